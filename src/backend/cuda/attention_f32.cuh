// Causal GQA prefill attention over fp32 activations, for the ref32 oracle: the same contract as
// fm_cuda_attention (attention.cuh) with fp32 q, k, v and out, and fp32 arithmetic throughout.
#ifndef FM_CUDA_ATTENTION_F32_CUH
#define FM_CUDA_ATTENTION_F32_CUH

#include "backend/cuda/cuda_common.cuh"

// qkv [T, (nh + 2 nkv) hd] (q heads, then k heads, then v heads); out [T, nh hd]; query head h reads kv head
// h / (nh / nkv)
extern "C" void fm_cuda_attention_f32(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, float *out,
                                      cudaStream_t s);

#endif
