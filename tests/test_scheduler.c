/* The continuous-batching scheduler (include/fp8moe_sched.h) on the CPU backend:
 *   - requests that join a running batch (one submitted while another decodes, prompts prefilled in chunks between
 *     decode steps) give the same greedy tokens as each run alone;
 *   - a request cancelled mid-run ends with one cancelled event at the next step and its blocks return to the pool
 *     (the other request goes on to the same tokens; 0 blocks in use at the end);
 *   - a kept cache continued by a longer prompt gives the tokens of a fresh run of the whole prompt and prefills only
 *     the new suffix (n_cached = the common prefix; at least the last prompt token is run again for its logits);
 *   - a pool without room for a request's next block ends it with FM_SCHED_ERROR naming the full cache, its blocks
 *     freed, and the next request runs as if nothing happened;
 *   - every request gets its events in order (n_generated 1, 2, ...) and exactly one final event, the last;
 *   - n_logprobs: the top ids per token, descending, the chosen greedy id first. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "fp8moe_sched.h"
#include "sched_recorder.h"

static const char *k_model = "tests/models/qwen3-moe-f32";

/* the prefix cache off (unless k_prefix): these tests count the tokens each request prefills
   (tests/test_prefix_cache.c has it on) */
static bool k_prefix = false;
static fm_model *load(void) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = 4, opt.ctx = 64, opt.max_tokens = 32, opt.prefix_cache = k_prefix;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(k_model, &opt, &m, &err)) fail_msg("load: %s", err.msg);
    return m;
}

static void prompt_ids(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

/* a greedy request of max_tokens ids into r (a recorder of SCHED_REC_TOKENS ids a request), no log-probabilities */
static fm_sched_request greedy(const int32_t *prompt, int64_t n, int64_t max_tokens, sched_rec *r) {
    fm_sched_request q = sched_rec_request(r, prompt, n);
    q.params.max_tokens = max_tokens;
    return q;
}

static void step(fm_sched *s, sched_rec *r) { assert_true(sched_rec_step(s, r)); }

/* tokens whose top log-probabilities are as asked: the chosen (greedy) id first, descending */
static int32_t tops_ok(const sched_rec *r, int64_t q) {
    int32_t ok = 0;
    for (int64_t k = 0; k < r->n[q]; k++) {
        const fm_sample_info *info = &r->info[q][k];
        if (info->n_top < 1 || info->top[0].id != r->ids[q][k]) continue;
        bool desc = true;
        for (int32_t t = 1; t < info->n_top; t++) desc &= info->top[t].logprob <= info->top[t - 1].logprob;
        ok += desc;
    }
    return ok;
}

/* greedy tokens of one prompt alone */
static void alone(fm_model *m, const int32_t *prompt, int64_t n, int64_t max_tokens, int32_t *out) {
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = max_tokens, gp.ignore_eos = true;
    fm_gen_output o;
    fm_error err;
    if (fm_context_generate(m->context, &prompt, &n, &gp, 1, 0, NULL, NULL, &o, NULL, &err)) fail_msg("%s", err.msg);
    assert_int_equal(o.n, max_tokens);
    memcpy(out, o.ids, (size_t)max_tokens * sizeof *out);
    free(o.ids), free(o.logprobs);
}

/* (the recorder fails any event after the final one) */
static void expect_final(const sched_rec *r, int64_t q, fm_sched_end end) {
    assert_int_equal(r->finals[q], 1);
    assert_int_equal(r->end[q], end);
}

static void test_join_running_batch(void **state) {
    (void)state;
    enum { NEW = 12 };
    fm_model *m = load();
    const int32_t V = fm_model_vocab_size(m);
    const int64_t len[3] = {9, 17, 23};
    int32_t p[3][23], ref[3][NEW];
    for (int i = 0; i < 3; i++) prompt_ids(p[i], len[i], V, 11u + (uint32_t)i), alone(m, p[i], len[i], NEW, ref[i]);
    fm_sched *s;
    fm_error err;
    assert_int_equal(fm_sched_create(m->context, 5, &s, &err), FM_OK); /* 5-token prefill chunks */
    sched_rec *r = sched_rec_new(SCHED_REC_TOKENS, 0);
    fm_sched_request q0 = greedy(p[0], len[0], NEW, r), q1 = greedy(p[1], len[1], NEW, r);
    fm_sched_request q2 = greedy(p[2], len[2], NEW, r);
    q2.n_logprobs = 5;
    const int64_t a = sched_rec_submit(s, &q0);
    for (int i = 0; i < 4; i++) step(s, r); /* a: 2 prefill chunks, then decodes */
    assert_true(r->n[a] >= 2);
    const int64_t b = sched_rec_submit(s, &q1);
    const int64_t a_before = r->n[a];
    while (r->n[b] == 0) step(s, r);
    /* b's 4 prefill chunks alternated with decode steps of a */
    assert_true(r->n[a] - a_before >= 3);
    const int64_t c = sched_rec_submit(s, &q2);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(st.running, 2);
    sched_rec_run_idle(s, r);
    const int64_t ids[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        expect_final(r, ids[i], FM_SCHED_LENGTH);
        assert_int_equal(r->n[ids[i]], NEW);
        assert_int_equal(r->n_generated[ids[i]], NEW);
        assert_memory_equal(r->ids[ids[i]], ref[i], sizeof ref[i]);
    }
    assert_int_equal(tops_ok(r, c), NEW); /* greedy: the chosen id is the top one */
    assert_int_equal(tops_ok(r, a), 0);   /* no log-probabilities asked: n_top 0 */
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.running + st.waiting + st.kept, 0);
    assert_int_equal(st.prefill_tokens, 9 + 17 + 23);
    assert_int_equal(st.decode_tokens, 3 * (NEW - 1));
    fm_sched_free(s);
    free(r);
    fm_model_free(m);
}

static void test_cancel_frees_blocks(void **state) {
    (void)state;
    enum { NEW = 20 };
    fm_model *m = load();
    const int32_t V = fm_model_vocab_size(m);
    int32_t p0[20], p1[20], ref[NEW];
    prompt_ids(p0, 20, V, 3), prompt_ids(p1, 20, V, 4);
    alone(m, p1, 20, NEW, ref);
    fm_sched *s;
    fm_error err;
    assert_int_equal(fm_sched_create(m->context, 0, &s, &err), FM_OK);
    sched_rec *r = sched_rec_new(SCHED_REC_TOKENS, 0);
    fm_sched_request q0 = greedy(p0, 20, NEW, r), q1 = greedy(p1, 20, NEW, r);
    const int64_t a = sched_rec_submit(s, &q0), b = sched_rec_submit(s, &q1);
    for (int i = 0; i < 6; i++) step(s, r);
    assert_true(r->n[a] > 0 && r->n[b] > 0 && r->finals[a] == 0);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 4); /* 2 x ceil(21..24 / 16) */
    fm_sched_cancel(s, a);
    assert_int_equal(r->finals[a], 0); /* at the next step, not inside cancel */
    const int64_t got = r->n[a];
    step(s, r);
    expect_final(r, a, FM_SCHED_CANCELLED);
    assert_int_equal(r->n[a], got);
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 2); /* b's only */
    fm_sched_cancel(s, a);                  /* finished: ignored */
    fm_sched_cancel(s, 999);                /* unknown: ignored */
    sched_rec_run_idle(s, r);
    expect_final(r, b, FM_SCHED_LENGTH);
    assert_memory_equal(r->ids[b], ref, sizeof ref);
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    /* a waiting request cancelled before it ran, and a running one left when the scheduler is freed */
    const int64_t c = sched_rec_submit(s, &q0), d = sched_rec_submit(s, &q1);
    step(s, r);
    fm_sched_cancel(s, d);
    step(s, r);
    expect_final(r, d, FM_SCHED_CANCELLED);
    assert_int_equal(r->n[d], 0);
    fm_sched_free(s);
    expect_final(r, c, FM_SCHED_CANCELLED);
    assert_int_equal(m->context->kv->pool.n_free, m->context->kv->pool.n_blocks);
    free(r);
    fm_model_free(m);
}

static void test_reuse_kept_cache(void **state) {
    (void)state;
    enum { P = 20, NEW = 8, EXTRA = 5 };
    fm_model *m = load();
    const int32_t V = fm_model_vocab_size(m);
    int32_t p[P], turn2[P + NEW + EXTRA], ref[NEW];
    prompt_ids(p, P, V, 21);
    fm_sched *s;
    fm_error err;
    assert_int_equal(fm_sched_create(m->context, 0, &s, &err), FM_OK);
    sched_rec *r = sched_rec_new(SCHED_REC_TOKENS, 0);
    fm_sched_request q = greedy(p, P, NEW, r);
    q.keep = true;
    const int64_t a = sched_rec_submit(s, &q);
    sched_rec_run_idle(s, r);
    expect_final(r, a, FM_SCHED_LENGTH);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kept, 1);
    assert_int_equal(st.kv_blocks_used, 2); /* P + NEW - 1 = 27 tokens held */
    /* the next turn: the whole conversation (prompt, the answer, new text) */
    memcpy(turn2, p, sizeof p);
    memcpy(turn2 + P, r->ids[a], NEW * sizeof *turn2);
    prompt_ids(turn2 + P + NEW, EXTRA, V, 22);
    const int64_t n2 = P + NEW + EXTRA;
    alone(m, turn2, n2, NEW, ref);
    const int64_t pre0 = st.prefill_tokens;
    fm_sched_request q2 = greedy(turn2, n2, NEW, r);
    q2.reuse = a, q2.keep = true;
    const int64_t b = sched_rec_submit(s, &q2);
    fm_sched_request q3 = greedy(turn2, n2, NEW, r);
    q3.reuse = a;
    int64_t dummy;
    assert_int_equal(fm_sched_submit(s, &q3, &dummy, &err), FM_ERR_USAGE); /* a is continued by b already */
    sched_rec_run_idle(s, r);
    expect_final(r, b, FM_SCHED_LENGTH);
    assert_memory_equal(r->ids[b], ref, sizeof ref);
    assert_int_equal(r->n_cached[b], P + NEW - 1); /* the cache held all but the last answer token */
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.prefill_tokens - pre0, n2 - (P + NEW - 1));
    assert_int_equal(st.kept, 1); /* b now, a was consumed */
    /* a prompt that shares only its first 10 tokens with b's cache: cut back, same tokens as fresh */
    int32_t turn3[30];
    memcpy(turn3, turn2, 10 * sizeof *turn3);
    prompt_ids(turn3 + 10, 20, V, 23);
    alone(m, turn3, 30, NEW, ref);
    fm_sched_request q4 = greedy(turn3, 30, NEW, r);
    q4.reuse = b, q4.keep = true;
    const int64_t c = sched_rec_submit(s, &q4);
    sched_rec_run_idle(s, r);
    assert_int_equal(r->n_cached[c], 10);
    assert_memory_equal(r->ids[c], ref, sizeof ref);
    /* the same prompt again: all of it cached but the last token, which runs for its logits */
    fm_sched_request q5 = greedy(turn3, 30, NEW, r);
    q5.reuse = c;
    const int64_t d = sched_rec_submit(s, &q5);
    sched_rec_run_idle(s, r);
    assert_int_equal(r->n_cached[d], 29);
    assert_memory_equal(r->ids[d], ref, sizeof ref);
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kept, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    /* release frees a kept cache */
    fm_sched_request q6 = greedy(p, P, 4, r);
    q6.keep = true;
    const int64_t e = sched_rec_submit(s, &q6);
    sched_rec_run_idle(s, r);
    fm_sched_get_stats(s, &st);
    assert_true(st.kv_blocks_used > 0);
    fm_sched_release(s, e);
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    fm_sched_free(s);
    free(r);
    fm_model_free(m);
}

static void test_pool_exhaustion(void **state) {
    (void)state;
    enum { P = 20, NEW = 30 };
    fm_model *m = load();
    const int32_t V = fm_model_vocab_size(m);
    int32_t p[P], ref[NEW];
    prompt_ids(p, P, V, 31);
    alone(m, p, P, NEW, ref);
    fm_sched *s;
    fm_error err;
    assert_int_equal(fm_sched_create(m->context, 0, &s, &err), FM_OK);
    sched_rec *r = sched_rec_new(SCHED_REC_TOKENS, 0);
    /* an overcommitted pool: only the 2 blocks at the bottom of the free stack are left (32 tokens) */
    fm_kv_pool *pool = &m->context->kv->pool;
    const int32_t n_free = pool->n_free;
    pool->n_free = 2;
    fm_sched_request q = greedy(p, P, NEW, r);
    const int64_t a = sched_rec_submit(s, &q);
    sched_rec_run_idle(s, r);
    expect_final(r, a, FM_SCHED_ERROR);
    assert_non_null(strstr(r->msg[a], "KV cache full"));
    assert_int_equal(r->n[a], 32 - P + 1); /* tokens 20..31 fill the 2 blocks; the 13th sampled needs a third */
    assert_memory_equal(r->ids[a], ref, (size_t)r->n[a] * sizeof *ref); /* correct until then */
    assert_int_equal(pool->n_free, 2);
    pool->n_free = n_free;
    const int64_t b = sched_rec_submit(s, &q);
    sched_rec_run_idle(s, r);
    expect_final(r, b, FM_SCHED_LENGTH);
    assert_memory_equal(r->ids[b], ref, sizeof ref);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    int64_t x;
    /* refused at submit: the context, ids outside the vocabulary, a bad sampling value */
    fm_sched_request bad = greedy(p, P, 64 - P + 1, r);
    assert_int_equal(fm_sched_submit(s, &bad, &x, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--ctx"));
    int32_t big[2] = {1, V};
    bad = greedy(big, 2, 4, r);
    assert_int_equal(fm_sched_submit(s, &bad, &x, &err), FM_ERR_FORMAT);
    bad = greedy(p, P, 4, r);
    bad.params.top_p = 0.0f;
    assert_int_equal(fm_sched_submit(s, &bad, &x, &err), FM_ERR_USAGE);
    bad = greedy(p, P, 4, r);
    bad.n_logprobs = FM_MAX_LOGPROBS + 1;
    assert_int_equal(fm_sched_submit(s, &bad, &x, &err), FM_ERR_USAGE);
    bad = greedy(p, P, 4, r);
    bad.reuse = a; /* not kept */
    assert_int_equal(fm_sched_submit(s, &bad, &x, &err), FM_ERR_USAGE);
    fm_sched_free(s);
    free(r);
    fm_model_free(m);
}

/* Qwen3-Next: a kept cache continued whole keeps its Gated DeltaNet states (only the new tokens run); one cut back
 * to a shorter common prefix cannot rewind them, so the prompt runs again from position 0. Tokens as alone. */
static void test_qwen3_next_reuse(void **state) {
    (void)state;
    enum { P = 20, NEW = 8, EXTRA = 5 };
    k_model = "tests/models/qwen3-next-f32";
    fm_model *m = load();
    k_model = "tests/models/qwen3-moe-f32";
    const int32_t V = fm_model_vocab_size(m);
    int32_t p[P], turn2[P + NEW + EXTRA], turn3[30], ref[NEW];
    prompt_ids(p, P, V, 31);
    fm_sched *s;
    fm_error err;
    assert_int_equal(fm_sched_create(m->context, 0, &s, &err), FM_OK);
    sched_rec *r = sched_rec_new(SCHED_REC_TOKENS, 0);
    fm_sched_request q = greedy(p, P, NEW, r);
    q.keep = true;
    const int64_t a = sched_rec_submit(s, &q);
    sched_rec_run_idle(s, r);
    memcpy(turn2, p, sizeof p);
    memcpy(turn2 + P, r->ids[a], NEW * sizeof *turn2);
    prompt_ids(turn2 + P + NEW, EXTRA, V, 32);
    alone(m, turn2, P + NEW + EXTRA, NEW, ref);
    fm_sched_request q2 = greedy(turn2, P + NEW + EXTRA, NEW, r);
    q2.reuse = a, q2.keep = true;
    const int64_t b = sched_rec_submit(s, &q2);
    sched_rec_run_idle(s, r);
    assert_int_equal(r->n_cached[b], P + NEW - 1);
    assert_memory_equal(r->ids[b], ref, sizeof ref);
    memcpy(turn3, turn2, 10 * sizeof *turn3);
    prompt_ids(turn3 + 10, 20, V, 33);
    alone(m, turn3, 30, NEW, ref);
    fm_sched_request q3 = greedy(turn3, 30, NEW, r);
    q3.reuse = b;
    const int64_t c = sched_rec_submit(s, &q3);
    sched_rec_run_idle(s, r);
    assert_int_equal(r->n_cached[c], 0);
    assert_memory_equal(r->ids[c], ref, sizeof ref);
    fm_sched_free(s);
    free(r);
    fm_model_free(m);
}

/* the same with the prefix cache on: the cuts fall inside named blocks (turn 3 keeps 10 tokens of the first one), which
 * are copied into a private block first, so the kept cache gives exactly the same counts */
static void test_reuse_kept_cache_prefix_on(void **state) {
    k_prefix = true;
    test_reuse_kept_cache(state);
    k_prefix = false;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_running_batch), cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_reuse_kept_cache),   cmocka_unit_test(test_qwen3_next_reuse),
        cmocka_unit_test(test_pool_exhaustion),    cmocka_unit_test(test_reuse_kept_cache_prefix_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
