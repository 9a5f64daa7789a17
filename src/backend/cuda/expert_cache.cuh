// Experts in host memory on the CUDA backend (expert_cache.cu): the backend ops of backend.h's "Experts in host
// memory".
#ifndef FM_CUDA_EXPERT_CACHE_CUH
#define FM_CUDA_EXPERT_CACHE_CUH

extern "C" {
#include "backend/backend.h"

fm_status fm_cuda_bank_create_host(fm_backend *bb, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                   fm_error *err);
fm_status fm_cuda_expert_cache_create(fm_backend *bb, const fm_expert_cache_desc *d, fm_expert_cache **out,
                                      const fm_bank **pool_gate_up, const fm_bank **pool_down, void **slot_ids,
                                      fm_error *err);
void fm_cuda_expert_fetch(fm_backend *bb, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P);
void fm_cuda_expert_prefetch(fm_backend *bb, fm_expert_cache *c, int32_t layer, const void *ids, int64_t rows,
                             int32_t k, int32_t m);
void fm_cuda_expert_cache_stats(fm_backend *bb, const fm_expert_cache *c, fm_expert_cache_stats *out);
void fm_cuda_expert_cache_free(fm_backend *bb, fm_expert_cache *c);
}

#endif
