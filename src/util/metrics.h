/* Comparison of logits against a reference: what the parity table, the golden tests and the parity report
 * print. */
#ifndef FM_UTIL_METRICS_H
#define FM_UTIL_METRICS_H

#include <stdint.h>

typedef struct fm_compare {
    double cosine;       /* over all T x V logits, flattened */
    double cosine_last;  /* over the V logits of the last position only (what generation samples from) */
    double max_abs_err;  /* max |x - ref| */
    double max_abs_ref;  /* max |ref| (for relative bounds) */
    double argmax_agree; /* fraction of positions whose argmax matches */
    double mean_kl;      /* mean over positions of KL(softmax(ref) || softmax(x)), nats */
    double top5_overlap; /* mean over positions of |top5(ref) & top5(x)| / 5 (top-V when V < 5) */
    int64_t n_nonfinite; /* NaN/Inf in x */
} fm_compare;

void fm_logits_compare(const float *ref, const float *x, int64_t T, int32_t V, fm_compare *out);

/* Mean and worst of n comparisons (one per prompt): worst is the smallest cosine, cosine_last, argmax_agree and
 * top5_overlap and the largest max_abs_err, max_abs_ref and mean_kl; n_nonfinite is the total in both. A NaN
 * (non-finite logits) is the worst value and makes the mean NaN. */
void fm_compare_summarize(const fm_compare *v, int n, fm_compare *mean, fm_compare *worst);

/* FNV-1a over the bytes of n floats: a cheap fingerprint for determinism checks. */
uint64_t fm_hash_f32(const float *x, int64_t n);

#endif
