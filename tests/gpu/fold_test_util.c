/* What the fold route's GPU tests share (fold_test_util.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/w4a8_fold.h"
#include "fold_test_util.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4_ckpt.h"
#include "quant/int4_p2.h"

static uint64_t g_rng;
void fold_seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }
double fold_urand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
float fold_gauss(void) {
    return (float)(sqrt(-2.0 * log(fold_urand() + 1e-300)) * cos(6.283185307179586 * fold_urand()));
}

void *fold_dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    FOLD_CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) FOLD_CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* the fold layout of b's host matrices on the device */
static void upload_bank(p2_bank *b) {
    const size_t cb = (size_t)(b->rows_pad * b->G * 64), sb = (size_t)(b->rows_pad * b->G);
    uint8_t *codes = malloc(cb * (size_t)b->n);
    uint16_t *sc = malloc(sb * (size_t)b->n * sizeof(uint16_t));
    for (int32_t e = 0; e < b->n; e++)
        fm_w4a8_fold_pack(b->q + e * b->rows * b->K, b->scales + e * b->rows * b->G, b->rows, b->K, b->interleaved,
                          b->rows_pad, codes + e * cb, sc + e * sb);
    b->d_codes = fold_dev_copy(codes, cb * (size_t)b->n);
    b->d_scales = fold_dev_copy(sc, sb * (size_t)b->n * sizeof(uint16_t));
    free(codes), free(sc);
}

p2_bank fold_make_bank(int32_t n, int64_t rows, int64_t K, bool interleaved) {
    p2_bank b = {n, rows, K, (K + 127) / 128, (rows + 31) / 32 * 32, interleaved, NULL, NULL, NULL, NULL};
    b.q = malloc((size_t)(n * rows * K));
    b.scales = malloc((size_t)(n * rows * b.G) * sizeof(float));
    float *w = malloc((size_t)(rows * K) * sizeof(float));
    for (int32_t e = 0; e < n; e++) {
        for (int64_t r = 0; r < rows; r++) {
            const float rscale = expf(0.3f * fold_gauss());
            for (int64_t g = 0; g < b.G; g++) {
                const float gs = rscale * expf(0.5f * fold_gauss());
                for (int64_t i = 128 * g; i < K && i < 128 * (g + 1); i++) w[r * K + i] = 0.05f * gs * fold_gauss();
            }
        }
        fm_int4_p2_quantize(w, rows, K, b.q + e * rows * K, b.scales + e * rows * b.G);
    }
    free(w);
    upload_bank(&b);
    return b;
}
p2_bank fold_make_bank_random(int32_t n, int64_t rows, int64_t K, bool interleaved) {
    p2_bank b = {n, rows, K, (K + 127) / 128, (rows + 31) / 32 * 32, interleaved, NULL, NULL, NULL, NULL};
    b.q = malloc((size_t)(n * rows * K));
    b.scales = malloc((size_t)(n * rows * b.G) * sizeof(float));
    for (int64_t r = 0; r < n * rows; r++) {
        const float rs = fm_round_bf16(0.01f * expf(0.3f * fold_gauss()));
        for (int64_t g = 0; g < b.G; g++) { /* mostly near the row's scale, now and then far below it */
            const double u = fold_urand();
            b.scales[r * b.G + g] = ldexpf(rs, -(int)(u * u * u * 13.0));
        }
        /* the sum of two uniform codes: -7..7, peaked at 0 (16 nibbles per draw: the codes of a bank cost little) */
        for (int64_t i = 0; i < K; i += 8) {
            fold_urand();
            uint64_t bits = g_rng;
            for (int64_t j = i; j < i + 8 && j < K; j++, bits >>= 8)
                b.q[r * K + j] = (int8_t)((int)(bits & 7u) - (int)((bits >> 4) & 7u));
        }
    }
    upload_bank(&b);
    return b;
}

void fold_free_bank(p2_bank *b) {
    free(b->q), free(b->scales);
    cudaFree(b->d_codes), cudaFree(b->d_scales);
}

bool fold_have_sm90(void) {
    if (!fm_cuda_fold_supported()) {
        printf("fold: not an sm_90 device, skipped\n");
        return false;
    }
    return true;
}

routed fold_route_rows(int64_t P, int32_t E, int32_t bn) {
    routed r = {P, malloc((size_t)(P + 1) * 4), malloc((size_t)(P + E + 1) * sizeof(fm_fold_tile)), 0};
    int64_t *count = calloc((size_t)E, sizeof(int64_t));
    for (int64_t i = 0; i < P; i++) count[(int64_t)(fold_urand() * fold_urand() * E) % E]++; /* uneven loads */
    int64_t slot = 0;
    for (int32_t e = 0; e < E; e++) {
        for (int64_t j = 0; j < count[e]; j += bn) {
            const int64_t rows = count[e] - j < bn ? count[e] - j : bn;
            r.tiles[r.n_tiles++] = (fm_fold_tile){e, (int32_t)(slot + j), (int32_t)rows, 0};
        }
        for (int64_t j = 0; j < count[e]; j++) r.expert_of[slot + j] = e;
        slot += count[e];
    }
    free(count);
    return r;
}

void fold_emulate(const p2_bank *b, const routed *rt, const uint8_t *x8, int64_t ldx, const float *xs, int64_t lds,
                  bool per_group, float *y_ref, float *mag) {
    fold_emulate_promote(b, rt, x8, ldx, xs, lds, per_group, FM_FOLD_PROMOTE, y_ref, mag);
}

void fold_emulate_promote(const p2_bank *b, const routed *rt, const uint8_t *x8, int64_t ldx, const float *xs,
                          int64_t lds, bool per_group, int32_t promote, float *y_ref, float *mag) {
    for (int64_t i = 0; i < rt->P; i++) {
        const int32_t e = rt->expert_of[i];
        const int8_t *q = b->q + e * b->rows * b->K;
        const float *sc = b->scales + e * b->rows * b->G;
        float xs1[64];
        if (per_group)
            for (int64_t g = 0; g < b->G; g++) xs1[g] = xs[g * lds + i];
        assert_true(fm_w4a8_fold_ref(q, sc, b->rows, b->K, x8 + i * ldx, ldx, per_group ? xs1 : xs + i, 1, per_group, 1,
                                     promote, y_ref + i * b->rows));
        for (int64_t r = 0; r < b->rows; r++) {
            double m = 0.0;
            for (int64_t k = 0; k < b->K; k++)
                m += fabs((double)q[r * b->K + k] * sc[r * b->G + k / 128] * fm_e4m3_to_f32(x8[i * ldx + k]) *
                          (per_group ? xs1[k / 128] : xs[i]));
            mag[i * b->rows + r] = (float)m;
        }
    }
}

void fold_check_close(const float *y, const float *ref, const float *mag, int64_t n, const char *what) {
    fold_check_close_acc(y, ref, mag, n, 0x1p-11, what);
}

void fold_check_close_acc(const float *y, const float *ref, const float *mag, int64_t n, double acc_rel,
                          const char *what) {
    int64_t worst = 0;
    double worst_r = 0.0;
    for (int64_t i = 0; i < n; i++) {
        /* one bf16 ulp of the output (2^-7 relative at most), and the FP8 accumulator's truncation (~2^-13 of the
           block's magnitude per block) */
        const double bound = fabs(ref[i]) * 0x1p-7 + mag[i] * acc_rel + 1e-30;
        const double r = fabs(y[i] - ref[i]) / bound;
        if (!(r <= worst_r)) worst_r = r, worst = i;
    }
    printf("%s: %lld elements, nerr %.3g, worst %.3g of the bound (element %lld: %g vs %g)\n", what, (long long)n,
           gpu_nerr(y, ref, n), worst_r, (long long)worst, y[worst], ref[worst]);
    assert_true(worst_r <= 1.0);
}

void fold_free_routed(routed *r) { free(r->expert_of), free(r->tiles); }
/* one linear in our checkpoint format with int4-p2 scales (compressed-tensors pack-quantized, symmetric, bf16
   scales: what `requantize --scales p2` writes), bound as a checkpoint's tensors are */
typedef struct p2_linear {
    fm_st_tensor t[2];
    uint32_t *packed;
    uint16_t *scales;
    fm_wsrc src;
} p2_linear;

static const fm_st_tensor *find_p2(const void *ctx, const char *name) {
    const p2_linear *l = ctx;
    if (!strcmp(name, "m.weight_packed")) return &l->t[0];
    if (!strcmp(name, "m.weight_scale")) return &l->t[1];
    return NULL;
}

static void make_p2_linear(const int8_t *q, const float *sc, int64_t N, int64_t K, p2_linear *l) {
    const int64_t KW = (K + 7) / 8, G = (K + 127) / 128;
    memset(l, 0, sizeof *l);
    l->packed = calloc((size_t)(N * KW), 4);
    l->scales = malloc((size_t)(N * G) * 2);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++)
            l->packed[n * KW + k / 8] |= (uint32_t)((q[n * K + k] + 8) & 15) << (4 * (k % 8));
        for (int64_t g = 0; g < G; g++) l->scales[n * G + g] = fm_f32_to_bf16(sc[n * G + g]);
    }
    l->t[0] = (fm_st_tensor){.name = "m.weight_packed",
                             .dtype = FM_DTYPE_I32,
                             .n_dims = 2,
                             .n_elements = N * KW,
                             .data = (const uint8_t *)l->packed,
                             .nbytes = (uint64_t)(N * KW) * 4};
    l->t[0].shape[0] = N, l->t[0].shape[1] = KW;
    l->t[1] = (fm_st_tensor){.name = "m.weight_scale",
                             .dtype = FM_DTYPE_BF16,
                             .n_dims = 2,
                             .n_elements = N * G,
                             .data = (const uint8_t *)l->scales,
                             .nbytes = (uint64_t)(N * G) * 2};
    l->t[1].shape[0] = N, l->t[1].shape[1] = G;
    const fm_quant_config qc = {.method = FM_QUANT_CT_PACKED, .bits = 4, .group_size = 128, .sym = true};
    fm_error err = {{0}};
    if (fm_qsrc_bind(&qc, "m", N, K, find_p2, l, &l->src.q, &err)) fail_msg("bind: %s", err.msg);
    l->src.rows = N, l->src.cols = K;
}

void fold_emulate_moe(const p2_bank *gu, const p2_bank *dn, const float *x, int64_t T, const int32_t *ids,
                      const float *w, int32_t k, float *out) {
    fold_emulate_moe_form(gu, dn, x, T, ids, w, k, false, out);
}

void fold_emulate_moe_form(const p2_bank *gu, const p2_bank *dn, const float *x, int64_t T, const int32_t *ids,
                           const float *w, int32_t k, bool ws, float *out) {
    const int32_t promote = ws ? 0 : FM_FOLD_PROMOTE; /* the warp-specialised GEMMs: all of K in one block */
    const int64_t H = dn->rows, I = dn->K, Hp = gu->G * 128, Ip = dn->G * 128;
    uint8_t *x8 = malloc((size_t)Hp), *h8 = malloc((size_t)Ip);
    float xs, *yg = malloc((size_t)(2 * I) * sizeof(float)), *yd = malloc((size_t)H * sizeof(float));
    float *hs = malloc((size_t)dn->G * sizeof(float)), *hv = malloc((size_t)Ip * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        fm_w4a8_fold_quantize_tokens(x + t * H, 1, H, H, x8, Hp, &xs);
        for (int64_t c = 0; c < H; c++) out[t * H + c] = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            const int32_t e = ids[t * k + j];
            assert_true(fm_w4a8_fold_ref(gu->q + e * gu->rows * H, gu->scales + e * gu->rows * gu->G, 2 * I, H, x8, Hp,
                                         &xs, 1, false, 1, promote, yg));
            for (int64_t c = 0; c < Ip; c++) {
                const float g = c < I ? fm_round_bf16(yg[c]) : 0.0f, u = c < I ? fm_round_bf16(yg[I + c]) : 0.0f;
                hv[c] = fm_round_bf16(g / (1.0f + expf(-g)) * u);
            }
            if (ws) { /* h in bf16, then e4m3 with one scale per token (fm_cuda_fold_quantize_tokens) */
                fm_w4a8_fold_quantize_tokens(hv, 1, I, I, h8, Ip, hs);
                assert_true(fm_w4a8_fold_ref(dn->q + e * H * I, dn->scales + e * H * dn->G, H, I, h8, Ip, hs, 1, false,
                                             1, 0, yd));
                for (int64_t c = 0; c < H; c++) out[t * H + c] += fm_round_bf16(w[t * k + j]) * fm_round_bf16(yd[c]);
                continue;
            }
            for (int64_t g = 0; g < dn->G; g++) { /* the SwiGLU epilogue's e4m3: x (1 / scale) */
                float m = 0.0f;
                for (int64_t c = 128 * g; c < 128 * (g + 1); c++) m = fmaxf(m, fabsf(hv[c]));
                hs[g] = fmaxf(m / 448.0f, 1e-12f);
                const float inv = 1.0f / hs[g];
                for (int64_t c = 128 * g; c < 128 * (g + 1); c++) h8[c] = fm_f32_to_e4m3(hv[c] * inv);
            }
            assert_true(fm_w4a8_fold_ref(dn->q + e * H * I, dn->scales + e * H * dn->G, H, I, h8, Ip, hs, 1, true, 1,
                                         FM_FOLD_PROMOTE, yd));
            for (int64_t c = 0; c < H; c++) out[t * H + c] += fm_round_bf16(w[t * k + j]) * fm_round_bf16(yd[c]);
        }
        for (int64_t c = 0; c < H; c++) out[t * H + c] = fm_round_bf16(out[t * H + c]);
    }
    free(x8), free(h8), free(yg), free(yd), free(hs), free(hv);
}

struct fold_experts {
    int32_t E;
    p2_linear *lin; /* [E][3]: gate, up, down */
    fm_wsrc *gsrc, *dsrc;
};

fold_experts *fold_experts_make(const p2_bank *gu, const p2_bank *dn) {
    const int32_t E = gu->n;
    const int64_t H = gu->K, I = dn->K;
    fold_experts *s = malloc(sizeof *s);
    s->E = E;
    s->lin = malloc((size_t)(3 * E) * sizeof *s->lin);
    s->gsrc = malloc((size_t)(2 * E) * sizeof *s->gsrc), s->dsrc = malloc((size_t)E * sizeof *s->dsrc);
    for (int32_t e = 0; e < E; e++) {
        p2_linear *l = s->lin + 3 * e;
        make_p2_linear(gu->q + e * 2 * I * H, gu->scales + e * 2 * I * gu->G, I, H, &l[0]); /* gate rows */
        make_p2_linear(gu->q + e * 2 * I * H + I * H, gu->scales + e * 2 * I * gu->G + I * gu->G, I, H, &l[1]);
        make_p2_linear(dn->q + e * H * I, dn->scales + e * H * dn->G, H, I, &l[2]);
        s->gsrc[2 * e] = l[0].src, s->gsrc[2 * e + 1] = l[1].src, s->dsrc[e] = l[2].src;
    }
    return s;
}

void fold_experts_banks(fm_backend *be, const fold_experts *s, fm_bank **gate_up, fm_bank **down) {
    const fm_bank_src gs = {s->gsrc, s->E, 2, "test experts gate_up", true, true};
    const fm_bank_src ds = {s->dsrc, s->E, 1, "test experts down", false, true};
    fm_error err = {{0}};
    if (be->ops->bank_create(be, &gs, be->plan.w_expert, gate_up, &err) ||
        be->ops->bank_create(be, &ds, be->plan.w_expert, down, &err))
        fail_msg("expert banks on %s: %s", be->ops->name, err.msg);
}

void fold_experts_free(fold_experts *s) {
    for (int32_t i = 0; i < 3 * s->E; i++) free(s->lin[i].packed), free(s->lin[i].scales);
    free(s->lin), free(s->gsrc), free(s->dsrc), free(s);
}
