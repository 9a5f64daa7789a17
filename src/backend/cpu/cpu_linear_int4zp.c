/* y = x W^T for int4-zp banks (pre-quantized checkpoints), the CPU reference of that format:
 *   y[n] = sum_b s[n, b] * sum_{j in block b} x[perm[j]] * (u[n, j] - z[n, b])
 * with blocks of G consecutive bank positions (K sorted by group for act-order), the group scale folded into the
 * fp32 accumulator once per group as the int4 path does. Activations are used as stored (w4a16): fp32, or bf16
 * values when the plan rounds activations. Each output is summed in a fixed order (thread-count independent). */
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

/* outputs n0..n1 of matrix idx for one input row already gathered into bank order (xp[K]) */
static void dot_rows(const fm_bank *w, int32_t idx, const float *xp, int64_t n0, int64_t n1, float *y) {
    const int64_t K = w->cols, G = w->group, ng = w->n_groups, KB = (K + 1) / 2;
    for (int64_t n = n0; n < n1; n++) {
        const int64_t r = (int64_t)idx * w->rows + n;
        const uint8_t *cr = w->codes + r * KB;
        float acc = 0.0f;
        for (int64_t b = 0; b < ng; b++) {
            const float z = (float)w->zeros[r * ng + b];
            float sum = 0.0f;
            const int64_t j1 = (b + 1) * G < K ? (b + 1) * G : K; /* compressed-tensors: the last group partial */
            for (int64_t j = b * G; j < j1; j++) {
                const float u = (float)((cr[j >> 1] >> ((j & 1) * 4)) & 15);
                sum += xp[j] * (u - z); /* u - z is an exact small integer */
            }
            acc += sum * w->scales[r * ng + b];
        }
        y[n - n0] = acc;
    }
}

static void gather(const fm_bank *w, int32_t idx, const float *x, float *xp) {
    const int64_t K = w->cols;
    const int32_t *perm = w->perm ? w->perm + (int64_t)idx * K : NULL;
    for (int64_t j = 0; j < K; j++) xp[j] = perm ? x[perm[j]] : x[j];
}

void cpu_int4zp_row(const fm_bank *w, int32_t idx, const float *x, float *y) {
    float *xp = (float *)malloc((size_t)w->cols * sizeof(float));
    gather(w, idx, x, xp);
    dot_rows(w, idx, xp, 0, w->rows, y);
    free(xp);
}

void cpu_linear_int4zp(fm_backend *be, const fm_bank *w, int32_t idx, const float *x, int64_t M, float *y) {
    const int64_t K = w->cols, N = w->rows, NB = 16, n_blocks = (N + NB - 1) / NB;
    float *xp = (float *)malloc((size_t)(M * K) * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) gather(w, idx, x + m * K, xp + m * K);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
            dot_rows(w, idx, xp + m * K, n0, n1, y + m * N + n0);
        }
    free(xp);
    cpu_round_act(be, y, M * N);
}
