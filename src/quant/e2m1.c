/* FP4 E2M1 codec by bit manipulation, and the MXFP4 / NVFP4 block quantizers built on it. */
#include "quant/e2m1.h"

#include <math.h>
#include <string.h>

#include "quant/e4m3.h"

float fm_e2m1_to_f32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}

uint8_t fm_f32_to_e2m1(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7u; /* NaN: +6, whatever the sign (see e2m1.h) */
    if (a >= 0x40C00000u)             /* |f| >= 6, inf included: saturate */
        return (uint8_t)(sign | 0x7u);
    if (a >= 0x3F800000u) {
        /* normal (|f| >= 1): rebias 127 -> 1 and round the 22 dropped mantissa bits to nearest even;
         * a carry moves into the exponent, and nothing below 6 rounds past code 7 */
        uint32_t h = a - (126u << 23);
        h = (h + 0x1FFFFFu + ((h >> 22) & 1u)) >> 22;
        return (uint8_t)(sign | h);
    }
    /* subnormal (|f| < 1), units of 0.5: value = m * 2^(exp-150), k = m >> (149 - exp) before rounding */
    uint32_t exp = a >> 23;
    int32_t shift = 149 - (int32_t)exp;
    if (exp == 0 || shift > 24) return sign; /* |f| < 0.25 rounds to (signed) zero */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t k = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) k++; /* k == 2 is 1.0, encoded correctly as is */
    return (uint8_t)(sign | k);
}

float fm_e8m0_to_f32(uint8_t e) {
    if (e == 0xFFu) return NAN;
    /* 2^(e-127): e >= 1 is a normal fp32 with that exponent field; e == 0 is the subnormal 2^-127 */
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void put_nibble(uint8_t *packed, int64_t i, uint8_t code) {
    if (i & 1) packed[i >> 1] = (uint8_t)(packed[i >> 1] | (code << 4));
    else packed[i >> 1] = code; /* the even element writes the whole byte, so a lone last nibble pairs with 0 */
}

static inline uint8_t get_nibble(const uint8_t *packed, int64_t i) {
    return (uint8_t)((packed[i >> 1] >> ((i & 1) * 4)) & 0xFu);
}

static float block_amax(const float *x, int64_t b0, int64_t b1) {
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf skips NaN */
    return amax;
}

/* The UE8M0 byte of a block with max magnitude amax. */
static uint8_t mx_scale_byte(float amax, fm_mx_rule rule) {
    if (!(amax > 0.0f)) return 0; /* all-zero block: the smallest scale, 2^-127; every element encodes to 0 */
    if (isinf(amax)) return 254;
    int e, x;
    if (rule == FM_MX_FLOOR) {
        frexpf(amax, &e); /* amax = f * 2^e, f in [0.5, 1): floor(log2(amax)) = e - 1 */
        x = e - 1 - 2;    /* - emax of E2M1 */
    } else {
        float s = amax / FM_E2M1_MAX; /* fp32, as cuBLAS computes it */
        if (s == 0.0f) return 0;
        float f = frexpf(s, &e);
        x = f == 0.5f ? e - 1 : e; /* ceil(log2(s)): exact powers of two stay, anything else rounds up */
    }
    x += 127;
    return (uint8_t)(x < 0 ? 0 : x > 254 ? 254 : x); /* 255 is NaN, never produced */
}

void fm_mxfp4_quantize(const float *x, int64_t n, fm_mx_rule rule, uint8_t *packed, uint8_t *scales) {
    for (int64_t b0 = 0, bi = 0; b0 < n; b0 += FM_MX_BLOCK, bi++) {
        int64_t b1 = b0 + FM_MX_BLOCK < n ? b0 + FM_MX_BLOCK : n;
        uint8_t sb = mx_scale_byte(block_amax(x, b0, b1), rule);
        scales[bi] = sb;
        float X = fm_e8m0_to_f32(sb);
        /* division by a power of two is exact unless the quotient leaves the fp32 range */
        for (int64_t i = b0; i < b1; i++) put_nibble(packed, i, fm_f32_to_e2m1(x[i] / X));
    }
}

void fm_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = fm_e2m1_to_f32(get_nibble(packed, i)) * fm_e8m0_to_f32(scales[i / FM_MX_BLOCK]);
}

float fm_nvfp4_amax(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}

float fm_nvfp4_scale_of_amax(float amax) {
    return fmaxf(amax / (FM_E2M1_MAX * FM_E4M3_MAX), FM_NVFP4_TENSOR_SCALE_FLOOR);
}

float fm_nvfp4_tensor_scale(const float *x, int64_t n) { return fm_nvfp4_scale_of_amax(fm_nvfp4_amax(x, n)); }

void fm_nvfp4_quantize(const float *x, int64_t n, float tensor_scale, uint8_t *packed, uint8_t *scales) {
    for (int64_t b0 = 0, bi = 0; b0 < n; b0 += FM_NV_BLOCK, bi++) {
        int64_t b1 = b0 + FM_NV_BLOCK < n ? b0 + FM_NV_BLOCK : n;
        float amax = block_amax(x, b0, b1);
        uint8_t sc = fm_f32_to_e4m3(amax / (FM_E2M1_MAX * tensor_scale)); /* >= 0, so the sign bit stays 0 */
        scales[bi] = sc;
        float d = tensor_scale * fm_e4m3_to_f32(sc);
        for (int64_t i = b0; i < b1; i++) put_nibble(packed, i, d == 0.0f ? 0 : fm_f32_to_e2m1(x[i] / d));
    }
}

void fm_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float tensor_scale, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        /* element * block scale is exact in fp32 (at most 6 significant bits), so one rounding in all */
        float eb = fm_e2m1_to_f32(get_nibble(packed, i)) * fm_e4m3_to_f32(scales[i / FM_NV_BLOCK]);
        out[i] = eb * tensor_scale;
    }
}

/* e4m3_rne(e2m1 value of every element x its block's r) for the n elements of a group, blocks of `block` */
static void expand_group(const uint8_t *packed, int64_t n, int block, const float *r, uint8_t *e4m3) {
    for (int64_t i = 0; i < n; i++) e4m3[i] = fm_f32_to_e4m3(fm_e2m1_to_f32(get_nibble(packed, i)) * r[i / block]);
}

float fm_mxfp4_expand_e4m3(const uint8_t *packed, const uint8_t *scales, int64_t n, uint8_t *e4m3) {
    const int nb = (int)((n + FM_MX_BLOCK - 1) / FM_MX_BLOCK);
    uint8_t smax = 0;
    for (int b = 0; b < nb; b++) smax = scales[b] > smax ? scales[b] : smax;
    float r[128 / FM_MX_BLOCK] = {0};
    for (int b = 0; b < nb; b++) {
        const int d = smax - scales[b];
        r[b] = ldexpf(1.0f, -(d < 24 ? d : 24));
    }
    expand_group(packed, n, FM_MX_BLOCK, r, e4m3);
    return fm_e8m0_to_f32(smax);
}

float fm_nvfp4_expand_e4m3(const uint8_t *packed, const uint8_t *scales, float tensor_scale, int64_t n, uint8_t *e4m3) {
    const int nb = (int)((n + FM_NV_BLOCK - 1) / FM_NV_BLOCK);
    uint8_t smax = 0; /* non-negative e4m3 codes order as their values */
    for (int b = 0; b < nb; b++) smax = scales[b] > smax ? scales[b] : smax;
    const float S = fm_e4m3_to_f32(smax), inv = S > 0.0f ? 1.0f / S : 0.0f;
    for (int64_t i = 0; i < n; i++) /* the code times its block scale is exact (6 significant bits at most) */
        e4m3[i] = fm_f32_to_e4m3(fm_e2m1_to_f32(get_nibble(packed, i)) * fm_e4m3_to_f32(scales[i / FM_NV_BLOCK]) * inv);
    return S * tensor_scale;
}
