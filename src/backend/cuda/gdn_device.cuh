// Device helpers of the Gated DeltaNet's kernels (gdn.cu, gdn_decode.cu), in one place so that the fused decode kernel
// computes the chain's activations, decays and padding rows with the very same code (its results are compared with
// the chain's bit for bit).
#ifndef FM_CUDA_GDN_DEVICE_CUH
#define FM_CUDA_GDN_DEVICE_CUH

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"

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

/* route dense.quant=producer: head h of the gated norm's row t at dv = 128 (a warp; the lane's 4 adjacent columns as
   the two bf16 pairs it stored) is 128-group h of the out projection's input row t: its e4m3 codes and scale as the
   quantizer kernel makes them from the same bf16 values (quantize_group), into fm_qrows's layout for M rows of K
   columns (codes [M][K], K a multiple of 128; scales [K / 128][M]) */
static __device__ __forceinline__ void gdn_quantize_head(__nv_bfloat162 a, __nv_bfloat162 b, int64_t t, int h,
                                                         int64_t M, int64_t K, uint8_t *q8, float *qs) {
    const float v[4] = {__low2float(a), __high2float(a), __low2float(b), __high2float(b)};
    float scale, sum;
    const uint32_t word = quantize_group<false>(v, K, h, &scale, &sum);
    *(uint32_t *)(q8 + t * K + (int64_t)h * 128 + (threadIdx.x & 31) * 4) = word;
    if ((threadIdx.x & 31) == 0) qs[(int64_t)h * M + t] = scale;
}

#endif
