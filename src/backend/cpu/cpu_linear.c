/* y = x W^T on the CPU, emulating each weight/activation format exactly:
 *   f32 / bf16 weights:  y[n] = sum_g scale_a[g] * sum_{k in g} a[k] w[n,k]
 *   int4 weights:        y[n] = sum_g (scale_a[g] * scale_w[n,g]) * sum_{k in g} a[k] q[n,k]
 *   int4-zp, e4m3-block: the pre-quantized checkpoints' formats, cpu_linear_int4zp.c and cpu_linear_e4m3b.c
 *   e4m3-tensor (W8A8):  y[n] = (scale_x * scale_W) * sum_k a[k] q[n,k], one scale for the whole input (amax over
 *                        all M x K elements of this call) and one for the matrix, applied once after the sum as
 *                        cuBLASLt's scale pointers do; e4m3-row: the same with one scale per input row
 * where a is the activation as quantized (e4m3 codes decoded; FP4 rows expanded to e4m3 with one scale per
 * 128-group, as the GPU's grouped GEMM expands them; or the input itself) and scale_a is its 1x128 scale (1 when
 * the values carry their own scale). The product of the two
 * scales is folded into the fp32 accumulator once per 128-group, as the GPU kernels do ("promotion"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* An FP4 row (codes and block scales as the dispatch buffer holds them) as the GPU's grouped GEMM reads it: each
 * 128-group expanded to e4m3 codes with one group scale (fm_mxfp4_expand_e4m3, fm_nvfp4_expand_e4m3), the codes
 * decoded into val and the scale kept apart, as for e4m3 1x128 activations. */
void cpu_expand_fp4_row(const uint8_t *packed, const uint8_t *scales, int64_t K, bool nv, float tensor_scale,
                        cpu_qrow *q) {
    uint8_t codes[FM_CPU_GROUP];
    for (int64_t g = 0; g * FM_CPU_GROUP < K; g++) {
        const int64_t k0 = g * FM_CPU_GROUP, n = K - k0 < FM_CPU_GROUP ? K - k0 : FM_CPU_GROUP;
        q->scale[g] = nv ? fm_nvfp4_expand_e4m3(packed + k0 / 2, scales + k0 / FM_NV_BLOCK, tensor_scale, n, codes)
                         : fm_mxfp4_expand_e4m3(packed + k0 / 2, scales + k0 / FM_MX_BLOCK, n, codes);
        for (int64_t i = 0; i < n; i++) q->val[k0 + i] = fm_e4m3_to_f32(codes[i]);
    }
}

void cpu_quantize_row(const float *x, int64_t K, fm_afmt afmt, cpu_qrow *q) {
    switch (afmt) {
    case FM_A_NATIVE:
        memcpy(q->val, x, (size_t)K * sizeof *x);
        q->scale = NULL;
        return;
    case FM_A_E4M3_G128: {
        /* codes are decoded in place of the values; the per-group scale is kept apart */
        uint8_t *codes = (uint8_t *)malloc((size_t)K);
        fm_e4m3_quantize_groups(x, K, FM_CPU_GROUP, codes, q->scale);
        for (int64_t k = 0; k < K; k++) q->val[k] = fm_e4m3_to_f32(codes[k]);
        free(codes);
        return;
    }
    case FM_A_E4M3_PT: /* needs the whole input's amax: cpu_linear quantizes it */
    case FM_A_E4M3_ROW:
    case FM_A_NVFP4: abort(); /* needs the whole input's amax: cpu_quantize_row_nvfp4 */
    case FM_A_MXFP4: {
        const int64_t nb = (K + FM_MX_BLOCK - 1) / FM_MX_BLOCK;
        uint8_t *packed = (uint8_t *)malloc((size_t)(K + 1) / 2 + (size_t)nb);
        fm_mxfp4_quantize(x, K, FM_MX_RCEIL, packed, packed + (K + 1) / 2);
        cpu_expand_fp4_row(packed, packed + (K + 1) / 2, K, false, 1.0f, q);
        free(packed);
        return;
    }
    }
}

void cpu_quantize_row_nvfp4(const float *x, int64_t K, float tensor_scale, cpu_qrow *q) {
    const int64_t nb = (K + FM_NV_BLOCK - 1) / FM_NV_BLOCK;
    uint8_t *packed = (uint8_t *)malloc((size_t)(K + 1) / 2 + (size_t)nb);
    fm_nvfp4_quantize(x, K, tensor_scale, packed, packed + (K + 1) / 2);
    cpu_expand_fp4_row(packed, packed + (K + 1) / 2, K, true, tensor_scale, q);
    free(packed);
}

void cpu_linear_row(const fm_bank *w, int32_t idx, const cpu_qrow *x, float *y) {
    if (fm_wformat_is_int4zp(w->fmt) || w->fmt == FM_W_E4M3_B128) {
        if (fm_wformat_is_int4zp(w->fmt)) cpu_int4zp_rows(w, idx, x, 0, w->rows, y);
        else cpu_e4m3b_rows(w, idx, x, 0, w->rows, y);
        return;
    }
    const int64_t K = w->cols, N = w->rows;
    const float *W = w->w + (int64_t)idx * N * K;
    const bool grouped = w->scales || x->scale;
    const int64_t G = grouped ? FM_CPU_GROUP : K, n_groups = (K + G - 1) / G;
    const float *ws = w->scales ? w->scales + (int64_t)idx * N * w->n_groups : NULL;
    for (int64_t n = 0; n < N; n++) {
        const float *wr = W + n * K;
        float acc = 0.0f;
        for (int64_t g = 0; g < n_groups; g++) {
            const int64_t k0 = g * G, len = K - k0 < G ? K - k0 : G;
            float scale = 1.0f;
            if (x->scale) scale *= x->scale[g];
            if (ws) scale *= ws[n * w->n_groups + g];
            acc += dot(x->val + k0, wr + k0, len) * scale;
        }
        y[n] = w->tscale ? acc * (x->tensor_scale * w->tscale[idx]) : acc;
    }
}

void cpu_linear(fm_backend *be, const fm_bank *w, int32_t idx, const void *xv, int64_t M, fm_afmt afmt, void *yv) {
    const float *x = (const float *)xv;
    float *y = (float *)yv;
    if (fm_wformat_is_int4zp(w->fmt) && afmt == FM_A_NATIVE) { /* w4a16: gathers act-order inputs once per row */
        cpu_linear_int4zp(be, w, idx, x, M, y);
        return;
    }
    const int64_t K = w->cols, N = w->rows, n_groups = (K + FM_CPU_GROUP - 1) / FM_CPU_GROUP;
    float *qv = (float *)malloc((size_t)(M * K) * sizeof(float));
    float *qs = (float *)malloc((size_t)(M * n_groups) * sizeof(float));
    float *row_scale = NULL; /* e4m3-row: [M] */
    float tensor_scale = 1.0f;
    const bool per_tensor_a = afmt == FM_A_E4M3_PT || afmt == FM_A_E4M3_ROW;
    if (per_tensor_a != (w->fmt == FM_W_E4M3_PT)) {
        fprintf(stderr, "fp8moe: cpu linear: %s weights with %s activations is not a W8A8 pair\n",
                fm_wformat_name(w->fmt), fm_afmt_name(afmt));
        abort(); /* the plans never pair them otherwise */
    }
    if (afmt == FM_A_E4M3_PT) tensor_scale = fm_e4m3_quantize_tensor(x, M * K, qv);
    else if (afmt == FM_A_E4M3_ROW) {
        row_scale = (float *)malloc((size_t)M * sizeof(float));
        for (int64_t m = 0; m < M; m++) row_scale[m] = fm_e4m3_quantize_tensor(x + m * K, K, qv + m * K);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            cpu_qrow q = {qv + m * K, qs + m * n_groups, 1.0f};
            cpu_quantize_row(x + m * K, K, afmt, &q);
        }
    }
    const bool has_scale = afmt == FM_A_E4M3_G128 || afmt == FM_A_MXFP4;
    /* blocks of 16 outputs per task keep a weight block hot in cache across rows */
    const int64_t NB = 16, n_blocks = (N + NB - 1) / NB;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
            if (fm_wformat_is_int4zp(w->fmt) ||
                w->fmt == FM_W_E4M3_B128) { /* pre-quantized banks: their own row loops */
                cpu_qrow q = {qv + m * K, has_scale ? qs + m * n_groups : NULL, 1.0f};
                if (fm_wformat_is_int4zp(w->fmt)) cpu_int4zp_rows(w, idx, &q, n0, n1, y + m * N + n0);
                else cpu_e4m3b_rows(w, idx, &q, n0, n1, y + m * N + n0);
                continue;
            }
            fm_bank sub = *w; /* a view of rows n0..n1 of matrix idx */
            sub.rows = n1 - n0;
            sub.w = w->w + ((int64_t)idx * N + n0) * K;
            sub.scales = w->scales ? w->scales + ((int64_t)idx * N + n0) * w->n_groups : NULL;
            sub.tscale = w->tscale ? w->tscale + idx : NULL;
            cpu_qrow q = {qv + m * K, has_scale ? qs + m * n_groups : NULL, row_scale ? row_scale[m] : tensor_scale};
            cpu_linear_row(&sub, 0, &q, y + m * N + n0);
        }
    free(qv);
    free(qs);
    free(row_scale);
    cpu_round_act(be, y, M * N);
}
