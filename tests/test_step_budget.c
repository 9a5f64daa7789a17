/* The latency step budget (src/engine/step_budget.h) and the scheduler under it, on the CPU backend with a clock
 * injected (fm_sched_set_clock) that advances by a modelled cost of each step, so every choice is deterministic:
 *   - the estimates alone: the fixed budget before any measurement and in steps without decode rows; the share
 *     (R - 1) x decode step / token cost, at least the floor (itself at most the room left) and at most the room;
 *     the nearest batch measured stands in for one not measured; a one-off slow step moves an estimate by a quarter
 *     at most; on a cost that is not linear in the share (a fixed part per mixed step) the share settles where the
 *     step takes R x the decode-only step;
 *   - the scheduler: one stream decoding while 200-token prompts keep arriving, prefill dear (the share drops to the
 *     floor), then cheap (it grows back to the whole budget, step by step), then in between (it settles where the
 *     modelled step is within 2 x the decode-only step); every prompt completes; every request's greedy tokens are
 *     those of the same run under the fixed budget (the budget decides which rows share a step, not what a row
 *     computes);
 *   - the prompts' turn: while more prompts wait than sequences decode a step takes the whole budget, whatever the
 *     estimates (one stream and two waiting prompts: the room, where one waiting prompt got the floor);
 *   - the prompt wait W: the share at least the waiting prompts' tokens over the steps left before the one waiting
 *     longest has waited W steps (the unit's arithmetic; in the scheduler, W = 2 finishes each 200-token prompt in
 *     2 steps where the floor takes 4, and the default W = 40 leaves the floor);
 *   - the options: the default is latency with R = 1.5 (measured on an H100, docs/RESULTS.md 2.26); latency or a
 *     ratio with mixed steps off, a ratio
 *     with fixed, a ratio below 1 are refused by name; the prompt wait is 40 under latency, as given, or off, and is
 *     refused where the ratio is and out of range; a rank of an --ep/--tp group keeps the fixed
 * budget (each rank schedules for itself, in step with the others: shares sized by each rank's clock would differ) and
 * refuses latency by name. */
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
#include "engine/kv_state.h"
#include "engine/step_budget.h"
#include "fp8moe_sched.h"

static fm_step_budget budget_of(int64_t tokens, bool latency, double ratio, int32_t max_batch) {
    fm_step_budget b;
    fm_error err;
    if (fm_step_budget_init(&b, tokens, latency, ratio, 0, max_batch, &err)) fail_msg("%s", err.msg);
    return b;
}

/* n requests waiting, with no prompt tokens counted (the prompt wait's share plays no part) */
static const fm_step_waiting *waiting(int32_t n) {
    static fm_step_waiting w[16];
    w[n] = (fm_step_waiting){n, 0, 0};
    return &w[n];
}

static void test_estimates(void **state) {
    (void)state;
    fm_step_budget b = budget_of(520, true, 2.0, 8);
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 512); /* nothing measured: the fixed budget */
    fm_step_budget_observe(&b, 8, 0, 6.0);                            /* a decode-only step of 8 rows: 6 ms */
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 512); /* no prefill cost yet */
    fm_step_budget_observe(&b, 8, 512, 30.0);                         /* 24 ms for 512 prompt tokens */
    assert_true(fabs(b.token_ms - 24.0 / 512) < 1e-12);
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 128); /* 6 ms more at most: 128 tokens */
    assert_int_equal(fm_step_budget_prefill(&b, 0, waiting(1)), 520); /* no stream waits: the whole budget */
    assert_true(fabs(fm_step_budget_decode_ms(&b, 5) - 6.0) < 1e-12); /* the nearest batch measured */
    assert_true(fm_step_budget_decode_ms(&b, 9) == 0.0);              /* beyond the batch: none */
    /* a one-off stall (a graph capture) of 100x moves the decode estimate by a quarter */
    fm_step_budget_observe(&b, 8, 0, 600.0);
    assert_true(fabs(fm_step_budget_decode_ms(&b, 8) - 7.5) < 1e-12);
    for (int i = 0; i < 40; i++) fm_step_budget_observe(&b, 8, 0, 6.0);
    assert_true(fabs(fm_step_budget_decode_ms(&b, 8) - 6.0) < 1e-3);
    /* dear prefill: the floor; cheap: the room; measured free: the room */
    b.token_ms = 1.0;
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), FM_STEP_PREFILL_FLOOR);
    b.token_ms = 1e-4;
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 512);
    b.token_ms = 0.0;
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 512);
    /* more prompts waiting than sequences decoding: the whole budget (the prompts' turn); as many: the share */
    b.token_ms = 24.0 / 512;
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(9)), 512);
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(8)), 128);
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(0)), 128);
    /* R = 3 doubles the share of R = 2 */
    b.ratio = 3.0, b.token_ms = 24.0 / 512;
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 256);
    fm_step_budget_free(&b);

    /* a budget smaller than the floor: the floor is what the decode rows leave */
    b = budget_of(40, true, 2.0, 4);
    fm_step_budget_observe(&b, 4, 0, 1.0), fm_step_budget_observe(&b, 4, 30, 100.0);
    assert_int_equal(fm_step_budget_prefill(&b, 4, waiting(1)), 36);
    fm_step_budget_free(&b);

    /* fixed: the room, whatever was measured */
    b = budget_of(520, false, 2.0, 8);
    fm_step_budget_observe(&b, 8, 0, 6.0), fm_step_budget_observe(&b, 8, 512, 300.0);
    assert_int_equal(fm_step_budget_prefill(&b, 8, waiting(1)), 512);
    fm_step_budget_free(&b);

    fm_error err;
    assert_int_equal(fm_step_budget_init(&b, 520, true, 0.5, 0, 8, &err), FM_ERR_USAGE);
    assert_int_equal(fm_step_budget_init(&b, 520, true, 2.0, -1, 8, &err), FM_ERR_USAGE);
}

/* The prompt wait W: the share at least the waiting prompts' tokens over the steps left before the one waiting
 * longest has waited W steps; never less than the share by time, never more than the room */
static void test_prompt_wait_share(void **state) {
    (void)state;
    fm_step_budget b;
    fm_error err;
    if (fm_step_budget_init(&b, 520, true, 2.0, 40, 8, &err)) fail_msg("%s", err.msg);
    fm_step_budget_observe(&b, 8, 0, 6.0);
    b.token_ms = 1.0; /* dear prefill: the share by time is the floor */
    fm_step_waiting w = {1, 1800, 0};
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), FM_STEP_PREFILL_FLOOR); /* 1800 / 40 = 45: the floor */
    w.oldest_steps = 30;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 180); /* 1800 over the 10 steps left */
    w.oldest_steps = 33;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 258); /* ceil(1800 / 7) */
    w.oldest_steps = 39;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 512); /* one step left: the room */
    w.oldest_steps = 400;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 512); /* waited past W: the room */
    w = (fm_step_waiting){2, 100, 39};
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 100); /* all that waits, no more */
    b.token_ms = 24.0 / 512;                                  /* the share by time: 128 */
    w = (fm_step_waiting){1, 1800, 30};
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 180);
    w.oldest_steps = 10;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 128); /* 60 < 128: the share by time */
    assert_int_equal(fm_step_budget_prefill(&b, 8, NULL), 128);
    b.wait_steps = 0; /* off: the share by time alone */
    w.oldest_steps = 39;
    assert_int_equal(fm_step_budget_prefill(&b, 8, &w), 128);
    fm_step_budget_free(&b);
}

/* A GPU-like cost: a mixed step pays a fixed 4 ms (its launches, the experts a chunk touches) and 0.02 ms a token
 * on top of a 6 ms decode step. The share settles where the step takes 12 ms: 4 + 0.02 P = 6, P = 100. */
static void test_settles_on_affine_cost(void **state) {
    (void)state;
    fm_step_budget b = budget_of(520, true, 2.0, 8);
    fm_step_budget_observe(&b, 8, 0, 6.0);
    int64_t p = 0;
    double ms = 0.0;
    for (int i = 0; i < 60; i++) {
        p = fm_step_budget_prefill(&b, 8, waiting(1));
        ms = 6.0 + 4.0 + 0.02 * (double)p;
        fm_step_budget_observe(&b, 8, p, ms);
    }
    printf("affine cost: share %lld tokens, step %.3f ms (decode-only 6 ms)\n", (long long)p, ms);
    assert_true(p >= 98 && p <= 101);
    assert_true(ms <= 12.0 + 1e-9);
    fm_step_budget_free(&b);
}

/* ---- the scheduler under a modelled clock ---- */

enum { N_PROMPTS = 34, LONG = 200, STREAM_NEW = 120, PASS = 256, SEQS = 4 };

/* milliseconds: a step costs STEP_MS, plus DEC_MS a decode row and pre_ms a prompt token (changed by the test) */
#define STEP_MS 5.0
#define DEC_MS 0.1
typedef struct model_clock {
    fm_sched *s;
    double now, pre_ms;
    int64_t steps, dec, pre; /* the scheduler's counters at the last reading */
} model_clock;

static double model_now(void *user) {
    model_clock *c = user;
    fm_sched_stats st;
    fm_sched_get_stats(c->s, &st);
    c->now += STEP_MS * (double)(st.steps - c->steps) + DEC_MS * (double)(st.decode_tokens - c->dec) +
              c->pre_ms * (double)(st.prefill_tokens - c->pre);
    c->steps = st.steps, c->dec = st.decode_tokens, c->pre = st.prefill_tokens;
    return c->now;
}

typedef struct outputs {
    int32_t stream[STREAM_NEW];
    int64_t n_stream;
    int32_t first[N_PROMPTS];
    int32_t done; /* prompts that got their token */
    fm_sched_end end[N_PROMPTS + 1];
} outputs;

static void on_stream(void *user, const fm_sched_event *ev) {
    outputs *o = user;
    if (ev->id >= 0) {
        assert_true(o->n_stream < STREAM_NEW);
        o->stream[o->n_stream++] = ev->id;
    }
    if (ev->end != FM_SCHED_RUNNING) o->end[N_PROMPTS] = ev->end;
}

typedef struct prompt_user {
    outputs *o;
    int32_t k;
} prompt_user;

static void on_prompt(void *user, const fm_sched_event *ev) {
    const prompt_user *u = user;
    if (ev->id >= 0) u->o->first[u->k] = ev->id;
    if (ev->end != FM_SCHED_RUNNING) u->o->end[u->k] = ev->end, u->o->done++;
}

/* the phases, by prompts completed: prefill dear, cheap, in between */
enum { DEAR_UNTIL = 6, CHEAP_UNTIL = 20 };
static double pre_ms_of(int32_t done) { return done < DEAR_UNTIL ? 0.5 : done < CHEAP_UNTIL ? 0.01 : 0.04; }

typedef struct trace {
    int32_t n;
    int32_t phase[4096];
    int64_t limit[4096], rows[4096];
    double ms[4096], dec_est[4096];
} trace;

static int32_t load_ep_ranks = 0;      /* fm_options.ep_ranks of the next loads (rank 0 of them) */
static int32_t load_prompt_wait = 0;   /* fm_options.prompt_wait_steps of the next loads */
static const char *load_routes = NULL; /* fm_options.routes of the next loads */

static fm_model *load(fm_step_budget_mode mode, double ratio, int64_t step_tokens, fm_status *st, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.ep_ranks = load_ep_ranks, opt.ep_rank = 0;
    opt.max_seqs = SEQS, opt.ctx = PASS, opt.max_tokens = PASS, opt.prefix_cache = false;
    opt.max_step_tokens = step_tokens, opt.step_budget = mode, opt.step_latency_ratio = ratio;
    opt.prompt_wait_steps = load_prompt_wait, opt.routes = load_routes;
    fm_model *m = NULL;
    *st = fm_model_load("tests/models/qwen3-moe-f32", &opt, &m, err);
    return m;
}

/* submits the stream (STREAM_NEW tokens after an 8-token prompt) and prompt k (LONG tokens, 1 new) */
static void submit_stream(fm_sched *s, const int32_t *prompt, outputs *o) {
    fm_sched_request q;
    fm_sched_request_init(&q);
    q.prompt = prompt, q.n_prompt = 8, q.params.max_tokens = STREAM_NEW, q.params.ignore_eos = true;
    q.on_event = on_stream, q.user = o;
    int64_t id;
    fm_error err;
    if (fm_sched_submit(s, &q, &id, &err)) fail_msg("%s", err.msg);
}
static void submit_prompt(fm_sched *s, const int32_t *prompt, prompt_user *u) {
    fm_sched_request q;
    fm_sched_request_init(&q);
    q.prompt = prompt, q.n_prompt = LONG, q.params.max_tokens = 1, q.params.ignore_eos = true;
    q.on_event = on_prompt, q.user = u;
    int64_t id;
    fm_error err;
    if (fm_sched_submit(s, &q, &id, &err)) fail_msg("%s", err.msg);
}

/* One stream of STREAM_NEW tokens; once it decodes, N_PROMPTS prompts of LONG tokens (1 new token each), the next
 * submitted whenever none is waiting or prefilling. The clock models the cost when `clock` is set. */
static void run(fm_step_budget_mode mode, bool clock, outputs *o, trace *t) {
    fm_status st;
    fm_error err;
    fm_model *m = load(mode, mode == FM_STEP_BUDGET_LATENCY ? 2.0 : 0.0, 0, &st, &err); /* R = 2: the shares below */
    if (st) fail_msg("load: %s", err.msg);
    const int32_t V = fm_model_vocab_size(m);
    fm_sched *s;
    if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
    model_clock mc = {s, 1000.0, pre_ms_of(0), 0, 0, 0};
    if (clock) fm_sched_set_clock(s, model_now, &mc);
    int32_t stream_prompt[8], prompts[N_PROMPTS][LONG];
    uint32_t seed = 7u;
    for (int i = 0; i < 8; i++) seed = seed * 1664525u + 1013904223u, stream_prompt[i] = (int32_t)((seed >> 8) % V);
    for (int k = 0; k < N_PROMPTS; k++)
        for (int i = 0; i < LONG; i++) seed = seed * 1664525u + 1013904223u, prompts[k][i] = (int32_t)((seed >> 8) % V);
    submit_stream(s, stream_prompt, o);
    prompt_user users[N_PROMPTS];
    int32_t submitted = 0;
    for (int64_t n = 0; n < 4000; n++) {
        fm_sched_stats before;
        fm_sched_get_stats(s, &before);
        if (o->n_stream >= 3 && submitted < N_PROMPTS && before.waiting == 0 && submitted == o->done &&
            before.running <= 1) {
            users[submitted] = (prompt_user){o, submitted};
            submit_prompt(s, prompts[submitted], &users[submitted]);
            submitted++;
        }
        const int32_t phase = o->done < DEAR_UNTIL ? 0 : o->done < CHEAP_UNTIL ? 1 : 2;
        mc.pre_ms = pre_ms_of(o->done);
        bool busy;
        if (fm_sched_step(s, &busy, &err)) fail_msg("step: %s", err.msg);
        if (!busy) break;
        fm_sched_stats st1;
        fm_sched_get_stats(s, &st1);
        if (t && st1.last_decode_rows > 0 && st1.last_prefill_rows > 0) {
            assert_true(t->n < 4096);
            t->phase[t->n] = phase, t->limit[t->n] = st1.last_prefill_limit, t->rows[t->n] = st1.last_prefill_rows;
            t->ms[t->n] = st1.last_step_ms, t->dec_est[t->n] = st1.est_decode_ms;
            t->n++;
        }
    }
    assert_int_equal(submitted, N_PROMPTS);
    fm_sched_free(s);
    fm_model_free(m);
}

static void test_share_follows_cost(void **state) {
    (void)state;
    outputs *fixed = calloc(1, sizeof *fixed), *lat = calloc(1, sizeof *lat);
    trace *t = calloc(1, sizeof *t);
    run(FM_STEP_BUDGET_FIXED, false, fixed, NULL);
    run(FM_STEP_BUDGET_LATENCY, true, lat, t);
    /* every prompt completed, the stream ran to its length, the same tokens as under the fixed budget */
    assert_int_equal(lat->done, N_PROMPTS), assert_int_equal(fixed->done, N_PROMPTS);
    for (int k = 0; k < N_PROMPTS; k++) assert_int_equal(lat->end[k], FM_SCHED_LENGTH);
    assert_int_equal(lat->end[N_PROMPTS], FM_SCHED_LENGTH);
    assert_int_equal(lat->n_stream, STREAM_NEW), assert_int_equal(fixed->n_stream, STREAM_NEW);
    assert_memory_equal(lat->stream, fixed->stream, sizeof lat->stream);
    assert_memory_equal(lat->first, fixed->first, sizeof lat->first);

    const int64_t room = PASS - 1; /* the stream's row beside the prompt rows */
    int32_t first[3] = {-1, -1, -1}, last[3] = {-1, -1, -1};
    for (int32_t i = 0; i < t->n; i++) {
        assert_true(t->rows[i] <= t->limit[i]);
        assert_true(t->limit[i] >= FM_STEP_PREFILL_FLOOR && t->limit[i] <= room);
        if (first[t->phase[i]] < 0) first[t->phase[i]] = i;
        last[t->phase[i]] = i;
    }
    for (int p = 0; p < 3; p++) assert_true(first[p] >= 0 && last[p] - first[p] >= 3);
    /* dear: the first mixed step has no prefill cost yet (the fixed budget); every later one the floor */
    assert_int_equal(t->limit[0], room);
    for (int32_t i = 1; i <= last[0]; i++) assert_int_equal(t->limit[i], FM_STEP_PREFILL_FLOOR);
    /* cheap: it grows back, never shrinking, to the whole room */
    for (int32_t i = first[1] + 1; i <= last[1]; i++) assert_true(t->limit[i] >= t->limit[i - 1]);
    assert_int_equal(t->limit[last[1]], room);
    /* in between: it settles at (R - 1) x 5.1 ms / 0.04 ms = 127 tokens, the step within 2 x the decode-only one */
    const int32_t e = last[2];
    printf("share: dear %lld, cheap %lld, in between %lld tokens (step %.2f ms, decode-only %.2f ms)\n",
           (long long)t->limit[last[0]], (long long)t->limit[last[1]], (long long)t->limit[e], t->ms[e], t->dec_est[e]);
    assert_true(fabs(t->dec_est[e] - (STEP_MS + DEC_MS)) < 1e-9);
    assert_true(t->limit[e] >= 125 && t->limit[e] <= 128);
    for (int32_t i = e - 2; i <= e; i++) assert_true(t->ms[i] <= 2.0 * t->dec_est[i] * 1.01); /* a token's rounding */
    free(fixed), free(lat), free(t);
}

/* One stream decoding under the latency budget (R = 2, the prompt wait `wait`) on the modelled clock with prefill
 * dear (0.5 ms a token: the share by time at the floor), and four 200-token prompts ready to submit */
typedef struct dear_world {
    fm_model *m;
    fm_sched *s;
    model_clock mc;
    outputs o;
    int32_t stream_prompt[8], prompts[4][LONG];
    prompt_user users[4];
} dear_world;

static dear_world *dear_open(int32_t wait) {
    dear_world *d = calloc(1, sizeof *d);
    assert_non_null(d);
    load_prompt_wait = wait;
    fm_status st;
    fm_error err;
    d->m = load(FM_STEP_BUDGET_LATENCY, 2.0, 0, &st, &err);
    load_prompt_wait = 0;
    if (st) fail_msg("load: %s", err.msg);
    if (fm_sched_create(d->m->context, 0, &d->s, &err)) fail_msg("%s", err.msg);
    d->mc = (model_clock){d->s, 1000.0, 0.5, 0, 0, 0};
    fm_sched_set_clock(d->s, model_now, &d->mc);
    const int32_t V = fm_model_vocab_size(d->m);
    for (int i = 0; i < 8; i++) d->stream_prompt[i] = (3 * i + 1) % V;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < LONG; i++) d->prompts[k][i] = (7 * i + 11 * k + 5) % V;
    submit_stream(d->s, d->stream_prompt, &d->o);
    return d;
}

static void dear_submit(dear_world *d, int32_t k) {
    d->users[k] = (prompt_user){&d->o, k};
    submit_prompt(d->s, d->prompts[k], &d->users[k]);
}

static void dear_close(dear_world *d) {
    fm_sched_free(d->s);
    fm_model_free(d->m);
    free(d);
}

/* The prompts' turn: one stream decodes with prefill dear (the share at the floor while one prompt waits); when three
 * prompts wait beside the one stream, each step takes the whole budget until no more prompts wait than sequences
 * decode (a load of many prompts at once would otherwise settle at a few streams and starved prompts) */
static void test_prompts_turn(void **state) {
    (void)state;
    dear_world *d = dear_open(0);
    outputs *o = &d->o;
    fm_error err;
    bool busy;
    fm_sched_stats sn;
    int32_t submitted = 0;
    /* one prompt at a time until two have completed: both estimates exist and the share is at the floor */
    for (int n = 0; n < 400 && o->done < 2; n++) {
        fm_sched_get_stats(d->s, &sn);
        if (o->n_stream >= 3 && sn.waiting == 0 && submitted == o->done) dear_submit(d, submitted++);
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
        fm_sched_get_stats(d->s, &sn);
        if (submitted == 2 && sn.last_prefill_rows > 0 && sn.last_decode_rows > 0)
            assert_int_equal(sn.last_prefill_limit, FM_STEP_PREFILL_FLOOR); /* one waits, one decodes: the share */
    }
    assert_int_equal(o->done, 2);
    /* two prompts at once beside the one stream: the whole budget while more wait than decode */
    dear_submit(d, 2), dear_submit(d, 3);
    if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
    fm_sched_get_stats(d->s, &sn);
    assert_int_equal(sn.last_decode_rows, 1);
    assert_int_equal(sn.last_prefill_limit, PASS - 1); /* the room beside the stream's row */
    printf("prompts' turn: 2 waiting beside 1 stream: a step's prompt share %lld (1 waiting: %d)\n",
           (long long)sn.last_prefill_limit, FM_STEP_PREFILL_FLOOR);
    for (int n = 0; n < 400 && busy; n++)
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
    assert_int_equal(o->done, 4);
    dear_close(d);
}

/* Steps from each prompt's submission to its first token, one 200-token prompt at a time beside one stream with
 * prefill dear (the share by time at the floor of 64), under the prompt wait `wait` (-1: off); the smallest prompt
 * share of those steps; the longest wait the stats showed */
static void prompt_steps(int32_t wait, int32_t steps[4], int64_t *least_limit, int32_t *most_waited) {
    dear_world *d = dear_open(wait);
    outputs *o = &d->o;
    fm_error err;
    bool busy = true;
    fm_sched_stats sn;
    int32_t submitted = 0;
    *least_limit = PASS, *most_waited = 0;
    for (int n = 0; n < 400 && o->done < 4; n++) {
        fm_sched_get_stats(d->s, &sn);
        if (o->n_stream >= 3 && sn.waiting == 0 && submitted == o->done)
            steps[submitted] = 0, dear_submit(d, submitted++);
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
        fm_sched_get_stats(d->s, &sn);
        if (submitted > 0 && sn.last_prefill_rows > 0) steps[submitted - 1]++; /* its steps: only its rows wait */
        /* the first prompt's steps come before the prefill cost is measured (the fixed budget) */
        if (submitted > 1 && sn.last_prefill_rows > 0 && sn.last_prefill_limit < *least_limit)
            *least_limit = sn.last_prefill_limit;
        if (sn.oldest_prompt_wait_steps > *most_waited) *most_waited = sn.oldest_prompt_wait_steps;
    }
    assert_int_equal(o->done, 4);
    assert_int_equal(sn.prompt_wait_steps, wait < 0 ? 0 : wait == 0 ? 40 : wait); /* the stats (/metrics) */
    dear_close(d);
}

/* The prompt wait: with W = 2 each 200-token prompt is done in 2 steps (shares of 100 and 100) where the share by
 * time alone (the floor, 64) takes 4; with the default W = 40 the floor rules (200 tokens over 40 steps is less) */
static void test_prompt_wait(void **state) {
    (void)state;
    int32_t off[4], w2[4], dflt[4], waited_off, waited_w2, waited_dflt;
    int64_t least_off, least_w2, least_dflt;
    prompt_steps(-1, off, &least_off, &waited_off);
    prompt_steps(2, w2, &least_w2, &waited_w2);
    prompt_steps(0, dflt, &least_dflt, &waited_dflt);
    printf("steps to a 200-token prompt's first token (prompts 2-4): off %d %d %d, W = 2 %d %d %d, W = 40 %d %d %d\n",
           off[1], off[2], off[3], w2[1], w2[2], w2[3], dflt[1], dflt[2], dflt[3]);
    for (int k = 1; k < 4; k++) {
        assert_int_equal(off[k], 4);
        assert_int_equal(w2[k], 2);
        assert_int_equal(dflt[k], 4);
    }
    assert_int_equal(least_off, FM_STEP_PREFILL_FLOOR);
    assert_int_equal(least_w2, LONG / 2);
    assert_int_equal(least_dflt, FM_STEP_PREFILL_FLOOR);
    /* the longest wait seen at a mixed step: 3 steps at the floor, 1 with W = 2 */
    assert_int_equal(waited_off, 3), assert_int_equal(waited_w2, 1), assert_int_equal(waited_dflt, 3);
}

/* Route mixed.graphs=on (on the cpu: the rows padded to their graph's bucket, step_graphs.c): a step at the floor's
 * 64 prompt tokens beside the one stream is 65 rows, padded to 80, so the prompt takes the 79 rows the step runs
 * anyway and a 200-token prompt is done in 3 steps instead of 4 */
static void test_floor_fills_bucket(void **state) {
    (void)state;
    int32_t steps[4], waited;
    int64_t least;
    int64_t rows = 0;
    fm_mixed_bucket(1 + FM_STEP_PREFILL_FLOOR, &rows);
    load_routes = "mixed.graphs=on";
    prompt_steps(-1, steps, &least, &waited);
    load_routes = NULL;
    printf("the floor's step padded to %lld rows: prompt share %lld, steps to a 200-token prompt's token %d %d %d\n",
           (long long)rows, (long long)least, steps[1], steps[2], steps[3]);
    assert_int_equal(rows, 80);
    assert_int_equal(least, rows - 1);
    for (int k = 1; k < 4; k++) assert_int_equal(steps[k], 3);
}

/* A prompt queued for a slot is not waiting in the budget's sense: while every slot decodes it is not counted (the
 * stats' longest wait stays 0); once a stream ends and it starts, W = 2 splits it in two steps of 100, not the whole
 * room the steps it spent queued would otherwise demand */
static void count_end(void *user, const fm_sched_event *ev) {
    if (ev->end != FM_SCHED_RUNNING) ++*(int32_t *)user;
}

static void test_prompt_wait_queued(void **state) {
    (void)state;
    dear_world *d = dear_open(2);
    fm_error err;
    bool busy;
    fm_sched_stats sn;
    /* the first prompt beside the stream: its steps measure a prompt token's cost */
    for (int n = 0; n < 50 && d->o.n_stream < 3; n++)
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
    dear_submit(d, 0);
    for (int n = 0; n < 50 && d->o.done < 1; n++)
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
    assert_int_equal(d->o.done, 1);
    /* three more streams fill the four slots, the last one short */
    static int32_t more[3][8];
    int32_t ended = 0;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 8; i++) more[k][i] = (5 * i + 3 * k + 2) % fm_model_vocab_size(d->m);
        fm_sched_request q;
        fm_sched_request_init(&q);
        q.prompt = more[k], q.n_prompt = 8, q.params.max_tokens = k == 2 ? 6 : 60, q.params.ignore_eos = true;
        q.on_event = count_end, q.user = &ended;
        int64_t id;
        if (fm_sched_submit(d->s, &q, &id, &err)) fail_msg("%s", err.msg);
    }
    for (int n = 0; n < 3; n++)
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
    fm_sched_get_stats(d->s, &sn);
    assert_int_equal(sn.running, SEQS);
    dear_submit(d, 1); /* queued: no slot until the short stream ends */
    int32_t queued = 0, n_limits = 0;
    int64_t limits[8];
    for (int n = 0; n < 100 && d->o.done < 2; n++) {
        if (fm_sched_step(d->s, &busy, &err)) fail_msg("step: %s", err.msg);
        fm_sched_get_stats(d->s, &sn);
        if (sn.last_prefill_rows == 0) {
            assert_int_equal(sn.oldest_prompt_wait_steps, 0);
            queued++;
        } else if (n_limits < 8) limits[n_limits++] = sn.last_prefill_limit;
    }
    assert_int_equal(d->o.done, 2);
    assert_int_equal(ended, 1);
    printf("a prompt queued %d steps for a slot, then its shares: %lld %lld (W = 2)\n", queued, (long long)limits[0],
           (long long)(n_limits > 1 ? limits[1] : -1));
    assert_true(queued >= 2);
    assert_int_equal(n_limits, 2);
    assert_int_equal(limits[0], LONG / 2), assert_int_equal(limits[1], LONG / 2);
    dear_close(d);
}

/* the real clock: the same tokens (whatever share the CPU's times choose) */
static void test_wall_clock_same_tokens(void **state) {
    (void)state;
    outputs *fixed = calloc(1, sizeof *fixed), *lat = calloc(1, sizeof *lat);
    run(FM_STEP_BUDGET_FIXED, false, fixed, NULL);
    run(FM_STEP_BUDGET_LATENCY, false, lat, NULL);
    assert_int_equal(lat->done, N_PROMPTS);
    assert_memory_equal(lat->stream, fixed->stream, sizeof lat->stream);
    assert_memory_equal(lat->first, fixed->first, sizeof lat->first);
    free(fixed), free(lat);
}

static void refused(fm_step_budget_mode mode, double ratio, int64_t step_tokens, const char *names) {
    fm_status st;
    fm_error err = {{0}};
    fm_model *m = load(mode, ratio, step_tokens, &st, &err);
    assert_null(m);
    assert_int_equal(st, FM_ERR_USAGE);
    if (!strstr(err.msg, names)) fail_msg("'%s' does not name %s", err.msg, names);
}

static void test_options(void **state) {
    (void)state;
    fm_status st;
    fm_error err;
    double ratio = -1.0;
    fm_model *m = load(FM_STEP_BUDGET_AUTO, 0.0, 0, &st, &err); /* the default: latency, R = 1.5 */
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, &ratio), FM_STEP_BUDGET_LATENCY);
    assert_true(ratio == 1.5);
    fm_model_free(m);
    m = load(FM_STEP_BUDGET_LATENCY, 0.0, 0, &st, &err);
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, &ratio), FM_STEP_BUDGET_LATENCY);
    assert_true(ratio == 1.5);
    fm_model_free(m);
    m = load(FM_STEP_BUDGET_AUTO, 3.0, 0, &st, &err); /* a ratio with the default */
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, &ratio), FM_STEP_BUDGET_LATENCY);
    assert_true(ratio == 3.0);
    fm_model_free(m);
    m = load(FM_STEP_BUDGET_LATENCY, 3.5, 100, &st, &err);
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, &ratio), FM_STEP_BUDGET_LATENCY);
    assert_true(ratio == 3.5);
    fm_model_free(m);
    m = load(FM_STEP_BUDGET_FIXED, 0.0, 0, &st, &err);
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, NULL), FM_STEP_BUDGET_FIXED);
    fm_model_free(m);
    m = load(FM_STEP_BUDGET_AUTO, 0.0, -1, &st, &err); /* mixed steps off: nothing to size */
    assert_int_equal(st, FM_OK);
    assert_int_equal(fm_context_step_budget(m->context, NULL), FM_STEP_BUDGET_FIXED);
    fm_model_free(m);
    refused(FM_STEP_BUDGET_LATENCY, 0.0, -1, "--step-budget");
    refused(FM_STEP_BUDGET_FIXED, 0.0, -1, "--step-budget");
    refused(FM_STEP_BUDGET_AUTO, 3.0, -1, "--max-step-latency-ratio");
    refused(FM_STEP_BUDGET_FIXED, 3.0, 0, "--max-step-latency-ratio");
    refused(FM_STEP_BUDGET_LATENCY, 0.5, 0, "--max-step-latency-ratio");
    refused((fm_step_budget_mode)7, 0.0, 0, "--step-budget");
    /* the prompt wait: 40 under latency by default, as given, off; refused where the ratio is, and out of range */
    int32_t waits[][2] = {{0, 40}, {7, 7}, {-1, 0}};
    for (int i = 0; i < 3; i++) {
        load_prompt_wait = waits[i][0];
        m = load(FM_STEP_BUDGET_LATENCY, 0.0, 0, &st, &err);
        if (st) fail_msg("load: %s", err.msg);
        assert_int_equal(fm_context_prompt_wait_steps(m->context), waits[i][1]);
        fm_model_free(m);
    }
    load_prompt_wait = 0;
    m = load(FM_STEP_BUDGET_FIXED, 0.0, 0, &st, &err);
    assert_int_equal(fm_context_step_budget(m->context, &ratio), FM_STEP_BUDGET_FIXED);
    assert_true(ratio == 0.0);
    assert_int_equal(fm_context_prompt_wait_steps(m->context), 0); /* fixed: no prompt wait */
    fm_model_free(m);
    load_prompt_wait = 9;
    m = load(FM_STEP_BUDGET_AUTO, 0.0, 0, &st, &err);
    if (st) fail_msg("load: %s", err.msg);
    assert_int_equal(fm_context_step_budget(m->context, NULL), FM_STEP_BUDGET_LATENCY);
    assert_int_equal(fm_context_prompt_wait_steps(m->context), 9);
    fm_model_free(m);
    refused(FM_STEP_BUDGET_FIXED, 0.0, 0, "--max-prompt-wait-steps");
    load_prompt_wait = -1; /* off asks nothing of any budget: accepted with fixed */
    m = load(FM_STEP_BUDGET_FIXED, 0.0, 0, &st, &err);
    if (st) fail_msg("fixed with the prompt wait off: %s", err.msg);
    assert_int_equal(fm_context_step_budget(m->context, NULL), FM_STEP_BUDGET_FIXED);
    assert_int_equal(fm_context_prompt_wait_steps(m->context), 0);
    fm_model_free(m);
    load_prompt_wait = 9;
    refused(FM_STEP_BUDGET_AUTO, 0.0, -1, "--max-prompt-wait-steps");
    load_prompt_wait = -2;
    refused(FM_STEP_BUDGET_LATENCY, 0.0, 0, "--max-prompt-wait-steps");
    load_prompt_wait = FM_PROMPT_WAIT_STEPS_MAX + 1;
    refused(FM_STEP_BUDGET_LATENCY, 0.0, 0, "--max-prompt-wait-steps");
    load_prompt_wait = 0;
    /* a rank of a group (each rank runs its own scheduler in step with the others): fixed, and latency refused */
    load_ep_ranks = 2;
    m = load(FM_STEP_BUDGET_AUTO, 0.0, 0, &st, &err);
    if (st) fail_msg("load as rank 0 of 2: %s", err.msg);
    assert_int_equal(fm_context_step_budget(m->context, NULL), FM_STEP_BUDGET_FIXED);
    fm_model_free(m);
    refused(FM_STEP_BUDGET_LATENCY, 0.0, 0, "--ep/--tp");
    refused(FM_STEP_BUDGET_AUTO, 2.5, 0, "--max-step-latency-ratio");
    load_prompt_wait = 5;
    refused(FM_STEP_BUDGET_AUTO, 0.0, 0, "--max-prompt-wait-steps");
    load_prompt_wait = 0;
    load_ep_ranks = 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimates),
        cmocka_unit_test(test_settles_on_affine_cost),
        cmocka_unit_test(test_share_follows_cost),
        cmocka_unit_test(test_prompts_turn),
        cmocka_unit_test(test_prompt_wait_share),
        cmocka_unit_test(test_prompt_wait),
        cmocka_unit_test(test_prompt_wait_queued),
        cmocka_unit_test(test_floor_fills_bucket),
        cmocka_unit_test(test_wall_clock_same_tokens),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
