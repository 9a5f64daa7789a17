// y[M, N] = x[M, K] W[idx]^T for one matrix of a bank: cuBLAS (bf16 in, fp32 accumulation, bf16 out) for
// bf16 banks, the W4A16 GEMV kernel per row for int4 banks, cuBLAS SGEMM (fp32 x and y) for f32 banks (the
// ref32 oracle; its handle is in pedantic math mode, so no TF32).
#ifndef FM_CUDA_LINEAR_CUH
#define FM_CUDA_LINEAR_CUH

#include "backend/cuda/cuda_internal.cuh"

void fm_cuda_linear(cuda_backend *be, const fm_bank *w, int32_t idx, const void *x, int64_t M, void *y);

#endif
