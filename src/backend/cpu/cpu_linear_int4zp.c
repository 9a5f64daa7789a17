/* y = x W^T for int4-zp banks (pre-quantized checkpoints), the CPU reference of that format, in two variants.
 *
 * w4a16 (the int4 preset: activations as stored, fp32 or bf16 values):
 *   y[n] = sum_b s[n, b] * sum_{j in block b} x[perm[j]] * (u[n, j] - z[n, b])
 * with blocks of G consecutive bank positions (K sorted by group for act-order), the group scale folded into the
 * fp32 accumulator once per group as the int4 path does.
 *
 * w4a8 (the fp8 plans: activations e4m3 with one fp32 scale per (row, 128-group), fm_e4m3_quantize_groups through
 * cpu_quantize_row, exactly as the int4-tc emulation quantizes them). The numerics contract the GPU kernels are
 * tested against: activation group g = bank positions [128 g, 128 g + 128) (the bank is in input order: no
 * act-order permutation; the last group may be partial), g' = 128 g / G the weight group holding it (G is a
 * multiple of 128, or one group spans K), and
 *   partial   = sum_{k in group g} xq[m, k] * (u[n, k] - z[n, g'])     fp32, in k order
 *   acc      += partial * (a[m, g] * s[n, g'])                          one fp32 product of the two scales first
 * with xq the decoded e4m3 activation, a its group scale, u - z an exact small integer (e4m3 holds -16..15 exactly)
 * and acc starting at 0, summed over g in order. Each output is summed in a fixed order (thread-count independent). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

static inline float code_at(const uint8_t *cr, int64_t j) { return (float)((cr[j >> 1] >> ((j & 1) * 4)) & 15); }

/* w4a16: outputs n0..n1 of matrix idx for one input row already gathered into bank order (xp[K]) */
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
            for (int64_t j = b * G; j < j1; j++) sum += xp[j] * (code_at(cr, j) - z); /* exact integer */
            acc += sum * w->scales[r * ng + b];
        }
        y[n - n0] = acc;
    }
}

/* w4a8: the contract above, for one e4m3 row xq[K] with group scales as[K / 128] */
static void dot_rows_a8(const fm_bank *w, int32_t idx, const float *xq, const float *as, int64_t n0, int64_t n1,
                        float *y) {
    const int64_t K = w->cols, G = w->group, ng = w->n_groups, KB = (K + 1) / 2, A = FM_CPU_GROUP;
    for (int64_t n = n0; n < n1; n++) {
        const int64_t r = (int64_t)idx * w->rows + n;
        const uint8_t *cr = w->codes + r * KB;
        float acc = 0.0f;
        for (int64_t g = 0; g < (K + A - 1) / A; g++) {             /* the last activation group may be partial */
            const int64_t wg = g * A / G < ng ? g * A / G : ng - 1; /* g': the weight group holding group g */
            const float z = (float)w->zeros[r * ng + wg];
            float partial = 0.0f;
            const int64_t k1 = (g + 1) * A < K ? (g + 1) * A : K;
            for (int64_t k = g * A; k < k1; k++) partial += xq[k] * (code_at(cr, k) - z);
            acc += partial * (as[g] * w->scales[r * ng + wg]);
        }
        y[n - n0] = acc;
    }
}

static void gather(const fm_bank *w, int32_t idx, const float *x, float *xp) {
    const int64_t K = w->cols;
    const int32_t *perm = w->perm ? w->perm + (int64_t)idx * K : NULL;
    for (int64_t j = 0; j < K; j++) xp[j] = perm ? x[perm[j]] : x[j];
}

void cpu_int4zp_rows(const fm_bank *w, int32_t idx, const cpu_qrow *x, int64_t n0, int64_t n1, float *y) {
    if (x->scale) {
        if (w->perm || (w->n_groups > 1 && w->group % FM_CPU_GROUP != 0)) { /* one group: any K (per-channel) */
            fprintf(stderr,
                    "fp8moe: cpu linear: an int4-zp bank with group %d, K = %lld%s reached the e4m3 1x128 op "
                    "(model.c refuses such banks for the fp8 plans)\n",
                    w->group, (long long)w->cols, w->perm ? " and an act-order permutation" : "");
            abort(); /* a bug: the load checks both */
        }
        dot_rows_a8(w, idx, x->val, x->scale, n0, n1, y);
        return;
    }
    if (!w->perm) {
        dot_rows(w, idx, x->val, n0, n1, y);
        return;
    }
    float *xp = (float *)malloc((size_t)w->cols * sizeof(float));
    gather(w, idx, x->val, xp);
    dot_rows(w, idx, xp, n0, n1, y);
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
