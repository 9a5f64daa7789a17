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

// Expert parallelism's moe_blocks op (backend.h) on bf16 or fp32 banks: the same grouped GEMMs over the native rows
// of the received dispatch blocks (backend/ep_blocks.h; the N x cap places at top-1, empty ones skipped), each output
// row in its place of the return blocks yret. The GEMMs' shapes follow from N x cap (no host synchronisation).
struct fm_ep_layout;
void fm_cuda_moe_grouped_cublas_blocks(cuda_backend *be, const struct fm_ep_layout *L, const fm_bank *gate_up,
                                       const fm_bank *down, const uint8_t *recv, void *yret);

#endif
