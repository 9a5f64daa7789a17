// Row-wise and element-wise ops: embedding gather, RMSNorm, SwiGLU, residual add, bf16 -> fp32.
// All memory-bound; the floor is bytes read + written at ~4.25 TB/s. bf16 in and out, fp32 arithmetic,
// the same formulas as the CPU reference (src/backend/cpu/cpu_elementwise.c). The _f32 variants are the same
// kernels over fp32 activations and weights (the ref32 oracle, cuda_backend.cu).
// pdl: launched with programmatic dependent launch (pdl.cuh; the caller passes fm_routes_pdl of its route table).
#ifndef FM_CUDA_ELEMENTWISE_CUH
#define FM_CUDA_ELEMENTWISE_CUH

#include "backend/cuda/cuda_common.cuh"

// out[t, :H] = table[ids[t], :H] (table rows ld elements apart)
extern "C" void fm_cuda_embed(const __nv_bfloat16 *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H,
                              __nv_bfloat16 *out, bool pdl, cudaStream_t s);
// out[r, :] = w * (x[r, :] * rsqrt(mean(x[r, :]^2) + eps))
extern "C" void fm_cuda_rmsnorm(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int64_t rows, int64_t dim, float eps,
                                __nv_bfloat16 *out, bool pdl, cudaStream_t s);
// out[r, i] = silu(gu[r, i]) * gu[r, I + i]
extern "C" void fm_cuda_swiglu(const __nv_bfloat16 *gu, int64_t rows, int64_t I, __nv_bfloat16 *out, bool pdl,
                               cudaStream_t s);
// acc[i] = bf16(acc[i] + x[i])
extern "C" void fm_cuda_add(__nv_bfloat16 *acc, const __nv_bfloat16 *x, int64_t n, bool pdl, cudaStream_t s);
// acc += x, then out = rmsnorm(acc) * w (rows of dim): bit for bit fm_cuda_add then fm_cuda_rmsnorm, in one launch
extern "C" void fm_cuda_add_rmsnorm(__nv_bfloat16 *acc, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int64_t rows,
                                    int64_t dim, float eps, __nv_bfloat16 *out, bool pdl, cudaStream_t s);
extern "C" void fm_cuda_add_rmsnorm_f32(float *acc, const float *x, const float *w, int64_t rows, int64_t dim,
                                        float eps, float *out, bool pdl, cudaStream_t s);
// MoE combine: out[t, :] = bf16(sum_j w[t, j] * y[row(t * k + j), :]) in j order in fp32 (deterministic), where
// row(p) = slot_of ? slot_of[p] : p
extern "C" void fm_cuda_moe_combine(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w, int64_t T,
                                    int32_t k, int64_t H, __nv_bfloat16 *out, bool pdl, cudaStream_t s);
extern "C" void fm_cuda_embed_f32(const float *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H, float *out,
                                  bool pdl, cudaStream_t s);
extern "C" void fm_cuda_rmsnorm_f32(const float *x, const float *w, int64_t rows, int64_t dim, float eps, float *out,
                                    bool pdl, cudaStream_t s);
extern "C" void fm_cuda_swiglu_f32(const float *gu, int64_t rows, int64_t I, float *out, bool pdl, cudaStream_t s);
extern "C" void fm_cuda_add_f32(float *acc, const float *x, int64_t n, bool pdl, cudaStream_t s);
extern "C" void fm_cuda_moe_combine_f32(const float *y, const int32_t *slot_of, const float *w, int64_t T, int32_t k,
                                        int64_t H, float *out, bool pdl, cudaStream_t s);

#endif
