// Device helpers of the Gated DeltaNet's kernels (gdn.cu, gdn_decode.cu), in one place so that the fused decode kernel
// computes the chain's activations, decays and padding rows with the very same code (its results are compared with
// the chain's bit for bit).
#ifndef FM_CUDA_GDN_DEVICE_CUH
#define FM_CUDA_GDN_DEVICE_CUH

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"

/* the delta rule's sums over a head's state rows: GDN_RULE_PARTS partial sums (state rows i, i + PARTS, ... each, in
   order), then the partials added in order: gdn.cu's block of that many warps, and the fused kernel's row groups */
#define GDN_RULE_PARTS 4

static __device__ __forceinline__ float silu_(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float softplus_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static __device__ __forceinline__ int64_t gdn_channels(fm_gdn_shape g) {
    return 2 * (int64_t)g.nk * g.dk + (int64_t)g.nv * g.dv;
}
static __host__ __device__ __forceinline__ int64_t gdn_qkvz_width(fm_gdn_shape g) {
    return 2 * (int64_t)g.nk * g.dk + 2 * (int64_t)g.nv * g.dv;
}

/* a padding row of a decode step replayed as a graph: a copy of row 0 (gdn.cuh) */
static __device__ __forceinline__ bool is_padding(const int32_t *seq, const int32_t *pos, int64_t t) {
    return t > 0 && seq[t] == seq[0] && pos[t] == pos[0];
}

#endif
