/* Experts in host memory on the GPU (src/backend/cuda/expert_cache.cu):
 *   - the device's residency kernel makes the reference's choices (backend/expert_residency.c): after every fetch
 *     of a random sequence (decode-sized and prefill-sized routings, several layers, a cache a little larger than
 *     one layer's experts so that most fetches evict), the slot table and the slot owners equal the reference's,
 *     and so do the counters, LRU and LFU (past a half-life); half the fetches follow a prefetch of the layer
 *     (expert_prefetch: a guess of one or two tokens' experts, the first 1..k of each), whose table is checked
 *     against the reference too;
 *   - the moe op on the cache's pool views, fetch after fetch, is bit-identical to the moe op on the layer's own
 *     device banks (the copies landed, the dispatch read the table), on the grouped GEMM and on the decode GEMVs;
 *   - whole models: logits of a prefill, then a fresh prefill and decode steps, with the experts in host memory
 *     and the smallest cache (S = E, every layer pass evicts) bit-identical to all experts on the GPU (fp8, fp4,
 *     NVFP4 dispatch), and greedy generation whose decode steps replay as CUDA graphs: the same tokens and
 *     log-probabilities, with and without the expert prefetch on the side stream (route expert.prefetch=on);
 *   - the plan: the GPU's memory grows by the plan's peak at most with the experts in host memory.
 * Runs only where a GPU is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/expert_residency.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_plan.h"
#include "../kv_steps.h"
#include "gpu_test_util.h"

static uint32_t rng = 12345;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}
static float *rand_array(int64_t n, float scale) {
    float *a = malloc((size_t)n * sizeof *a);
    for (int64_t i = 0; i < n; i++) a[i] = scale * ((float)(next_u32() >> 8) / 8388608.0f - 1.0f);
    return a;
}

/* routed ids of T tokens, top-k distinct experts each; hot: the first choice among the first 3 experts */
static void routing(int32_t *ids, float *wts, int64_t T, int32_t k, int32_t E, bool hot) {
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(next_u32() % (uint32_t)(hot && j == 0 ? 3 : E));
                dup = false;
                for (int32_t i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e, wts[t * k + j] = 1.0f / (float)(j + 1);
        }
}

/* One cache of S slots over L layers of E experts (H, I) against the reference and against device banks. */
static void cache_case(fm_expert_policy policy, int32_t L, int32_t E, int32_t S, int32_t k, int64_t H, int64_t I,
                       int n_fetches) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *be = NULL;
    fm_error err = {{0}};
    if (fm_backend_create("cuda", &plan, 1, gpu_test_routes(), &be, &err)) fail_msg("cuda backend: %s", err.msg);
    fm_bank **hgu = calloc((size_t)L, sizeof *hgu), **hdn = calloc((size_t)L, sizeof *hdn);
    fm_bank **dgu = calloc((size_t)L, sizeof *dgu), **ddn = calloc((size_t)L, sizeof *ddn);
    for (int32_t l = 0; l < L; l++) {
        if (l == 1 && L > 2) continue; /* a dense layer: no banks */
        float *gu = rand_array((int64_t)E * 2 * I * H, 0.1f), *dn = rand_array((int64_t)E * H * I, 0.1f);
        hgu[l] = gpu_bank_host(be, gu, E, 2 * I, H, FM_W_INT4_G128_TC, true);
        hdn[l] = gpu_bank_host(be, dn, E, H, I, FM_W_INT4_G128_TC, false);
        dgu[l] = gpu_bank(be, gu, E, 2 * I, H, FM_W_INT4_G128_TC, true);
        ddn[l] = gpu_bank(be, dn, E, H, I, FM_W_INT4_G128_TC, false);
        free(gu), free(dn);
    }
    const int64_t Tmax = 300;
    const fm_expert_cache_desc d = {L, E, S, Tmax * k, policy, hgu, hdn};
    fm_expert_cache *c = NULL;
    const fm_bank *pgu = NULL, *pdn = NULL;
    void *slot_ids = (void *)1;
    if (be->ops->expert_cache_create(be, &d, &c, &pgu, &pdn, &slot_ids, &err)) fail_msg("cache: %s", err.msg);
    assert_null(slot_ids); /* the views take the routed ids */
    fm_residency ref;
    assert_int_equal(fm_residency_init(&ref, L, E, S, policy, &err), FM_OK);
    int32_t *ids = malloc((size_t)(Tmax * k) * 4), *rslots = malloc((size_t)(Tmax * k) * 4);
    int32_t *ce = malloc((size_t)E * 4), *cs = malloc((size_t)E * 4), nc;
    int32_t *slot_of = malloc((size_t)L * E * 4), *owner = malloc((size_t)S * 4);
    float *wts = malloc((size_t)(Tmax * k) * 4);
    void *idd = be->ops->alloc(be, (size_t)(Tmax * k) * 4);
    int compared = 0;
    for (int f = 0; f < n_fetches; f++) {
        int32_t l = (int32_t)(next_u32() % (uint32_t)L);
        while (!hgu[l]) l = (l + 1) % L;
        const uint32_t pick = next_u32() % 8;
        const int64_t T = pick == 0 ? Tmax : pick == 1 ? 17 : pick < 4 ? 2 : 1;
        if (next_u32() % 2 == 0) { /* a prefetch of the layer first: a guess of one or two tokens' experts */
            const int64_t Tp = 1 + next_u32() % 2;
            routing(ids, wts, Tp, k, E, pick == 5);
            be->ops->upload_ids(be, ids, Tp * k, idd);
            const int32_t top = 1 + (int32_t)(next_u32() % (uint32_t)k); /* the first `top` of each row */
            be->ops->expert_prefetch(be, c, l, idd, Tp, k, top);
            fm_residency_prefetch(&ref, l, ids, Tp, k, top, ce, cs, &nc);
            assert_int_equal(fm_cuda_expert_cache_table(be, c, slot_of, owner, &err), FM_OK);
            if (memcmp(slot_of, ref.slot_of, (size_t)L * E * 4) || memcmp(owner, ref.owner, (size_t)S * 4))
                fail_msg("%s prefetch before fetch %d (layer %d): the table differs from the reference",
                         fm_expert_policy_name(policy), f, l);
        }
        routing(ids, wts, T, k, E, pick == 5);
        be->ops->upload_ids(be, ids, T * k, idd);
        be->ops->expert_fetch(be, c, l, idd, T * k);
        fm_residency_fetch(&ref, l, ids, T * k, rslots, ce, cs, &nc);
        assert_int_equal(fm_cuda_expert_cache_table(be, c, slot_of, owner, &err), FM_OK);
        if (memcmp(slot_of, ref.slot_of, (size_t)L * E * 4) || memcmp(owner, ref.owner, (size_t)S * 4)) {
            for (int32_t i = 0; i < L * E; i++)
                if (slot_of[i] != ref.slot_of[i])
                    fail_msg("%s fetch %d (layer %d, %lld ids): (layer, expert) %d in slot %d on the GPU, %d in the "
                             "reference",
                             fm_expert_policy_name(policy), f, l, (long long)(T * k), i, slot_of[i], ref.slot_of[i]);
            fail_msg("%s fetch %d: slot owners differ", fm_expert_policy_name(policy), f);
        }
        /* every few fetches, and at every prefill: the moe op on the pool equals the one on the layer's banks */
        if (f % 5 == 0 || T == Tmax) {
            float *x = rand_array(T * H, 1.0f);
            float *a = gpu_run_moe(be, pgu, pdn, x, T, H, ids, wts, k);
            float *b = gpu_run_moe(be, dgu[l], ddn[l], x, T, H, ids, wts, k);
            if (memcmp(a, b, (size_t)(T * H) * 4))
                fail_msg("%s fetch %d (layer %d, T %lld): moe on the cache's pool differs from the layer's banks",
                         fm_expert_policy_name(policy), f, l, (long long)T);
            compared++;
            free(x), free(a), free(b);
        }
    }
    fm_expert_cache_stats st;
    be->ops->expert_cache_stats(be, c, &st);
    assert_int_equal(st.fetches, ref.fetches);
    assert_int_equal(st.hits, ref.hits);
    assert_int_equal(st.misses, ref.misses);
    assert_int_equal(st.prefetches, ref.prefetches);
    assert_int_equal(st.prefetch_copies, ref.prefetch_copies);
    printf("  %s L=%d E=%d S=%d k=%d H=%lld I=%lld: %d fetches, %lld hits, %lld misses (%.1f MB copied), %lld "
           "prefetches copying %lld experts, as the reference; %d moe outputs bit-identical to device banks\n",
           fm_expert_policy_name(policy), L, E, S, k, (long long)H, (long long)I, n_fetches, (long long)st.hits,
           (long long)st.misses, (double)st.bytes_copied / 1e6, (long long)st.prefetches, (long long)st.prefetch_copies,
           compared);
    assert_true(st.misses > 0 && st.hits > 0 && st.prefetch_copies > 0);
    be->ops->expert_cache_free(be, c);
    fm_residency_free(&ref);
    for (int32_t l = 0; l < L; l++) {
        if (!hgu[l]) continue;
        be->ops->bank_free(be, hgu[l]), be->ops->bank_free(be, hdn[l]);
        be->ops->bank_free(be, dgu[l]), be->ops->bank_free(be, ddn[l]);
    }
    be->ops->free(be, idd);
    free(hgu), free(hdn), free(dgu), free(ddn), free(ids), free(rslots), free(ce), free(cs), free(slot_of);
    free(owner), free(wts);
    be->ops->destroy(be);
}

static void test_cache_small(void **s) {
    (void)s;
    cache_case(FM_EXPERT_LRU, 3, 8, 10, 2, 256, 128, 120);
    cache_case(FM_EXPERT_LFU, 3, 8, 10, 2, 256, 128, 120);
}

static void test_cache_qwen_routing(void **s) {
    (void)s;
    /* Qwen3-30B-A3B's routing width (128 experts, top-8) on small matrices; LFU past its half-life */
    cache_case(FM_EXPERT_LRU, 4, 128, 200, 8, 256, 128, 80);
    cache_case(FM_EXPERT_LFU, 2, 128, 160, 8, 256, 128, FM_EXPERT_LFU_HALF_LIFE + 40);
}

/* ---- whole models --------------------------------------------------------------------------------------------- */

static fm_model *load_routes(const char *dir, fm_preset preset, fm_dispatch dispatch, fm_experts_in where,
                             int32_t slots, fm_expert_policy policy, const char *backend, const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = backend, opt.preset = preset, opt.dispatch = dispatch, opt.routes = routes;
    opt.max_seqs = 1, opt.ctx = 64, opt.max_tokens = 32;
    opt.experts_in = where, opt.expert_slots = slots, opt.expert_policy = policy;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err))
        fail_msg("%s (%s, %s, experts in %s): load: %s", dir, fm_preset_name(preset), backend,
                 fm_experts_in_name(where), err.msg);
    return m;
}

static fm_model *load(const char *dir, fm_preset preset, fm_dispatch dispatch, fm_experts_in where, int32_t slots,
                      fm_expert_policy policy, const char *backend) {
    return load_routes(dir, preset, dispatch, where, slots, policy, backend, gpu_test_routes());
}

/* greedy generation through fm_context_generate: its decode steps replay as CUDA graphs (route decode.graphs) */
static void generate(fm_model *m, const int32_t *prompt, int64_t n, fm_gen_output *out) {
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = 16, gp.ignore_eos = true;
    fm_error err = {{0}};
    if (fm_context_generate(m->context, &prompt, &n, &gp, 1, 0, NULL, NULL, out, NULL, &err))
        fail_msg("generate: %s", err.msg);
    assert_int_equal(out->n, 16);
}

static void model_case(const char *dir, fm_preset preset, fm_dispatch dispatch, fm_expert_policy policy) {
    enum { N = 20 };
    fm_model *dev = load(dir, preset, dispatch, FM_EXPERTS_DEVICE, 0, FM_EXPERT_LRU, "cuda");
    const int32_t E = dev->cfg.n_experts, V = fm_model_vocab_size(dev);
    fm_model *host = load(dir, preset, dispatch, FM_EXPERTS_HOST, E, policy, "cuda");
    char pf_routes[300];
    snprintf(pf_routes, sizeof pf_routes, "expert.prefetch=on%s%s", gpu_test_routes() ? "," : "",
             gpu_test_routes() ? gpu_test_routes() : "");
    fm_model *pf = load_routes(dir, preset, dispatch, FM_EXPERTS_HOST, E, policy, "cuda", pf_routes);
    assert_true(host->experts_host);
    assert_int_equal(host->weight_bytes + host->expert_host_bytes, dev->weight_bytes);
    int32_t ids[N];
    uint32_t seed = 11;
    for (int i = 0; i < N; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    float *a = malloc((size_t)2 * N * V * sizeof *a), *b = malloc((size_t)2 * N * V * sizeof *b);
    kv_prefill_and_steps(host, ids, N, 12, a);
    kv_prefill_and_steps(dev, ids, N, 12, b);
    if (memcmp(a, b, (size_t)2 * N * V * sizeof *a))
        fail_msg("%s %s dispatch %s %s: logits with the experts in host memory differ from the GPU's", dir,
                 fm_preset_name(preset), fm_dispatch_name(dispatch), fm_expert_policy_name(policy));
    kv_prefill_and_steps(pf, ids, N, 12, a); /* the decode steps prefetch each layer on the side stream */
    if (memcmp(a, b, (size_t)2 * N * V * sizeof *a))
        fail_msg("%s %s dispatch %s %s: logits with the expert prefetch differ from the GPU's", dir,
                 fm_preset_name(preset), fm_dispatch_name(dispatch), fm_expert_policy_name(policy));
    fm_gen_output ga, gb;
    generate(host, ids, 9, &ga);
    generate(dev, ids, 9, &gb);
    assert_memory_equal(ga.ids, gb.ids, 16 * sizeof *ga.ids);
    assert_memory_equal(ga.logprobs, gb.logprobs, 16 * sizeof *ga.logprobs);
    free(ga.ids), free(ga.logprobs);
    generate(pf, ids, 9, &ga);
    assert_memory_equal(ga.ids, gb.ids, 16 * sizeof *ga.ids);
    assert_memory_equal(ga.logprobs, gb.logprobs, 16 * sizeof *ga.logprobs);
    fm_expert_stats ps;
    assert_true(fm_context_expert_stats(pf->context, &ps));
    assert_true(ps.prefetches > 0);
    fm_expert_stats st;
    assert_true(fm_context_expert_stats(host->context, &st));
    int32_t moe = 0;
    for (int l = 0; l < host->n_layers; l++) moe += host->layers[l].is_moe;
    printf("  %-34s %-4s %-6s %s: logits (20-token prefill, 12 + 8 decode steps) and 16 greedy tokens from graphs "
           "bit-identical; %d slots: %lld fetches, %lld hits, %lld misses\n",
           dir, fm_preset_name(preset), fm_dispatch_name(dispatch), fm_expert_policy_name(policy), st.slots,
           (long long)st.fetches, (long long)st.hits, (long long)st.misses);
    assert_int_equal(st.slots, E);
    assert_true(st.fetches >= (int64_t)moe * (1 + 1 + 8 + 16));
    if (moe > 1) assert_true(st.misses >= (int64_t)moe * (1 + 1 + 8)); /* S = E: every layer pass evicts */
    assert_int_equal(st.bytes_copied, (uint64_t)st.misses * st.slot_bytes);
    free(ga.ids), free(ga.logprobs), free(gb.ids), free(gb.logprobs);
    free(a), free(b);
    fm_model_free(host), fm_model_free(dev), fm_model_free(pf);
}

static void test_models_bit_identical(void **s) {
    (void)s;
    model_case("models/tiny-code-moe", FM_PRESET_FP8, FM_DISPATCH_PRESET, FM_EXPERT_LRU);
    model_case("models/tiny-code-moe", FM_PRESET_FP8, FM_DISPATCH_PRESET, FM_EXPERT_LFU);
    model_case("models/tiny-code-moe", FM_PRESET_FP4, FM_DISPATCH_PRESET, FM_EXPERT_LRU);
    model_case("models/tiny-code-moe", FM_PRESET_FP8, FM_DISPATCH_NVFP4, FM_EXPERT_LRU);
    model_case("tests/models/qwen3-moe-bf16", FM_PRESET_FP8, FM_DISPATCH_PRESET, FM_EXPERT_LRU);
    model_case("tests/models/mixtral-f32-sharded", FM_PRESET_FP8, FM_DISPATCH_PRESET, FM_EXPERT_LFU);
}

/* The GPU's memory with the experts in host memory: the plan's peak bounds it (the pool after the rest); a preset
   whose experts the cache cannot keep is refused by name. */
static void test_plan_and_refusals(void **s) {
    (void)s;
    size_t free0 = 0, total = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_cuda_free_memory(&free0, &total, &err), FM_OK);
    fm_model *m =
        load("models/tiny-code-moe", FM_PRESET_FP8, FM_DISPATCH_PRESET, FM_EXPERTS_HOST, 20, FM_EXPERT_LRU, "cuda");
    size_t free1 = 0;
    assert_int_equal(fm_cuda_free_memory(&free1, &total, &err), FM_OK);
    fm_expert_stats st;
    assert_true(fm_context_expert_stats(m->context, &st));
    assert_int_equal(st.slots, 20);
    printf("  tiny-code-moe fp8, experts in host memory (%.1f MiB), 20 slots of %.1f KiB: GPU memory +%.1f MiB\n",
           (double)m->expert_host_bytes / (1 << 20), (double)st.slot_bytes / 1024, (double)(free0 - free1) / (1 << 20));
    fm_model_free(m);
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = FM_PRESET_REF, opt.experts_in = FM_EXPERTS_HOST;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "keeps experts in host memory for the fp8 and fp4 presets"));
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    /* FM_TEST_FILTER=test_cache_small runs the small kernel tests alone (compute-sanitizer) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_small),
        cmocka_unit_test(test_cache_qwen_routing),
        cmocka_unit_test(test_models_bit_identical),
        cmocka_unit_test(test_plan_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
