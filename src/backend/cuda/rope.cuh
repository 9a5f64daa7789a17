// Qwen3 per-head q/k RMSNorm fused with RoPE, in place on the fused qkv buffer.
#ifndef FM_CUDA_ROPE_CUH
#define FM_CUDA_ROPE_CUH

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"

// qkv: [T, (nh + 2 nkv) hd] bf16. For each token t and each of the nh query and nkv key heads: optional RMSNorm
// over hd (q_norm for query heads, k_norm for key heads; both NULL for Mixtral), then rotate-half RoPE at
// position pos[t] (pos: int32 [T] in device memory), or pos0 + t when pos is NULL (pairs (j, j + hd/2),
// inv_freq[j] = 1 / theta^(2j/hd) in fp32), rounded to bf16 once at the end. Value heads are untouched. Preconditions:
// hd a multiple of 4, hd <= 256 (every head_dim the attention kernels take).
// pdl: launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's route table).
extern "C" void fm_cuda_qk_norm_rope(__nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                     const __nv_bfloat16 *q_norm, const __nv_bfloat16 *k_norm, float eps, int64_t pos0,
                                     const int32_t *pos, double theta, bool pdl, cudaStream_t s);
// the same over fp32 activations and norm weights (the ref32 oracle)
extern "C" void fm_cuda_qk_norm_rope_f32(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                         const float *q_norm, const float *k_norm, float eps, int64_t pos0,
                                         const int32_t *pos, double theta, bool pdl, cudaStream_t s);
// qk_norm_rope at device positions pos, then token t's k heads (as rounded) and v heads stored in slot slots[t] of
// k_cache and v_cache (the layer's paged KV cache, fm_cuda_kv_store's layout for kv: [n_slots][nkv hd] bf16, or e4m3
// rows of codes and scales; nothing for slot -1): qk_norm_rope followed by fm_cuda_kv_store, bit for bit, in one
// launch. FM_KV_E4M3 caches 16-byte aligned.
extern "C" void fm_cuda_qk_norm_rope_store(__nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                           const __nv_bfloat16 *q_norm, const __nv_bfloat16 *k_norm, float eps,
                                           const int32_t *pos, double theta, const int32_t *slots, void *k_cache,
                                           void *v_cache, fm_kv_dtype kv, bool pdl, cudaStream_t s);
// the same over fp32 (the ref32 oracle): caches [n_slots][nkv hd] fp32 (no e4m3 form)
extern "C" void fm_cuda_qk_norm_rope_store_f32(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                               const float *q_norm, const float *k_norm, float eps, const int32_t *pos,
                                               double theta, const int32_t *slots, float *k_cache, float *v_cache,
                                               bool pdl, cudaStream_t s);

#endif
