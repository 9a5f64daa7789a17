/* The fold route at decode sizes, on sm_90 (skipped elsewhere):
 *   - the grouped W4A8 GEMV on fold banks (src/backend/cuda/w4a8_fold_gemv.cu) against the CPU's emulation of the
 *     fold arithmetic (fm_w4a8_fold_ref), P = 1..64 routed pairs in tiles of at most 16 rows, at a small shape (K
 *     not a multiple of 128, rows not of 32) and at Qwen3-30B-A3B's widths (H 2048, I 768, E 128): the gate|up
 *     GEMV with per-token scales and the SwiGLU into bf16 h, the down GEMV with per-(slot, group) scales into bf16
 *     rows through a row map, NaN guards around both. The GEMV promotes every group where the emulation sums blocks
 *     of FM_FOLD_PROMOTE groups, and its K slices add in another order: the same bound as the fold GEMM's tests
 *     (one bf16 ulp plus 2^-11 of the sum of |products|, fold_check_close), which covers both;
 *   - the dispatch's per-token rows (fm_cuda_moe_dispatch_read after the moe op under the route): codes and scales
 *     bit for bit fm_w4a8_fold_quantize_tokens of each pair's token, from the one-block decode dispatch (P <= 64)
 *     and from the grouped one (P > 64), a zero row (the scale's floor) and outliers included;
 *   - the moe op under w4a8.kernel=fold with moe.gemv=64 (the GEMVs up to 64 pairs) against the emulation of the
 *     fold MoE and the cpu backend's moe under the same route, at the small shape (top-2, T = 1..300) and at Qwen3's
 *     (top-8, T = 1..8: P = 8..64), and the GEMV path against the GEMM path (moe.gemv=off) on the same input. Above
 *     the GEMVs' pairs the emulation takes the form of h the route does (w4a8.fold_ws: per token from 16 rows an
 *     expert, T = 300 here; per 128 channels below). */
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
#include "backend/routes.h"
#include "backend/cuda/w4a8_fold_gemv.h"
#include "backend/w4a8_fold.h"
#include "fold_test_util.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"

/* the largest tile of a routing (the GEMV's max_rows) */
static int64_t max_tile_rows(const routed *rt) {
    int64_t m = 1;
    for (int32_t i = 0; i < rt->n_tiles; i++) m = rt->tiles[i].rows > m ? rt->tiles[i].rows : m;
    return m;
}

/* a bf16 output of n elements between NaN guards on the device */
static uint16_t *guarded_y(int64_t n) {
    uint16_t *h = malloc((size_t)(n + 2 * GPU_TEST_GUARD) * 2);
    for (int64_t i = 0; i < n + 2 * GPU_TEST_GUARD; i++) h[i] = 0x7FC0; /* NaN */
    uint16_t *d = fold_dev_copy(h, (size_t)(n + 2 * GPU_TEST_GUARD) * 2);
    free(h);
    return d;
}

/* downloads it, checks the guards, returns the n values as floats (NaN where never written) */
static float *fetch_y(uint16_t *d, int64_t n) {
    uint16_t *h = malloc((size_t)(n + 2 * GPU_TEST_GUARD) * 2);
    FOLD_CK(cudaMemcpy(h, d, (size_t)(n + 2 * GPU_TEST_GUARD) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < GPU_TEST_GUARD; i++) {
        assert_int_equal(h[i], 0x7FC0);
        assert_int_equal(h[GPU_TEST_GUARD + n + i], 0x7FC0);
    }
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) y[i] = fm_bf16_to_f32(h[GPU_TEST_GUARD + i]);
    cudaFree(d), free(h);
    return y;
}

/* The gate|up GEMV of an interleaved bank on P per-token rows: h [P][I] bf16 against the SwiGLU of the emulation's
 * gate and up, each within the accumulator model's bound (fold_check_close's), carried through the SwiGLU: |dh| <=
 * 1.1 |d gate| (|up| + |d up|) + (|silu(gate)| + 1.1 |d gate|) |d up| + 2^-6 |h| (silu' <= 1.1; the bf16 roundings
 * of gate, up and h; the kernel's fast exp) */
static void gate_up_case(const p2_bank *gu, int64_t P, const char *shape) {
    const int64_t K = gu->K, I = gu->rows / 2, ldx = gu->G * 128;
    routed rt = fold_route_rows(P, gu->n, 16);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)P * sizeof(float));
    uint8_t *x8 = malloc((size_t)(P * ldx));
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(fold_gauss() * (i % 211 == 0 ? 12.0f : 1.0f));
    fm_w4a8_fold_quantize_tokens(x, P, K, K, x8, ldx, xs);
    uint8_t *dx8 = fold_dev_copy(x8, (size_t)(P * ldx));
    float *dxs = fold_dev_copy(xs, (size_t)P * 4);
    int32_t *dn = fold_dev_copy(&rt.n_tiles, 4);
    fm_fold_tile *dtiles = fold_dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    uint16_t *dy = guarded_y(P * I);
    fm_fold_gemv_args a;
    memset(&a, 0, sizeof a);
    a.codes = gu->d_codes, a.scales = gu->d_scales, a.rows = gu->rows, a.rows_pad = gu->rows_pad;
    a.n_groups = gu->G, a.x = dx8, a.ldx = ldx, a.ascale = FM_FOLD_PER_TOKEN, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn, a.max_tiles = rt.n_tiles + 2, a.max_rows = max_tile_rows(&rt); /* spare tiles */
    a.swiglu = true, a.y = dy + GPU_TEST_GUARD, a.ldy = I;
    fm_cuda_w4a8_fold_gemv(&a, NULL);
    FOLD_CK(cudaDeviceSynchronize());
    float *h = fetch_y(dy, P * I);
    float *ref = malloc((size_t)(P * gu->rows) * sizeof(float)), *mag = malloc((size_t)(P * gu->rows) * sizeof(float));
    float *hv = malloc((size_t)(P * I) * sizeof(float));
    fold_emulate(gu, &rt, x8, ldx, xs, 0, false, ref, mag); /* rows 0..I-1 gate, I..2I-1 up */
    int64_t off = 0;
    for (int64_t i = 0; i < P; i++)
        for (int64_t c = 0; c < I; c++) {
            const float *r = ref + i * gu->rows, *m = mag + i * gu->rows;
            const float gate = fm_round_bf16(r[c]), up = fm_round_bf16(r[I + c]), silu = gate / (1.0f + expf(-gate));
            const double eg = fabs(r[c]) * 0x1p-7 + m[c] * 0x1p-11, eu = fabs(r[I + c]) * 0x1p-7 + m[I + c] * 0x1p-11;
            hv[i * I + c] = fm_round_bf16(silu * up);
            const double tol =
                1.1 * eg * (fabs(up) + eu) + (fabs(silu) + 1.1 * eg) * eu + fabs(hv[i * I + c]) * 0x1p-6 + 1e-30;
            off += !(fabs(h[i * I + c] - hv[i * I + c]) <= tol);
        }
    printf("fold gemv gate|up %s P = %lld (tiles %d, up to %lld rows): nerr %.3g, %lld of %lld h outside the bound\n",
           shape, (long long)P, rt.n_tiles, (long long)a.max_rows, gpu_nerr(h, hv, P * I), (long long)off,
           (long long)(P * I));
    assert_int_equal(off, 0);
    cudaFree(dx8), cudaFree(dxs), cudaFree(dn), cudaFree(dtiles);
    free(x), free(xs), free(x8), free(h), free(ref), free(mag), free(hv);
    fold_free_routed(&rt);
}

/* The down GEMV on P rows of e4m3 h with a scale per (slot, 128 channels), bf16 y through a row map (a permutation:
 * slot i lands on row row_map[i]) */
static void down_case(const p2_bank *dn, int64_t P, const char *shape) {
    const int64_t K = dn->K, G = dn->G, ldx = G * 128, rows = dn->rows;
    routed rt = fold_route_rows(P, dn->n, 16);
    float *x = malloc((size_t)(P * K) * sizeof(float)), *xs = malloc((size_t)(P * G) * sizeof(float));
    uint8_t *x8 = calloc((size_t)(P * ldx), 1);
    float s[64];
    for (int64_t i = 0; i < P * K; i++) x[i] = fm_round_bf16(fold_gauss() * (i % 97 == 0 ? 6.0f : 0.3f));
    for (int64_t i = 0; i < P; i++) { /* as the quantizer of h writes them: [G][P] */
        fm_e4m3_quantize_groups(x + i * K, K, 128, x8 + i * ldx, s);
        for (int64_t g = 0; g < G; g++) xs[g * P + i] = s[g];
    }
    int32_t *row_map = malloc((size_t)P * 4);
    for (int64_t i = 0; i < P; i++) row_map[i] = (int32_t)(P - 1 - i);
    uint8_t *dx8 = fold_dev_copy(x8, (size_t)(P * ldx));
    float *dxs = fold_dev_copy(xs, (size_t)(P * G) * 4);
    int32_t *dn_tiles = fold_dev_copy(&rt.n_tiles, 4), *dmap = fold_dev_copy(row_map, (size_t)P * 4);
    fm_fold_tile *dtiles = fold_dev_copy(rt.tiles, (size_t)rt.n_tiles * sizeof(fm_fold_tile));
    uint16_t *dy = guarded_y(P * rows);
    fm_fold_gemv_args a;
    memset(&a, 0, sizeof a);
    a.codes = dn->d_codes, a.scales = dn->d_scales, a.rows = rows, a.rows_pad = dn->rows_pad, a.n_groups = G;
    a.x = dx8, a.ldx = ldx, a.ascale = FM_FOLD_PER_GROUP, a.xs = dxs, a.lds = P;
    a.tiles = dtiles, a.n_tiles = dn_tiles, a.max_tiles = rt.n_tiles, a.max_rows = max_tile_rows(&rt);
    a.y = dy + GPU_TEST_GUARD, a.ldy = rows, a.row_map = dmap;
    fm_cuda_w4a8_fold_gemv(&a, NULL);
    FOLD_CK(cudaDeviceSynchronize());
    float *yo = fetch_y(dy, P * rows), *y = malloc((size_t)(P * rows) * sizeof(float));
    float *ref = malloc((size_t)(P * rows) * sizeof(float)), *mag = malloc((size_t)(P * rows) * sizeof(float));
    fold_emulate(dn, &rt, x8, ldx, xs, P, true, ref, mag);
    for (int64_t i = 0; i < P; i++)
        for (int64_t r = 0; r < rows; r++) {
            y[i * rows + r] = yo[(int64_t)row_map[i] * rows + r];
            assert_false(isnan(y[i * rows + r]));
            ref[i * rows + r] = fm_round_bf16(ref[i * rows + r]);
        }
    char what[128];
    snprintf(what, sizeof what, "fold gemv down %s P = %lld (tiles %d, up to %lld rows)", shape, (long long)P,
             rt.n_tiles, (long long)a.max_rows);
    fold_check_close(y, ref, mag, P * rows, what);
    cudaFree(dx8), cudaFree(dxs), cudaFree(dn_tiles), cudaFree(dmap), cudaFree(dtiles);
    free(x), free(xs), free(x8), free(row_map), free(yo), free(y), free(ref), free(mag);
    fold_free_routed(&rt);
}

static void test_gemv_small(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    fold_seed(41);
    /* gate|up: I = 104 channels (rows 208, padded to 224), K = 328 (3 groups, the last partial) */
    p2_bank gu = fold_make_bank(8, 208, 328, true), dn = fold_make_bank(8, 328, 104, false);
    const int64_t Ps[] = {1, 2, 3, 8, 9, 16, 17, 40, 64};
    for (int i = 0; i < 9; i++) {
        gate_up_case(&gu, Ps[i], "small");
        down_case(&dn, Ps[i], "small");
    }
    fold_free_bank(&gu), fold_free_bank(&dn);
}

/* Qwen3-30B-A3B's experts (H 2048, I 768, E 128), made once for the tests below */
static p2_bank qwen_gu, qwen_dn;
static void qwen_banks(void) {
    if (qwen_gu.q) return;
    fold_seed(43);
    qwen_gu = fold_make_bank_random(128, 2 * 768, 2048, true);
    qwen_dn = fold_make_bank_random(128, 2048, 768, false);
}

static void test_gemv_qwen3(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    qwen_banks();
    const int64_t Ps[] = {1, 3, 8, 16, 17, 33, 64};
    for (int i = 0; i < 7; i++) {
        gate_up_case(&qwen_gu, Ps[i], "qwen3");
        down_case(&qwen_dn, Ps[i], "qwen3");
    }
}

/* ---- the moe op under the route ---- */

/* the backend NAME under ROUTES (the command line's first on cuda); its route table, when r is given, for the
   form of h the emulation follows */
static fm_backend *make_backend(const char *name, const char *routes, fm_routes *r) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *be = NULL;
    fm_error err = {{0}};
    char all[256];
    const char *user = gpu_test_routes();
    snprintf(all, sizeof all, "%s%s%s", user && !strcmp(name, "cuda") ? user : "",
             user && !strcmp(name, "cuda") ? "," : "", routes);
    if (fm_backend_create(name, &plan, 0, all, &be, &err)) fail_msg("%s backend (%s): %s", name, all, err.msg);
    if (r) {
        fm_routes_default(r, 9);
        if (fm_routes_apply(r, all, &err)) fail_msg("routes %s: %s", all, err.msg);
    }
    return be;
}

/* x [T][H] (token 0 all zeros: the scale's floor; outliers), routing of T tokens to k distinct experts of E */
static void make_input(int64_t T, int64_t H, int32_t E, int32_t k, float *x, int32_t *ids, float *w) {
    for (int64_t i = 0; i < T * H; i++)
        x[i] = i < H && T > 1 ? 0.0f : fm_round_bf16(fold_gauss() * (i % 53 == 0 ? 8.0f : 1.0f));
    for (int64_t t = 0; t < T; t++) {
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            int32_t e;
            bool taken;
            do { /* skewed towards the first experts */
                e = (int32_t)(fold_urand() * fold_urand() * E) % E, taken = false;
                for (int32_t i = 0; i < j; i++) taken |= ids[t * k + i] == e;
            } while (taken);
            ids[t * k + j] = e, sum += (w[t * k + j] = 0.2f + (float)fold_urand());
        }
        for (int32_t j = 0; j < k; j++) w[t * k + j] /= sum;
    }
}

/* the dispatch's per-token rows the moe op left (pair order) against the CPU's quantizer on each pair's token */
static void expect_token_rows(fm_backend *gpu, const float *x, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I,
                              const char *what) {
    const int64_t P = T * k, Hp = (H + 127) / 128 * 128;
    uint8_t *codes = malloc((size_t)(P * Hp)), *want = malloc((size_t)Hp);
    float *scales = malloc((size_t)P * sizeof(float)), ts = 0.0f, ws = 0.0f;
    assert_true(fm_cuda_moe_dispatch_read(gpu, T, k, E, H, I, codes, (uint8_t *)scales, &ts));
    for (int64_t p = 0; p < P; p++) {
        fm_w4a8_fold_quantize_tokens(x + (p / k) * H, 1, H, H, want, Hp, &ws);
        if (memcmp(&scales[p], &ws, 4))
            fail_msg("%s: pair %lld scale %.9g, CPU %.9g", what, (long long)p, scales[p], ws);
        for (int64_t c = 0; c < Hp; c++)
            if (codes[p * Hp + c] != want[c])
                fail_msg("%s: pair %lld code %lld: %02x on the GPU, %02x on the CPU", what, (long long)p, (long long)c,
                         codes[p * Hp + c], want[c]);
    }
    printf("  %s: %lld per-token rows bit for bit the CPU quantizer's\n", what, (long long)P);
    free(codes), free(want), free(scales);
}

/* the moe op on the GEMV route (moe.gemv=64) against the emulation and the cpu moe, the dispatch's rows bit for bit;
 * when gemm is given, that backend (moe.gemv=off) on the same input too */
static void moe_case(fm_backend *gpu, const fm_routes *gpu_routes, fm_backend *cpu, fm_bank *const b[2][2],
                     const p2_bank *gu, const p2_bank *dn, int64_t T, int32_t k, fm_backend *gemm,
                     fm_bank *const bg[2]) {
    const int32_t E = gu->n;
    const int64_t H = gu->K, I = dn->K;
    float *x = malloc((size_t)(T * H) * sizeof(float)), *w = malloc((size_t)(T * k) * sizeof(float));
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    make_input(T, H, E, k, x, ids, w);
    char what[128];
    float *g = gpu_run_moe(gpu, b[1][0], b[1][1], x, T, H, ids, w, k);
    snprintf(what, sizeof what, "H %lld, top-%d, T = %lld (P = %lld)", (long long)H, k, (long long)T,
             (long long)(T * k));
    expect_token_rows(gpu, x, T, E, k, H, I, what);
    float *c = gpu_run_moe(cpu, b[0][0], b[0][1], x, T, H, ids, w, k);
    float *ref = malloc((size_t)(T * H) * sizeof(float));
    /* above the GEMVs' pairs, the warp-specialised GEMMs (h per token) where the route takes them from the rows an
       expert, else the fold GEMM (h per 128 channels) */
    fold_emulate_moe_form(gu, dn, x, T, ids, w, k, fm_routes_fold_ws(gpu_routes, (uint64_t)(T * k), (uint64_t)E, k),
                          ref);
    /* as test_cuda_fold's moe op: the emulation differs where an accumulator's last bits move a bf16 rounding of
       gate or up and that an e4m3 code of h */
    snprintf(what, sizeof what, "moe fold H %lld T = %lld vs the emulation", (long long)H, (long long)T);
    gpu_expect_close(g, ref, T * H, 1e-2, what);
    snprintf(what, sizeof what, "moe fold H %lld T = %lld vs the cpu moe under the route", (long long)H, (long long)T);
    gpu_expect_close(g, c, T * H, 1e-2, what);
    if (gemm) {
        float *m = gpu_run_moe(gemm, bg[0], bg[1], x, T, H, ids, w, k);
        snprintf(what, sizeof what, "moe fold H %lld T = %lld: GEMVs vs GEMMs", (long long)H, (long long)T);
        gpu_expect_close(g, m, T * H, 1e-2, what);
        free(m);
    }
    free(x), free(w), free(ids), free(g), free(c), free(ref);
}

static void moe_route(const p2_bank *gu, const p2_bank *dn, int32_t k, const int64_t *Ts, int n_T, int64_t T_gemm) {
    fm_routes gpu_routes;
    fm_backend *gpu = make_backend("cuda", "w4a8.kernel=fold,moe.gemv=64", &gpu_routes);
    fm_backend *gemm = make_backend("cuda", "w4a8.kernel=fold,moe.gemv=off", NULL);
    fm_backend *cpu = make_backend("cpu", "w4a8.kernel=fold", NULL); /* per token too */
    fold_experts *src = fold_experts_make(gu, dn);
    fm_bank *b[2][2], *bg[2];
    fold_experts_banks(cpu, src, &b[0][0], &b[0][1]);
    fold_experts_banks(gpu, src, &b[1][0], &b[1][1]);
    fold_experts_banks(gemm, src, &bg[0], &bg[1]);
    for (int i = 0; i < n_T; i++)
        moe_case(gpu, &gpu_routes, cpu, b, gu, dn, Ts[i], k, Ts[i] == T_gemm ? gemm : NULL, bg);
    cpu->ops->bank_free(cpu, b[0][0]), cpu->ops->bank_free(cpu, b[0][1]);
    gpu->ops->bank_free(gpu, b[1][0]), gpu->ops->bank_free(gpu, b[1][1]);
    gemm->ops->bank_free(gemm, bg[0]), gemm->ops->bank_free(gemm, bg[1]);
    fold_experts_free(src);
    cpu->ops->destroy(cpu), gpu->ops->destroy(gpu), gemm->ops->destroy(gemm);
}

static void test_moe_small(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    fold_seed(47);
    p2_bank gu = fold_make_bank(8, 2 * 200, 328, false), dn = fold_make_bank(8, 328, 200, false);
    /* P = 2..64: the one-block dispatch and the GEMVs; P = 66, 600: the grouped dispatch and the GEMMs */
    const int64_t Ts[] = {1, 2, 5, 32, 33, 300};
    moe_route(&gu, &dn, 2, Ts, 6, 5);
    fold_free_bank(&gu), fold_free_bank(&dn);
}

static void test_moe_qwen3(void **state) {
    (void)state;
    if (!fold_have_sm90()) return;
    qwen_banks();
    fold_seed(53);
    const int64_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8}; /* P = 8..64 at top-8 */
    moe_route(&qwen_gu, &qwen_dn, 8, Ts, 8, 1);
}

static int free_qwen(void **state) {
    (void)state;
    if (qwen_gu.q) fold_free_bank(&qwen_gu), fold_free_bank(&qwen_dn);
    return 0;
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    /* FM_TEST_FILTER='test_*_small' runs the small shapes alone (compute-sanitizer: tools/gpu-check.sh) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_small),
        cmocka_unit_test(test_gemv_qwen3),
        cmocka_unit_test(test_moe_small),
        cmocka_unit_test(test_moe_qwen3),
    };
    return cmocka_run_group_tests(tests, NULL, free_qwen);
}
