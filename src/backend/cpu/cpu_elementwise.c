/* Row-wise and element-wise ops of the CPU reference: embedding, RMSNorm, SwiGLU, residual add. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

void cpu_embed(fm_backend *be, const fm_bank *table, const void *idsv, int64_t T, void *outv) {
    const int32_t *ids = (const int32_t *)idsv;
    float *out = (float *)outv;
    const int64_t H = table->cols;
    for (int64_t t = 0; t < T; t++) memcpy(out + t * H, table->w + (int64_t)ids[t] * H, (size_t)H * sizeof(float));
    cpu_round_act(be, out, T * H);
}

/* HF Llama/Qwen3 RMSNorm: fp32 mean of squares, x * rsqrt(mean + eps), then times the weight. */
void cpu_rmsnorm(fm_backend *be, const void *xv, const fm_bank *w, int64_t rows, int64_t dim, float eps, void *outv) {
    const float *x = (const float *)xv;
    float *out = (float *)outv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < dim; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) out[r * dim + i] = w->w[i] * (xr[i] * inv);
    }
    cpu_round_act(be, out, rows * dim);
}

void cpu_swiglu(fm_backend *be, const void *guv, int64_t rows, int64_t I, void *outv) {
    const float *gu = (const float *)guv;
    float *out = (float *)outv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < I; i++) {
            const float g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
            out[r * I + i] = g / (1.0f + expf(-g)) * u;
        }
    cpu_round_act(be, out, rows * I);
}

void cpu_add(fm_backend *be, void *accv, const void *xv, int64_t n) {
    float *acc = (float *)accv;
    const float *x = (const float *)xv;
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
    cpu_round_act(be, acc, n);
}

void cpu_add_rmsnorm(fm_backend *be, void *acc, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps,
                     void *out) {
    cpu_add(be, acc, x, rows * dim);
    cpu_rmsnorm(be, acc, w, rows, dim, eps, out);
}
