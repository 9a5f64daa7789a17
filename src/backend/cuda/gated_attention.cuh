// Qwen3-Next's gated full attention and gated shared expert (backend.h states each op; the CPU reference is
// src/backend/cpu/cpu_gated_attention.c). Activations bf16, or fp32 under the ref32 oracle (f32 true); the norm
// weights are banks of the activation type; arithmetic fp32, one rounding per store. pdl: launched with programmatic
// dependent launch (pdl.cuh; fm_routes_pdl of the caller's route table).
#ifndef FM_CUDA_GATED_ATTENTION_CUH
#define FM_CUDA_GATED_ATTENTION_CUH

#include "backend/cuda/cuda_common.cuh"

// qg [T, (2 nh + 2 nkv) hd] (per query head hd query then hd gate values, then k and v) to qkv [T, (nh + 2 nkv) hd]
// with per-head q/k RMSNorm (q_norm / k_norm may be NULL) and RoPE on the first rot_dim dims of each q and k head
// (rotate-half pairs (j, j + rot_dim / 2), inv_freq theta^(-2j / rot_dim)), and gate [T, nh hd]. Position pos[t]
// (int32 [T] in device memory) or pos0 + t when pos is NULL. Preconditions: hd <= 256, rot_dim even, <= hd.
extern "C" void fm_cuda_gated_qk_norm_rope(bool f32, const void *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                           int32_t rot_dim, const void *q_norm, const void *k_norm, float eps,
                                           int64_t pos0, const int32_t *pos, double theta, void *qkv, void *gate,
                                           bool pdl, cudaStream_t s);
// x[i] *= sigmoid(gate[i]), n elements
extern "C" void fm_cuda_sigmoid_mul(bool f32, void *x, const void *gate, int64_t n, bool pdl, cudaStream_t s);
// acc[r, :] += sigmoid(score[r]) * x[r, :], rows of dim
extern "C" void fm_cuda_add_sigmoid_scaled(bool f32, void *acc, const void *x, const void *score, int64_t rows,
                                           int64_t dim, bool pdl, cudaStream_t s);
// acc[r, :] += sigmoid(h[r, :] . w) * x[r, :], w [dim] of the act type, the score rounded to the act type first
extern "C" void fm_cuda_add_sigmoid_gated(bool f32, void *acc, const void *x, const void *h, const void *w,
                                          int64_t rows, int64_t dim, bool pdl, cudaStream_t s);

#endif
