/* The reference sampler (sampler.h says what one step computes). Plain and exact rather than fast: a full sort of
 * the vocabulary per step, double-precision sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "util/status.h"

void fm_sampling_init(fm_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 0.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

fm_status fm_sampling_check(const fm_sampling *s, fm_error *err) {
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        return fm_fail(err, FM_ERR_USAGE, "temperature must be a finite number >= 0 (0 = greedy), got %g",
                       (double)s->temperature);
    if (s->top_k < 0) return fm_fail(err, FM_ERR_USAGE, "top_k must be >= 0 (0 = off), got %d", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return fm_fail(err, FM_ERR_USAGE, "top_p must be in (0, 1] (1 = off), got %g", (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p < 1.0f))
        return fm_fail(err, FM_ERR_USAGE, "min_p must be in [0, 1) (0 = off), got %g", (double)s->min_p);
    if (!(s->repetition_penalty > 0.0f) || !isfinite(s->repetition_penalty))
        return fm_fail(err, FM_ERR_USAGE, "repetition_penalty must be a finite number > 0 (1 = off), got %g",
                       (double)s->repetition_penalty);
    if (!(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return fm_fail(err, FM_ERR_USAGE, "presence_penalty must be in [-2, 2], got %g", (double)s->presence_penalty);
    if (!(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return fm_fail(err, FM_ERR_USAGE, "frequency_penalty must be in [-2, 2], got %g", (double)s->frequency_penalty);
    if (s->n_bias < 0 || s->n_bias > FM_MAX_LOGIT_BIAS)
        return fm_fail(err, FM_ERR_USAGE, "logit_bias has at most %d entries, got %d", FM_MAX_LOGIT_BIAS, s->n_bias);
    if (s->n_logprobs < 0 || s->n_logprobs > FM_MAX_LOGPROBS)
        return fm_fail(err, FM_ERR_USAGE, "logprobs must be in [0, %d], got %d", FM_MAX_LOGPROBS, s->n_logprobs);
    return FM_OK;
}

fm_status fm_logit_bias_check(const fm_logit_bias *bias, int32_t n, int32_t vocab, fm_error *err) {
    if (n < 0 || n > FM_MAX_LOGIT_BIAS || (n > 0 && !bias))
        return fm_fail(err, FM_ERR_USAGE, "logit_bias has at most %d entries, got %d", FM_MAX_LOGIT_BIAS, n);
    for (int32_t i = 0; i < n; i++) {
        if (bias[i].id < 0 || bias[i].id >= vocab)
            return fm_fail(err, FM_ERR_USAGE, "logit_bias: token id %d is outside the vocabulary of %d", bias[i].id,
                           vocab);
        if (!(bias[i].bias >= -100.0f && bias[i].bias <= 100.0f))
            return fm_fail(err, FM_ERR_USAGE, "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                           bias[i].id, (double)bias[i].bias);
        for (int32_t j = 0; j < i; j++)
            if (bias[j].id == bias[i].id)
                return fm_fail(err, FM_ERR_USAGE, "logit_bias: token id %d is given twice", bias[i].id);
    }
    return FM_OK;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double fm_sample_uniform(uint64_t seed, uint64_t step) {
    return (double)(splitmix64(splitmix64(seed) ^ step) >> 11) * (1.0 / 9007199254740992.0);
}

/* values descending */
static int desc_cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

size_t fm_sampler_scratch_bytes(int32_t vocab) { return (size_t)vocab * (2 * sizeof(float) + sizeof(int32_t) + 1); }

/* Penalised logits into l[vocab] from the penalty state (either may be NULL: no such history), then the bias and
 * the mask. NaN becomes -inf: it can never be drawn. */
static void apply_penalties(const float *logits, int32_t vocab, const fm_sampling *s, const int32_t *counts,
                            const uint8_t *seen, const fm_logit_bias *bias, const uint32_t *mask, float *l) {
    for (int32_t i = 0; i < vocab; i++) l[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    const bool rep = seen && s->repetition_penalty != 1.0f;
    const bool pres = counts && (s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f);
    for (int32_t i = 0; i < vocab; i++) {
        if (rep && seen[i]) l[i] = l[i] > 0.0f ? l[i] / s->repetition_penalty : l[i] * s->repetition_penalty;
        if (pres && counts[i]) l[i] -= s->presence_penalty + s->frequency_penalty * (float)counts[i];
    }
    for (int32_t j = 0; bias && j < s->n_bias; j++)
        if (bias[j].id >= 0 && bias[j].id < vocab) l[bias[j].id] += bias[j].bias;
    if (mask && s->masked)
        for (int32_t i = 0; i < vocab; i++)
            if (!((mask[i >> 5] >> (i & 31)) & 1u)) l[i] = -INFINITY;
}

void fm_sample_state_add(int32_t vocab, int32_t id, bool generated, int32_t *counts, uint8_t *seen) {
    if (id < 0 || id >= vocab) return; /* ids are checked where they enter; never index out of bounds here */
    seen[id] = 1;
    if (generated) counts[id]++;
}

static void raw_logprobs(const float *logits, int32_t vocab, int32_t chosen, int32_t n_top, fm_sample_info *info) {
    double mx = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) sum += isnan(logits[i]) ? 0.0 : exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    info->logprob = (float)((double)logits[chosen] - lse);
    info->n_top = n_top < vocab ? n_top : vocab;
    /* selection of the n_top largest, descending, ties to the lower id */
    for (int32_t j = 0; j < info->n_top; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < vocab; i++) {
            bool taken = false;
            for (int32_t q = 0; q < j && !taken; q++) taken = info->top[q].id == i;
            if (taken || isnan(logits[i])) continue;
            if (best < 0 || logits[i] > logits[best]) best = i;
        }
        if (best < 0) { /* fewer finite ids than asked */
            info->n_top = j;
            break;
        }
        info->top[j].id = best;
        info->top[j].logprob = (float)((double)logits[best] - lse);
    }
}

int32_t fm_sample(const float *logits, int32_t vocab, const fm_sampling *s, const int32_t *hist, int64_t n_hist,
                  int64_t n_prompt, uint64_t step, void *scratch, fm_sample_info *info) {
    int32_t *counts = (int32_t *)((float *)scratch + 2 * (size_t)vocab);
    uint8_t *seen = (uint8_t *)(counts + vocab);
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    memset(seen, 0, (size_t)vocab);
    for (int64_t i = 0; i < n_hist; i++) fm_sample_state_add(vocab, hist[i], i >= n_prompt, counts, seen);
    return fm_sample_row(logits, vocab, s, counts, seen, NULL, NULL, step, scratch, info);
}

int32_t fm_sample_row(const float *logits, int32_t vocab, const fm_sampling *s, const int32_t *counts,
                      const uint8_t *seen, const fm_logit_bias *bias, const uint32_t *mask, uint64_t step,
                      float *scratch, fm_sample_info *info) {
    float *l = scratch, *sorted = scratch + vocab;
    apply_penalties(logits, vocab, s, counts, seen, bias, mask, l);
    int32_t chosen = 0;
    for (int32_t i = 1; i < vocab; i++) /* the argmax, ties to the lower id: greedy's answer */
        if (l[i] > l[chosen]) chosen = i;
    if (s->temperature > 0.0f && isfinite(l[chosen])) { /* +inf or all -inf: the argmax is the only candidate */
        const double zmax = (double)(l[chosen] / s->temperature); /* the largest z: its weight is exactly 1 */
        for (int32_t i = 0; i < vocab; i++) l[i] = l[i] / s->temperature;
        /* the filters as value thresholds: an id is kept when its scaled logit is >= the threshold */
        double thr = -INFINITY;
        memcpy(sorted, l, (size_t)vocab * sizeof *sorted);
        qsort(sorted, (size_t)vocab, sizeof *sorted, desc_cmp);
        int32_t n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab; /* candidates: sorted[0..n) */
        if (n < vocab) thr = sorted[n - 1];
        while (n < vocab && sorted[n] >= thr) n++; /* ids tied with the k-th stay, and count in top-p's mass */
        if (s->top_p < 1.0f) { /* the smallest prefix whose mass reaches p: keep while the mass before is below p */
            double total = 0.0, before = 0.0;
            for (int32_t i = 0; i < n; i++) total += exp((double)sorted[i] - zmax);
            int32_t m = 0;
            while (m < n && before < (double)s->top_p * total) before += exp((double)sorted[m] - zmax), m++;
            if (m < 1) m = 1;
            if ((double)sorted[m - 1] > thr) thr = sorted[m - 1];
        }
        if (s->min_p > 0.0f) { /* probability >= min_p x the largest's */
            const double t = zmax + log((double)s->min_p);
            if (t > thr) thr = t;
        }
        /* the draw: the first id, in id order, whose cumulative kept mass exceeds u x the total (a device walks the
           vocabulary in blocks the same way, without a sort) */
        double total = 0.0;
        for (int32_t i = 0; i < vocab; i++)
            if ((double)l[i] >= thr) total += exp((double)l[i] - zmax);
        const double target = fm_sample_uniform(s->seed, step) * total;
        double cum = 0.0;
        for (int32_t i = 0; i < vocab; i++) {
            if (!((double)l[i] >= thr) || l[i] == -INFINITY) continue;
            cum += exp((double)l[i] - zmax);
            chosen = i; /* rounding can leave the target at the total: then the last kept id */
            if (cum > target) break;
        }
    }
    if (info) raw_logprobs(logits, vocab, chosen, s->n_logprobs, info);
    return chosen;
}
