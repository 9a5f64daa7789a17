// The per-token expert dispatch (the baseline the grouped kernels must beat): every routed (token, expert)
// pair runs its own GEMVs against its expert's weights.
#ifndef FM_CUDA_MOE_PER_TOKEN_CUH
#define FM_CUDA_MOE_PER_TOKEN_CUH

#include "backend/cuda/cuda_internal.cuh"

// x [T, H] bf16; ids/weights [T, k] (device); gate_up bank [E][2I, H], down bank [E][H, I]; out [T, H] bf16.
void fm_cuda_moe_per_token(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x,
                           int64_t T, const int32_t *ids, const __nv_bfloat16 *weights, int32_t k, __nv_bfloat16 *out);

#endif
