// Bulk asynchronous copies global -> shared memory (sm_90: the TMA unit's 1-D form, cp.async.bulk) completed on an
// mbarrier. One thread arms the barrier with the bytes to expect, any threads issue copies against it, and every
// thread that needs the data waits on the barrier's phase. No tensor map is needed: a copy is a contiguous run of
// bytes, 16-byte aligned at both ends, a multiple of 16 long. The barrier's transaction count holds < 2^20 bytes
// per phase. On sm_89 these compile to nothing (traps): callers choose a kernel by compute capability.
#ifndef FM_CUDA_BULK_COPY_CUH
#define FM_CUDA_BULK_COPY_CUH

#include <stdint.h>

#define FM_BULK_MAX_TX ((1u << 20) - 1) // bytes one barrier phase can expect

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FM_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FM_BULK_ASM(...) __trap()
#endif

// One arrival (the arming thread's), then visible to the copy engine and to the other threads of the CTA (the
// caller still synchronises the CTA before anyone else waits on it).
static __device__ __forceinline__ void bulk_barrier_init(uint64_t *bar) {
    FM_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;\n\t"
                "fence.proxy.async.shared::cta;" ::"r"(smem_u32(bar))
                : "memory");
}

// The arming thread's arrival, announcing the bytes the copies will deliver
static __device__ __forceinline__ void bulk_barrier_expect(uint64_t *bar, uint32_t bytes) {
    FM_BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// An L2 policy for data read once (streamed weights): evict first
static __device__ __forceinline__ uint64_t l2_evict_first(void) {
    uint64_t policy = 0;
    FM_BULK_ASM("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

static __device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar,
                                                 uint64_t policy) {
    FM_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
                "%4;" ::"r"(smem_u32(dst)),
                "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
                : "memory");
}

// Blocks until the barrier has completed phase `parity` (0 for the first use)
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

#endif
