/* FP8 e4m3fn (OCP): bias 7, max finite 448 (0x7E), NaN = S.1111.111, no infinity.
 * Encoding is round-to-nearest-even and saturates finite overflow to +-448 (as CUDA's
 * __NV_SATFINITE and cvt.rn.satfinite do); NaN encodes as 0x7F with the input's sign bit. */
#ifndef FM_QUANT_E4M3_H
#define FM_QUANT_E4M3_H

#include <stdint.h>

#define FM_E4M3_MAX 448.0f
/* Smallest activation scale: an all-zero group gets this scale and encodes to zeros, never NaN. */
#define FM_ACT_SCALE_FLOOR 1e-12f

float fm_e4m3_to_f32(uint8_t code);
uint8_t fm_f32_to_e4m3(float f);

/* Activation quantization in 1 x group blocks along K (the fp8 preset uses group = 128):
 * for each block, scale = max(amax / 448, FM_ACT_SCALE_FLOOR) in fp32 and code = e4m3(x / scale).
 * amax ignores NaN elements (which encode as 0x7F | sign); inputs are expected finite.
 * x is [K]; codes is [K]; scales is [ceil(K / group)]. The last block may be partial. */
void fm_e4m3_quantize_groups(const float *x, int64_t K, int32_t group, uint8_t *codes, float *scales);

/* Per-tensor quantization (W8A8: a weight matrix at load, an activation input per call): one scale
 * max(amax / 448, FM_ACT_SCALE_FLOOR) over all n elements, and decoded[i] = e4m3(x[i] / scale) as a float
 * (decoded may be x). Returns the scale. */
float fm_e4m3_quantize_tensor(const float *x, int64_t n, float *decoded);

#endif
