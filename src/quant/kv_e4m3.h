/* The e4m3 KV cache (fm_options.kv_cache = FM_KV_E4M3): each (token, kv head) row of hd keys or values is stored as
 * hd e4m3 codes and one power-of-two scale 2^e, the least e with amax / 2^e <= 448 (amax: the row's largest |x|, NaN
 * skipped; 0 for an all-zero row), clamped to [FM_KV_E4M3_EMIN, FM_KV_E4M3_EMAX]. code = e4m3(x * 2^-e) (RNE,
 * saturating: quant/e4m3.h); a reader's value is e4m3 value x 2^e, exact in bf16 (3 significant bits, at least
 * 2^(EMIN - 9) = 2^-126 in magnitude), so the attention kernels run on those bf16 keys and values as they do on a bf16
 * cache. A power of two rather than amax / 448: the multiply is exact both ways, and e4m3 is floating point, so the
 * relative error of a code does not depend on where the row's amax lands in its top binade.
 *
 * Why: the cache is the bytes a decode step reads beside the weights (at 64 sequences of 2,048 tokens, Qwen3-30B-A3B's
 * 12.9 GB a step in bf16 against 2.3 GB of weights); e4m3 halves them and doubles the tokens a GPU holds. */
#ifndef FM_QUANT_KV_E4M3_H
#define FM_QUANT_KV_E4M3_H

#include <stdint.h>

#define FM_KV_E4M3_EMIN (-117)
#define FM_KV_E4M3_EMAX 100

/* e of a row whose largest magnitude is amax (>= 0; NaN or 0: 0) */
int32_t fm_kv_e4m3_exponent(float amax);
/* codes [n] and the scale 2^e of one row x [n] */
float fm_kv_e4m3_quantize_row(const float *x, int32_t n, uint8_t *codes);
/* the values a reader sees: out[i] = e4m3 value of codes[i] x scale (out may not alias codes) */
void fm_kv_e4m3_dequantize_row(const uint8_t *codes, int32_t n, float scale, float *out);

#endif
