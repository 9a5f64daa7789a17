// Decode-size FP8 projections, y [M, N] = x [M, K] W^T for M <= FM_GEMV_FP8_MAX_M, on mma.sync m16n8k32 e4m3
// (sm_89 and sm_90). See gemv_fp8.cu for the shapes and the floor.
#ifndef FM_CUDA_GEMV_FP8_CUH
#define FM_CUDA_GEMV_FP8_CUH

#include "backend/cuda/cuda_internal.cuh"

#define FM_GEMV_FP8_MAX_M 16 // two n8 tiles of activation rows
#define FM_GEMV_FP8_SMEM_MAX (96 * 1024) // x staged per CTA: M rows of K e4m3 (+ scales), at most this

// The route table of the dense FP8 projections: up to these row counts the ops (linear_w8a8.cu, moe_w4a8.cu) take
// these kernels, above them cuBLASLt (W8A8) and the grouped W4A8 GEMM. bench/NOTES.md ("bench gemm") has the
// same-run figures the thresholds rest on.
#define FM_W8A8_GEMV_MAX_M FM_GEMV_FP8_MAX_M
#define FM_W4A8_GEMV_MAX_M FM_GEMV_FP8_MAX_M

// Shared memory a GEMV stages x in: M rows (rounded to 8 or 16) of ldx e4m3 bytes (W8A8: the bank's ld; W4A8: the
// padded K), plus padding and (W4A8) scales. The ops take the GEMV only when this is <= FM_GEMV_FP8_SMEM_MAX
// (K <= 5.9k at M <= 16: every dense projection of the models we run).
size_t fm_cuda_gemv_fp8_smem(bool w4a8, int64_t M, int64_t ldx);

// The route table: whether an op of M rows takes the GEMV (ldx as above).
static inline bool fm_w8a8_takes_gemv(int64_t M, int64_t ld) {
    return M <= FM_W8A8_GEMV_MAX_M && fm_cuda_gemv_fp8_smem(false, M, ld) <= FM_GEMV_FP8_SMEM_MAX;
}
static inline bool fm_w4a8_takes_gemv(int64_t M, int64_t k_pad) {
    return M <= FM_W4A8_GEMV_MAX_M && fm_cuda_gemv_fp8_smem(true, M, k_pad) <= FM_GEMV_FP8_SMEM_MAX;
}


// Whether the ops quantize a decode-sized input inside the GEMV (the *_bf16 kernels below) rather than with a
// quantizer launch first: yes, unless FP8MOE_GEMV_FUSED=0 (kept for the same-run A/B of bench/NOTES.md).
bool fm_cuda_gemv_fused_quant(void);

// W8A8: W e4m3 [N][ld] with its scale at *w_scale, x e4m3 [M][ld] (columns past K zero) with its scale at
// *x_scale (both scales device pointers: nothing is read back), y bf16 [M][N]. ld a multiple of 16.
extern "C" void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                  int64_t M, const float *x_scale, __nv_bfloat16 *y, cudaStream_t s);

// The same with x bf16 [M][K], quantized per tensor inside the kernel (every CTA computes the amax of all of x;
// no quantizer launch, no xq in memory): the W8A8 op's decode path. Bit for bit the codes and scale of
// fm_cuda_w8a8_quantize_act.
extern "C" void fm_cuda_w8a8_gemv_bf16(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale,
                                       const __nv_bfloat16 *x, int64_t M, int64_t K, __nv_bfloat16 *y, cudaStream_t s);

// W4A8: matrix idx of an int4-tc bank (w4a8_layout.cuh, not interleaved), x e4m3 [M][n_groups * 128] with scales
// xs[group * ld_s + row] (fm_cuda_quantize_e4m3_rows), y bf16 [M][rows].
extern "C" void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, int64_t ld_s,
                                  int64_t M, __nv_bfloat16 *y, cudaStream_t s);

// The same with x bf16 [M][K], quantized per (row, 128-group) inside the kernel (no quantizer launch, no x8 in
// memory): the W4A8 op's decode path. Bit for bit the codes and scales fm_cuda_quantize_e4m3_rows would give.
extern "C" void fm_cuda_w4a8_gemv_bf16(const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                                       __nv_bfloat16 *y, cudaStream_t s);

#endif
