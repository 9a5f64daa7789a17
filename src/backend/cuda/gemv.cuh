// Matrix-vector products against a weight bank, one input row at a time: the int4 (W4A16) and bf16 paths of
// the per-token baseline. Each output row p of y [P, N] is x[p / x_row_div] . W[e]^T where e is
// matrix_of_row[p] (a device array, e.g. the expert id of a routed pair) or idx when that is NULL.
#ifndef FM_CUDA_GEMV_CUH
#define FM_CUDA_GEMV_CUH

#include "backend/cuda/cuda_internal.cuh"

void fm_cuda_gemv(const fm_bank *w, int32_t idx, const int32_t *matrix_of_row, const __nv_bfloat16 *x,
                  int64_t x_row_div, int64_t P, __nv_bfloat16 *y, cudaStream_t s);

#endif
