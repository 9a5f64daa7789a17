/* fp8moe: the scheduler's public API. Continuous batching: requests join and leave the running decode batch between
 * steps.
 *
 * One thread owns the scheduler (and its context): it calls fm_sched_step in a loop; each step is one forward
 * pass. With mixed steps (the load's fm_options.max_step_tokens, on by default) a step holds every running request's
 * next token and, in the rest of the token budget, prefill chunks of one or more waiting requests, so a long prompt
 * delays the running streams by one budgeted step at most (docs/mixed-steps.md); how much of the budget prompts take
 * beside decoding requests follows the steps' measured times (fm_options.step_budget, fm_sched_set_clock). With them
 * off, a step is one prefill chunk of one waiting request or one decode step of every active request, alternating.
 * Requests are submitted and cancelled between steps by the same thread; a server wraps the scheduler with its own
 * lock and queue.
 *
 * Every event of a request (each sampled token, then its end) goes to the request's callback, on the stepping
 * thread, in order. fm_context_generate is this scheduler run to completion.
 *
 * A request may keep its sequence's KV cache when it finishes (keep = true) and a later request may continue from
 * it (reuse = the earlier request's id): the later prompt is the whole conversation, the scheduler finds the common
 * prefix with what the kept cache holds and prefills only the rest (a chat turn re-runs only the new text).
 *
 * With the context's prefix cache on (fm_context_prefix_cache), any request maps the longest cached prefix of its
 * prompt, from finished requests or running ones, and prefills the rest (fm_sched_event.n_cached); the full blocks of
 * every request, prompt and output, are named as they are written. */
#ifndef FP8MOE_SCHED_H
#define FP8MOE_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_sched fm_sched;

typedef enum fm_sched_end {
    FM_SCHED_RUNNING = 0,
    FM_SCHED_LENGTH,    /* max_tokens reached */
    FM_SCHED_EOS,       /* an eos id (not part of the output) */
    FM_SCHED_STOP,      /* a stop id or stop sequence of ids (not part of the output) */
    FM_SCHED_CANCELLED, /* fm_sched_cancel */
    FM_SCHED_ERROR,     /* the request failed (e.g. the KV pool ran out of blocks): msg says why */
} fm_sched_end;

typedef struct fm_sched_event {
    int64_t req;                /* the request */
    int32_t id;                 /* a new token (-1 on the final event when it carries no token) */
    const fm_sample_info *info; /* its log-probabilities (top n_logprobs of the request), NULL without a token */
    fm_sched_end end;           /* FM_SCHED_RUNNING, or why the request ended: its last event */
    int64_t n_prompt;           /* prompt tokens of the request; n_cached of them came from a kept cache */
    int64_t n_cached;
    int64_t n_generated; /* tokens of output so far; on the final event the output's length (the ids of a
                            stop sequence, sent before it matched, are cut from it) */
    const char *msg;     /* FM_SCHED_ERROR: the reason */
} fm_sched_event;

typedef void (*fm_sched_fn)(void *user, const fm_sched_event *ev);

typedef struct fm_sched_request {
    const int32_t *prompt; /* copied at submit */
    int64_t n_prompt;
    fm_gen_params params;
    int32_t n_logprobs; /* top log-probabilities per token, 0..FM_MAX_LOGPROBS */
    bool keep;          /* keep the KV cache after the end (release with fm_sched_release) */
    int64_t reuse;      /* a kept request whose cache this prompt continues; -1: none */
    fm_sched_fn on_event;
    void *user;
} fm_sched_request;

void fm_sched_request_init(fm_sched_request *r); /* greedy, reuse -1 */

/* A scheduler over the context c (max_seqs > 0; c must outlive it), within c's limits (fm_context_params);
 * prefill_chunk: prompt tokens of one request per step at most (0: the context's max_tokens); the step budget is the
 * context's (fm_context_max_step_tokens). */
fm_status fm_sched_create(fm_context *c, int64_t prefill_chunk, fm_sched **out, fm_error *err);
/* Ends every request (cancelled, events sent) and frees what it holds. */
void fm_sched_free(fm_sched *s);

/* Queues a request (checked now: ids in the vocabulary, prompt + max_tokens within the context, sampling values);
 * *req is its id. */
fm_status fm_sched_submit(fm_sched *s, const fm_sched_request *r, int64_t *req, fm_error *err);
/* Cancels a waiting or running request at the next step (its blocks are freed, its last event says cancelled).
 * Unknown or finished ids are ignored. */
void fm_sched_cancel(fm_sched *s, int64_t req);
/* Frees the cache a finished request kept. */
void fm_sched_release(fm_sched *s, int64_t req);

/* One step (one forward pass); false in *busy when there was nothing to do. An error here is the backend's (fatal). */
fm_status fm_sched_step(fm_sched *s, bool *busy, fm_error *err);

/* The clock that times the steps (the latency step budget, fm_options.step_budget; the stats): milliseconds from any
 * origin, never decreasing. NULL: the monotonic clock (the default). For tests and simulations: a clock that advances
 * by a modelled cost of each step makes the budget's choices deterministic. */
typedef double (*fm_sched_clock_fn)(void *user);
void fm_sched_set_clock(fm_sched *s, fm_sched_clock_fn now_ms, void *user);

typedef struct fm_sched_stats {
    int32_t waiting, running, kept;          /* requests */
    int32_t kv_blocks_used, kv_blocks_total; /* used: held by a sequence (cached blocks count as free) */
    /* the prefix cache (docs/prefix-caching.md): cached blocks no sequence holds, and those given up for new tokens;
       requests that looked up their prompt (queries) and found a prefix (hits); their prompt tokens, and those mapped
     */
    bool prefix_cache;
    int32_t kv_blocks_cached;
    int64_t kv_evictions;
    int64_t prefix_queries, prefix_hits, prefix_prompt_tokens, prefix_cached_tokens;
    /* hybrid models (Qwen3-Next): the snapshots of the recurrent states (docs/prefix-caching.md): slots, usable
       snapshots, snapshots taken, copied into a request's states (its cached tokens came with one), given up */
    int32_t state_slots, state_snapshots;
    int64_t state_saves, state_restores, state_evictions;
    int64_t prefill_tokens, decode_tokens, decode_steps;
    /* steps that ran rows; those with decode and prefill rows together (mixed), and their prefill tokens */
    int64_t steps, mixed_steps, mixed_prefill_tokens;
    /* the last step: its decode and prefill rows, the prefill tokens it could take (the step budget's share; the
       prefill chunk without mixed steps), its wall time */
    int32_t last_decode_rows;
    int64_t last_prefill_rows, last_prefill_limit;
    double last_step_ms;
    /* mixed steps: the share sized by time (fm_options.step_budget), and the estimates behind it at the last step's
       batch: a decode-only step, a prefill token beside it (0: not measured yet) */
    bool step_latency;
    double est_decode_ms, est_prefill_token_ms;
    /* the latency budget's prompt wait W (0: off or fixed), and the steps the longest-waiting prompt had waited at the
       last mixed step (0: none waited) */
    int32_t prompt_wait_steps, oldest_prompt_wait_steps;
    bool experts_host; /* experts in host memory: the expert cache's counters (fm_expert_stats) */
    int32_t expert_slots;
    int64_t expert_hits, expert_misses;
    uint64_t expert_bytes_copied;
} fm_sched_stats;
void fm_sched_get_stats(const fm_sched *s, fm_sched_stats *st);

#ifdef __cplusplus
}
#endif
#endif
