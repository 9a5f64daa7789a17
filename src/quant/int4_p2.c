/* int4 with power-of-two group scales under a bf16 row scale: the searching quantizer and the form check. */
#include "quant/int4_p2.h"

#include <math.h>
#include <stddef.h>

#include "quant/bf16.h"

static const float octave16[16] = FM_INT4_P2_OCTAVE16;

/* the smallest bf16 value >= s (s > 0 finite), saturated at the largest finite bf16 */
static float bf16_up(float s) {
    uint16_t h = fm_f32_to_bf16(s);
    if (fm_bf16_to_f32(h) < s) h++;
    if ((h & 0x7FFFu) >= 0x7F80u) h = 0x7F7Fu;
    return fm_bf16_to_f32(h);
}

static inline float code_of(float w, float step) {
    const float r = nearbyintf(w / step);
    return r < -7.0f ? -7.0f : r > 7.0f ? 7.0f : r;
}

/* squared error of n weights quantized with step (NaN weights skipped: they encode as 0 and are not counted) */
static double group_sse(const float *w, int64_t n, float step) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(w[i])) continue;
        const double d = (double)code_of(w[i], step) * step - w[i];
        e += d * d;
    }
    return e;
}

/* the exponent of one group under row scale s: the finest step s 2^k >= amax / 7 (no clipping), or one octave finer
   when that costs less; *sse its squared error */
static int group_k(const float *w, int64_t n, float amax, float s, double *sse) {
    int k = 0;
    while (k > -FM_INT4_P2_KSPAN && ldexpf(s, k - 1) * 7.0f >= amax) k--;
    double e = group_sse(w, n, ldexpf(s, k));
    if (k > -FM_INT4_P2_KSPAN) {
        const double e1 = group_sse(w, n, ldexpf(s, k - 1));
        if (e1 < e) e = e1, k--;
    }
    *sse = e;
    return k;
}

static void quantize_row(const float *w, int64_t K, int8_t *q, float *scales) {
    const int64_t G = FM_INT4_P2_GROUP, ng = (K + G - 1) / G;
    float amax_row = 0.0f;
    for (int64_t i = 0; i < K; i++) amax_row = fmaxf(amax_row, fabsf(w[i])); /* fmaxf skips NaN */
    if (!(amax_row > 0.0f) || isinf(amax_row)) {
        for (int64_t i = 0; i < K; i++) q[i] = 0;
        for (int64_t g = 0; g < ng; g++) scales[g] = 0.0f;
        return;
    }
    for (int64_t g = 0; g < ng; g++) { /* the groups' amax, once (scales[] holds them until the end) */
        const int64_t k0 = g * G, n = K - k0 < G ? K - k0 : G;
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(w[k0 + i]));
        scales[g] = amax;
    }
    float best_s = 0.0f;
    double best = INFINITY;
    for (int j = 0; j < 16; j++) {
        const float s = bf16_up(amax_row / 7.0f * octave16[j]);
        double e = 0.0;
        for (int64_t g = 0; g < ng && e < best; g++) { /* a candidate stops once it is worse than the best */
            const int64_t k0 = g * G, n = K - k0 < G ? K - k0 : G;
            double eg;
            group_k(w + k0, n, scales[g], s, &eg);
            e += eg;
        }
        if (e < best) best = e, best_s = s;
    }
    for (int64_t g = 0; g < ng; g++) {
        const int64_t k0 = g * G, n = K - k0 < G ? K - k0 : G;
        double eg;
        const float step = ldexpf(best_s, group_k(w + k0, n, scales[g], best_s, &eg));
        scales[g] = step;
        for (int64_t i = 0; i < n; i++) q[k0 + i] = isnan(w[k0 + i]) ? 0 : (int8_t)code_of(w[k0 + i], step);
    }
}

void fm_int4_p2_quantize(const float *w, int64_t rows, int64_t K, int8_t *q, float *scales) {
    const int64_t ng = (K + FM_INT4_P2_GROUP - 1) / FM_INT4_P2_GROUP;
#pragma omp parallel for schedule(dynamic, 16) if (rows * K > (1 << 18))
    for (int64_t r = 0; r < rows; r++) quantize_row(w + r * K, K, q + r * K, scales + r * ng);
}

bool fm_int4_p2_split(const float *scales, int64_t n_groups, float *row_scale, int8_t *k) {
    float mx = 0.0f;
    for (int64_t g = 0; g < n_groups; g++) {
        if (!(scales[g] >= 0.0f) || isinf(scales[g])) return false; /* negative, NaN or infinite */
        mx = fmaxf(mx, scales[g]);
    }
    for (int64_t g = 0; g < n_groups; g++) {
        int e = 0;
        if (scales[g] > 0.0f) {
            const float m = frexpf(scales[g] / mx, &e); /* the quotient of two scales of one mantissa is exact */
            if (m != 0.5f || e - 1 < -FM_INT4_P2_KSPAN) return false;
        }
        if (k) k[g] = (int8_t)(scales[g] > 0.0f ? e - 1 : 0);
    }
    if (row_scale) *row_scale = mx;
    return true;
}
