// The cuBLASLt FP8 anchor for the expert FFN (`fp8moe bench moe`, route fp8-cublaslt-loop): what a careful user of
// the vendor library gets for one MoE layer, to measure the grouped FP8 kernel against. A yardstick, not an engine
// path: weights e4m3 with one fp32 scale per expert matrix (per-tensor), activations e4m3 with one dynamic
// per-tensor scale computed on the device, one cublasLtMatmul per expert with rows and projection.
//
// Built into build/libfp8moe_bench.a (the fp8moe binary and the GPU tests link it), never into libfp8moe.a.
// Plain C declarations (no CUDA types), so the benchmark command, written in C, can include this header.
#ifndef FM_BENCH_MOE_CUBLASLT_FP8_CUH
#define FM_BENCH_MOE_CUBLASLT_FP8_CUH

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

typedef struct fm_lt_moe fm_lt_moe;

// Quantizes the bf16 banks of a cuda backend (gate_up [E][2I, H] gate rows first, down [E][H, I]) to e4m3, one
// fp32 scale per matrix (amax / 448), on the device; the banks are not used afterwards (the caller may free
// them). FM_ERR_UNSUPPORTED when be is not the cuda backend, the banks are not bf16, or H or I is not a
// multiple of 16 (cuBLASLt FP8 needs 16-byte aligned K and N).
fm_status fm_lt_moe_create(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, fm_lt_moe **out, fm_error *err);

// Bytes the GEMMs read for all E experts: the e4m3 weights and one fp32 scale per matrix (each scale sits in its
// own 16-byte slot on the device, see moe_cublaslt_fp8.cu; the padding is not counted).
size_t fm_lt_moe_weight_bytes(const fm_lt_moe *m);

// The moe op's contract (backend.h): x [T, H] bf16, ids [T, k] int32 and weights [T, k] bf16 on the device,
// out [T, H] bf16, on the backend's stream. Synchronises the host once per call to read the per-expert row
// counts (the GEMM shapes are host arguments of cublasLtMatmul). A cuBLASLt failure (no algorithm for a
// shape, a bad argument) returns FM_ERR_BACKEND naming the call and the status.
fm_status fm_lt_moe_run(fm_lt_moe *m, const void *x, int64_t T, const void *ids, const void *weights, int32_t k,
                        void *out, fm_error *err);

void fm_lt_moe_free(fm_lt_moe *m);

#ifdef __cplusplus
}
#endif

#endif
