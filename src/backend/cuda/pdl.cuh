// Programmatic dependent launch (PDL, sm_90): a kernel launched with it may start while the kernel before it in
// the stream is still running, so its prologue (for a decode GEMV: issuing its weight loads, which depend on no
// earlier kernel) overlaps the previous kernel's work and its own launch latency. Inside such a kernel:
//   pdl_wait()  blocks until the previous kernel has completed and its writes are visible, then lets the next PDL
//               kernel start launching. Nothing the previous kernels wrote may be read, and nothing they might read
//               may be written, before it.
// The next kernel is released only after the wait, not at the kernel's start: released at the start (the first form,
// measured 2026-12-05 on an H100), every kernel of a graph let the next one launch while it was itself still waiting,
// so dozens of grids became resident at once, each CTA holding its SM slot while it spun, and a decode step at B = 1
// took 3.76 ms against 3.47 for PDL on the GEMVs alone (bench/NOTES.md, twenty-fifth session). After the wait, at
// most one kernel beyond the running one is in its prologue.
// It is a no-op when the kernel was launched normally, and on sm_89 (compiled out: Ada has no PDL). A kernel
// launched with fm_cuda_launch_pdl must call pdl_wait before touching data of earlier kernels; before it, it may
// only read what no kernel writes (weights: norm vectors, the router matrix, conv taps; what the host staged before
// the step: sequences, positions, block tables), or what a kernel two launches back wrote, through L2
// (ld.global.cg): the kernel in between released this one only after its own wait, so that one had completed (the
// grouped down GEMM's tiles, the dispatch's: w4a8.early_codes). An earlier kernel's output is
// never read through the non-coherent path (__ldg, or a const __restrict__ pointer that the compiler turns into
// ld.global.nc): an invariant load may be hoisted above the wait (bench/NOTES.md 2026-11-30 "v2 -> v4"). Every
// thread of every CTA must execute pdl_wait before it exits, early-return paths included: the grid's completion is
// what releases the next kernel's wait, and a grid that completed without waiting would let the kernel after it run
// before the one before it has finished (the chain's order holds only through the waits). In a CUDA graph the
// dependency becomes a programmatic edge. Whether it is used is a route (routes.h, key pdl: on for sm_90+ by
// default; pdl=off launches normally, for same-run A/B).
#ifndef FM_CUDA_PDL_CUH
#define FM_CUDA_PDL_CUH

#include "backend/cuda/cuda_common.cuh"

static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches fn (a __global__ function; args: pointers to its arguments, as cudaLaunchKernel takes them) with PDL
// when pdl (the caller passes fm_routes_pdl of its backend's route table), normally otherwise.
void fm_cuda_launch_pdl(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void **args, bool pdl);

// The same for a kernel called with its arguments, each converted to the kernel's parameter type as a <<<>>> launch
// converts it (cudaLaunchKernelEx's typed form): pdl_launch(kernel<A>, grid, block, smem, s, pdl, x, n, y).
template <typename... P, typename... V>
static inline void pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                              V... v) {
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = pdl ? &attr : NULL, cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, v...); /* a failure is the last error: the caller's FM_LAUNCH_CHECK reports it */
}

#endif
