#include "util/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

enum { TOPK = 5 };

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Indices of the k largest values, largest first; a tie goes to the lower index (deterministic). */
static void top_k(const float *x, int32_t n, int k, int32_t *idx) {
    int m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m == k && !(x[i] > x[idx[k - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        for (; j > 0 && x[i] > x[idx[j - 1]]; j--) idx[j] = idx[j - 1];
        idx[j] = i;
    }
}

/* |top_k(a) & top_k(b)|: both lists are k distinct indices */
static int top_k_common(const float *a, const float *b, int32_t n, int k) {
    int32_t ia[TOPK], ib[TOPK];
    top_k(a, n, k, ia);
    top_k(b, n, k, ib);
    int common = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) common += ia[i] == ib[j];
    return common;
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
    const int k = V < TOPK ? V : TOPK;
    double dot = 0, nr = 0, nx = 0, kl = 0, top = 0;
    double dot_last = 0, nr_last = 0, nx_last = 0;
    bool last_finite = true;
    int64_t agree = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *r = ref + t * V, *y = x + t * V;
        double d_row = 0, r_row = 0, x_row = 0;
        bool finite = true;
        for (int32_t v = 0; v < V; v++) {
            if (!isfinite(y[v])) {
                out->n_nonfinite++;
                finite = false;
                continue;
            }
            d_row += (double)r[v] * y[v], r_row += (double)r[v] * r[v], x_row += (double)y[v] * y[v];
            const double d = fabs((double)y[v] - r[v]);
            out->max_abs_err = d > out->max_abs_err ? d : out->max_abs_err;
            out->max_abs_ref = fabs(r[v]) > out->max_abs_ref ? fabs(r[v]) : out->max_abs_ref;
        }
        dot += d_row, nr += r_row, nx += x_row;
        if (t == T - 1) dot_last = d_row, nr_last = r_row, nx_last = x_row, last_finite = finite;
        agree += argmax(r, V) == argmax(y, V);
        if (k > 0) top += (double)top_k_common(r, y, V, k) / k;
        if (finite) {
            const double lr = lse(r, V), ly = lse(y, V);
            double kt = 0;
            for (int32_t v = 0; v < V; v++) {
                const double pr = exp((double)r[v] - lr);
                kt += pr * (((double)r[v] - lr) - ((double)y[v] - ly));
            }
            kl += kt;
        }
    }
    out->cosine = (nr > 0 && nx > 0) ? dot / sqrt(nr * nx) : 0.0;
    out->cosine_last = (nr_last > 0 && nx_last > 0) ? dot_last / sqrt(nr_last * nx_last) : 0.0;
    out->argmax_agree = T > 0 ? (double)agree / (double)T : 0.0;
    out->mean_kl = T > 0 ? kl / (double)T : 0.0;
    out->top5_overlap = T > 0 ? top / (double)T : 0.0;
    if (out->n_nonfinite) out->cosine = NAN, out->max_abs_err = INFINITY;
    if (!last_finite) out->cosine_last = NAN;
}

/* the worse of two values: NaN (non-finite logits somewhere) is worst of all */
static double worse_low(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a < b ? a : b); }
static double worse_high(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a > b ? a : b); }

void fm_compare_summarize(const fm_compare *v, int n, fm_compare *mean, fm_compare *worst) {
    memset(mean, 0, sizeof *mean);
    memset(worst, 0, sizeof *worst);
    if (n <= 0) return;
    *worst = v[0];
    for (int i = 0; i < n; i++) {
        const fm_compare *c = &v[i];
        mean->cosine += c->cosine, mean->cosine_last += c->cosine_last, mean->max_abs_err += c->max_abs_err;
        mean->max_abs_ref += c->max_abs_ref, mean->argmax_agree += c->argmax_agree, mean->mean_kl += c->mean_kl;
        mean->top5_overlap += c->top5_overlap, mean->n_nonfinite += c->n_nonfinite;
        if (i == 0) continue;
        worst->cosine = worse_low(worst->cosine, c->cosine);
        worst->cosine_last = worse_low(worst->cosine_last, c->cosine_last);
        worst->argmax_agree = worse_low(worst->argmax_agree, c->argmax_agree);
        worst->top5_overlap = worse_low(worst->top5_overlap, c->top5_overlap);
        worst->max_abs_err = worse_high(worst->max_abs_err, c->max_abs_err);
        worst->max_abs_ref = worse_high(worst->max_abs_ref, c->max_abs_ref);
        worst->mean_kl = worse_high(worst->mean_kl, c->mean_kl);
        worst->n_nonfinite += c->n_nonfinite;
    }
    mean->cosine /= n, mean->cosine_last /= n, mean->max_abs_err /= n, mean->max_abs_ref /= n;
    mean->argmax_agree /= n, mean->mean_kl /= n, mean->top5_overlap /= n;
}

uint64_t fm_hash_f32(const float *x, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (int64_t i = 0; i < n * (int64_t)sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
