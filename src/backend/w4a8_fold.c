/* The fold kernel's code layout and its conversion of a code word, on the host (w4a8_fold.h). */
#include "backend/w4a8_fold.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/bf16.h"
#include "quant/int4_p2.h"

void fm_w4a8_fold_pack(const int8_t *q, const float *scales, int64_t rows, int64_t K, bool interleaved,
                       int64_t rows_pad, uint8_t *codes, uint16_t *scales_bf16) {
    const int64_t G = (K + 127) / 128;
    memset(codes, 0, (size_t)(rows_pad * G * 64));
    memset(scales_bf16, 0, (size_t)(rows_pad * G) * sizeof(uint16_t));
    for (int64_t r = 0; r < rows_pad && r < rows; r++) {
        const int64_t src = fm_w4a8_fold_source_row(r, rows, interleaved);
        for (int64_t g = 0; g < G; g++) {
            scales_bf16[g * rows_pad + r] = fm_f32_to_bf16(scales[src * G + g]);
            for (int64_t s = 0; s < 4; s++) {
                uint8_t *seg = codes + fm_w4a8_fold_code_offset(rows_pad, g, s, r);
                for (int64_t i = 0; i < 4; i++) {
                    uint32_t w = 0;
                    for (int c = 0; c < 8; c++) {
                        const int64_t k = 128 * g + 32 * s + 8 * i + c;
                        const int v = k < K ? q[src * K + k] : 0;
                        const uint32_t mag = (uint32_t)(v < 0 ? -v : v) & 7u, neg = v < 0;
                        w |= mag << (4 * c);
                        w |= neg << (c < 4 ? 8 * c + 7 : 8 * (c - 4) + 3);
                    }
                    for (int b = 0; b < 4; b++) seg[4 * i + b] = (uint8_t)(w >> (8 * b));
                }
            }
        }
    }
}

/* PRMT (byte permute, default mode): byte i of the result is byte (selector nibble i & 7) of {a, b} */
static uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t ab = (uint64_t)b << 32 | a;
    uint32_t d = 0;
    for (int i = 0; i < 4; i++) d |= (uint32_t)((ab >> (8 * ((sel >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
    return d;
}

void fm_w4a8_fold_convert_word(uint32_t w, int32_t j, uint32_t *lo, uint32_t *hi) {
    const uint32_t tlo = FM_FOLD_TLO0 + (uint32_t)j * FM_FOLD_TLO_STEP,
                   thi = FM_FOLD_THI0 + (uint32_t)j * FM_FOLD_THI_STEP;
    const uint32_t sel = w & 0x77777777u;
    *lo = byte_perm(tlo, thi, sel) | (w & 0x80808080u);
    *hi = byte_perm(tlo, thi, sel >> 16) | ((w << 4) & 0x80808080u);
}

bool fm_w4a8_fold_split_scales(const uint16_t *scales_bf16, int32_t n, int64_t rows, int64_t rows_pad, int64_t G,
                               int8_t *fold_j, float *fold_rs, int32_t *bad_m, int64_t *bad_r) {
    float *row = (float *)malloc((size_t)G * sizeof(float));
    int8_t *k = (int8_t *)malloc((size_t)G);
    bool ok = row && k;
    *bad_m = -1, *bad_r = -1; /* -1: out of host memory */
    for (int32_t m = 0; m < n && ok; m++)
        for (int64_t r = 0; r < rows_pad && ok; r++) {
            float rs = 0.0f;
            for (int64_t g = 0; g < G; g++)
                row[g] = r < rows ? fm_bf16_to_f32(scales_bf16[((int64_t)m * G + g) * rows_pad + r]) : 0.0f;
            if (!fm_int4_p2_split(row, G, &rs, k)) {
                *bad_m = m, *bad_r = r, ok = false;
                break;
            }
            for (int64_t g = 0; g < G; g++)
                fold_j[((int64_t)m * G + g) * rows_pad + r] = (int8_t)(rs > 0.0f ? k[g] + FM_FOLD_J_BIAS : 0);
            fold_rs[(int64_t)m * rows_pad + r] = ldexpf(rs, -FM_FOLD_J_BIAS);
        }
    free(row), free(k);
    return ok;
}
