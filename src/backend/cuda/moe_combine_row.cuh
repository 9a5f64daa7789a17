// One token's end of the MoE block by one block of NORM_THREADS threads: its k routed rows weighted and summed,
// rounded to bf16 as moe_combine stores them, added into the residual and normalised as add_rmsnorm does
// (norm_row.cuh's map and order). Both places that end the block this way share it: the kernel of its own
// (moe_combine_norm.cu) and the down GEMV's last CTA of each token (gemv_fp8.cu, route moe.combine=fused), so they
// agree bit for bit.
#ifndef FM_CUDA_MOE_COMBINE_ROW_CUH
#define FM_CUDA_MOE_COMBINE_ROW_CUH

#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/norm_row.cuh"

#define COMBINE_U 4 /* routed rows whose loads are in flight together (the default: U) */

// this thread's chunks of the norm's weights (no earlier kernel writes them: a caller loads them before its wait)
static __device__ __forceinline__ void combine_row_norm_weights(const __nv_bfloat16 *norm, int64_t H,
                                                                float wv[NORM_CHUNKS][8]) {
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) load8f(norm + c, wv[j]);
    }
}

// m[j] += the k routed rows' chunks j < CH weighted, in i order (fp32): U rows' loads in flight before their products
// (a row's load is a round trip through L2: one at a time, the walk over k = 8 rows took ~3 us of the persistent MoE
// block's 3.4-us tail)
template <int U, int CH>
static __device__ __forceinline__ void combine_rows(const __nv_bfloat16 *y, const int32_t *slot_of,
                                                    const __nv_bfloat16 *w, int32_t k, int64_t H, int64_t t,
                                                    float m[NORM_CHUNKS][8]) {
    for (int32_t i0 = 0; i0 < k; i0 += U) {
        uint4 raw[U][CH];
        float wi[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t i = i0 + u;
            if (i >= k) break;
            const int64_t p = t * k + i, row = slot_of ? slot_of[p] : p;
            wi[u] = __bfloat162float(w[p]);
#pragma unroll
            for (int j = 0; j < CH; j++) {
                const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
                if (c < H) raw[u][j] = __ldcg((const uint4 *)(y + row * H + c));
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (i0 + u >= k) break;
#pragma unroll
            for (int j = 0; j < CH; j++) {
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
}

// The normed row's 128-groups in e4m3 from the registers that stored it (H a multiple of 128): thread t's chunk j
// starts at column 8 (t + j NORM_THREADS), so group c / 128 is the chunks of 16 consecutive threads and its maximum
// four shuffles within the half-warp, not a __syncthreads and a reload of the row. The arithmetic is quantize_group's
// on the bf16 values stored (the same codes and scale): codes at q8 + column, the group's scale at q8s[grp ld_s + t].
static __device__ __forceinline__ void quantize_chunks_e4m3(const float v[NORM_CHUNKS][8], int64_t H, uint8_t *q8,
                                                            float *q8s, int64_t ld_s, int64_t t) {
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        if (8 * (int64_t)j * NORM_THREADS >= H) break; /* the same for every thread: the shuffles stay whole */
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        const bool live = c < H;
        float r[8], amax = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            r[e] = live ? __bfloat162float(__float2bfloat16_rn(v[j][e])) : 0.0f; /* the value stored */
            amax = fmaxf(amax, fabsf(r[e]));
        }
        for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = e4m3_group_scale(amax);
        if (!live) continue;
        uint32_t word[2] = {0u, 0u};
#pragma unroll
        for (int e = 0; e < 8; e++) word[e >> 2] |= e4m3_group_code(r[e], scale) << (8 * (e & 3));
        *(uint2 *)(q8 + c) = make_uint2(word[0], word[1]);
        if ((threadIdx.x & 15) == 0) q8s[(c / 128) * ld_s + t] = scale;
    }
}

// Token t: m = sum_i w[t k + i] y[row(t k + i)] (row(p) = slot_of ? slot_of[p] : p, in i order, fp32),
// acc[t] = bf16(acc[t] + bf16(m)), out[t] = rmsnorm(acc[t]) * norm (wv: combine_row_norm_weights). H a multiple of 8
// up to 8 NORM_CHUNKS NORM_THREADS, rows 16-byte aligned. The rows and the residual are read through L2 (other CTAs
// or earlier kernels wrote them). Every thread of the block calls it (block_sum's barriers). With q8 (route
// dense.quant=producer) out[t] is also quantized for the next projection, as fm_cuda_quantize_e4m3_rows would: its
// codes at q8 + t ceil(H / 128) 128, its scales at q8s[grp ld_s + t] (from registers where H % 128 == 0, else by the
// block's warps from the row stored, quantize_group_warp). U: routed rows loaded at once where H <= 8 NORM_THREADS
// (else at most COMBINE_U).
template <int U = COMBINE_U>
static __device__ __forceinline__ void
combine_add_rmsnorm_row(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w, int32_t k, int64_t H,
                        int64_t t, __nv_bfloat16 *acc, float eps, const float wv[NORM_CHUNKS][8], __nv_bfloat16 *out,
                        uint8_t *q8, float *q8s, int64_t ld_s) {
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
    /* the first chunk alone where the row has no second (H <= 8 NORM_THREADS): twice the rows in flight for the same
       registers */
    if (H <= 8 * NORM_THREADS) combine_rows<U, 1>(y, slot_of, w, k, H, t, m);
    else combine_rows<(U < COMBINE_U ? U : COMBINE_U), NORM_CHUNKS>(y, slot_of, w, k, H, t, m);
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
    if (!q8) return;
    const int64_t G = (H + 127) / 128;
    if (H % 128 == 0) {
        quantize_chunks_e4m3(v, H, q8 + t * G * 128, q8s, ld_s, t);
        return;
    }
    __syncthreads(); /* every thread's stores of the row, before the warps read their groups */
    for (int64_t grp = threadIdx.x >> 5; grp < G; grp += NORM_THREADS / 32)
        quantize_group_warp<false>(out + t * H, H, grp, q8 + t * G * 128, q8s, NULL, ld_s, t);
}

// The shapes the one-block form takes (else moe_combine then add_rmsnorm)
static inline bool fm_combine_row_takes(int64_t H, const void *y, const void *acc, const void *norm, const void *out) {
    return H % 8 == 0 && H <= 8 * NORM_CHUNKS * NORM_THREADS &&
           (((uintptr_t)y | (uintptr_t)acc | (uintptr_t)norm | (uintptr_t)out) & 15) == 0;
}

#endif
