// Token sampling on the device (sampler.cu): what src/engine/sampler.c's fm_sample_row computes, one row per CTA.
// Plain C: the GPU tests call it directly.
#ifndef FM_CUDA_SAMPLER_CUH
#define FM_CUDA_SAMPLER_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

// One id per row of logits [B][vocab] (fp32 when f32, else bf16). Row r belongs to sequence slot
// row_slot[r] (NULL: slot r). Device memory, all of it, indexed by slot:
//   params [slots] fm_sampling, steps [slots] (the draw uses the slot's step, which is then incremented),
//   counts [slots][vocab] int32 and seen [slots][vocab] uint8: each slot's penalty state (both NULL: no
//   penalties), the chosen id is added to it (seen = 1, count + 1);
//   bias [slots][FM_MAX_LOGIT_BIAS] (params.n_bias of them used; may be NULL when no slot has any);
// and by row: mask [B][(vocab + 31) / 32], bit i: id i allowed, read only for rows whose slot has params.masked
// (may be NULL when none has): unconstrained rows pay nothing;
//   z [B][vocab] fp32 scratch; ids [B] out; info [B] out (the raw log-probabilities, as fm_sample_info), or NULL.
// Values never reach the host: the op is graph-safe and branches on shapes only.
// pdl: launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's route table).
void fm_cuda_sample(const void *logits, bool f32, int32_t B, int32_t vocab, const int32_t *row_slot,
                    const fm_sampling *params, uint64_t *steps, int32_t *counts, uint8_t *seen,
                    const fm_logit_bias *bias, const uint32_t *mask, float *z, int32_t *ids, fm_sample_info *info,
                    bool pdl, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
