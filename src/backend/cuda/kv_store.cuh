// The paged KV cache's append: token t's k and v heads from the fused qkv buffer to their cache slot.
#ifndef FM_CUDA_KV_STORE_CUH
#define FM_CUDA_KV_STORE_CUH

#include "backend/cuda/cuda_common.cuh"

// qkv [T, (nh + 2 nkv) hd] (q heads, k heads, v heads) of elem_bytes-byte activations (2: bf16, 4: fp32);
// k_cache and v_cache [n_slots][nkv hd] of the same type; slots int32 [T] in device memory, distinct and valid
// (the engine's block tables make them). Stream-ordered, no allocation, no synchronisation; the values are copied
// bit for bit. pdl: launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's routes).
extern "C" void fm_cuda_kv_store(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                                 const int32_t *slots, void *k_cache, void *v_cache, bool pdl, cudaStream_t s);

#endif
