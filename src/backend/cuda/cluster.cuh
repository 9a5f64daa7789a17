// Thread-block clusters (sm_90): the cluster barrier, a CTA's rank, and loads and stores into another CTA's shared
// memory (distributed shared memory). Compiled to nothing below sm_90: the callers launch clusters on sm_90 only.
#ifndef FM_CUDA_CLUSTER_CUH
#define FM_CUDA_CLUSTER_CUH

#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ void cluster_arrive_relaxed(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cluster_arrive_release(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cluster_wait_acquire(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ uint32_t cluster_rank(void) {
    uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
// the shared-memory address (cvta) of this CTA's `local` in CTA `rank` of the cluster
static __device__ __forceinline__ uint32_t cluster_map(uint32_t local, uint32_t rank) {
    uint32_t remote = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
#else
    (void)rank;
#endif
    return remote;
}
// v into CTA `rank`'s shared memory at the offset of p (a pointer into this CTA's own shared memory)
static __device__ __forceinline__ void st_cluster_bf16(__nv_bfloat16 *p, uint32_t rank, __nv_bfloat16 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t remote = cluster_map((uint32_t)__cvta_generic_to_shared(p), rank);
    asm volatile("st.shared::cluster.b16 [%0], %1;" ::"r"(remote), "h"(__bfloat16_as_ushort(v)) : "memory");
#else
    (void)p, (void)rank, (void)v;
#endif
}
// the 16 bytes at a cluster shared-memory address (cluster_map's; 16-byte aligned)
static __device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t remote) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
#else
    (void)remote;
#endif
    return v;
}

#endif
