// Causal GQA prefill attention over fp32 activations, for the ref32 oracle: the same contract as
// fm_cuda_attention (attention.cuh) with fp32 q, k, v and out, and fp32 arithmetic throughout.
#ifndef FM_CUDA_ATTENTION_F32_CUH
#define FM_CUDA_ATTENTION_F32_CUH

#include "backend/cuda/cuda_common.cuh"

// qkv [T, (nh + 2 nkv) hd] (q heads, then k heads, then v heads); out [T, nh hd]; query head h reads kv head
// h / (nh / nkv)
extern "C" void fm_cuda_attention_f32(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, float *out,
                                      cudaStream_t s);
// the same kernel over bf16 activations (fp32 arithmetic, out rounded once): the bf16 path for a head dim that is not
// a multiple of 16, which the tensor-core kernels (attention.cu, attention_wgmma.cu) do not take
extern "C" void fm_cuda_attention_plain_bf16(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                             __nv_bfloat16 *out, cudaStream_t s);

#endif
