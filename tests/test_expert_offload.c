/* Experts in host memory (--experts-in host), on the CPU backend's emulation of the expert cache:
 *   - the residency bookkeeping (backend/expert_residency.c) on a hand-worked sequence of routed ids: the slot ids,
 *     the copies (expert, victim slot) and the counters of each fetch, LRU and LFU (which differ at the 4th fetch);
 *   - logits with the experts in host memory and the smallest legal cache (S = E slots for all the layers, so every
 *     layer pass evicts) are bit-identical to all-resident experts, for a prefill and for cached generation (a fresh
 *     prefill, then decode steps over the paged KV cache), on models/tiny-code-moe and the tests/models checkpoints
 *     (ref, int4, fp8; the fp8 plan of the GPU emulated) and on pre-quantized checkpoints (int4-zp with act-order,
 *     int4-zp-tc, e4m3-block banks: every array of a bank goes through the slot copy);
 *   - the memory plan: the experts move to host memory, the pool is S x slot bytes; a cache smaller than one layer's
 *     experts is refused with the numbers; auto keeps the experts on the device when the plan fits;
 *   - the command line: --experts-in, --expert-slots, --expert-policy, their errors, the cuda refusal of presets
 *     other than fp8 and fp4 (the GPU's expert cache: tests/gpu/test_cuda_offload.c), the stats line
 *     of perplexity and the plan of inspect. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/expert_residency.h"
#include "cli_runner.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_plan.h"
#include "fp8moe_sched.h"
#include "kv_steps.h"

/* ---- residency bookkeeping ------------------------------------------------------------------------------------ */

typedef struct fetch_case {
    int32_t layer, n;
    int32_t ids[4];
    int32_t slots[4]; /* expected slot of each id */
    int32_t n_copies; /* expected copies */
    int32_t copy_e[3], copy_s[3];
} fetch_case;

static void run_cases(fm_expert_policy policy, const fetch_case *cases, int n_cases, int64_t hits, int64_t misses) {
    fm_residency r;
    fm_error err = {{0}};
    assert_int_equal(fm_residency_init(&r, 2, 3, 4, policy, &err), FM_OK);
    for (int c = 0; c < n_cases; c++) {
        const fetch_case *f = &cases[c];
        int32_t slots[4], ce[3], cs[3], nc = -1;
        fm_residency_fetch(&r, f->layer, f->ids, f->n, slots, ce, cs, &nc);
        for (int i = 0; i < f->n; i++)
            if (slots[i] != f->slots[i])
                fail_msg("%s fetch %d: id %d went to slot %d, want %d", fm_expert_policy_name(policy), c, i, slots[i],
                         f->slots[i]);
        if (nc != f->n_copies)
            fail_msg("%s fetch %d: %d copies, want %d", fm_expert_policy_name(policy), c, nc, f->n_copies);
        for (int j = 0; j < nc; j++)
            if (ce[j] != f->copy_e[j] || cs[j] != f->copy_s[j])
                fail_msg("%s fetch %d: copy %d is expert %d -> slot %d, want %d -> %d", fm_expert_policy_name(policy),
                         c, j, ce[j], cs[j], f->copy_e[j], f->copy_s[j]);
    }
    assert_int_equal(r.fetches, n_cases);
    assert_int_equal(r.hits, hits);
    assert_int_equal(r.misses, misses);
    fm_residency_free(&r);
}

/* 2 layers of E = 3 experts, S = 4 slots. Worked by hand (tick t = fetch number; lu = last use):
 *   A  layer 0 [0 2 0]  both miss; empty slots go lowest first: e0 -> 0, e2 -> 1                    slots 0 1 0
 *   B  layer 1 [1]      miss -> slot 2 (empty)                                                      slots 2
 *   C  layer 0 [2 1]    e2 hit (slot 1, lu 3); e1 miss -> slot 3 (empty)                              slots 1 3
 *   D  layer 1 [0 1 2]  e1 hit (slot 2, lu 4); e0, e2 miss among slots 0 (L0e0 lu 1, 1 use), 1 (L0e2 lu 3,
 *                       2 uses), 3 (L0e1 lu 3, 1 use):
 *                         LRU  e0 -> 0 (lu 1), e2 -> 1 (lu 3, lower index than 3)                     slots 0 2 1
 *                         LFU  e0 -> 3 (1 use; of the two 1-use slots the more recent, lu 3), e2 -> 0
 *                              (1 use, lu 1), keeping L0e2 (2 uses)                                   slots 3 2 0
 *   E  layer 0 [0]      L0e0 was evicted: miss.
 *                         LRU  victims lu: 0:4 1:4 2:4 3:3 (L0e1) -> 3                                  slots 3
 *                         LFU  uses: 0 L1e2 1, 1 L0e2 2, 2 L1e1 2, 3 L1e0 1 (lu 4 both) -> 0            slots 0
 *   F  layer 0 [2]        LRU  L0e2 was evicted at D: miss; lu 0:4 1:4 2:4 3:5 -> 0                    slots 0
 *                         LFU  L0e2 kept in slot 1: hit                                                slots 1
 *   LRU: 2 hits (C, D), 8 misses; LFU: 3 hits (C, D, F), 7 misses. */
static void residency_by_hand(void **s) {
    (void)s;
    const fetch_case lru[] = {
        {0, 3, {0, 2, 0}, {0, 1, 0}, 2, {0, 2}, {0, 1}},
        {1, 1, {1}, {2}, 1, {1}, {2}},
        {0, 2, {2, 1}, {1, 3}, 1, {1}, {3}},
        {1, 3, {0, 1, 2}, {0, 2, 1}, 2, {0, 2}, {0, 1}},
        {0, 1, {0}, {3}, 1, {0}, {3}},
        {0, 1, {2}, {0}, 1, {2}, {0}},
    };
    run_cases(FM_EXPERT_LRU, lru, 6, 2, 8);
    const fetch_case lfu[] = {
        {0, 3, {0, 2, 0}, {0, 1, 0}, 2, {0, 2}, {0, 1}},
        {1, 1, {1}, {2}, 1, {1}, {2}},
        {0, 2, {2, 1}, {1, 3}, 1, {1}, {3}},
        {1, 3, {0, 1, 2}, {3, 2, 0}, 2, {0, 2}, {3, 0}},
        {0, 1, {0}, {0}, 1, {0}, {0}},
        {0, 1, {2}, {1}, 0, {0}, {0}},
    };
    run_cases(FM_EXPERT_LFU, lfu, 6, 3, 7);
}

/* LFU counts halve every FM_EXPERT_LFU_HALF_LIFE fetches; S < E is refused. */
static void residency_limits(void **s) {
    (void)s;
    fm_residency r;
    fm_error err = {{0}};
    assert_int_equal(fm_residency_init(&r, 1, 4, 3, FM_EXPERT_LRU, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "3 slots are fewer than one layer's 4 experts"));
    assert_int_equal(fm_residency_init(&r, 1, 2, 2, FM_EXPERT_LFU, &err), FM_OK);
    int32_t id = 0, slot, ce[2], cs[2], nc;
    for (int t = 1; t < FM_EXPERT_LFU_HALF_LIFE; t++) fm_residency_fetch(&r, 0, &id, 1, &slot, ce, cs, &nc);
    assert_int_equal(r.uses[0], FM_EXPERT_LFU_HALF_LIFE - 1);
    fm_residency_fetch(&r, 0, &id, 1, &slot, ce, cs, &nc); /* halved first, then counted */
    assert_int_equal(r.uses[0], (FM_EXPERT_LFU_HALF_LIFE - 1) / 2 + 1);
    assert_int_equal(r.hits, FM_EXPERT_LFU_HALF_LIFE - 1);
    fm_residency_free(&r);
}

/* ---- bit-identical logits ------------------------------------------------------------------------------------- */

typedef struct model_case {
    const char *dir;
    fm_preset preset;
    const char *plan_backend; /* NULL: the cpu's plan; "cuda": the GPU's formats emulated */
} model_case;

static fm_model *load_routes(const model_case *mc, fm_experts_in where, int32_t slots, fm_expert_policy policy,
                             const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = mc->preset, opt.plan_backend = mc->plan_backend, opt.routes = routes;
    opt.max_seqs = 1, opt.ctx = 64, opt.max_tokens = 32;
    opt.experts_in = where, opt.expert_slots = slots, opt.expert_policy = policy;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(mc->dir, &opt, &m, &err))
        fail_msg("%s (%s): load: %s", mc->dir, fm_preset_name(mc->preset), err.msg);
    return m;
}

static fm_model *load(const model_case *mc, fm_experts_in where, int32_t slots, fm_expert_policy policy) {
    return load_routes(mc, where, slots, policy, NULL);
}

static void expect_same(const float *a, const float *b, int64_t n, const char *what, const model_case *mc) {
    if (memcmp(a, b, (size_t)n * sizeof *a) != 0) {
        int64_t i = 0;
        while (a[i] == b[i] || (a[i] != a[i] && b[i] != b[i])) i++;
        fail_msg("%s %s%s%s: %s: logits differ at %lld: %.9g (host experts) vs %.9g (device)", mc->dir,
                 fm_preset_name(mc->preset), mc->plan_backend ? " plan " : "", mc->plan_backend ? mc->plan_backend : "",
                 what, (long long)i, a[i], b[i]);
    }
}

static void check_model(const model_case *mc, fm_expert_policy policy) {
    enum { N = 20 };
    fm_model *dev = load(mc, FM_EXPERTS_DEVICE, 0, FM_EXPERT_LRU);
    const int32_t E = dev->cfg.n_experts, V = fm_model_vocab_size(dev);
    fm_model *host = load(mc, FM_EXPERTS_HOST, E, policy);
    assert_true(host->experts_host);
    assert_false(dev->experts_host);
    /* the same banks, the experts in host memory instead */
    assert_int_equal(host->weight_bytes + host->expert_host_bytes, dev->weight_bytes);
    int32_t ids[N];
    uint32_t seed = 11;
    for (int i = 0; i < N; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    float *a = malloc((size_t)2 * N * V * sizeof *a), *b = malloc((size_t)2 * N * V * sizeof *b);
    kv_prefill_and_steps(host, ids, N, 12, a);
    kv_prefill_and_steps(dev, ids, N, 12, b);
    expect_same(a, b, (int64_t)N * V, "prefill", mc);
    expect_same(a + (size_t)N * V, b + (size_t)N * V, (int64_t)N * V, "generation (prefill 12, 8 decode steps)", mc);
    fm_expert_stats st;
    assert_true(fm_context_expert_stats(host->context, &st));
    assert_false(fm_context_expert_stats(dev->context, &(fm_expert_stats){0}));
    int32_t moe = 0;
    for (int l = 0; l < host->n_layers; l++) moe += host->layers[l].is_moe;
    assert_int_equal(st.slots, E);
    assert_int_equal(st.experts, moe * E);
    assert_int_equal(st.fetches, (int64_t)moe * (1 + 1 + 8)); /* prefill, fresh prefill, 8 decode steps */
    /* S = E: with two MoE layers or more, every layer pass finds the previous layer's experts: misses every pass */
    if (moe > 1) assert_true(st.misses >= st.fetches);
    assert_int_equal(st.bytes_copied, (uint64_t)st.misses * st.slot_bytes);
    free(a), free(b);
    fm_model_free(host);
    fm_model_free(dev);
}

static void logits_bit_identical(void **s) {
    (void)s;
    const model_case cases[] = {
        {"models/tiny-code-moe", FM_PRESET_REF, NULL},
        {"models/tiny-code-moe", FM_PRESET_INT4, NULL},
        {"models/tiny-code-moe", FM_PRESET_FP8, NULL},
        {"models/tiny-code-moe", FM_PRESET_FP8, "cuda"},
        {"tests/models/qwen3-moe-f32", FM_PRESET_REF, NULL},
        {"tests/models/qwen3-moe-f32", FM_PRESET_FP8, "cuda"},
        {"tests/models/qwen3-moe-bf16", FM_PRESET_INT4, NULL},
        {"tests/models/qwen3-moe-fused-bf16", FM_PRESET_FP8, NULL},
        {"tests/models/qwen3-moe-tied-f32", FM_PRESET_REF, NULL},
        {"tests/models/mixtral-f32-sharded", FM_PRESET_REF, NULL},
        {"tests/models/mixtral-f32-sharded", FM_PRESET_FP8, "cuda"},
        {"tests/data/quant/gptq-v1-asym-actorder", FM_PRESET_INT4, NULL},    /* int4-zp: codes, zeros, perm */
        {"tests/data/quant/gptq-v2-asym-channel-k128", FM_PRESET_FP8, NULL}, /* int4-zp-tc */
        {"tests/data/quant/fp8-block-b128", FM_PRESET_FP8, NULL},            /* e4m3-block */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_model(&cases[i], FM_EXPERT_LRU);
    check_model(&cases[0], FM_EXPERT_LFU);
    check_model(&cases[3], FM_EXPERT_LFU);
}

/* The expert prefetch (route expert.prefetch=on or N: steps of <= 8 rows): 24 decode steps through a cache
   of 24 slots (LFU) with and without it give the same logits bit for bit; with it, every decode step prefetched each
   MoE layer, and the layers' own fetches missed fewer experts (tiny-code-moe, fp8 as the GPU runs it) */
static void prefetch_case(const char *route) {
    enum { N = 32, P = 8 };
    const model_case mc = {"models/tiny-code-moe", FM_PRESET_FP8, "cuda"};
    fm_model *pre = load_routes(&mc, FM_EXPERTS_HOST, 24, FM_EXPERT_LFU, route);
    fm_model *off = load(&mc, FM_EXPERTS_HOST, 24, FM_EXPERT_LFU);
    const int32_t V = fm_model_vocab_size(pre);
    int32_t ids[N];
    uint32_t seed = 5;
    for (int i = 0; i < N; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    float *a = malloc((size_t)2 * N * V * sizeof *a), *b = malloc((size_t)2 * N * V * sizeof *b);
    kv_prefill_and_steps(pre, ids, N, P, a);
    kv_prefill_and_steps(off, ids, N, P, b);
    expect_same(a, b, (int64_t)2 * N * V, "prefetch on vs off (prefill 32; prefill 8, 24 decode steps)", &mc);
    fm_expert_stats sp, so;
    assert_true(fm_context_expert_stats(pre->context, &sp));
    assert_true(fm_context_expert_stats(off->context, &so));
    int32_t moe = 0;
    for (int l = 0; l < pre->n_layers; l++) moe += pre->layers[l].is_moe;
    printf("  %s: %lld own misses, %lld experts prefetched in %lld layer passes; off: %lld own misses\n", route,
           (long long)sp.misses, (long long)sp.prefetch_copies, (long long)sp.prefetches, (long long)so.misses);
    assert_int_equal(sp.prefetches, (int64_t)moe * (N - P + 1)); /* the decode steps and the 8-token prefill */
    assert_int_equal(so.prefetches, 0);
    assert_int_equal(sp.fetches, so.fetches);
    assert_int_equal(sp.bytes_prefetched, (uint64_t)sp.prefetch_copies * sp.slot_bytes);
    assert_true(sp.prefetch_copies > 0);
    assert_true(sp.misses < so.misses);
    free(a), free(b);
    fm_model_free(pre);
    fm_model_free(off);
}

/* every predicted expert of each token (on), and the top 2 of its top-4 */
static void prefetch_keeps_logits(void **s) {
    (void)s;
    prefetch_case("expert.prefetch=on");
    prefetch_case("expert.prefetch=2");
}

/* greedy generation (fm_context_generate) and the scheduler (what serve runs) with host experts: the same tokens as
   device experts; the scheduler's stats carry the cache's counters (serve's /metrics prints them) */
static void on_event(void *user, const fm_sched_event *ev) {
    int32_t *n = user;
    if (ev->id >= 0 && n[0] < 32) n[1 + n[0]++] = ev->id;
}

static void generation_and_scheduler(void **s) {
    (void)s;
    enum { NEW = 16, P = 9 };
    const model_case mc = {"models/tiny-code-moe", FM_PRESET_FP8, "cuda"};
    fm_model *dev = load(&mc, FM_EXPERTS_DEVICE, 0, FM_EXPERT_LRU);
    fm_model *host = load(&mc, FM_EXPERTS_HOST, 16, FM_EXPERT_LFU);
    int32_t prompt[P];
    for (int i = 0; i < P; i++) prompt[i] = 100 + 37 * i;
    const int32_t *pp = prompt;
    const int64_t np = P;
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = NEW, gp.ignore_eos = true;
    fm_gen_output a, b;
    fm_error err = {{0}};
    assert_int_equal(fm_context_generate(dev->context, &pp, &np, &gp, 1, 0, NULL, NULL, &a, NULL, &err), FM_OK);
    assert_int_equal(fm_context_generate(host->context, &pp, &np, &gp, 1, 0, NULL, NULL, &b, NULL, &err), FM_OK);
    assert_int_equal(a.n, NEW);
    assert_int_equal(b.n, NEW);
    assert_memory_equal(a.ids, b.ids, NEW * sizeof *a.ids);
    assert_memory_equal(a.logprobs, b.logprobs, NEW * sizeof *a.logprobs);
    fm_sched *sc;
    assert_int_equal(fm_sched_create(host->context, 4, &sc, &err), FM_OK);
    fm_sched_request q;
    fm_sched_request_init(&q);
    int32_t got[1 + 32] = {0};
    q.prompt = prompt, q.n_prompt = P, q.params.max_tokens = NEW, q.params.ignore_eos = true;
    q.on_event = on_event, q.user = got;
    int64_t id;
    assert_int_equal(fm_sched_submit(sc, &q, &id, &err), FM_OK);
    for (bool busy = true; busy;) assert_int_equal(fm_sched_step(sc, &busy, &err), FM_OK);
    assert_int_equal(got[0], NEW);
    assert_memory_equal(got + 1, a.ids, NEW * sizeof *a.ids);
    fm_sched_stats st;
    fm_sched_get_stats(sc, &st);
    fm_expert_stats es;
    assert_true(fm_context_expert_stats(host->context, &es));
    assert_true(st.experts_host);
    assert_int_equal(st.expert_slots, 16);
    assert_int_equal(st.expert_hits, es.hits);
    assert_int_equal(st.expert_misses, es.misses);
    assert_true(st.expert_hits > 0 && st.expert_misses > 0);
    fm_sched_free(sc);
    free(a.ids), free(a.logprobs), free(b.ids), free(b.logprobs);
    fm_model_free(host);
    fm_model_free(dev);
}

/* ---- memory plan ---------------------------------------------------------------------------------------------- */

static void plan_places_experts(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    assert_int_equal(fm_config_load("models/tiny-code-moe", &cfg, &err), FM_OK);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cpu", &plan);
    fm_memory_plan dev, p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cpu", 0, 64, &dev, &err), FM_OK);
    /* cpu, f32: a slot is gate|up [256, 192] + down [192, 128] fp32 = (49152 + 24576) x 4 bytes */
    assert_int_equal(dev.expert_slot_bytes, 294912);
    assert_int_equal(dev.n_moe_layers, 4);
    assert_int_equal(dev.n_experts, 16);
    assert_int_equal(dev.weights[FM_MEM_EXPERTS], 64 * dev.expert_slot_bytes);
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_HOST, 20, 0, NULL, &err), FM_OK);
    assert_int_equal(p.experts_in, FM_EXPERTS_HOST);
    assert_int_equal(p.expert_slots, 20);
    assert_int_equal(p.host_experts, dev.weights[FM_MEM_EXPERTS]);
    assert_int_equal(p.weights[FM_MEM_EXPERTS], 0);
    assert_int_equal(p.weight_total, dev.weight_total - p.host_experts);
    /* + slot ids: 64 tokens x top-4; + the prefetch's buffers for 8 rows: h 8 x 192 and logits 8 x 16 fp32, ids and
       weights 8 x 4 (each part padded to 256 bytes) */
    assert_int_equal(p.expert_pool, 20 * p.expert_slot_bytes + 64 * 4 * 4 + 6144 + 512 + 256 + 256);
    assert_int_equal(p.total, dev.total - p.host_experts + p.expert_pool);
    /* no slot count and no limit: every expert; more than every expert: every expert */
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_HOST, 0, 0, NULL, &err), FM_OK);
    assert_int_equal(p.expert_slots, 64);
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_HOST, 1000, 0, NULL, &err), FM_OK);
    assert_int_equal(p.expert_slots, 64);
    /* auto: device when it fits (or no limit), host when not */
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_AUTO, 0, 0, NULL, &err), FM_OK);
    assert_int_equal(p.experts_in, FM_EXPERTS_DEVICE);
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_AUTO, 0, dev.peak, "--vram-limit", &err), FM_OK);
    assert_int_equal(p.experts_in, FM_EXPERTS_DEVICE);
    /* a limit 30 slots above the rest: 30 slots */
    const size_t rest = dev.peak - dev.weights[FM_MEM_EXPERTS] + 64 * 4 * 4 + 6144 + 512 + 256 + 256;
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_AUTO, 0, rest + 30 * dev.expert_slot_bytes + 7,
                                                  "--vram-limit", &err),
                     FM_OK);
    assert_int_equal(p.experts_in, FM_EXPERTS_HOST);
    assert_int_equal(p.expert_slots, 30);
    assert_true(p.peak <= rest + 30 * dev.expert_slot_bytes + 7);
    /* 15 slots' room: refused with the numbers */
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_AUTO, 0, rest + 15 * dev.expert_slot_bytes + 7,
                                                  "--vram-limit", &err),
                     FM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "the expert cache needs at least 16 slots"));
    assert_non_null(strstr(err.msg, "of 288.0 KiB each = 4.5 MiB"));
    assert_non_null(strstr(err.msg, "(--vram-limit) leaves 4.2 MiB after the rest"));
    assert_non_null(strstr(err.msg, "that fits 15 slots"));
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_HOST, 15, 0, NULL, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--expert-slots 15 is fewer than one layer's 16 experts"));
    /* the check names the cache */
    p = dev;
    assert_int_equal(fm_memory_plan_place_experts(&p, &cfg, FM_EXPERTS_HOST, 16, 0, NULL, &err), FM_OK);
    assert_int_equal(fm_memory_plan_check(&p, p.peak - 1, "--vram-limit", &err), FM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "expert cache 4.5 MiB (16 slots, --expert-slots)"));
}

/* the load: S < E refused before anything is allocated; --expert-slots without host; cuda refuses host by name */
static void load_refusals(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    fm_error err = {{0}};
    opt.experts_in = FM_EXPERTS_HOST, opt.expert_slots = 8;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
    assert_non_null(strstr(err.msg, "--expert-slots 8 is fewer than one layer's 16 experts"));
    opt.experts_in = FM_EXPERTS_DEVICE, opt.expert_slots = 16;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--expert-slots sizes the expert cache of --experts-in host"));
    /* cuda keeps int4-tc experts in host memory (the fp8 and fp4 presets): refused before the GPU is asked */
    opt.experts_in = FM_EXPERTS_HOST, opt.expert_slots = 0, opt.backend = "cuda", opt.preset = FM_PRESET_INT4;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--experts-in host: the cuda backend keeps experts in host memory for the fp8 "
                                    "and fp4 presets (int4-g128-tc experts); preset int4 has int4-g128 experts"));
    opt.preset = FM_PRESET_FP8;
    /* cpu, auto: device (no limit there) */
    opt.experts_in = FM_EXPERTS_AUTO, opt.backend = "cpu";
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_OK);
    assert_false(m->experts_host);
    fm_model_free(m);
}

/* ---- synthetic routing ---------------------------------------------------------------------------------------- */

/* The measured frequency of each expert of layer `layer` of toy-moe over T random tokens (its router's ids) against
 * fm_synthetic_routing_targets: the total variation distance between the two distributions (each / top-k). */
static double routing_distance(const char *routing, int32_t layer, double *hot_measured, double *hot_target,
                               double *tv_uniform) {
    enum { T = 2048 };
    fm_options opt;
    fm_options_init(&opt);
    opt.max_tokens = T, opt.synthetic_routing = routing;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load_synthetic("toy-moe", layer + 1, &opt, &m, &err)) fail_msg("load: %s", err.msg);
    const int32_t E = m->cfg.n_experts, k = m->cfg.n_experts_per_tok, V = fm_model_vocab_size(m);
    int32_t *ids = malloc(T * sizeof *ids), *eids = malloc((size_t)T * k * sizeof *eids);
    float *logits = malloc((size_t)V * sizeof *logits);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < T; t++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, ids[t] = (int32_t)(x % (uint64_t)V);
    assert_int_equal(fm_forward(m->context, ids, T, true, logits, NULL, &err), FM_OK);
    /* the forward buffers hold the last layer's routing: layer `layer` */
    m->be->ops->download_raw(m->be, ((void **)m->context->bufs)[9], (size_t)T * k * sizeof *eids, eids);
    double got[64] = {0}, want[64];
    for (int i = 0; i < T * k; i++) got[eids[i]] += 1.0 / T;
    assert_int_equal(fm_synthetic_routing_targets("toy-moe", routing, layer, want, &err), FM_OK);
    double tv = 0, sum_w = 0;
    int32_t hot = 0;
    *tv_uniform = 0;
    for (int32_t e = 0; e < E; e++) {
        tv += 0.5 * fabs(got[e] - want[e]) / k, sum_w += want[e];
        *tv_uniform += 0.5 * fabs(got[e] - (double)k / E) / k;
        if (want[e] > want[hot]) hot = e;
    }
    assert_true(fabs(sum_w - k) < 1e-9);
    *hot_measured = got[hot], *hot_target = want[hot];
    free(ids), free(eids), free(logits);
    fm_model_free(m);
    return tv;
}

/* Random router rows are not exactly uniform (toy-moe's 64-wide hidden states are not isotropic: a total variation
 * of ~0.1 from k/E); the skew is "roughly": layer 0 within 0.15 of its targets, its hottest expert within 0.05 of
 * its target (0.45: the cap), and at least twice as far from uniform as from the targets; layer 1, whose hidden
 * states are further from the calibration's model (one outlier channel of 64 dominates), closer to the targets than
 * to uniform and its hottest expert at least 1.3 x k/E. Measured when written: uniform 0.106; zipf:1.2 layer 0: 0.085
 * from the targets (0.281 from uniform), hottest 0.437; layer 1: 0.164 (0.222), hottest 0.356. */
static void synthetic_routing_skew(void **s) {
    (void)s;
    double hm, ht, tu;
    const double uni = routing_distance(NULL, 0, &hm, &ht, &tu);
    print_message("uniform: total variation %.3f from k/E each\n", uni);
    assert_true(uni < 0.2);
    for (int layer = 0; layer < 2; layer++) {
        const double z = routing_distance("zipf:1.2", layer, &hm, &ht, &tu);
        print_message("zipf:1.2 layer %d: total variation %.3f from the targets (%.3f from uniform), hottest expert "
                      "%.3f (target %.3f)\n",
                      layer, z, tu, hm, ht);
        if (layer == 0) {
            assert_true(z < 0.15);
            assert_true(tu > 2 * z);
            assert_true(fabs(hm - ht) < 0.05);
        } else {
            assert_true(z < tu);
            assert_true(hm > 1.3 * 2 / 8);
        }
    }
    fm_error err = {{0}};
    double zs = 0;
    assert_int_equal(fm_synthetic_routing_parse("zipf:0", &zs, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--synthetic-routing must be uniform or zipf:S"));
    assert_int_equal(fm_synthetic_routing_parse("zipf:1.5", &zs, &err), FM_OK);
    assert_true(zs == 1.5);
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --synthetic-routing zipf"), 2);
    assert_non_null(strstr(cli_err, "--synthetic-routing must be uniform or zipf:S"));
}

/* ---- command line --------------------------------------------------------------------------------------------- */

static void expect_exit(int code, int want, const char *needle) {
    if (code != want || !strstr(cli_err, needle))
        fail_msg("exit %d (want %d); stderr should name '%s': %s", code, want, needle, cli_err);
}

static void cli_flags(void **s) {
    (void)s;
    const char *ppl = "perplexity --model models/tiny-code-moe --ids models/tiny-code-moe/eval_ids.i32 --window 64 "
                      "--windows 2";
    assert_int_equal(fp8moe("%s", ppl), 0);
    const char *last = strstr(cli_out, "perplexity = ");
    assert_non_null(last);
    char want[64];
    snprintf(want, sizeof want, "%.20s", last);
    assert_null(strstr(cli_out, "expert cache:"));
    assert_int_equal(fp8moe("%s --experts-in host --expert-slots 16 --expert-policy lfu", ppl), 0);
    assert_non_null(strstr(cli_out, want)); /* the same perplexity */
    assert_non_null(strstr(cli_out, "expert cache: 16 slots of 64 experts (288.0 KiB each), 8 layer passes"));
    expect_exit(fp8moe("%s --experts-in sideways", ppl), 2, "--experts-in must be host, device or auto");
    expect_exit(fp8moe("%s --experts-in host --expert-slots 0", ppl), 2, "--expert-slots expects an integer");
    expect_exit(fp8moe("%s --experts-in host --expert-policy mru", ppl), 2, "--expert-policy must be lru or lfu");
    expect_exit(fp8moe("%s --experts-in host --expert-slots 4", ppl), 2,
                "--expert-slots 4 is fewer than one layer's 16 experts");
    expect_exit(fp8moe("%s --backend cuda --experts-in host --preset ref", ppl), 1,
                "--experts-in host: the cuda backend keeps experts in host memory for the fp8 and fp4 presets");
    assert_int_equal(fp8moe("perplexity --help"), 0);
    assert_non_null(strstr(cli_out, "--experts-in W"));
    assert_non_null(strstr(cli_out, "--expert-slots N"));
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --tokens 64 --experts-in host --expert-slots 20"), 0);
    assert_non_null(strstr(cli_out,
                           "experts-in: host, 20 slots of 288.0 KiB (64 experts in 4 layers), 18.0 MiB in host "
                           "memory"));
    assert_non_null(strstr(cli_out, "expert cache (20 slots, in the peak)"));
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --tokens 64"), 0);
    assert_non_null(strstr(cli_out, "experts-in: device\n"));
    expect_exit(fp8moe("inspect --model models/tiny-code-moe --experts-in host"), 2, "needs --tokens T");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(residency_by_hand),      cmocka_unit_test(residency_limits),
        cmocka_unit_test(plan_places_experts),    cmocka_unit_test(load_refusals),
        cmocka_unit_test(logits_bit_identical),   cmocka_unit_test(cli_flags),
        cmocka_unit_test(synthetic_routing_skew), cmocka_unit_test(generation_and_scheduler),
        cmocka_unit_test(prefetch_keeps_logits),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
