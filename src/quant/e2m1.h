/* FP4 E2M1 (OCP MX): 1 sign, 2 exponent, 1 mantissa bit, bias 1, no inf/NaN, magnitudes
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Encoding is round-to-nearest-even (the hardware cvt.rn behaviour:
 * 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), keeps the sign of zero
 * (-0 and tiny negatives give 0b1000), and saturates finite overflow and +-inf to +-6.
 * NaN encodes as +6 (0b0111) whatever its sign, as the PTX cvt .satfinite conversion turns NaN into
 * +MAX_NORM; ml_dtypes instead gives 0b1000 (-0), which would hide the NaN.
 * Packing: two codes per byte, element 2i in the low nibble, 2i+1 in the high nibble; when n is odd
 * the high nibble of the last byte is 0.
 *
 * MXFP4: blocks of 32 elements share one UE8M0 scale byte e (X = 2^(e-127), 0xFF = NaN); element
 * i is e2m1(x_i / X) computed in fp32 (exact division by a power of two), and dequantizes to
 * e2m1 value * X. The block amax ignores NaN elements. The exponent is clamped to 0..254 (0xFF is
 * never produced): a block whose rule asks for X below 2^-127 gets e = 0 (its elements
 * then lose precision or flush to 0); a block containing +-inf gets e = 254. An all-zero block gets
 * e = 0 (X = 2^-127, the smallest scale), as the round-up cvt.rp.ue8m0 of 0 gives.
 * NVFP4: blocks of 16 elements share one e4m3 scale, times one fp32 scale for the tensor. */
#ifndef FM_QUANT_E2M1_H
#define FM_QUANT_E2M1_H

#include <stdint.h>

#define FM_E2M1_MAX 6.0f
#define FM_MX_BLOCK 32
#define FM_NV_BLOCK 16

float fm_e2m1_to_f32(uint8_t code); /* low 4 bits used */
uint8_t fm_f32_to_e2m1(float f);

float fm_e8m0_to_f32(uint8_t e); /* NaN for 0xFF */

/* How an MX block's shared exponent is chosen from the block's amax.
 * FLOOR (OCP MX v1.0 spec): X = 2^(floor(log2(amax)) - 2); values above 6X clip.
 * RCEIL (cuBLAS): X = 2^ceil(log2(amax / 6)), amax / 6 computed in fp32; nothing clips. */
typedef enum fm_mx_rule { FM_MX_FLOOR, FM_MX_RCEIL } fm_mx_rule;

/* x is [n]; packed is [ceil(n/2)] bytes; scales is [ceil(n/32)] UE8M0 bytes. The last block may be partial. */
void fm_mxfp4_quantize(const float *x, int64_t n, fm_mx_rule rule, uint8_t *packed, uint8_t *scales);
void fm_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t n, float *out);

/* Floor of the NVFP4 tensor scale: keeps the block-scale division finite for an all-zero tensor. */
#define FM_NVFP4_TENSOR_SCALE_FLOOR 1e-12f

/* NVFP4 per-tensor scale: max(amax / (6 * 448), FM_NVFP4_TENSOR_SCALE_FLOOR) in fp32, amax over the
 * finite elements (NaN and +-inf ignored, so one inf does not zero every other element). */
float fm_nvfp4_tensor_scale(const float *x, int64_t n);
/* Its two steps, for a buffer held in parts (expert parallelism: the largest of the parts' amax gives the scale of the
 * whole): the amax over the finite elements, and the scale of an amax. */
float fm_nvfp4_amax(const float *x, int64_t n);
float fm_nvfp4_scale_of_amax(float amax);
/* scales is [ceil(n/16)] e4m3 codes of block_amax / (6 * tensor_scale) (RNE, saturating at 448, so a
 * block holding +-inf gets 448). With d = tensor_scale * decoded block scale (fp32), element i is
 * e2m1(x_i / d), or 0 when d == 0 (a block far below the tensor amax whose scale rounds to 0).
 * tensor_scale must be positive and finite (as fm_nvfp4_tensor_scale returns).
 * Dequantized value: (e2m1 value * decoded block scale) * tensor_scale; the first product is exact,
 * so the result is the fp32 value nearest to the exact product of the three. */
void fm_nvfp4_quantize(const float *x, int64_t n, float tensor_scale, uint8_t *packed, uint8_t *scales);
void fm_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float tensor_scale, int64_t n, float *out);

/* The grouped GEMM's on-chip expansion of an FP4 buffer to e4m3 (Hopper has no FP4 tensor cores), one K-group of
 * n <= 128 elements (its codes start at packed, its block scales at scales: 4 MX or 8 NV blocks, fewer when n is
 * short). S is the group's largest decoded block scale; each element becomes e4m3_rne(e2m1 value x r), r the
 * fp32 ratio of its block's scale to S, and the group's scale (the promotion's activation scale) is S (MX) or
 * fp32(S x tensor_scale) (NV). MX: r = 2^-min(d, 24) for a block d binades below S, so the e4m3 code is exact
 * for d <= 8 (every E2M1 value times 2^-d is an e4m3 value) and rounds into the e4m3 subnormals, or to 0, beyond
 * (min(d, 24) gives the same codes as 2^-d: every product below 2^-10 rounds to 0). NV: the element is
 * e4m3_rne(fp32(e2m1 value x s_b) x fp32(1 / S)) (the first product is exact; one reciprocal per group, as the
 * GPU computes it): a quotient of e4m3 scales, whose product with the code (up to 6 significant bits) rounds to
 * e4m3's 4: not exact.
 * An NV group whose block scales are all 0 gets codes 0 and scale 0. Returns the group's scale. */
float fm_mxfp4_expand_e4m3(const uint8_t *packed, const uint8_t *scales, int64_t n, uint8_t *e4m3);
float fm_nvfp4_expand_e4m3(const uint8_t *packed, const uint8_t *scales, float tensor_scale, int64_t n, uint8_t *e4m3);

#endif
