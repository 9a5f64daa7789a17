// Prefill-size W8A8 GEMM of our own on sm_90a (TMA + wgmma, gemm_w8a8_wgmma.cu). Arguments as fm_cuda_w8a8_gemv's:
// W e4m3 [N][ld] with *w_scale, x e4m3 [M][ld] with *x_scale (columns past K zero), y bf16 [M][N]; ld a multiple of
// 16. Launched with PDL. The route table (fm_cuda_w8a8_gemm, linear_w8a8.cu) decides when it runs.
#ifndef FM_CUDA_GEMM_W8A8_WGMMA_CUH
#define FM_CUDA_GEMM_W8A8_WGMMA_CUH

#include "backend/cuda/cuda_internal.cuh"

bool fm_cuda_w8a8_wgmma_available(void); // an sm_90 GPU (the binary carries sm_90a code)
int  fm_cuda_w8a8_wgmma_bn(void);        // its tile's weight rows: 256, or 128 with FP8MOE_W8A8_WGMMA_BN=128
void fm_cuda_w8a8_wgmma(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                        const float *x_scale, __nv_bfloat16 *y, cudaStream_t s);

#endif
