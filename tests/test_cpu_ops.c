/* The CPU reference ops (src/backend/cpu) against naive double-precision references written here, on random
 * non-zero inputs (fixed seed) of odd sizes: M = 1, 3, 17; K = 200, 300 (not multiples of the 128-group).
 * Errors are norm-wise, ||out - ref|| / ||ref||, with the threshold and its reason stated at each check.
 * Each quantized format is checked as "the op equals a double-precision computation on the quantized
 * operands" (tight), which pins down what the format is; the distance to the unquantized result is
 * checked separately with a loose, explained bound. Outputs are poisoned with NaN before each op. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "quant/bf16.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "quant/kv_e4m3.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng;

static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }

static double urand(void) { /* uniform [0, 1) */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* uniform in [-a, a], never within a/100 of zero */
static float nzrand(float a) {
    for (;;) {
        float v = (float)((2.0 * urand() - 1.0) * a);
        if (fabsf(v) >= a / 100) return v;
    }
}

static float *rand_array(int64_t n, float a) {
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = nzrand(a);
    return p;
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n ? n : 1), sizeof *p);
    assert_non_null(p);
    return p;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static void poison(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
}

/* ||y - ref|| / ||ref|| (a NaN anywhere makes it NaN, which fails every "<" check) */
static double rel_err(const float *y, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den);
}

static double rel_err_ff(const float *y, const float *ref, int64_t n) {
    double *r = dalloc(n);
    for (int64_t i = 0; i < n; i++) r[i] = ref[i];
    double e = rel_err(y, r, n);
    free(r);
    return e;
}

#define assert_rel_below(err, bound)                                                                                   \
    do {                                                                                                               \
        double e_ = (err);                                                                                             \
        if (!(e_ < (bound))) fail_msg("%s = %.3g, not below %.3g", #err, e_, (double)(bound));                         \
    } while (0)

static bool all_bf16(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(fm_round_bf16(x[i]) == x[i])) return false;
    return true;
}

static int64_t count_nonzero(const float *x, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += x[i] != 0.0f;
    return c;
}

static fm_backend *make_backend(fm_preset p) {
    fm_plan plan;
    fm_plan_from_preset(p, &plan);
    fm_backend *be = NULL;
    fm_error err;
    assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);
    assert_non_null(be);
    assert_int_equal(be->ops->act_size, sizeof(float));
    return be;
}

static float *act(fm_backend *be, int64_t n) {
    float *p = be->ops->alloc(be, (size_t)n * be->ops->act_size);
    assert_non_null(p);
    poison(p, n);
    return p;
}

static char g_tensor_name[] = "test.weight";

static fm_st_tensor f32_tensor(const float *data, int64_t n, int64_t rows, int64_t cols) {
    fm_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = g_tensor_name;
    t.dtype = FM_DTYPE_F32;
    t.n_dims = 3;
    t.shape[0] = n;
    t.shape[1] = rows;
    t.shape[2] = cols;
    t.n_elements = n * rows * cols;
    t.data = (const uint8_t *)data;
    t.nbytes = (uint64_t)t.n_elements * sizeof(float);
    return t;
}

/* A bank of n [rows, cols] matrices stored contiguously in data. */
static fm_bank *make_bank(fm_backend *be, const float *data, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt) {
    fm_st_tensor t = f32_tensor(data, n, rows, cols);
    fm_wsrc *srcs = xmalloc((size_t)n * sizeof *srcs);
    for (int32_t i = 0; i < n; i++) srcs[i] = (fm_wsrc){&t, (int64_t)i * rows * cols, rows, cols, {0}, {0}};
    fm_bank_src src = {srcs, n, 1, "test bank", false, false};
    fm_bank *b = NULL;
    fm_error err;
    fm_status st = be->ops->bank_create(be, &src, fmt, &b, &err);
    if (st != FM_OK) fail_msg("bank_create: %s", err.msg);
    free(srcs);
    assert_non_null(b);
    return b;
}

/* A bank of n matrices, each the row concatenation of a[i] [ra, cols] and b[i] [rb, cols] (gate|up). */
static fm_bank *make_bank2(fm_backend *be, const float *a, const float *b, int32_t n, int64_t ra, int64_t rb,
                           int64_t cols, fm_wformat fmt) {
    fm_st_tensor ta = f32_tensor(a, n, ra, cols), tb = f32_tensor(b, n, rb, cols);
    fm_wsrc *srcs = xmalloc((size_t)(2 * n) * sizeof *srcs);
    for (int32_t i = 0; i < n; i++) {
        srcs[2 * i] = (fm_wsrc){&ta, (int64_t)i * ra * cols, ra, cols, {0}, {0}};
        srcs[2 * i + 1] = (fm_wsrc){&tb, (int64_t)i * rb * cols, rb, cols, {0}, {0}};
    }
    fm_bank_src src = {srcs, n, 2, "test gate_up", true, false};
    fm_bank *w = NULL;
    fm_error err;
    fm_status st = be->ops->bank_create(be, &src, fmt, &w, &err);
    if (st != FM_OK) fail_msg("bank_create: %s", err.msg);
    free(srcs);
    return w;
}

/* y[M, N] = x[M, K] w[N, K]^T in double */
static void ref_matmul(const double *x, const double *w, int64_t M, int64_t N, int64_t K, double *y) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += x[m * K + k] * w[n * K + k];
            y[m * N + n] = s;
        }
}

static double *to_double(const float *x, int64_t n) {
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* w [rows, K] quantized as the int4 banks are (sym, group 128, bf16 scales) and dequantized, in double */
static double *int4_dequant(const float *w, int64_t rows, int64_t K) {
    const fm_int4_params p = {128, true, FM_SCALE_BF16};
    const int64_t ng = fm_int4_n_groups(K, 128);
    int8_t *q = xmalloc((size_t)(rows * K));
    float *s = xmalloc((size_t)(rows * ng) * sizeof *s);
    float *d = xmalloc((size_t)(rows * K) * sizeof *d);
    fm_int4_quantize(w, rows, K, &p, q, s, NULL);
    fm_int4_dequantize(q, s, NULL, rows, K, &p, d);
    double *out = to_double(d, rows * K);
    free(q), free(s), free(d);
    return out;
}

/* x [M, K] quantized as afmt (per row; e4m3-tensor over the whole input) and dequantized, in double (code *
 * scale exactly) */
static double *act_dequant(const float *x, int64_t M, int64_t K, fm_afmt afmt) {
    double *out = dalloc(M * K);
    if (afmt == FM_A_E4M3_PT) { /* one scale: max(amax / 448, 1e-12) over all M K elements, written out here */
        float amax = 0.0f;
        for (int64_t i = 0; i < M * K; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const float s = amax / 448.0f > 1e-12f ? amax / 448.0f : 1e-12f;
        for (int64_t i = 0; i < M * K; i++) out[i] = (double)fm_e4m3_to_f32(fm_f32_to_e4m3(x[i] / s)) * (double)s;
        return out;
    }
    uint8_t *codes = xmalloc((size_t)K + 1);
    float *sc = xmalloc((size_t)(K / 128 + 1) * sizeof *sc);
    uint8_t *mxs = xmalloc((size_t)(K / 16 + 1)); /* MXFP4's scales per 32, NVFP4's per 16 */
    float *deq = xmalloc((size_t)K * sizeof *deq);
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * K;
        double *o = out + m * K;
        switch (afmt) {
        case FM_A_NATIVE:
            for (int64_t k = 0; k < K; k++) o[k] = xr[k];
            break;
        case FM_A_E4M3_G128:
            fm_e4m3_quantize_groups(xr, K, 128, codes, sc);
            for (int64_t k = 0; k < K; k++) o[k] = (double)fm_e4m3_to_f32(codes[k]) * (double)sc[k / 128];
            break;
        case FM_A_E4M3_PT: break; /* above */
        case FM_A_E4M3_ROW:
            for (int64_t k = 0; k < K; k++) deq[k] = 0.0f;
            {
                const float s = fm_e4m3_quantize_tensor(xr, K, deq);
                for (int64_t k = 0; k < K; k++) o[k] = (double)deq[k] * (double)s;
            }
            break;
        case FM_A_MXFP4:
            fm_mxfp4_quantize(xr, K, FM_MX_RCEIL, codes, mxs);
            fm_mxfp4_dequantize(codes, mxs, K, deq);
            for (int64_t k = 0; k < K; k++) o[k] = deq[k];
            break;
        case FM_A_NVFP4: { /* the tensor scale of all M K elements (the dispatch buffer's) */
            const float ts = fm_nvfp4_tensor_scale(x, M * K);
            fm_nvfp4_quantize(xr, K, ts, codes, mxs);
            fm_nvfp4_dequantize(codes, mxs, ts, K, deq);
            for (int64_t k = 0; k < K; k++) o[k] = deq[k];
            break;
        }
        }
    }
    free(codes), free(sc), free(mxs), free(deq);
    return out;
}

static const int64_t Ms[] = {1, 3, 17};
static const int64_t Ks[] = {200, 300};
#define N_OUT 37 /* output width: odd, not a multiple of the 16-row blocks of cpu_linear */

/* ---------------------------------------------------------------- linear */

/* ref plan, fp32 weights: fp32 dot products of <= 300 terms of size ~1 differ from double by a few ulps
 * times sqrt(K) (~1e-6 relative); 1e-5 leaves margin and still catches any wrong index or missing term. */
static void test_linear_f32(void **state) {
    (void)state;
    seed(1);
    fm_backend *be = make_backend(FM_PRESET_REF);
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t mi = 0; mi < 3; mi++) {
            const int64_t M = Ms[mi], K = Ks[ki], N = N_OUT;
            float *w = rand_array(2 * N * K, 1.0f), *x = rand_array(M * K, 1.0f);
            fm_bank *b = make_bank(be, w, 2, N, K, FM_W_F32);
            assert_int_equal(be->ops->bank_bytes(b), (size_t)(2 * N * K) * sizeof(float));
            for (int32_t idx = 0; idx < 2; idx++) {
                float *y = act(be, M * N);
                be->ops->linear(be, b, idx, x, M, FM_A_NATIVE, y);
                double *xd = to_double(x, M * K), *wd = to_double(w + idx * N * K, N * K), *r = dalloc(M * N);
                ref_matmul(xd, wd, M, N, K, r);
                assert_rel_below(rel_err(y, r, M * N), 1e-5);
                free(xd), free(wd), free(r);
                be->ops->free(be, y);
            }
            be->ops->bank_free(be, b);
            free(w), free(x);
        }
    be->ops->destroy(be);
}

/* int4 weights (sym, g128, bf16 scales) with native activations, on the ref plan (no output rounding). */
static void test_linear_int4(void **state) {
    (void)state;
    seed(2);
    fm_backend *be = make_backend(FM_PRESET_REF);
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t mi = 0; mi < 3; mi++) {
            const int64_t M = Ms[mi], K = Ks[ki], N = N_OUT;
            float *w = rand_array(2 * N * K, 1.0f), *x = rand_array(M * K, 1.0f);
            fm_bank *b = make_bank(be, w, 2, N, K, FM_W_INT4_G128);
            const int32_t idx = 1;
            float *y = act(be, M * N);
            be->ops->linear(be, b, idx, x, M, FM_A_NATIVE, y);
            double *xd = to_double(x, M * K), *wq = int4_dequant(w + idx * N * K, N, K);
            double *wd = to_double(w + idx * N * K, N * K), *rq = dalloc(M * N), *r = dalloc(M * N);
            ref_matmul(xd, wq, M, N, K, rq);
            ref_matmul(xd, wd, M, N, K, r);
            /* the same product as x times the dequantized weights: only fp32 summation order differs
             * (group scale applied per 128-group instead of per element), ~1e-6 */
            assert_rel_below(rel_err(y, rq, M * N), 1e-5);
            /* vs the fp32 weights: uniform [-1, 1] weights have rms 0.577; the int4 step is amax/7 ~ 0.143,
             * so the rounding error is uniform in +-0.071 with rms 0.143/sqrt(12) = 0.041, i.e. ~0.07 of the
             * weight rms, and random errors carry that ratio to the output. 0.15 is twice that; and the
             * error must not be ~0 either (the weights really were quantized). */
            const double e = rel_err(y, r, M * N);
            assert_rel_below(e, 0.15);
            assert_true(e > 0.01);
            free(xd), free(wq), free(wd), free(rq), free(r);
            be->ops->free(be, y);
            be->ops->bank_free(be, b);
            free(w), free(x);
        }
    be->ops->destroy(be);
}

/* Quantized activations: e4m3 1x128 and MXFP4 (RCEIL), with fp32 and with int4 weights (w4a8 / w4a4-dispatch).
 * The op must equal the double product of the quantized operands: 1e-5 as for fp32 (the codes times their
 * scales are exact in fp32, only the summation differs). */
static void test_linear_quant_act(void **state) {
    (void)state;
    seed(3);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const fm_afmt afmts[] = {FM_A_E4M3_G128, FM_A_MXFP4};
    const fm_wformat wfmts[] = {FM_W_F32, FM_W_INT4_G128};
    for (size_t ai = 0; ai < 2; ai++)
        for (size_t wi = 0; wi < 2; wi++)
            for (size_t ki = 0; ki < 2; ki++)
                for (size_t mi = 0; mi < 3; mi++) {
                    const int64_t M = Ms[mi], K = Ks[ki], N = N_OUT;
                    /* rows of different magnitudes so that the per-group / per-block scales differ */
                    float *w = rand_array(N * K, 1.0f), *x = rand_array(M * K, 1.0f);
                    for (int64_t i = 0; i < M * K; i++) x[i] *= (float)(1 + (i / 64) % 5) * 3.0f;
                    fm_bank *b = make_bank(be, w, 1, N, K, wfmts[wi]);
                    float *y = act(be, M * N), *yn = act(be, M * N);
                    be->ops->linear(be, b, 0, x, M, afmts[ai], y);
                    be->ops->linear(be, b, 0, x, M, FM_A_NATIVE, yn);
                    double *xq = act_dequant(x, M, K, afmts[ai]);
                    double *wd = wfmts[wi] == FM_W_F32 ? to_double(w, N * K) : int4_dequant(w, N, K);
                    double *r = dalloc(M * N);
                    ref_matmul(xq, wd, M, N, K, r);
                    assert_rel_below(rel_err(y, r, M * N), 1e-5);
                    /* and the activation quantization did change the result (e4m3: ~3% per element,
                     * E2M1: ~10%; both far above 1e-3) */
                    assert_true(rel_err_ff(y, yn, M * N) > 1e-3);
                    free(xq), free(wd), free(r);
                    be->ops->free(be, y), be->ops->free(be, yn);
                    be->ops->bank_free(be, b);
                    free(w), free(x);
                }
    be->ops->destroy(be);
}

/* W8A8 (--dense w8a8): e4m3 weights with one scale per matrix, e4m3 activations with one scale per input. The
 * op must equal the double product of the two dequantized operands (1e-5: codes times scales are exact, only
 * the fp32 summation differs); an all-zero input gives zeros, not NaN (the scale floor); and one outlier channel
 * costs the other activations their precision (the per-tensor scale follows the outlier), which the 1x128 groups
 * of e4m3-1x128 limit to the outlier's group. */
static void test_linear_w8a8(void **state) {
    (void)state;
    seed(4);
    fm_backend *be = make_backend(FM_PRESET_REF);
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t mi = 0; mi < 3; mi++) {
            const int64_t M = Ms[mi], K = Ks[ki], N = N_OUT;
            float *w = rand_array(2 * N * K, 0.1f), *x = rand_array(M * K, 1.0f);
            fm_bank *b = make_bank(be, w, 2, N, K, FM_W_E4M3_PT);
            assert_int_equal(be->ops->bank_bytes(b), (size_t)(2 * N * K) * sizeof(float) + 2 * sizeof(float));
            float *y = act(be, M * N);
            be->ops->linear(be, b, 1, x, M, FM_A_E4M3_PT, y);
            double *xq = act_dequant(x, M, K, FM_A_E4M3_PT), *wq = act_dequant(w + N * K, 1, N * K, FM_A_E4M3_PT);
            double *r = dalloc(M * N);
            ref_matmul(xq, wq, M, N, K, r);
            assert_rel_below(rel_err(y, r, M * N), 1e-5);
            /* zeros in, zeros out */
            float *z = act(be, M * K);
            for (int64_t i = 0; i < M * K; i++) z[i] = 0.0f;
            be->ops->linear(be, b, 0, z, M, FM_A_E4M3_PT, y);
            for (int64_t i = 0; i < M * N; i++) assert_true(y[i] == 0.0f);
            /* an outlier channel: per tensor loses more than 1x128 groups do on the same input */
            for (int64_t m = 0; m < M; m++) x[m * K] = 200.0f;
            double *xd = to_double(x, M * K), *xt = act_dequant(x, M, K, FM_A_E4M3_PT);
            double *xg = act_dequant(x, M, K, FM_A_E4M3_G128);
            double et = 0, eg = 0, n2 = 0;
            for (int64_t i = 0; i < M * K; i++) {
                if (i % K == 0) continue;
                et += (xt[i] - xd[i]) * (xt[i] - xd[i]), eg += (xg[i] - xd[i]) * (xg[i] - xd[i]), n2 += xd[i] * xd[i];
            }
            printf("  w8a8 M=%lld K=%lld: outlier 200 -> rel. error of the other activations, per tensor %.3g, 1x128 "
                   "%.3g\n",
                   (long long)M, (long long)K, sqrt(et / n2), sqrt(eg / n2));
            assert_true(et > eg);
            free(xq), free(wq), free(r), free(xd), free(xt), free(xg);
            be->ops->free(be, y), be->ops->free(be, z);
            be->ops->bank_free(be, b);
            free(w), free(x);
        }
    be->ops->destroy(be);
}

/* The accuracy study of issue 4 (printed for bench/NOTES.md, asserted loosely): the Qwen3-30B-A3B q|k|v projection
 * (N 5120, K 2048) at M = 16 on the CPU's exact emulation of each format, error relative to the bf16 op (bf16
 * weights and activations, fp32 sums), for inputs of unit scale (a), with outlier channels (b: every 97th channel
 * x 20), and with one token carrying a massive activation (c: 500 in one channel of row 3). Weights uniform with
 * variance 1/K, as the synthetic models. W8A8 per tensor vs per row (token) activation scales, W4A8 (int4 g128 x
 * e4m3 1x128, the fp8 preset) and W4A16 (int4 x bf16, the int4 preset). */
static void test_w8a8_accuracy_study(void **state) {
    (void)state;
    seed(9);
    const int64_t M = 16, K = 2048, N = 5120;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan); /* bf16 activations at op boundaries, as on the GPU */
    fm_backend *be = NULL;
    fm_error err;
    assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);
    float *w = rand_array(N * K, sqrtf(3.0f / (float)K));
    fm_bank *wb = make_bank(be, w, 1, N, K, FM_W_BF16), *w8 = make_bank(be, w, 1, N, K, FM_W_E4M3_PT);
    fm_bank *w4 = make_bank(be, w, 1, N, K, FM_W_INT4_G128);
    const char *cases[] = {"(a) unit scale", "(b) outlier channels x20", "(c) one token with a 500"};
    printf("  | input | W8A8 per tensor | W8A8 per row | W4A8 (1x128) | W4A16 |\n");
    for (int c = 0; c < 3; c++) {
        float *x = rand_array(M * K, sqrtf(3.0f));
        for (int64_t i = 0; i < M * K; i++)
            if (c == 1 && (i % K) % 97 == 0) x[i] *= 20.0f;
        if (c == 2) x[3 * K + 11] = 500.0f;
        float *y = act(be, M * N), *ref = act(be, M * N);
        be->ops->linear(be, wb, 0, x, M, FM_A_NATIVE, ref);
        double e[4];
        const struct {
            fm_bank *b;
            fm_afmt a;
        } v[4] = {{w8, FM_A_E4M3_PT}, {w8, FM_A_E4M3_ROW}, {w4, FM_A_E4M3_G128}, {w4, FM_A_NATIVE}};
        for (int i = 0; i < 4; i++) {
            be->ops->linear(be, v[i].b, 0, x, M, v[i].a, y);
            e[i] = rel_err_ff(y, ref, M * N);
        }
        printf("  | %s | %.3g | %.3g | %.3g | %.3g |\n", cases[c], e[0], e[1], e[2], e[3]);
        for (int i = 0; i < 4; i++) assert_true(e[i] > 1e-4 && e[i] < 0.2);
        assert_true(e[0] < e[2]);              /* e4m3 weights with one scale lose less than int4 in 128-groups */
        if (c == 2) assert_true(e[1] <= e[0]); /* the massive token costs the other tokens only per tensor */
        be->ops->free(be, y), be->ops->free(be, ref);
        free(x);
    }
    be->ops->bank_free(be, wb), be->ops->bank_free(be, w8), be->ops->bank_free(be, w4);
    free(w);
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- bf16 activations (quantized presets) */

/* With act_bf16 every op's output is a bf16 value, and it is exactly the bf16 rounding of what the same
 * op computes in fp32 on the ref plan (the plan changes nothing else in an op). */
static void test_output_rounding(void **state) {
    (void)state;
    seed(4);
    const fm_preset presets[] = {FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP4};
    fm_backend *ref = make_backend(FM_PRESET_REF);
    for (size_t pi = 0; pi < 3; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        assert_true(be->plan.act_bf16);
        const int64_t M = 17, K = 300, N = N_OUT;
        float *w = rand_array(N * K, 1.0f), *x = rand_array(M * K, 2.0f), *nw = rand_array(K, 1.0f);
        for (int64_t i = 0; i < M * K; i++) x[i] = fm_round_bf16(x[i]); /* bf16 activations in */

        /* linear: int4 weights, the plan's dense activation format */
        fm_bank *b = make_bank(be, w, 1, N, K, be->plan.w_dense), *b32 = make_bank(ref, w, 1, N, K, be->plan.w_dense);
        float *y = act(be, M * N), *y32 = act(ref, M * N);
        be->ops->linear(be, b, 0, x, M, be->plan.a_dense, y);
        ref->ops->linear(ref, b32, 0, x, M, be->plan.a_dense, y32);
        assert_true(all_bf16(y, M * N));
        assert_int_equal(count_nonzero(y, M * N), M * N);
        for (int64_t i = 0; i < M * N; i++) assert_true(y[i] == fm_round_bf16(y32[i]));

        /* rmsnorm: bf16 weight bank */
        fm_bank *nb = make_bank(be, nw, 1, 1, K, be->plan.w_other), *nb32 = make_bank(ref, nw, 1, 1, K, FM_W_BF16);
        float *o = act(be, M * K), *o32 = act(ref, M * K);
        be->ops->rmsnorm(be, x, nb, M, K, 1e-6f, o);
        ref->ops->rmsnorm(ref, x, nb32, M, K, 1e-6f, o32);
        assert_true(all_bf16(o, M * K));
        assert_int_equal(count_nonzero(o, M * K), M * K);
        for (int64_t i = 0; i < M * K; i++) assert_true(o[i] == fm_round_bf16(o32[i]));

        /* add: acc += x, both bf16 in; the sum is rounded back to bf16 */
        float *acc = act(be, M * K), *acc32 = act(ref, M * K);
        for (int64_t i = 0; i < M * K; i++) acc[i] = acc32[i] = fm_round_bf16(nzrand(1.0f));
        be->ops->add(be, acc, o, M * K);
        ref->ops->add(ref, acc32, o, M * K);
        assert_true(all_bf16(acc, M * K));
        for (int64_t i = 0; i < M * K; i++) assert_true(acc[i] == fm_round_bf16(acc32[i]));
        int64_t changed = 0; /* most sums of two random bf16 values are not bf16 values: rounding happened */
        for (int64_t i = 0; i < M * K; i++) changed += acc32[i] != acc[i];
        assert_true(changed > M * K / 4);

        /* swiglu */
        const int64_t I = 72;
        float *gu = rand_array(M * 2 * I, 3.0f), *h = act(be, M * I), *h32 = act(ref, M * I);
        be->ops->swiglu(be, gu, M, I, h);
        ref->ops->swiglu(ref, gu, M, I, h32);
        assert_true(all_bf16(h, M * I));
        for (int64_t i = 0; i < M * I; i++) assert_true(h[i] == fm_round_bf16(h32[i]));

        /* qk_norm_rope (q and k rounded; v untouched) and attention */
        const int32_t nh = 4, nkv = 2, hd = 16, ld = (nh + 2 * nkv) * hd;
        const int64_t T = 9;
        float *qkv = rand_array(T * ld, 1.0f);
        for (int64_t i = 0; i < T * ld; i++) qkv[i] = fm_round_bf16(qkv[i]);
        float *qkv32 = xmalloc((size_t)(T * ld) * sizeof(float));
        memcpy(qkv32, qkv, (size_t)(T * ld) * sizeof(float));
        float *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
        fm_bank *qnb = make_bank(be, qn, 1, 1, hd, FM_W_BF16), *knb = make_bank(be, kn, 1, 1, hd, FM_W_BF16);
        be->ops->qk_norm_rope(be, qkv, T, nh, nkv, hd, qnb, knb, 1e-6f, 5, NULL, 1e6);
        ref->ops->qk_norm_rope(ref, qkv32, T, nh, nkv, hd, qnb, knb, 1e-6f, 5, NULL, 1e6);
        assert_true(all_bf16(qkv, T * ld));
        for (int64_t i = 0; i < T * ld; i++) assert_true(qkv[i] == fm_round_bf16(qkv32[i]));
        float *ao = act(be, T * nh * hd), *ao32 = act(ref, T * nh * hd);
        be->ops->attention(be, qkv, T, nh, nkv, hd, ao);
        ref->ops->attention(ref, qkv, T, nh, nkv, hd, ao32);
        assert_true(all_bf16(ao, T * nh * hd));
        for (int64_t i = 0; i < T * nh * hd; i++) assert_true(ao[i] == fm_round_bf16(ao32[i]));

        /* route weights */
        const int32_t E = 8, k = 2;
        float *logits = rand_array(T * E, 2.0f), *rw = act(be, T * k);
        int32_t *ids = xmalloc((size_t)(T * k) * sizeof *ids);
        be->ops->route(be, logits, T, E, k, FM_ROUTER_SOFTMAX_TOPK, true, ids, rw);
        assert_true(all_bf16(rw, T * k));
        be->ops->route(be, logits, T, E, k, FM_ROUTER_TOPK_SOFTMAX, true, ids, rw);
        assert_true(all_bf16(rw, T * k));

        /* moe and embed */
        const int64_t H = 200;
        float *g = rand_array(E * I * H, 1.0f), *u = rand_array(E * I * H, 1.0f), *dn = rand_array(E * H * I, 1.0f);
        fm_bank *gub = make_bank2(be, g, u, E, I, I, H, be->plan.w_expert),
                *db = make_bank(be, dn, E, H, I, be->plan.w_expert);
        float *mo = act(be, T * H);
        be->ops->moe(be, gub, db, x, T, ids, rw, k, be->plan.a_dispatch, be->plan.a_expert, mo);
        assert_true(all_bf16(mo, T * H));
        assert_int_equal(count_nonzero(mo, T * H), T * H);
        fm_bank *tb = make_bank(be, w, 1, N, K, be->plan.w_other);
        int32_t tid[3] = {5, 0, 36};
        float *eo = act(be, 3 * K);
        be->ops->embed(be, tb, tid, 3, eo);
        assert_true(all_bf16(eo, 3 * K));
        for (int64_t i = 0; i < K; i++) assert_true(eo[K + i] == fm_round_bf16(w[i]));

        be->ops->bank_free(be, b), ref->ops->bank_free(ref, b32);
        be->ops->bank_free(be, nb), ref->ops->bank_free(ref, nb32);
        be->ops->bank_free(be, qnb), be->ops->bank_free(be, knb);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db), be->ops->bank_free(be, tb);
        be->ops->free(be, y), ref->ops->free(ref, y32), be->ops->free(be, o), ref->ops->free(ref, o32);
        be->ops->free(be, acc), ref->ops->free(ref, acc32), be->ops->free(be, h), ref->ops->free(ref, h32);
        be->ops->free(be, ao), ref->ops->free(ref, ao32), be->ops->free(be, rw), be->ops->free(be, mo);
        be->ops->free(be, eo);
        free(w), free(x), free(nw), free(gu), free(qkv), free(qkv32), free(qn), free(kn), free(logits), free(ids);
        free(g), free(u), free(dn);
        be->ops->destroy(be);
    }
    ref->ops->destroy(ref);
}

/* ---------------------------------------------------------------- element-wise ops */

/* rmsnorm: fp32 sum of squares of <= 300 terms and one rsqrt: ~1e-7 relative; bound 1e-5. */
static void test_rmsnorm(void **state) {
    (void)state;
    seed(5);
    fm_backend *be = make_backend(FM_PRESET_REF);
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t mi = 0; mi < 3; mi++) {
            const int64_t M = Ms[mi], K = Ks[ki];
            const float eps = 1e-5f;
            float *x = rand_array(M * K, 3.0f), *w = rand_array(K, 1.0f), *o = act(be, M * K);
            fm_bank *b = make_bank(be, w, 1, 1, K, FM_W_F32);
            be->ops->rmsnorm(be, x, b, M, K, eps, o);
            double *r = dalloc(M * K);
            for (int64_t m = 0; m < M; m++) {
                double ss = 0;
                for (int64_t i = 0; i < K; i++) ss += (double)x[m * K + i] * x[m * K + i];
                const double inv = 1.0 / sqrt(ss / (double)K + (double)eps);
                for (int64_t i = 0; i < K; i++) r[m * K + i] = (double)w[i] * x[m * K + i] * inv;
            }
            assert_rel_below(rel_err(o, r, M * K), 1e-5);
            /* the output is in place-safe: x == out gives the same result */
            float *xi = xmalloc((size_t)(M * K) * sizeof *xi);
            memcpy(xi, x, (size_t)(M * K) * sizeof *xi);
            be->ops->rmsnorm(be, xi, b, M, K, eps, xi);
            assert_memory_equal(xi, o, (size_t)(M * K) * sizeof *xi);
            free(xi), free(r), free(x), free(w);
            be->ops->free(be, o);
            be->ops->bank_free(be, b);
        }
    be->ops->destroy(be);
}

/* swiglu: one expf and a division per element, a few ulps: bound 1e-5. add: fp32 addition is correctly
 * rounded, so it equals the double sum rounded to fp32 exactly. */
static void test_swiglu_add(void **state) {
    (void)state;
    seed(6);
    fm_backend *be = make_backend(FM_PRESET_REF);
    for (size_t mi = 0; mi < 3; mi++) {
        const int64_t M = Ms[mi], I = 72;
        float *gu = rand_array(M * 2 * I, 6.0f), *o = act(be, M * I);
        be->ops->swiglu(be, gu, M, I, o);
        double *r = dalloc(M * I);
        for (int64_t m = 0; m < M; m++)
            for (int64_t i = 0; i < I; i++) {
                const double g = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i];
                r[m * I + i] = g / (1.0 + exp(-g)) * u;
            }
        assert_rel_below(rel_err(o, r, M * I), 1e-5);
        float *acc = rand_array(M * I, 1.0f), *acc0 = xmalloc((size_t)(M * I) * sizeof *acc0);
        memcpy(acc0, acc, (size_t)(M * I) * sizeof *acc0);
        be->ops->add(be, acc, o, M * I);
        for (int64_t i = 0; i < M * I; i++) assert_true(acc[i] == (float)((double)acc0[i] + (double)o[i]));
        free(gu), free(r), free(acc), free(acc0);
        be->ops->free(be, o);
    }
    be->ops->destroy(be);
}

static void test_embed(void **state) {
    (void)state;
    seed(7);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int64_t V = 11, H = 200, T = 5;
    float *tab = rand_array(V * H, 1.0f), *o = act(be, T * H);
    fm_bank *b = make_bank(be, tab, 1, V, H, FM_W_F32);
    const int32_t ids[5] = {10, 0, 3, 3, 7};
    be->ops->embed(be, b, ids, T, o);
    for (int64_t t = 0; t < T; t++) assert_memory_equal(o + t * H, tab + ids[t] * H, (size_t)H * sizeof(float));
    be->ops->bank_free(be, b);
    be->ops->free(be, o);
    free(tab);
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- routing */

/* The double-precision definition of both router kinds: ids and weights of one token. */
static void ref_route(const float *l, int32_t E, int32_t k, fm_router_kind kind, bool norm, int32_t *ids, double *w) {
    /* top-k of the logits (the softmax is monotonic, so also of the probabilities), descending */
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        ids[j] = best;
    }
    if (kind == FM_ROUTER_SOFTMAX_TOPK) {
        double mx = -INFINITY, s = 0, sk = 0;
        for (int32_t e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int32_t e = 0; e < E; e++) s += exp((double)l[e] - mx);
        for (int32_t j = 0; j < k; j++) sk += (w[j] = exp((double)l[ids[j]] - mx) / s);
        if (norm)
            for (int32_t j = 0; j < k; j++) w[j] /= sk;
    } else {
        double s = 0;
        for (int32_t j = 0; j < k; j++) s += (w[j] = exp((double)l[ids[j]] - l[ids[0]]));
        for (int32_t j = 0; j < k; j++) w[j] /= s;
    }
}

/* Weights are probabilities in (0, 1]: an fp32 softmax is within a few ulps of 1, so |w - ref| < 1e-6. */
static void test_route(void **state) {
    (void)state;
    seed(8);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t Es[] = {8, 13, 60}, kk[] = {2, 3, 8};
    for (size_t ci = 0; ci < 3; ci++) {
        const int32_t E = Es[ci], k = kk[ci];
        const int64_t T = 17;
        float *logits = rand_array(T * E, 4.0f);
        int32_t *ids = xmalloc((size_t)(T * k) * sizeof *ids), *ids2 = xmalloc((size_t)(T * k) * sizeof *ids2);
        float *w = act(be, T * k), *w2 = act(be, T * k);
        int32_t rid[8];
        double rw[8];
        const struct {
            fm_router_kind kind;
            bool norm;
        } cases[] = {{FM_ROUTER_SOFTMAX_TOPK, true}, {FM_ROUTER_SOFTMAX_TOPK, false}, {FM_ROUTER_TOPK_SOFTMAX, true}};
        for (size_t c = 0; c < 3; c++) {
            poison(w, T * k);
            be->ops->route(be, logits, T, E, k, cases[c].kind, cases[c].norm, ids, w);
            for (int64_t t = 0; t < T; t++) {
                const float *l = logits + t * E;
                ref_route(l, E, k, cases[c].kind, cases[c].norm, rid, rw);
                double sum = 0;
                for (int32_t j = 0; j < k; j++) {
                    assert_int_equal(ids[t * k + j], rid[j]);
                    assert_true(fabs(w[t * k + j] - rw[j]) < 1e-6);
                    sum += w[t * k + j];
                    if (j) { /* descending by value, weights too */
                        assert_true(l[ids[t * k + j - 1]] > l[ids[t * k + j]]);
                        assert_true(w[t * k + j - 1] >= w[t * k + j]);
                    }
                }
                for (int32_t e = 0; e < E; e++) { /* every expert not chosen is at most the k-th */
                    bool chosen = false;
                    for (int32_t j = 0; j < k; j++) chosen |= ids[t * k + j] == e;
                    if (!chosen) assert_true(l[e] <= l[ids[t * k + k - 1]]);
                }
                if (cases[c].norm) assert_true(fabs(sum - 1.0) < 1e-6);
                else assert_true(sum < 1.0 && sum > 0.0);
            }
        }
        /* Qwen3 with norm == Mixtral: softmax over all then renormalised over the k equals the softmax over
         * the k logits (the common factor cancels) */
        be->ops->route(be, logits, T, E, k, FM_ROUTER_SOFTMAX_TOPK, true, ids, w);
        be->ops->route(be, logits, T, E, k, FM_ROUTER_TOPK_SOFTMAX, true, ids2, w2);
        assert_memory_equal(ids, ids2, (size_t)(T * k) * sizeof *ids);
        for (int64_t i = 0; i < T * k; i++) assert_true(fabsf(w[i] - w2[i]) < 1e-6f);
        free(logits), free(ids), free(ids2);
        be->ops->free(be, w), be->ops->free(be, w2);
    }
    be->ops->destroy(be);
}

/* Equal logits: the lower expert index comes first, and equal weights. */
static void test_route_ties(void **state) {
    (void)state;
    fm_backend *be = make_backend(FM_PRESET_REF);
    const float logits[6] = {1.0f, 2.0f, 0.5f, 2.0f, -1.0f, 2.0f};
    int32_t ids[2];
    float w[2];
    for (int kind = 0; kind < 2; kind++) {
        be->ops->route(be, logits, 1, 6, 2, (fm_router_kind)kind, true, ids, w);
        assert_int_equal(ids[0], 1);
        assert_int_equal(ids[1], 3);
        assert_true(w[0] == w[1]);
        assert_true(fabsf(w[0] - 0.5f) < 1e-7f);
    }
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- qk_norm_rope */

static void test_rope_by_hand(void **state) {
    (void)state;
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t hd = 8, ld = 3 * hd; /* nh = nkv = 1: q | k | v */
    float qkv[24] = {0};
    qkv[0] = 1.0f;      /* q = e_0: pair (0, 4) at frequency theta^0 = 1 */
    qkv[hd + 1] = 1.0f; /* k = e_1: pair (1, 5) at frequency theta^(-2/8) = 0.1 */
    for (int i = 0; i < hd; i++) qkv[2 * hd + i] = (float)(i + 1);
    be->ops->qk_norm_rope(be, qkv, 1, 1, 1, hd, NULL, NULL, 1e-6f, 1, NULL, 10000.0);
    const double c1 = cos(1.0), s1 = sin(1.0), c01 = cos(0.1), s01 = sin(0.1);
    assert_true(fabs(qkv[0] - c1) < 1e-6);
    assert_true(fabs(qkv[4] - s1) < 1e-6);
    for (int i = 0; i < hd; i++)
        if (i != 0 && i != 4) assert_true(qkv[i] == 0.0f); /* nothing at index 1 (not interleaved pairs) */
    assert_true(fabs(qkv[hd + 1] - c01) < 1e-6);
    assert_true(fabs(qkv[hd + 5] - s01) < 1e-6);
    for (int i = 0; i < hd; i++)
        if (i != 1 && i != 5) assert_true(qkv[hd + i] == 0.0f);
    for (int i = 0; i < hd; i++) assert_true(qkv[2 * hd + i] == (float)(i + 1)); /* v untouched */
    /* a second half input rotates the other way: e_4 -> -sin at 0, cos at 4 */
    float q2[24] = {0};
    q2[4] = 1.0f;
    be->ops->qk_norm_rope(be, q2, 1, 1, 1, hd, NULL, NULL, 1e-6f, 1, NULL, 10000.0);
    assert_true(fabs(q2[0] + s1) < 1e-6);
    assert_true(fabs(q2[4] - c1) < 1e-6);
    (void)ld;
    be->ops->destroy(be);
}

/* Position 0 without norm is the identity; later positions are not. */
static void test_rope_position0_identity(void **state) {
    (void)state;
    seed(9);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nh = 4, nkv = 2, hd = 32, ld = (nh + 2 * nkv) * hd;
    const int64_t T = 3;
    float *qkv = rand_array(T * ld, 1.0f), *orig = xmalloc((size_t)(T * ld) * sizeof(float));
    memcpy(orig, qkv, (size_t)(T * ld) * sizeof(float));
    be->ops->qk_norm_rope(be, qkv, T, nh, nkv, hd, NULL, NULL, 1e-6f, 0, NULL, 10000.0);
    assert_memory_equal(qkv, orig, (size_t)ld * sizeof(float));
    for (int64_t t = 1; t < T; t++) {
        assert_memory_not_equal(qkv + t * ld, orig + t * ld, (size_t)(nh + nkv) * hd * sizeof(float));
        assert_memory_equal(qkv + t * ld + (nh + nkv) * hd, orig + t * ld + (nh + nkv) * hd,
                            (size_t)nkv * hd * sizeof(float));
    }
    free(qkv), free(orig);
    be->ops->destroy(be);
}

/* With q_norm / k_norm: per-head RMSNorm then rotate-half RoPE at positions pos0 + t, vs double.
 * The op computes inv_freq, the angle and cos/sin in fp32 as transformers does: angles up to ~pos0 + T
 * carry ~1e-7 relative error, plus the norm's ~1e-7; bound 1e-5. */
static void test_qk_norm_rope_vs_double(void **state) {
    (void)state;
    seed(10);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nh = 4, nkv = 2, hd = 64, ld = (nh + 2 * nkv) * hd, half = hd / 2;
    const int64_t T = 5, pos0 = 7;
    const double theta = 1e6;
    const float eps = 1e-6f;
    float *qkv = rand_array(T * ld, 2.0f), *qn = rand_array(hd, 1.5f), *kn = rand_array(hd, 1.5f);
    fm_bank *qb = make_bank(be, qn, 1, 1, hd, FM_W_F32), *kb = make_bank(be, kn, 1, 1, hd, FM_W_F32);
    double *r = to_double(qkv, T * ld);
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < nh + nkv; h++) {
            double *x = r + t * ld + h * hd;
            const float *nw = h < nh ? qn : kn;
            double ss = 0;
            for (int32_t i = 0; i < hd; i++) ss += x[i] * x[i];
            const double inv = 1.0 / sqrt(ss / hd + (double)eps);
            for (int32_t i = 0; i < hd; i++) x[i] = nw[i] * x[i] * inv;
            for (int32_t j = 0; j < half; j++) {
                const double f = (double)(pos0 + t) * pow(theta, -2.0 * j / hd);
                const double a = x[j], b = x[j + half];
                x[j] = a * cos(f) - b * sin(f);
                x[j + half] = b * cos(f) + a * sin(f);
            }
        }
    float *orig = xmalloc((size_t)(T * ld) * sizeof(float));
    memcpy(orig, qkv, (size_t)(T * ld) * sizeof(float));
    be->ops->qk_norm_rope(be, qkv, T, nh, nkv, hd, qb, kb, eps, pos0, NULL, theta);
    assert_rel_below(rel_err(qkv, r, T * ld), 1e-5);
    for (int64_t t = 0; t < T; t++) /* v exactly untouched */
        assert_memory_equal(qkv + t * ld + (nh + nkv) * hd, orig + t * ld + (nh + nkv) * hd,
                            (size_t)nkv * hd * sizeof(float));
    free(qkv), free(qn), free(kn), free(r), free(orig);
    be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- attention */

static void ref_attention(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, double *out) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    double *p = dalloc(T);
    for (int32_t h = 0; h < nh; h++) {
        const int32_t kvh = h / (nh / nkv);
        for (int64_t t = 0; t < T; t++) {
            const float *q = qkv + t * ld + h * hd;
            double mx = -INFINITY, s = 0;
            for (int64_t j = 0; j <= t; j++) {
                const float *k = qkv + j * ld + (nh + kvh) * hd;
                double d = 0;
                for (int32_t i = 0; i < hd; i++) d += (double)q[i] * k[i];
                p[j] = d / sqrt((double)hd);
                mx = fmax(mx, p[j]);
            }
            for (int64_t j = 0; j <= t; j++) s += (p[j] = exp(p[j] - mx));
            double *o = out + t * nh * hd + h * hd;
            for (int32_t i = 0; i < hd; i++) o[i] = 0;
            for (int64_t j = 0; j <= t; j++) {
                const float *v = qkv + j * ld + (nh + nkv + kvh) * hd;
                for (int32_t i = 0; i < hd; i++) o[i] += p[j] / s * v[i];
            }
        }
    }
    free(p);
}

/* Position 0 attends only to itself: its output is v of its kv head, exactly (softmax of one score is 1). */
static void test_attention_causal(void **state) {
    (void)state;
    seed(11);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nh = 4, nkv = 2, hd = 16, ld = (nh + 2 * nkv) * hd;
    const int64_t T = 7;
    float *qkv = rand_array(T * ld, 2.0f), *o = act(be, T * nh * hd), *o2 = act(be, T * nh * hd);
    be->ops->attention(be, qkv, T, nh, nkv, hd, o);
    for (int32_t h = 0; h < nh; h++)
        assert_memory_equal(o + h * hd, qkv + (nh + nkv + h / 2) * hd, (size_t)hd * sizeof(float));
    /* changing q, k and v of the last position changes no earlier output, and does change the last */
    for (int32_t i = 0; i < ld; i++) qkv[(T - 1) * ld + i] = nzrand(2.0f);
    be->ops->attention(be, qkv, T, nh, nkv, hd, o2);
    assert_memory_equal(o, o2, (size_t)((T - 1) * nh * hd) * sizeof(float));
    assert_memory_not_equal(o + (T - 1) * nh * hd, o2 + (T - 1) * nh * hd, (size_t)(nh * hd) * sizeof(float));
    /* and a middle position's k/v changes outputs from that position on only */
    const int64_t tm = 3;
    for (int32_t i = nh * hd; i < ld; i++) qkv[tm * ld + i] = nzrand(2.0f);
    be->ops->attention(be, qkv, T, nh, nkv, hd, o);
    assert_memory_equal(o, o2, (size_t)(tm * nh * hd) * sizeof(float));
    for (int64_t t = tm; t < T; t++)
        assert_memory_not_equal(o + t * nh * hd, o2 + t * nh * hd, (size_t)(nh * hd) * sizeof(float));
    free(qkv);
    be->ops->free(be, o), be->ops->free(be, o2);
    be->ops->destroy(be);
}

/* nh = 4, nkv = 2: heads 0, 1 read kv head 0 and heads 2, 3 kv head 1. */
static void test_attention_gqa(void **state) {
    (void)state;
    seed(12);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nh = 4, nkv = 2, hd = 16, ld = (nh + 2 * nkv) * hd;
    const int64_t T = 6;
    float *qkv = rand_array(T * ld, 2.0f), *o = act(be, T * nh * hd), *o2 = act(be, T * nh * hd);
    be->ops->attention(be, qkv, T, nh, nkv, hd, o);
    for (int32_t kvh = 0; kvh < nkv; kvh++) {
        /* new k and v for kv head kvh at every position */
        for (int64_t t = 0; t < T; t++)
            for (int32_t i = 0; i < hd; i++) {
                qkv[t * ld + (nh + kvh) * hd + i] = nzrand(2.0f);
                qkv[t * ld + (nh + nkv + kvh) * hd + i] = nzrand(2.0f);
            }
        be->ops->attention(be, qkv, T, nh, nkv, hd, o2);
        for (int64_t t = 0; t < T; t++)
            for (int32_t h = 0; h < nh; h++) {
                const float *a = o + t * nh * hd + h * hd, *b = o2 + t * nh * hd + h * hd;
                if (h / 2 == kvh) assert_memory_not_equal(a, b, (size_t)hd * sizeof(float));
                else assert_memory_equal(a, b, (size_t)hd * sizeof(float));
            }
        memcpy(o, o2, (size_t)(T * nh * hd) * sizeof(float));
    }
    free(qkv);
    be->ops->free(be, o), be->ops->free(be, o2);
    be->ops->destroy(be);
}

/* vs double (MHA, GQA, MQA): fp32 dot products of hd terms, an fp32 softmax over <= 17 scores and a
 * weighted sum: ~1e-7 relative; bound 1e-5. */
static void test_attention_vs_double(void **state) {
    (void)state;
    seed(13);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nkvs[] = {4, 2, 1};
    for (size_t c = 0; c < 3; c++)
        for (size_t mi = 0; mi < 3; mi++) {
            const int32_t nh = 4, nkv = nkvs[c], hd = 32, ld = (nh + 2 * nkv) * hd;
            const int64_t T = Ms[mi];
            float *qkv = rand_array(T * ld, 2.0f), *o = act(be, T * nh * hd);
            double *r = dalloc(T * nh * hd);
            be->ops->attention(be, qkv, T, nh, nkv, hd, o);
            ref_attention(qkv, T, nh, nkv, hd, r);
            assert_rel_below(rel_err(o, r, T * nh * hd), 1e-5);
            free(qkv), free(r);
            be->ops->free(be, o);
        }
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- paged KV cache */

/* Block tables for nseq sequences of len[s] tokens in blocks of bt: every block id of the pool [0, n_blocks) at
 * most once, in a shuffled order (block ids unrelated to sequence order), -1 past a sequence's last block; `spare`
 * blocks stay unused (their slots keep the cache's NaN poison, so reading one shows). */
static int32_t *paged_tables(int32_t nseq, const int32_t *len, int32_t bt, int32_t max_blocks, int32_t spare,
                             int32_t *n_blocks) {
    int32_t used = 0;
    for (int32_t s = 0; s < nseq; s++) used += (len[s] + bt - 1) / bt;
    *n_blocks = used + spare;
    int32_t *perm = xmalloc((size_t)*n_blocks * sizeof *perm);
    for (int32_t i = 0; i < *n_blocks; i++) perm[i] = i;
    for (int32_t i = *n_blocks - 1; i > 0; i--) { /* Fisher-Yates */
        const int32_t j = (int32_t)(urand() * (i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    int32_t *tables = xmalloc((size_t)(nseq * max_blocks) * sizeof *tables), k = 0;
    for (int32_t s = 0; s < nseq; s++)
        for (int32_t b = 0; b < max_blocks; b++) tables[s * max_blocks + b] = b * bt < len[s] ? perm[k++] : -1;
    free(perm);
    return tables;
}

static int32_t paged_slot(const int32_t *tables, int32_t max_blocks, int32_t bt, int32_t seq, int32_t pos) {
    return tables[seq * max_blocks + pos / bt] * bt + pos % bt;
}

/* kv_store copies each token's k and v heads bit for bit to its slot, and writes nothing else; a padding row (slot
   -1, a decode graph's) stores nothing. */
static void test_kv_store(void **state) {
    (void)state;
    seed(30);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4};
    for (int pi = 0; pi < 2; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        const int32_t nh = 4, nkv = 2, hd = 32, ld = (nh + 2 * nkv) * hd, row = nkv * hd, n_slots = 40;
        const int64_t T = 8;
        const int32_t slots[8] = {39, 0, 17, 16, 3, 22, 31, -1};
        float *qkv = rand_array(T * ld, 2.0f), *kc = act(be, (int64_t)n_slots * row),
              *vc = act(be, (int64_t)n_slots * row);
        be->ops->kv_store(be, qkv, T, nh, nkv, hd, slots, kc, vc, FM_KV_ACT);
        for (int64_t t = 0; t < T - 1; t++) {
            assert_memory_equal(kc + slots[t] * row, qkv + t * ld + nh * hd, (size_t)row * sizeof(float));
            assert_memory_equal(vc + slots[t] * row, qkv + t * ld + (nh + nkv) * hd, (size_t)row * sizeof(float));
        }
        int64_t written = 0;
        for (int64_t i = 0; i < (int64_t)n_slots * row; i++) written += !isnan(kc[i]) + !isnan(vc[i]);
        assert_int_equal(written, 2 * (T - 1) * row);
        free(qkv);
        be->ops->free(be, kc), be->ops->free(be, vc);
        be->ops->destroy(be);
    }
}

/* kv_store into an e4m3 cache (the cpu backend's emulation: each row holds its codes' values): every k and v head of
   a token is quant/kv_e4m3.h's row of it, a padding row stores nothing, and the values sit within e4m3's half step
   (2^-4 relative) of the input where they are normal e4m3 numbers */
static void test_kv_store_e4m3(void **state) {
    (void)state;
    seed(32);
    fm_backend *be = make_backend(FM_PRESET_INT4);
    const int32_t nh = 4, nkv = 2, hd = 64, ld = (nh + 2 * nkv) * hd, row = nkv * hd, n_slots = 24;
    const int64_t T = 5;
    const int32_t slots[5] = {23, 0, 9, -1, 4};
    float *qkv = rand_array(T * ld, 3.0f), *kc = act(be, (int64_t)n_slots * row), *vc = act(be, (int64_t)n_slots * row);
    cpu_round_act(be, qkv, T * ld);
    for (int32_t i = 0; i < hd; i++) qkv[2 * ld + nh * hd + i] = 0.0f; /* an all-zero head: codes 0, scale 1 */
    be->ops->kv_store(be, qkv, T, nh, nkv, hd, slots, kc, vc, FM_KV_E4M3);
    int64_t written = 0;
    for (int64_t i = 0; i < (int64_t)n_slots * row; i++) written += !isnan(kc[i]) + !isnan(vc[i]);
    assert_int_equal(written, 2 * (T - 1) * row);
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        for (int32_t h = 0; h < 2 * nkv; h++) {
            const float *x = qkv + t * ld + (nh + h) * hd;
            const float *got = (h < nkv ? kc : vc) + (int64_t)slots[t] * row + (int64_t)(h % nkv) * hd;
            uint8_t codes[64];
            float want[64];
            const float scale = fm_kv_e4m3_quantize_row(x, hd, codes);
            fm_kv_e4m3_dequantize_row(codes, hd, scale, want);
            assert_memory_equal(got, want, (size_t)hd * sizeof(float));
            assert_true(all_bf16(got, hd));
            float amax = 0.0f;
            for (int32_t i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(x[i]));
            for (int32_t i = 0; i < hd; i++)
                if (fabsf(x[i]) >= scale * 0.015625f) /* a normal e4m3 code: 2^-6 x scale and above */
                    assert_true(fabsf(got[i] - x[i]) <= fabsf(x[i]) * 0.0625f);
            assert_true(amax == 0.0f ? scale == 1.0f : amax / scale <= 448.0f && amax / scale > 224.0f);
        }
    }
    free(qkv);
    be->ops->free(be, kc), be->ops->free(be, vc);
    be->ops->destroy(be);
}

/* The e4m3 cache's scale: the least power of two that brings a row's amax to 448 or below */
static void test_kv_e4m3_exponent(void **state) {
    (void)state;
    assert_int_equal(fm_kv_e4m3_exponent(0.0f), 0);
    assert_int_equal(fm_kv_e4m3_exponent(NAN), 0);
    assert_int_equal(fm_kv_e4m3_exponent(448.0f), 0);
    assert_int_equal(fm_kv_e4m3_exponent(448.5f), 1);
    assert_int_equal(fm_kv_e4m3_exponent(224.0f), -1);
    assert_int_equal(fm_kv_e4m3_exponent(224.1f), 0);
    assert_int_equal(fm_kv_e4m3_exponent(1.0f), -8); /* 1 x 2^8 = 256 <= 448 < 512 */
    assert_int_equal(fm_kv_e4m3_exponent(0.875f), -9);
    assert_int_equal(fm_kv_e4m3_exponent(1e-38f), FM_KV_E4M3_EMIN);
    assert_int_equal(fm_kv_e4m3_exponent(INFINITY), FM_KV_E4M3_EMAX);
    for (int32_t e = -60; e <= 60; e++) { /* exhaustive on the binade edges */
        const float a = ldexpf(448.0f, e), b = nextafterf(a, INFINITY);
        assert_int_equal(fm_kv_e4m3_exponent(a), e);
        assert_int_equal(fm_kv_e4m3_exponent(b), e + 1);
    }
}

/* One paged attention case: sequences of len[s] tokens whose k and v rows (random) go to the cache through
 * kv_store and shuffled block tables; T query tokens (seq[t], pos[t]); the op against a double reference that reads
 * the same k and v rows by position. */
typedef struct paged_case {
    int32_t nh, nkv, hd, bt, nseq;
    const int32_t *len;
    int64_t T;
    const int32_t *seq, *pos;
} paged_case;

static void paged_vs_double(fm_backend *be, const paged_case *c, fm_kv_dtype kv, double bound) {
    const int32_t nh = c->nh, nkv = c->nkv, hd = c->hd, bt = c->bt, ld = (nh + 2 * nkv) * hd, row = nkv * hd;
    int32_t max_len = 0, hist = 0;
    for (int32_t s = 0; s < c->nseq; s++) max_len = c->len[s] > max_len ? c->len[s] : max_len, hist += c->len[s];
    const int32_t max_blocks = (max_len + bt - 1) / bt;
    int32_t n_blocks;
    int32_t *tables = paged_tables(c->nseq, c->len, bt, max_blocks, 3, &n_blocks);
    /* every sequence's tokens, as qkv rows (bf16 values for a bf16 plan: the cache holds activations) */
    float *rows = rand_array((int64_t)hist * ld, 2.0f);
    int32_t *first = xmalloc((size_t)c->nseq * sizeof *first), *slots = xmalloc((size_t)hist * sizeof *slots);
    for (int32_t s = 0, k = 0; s < c->nseq; s++) {
        first[s] = k;
        for (int32_t p = 0; p < c->len[s]; p++, k++) slots[k] = paged_slot(tables, max_blocks, bt, s, p);
    }
    cpu_round_act(be, rows, (int64_t)hist * ld);
    const int64_t n_slots = (int64_t)n_blocks * bt;
    float *kc = act(be, n_slots * row), *vc = act(be, n_slots * row);
    be->ops->kv_store(be, rows, hist, nh, nkv, hd, slots, kc, vc, kv);
    if (kv == FM_KV_E4M3) /* the reference reads what the cache holds: each k and v head as its codes' values */
        for (int64_t i = 0; i < hist; i++)
            for (int32_t h = 0; h < 2 * nkv; h++) {
                float *x = rows + i * ld + (nh + h) * hd;
                uint8_t codes[256];
                fm_kv_e4m3_dequantize_row(codes, hd, fm_kv_e4m3_quantize_row(x, hd, codes), x);
            }
    /* the query tokens: row t of qkv is the row of (seq[t], pos[t]) */
    float *qkv = xmalloc((size_t)(c->T * ld) * sizeof *qkv), *o = act(be, c->T * nh * hd);
    for (int64_t t = 0; t < c->T; t++)
        memcpy(qkv + t * ld, rows + (int64_t)(first[c->seq[t]] + c->pos[t]) * ld, (size_t)ld * sizeof *qkv);
    be->ops->attention_paged(be, qkv, c->T, nh, nkv, hd, kc, vc, kv, c->seq, c->pos, tables, max_blocks, bt, max_len,
                             NULL, o);
    double *r = dalloc(c->T * nh * hd), *p = dalloc(max_len);
    for (int64_t t = 0; t < c->T; t++)
        for (int32_t h = 0; h < nh; h++) {
            const int32_t kvh = h / (nh / nkv), n = c->pos[t] + 1;
            const float *q = qkv + t * ld + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = 0; j < n; j++) {
                const float *k = rows + (int64_t)(first[c->seq[t]] + j) * ld + (nh + kvh) * hd;
                double d = 0;
                for (int32_t i = 0; i < hd; i++) d += (double)q[i] * k[i];
                p[j] = d / sqrt((double)hd);
                mx = fmax(mx, p[j]);
            }
            for (int32_t j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
            double *ro = r + (t * nh + h) * hd;
            for (int32_t j = 0; j < n; j++) {
                const float *v = rows + (int64_t)(first[c->seq[t]] + j) * ld + (nh + nkv + kvh) * hd;
                for (int32_t i = 0; i < hd; i++) ro[i] += p[j] / sum * v[i];
            }
        }
    const double e = rel_err(o, r, c->T * nh * hd);
    if (!(e < bound))
        fail_msg("attention_paged nh=%d nkv=%d hd=%d bt=%d T=%lld act_bf16=%d: error %.3g, not below %.3g", nh, nkv, hd,
                 bt, (long long)c->T, be->plan.act_bf16, e, bound);
    if (be->plan.act_bf16) assert_true(all_bf16(o, c->T * nh * hd));
    free(tables), free(rows), free(first), free(slots), free(qkv), free(r), free(p);
    be->ops->free(be, kc), be->ops->free(be, vc), be->ops->free(be, o);
}

/* Paged attention vs double, ref plan: fp32 dot products of hd terms and an fp32 softmax over <= 70 scores, ~1e-7
 * relative; bound 1e-5 (as the contiguous op). bf16 plan (int4): the same fp32 arithmetic on bf16 inputs, the
 * output rounded to bf16 once (2^-9 relative at most, ~1.1e-3 normalised over many elements); bound 4e-3.
 * Three sequences of 37, 16 (ending exactly at a block boundary) and 70 tokens in shuffled blocks of 16 (and of 7:
 * any block size); GQA 1, 2 and 8; hd 64 and 128; T = 1 (decode), a batch of one decode token per sequence, and a
 * prefill chunk (5 consecutive tokens of one sequence over its cached prefix) with another sequence's decode token
 * in the same call. */
static void test_attention_paged_vs_double(void **state) {
    (void)state;
    seed(31);
    const int32_t len[3] = {37, 16, 70};
    const int32_t seq1[1] = {2}, pos1[1] = {69};
    const int32_t seq3[3] = {0, 1, 2}, pos3[3] = {36, 15, 69};
    const int32_t seq6[6] = {2, 2, 2, 2, 2, 1}, pos6[6] = {63, 64, 65, 66, 67, 15};
    const int32_t heads[3][2] = {{4, 4}, {4, 2}, {16, 2}}, hds[2] = {64, 128};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4};
    for (int pi = 0; pi < 2; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        const double bound = be->plan.act_bf16 ? 4e-3 : 1e-5;
        for (int hi = 0; hi < 3; hi++)
            for (int di = 0; di < 2; di++)
                for (int bi = 0; bi < 2; bi++) {
                    /* an e4m3 cache (the bf16 plan's): against the reference on its codes' values, the same bound */
                    for (int kv = 0; kv <= (be->plan.act_bf16 ? 1 : 0); kv++) {
                        const fm_kv_dtype d = kv ? FM_KV_E4M3 : FM_KV_ACT;
                        paged_case c = {heads[hi][0], heads[hi][1], hds[di], bi ? 7 : 16, 3, len, 1, seq1, pos1};
                        paged_vs_double(be, &c, d, bound);
                        c.T = 3, c.seq = seq3, c.pos = pos3;
                        paged_vs_double(be, &c, d, bound);
                        c.T = 6, c.seq = seq6, c.pos = pos6;
                        paged_vs_double(be, &c, d, bound);
                    }
                }
        be->ops->destroy(be);
    }
}

/* kv_store of a whole prompt, then attention_paged with every token at its own position, equals the contiguous
 * attention op on the same qkv bit for bit: both ops run the same row routine (cpu_attention.c, attend_row) over the
 * same k and v values (kv_store copies them exactly) in the same key order, so nothing may differ. Tight on purpose:
 * any difference is a wrong slot or a wrong length. ref and bf16 plans, GQA 2 and 8, prompts ending inside a block
 * and at a block boundary. */
static void test_attention_paged_equals_contiguous(void **state) {
    (void)state;
    seed(32);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4};
    const int32_t shapes[2][3] = {{4, 2, 64}, {16, 2, 128}};
    const int32_t lens[2] = {37, 48};
    for (int pi = 0; pi < 2; pi++)
        for (int si = 0; si < 2; si++)
            for (int li = 0; li < 2; li++) {
                fm_backend *be = make_backend(presets[pi]);
                const int32_t nh = shapes[si][0], nkv = shapes[si][1], hd = shapes[si][2], ld = (nh + 2 * nkv) * hd;
                const int32_t bt = 16, T = lens[li], max_blocks = (T + bt - 1) / bt, row = nkv * hd;
                int32_t n_blocks;
                int32_t *tables = paged_tables(1, &T, bt, max_blocks, 2, &n_blocks);
                float *qkv = rand_array((int64_t)T * ld, 2.0f);
                cpu_round_act(be, qkv, (int64_t)T * ld);
                int32_t *slots = xmalloc((size_t)T * sizeof *slots), *seq = xmalloc((size_t)T * sizeof *seq);
                int32_t *pos = xmalloc((size_t)T * sizeof *pos);
                for (int32_t t = 0; t < T; t++)
                    slots[t] = paged_slot(tables, max_blocks, bt, 0, t), seq[t] = 0, pos[t] = t;
                float *kc = act(be, (int64_t)n_blocks * bt * row), *vc = act(be, (int64_t)n_blocks * bt * row);
                float *o1 = act(be, (int64_t)T * nh * hd), *o2 = act(be, (int64_t)T * nh * hd);
                be->ops->attention(be, qkv, T, nh, nkv, hd, o1);
                be->ops->kv_store(be, qkv, T, nh, nkv, hd, slots, kc, vc, FM_KV_ACT);
                be->ops->attention_paged(be, qkv, T, nh, nkv, hd, kc, vc, FM_KV_ACT, seq, pos, tables, max_blocks, bt,
                                         T, NULL, o2);
                assert_memory_equal(o1, o2, (size_t)T * nh * hd * sizeof(float));
                free(tables), free(qkv), free(slots), free(seq), free(pos);
                be->ops->free(be, kc), be->ops->free(be, vc), be->ops->free(be, o1), be->ops->free(be, o2);
                be->ops->destroy(be);
            }
}

/* qk_norm_rope with a positions buffer equals the pos0 form at the same positions, bit for bit: consecutive
 * positions against pos0, and arbitrary positions (a decode batch) token by token against T = 1 calls. */
static void test_qk_norm_rope_positions(void **state) {
    (void)state;
    seed(33);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int32_t nh = 4, nkv = 2, hd = 64, ld = (nh + 2 * nkv) * hd;
    const int64_t T = 6;
    float *qn = rand_array(hd, 1.5f), *kn = rand_array(hd, 1.5f);
    fm_bank *qb = make_bank(be, qn, 1, 1, hd, FM_W_F32), *kb = make_bank(be, kn, 1, 1, hd, FM_W_F32);
    float *a = rand_array(T * ld, 2.0f), *b = xmalloc((size_t)(T * ld) * sizeof(float));
    memcpy(b, a, (size_t)(T * ld) * sizeof(float));
    const int32_t consecutive[6] = {9, 10, 11, 12, 13, 14};
    be->ops->qk_norm_rope(be, a, T, nh, nkv, hd, qb, kb, 1e-6f, 9, NULL, 1e6);
    be->ops->qk_norm_rope(be, b, T, nh, nkv, hd, qb, kb, 1e-6f, 0, consecutive, 1e6); /* pos0 ignored */
    assert_memory_equal(a, b, (size_t)(T * ld) * sizeof(float));
    const int32_t batch[6] = {3, 2047, 0, 17, 17, 100000};
    float *c = rand_array(T * ld, 2.0f), *d = xmalloc((size_t)(T * ld) * sizeof(float));
    memcpy(d, c, (size_t)(T * ld) * sizeof(float));
    be->ops->qk_norm_rope(be, c, T, nh, nkv, hd, qb, kb, 1e-6f, 0, batch, 1e6);
    for (int64_t t = 0; t < T; t++)
        be->ops->qk_norm_rope(be, d + t * ld, 1, nh, nkv, hd, qb, kb, 1e-6f, batch[t], NULL, 1e6);
    assert_memory_equal(c, d, (size_t)(T * ld) * sizeof(float));
    assert_memory_not_equal(c + 3 * ld, c + 4 * ld, (size_t)ld * sizeof(float)); /* different inputs, same position */
    free(a), free(b), free(c), free(d), free(qn), free(kn);
    be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- moe */

/* out[t] = sum_j w_j * down_e(silu(gate_e x) * up_e x), ref plan, vs double. Errors: two fp32 GEMV chains of
 * K = 200 and 72 terms, ~1e-6 relative; bound 1e-5. The gate_up bank is built from separate gate and up
 * tensors (two parts per matrix), which also checks the row concatenation (gate rows first). */
static void test_moe_vs_double(void **state) {
    (void)state;
    seed(14);
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int64_t T = 5, H = 200, I = 72;
    const int32_t E = 4, k = 2;
    float *g = rand_array(E * I * H, 1.0f), *u = rand_array(E * I * H, 1.0f), *d = rand_array(E * H * I, 1.0f);
    float *x = rand_array(T * H, 1.0f);
    fm_bank *gub = make_bank2(be, g, u, E, I, I, H, FM_W_F32), *db = make_bank(be, d, E, H, I, FM_W_F32);
    assert_int_equal(gub->rows, 2 * I);
    const int32_t ids[10] = {0, 3, 2, 1, 3, 0, 1, 2, 2, 3}; /* every expert used, both orders */
    float w[10];
    for (int i = 0; i < 10; i++) w[i] = (float)(0.1 + 0.9 * urand());
    float *o = act(be, T * H);
    be->ops->moe(be, gub, db, x, T, ids, w, k, FM_A_NATIVE, FM_A_NATIVE, o);
    double *r = dalloc(T * H), *hh = dalloc(I);
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            const int32_t e = ids[t * k + j];
            for (int64_t i = 0; i < I; i++) {
                double a = 0, b = 0;
                for (int64_t c = 0; c < H; c++) {
                    a += (double)g[(e * I + i) * H + c] * x[t * H + c];
                    b += (double)u[(e * I + i) * H + c] * x[t * H + c];
                }
                hh[i] = a / (1.0 + exp(-a)) * b;
            }
            for (int64_t c = 0; c < H; c++) {
                double s = 0;
                for (int64_t i = 0; i < I; i++) s += (double)d[(e * H + c) * I + i] * hh[i];
                r[t * H + c] += (double)w[t * k + j] * s;
            }
        }
    assert_rel_below(rel_err(o, r, T * H), 1e-5);
    free(g), free(u), free(d), free(x), free(r), free(hh);
    be->ops->free(be, o);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
    be->ops->destroy(be);
}

/* On the quantized presets the fused moe op is the composition of the other ops (linear on the gate_up bank
 * with the dispatch format, swiglu, linear down with the expert format, weighted fp32 sum, bf16 rounding),
 * so the two agree exactly: the routed path quantizes and rounds at the same points as the dense one. */
static void test_moe_is_composition(void **state) {
    (void)state;
    seed(15);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP4};
    const int64_t T = 5, H = 200, I = 72;
    const int32_t E = 4, k = 2;
    for (size_t pi = 0; pi < 4; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        float *g = rand_array(E * I * H, 1.0f), *u = rand_array(E * I * H, 1.0f), *d = rand_array(E * H * I, 1.0f);
        float *x = rand_array(T * H, 1.0f);
        if (be->plan.act_bf16)
            for (int64_t i = 0; i < T * H; i++) x[i] = fm_round_bf16(x[i]);
        fm_bank *gub = make_bank2(be, g, u, E, I, I, H, be->plan.w_expert),
                *db = make_bank(be, d, E, H, I, be->plan.w_expert);
        const int32_t ids[10] = {1, 2, 3, 0, 0, 1, 2, 3, 3, 1};
        float w[10];
        for (int i = 0; i < 10; i++) w[i] = fm_round_bf16((float)(0.1 + 0.9 * urand()));
        float *o = act(be, T * H);
        be->ops->moe(be, gub, db, x, T, ids, w, k, be->plan.a_dispatch, be->plan.a_expert, o);
        float *gu = act(be, 2 * I), *h = act(be, I), *y = act(be, H), *acc = xmalloc((size_t)H * sizeof *acc);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t c = 0; c < H; c++) acc[c] = 0.0f;
            for (int32_t j = 0; j < k; j++) {
                const int32_t e = ids[t * k + j];
                be->ops->linear(be, gub, e, x + t * H, 1, be->plan.a_dispatch, gu);
                be->ops->swiglu(be, gu, 1, I, h);
                be->ops->linear(be, db, e, h, 1, be->plan.a_expert, y);
                for (int64_t c = 0; c < H; c++) acc[c] += w[t * k + j] * y[c];
            }
            if (be->plan.act_bf16) fm_round_bf16_array(acc, H);
            assert_memory_equal(o + t * H, acc, (size_t)H * sizeof *acc);
        }
        free(g), free(u), free(d), free(x), free(acc);
        be->ops->free(be, o), be->ops->free(be, gu), be->ops->free(be, h), be->ops->free(be, y);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
        be->ops->destroy(be);
    }
}

/* moe_add_rmsnorm (the fused end of a MoE block, route decode.fused) is moe followed by add_rmsnorm, bit for bit, with
 * the moe's input buffer also the norm's output, as the engine calls it */
static void test_moe_add_rmsnorm_is_the_chain(void **state) {
    (void)state;
    seed(16);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP4};
    const int64_t T = 5, H = 200, I = 72;
    const int32_t E = 4, k = 2;
    for (size_t pi = 0; pi < 4; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        float *g = rand_array(E * I * H, 1.0f), *u = rand_array(E * I * H, 1.0f), *d = rand_array(E * H * I, 1.0f);
        float *x = rand_array(T * H, 1.0f), *r0 = rand_array(T * H, 2.0f), *nw = rand_array(H, 1.0f);
        fm_bank *gub = make_bank2(be, g, u, E, I, I, H, be->plan.w_expert),
                *db = make_bank(be, d, E, H, I, be->plan.w_expert), *nb = make_bank(be, nw, 1, 1, H, FM_W_F32);
        const int32_t ids[10] = {1, 2, 3, 0, 0, 1, 2, 3, 3, 1};
        float w[10];
        for (int i = 0; i < 10; i++) w[i] = fm_round_bf16((float)(0.1 + 0.9 * urand()));
        float *h1 = act(be, T * H), *h2 = act(be, T * H), *a1 = act(be, T * H), *a2 = act(be, T * H);
        float *y1 = act(be, T * H), *y2 = act(be, T * H);
        be->ops->upload_f32(be, x, T * H, h1), be->ops->upload_f32(be, x, T * H, h2);
        be->ops->upload_f32(be, r0, T * H, a1), be->ops->upload_f32(be, r0, T * H, a2);
        be->ops->moe_add_rmsnorm(be, gub, db, h1, T, ids, w, k, be->plan.a_dispatch, be->plan.a_expert, y1, a1, nb,
                                 1e-6f, h1, NULL);
        be->ops->moe(be, gub, db, h2, T, ids, w, k, be->plan.a_dispatch, be->plan.a_expert, y2);
        be->ops->add_rmsnorm(be, a2, y2, nb, T, H, 1e-6f, h2);
        assert_memory_equal(a1, a2, (size_t)(T * H) * sizeof(float)); /* the residual stream */
        assert_memory_equal(h1, h2, (size_t)(T * H) * sizeof(float)); /* the next block's input */
        double moved = 0;                                             /* and the block changed both */
        for (int64_t i = 0; i < T * H; i++) moved += fabs((double)a1[i] - fm_round_bf16(r0[i]));
        assert_true(moved > 0);
        free(g), free(u), free(d), free(x), free(r0), free(nw);
        be->ops->free(be, h1), be->ops->free(be, h2), be->ops->free(be, a1), be->ops->free(be, a2);
        be->ops->free(be, y1), be->ops->free(be, y2);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db), be->ops->bank_free(be, nb);
        be->ops->destroy(be);
    }
}

/* linear_add_rmsnorm (a projection with the residual add and norm after it, route decode.fused) is linear followed by
 * add_rmsnorm, bit for bit, in every dense format (W8A8 included: the o projection of --dense w8a8) */
static void test_linear_add_rmsnorm_is_the_chain(void **state) {
    (void)state;
    seed(17);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP8};
    const int64_t Ms[] = {1, 2, 3, 8, 16, 64}; /* the decode GEMV's rows (its fused tail: 1..16) and above */
    const int64_t K = 256, N = 200;
    for (size_t pi = 0; pi < 4; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        const bool w8a8 = pi == 3; /* --dense w8a8 */
        const fm_wformat wf = w8a8 ? FM_W_E4M3_PT : be->plan.w_dense;
        const fm_afmt af = w8a8 ? FM_A_E4M3_PT : be->plan.a_dense;
        for (int mi = 0; mi < 6; mi++) {
            const int64_t M = Ms[mi];
            float *w = rand_array(N * K, 0.1f), *x = rand_array(M * K, 1.0f), *r0 = rand_array(M * N, 2.0f);
            float *nw = rand_array(N, 1.0f);
            fm_bank *wb = make_bank(be, w, 1, N, K, wf), *nb = make_bank(be, nw, 1, 1, N, FM_W_F32);
            float *xd = act(be, M * K), *y1 = act(be, M * N), *y2 = act(be, M * N), *a1 = act(be, M * N),
                  *a2 = act(be, M * N), *h1 = act(be, M * N), *h2 = act(be, M * N);
            be->ops->upload_f32(be, x, M * K, xd);
            be->ops->upload_f32(be, r0, M * N, a1), be->ops->upload_f32(be, r0, M * N, a2);
            be->ops->linear_add_rmsnorm(be, wb, xd, M, af, y1, a1, nb, 1e-6f, h1);
            be->ops->linear(be, wb, 0, xd, M, af, y2);
            be->ops->add_rmsnorm(be, a2, y2, nb, M, N, 1e-6f, h2);
            assert_memory_equal(y1, y2, (size_t)(M * N) * sizeof(float)); /* the projection */
            assert_memory_equal(a1, a2, (size_t)(M * N) * sizeof(float)); /* the residual stream */
            assert_memory_equal(h1, h2, (size_t)(M * N) * sizeof(float)); /* the next block's input */
            double moved = 0;
            for (int64_t i = 0; i < M * N; i++) moved += fabs((double)y1[i]);
            assert_true(moved > 0);
            free(w), free(x), free(r0), free(nw);
            be->ops->free(be, xd), be->ops->free(be, y1), be->ops->free(be, y2), be->ops->free(be, a1);
            be->ops->free(be, a2), be->ops->free(be, h1), be->ops->free(be, h2);
            be->ops->bank_free(be, wb), be->ops->bank_free(be, nb);
        }
        be->ops->destroy(be);
    }
}

/* --dispatch: the moe op with an FP4 dispatch buffer is the same op on the buffer's dequantized values (NVFP4: one
 * tensor scale over every routed row, i.e. over x; MXFP4: per 32-block) up to the GEMM's expansion to e4m3 with one
 * scale per 128-group (exact here for MXFP4, whose blocks lie within 3 binades of each other: only the order of the
 * scale products differs; NVFP4 rounds each element to e4m3, 2^-4 relative at most: an error of the size of e4m3
 * 1x128 quantization of the same rows, which the test prints beside it), and differs from the
 * unquantized dispatch. The plan's setter leaves the down input alone and refuses the oracle. */
static void test_moe_fp4_dispatch(void **state) {
    (void)state;
    seed(16);
    const int64_t T = 5, H = 200, I = 72;
    const int32_t E = 4, k = 2;
    const fm_afmt afmts[] = {FM_A_NVFP4, FM_A_MXFP4};
    fm_backend *be = make_backend(FM_PRESET_FP8);
    float *g = rand_array(E * I * H, 1.0f), *u = rand_array(E * I * H, 1.0f), *d = rand_array(E * H * I, 1.0f);
    float *x = rand_array(T * H, 1.0f);
    for (int64_t i = 0; i < T * H; i++)
        x[i] = fm_round_bf16(x[i] * (float)(1 + (i / 40) % 7)); /* block scales differ */
    fm_bank *gub = make_bank2(be, g, u, E, I, I, H, be->plan.w_expert),
            *db = make_bank(be, d, E, H, I, be->plan.w_expert);
    const int32_t ids[10] = {1, 2, 3, 0, 0, 1, 2, 3, 3, 1};
    float w[10];
    for (int i = 0; i < 10; i++) w[i] = fm_round_bf16((float)(0.1 + 0.9 * urand()));
    for (int a = 0; a < 2; a++) {
        float *o = act(be, T * H), *on = act(be, T * H), *oq = act(be, T * H), *xq = xmalloc((size_t)(T * H) * 4);
        be->ops->moe(be, gub, db, x, T, ids, w, k, afmts[a], be->plan.a_expert, o);
        be->ops->moe(be, gub, db, x, T, ids, w, k, FM_A_NATIVE, be->plan.a_expert, on);
        double *xd = act_dequant(x, T, H, afmts[a]);
        for (int64_t i = 0; i < T * H; i++) xq[i] = (float)xd[i]; /* exact: E2M1 x scales are floats */
        be->ops->moe(be, gub, db, xq, T, ids, w, k, FM_A_NATIVE, be->plan.a_expert, oq);
        /* the yardstick of NVFP4's rounding: e4m3 1x128 of the same rows against native */
        float *o8 = act(be, T * H);
        be->ops->moe(be, gub, db, xq, T, ids, w, k, FM_A_E4M3_G128, be->plan.a_expert, o8);
        const double e = rel_err_ff(o, oq, T * H), e8 = rel_err_ff(o8, oq, T * H);
        printf("  moe %s dispatch: %.3g against the dequantized buffer (e4m3 1x128 of it: %.3g)\n",
               fm_afmt_name(afmts[a]), e, e8);
        assert_true(afmts[a] == FM_A_MXFP4 ? e < 1e-2 : e < 2.0 * e8);
        be->ops->free(be, o8);
        assert_true(rel_err_ff(o, on, T * H) > 1e-3); /* E2M1: ~10% per element */
        free(xd), free(xq);
        be->ops->free(be, o), be->ops->free(be, on), be->ops->free(be, oq);
    }
    /* the plan */
    fm_plan plan;
    fm_error err;
    fm_plan_from_preset(FM_PRESET_FP8, &plan);
    assert_int_equal(fm_plan_set_dispatch(&plan, FM_DISPATCH_NVFP4, &err), FM_OK);
    assert_int_equal(plan.a_dispatch, FM_A_NVFP4);
    assert_int_equal(plan.a_expert, FM_A_E4M3_G128);
    assert_int_equal(fm_plan_set_dispatch(&plan, FM_DISPATCH_BF16, &err), FM_OK);
    assert_int_equal(plan.a_dispatch, FM_A_NATIVE);
    fm_plan_from_preset(FM_PRESET_FP4, &plan);
    assert_int_equal(plan.a_dispatch, FM_A_MXFP4); /* fp4 = fp8 + --dispatch mxfp4 */
    fm_plan_from_preset(FM_PRESET_REF, &plan);
    assert_int_equal(fm_plan_set_dispatch(&plan, FM_DISPATCH_FP8, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "oracle"));
    fm_dispatch dd;
    assert_true(fm_dispatch_parse("nvfp4", &dd) && dd == FM_DISPATCH_NVFP4);
    assert_false(fm_dispatch_parse("fp16", &dd));
    free(g), free(u), free(d), free(x);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------- banks and threads */

static void test_bank_bad_parts(void **state) {
    (void)state;
    fm_backend *be = make_backend(FM_PRESET_INT4);
    float a[6 * 4] = {1}, b[6 * 5] = {1};
    fm_st_tensor ta = f32_tensor(a, 1, 6, 4), tb = f32_tensor(b, 1, 6, 5);
    fm_wsrc srcs[2] = {{&ta, 0, 6, 4, {0}, {0}}, {&tb, 0, 6, 5, {0}, {0}}};
    fm_bank_src src = {srcs, 1, 2, "layer 7 expert gate_up", true, true};
    fm_bank *w = (fm_bank *)&src; /* must be reset to NULL */
    fm_error err;
    assert_int_equal(be->ops->bank_create(be, &src, FM_W_INT4_G128, &w, &err), FM_ERR_FORMAT);
    assert_null(w);
    assert_non_null(strstr(err.msg, "layer 7 expert gate_up"));
    /* a view that runs past its tensor */
    fm_wsrc bad = {&ta, 4, 6, 4, {0}, {0}};
    fm_bank_src src2 = {&bad, 1, 1, "layer 0 q", false, false};
    assert_int_not_equal(be->ops->bank_create(be, &src2, FM_W_BF16, &w, &err), FM_OK);
    assert_null(w);
    /* a later matrix with more rows than matrix 0 (the bank is sized from matrix 0) */
    float big[64] = {1};
    fm_st_tensor tbig = f32_tensor(big, 1, 16, 4);
    fm_wsrc uneven[2] = {{&tbig, 0, 2, 4, {0}, {0}}, {&tbig, 8, 3, 4, {0}, {0}}};
    fm_bank_src src3 = {uneven, 2, 1, "layer 1 experts down", false, true};
    assert_int_equal(be->ops->bank_create(be, &src3, FM_W_F32, &w, &err), FM_ERR_FORMAT);
    assert_null(w);
    assert_non_null(strstr(err.msg, "matrix 1 part 0 is [3, 4], expected [2, 4]"));
    be->ops->destroy(be);
}

/* The same inputs give bit-identical outputs on 1, 2 and 3 threads (each element is summed in a fixed order). */
static void test_thread_determinism(void **state) {
    (void)state;
    seed(16);
    const int saved = omp_get_max_threads();
    fm_backend *be = make_backend(FM_PRESET_REF);
    const int64_t M = 17, K = 300, N = 77;
    const int32_t nh = 4, nkv = 2, hd = 32, ld = (nh + 2 * nkv) * hd;
    const int64_t T = 17;
    float *w = rand_array(N * K, 1.0f), *x = rand_array(M * K, 1.0f), *qkv = rand_array(T * ld, 2.0f);
    fm_bank *bf = make_bank(be, w, 1, N, K, FM_W_F32), *bq = make_bank(be, w, 1, N, K, FM_W_INT4_G128);
    float *y[3][3], *ao[3];
    const int threads[3] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++) {
        omp_set_num_threads(threads[ti]);
        y[ti][0] = act(be, M * N), y[ti][1] = act(be, M * N), y[ti][2] = act(be, M * N);
        be->ops->linear(be, bf, 0, x, M, FM_A_NATIVE, y[ti][0]);
        be->ops->linear(be, bq, 0, x, M, FM_A_E4M3_G128, y[ti][1]);
        be->ops->linear(be, bq, 0, x, M, FM_A_MXFP4, y[ti][2]);
        ao[ti] = act(be, T * nh * hd);
        be->ops->attention(be, qkv, T, nh, nkv, hd, ao[ti]);
    }
    omp_set_num_threads(saved);
    for (int ti = 1; ti < 3; ti++) {
        for (int c = 0; c < 3; c++) assert_memory_equal(y[0][c], y[ti][c], (size_t)(M * N) * sizeof(float));
        assert_memory_equal(ao[0], ao[ti], (size_t)(T * nh * hd) * sizeof(float));
    }
    for (int ti = 0; ti < 3; ti++) {
        for (int c = 0; c < 3; c++) be->ops->free(be, y[ti][c]);
        be->ops->free(be, ao[ti]);
    }
    be->ops->bank_free(be, bf), be->ops->bank_free(be, bq);
    free(w), free(x), free(qkv);
    be->ops->destroy(be);
}

/* add_rmsnorm is add followed by rmsnorm, exactly (the fp32 plan and the bf16-rounding one) */
static void test_add_rmsnorm(void **state) {
    (void)state;
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4};
    for (int pi = 0; pi < 2; pi++) {
        fm_backend *be = make_backend(presets[pi]);
        const int64_t R = 3, D = 200;
        float *x = rand_array(R * D, 2.0f), *r0 = rand_array(R * D, 2.0f), *w = rand_array(D, 1.0f);
        fm_bank *wb = make_bank(be, w, 1, 1, D, FM_W_F32);
        float *a1 = act(be, R * D), *a2 = act(be, R * D), *o1 = act(be, R * D), *o2 = act(be, R * D);
        be->ops->upload_f32(be, r0, R * D, a1);
        be->ops->upload_f32(be, r0, R * D, a2);
        be->ops->add_rmsnorm(be, a1, x, wb, R, D, 1e-6f, o1);
        be->ops->add(be, a2, x, R * D);
        be->ops->rmsnorm(be, a2, wb, R, D, 1e-6f, o2);
        assert_memory_equal(a1, a2, (size_t)(R * D) * sizeof(float));
        assert_memory_equal(o1, o2, (size_t)(R * D) * sizeof(float));
        be->ops->bank_free(be, wb);
        be->ops->free(be, a1), be->ops->free(be, a2), be->ops->free(be, o1), be->ops->free(be, o2);
        free(x), free(r0), free(w);
        be->ops->destroy(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_f32),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_linear_int4),
        cmocka_unit_test(test_linear_quant_act),
        cmocka_unit_test(test_linear_w8a8),
        cmocka_unit_test(test_w8a8_accuracy_study),
        cmocka_unit_test(test_output_rounding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_swiglu_add),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_route_ties),
        cmocka_unit_test(test_rope_by_hand),
        cmocka_unit_test(test_rope_position0_identity),
        cmocka_unit_test(test_qk_norm_rope_vs_double),
        cmocka_unit_test(test_attention_causal),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_vs_double),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention_paged_vs_double),
        cmocka_unit_test(test_kv_store_e4m3),
        cmocka_unit_test(test_kv_e4m3_exponent),
        cmocka_unit_test(test_attention_paged_equals_contiguous),
        cmocka_unit_test(test_qk_norm_rope_positions),
        cmocka_unit_test(test_moe_vs_double),
        cmocka_unit_test(test_moe_is_composition),
        cmocka_unit_test(test_moe_add_rmsnorm_is_the_chain),
        cmocka_unit_test(test_linear_add_rmsnorm_is_the_chain),
        cmocka_unit_test(test_moe_fp4_dispatch),
        cmocka_unit_test(test_bank_bad_parts),
        cmocka_unit_test(test_thread_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
