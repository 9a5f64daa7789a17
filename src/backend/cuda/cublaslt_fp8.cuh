// One FP8 GEMM shape through cuBLASLt, with per-tensor scales read from device pointers and the algorithm chosen
// once per (rows, operand alignments): D [n, N] bf16 = a_scale * b_scale * B [n, K] A^T, A [N, K] and B [n, K]
// e4m3 row-major (ld K). Used by the W8A8 dense projections (linear_w8a8.cu) and by the cuBLASLt MoE anchor
// (bench/anchors/moe_cublaslt_fp8.cu). cublaslt_fp8.cu says how the layouts map to cuBLASLt's and why alignment
// matters.
#ifndef FM_CUDA_CUBLASLT_FP8_CUH
#define FM_CUDA_CUBLASLT_FP8_CUH

#include <cublasLt.h>

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "util/status.h"
}

#define FM_LT_SCALE_SLOT 4 // floats per device scale: one 16-byte slot each (cuBLASLt refuses less aligned scales)

// The handle, the matmul preference and the workspace: one per user (the backend, the MoE anchor).
#define FM_LT_GRID_SYNC_WORDS 4
typedef struct fm_lt {
    cublasLtHandle_t handle;
    cublasLtMatmulPreference_t pref;
    void *workspace;
    unsigned *grid_sync; // after the workspace, zeroed once: the W8A8 activation quantizer's barrier
} fm_lt;

// One weight shape N x K: its descriptors and remembered algorithms.
typedef struct fm_lt_gemm {
    int64_t N, K;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d; // b and d: columns (= rows of B) set per call; d is also C
    uint64_t *cache_key;
    cublasLtMatmulAlgo_t *cache_algo;
} fm_lt_gemm;

fm_status fm_lt_init(fm_lt *lt, fm_error *err);
void fm_lt_destroy(fm_lt *lt);
// K and N multiples of 16 (FP8 needs 16-byte aligned rows); FM_ERR_UNSUPPORTED otherwise.
fm_status fm_lt_gemm_init(fm_lt_gemm *g, int64_t N, int64_t K, fm_error *err);
void fm_lt_gemm_destroy(fm_lt_gemm *g);
// Switches a shape to row-wise scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for A and B): a_scale then
// points to N floats (one per row of A), b_scale to n floats (one per row of B). Used by the bench gemm anchor.
fm_status fm_lt_gemm_set_rowwise(fm_lt_gemm *g, fm_error *err);
// Enqueues D = a_scale b_scale B A^T on stream s; `what` names the GEMM in errors (e.g. "expert 3 gate_up").
// A, B, D and both scales must be 16-byte aligned.
fm_status fm_lt_gemm_run(fm_lt *lt, fm_lt_gemm *g, const uint8_t *A, const float *a_scale, const uint8_t *B,
                         const float *b_scale, int n, __nv_bfloat16 *D, cudaStream_t s, const char *what,
                         fm_error *err);

#endif
