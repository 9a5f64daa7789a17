// One token's end of the MoE block by one block of NORM_THREADS threads: its k routed rows weighted and summed,
// rounded to bf16 as moe_combine stores them, added into the residual and normalised as add_rmsnorm does
// (norm_row.cuh's map and order). Both places that end the block this way share it: the kernel of its own
// (moe_combine_norm.cu) and the down GEMV's last CTA of each token (gemv_fp8.cu, route moe.combine=fused), so they
// agree bit for bit.
#ifndef FM_CUDA_MOE_COMBINE_ROW_CUH
#define FM_CUDA_MOE_COMBINE_ROW_CUH

#include "backend/cuda/norm_row.cuh"

#define COMBINE_U 4 /* routed rows whose loads are in flight together */

// this thread's chunks of the norm's weights (no earlier kernel writes them: a caller loads them before its wait)
static __device__ __forceinline__ void combine_row_norm_weights(const __nv_bfloat16 *norm, int64_t H,
                                                                float wv[NORM_CHUNKS][8]) {
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) load8f(norm + c, wv[j]);
    }
}

// Token t: m = sum_i w[t k + i] y[row(t k + i)] (row(p) = slot_of ? slot_of[p] : p, in i order, fp32),
// acc[t] = bf16(acc[t] + bf16(m)), out[t] = rmsnorm(acc[t]) * norm (wv: combine_row_norm_weights). H a multiple of 8
// up to 8 NORM_CHUNKS NORM_THREADS, rows 16-byte aligned. The rows and the residual are read through L2 (other CTAs
// or earlier kernels wrote them). Every thread of the block calls it (block_sum's barriers).
static __device__ __forceinline__ void combine_add_rmsnorm_row(const __nv_bfloat16 *y, const int32_t *slot_of,
                                                               const __nv_bfloat16 *w, int32_t k, int64_t H, int64_t t,
                                                               __nv_bfloat16 *acc, float eps,
                                                               const float wv[NORM_CHUNKS][8], __nv_bfloat16 *out) {
    float v[NORM_CHUNKS][8], m[NORM_CHUNKS][8];
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++)
#pragma unroll
        for (int e = 0; e < 8; e++) m[j][e] = 0.0f;
    __nv_bfloat16 *ar = acc + t * H;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) load8f_cg(ar + c, v[j]);
    }
    /* COMBINE_U rows' loads in flight before their products (a row's load a round trip through L2: one at a time, the
       walk over k = 8 rows took ~3 us of the persistent MoE block's 3.4-us tail); the sums in i order as before */
    for (int32_t i0 = 0; i0 < k; i0 += COMBINE_U) {
        uint4 raw[COMBINE_U][NORM_CHUNKS];
        float wi[COMBINE_U];
#pragma unroll
        for (int u = 0; u < COMBINE_U; u++) {
            const int32_t i = i0 + u;
            if (i >= k) break;
            const int64_t p = t * k + i, row = slot_of ? slot_of[p] : p;
            wi[u] = __bfloat162float(w[p]);
#pragma unroll
            for (int j = 0; j < NORM_CHUNKS; j++) {
                const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
                if (c < H) raw[u][j] = __ldcg((const uint4 *)(y + row * H + c));
            }
        }
#pragma unroll
        for (int u = 0; u < COMBINE_U; u++) {
            if (i0 + u >= k) break;
#pragma unroll
            for (int j = 0; j < NORM_CHUNKS; j++) {
                const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
                if (c >= H) continue;
                const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw[u][j];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    m[j][2 * q] += wi[u] * __low2float(h[q]);
                    m[j][2 * q + 1] += wi[u] * __high2float(h[q]);
                }
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c >= H) continue;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            /* the combined value as moe_combine stores it, then the sum as add_rmsnorm stores it */
            v[j][e] = act_round(v[j][e] + act_round(m[j][e], ar), ar);
            ss += v[j][e] * v[j][e];
        }
        store8f(ar + c, v[j]);
    }
    norm_store_chunks(v, wv, 1.0f / sqrtf(block_sum(ss) / (float)H + eps), out + t * H, H);
}

// The shapes the one-block form takes (else moe_combine then add_rmsnorm)
static inline bool fm_combine_row_takes(int64_t H, const void *y, const void *acc, const void *norm, const void *out) {
    return H % 8 == 0 && H <= 8 * NORM_CHUNKS * NORM_THREADS &&
           (((uintptr_t)y | (uintptr_t)acc | (uintptr_t)norm | (uintptr_t)out) & 15) == 0;
}

#endif
