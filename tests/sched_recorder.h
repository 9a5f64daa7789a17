/* What the scheduler (include/fp8moe_sched.h) told each request, for the tests that drive it: the ids, their sample
 * infos (log-probabilities), the step each came at, the final event. Requests are indexed by their id, so one
 * recorder serves a scheduler's requests 0..SCHED_REC_REQ-1. The event callback checks what holds for every
 * request: ids in order (n_generated counts them), an info with every id, nothing after the final event, at most
 * max_tokens ids. Any failure fails the test (cmocka). */
#ifndef FP8MOE_TESTS_SCHED_RECORDER_H
#define FP8MOE_TESTS_SCHED_RECORDER_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe_sched.h"

enum { SCHED_REC_REQ = 24, SCHED_REC_TOKENS = 32 };

typedef struct sched_rec {
    int64_t max_tokens; /* of each request sched_rec_request makes; one id more fails */
    int32_t n_logprobs; /* top log-probabilities each of them asks for */
    int64_t step;       /* steps run through sched_rec_step */
    int64_t most_rows;  /* the most prompt and decode tokens one of them ran */
    int32_t ids[SCHED_REC_REQ][SCHED_REC_TOKENS];
    fm_sample_info info[SCHED_REC_REQ][SCHED_REC_TOKENS];
    int64_t at[SCHED_REC_REQ][SCHED_REC_TOKENS]; /* the step of each id */
    int64_t n[SCHED_REC_REQ];                    /* ids so far */
    int32_t finals[SCHED_REC_REQ];               /* final events (0 while running, then 1) */
    fm_sched_end end[SCHED_REC_REQ];             /* of the final event: */
    int64_t n_generated[SCHED_REC_REQ], n_cached[SCHED_REC_REQ];
    char msg[SCHED_REC_REQ][256];
} sched_rec;

/* A zeroed recorder (calloc: free it with free) for requests of max_tokens ids (<= SCHED_REC_TOKENS) and n_logprobs
 * top log-probabilities. */
sched_rec *sched_rec_new(int64_t max_tokens, int32_t n_logprobs);
/* The scheduler's on_event: user is the sched_rec. */
void sched_rec_on_event(void *user, const fm_sched_event *ev);
/* A greedy request of the prompt into r: max_tokens ids (eos ignored), n_logprobs. */
fm_sched_request sched_rec_request(sched_rec *r, const int32_t *prompt, int64_t n);
/* Submits q (a failure fails the test); its id. */
int64_t sched_rec_submit(fm_sched *s, const fm_sched_request *q);
/* sched_rec_submit(sched_rec_request(...)). */
int64_t sched_rec_submit_prompt(fm_sched *s, sched_rec *r, const int32_t *prompt, int64_t n);
/* One step, counted in r->step, its tokens in r->most_rows; false when the scheduler had nothing to do. */
bool sched_rec_step(fm_sched *s, sched_rec *r);
/* Steps until request q has ended (10000 at most). */
void sched_rec_run_until(fm_sched *s, sched_rec *r, int64_t q);
/* Steps until the scheduler has nothing to do (10000 at most). */
void sched_rec_run_idle(fm_sched *s, sched_rec *r);
/* Of requests 0..n_req-1, the widest gap in steps between two ids of one, while the others' prompts were prefilled
 * (up to the step of the last first id): 1 when every running request got an id at every step. */
int64_t sched_rec_gap_during_prefill(const sched_rec *r, int32_t n_req);

#endif
