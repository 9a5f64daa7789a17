/* The fold GEMM (src/backend/cuda/w4a8_fold_gemm.cu) against the CPU's emulation of its arithmetic
 * (backend/w4a8_fold.h), on sm_90 (skipped elsewhere):
 *   - the per-token quantizer: codes and scales bit for bit, rows gathered through a slot map, padding zero;
 *   - the repack of an int4-tc bank into the fold layout: byte for byte the host's packing;
 *   - the grouped GEMM at T = 1, 7, 64, 512, 2048 rows over 8 experts (every tile height), per-token scales, bf16 out
 *     through a row map: each element within the accumulator model's bound of the emulation (bf16 rounding plus
 *     2^-12 of the sum of |products| per promotion block); the normalised error printed;
 *   - per-(token, group) scales (the down GEMM's input) and the SwiGLU e4m3 epilogue of an interleaved bank;
 *   - NaN guards around every output (nothing written outside);
 *   - the moe op under route w4a8.kernel=fold on int4-p2 expert banks (pre-quantized sources in our checkpoint
 *     format): against the emulation of the whole fold MoE (per-token x, SwiGLU, h per 128 channels, down per
 *     group, combine), and against the cpu backend's moe under the same route (which quantizes the gate|up input
 *     per token); the load refused by name for int4-g128 scales (float weights quantized at load). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/w4a8_fold.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "quant/int4_ckpt.h"
#include "quant/int4_p2.h"

/* w4a8_layout.cuh's repack of the row layout into the int4-tc one (extern "C"; its header is CUDA C++): the same
 * function with the CUDA types as the C ABI sees them */
void fm_cuda_repack_int4_tc(const uint8_t *src, const void *src_scales, int32_t n, int64_t rows, int64_t cols,
                            int64_t ld, int64_t n_groups, bool interleaved, uint8_t *dst, void *dst_scales,
                            int64_t rows_pad, int *bad_codes, void *stream);

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }
static double urand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* n int4-p2 matrices [rows][K]: gaussian rows with log-normal (row, group) scales, quantized by the CPU */
typedef struct p2_bank {
    int32_t n;
    int64_t rows, K, G, rows_pad;
    bool interleaved;
    int8_t *q;     /* [n][rows][K] */
    float *scales; /* [n][rows][G] */
    uint8_t *d_codes;
    uint16_t *d_scales;
} p2_bank;

static p2_bank make_bank(int32_t n, int64_t rows, int64_t K, bool interleaved) {
    p2_bank b = {n, rows, K, (K + 127) / 128, (rows + 31) / 32 * 32, interleaved, NULL, NULL, NULL, NULL};
    b.q = malloc((size_t)(n * rows * K));
    b.scales = malloc((size_t)(n * rows * b.G) * sizeof(float));
    float *w = malloc((size_t)(rows * K) * sizeof(float));
    const size_t cb = (size_t)(b.rows_pad * b.G * 64), sb = (size_t)(b.rows_pad * b.G);
    uint8_t *codes = malloc(cb * (size_t)n);
    uint16_t *sc = malloc(sb * (size_t)n * sizeof(uint16_t));
    for (int32_t e = 0; e < n; e++) {
        for (int64_t r = 0; r < rows; r++) {
            const float rscale = expf(0.3f * gauss());
            for (int64_t g = 0; g < b.G; g++) {
                const float gs = rscale * expf(0.5f * gauss());
                for (int64_t i = 128 * g; i < K && i < 128 * (g + 1); i++) w[r * K + i] = 0.05f * gs * gauss();
            }
        }
        fm_int4_p2_quantize(w, rows, K, b.q + e * rows * K, b.scales + e * rows * b.G);
        fm_w4a8_fold_pack(b.q + e * rows * K, b.scales + e * rows * b.G, rows, K, interleaved, b.rows_pad,
                          codes + e * cb, sc + e * sb);
    }
    b.d_codes = dev_copy(codes, cb * (size_t)n);
    b.d_scales = dev_copy(sc, sb * (size_t)n * sizeof(uint16_t));
    free(w), free(codes), free(sc);
    return b;
}
static void free_bank(p2_bank *b) {
    free(b->q), free(b->scales);
    cudaFree(b->d_codes), cudaFree(b->d_scales);
}

static bool have_sm90(void) {
    if (!fm_cuda_fold_supported()) {
        printf("fold: not an sm_90 device, skipped\n");
        return false;
    }
    return true;
}

/* rows of x [T][K] quantized per token on the device, through a slot map, against the CPU quantizer */
static void quantize_tokens(int64_t K) {
    seed((uint64_t)K);
    const int64_t T = 37, ld8 = 1024, k = 3, P = T * k;
    uint16_t *xb = malloc((size_t)(T * K) * 2);
    float *xf = malloc((size_t)(T * K) * sizeof(float));
    for (int64_t i = 0; i < T * K; i++) {
        xb[i] = fm_f32_to_bf16(gauss() * (i % 97 == 0 ? 30.0f : 1.0f) * (float)(1 + i / K));
        xf[i] = fm_bf16_to_f32(xb[i]);
    }
    int32_t *src = malloc((size_t)P * sizeof(int32_t)); /* slot i reads pair src[i], token src[i] / k */
    for (int64_t i = 0; i < P; i++) src[i] = (int32_t)((i * 7) % P);
    void *dx = dev_copy(xb, (size_t)(T * K) * 2);
    int32_t *dsrc = dev_copy(src, (size_t)P * 4);
    uint8_t *dx8 = NULL;
    float *dxs = NULL;
    CK(cudaMalloc((void **)&dx8, (size_t)(P * ld8)));
    CK(cudaMemset(dx8, 0x5A, (size_t)(P * ld8)));
    CK(cudaMalloc((void **)&dxs, (size_t)P * 4));
    fm_cuda_fold_quantize_tokens(dx, K, dsrc, (int32_t)k, P, K, dx8, ld8, dxs, NULL);
    uint8_t *x8 = malloc((size_t)(P * ld8)), *want = malloc((size_t)ld8);
    float *xs = malloc((size_t)P * 4), ws;
    CK(cudaMemcpy(x8, dx8, (size_t)(P * ld8), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xs, dxs, (size_t)P * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < P; i++) {
        fm_w4a8_fold_quantize_tokens(xf + (src[i] / k) * K, 1, K, K, want, ld8, &ws);
        assert_true(xs[i] == ws);
        assert_memory_equal(x8 + i * ld8, want, (size_t)ld8);
    }
    cudaFree(dx), cudaFree(dsrc), cudaFree(dx8), cudaFree(dxs);
    free(xb), free(xf), free(src), free(x8), free(want), free(xs);
}

static void test_quantize_tokens(void **state) {
    (void)state;
    if (!have_sm90()) return;
    quantize_tokens(1000); /* 8 elements a lane */
    quantize_tokens(997);  /* one a lane (rows not 16-byte aligned) */
}

/* the int4-tc layout (made from the row layout by the device) repacked into the fold layout: the host's bytes */
static void test_repack(void **state) {
    (void)state;
    if (!have_sm90()) return;
    seed(12);
    const int32_t n = 3;
    for (int il = 0; il < 2; il++) {
        const int64_t rows = 80, K = 384, G = 3, ld = K / 2;
        p2_bank b = make_bank(n, rows, K, il == 1);
        /* the row layout: two's complement nibbles, element 2i low; bf16 scales [n][rows][G] */
        uint8_t *rowq = calloc((size_t)(n * rows * ld), 1);
        uint16_t *rows_s = malloc((size_t)(n * rows * G) * 2);
        for (int64_t i = 0; i < n * rows * K; i++) {
            const uint8_t v = (uint8_t)(b.q[i] & 0xF);
            rowq[i / 2] |= (uint8_t)(i % 2 ? v << 4 : v);
        }
        for (int64_t i = 0; i < n * rows * G; i++) rows_s[i] = fm_f32_to_bf16(b.scales[i]);
        uint8_t *d_row = dev_copy(rowq, (size_t)(n * rows * ld)), *d_tc = NULL, *d_fold = NULL;
        void *d_rs = dev_copy(rows_s, (size_t)(n * rows * G) * 2), *d_tcs = NULL;
        int *d_bad = NULL;
        const size_t cb = (size_t)(n * b.rows_pad * G * 64);
        CK(cudaMalloc((void **)&d_tc, cb));
        CK(cudaMalloc((void **)&d_fold, cb));
        CK(cudaMalloc(&d_tcs, (size_t)(n * b.rows_pad * G) * 2));
        CK(cudaMalloc((void **)&d_bad, sizeof(int)));
        CK(cudaMemset(d_bad, 0, sizeof(int)));
        fm_cuda_repack_int4_tc(d_row, d_rs, n, rows, K, ld, G, il == 1, d_tc, d_tcs, b.rows_pad, d_bad, NULL);
        fm_cuda_repack_tc_to_fold(d_tc, n, b.rows_pad, G, d_fold, NULL);
        uint8_t *got = malloc(cb), *want = malloc(cb);
        uint16_t *gs = malloc((size_t)(n * b.rows_pad * G) * 2), *wsc = malloc((size_t)(n * b.rows_pad * G) * 2);
        CK(cudaMemcpy(got, d_fold, cb, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(want, b.d_codes, cb, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gs, d_tcs, (size_t)(n * b.rows_pad * G) * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wsc, b.d_scales, (size_t)(n * b.rows_pad * G) * 2, cudaMemcpyDeviceToHost));
        assert_memory_equal(got, want, cb);
        assert_memory_equal(gs, wsc, (size_t)(n * b.rows_pad * G) * 2); /* the int4-tc scales are the fold ones */
        cudaFree(d_row), cudaFree(d_tc), cudaFree(d_fold), cudaFree(d_rs), cudaFree(d_tcs), cudaFree(d_bad);
        free(rowq), free(rows_s), free(got), free(want), free(gs), free(wsc), free_bank(&b);
    }
}

/* slots of T routed rows over E experts: expert of slot i, sorted; tiles of bn rows per expert */
typedef struct routed {
    int64_t P;
    int32_t *expert_of; /* [P], non-decreasing */
    fm_fold_tile *tiles;
    int32_t n_tiles;
} routed;

static routed route_rows(int64_t P, int32_t E, int32_t bn) {
    routed r = {P, malloc((size_t)(P + 1) * 4), malloc((size_t)(P + E + 1) * sizeof(fm_fold_tile)), 0};
    int64_t *count = calloc((size_t)E, sizeof(int64_t));
    for (int64_t i = 0; i < P; i++) count[(int64_t)(urand() * urand() * E) % E]++; /* uneven loads */
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

/* The emulation of one routed GEMM: y_ref [P][rows], and per element the bound of the accumulator model (the sum of
 * |products| x the output's scale, over all of K) */
static void emulate(const p2_bank *b, const routed *rt, const uint8_t *x8, int64_t ldx, const float *xs, int64_t lds,
                    bool per_group, float *y_ref, float *mag) {
    for (int64_t i = 0; i < rt->P; i++) {
        const int32_t e = rt->expert_of[i];
        const int8_t *q = b->q + e * b->rows * b->K;
        const float *sc = b->scales + e * b->rows * b->G;
        float xs1[64];
        if (per_group)
            for (int64_t g = 0; g < b->G; g++) xs1[g] = xs[g * lds + i];
        assert_true(fm_w4a8_fold_ref(q, sc, b->rows, b->K, x8 + i * ldx, ldx, per_group ? xs1 : xs + i, 1, per_group, 1,
                                     FM_FOLD_PROMOTE, y_ref + i * b->rows));
        for (int64_t r = 0; r < b->rows; r++) {
            double m = 0.0;
            for (int64_t k = 0; k < b->K; k++)
                m += fabs((double)q[r * b->K + k] * sc[r * b->G + k / 128] * fm_e4m3_to_f32(x8[i * ldx + k]) *
                          (per_group ? xs1[k / 128] : xs[i]));
            mag[i * b->rows + r] = (float)m;
        }
    }
}

static void check_close(const float *y, const float *ref, const float *mag, int64_t n, const char *what) {
    int64_t worst = 0;
    double worst_r = 0.0;
    for (int64_t i = 0; i < n; i++) {
        /* one bf16 ulp of the output (2^-7 relative at most), and the FP8 accumulator's truncation (~2^-13 of the
           block's magnitude per block) */
        const double bound = fabs(ref[i]) * 0x1p-7 + mag[i] * 0x1p-11 + 1e-30;
        const double r = fabs(y[i] - ref[i]) / bound;
        if (!(r <= worst_r)) worst_r = r, worst = i;
    }
    printf("%s: %lld elements, nerr %.3g, worst %.3g of the bound (element %lld: %g vs %g)\n", what, (long long)n,
           gpu_nerr(y, ref, n), worst_r, (long long)worst, y[worst], ref[worst]);
    assert_true(worst_r <= 1.0);
}

/* bf16 out between NaN guards (GPU_TEST_GUARD elements each side), through a row map (a permutation) */
static void run_bf16(int64_t T, int32_t bn, bool per_group) {
    seed((uint64_t)(T * 131 + bn + per_group));
    const int32_t E = 8;
    const int64_t rows = 200, K = 1152, G = 9, ldx = K, P = T;
    p2_bank b = make_bank(E, rows, K, false);
    routed rt = route_rows(P, E, bn);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)(P * G) * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * ldx));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(gauss() * (i % 301 == 0 ? 20.0f : 1.0f));
    if (per_group) { /* as the dispatch: [G][P] */
        float s[16];
        for (int64_t i = 0; i < P; i++) {
            fm_e4m3_quantize_groups(x + i * K, K, 128, x8 + i * ldx, s);
            for (int64_t g = 0; g < G; g++) xs[g * P + i] = s[g];
        }
    } else {
        fm_w4a8_fold_quantize_tokens(x, P, K, K, x8, ldx, xs);
    }
    int32_t *row_map = malloc((size_t)P * 4);
    for (int64_t i = 0; i < P; i++) row_map[i] = (int32_t)((i * 5 + 3) % P);
    if (P % 5 == 0)
        for (int64_t i = 0; i < P; i++) row_map[i] = (int32_t)(P - 1 - i);
    uint8_t *dx8 = dev_copy(x8, (size_t)(P * ldx));
    float *dxs = dev_copy(xs, (size_t)(per_group ? P * G : P) * 4);
    int32_t *dmap = dev_copy(row_map, (size_t)P * 4), *dn = dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    const int64_t ny = P * rows;
    uint16_t *hy = malloc((size_t)(ny + 2 * GPU_TEST_GUARD) * 2), *dy = NULL;
    for (int64_t i = 0; i < ny + 2 * GPU_TEST_GUARD; i++) hy[i] = 0x7FC0; /* NaN */
    dy = dev_copy(hy, (size_t)(ny + 2 * GPU_TEST_GUARD) * 2);
    fm_fold_gemm_args a;
    memset(&a, 0, sizeof a);
    a.codes = b.d_codes, a.scales = b.d_scales, a.rows = rows, a.rows_pad = b.rows_pad, a.n_groups = G;
    a.x = dx8, a.ldx = ldx, a.ascale = per_group ? FM_FOLD_PER_GROUP : FM_FOLD_PER_TOKEN, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles + 3, a.tile_rows = bn; /* spare tiles exit */
    a.out = FM_FOLD_OUT_BF16, a.y = dy + GPU_TEST_GUARD, a.ldy = rows, a.row_map = dmap;
    fm_cuda_w4a8_fold_gemm(&a, NULL);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy, dy, (size_t)(ny + 2 * GPU_TEST_GUARD) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < GPU_TEST_GUARD; i++) {
        assert_int_equal(hy[i], 0x7FC0);
        assert_int_equal(hy[GPU_TEST_GUARD + ny + i], 0x7FC0);
    }
    float *y = malloc((size_t)ny * sizeof(float)), *ref = malloc((size_t)ny * sizeof(float));
    float *mag = malloc((size_t)ny * sizeof(float)), *yr = malloc((size_t)ny * sizeof(float));
    emulate(&b, &rt, x8, ldx, xs, P, per_group, ref, mag);
    for (int64_t i = 0; i < P; i++) /* slot i's row landed at row_map[i] */
        for (int64_t r = 0; r < rows; r++) {
            const float v = fm_bf16_to_f32(hy[GPU_TEST_GUARD + (int64_t)row_map[i] * rows + r]);
            assert_false(isnan(v));
            y[i * rows + r] = v;
            yr[i * rows + r] = fm_round_bf16(ref[i * rows + r]);
        }
    char what[96];
    snprintf(what, sizeof what, "fold bf16 T = %lld, tile %d, %s scales", (long long)T, bn,
             per_group ? "per-group" : "per-token");
    check_close(y, yr, mag, ny, what);
    cudaFree(dx8), cudaFree(dxs), cudaFree(dmap), cudaFree(dn), cudaFree(dtiles), cudaFree(dy);
    free(x), free(xs), free(x8), free(row_map), free(hy), free(y), free(ref), free(mag), free(yr);
    free(rt.expert_of), free(rt.tiles), free_bank(&b);
}

static void test_gemm_per_token(void **state) {
    (void)state;
    if (!have_sm90()) return;
    const int64_t Ts[] = {1, 7, 64, 512, 2048};
    for (int i = 0; i < 5; i++) run_bf16(Ts[i], Ts[i] < 64 ? 16 : Ts[i] < 512 ? 32 : 64, false);
    run_bf16(512, 16, false);
    run_bf16(7, 64, false);
}

static void test_gemm_per_group(void **state) {
    (void)state;
    if (!have_sm90()) return;
    run_bf16(7, 16, true);
    run_bf16(512, 32, true);
    run_bf16(2048, 64, true);
}

/* the SwiGLU epilogue of an interleaved gate|up bank: h (e4m3, a scale per slot and 128 channels) against the
 * emulation's y through the same SwiGLU (exact silu on the CPU; the kernel's fast one differs by ulps, which the
 * bf16 rounding absorbs but at ties: the decoded h compared within one e4m3 step) */
static void test_swiglu(void **state) {
    (void)state;
    if (!have_sm90()) return;
    seed(21);
    const int32_t E = 4, bn = 64;
    const int64_t I = 320, rows = 2 * I, K = 768, G = 6, P = 300, ldh = 384, HG = 3;
    p2_bank b = make_bank(E, rows, K, true);
    routed rt = route_rows(P, E, bn);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)P * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * K));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(gauss());
    fm_w4a8_fold_quantize_tokens(x, P, K, K, x8, K, xs);
    uint8_t *dx8 = dev_copy(x8, (size_t)(P * K)), *dh = NULL;
    float *dxs = dev_copy(xs, (size_t)P * 4), *dhs = NULL;
    int32_t *dn = dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    CK(cudaMalloc((void **)&dh, (size_t)(P * ldh)));
    CK(cudaMemset(dh, 0, (size_t)(P * ldh)));
    CK(cudaMalloc((void **)&dhs, (size_t)(HG * P) * 4));
    fm_fold_gemm_args a;
    memset(&a, 0, sizeof a);
    a.codes = b.d_codes, a.scales = b.d_scales, a.rows = rows, a.rows_pad = b.rows_pad, a.n_groups = G;
    a.interleaved = true, a.x = dx8, a.ldx = K, a.ascale = FM_FOLD_PER_TOKEN, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles, a.tile_rows = bn;
    a.out = FM_FOLD_OUT_SWIGLU_E4M3, a.h = dh, a.ldh = ldh, a.hs = dhs, a.ldhs = P;
    fm_cuda_w4a8_fold_gemm(&a, NULL);
    CK(cudaDeviceSynchronize());
    uint8_t *h = malloc((size_t)(P * ldh));
    float *hs = malloc((size_t)(HG * P) * 4);
    CK(cudaMemcpy(h, dh, (size_t)(P * ldh), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs, dhs, (size_t)(HG * P) * 4, cudaMemcpyDeviceToHost));
    /* the emulation on the un-interleaved matrices: rows 0..I-1 gate, I..2I-1 up */
    float *ref = malloc((size_t)(P * rows) * sizeof(float)), *mag = malloc((size_t)(P * rows) * sizeof(float));
    emulate(&b, &rt, x8, K, xs, 0, false, ref, mag);
    int64_t off = 0;
    for (int64_t i = 0; i < P; i++)
        for (int64_t c = 0; c < I; c++) {
            const float gate = fm_round_bf16(ref[i * rows + c]), up = fm_round_bf16(ref[i * rows + I + c]);
            const float hv = fm_round_bf16(gate / (1.0f + expf(-gate)) * up);
            const float s = hs[(c / 128) * P + i], got = fm_e4m3_to_f32(h[i * ldh + c]) * s;
            /* one e4m3 step (2^-3 relative) plus the accumulator's share */
            const float tol = fabsf(hv) * 0.13f + s * 0.02f + 1e-3f * (mag[i * rows + c] + mag[i * rows + I + c]);
            if (fabsf(got - hv) > tol) off++;
        }
    printf("fold swiglu: %lld of %lld h values off by more than an e4m3 step\n", (long long)off, (long long)(P * I));
    assert_true(off == 0);
    for (int64_t i = 0; i < P; i++)
        for (int64_t c = I; c < ldh; c++) assert_int_equal(h[i * ldh + c], 0); /* channels past I: untouched zeros */
    cudaFree(dx8), cudaFree(dxs), cudaFree(dn), cudaFree(dtiles), cudaFree(dh), cudaFree(dhs);
    free(x), free(xs), free(x8), free(h), free(hs), free(ref), free(mag);
    free(rt.expert_of), free(rt.tiles), free_bank(&b);
}

/* ---- the moe op under the route ---- */

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

/* The fold MoE, emulated: out [T][H] */
static void emulate_moe(const p2_bank *gu, const p2_bank *dn, const float *x, int64_t T, const int32_t *ids,
                        const float *w, int32_t k, float *out) {
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
                                         &xs, 1, false, 1, FM_FOLD_PROMOTE, yg));
            for (int64_t c = 0; c < Ip; c++) {
                const float g = c < I ? fm_round_bf16(yg[c]) : 0.0f, u = c < I ? fm_round_bf16(yg[I + c]) : 0.0f;
                hv[c] = fm_round_bf16(g / (1.0f + expf(-g)) * u);
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

static void test_moe_route(void **state) {
    (void)state;
    if (!have_sm90()) return;
    seed(31);
    const int32_t E = 8, k = 2;
    const int64_t H = 384, I = 256;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *gpu = NULL, *cpu = NULL;
    fm_error err = {{0}};
    char routes[256];
    const char *user = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%sw4a8.kernel=fold", user ? user : "", user ? "," : "");
    assert_int_equal(fm_backend_create("cuda", &plan, 0, routes, &gpu, &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &plan, 0, "w4a8.kernel=fold", &cpu, &err), FM_OK); /* per token too */
    /* the same int4-p2 numbers as the emulation's banks (p2_bank), as checkpoint sources */
    p2_bank gu = make_bank(E, 2 * I, H, false), dn = make_bank(E, H, I, false);
    p2_linear *lin = malloc((size_t)(3 * E) * sizeof *lin);
    fm_wsrc *gsrc = malloc((size_t)(2 * E) * sizeof *gsrc), *dsrc = malloc((size_t)E * sizeof *dsrc);
    for (int32_t e = 0; e < E; e++) {
        make_p2_linear(gu.q + e * 2 * I * H, gu.scales + e * 2 * I * gu.G, I, H, &lin[3 * e]); /* gate rows */
        make_p2_linear(gu.q + e * 2 * I * H + I * H, gu.scales + e * 2 * I * gu.G + I * gu.G, I, H, &lin[3 * e + 1]);
        make_p2_linear(dn.q + e * H * I, dn.scales + e * H * dn.G, H, I, &lin[3 * e + 2]);
        gsrc[2 * e] = lin[3 * e].src, gsrc[2 * e + 1] = lin[3 * e + 1].src, dsrc[e] = lin[3 * e + 2].src;
    }
    const fm_bank_src gs = {gsrc, E, 2, "test experts gate_up", true, true};
    const fm_bank_src ds = {dsrc, E, 1, "test experts down", false, true};
    fm_bank *b[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* [cpu, gpu][gate_up, down] */
    fm_backend *be[2] = {cpu, gpu};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(be[i]->ops->bank_create(be[i], &gs, plan.w_expert, &b[i][0], &err), FM_OK);
        assert_int_equal(be[i]->ops->bank_create(be[i], &ds, plan.w_expert, &b[i][1], &err), FM_OK);
    }
    const int64_t Ts[] = {1, 7, 64, 512};
    for (int ti = 0; ti < 4; ti++) {
        const int64_t T = Ts[ti];
        float *x = malloc((size_t)(T * H) * sizeof(float)), *w = malloc((size_t)(T * k) * sizeof(float));
        int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
        for (int64_t i = 0; i < T * H; i++) x[i] = fm_round_bf16(gauss() * (i % 53 == 0 ? 8.0f : 1.0f));
        for (int64_t t = 0; t < T; t++) {
            ids[t * k] = (int32_t)(urand() * E) % E, ids[t * k + 1] = (ids[t * k] + 1 + (int32_t)(urand() * 6)) % E;
            w[t * k] = 0.3f + 0.4f * (float)urand(), w[t * k + 1] = 1.0f - w[t * k];
        }
        float *g = gpu_run_moe(gpu, b[1][0], b[1][1], x, T, H, ids, w, k);
        float *c = gpu_run_moe(cpu, b[0][0], b[0][1], x, T, H, ids, w, k);
        float *ref = malloc((size_t)(T * H) * sizeof(float));
        emulate_moe(&gu, &dn, x, T, ids, w, k, ref);
        char what[96];
        snprintf(what, sizeof what, "moe fold T = %lld vs the emulation", (long long)T);
        /* the emulation differs only where an accumulator's last bits move a bf16 rounding of gate or up and that an
           e4m3 code of h (the int4-tc op tests see up to 7e-3 from the same flips) */
        gpu_expect_close(g, ref, T * H, 1e-2, what);
        snprintf(what, sizeof what, "moe fold T = %lld vs the cpu moe under the route", (long long)T);
        gpu_expect_close(g, c, T * H, 1e-2, what); /* the same roundings: as the emulation */
        free(x), free(w), free(ids), free(g), free(c), free(ref);
    }
    /* float weights: the cuda backend quantizes them to int4-g128, which the route refuses by name */
    fm_wsrc fsrc = {0};
    fsrc.rows = H, fsrc.cols = I, fsrc.synth.seed = 7, fsrc.synth.scale = 0.05f;
    const fm_bank_src fs = {&fsrc, 1, 1, "test float experts", false, true};
    fm_bank *fb = NULL;
    assert_int_equal(gpu->ops->bank_create(gpu, &fs, plan.w_expert, &fb, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "w4a8.kernel=fold needs int4-p2 scales"));
    assert_null(fb);
    for (int i = 0; i < 2; i++) be[i]->ops->bank_free(be[i], b[i][0]), be[i]->ops->bank_free(be[i], b[i][1]);
    for (int32_t i = 0; i < 3 * E; i++) free(lin[i].packed), free(lin[i].scales);
    free(lin), free(gsrc), free(dsrc), free_bank(&gu), free_bank(&dn);
    cpu->ops->destroy(cpu), gpu->ops->destroy(gpu);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_tokens), cmocka_unit_test(test_repack), cmocka_unit_test(test_gemm_per_token),
        cmocka_unit_test(test_gemm_per_group),  cmocka_unit_test(test_swiglu), cmocka_unit_test(test_moe_route),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
