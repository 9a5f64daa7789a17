/* bf16 and fp16 <-> fp32, round-to-nearest-even, NaN kept (quiet). */
#ifndef FM_QUANT_BF16_H
#define FM_QUANT_BF16_H

#include <stdint.h>

float fm_bf16_to_f32(uint16_t h);
uint16_t fm_f32_to_bf16(float f);
/* f rounded to the nearest bf16 value, returned as fp32 */
float fm_round_bf16(float f);
void fm_round_bf16_array(float *x, int64_t n);

float fm_f16_to_f32(uint16_t h);
uint16_t fm_f32_to_f16(float f); /* RNE; overflow -> inf; subnormals kept */
float fm_round_f16(float f);

#endif
