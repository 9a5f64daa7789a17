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

static both make_dense(fm_preset p, fm_dense dense) {
    both b;
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_plan_set_dense(&plan, dense);
    fm_error err;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, &b.be[0], &err), FM_OK);
    fm_status st = fm_backend_create("cuda", &plan, 0, &b.be[1], &err);
    if (st) fail_msg("cuda backend: %s", err.msg);
    return b;
}
/* the plan's weight format for norms and embeddings, and the bound for ops with reductions (see the top) */
static fm_wformat other_fmt(const both *b) { return b->be[1]->plan.w_other; }
static double reduction_bound(const both *b) { return b->be[1]->plan.act_bf16 ? 1e-2 : 1e-5; }

static both make(fm_preset p) { return make_dense(p, FM_DENSE_PRESET); }

static void destroy(both *b) {
    for (int i = 0; i < 2; i++) b->be[i]->ops->destroy(b->be[i]);
}


static fm_bank *bank(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt) {
    return gpu_bank(be, w, n, rows, cols, fmt, false);
}

static void linear_case_x(fm_preset p, fm_wformat fmt, int64_t M, int64_t K, int64_t N, float x_scale) {
    both b = make_dense(p, fmt == FM_W_E4M3_PT ? FM_DENSE_W8A8 : FM_DENSE_PRESET);
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
    char what[96];
    snprintf(what, sizeof what, "linear %s M=%lld K=%lld N=%lld%s", fm_wformat_name(fmt), (long long)M, (long long)K,
             (long long)N, x_scale == 0.0f ? " zero input" : "");
    const bool fp8 = fmt == FM_W_INT4_G128_TC || fmt == FM_W_E4M3_PT;
    gpu_expect_close(y[1], y[0], M * N, fp8 ? 5e-3 : reduction_bound(&b), what);
    free(y[0]), free(y[1]), free(w), free(x);
    destroy(&b);
}

static void linear_case(fm_preset p, fm_wformat fmt, int64_t M, int64_t K, int64_t N) { linear_case_x(p, fmt, M, K, N, 1.0f); }

/* W8A8 (--dense w8a8): M = 1, 8 (the mma.sync GEMV) and 9, 16, 300 (cuBLASLt FP8; gemv_fp8.cuh has the route
   table; gpu-check also runs these with the GEMV up to 16 rows, its two-tile form), on the fused (M Kp <= 65536)
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

/* W8A8 at decode sizes, many calls on one backend: the fused activation quantizer's blocks meet at a grid barrier
   whose words persist between calls (linear_w8a8.cu), so a sequence with changing block counts (M Kp / 8192: 8,
   3, 1, 8, 2, 6, 8, 1) must give each call its own amax. Outlier magnitudes change from call to call. */
static void test_linear_w8a8_sequence(void **s) {
    (void)s;
    both          b = make_dense(FM_PRESET_FP8, FM_DENSE_W8A8);
    const int64_t K = 4096, N = 64, Ms[] = {16, 6, 1, 16, 4, 12, 16, 2};
    float        *w = rand_array(N * K, 0.1f);
    fm_bank      *wb[2];
    for (int i = 0; i < 2; i++) wb[i] = bank(b.be[i], w, 1, N, K, FM_W_E4M3_PT);
    for (int c = 0; c < 8; c++) {
        const int64_t M = Ms[c];
        float        *x = rand_array(M * K, 1.0f), *y[2];
        x[(c * 977) % (M * K)] = 10.0f * (float)(c + 1); /* the amax moves */
        for (int i = 0; i < 2; i++) {
            fm_backend *be = b.be[i];
            void       *xd = gpu_upload(be, x, M * K), *base;
            void       *yd = gpu_guarded(be, M * N, &base);
            be->ops->linear(be, wb[i], 0, xd, M, be->plan.a_dense, yd);
            y[i] = gpu_fetch(be, base, M * N, "linear");
            be->ops->free(be, xd);
        }
        char what[96];
        snprintf(what, sizeof what, "linear e4m3-tensor sequence call %d M=%lld K=%lld N=%lld", c, (long long)M,
                 (long long)K, (long long)N);
        gpu_expect_close(y[1], y[0], M * N, 5e-3, what);
        free(y[0]), free(y[1]), free(x);
    }
    for (int i = 0; i < 2; i++) b.be[i]->ops->bank_free(b.be[i], wb[i]);
    free(w);
    destroy(&b);
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

static void norm_embed_elementwise(fm_preset preset) {
    both b = make(preset);
    const fm_wformat wf = other_fmt(&b);
    const int64_t rows_list[] = {1, 17, 300}, dims[] = {96, 200, 2048};
    for (int ri = 0; ri < 3; ri++)
        for (int di = 0; di < 3; di++) {
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
            snprintf(what, sizeof what, "rmsnorm %s rows=%lld dim=%lld", fm_preset_name(preset), (long long)R, (long long)D);
            gpu_expect_close(o[1], o[0], R * D, reduction_bound(&b), what);
            gpu_expect_close(sw[1], sw[0], R * (D / 2), 1e-6, "swiglu");
            gpu_expect_close(ad[1], ad[0], D, 1e-6, "add");
            for (int i = 0; i < 2; i++) free(o[i]), free(sw[i]), free(ad[i]);
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
    snprintf(what, sizeof what, "qk_norm_rope %s T=%lld nh=%d nkv=%d hd=%d norm=%d", fm_preset_name(preset), (long long)T,
             nh, nkv, hd, norm);
    gpu_expect_close(r[1], r[0], T * ld, reduction_bound(&b), what);
    snprintf(what, sizeof what, "attention    %s T=%lld nh=%d nkv=%d hd=%d", fm_preset_name(preset), (long long)T, nh,
             nkv, hd);
    gpu_expect_close(a[1], a[0], T * nh * hd, reduction_bound(&b), what);
    free(r[0]), free(r[1]), free(a[0]), free(a[1]), free(qkv), free(qn), free(kn);
    destroy(&b);
}

static void test_rope_attention(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 17, 300, 1000};
    const int32_t shapes[][3] = {{4, 2, 48}, {32, 4, 128}, {8, 8, 64}, {2, 1, 256}, {4, 4, 16}};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            attention_case(FM_PRESET_REF, Ts[i], shapes[j][0], shapes[j][1], shapes[j][2], j % 2 == 0);
            attention_case(FM_PRESET_REF32, Ts[i], shapes[j][0], shapes[j][1], shapes[j][2], j % 2 == 0);
        }
}

static void route_cases(fm_preset preset) {
    both b = make(preset);
    const int32_t cases[][2] = {{8, 2}, {16, 4}, {128, 8}};
    const int64_t Ts[] = {1, 17, 300};
    for (int c = 0; c < 3; c++)
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
                    be->ops->route(be, ld, T, E, k, kind ? FM_ROUTER_TOPK_SOFTMAX : FM_ROUTER_SOFTMAX_TOPK, true, idd, wd);
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

/* routing: spread (pair (t, j) -> (5t + 3j) mod E) or skewed (every token's first choice is expert 0, the
   others spread over 1..E-2: expert 0 gets all T rows, expert E-1 none) */
static void moe_case_routed(fm_preset p, fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I,
                            bool skewed) {
    both b = make(p);
    float *gu = rand_array((int64_t)E * 2 * I * H, 0.1f), *dn = rand_array((int64_t)E * H * I, 0.1f);
    float *x = rand_array(T * H, 1.0f), *wts = malloc((size_t)(T * k) * sizeof(float));
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            ids[t * k + j] = skewed ? (j == 0 ? 0 : (int32_t)(1 + (t * 5 + j * 3) % (E - 2)))
                                    : (int32_t)((t * 5 + j * 3) % E); /* distinct for k <= E when 3 and E are coprime */
            wts[t * k + j] = 0.25f + 0.5f * fabsf(frand());
        }
    float *o[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *gub = gpu_bank(be, gu, E, 2 * I, H, fmt, true), *db = bank(be, dn, E, H, I, fmt);
        o[i] = gpu_run_moe(be, gub, db, x, T, H, ids, wts, k);
        be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
    }
    char what[96];
    snprintf(what, sizeof what, "moe %s T=%lld E=%d k=%d H=%lld I=%lld%s", fm_wformat_name(fmt), (long long)T, E, k,
             (long long)H, (long long)I, skewed ? " skewed" : "");
    gpu_expect_close(o[1], o[0], T * H, fmt == FM_W_INT4_G128_TC ? 3e-2 : reduction_bound(&b), what);
    free(o[0]), free(o[1]), free(gu), free(dn), free(x), free(wts), free(ids);
    destroy(&b);
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
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),   cmocka_unit_test(test_norm_embed_elementwise), cmocka_unit_test(test_rope_attention),
        cmocka_unit_test(test_route),    cmocka_unit_test(test_moe),
        cmocka_unit_test(test_moe_w4a8),  cmocka_unit_test(test_linear_w8a8), cmocka_unit_test(test_linear_w8a8_sequence),
    };
    /* FM_TEST_FILTER=test_moe_w4a8 runs the matching tests only (e.g. one kernel under compute-sanitizer) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
