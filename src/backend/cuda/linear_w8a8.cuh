// W8A8 dense projections (--dense w8a8): e4m3 weights with one fp32 scale per matrix, set at load from the
// checkpoint's values, times e4m3 activations with one dynamic scale per input computed on the device (no host
// synchronisation), through cuBLASLt FP8 (cublaslt_fp8.cuh) with both scales read from device pointers.
// The CPU's exact emulation: src/backend/cpu/cpu_linear.c (e4m3-tensor).
#ifndef FM_CUDA_LINEAR_W8A8_CUH
#define FM_CUDA_LINEAR_W8A8_CUH

#include "backend/cuda/cuda_internal.cuh"

// One matrix at load: w [rows, cols] fp32 (contiguous) -> q [rows][ldq] e4m3 (columns past cols zero) and its
// scale in *scale_slot (16-byte aligned), max(amax / 448, 1e-12); amax_tmp is one device word of scratch.
void fm_cuda_w8a8_quantize_matrix(const float *w, int64_t rows, int64_t cols, uint8_t *q, int64_t ldq,
                                  float *scale_slot, unsigned *amax_tmp, cudaStream_t s);

// y [M, N] bf16 = x [M, K] W[idx]^T for an e4m3-tensor bank. Quantizes x per tensor into the backend's
// workspace: one fused launch (amax, scale and cast; its blocks meet at a grid barrier) up to
// fm_routes_w8a8_fused_elems elements of x with its rows padded to 16 (M Kp), an amax reduction and a cast above (the
// branch depends on the shape and the route only).
void fm_cuda_linear_w8a8(cuda_backend *be, const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                         __nv_bfloat16 *y);
// The same for matrix 0, then acc [M, N] += y and out = rmsnorm(acc) * norm, in the decode GEMV's last CTA
// (row_tail.cuh; route decode.fused: the o projection and the next add_rmsnorm in one launch). False, with nothing
// launched, where that does not apply (M above the GEMV's rows, rows that fm_row_tail_takes refuses): the caller then
// runs the two ops.
bool fm_cuda_linear_w8a8_add_rmsnorm(cuda_backend *be, const fm_bank *w, const __nv_bfloat16 *x, int64_t M,
                                     __nv_bfloat16 *y, __nv_bfloat16 *acc, const __nv_bfloat16 *norm, float eps,
                                     __nv_bfloat16 *out);

// Its two halves, for callers that quantize once and time the GEMM alone (bench gemm):
// x [M, K] bf16 -> xq [M][Kp] e4m3 with its scale in *scale_slot (16-byte aligned); amax_and_bad is two device
// words of scratch (the amax, then the count of NaN/Inf inputs, zeroed here when count_bad_inputs or when the
// two-kernel path runs); grid_sync is FM_LT_GRID_SYNC_WORDS device words, zero before the first call, which the
// fused launch's grid barrier keeps (fm_lt's; calls on it must be in one stream); pdl: its kernels (the fused one,
// or the amax and the cast) with programmatic dependent launch (fm_routes_pdl); fused_elems: the fused launch up to
// this many elements M Kp (fm_routes_w8a8_fused_elems; at most FM_W8A8_FUSED_ELEMS_MAX).
void fm_cuda_w8a8_quantize_act(const __nv_bfloat16 *x, int64_t M, int64_t K, int64_t Kp, uint8_t *xq, float *scale_slot,
                               unsigned *amax_and_bad, unsigned *grid_sync, bool count_bad_inputs, bool pdl,
                               int64_t fused_elems, cudaStream_t s);
// y = xq W[idx]^T times both scales, by the backend's route table (fm_routes_dense_kernel: the mma.sync GEMV up to
// w8a8.gemv_max_m rows, cuBLASLt FP8 above).
void fm_cuda_w8a8_gemm(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *xq, const float *x_scale,
                       int64_t M, __nv_bfloat16 *y);

// Workspace bytes of fm_cuda_linear_w8a8 for M rows of K columns (the memory plan counts it).
static inline size_t fm_w8a8_linear_ws_bytes(int64_t M, int64_t K) { return (size_t)(M * ((K + 15) / 16 * 16)) + 256; }

#endif
