/* Pre-quantized linears from float views (qsynth.h). */
#include "qsynth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "util/status.h"

#define GROUP 128

static const fm_st_tensor *find_in(const void *ctx, const char *name) {
    const fm_qsynth *q = ctx;
    for (int i = 0; i < 3; i++)
        if (q->data[i] && strcmp(q->names[i], name) == 0) return &q->t[i];
    return NULL;
}

static bool add_tensor(fm_qsynth *q, int i, const char *name, fm_dtype dt, int64_t d0, int64_t d1) {
    snprintf(q->names[i], sizeof q->names[i], "m.%s", name);
    const size_t bytes = (size_t)(d0 * d1) * (size_t)fm_dtype_size(dt);
    if (!(q->data[i] = calloc(bytes ? bytes : 1, 1))) return false;
    q->t[i] = (fm_st_tensor){
        .name = q->names[i], .dtype = dt, .n_dims = 2, .n_elements = d0 * d1, .data = q->data[i], .nbytes = bytes};
    q->t[i].shape[0] = d0, q->t[i].shape[1] = d1;
    return true;
}

/* compressed-tensors: weight_packed I32 [N, K/8] (u at bits 4i of word k / 8), weight_scale F16 [N, K/128],
   weight_zero_point I32 [N/8, K/128] (n = 8r + i at bits 4i of row r) */
static bool pack_int4_asym(const float *w, int64_t N, int64_t K, fm_qsynth *q) {
    const int64_t ng = fm_int4_n_groups(K, GROUP), KW = (K + 7) / 8;
    const fm_int4_params p = {GROUP, false, FM_SCALE_F16};
    int8_t *codes = malloc((size_t)(N * K));
    float *sc = malloc((size_t)(N * ng) * sizeof *sc);
    uint8_t *zp = malloc((size_t)(N * ng));
    bool ok = codes && sc && zp && add_tensor(q, 0, "weight_packed", FM_DTYPE_I32, N, KW) &&
              add_tensor(q, 1, "weight_scale", FM_DTYPE_F16, N, ng) &&
              add_tensor(q, 2, "weight_zero_point", FM_DTYPE_I32, (N + 7) / 8, ng);
    if (ok) {
        fm_int4_quantize(w, N, K, &p, codes, sc, zp);
        uint32_t *pk = (uint32_t *)q->data[0], *zw = (uint32_t *)q->data[2];
        uint16_t *s16 = (uint16_t *)q->data[1];
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) pk[n * KW + k / 8] |= (uint32_t)(uint8_t)codes[n * K + k] << (4 * (k % 8));
            for (int64_t g = 0; g < ng; g++) {
                s16[n * ng + g] = fm_f32_to_f16(sc[n * ng + g]); /* exact: the quantizer rounds to fp16 */
                zw[(n / 8) * ng + g] |= (uint32_t)zp[n * ng + g] << (4 * (n % 8));
            }
        }
    }
    free(codes), free(sc), free(zp);
    return ok;
}

/* block-FP8: weight F8_E4M3 [N, K], weight_scale_inv F32 [N/128, K/128], scale = amax / 448 per block */
static bool pack_fp8_block(const float *w, int64_t N, int64_t K, fm_qsynth *q) {
    const int64_t nb = (N + GROUP - 1) / GROUP, kb = (K + GROUP - 1) / GROUP;
    if (!add_tensor(q, 0, "weight", FM_DTYPE_F8_E4M3, N, K) ||
        !add_tensor(q, 1, "weight_scale_inv", FM_DTYPE_F32, nb, kb))
        return false;
    float *s = (float *)q->data[1];
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t bk = 0; bk < kb; bk++) {
            const int64_t n1 = (bi + 1) * GROUP < N ? (bi + 1) * GROUP : N,
                          k1 = (bk + 1) * GROUP < K ? (bk + 1) * GROUP : K;
            float amax = 0.0f;
            for (int64_t n = bi * GROUP; n < n1; n++)
                for (int64_t k = bk * GROUP; k < k1; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
            const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
            s[bi * kb + bk] = scale;
            for (int64_t n = bi * GROUP; n < n1; n++)
                for (int64_t k = bk * GROUP; k < k1; k++) q->data[0][n * K + k] = fm_f32_to_e4m3(w[n * K + k] / scale);
        }
    return true;
}

fm_status fm_qsynth_make(const fm_wsrc *w, fm_qsynth_kind kind, fm_qsynth *q, fm_error *err) {
    memset(q, 0, sizeof *q);
    const int64_t N = w->rows, K = w->cols;
    float *f = malloc((size_t)(N * K) * sizeof *f);
    if (!f)
        return fm_fail(err, FM_ERR_NOMEM, "out of memory quantizing a [%lld, %lld] linear", (long long)N, (long long)K);
    fm_status st = fm_wsrc_read(w, f, err);
    if (!st && !(kind == FM_QSYNTH_INT4_ASYM ? pack_int4_asym(f, N, K, q) : pack_fp8_block(f, N, K, q)))
        st = fm_fail(err, FM_ERR_NOMEM, "out of memory quantizing a [%lld, %lld] linear", (long long)N, (long long)K);
    free(f);
    const fm_quant_config qc =
        kind == FM_QSYNTH_INT4_ASYM
            ? (fm_quant_config){.method = FM_QUANT_CT_PACKED, .bits = 4, .group_size = GROUP}
            : (fm_quant_config){.method = FM_QUANT_FP8_BLOCK, .bits = 8, .group_size = GROUP, .block_n = GROUP};
    if (!st) st = fm_qsrc_bind(&qc, "m", N, K, find_in, q, &q->src.q, err);
    q->src.rows = N, q->src.cols = K;
    if (st) fm_qsynth_free(q);
    return st;
}

void fm_qsynth_free(fm_qsynth *q) {
    for (int i = 0; i < 3; i++) free(q->data[i]), q->data[i] = NULL;
}
