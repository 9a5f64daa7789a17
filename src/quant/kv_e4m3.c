/* The e4m3 KV cache's rows (kv_e4m3.h) */
#include "quant/kv_e4m3.h"

#include <math.h>

#include "quant/e4m3.h"

int32_t fm_kv_e4m3_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    if (isinf(amax)) return FM_KV_E4M3_EMAX;
    /* amax = m 2^x, m in [0.5, 1); 448 = 0.875 2^9: amax / 2^e <= 448 from e = x - 9 when m <= 0.875, else x - 8 */
    int x;
    const float m = frexpf(amax, &x);
    const int32_t e = m <= 0.875f ? x - 9 : x - 8;
    return e < FM_KV_E4M3_EMIN ? FM_KV_E4M3_EMIN : e > FM_KV_E4M3_EMAX ? FM_KV_E4M3_EMAX : e;
}

float fm_kv_e4m3_quantize_row(const float *x, int32_t n, uint8_t *codes) {
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf skips NaN */
    const int32_t e = fm_kv_e4m3_exponent(amax);
    const float down = ldexpf(1.0f, -e); /* exact: a normal power of two for e in [EMIN, EMAX] */
    for (int32_t i = 0; i < n; i++) codes[i] = fm_f32_to_e4m3(x[i] * down);
    return ldexpf(1.0f, e);
}

void fm_kv_e4m3_dequantize_row(const uint8_t *codes, int32_t n, float scale, float *out) {
    for (int32_t i = 0; i < n; i++) out[i] = fm_e4m3_to_f32(codes[i]) * scale;
}
