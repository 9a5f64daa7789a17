// Dense projections (see linear.cuh). The bf16 route is cuBLAS, as DESIGN.md allows for the bf16 baseline:
// row-major y = x W^T is column-major y^T = W x^T, i.e. gemm(op(W) = T, op(x) = N) with W's padded row
// stride as its leading dimension.
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/linear.cuh"

void fm_cuda_linear(cuda_backend *be, const fm_bank *w, int32_t idx, const void *x, int64_t M, void *y) {
    if (M == 0) return;
    if (w->fmt == FM_W_INT4_G128 || w->fmt == FM_W_INT4_ZP) {
        fm_cuda_gemv(w, idx, NULL, (const __nv_bfloat16 *)x, 1, M, (__nv_bfloat16 *)y, be->stream);
        return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType t = w->fmt == FM_W_F32 ? CUDA_R_32F : CUDA_R_16BF;
    FM_CUBLAS_CHECK(cublasGemmEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)M, (int)w->cols, &alpha,
                                 bank_matrix(w, idx), t, (int)w->ld, x, t, (int)w->cols, &beta, y, t, (int)w->rows,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
