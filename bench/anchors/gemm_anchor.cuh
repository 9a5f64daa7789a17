// The GEMM alone, for `fp8moe bench gemm`: a dense projection's GEMM on activations quantized once, before the
// timing (as the library anchors are timed: torch._scaled_mm takes e4m3 inputs). Yardsticks, not engine paths: the
// engine's ops (backend.h linear) quantize their input on every call. Built into build/libfp8moe_bench.a (the
// fp8moe binary and the GPU tests link it), never into libfp8moe.a.
//
// Plain C declarations (no CUDA types), so the benchmark command, written in C, can include this header.
#ifndef FM_BENCH_GEMM_ANCHOR_CUH
#define FM_BENCH_GEMM_ANCHOR_CUH

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

typedef enum {
    FM_GEMM_ONLY_LT_TENSOR, // cuBLASLt FP8, one scale per weight matrix and one per activation tensor
    FM_GEMM_ONLY_LT_ROW,    // cuBLASLt FP8, row-wise: one scale per weight row and one per activation row
    FM_GEMM_ONLY_W8A8,      // ours: the W8A8 op's GEMM (its route: mma.sync GEMV or cuBLASLt)
    FM_GEMM_ONLY_W4A8,      // ours: the W4A8 op's GEMM (mma.sync GEMV or the grouped W4A8 kernel)
} fm_gemm_only_kind;

typedef struct fm_gemm_only fm_gemm_only;

// Quantizes x [M, w->cols] (bf16, on the device) once, as the kind's format wants: per tensor (LT_TENSOR, W8A8),
// per tensor with the scale copied to every row (LT_ROW: the row-wise kernel is timed on the same codes; its speed
// does not depend on the values), or per (row, 128-group) (W4A8). w is an e4m3-tensor bank (LT_*, W8A8) or an
// int4-tc bank (W4A8) of the cuda backend be; LT_ROW also gets one scale per weight row (the matrix's). Synchronises.
// FM_ERR_UNSUPPORTED for another backend or bank format, or when cuBLASLt has no row-wise FP8 GEMM here.
fm_status fm_gemm_only_create(fm_backend *be, fm_gemm_only_kind kind, const fm_bank *w, const void *x, int64_t M,
                              fm_gemm_only **out, fm_error *err);
// Enqueues y [M, w->rows] bf16 = x W[idx]^T on the backend's stream.
fm_status fm_gemm_only_run(fm_gemm_only *g, int32_t idx, void *y, fm_error *err);
void fm_gemm_only_free(fm_gemm_only *g);

#ifdef __cplusplus
}
#endif

#endif
