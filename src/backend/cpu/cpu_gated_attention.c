/* Qwen3-Next's gated full attention and gated shared expert on the CPU reference (backend.h states each op): the
 * query/gate split of q_proj's output with per-head q/k RMSNorm and partial RoPE, and the two sigmoid gates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

void cpu_gated_qk_norm_rope(fm_backend *be, const void *qgv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            int32_t rot_dim, const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0,
                            const void *posv, double theta, void *qkvv, void *gatev) {
    const float *qg = (const float *)qgv;
    float *qkv = (float *)qkvv, *gate = (float *)gatev;
    const int64_t ld_in = (int64_t)(2 * nh + 2 * nkv) * hd, ld = (int64_t)(nh + 2 * nkv) * hd;
    /* the split: per head hd query rows then hd gate rows, then k and v as they are */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *in = qg + t * ld_in;
        float *row = qkv + t * ld;
        for (int32_t h = 0; h < nh; h++) {
            memcpy(row + (int64_t)h * hd, in + (int64_t)h * 2 * hd, (size_t)hd * sizeof(float));
            memcpy(gate + t * (int64_t)nh * hd + (int64_t)h * hd, in + (int64_t)h * 2 * hd + hd,
                   (size_t)hd * sizeof(float));
        }
        memcpy(row + (int64_t)nh * hd, in + (int64_t)2 * nh * hd, (size_t)(2 * nkv) * (size_t)hd * sizeof(float));
    }
    cpu_norm_rope_rows(qkv, T, nh, nkv, hd, rot_dim, q_norm, k_norm, eps, pos0, (const int32_t *)posv, theta);
    cpu_round_act(be, qkv, T * ld);
    cpu_round_act(be, gate, T * (int64_t)nh * hd);
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void cpu_sigmoid_mul(fm_backend *be, void *xv, const void *gatev, int64_t n) {
    float *x = (float *)xv;
    const float *gate = (const float *)gatev;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= sigmoid(gate[i]);
    cpu_round_act(be, x, n);
}

void cpu_add_sigmoid_scaled(fm_backend *be, void *accv, const void *xv, const void *scorev, int64_t rows, int64_t dim) {
    float *acc = (float *)accv;
    const float *x = (const float *)xv, *score = (const float *)scorev;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float s = sigmoid(score[r]);
        for (int64_t i = 0; i < dim; i++) acc[r * dim + i] += s * x[r * dim + i];
    }
    cpu_round_act(be, acc, rows * dim);
}

void cpu_add_sigmoid_gated(fm_backend *be, void *acc, const void *x, const void *h, const fm_bank *w, int64_t rows,
                           int64_t dim) {
    /* the op's definition: the score as linear leaves it (rounded to the act dtype), then the gate */
    float *score = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *score);
    if (!score) {
        fprintf(stderr, "fp8moe: cpu add_sigmoid_gated: out of memory for %lld scores\n", (long long)rows);
        abort();
    }
    cpu_linear(be, w, 0, h, rows, FM_A_NATIVE, score);
    cpu_add_sigmoid_scaled(be, acc, x, score, rows, dim);
    free(score);
}
