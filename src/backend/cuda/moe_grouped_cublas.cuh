// MoE expert FFN for bf16 banks (the ref preset) as grouped GEMMs through cuBLAS: routed pairs sorted by
// expert, one cublasGemmGroupedBatchedEx per projection. The bf16 route that the fp8 grouped kernel
// (issue 5) is measured against; it reads each expert's weights once per layer, not once per routed token.
#ifndef FM_CUDA_MOE_GROUPED_CUBLAS_CUH
#define FM_CUDA_MOE_GROUPED_CUBLAS_CUH

#include "backend/cuda/cuda_internal.cuh"

// Same contract as fm_cuda_moe_per_token (moe_per_token.cuh); gate_up and down must be bf16 banks.
// Synchronises the host once per call, to read the per-expert row counts that size the GEMMs.
void fm_cuda_moe_grouped_cublas(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x,
                                int64_t T, const int32_t *ids, const __nv_bfloat16 *weights, int32_t k,
                                __nv_bfloat16 *out);

#endif
