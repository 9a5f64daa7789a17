#include "util/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* log-sum-exp of a row, in double */
static double lse(const float *x, int32_t n) {
    double mx = x[0], s = 0.0;
    for (int32_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int32_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

void fm_logits_compare(const float *ref, const float *x, int64_t T, int32_t V, fm_compare *out) {
    memset(out, 0, sizeof *out);
    double dot = 0, nr = 0, nx = 0, kl = 0;
    int64_t agree = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *r = ref + t * V, *y = x + t * V;
        bool finite = true;
        for (int32_t v = 0; v < V; v++) {
            if (!isfinite(y[v])) {
                out->n_nonfinite++;
                finite = false;
                continue;
            }
            dot += (double)r[v] * y[v], nr += (double)r[v] * r[v], nx += (double)y[v] * y[v];
            const double d = fabs((double)y[v] - r[v]);
            out->max_abs_err = d > out->max_abs_err ? d : out->max_abs_err;
            out->max_abs_ref = fabs(r[v]) > out->max_abs_ref ? fabs(r[v]) : out->max_abs_ref;
        }
        agree += argmax(r, V) == argmax(y, V);
        if (finite) {
            const double lr = lse(r, V), ly = lse(y, V);
            double k = 0;
            for (int32_t v = 0; v < V; v++) {
                const double pr = exp((double)r[v] - lr);
                k += pr * (((double)r[v] - lr) - ((double)y[v] - ly));
            }
            kl += k;
        }
    }
    out->cosine       = (nr > 0 && nx > 0) ? dot / sqrt(nr * nx) : 0.0;
    out->argmax_agree = T > 0 ? (double)agree / (double)T : 0.0;
    out->mean_kl      = T > 0 ? kl / (double)T : 0.0;
    if (out->n_nonfinite) out->cosine = NAN, out->max_abs_err = INFINITY;
}

uint64_t fm_hash_f32(const float *x, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (int64_t i = 0; i < n * (int64_t)sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
