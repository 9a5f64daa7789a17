/* The prefill share of a mixed step (scheduler.c), sized by time or fixed (docs/mixed-steps.md "The step budget").
 *
 * fixed: a step holds every decoding sequence's next token and prefill rows up to the token budget
 * (--max-step-tokens). latency: the scheduler reports each step it ran (its decode rows, prefill rows and wall time)
 * and this keeps two estimates: the time of a decode-only step at each batch size, and the marginal time of a prefill
 * token beside decode rows ((step - decode-only step at its batch) / prefill rows). A step with decode rows then
 * takes the prefill rows whose predicted time keeps the step within ratio x the decode-only step:
 *     prefill <= (ratio - 1) x decode_ms(batch) / token_ms
 * at least FM_STEP_PREFILL_FLOOR (prompts keep moving even where prefill is dear), at most what the fixed budget
 * leaves. A step without decode rows takes the whole budget (no stream waits on it: a prompt's time to first token
 * is what counts then), and so does every step before both estimates exist, and every step while more prompts wait
 * than sequences decode: the share follows the decode batch, and a batch kept small by waiting prompts would keep
 * them waiting (a load of many long prompts at once otherwise settles at a few streams and starved prompts).
 *
 * The prompts' wait (wait_steps W > 0, --max-prompt-wait-steps): the latency share alone can leave a long prompt
 * waiting for many steps (at the floor of 64 tokens, 29 steps for 1,800 tokens, each step as slow as a mixed step).
 * So a step with decode rows also takes at least the waiting prompts' tokens over the steps left before the one that
 * has waited longest has waited W steps: ceil(tokens / max(1, W - oldest)). The streams' steps then grow only as
 * much as the waiting prompts need to be done in time, and a prompt that has waited W steps gets the whole budget.
 *
 * The marginal cost need not be linear: on a GPU the first prefill rows of a step are cheap (the weights are read
 * for the decode rows anyway) and later ones cost more. The estimate is the average cost per token at the shares
 * recently chosen, so the share settles where the measured step is ratio x the decode-only step. */
#ifndef FM_ENGINE_STEP_BUDGET_H
#define FM_ENGINE_STEP_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

/* The least prefill share of a step with decode rows under the latency budget: a 1,800-token prompt then reaches
 * its first token in at most 29 steps however dear prefill is; and below ~64 rows a mixed step's fixed cost (its
 * launches, un-graphed, and the expert weights a prompt chunk touches) dominates, so a smaller share would cost the
 * prompt steps without making the streams' step much shorter. */
#define FM_STEP_PREFILL_FLOOR 64
/* the default ratio: R = 2 left the streams' inter-token p99 at 3x their p50 while long prompts arrived on an H100,
 * 1.5 within 2x (docs/RESULTS.md 2.24, 2.26) */
#define FM_STEP_LATENCY_RATIO 1.5
/* the default prompt wait W: 40 kept that spread at 1.97x and a 64-client load of long prompts at ~95 % of the fixed
 * budget's output rate; 20 gave 2.03x and ~98 % (docs/RESULTS.md 2.26) */
#define FM_STEP_PROMPT_WAIT_STEPS 40

typedef struct fm_step_budget {
    int64_t tokens;     /* the fixed budget: the tokens of a step, decode rows included (> 0) */
    bool latency;       /* the prefill share sized by time; else every token the fixed budget leaves */
    double ratio;       /* latency: a step's predicted time at most ratio x the decode-only step (>= 1) */
    int32_t wait_steps; /* latency: the prompts' wait W in steps (0: no such share) */
    int32_t max_batch;  /* decode rows of a step at most */
    double *decode_ms;  /* [max_batch + 1] a decode-only step's time by its batch, smoothed; 0: not measured */
    double token_ms;    /* a prefill token's marginal time beside decode rows, smoothed; < 0: not measured */
} fm_step_budget;

/* The requests a step could give prompt rows to (those prefilling, and the waiting ones that could start now: not
 * those queued for a slot): how many, their prompt tokens not yet in the cache (a request not started counts its
 * whole prompt: the prefix it may map is known only when it starts), and the steps the one waiting longest has
 * waited while it could have been served */
typedef struct fm_step_waiting {
    int32_t n;
    int64_t tokens;
    int32_t oldest_steps;
} fm_step_waiting;

fm_status fm_step_budget_init(fm_step_budget *b, int64_t tokens, bool latency, double ratio, int32_t wait_steps,
                              int32_t max_batch, fm_error *err);
void fm_step_budget_free(fm_step_budget *b);

/* The prefill tokens a step with n_dec decode rows may hold while the requests w (NULL: none) wait for (the rest
 * of) their prompt (0 when the decode rows fill the fixed budget). */
int64_t fm_step_budget_prefill(const fm_step_budget *b, int32_t n_dec, const fm_step_waiting *w);
/* A step ran: n_dec decode rows and n_prefill prefill rows in ms milliseconds of wall time. */
void fm_step_budget_observe(fm_step_budget *b, int32_t n_dec, int64_t n_prefill, double ms);
/* The decode-only step's estimated time at batch n_dec (the nearest batch measured); 0 before any. */
double fm_step_budget_decode_ms(const fm_step_budget *b, int32_t n_dec);

#endif
