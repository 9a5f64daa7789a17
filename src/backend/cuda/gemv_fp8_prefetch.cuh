// Decode-size FP8 GEMVs with the weights prefetched into shared memory before the PDL wait (sm_90; see
// gemv_fp8_prefetch.cu). gemv_fp8.cu's entry points try these first; each returns false, launching nothing, where
// the GPU or the shape does not suit (not sm_90, FP8MOE_GEMV_PREFETCH=0, or the matrix needs more than one CTA per
// SM), and the caller then takes its own kernel. Arguments as fm_cuda_w8a8_gemv / fm_cuda_w4a8_gemv.
#ifndef FM_CUDA_GEMV_FP8_PREFETCH_CUH
#define FM_CUDA_GEMV_FP8_PREFETCH_CUH

#include "backend/cuda/cuda_internal.cuh"

#define FM_GEMV_PREFETCH_SMEM (112 * 1024) // per CTA: two CTAs (this kernel's and the next's) fit in an SM's 228 KB

bool fm_cuda_gemv_prefetch_enabled(void);
bool fm_cuda_w8a8_gemv_prefetch(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                int64_t M, const float *x_scale, __nv_bfloat16 *y, cudaStream_t s);
bool fm_cuda_w4a8_gemv_prefetch(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                                int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s);

#endif
