/* Automatic prefix caching through the scheduler (src/engine/scheduler.c + kv_prefix.c) on the CPU backend, for every
 * preset on the test models: the same requests run with the cache off and on give the same tokens and the same
 * log-probabilities (chosen id and top 5, bit for bit; a hybrid's to rounding, below), while with the cache on
 *   - a request whose prompt shares its first blocks with one still decoding maps them (n_cached = those tokens);
 *   - the next turn of a conversation (prompt, answer, new text) maps the blocks of the first turn's prompt and
 *     answer;
 *   - the same prompt again maps all of its full blocks but runs at least its last token;
 *   - the counters of fm_sched_stats agree, and every block is free (or cached) at the end.
 * A hybrid model (Qwen3-Next) maps a prefix only up to a block with a snapshot of its Gated DeltaNet states at its end
 * (src/engine/state_cache.c): b maps a's prompt blocks (a snapshot at a's last prompt boundary), the next turn a's
 * prompt and answer (the boundary a decoded past last), and d, whose cached block has no snapshot, computes it again
 * (and takes one there); its log-probabilities agree to 1e-4 (the states its turns start from were built token by
 * token by decode steps with the cache, by the chunked rule over prompt chunks without). tests/test_state_cache.c has
 * the rest. */
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

enum { NEW = 12, P1 = 40, P2 = 37, EXTRA = 9, TOP = 5 };

/* until request last has ended, then until the scheduler is idle */
static void run_all(fm_sched *s, sched_rec *r, int64_t last) {
    sched_rec_run_until(s, r, last);
    sched_rec_run_idle(s, r);
}

static void prompt_ids(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

static void check_pool(const fm_model *m) {
    char msg[256];
    if (!fm_kv_pool_check(&m->context->kv->pool, msg, sizeof msg)) fail_msg("KV pool: %s", msg);
    if (!fm_state_cache_check(m->context, msg, sizeof msg)) fail_msg("state snapshots: %s", msg);
}

/* The workload: a (P1 tokens); b (P2 tokens, the first 36 of a's) submitted while a decodes; then c, the next turn of
 * a's conversation; then a's prompt again. Returns the requests' ids in r (0..3). */
static void workload(fm_model *m, sched_rec *r, int32_t *turn2, int64_t *n2) {
    const int32_t V = fm_model_vocab_size(m);
    int32_t p1[P1], p2[P2];
    prompt_ids(p1, P1, V, 7);
    memcpy(p2, p1, 36 * sizeof *p2);
    prompt_ids(p2 + 36, P2 - 36, V, 8);
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, 16, &s, &err)) fail_msg("%s", err.msg); /* 16-token prefill chunks */
    const int64_t a = sched_rec_submit_prompt(s, r, p1, P1);
    while (r->n[a] < 3) sched_rec_step(s, r); /* a decodes */
    check_pool(m);
    const int64_t b = sched_rec_submit_prompt(s, r, p2, P2);
    while (r->n[b] < 1) sched_rec_step(s, r);
    assert_false(r->finals[a]); /* b started while a was still running */
    check_pool(m);
    run_all(s, r, b);
    memcpy(turn2, p1, sizeof p1);
    memcpy(turn2 + P1, r->ids[a], NEW * sizeof *turn2);
    prompt_ids(turn2 + P1 + NEW, EXTRA, V, 9);
    *n2 = P1 + NEW + EXTRA;
    const int64_t c = sched_rec_submit_prompt(s, r, turn2, *n2);
    run_all(s, r, c);
    const int64_t d = sched_rec_submit_prompt(s, r, p1, 32); /* two whole blocks: the second is computed again */
    run_all(s, r, d);
    assert_true(a == 0 && b == 1 && c == 2 && d == 3);
    check_pool(m);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    if (st.prefix_cache) {
        assert_int_equal(st.prefix_queries, 4);
        assert_int_equal(st.prefix_hits, (r->n_cached[1] > 0) + (r->n_cached[2] > 0) + (r->n_cached[3] > 0));
        assert_int_equal(st.prefix_prompt_tokens, P1 + P2 + *n2 + 32);
        assert_int_equal(st.prefix_cached_tokens, r->n_cached[1] + r->n_cached[2] + r->n_cached[3]);
        assert_true(st.kv_blocks_cached > 0);
    }
    fm_sched_free(s);
}

/* the same ids, log-probabilities within tol (0: bit for bit) */
static void same_output(const sched_rec *off, const sched_rec *on, int64_t q, double tol, const char *what) {
    assert_int_equal(off->n[q], NEW);
    assert_int_equal(on->n[q], NEW);
    for (int i = 0; i < NEW; i++) {
        if (off->ids[q][i] != on->ids[q][i] ||
            fabs((double)off->info[q][i].logprob - (double)on->info[q][i].logprob) > tol)
            fail_msg("%s request %lld token %d: id %d (logprob %.9g) without the cache, %d (%.9g) with it", what,
                     (long long)q, i, off->ids[q][i], (double)off->info[q][i].logprob, on->ids[q][i],
                     (double)on->info[q][i].logprob);
        assert_int_equal(off->info[q][i].n_top, TOP);
        for (int k = 0; k < TOP; k++) {
            assert_int_equal(off->info[q][i].top[k].id, on->info[q][i].top[k].id);
            assert_true(fabs((double)off->info[q][i].top[k].logprob - (double)on->info[q][i].top[k].logprob) <= tol);
        }
    }
}

static void run_model(const char *dir, fm_preset preset, bool hybrid) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset, opt.max_seqs = 2, opt.ctx = 128, opt.max_tokens = 64;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("%s (%s): %s", dir, fm_preset_name(preset), err.msg);
    assert_true(m->context->kv->pool.prefix_cache);
    assert_int_equal(m->context->kv->snaps != NULL, hybrid);
    sched_rec *off = sched_rec_new(NEW, TOP), *on = sched_rec_new(NEW, TOP);
    int32_t turn2[P1 + NEW + EXTRA];
    int64_t n2;
    char what[300];
    snprintf(what, sizeof what, "%s (%s)", dir, fm_preset_name(preset));
    m->context->kv->pool.prefix_cache = false;
    workload(m, off, turn2, &n2);
    m->context->kv->pool.prefix_cache = true;
    workload(m, on, turn2, &n2);
    /* a hybrid's next turn starts from the Gated DeltaNet states its answer's decode steps left (token by token),
       which the uncached run builds by prompt chunks (the chunked rule): the same to rounding */
    const double tol = hybrid ? 1e-4 : 0.0;
    for (int64_t q = 0; q < 4; q++) same_output(off, on, q, tol, what), assert_int_equal(off->n_cached[q], 0);
    assert_int_equal(on->n_cached[0], 0);
    assert_int_equal(on->n_cached[1], 32);                       /* from a, still decoding */
    assert_int_equal(on->n_cached[2], (P1 + NEW - 1) / 16 * 16); /* a's prompt and answer as written */
    /* the last token runs: one block computed; a hybrid model has no snapshot after d's first block */
    assert_int_equal(on->n_cached[3], hybrid ? 0 : 16);
    free(off), free(on);
    fm_model_free(m);
}

static const char *const k_models[] = {"tests/models/qwen3-moe-f32", "tests/models/qwen3-moe-bf16",
                                       "tests/models/mixtral-f32-sharded", "tests/models/qwen3-moe-tied-f32",
                                       "models/tiny-code-moe"};

static void test_every_preset(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_models / sizeof *k_models; i++)
        for (int p = 0; p < FM_PRESET_COUNT; p++) run_model(k_models[i], (fm_preset)p, false);
}

static void test_hybrid(void **state) {
    (void)state;
    for (int p = 0; p < FM_PRESET_COUNT; p++) run_model("tests/models/qwen3-next-f32", (fm_preset)p, true);
    run_model("tests/models/qwen3-next-bf16", FM_PRESET_REF, true);
}

/* --no-prefix-cache through the options: the pool never names a block */
static void test_option_off(void **state) {
    (void)state;
    fm_options opt;
    fm_options_init(&opt);
    assert_true(opt.prefix_cache); /* on by default */
    opt.max_seqs = 1, opt.ctx = 64, opt.max_tokens = 32, opt.prefix_cache = false;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load("tests/models/qwen3-moe-f32", &opt, &m, &err)) fail_msg("%s", err.msg);
    assert_false(m->context->kv->pool.prefix_cache);
    sched_rec *r = sched_rec_new(NEW, TOP);
    fm_sched *s;
    assert_int_equal(fm_sched_create(m->context, 0, &s, &err), FM_OK);
    int32_t p[40];
    prompt_ids(p, 40, fm_model_vocab_size(m), 5);
    run_all(s, r, sched_rec_submit_prompt(s, r, p, 40));
    run_all(s, r, sched_rec_submit_prompt(s, r, p, 40));
    assert_int_equal(r->n_cached[1], 0);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_false(st.prefix_cache);
    assert_int_equal(st.prefix_queries, 0);
    assert_int_equal(st.kv_blocks_cached, 0);
    fm_sched_free(s);
    free(r);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_preset),
        cmocka_unit_test(test_hybrid),
        cmocka_unit_test(test_option_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
