// Weights into L2 ahead of their use (route gemv.prefetch). At B = 1 a decode step is a chain of ~14 kernels a layer;
// half of them move kilobytes and leave HBM idle, and each GEMV (1-6 MB of weights) is latency-bound: 4 TB/s times
// ~1 us of HBM latency is 4 MB in flight. Weights depend on no kernel, so a kernel may ask for them early: a dense
// GEMV for its own rows before its griddepcontrol.wait (pdl.cuh: while the kernel before it runs), the small MoE
// dispatch for the routed experts' gate|up matrices, the gate|up GEMV for its tile's down matrix. The GEMV then
// reads them from L2.
//
// cp.async.bulk.prefetch.L2.global (sm_90) is a hint: it changes no result and has no completion to wait for. Its
// address and size must be multiples of 16; l2_prefetch keeps to the whole 16-byte units inside the range it is
// given, so it never names a byte outside it. Below sm_90 it compiles to nothing.
#ifndef FM_CUDA_L2_PREFETCH_CUH
#define FM_CUDA_L2_PREFETCH_CUH

#include <stdint.h>

// One weight bank's matrices as byte ranges (codes NULL: nothing to prefetch): matrix m's codes are
// [codes + m codes_stride, + codes_stride), and each scale array s (s1, s2; NULL: none) [s + m s_stride, + s_stride).
typedef struct fm_l2_bank {
    const uint8_t *codes;
    int64_t codes_stride;
    const uint8_t *s1, *s2;
    int64_t s1_stride, s2_stride;
} fm_l2_bank;

#ifdef __CUDACC__
#define FM_L2_PREFETCH_PIECE (64 * 1024) // bytes per instruction

static __device__ __forceinline__ void l2_prefetch(const void *p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes <= 0) return;
    uint64_t a = ((uint64_t)(uintptr_t)p + 15) & ~(uint64_t)15;
    const uint64_t end = ((uint64_t)(uintptr_t)p + (uint64_t)bytes) & ~(uint64_t)15;
    for (; a < end; a += FM_L2_PREFETCH_PIECE) {
        const uint32_t n = (uint32_t)(end - a < FM_L2_PREFETCH_PIECE ? end - a : FM_L2_PREFETCH_PIECE);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
    }
#else
    (void)p, (void)bytes;
#endif
}

// Share `part` of `parts` of [p, p + bytes): the parts' bounds rounded to 16 bytes, so that they tile the range.
static __device__ __forceinline__ void l2_prefetch_share(const void *p, int64_t bytes, int64_t part, int64_t parts) {
    const int64_t units = bytes / 16, u0 = units * part / parts, u1 = units * (part + 1) / parts;
    l2_prefetch((const uint8_t *)p + u0 * 16, (u1 - u0) * 16);
}

// Share `part` of `parts` of matrix m of bank b (its codes and scales), by one thread.
static __device__ __forceinline__ void l2_prefetch_matrix(const fm_l2_bank &b, int64_t m, int64_t part, int64_t parts) {
    if (!b.codes) return;
    l2_prefetch_share(b.codes + m * b.codes_stride, b.codes_stride, part, parts);
    if (b.s1) l2_prefetch_share(b.s1 + m * b.s1_stride, b.s1_stride, part, parts);
    if (b.s2) l2_prefetch_share(b.s2 + m * b.s2_stride, b.s2_stride, part, parts);
}
#endif

#endif
