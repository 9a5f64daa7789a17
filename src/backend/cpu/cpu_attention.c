/* Attention of the CPU reference: Qwen3 per-head q/k RMSNorm + RoPE, and causal GQA attention, on the fused
 * qkv buffer [T, (nh + 2 nkv) hd] (q heads, then k heads, then v heads), or over the paged KV cache. Follows HF
 * eager attention: scores = q.k * hd^-0.5, causal mask, fp32 softmax, then the weighted sum of v. Both attention
 * ops run one row routine (attend_row) on the key and value rows they gather, so the paged op over a cache that
 * holds a prompt's k and v gives the contiguous op's output bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "quant/kv_e4m3.h"

#define CPU_KV_E4M3_MAX_HD 1024 /* an e4m3 row's codes on the stack */

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
        x[j] = a * cosv[j] - b * sinv[j];
        x[j + half] = b * cosv[j] + a * sinv[j];
    }
}

/* Per-head q/k RMSNorm, then rotate-half RoPE over the first rot_dim dims of each q and k head (pairs (j, j + rot_dim /
 * 2), inv_freq as transformers computes it: 1 / theta^(2j / rot_dim) in fp32), in place on qkv [T][(nh + 2 nkv) hd];
 * rot_dim = hd for full RoPE, less for partial rotary (Qwen3-Next). No activation rounding. */
void cpu_norm_rope_rows(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t rot_dim,
                        const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, const int32_t *pos,
                        double theta) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const int32_t half = rot_dim / 2;
    float *inv_freq = (float *)malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    for (int32_t i = 0; i < half; i++) inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot_dim);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float cosv[half > 0 ? half : 1], sinv[half > 0 ? half : 1];
        const float p = (float)(pos ? (int64_t)pos[t] : pos0 + t);
        for (int32_t j = 0; j < half; j++) {
            const float f = p * inv_freq[j];
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
}

void cpu_qk_norm_rope(fm_backend *be, void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const fm_bank *q_norm,
                      const fm_bank *k_norm, float eps, int64_t pos0, const void *posv, double theta) {
    float *qkv = (float *)qkvv;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    cpu_norm_rope_rows(qkv, T, nh, nkv, hd, hd, q_norm, k_norm, eps, pos0, (const int32_t *)posv, theta);
    for (int64_t t = 0; t < T; t++) cpu_round_act(be, qkv + t * ld, (int64_t)(nh + nkv) * hd);
}

/* the two ops, in order: the definition every backend's fused form follows */
void cpu_qk_norm_rope_store(fm_backend *be, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const fm_bank *q_norm, const fm_bank *k_norm, float eps, const void *pos, double theta,
                            const void *slots, void *k_cache, void *v_cache, fm_kv_dtype kv) {
    cpu_qk_norm_rope(be, qkv, T, nh, nkv, hd, q_norm, k_norm, eps, 0, pos, theta);
    cpu_kv_store(be, qkv, T, nh, nkv, hd, slots, k_cache, v_cache, kv);
}

/* One query row against n keys: o = softmax(q.k_j * scale) . v_j, key j at kbase + rows[j], value j at
 * vbase + rows[j]; p holds n scores. */
static void attend_row(const float *q, const float *kbase, const float *vbase, const int64_t *rows, int64_t n,
                       int32_t hd, float scale, float *p, float *o) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const float *k = kbase + rows[j];
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int32_t i = 0; i < hd; i++) s += q[i] * k[i];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) sum += (p[j] = expf(p[j] - mx));
    for (int32_t i = 0; i < hd; i++) o[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float pj = p[j] / sum;
        const float *v = vbase + rows[j];
#pragma omp simd
        for (int32_t i = 0; i < hd; i++) o[i] += pj * v[i];
    }
}

static void *cpu_xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "fp8moe: cpu %s: out of host memory (%zu bytes)\n", what, bytes);
        abort();
    }
    return p;
}

void cpu_attention(fm_backend *be, const void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *outv) {
    const float *qkv = (const float *)qkvv;
    float *out = (float *)outv;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const int32_t group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    int64_t *rows = (int64_t *)cpu_xmalloc((size_t)T * sizeof *rows, "attention");
    for (int64_t j = 0; j < T; j++) rows[j] = j * ld;
#pragma omp parallel
    {
        float *p = (float *)cpu_xmalloc((size_t)T * sizeof(float), "attention");
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int32_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t kofs = (int64_t)(nh + h / group) * hd, vofs = (int64_t)(nh + nkv + h / group) * hd;
                attend_row(qkv + t * ld + (int64_t)h * hd, qkv + kofs, qkv + vofs, rows, t + 1, hd, scale, p,
                           out + t * (int64_t)nh * hd + (int64_t)h * hd);
            }
        free(p);
    }
    free(rows);
    cpu_round_act(be, out, T * (int64_t)nh * hd);
}

/* row [hd] of the cache from src: copied, or (FM_KV_E4M3) the values of its e4m3 codes (the emulation: the rows keep
   the act dtype's width, kv_e4m3_codes false) */
static void store_head(const float *src, int32_t hd, fm_kv_dtype kv, float *dst) {
    if (kv != FM_KV_E4M3) {
        memcpy(dst, src, (size_t)hd * sizeof(float));
        return;
    }
    uint8_t codes[CPU_KV_E4M3_MAX_HD];
    const float scale = fm_kv_e4m3_quantize_row(src, hd, codes);
    fm_kv_e4m3_dequantize_row(codes, hd, scale, dst);
}

void cpu_kv_store(fm_backend *be, const void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const void *slotsv,
                  void *k_cachev, void *v_cachev, fm_kv_dtype kv) {
    (void)be;
    if (kv == FM_KV_E4M3 && hd > CPU_KV_E4M3_MAX_HD) {
        fprintf(stderr, "fp8moe: cpu kv_store: an e4m3 cache of head dim %d (at most %d)\n", hd, CPU_KV_E4M3_MAX_HD);
        abort();
    }
    const float *qkv = (const float *)qkvv;
    const int32_t *slots = (const int32_t *)slotsv;
    float *kc = (float *)k_cachev, *vc = (float *)v_cachev;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, row = (int64_t)nkv * hd;
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] == -1) continue; /* a padding row */
        if (slots[t] < 0) {
            fprintf(stderr, "fp8moe: cpu kv_store: token %lld has slot %d (a block table entry not set?)\n",
                    (long long)t, slots[t]);
            abort();
        }
        for (int32_t h = 0; h < nkv; h++) {
            store_head(qkv + t * ld + (int64_t)(nh + h) * hd, hd, kv, kc + (int64_t)slots[t] * row + (int64_t)h * hd);
            store_head(qkv + t * ld + (int64_t)(nh + nkv + h) * hd, hd, kv,
                       vc + (int64_t)slots[t] * row + (int64_t)h * hd);
        }
    }
}

void cpu_attention_paged(fm_backend *be, const void *qkvv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                         const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seqv,
                         const void *tok_posv, const void *tablesv, int32_t max_blocks, int32_t block_tokens,
                         int64_t max_len, void *scratch, void *outv) {
    (void)scratch, (void)kv; /* an e4m3 cache holds its codes' values here (store_head) */
    const float *qkv = (const float *)qkvv;
    const int32_t *tok_seq = (const int32_t *)tok_seqv, *tok_pos = (const int32_t *)tok_posv;
    const int32_t *tables = (const int32_t *)tablesv;
    float *out = (float *)outv;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, row = (int64_t)nkv * hd;
    const int32_t group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    /* the slot rows of every token's context, checked once: a table entry that is not a block is a broken
       invariant of the engine (the GPU would read out of bounds), so it stops here with the numbers */
    int64_t *first = (int64_t *)cpu_xmalloc((size_t)(T + 1) * sizeof *first, "attention_paged");
    first[0] = 0;
    for (int64_t t = 0; t < T; t++) {
        if (tok_pos[t] < 0 || tok_pos[t] >= max_len) {
            fprintf(stderr, "fp8moe: cpu attention_paged: token %lld at position %d, outside [0, max_len %lld)\n",
                    (long long)t, tok_pos[t], (long long)max_len);
            abort();
        }
        first[t + 1] = first[t] + tok_pos[t] + 1;
    }
    int64_t *rows = (int64_t *)cpu_xmalloc((size_t)first[T] * sizeof *rows, "attention_paged");
    int64_t longest = 1;
    for (int64_t t = 0; t < T; t++) {
        const int64_t n = tok_pos[t] + 1;
        longest = n > longest ? n : longest;
        for (int64_t j = 0; j < n; j++) {
            const int32_t block = tables[(int64_t)tok_seq[t] * max_blocks + j / block_tokens];
            if (block < 0) {
                fprintf(stderr,
                        "fp8moe: cpu attention_paged: sequence %d has no block for position %lld (token %lld "
                        "at position %d)\n",
                        tok_seq[t], (long long)j, (long long)t, tok_pos[t]);
                abort();
            }
            rows[first[t] + j] = ((int64_t)block * block_tokens + j % block_tokens) * row;
        }
    }
#pragma omp parallel
    {
        float *p = (float *)cpu_xmalloc((size_t)longest * sizeof(float), "attention_paged");
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int32_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t kvofs = (int64_t)(h / group) * hd;
                attend_row(qkv + t * ld + (int64_t)h * hd, (const float *)k_cache + kvofs,
                           (const float *)v_cache + kvofs, rows + first[t], tok_pos[t] + 1, hd, scale, p,
                           out + t * (int64_t)nh * hd + (int64_t)h * hd);
            }
        free(p);
    }
    free(rows), free(first);
    cpu_round_act(be, out, T * (int64_t)nh * hd);
}
