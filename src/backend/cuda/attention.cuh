// Causal GQA prefill attention on tensor cores (flash-attention style: tiles of keys streamed through shared
// memory, online softmax in fp32, no T x T buffer).
#ifndef FM_CUDA_ATTENTION_CUH
#define FM_CUDA_ATTENTION_CUH

#include "backend/cuda/cuda_common.cuh"

// qkv: [T, (nh + 2 nkv) hd] bf16 row-major, per row the nh query heads, then the nkv key heads, then the nkv
// value heads (the layout the fused q|k|v projection writes); query head h reads kv head h / (nh / nkv).
// out: [T, nh hd] bf16. Scores q.k * hd^-0.5, causal (key j <= query t), softmax in fp32, fp32 accumulation.
// Preconditions (checked; a violation stops with a message): hd a multiple of 16 in [16, 256], nh % nkv == 0,
// T >= 1 (up to about 4M tokens: the grid holds 65535 query tiles), 16-byte aligned pointers.
// Stream-ordered: no allocation, no synchronisation; every element of out is written. bf16 output error against
// a float64 reference ~2e-3 relative (lab/attention.cu); kernels, tile shapes and timings: attention.cu and
// lab/README.md.
extern "C" void fm_cuda_attention(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                  __nv_bfloat16 *out, cudaStream_t stream);

// The same op on Hopper (attention_wgmma.cu: wgmma + TMA, FlashAttention-3's recipe; sm_90a code only): same
// layouts, results and preconditions, plus hd one the kernel supports (fm_cuda_attention_wgmma_supported: 128 for
// now) and an sm_90 GPU. The route table picks between the two (routes.h, key attention.kernel).
extern "C" bool fm_cuda_attention_wgmma_supported(int32_t hd);
extern "C" void fm_cuda_attention_wgmma(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                        __nv_bfloat16 *out, cudaStream_t stream);

#endif
