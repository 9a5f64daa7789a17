/* GPU tests of the banks that keep a pre-quantized checkpoint's numbers (src/backend/cuda/cuda_bank_prequant.cu), on
 * random linears built in memory in the checkpoint formats (compressed-tensors pack-quantized int4 with fp16
 * scales, asymmetric zero points, act-order g_idx; block-FP8 e4m3 with fp32 block scales), read through the same
 * binder checks a checkpoint goes through (fm_qsrc_bind):
 *   int4 preset (W4A16, int4-zp banks): the CUDA linear and per-token MoE against the CPU ops on the same plan,
 *     normalised error <= 1e-2 (bf16 activations and outputs, different summation orders; test_cuda_ops.c)
 *   fp8 presets (int4-zp-tc and e4m3-block banks, e4m3 1x128 activations): the CUDA linear against a reference
 *     computed here in double from the dequantized weights and the e4m3-quantized input (fm_e4m3_quantize_groups on
 *     the bf16-rounded input), normalised error <= 5e-3 (bf16 output, the wgmma's accumulator: test_cuda_ops.c);
 *     the MoE against the CPU backend's emulation of the same formats, <= 3e-2 as for the int4-tc MoE; the fused
 *     decode forms (linear_add_rmsnorm on the W4A8 GEMV, moe.down_quant=fused) bit for bit the chains they replace
 * Runs only where a GPU is present (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4_ckpt.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)(urand() >> 8) * (1.0f / 8388608.0f) - 1.0f; } /* [-1, 1) */

/* One linear [N, K] stored in a checkpoint format, with the tensors it is bound from. */
typedef struct qlinear {
    fm_st_tensor t[4]; /* packed, scales, zeros, g_idx (by name below) */
    char names[4][64];
    uint8_t *data[4];
    fm_wsrc src;
    float *w; /* [N, K] the checkpoint's own dequantization, for references */
} qlinear;

static const fm_st_tensor *find_in(const void *ctx, const char *name) {
    const qlinear *q = ctx;
    for (int i = 0; i < 4; i++)
        if (q->data[i] && strcmp(q->names[i], name) == 0) return &q->t[i];
    return NULL;
}

static void set_tensor(qlinear *q, int i, const char *suffix, fm_dtype dt, int n_dims, int64_t d0, int64_t d1) {
    snprintf(q->names[i], sizeof q->names[i], "m.%s", suffix);
    const int64_t n = d0 * (n_dims == 2 ? d1 : 1);
    const size_t bytes = (size_t)n * (size_t)fm_dtype_size(dt);
    q->data[i] = calloc(bytes, 1);
    q->t[i] = (fm_st_tensor){
        .name = q->names[i], .dtype = dt, .n_dims = n_dims, .n_elements = n, .data = q->data[i], .nbytes = bytes};
    q->t[i].shape[0] = d0, q->t[i].shape[1] = n_dims == 2 ? d1 : 0;
}

static void bind(qlinear *q, const fm_quant_config *qc, int64_t N, int64_t K) {
    fm_error err;
    fm_status st = fm_qsrc_bind(qc, "m", N, K, find_in, q, &q->src.q, &err);
    if (st) fail_msg("binding a test linear: %s", err.msg);
    q->src.rows = N, q->src.cols = K;
    q->w = malloc((size_t)(N * K) * sizeof(float));
    assert_int_equal(fm_wsrc_read(&q->src, q->w, &err), FM_OK);
}

/* compressed-tensors pack-quantized: codes u 0..15 (some 0: the -8 our own tensor-core layout cannot hold), fp16
   scales, zero points (asymmetric) and a g_idx that scatters each group over K (act_order) */
static void make_ct(qlinear *q, int64_t N, int64_t K, int32_t G, bool sym, bool act_order) {
    memset(q, 0, sizeof *q);
    const int64_t ng = K / G, KW = (K + 7) / 8;
    fm_quant_config qc = {
        .method = FM_QUANT_CT_PACKED, .bits = 4, .group_size = G == K ? -1 : G, .sym = sym, .act_order = act_order};
    set_tensor(q, 0, "weight_packed", FM_DTYPE_I32, 2, N, KW);
    set_tensor(q, 1, "weight_scale", FM_DTYPE_F16, 2, N, ng);
    uint32_t *pk = (uint32_t *)q->data[0];
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) pk[n * KW + k / 8] |= (urand() % 16u) << (4 * (k % 8));
    uint16_t *sc = (uint16_t *)q->data[1];
    for (int64_t i = 0; i < N * ng; i++) sc[i] = fm_f32_to_f16(0.004f + 0.01f * fabsf(frand()));
    if (!sym) {
        set_tensor(q, 2, "weight_zero_point", FM_DTYPE_I32, 2, (N + 7) / 8, ng);
        uint32_t *zp = (uint32_t *)q->data[2];
        for (int64_t n = 0; n < N; n++)
            for (int64_t g = 0; g < ng; g++) zp[(n / 8) * ng + g] |= (3u + urand() % 10u) << (4 * (n % 8));
    }
    if (act_order) {
        set_tensor(q, 3, "weight_g_idx", FM_DTYPE_I32, 1, K, 0);
        int32_t *gi = (int32_t *)q->data[3];
        for (int64_t k = 0; k < K; k++) gi[k] = (int32_t)(k / G);
        for (int64_t k = K - 1; k > 0; k--) { /* shuffle: each group still holds G channels */
            const int64_t j = urand() % (uint32_t)(k + 1);
            const int32_t t = gi[k];
            gi[k] = gi[j], gi[j] = t;
        }
    }
    bind(q, &qc, N, K);
}

/* block-FP8 as a quantizer makes it: normal weights scaled so that the largest maps near 448, rounded to e4m3 (uniform
   random bytes would spread the products over 2^35, where the Hopper wgmma's reduced-precision accumulation of a
   128-group, bench/NOTES.md, is far from what real checkpoints see); fp32 scales per (bn x 128) block */
static void make_fp8_block(qlinear *q, int64_t N, int64_t K, int32_t bn) {
    memset(q, 0, sizeof *q);
    fm_quant_config qc = {.method = FM_QUANT_FP8_BLOCK, .bits = 8, .group_size = 128, .block_n = bn};
    set_tensor(q, 0, "weight", FM_DTYPE_F8_E4M3, 2, N, K);
    const int64_t nb = (N + bn - 1) / bn, kb = (K + 127) / 128;
    set_tensor(q, 1, "weight_scale_inv", FM_DTYPE_F32, 2, nb, kb);
    for (int64_t i = 0; i < N * K; i++) {
        const float u1 = 0.5f * (frand() + 1.0f) + 1e-7f, u2 = frand();
        const float g = sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2); /* Box-Muller */
        q->data[0][i] = fm_f32_to_e4m3(fmaxf(-448.0f, fminf(448.0f, 448.0f / 4.5f * g)));
    }
    float *s = (float *)q->data[1];
    for (int64_t i = 0; i < nb * kb; i++) s[i] = 2e-4f * (1.0f + fabsf(frand()));
    bind(q, &qc, N, K);
}

static void free_q(qlinear *q) {
    for (int i = 0; i < 4; i++) free(q->data[i]);
    free(q->w);
}

static fm_backend *backend(const char *name, fm_preset p) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_backend *be;
    fm_error err;
    fm_status st = fm_backend_create(name, &plan, 0, gpu_test_routes(), &be, &err);
    if (st) fail_msg("%s backend: %s", name, err.msg);
    return be;
}

static fm_bank *make_bank(fm_backend *be, const fm_wsrc *srcs, int32_t n, int32_t parts, fm_wformat fmt, bool gate_up) {
    fm_bank_src src = {srcs, n, parts, "test bank", gate_up, false};
    fm_bank *b;
    fm_error err;
    fm_status st = be->ops->bank_create(be, &src, fmt, &b, &err);
    if (st) fail_msg("%s bank: %s", fm_wformat_name(fmt), err.msg);
    return b;
}

static float *rand_x(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = fm_round_bf16(frand());
    if (n > 3) x[3] = 24.0f; /* an outlier channel */
    return x;
}

static float *run_linear(fm_backend *be, fm_bank *wb, const float *x, int64_t M, int64_t K, int64_t N) {
    void *xd = gpu_upload(be, x, M * K), *base;
    void *yd = gpu_guarded(be, M * N, &base);
    be->ops->linear(be, wb, 0, xd, M, be->plan.a_dense, yd);
    float *y = gpu_fetch(be, base, M * N, "linear");
    be->ops->free(be, xd);
    return y;
}

/* int4 preset: int4-zp banks, CUDA against CPU */
static void zp_w4a16_case(int64_t M, int64_t N, int64_t K, int32_t G, bool sym, bool act_order) {
    qlinear q;
    make_ct(&q, N, K, G, sym, act_order);
    float *y[2], *x = rand_x(M * K);
    for (int i = 0; i < 2; i++) {
        fm_backend *be = backend(i ? "cuda" : "cpu", FM_PRESET_INT4);
        fm_bank *wb = make_bank(be, &q.src, 1, 1, FM_W_INT4_ZP, false);
        y[i] = run_linear(be, wb, x, M, K, N);
        be->ops->bank_free(be, wb);
        be->ops->destroy(be);
    }
    free(x);
    char what[128];
    snprintf(what, sizeof what, "int4-zp linear M=%lld N=%lld K=%lld G=%d%s%s", (long long)M, (long long)N,
             (long long)K, G, sym ? " sym" : " asym", act_order ? " act-order" : "");
    gpu_expect_close(y[1], y[0], M * N, 1e-2, what);
    free(y[0]), free(y[1]);
    free_q(&q);
}

static void test_int4zp_linear(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 16, 300};
    for (int i = 0; i < 3; i++) {
        zp_w4a16_case(Ms[i], 200, 384, 128, false, false);
        zp_w4a16_case(Ms[i], 256, 256, 32, true, true);
        zp_w4a16_case(Ms[i], 72, 200, 200, false,
                      false); /* one group per row (group_size -1), K not a multiple of 32 */
    }
}

/* fp8 presets: y = dequant(e4m3 1x128 (x)) . W^T in double, W the checkpoint's own dequantization */
static float *fp8_reference(const float *x, const float *w, int64_t M, int64_t K, int64_t N) {
    float *y = malloc((size_t)(M * N) * sizeof *y), *xd = malloc((size_t)K * sizeof *xd);
    float *sc = malloc((size_t)((K + 127) / 128) * sizeof *sc);
    uint8_t *codes = malloc((size_t)K);
    for (int64_t m = 0; m < M; m++) {
        fm_e4m3_quantize_groups(x + m * K, K, 128, codes, sc);
        for (int64_t k = 0; k < K; k++) xd[k] = fm_e4m3_to_f32(codes[k]) * sc[k / 128];
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xd[k] * (double)w[n * K + k];
            y[m * N + n] = (float)acc;
        }
    }
    free(xd), free(sc), free(codes);
    return y;
}

/* a bank of n_parts linears stacked along rows (q|k|v), against the reference on their stacked weights */
static void fp8_linear_parts(qlinear *q, int n_parts, fm_wformat fmt, int64_t M, const char *what) {
    const int64_t K = q[0].src.cols;
    int64_t N = 0;
    fm_wsrc srcs[4];
    for (int i = 0; i < n_parts; i++) srcs[i] = q[i].src, N += q[i].src.rows;
    float *w = malloc((size_t)(N * K) * sizeof *w), *wp = w;
    for (int i = 0; i < n_parts; i++)
        memcpy(wp, q[i].w, (size_t)(q[i].src.rows * K) * sizeof *w), wp += q[i].src.rows * K;
    fm_backend *be = backend("cuda", FM_PRESET_FP8);
    fm_bank *wb = make_bank(be, srcs, 1, n_parts, fmt, false);
    float *x = rand_x(M * K), *y = run_linear(be, wb, x, M, K, N), *ref = fp8_reference(x, w, M, K, N);
    char label[160];
    snprintf(label, sizeof label, "%s M=%lld N=%lld K=%lld", what, (long long)M, (long long)N, (long long)K);
    gpu_expect_close(y, ref, M * N, 5e-3, label);
    free(x), free(y), free(ref), free(w);
    be->ops->bank_free(be, wb);
    be->ops->destroy(be);
}

static void fp8_linear_case(qlinear *q, fm_wformat fmt, int64_t M, const char *what) {
    fp8_linear_parts(q, 1, fmt, M, what);
}

/* int4-zp-tc (the grouped W4A8 kernel with the zero-point term) and e4m3-block, at decode and prefill sizes */
static void test_fp8_prequant_linear(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 16, 300};
    for (int i = 0; i < 3; i++) {
        qlinear q;
        make_ct(&q, 200, 384, 128, false, false);
        fp8_linear_case(&q, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc G=128 asym");
        free_q(&q);
        make_ct(&q, 256, 256, 256, true, false);
        fp8_linear_case(&q, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc per-channel sym (codes 0 = -8)");
        free_q(&q);
        make_ct(&q, 72, 200, 200, false, false);
        fp8_linear_case(&q, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc per-channel, K padded to 256");
        free_q(&q);
        make_fp8_block(&q, 200, 384, 128);
        fp8_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 128x128, N not a multiple of 128");
        free_q(&q);
        make_fp8_block(&q, 256, 200, 64);
        fp8_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 64x128, K padded to 256");
        free_q(&q);
        make_fp8_block(&q, 384, 176, 128); /* an expert down projection of width 176: K padded to 256 */
        fp8_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 128x128, K = 176");
        free_q(&q);
        make_fp8_block(&q, 352, 384, 128);
        fp8_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 128x128, N = 352");
        free_q(&q);
        qlinear qkv[3]; /* a fused q|k|v of three block grids, 48 rows per block (no part a multiple of 48) */
        make_fp8_block(&qkv[0], 128, 256, 48), make_fp8_block(&qkv[1], 64, 256, 48),
            make_fp8_block(&qkv[2], 64, 256, 48);
        fp8_linear_parts(qkv, 3, FM_W_E4M3_B128, Ms[i], "e4m3-block 48x128, q|k|v 128+64+64");
        for (int j = 0; j < 3; j++) free_q(&qkv[j]);
        /* K = 128: a single group (the wgmma kernel's loop runs once) */
        make_fp8_block(&qkv[0], 128, 128, 48), make_fp8_block(&qkv[1], 64, 128, 48),
            make_fp8_block(&qkv[2], 64, 128, 48);
        fp8_linear_parts(qkv, 3, FM_W_E4M3_B128, Ms[i] + 8, "e4m3-block 48x128, K = 128, q|k|v 128+64+64");
        for (int j = 0; j < 3; j++) free_q(&qkv[j]);
        make_ct(&qkv[0], 128, 256, 128, false, false), make_ct(&qkv[1], 64, 256, 128, false, false);
        make_ct(&qkv[2], 64, 256, 128, false, false);
        fp8_linear_parts(qkv, 3, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc G=128 asym, q|k|v 128+64+64");
        for (int j = 0; j < 3; j++) free_q(&qkv[j]);
    }
}

/* The fp8 plans refuse what the kernels cannot do, by name: act-order, groups that split a 128-block */
static void test_fp8_prequant_refusals(void **s) {
    (void)s;
    fm_backend *be = backend("cuda", FM_PRESET_FP8);
    qlinear q;
    make_ct(&q, 64, 256, 128, false, true);
    fm_bank_src src = {&q.src, 1, 1, "layer 0 qkv", false, false};
    fm_bank *b = NULL;
    fm_error err;
    assert_int_equal(be->ops->bank_create(be, &src, FM_W_INT4_ZP_TC, &b, &err), FM_ERR_UNSUPPORTED);
    printf("  refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "act-order"));
    free_q(&q);
    make_ct(&q, 64, 256, 64, false, false);
    src.srcs = &q.src;
    assert_int_equal(be->ops->bank_create(be, &src, FM_W_INT4_ZP_TC, &b, &err), FM_ERR_UNSUPPORTED);
    printf("  refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "groups of 64"));
    free_q(&q);
    be->ops->destroy(be);
}

/* Expert banks [E] of gate, up [I, H] and down [H, I], each its own random checkpoint linear. */
typedef struct qexperts {
    qlinear *gate, *up, *down;
    fm_wsrc *gu, *dn;
    int32_t E;
} qexperts;

static qexperts make_experts(int32_t E, int64_t H, int64_t I, int32_t fp8_bn, bool sym) {
    qexperts x = {calloc((size_t)E, sizeof(qlinear)), calloc((size_t)E, sizeof(qlinear)),
                  calloc((size_t)E, sizeof(qlinear)), calloc((size_t)E * 2, sizeof(fm_wsrc)),
                  calloc((size_t)E, sizeof(fm_wsrc)), E};
    for (int32_t e = 0; e < E; e++) {
        if (fp8_bn) {
            make_fp8_block(&x.gate[e], I, H, fp8_bn), make_fp8_block(&x.up[e], I, H, fp8_bn);
            make_fp8_block(&x.down[e], H, I, fp8_bn);
        } else {
            make_ct(&x.gate[e], I, H, 128, sym, false), make_ct(&x.up[e], I, H, 128, sym, false);
            make_ct(&x.down[e], H, I, I % 128 ? I : 128, sym, false);
        }
        x.gu[2 * e] = x.gate[e].src, x.gu[2 * e + 1] = x.up[e].src, x.dn[e] = x.down[e].src;
    }
    return x;
}

static void free_experts(qexperts *x) {
    for (int32_t e = 0; e < x->E; e++) free_q(&x->gate[e]), free_q(&x->up[e]), free_q(&x->down[e]);
    free(x->gate), free(x->up), free(x->down), free(x->gu), free(x->dn);
}

/* the MoE op on both backends; spread routing (pair (t, j) -> (5t + 3j) mod E) */
/* fp8_bn: block-FP8 experts with blocks of fp8_bn rows (0: int4 experts, sym or not) */
static void moe_case(fm_preset p, fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I, int32_t fp8_bn,
                     bool sym, double bound) {
    qexperts q = make_experts(E, H, I, fp8_bn, sym);
    float *x = rand_x(T * H), *wts = malloc((size_t)(T * k) * sizeof(float));
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++)
            ids[t * k + j] = (int32_t)((t * 5 + j * 3) % E), wts[t * k + j] = 0.3f + 0.1f * (float)j;
    float *o[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = backend(i ? "cuda" : "cpu", p);
        fm_bank *gub = make_bank(be, q.gu, E, 2, fmt, true), *db = make_bank(be, q.dn, E, 1, fmt, false);
        o[i] = gpu_run_moe(be, gub, db, x, T, H, ids, wts, k);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
        be->ops->destroy(be);
    }
    char what[128];
    char kind[32];
    snprintf(kind, sizeof kind, fp8_bn ? " blocks %dx128" : sym ? " sym" : " asym", fp8_bn);
    snprintf(what, sizeof what, "moe %s T=%lld E=%d k=%d H=%lld I=%lld%s", fm_wformat_name(fmt), (long long)T, E, k,
             (long long)H, (long long)I, kind);
    gpu_expect_close(o[1], o[0], T * H, bound, what);
    free(o[0]), free(o[1]), free(x), free(wts), free(ids);
    free_experts(&q);
}

static void test_int4zp_moe(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 33};
    for (int i = 0; i < 2; i++) moe_case(FM_PRESET_INT4, FM_W_INT4_ZP, Ts[i], 8, 2, 256, 128, 0, false, 1e-2);
}

static void test_fp8_prequant_moe(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) {
        moe_case(FM_PRESET_FP8, FM_W_INT4_ZP_TC, Ts[i], 8, 2, 256, 128, 0, false, 3e-2);
        moe_case(FM_PRESET_FP8, FM_W_INT4_ZP_TC, Ts[i], 7, 3, 384, 256, 0, true, 3e-2);
        moe_case(FM_PRESET_FP8, FM_W_E4M3_B128, Ts[i], 8, 2, 256, 128, 128, false, 3e-2);
        moe_case(FM_PRESET_FP8, FM_W_E4M3_B128, Ts[i], 5, 2, 384, 176, 128, false, 3e-2);
        moe_case(FM_PRESET_FP8, FM_W_E4M3_B128, Ts[i], 8, 2, 256, 128, 48, false, 3e-2);
        moe_case(FM_PRESET_FP8, FM_W_E4M3_B128, Ts[i], 5, 2, 384, 176, 48, false, 3e-2);      /* I: 48 x 3 + 32 rows */
        moe_case(FM_PRESET_FP8, FM_W_E4M3_B128, Ts[i] + 23, 8, 2, 128, 128, 48, false, 3e-2); /* one K group */
        moe_case(FM_PRESET_FP8, FM_W_INT4_ZP_TC, Ts[i] + 23, 8, 2, 128, 128, 0, false, 3e-2);
    }
}

/* ---- the fused decode forms on these banks: each bit for bit the chain it replaces ---- */

/* a backend under route, after the command line's routes (the case's route wins) */
static fm_backend *backend_route(fm_preset p, const char *route) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    char routes[640];
    const char *cl = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%s%s", cl ? cl : "", cl ? "," : "", route);
    fm_backend *be;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, routes, &be, &err)) fail_msg("cuda backend (%s): %s", routes, err.msg);
    return be;
}

/* linear_add_rmsnorm (decode.fused: the o projection, its residual add and the next norm) on q's bank: the W4A8 GEMV
 * adding and normalising in its last CTA, called twice (its counter reset), against linear then add_rmsnorm; y also
 * against the double reference */
static void fused_linear_case(qlinear *q, fm_wformat fmt, int64_t M, const char *what) {
    const int64_t N = q->src.rows, K = q->src.cols;
    fm_backend *be = backend("cuda", FM_PRESET_FP8);
    fm_bank *wb = make_bank(be, &q->src, 1, 1, fmt, false);
    float *nw = rand_x(N), *x = rand_x(M * K), *r0 = rand_x(M * N);
    fm_bank *nb = gpu_bank(be, nw, 1, 1, N, be->plan.w_other, false);
    float *out[2][3]; /* chain, fused: y, residual, normed rows */
    for (int f = 0; f < 2; f++) {
        void *xd = gpu_upload(be, x, M * K), *base[3], *d[3];
        for (int o = 0; o < 3; o++) d[o] = gpu_guarded(be, M * N, &base[o]);
        for (int c = 0; c < (f ? 2 : 1); c++) {
            be->ops->upload_f32(be, r0, M * N, d[1]);
            if (f) be->ops->linear_add_rmsnorm(be, wb, xd, M, be->plan.a_dense, d[0], d[1], nb, 1e-6f, d[2]);
            else {
                be->ops->linear(be, wb, 0, xd, M, be->plan.a_dense, d[0]);
                be->ops->add_rmsnorm(be, d[1], d[0], nb, M, N, 1e-6f, d[2]);
            }
        }
        for (int o = 0; o < 3; o++) out[f][o] = gpu_fetch(be, base[o], M * N, "fused linear");
        be->ops->free(be, xd);
    }
    char label[200];
    snprintf(label, sizeof label, "linear_add_rmsnorm %s M=%lld N=%lld K=%lld", what, (long long)M, (long long)N,
             (long long)K);
    for (int o = 0; o < 3; o++)
        for (int64_t i = 0; i < M * N; i++)
            if (memcmp(&out[0][o][i], &out[1][o][i], sizeof(float)))
                fail_msg("%s: output %d element %lld: fused %.9g, chain %.9g", label, o, (long long)i, out[1][o][i],
                         out[0][o][i]);
    printf("  %-60s fused = chain bit for bit\n", label);
    float *ref = fp8_reference(x, q->w, M, K, N);
    gpu_expect_close(out[1][0], ref, M * N, 5e-3, label);
    for (int f = 0; f < 2; f++)
        for (int o = 0; o < 3; o++) free(out[f][o]);
    free(ref), free(nw), free(x), free(r0);
    be->ops->bank_free(be, wb), be->ops->bank_free(be, nb);
    be->ops->destroy(be);
}

/* the moe op with the down GEMV quantizing h itself (moe.down_quant=fused) against the quantizer launch, on the
 * decode GEMVs (moe.gemv=64): int4-zp-tc's group sums, e4m3-block's scales */
static void fused_moe_case(fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I, int32_t fp8_bn,
                           bool sym) {
    qexperts q = make_experts(E, H, I, fp8_bn, sym);
    float *x = rand_x(T * H), *wts = malloc((size_t)(T * k) * sizeof(float));
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++)
            ids[t * k + j] = (int32_t)((t * 5 + j * 3) % E), wts[t * k + j] = 0.3f + 0.1f * (float)j;
    float *o[2];
    const char *routes[2] = {"moe.gemv=64,moe.down_quant=kernel", "moe.gemv=64,moe.down_quant=fused"};
    for (int i = 0; i < 2; i++) {
        fm_backend *be = backend_route(FM_PRESET_FP8, routes[i]);
        fm_bank *gub = make_bank(be, q.gu, E, 2, fmt, true), *db = make_bank(be, q.dn, E, 1, fmt, false);
        o[i] = gpu_run_moe(be, gub, db, x, T, H, ids, wts, k);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
        be->ops->destroy(be);
    }
    char what[160];
    snprintf(what, sizeof what, "moe.down_quant=fused %s T=%lld E=%d k=%d H=%lld I=%lld%s", fm_wformat_name(fmt),
             (long long)T, E, k, (long long)H, (long long)I,
             fp8_bn ? ""
             : sym  ? " sym"
                    : " asym");
    for (int64_t i = 0; i < T * H; i++)
        if (memcmp(&o[0][i], &o[1][i], sizeof(float)))
            fail_msg("%s: element %lld: fused %.9g, quantizer launch %.9g", what, (long long)i, o[1][i], o[0][i]);
    printf("  %-60s = the quantizer launch, bit for bit\n", what);
    free(o[0]), free(o[1]), free(x), free(wts), free(ids);
    free_experts(&q);
}

static void test_fp8_prequant_fused(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 2, 8, 16};
    for (int i = 0; i < 4; i++) {
        qlinear q;
        make_ct(&q, 256, 384, 128, false, false);
        fused_linear_case(&q, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc G=128 asym");
        free_q(&q);
        make_ct(&q, 2048, 512, 128, true, false);
        fused_linear_case(&q, FM_W_INT4_ZP_TC, Ms[i], "int4-zp-tc G=128 sym");
        free_q(&q);
        make_fp8_block(&q, 256, 384, 128);
        fused_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 128x128");
        free_q(&q);
        make_fp8_block(&q, 2048, 200, 64);
        fused_linear_case(&q, FM_W_E4M3_B128, Ms[i], "e4m3-block 64x128, K padded to 256");
        free_q(&q);
    }
    const int64_t Ts[] = {1, 7, 21};
    for (int i = 0; i < 3; i++) {
        fused_moe_case(FM_W_INT4_ZP_TC, Ts[i], 8, 2, 256, 128, 0, false);
        fused_moe_case(FM_W_INT4_ZP_TC, Ts[i], 7, 3, 384, 256, 0, true);
        fused_moe_case(FM_W_E4M3_B128, Ts[i], 5, 2, 384, 176, 128, false);
        fused_moe_case(FM_W_E4M3_B128, Ts[i], 8, 2, 256, 128, 48, false);
    }
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int4zp_linear),       cmocka_unit_test(test_int4zp_moe),
        cmocka_unit_test(test_fp8_prequant_linear), cmocka_unit_test(test_fp8_prequant_refusals),
        cmocka_unit_test(test_fp8_prequant_moe),    cmocka_unit_test(test_fp8_prequant_fused),
    };
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
