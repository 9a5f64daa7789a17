// Asynchronous bulk tensor copies global -> shared memory (sm_90: the TMA unit, cp.async.bulk.tensor) completed on
// mbarriers, and the mbarrier operations around them. A copy's tile is described by a CUtensorMap (a kernel
// parameter, __grid_constant__); the thread that issues it first arms the stage's barrier with the bytes to expect,
// and every thread that needs the data waits on the barrier's phase. The barrier's transaction count holds < 2^20
// bytes per phase. On sm_89 these compile to a trap: callers choose a kernel by compute capability.
// (attention_wgmma.cu and lab/gemm_w8a8.cu use them; a 1-D bulk-copy GEMV built on the same pieces is in history,
// bench/NOTES.md 2026-11-30 "decode GEMVs that prefetch into shared memory".)
#ifndef FM_CUDA_BULK_COPY_CUH
#define FM_CUDA_BULK_COPY_CUH

#include <cuda.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FM_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FM_BULK_ASM(...) __trap()
#endif

// count arrivals complete a phase; visible to the copy engine (the caller still synchronises the CTA before any
// other thread uses the barrier)
static __device__ __forceinline__ void bulk_barrier_init(uint64_t *bar, unsigned count) {
    FM_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(smem_u32(bar)),
                "r"(count)
                : "memory");
}

// The arming thread's arrival, announcing the bytes the copies will deliver
static __device__ __forceinline__ void bulk_barrier_expect(uint64_t *bar, uint32_t bytes) {
    FM_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// A plain arrival (a consumer handing a stage back)
static __device__ __forceinline__ void bulk_barrier_arrive(uint64_t *bar) {
    FM_BULK_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Blocks until the barrier has completed the phase of this parity (0 for its first use)
static __device__ __forceinline__ void bulk_barrier_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        FM_BULK_ASM("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                    "selp.u32 %0, 1, 0, p;\n\t}"
                    : "=r"(done)
                    : "r"(smem_u32(bar)), "r"(parity)
                    : "memory");
    } while (!done);
}

// The tile of a 2-D tensor map at element coordinates (x inner, y outer) into dst, completing on bar
static __device__ __forceinline__ void bulk_tensor_load_2d(void *dst, const CUtensorMap *map, int x, int y,
                                                           uint64_t *bar) {
    FM_BULK_ASM(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            smem_u32(dst)),
        "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_u32(bar))
        : "memory");
}

#endif
