/* Two models' logits of one prompt compared, for tests that split a model over ranks: [T][V] each. */
#ifndef FM_TESTS_LOGITS_DIFF_H
#define FM_TESTS_LOGITS_DIFF_H

#include <stddef.h>
#include <stdint.h>

typedef struct logits_diff {
    double max_abs;  /* the largest |logit| of a */
    double max_diff; /* the largest |a - b| */
    int64_t same;    /* positions whose argmax agree */
} logits_diff;

logits_diff logits_compare(const float *a, const float *b, int64_t T, int32_t V);
/* root mean square of a - b over n values */
double logits_rms_diff(const float *a, const float *b, size_t n);

#endif
