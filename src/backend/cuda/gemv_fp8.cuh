// Decode-size FP8 projections, y [M, N] = x [M, K] W^T for M <= FM_GEMV_FP8_MAX_M, on mma.sync m16n8k32 e4m3
// (sm_89 and sm_90), launched with PDL (pdl.cuh). See gemv_fp8.cu for the shapes and the floor.
#ifndef FM_CUDA_GEMV_FP8_CUH
#define FM_CUDA_GEMV_FP8_CUH

#include "backend/cuda/cuda_internal.cuh"

#define FM_GEMV_FP8_MAX_M    16          // two n8 tiles of activation rows
#define FM_GEMV_FP8_SMEM_MAX (96 * 1024) // W4A8: x staged per CTA (M rows of padded K e4m3, + scales), at most this

// Shared memory the W4A8 GEMV stages x in: M rows (rounded up to 8 or 16) of k_pad e4m3 bytes, padding, scales.
size_t fm_cuda_gemv_fp8_smem(int64_t M, int64_t k_pad);

// The route table of the dense FP8 projections (linear_w8a8.cu, moe_w4a8.cu): these GEMVs up to the row counts
// below, cuBLASLt FP8 (W8A8) or the grouped W4A8 kernel above. Same-run figures (bench gemm, H200, bench/NOTES.md
// "bench gemm v4"): the W8A8 GEMV beats cuBLASLt at M = 1 and 8 (0.449 / 0.494 ms for 48 layers against 0.600 /
// 0.559) and loses at M = 16 (0.670 against 0.564), where it runs two n8 tiles: threshold 8. FP8MOE_GEMV=0 turns
// the GEMVs off (for that A/B).
#define FM_W8A8_GEMV_MAX_M 8
#define FM_W4A8_GEMV_MAX_M FM_GEMV_FP8_MAX_M
bool fm_cuda_gemv_enabled(void);
// FM_W8A8_GEMV_MAX_M, or FP8MOE_W8A8_GEMV_MAX_M (1..16) where set (for measuring the threshold)
int  fm_w8a8_gemv_max_m(void);
static inline bool fm_w8a8_takes_gemv(int64_t M) { return M >= 1 && M <= fm_w8a8_gemv_max_m() && fm_cuda_gemv_enabled(); }
static inline bool fm_w4a8_takes_gemv(int64_t M, int64_t k_pad) {
    return M >= 1 && M <= FM_W4A8_GEMV_MAX_M && fm_cuda_gemv_fp8_smem(M, k_pad) <= FM_GEMV_FP8_SMEM_MAX &&
           fm_cuda_gemv_enabled();
}

// W8A8, M <= FM_W8A8_GEMV_MAX_M: W e4m3 [N][ld] with its scale at *w_scale, x e4m3 [M][ld] (columns past K zero)
// with its scale at *x_scale (both scales device pointers: nothing is read back), y bf16 [M][N]. ld a multiple of 16.
extern "C" void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                  int64_t M, const float *x_scale, __nv_bfloat16 *y, cudaStream_t s);

// W4A8: matrix idx of an int4-tc, int4-zp-tc or e4m3-block bank (w4a8_layout.cuh, not interleaved), x e4m3
// [M][n_groups * 128] with scales xs[group * ld_s + row] and, for int4-zp-tc, group sums xsum alike
// (fm_cuda_quantize_e4m3_rows), y bf16 [M][rows]. Needs fm_w4a8_takes_gemv.
extern "C" void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                                  int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s);

#endif
