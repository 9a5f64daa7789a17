/* Comparison of logits against a reference: what the parity table, the golden tests and (later) the
 * parity report print. */
#ifndef FM_UTIL_METRICS_H
#define FM_UTIL_METRICS_H

#include <stdint.h>

typedef struct fm_compare {
    double  cosine;        /* over all T x V logits, flattened */
    double  max_abs_err;   /* max |x - ref| */
    double  max_abs_ref;   /* max |ref| (for relative bounds) */
    double  argmax_agree;  /* fraction of positions whose argmax matches */
    double  mean_kl;       /* mean over positions of KL(softmax(ref) || softmax(x)), nats */
    int64_t n_nonfinite;   /* NaN/Inf in x */
} fm_compare;

void fm_logits_compare(const float *ref, const float *x, int64_t T, int32_t V, fm_compare *out);

/* FNV-1a over the bytes of n floats: a cheap fingerprint for determinism checks. */
uint64_t fm_hash_f32(const float *x, int64_t n);

#endif
