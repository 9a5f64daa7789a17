/* The scheduler tests' recorder of events (sched_recorder.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "sched_recorder.h"

enum { MAX_STEPS = 10000 }; /* a scheduler that never gets there is stuck */

sched_rec *sched_rec_new(int64_t max_tokens, int32_t n_logprobs) {
    assert_true(max_tokens > 0 && max_tokens <= SCHED_REC_TOKENS);
    sched_rec *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->max_tokens = max_tokens, r->n_logprobs = n_logprobs;
    return r;
}

void sched_rec_on_event(void *user, const fm_sched_event *ev) {
    sched_rec *r = user;
    const int64_t q = ev->req;
    assert_true(q >= 0 && q < SCHED_REC_REQ);
    assert_int_equal(r->finals[q], 0); /* the final event is the last */
    if (ev->id >= 0) {
        assert_true(r->n[q] < r->max_tokens);
        assert_non_null(ev->info);
        const int64_t k = r->n[q]++;
        r->ids[q][k] = ev->id, r->info[q][k] = *ev->info, r->at[q][k] = r->step;
        if (ev->end == FM_SCHED_RUNNING) assert_int_equal(ev->n_generated, r->n[q]); /* in order, none lost */
    }
    if (ev->end != FM_SCHED_RUNNING) {
        r->finals[q]++;
        r->end[q] = ev->end, r->n_generated[q] = ev->n_generated, r->n_cached[q] = ev->n_cached;
        if (ev->msg) snprintf(r->msg[q], sizeof r->msg[q], "%s", ev->msg);
    }
}

fm_sched_request sched_rec_request(sched_rec *r, const int32_t *prompt, int64_t n) {
    fm_sched_request q;
    fm_sched_request_init(&q);
    q.prompt = prompt, q.n_prompt = n, q.params.max_tokens = r->max_tokens, q.params.ignore_eos = true;
    q.n_logprobs = r->n_logprobs, q.on_event = sched_rec_on_event, q.user = r;
    return q;
}

int64_t sched_rec_submit(fm_sched *s, const fm_sched_request *q) {
    int64_t id;
    fm_error err;
    if (fm_sched_submit(s, q, &id, &err)) fail_msg("submit: %s", err.msg);
    return id;
}

int64_t sched_rec_submit_prompt(fm_sched *s, sched_rec *r, const int32_t *prompt, int64_t n) {
    const fm_sched_request q = sched_rec_request(r, prompt, n);
    return sched_rec_submit(s, &q);
}

bool sched_rec_step(fm_sched *s, sched_rec *r) {
    bool busy;
    fm_error err;
    fm_sched_stats a, b;
    fm_sched_get_stats(s, &a);
    r->step++;
    if (fm_sched_step(s, &busy, &err)) fail_msg("step: %s", err.msg);
    fm_sched_get_stats(s, &b);
    const int64_t rows = b.prefill_tokens - a.prefill_tokens + b.decode_tokens - a.decode_tokens;
    if (rows > r->most_rows) r->most_rows = rows;
    return busy;
}

void sched_rec_run_until(fm_sched *s, sched_rec *r, int64_t q) {
    assert_true(q >= 0 && q < SCHED_REC_REQ);
    for (int guard = 0; guard < MAX_STEPS && !r->finals[q]; guard++) sched_rec_step(s, r);
    if (!r->finals[q]) fail_msg("request %lld never ended", (long long)q);
}

void sched_rec_run_idle(fm_sched *s, sched_rec *r) {
    for (int guard = 0; guard < MAX_STEPS; guard++)
        if (!sched_rec_step(s, r)) return;
    fail_msg("the scheduler never went idle");
}

int64_t sched_rec_gap_during_prefill(const sched_rec *r, int32_t n_req) {
    int64_t last_first = 0, gap = 0;
    for (int32_t q = 0; q < n_req; q++)
        if (r->at[q][0] > last_first) last_first = r->at[q][0];
    for (int32_t q = 0; q < n_req; q++)
        for (int64_t k = 1; k < r->n[q] && r->at[q][k] <= last_first; k++)
            if (r->at[q][k] - r->at[q][k - 1] > gap) gap = r->at[q][k] - r->at[q][k - 1];
    return gap;
}
