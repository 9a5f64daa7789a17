/* bf16 and fp16 <-> fp32 conversions by bit manipulation (round-to-nearest-even, NaN kept quiet). */
#include "quant/bf16.h"

#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float fm_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t fm_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign and top payload, force quiet bit */
    /* RNE on the 16 dropped bits; a carry walks into the exponent, and overflow lands exactly on inf. */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fm_round_bf16(float f) { return fm_bf16_to_f32(fm_f32_to_bf16(f)); }

void fm_round_bf16_array(float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; i++) x[i] = fm_round_bf16(x[i]);
}

float fm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (man << 13)); /* inf, or NaN with its payload */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13)); /* rebias 15 -> 127 */
}

uint16_t fm_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) {
        if (a == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* quiet NaN, top payload bits kept */
    }
    int32_t e16 = (int32_t)(a >> 23) - 112; /* biased f16 exponent of the input */
    if (e16 >= 1) {
        /* normal range: rebias, then RNE on the 13 dropped mantissa bits; carries and overflow
         * (anything that rounds to >= 65536) land on the next exponent / inf naturally */
        uint32_t h = a - (112u << 23);
        h = (h + 0x0FFFu + ((h >> 13) & 1u)) >> 13;
        if (h >= 0x7C00u) h = 0x7C00u;
        return (uint16_t)(sign | h);
    }
    /* subnormal f16 (units of 2^-24): value = m * 2^(exp-150), so k = m >> (14 - e16) before rounding */
    int32_t shift = 14 - e16;
    if (shift > 24) return sign; /* below half of 2^-24 (m < 2^24), rounds to zero */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t k = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) k++; /* k == 0x400 is the smallest normal, encoded correctly as is */
    return (uint16_t)(sign | k);
}

float fm_round_f16(float f) { return fm_f16_to_f32(fm_f32_to_f16(f)); }
