/* Token sampling: the reference (CPU) sampler that a device sampler must reproduce.
 *
 * One step turns a row of logits [vocab] into one token id:
 *   1. penalties on the logits (the sequence's history: prompt ids, then generated ids)
 *        repetition r (Hugging Face, CTRL paper): every id seen in prompt or output: l > 0 ? l / r : l * r
 *        presence p, frequency f (OpenAI): every id generated c > 0 times: l -= p + f * c
 *      then the logit bias (OpenAI logit_bias: l += bias for each listed id), then the constraint's mask (structured
 *        outputs: every id the mask does not allow becomes -inf, so greedy picks the best allowed id and sampling
 *        draws among the allowed ones only)
 *   2. temperature 0: the argmax (ties: the lowest id). Otherwise z = l / T, then the filters, in Hugging Face's
 *        order, each a threshold on z (ids tied at a threshold are kept together, as Hugging Face's top-k does):
 *        top-k (z >= the k-th largest), top-p (z >= the smallest z of the shortest prefix, by probability, whose
 *        mass reaches p of what top-k left), min-p (probability >= min_p times the largest)
 *   3. one uniform u in [0, 1) from (seed, step) by a counter-based hash (fm_sample_uniform); the id is the first
 *        kept one, in id order, whose cumulative mass exceeds u times the kept total. Id order (not probability
 *        order) lets a device sampler walk the vocabulary in blocks without sorting it and draw the same id; the
 *        same seed gives the same tokens on every backend and in any batch.
 * Log-probabilities are those of the model's own distribution (log-softmax of the raw logits, before penalties,
 * temperature and filters), as the OpenAI API and vLLM report them. */
#ifndef FM_ENGINE_SAMPLER_H
#define FM_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"

typedef struct fm_sampling {
    float temperature;        /* 0: greedy; > 0: scale the logits by 1 / T */
    int32_t top_k;            /* 0: off */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1); 0: off */
    float repetition_penalty; /* > 0; 1: off */
    float presence_penalty;   /* [-2, 2] as in the OpenAI API; 0: off */
    float frequency_penalty;  /* [-2, 2]; 0: off */
    uint64_t seed;            /* the request's seed */
    int32_t n_logprobs;       /* top log-probabilities to report, 0..FM_MAX_LOGPROBS */
    int32_t n_bias;           /* logit_bias entries of the slot (its row of the bias buffer), 0..FM_MAX_LOGIT_BIAS */
    int32_t masked;           /* 1: the row's allowed-token mask applies (a constrained sequence) */
} fm_sampling;

/* Greedy, no penalties, seed 0, no log-probabilities. */
void fm_sampling_init(fm_sampling *s);
/* FM_ERR_USAGE naming the field when a value is out of its range. */
fm_status fm_sampling_check(const fm_sampling *s, fm_error *err);

/* FM_ERR_USAGE naming the entry when logit_bias (n entries) is not n <= FM_MAX_LOGIT_BIAS distinct ids in [0, vocab)
 * with finite biases in [-100, 100]. */
fm_status fm_logit_bias_check(const fm_logit_bias *bias, int32_t n, int32_t vocab, fm_error *err);

/* A uniform double in [0, 1) for (seed, step): splitmix64 of the pair, its top 53 bits. */
double fm_sample_uniform(uint64_t seed, uint64_t step);

/* Scratch for a vocabulary of `vocab` ids (fm_sampler_scratch_bytes). */
size_t fm_sampler_scratch_bytes(int32_t vocab);

/* The penalty state of a sequence: seen[vocab] marks the ids of prompt and output (repetition), counts[vocab] counts
 * the output's (presence, frequency). Adds one id: a prompt id (generated false) or a generated one. */
void fm_sample_state_add(int32_t vocab, int32_t id, bool generated, int32_t *counts, uint8_t *seen);

/* One step on a row from its penalty state (counts and seen may be NULL: no penalties of that kind), its logit bias
 * (s->n_bias entries of bias) and its mask (words[(vocab + 31) / 32], bit i: id i allowed; read when s->masked);
 * scratch holds 2 x vocab floats. What a backend's sample op computes per row. */
int32_t fm_sample_row(const float *logits, int32_t vocab, const fm_sampling *s, const int32_t *counts,
                      const uint8_t *seen, const fm_logit_bias *bias, const uint32_t *mask, uint64_t step,
                      float *scratch, fm_sample_info *info);

/* One step: the token for logits[vocab] given the sequence's history (n_hist ids, of which the first n_prompt are
 * the prompt) at generation step `step` (0 for the first generated token). scratch holds fm_sampler_scratch_bytes;
 * info may be NULL. The parameters must have passed fm_sampling_check. */
int32_t fm_sample(const float *logits, int32_t vocab, const fm_sampling *s, const int32_t *hist, int64_t n_hist,
                  int64_t n_prompt, uint64_t step, void *scratch, fm_sample_info *info);

#endif
