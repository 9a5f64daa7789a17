/* The cuBLASLt FP8 anchor of `bench moe` (bench/anchors/moe_cublaslt_fp8.cu) is a yardstick, but it must compute
 * the expert FFN correctly. Per case (fresh random weights, x with an outlier channel, routing by the GPU's route op,
 * outputs between NaN guards):
 *   - against an exact host emulation of its formats (bf16 weights -> e4m3 with one scale amax/448 per matrix; x and
 *     h -> e4m3 with one scale per tensor; bf16 GEMM outputs, bf16 h, fp32 combine): ||lt - emu|| / ||emu|| <= 1e-2
 *     (only the summation order differs; a bf16 rounding flip of h can move one e4m3 code, rare and small).
 *     A transposed operand, a wrong scale or a misplaced expert segment gives errors of order 1.
 *   - against the bf16 route (cuBLAS grouped GEMMs, the ref preset) on the same banks and inputs:
 *     ||lt - bf16|| / ||bf16|| <= 0.12: the cost of per-tensor e4m3 itself (about 2.5% relative per rounded operand,
 *     x and W into gate|up, then h and W into down: 0.059 to 0.080 measured between the emulation and a host bf16
 *     reference at these shapes and at H 2048, I 768; T = 1 is the noisiest).
 *   - the route is run twice on the same inputs (the second call uses the algorithms remembered by the first);
 *     the output checked is the second one's.
 *   - refusals: H or I not a multiple of 16, a cpu backend.
 * Shapes: E 8, top-2, H 256, I 128 at T = 1, 7, 300 (T = 1 leaves six experts empty), and E 16, top-4, H 512, I 256
 * at T = 33. Runs only where a GPU is present (make test-gpu). */
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
#include "anchors/moe_cublaslt_fp8.cuh"
#include "quant/bf16.h"
#include "quant/e4m3.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform (-1, 1), never exactly zero */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    float v = (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
    return v == 0.0f ? 0.5f : v;
}

static fm_backend *cuda_ref(void) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cuda", &plan); /* bf16 banks */
    fm_backend *be = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &be, &err)) fail_msg("cuda backend: %s", err.msg);
    return be;
}

/* a bf16 bank from host fp32 matrices [n][rows, cols] (gate|up rows already concatenated) */
static fm_bank *bank(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols) {
    return gpu_bank(be, w, n, rows, cols, FM_W_BF16, false);
}

/* ---- the host emulation of the route's formats ---- */

static float tensor_scale(const float *v, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(v[i]));
    return fmaxf(a / FM_E4M3_MAX, FM_ACT_SCALE_FLOOR);
}

/* v[i] -> e4m3(v[i] / s) decoded (the integer-like code value, not yet times s) */
static void e4m3_codes(const float *v, int64_t n, float s, float *q) {
    for (int64_t i = 0; i < n; i++) q[i] = fm_e4m3_to_f32(fm_f32_to_e4m3(v[i] / s));
}

/* y[N] = bf16(s * sum_k a[k] w[n, k]) */
static void dot_rows(const float *a, const float *w, int64_t N, int64_t K, float s, float *y) {
    for (int64_t n = 0; n < N; n++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++) acc += (double)a[k] * w[n * K + k];
        y[n] = fm_round_bf16((float)(s * acc));
    }
}

/* x [T, H] and wts [T, k] already bf16 values; gu [E][2I, H], dn [E][H, I] already bf16 values */
static void emulate(const float *gu, const float *dn, int32_t E, int64_t H, int64_t I, const float *x, int64_t T,
                    const int32_t *ids, const float *wts, int32_t k, float *out) {
    const int64_t P = T * k;
    float *gq = malloc((size_t)(E * 2 * I * H) * sizeof(float)), *dq = malloc((size_t)(E * H * I) * sizeof(float));
    float *sg = malloc((size_t)E * sizeof(float)), *sd = malloc((size_t)E * sizeof(float));
    for (int32_t e = 0; e < E; e++) {
        sg[e] = tensor_scale(gu + e * 2 * I * H, 2 * I * H), sd[e] = tensor_scale(dn + e * H * I, H * I);
        e4m3_codes(gu + e * 2 * I * H, 2 * I * H, sg[e], gq + e * 2 * I * H);
        e4m3_codes(dn + e * H * I, H * I, sd[e], dq + e * H * I);
    }
    const float sx = tensor_scale(x, T * H);
    float *xq = malloc((size_t)(T * H) * sizeof(float)), *g = malloc((size_t)(2 * I) * sizeof(float));
    float *h = malloc((size_t)(P * I) * sizeof(float)), *hq = malloc((size_t)(P * I) * sizeof(float));
    float *y = malloc((size_t)(P * H) * sizeof(float));
    e4m3_codes(x, T * H, sx, xq);
    for (int64_t p = 0; p < P; p++) {
        const int32_t e = ids[p];
        dot_rows(xq + (p / k) * H, gq + e * 2 * I * H, 2 * I, H, sx * sg[e], g);
        for (int64_t i = 0; i < I; i++) h[p * I + i] = fm_round_bf16(g[i] / (1.0f + expf(-g[i])) * g[I + i]);
    }
    const float sh = tensor_scale(h, P * I);
    e4m3_codes(h, P * I, sh, hq);
    for (int64_t p = 0; p < P; p++) dot_rows(hq + p * I, dq + ids[p] * H * I, H, I, sh * sd[ids[p]], y + p * H);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < H; c++) {
            float acc = 0.0f;
            for (int32_t j = 0; j < k; j++) acc += wts[t * k + j] * y[(t * k + j) * H + c];
            out[t * H + c] = fm_round_bf16(acc);
        }
    free(gq), free(dq), free(sg), free(sd), free(xq), free(g), free(h), free(hq), free(y);
}

/* ---- cases ---- */

static float *rand_bf16(int64_t n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = fm_round_bf16(frand() * scale);
    return v;
}

static void lt_case(int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    fm_backend *be = cuda_ref();
    /* weights with variance 1 / fan_in (bf16 values, so the bank holds them exactly); x with an outlier channel */
    float *gu = rand_bf16((int64_t)E * 2 * I * H, sqrtf(3.0f / (float)H)),
          *dn = rand_bf16((int64_t)E * H * I, sqrtf(3.0f / (float)I));
    float *x = rand_bf16(T * H, 1.0f), *logits = rand_bf16(T * E, 3.5f);
    for (int64_t t = 0; t < T; t++) x[t * H + 3] = fm_round_bf16(8.0f * x[t * H + 3]);
    fm_bank *gub = bank(be, gu, E, 2 * I, H), *dnb = bank(be, dn, E, H, I);
    void *xd = gpu_upload(be, x, T * H), *ld = gpu_upload(be, logits, T * E);
    void *ids_d = be->ops->alloc(be, (size_t)(T * k) * 4),
         *w_d = be->ops->alloc(be, (size_t)(T * k) * be->ops->act_size);
    be->ops->route(be, ld, T, E, k, FM_ROUTER_SOFTMAX_TOPK, true, ids_d, w_d);
    int32_t *ids = malloc((size_t)(T * k) * sizeof *ids);
    float *wts = malloc((size_t)(T * k) * sizeof *wts);
    be->ops->download_raw(be, ids_d, (size_t)(T * k) * 4, ids);
    be->ops->download_f32(be, w_d, T * k, wts);

    void *base_ref, *base_lt;
    void *o_ref = gpu_guarded(be, T * H, &base_ref), *o_lt = gpu_guarded(be, T * H, &base_lt);
    be->ops->moe(be, gub, dnb, xd, T, ids_d, w_d, k, FM_A_NATIVE, FM_A_NATIVE, o_ref);
    fm_lt_moe *lt = NULL;
    fm_error err;
    if (fm_lt_moe_create(be, gub, dnb, &lt, &err)) fail_msg("fm_lt_moe_create: %s", err.msg);
    assert_int_equal(fm_lt_moe_weight_bytes(lt), (size_t)(E * 3 * I * H) + 2 * (size_t)E * sizeof(float));
    /* twice: the first call chooses every (rows, alignment) algorithm, the second runs the remembered ones */
    for (int r = 0; r < 2; r++)
        if (fm_lt_moe_run(lt, xd, T, ids_d, w_d, k, o_lt, &err))
            fail_msg("fm_lt_moe_run (call %d): %s", r + 1, err.msg);
    char what[128];
    snprintf(what, sizeof what, "cublaslt fp8 moe T=%lld E=%d k=%d H=%lld I=%lld", (long long)T, E, k, (long long)H,
             (long long)I);
    float *ref = gpu_fetch(be, base_ref, T * H, what), *got = gpu_fetch(be, base_lt, T * H, what);
    float *emu = malloc((size_t)(T * H) * sizeof *emu);
    emulate(gu, dn, E, H, I, x, T, ids, wts, k, emu);
    const double e_emu = gpu_nerr(got, emu, T * H), e_bf16 = gpu_nerr(got, ref, T * H),
                 e_model = gpu_nerr(emu, ref, T * H);
    printf("  %-52s err vs emulation %.3g, vs bf16 route %.3g (emulation vs bf16 %.3g)\n", what, e_emu, e_bf16,
           e_model);
    if (!(e_emu <= 1e-2)) {
        for (int64_t i = 0; i < T * H && i < 6; i++)
            printf("    [%lld] lt %g emu %g bf16 %g\n", (long long)i, got[i], emu[i], ref[i]);
        fail_msg("%s: error %.3g against the emulation of its formats > 1e-2", what, e_emu);
    }
    if (!(e_bf16 <= 0.12)) fail_msg("%s: error %.3g against the bf16 route > 0.12", what, e_bf16);

    fm_lt_moe_free(lt);
    be->ops->free(be, xd), be->ops->free(be, ld), be->ops->free(be, ids_d), be->ops->free(be, w_d);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, dnb);
    be->ops->destroy(be);
    free(gu), free(dn), free(x), free(logits), free(ids), free(wts), free(ref), free(got), free(emu);
}

static void test_against_emulation_and_bf16(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) lt_case(Ts[i], 8, 2, 256, 128);
    lt_case(33, 16, 4, 512, 256);
}

static void test_refusals(void **s) {
    (void)s;
    fm_backend *be = cuda_ref();
    float *gu = rand_bf16(2 * 2 * 72 * 200, 0.1f), *dn = rand_bf16(2 * 200 * 72, 0.1f);
    fm_bank *gub = bank(be, gu, 2, 2 * 72, 200), *dnb = bank(be, dn, 2, 200, 72);
    fm_lt_moe *lt = NULL;
    fm_error err;
    assert_int_equal(fm_lt_moe_create(be, gub, dnb, &lt, &err), FM_ERR_UNSUPPORTED); /* H 200, I 72 */
    assert_null(lt);
    assert_non_null(strstr(err.msg, "multiples of 16"));
    be->ops->bank_free(be, gub), be->ops->bank_free(be, dnb);
    be->ops->destroy(be);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cuda", &plan);
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &be, &err), FM_OK);
    gub = bank(be, gu, 2, 2 * 72, 200), dnb = bank(be, dn, 2, 200, 72);
    assert_int_equal(fm_lt_moe_create(be, gub, dnb, &lt, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "cuda"));
    be->ops->bank_free(be, gub), be->ops->bank_free(be, dnb);
    be->ops->destroy(be);
    free(gu), free(dn);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_emulation_and_bf16),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
