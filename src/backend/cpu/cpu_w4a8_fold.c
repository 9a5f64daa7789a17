/* The fold GEMM's arithmetic on the CPU (backend/w4a8_fold.h): per-token e4m3 activations and the exact emulation
 * of the kernel's sums, in the kernel's order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/w4a8_fold.h"
#include "quant/e4m3.h"
#include "quant/int4_p2.h"

void fm_w4a8_fold_quantize_tokens(const float *x, int64_t rows, int64_t K, int64_t ld_in, uint8_t *codes, int64_t ldx,
                                  float *scales) {
    for (int64_t n = 0; n < rows; n++) {
        memset(codes + n * ldx, 0, (size_t)ldx);
        fm_e4m3_quantize_groups(x + n * ld_in, K, (int32_t)K, codes + n * ldx, scales + n);
    }
}

bool fm_w4a8_fold_ref(const int8_t *q, const float *scales, int64_t rows, int64_t K, const uint8_t *x8, int64_t ldx,
                      const float *xs, int64_t lds, bool per_group, int64_t N, int32_t P, float *y) {
    const int64_t G = (K + 127) / 128, block = per_group ? 1 : P > 0 ? P : G;
    float *w = malloc((size_t)K * sizeof(float)), *rs = malloc((size_t)rows * sizeof(float));
    float *a = malloc((size_t)(N * K) * sizeof(float)); /* the activations decoded */
    int8_t *k = malloc((size_t)G);
    bool ok = w && rs && a && k;
    for (int64_t n = 0; ok && n < N; n++)
        for (int64_t i = 0; i < K; i++) a[n * K + i] = fm_e4m3_to_f32(x8[n * ldx + i]);
    for (int64_t r = 0; ok && r < rows; r++) ok = fm_int4_p2_split(scales + r * G, G, rs + r, NULL);
    for (int64_t r = 0; ok && r < rows; r++) {
        fm_int4_p2_split(scales + r * G, G, rs + r, k);
        /* the operand: q x 2^(k + 6), exact in e4m3 (and in fp32) */
        for (int64_t i = 0; i < K; i++) w[i] = ldexpf((float)q[r * K + i], k[i / 128] + FM_FOLD_J_BIAS);
        const float wr = ldexpf(rs[r], -FM_FOLD_J_BIAS);
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t g0 = 0; g0 < G; g0 += block) {
                const int64_t k1 = (g0 + block) * 128 < K ? (g0 + block) * 128 : K;
                /* the products of two e4m3 values are exact; their sum in double rounds ~2^-29 below fp32's ulp */
                double part = 0.0;
                for (int64_t i = g0 * 128; i < k1; i++) part += (double)w[i] * (double)a[n * K + i];
                acc = per_group ? fmaf((float)part, xs[g0 * lds + n], acc) : acc + (float)part;
            }
            y[n * rows + r] = per_group ? acc * wr : acc * (wr * xs[n]);
        }
    }
    free(w), free(rs), free(a), free(k);
    return ok;
}
