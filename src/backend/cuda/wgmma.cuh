// The wgmma pieces both sm_90a GEMMs share (w4a8_gemm.cu, and lab/gemm_w8a8.cu): the fence, commit and wait of an
// async warpgroup MMA, the register fences that keep the compiler from touching in-flight fragments, and the
// shared-memory descriptor of a K-major operand in the 128-byte swizzle. Empty (or a trap) below sm_90a.
#ifndef FM_CUDA_WGMMA_CUH
#define FM_CUDA_WGMMA_CUH

#include <stdint.h>

static __device__ __forceinline__ void wgmma_fence(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wgmma_commit(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wgmma_wait_all(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// At most N commit groups still in flight
template <int N> static __device__ __forceinline__ void wgmma_wait(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of registers that an in-flight wgmma owns across the wait.
static __device__ __forceinline__ void fence_f(float &r) { asm volatile("" : "+f"(r)::"memory"); }
static __device__ __forceinline__ void fence_u(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: rows of 128 bytes, 8-row groups
// 1024 bytes apart (stride byte offset), the tile 1024-byte aligned; a k step of 32 bytes advances the start.
static __device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

#endif
