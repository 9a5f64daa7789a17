/* The fold GEMM (src/backend/cuda/w4a8_fold_gemm.cu) against the CPU's emulation of its arithmetic
 * (backend/w4a8_fold.h), on sm_90 (skipped elsewhere):
 *   - the per-token quantizer: codes and scales bit for bit, rows gathered through a slot map, padding zero;
 *   - the int4-p2 quantizer at load (--int4-scales p2 on the cuda backend): bit for bit fm_int4_p2_quantize;
 *   - the repack of an int4-tc bank into the fold layout: byte for byte the host's packing;
 *   - the grouped GEMM at T = 1, 7, 64, 512, 2048 rows over 8 experts (every tile height), per-token scales, bf16 out
 *     through a row map: each element within the accumulator model's bound of the emulation (bf16 rounding plus
 *     2^-12 of the sum of |products| per promotion block); the normalised error printed;
 *   - per-(token, group) scales (the down GEMM's input) and the SwiGLU e4m3 epilogue of an interleaved bank;
 *   - NaN guards around every output (nothing written outside);
 *   - the moe op under route w4a8.kernel=fold on int4-p2 expert banks (pre-quantized sources in our checkpoint
 *     format): against the emulation of the whole fold MoE (per-token x, SwiGLU, h per 128 channels, down per
 *     group, combine), and against the cpu backend's moe under the same route (which quantizes the gate|up input
 *     per token), at T = 1 on the decode GEMVs (w4a8_fold_gemv.cu), the GEMMs from T = 7; the load refused by name
 *     for int4-g128 scales (float weights quantized at load).
 *   - float experts under --int4-scales p2 (quantized on the device): the route runs, as on the cpu backend.
 * The decode GEMV and the dispatch's per-token rows have their own program (test_cuda_fold_gemv.c). */
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
#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/cuda/w4a8_fold_ws.h"
#include "backend/w4a8_fold.h"
#include "fold_test_util.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "quant/int4_ckpt.h"
#include "quant/int4_p2.h"

/* quantize.cuh's int4-p2 quantizer at load (extern "C"; CUDA types as the C ABI sees them) */
void fm_cuda_quantize_int4_p2(const void *src, int src_dtype, int64_t rows, int64_t cols, uint8_t *dst, int64_t ld,
                              void *scales, int64_t n_groups, void *stream);

/* w4a8_layout.cuh's repack of the row layout into the int4-tc one (extern "C"; its header is CUDA C++): the same
 * function with the CUDA types as the C ABI sees them */
void fm_cuda_repack_int4_tc(const uint8_t *src, const void *src_scales, int32_t n, int64_t rows, int64_t cols,
                            int64_t ld, int64_t n_groups, bool interleaved, uint8_t *dst, void *dst_scales,
                            int64_t rows_pad, int *bad_codes, void *stream);

/* rows of x [T][K] quantized per token on the device, through a slot map, against the CPU quantizer */
static void quantize_tokens(int64_t K) {
    fold_seed((uint64_t)K);
    const int64_t T = 37, ld8 = 1024, k = 3, P = T * k;
    uint16_t *xb = malloc((size_t)(T * K) * 2);
    float *xf = malloc((size_t)(T * K) * sizeof(float));
    for (int64_t i = 0; i < T * K; i++) {
        xb[i] = fm_f32_to_bf16(fold_gauss() * (i % 97 == 0 ? 30.0f : 1.0f) * (float)(1 + i / K));
        xf[i] = fm_bf16_to_f32(xb[i]);
    }
    int32_t *src = malloc((size_t)P * sizeof(int32_t)); /* slot i reads pair src[i], token src[i] / k */
    for (int64_t i = 0; i < P; i++) src[i] = (int32_t)((i * 7) % P);
    void *dx = fold_dev_copy(xb, (size_t)(T * K) * 2);
    int32_t *dsrc = fold_dev_copy(src, (size_t)P * 4);
    uint8_t *dx8 = NULL;
    float *dxs = NULL;
    FOLD_CK(cudaMalloc((void **)&dx8, (size_t)(P * ld8)));
    FOLD_CK(cudaMemset(dx8, 0x5A, (size_t)(P * ld8)));
    FOLD_CK(cudaMalloc((void **)&dxs, (size_t)P * 4));
    fm_cuda_fold_quantize_tokens(dx, K, dsrc, (int32_t)k, P, K, dx8, ld8, dxs, NULL);
    uint8_t *x8 = malloc((size_t)(P * ld8)), *want = malloc((size_t)ld8);
    float *xs = malloc((size_t)P * 4), ws;
    FOLD_CK(cudaMemcpy(x8, dx8, (size_t)(P * ld8), cudaMemcpyDeviceToHost));
    FOLD_CK(cudaMemcpy(xs, dxs, (size_t)P * 4, cudaMemcpyDeviceToHost));
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
    if (!fold_have_sm90()) return;
    quantize_tokens(1000); /* 8 elements a lane */
    quantize_tokens(997);  /* one a lane (rows not 16-byte aligned) */
}

/* --int4-scales p2 on the device: rows of F32 and BF16 weights (a zero row, a NaN, groups far below their row's
 * largest, a partial last group) quantized bit for bit as fm_int4_p2_quantize does (codes as the row layout's
 * two's complement nibbles, element 2i low; scales as bf16) */
static void quantize_p2(int dtype) {
    fold_seed(61 + (uint64_t)dtype);
    const int64_t rows = 37, cols = 1000, G = 8, ld = cols / 2;
    float *w = malloc((size_t)(rows * cols) * sizeof(float)), *sc = malloc((size_t)(rows * G) * sizeof(float));
    uint16_t *wb = malloc((size_t)(rows * cols) * 2);
    int8_t *q = malloc((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++) {
            const float g = r % 5 == 1 ? ldexpf(1.0f, -(int)(i / 128) * 3) : expf(0.7f * (float)((i / 128) % 3));
            float v = r == 3 ? 0.0f : 0.02f * g * fold_gauss() * (i % 89 == 0 ? 9.0f : 1.0f);
            if (r == 7 && i == 500) v = NAN;
            wb[r * cols + i] = fm_f32_to_bf16(v);
            w[r * cols + i] = dtype == 2 ? fm_bf16_to_f32(wb[r * cols + i]) : v;
        }
    fm_int4_p2_quantize(w, rows, cols, q, sc);
    void *dsrc = dtype == 2 ? fold_dev_copy(wb, (size_t)(rows * cols) * 2)
                            : fold_dev_copy(w, (size_t)(rows * cols) * sizeof(float));
    uint8_t *dq = NULL;
    uint16_t *ds = NULL;
    FOLD_CK(cudaMalloc((void **)&dq, (size_t)(rows * ld)));
    FOLD_CK(cudaMemset(dq, 0, (size_t)(rows * ld)));
    FOLD_CK(cudaMalloc((void **)&ds, (size_t)(rows * G) * 2));
    fm_cuda_quantize_int4_p2(dsrc, dtype, rows, cols, dq, ld, ds, G, NULL);
    uint8_t *gq = malloc((size_t)(rows * ld));
    uint16_t *gs = malloc((size_t)(rows * G) * 2);
    FOLD_CK(cudaMemcpy(gq, dq, (size_t)(rows * ld), cudaMemcpyDeviceToHost));
    FOLD_CK(cudaMemcpy(gs, ds, (size_t)(rows * G) * 2, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < G; g++)
            if (gs[r * G + g] != fm_f32_to_bf16(sc[r * G + g]))
                fail_msg("p2 (dtype %d): row %lld group %lld scale %g on the GPU, %g on the CPU", dtype, (long long)r,
                         (long long)g, fm_bf16_to_f32(gs[r * G + g]), sc[r * G + g]);
        for (int64_t i = 0; i < cols; i++) {
            const int v = (gq[r * ld + i / 2] >> (4 * (i % 2))) & 15;
            if ((v >= 8 ? v - 16 : v) != q[r * cols + i])
                fail_msg("p2 (dtype %d): row %lld code %lld: %d on the GPU, %d on the CPU", dtype, (long long)r,
                         (long long)i, v >= 8 ? v - 16 : v, q[r * cols + i]);
        }
    }
    printf("int4-p2 at load (dtype %d): %lld x %lld codes and scales bit for bit the CPU's\n", dtype, (long long)rows,
           (long long)cols);
    cudaFree(dsrc), cudaFree(dq), cudaFree(ds);
    free(w), free(sc), free(wb), free(q), free(gq), free(gs);
}

static void test_quantize_p2(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    quantize_p2(0); /* F32 */
    quantize_p2(2); /* BF16 */
}

/* the int4-tc layout (made from the row layout by the device) repacked into the fold layout: the host's bytes */
static void test_repack(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    fold_seed(12);
    const int32_t n = 3;
    for (int il = 0; il < 2; il++) {
        const int64_t rows = 80, K = 384, G = 3, ld = K / 2;
        p2_bank b = fold_make_bank(n, rows, K, il == 1);
        /* the row layout: two's complement nibbles, element 2i low; bf16 scales [n][rows][G] */
        uint8_t *rowq = calloc((size_t)(n * rows * ld), 1);
        uint16_t *rows_s = malloc((size_t)(n * rows * G) * 2);
        for (int64_t i = 0; i < n * rows * K; i++) {
            const uint8_t v = (uint8_t)(b.q[i] & 0xF);
            rowq[i / 2] |= (uint8_t)(i % 2 ? v << 4 : v);
        }
        for (int64_t i = 0; i < n * rows * G; i++) rows_s[i] = fm_f32_to_bf16(b.scales[i]);
        uint8_t *d_row = fold_dev_copy(rowq, (size_t)(n * rows * ld)), *d_tc = NULL, *d_fold = NULL;
        void *d_rs = fold_dev_copy(rows_s, (size_t)(n * rows * G) * 2), *d_tcs = NULL;
        int *d_bad = NULL;
        const size_t cb = (size_t)(n * b.rows_pad * G * 64);
        FOLD_CK(cudaMalloc((void **)&d_tc, cb));
        FOLD_CK(cudaMalloc((void **)&d_fold, cb));
        FOLD_CK(cudaMalloc(&d_tcs, (size_t)(n * b.rows_pad * G) * 2));
        FOLD_CK(cudaMalloc((void **)&d_bad, sizeof(int)));
        FOLD_CK(cudaMemset(d_bad, 0, sizeof(int)));
        fm_cuda_repack_int4_tc(d_row, d_rs, n, rows, K, ld, G, il == 1, d_tc, d_tcs, b.rows_pad, d_bad, NULL);
        fm_cuda_repack_tc_to_fold(d_tc, n, b.rows_pad, G, d_fold, NULL);
        uint8_t *got = malloc(cb), *want = malloc(cb);
        uint16_t *gs = malloc((size_t)(n * b.rows_pad * G) * 2), *wsc = malloc((size_t)(n * b.rows_pad * G) * 2);
        FOLD_CK(cudaMemcpy(got, d_fold, cb, cudaMemcpyDeviceToHost));
        FOLD_CK(cudaMemcpy(want, b.d_codes, cb, cudaMemcpyDeviceToHost));
        FOLD_CK(cudaMemcpy(gs, d_tcs, (size_t)(n * b.rows_pad * G) * 2, cudaMemcpyDeviceToHost));
        FOLD_CK(cudaMemcpy(wsc, b.d_scales, (size_t)(n * b.rows_pad * G) * 2, cudaMemcpyDeviceToHost));
        assert_memory_equal(got, want, cb);
        assert_memory_equal(gs, wsc, (size_t)(n * b.rows_pad * G) * 2); /* the int4-tc scales are the fold ones */
        cudaFree(d_row), cudaFree(d_tc), cudaFree(d_fold), cudaFree(d_rs), cudaFree(d_tcs), cudaFree(d_bad);
        free(rowq), free(rows_s), free(got), free(want), free(gs), free(wsc), fold_free_bank(&b);
    }
}

/* bf16 out between NaN guards (GPU_TEST_GUARD elements each side), through a row map (a permutation) */
/* The GEMM's bf16 output of ny elements between two guards of NaN (dy, hy: GPU_TEST_GUARD + ny + GPU_TEST_GUARD)
 * after the launch: copied back, the guards checked untouched */
static void download_guarded(uint16_t *hy, const uint16_t *dy, int64_t ny) {
    FOLD_CK(cudaDeviceSynchronize());
    FOLD_CK(cudaMemcpy(hy, dy, (size_t)(ny + 2 * GPU_TEST_GUARD) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < GPU_TEST_GUARD; i++) {
        assert_int_equal(hy[i], 0x7FC0);
        assert_int_equal(hy[GPU_TEST_GUARD + ny + i], 0x7FC0);
    }
}

/* The output rows through the row map (slot i's row landed at row_map[i]) as floats, none NaN, and the emulation's
 * rows rounded to bf16 beside them */
static void gather_mapped(const uint16_t *hy, const int32_t *row_map, const float *ref, int64_t P, int64_t rows,
                          float *y, float *yr) {
    for (int64_t i = 0; i < P; i++)
        for (int64_t r = 0; r < rows; r++) {
            const float v = fm_bf16_to_f32(hy[GPU_TEST_GUARD + (int64_t)row_map[i] * rows + r]);
            assert_false(isnan(v));
            y[i * rows + r] = v;
            yr[i * rows + r] = fm_round_bf16(ref[i * rows + r]);
        }
}

static void run_bf16(int64_t T, int32_t bn, bool per_group) {
    fold_seed((uint64_t)(T * 131 + bn + per_group));
    const int32_t E = 8;
    const int64_t rows = 200, K = 1152, G = 9, ldx = K, P = T;
    p2_bank b = fold_make_bank(E, rows, K, false);
    routed rt = fold_route_rows(P, E, bn);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)(P * G) * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * ldx));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(fold_gauss() * (i % 301 == 0 ? 20.0f : 1.0f));
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
    uint8_t *dx8 = fold_dev_copy(x8, (size_t)(P * ldx));
    float *dxs = fold_dev_copy(xs, (size_t)(per_group ? P * G : P) * 4);
    int32_t *dmap = fold_dev_copy(row_map, (size_t)P * 4), *dn = fold_dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = fold_dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    const int64_t ny = P * rows;
    uint16_t *hy = malloc((size_t)(ny + 2 * GPU_TEST_GUARD) * 2), *dy = NULL;
    for (int64_t i = 0; i < ny + 2 * GPU_TEST_GUARD; i++) hy[i] = 0x7FC0; /* NaN */
    dy = fold_dev_copy(hy, (size_t)(ny + 2 * GPU_TEST_GUARD) * 2);
    fm_fold_gemm_args a;
    memset(&a, 0, sizeof a);
    a.codes = b.d_codes, a.scales = b.d_scales, a.rows = rows, a.rows_pad = b.rows_pad, a.n_groups = G;
    a.x = dx8, a.ldx = ldx, a.ascale = per_group ? FM_FOLD_PER_GROUP : FM_FOLD_PER_TOKEN, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles + 3, a.tile_rows = bn; /* spare tiles exit */
    a.out = FM_FOLD_OUT_BF16, a.y = dy + GPU_TEST_GUARD, a.ldy = rows, a.row_map = dmap;
    fm_cuda_w4a8_fold_gemm(&a, NULL);
    download_guarded(hy, dy, ny);
    float *y = malloc((size_t)ny * sizeof(float)), *ref = malloc((size_t)ny * sizeof(float));
    float *mag = malloc((size_t)ny * sizeof(float)), *yr = malloc((size_t)ny * sizeof(float));
    fold_emulate(&b, &rt, x8, ldx, xs, P, per_group, ref, mag);
    gather_mapped(hy, row_map, ref, P, rows, y, yr);
    char what[96];
    snprintf(what, sizeof what, "fold bf16 T = %lld, tile %d, %s scales", (long long)T, bn,
             per_group ? "per-group" : "per-token");
    fold_check_close(y, yr, mag, ny, what);
    cudaFree(dx8), cudaFree(dxs), cudaFree(dmap), cudaFree(dn), cudaFree(dtiles), cudaFree(dy);
    free(x), free(xs), free(x8), free(row_map), free(hy), free(y), free(ref), free(mag), free(yr);
    fold_free_routed(&rt), fold_free_bank(&b);
}

static void test_gemm_per_token(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    const int64_t Ts[] = {1, 7, 64, 512, 2048};
    for (int i = 0; i < 5; i++) run_bf16(Ts[i], Ts[i] < 64 ? 16 : Ts[i] < 512 ? 32 : 64, false);
    run_bf16(512, 16, false);
    run_bf16(7, 64, false);
}

static void test_gemm_per_group(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    run_bf16(7, 16, true);
    run_bf16(512, 32, true);
    run_bf16(2048, 64, true);
}

/* the SwiGLU epilogue of an interleaved gate|up bank: h (e4m3, a scale per slot and 128 channels) against the
 * emulation's y through the same SwiGLU (exact silu on the CPU; the kernel's fast one differs by ulps, which the
 * bf16 rounding absorbs but at ties: the decoded h compared within one e4m3 step) */
static void test_swiglu(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    fold_seed(21);
    const int32_t E = 4, bn = 64;
    const int64_t I = 320, rows = 2 * I, K = 768, G = 6, P = 300, ldh = 384, HG = 3;
    p2_bank b = fold_make_bank(E, rows, K, true);
    routed rt = fold_route_rows(P, E, bn);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)P * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * K));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(fold_gauss());
    fm_w4a8_fold_quantize_tokens(x, P, K, K, x8, K, xs);
    uint8_t *dx8 = fold_dev_copy(x8, (size_t)(P * K)), *dh = NULL;
    float *dxs = fold_dev_copy(xs, (size_t)P * 4), *dhs = NULL;
    int32_t *dn = fold_dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = fold_dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    FOLD_CK(cudaMalloc((void **)&dh, (size_t)(P * ldh)));
    FOLD_CK(cudaMemset(dh, 0, (size_t)(P * ldh)));
    FOLD_CK(cudaMalloc((void **)&dhs, (size_t)(HG * P) * 4));
    fm_fold_gemm_args a;
    memset(&a, 0, sizeof a);
    a.codes = b.d_codes, a.scales = b.d_scales, a.rows = rows, a.rows_pad = b.rows_pad, a.n_groups = G;
    a.interleaved = true, a.x = dx8, a.ldx = K, a.ascale = FM_FOLD_PER_TOKEN, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles, a.tile_rows = bn;
    a.out = FM_FOLD_OUT_SWIGLU_E4M3, a.h = dh, a.ldh = ldh, a.hs = dhs, a.ldhs = P;
    fm_cuda_w4a8_fold_gemm(&a, NULL);
    FOLD_CK(cudaDeviceSynchronize());
    uint8_t *h = malloc((size_t)(P * ldh));
    float *hs = malloc((size_t)(HG * P) * 4);
    FOLD_CK(cudaMemcpy(h, dh, (size_t)(P * ldh), cudaMemcpyDeviceToHost));
    FOLD_CK(cudaMemcpy(hs, dhs, (size_t)(HG * P) * 4, cudaMemcpyDeviceToHost));
    /* the emulation on the un-interleaved matrices: rows 0..I-1 gate, I..2I-1 up */
    float *ref = malloc((size_t)(P * rows) * sizeof(float)), *mag = malloc((size_t)(P * rows) * sizeof(float));
    fold_emulate(&b, &rt, x8, K, xs, 0, false, ref, mag);
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
    fold_free_routed(&rt), fold_free_bank(&b);
}

/* ---- the warp-specialised prefill GEMM (w4a8_fold_ws.cu) ---- */

/* The bank's int4-p2 scales as the kernel reads them (fm_w4a8_fold_split_scales of the device's bf16 scales) */
static void ws_split(const p2_bank *b, int8_t **dj, float **drs) {
    const int64_t ns = b->n * b->G * b->rows_pad, nr = b->n * b->rows_pad;
    uint16_t *hs = malloc((size_t)ns * 2);
    int8_t *hj = malloc((size_t)ns);
    float *hr = malloc((size_t)nr * sizeof(float));
    FOLD_CK(cudaMemcpy(hs, b->d_scales, (size_t)ns * 2, cudaMemcpyDeviceToHost));
    int32_t bm = 0;
    int64_t br = 0;
    assert_true(fm_w4a8_fold_split_scales(hs, b->n, b->rows, b->rows_pad, b->G, hj, hr, &bm, &br));
    *dj = fold_dev_copy(hj, (size_t)ns), *drs = fold_dev_copy(hr, (size_t)nr * sizeof(float));
    free(hs), free(hj), free(hr);
}

/* P routed rows over E experts in 256-row tiles against the emulation with all of K in one block: bf16 out through a
 * row map, or (swiglu) h = silu(g) u in bf16 of an interleaved gate|up bank; NaN guards around the output */
static void run_ws(int64_t P, int32_t E, int64_t rows, int64_t K, bool swiglu) {
    fold_seed((uint64_t)(P * 7 + rows + K + swiglu));
    const int64_t G = (K + 127) / 128, ldx = 128 * G, I = rows / 2;
    p2_bank b = swiglu ? fold_make_bank(E, rows, K, true) : fold_make_bank_random(E, rows, K, false);
    routed rt = fold_route_rows(P, E, FM_FOLD_WS_TILE_ROWS);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)P * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * ldx));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(fold_gauss() * (i % 301 == 0 ? 20.0f : 1.0f));
    fm_w4a8_fold_quantize_tokens(x, P, K, K, x8, ldx, xs);
    int32_t *row_map = malloc((size_t)P * 4);
    for (int64_t i = 0; i < P; i++) row_map[i] = (int32_t)((i * 5 + 3) % P);
    if (P % 5 == 0)
        for (int64_t i = 0; i < P; i++) row_map[i] = (int32_t)(P - 1 - i);
    int8_t *dj = NULL;
    float *drs = NULL;
    ws_split(&b, &dj, &drs);
    uint8_t *dx8 = fold_dev_copy(x8, (size_t)(P * ldx));
    float *dxs = fold_dev_copy(xs, (size_t)P * 4);
    int32_t *dmap = fold_dev_copy(row_map, (size_t)P * 4), *dn = fold_dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = fold_dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    const int64_t cols = swiglu ? I : rows, ny = P * cols;
    uint16_t *hy = malloc((size_t)(ny + 2 * GPU_TEST_GUARD) * 2), *dy = NULL;
    for (int64_t i = 0; i < ny + 2 * GPU_TEST_GUARD; i++) hy[i] = 0x7FC0; /* NaN */
    dy = fold_dev_copy(hy, (size_t)(ny + 2 * GPU_TEST_GUARD) * 2);
    fm_fold_ws_args a;
    memset(&a, 0, sizeof a);
    a.codes = b.d_codes, a.fold_j = dj, a.fold_rs = drs, a.rows = rows, a.rows_pad = b.rows_pad, a.n_groups = G;
    a.x = dx8, a.ldx = ldx, a.slots = P, a.xs = dxs;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles + 3; /* spare tiles: nothing to do */
    a.out = swiglu ? FM_FOLD_WS_OUT_SWIGLU : FM_FOLD_WS_OUT_BF16, a.y = dy + GPU_TEST_GUARD, a.ldy = cols;
    a.row_map = swiglu ? NULL : dmap;
    fm_cuda_w4a8_fold_ws_gemm(&a, NULL);
    download_guarded(hy, dy, ny);
    float *ref = malloc((size_t)(P * rows) * sizeof(float)), *mag = malloc((size_t)(P * rows) * sizeof(float));
    fold_emulate_promote(&b, &rt, x8, ldx, xs, 0, false, 0, ref, mag);
    /* the accumulator over all of K in one block: ~2^-13 of the magnitude per k32 step */
    const double acc_rel = 0x1p-13 * (double)(G * 4);
    char what[112];
    if (swiglu) {
        int64_t off = 0;
        double worst = 0.0;
        for (int64_t i = 0; i < P; i++)
            for (int64_t c = 0; c < I; c++) {
                const float g = fm_round_bf16(ref[i * rows + c]), u = fm_round_bf16(ref[i * rows + I + c]);
                const float hv = fm_round_bf16(g / (1.0f + expf(-g)) * u);
                const float got = fm_bf16_to_f32(hy[GPU_TEST_GUARD + i * I + c]);
                assert_false(isnan(got));
                /* two bf16 roundings of g and u and the fast exp, plus the accumulator's share through silu(g) u */
                const double tol =
                    fabs(hv) * 0x1p-6 +
                    acc_rel * (mag[i * rows + c] * (fabs(u) + 1.0) + mag[i * rows + I + c] * (fabs(g) + 1.0)) + 1e-6;
                const double r = fabs(got - hv) / tol;
                if (r > worst) worst = r;
                if (r > 1.0) off++;
            }
        printf("fold ws swiglu P = %lld, E = %d, I = %lld, K = %lld: %lld of %lld off, worst %.3g of the bound\n",
               (long long)P, E, (long long)I, (long long)K, (long long)off, (long long)(P * I), worst);
        assert_true(off == 0);
    } else {
        float *y = malloc((size_t)ny * sizeof(float)), *yr = malloc((size_t)ny * sizeof(float));
        gather_mapped(hy, row_map, ref, P, rows, y, yr);
        snprintf(what, sizeof what, "fold ws bf16 P = %lld, E = %d, rows = %lld, K = %lld", (long long)P, E,
                 (long long)rows, (long long)K);
        fold_check_close_acc(y, yr, mag, ny, acc_rel, what);
        free(y), free(yr);
    }
    cudaFree(dj), cudaFree(drs), cudaFree(dx8), cudaFree(dxs), cudaFree(dmap), cudaFree(dn), cudaFree(dtiles);
    cudaFree(dy);
    free(x), free(xs), free(x8), free(row_map), free(hy), free(ref), free(mag);
    fold_free_routed(&rt), fold_free_bank(&b);
}

static void test_ws_gemm(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    run_ws(7, 4, 200, 1152, false);    /* one partial tile an expert; rows_pad 224: a partial column tile */
    run_ws(1000, 3, 256, 300, false);  /* several row tiles an expert, K not a multiple of 128 */
    run_ws(2048, 8, 384, 2048, false); /* three column tiles, 16 groups */
    run_ws(600, 5, 1024, 640, false);  /* eight column tiles: each CTA walks several items */
}

static void test_ws_swiglu(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    run_ws(300, 4, 672, 768, true); /* I = 336: rows_pad 672, the last column tile 32 rows */
    run_ws(1500, 6, 256, 1152, true);
}

/* ---- the moe op under the route ---- */

/* The moe op under w4a8.kernel=fold plus `form` on int4-p2 expert banks (pre-quantized sources in our checkpoint
 * format) at each T: against the emulation of the form (ws: the warp-specialised GEMMs', all of K in one block and h
 * per token; else the fold GEMM's) and against the cpu moe under the same routes (per-token x, and h per token where
 * the route takes the warp-specialised GEMMs) */
static void moe_route_cases(uint64_t seed, int64_t I, const char *form, bool ws, const int64_t *Ts, int nT) {
    fold_seed(seed);
    const int32_t E = 8, k = 2;
    const int64_t H = 384;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *gpu = NULL, *cpu = NULL;
    fm_error err = {{0}};
    char routes[256], own[128];
    const char *user = gpu_test_routes();
    snprintf(own, sizeof own, "w4a8.kernel=fold%s%s", form ? "," : "", form ? form : "");
    snprintf(routes, sizeof routes, "%s%s%s", user ? user : "", user ? "," : "", own);
    assert_int_equal(fm_backend_create("cuda", &plan, 0, routes, &gpu, &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &plan, 0, own, &cpu, &err), FM_OK);
    /* the same int4-p2 numbers as the emulation's banks (p2_bank), as checkpoint sources */
    p2_bank gu = fold_make_bank(E, 2 * I, H, false), dn = fold_make_bank(E, H, I, false);
    fold_experts *src = fold_experts_make(&gu, &dn);
    fm_bank *b[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* [cpu, gpu][gate_up, down] */
    fm_backend *be[2] = {cpu, gpu};
    for (int i = 0; i < 2; i++) fold_experts_banks(be[i], src, &b[i][0], &b[i][1]);
    for (int ti = 0; ti < nT; ti++) {
        const int64_t T = Ts[ti];
        float *x = malloc((size_t)(T * H) * sizeof(float)), *w = malloc((size_t)(T * k) * sizeof(float));
        int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
        for (int64_t i = 0; i < T * H; i++) x[i] = fm_round_bf16(fold_gauss() * (i % 53 == 0 ? 8.0f : 1.0f));
        for (int64_t t = 0; t < T; t++) {
            ids[t * k] = (int32_t)(fold_urand() * E) % E,
                    ids[t * k + 1] = (ids[t * k] + 1 + (int32_t)(fold_urand() * 6)) % E;
            w[t * k] = 0.3f + 0.4f * (float)fold_urand(), w[t * k + 1] = 1.0f - w[t * k];
        }
        float *g = gpu_run_moe(gpu, b[1][0], b[1][1], x, T, H, ids, w, k);
        float *c = gpu_run_moe(cpu, b[0][0], b[0][1], x, T, H, ids, w, k);
        float *ref = malloc((size_t)(T * H) * sizeof(float)), *other = malloc((size_t)(T * H) * sizeof(float));
        fold_emulate_moe_form(&gu, &dn, x, T, ids, w, k, ws, ref);
        fold_emulate_moe_form(&gu, &dn, x, T, ids, w, k, !ws, other);
        char what[112];
        snprintf(what, sizeof what, "moe fold%s T = %lld vs the emulation", ws ? " ws" : "", (long long)T);
        /* the emulation differs only where an accumulator's last bits move a bf16 rounding of gate or up and that an
           e4m3 code of h (the int4-tc op tests see up to 7e-3 from the same flips) */
        gpu_expect_close(g, ref, T * H, 1e-2, what);
        snprintf(what, sizeof what, "moe fold%s T = %lld vs the cpu moe under the routes", ws ? " ws" : "",
                 (long long)T);
        gpu_expect_close(g, c, T * H, 1e-2, what); /* the same roundings: as the emulation */
        /* the two forms of the arithmetic differ by h's rounding and the promotion: printed, for the notes */
        printf("moe fold T = %lld: the emulations of the two forms apart by %.3g (normalised)\n", (long long)T,
               gpu_nerr(ref, other, T * H));
        free(x), free(w), free(ids), free(g), free(c), free(ref), free(other);
    }
    for (int i = 0; i < 2; i++) be[i]->ops->bank_free(be[i], b[i][0]), be[i]->ops->bank_free(be[i], b[i][1]);
    fold_experts_free(src), fold_free_bank(&gu), fold_free_bank(&dn);
    cpu->ops->destroy(cpu), gpu->ops->destroy(gpu);
}

static void test_moe_route(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    /* T = 1 (2 pairs): the decode GEMVs (moe.gemv's default), the rest the fold GEMM (w4a8.fold_ws=off: auto would
       take the warp-specialised GEMMs from 16 rows an expert) */
    const int64_t Ts[] = {1, 7, 64, 512};
    moe_route_cases(31, 256, "w4a8.fold_ws=off", false, Ts, 4);
    const int32_t E = 8, k = 2;
    const int64_t H = 384, I = 256;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *gpu = NULL;
    fm_error err = {{0}};
    char routes[256];
    const char *user = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%sw4a8.kernel=fold", user ? user : "", user ? "," : "");
    assert_int_equal(fm_backend_create("cuda", &plan, 0, routes, &gpu, &err), FM_OK);
    /* float weights: the cuda backend quantizes them to int4-g128, which the route refuses by name */
    fm_wsrc fsrc = {0};
    fsrc.rows = H, fsrc.cols = I, fsrc.synth.seed = 7, fsrc.synth.scale = 0.05f;
    const fm_bank_src fs = {&fsrc, 1, 1, "test float experts", false, true};
    fm_bank *fb = NULL;
    assert_int_equal(gpu->ops->bank_create(gpu, &fs, plan.w_expert, &fb, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "w4a8.kernel=fold needs int4-p2 scales"));
    assert_null(fb);
    /* ... unless the plan quantizes them to int4-p2 (--int4-scales p2: on the device, as the cpu backend does on the
       host): synthetic float experts then run the route, the two backends alike */
    fm_plan p2 = plan;
    p2.int4_p2 = true;
    fm_backend *pg = NULL, *pc = NULL;
    assert_int_equal(fm_backend_create("cuda", &p2, 0, routes, &pg, &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &p2, 0, "w4a8.kernel=fold", &pc, &err), FM_OK);
    fm_wsrc fl[3 * 8];
    for (int32_t i = 0; i < 3 * E; i++) {
        memset(&fl[i], 0, sizeof fl[i]);
        fl[i].rows = i < 2 * E ? I : H, fl[i].cols = i < 2 * E ? H : I;
        fl[i].synth.seed = 100 + (uint64_t)i, fl[i].synth.scale = 0.05f;
    }
    const fm_bank_src fgs = {fl, E, 2, "test float experts gate_up", true, true};
    const fm_bank_src fds = {fl + 2 * E, E, 1, "test float experts down", false, true};
    fm_bank *fbk[2][2];
    fm_backend *pb[2] = {pc, pg};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pb[i]->ops->bank_create(pb[i], &fgs, p2.w_expert, &fbk[i][0], &err), FM_OK);
        assert_int_equal(pb[i]->ops->bank_create(pb[i], &fds, p2.w_expert, &fbk[i][1], &err), FM_OK);
    }
    for (int64_t T = 1; T <= 64; T *= 64) { /* the GEMVs, then the GEMMs */
        float *x = malloc((size_t)(T * H) * sizeof(float)), *w = malloc((size_t)(T * k) * sizeof(float));
        int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
        for (int64_t i = 0; i < T * H; i++) x[i] = fm_round_bf16(fold_gauss());
        for (int64_t t = 0; t < T; t++)
            ids[t * k] = (int32_t)t % E, ids[t * k + 1] = (int32_t)(t + 3) % E, w[t * k] = 0.6f, w[t * k + 1] = 0.4f;
        float *g = gpu_run_moe(pg, fbk[1][0], fbk[1][1], x, T, H, ids, w, k);
        float *c = gpu_run_moe(pc, fbk[0][0], fbk[0][1], x, T, H, ids, w, k);
        char what[96];
        snprintf(what, sizeof what, "moe fold T = %lld, float experts at --int4-scales p2 vs the cpu", (long long)T);
        gpu_expect_close(g, c, T * H, 1e-2, what);
        free(x), free(w), free(ids), free(g), free(c);
    }
    for (int i = 0; i < 2; i++) pb[i]->ops->bank_free(pb[i], fbk[i][0]), pb[i]->ops->bank_free(pb[i], fbk[i][1]);
    pc->ops->destroy(pc), pg->ops->destroy(pg), gpu->ops->destroy(gpu);
}

/* ... with the warp-specialised GEMMs (w4a8.fold_ws=on; auto takes them from 16 rows an expert), I = 320: h over
 * three 128-channel groups, the down GEMM's K not a multiple of 128 */
static void test_moe_route_ws(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    const int64_t Ts[] = {7, 64, 700};
    moe_route_cases(41, 320, "w4a8.fold_ws=on", true, Ts, 3);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_tokens), cmocka_unit_test(test_quantize_p2),    cmocka_unit_test(test_repack),
        cmocka_unit_test(test_gemm_per_token),  cmocka_unit_test(test_gemm_per_group), cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_moe_route),       cmocka_unit_test(test_ws_gemm),        cmocka_unit_test(test_ws_swiglu),
        cmocka_unit_test(test_moe_route_ws),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
