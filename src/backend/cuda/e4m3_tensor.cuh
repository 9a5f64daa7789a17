// Per-tensor e4m3 quantization on the device, the pieces every W8A8 kernel shares: an amax kept as the bits of a
// non-negative float (their unsigned order is the float order, so atomicMax works), the scale it implies,
// max(amax / 448, 1e-12) (FM_E4M3_MAX, FM_ACT_SCALE_FLOOR of src/quant/e4m3.h), and the saturating RNE encoder,
// all bit for bit what the CPU's fm_e4m3_quantize_tensor computes; and the decoder.
#ifndef FM_CUDA_E4M3_TENSOR_CUH
#define FM_CUDA_E4M3_TENSOR_CUH

#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"

// The value of an e4m3 byte (finite codes: 2^(e - 7) (1 + m / 8), subnormals m 2^-9), without a conversion unit.
static __device__ __forceinline__ float e4m3_decode(uint32_t b) {
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    return (b & 0x80u) ? -v : v;
}

static __device__ __forceinline__ float e4m3t_warp_max(float a) {
    for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// a block's amax into *amax with one atomic (blockDim.x a multiple of 32, at most 1024; every thread calls it):
// atomics on one address serialise, so a grid commits one per block, not one per warp
static __device__ __forceinline__ void e4m3t_block_amax_commit(float a, unsigned *amax) {
    __shared__ float e4m3t_red[32];
    a = e4m3t_warp_max(a);
    if ((threadIdx.x & 31) == 0) e4m3t_red[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x < 32) {
        a = threadIdx.x < (blockDim.x >> 5) ? e4m3t_red[threadIdx.x] : 0.0f;
        a = e4m3t_warp_max(a);
        if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(a));
    }
}

static __device__ __forceinline__ float e4m3t_scale_of(unsigned amax_bits) {
    return fmaxf(__uint_as_float(amax_bits) / 448.0f, 1e-12f);
}

static __device__ __forceinline__ uint8_t e4m3t_encode(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

#endif
