// CUDA backend: the state and weight-bank layout shared by its .cu files.
//
// Activations are bf16 in device memory. Weight banks hold n matrices [rows, cols] with padded rows so that
// every row starts 16-byte aligned (16-byte loads in the GEMV kernels, any leading dimension for cuBLAS):
//   bf16:  w is [n][rows][ld] bf16, ld = cols rounded up to 8, padding zero
//   int4:  w is [n][rows][ld] bytes, ld = cols rounded up to 32 elements / 2, two codes per byte (element
//          2i in the low nibble, two's complement), padding zero; scales [n][rows][n_groups] bf16, one per
//          128 elements along the row (the last group may be partial)
//   int4-tc: the tensor-core layout of w4a8_layout.cuh: w is [n][rows_pad / 16][n_groups][1024] bytes, scales
//          [n][n_groups][rows_pad] bf16; ld = n_groups * 128 (the padded K)
#ifndef FM_CUDA_INTERNAL_CUH
#define FM_CUDA_INTERNAL_CUH

#include <cublas_v2.h>

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"

#define FM_CUDA_GROUP 128

#define FM_CUBLAS_CHECK(call)                                                                                   \
    do {                                                                                                        \
        cublasStatus_t s_ = (call);                                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                      \
            fprintf(stderr, "fp8moe: cuBLAS error at %s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)s_);     \
            abort();                                                                                            \
        }                                                                                                       \
    } while (0)

struct fm_bank {
    fm_wformat     fmt;
    int32_t        n;
    int64_t        rows, cols;
    int64_t        ld;        // row stride: bf16 elements (bf16) or bytes (int4)
    int64_t        n_groups;  // int4 only
    int64_t        rows_pad;  // int4-tc: rows rounded up to 32
    bool           interleaved; // int4-tc: a gate|up bank interleaved by 8 rows (w4a8_layout.cuh)
    void          *w;
    __nv_bfloat16 *scales;    // int4 only
    size_t         bytes;
};

typedef struct cuda_backend {
    fm_backend     base;
    cudaStream_t   stream;
    cublasHandle_t cublas;
    int            device;
    cudaDeviceProp prop;
    char           device_label[320]; // the GPU's name, and the W4A8 kernel it runs when the plan has one
    void          *work;       // grow-only scratch for ops that need it (moe)
    size_t         work_bytes;
    cudaEvent_t   *marks;      // FM_MARK_SLOTS events, created on the first mark
} cuda_backend;

static inline cuda_backend *cuda_be(fm_backend *be) { return (cuda_backend *)be; }

// Returns scratch of at least `bytes` (grows by reallocation; contents not kept).
void *fm_cuda_workspace(cuda_backend *be, size_t bytes);

static inline const __nv_bfloat16 *bank_bf16(const fm_bank *w, int32_t idx) {
    return (const __nv_bfloat16 *)w->w + (int64_t)idx * w->rows * w->ld;
}

#endif
