/* Two models' logits compared (logits_diff.h). */
#include "logits_diff.h"

#include <math.h>

logits_diff logits_compare(const float *a, const float *b, int64_t T, int32_t V) {
    logits_diff d = {0, 0, 0};
    for (int64_t t = 0; t < T; t++) {
        int32_t ia = 0, ib = 0;
        for (int32_t v = 0; v < V; v++) {
            const float x = a[t * V + v], y = b[t * V + v];
            if (fabs(x) > d.max_abs) d.max_abs = fabs(x);
            if (fabs(x - y) > d.max_diff) d.max_diff = fabs(x - y);
            if (x > a[t * V + ia]) ia = v;
            if (y > b[t * V + ib]) ib = v;
        }
        d.same += ia == ib;
    }
    return d;
}

double logits_rms_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}
