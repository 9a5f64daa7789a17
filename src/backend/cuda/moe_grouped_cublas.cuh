// MoE expert FFN for bf16 banks (the ref preset) as grouped GEMMs through cuBLAS: routed pairs sorted by expert
// into equal tiles, one cublasGemmBatchedEx per projection with pointer arrays built on the device. The bf16 route
// that the fp8 grouped kernel is measured against; it reads each expert's weights once per tile of its rows, not
// once per routed token.
#ifndef FM_CUDA_MOE_GROUPED_CUBLAS_CUH
#define FM_CUDA_MOE_GROUPED_CUBLAS_CUH

#include "backend/cuda/cuda_internal.cuh"

// Same contract as fm_cuda_moe_per_token (moe_per_token.cuh) for bf16 banks with bf16 activations, or fp32 banks
// with fp32 activations (the ref32 oracle). No host synchronisation: the GEMM shapes follow from T, k and E
// (moe_grouped_workspace.h), so the op can be captured into a CUDA graph.
void fm_cuda_moe_grouped_cublas(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                                const int32_t *ids, const void *weights, int32_t k, void *out);

#endif
