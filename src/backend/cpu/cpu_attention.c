/* Attention of the CPU reference: Qwen3 per-head q/k RMSNorm + RoPE, and causal GQA attention, on the fused
 * qkv buffer [T, (nh + 2 nkv) hd] (q heads, then k heads, then v heads). Follows HF eager attention:
 * scores = q.k * hd^-0.5, causal mask, fp32 softmax, then the weighted sum of v. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

static void rms_head(float *x, int32_t hd, const float *w, float eps) {
    float ss = 0.0f;
    for (int32_t i = 0; i < hd; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int32_t i = 0; i < hd; i++) x[i] = w[i] * (x[i] * inv);
}

/* rotate-half RoPE: pairs (j, j + hd/2) rotated by pos * inv_freq[j] */
static void rope_head(float *x, int32_t half, const float *cosv, const float *sinv) {
    for (int32_t j = 0; j < half; j++) {
        const float a = x[j], b = x[j + half];
        x[j]        = a * cosv[j] - b * sinv[j];
        x[j + half] = b * cosv[j] + a * sinv[j];
    }
}

void cpu_qk_norm_rope(fm_backend *be, void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const fm_bank *q_norm,
                      const fm_bank *k_norm, float eps, int64_t pos0, double theta) {
    float        *qkv = (float *)qkvv;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const int32_t half = hd / 2;
    /* inv_freq as transformers computes it: 1 / theta^(2i/d) in fp32 */
    float *inv_freq = (float *)malloc((size_t)half * sizeof(float));
    for (int32_t i = 0; i < half; i++) inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)hd);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float cosv[half > 0 ? half : 1], sinv[half > 0 ? half : 1];
        const float pos = (float)(pos0 + t);
        for (int32_t j = 0; j < half; j++) {
            const float f = pos * inv_freq[j];
            cosv[j] = cosf(f);
            sinv[j] = sinf(f);
        }
        float *row = qkv + t * ld;
        for (int32_t h = 0; h < nh + nkv; h++) {
            float *x = row + (int64_t)h * hd;
            const fm_bank *norm = h < nh ? q_norm : k_norm;
            if (norm) rms_head(x, hd, norm->w, eps);
            rope_head(x, half, cosv, sinv);
        }
    }
    free(inv_freq);
    for (int64_t t = 0; t < T; t++) cpu_round_act(be, qkv + t * ld, (int64_t)(nh + nkv) * hd);
}

void cpu_attention(fm_backend *be, const void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *outv) {
    const float  *qkv = (const float *)qkvv;
    float        *out = (float *)outv;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const int32_t group = nh / nkv;
    const float   scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *p = (float *)malloc((size_t)T * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int32_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *q = qkv + t * ld + (int64_t)h * hd;
                const int64_t kofs = (int64_t)(nh + h / group) * hd, vofs = (int64_t)(nh + nkv + h / group) * hd;
                float mx = -INFINITY;
                for (int64_t j = 0; j <= t; j++) {
                    const float *k = qkv + j * ld + kofs;
                    float        s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int32_t i = 0; i < hd; i++) s += q[i] * k[i];
                    p[j] = s * scale;
                    mx   = p[j] > mx ? p[j] : mx;
                }
                float sum = 0.0f;
                for (int64_t j = 0; j <= t; j++) sum += (p[j] = expf(p[j] - mx));
                float *o = out + t * (int64_t)nh * hd + (int64_t)h * hd;
                for (int32_t i = 0; i < hd; i++) o[i] = 0.0f;
                for (int64_t j = 0; j <= t; j++) {
                    const float  pj = p[j] / sum;
                    const float *v  = qkv + j * ld + vofs;
#pragma omp simd
                    for (int32_t i = 0; i < hd; i++) o[i] += pj * v[i];
                }
            }
        free(p);
    }
    cpu_round_act(be, out, T * (int64_t)nh * hd);
}
