/* The prefix cache of a hybrid model (Qwen3-Next: src/engine/state_cache.c) through the scheduler on the CPU backend:
 * the same requests with the cache off and on give the same ids and log-probabilities (chosen id and top 5, bit for
 * bit when every prompt runs in the same 16-token chunks both ways: each chunk's Gated DeltaNet rule runs chunked
 * from the same state; to rounding, 1e-4, where the cache restores a state that decode steps built token by token
 * and the uncached run builds in prompt chunks: the next turn of a conversation), and with the cache on
 *   (a) the same prompt again starts at the snapshot of its last block boundary;
 *   (b) the next turn of a conversation starts at the last boundary the first turn decoded past;
 *   (c) prompts sharing a system prompt: the second computes it again (no snapshot at its end yet) and takes one
 *       there; the third starts from it;
 *   (d) a pool of one slot keeps the latest snapshot only, and a snapshot whose KV block was evicted is never used;
 * the KV pool's and the snapshot pool's invariants hold after every step, and the counters agree. A whole prompt in
 * one step (the chunked rule, on tensor cores on the GPU) against its two pieces split at the snapshot (the chunked
 * rule, then the token-by-token one) agrees to rounding: same ids, log-probabilities within 1e-4. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "engine/state_cache.h"
#include "fp8moe_sched.h"
#include "sched_recorder.h"
#include "serve/serve_internal.h"

enum { NEW = 10, TOP = 5, MAX_PROMPT = 120 };

static void prompt_ids(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

static fm_model *load(int32_t slots, int32_t max_seqs, int64_t ctx) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = max_seqs, opt.ctx = ctx, opt.max_tokens = ctx < 128 ? ctx : 128, opt.state_cache_slots = slots;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err)) fail_msg("load: %s", err.msg);
    assert_true(m->context->kv->pool.prefix_cache);
    assert_non_null(m->context->kv->snaps);
    assert_int_equal(m->context->kv->snaps->n_slots, slots < 0 ? 2 * max_seqs : slots);
    return m;
}

static void check_pools(const fm_model *m) {
    char msg[256];
    if (!fm_kv_pool_check(&m->context->kv->pool, msg, sizeof msg)) fail_msg("KV pool: %s", msg);
    if (!fm_state_cache_check(m->context, msg, sizeof msg)) fail_msg("state snapshots: %s", msg);
}

/* One request after another (each to its end), every step followed by the invariant checks. */
typedef struct work {
    const int32_t *ids;
    int64_t n;
} work;

static void run_jobs(fm_model *m, int64_t chunk, const work *jobs, int32_t n_jobs, sched_rec *r, fm_sched_stats *st) {
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, chunk, &s, &err)) fail_msg("%s", err.msg);
    for (int32_t j = 0; j < n_jobs; j++) {
        assert_int_equal(sched_rec_submit_prompt(s, r, jobs[j].ids, jobs[j].n), j);
        bool busy = true;
        for (int guard = 0; guard < 10000 && busy; guard++) {
            busy = sched_rec_step(s, r);
            check_pools(m);
        }
        assert_true(r->finals[j]);
    }
    fm_sched_get_stats(s, st);
    assert_int_equal(st->kv_blocks_used, 0);
    fm_sched_free(s);
}

/* The jobs with the cache off, then on (the same model): ids and log-probabilities, exactly or within tol. */
static void off_and_on(fm_model *m, int64_t chunk, const work *jobs, int32_t n_jobs, double tol, sched_rec *on,
                       fm_sched_stats *st) {
    sched_rec *off = sched_rec_new(NEW, TOP);
    fm_sched_stats st_off;
    m->context->kv->pool.prefix_cache = false;
    run_jobs(m, chunk, jobs, n_jobs, off, &st_off);
    m->context->kv->pool.prefix_cache = true;
    run_jobs(m, chunk, jobs, n_jobs, on, st);
    for (int32_t q = 0; q < n_jobs; q++) {
        assert_int_equal(off->n_cached[q], 0);
        assert_int_equal(off->n[q], NEW);
        assert_int_equal(on->n[q], NEW);
        for (int i = 0; i < NEW; i++) {
            const double d = fabs((double)off->info[q][i].logprob - (double)on->info[q][i].logprob);
            if (off->ids[q][i] != on->ids[q][i] || d > tol)
                fail_msg("request %d token %d: id %d (logprob %.9g) without the cache, %d (%.9g) with it", q, i,
                         off->ids[q][i], (double)off->info[q][i].logprob, on->ids[q][i],
                         (double)on->info[q][i].logprob);
            for (int k = 0; k < TOP; k++)
                if (off->info[q][i].top[k].id != on->info[q][i].top[k].id ||
                    fabs((double)off->info[q][i].top[k].logprob - (double)on->info[q][i].top[k].logprob) > tol)
                    fail_msg(
                        "request %d (%lld cached) token %d top %d: id %d (%.9g) without the cache, %d (%.9g) with it",
                        q, (long long)on->n_cached[q], i, k, off->info[q][i].top[k].id,
                        (double)off->info[q][i].top[k].logprob, on->info[q][i].top[k].id,
                        (double)on->info[q][i].top[k].logprob);
        }
    }
    free(off);
}

/* (a) the same prompt twice; (b) the next turn of the conversation, and the turn after it */
static void same_prompt_and_turns(int64_t chunk, double tol) {
    fm_model *m = load(-1, 2, 128);
    const int32_t V = fm_model_vocab_size(m);
    enum { P = 40 };
    int32_t p[P], turn2[MAX_PROMPT], turn3[MAX_PROMPT];
    prompt_ids(p, P, V, 11);
    /* the answers are the model's own (greedy, the same with the cache off): known after a first run */
    m->context->kv->pool.prefix_cache = false;
    sched_rec *first = sched_rec_new(NEW, TOP);
    fm_sched_stats st;
    const work one[] = {{p, P}};
    run_jobs(m, chunk, one, 1, first, &st);
    const int64_t n2 = P + NEW + 7, n3 = n2 + NEW + 5;
    memcpy(turn2, p, sizeof p);
    memcpy(turn2 + P, first->ids[0], NEW * sizeof *turn2);
    prompt_ids(turn2 + P + NEW, 7, V, 12);
    sched_rec *pre = sched_rec_new(NEW, TOP); /* turn 2's answer, for turn 3 */
    const work two[] = {{turn2, n2}};
    run_jobs(m, chunk, two, 1, pre, &st);
    memcpy(turn3, turn2, (size_t)n2 * sizeof *turn3);
    memcpy(turn3 + n2, pre->ids[0], NEW * sizeof *turn3);
    prompt_ids(turn3 + n2 + NEW, 5, V, 13);
    sched_rec *on = sched_rec_new(NEW, TOP);
    const work jobs[] = {{p, P}, {p, P}, {turn2, n2}, {turn3, n3}};
    off_and_on(m, chunk, jobs, 4, tol, on, &st);
    assert_int_equal(on->n_cached[0], 0);
    assert_int_equal(on->n_cached[1], 32);                      /* the prompt's last boundary */
    assert_int_equal(on->n_cached[2], (P + NEW - 1) / 16 * 16); /* the boundary the first turn decoded past */
    assert_int_equal(on->n_cached[3], (n2 + NEW - 1) / 16 * 16);
    assert_int_equal(st.prefix_hits, 3);
    assert_int_equal(st.prefix_cached_tokens, on->n_cached[1] + on->n_cached[2] + on->n_cached[3]);
    assert_true(st.state_snapshots > 0 && st.state_snapshots <= 4);
    assert_int_equal(st.state_restores, 3);
    free(first), free(pre), free(on);
    fm_model_free(m);
}

static void test_same_prompt_and_turns(void **state) {
    (void)state;
    same_prompt_and_turns(16, 1e-4); /* the next turns start from states the decode steps left (token by token) */
}

/* whole prompts in one step: the first piece of a split prompt runs as the fresh prefill the whole prompt did */
static void test_whole_prompts(void **state) {
    (void)state;
    same_prompt_and_turns(0, 1e-4);
}

/* (c) three prompts sharing a 48-token system prompt, each with its own 21-token question */
static void test_shared_system_prompt(void **state) {
    (void)state;
    fm_model *m = load(-1, 2, 128);
    const int32_t V = fm_model_vocab_size(m);
    enum { S = 48, Q = 21 };
    int32_t p[3][S + Q];
    for (int i = 0; i < 3; i++) prompt_ids(p[i], S, V, 21), prompt_ids(p[i] + S, Q, V, 22 + (uint32_t)i);
    sched_rec *on = sched_rec_new(NEW, TOP);
    fm_sched_stats st;
    const work jobs[] = {{p[0], S + Q}, {p[1], S + Q}, {p[2], S + Q}, {p[0], S + Q}};
    off_and_on(m, 16, jobs, 4, 0.0, on, &st);
    assert_int_equal(on->n_cached[0], 0);
    assert_int_equal(on->n_cached[1], 0);  /* the system prompt's blocks are cached, but no state after them */
    assert_int_equal(on->n_cached[2], S);  /* the snapshot the second took where its cached prefix ended */
    assert_int_equal(on->n_cached[3], 64); /* the first one's own prompt boundary */
    /* the counters, and the server's /metrics lines of them */
    assert_int_equal(st.state_slots, 4);
    assert_int_equal(st.state_restores, 2);
    assert_int_equal(st.state_saves, 4); /* p0's, p1's and p2's prompt ends, and the system prompt's end */
    assert_int_equal(st.state_snapshots, 4);
    assert_int_equal(st.state_evictions, 0);
    metrics mt = {0};
    sbuf o = {0};
    metrics_write(&o, &mt, &st, 0, false);
    assert_non_null(strstr(o.p, "\nfp8moe_state_snapshots 4\n"));
    assert_non_null(strstr(o.p, "\nfp8moe_state_snapshot_restores_total 2\n"));
    sb_free(&o);
    free(on);
    fm_model_free(m);
}

/* (d) one slot: each snapshot replaces the one before; a KV pool so small that a prompt evicts the blocks of the
 * previous one: the snapshot after them is never used again */
static void test_eviction(void **state) {
    (void)state;
    fm_model *m = load(1, 1, 128);
    const int32_t V = fm_model_vocab_size(m);
    enum { P = 36 }; /* its answer never reaches the next boundary: one snapshot a request */
    int32_t x[P], y[P];
    prompt_ids(x, P, V, 31), prompt_ids(y, P, V, 32);
    sched_rec *on = sched_rec_new(NEW, TOP);
    fm_sched_stats st;
    const work jobs[] = {{x, P}, {y, P}, {x, P}, {x, P}, {y, P}};
    off_and_on(m, 16, jobs, 5, 0.0, on, &st);
    assert_int_equal(on->n_cached[0], 0);
    assert_int_equal(on->n_cached[1], 0);
    assert_int_equal(on->n_cached[2], 0);  /* y's snapshot took the slot: x's blocks are cached, its state is not */
    assert_int_equal(on->n_cached[3], 32); /* x took it back (where its cached prefix ended) */
    assert_int_equal(on->n_cached[4], 0);
    assert_true(st.state_evictions >= 3);
    assert_int_equal(st.state_snapshots, 1);
    fm_model_free(m);

    /* 8 blocks of KV (one sequence of 128 tokens): x and y leave 2 named blocks each, z needs 5: x's second block,
       whose end x's snapshot names, is evicted first */
    m = load(4, 1, 128);
    int32_t z[60];
    prompt_ids(z, 60, V, 33);
    free(on), on = sched_rec_new(NEW, TOP);
    const work jobs2[] = {{x, P}, {y, P}, {z, 60}, {x, P}};
    off_and_on(m, 16, jobs2, 4, 0.0, on, &st);
    assert_true(st.kv_evictions > 0);
    assert_int_equal(on->n_cached[3], 0);
    free(on);
    fm_model_free(m);
}

/* Many requests at once, two sequences at a time in mixed steps, prompts of a few shared beginnings (two system
 * prompts, and repeats) with random tails, pools small enough that KV blocks and snapshots are evicted: the same ids
 * and log-probabilities as without the cache, the invariants after every step. */
enum { RAND_REQ = 24, RAND_NEW = 6 };

static void run_random(fm_model *m, int32_t (*prompts)[MAX_PROMPT], const int64_t *lens, sched_rec *r,
                       fm_sched_stats *st) {
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, 16, &s, &err)) fail_msg("%s", err.msg);
    for (int32_t j = 0; j < RAND_REQ; j++) sched_rec_submit_prompt(s, r, prompts[j], lens[j]);
    bool busy = true;
    for (int guard = 0; guard < 100000 && busy; guard++) {
        busy = sched_rec_step(s, r);
        check_pools(m);
    }
    for (int32_t j = 0; j < RAND_REQ; j++) assert_int_equal(r->finals[j], 1);
    fm_sched_get_stats(s, st);
    fm_sched_free(s);
}

static void test_random_requests(void **state) {
    (void)state;
    fm_model *m = load(3, 2, 112); /* 14 KV blocks, 3 snapshots */
    const int32_t V = fm_model_vocab_size(m);
    int32_t(*prompts)[MAX_PROMPT] = calloc(RAND_REQ, sizeof *prompts);
    int64_t lens[RAND_REQ];
    uint32_t seed = 77;
    for (int32_t j = 0; j < RAND_REQ; j++) {
        seed = seed * 1664525u + 1013904223u;
        const uint32_t kind = (seed >> 8) % 4, tail = 1 + (seed >> 12) % 40;
        if (kind == 3 && j > 0) { /* an earlier prompt again */
            const int32_t k = (int32_t)((seed >> 16) % (uint32_t)j);
            memcpy(prompts[j], prompts[k], sizeof prompts[j]), lens[j] = lens[k];
            continue;
        }
        const int64_t head = kind == 0 ? 0 : kind == 1 ? 33 : 50; /* no, or one of two system prompts */
        prompt_ids(prompts[j], head, V, 100 + kind);
        prompt_ids(prompts[j] + head, tail, V, seed);
        lens[j] = head + tail;
    }
    sched_rec *off = sched_rec_new(RAND_NEW, 0), *on = sched_rec_new(RAND_NEW, 0);
    fm_sched_stats st;
    m->context->kv->pool.prefix_cache = false;
    run_random(m, prompts, lens, off, &st);
    m->context->kv->pool.prefix_cache = true;
    run_random(m, prompts, lens, on, &st);
    int64_t cached = 0;
    for (int32_t q = 0; q < RAND_REQ; q++) {
        assert_int_equal(on->n[q], RAND_NEW);
        for (int i = 0; i < RAND_NEW; i++)
            if (off->ids[q][i] != on->ids[q][i] || off->info[q][i].logprob != on->info[q][i].logprob)
                fail_msg("request %d (%lld cached) token %d: id %d (%.9g) without the cache, %d (%.9g) with it", q,
                         (long long)on->n_cached[q], i, off->ids[q][i], (double)off->info[q][i].logprob, on->ids[q][i],
                         (double)on->info[q][i].logprob);
        assert_true(on->n_cached[q] % 16 == 0 && on->n_cached[q] < lens[q]);
        cached += on->n_cached[q];
    }
    assert_int_equal(st.prefix_cached_tokens, cached);
    assert_true(st.state_restores > 0 && st.state_evictions > 0 && st.kv_evictions > 0);
    printf("  %lld prompt tokens mapped of %lld, %lld restores, %lld snapshot and %lld block evictions\n",
           (long long)cached, (long long)st.prefix_prompt_tokens, (long long)st.state_restores,
           (long long)st.state_evictions, (long long)st.kv_evictions);
    free(off), free(on), free(prompts);
    fm_model_free(m);
}

/* --state-cache-slots 0 keeps the prefix cache off for a hybrid model; a negative count is refused by name */
static void test_slots_option(void **state) {
    (void)state;
    fm_options opt;
    fm_options_init(&opt);
    assert_int_equal(opt.state_cache_slots, -1);
    opt.max_seqs = 1, opt.ctx = 64, opt.max_tokens = 32, opt.state_cache_slots = 0;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err)) fail_msg("%s", err.msg);
    assert_false(m->context->kv->pool.prefix_cache);
    assert_null(m->context->kv->snaps);
    fm_model_free(m);
    opt.state_cache_slots = -2;
    assert_int_equal(fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--state-cache-slots"));
    /* a model without Gated DeltaNet layers takes none */
    opt.state_cache_slots = 5;
    if (fm_model_load("tests/models/qwen3-moe-f32", &opt, &m, &err)) fail_msg("%s", err.msg);
    assert_true(m->context->kv->pool.prefix_cache);
    assert_null(m->context->kv->snaps);
    fm_model_free(m);
    /* the memory plan counts the snapshots with the decode state */
    fm_memory_estimate e0, e1;
    opt.state_cache_slots = 0;
    if (fm_memory_estimate_compute("tests/models/qwen3-next-f32", &opt, &e0, &err)) fail_msg("%s", err.msg);
    opt.state_cache_slots = 3;
    if (fm_memory_estimate_compute("tests/models/qwen3-next-f32", &opt, &e1, &err)) fail_msg("%s", err.msg);
    fm_model *probe = NULL;
    opt.state_cache_slots = 3;
    if (fm_model_load("tests/models/qwen3-next-f32", &opt, &probe, &err)) fail_msg("%s", err.msg);
    assert_int_equal(e1.total - e0.total, fm_state_cache_bytes(&probe->cfg, probe->n_layers, 3));
    fm_model_free(probe);
    /* the default --max-seqs on a GPU counts two snapshots per sequence: fewer sequences fit than without them */
    fm_options fit = opt;
    fit.max_seqs = 0, fit.ctx = 0, fit.max_tokens = 64, fit.state_cache_slots = 0;
    if (fm_memory_estimate_compute("tests/models/qwen3-next-f32", &fit, &e0, &err)) fail_msg("%s", err.msg);
    int32_t seqs0 = 0, seqs1 = 0;
    int64_t ctx0 = 64, ctx1 = 64;
    const size_t budget = e0.peak + ((size_t)256 << 20); /* the cuda plan adds its libraries' workspaces */
    if (fm_memory_fit_generation("tests/models/qwen3-next-f32", &fit, 64, budget, 1 << 20, &seqs0, &ctx0, &err))
        fail_msg("%s", err.msg);
    fit.state_cache_slots = -1;
    if (fm_memory_fit_generation("tests/models/qwen3-next-f32", &fit, 64, budget, 1 << 20, &seqs1, &ctx1, &err))
        fail_msg("%s", err.msg);
    printf("  %d sequences fit without snapshots, %d with two each\n", seqs0, seqs1);
    assert_true(seqs1 > 0 && seqs1 < seqs0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_prompt_and_turns), cmocka_unit_test(test_whole_prompts),
        cmocka_unit_test(test_shared_system_prompt),  cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_random_requests),       cmocka_unit_test(test_slots_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
