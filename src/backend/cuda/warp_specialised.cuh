// The pieces of the warp-specialised kernels (w4a8_fold_ws.cu; lab/w4a8_ws.cu, where its forms were measured):
// register budgets moved between warpgroups by setmaxnreg, an mbarrier wait that traps instead of hanging, the 1-D
// bulk copy of a contiguous run into shared memory, and the fold layout's byte-permute conversion of 8 int4 codes
// (backend/w4a8_fold.h). sm_90a only (empty or a trap elsewhere).
#ifndef FM_CUDA_WARP_SPECIALISED_CUH
#define FM_CUDA_WARP_SPECIALISED_CUH

#include <stdint.h>

#include "backend/cuda/bulk_copy.cuh"

template <int REGS> static __device__ __forceinline__ void ws_setmaxnreg_inc(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}
template <int REGS> static __device__ __forceinline__ void ws_setmaxnreg_dec(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}

// An mbarrier wait with a watchdog: a wrong phase or byte count traps after ~2^32 cycles (2-3 s: the launch fails
// with an illegal-instruction error) instead of hanging the process. (No printf: a call in the kernel makes ptxas
// serialise every wgmma.)
static __device__ __forceinline__ void ws_wait(uint64_t *bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t done = 0;
    const long long start = clock64();
    for (;;) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
        if (done) return;
        if (clock64() - start > (1ll << 32)) __trap();
    }
#else
    (void)bar, (void)parity;
#endif
}

// A contiguous run of global memory into shared memory (the bulk copy engine), completing on bar
static __device__ __forceinline__ void ws_bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    FM_BULK_ASM(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

// 8 codes of one fold-layout word -> their 8 e4m3 bytes of q 2^j in k order (w4a8_fold.h), through the row's tables
static __device__ __forceinline__ uint2 ws_fold8(uint32_t w, uint32_t tlo, uint32_t thi) {
    const uint32_t lo = __byte_perm(tlo, thi, w & 0x7777u) | (w & 0x80808080u);
    const uint32_t hi = __byte_perm(tlo, thi, (w >> 16) & 0x7777u) | ((w << 4) & 0x80808080u);
    return make_uint2(lo, hi);
}

#endif
