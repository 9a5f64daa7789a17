/* FP8 e4m3fn codec by bit manipulation, and 1 x group activation quantization. */
#include "quant/e4m3.h"

#include <math.h>
#include <string.h>

float fm_e4m3_to_f32(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (code >> 3) & 0xFu;
    uint32_t man = code & 0x7u;
    uint32_t u;
    if (exp == 0xF && man == 0x7) {
        u = sign | 0x7FC00000u; /* the only NaN codes: S.1111.111 */
    } else if (exp == 0) {
        float v = (float)man * 0x1p-9f; /* subnormal: man * 2^-9, exact */
        return sign ? -v : v;
    } else {
        u = sign | ((exp + 120u) << 23) | (man << 20); /* rebias 7 -> 127 */
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint8_t fm_f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    if (a >= 0x43E00000u) /* |f| >= 448, inf included: saturate (SATFINITE) */
        return (uint8_t)(sign | 0x7Eu);
    if (a >= 0x3C800000u) {
        /* normal e4m3 (|f| >= 2^-6): rebias and round the 20 dropped mantissa bits to nearest even.
         * A carry moves into the exponent; the largest input below 448 rounds to 0x7E at most. */
        uint32_t h = a - (120u << 23);
        h = (h + 0x7FFFFu + ((h >> 20) & 1u)) >> 20;
        return (uint8_t)(sign | h);
    }
    /* subnormal e4m3, units of 2^-9: value = m * 2^(exp-150), k = m >> (141 - exp) before rounding */
    uint32_t exp = a >> 23;
    int32_t shift = 141 - (int32_t)exp;
    if (exp == 0 || shift > 24) return sign; /* below half of 2^-9: rounds to (signed) zero */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t k = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u)))
        k++; /* k == 8 is 2^-6, the smallest normal code, encoded correctly as is */
    return (uint8_t)(sign | k);
}

float fm_e4m3_quantize_tensor(const float *x, int64_t n, float *decoded) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float scale = fmaxf(amax / FM_E4M3_MAX, FM_ACT_SCALE_FLOOR);
    for (int64_t i = 0; i < n; i++) decoded[i] = fm_e4m3_to_f32(fm_f32_to_e4m3(x[i] / scale));
    return scale;
}

void fm_e4m3_quantize_groups(const float *x, int64_t K, int32_t group, uint8_t *codes, float *scales) {
    for (int64_t g0 = 0, gi = 0; g0 < K; g0 += group, gi++) {
        int64_t g1 = g0 + group < K ? g0 + group : K;
        float amax = 0.0f;
        for (int64_t i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf skips NaN */
        float scale = fmaxf(amax / FM_E4M3_MAX, FM_ACT_SCALE_FLOOR);
        scales[gi] = scale;
        /* divide (not multiply by 1/scale) so the element at amax lands on 448 up to one fp32 rounding,
         * which the encoder saturates anyway */
        for (int64_t i = g0; i < g1; i++) codes[i] = fm_f32_to_e4m3(x[i] / scale);
    }
}
