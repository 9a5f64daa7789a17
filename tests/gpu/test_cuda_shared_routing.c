/* Qwen3-Next's shared expert as one more routed expert (route moe.shared, src/engine/shared_routing.h) on the GPU.
 *
 * 1. The route op with the shared pair (FM_ROUTER_SOFTMAX_TOPK_SHARED) against the CPU's: the warp kernel (E - 1 <=
 *    1024 candidates: 8, 16 and 32 per lane, Qwen3-Next's 512 + 1 with top-10 + 1) and the thread-per-token one
 *    above, T = 1, 17, 300, ref (bf16) and ref32: the same ids, the weights within the reduction bound, the shared
 *    expert's pair last with sigmoid of its logit.
 * 2. The router op (the fused GEMV + route at T <= 8, route router.fused; cuBLAS + route above) over an [E + 1, H]
 *    router: logits close; the same ids but where the CPU's own logits tie within a bf16 step; the shared pair last.
 * 3. The synthetic toy-next (the shared expert as wide as the routed ones) on the GPU under moe.shared=routed against
 *    =separate, ref32 and fp8 (test_toy_next_routed says the bounds), greedy generations in CUDA graphs equal.
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
#include "engine/engine.h"
#include "fp8moe.h"
#include "gpu_test_util.h"
#include "util/metrics.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
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

static both make(fm_preset p) {
    both b;
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &b.be[0], &err), FM_OK);
    fm_status st = fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &b.be[1], &err);
    if (st) fail_msg("cuda backend: %s", err.msg);
    return b;
}
static void destroy(both *b) {
    for (int i = 0; i < 2; i++) b->be[i]->ops->destroy(b->be[i]);
}
static double reduction_bound(const both *b) { return b->be[1]->plan.act_bf16 ? 1e-2 : 1e-5; }

static int32_t *fetch_ids(fm_backend *be, const void *d, int64_t n) {
    int32_t *h = malloc((size_t)n * sizeof *h);
    be->ops->download_raw(be, d, (size_t)n * sizeof *h, h);
    return h;
}

/* E and k count the shared expert (the last of the E logits) */
static void route_cases(fm_preset preset) {
    both b = make(preset);
    const int32_t cases[][2] = {{9, 3}, {129, 9}, {513, 11}, {1025, 33}, {1031, 4}};
    const int64_t Ts[] = {1, 17, 300};
    for (int c = 0; c < 5; c++)
        for (int ti = 0; ti < 3; ti++)
            for (int norm = 0; norm < 2; norm++) {
                const int32_t E = cases[c][0], k = cases[c][1];
                const int64_t T = Ts[ti];
                float *l = rand_array(T * E, 3.0f), *w[2];
                int32_t *ids[2];
                for (int i = 0; i < 2; i++) {
                    fm_backend *be = b.be[i];
                    void *ld = gpu_upload(be, l, T * E), *base;
                    void *idd = be->ops->alloc(be, (size_t)(T * k) * 4);
                    void *wd = gpu_guarded(be, T * k, &base);
                    be->ops->route(be, ld, T, E, k, FM_ROUTER_SOFTMAX_TOPK_SHARED, norm, idd, wd);
                    w[i] = gpu_fetch(be, base, T * k, "route (shared)");
                    ids[i] = fetch_ids(be, idd, T * k);
                    be->ops->free(be, ld), be->ops->free(be, idd);
                }
                char what[96];
                snprintf(what, sizeof what, "route %s shared E=%d k=%d T=%lld norm=%d", fm_preset_name(preset), E, k,
                         (long long)T, norm);
                assert_memory_equal(ids[0], ids[1], (size_t)(T * k) * 4);
                for (int64_t t = 0; t < T; t++) assert_int_equal(ids[1][t * k + k - 1], E - 1);
                gpu_expect_close(w[1], w[0], T * k, reduction_bound(&b), what);
                for (int i = 0; i < 2; i++) free(w[i]), free(ids[i]);
                free(l);
            }
    destroy(&b);
}

static void test_route_shared(void **s) {
    (void)s;
    route_cases(FM_PRESET_REF);
    route_cases(FM_PRESET_REF32);
}

static void router_case(fm_preset preset, int32_t E, int32_t k, int64_t H, int64_t T) {
    both b = make(preset);
    float *w = rand_array((int64_t)E * H, 0.1f), *x = rand_array(T * H, 1.0f), *lg[2], *wt[2];
    int32_t *ids[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *wb = gpu_bank(be, w, 1, E, H, be->plan.w_other, false);
        void *xd = gpu_upload(be, x, T * H), *lbase, *wbase;
        void *ld = gpu_guarded(be, T * E, &lbase), *wd = gpu_guarded(be, T * k, &wbase);
        void *idd = be->ops->alloc(be, (size_t)(T * k) * 4);
        be->ops->router(be, wb, xd, T, k, FM_ROUTER_SOFTMAX_TOPK_SHARED, true, ld, idd, wd);
        lg[i] = gpu_fetch(be, lbase, T * E, "router logits");
        wt[i] = gpu_fetch(be, wbase, T * k, "router weights");
        ids[i] = fetch_ids(be, idd, T * k);
        be->ops->free(be, xd), be->ops->free(be, idd);
        be->ops->bank_free(be, wb);
    }
    char what[128];
    snprintf(what, sizeof what, "router %s shared E=%d k=%d H=%lld T=%lld", fm_preset_name(preset), E, k, (long long)H,
             (long long)T);
    gpu_expect_close(lg[1], lg[0], T * E, reduction_bound(&b), what);
    for (int64_t t = 0; t < T; t++) {
        assert_int_equal(ids[1][t * k + k - 1], E - 1);
        /* the shared pair's weight: the sigmoid of its logit, whatever the routed experts' ties */
        gpu_expect_close(wt[1] + t * k + k - 1, wt[0] + t * k + k - 1, 1, reduction_bound(&b), what);
        if (!memcmp(ids[0] + t * k, ids[1] + t * k, (size_t)k * 4)) {
            gpu_expect_close(wt[1] + t * k, wt[0] + t * k, k, reduction_bound(&b), what);
            continue;
        }
        for (int32_t j = 0; j < k - 1; j++) { /* a tie within the bf16 spacing: the ranks' CPU logits agree */
            const float a = lg[0][t * E + ids[0][t * k + j]], g = lg[0][t * E + ids[1][t * k + j]];
            if (fabsf(a - g) > 0.02f)
                fail_msg("%s: token %lld rank %d: expert %d (cpu logit %g) where the cpu chose %d (%g)", what,
                         (long long)t, j, ids[1][t * k + j], g, ids[0][t * k + j], a);
        }
    }
    for (int i = 0; i < 2; i++) free(lg[i]), free(wt[i]), free(ids[i]);
    free(w), free(x);
    destroy(&b);
}

static void test_router_shared(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 3, 8, 17}; /* fused up to 8 with router.fused=on, T = 1 by default */
    for (int i = 0; i < 4; i++) {
        router_case(FM_PRESET_REF, 513, 11, 2048, Ts[i]); /* Qwen3-Next-80B-A3B: 512 + 1 experts, top-10 + 1 */
        router_case(FM_PRESET_REF, 9, 3, 64, Ts[i]);      /* toy-next */
        router_case(FM_PRESET_REF32, 9, 3, 64, Ts[i]);
    }
}

static fm_model *load(fm_preset p, const char *backend, const char *shared, int32_t layers) {
    char routes[256];
    const char *extra = gpu_test_routes();
    snprintf(routes, sizeof routes, "moe.shared=%s%s%s", shared, extra ? "," : "", extra ? extra : "");
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = p;
    opt.backend = backend;
    opt.routes = routes;
    opt.max_seqs = 2;
    opt.max_tokens = 64;
    fm_model *m = NULL;
    fm_error err = {{0}};
    const fm_status st = fm_model_load_synthetic("toy-next", layers, &opt, &m, &err);
    if (st) fail_msg("load toy-next %s %s moe.shared=%s: %s", fm_preset_name(p), backend, shared, err.msg);
    assert_int_equal(m->cfg.shared_in_bank, !strcmp(shared, "routed"));
    return m;
}

static float *logits_of(fm_model *m, const int32_t *ids, int64_t T) {
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    float *out = malloc((size_t)T * (size_t)fm_model_vocab_size(m) * sizeof *out);
    if (fm_context_logits(ctx, ids, T, out, &err)) fail_msg("logits: %s", err.msg);
    fm_context_free(ctx);
    return out;
}

static int32_t *greedy(fm_model *m, const int32_t *prompt, int64_t T, int64_t n) {
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    fm_gen_params p;
    fm_gen_params_init(&p);
    p.max_tokens = n, p.ignore_eos = true;
    fm_gen_output out = {0};
    if (fm_context_generate(ctx, &prompt, &T, &p, 1, 0, NULL, NULL, &out, NULL, &err))
        fail_msg("generate: %s", err.msg);
    assert_int_equal(out.n, n);
    free(out.logprobs);
    fm_context_free(ctx);
    return out.ids;
}

static fm_compare compare(const float *ref, const float *x, int64_t T, int32_t V, const char *what) {
    fm_compare c;
    fm_logits_compare(ref, x, T, V, &c);
    printf("%-44s cosine %.9f max|diff| %.3g (%.2g x max|logit|) argmax %.1f%%\n", what, c.cosine, c.max_abs_err,
           c.max_abs_err / c.max_abs_ref, 100 * c.argmax_agree);
    assert_int_equal(c.n_nonfinite, 0);
    return c;
}

/* ref32 (fp32 on the GPU): routed against separate within the combine's order; routed on the GPU against routed on
   the CPU (ref, fp32) close (a wrong pair would be far); greedy decode (prefill, then decode steps in CUDA graphs)
   equal. fp8: after one layer, where both forms see the same input, within 2^-6 of the largest logit (the CPU test
   measures 2^-8: the block's output rounded apart; here the shared expert's SwiGLU also runs in another kernel, the
   moe GEMV's epilogue, so an e4m3 step of its output may flip); after four, under 0.3 of the preset's own distance
   from fp32 (the CPU test: 0.08; this random-weight model amplifies every rounding). */
static void test_toy_next_routed(void **s) {
    (void)s;
    const int64_t T = 37;
    int32_t ids[37];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((frand() * 0.5f + 0.5f) * 255.0f);
    fm_model *cpu = load(FM_PRESET_REF, "cpu", "routed", 0);
    float *oracle = logits_of(cpu, ids, T);
    const int32_t V = fm_model_vocab_size(cpu);
    fm_model *rt = load(FM_PRESET_REF32, "cuda", "routed", 0), *sp = load(FM_PRESET_REF32, "cuda", "separate", 0);
    float *a = logits_of(rt, ids, T), *b = logits_of(sp, ids, T);
    fm_compare c = compare(b, a, T, V, "ref32 cuda: routed vs separate");
    assert_true(c.max_abs_err <= 1e-4 * c.max_abs_ref);
    c = compare(oracle, a, T, V, "ref32 cuda routed vs cpu ref routed");
    assert_true(c.cosine >= 0.9999);
    int32_t *ga = greedy(rt, ids, 9, 16), *gb = greedy(sp, ids, 9, 16);
    assert_memory_equal(ga, gb, 16 * sizeof *ga);
    free(ga), free(gb), free(a), free(b);
    fm_model_free(rt), fm_model_free(sp);
    rt = load(FM_PRESET_FP8, "cuda", "routed", 1), sp = load(FM_PRESET_FP8, "cuda", "separate", 1);
    a = logits_of(rt, ids, T), b = logits_of(sp, ids, T);
    c = compare(b, a, T, V, "fp8 cuda, 1 layer: routed vs separate");
    assert_true(c.max_abs_err <= 0x1p-6 * c.max_abs_ref);
    free(a), free(b);
    fm_model_free(rt), fm_model_free(sp);
    rt = load(FM_PRESET_FP8, "cuda", "routed", 0), sp = load(FM_PRESET_FP8, "cuda", "separate", 0);
    a = logits_of(rt, ids, T), b = logits_of(sp, ids, T);
    const fm_compare q = compare(oracle, b, T, V, "fp8 cuda separate vs cpu ref");
    c = compare(b, a, T, V, "fp8 cuda: routed vs separate");
    assert_true(1 - c.cosine <= 0.3 * (1 - q.cosine) + 1e-4);
    free(a), free(b), free(oracle);
    fm_model_free(rt), fm_model_free(sp), fm_model_free(cpu);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_shared),
        cmocka_unit_test(test_router_shared),
        cmocka_unit_test(test_toy_next_routed),
    };
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
