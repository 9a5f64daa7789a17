/* The serve warm-up (fp8moe.h fm_context_warmup, src/engine/warmup.c) on the CPU: it runs its prefill chunks and every
 * decode bucket, and leaves nothing behind: afterwards every block is free, none is cached or named, no sequence is
 * open, the pool's invariants hold; and the same requests (greedy and sampled with a seed, then one sharing the first's
 * prompt, whose prefix the cache serves) give the same tokens, the same cached-token counts and the same scheduler
 * counters as on a model that was never warmed up. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "fp8moe_sched.h"

#define TINY "models/tiny-code-moe"
#define N_OUT 12

static fm_model *load(void) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = 4;
    opt.max_tokens = 48; /* the prefill chunk */
    opt.ctx = 512;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(TINY, &opt, &m, &err)) fail_msg("load: %s", err.msg);
    return m;
}

typedef struct result {
    int32_t ids[N_OUT];
    int32_t n;
    int64_t n_cached;
    fm_sched_end end;
} result;

static void on_event(void *user, const fm_sched_event *ev) {
    result *r = user;
    if (ev->id >= 0 && r->n < N_OUT) r->ids[r->n++] = ev->id;
    r->n_cached = ev->n_cached;
    r->end = ev->end;
}

/* three requests, one after the other: greedy, sampled (seed 7), and greedy again on the first prompt */
static void run_requests(fm_model *m, result *out, fm_sched_stats *stats) {
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37 + 5) % 300;
    fm_sched *s = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_sched_create(m->context, 48, &s, &err), FM_OK);
    for (int r = 0; r < 3; r++) {
        fm_sched_request q;
        fm_sched_request_init(&q);
        q.prompt = prompt, q.n_prompt = r == 1 ? 21 : 40;
        q.params.max_tokens = N_OUT;
        if (r == 1) q.params.temperature = 0.8f, q.params.seed = 7;
        q.on_event = on_event, q.user = &out[r];
        int64_t id;
        assert_int_equal(fm_sched_submit(s, &q, &id, &err), FM_OK);
        for (bool busy = true; busy;) assert_int_equal(fm_sched_step(s, &busy, &err), FM_OK);
        assert_int_not_equal(out[r].end, FM_SCHED_ERROR);
    }
    fm_sched_get_stats(s, stats);
    fm_sched_free(s);
}

static void warmup_leaves_nothing(void **state) {
    (void)state;
    fm_model *cold = load(), *warm = load();
    fm_warmup_report rep;
    fm_error err = {{0}};
    assert_int_equal(fm_context_warmup(warm->context, 48, &rep, &err), FM_OK);
    assert_int_equal(rep.prefill_tokens, 96); /* two chunks: from position 0, then paged after it */
    assert_int_equal(rep.buckets, 3);         /* 1, 2, 4 sequences */
    const fm_kv_pool *p = &warm->context->kv->pool;
    assert_int_equal(p->n_free, p->n_blocks);
    assert_int_equal(p->n_lru, 0); /* no cached block */
    for (int32_t b = 0; b < p->n_blocks; b++) assert_int_equal(p->in_table[b], 0);
    for (int32_t q = 0; q < p->max_seqs; q++) assert_int_equal(p->n_tokens[q], -1);
    char msg[256];
    assert_true(fm_kv_pool_check(p, msg, sizeof msg));

    result a[3], b[3];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b);
    fm_sched_stats sa, sb;
    run_requests(cold, a, &sa);
    run_requests(warm, b, &sb);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(a[r].n, b[r].n);
        assert_memory_equal(a[r].ids, b[r].ids, sizeof a[r].ids);
        assert_int_equal(a[r].n_cached, b[r].n_cached);
    }
    assert_true(a[2].n_cached > 0); /* the third request's prefix came from the cache, in both */
    assert_int_equal(sa.prefix_queries, sb.prefix_queries);
    assert_int_equal(sa.prefix_hits, sb.prefix_hits);
    assert_int_equal(sa.prefix_cached_tokens, sb.prefix_cached_tokens);
    assert_int_equal(sa.prefill_tokens, sb.prefill_tokens);
    assert_int_equal(sa.decode_tokens, sb.decode_tokens);
    assert_int_equal(sa.decode_steps, sb.decode_steps);
    assert_int_equal(sa.kv_blocks_cached, sb.kv_blocks_cached);
    assert_int_equal(sa.kv_evictions, sb.kv_evictions);
    printf("  warm-up (%lld prefill tokens, %d buckets): 3 requests identical, %lld tokens cached in both\n",
           (long long)rep.prefill_tokens, rep.buckets, (long long)a[2].n_cached);
    fm_model_free(cold), fm_model_free(warm);
}

/* a model without a KV cache has nothing to warm: refused by name */
static void needs_kv(void **state) {
    (void)state;
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load(TINY, &opt, &m, &err), FM_OK);
    fm_warmup_report rep;
    assert_int_equal(fm_context_warmup(m->context, 16, &rep, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "without a KV cache"));
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(warmup_leaves_nothing), cmocka_unit_test(needs_kv)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
