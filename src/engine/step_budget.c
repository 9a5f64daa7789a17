/* The prefill share of a mixed step from measured step times (step_budget.h says the policy). */
#include <stdlib.h>

#include "engine/step_budget.h"

/* weight of a new sample in the smoothed estimates: a few steps follow a change of load (a longer context, another
 * batch), one slow step (a page fault, a host stall) moves them by a quarter at most */
#define SMOOTH 0.25
/* a decode-only step above CLIP x its estimate counts as CLIP x: the first step at a batch bucket may capture its CUDA
 * graph, a one-off many times a step's time, and an estimate too high would give the next steps too large a share.
 * A prompt token's cost is not clipped: too high an estimate errs on the streams' side, and it must follow a real
 * rise at once */
#define CLIP 2.0

fm_status fm_step_budget_init(fm_step_budget *b, int64_t tokens, bool latency, double ratio, int32_t wait_steps,
                              int32_t max_batch, fm_error *err) {
    *b = (fm_step_budget){tokens, latency, ratio, wait_steps, max_batch, NULL, -1.0};
    if (tokens < 1 || max_batch < 0 || wait_steps < 0 || (latency && !(ratio >= 1.0)))
        return fm_fail(err, FM_ERR_USAGE, "step budget of %lld tokens, ratio %g, wait %d steps, batch %d: out of range",
                       (long long)tokens, ratio, wait_steps, max_batch);
    b->decode_ms = calloc((size_t)max_batch + 1, sizeof *b->decode_ms);
    if (!b->decode_ms) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    return FM_OK;
}

void fm_step_budget_free(fm_step_budget *b) {
    free(b->decode_ms);
    b->decode_ms = NULL;
}

double fm_step_budget_decode_ms(const fm_step_budget *b, int32_t n_dec) {
    if (n_dec < 0 || n_dec > b->max_batch) return 0.0;
    for (int32_t d = 0; d <= b->max_batch; d++) { /* n_dec, then n_dec - 1, n_dec + 1, ...: the lower one first */
        if (n_dec - d >= 0 && b->decode_ms[n_dec - d] > 0.0) return b->decode_ms[n_dec - d];
        if (n_dec + d <= b->max_batch && b->decode_ms[n_dec + d] > 0.0) return b->decode_ms[n_dec + d];
    }
    return 0.0;
}

/* the waiting prompts' tokens over the steps left before the longest-waiting one has waited W steps (0: no rule) */
static int64_t wait_share(const fm_step_budget *b, const fm_step_waiting *w) {
    if (b->wait_steps <= 0 || !w || w->n <= 0 || w->tokens <= 0) return 0;
    const int64_t left = w->oldest_steps < b->wait_steps ? b->wait_steps - w->oldest_steps : 1;
    return (w->tokens + left - 1) / left;
}

int64_t fm_step_budget_prefill(const fm_step_budget *b, int32_t n_dec, const fm_step_waiting *w) {
    const int64_t room = b->tokens - n_dec;
    if (room <= 0) return 0;
    const double dec = fm_step_budget_decode_ms(b, n_dec);
    const int32_t n_wait = w ? w->n : 0;
    if (!b->latency || n_dec == 0 || n_wait > n_dec || dec <= 0.0 || b->token_ms < 0.0) return room;
    if (b->token_ms == 0.0) return room; /* prefill measured free beside the decode rows */
    const double by_time = (b->ratio - 1.0) * dec / b->token_ms;
    const int64_t floor = FM_STEP_PREFILL_FLOOR < room ? FM_STEP_PREFILL_FLOOR : room;
    if (by_time >= (double)room) return room;
    int64_t share = by_time > (double)floor ? (int64_t)by_time : floor;
    const int64_t need = wait_share(b, w);
    if (need > share) share = need < room ? need : room;
    return share;
}

static void smooth(double *est, double sample, bool clip) {
    if (*est <= 0.0) *est = sample; /* the first sample (or after a free one: nothing to clip against) */
    else *est += SMOOTH * ((clip && sample > CLIP * *est ? CLIP * *est : sample) - *est);
}

void fm_step_budget_observe(fm_step_budget *b, int32_t n_dec, int64_t n_prefill, double ms) {
    if (n_dec < 1 || n_dec > b->max_batch || !(ms > 0.0)) return; /* a prefill-only step says nothing of either */
    if (n_prefill == 0) {
        smooth(&b->decode_ms[n_dec], ms, true);
        return;
    }
    const double dec = fm_step_budget_decode_ms(b, n_dec);
    if (dec <= 0.0) return;
    const double per_token = ms > dec ? (ms - dec) / (double)n_prefill : 0.0;
    smooth(&b->token_ms, per_token, false);
}
