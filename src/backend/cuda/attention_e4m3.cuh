// The e4m3 KV cache's side of the paged attention kernels (attention_paged.cu's split kernel,
// attention_paged_tiled.cu): the products run on f16 operands. Every e4m3 code is an f16 (one cvt a pair, no scale),
// the query tile is converted to f16 once, and the cache rows' power-of-two scales are applied to the scores (keys) and
// to the probabilities (values), where a product by a power of two is exact. The layouts are attention_mma.cuh's.
#ifndef FM_CUDA_ATTENTION_E4M3_CUH
#define FM_CUDA_ATTENTION_E4M3_CUH

#include <cuda_fp8.h>

#include "backend/cuda/attention_mma.cuh"

// two e4m3 codes (the low byte first) as an f16 pair: exact (every e4m3 value is an f16), one cvt on sm_89+
static __device__ __forceinline__ uint32_t att_e4m3x2_f16x2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}

// 1 / x for x a power of two in fp32's normal range: exact, one integer subtraction
static __device__ __forceinline__ float att_inv_pow2(float x) { return __int_as_float(0x7f000000 - __float_as_int(x)); }

// The codes of a raw tile [ROWS][HD] bytes (rows of HD bytes, unswizzled) to an f16 tile [ROWS][HD] in
// attention_mma.cuh's layout, unscaled, by NT threads (idx in [0, NT)): thread idx converts the 8-code pieces idx,
// idx + NT, ...: piece k is chunk k % (HD / 8) of row k / (HD / 8), an 8-byte load (NT consecutive pieces: contiguous
// bytes) and one 16-byte store (8 consecutive pieces of a row land in distinct bank groups of the swizzled layout).
// U pieces unrolled: the loads hoisted above the conversions hold registers (the split kernel's HD 128: 4 keeps 3
// CTAs an SM, whole unrolling 2). Plain shared-memory accesses: the caller's barrier orders them with the cp.async
// that filled the raw tile and with the ldmatrix that reads the f16 one.
template <int HD, int ROWS, int NT, int U>
static __device__ __forceinline__ void att_e4m3_to_f16(unsigned char *tile, const unsigned char *raw, int idx) {
    constexpr int CH = HD / 8, N = (ROWS * CH + NT - 1) / NT; // HD % 16 == 0
#pragma unroll U
    for (int p = 0; p < N; p++) {
        const int k = idx + NT * p, r = k / CH, ch = k % CH;
        if ((ROWS * CH) % NT != 0 && k >= ROWS * CH) break;
        const uint2 c = *(const uint2 *)(raw + k * 8);
        *(uint4 *)(tile + att_off<HD>(r, ch)) = make_uint4(att_e4m3x2_f16x2(c.x), att_e4m3x2_f16x2(c.x >> 16),
                                                           att_e4m3x2_f16x2(c.y), att_e4m3x2_f16x2(c.y >> 16));
    }
}

// The block's query tile [ROWS][HD] (bf16, at smem in attention_mma.cuh's layout) to f16 in place, times 2^-qe, and
// 2^qe returned (the scores are multiplied by it back: exact, a power of two). qe >= 0 is the least that brings the
// tile's largest |q| under 2^16 (every bf16 below 2^16 is an f16; 0 unless a query exceeds 65,280). Values under
// f16's normal range (2^-14) keep fewer bits than in bf16: their products are below 2^-14 |k|. Called by all THREADS
// threads of the block after the tile landed, qmax a shared word set to 0 before that barrier; ends with a barrier.
// The barrier of a CTA's attention threads: SYNC 0, __syncthreads (a kernel whose every thread runs the attention);
// SYNC > 0, named barrier SYNC over the first THREADS threads (a persistent kernel whose other warps do other work)
template <int SYNC, int THREADS> static __device__ __forceinline__ void att_sync() {
    if (SYNC == 0) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"n"(SYNC), "n"(THREADS) : "memory");
}

template <int HD, int ROWS, int THREADS, int SYNC = 0>
static __device__ __forceinline__ float att_q_to_f16(unsigned char *smem, unsigned *qmax, int tid) {
    constexpr int CH = HD / 8, N = (ROWS * CH + THREADS - 1) / THREADS;
    uint4 v[N];
    unsigned m = 0;
#pragma unroll
    for (int p = 0; p < N; p++) {
        const int i = tid + p * THREADS;
        v[p] = i < ROWS * CH ? *(const uint4 *)(smem + att_off<HD>(i / CH, i % CH)) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
#pragma unroll
        for (int j = 0; j < 4; j++) m = max(m, max(w[j] & 0x7fffu, (w[j] >> 16) & 0x7fffu)); // |bf16| ordered as bits
    }
    m = __reduce_max_sync(0xffffffffu, m);
    if ((tid & 31) == 0) atomicMax(qmax, m);
    att_sync<SYNC, THREADS>();
    const int qe = min(max((int)(*qmax >> 7) - 142, 0), 100); // bf16 exponent field 143: [2^16, 2^17) -> 1
    const float down = __int_as_float((127 - qe) << 23);
#pragma unroll
    for (int p = 0; p < N; p++) {
        const int i = tid + p * THREADS;
        if (i >= ROWS * CH) break;
        const uint32_t w[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = att_pack_f16(__uint_as_float(w[j] << 16) * down, __uint_as_float(w[j] & 0xffff0000u) * down);
        *(uint4 *)(smem + att_off<HD>(i / CH, i % CH)) = make_uint4(h[0], h[1], h[2], h[3]);
    }
    att_sync<SYNC, THREADS>();
    return __int_as_float((127 + qe) << 23);
}

#endif
