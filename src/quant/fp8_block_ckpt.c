/* Block-wise FP8 checkpoints (quant_method "fp8" with weight_block_size, as DeepSeek-V3 and Qwen3-*-FP8 ship):
 * binding checks and dequantization (see int4_ckpt.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/e4m3.h"
#include "quant/int4_ckpt.h"
#include "util/status.h"

fm_status fm_fp8_block_bind(const fm_quant_config *qc, const char *module, int64_t N, int64_t K, fm_tensor_lookup find,
                            const void *ctx, fm_qsrc *q, fm_error *err) {
    char name[560];
    snprintf(name, sizeof name, "%s.weight", module);
    const fm_st_tensor *w = find(ctx, name);
    snprintf(name, sizeof name, "%s.weight_scale_inv", module);
    const fm_st_tensor *s = find(ctx, name);
    const int64_t bn = qc->block_n, bk = qc->group_size;
    char role[160];
    snprintf(role, sizeof role, "e4m3 weights of a [%lld, %lld] linear", (long long)N, (long long)K);
    fm_status st = FM_OK;
    if (w && w->dtype != FM_DTYPE_F8_E4M3)
        return fm_fail(err, FM_ERR_FORMAT, "tensor '%s' (%s) has dtype %s, expected F8_E4M3: it has a weight_scale_inv",
                       w->name, role, fm_dtype_name(w->dtype));
    if (!w) return fm_fail(err, FM_ERR_FORMAT, "tensor '%s.weight' (%s) is missing from the checkpoint", module, role);
    if (w->n_dims != 2 || w->shape[0] != N || w->shape[1] != K)
        return fm_fail(err, FM_ERR_FORMAT, "tensor '%s' (%s): expected shape [%lld, %lld]", w->name, role, (long long)N,
                       (long long)K);
    if ((st = fm_qsrc_expect(s, module, "weight_scale_inv", "per-block scales [ceil(N/bn), ceil(K/bk)]", true,
                             (N + bn - 1) / bn, (K + bk - 1) / bk, 2, err)))
        return st;
    *q =
        (fm_qsrc){.method = FM_QUANT_FP8_BLOCK, .packed = w, .scales = s, .group = (int32_t)bk, .block_n = (int32_t)bn};
    return FM_OK;
}

fm_status fm_fp8_block_dequantize(const fm_qsrc *q, int64_t N, int64_t K, float *w, fm_error *err) {
    const int64_t bn = q->block_n, bk = q->group, nbk = (K + bk - 1) / bk, n_scales = ((N + bn - 1) / bn) * nbk;
    float *s = malloc((size_t)n_scales * sizeof *s);
    if (!s) return fm_fail(err, FM_ERR_NOMEM, "out of memory decoding %s", q->scales->name);
    fm_status st = fm_st_check_finite(q->packed, 0, N * K, err); /* NaN codes */
    if (!st) st = fm_st_read_f32(q->scales, 0, n_scales, s, err);
    for (int64_t i = 0; !st && i < n_scales; i++)
        if (!isfinite(s[i]))
            st = fm_fail(err, FM_ERR_FORMAT, "tensor '%s': scale %lld is not finite", q->scales->name, (long long)i);
    for (int64_t n = 0; !st && n < N; n++)
        for (int64_t k = 0; k < K; k++)
            w[n * K + k] = fm_e4m3_to_f32(q->packed->data[n * K + k]) * s[(n / bn) * nbk + k / bk];
    free(s);
    return st;
}
