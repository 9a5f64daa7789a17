// Decode-size FP8 projections, y [M, N] = x [M, K] W^T for M <= FM_GEMV_FP8_MAX_M, on mma.sync m16n8k32 e4m3
// (sm_89 and sm_90), launched with PDL (pdl.cuh). See gemv_fp8.cu for the shapes and the floor.
#ifndef FM_CUDA_GEMV_FP8_CUH
#define FM_CUDA_GEMV_FP8_CUH

#include "backend/cuda/cuda_internal.cuh"

#define FM_GEMV_FP8_MAX_M    16          // two n8 tiles of activation rows
#define FM_GEMV_FP8_SMEM_MAX (96 * 1024) // W4A8: x staged per CTA (M rows of padded K e4m3, + scales), at most this

// Shared memory the W4A8 GEMV stages x in: M rows (rounded up to 8 or 16) of k_pad e4m3 bytes, padding, scales.
size_t fm_cuda_gemv_fp8_smem(int64_t M, int64_t k_pad);

// The route table of the dense FP8 projections: up to FM_GEMV_FP8_MAX_M rows the ops (linear_w8a8.cu,
// moe_w4a8.cu) take these kernels, above them cuBLASLt (W8A8) and the grouped W4A8 GEMM. bench/NOTES.md
// ("bench gemm") has the same-run figures the threshold rests on.
static inline bool fm_w8a8_takes_gemv(int64_t M) { return M >= 1 && M <= FM_GEMV_FP8_MAX_M; }
static inline bool fm_w4a8_takes_gemv(int64_t M, int64_t k_pad) {
    return M >= 1 && M <= FM_GEMV_FP8_MAX_M && fm_cuda_gemv_fp8_smem(M, k_pad) <= FM_GEMV_FP8_SMEM_MAX;
}

// W8A8: W e4m3 [N][ld] with its scale at *w_scale, x e4m3 [M][ld] (columns past K zero) with its scale at
// *x_scale (both scales device pointers: nothing is read back), y bf16 [M][N]. ld a multiple of 16.
extern "C" void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                  int64_t M, const float *x_scale, __nv_bfloat16 *y, cudaStream_t s);

// W4A8: matrix idx of an int4-tc bank (w4a8_layout.cuh, not interleaved), x e4m3 [M][n_groups * 128] with scales
// xs[group * ld_s + row] (fm_cuda_quantize_e4m3_rows), y bf16 [M][rows]. Needs fm_w4a8_takes_gemv.
extern "C" void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, int64_t ld_s,
                                  int64_t M, __nv_bfloat16 *y, cudaStream_t s);

#endif
