/* int4 group quantization of a [rows, K] weight matrix along K (one scale per row per group of K).
 * The fp32 scale is rounded UP to the scale dtype (the smallest bf16/fp16 value >= it) before q is
 * computed, so the rounding of the scale never clips an element and |w - dequant| <= scale / 2 (up to the fp32
 * rounding of amax / 7 or (max - min) / 15);
 * a scale beyond the dtype's range saturates to its largest finite value (fp16: 65504, so with fp16
 * scales weights above 7 * 65504 clip). All arithmetic is fp32; rne is round-half-to-even.
 * Symmetric: scale = amax / 7, q = clamp(rne(w / scale), -8, 7) (-8 is never produced); w ~= q * scale.
 * Asymmetric: min/max of the group widened to include 0, scale = (max - min) / 15,
 * zero = clamp(rne(-min / scale), 0, 15), q = clamp(rne(w / scale) + zero, 0, 15); w ~= (q - zero) * scale.
 * A group whose scale is 0 (all zeros) gets q = zero point (dequantizes to 0); its asym zero point is 0.
 * NaN weights are ignored by amax/min/max and encode as the zero point. The last group may be partial. */
#ifndef FM_QUANT_INT4_H
#define FM_QUANT_INT4_H

#include <stdbool.h>
#include <stdint.h>

typedef enum fm_scale_dtype { FM_SCALE_BF16, FM_SCALE_F16 } fm_scale_dtype;

typedef struct fm_int4_params {
    int32_t group; /* 32, 64 or 128 */
    bool symmetric;
    fm_scale_dtype scale_dtype;
} fm_int4_params;

static inline int64_t fm_int4_n_groups(int64_t K, int32_t group) { return (K + group - 1) / group; }

/* q is [rows, K] (sym: -8..7, asym: 0..15); scales is [rows, n_groups] (values exactly representable in
 * the scale dtype); zeros is [rows, n_groups] (asym only; may be NULL when symmetric). */
void fm_int4_quantize(const float *w, int64_t rows, int64_t K, const fm_int4_params *p, int8_t *q, float *scales,
                      uint8_t *zeros);
void fm_int4_dequantize(const int8_t *q, const float *scales, const uint8_t *zeros, int64_t rows, int64_t K,
                        const fm_int4_params *p, float *w);

/* Two codes per byte, element 2i in the low nibble (low 4 bits of the two's complement for sym codes). */
void fm_int4_pack(const int8_t *q, int64_t n, uint8_t *packed);
void fm_int4_unpack(const uint8_t *packed, int64_t n, bool symmetric, int8_t *q);

#endif
