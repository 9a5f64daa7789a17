// A norm's row as one block holds it (elementwise.cu's RMSNorm and add + RMSNorm, moe_combine_norm.cu's combine +
// add + RMSNorm): the block sum, the element-to-thread map and the loads and stores of 8 activations at a time. Every
// kernel that normalises a row through these sums its squares in the same order, so their results agree bit for bit.
#ifndef FM_CUDA_NORM_ROW_CUH
#define FM_CUDA_NORM_ROW_CUH

#include "backend/cuda/cuda_common.cuh"

// the sum of every thread's v over the block (warp shuffles, then one warp over the warps' sums), for every thread
static __device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

// The norms run one block of NORM_THREADS per row; thread t owns elements t, t + NORM_THREADS, ... and sums their
// squares in that order. A row of up to NORM_VEC x NORM_THREADS elements (4096: every hidden size we run) is held in
// registers: every load of the row (and of w) is issued before the first is used, so a step of decode pays one memory
// round trip per phase instead of one per element (a strided loop whose stores may alias its next loads is
// serialised by the compiler: 6.9 us for a 2048-wide row, measured with ncu). Longer rows take the plain loop, with
// the same per-thread order of summation.
// Rows whose width is a multiple of 8 (every hidden size) go 16 bytes at a time instead: thread t owns the 8-element
// chunks t, t + NORM_THREADS (up to NORM_CHUNKS of them: 4096 elements), loads each with one instruction and sums its
// elements' squares in order (prefill: 2048 blocks of 2-byte loads ran add_rmsnorm at 14.6 us for 2048 x 2048, twice
// its 32 MB floor). Both norms map a row the same way, so add_rmsnorm stays bit for bit add + rmsnorm.
#define NORM_THREADS 256
#define NORM_VEC 16
#define NORM_CHUNKS 2

// 8 bf16 in 16 bytes as floats, and 8 floats rounded to bf16 and packed
static __device__ __forceinline__ void unpack8(uint4 raw, float v[8]) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = __low2float(h[i]), v[2 * i + 1] = __high2float(h[i]);
}
static __device__ __forceinline__ uint4 pack8(const float v[8]) {
    uint4 raw;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return raw;
}

// 8 consecutive activations as floats, and back (bf16: one 16-byte access; fp32: two)
static __device__ __forceinline__ void load8f(const __nv_bfloat16 *p, float v[8]) { unpack8(*(const uint4 *)p, v); }
static __device__ __forceinline__ void load8f(const float *p, float v[8]) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
static __device__ __forceinline__ void store8f(__nv_bfloat16 *p, const float v[8]) { *(uint4 *)p = pack8(v); }
static __device__ __forceinline__ void store8f(float *p, const float v[8]) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
// The 16-byte form's last step, shared by both norms: out = w * (v * inv) for this thread's chunks of the row.
template <typename A>
static __device__ __forceinline__ void norm_store_chunks(float v[NORM_CHUNKS][8], const float wv[NORM_CHUNKS][8],
                                                         float inv, A *yr, int64_t dim) {
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c >= dim) continue;
#pragma unroll
        for (int e = 0; e < 8; e++) v[j][e] = wv[j][e] * (v[j][e] * inv);
        store8f(yr + c, v[j]);
    }
}
// the 16-byte form applies: 8 | dim (so every row of an aligned buffer is aligned), dim <= 8 NORM_CHUNKS NORM_THREADS
template <typename A> static __device__ __forceinline__ bool norm_vec8(const A *p, int64_t dim) {
    return dim % 8 == 0 && dim <= 8 * NORM_CHUNKS * NORM_THREADS && ((uintptr_t)p & 15) == 0;
}

static __device__ __forceinline__ float act_round(float v, const float *) { return v; }
static __device__ __forceinline__ float act_round(float v, const __nv_bfloat16 *) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

// 8 bf16 through L2 only: rows another CTA of the grid, or a kernel this one overlaps under PDL, wrote
// (L1 is not coherent)
static __device__ __forceinline__ void load8f_cg(const __nv_bfloat16 *p, float v[8]) {
    unpack8(__ldcg((const uint4 *)p), v);
}

#endif
