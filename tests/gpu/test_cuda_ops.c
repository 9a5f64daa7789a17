/* Backend-op tests: every CUDA op against the CPU op given the same plan (the CPU then emulates the GPU's
 * formats exactly: bf16 activations, bf16 or int4 weights), on fresh random inputs of odd sizes. Outputs sit
 * between guard regions poisoned with NaN: the guards must stay NaN (no out-of-bounds write) and every output
 * element must be written (no NaN left). Error is ||gpu - cpu|| / ||cpu||; thresholds per format:
 *   exact ops (embed, add, swiglu, router ids)           <= 1e-6 (same formulas on the same bf16 inputs)
 *   bf16-output ops with reductions (norms, GEMM, attention, MoE)  <= 1e-2 (different summation orders; one
 *   bf16 rounding step is 2^-8 = 3.9e-3 relative, the normalised error of a few flips is far below)
 *   ref32 (the fp32 oracle, f32 weights and activations): exact ops <= 1e-6, reductions <= 1e-5 (fp32 sums in
 *   different orders: ~1e-7 relative per element)
 *   W4A8 (fp8 preset) linear <= 5e-3, MoE <= 3e-2: the Hopper FP8 wgmma accumulates a 128-group's products
 *   in a narrower-than-fp32 accumulator (measured ~5e-4 normalised against the exact CPU sum; the mma.sync
 *   kernel is within 4e-5), and in the MoE that difference can flip an e4m3 code of the SwiGLU output (one
 *   code step is 6-12% of the value), which a T = 1 case with a few hundred outputs shows as ~1.5e-2
 *   paged KV cache: kv_store exact (each backend's cache against its own roped rows, bit for bit, no other slot
 *   written; qk_norm_rope_store the bits of qk_norm_rope + kv_store, padding rows storing nothing); attention_paged
 *   as attention (1e-2 bf16: the GPU rounds P to bf16 for P V as the prefill kernel does,
 *   and the roped q/k of the two backends may differ by a bf16 ulp; 1e-5 fp32); a captured decode step replayed
 *   with new positions equals the plain launch bit for bit; route paged.combine=fused (the split kernel's last CTAs
 *   merge the splits) equals paged.combine=kernel bit for bit, its scratch counters zero again after every call
 *   e4m3 KV cache (FM_KV_E4M3): the cuda backend's codes and scales are quant/kv_e4m3.c's bit for bit (kv_store and
 *   qk_norm_rope_store, nothing else written); its attention_paged on them within 4e-3 of attention_paged on a bf16
 *   cache of their values (f16 P against bf16 P), attention_paged_runs (the chunks' rows on the tiled kernel's e4m3
 *   form) within 4e-3 of the same op on the values and of attention_paged;
 *   the cpu's emulation (the values as activations) within the attention bound of the cuda backend
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

#include <cuda_runtime_api.h>

#include "backend/attention_paged.h"
#include "backend/backend.h"
#include "backend/routes.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"
#include "quant/e2m1.h"
#include "quant/kv_e4m3.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform (-1, 1), never exactly zero */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    float v = (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
    return v == 0.0f ? 0.5f : v;
}
static float *rand_array(int64_t n, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

typedef struct both {
    fm_backend *be[2]; /* 0 cpu, 1 cuda */
} both;

/* the cuda backend under the command line's routes and `extra` (NULL: none; it wins over them) */
static both make_dense_routes(fm_preset p, fm_dense dense, const char *extra) {
    both b;
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_plan_set_dense(&plan, dense);
    const char *given = gpu_test_routes();
    char routes[512];
    snprintf(routes, sizeof routes, "%s%s%s", given ? given : "", given && extra ? "," : "", extra ? extra : "");
    fm_error err;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &b.be[0], &err), FM_OK);
    fm_status st = fm_backend_create("cuda", &plan, 0, routes[0] ? routes : NULL, &b.be[1], &err);
    if (st) fail_msg("cuda backend: %s", err.msg);
    return b;
}
static both make_dense(fm_preset p, fm_dense dense) { return make_dense_routes(p, dense, NULL); }
/* the plan's weight format for norms and embeddings, and the bound for ops with reductions (see the top) */
static fm_wformat other_fmt(const both *b) { return b->be[1]->plan.w_other; }
static double reduction_bound(const both *b) { return b->be[1]->plan.act_bf16 ? 1e-2 : 1e-5; }

static both make(fm_preset p) { return make_dense(p, FM_DENSE_PRESET); }

/* both backends with the preset's plan and a --dispatch format, under the command line's routes and `extra` (NULL:
   none; it wins over them). The cpu backend gets the same routes: it emulates those that change the arithmetic
   (moe.act_scale=token, w4a8.kernel=fold) and decides where they apply as the cuda backend does. */
static both make_dispatch_routes(fm_preset p, fm_dispatch d, const char *extra) {
    both b;
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    assert_int_equal(fm_plan_set_dispatch(&plan, d, &err), FM_OK);
    const char *given = gpu_test_routes();
    char routes[512];
    snprintf(routes, sizeof routes, "%s%s%s", given ? given : "", given && extra ? "," : "", extra ? extra : "");
    const char *r = routes[0] ? routes : NULL;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, r, &b.be[0], &err), FM_OK);
    fm_status st = fm_backend_create("cuda", &plan, 0, r, &b.be[1], &err);
    if (st) fail_msg("cuda backend: %s", err.msg);
    return b;
}

static void destroy(both *b) {
    for (int i = 0; i < 2; i++) b->be[i]->ops->destroy(b->be[i]);
}

static fm_bank *bank(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt) {
    return gpu_bank(be, w, n, rows, cols, fmt, false);
}

/* y = x W^T on both backends of b (destroyed here), x M x K at x_scale with an outlier, against the cpu */
static void linear_on(both b, fm_wformat fmt, int64_t M, int64_t K, int64_t N, float x_scale, const char *routes) {
    float *w = rand_array(N * K, 0.1f), *x = rand_array(M * K, x_scale);
    if (x_scale != 0.0f) x[0] = 30.0f; /* an outlier */
    float *y[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *wb = bank(be, w, 1, N, K, fmt);
        void *xd = gpu_upload(be, x, M * K), *base;
        void *yd = gpu_guarded(be, M * N, &base);
        be->ops->linear(be, wb, 0, xd, M, be->plan.a_dense, yd);
        y[i] = gpu_fetch(be, base, M * N, "linear");
        be->ops->free(be, xd);
        be->ops->bank_free(be, wb);
    }
    char what[160];
    snprintf(what, sizeof what, "linear %s M=%lld K=%lld N=%lld%s%s%s", fm_wformat_name(fmt), (long long)M,
             (long long)K, (long long)N, x_scale == 0.0f ? " zero input" : "", routes ? " " : "", routes ? routes : "");
    const bool fp8 = fmt == FM_W_INT4_G128_TC || fmt == FM_W_E4M3_PT;
    gpu_expect_close(y[1], y[0], M * N, fp8 ? 5e-3 : reduction_bound(&b), what);
    free(y[0]), free(y[1]), free(w), free(x);
    destroy(&b);
}

static void linear_case_x(fm_preset p, fm_wformat fmt, int64_t M, int64_t K, int64_t N, float x_scale) {
    linear_on(make_dense(p, fmt == FM_W_E4M3_PT ? FM_DENSE_W8A8 : FM_DENSE_PRESET), fmt, M, K, N, x_scale, NULL);
}

static void linear_case(fm_preset p, fm_wformat fmt, int64_t M, int64_t K, int64_t N) {
    linear_case_x(p, fmt, M, K, N, 1.0f);
}

/* W8A8 (--dense w8a8): M = 1, 8 (the mma.sync GEMV) and 9, 16, 300 (cuBLASLt FP8; src/backend/routes.h has the route
   table; gpu-check also runs these with --route w8a8.gemv_max_m=16, the two-tile form), on the fused (M Kp <= 65536)
   and the two-kernel activation quantization, K not a multiple of 16 (padded) nor of 64 (the GEMV's last chunk
   partial), the Qwen3-30B-A3B attention shapes, many rows with a short K, a long K with few rows, and an all-zero
   input on both GEMM routes (the scale floor: zeros out, no NaN). N must be a multiple of 16. */
static void test_linear_w8a8(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 8, 9, 16, 300};
    const int64_t shapes[][2] = {{200, 208}, {2048, 5120}, {4096, 2048}, {256, 6400}, {8192, 64}};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) linear_case(FM_PRESET_FP8, FM_W_E4M3_PT, Ms[i], shapes[j][0], shapes[j][1]);
    linear_case_x(FM_PRESET_FP8, FM_W_E4M3_PT, 7, 192, 384, 0.0f);
    linear_case_x(FM_PRESET_FP8, FM_W_E4M3_PT, 300, 2048, 512, 0.0f);
}

/* The fused activation quantizer past 8 blocks (route w8a8.quant=fused: up to 64 blocks of 8192 elements at one grid
   barrier) at the Qwen3-30B-A3B projections' shapes, 17 to 128 rows (K 4096 at 128 rows: 64 blocks), a K not a
   multiple of 16, an all-zero input; and the three-launch form (w8a8.quant=kernel) at the rows the fused one takes by
   default. The rows above w8a8.gemv_max_m run cuBLASLt, the rest the GEMV. */
static void test_linear_w8a8_quant_routes(void **s) {
    (void)s;
    fm_routes r;
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_w8a8_fused_elems(&r), FM_W8A8_FUSED_ELEMS_DEFAULT);
    const int64_t Ms[] = {17, 33, 64, 128}, shapes[][2] = {{2048, 5120}, {4096, 2048}, {200, 208}};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            linear_on(make_dense_routes(FM_PRESET_FP8, FM_DENSE_W8A8, "w8a8.quant=fused"), FM_W_E4M3_PT, Ms[i],
                      shapes[j][0], shapes[j][1], 1.0f, "w8a8.quant=fused");
    linear_on(make_dense_routes(FM_PRESET_FP8, FM_DENSE_W8A8, "w8a8.quant=fused"), FM_W_E4M3_PT, 64, 4096, 512, 0.0f,
              "w8a8.quant=fused");
    const int64_t Mk[] = {1, 8, 16};
    for (int i = 0; i < 3; i++)
        linear_on(make_dense_routes(FM_PRESET_FP8, FM_DENSE_W8A8, "w8a8.quant=kernel"), FM_W_E4M3_PT, Mk[i], 2048, 5120,
                  1.0f, "w8a8.quant=kernel");
}

/* W8A8 at decode sizes, many calls on one backend: the fused activation quantizer's blocks meet at a grid barrier
   whose words persist between calls (linear_w8a8.cu), so a sequence with changing block counts (M Kp / 8192: 8,
   3, 1, 8, 2, 6, 8, 1) must give each call its own amax. Outlier magnitudes change from call to call. */
static void w8a8_sequence(const char *routes, const int64_t Ms[8]) {
    both b = make_dense_routes(FM_PRESET_FP8, FM_DENSE_W8A8, routes);
    const int64_t K = 4096, N = 64;
    float *w = rand_array(N * K, 0.1f);
    fm_bank *wb[2];
    for (int i = 0; i < 2; i++) wb[i] = bank(b.be[i], w, 1, N, K, FM_W_E4M3_PT);
    for (int c = 0; c < 8; c++) {
        const int64_t M = Ms[c];
        float *x = rand_array(M * K, 1.0f), *y[2];
        x[(c * 977) % (M * K)] = 10.0f * (float)(c + 1); /* the amax moves */
        for (int i = 0; i < 2; i++) {
            fm_backend *be = b.be[i];
            void *xd = gpu_upload(be, x, M * K), *base;
            void *yd = gpu_guarded(be, M * N, &base);
            be->ops->linear(be, wb[i], 0, xd, M, be->plan.a_dense, yd);
            y[i] = gpu_fetch(be, base, M * N, "linear");
            be->ops->free(be, xd);
        }
        char what[160];
        snprintf(what, sizeof what, "linear e4m3-tensor sequence call %d M=%lld K=%lld N=%lld %s", c, (long long)M,
                 (long long)K, (long long)N, routes ? routes : "");
        gpu_expect_close(y[1], y[0], M * N, 5e-3, what);
        free(y[0]), free(y[1]), free(x);
    }
    for (int i = 0; i < 2; i++) b.be[i]->ops->bank_free(b.be[i], wb[i]);
    free(w);
    destroy(&b);
}

static void test_linear_w8a8_sequence(void **s) {
    (void)s;
    const int64_t Ms[8] = {16, 6, 1, 16, 4, 12, 16, 2};
    w8a8_sequence(NULL, Ms);
    /* w8a8.quant=fused: 64, 8, 1, 32, 64, 3, 40 and 8 blocks at one barrier */
    const int64_t Mf[8] = {128, 16, 2, 64, 128, 6, 80, 16};
    w8a8_sequence("w8a8.quant=fused", Mf);
}

static void test_linear(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 3, 17, 300}, Ks[][2] = {{200, 37}, {96, 256}, {1000, 130}};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            linear_case(FM_PRESET_REF, FM_W_BF16, Ms[i], Ks[j][0], Ks[j][1]);
            linear_case(FM_PRESET_REF32, FM_W_F32, Ms[i], Ks[j][0], Ks[j][1]);
            linear_case(FM_PRESET_INT4, FM_W_INT4_G128, Ms[i], Ks[j][0], Ks[j][1]);
            linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ms[i], Ks[j][0], Ks[j][1]);
        }
    /* W4A8 at the sizes of the issue: decode (1, 9, 16: the mma.sync GEMV) and prefill rows (the grouped GEMM), a
       K that is not a multiple of 128, N not a multiple of 16 */
    const int64_t Mw[] = {1, 9, 16, 300, 1000};
    for (int i = 0; i < 5; i++) linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, Mw[i], 2048, 640);
    linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, 65, 4160, 96);
    /* the GEMV at the Qwen3-30B-A3B attention shapes, and many rows with a short K */
    linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, 1, 2048, 5120);
    linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, 16, 4096, 2048);
    linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, 3, 256, 6400);
    linear_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, 11, 4160, 200);
    linear_case_x(FM_PRESET_FP8, FM_W_INT4_G128_TC, 5, 1000, 130, 0.0f);
}

/* The dense W4A8 GEMV past 16 rows (route w4a8.gemv_max_m=64: chunks of 16 rows, one a grid row): a partial last
   chunk (17, 31, 50), whole ones (32, 64), the Qwen3-30B-A3B attention shapes, a K that is not a multiple of 128 and
   N not of 16; from e4m3 rows and from bf16 rows the GEMV quantizes itself (dense.quant=fused); 65 rows go to the
   GEMM. The route must pick the GEMV at these sizes (fm_routes_dense_kernel), and the cpu is the reference. */
static void test_linear_w4a8_chunks(void **s) {
    (void)s;
    fm_routes r;
    fm_routes_default(&r, 9);
    fm_error err;
    assert_int_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=64", &err), FM_OK);
    const char *forms[] = {"w4a8.gemv_max_m=64", "w4a8.gemv_max_m=64,dense.quant=fused"};
    const int64_t Ms[] = {17, 31, 32, 50, 64}, shapes[][2] = {{2048, 5120}, {4096, 2048}, {1000, 130}};
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 3; j++) {
                assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128_TC, Ms[i], shapes[j][0]), FM_DK_W4A8_GEMV);
                linear_on(make_dispatch_routes(FM_PRESET_FP8, FM_DISPATCH_PRESET, forms[f]), FM_W_INT4_G128_TC, Ms[i],
                          shapes[j][0], shapes[j][1], 1.0f, forms[f]);
            }
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128_TC, 65, 2048), FM_DK_W4A8_GEMM);
    linear_on(make_dispatch_routes(FM_PRESET_FP8, FM_DISPATCH_PRESET, forms[0]), FM_W_INT4_G128_TC, 65, 2048, 640, 1.0f,
              forms[0]);
    linear_on(make_dispatch_routes(FM_PRESET_FP8, FM_DISPATCH_PRESET, forms[0]), FM_W_INT4_G128_TC, 40, 2048, 640, 0.0f,
              forms[0]);
}

/* The dense W4A8 GEMM with K split over a cluster (route w4a8.splits, the wgmma kernel; the GEMV held to 16 rows so
   that the GEMM takes 17 rows and up): a partial tile (17, 40), a whole one (64), two and three tiles (65, 130); the
   Qwen3-30B-A3B attention shapes, a K of 8 groups not a multiple of 128 with N not of 16, K of two groups (8 splits
   clamped to 2); 2, 4 and 8 splits and fill; the codes through registers and through the stage ring; against the cpu.
   On an sm_89 GPU the mma.sync kernel runs all of K (the same comparison). */
static void test_linear_w4a8_splits(void **s) {
    (void)s;
    const char *forms[] = {"w4a8.gemv_max_m=16,w4a8.splits=2",
                           "w4a8.gemv_max_m=16,w4a8.splits=4",
                           "w4a8.gemv_max_m=16,w4a8.splits=8",
                           "w4a8.gemv_max_m=16,w4a8.splits=fill",
                           "w4a8.gemv_max_m=16,w4a8.splits=8,w4a8.codes=smem",
                           "w4a8.gemv_max_m=16,w4a8.splits=4,w4a8.codes=regs"};
    const int64_t Ms[] = {17, 40, 64, 65, 130}, shapes[][2] = {{2048, 5120}, {4096, 2048}, {1000, 130}, {256, 640}};
    for (int f = 0; f < 6; f++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 4; j++)
                linear_on(make_dispatch_routes(FM_PRESET_FP8, FM_DISPATCH_PRESET, forms[f]), FM_W_INT4_G128_TC, Ms[i],
                          shapes[j][0], shapes[j][1], 1.0f, forms[f]);
    linear_on(make_dispatch_routes(FM_PRESET_FP8, FM_DISPATCH_PRESET, forms[2]), FM_W_INT4_G128_TC, 40, 2048, 640, 0.0f,
              forms[2]);
}

static void norm_embed_elementwise(fm_preset preset) {
    both b = make(preset);
    const fm_wformat wf = other_fmt(&b);
    /* dims: the norms' three forms (elementwise.cu): 16-byte chunks (8 | D <= 4096), the row in registers (100),
       the plain loop (5000 > 4096) */
    const int64_t rows_list[] = {1, 17, 300}, dims[] = {96, 200, 2048, 100, 5000};
    for (int ri = 0; ri < 3; ri++)
        for (int di = 0; di < 5; di++) {
            const int64_t R = rows_list[ri], D = dims[di];
            float *x = rand_array(R * D, 2.0f), *w = rand_array(D, 1.0f), *o[2], *sw[2], *ad[2];
            for (int i = 0; i < 2; i++) {
                fm_backend *be = b.be[i];
                fm_bank *wb = bank(be, w, 1, 1, D, wf);
                void *xd = gpu_upload(be, x, R * D), *base;
                void *od = gpu_guarded(be, R * D, &base);
                be->ops->rmsnorm(be, xd, wb, R, D, 1e-6f, od);
                o[i] = gpu_fetch(be, base, R * D, "rmsnorm");
                /* swiglu over [R, 2 * (D/2)], add */
                od = gpu_guarded(be, R * (D / 2), &base);
                be->ops->swiglu(be, xd, R, D / 2, od);
                sw[i] = gpu_fetch(be, base, R * (D / 2), "swiglu");
                void *acc = gpu_upload(be, w, D < R * D ? D : R * D);
                be->ops->add(be, acc, xd, D);
                ad[i] = malloc((size_t)D * sizeof(float));
                be->ops->download_f32(be, acc, D, ad[i]);
                be->ops->free(be, acc), be->ops->free(be, xd);
                be->ops->bank_free(be, wb);
            }
            char what[64];
            snprintf(what, sizeof what, "rmsnorm %s rows=%lld dim=%lld", fm_preset_name(preset), (long long)R,
                     (long long)D);
            gpu_expect_close(o[1], o[0], R * D, reduction_bound(&b), what);
            gpu_expect_close(sw[1], sw[0], R * (D / 2), 1e-6, "swiglu");
            gpu_expect_close(ad[1], ad[0], D, 1e-6, "add");
            for (int i = 0; i < 2; i++) free(o[i]), free(sw[i]), free(ad[i]);
            /* add_rmsnorm: against the CPU op, and on the GPU against add then rmsnorm, bit for bit */
            float *r0 = rand_array(R * D, 2.0f), *fo[2], *fa[2], *uo = NULL, *ua = NULL;
            for (int i = 0; i < 2; i++) {
                fm_backend *be = b.be[i];
                fm_bank *wb = bank(be, w, 1, 1, D, wf);
                void *xd = gpu_upload(be, x, R * D), *acc = gpu_upload(be, r0, R * D), *base;
                void *od = gpu_guarded(be, R * D, &base);
                be->ops->add_rmsnorm(be, acc, xd, wb, R, D, 1e-6f, od);
                fo[i] = gpu_fetch(be, base, R * D, "add_rmsnorm");
                fa[i] = malloc((size_t)(R * D) * sizeof(float));
                be->ops->download_f32(be, acc, R * D, fa[i]);
                if (i == 1) {
                    void *acc2 = gpu_upload(be, r0, R * D), *base2, *od2 = gpu_guarded(be, R * D, &base2);
                    be->ops->add(be, acc2, xd, R * D);
                    be->ops->rmsnorm(be, acc2, wb, R, D, 1e-6f, od2);
                    uo = gpu_fetch(be, base2, R * D, "add then rmsnorm");
                    ua = malloc((size_t)(R * D) * sizeof(float));
                    be->ops->download_f32(be, acc2, R * D, ua);
                    be->ops->free(be, acc2);
                }
                be->ops->free(be, acc), be->ops->free(be, xd);
                be->ops->bank_free(be, wb);
            }
            snprintf(what, sizeof what, "add_rmsnorm %s rows=%lld dim=%lld", fm_preset_name(preset), (long long)R,
                     (long long)D);
            gpu_expect_close(fo[1], fo[0], R * D, reduction_bound(&b), what);
            gpu_expect_close(fa[1], fa[0], R * D, 1e-6, "add_rmsnorm's sum");
            gpu_expect_close(fo[1], uo, R * D, 0.0, "add_rmsnorm = add then rmsnorm (cuda)");
            gpu_expect_close(fa[1], ua, R * D, 0.0, "add_rmsnorm's sum = add (cuda)");
            for (int i = 0; i < 2; i++) free(fo[i]), free(fa[i]);
            free(uo), free(ua), free(r0);
            free(x), free(w);
        }
    /* embedding: exact gather */
    const int64_t V = 301, H = 200, T = 37;
    float *table = rand_array(V * H, 1.0f), *e[2];
    int32_t ids[37];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 97 + 13) % V);
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *tb = bank(be, table, 1, V, H, wf);
        void *idd = be->ops->alloc(be, sizeof ids), *base;
        be->ops->upload_ids(be, ids, T, idd);
        void *od = gpu_guarded(be, T * H, &base);
        be->ops->embed(be, tb, idd, T, od);
        e[i] = gpu_fetch(be, base, T * H, "embed");
        be->ops->free(be, idd);
        be->ops->bank_free(be, tb);
    }
    gpu_expect_close(e[1], e[0], T * H, 0.0, "embed");
    free(e[0]), free(e[1]), free(table);
    destroy(&b);
}

static void test_norm_embed_elementwise(void **s) {
    (void)s;
    norm_embed_elementwise(FM_PRESET_REF);
    norm_embed_elementwise(FM_PRESET_REF32);
}

static void attention_case(fm_preset preset, int64_t T, int32_t nh, int32_t nkv, int32_t hd, bool norm) {
    both b = make(preset);
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    float *qkv = rand_array(T * ld, 2.0f), *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
    float *r[2], *a[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *qb = norm ? bank(be, qn, 1, 1, hd, other_fmt(&b)) : NULL;
        fm_bank *kb = norm ? bank(be, kn, 1, 1, hd, other_fmt(&b)) : NULL;
        void *base, *d = gpu_guarded(be, T * ld, &base);
        be->ops->upload_f32(be, qkv, T * ld, d);
        be->ops->qk_norm_rope(be, d, T, nh, nkv, hd, qb, kb, 1e-6f, 0, NULL, 1e6);
        r[i] = malloc((size_t)(T * ld) * sizeof(float));
        be->ops->download_f32(be, d, T * ld, r[i]);
        void *obase, *od = gpu_guarded(be, T * nh * hd, &obase);
        be->ops->attention(be, d, T, nh, nkv, hd, od);
        a[i] = gpu_fetch(be, obase, T * nh * hd, "attention");
        (void)gpu_fetch(be, base, T * ld, "qk_norm_rope"); /* guards of the in-place op */
        if (qb) be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    }
    char what[96];
    snprintf(what, sizeof what, "qk_norm_rope %s T=%lld nh=%d nkv=%d hd=%d norm=%d", fm_preset_name(preset),
             (long long)T, nh, nkv, hd, norm);
    gpu_expect_close(r[1], r[0], T * ld, reduction_bound(&b), what);
    snprintf(what, sizeof what, "attention    %s T=%lld nh=%d nkv=%d hd=%d", fm_preset_name(preset), (long long)T, nh,
             nkv, hd);
    gpu_expect_close(a[1], a[0], T * nh * hd, reduction_bound(&b), what);
    free(r[0]), free(r[1]), free(a[0]), free(a[1]), free(qkv), free(qn), free(kn);
    destroy(&b);
}

/* hd 128 runs the wgmma kernel on sm_90 (route attention.kernel; --route attention.kernel=mma forces the mma.sync
   kernel, tools/gpu-check.sh), every other head dim the mma.sync one; (6, 2, 128): three q heads per kv head */
static void test_rope_attention(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 17, 300, 1000};
    const int32_t shapes[][3] = {{4, 2, 48}, {32, 4, 128}, {8, 8, 64}, {2, 1, 256}, {4, 4, 16}, {6, 2, 128}};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 6; j++) {
            attention_case(FM_PRESET_REF, Ts[i], shapes[j][0], shapes[j][1], shapes[j][2], j % 2 == 0);
            attention_case(FM_PRESET_REF32, Ts[i], shapes[j][0], shapes[j][1], shapes[j][2], j % 2 == 0);
        }
}

/* ---------------------------------------------------------------- paged KV cache */

/* A paged attention case on one backend pair: nseq sequences of len[s] tokens in shuffled blocks of bt, their k and
 * v written through qk_norm_rope (device positions) and kv_store; T query tokens (seq[t], pos[t]) roped at their
 * positions and attending through attention_paged with max_len as the planned context (>= the longest sequence). */
typedef struct gpu_paged {
    int32_t nh, nkv, hd, bt, nseq, max_blocks, n_blocks;
    int64_t T, max_len, hist;
    int32_t *len, *first, *tables, *hist_pos, *hist_slot, *seq, *pos;
    float *hist_rows, *q_rows; /* host fp32 inputs: [hist][ld] and [T][ld] */
} gpu_paged;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#define CKG(call)                                                                                                      \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
    } while (0)

static int32_t urand_below(int32_t n) { return (int32_t)((frand() * 0.5f + 0.5f) * (float)n) % n; }

/* The blocks, cache rows and queries of a case whose sequences (p->nseq, p->len) and step rows (p->T, p->seq, p->pos)
 * are set: shuffled block ids (3 spare blocks never used), every sequence's history rows, each row's query the history
 * row of its position. */
static void paged_fill(gpu_paged *p) {
    const int32_t nh = p->nh, nkv = p->nkv, hd = p->hd;
    int32_t longest = 0;
    for (int32_t s = 0; s < p->nseq; s++) longest = p->len[s] > longest ? p->len[s] : longest, p->hist += p->len[s];
    if (p->max_len < longest)
        fail_msg("paged case: max_len %lld below the longest sequence %d", (long long)p->max_len, longest);
    p->max_blocks = (int32_t)ceil_div(longest, p->bt);
    p->n_blocks = 3;
    for (int32_t s = 0; s < p->nseq; s++) p->n_blocks += (int32_t)ceil_div(p->len[s], p->bt);
    int32_t *perm = malloc((size_t)p->n_blocks * sizeof *perm);
    for (int32_t i = 0; i < p->n_blocks; i++) perm[i] = i;
    for (int32_t i = p->n_blocks - 1; i > 0; i--) {
        const int32_t j = urand_below(i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    p->tables = malloc((size_t)p->nseq * p->max_blocks * sizeof *p->tables);
    for (int32_t s = 0, k = 0; s < p->nseq; s++)
        for (int32_t b = 0; b < p->max_blocks; b++)
            p->tables[s * p->max_blocks + b] = b * p->bt < p->len[s] ? perm[k++] : -1;
    free(perm);
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    p->first = malloc((size_t)p->nseq * sizeof *p->first);
    p->hist_pos = malloc((size_t)p->hist * sizeof *p->hist_pos),
    p->hist_slot = malloc((size_t)p->hist * sizeof *p->hist_slot);
    for (int32_t s = 0, k = 0; s < p->nseq; s++) {
        p->first[s] = k;
        for (int32_t i = 0; i < p->len[s]; i++, k++)
            p->hist_pos[k] = i, p->hist_slot[k] = p->tables[s * p->max_blocks + i / p->bt] * p->bt + i % p->bt;
    }
    p->hist_rows = rand_array(p->hist * ld, 2.0f);
    p->q_rows = malloc((size_t)(p->T * ld) * sizeof *p->q_rows);
    for (int64_t t = 0; t < p->T; t++)
        memcpy(p->q_rows + t * ld, p->hist_rows + (int64_t)(p->first[p->seq[t]] + p->pos[t]) * ld,
               (size_t)ld * sizeof(float));
}

/* the cache's block size of the cases made below: the engine's 16 unless a case sets another (the kernels take a
   power of two of at least 16 by shifts a tile, other sizes key by key) */
static int32_t paged_bt = 16;

/* lengths: the longest is max_ctx, one ends at a block boundary, the others random; tokens: a decode token at the
 * end of each of the first min(T, nseq) sequences, the rest a prefill chunk of consecutive positions at the end of
 * sequence 0 (its cached prefix before it) */
static gpu_paged paged_make(int32_t nh, int32_t nkv, int32_t hd, int64_t T, int32_t max_ctx, int64_t max_len) {
    gpu_paged p;
    memset(&p, 0, sizeof p);
    p.nh = nh, p.nkv = nkv, p.hd = hd, p.bt = paged_bt, p.T = T, p.max_len = max_len;
    p.nseq = T < 5 ? (int32_t)T : 5;
    p.len = malloc((size_t)p.nseq * sizeof *p.len);
    for (int32_t s = 0; s < p.nseq; s++) p.len[s] = 1 + urand_below(max_ctx);
    p.len[p.nseq - 1] = max_ctx;
    if (p.nseq > 1) p.len[p.nseq - 2] = max_ctx >= 32 ? (max_ctx / 32) * 16 : 16; /* ends at a block boundary */
    const int64_t chunk = T - p.nseq + 1;                                         /* sequence 0's tokens in the call */
    if (p.len[0] < chunk) p.len[0] = (int32_t)chunk;
    p.seq = malloc((size_t)T * sizeof *p.seq), p.pos = malloc((size_t)T * sizeof *p.pos);
    int64_t t = 0;
    for (int32_t s = 1; s < p.nseq; s++) p.seq[t] = s, p.pos[t] = p.len[s] - 1, t++;
    for (int64_t i = 0; i < chunk; i++) p.seq[t] = 0, p.pos[t] = (int32_t)(p.len[0] - chunk + i), t++;
    paged_fill(&p);
    return p;
}

/* A mixed step as the scheduler makes it: a prompt chunk of `chunk` rows of sequence 0 after a cached prefix of
 * `prefix` tokens, then (chunk2 > 0) a chunk of chunk2 rows of sequence 1 after a prefix of 5 tokens, then a decode
 * row of each of n_dec other sequences (contexts up to 700); decode_first puts the decode rows before the chunks. */
static gpu_paged paged_make_step(int32_t nh, int32_t nkv, int32_t hd, int32_t chunk, int32_t prefix, int32_t chunk2,
                                 int32_t n_dec, bool decode_first) {
    gpu_paged p;
    memset(&p, 0, sizeof p);
    p.nh = nh, p.nkv = nkv, p.hd = hd, p.bt = paged_bt, p.T = chunk + chunk2 + n_dec;
    const int32_t first_dec = chunk2 > 0 ? 2 : 1;
    p.nseq = first_dec + n_dec;
    p.len = malloc((size_t)p.nseq * sizeof *p.len);
    p.len[0] = prefix + chunk;
    if (chunk2 > 0) p.len[1] = 5 + chunk2;
    for (int32_t s = first_dec; s < p.nseq; s++) p.len[s] = 1 + urand_below(700);
    p.max_len = 0;
    for (int32_t s = 0; s < p.nseq; s++) p.max_len = p.len[s] > p.max_len ? p.len[s] : p.max_len;
    p.seq = malloc((size_t)p.T * sizeof *p.seq), p.pos = malloc((size_t)p.T * sizeof *p.pos);
    int64_t t = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == (decode_first ? 0 : 1))
            for (int32_t s = first_dec; s < p.nseq; s++) p.seq[t] = s, p.pos[t] = p.len[s] - 1, t++;
        else {
            for (int32_t i = 0; i < chunk; i++) p.seq[t] = 0, p.pos[t] = prefix + i, t++;
            for (int32_t i = 0; i < chunk2; i++) p.seq[t] = 1, p.pos[t] = 5 + i, t++;
        }
    }
    paged_fill(&p);
    return p;
}

static void paged_free(gpu_paged *p) {
    free(p->len), free(p->first), free(p->tables), free(p->hist_pos), free(p->hist_slot), free(p->seq), free(p->pos);
    free(p->hist_rows), free(p->q_rows);
}

static void *upload_i32(fm_backend *be, const int32_t *x, int64_t n) {
    void *d = be->ops->alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    assert_non_null(d);
    be->ops->upload_ids(be, x, n, d);
    return d;
}

/* n activations of base (guards included: GPU_TEST_GUARD on each side) to the host; fails if a guard was written */
static float *fetch_with_guards(fm_backend *be, void *base, int64_t n, const char *what) {
    const int64_t G = GPU_TEST_GUARD, total = n + 2 * G;
    float *all = malloc((size_t)total * sizeof *all);
    be->ops->download_f32(be, base, total, all);
    for (int64_t i = 0; i < G; i++)
        if (!isnan(all[i]) || !isnan(all[n + G + i]))
            fail_msg("%s (%s): write outside the buffer", what, be->ops->name);
    float *x = malloc((size_t)n * sizeof *x);
    memcpy(x, all + G, (size_t)n * sizeof *x);
    free(all);
    return x;
}

/* the cuda backend of b's plan under the command line's routes and one more (which wins over them) */
static fm_backend *cuda_with_route(const both *b, const char *route) {
    const char *given = gpu_test_routes();
    char routes[512];
    snprintf(routes, sizeof routes, "%s%s%s", given ? given : "", given ? "," : "", route);
    fm_backend *be = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &b->be[1]->plan, 0, routes, &be, &err)) fail_msg("cuda backend: %s", err.msg);
    return be;
}

/* attention_paged's scratch counters (backend/attention_paged.h) as the owner of a scratch leaves them: zero */
static void zero_paged_counters(fm_backend *be, void *scratch, int32_t nh) {
    const size_t cb = fm_attention_paged_counter_bytes(nh);
    void *zeros = calloc(cb, 1);
    be->ops->upload_raw(be, zeros, cb, scratch);
    free(zeros);
}

/* the counters are zero again after the calls (the combining CTA resets its own: a replayed graph finds them so) */
static void expect_paged_counters_zero(fm_backend *be, const void *scratch, int32_t nh, const char *what) {
    const size_t cb = fm_attention_paged_counter_bytes(nh);
    uint32_t *c = malloc(cb);
    be->ops->download_raw(be, scratch, cb, c);
    be->ops->sync(be, NULL);
    for (size_t i = 0; i < cb / sizeof *c; i++)
        if (c[i]) fail_msg("%s: counter %zu of attention_paged's scratch is %u after the call, not 0", what, i, c[i]);
    free(c);
}

/* The results of one backend: the roped history, the caches, the attention output. */
typedef struct paged_out {
    float *roped, *kc, *vc, *att;
} paged_out;

/* fused: the history through qk_norm_rope_store, and the queries through it with every slot -1 (padding rows: nothing
 * stored), where the plain run has qk_norm_rope, kv_store and qk_norm_rope; runs: attention_paged_runs (the rows of
 * prompt chunks on the tiled kernel) in place of attention_paged; kv: the cache's dtype, FM_KV_E4M3 only on a backend
 * whose cache holds the values as activations (the cpu's emulation: e4m3_store takes the cuda backend's codes) */
static paged_out paged_run_kv(fm_backend *be, const gpu_paged *p, const fm_bank *qn, const fm_bank *kn, bool fused,
                              bool runs, fm_kv_dtype kv) {
    const int32_t nh = p->nh, nkv = p->nkv, hd = p->hd;
    assert_true(kv == FM_KV_ACT || !be->ops->kv_e4m3_codes);
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, row = (int64_t)nkv * hd, n_slots = (int64_t)p->n_blocks * p->bt;
    paged_out r;
    void *hpos = upload_i32(be, p->hist_pos, p->hist), *hslot = upload_i32(be, p->hist_slot, p->hist);
    void *seq = upload_i32(be, p->seq, p->T), *pos = upload_i32(be, p->pos, p->T);
    void *tables = upload_i32(be, p->tables, (int64_t)p->nseq * p->max_blocks);
    void *hist = gpu_upload(be, p->hist_rows, p->hist * ld), *q = gpu_upload(be, p->q_rows, p->T * ld);
    void *kbase, *vbase, *kc = gpu_guarded(be, n_slots * row, &kbase), *vc = gpu_guarded(be, n_slots * row, &vbase);
    if (fused) {
        int32_t *none = malloc((size_t)p->T * sizeof *none);
        for (int64_t t = 0; t < p->T; t++) none[t] = -1;
        void *qslot = upload_i32(be, none, p->T);
        be->ops->qk_norm_rope_store(be, hist, p->hist, nh, nkv, hd, qn, kn, 1e-6f, hpos, 1e6, hslot, kc, vc, kv);
        be->ops->qk_norm_rope_store(be, q, p->T, nh, nkv, hd, qn, kn, 1e-6f, pos, 1e6, qslot, kc, vc, kv);
        be->ops->sync(be, NULL);
        be->ops->free(be, qslot);
        free(none);
    } else {
        be->ops->qk_norm_rope(be, hist, p->hist, nh, nkv, hd, qn, kn, 1e-6f, 0, hpos, 1e6);
        be->ops->kv_store(be, hist, p->hist, nh, nkv, hd, hslot, kc, vc, kv);
        be->ops->qk_norm_rope(be, q, p->T, nh, nkv, hd, qn, kn, 1e-6f, 0, pos, 1e6);
    }
    /* the scratch between NaN guards too (as activations: its bytes are the op's own, so only the guards count) */
    const size_t sb = fm_attention_paged_scratch_bytes(p->T, nh, hd, p->max_len);
    const int64_t sn = (int64_t)((sb + be->ops->act_size - 1) / be->ops->act_size);
    void *sbase, *scratch = gpu_guarded(be, sn, &sbase);
    if (sb) zero_paged_counters(be, scratch, nh);
    void *obase, *o = gpu_guarded(be, p->T * nh * hd, &obase);
    (runs ? be->ops->attention_paged_runs : be->ops->attention_paged)(be, q, p->T, nh, nkv, hd, kc, vc, kv, seq, pos,
                                                                      tables, p->max_blocks, p->bt, p->max_len,
                                                                      sb ? scratch : NULL, o);
    r.att = gpu_fetch(be, obase, p->T * nh * hd, "attention_paged");
    if (sb) expect_paged_counters_zero(be, scratch, nh, "attention_paged");
    free(fetch_with_guards(be, sbase, sn, "attention_paged scratch"));
    r.kc = fetch_with_guards(be, kbase, n_slots * row, "kv_store k_cache");
    r.vc = fetch_with_guards(be, vbase, n_slots * row, "kv_store v_cache");
    r.roped = malloc((size_t)(p->hist * ld) * sizeof *r.roped);
    be->ops->download_f32(be, hist, p->hist * ld, r.roped);
    be->ops->free(be, hpos), be->ops->free(be, hslot), be->ops->free(be, seq), be->ops->free(be, pos);
    be->ops->free(be, tables), be->ops->free(be, hist), be->ops->free(be, q);
    be->ops->free(be, kbase), be->ops->free(be, vbase), be->ops->free(be, sbase);
    return r;
}

static paged_out paged_run(fm_backend *be, const gpu_paged *p, const fm_bank *qn, const fm_bank *kn, bool fused,
                           bool runs) {
    return paged_run_kv(be, p, qn, kn, fused, runs, FM_KV_ACT);
}

/* kv_store put each token's roped k and v rows, bit for bit, in its slot, and wrote no other slot */
static void expect_cache_holds(const gpu_paged *p, const paged_out *r, const char *what, const char *be_name) {
    const int64_t ld = (int64_t)(p->nh + 2 * p->nkv) * p->hd, row = (int64_t)p->nkv * p->hd;
    const int64_t n_slots = (int64_t)p->n_blocks * p->bt;
    char *used = calloc((size_t)n_slots, 1);
    for (int64_t k = 0; k < p->hist; k++) {
        const int64_t s = p->hist_slot[k];
        used[s] = 1;
        if (memcmp(r->kc + s * row, r->roped + k * ld + (int64_t)p->nh * p->hd, (size_t)row * sizeof(float)) ||
            memcmp(r->vc + s * row, r->roped + k * ld + (int64_t)(p->nh + p->nkv) * p->hd, (size_t)row * sizeof(float)))
            fail_msg("%s (%s): slot %lld does not hold the k/v of history row %lld", what, be_name, (long long)s,
                     (long long)k);
    }
    for (int64_t s = 0; s < n_slots; s++)
        for (int64_t i = 0; !used[s] && i < row; i++)
            if (!isnan(r->kc[s * row + i]) || !isnan(r->vc[s * row + i]))
                fail_msg("%s (%s): kv_store wrote slot %lld, which no token maps to", what, be_name, (long long)s);
    free(used);
}

/* CUDA vs CPU for one case and plan; bounds: the roped history and the attention output as the contiguous ops
 * (reduction_bound: 1e-2 bf16, where the GPU also rounds P to bf16 for the P V product and the two backends' roped
 * q/k may differ by a bf16 ulp; 1e-5 fp32); kv_store exact on each backend against its own roped rows. */
static void paged_check(fm_preset preset, gpu_paged *pp, bool norm, const char *what) {
    both b = make(preset);
    gpu_paged p = *pp;
    const int32_t nh = p.nh, nkv = p.nkv, hd = p.hd;
    const int64_t T = p.T;
    float *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
    paged_out r[4]; /* cpu, cuda, cuda with qk_norm_rope_store, cuda with attention_paged_runs */
    for (int i = 0; i < 4; i++) {
        fm_backend *be = b.be[i < 2 ? i : 1];
        fm_bank *qb = norm ? bank(be, qn, 1, 1, hd, other_fmt(&b)) : NULL,
                *kb = norm ? bank(be, kn, 1, 1, hd, other_fmt(&b)) : NULL;
        r[i] = paged_run(be, &p, qb, kb, i == 2, i == 3);
        if (qb) be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    }
    for (int i = 0; i < 2; i++) expect_cache_holds(&p, &r[i], what, b.be[i]->ops->name);
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, cache = (int64_t)p.n_blocks * p.bt * nkv * hd;
    /* the fused op: the same bits as the two ops, padding rows storing nothing */
    if (memcmp(r[2].roped, r[1].roped, (size_t)(p.hist * ld) * sizeof(float)) ||
        memcmp(r[2].kc, r[1].kc, (size_t)cache * sizeof(float)) ||
        memcmp(r[2].vc, r[1].vc, (size_t)cache * sizeof(float)) ||
        memcmp(r[2].att, r[1].att, (size_t)(T * nh * hd) * sizeof(float)))
        fail_msg("qk_norm_rope_store %s: not the bits of qk_norm_rope + kv_store", what);
    char w2[200];
    snprintf(w2, sizeof w2, "qk_norm_rope(positions) %s", what);
    gpu_expect_close(r[1].roped, r[0].roped, p.hist * ld, reduction_bound(&b), w2);
    snprintf(w2, sizeof w2, "attention_paged %s", what);
    gpu_expect_close(r[1].att, r[0].att, T * nh * hd, reduction_bound(&b), w2);
    snprintf(w2, sizeof w2, "attention_paged_runs %s", what); /* the tiled kernel for the chunk's rows (bf16) */
    gpu_expect_close(r[3].att, r[0].att, T * nh * hd, reduction_bound(&b), w2);
    /* route paged.combine: the last CTA (split or swapped kernel) merges the splits (fused) with the combine kernel's
       bits; route paged.early_kv: the split kernel's (and paged.swap's) first tiles of past keys loaded before its PDL
       wait, with the bits of the loads after it (a decode step's store just before it: test_cuda_generate under the
       route); for attention_paged and for the split kernel's rows of attention_paged_runs */
    const char *pairs[4][2] = {{"paged.swap=off,paged.combine=kernel", "paged.swap=off,paged.combine=fused"},
                               {"paged.swap=on,paged.combine=kernel", "paged.swap=on,paged.combine=fused"},
                               {"paged.swap=off,paged.early_kv=off", "paged.swap=off,paged.early_kv=on"},
                               {"paged.swap=on,paged.early_kv=off", "paged.swap=on,paged.early_kv=on"}};
    for (int pr = 0; pr < 4; pr++) {
        fm_backend *forms[2] = {cuda_with_route(&b, pairs[pr][0]), cuda_with_route(&b, pairs[pr][1])};
        for (int runs = 0; runs < 2; runs++) {
            paged_out f[2];
            for (int k = 0; k < 2; k++) {
                fm_bank *qb = norm ? bank(forms[k], qn, 1, 1, hd, other_fmt(&b)) : NULL,
                        *kb = norm ? bank(forms[k], kn, 1, 1, hd, other_fmt(&b)) : NULL;
                f[k] = paged_run(forms[k], &p, qb, kb, false, runs);
                if (qb) forms[k]->ops->bank_free(forms[k], qb), forms[k]->ops->bank_free(forms[k], kb);
            }
            for (int64_t i = 0; i < T * nh * hd; i++)
                if (memcmp(&f[0].att[i], &f[1].att[i], sizeof(float)))
                    fail_msg("%s %s: output %lld is %.9g with %s, %.9g with %s",
                             runs ? "attention_paged_runs" : "attention_paged", what, (long long)i, f[1].att[i],
                             pairs[pr][1], f[0].att[i], pairs[pr][0]);
            printf("  %s %s: %s == %s, bit for bit\n", runs ? "attention_paged_runs" : "attention_paged", what,
                   pairs[pr][1], pairs[pr][0]);
            for (int k = 0; k < 2; k++) free(f[k].roped), free(f[k].kc), free(f[k].vc), free(f[k].att);
        }
        for (int k = 0; k < 2; k++) forms[k]->ops->destroy(forms[k]);
    }
    /* route paged.swap: the decode rows on the kernel with the keys as the mma's M (attention_paged_swap.cu, kv heads
       of at most 8 query heads at hd 64, 128, 256; elsewhere the split kernel), either combine, alone and beside the
       tiled kernel, and the split kernel (the default from sm_90 is the swapped one): within the bound of the CPU */
    const char *swaps[3] = {"paged.swap=on,paged.combine=kernel", "paged.swap=on,paged.combine=fused",
                            "paged.swap=off"};
    for (int k = 0; k < 3; k++) {
        fm_backend *be = cuda_with_route(&b, swaps[k]);
        for (int runs = 0; runs < 2; runs++) {
            fm_bank *qb = norm ? bank(be, qn, 1, 1, hd, other_fmt(&b)) : NULL,
                    *kb = norm ? bank(be, kn, 1, 1, hd, other_fmt(&b)) : NULL;
            paged_out f = paged_run(be, &p, qb, kb, false, runs);
            if (qb) be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
            snprintf(w2, sizeof w2, "%s %s, %s", runs ? "attention_paged_runs" : "attention_paged", what, swaps[k]);
            gpu_expect_close(f.att, r[0].att, T * nh * hd, reduction_bound(&b), w2);
            free(f.roped), free(f.kc), free(f.vc), free(f.att);
        }
        be->ops->destroy(be);
    }
    for (int i = 0; i < 4; i++) free(r[i].roped), free(r[i].kc), free(r[i].vc), free(r[i].att);
    free(qn), free(kn);
    destroy(&b);
}

static void paged_case_gpu(fm_preset preset, int32_t nh, int32_t nkv, int32_t hd, int64_t T, int32_t max_ctx,
                           int64_t max_len, bool norm) {
    gpu_paged p = paged_make(nh, nkv, hd, T, max_ctx, max_len);
    char what[160];
    snprintf(what, sizeof what, "paged %s nh=%d nkv=%d hd=%d T=%lld ctx<=%d max_len=%lld seqs=%d",
             fm_preset_name(preset), nh, nkv, hd, (long long)T, max_ctx, (long long)max_len, p.nseq);
    paged_check(preset, &p, norm, what);
    paged_free(&p);
}

/* T = 1, 3, 17, 64 with the Qwen3-30B-A3B head shape (32/4 x 128) at contexts up to 3000 (splits from 1 to the
 * most), and small shapes: hd 48 (padded tile rows), MHA hd 64, GQA 16 (a full m16 tile) at hd 32, GQA 24 (two
 * query groups per kv head), hd 256; short contexts (one split, one tile, a single key) and a planned context far
 * above the actual lengths (what a captured graph replays with). */
static void test_paged_attention(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 17, 64};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_REF32};
    for (int pi = 0; pi < 2; pi++) {
        for (int i = 0; i < 4; i++) {
            paged_case_gpu(presets[pi], 32, 4, 128, Ts[i], 3000, 3000, true);
            paged_case_gpu(presets[pi], 32, 4, 128, Ts[i], 300, 4096, true);
            paged_case_gpu(presets[pi], 4, 2, 48, Ts[i], 77, 77, false);
        }
        paged_case_gpu(presets[pi], 8, 8, 64, 3, 1000, 1000, true);
        paged_case_gpu(presets[pi], 16, 1, 32, 17, 200, 256, true);
        paged_case_gpu(presets[pi], 48, 2, 64, 5, 500, 500, false);
        paged_case_gpu(presets[pi], 2, 1, 256, 3, 129, 129, true);
        paged_case_gpu(presets[pi], 32, 4, 128, 1, 1, 1, true);     /* one key */
        paged_case_gpu(presets[pi], 32, 4, 128, 1, 16, 2048, true); /* one block, many idle splits */
    }
}

/* The steps that hold prompt chunks (attention_paged and attention_paged_runs, whose tiled kernel takes the chunks'
 * rows: paged_check), bf16: chunks of 1, 7, 64 and 300 rows after cached prefixes of 0, 37 and 1000 tokens, GQA 4 and 8
 * at hd 64 and 128, alone and mixed with decode rows of other sequences (after them, or before them and a second chunk:
 * a tile of the tiled kernel then spans two sequences' rows), against the CPU within the bound of the split kernel. */
static void test_paged_chunks(void **s) {
    (void)s;
    const int32_t chunks[] = {1, 7, 64, 300}, prefixes[] = {0, 37, 1000}, hds[] = {64, 128}, groups[] = {4, 8};
    for (int hi = 0; hi < 2; hi++)
        for (int gi = 0; gi < 2; gi++)
            for (int ci = 0; ci < 4; ci++)
                for (int pi = 0; pi < 3; pi++)
                    for (int mix = 0; mix < 3; mix++) {
                        const int32_t nkv = hds[hi] == 64 ? 2 : 4, nh = nkv * groups[gi];
                        /* 0: the chunk alone; 1: decode rows, then the chunk; 2: the chunk, a chunk of 9 rows of
                           another sequence, then decode rows */
                        const int32_t chunk2 = mix == 2 ? 9 : 0, n_dec = mix == 0 ? 0 : 3;
                        gpu_paged p =
                            paged_make_step(nh, nkv, hds[hi], chunks[ci], prefixes[pi], chunk2, n_dec, mix == 1);
                        char what[160];
                        snprintf(what, sizeof what, "paged step nh=%d nkv=%d hd=%d chunk=%d prefix=%d chunk2=%d dec=%d",
                                 nh, nkv, hds[hi], chunks[ci], prefixes[pi], chunk2, n_dec);
                        paged_check(FM_PRESET_REF, &p, true, what);
                        paged_free(&p);
                    }
}

/* The decode step under a CUDA graph: attention_paged (with qk_norm_rope and kv_store) captured once, then replayed
 * after new positions, slots and lengths were written into the same device buffers; each replay equals the plain
 * launch for those lengths bit for bit (the kernels branch on shapes only and read lengths from device memory), under
 * one value of route paged.combine (fused: the counters the last CTAs reset are zero again for every replay). Returns
 * the outputs of every step (caller frees). */
static float *paged_graph_replay(const char *route) {
    rng = 0x243F6A8885A308D3ull; /* the same inputs under each route: the caller compares the two runs */
    both b = make(FM_PRESET_REF);
    fm_backend *be = cuda_with_route(&b, route);
    const int32_t nh = 32, nkv = 4, hd = 128, bt = 16, nseq = 4, max_blocks = 64, T = nseq;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, row = (int64_t)nkv * hd, max_len = (int64_t)max_blocks * bt;
    const int64_t n_slots = (int64_t)nseq * max_blocks * bt;
    /* sequence s owns blocks s, s + nseq, s + 2 nseq, ... (interleaved) */
    int32_t tables[4 * 64];
    for (int32_t q = 0; q < nseq; q++)
        for (int32_t k = 0; k < max_blocks; k++) tables[q * max_blocks + k] = k * nseq + q;
    float *cache_init = rand_array(n_slots * row, 2.0f), *qkv = rand_array((int64_t)T * ld, 2.0f);
    void *kc = gpu_upload(be, cache_init, n_slots * row), *vc = gpu_upload(be, cache_init, n_slots * row);
    void *q = be->ops->alloc(be, (size_t)(T * ld) * be->ops->act_size);
    void *dtab = upload_i32(be, tables, nseq * max_blocks), *dseq, *dpos, *dslot, *o;
    int32_t seq[4] = {0, 1, 2, 3}, pos[4] = {5, 100, 1023, 16}, slot[4];
    dseq = upload_i32(be, seq, T), dpos = upload_i32(be, pos, T), dslot = upload_i32(be, pos, T);
    o = be->ops->alloc(be, (size_t)(T * nh * hd) * be->ops->act_size);
    const size_t sb = fm_attention_paged_scratch_bytes(T, nh, hd, max_len);
    void *scratch = be->ops->alloc(be, sb ? sb : 16);
    if (sb) zero_paged_counters(be, scratch, nh);
    cudaStream_t stream = (cudaStream_t)fm_cuda_backend_stream(be);
    if (!stream) fail_msg("paged graph: the cuda backend has no stream");
#define STEP()                                                                                                         \
    do {                                                                                                               \
        be->ops->qk_norm_rope(be, q, T, nh, nkv, hd, NULL, NULL, 1e-6f, 0, dpos, 1e6);                                 \
        be->ops->kv_store(be, q, T, nh, nkv, hd, dslot, kc, vc, FM_KV_ACT);                                            \
        be->ops->attention_paged(be, q, T, nh, nkv, hd, kc, vc, FM_KV_ACT, dseq, dpos, dtab, max_blocks, bt, max_len,  \
                                 scratch, o);                                                                          \
    } while (0)
    be->ops->upload_f32(be, qkv, (int64_t)T * ld, q);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CKG(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    STEP();
    CKG(cudaStreamEndCapture(stream, &graph));
    CKG(cudaGraphInstantiate(&exec, graph, 0));
    const int32_t steps[3][4] = {{5, 100, 1023, 16}, {0, 15, 511, 1000}, {63, 64, 1, 777}};
    const int64_t n_out = (int64_t)T * nh * hd;
    float *all = malloc((size_t)(3 * n_out) * sizeof *all), *replay = malloc((size_t)n_out * sizeof *replay);
    float *nan_out = malloc((size_t)n_out * sizeof *nan_out);
    for (int64_t i = 0; i < n_out; i++) nan_out[i] = NAN;
    for (int st = 0; st < 3; st++) {
        for (int32_t t = 0; t < T; t++)
            pos[t] = steps[st][t], slot[t] = tables[seq[t] * max_blocks + pos[t] / bt] * bt + pos[t] % bt;
        float *plain = all + st * n_out; /* plain launch */
        be->ops->upload_f32(be, qkv, (int64_t)T * ld, q);
        be->ops->upload_ids(be, pos, T, dpos), be->ops->upload_ids(be, slot, T, dslot);
        STEP();
        be->ops->download_f32(be, o, n_out, plain);
        /* the graph, the same inputs (the cache rows it rewrites get the same values), the output poisoned */
        be->ops->upload_f32(be, qkv, (int64_t)T * ld, q);
        be->ops->upload_f32(be, nan_out, n_out, o);
        be->ops->upload_ids(be, pos, T, dpos), be->ops->upload_ids(be, slot, T, dslot);
        CKG(cudaGraphLaunch(exec, stream));
        be->ops->download_f32(be, o, n_out, replay);
        for (int64_t i = 0; i < n_out; i++)
            if (memcmp(&plain[i], &replay[i], sizeof(float)) != 0 || isnan(plain[i]))
                fail_msg("paged graph step %d: output %lld is %.9g replayed, %.9g launched", st, (long long)i,
                         replay[i], plain[i]);
        if (sb) expect_paged_counters_zero(be, scratch, nh, "paged graph");
        printf("  paged graph step %d (positions %d %d %d %d, %s): replay == launch\n", st, pos[0], pos[1], pos[2],
               pos[3], route);
    }
#undef STEP
    CKG(cudaGraphExecDestroy(exec));
    CKG(cudaGraphDestroy(graph));
    free(replay), free(nan_out), free(cache_init), free(qkv);
    be->ops->free(be, kc), be->ops->free(be, vc), be->ops->free(be, q), be->ops->free(be, dtab);
    be->ops->free(be, dseq), be->ops->free(be, dpos), be->ops->free(be, dslot), be->ops->free(be, o);
    be->ops->free(be, scratch);
    be->ops->destroy(be);
    destroy(&b);
    return all;
}

/* ... under both values of paged.combine, whose steps agree bit for bit */
static void test_paged_graph_replay(void **s) {
    (void)s;
    float *kernel = paged_graph_replay("paged.combine=kernel"), *fused = paged_graph_replay("paged.combine=fused");
    const int64_t n = 3 * 4 * 32 * 128; /* steps x T x nh x hd */
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&kernel[i], &fused[i], sizeof(float)))
            fail_msg("paged graph: output %lld is %.9g with paged.combine=fused, %.9g with the combine kernel",
                     (long long)i, fused[i], kernel[i]);
    free(kernel), free(fused);
}

/* The e4m3 KV cache (FM_KV_E4M3, quant/kv_e4m3.h) on the ref preset (bf16). The cuda backend's slot rows hold the codes
 * and scales (fm_kv_e4m3_row_bytes: the codes of kv head h at h hd, its fp32 scale at nkv hd + 4 h), the cpu's the
 * values a reader of them sees, as activations (kv_e4m3_codes false). Checked per case:
 *  (a) kv_store and qk_norm_rope_store (the queries through it with every slot -1) write, for each history row and kv
 *      head, the codes and the scale of fm_kv_e4m3_quantize_row of the roped row the backend holds, bit for bit, and
 *      nothing else (unused slots, the rows' padding and a guard row on each side keep their bytes); the two ops leave
 *      the same bytes and roped rows;
 *  (b) attention_paged on the e4m3 cache within 4e-3 (normalised) of attention_paged on a bf16 cache holding the values
 *      (the stored codes dequantized on the host and uploaded; the e4m3 form multiplies f16 codes, the keys' scales
 *      on S and P as exact powers of two, and rounds P to f16 where the bf16 form rounds it to bf16; the count of
 *      outputs whose bits differ is printed), under paged.splits=fill with paged.combine=kernel and fused, which
 *      agree with each other bit for bit, and under the default routes;
 *  (c) attention_paged_runs on the e4m3 cache (the chunks' rows on the tiled kernel's e4m3 form, the others on the
 *      split kernel) within 4e-3 of attention_paged_runs on the bf16 cache of the values and of attention_paged on the
 *      e4m3 cache, under each route set, and the same bits under both combines;
 *  and the cpu backend's emulation: its cache holds exactly the values of its own roped rows' codes (kv_store and
 *  qk_norm_rope_store alike), its attention output within reduction_bound of the cuda one (the backends' roped rows
 *  may differ by a bf16 ulp, and then by a code). */
typedef struct e4m3_cache {
    uint8_t *kc, *vc; /* (n_slots + 2) rows of row_b bytes: a guard row, the cache's rows, a guard row */
    float *roped, *q; /* the roped history [hist][ld] and queries [T][ld], as the backend holds them */
} e4m3_cache;

#define E4M3_POISON 0xA5 /* every byte of the caches before the store */

/* the cuda backend's e4m3 cache of case p: the history through qk_norm_rope + kv_store, or (fused) qk_norm_rope_store;
 * the queries roped (fused: through qk_norm_rope_store with every slot -1) */
static e4m3_cache e4m3_store(fm_backend *be, const gpu_paged *p, const fm_bank *qn, const fm_bank *kn, bool fused) {
    const int32_t nh = p->nh, nkv = p->nkv, hd = p->hd;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, row_b = fm_kv_row_bytes(be->ops, nkv, hd, FM_KV_E4M3);
    const size_t bytes = (size_t)(((int64_t)p->n_blocks * p->bt + 2) * row_b);
    void *hpos = upload_i32(be, p->hist_pos, p->hist), *hslot = upload_i32(be, p->hist_slot, p->hist);
    void *pos = upload_i32(be, p->pos, p->T);
    void *hist = gpu_upload(be, p->hist_rows, p->hist * ld), *q = gpu_upload(be, p->q_rows, p->T * ld);
    uint8_t *poison = malloc(bytes);
    memset(poison, E4M3_POISON, bytes);
    void *kbase = be->ops->alloc(be, bytes), *vbase = be->ops->alloc(be, bytes);
    assert_non_null(kbase);
    assert_non_null(vbase);
    be->ops->upload_raw(be, poison, bytes, kbase);
    be->ops->upload_raw(be, poison, bytes, vbase);
    void *kc = (char *)kbase + row_b, *vc = (char *)vbase + row_b;
    if (fused) {
        int32_t *none = malloc((size_t)p->T * sizeof *none);
        for (int64_t t = 0; t < p->T; t++) none[t] = -1;
        void *qslot = upload_i32(be, none, p->T);
        be->ops->qk_norm_rope_store(be, hist, p->hist, nh, nkv, hd, qn, kn, 1e-6f, hpos, 1e6, hslot, kc, vc,
                                    FM_KV_E4M3);
        be->ops->qk_norm_rope_store(be, q, p->T, nh, nkv, hd, qn, kn, 1e-6f, pos, 1e6, qslot, kc, vc, FM_KV_E4M3);
        be->ops->sync(be, NULL);
        be->ops->free(be, qslot);
        free(none);
    } else {
        be->ops->qk_norm_rope(be, hist, p->hist, nh, nkv, hd, qn, kn, 1e-6f, 0, hpos, 1e6);
        be->ops->kv_store(be, hist, p->hist, nh, nkv, hd, hslot, kc, vc, FM_KV_E4M3);
        be->ops->qk_norm_rope(be, q, p->T, nh, nkv, hd, qn, kn, 1e-6f, 0, pos, 1e6);
    }
    e4m3_cache r;
    r.kc = malloc(bytes), r.vc = malloc(bytes);
    be->ops->download_raw(be, kbase, bytes, r.kc);
    be->ops->download_raw(be, vbase, bytes, r.vc);
    r.roped = malloc((size_t)(p->hist * ld) * sizeof *r.roped);
    r.q = malloc((size_t)(p->T * ld) * sizeof *r.q);
    be->ops->download_f32(be, hist, p->hist * ld, r.roped);
    be->ops->download_f32(be, q, p->T * ld, r.q);
    be->ops->free(be, hpos), be->ops->free(be, hslot), be->ops->free(be, pos), be->ops->free(be, hist);
    be->ops->free(be, q), be->ops->free(be, kbase), be->ops->free(be, vbase);
    free(poison);
    return r;
}

static void e4m3_cache_free(e4m3_cache *c) { free(c->kc), free(c->vc), free(c->roped), free(c->q); }

/* (a): each history row's k and v heads are fm_kv_e4m3_quantize_row of its roped row, in its slot; no other byte
 * written */
static void expect_e4m3_cache(const gpu_paged *p, const e4m3_cache *c, int64_t row_b, const char *what) {
    const int32_t nh = p->nh, nkv = p->nkv, hd = p->hd;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, n_slots = (int64_t)p->n_blocks * p->bt;
    char *used = calloc((size_t)n_slots, 1);
    uint8_t *codes = malloc((size_t)hd);
    for (int64_t k = 0; k < p->hist; k++) {
        const int64_t s = p->hist_slot[k];
        used[s] = 1;
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < nkv; h++) {
                const float scale =
                    fm_kv_e4m3_quantize_row(c->roped + k * ld + (int64_t)(nh + kv * nkv + h) * hd, hd, codes);
                const uint8_t *row = (kv ? c->vc : c->kc) + (s + 1) * row_b;
                float got;
                memcpy(&got, row + (int64_t)nkv * hd + 4 * h, sizeof got);
                if (memcmp(&got, &scale, sizeof got))
                    fail_msg("%s: slot %lld %c head %d (history row %lld): scale %.9g, fm_kv_e4m3_quantize_row's %.9g",
                             what, (long long)s, kv ? 'v' : 'k', h, (long long)k, got, scale);
                for (int32_t d = 0; d < hd; d++)
                    if (row[(int64_t)h * hd + d] != codes[d])
                        fail_msg("%s: slot %lld %c head %d (history row %lld) code %d: %02x, fm_kv_e4m3_quantize_row's "
                                 "%02x",
                                 what, (long long)s, kv ? 'v' : 'k', h, (long long)k, d, row[(int64_t)h * hd + d],
                                 codes[d]);
            }
    }
    /* the guard rows (s = -1, n_slots), the unused slots, the used rows' padding after the scales */
    for (int64_t s = -1; s <= n_slots; s++) {
        const bool u = s >= 0 && s < n_slots && used[s];
        for (int64_t b = u ? (int64_t)nkv * (hd + 4) : 0; b < row_b; b++)
            if (c->kc[(s + 1) * row_b + b] != E4M3_POISON || c->vc[(s + 1) * row_b + b] != E4M3_POISON)
                fail_msg("%s: byte %lld of %s %lld written (no history row's codes or scales)", what, (long long)b,
                         s < 0 || s == n_slots ? "guard row" : "slot", (long long)s);
    }
    free(used), free(codes);
}

/* the values of c's rows: [n_slots][nkv hd] floats (exact in bf16), what a bf16 cache of them holds; 0 in the unused
 * slots */
static float *e4m3_values(const gpu_paged *p, const uint8_t *cache, int64_t row_b) {
    const int32_t nkv = p->nkv, hd = p->hd;
    const int64_t row = (int64_t)nkv * hd;
    float *x = calloc((size_t)((int64_t)p->n_blocks * p->bt * row), sizeof *x);
    for (int64_t k = 0; k < p->hist; k++) {
        const int64_t s = p->hist_slot[k];
        const uint8_t *r = cache + (s + 1) * row_b;
        for (int32_t h = 0; h < nkv; h++) {
            float scale;
            memcpy(&scale, r + row + 4 * h, sizeof scale);
            fm_kv_e4m3_dequantize_row(r + (int64_t)h * hd, hd, scale, x + s * row + (int64_t)h * hd);
        }
    }
    return x;
}

/* attention_paged (runs: attention_paged_runs) on be of the roped queries q over the caches k and v: FM_KV_E4M3, the
 * rows' bytes ([n_slots] rows of row_b, uploaded as they are); FM_KV_ACT, [n_slots][nkv hd] values (uploaded as
 * activations). The output from NaN guards; the scratch's guards kept and its counters zero after the call. */
static float *e4m3_attend(fm_backend *be, const gpu_paged *p, const float *q, const void *k, const void *v,
                          fm_kv_dtype kv, bool runs) {
    const int32_t nh = p->nh, nkv = p->nkv, hd = p->hd;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, n_slots = (int64_t)p->n_blocks * p->bt;
    void *seq = upload_i32(be, p->seq, p->T), *pos = upload_i32(be, p->pos, p->T);
    void *tables = upload_i32(be, p->tables, (int64_t)p->nseq * p->max_blocks), *qd = gpu_upload(be, q, p->T * ld);
    void *kc, *vc;
    if (kv == FM_KV_E4M3) {
        const size_t bytes = (size_t)(n_slots * fm_kv_row_bytes(be->ops, nkv, hd, kv));
        kc = be->ops->alloc(be, bytes), vc = be->ops->alloc(be, bytes);
        assert_non_null(kc);
        assert_non_null(vc);
        be->ops->upload_raw(be, k, bytes, kc);
        be->ops->upload_raw(be, v, bytes, vc);
    } else {
        kc = gpu_upload(be, (const float *)k, n_slots * nkv * hd);
        vc = gpu_upload(be, (const float *)v, n_slots * nkv * hd);
    }
    const size_t sb = fm_attention_paged_scratch_bytes(p->T, nh, hd, p->max_len);
    const int64_t sn = (int64_t)((sb + be->ops->act_size - 1) / be->ops->act_size);
    void *sbase, *scratch = gpu_guarded(be, sn, &sbase);
    if (sb) zero_paged_counters(be, scratch, nh);
    void *obase, *o = gpu_guarded(be, p->T * nh * hd, &obase);
    (runs ? be->ops->attention_paged_runs : be->ops->attention_paged)(be, qd, p->T, nh, nkv, hd, kc, vc, kv, seq, pos,
                                                                      tables, p->max_blocks, p->bt, p->max_len,
                                                                      sb ? scratch : NULL, o);
    float *att = gpu_fetch(be, obase, p->T * nh * hd, "attention_paged e4m3");
    if (sb) expect_paged_counters_zero(be, scratch, nh, "attention_paged e4m3");
    free(fetch_with_guards(be, sbase, sn, "attention_paged e4m3 scratch"));
    be->ops->free(be, seq), be->ops->free(be, pos), be->ops->free(be, tables), be->ops->free(be, qd);
    be->ops->free(be, kc), be->ops->free(be, vc), be->ops->free(be, sbase);
    return att;
}

static void expect_same_bits(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)))
            fail_msg("%s: output %lld is %.9g, %.9g expected bit for bit", what, (long long)i, got[i], want[i]);
    printf("  %s: bit for bit\n", what);
}

static void paged_e4m3_check(gpu_paged *pp, const char *what) {
    both b = make(FM_PRESET_REF);
    gpu_paged p = *pp;
    const int32_t nh = p.nh, nkv = p.nkv, hd = p.hd;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, n_slots = (int64_t)p.n_blocks * p.bt, n_out = p.T * nh * hd;
    float *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
    fm_backend *cu = b.be[1], *cpu = b.be[0];
    const int64_t row_b = fm_kv_row_bytes(cu->ops, nkv, hd, FM_KV_E4M3);
    assert_true(cu->ops->kv_e4m3_codes);
    assert_int_equal(row_b, fm_kv_e4m3_row_bytes(nkv, hd));
    char w[240];

    /* (a) the store, both ops */
    fm_bank *qb = bank(cu, qn, 1, 1, hd, other_fmt(&b)), *kb = bank(cu, kn, 1, 1, hd, other_fmt(&b));
    e4m3_cache c[2];
    for (int fused = 0; fused < 2; fused++) c[fused] = e4m3_store(cu, &p, qb, kb, fused);
    cu->ops->bank_free(cu, qb), cu->ops->bank_free(cu, kb);
    const size_t bytes = (size_t)((n_slots + 2) * row_b);
    if (memcmp(c[1].kc, c[0].kc, bytes) || memcmp(c[1].vc, c[0].vc, bytes) ||
        memcmp(c[1].roped, c[0].roped, (size_t)(p.hist * ld) * sizeof(float)) ||
        memcmp(c[1].q, c[0].q, (size_t)(p.T * ld) * sizeof(float)))
        fail_msg("qk_norm_rope_store e4m3 %s: not the bytes of qk_norm_rope + kv_store", what);
    expect_e4m3_cache(&p, &c[0], row_b, what);
    printf("  kv_store and qk_norm_rope_store e4m3 %s: the codes and scales of fm_kv_e4m3_quantize_row\n", what);

    /* (b) and (c): the split kernel, fill with both combines (the same splits for both forms), then its default
       splits (paged.swap's kernel, the default from sm_90, in (d)) */
    const uint8_t *k8 = c[0].kc + row_b, *v8 = c[0].vc + row_b; /* the cache's rows, past the guard row */
    float *kvals = e4m3_values(&p, c[0].kc, row_b), *vvals = e4m3_values(&p, c[0].vc, row_b);
    const char *routes[3] = {"paged.swap=off,paged.splits=fill,paged.combine=kernel",
                             "paged.swap=off,paged.splits=fill,paged.combine=fused", "paged.swap=off"};
    float *e8[3], *runs8[3];
    for (int k = 0; k < 3; k++) {
        fm_backend *be = routes[k] ? cuda_with_route(&b, routes[k]) : cu;
        const char *rn = routes[k] ? routes[k] : "default routes";
        e8[k] = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, false);
        float *vals = e4m3_attend(be, &p, c[0].q, kvals, vvals, FM_KV_ACT, false);
        /* attention_paged_runs: the chunks' rows on the tiled kernel (its e4m3 form), the others on the split kernel;
           against the same op on the bf16 cache of the values and against the split kernel's e4m3 */
        runs8[k] = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, true);
        float *runs_vals = e4m3_attend(be, &p, c[0].q, kvals, vvals, FM_KV_ACT, true);
        snprintf(w, sizeof w, "attention_paged_runs e4m3 ~ bf16 cache of the values %s, %s", what, rn);
        gpu_expect_close(runs8[k], runs_vals, n_out, 4e-3, w);
        snprintf(w, sizeof w, "attention_paged_runs e4m3 ~ attention_paged e4m3 %s, %s", what, rn);
        gpu_expect_close(runs8[k], e8[k], n_out, 4e-3, w);
        free(runs_vals);
        /* the e4m3 form multiplies f16 codes and applies the keys' scales to S and P (exact powers of two), so it
           differs from the bf16 form on the values only in P's rounding (f16 there, bf16 here) and in queries below
           f16's normal range: within a few of the outputs' bf16 steps */
        int64_t diff = 0;
        for (int64_t i = 0; i < n_out; i++) diff += memcmp(&e8[k][i], &vals[i], sizeof(float)) != 0;
        snprintf(w, sizeof w, "attention_paged e4m3 ~ bf16 cache of the values %s, %s (%lld of %lld differ)", what, rn,
                 (long long)diff, (long long)n_out);
        gpu_expect_close(e8[k], vals, n_out, 4e-3, w);
        free(vals);
        if (routes[k]) be->ops->destroy(be);
    }
    snprintf(w, sizeof w, "attention_paged e4m3 paged.combine=fused == kernel %s", what);
    expect_same_bits(e8[1], e8[0], n_out, w);
    snprintf(w, sizeof w, "attention_paged_runs e4m3 paged.combine=fused == kernel %s", what);
    expect_same_bits(runs8[1], runs8[0], n_out, w);

    /* (d) route paged.swap (the keys as the mma's M, attention_paged_swap.cu, where it applies): the split kernel's
       numbers but for the order of fp32 sums, on the e4m3 cache and on the bf16 cache of its values, alone and beside
       the tiled kernel; the fused combine's bits those of the combine kernel */
    const char *swaps[3] = {"paged.swap=on,paged.combine=kernel", "paged.swap=on,paged.combine=fused",
                            "paged.swap=x2,paged.combine=kernel"};
    float *sw[3];
    for (int k = 0; k < 3; k++) {
        fm_backend *be = cuda_with_route(&b, swaps[k]);
        sw[k] = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, false);
        float *vals = e4m3_attend(be, &p, c[0].q, kvals, vvals, FM_KV_ACT, false);
        float *runs = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, true);
        snprintf(w, sizeof w, "attention_paged e4m3 %s ~ the split kernel's %s", swaps[k], what);
        gpu_expect_close(sw[k], e8[2], n_out, 4e-3, w);
        snprintf(w, sizeof w, "attention_paged e4m3 %s ~ its bf16 cache of the values %s", swaps[k], what);
        gpu_expect_close(sw[k], vals, n_out, 4e-3, w);
        snprintf(w, sizeof w, "attention_paged_runs e4m3 %s ~ the split kernel's %s", swaps[k], what);
        gpu_expect_close(runs, runs8[2], n_out, 4e-3, w);
        free(vals), free(runs);
        be->ops->destroy(be);
    }
    snprintf(w, sizeof w, "attention_paged e4m3 paged.swap=on: paged.combine=fused == kernel %s", what);
    expect_same_bits(sw[1], sw[0], n_out, w);
    free(sw[0]), free(sw[1]), free(sw[2]);

    /* (e) route paged.early_kv (the first tiles of past keys before the PDL wait), on the split kernel and on
       paged.swap's (one and two tiles an iteration): on with the bits of off, alone and beside the tiled kernel */
    const char *early[3][2] = {{"paged.early_kv=off", "paged.early_kv=on"},
                               {"paged.swap=on,paged.early_kv=off", "paged.swap=on,paged.early_kv=on"},
                               {"paged.swap=x2,paged.early_kv=off", "paged.swap=x2,paged.early_kv=on"}};
    for (int k = 0; k < 3; k++) {
        float *ek[2], *ek_runs[2];
        for (int on = 0; on < 2; on++) {
            fm_backend *be = cuda_with_route(&b, early[k][on]);
            ek[on] = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, false);
            ek_runs[on] = e4m3_attend(be, &p, c[0].q, k8, v8, FM_KV_E4M3, true);
            be->ops->destroy(be);
        }
        snprintf(w, sizeof w, "attention_paged e4m3 %s == %s %s", early[k][1], early[k][0], what);
        expect_same_bits(ek[1], ek[0], n_out, w);
        snprintf(w, sizeof w, "attention_paged_runs e4m3 %s == %s %s", early[k][1], early[k][0], what);
        expect_same_bits(ek_runs[1], ek_runs[0], n_out, w);
        free(ek[0]), free(ek[1]), free(ek_runs[0]), free(ek_runs[1]);
    }

    /* the cpu's emulation: its caches hold its roped rows' values, the same through both ops; attention close */
    qb = bank(cpu, qn, 1, 1, hd, other_fmt(&b)), kb = bank(cpu, kn, 1, 1, hd, other_fmt(&b));
    paged_out pc[2];
    for (int fused = 0; fused < 2; fused++) pc[fused] = paged_run_kv(cpu, &p, qb, kb, fused, false, FM_KV_E4M3);
    cpu->ops->bank_free(cpu, qb), cpu->ops->bank_free(cpu, kb);
    const int64_t row = (int64_t)nkv * hd;
    uint8_t *codes = malloc((size_t)hd);
    float *want = malloc((size_t)hd * sizeof *want);
    for (int64_t k = 0; k < p.hist; k++)
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < nkv; h++) {
                const float scale =
                    fm_kv_e4m3_quantize_row(pc[0].roped + k * ld + (int64_t)(nh + kv * nkv + h) * hd, hd, codes);
                fm_kv_e4m3_dequantize_row(codes, hd, scale, want);
                const float *got = (kv ? pc[0].vc : pc[0].kc) + p.hist_slot[k] * row + (int64_t)h * hd;
                if (memcmp(got, want, (size_t)hd * sizeof *want))
                    fail_msg("cpu kv_store e4m3 %s: slot %d %c head %d: not the values of the row's codes", what,
                             p.hist_slot[k], kv ? 'v' : 'k', h);
            }
    if (memcmp(pc[1].kc, pc[0].kc, (size_t)(n_slots * row) * sizeof(float)) ||
        memcmp(pc[1].vc, pc[0].vc, (size_t)(n_slots * row) * sizeof(float)) ||
        memcmp(pc[1].att, pc[0].att, (size_t)n_out * sizeof(float)))
        fail_msg("cpu qk_norm_rope_store e4m3 %s: not the values of qk_norm_rope + kv_store", what);
    snprintf(w, sizeof w, "attention_paged e4m3 cuda vs cpu %s", what);
    gpu_expect_close(e8[2], pc[0].att, n_out, reduction_bound(&b), w);

    for (int k = 0; k < 3; k++) free(e8[k]), free(runs8[k]);
    for (int i = 0; i < 2; i++) {
        e4m3_cache_free(&c[i]);
        free(pc[i].roped), free(pc[i].kc), free(pc[i].vc), free(pc[i].att);
    }
    free(kvals), free(vvals), free(codes), free(want), free(qn), free(kn);
    destroy(&b);
}

static void paged_e4m3_case(int32_t nh, int32_t nkv, int32_t hd, int64_t T, int32_t max_ctx, int64_t max_len) {
    gpu_paged p = paged_make(nh, nkv, hd, T, max_ctx, max_len);
    char what[160];
    snprintf(what, sizeof what, "paged e4m3 nh=%d nkv=%d hd=%d T=%lld ctx<=%d max_len=%lld seqs=%d", nh, nkv, hd,
             (long long)T, max_ctx, (long long)max_len, p.nseq);
    paged_e4m3_check(&p, what);
    paged_free(&p);
}

/* test_paged_attention's shapes with an e4m3 cache: T = 1 (one sequence), 3, 17, 64 (several sequences and a chunk)
 * at Qwen3-30B-A3B's heads (32/4 x 128) with contexts up to 3000 (splits) and 300 under a planned 4096, hd 48, 64, 32
 * and 256 (with splits too), a single key; and a step of two prompt chunks and decode rows (attention_paged_runs) */
static void test_paged_e4m3(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 17, 64};
    for (int i = 0; i < 4; i++) {
        paged_e4m3_case(32, 4, 128, Ts[i], 3000, 3000);
        paged_e4m3_case(32, 4, 128, Ts[i], 300, 4096);
        paged_e4m3_case(4, 2, 48, Ts[i], 77, 77);
    }
    paged_e4m3_case(8, 8, 64, 3, 1000, 1000);
    paged_e4m3_case(16, 1, 32, 17, 200, 256);
    paged_e4m3_case(48, 2, 64, 5, 500, 500);
    paged_e4m3_case(2, 1, 256, 3, 129, 129);
    paged_e4m3_case(16, 2, 256, 5, 2000, 2000);
    paged_e4m3_case(2, 1, 256, 1, 2000, 2000);
    paged_e4m3_case(32, 4, 128, 1, 1, 1); /* one key */
    gpu_paged p = paged_make_step(32, 4, 128, 64, 1000, 9, 3, false);
    paged_e4m3_check(&p, "paged e4m3 step nh=32 nkv=4 hd=128 chunk=64 prefix=1000 chunk2=9 dec=3");
    paged_free(&p);
    /* blocks of 24 keys (a division per key) and of 8 (shifts per key; a tile spans two blocks), both forms */
    const int32_t bts[] = {24, 8};
    for (int i = 0; i < 2; i++) {
        paged_bt = bts[i];
        printf("  block of %d keys:\n", paged_bt);
        paged_e4m3_case(32, 4, 128, 17, 700, 700);
        p = paged_make_step(32, 4, 128, 40, 300, 9, 3, false);
        paged_e4m3_check(&p, "paged e4m3 step nh=32 nkv=4 hd=128 chunk=40 prefix=300 chunk2=9 dec=3");
        paged_free(&p);
    }
    paged_bt = 16;
}

static void route_cases(fm_preset preset) {
    both b = make(preset);
    /* a warp per token with 8, 16 and 32 experts per lane (Qwen3-Next: 512, top-10), a thread per token above 1024 */
    const int32_t cases[][2] = {{8, 2}, {16, 4}, {128, 8}, {512, 10}, {1000, 32}, {1030, 3}};
    const int64_t Ts[] = {1, 17, 300};
    for (int c = 0; c < 6; c++)
        for (int ti = 0; ti < 3; ti++)
            for (int kind = 0; kind < 2; kind++) {
                const int32_t E = cases[c][0], k = cases[c][1];
                const int64_t T = Ts[ti];
                float *l = rand_array(T * E, 3.0f), *w[2];
                int32_t *ids[2];
                for (int i = 0; i < 2; i++) {
                    fm_backend *be = b.be[i];
                    void *ld = gpu_upload(be, l, T * E), *base;
                    void *idd = be->ops->alloc(be, (size_t)(T * k) * 4);
                    void *wd = gpu_guarded(be, T * k, &base);
                    be->ops->route(be, ld, T, E, k, kind ? FM_ROUTER_TOPK_SOFTMAX : FM_ROUTER_SOFTMAX_TOPK, true, idd,
                                   wd);
                    w[i] = gpu_fetch(be, base, T * k, "route");
                    ids[i] = malloc((size_t)(T * k) * 4);
                    be->ops->download_raw(be, idd, (size_t)(T * k) * 4, ids[i]);
                    be->ops->free(be, ld), be->ops->free(be, idd);
                }
                char what[96];
                snprintf(what, sizeof what, "route %s %s E=%d k=%d T=%lld", fm_preset_name(preset),
                         kind ? "topk-softmax" : "softmax-topk", E, k, (long long)T);
                assert_memory_equal(ids[0], ids[1], (size_t)(T * k) * 4);
                gpu_expect_close(w[1], w[0], T * k, reduction_bound(&b), what);
                for (int i = 0; i < 2; i++) free(w[i]), free(ids[i]);
                free(l);
            }
    destroy(&b);
}

static void test_route(void **s) {
    (void)s;
    route_cases(FM_PRESET_REF);
    route_cases(FM_PRESET_REF32);
}

/* The router op (GEMV + route; fused into one kernel on the GPU at T <= 8, route router.fused): logits close to the
   CPU's, and the same experts with close weights, except where the CPU's own logits tie within the bf16 spacing
   (summed in another order, a logit may round to the neighbouring bf16): there the chosen experts' CPU logits must
   match rank by rank within that tolerance. */
static void router_case(fm_preset preset, int32_t E, int32_t k, int64_t H, int64_t T, int kind) {
    both b = make(preset);
    float *w = rand_array((int64_t)E * H, 0.1f), *x = rand_array(T * H, 1.0f), *lg[2], *wt[2];
    int32_t *ids[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *wb = bank(be, w, 1, E, H, other_fmt(&b));
        void *xd = gpu_upload(be, x, T * H), *lbase, *wbase;
        void *ld = gpu_guarded(be, T * E, &lbase), *wd = gpu_guarded(be, T * k, &wbase);
        void *idd = be->ops->alloc(be, (size_t)(T * k) * 4);
        be->ops->router(be, wb, xd, T, k, kind ? FM_ROUTER_TOPK_SOFTMAX : FM_ROUTER_SOFTMAX_TOPK, true, ld, idd, wd);
        lg[i] = gpu_fetch(be, lbase, T * E, "router logits");
        wt[i] = gpu_fetch(be, wbase, T * k, "router weights");
        ids[i] = malloc((size_t)(T * k) * 4);
        be->ops->download_raw(be, idd, (size_t)(T * k) * 4, ids[i]);
        be->ops->free(be, xd), be->ops->free(be, idd);
        be->ops->bank_free(be, wb);
    }
    char what[128];
    snprintf(what, sizeof what, "router %s %s E=%d k=%d H=%lld T=%lld", fm_preset_name(preset),
             kind ? "topk-softmax" : "softmax-topk", E, k, (long long)H, (long long)T);
    gpu_expect_close(lg[1], lg[0], T * E, reduction_bound(&b), what);
    int ties = 0;
    for (int64_t t = 0; t < T; t++) {
        if (!memcmp(ids[0] + t * k, ids[1] + t * k, (size_t)k * 4)) {
            gpu_expect_close(wt[1] + t * k, wt[0] + t * k, k, reduction_bound(&b), what);
            continue;
        }
        ties++;
        for (int32_t j = 0; j < k; j++) {
            const float a = lg[0][t * E + ids[0][t * k + j]], g = lg[0][t * E + ids[1][t * k + j]];
            if (fabsf(a - g) > 0.02f)
                fail_msg("%s: token %lld rank %d: expert %d (cpu logit %g) where the cpu chose %d (%g)", what,
                         (long long)t, j, ids[1][t * k + j], g, ids[0][t * k + j], a);
        }
    }
    printf("  %s: %lld tokens, %d decided differently within a bf16 tie\n", what, (long long)T, ties);
    for (int i = 0; i < 2; i++) free(lg[i]), free(wt[i]), free(ids[i]);
    free(w), free(x);
    destroy(&b);
}

static void test_router(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 8, 17};
    for (int i = 0; i < 4; i++)
        for (int kind = 0; kind < 2; kind++) {
            router_case(FM_PRESET_FP8, 128, 8, 2048, Ts[i], kind);  /* Qwen3-30B-A3B */
            router_case(FM_PRESET_FP8, 512, 10, 2048, Ts[i], kind); /* Qwen3-Next-80B-A3B */
            router_case(FM_PRESET_FP8, 8, 2, 200, Ts[i], kind);
            router_case(FM_PRESET_REF, 13, 3, 196, Ts[i], kind); /* H % 8 != 0: the unfused route */
            router_case(FM_PRESET_REF32, 16, 4, 256, Ts[i], kind);
        }
}

static void expect_fp4_dispatch(fm_backend *be, fm_dispatch d, const float *x, int64_t T, int32_t E, int32_t k,
                                int64_t H, int64_t I, const char *what);

/* routing: spread (pair (t, j) -> (5t + 3j) mod E) or skewed (every token's first choice is expert 0, the
   others spread over 1..E-2: expert 0 gets all T rows, expert E-1 none). d: the --dispatch format; an FP4 one gets
   blocks of different magnitudes (x1..7, and 2^-11 for every 11th block of 32: MX blocks more than 8 binades below
   their group's largest, whose expansion rounds) and its dispatch buffer checked byte for byte */
/* uneven: each row's 128-groups at different ranges (group g scaled by 2^-4g, one value of 8 in group 0 per row), so
   that one scale per token differs from the groups' own (route moe.act_scale=token; uniform rows give nearly the
   same scale either way) */
static void moe_case_x(fm_preset p, fm_wformat fmt, fm_dispatch d, int64_t T, int32_t E, int32_t k, int64_t H,
                       int64_t I, bool skewed, const char *extra, bool uneven) {
    both b = make_dispatch_routes(p, d, extra);
    float *gu = rand_array((int64_t)E * 2 * I * H, 0.1f), *dn = rand_array((int64_t)E * H * I, 0.1f);
    float *x = rand_array(T * H, 1.0f), *wts = malloc((size_t)(T * k) * sizeof(float));
    const bool fp4 = d == FM_DISPATCH_MXFP4 || d == FM_DISPATCH_NVFP4;
    for (int64_t i = 0; fp4 && i < T * H; i++)
        x[i] *= (i % H) / 32 % 11 == 3 ? 0x1p-11f : (float)(1 + (i % H) / 40 % 7);
    for (int64_t i = 0; uneven && i < T * H; i++) x[i] = ldexpf(x[i], -4 * (int)((i % H) / 128));
    for (int64_t t = 0; uneven && t < T; t++) x[t * H + (t * 37) % (H < 128 ? H : 128)] = t % 2 ? -8.0f : 8.0f;
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            ids[t * k + j] = skewed ? (j == 0 ? 0 : (int32_t)(1 + (t * 5 + j * 3) % (E - 2)))
                                    : (int32_t)((t * 5 + j * 3) % E); /* distinct for k <= E when 3 and E are coprime */
            wts[t * k + j] = 0.25f + 0.5f * fabsf(frand());
        }
    float *o[2];
    char what[128];
    snprintf(what, sizeof what, "moe %s%s%s T=%lld E=%d k=%d H=%lld I=%lld%s%s%s%s", fm_wformat_name(fmt),
             fp4 ? " dispatch " : "", fp4 ? fm_dispatch_name(d) : "", (long long)T, E, k, (long long)H, (long long)I,
             skewed ? " skewed" : "", uneven ? " uneven" : "", extra ? " " : "", extra ? extra : "");
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *gub = gpu_bank(be, gu, E, 2 * I, H, fmt, true), *db = bank(be, dn, E, H, I, fmt);
        o[i] = gpu_run_moe(be, gub, db, x, T, H, ids, wts, k);
        if (i == 1 && fp4) expect_fp4_dispatch(be, d, x, T, E, k, H, I, what);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
    }
    gpu_expect_close(o[1], o[0], T * H, fmt == FM_W_INT4_G128_TC ? 3e-2 : reduction_bound(&b), what);
    free(o[0]), free(o[1]), free(gu), free(dn), free(x), free(wts), free(ids);
    destroy(&b);
}

static void moe_case_dispatch_routes(fm_preset p, fm_wformat fmt, fm_dispatch d, int64_t T, int32_t E, int32_t k,
                                     int64_t H, int64_t I, bool skewed, const char *extra) {
    moe_case_x(p, fmt, d, T, E, k, H, I, skewed, extra, false);
}

static void moe_case_dispatch(fm_preset p, fm_wformat fmt, fm_dispatch d, int64_t T, int32_t E, int32_t k, int64_t H,
                              int64_t I, bool skewed) {
    moe_case_dispatch_routes(p, fmt, d, T, E, k, H, I, skewed, NULL);
}

static void moe_case_routed(fm_preset p, fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I,
                            bool skewed) {
    moe_case_dispatch(p, fmt, FM_DISPATCH_PRESET, T, E, k, H, I, skewed);
}

/* The dispatch buffer the GPU left (fm_cuda_moe_dispatch_read) against the CPU codec on the same bf16 rows: every
   code and block scale byte for byte (blocks past H: zero), the NVFP4 tensor scale bit for bit. */
static void expect_fp4_dispatch(fm_backend *be, fm_dispatch d, const float *x, int64_t T, int32_t E, int32_t k,
                                int64_t H, int64_t I, const char *what) {
    const bool nv = d == FM_DISPATCH_NVFP4;
    const int64_t P = T * k, Hp = (H + 127) / 128 * 128, G = Hp / 128, sb = nv ? 8 : 4, blk = nv ? 16 : 32;
    uint8_t *codes = malloc((size_t)(P * Hp / 2)), *scales = malloc((size_t)(P * G * sb));
    uint8_t *packed = calloc((size_t)Hp / 2, 1), *sc = calloc((size_t)(G * sb), 1);
    float *xr = malloc((size_t)(T * H) * sizeof *xr), ts = 0.0f;
    assert_true(fm_cuda_moe_dispatch_read(be, T, k, E, H, I, codes, scales, &ts));
    for (int64_t i = 0; i < T * H; i++) xr[i] = fm_round_bf16(x[i]); /* what the GPU holds */
    const float ts_cpu = nv ? fm_nvfp4_tensor_scale(xr, T * H) : 1.0f;
    if (memcmp(&ts, &ts_cpu, 4) != 0) fail_msg("%s: tensor scale %.9g on the GPU, %.9g on the CPU", what, ts, ts_cpu);
    int64_t sub = 0; /* MX blocks whose expansion rounds (more than 8 binades below their group's largest) */
    for (int64_t t = 0; t < T; t++) {
        memset(packed, 0, (size_t)Hp / 2), memset(sc, 0, (size_t)(G * sb));
        if (nv) fm_nvfp4_quantize(xr + t * H, H, ts_cpu, packed, sc);
        else fm_mxfp4_quantize(xr + t * H, H, FM_MX_RCEIL, packed, sc);
        for (int64_t g = 0; !nv && g < G; g++) {
            uint8_t m = 0;
            for (int b = 0; b < 4; b++) m = sc[g * 4 + b] > m ? sc[g * 4 + b] : m;
            for (int b = 0; b < 4; b++) sub += g * 128 + b * blk < H && m - sc[g * 4 + b] > 8;
        }
        for (int32_t j = 0; j < k; j++) {
            const int64_t p = t * k + j;
            for (int64_t c = 0; c < Hp / 2; c++)
                if (codes[p * (Hp / 2) + c] != packed[c])
                    fail_msg("%s: pair %lld code byte %lld: %02x on the GPU, %02x on the CPU", what, (long long)p,
                             (long long)c, codes[p * (Hp / 2) + c], packed[c]);
            for (int64_t c = 0; c < G * sb; c++)
                if (scales[p * G * sb + c] != sc[c])
                    fail_msg("%s: pair %lld block %lld scale %02x on the GPU, %02x on the CPU", what, (long long)p,
                             (long long)c, scales[p * G * sb + c], sc[c]);
        }
    }
    printf("  %s: dispatch buffer identical to the CPU codec's (%lld x %lld code bytes%s)\n", what, (long long)P,
           (long long)(Hp / 2), nv ? "" : ", MX blocks rounded by the expansion:");
    if (!nv) printf("    %lld of %lld\n", (long long)sub, (long long)(T * ((H + 31) / 32)));
    free(codes), free(scales), free(packed), free(sc), free(xr);
}

static void moe_case(fm_preset p, fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    moe_case_routed(p, fmt, T, E, k, H, I, false);
}

static void test_moe(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 5, 33};
    for (int i = 0; i < 3; i++) {
        moe_case(FM_PRESET_REF, FM_W_BF16, Ts[i], 8, 2, 200, 72);
        moe_case(FM_PRESET_REF32, FM_W_F32, Ts[i], 8, 2, 200, 72);
        moe_case(FM_PRESET_REF32, FM_W_F32, Ts[i], 16, 4, 192, 128);
        moe_case(FM_PRESET_INT4, FM_W_INT4_G128, Ts[i], 8, 2, 200, 72);
        moe_case(FM_PRESET_INT4, FM_W_INT4_G128, Ts[i], 16, 4, 192, 128);
    }
}

/* the grouped W4A8 expert path (fp8 preset) against the CPU emulation of the same formats: T = 1, 7, 300, 4096,
   odd expert counts and top-k, uneven routing (an expert with every row, one with none, counts that are not a
   multiple of the 64-row tile), widths that are and are not multiples of 128 */
static void test_moe_w4a8(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) {
        moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ts[i], 8, 2, 200, 72, false);
        moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ts[i], 7, 3, 256, 128, false);
        moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ts[i], 13, 5, 384, 200, true);
    }
    moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, 4096, 16, 4, 256, 128, false);
    moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, 4096, 16, 4, 256, 128, true);
    moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, 300, 128, 8, 2048, 768, false); /* Qwen3-30B-A3B widths */
    /* decode sizes at Qwen3 widths: the grouped GEMVs up to 64 routed pairs (route moe.gemv), the GEMM at 72 */
    const int64_t Td[] = {1, 2, 8, 9};
    for (int i = 0; i < 4; i++) moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, Td[i], 128, 8, 2048, 768, false);
    moe_case_routed(FM_PRESET_FP8, FM_W_INT4_G128_TC, 8, 128, 8, 2048, 768, true);
}

/* route moe.act_scale=token: the gate|up GEMM's input with one scale per token, the promotion without it (the
   EPI_SWIGLU_TOK instances of the wgmma kernel), against the cpu backend's emulation under the same route. Small
   shapes (named test_moe_w4a8_* so that gpu-check's route-forced runs take them: tiles of 16, 32 and 64 rows, codes
   in registers and through the ring, moe.gemv off and 64): T = 1 (the GEMVs, where the route does not apply), 7
   (16-row tiles), 300 at E = 8 (32-row), skewed, widths not multiples of 128. Large (default routes only): T = 4096
   at E = 16 (64-row tiles), also with the codes through the ring; Qwen3 widths at 9 and 300 tokens. gpu-check's
   run under w4a8.kernel=mma takes the mma.sync kernel's instances. Skipped where the backend refuses the route. */
static const char *token_route(void) {
    const char *given = gpu_test_routes();
    char routes[512];
    snprintf(routes, sizeof routes, "%s%smoe.act_scale=token", given ? given : "", given ? "," : "");
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *be = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, routes, &be, &err)) {
        printf("  skipped: %s\n", err.msg);
        return NULL;
    }
    be->ops->destroy(be);
    return "moe.act_scale=token";
}

static void token_case(int64_t T, int32_t E, int32_t k, int64_t H, int64_t I, bool skewed, const char *route) {
    moe_case_dispatch_routes(FM_PRESET_FP8, FM_W_INT4_G128_TC, FM_DISPATCH_PRESET, T, E, k, H, I, skewed, route);
}

static void test_moe_w4a8_token_small(void **s) {
    (void)s;
    const char *tok = token_route();
    if (!tok) return;
    const int64_t Ts[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) {
        token_case(Ts[i], 8, 2, 200, 72, false, tok);
        token_case(Ts[i], 13, 5, 384, 200, true, tok);
    }
    /* models/tiny-code-moe's steps in test_cuda_generate's test_cached_steps (H = 192: a group and a half; 16
       experts, top-4, I = 128): chunks of 9 and 4 tokens (P = 36, 16: 16-row tiles, codes through the ring), a decode
       step on the GEMM (moe.gemv=off), the fresh prefill of 17 and the full pass of 40; uniform rows and rows whose
       groups differ in range */
    char nogemv[160];
    snprintf(nogemv, sizeof nogemv, "%s,moe.gemv=off", tok);
    const int64_t Tc[] = {1, 4, 9, 17, 40};
    for (int i = 0; i < 5; i++) {
        token_case(Tc[i], 16, 4, 192, 128, false, nogemv);
        moe_case_x(FM_PRESET_FP8, FM_W_INT4_G128_TC, FM_DISPATCH_PRESET, Tc[i], 16, 4, 192, 128, false, nogemv, true);
    }
    moe_case_x(FM_PRESET_FP8, FM_W_INT4_G128_TC, FM_DISPATCH_PRESET, 7, 13, 5, 384, 200, true, tok, true);
}

static void test_moe_token_large(void **s) {
    (void)s;
    const char *tok = token_route();
    if (!tok) return;
    token_case(4096, 16, 4, 256, 128, true, tok);
    token_case(4096, 16, 4, 256, 128, false, "moe.act_scale=token,w4a8.codes=smem");
    token_case(9, 128, 8, 2048, 768, false, tok);
    token_case(300, 128, 8, 2048, 768, false, tok);
}

/* --dispatch mxfp4|nvfp4: the grouped W4A8 path with an FP4 dispatch buffer (the gate|up GEMM expands it to e4m3 on
   chip; the decode GEMVs read the dispatch's own expansion) against the CPU emulation of the same expansion, with the
   bound of the e4m3 dispatch; the dispatch buffer byte for byte the CPU codec's. T = 1, 7, 300, 4096, an expert with
   every row and one with none (skewed), widths that are and are not multiples of 128, Qwen3 widths at decode sizes
   (GEMVs) and at 300. The small shapes are named test_moe_w4a8_* so that gpu-check's route-forced runs (tile 16/64,
   moe.gemv=off and =64, memcheck) take them too; the large ones (test_moe_fp4_large: about a minute of CPU reference
   and bank building per run) run on the default routes and on w4a8.kernel=mma only. */
static const fm_dispatch fp4_dispatches[] = {FM_DISPATCH_MXFP4, FM_DISPATCH_NVFP4};

/* the small shapes (compute-sanitizer runs these alone) */
static void test_moe_w4a8_fp4_small(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 7, 300};
    for (int di = 0; di < 2; di++)
        for (int i = 0; i < 3; i++) {
            moe_case_dispatch(FM_PRESET_FP8, FM_W_INT4_G128_TC, fp4_dispatches[di], Ts[i], 8, 2, 200, 72, false);
            moe_case_dispatch(FM_PRESET_FP8, FM_W_INT4_G128_TC, fp4_dispatches[di], Ts[i], 13, 5, 384, 200, true);
        }
}

static void test_moe_fp4_large(void **s) {
    (void)s;
    const fm_wformat f = FM_W_INT4_G128_TC;
    for (int di = 0; di < 2; di++) {
        const fm_dispatch d = fp4_dispatches[di];
        moe_case_dispatch(FM_PRESET_FP8, f, d, 4096, 16, 4, 256, 128, true);
        moe_case_dispatch(FM_PRESET_FP8, f, d, 300, 128, 8, 2048, 768, false); /* Qwen3-30B-A3B widths */
        moe_case_dispatch(FM_PRESET_FP8, f, d, 1, 128, 8, 2048, 768, false);
        moe_case_dispatch(FM_PRESET_FP8, f, d, 8, 128, 8, 2048, 768, true);
        moe_case_dispatch(FM_PRESET_FP8, f, d, 9, 128, 8, 2048, 768, false);
    }
}

/* copy_rows (a hybrid model's state snapshots, src/engine/state_cache.c): a strided slice of rows into a packed
   buffer and back, odd widths and pitches; bytes outside the rows stay as they were */
static void test_copy_rows(void **s) {
    (void)s;
    both b = make(FM_PRESET_REF32);
    enum { ROWS = 5, W = 13 * 4, SP = 3 * W + 8, DP = W + 20 };
    uint8_t src[ROWS * SP], dst0[ROWS * DP], out[ROWS * DP], back[ROWS * SP];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 37 + 11);
    for (size_t i = 0; i < sizeof dst0; i++) dst0[i] = (uint8_t)(0xA5 ^ i);
    fm_backend *be = b.be[1];
    void *sd = be->ops->alloc(be, sizeof src), *dd = be->ops->alloc(be, sizeof dst0);
    be->ops->upload_raw(be, src, sizeof src, sd), be->ops->upload_raw(be, dst0, sizeof dst0, dd);
    be->ops->copy_rows(be, (char *)sd + W, SP, dd, DP, W, ROWS); /* the second W bytes of each source row */
    be->ops->download_raw(be, dd, sizeof out, out);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < DP; c++) assert_int_equal(out[r * DP + c], c < W ? src[r * SP + W + c] : dst0[r * DP + c]);
    /* and back into the third W bytes of each source row */
    be->ops->copy_rows(be, dd, DP, (char *)sd + 2 * W, SP, W, ROWS);
    be->ops->download_raw(be, sd, sizeof back, back);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < SP; c++)
            assert_int_equal(back[r * SP + c], c >= 2 * W && c < 3 * W ? src[r * SP + c - W] : src[r * SP + c]);
    be->ops->free(be, sd), be->ops->free(be, dd);
    destroy(&b);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_w4a8_chunks),
        cmocka_unit_test(test_linear_w4a8_splits),
        cmocka_unit_test(test_norm_embed_elementwise),
        cmocka_unit_test(test_rope_attention),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_moe_w4a8),
        cmocka_unit_test(test_moe_w4a8_token_small),
        cmocka_unit_test(test_moe_token_large),
        cmocka_unit_test(test_moe_w4a8_fp4_small),
        cmocka_unit_test(test_moe_fp4_large),
        cmocka_unit_test(test_linear_w8a8),
        cmocka_unit_test(test_linear_w8a8_sequence),
        cmocka_unit_test(test_linear_w8a8_quant_routes),
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_paged_chunks),
        cmocka_unit_test(test_paged_graph_replay),
        cmocka_unit_test(test_paged_e4m3),
        cmocka_unit_test(test_copy_rows),
    };
    /* FM_TEST_FILTER=test_moe_w4a8 runs the matching tests only (e.g. one kernel under compute-sanitizer) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
