/* int4 group quantization of weight rows (symmetric and asymmetric), and nibble packing. */
#include "quant/int4.h"

#include <math.h>
#include <stddef.h>

#include "quant/bf16.h"

/* The smallest value of the scale dtype >= s (s >= 0), saturated at the dtype's largest finite value.
 * Rounding up (not to nearest) keeps amax / scale <= 7 and (max - min) / scale <= 15, so no element
 * is clipped by the scale's own rounding and every error stays within scale / 2. */
static float scale_round_up(float s, fm_scale_dtype dt) {
    if (dt == FM_SCALE_BF16) {
        uint16_t h = fm_f32_to_bf16(s);
        if (fm_bf16_to_f32(h) < s) h++; /* positive: the next code is the next larger value */
        if ((h & 0x7FFFu) >= 0x7F80u) h = 0x7F7Fu;
        return fm_bf16_to_f32(h);
    }
    uint16_t h = fm_f32_to_f16(s);
    if (fm_f16_to_f32(h) < s) h++;
    if ((h & 0x7FFFu) >= 0x7C00u) h = 0x7BFFu; /* 65504 */
    return fm_f16_to_f32(h);
}

/* rne(v) + offset clamped to [lo, hi], in float so that huge or infinite quotients cannot overflow an int.
 * nearbyintf rounds to nearest even in the default rounding mode. */
static inline int8_t rne_clamp(float v, float offset, float lo, float hi) {
    float r = nearbyintf(v) + offset;
    r = r < lo ? lo : r > hi ? hi : r;
    return (int8_t)r;
}

static void quantize_row(const float *w, int64_t K, const fm_int4_params *p, int8_t *q, float *scales, uint8_t *zeros) {
    const int32_t G = p->group;
    for (int64_t g0 = 0, gi = 0; g0 < K; g0 += G, gi++) {
        int64_t g1 = g0 + G < K ? g0 + G : K;
        if (p->symmetric) {
            float amax = 0.0f;
            for (int64_t i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(w[i])); /* fmaxf skips NaN */
            float s = scale_round_up(amax / 7.0f, p->scale_dtype);
            scales[gi] = s;
            for (int64_t i = g0; i < g1; i++)
                q[i] = (s == 0.0f || isnan(w[i])) ? 0 : rne_clamp(w[i] / s, 0.0f, -8.0f, 7.0f);
        } else {
            float mn = 0.0f, mx = 0.0f; /* the range always includes 0, so 0 is exact */
            for (int64_t i = g0; i < g1; i++) {
                mn = fminf(mn, w[i]);
                mx = fmaxf(mx, w[i]);
            }
            float s = scale_round_up((mx - mn) / 15.0f, p->scale_dtype);
            scales[gi] = s;
            if (s == 0.0f) {
                zeros[gi] = 0; /* any zero point would do: every q equals it */
                for (int64_t i = g0; i < g1; i++) q[i] = 0;
                continue;
            }
            int8_t z = rne_clamp(-mn / s, 0.0f, 0.0f, 15.0f);
            zeros[gi] = (uint8_t)z;
            for (int64_t i = g0; i < g1; i++) q[i] = isnan(w[i]) ? z : rne_clamp(w[i] / s, (float)z, 0.0f, 15.0f);
        }
    }
}

void fm_int4_quantize(const float *w, int64_t rows, int64_t K, const fm_int4_params *p, int8_t *q, float *scales,
                      uint8_t *zeros) {
    const int64_t ng = fm_int4_n_groups(K, p->group);
#pragma omp parallel for schedule(static) if (rows * K > (1 << 18))
    for (int64_t r = 0; r < rows; r++)
        quantize_row(w + r * K, K, p, q + r * K, scales + r * ng, p->symmetric ? NULL : zeros + r * ng);
}

void fm_int4_dequantize(const int8_t *q, const float *scales, const uint8_t *zeros, int64_t rows, int64_t K,
                        const fm_int4_params *p, float *w) {
    const int64_t ng = fm_int4_n_groups(K, p->group);
#pragma omp parallel for schedule(static) if (rows * K > (1 << 18))
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < K; k++) {
            int64_t g = r * ng + k / p->group;
            int32_t v = q[r * K + k] - (p->symmetric ? 0 : zeros[g]);
            w[r * K + k] = (float)v * scales[g]; /* |v| <= 15 times an 8- or 11-bit scale: exact */
        }
    }
}

void fm_int4_pack(const int8_t *q, int64_t n, uint8_t *packed) {
    for (int64_t i = 0; i + 1 < n; i += 2)
        packed[i >> 1] = (uint8_t)(((uint8_t)q[i] & 0xFu) | (((uint8_t)q[i + 1] & 0xFu) << 4));
    if (n & 1) packed[n >> 1] = (uint8_t)q[n - 1] & 0xFu;
}

void fm_int4_unpack(const uint8_t *packed, int64_t n, bool symmetric, int8_t *q) {
    for (int64_t i = 0; i < n; i++) {
        int32_t nib = (packed[i >> 1] >> ((i & 1) * 4)) & 0xF;
        q[i] = (int8_t)(symmetric ? (nib ^ 8) - 8 : nib); /* sign-extend the 4-bit two's complement */
    }
}
