// Token sampling on the device (sampler.cu): what src/engine/sampler.c's fm_sample_row computes, a row per CTA or
// per few CTAs.
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
//   z [B][vocab] fp32 scratch; ids [B] out; info [B] out (the raw log-probabilities, as fm_sample_info), or NULL;
//   split_ws: FM_CUDA_SAMPLE_WS_BYTES of device memory, zeroed once by its owner (the counters reset themselves), or
//   NULL: then one CTA a row. With it, a batch of at most FM_CUDA_SAMPLE_SPLIT_ROWS rows spreads each row's first pass
//   (penalties, mask, argmax, log-sum-exp) over fm_cuda_sample_splits CTAs, and the row's last CTA to finish goes on
//   with the whole row (a greedy row: only the slices' results): one SM per row took 40 us for one Qwen3 row on an
//   H100. The same ids either way; the log-probabilities within ~1e-6 (the log-sum-exp's shares add in another order).
// Values never reach the host: the op is graph-safe and branches on shapes only.
// pdl: launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's route table).
#define FM_CUDA_SAMPLE_SPLIT_ROWS 64  /* rows a split launch takes at most */
#define FM_CUDA_SAMPLE_MAX_SPLITS 64  /* CTAs a row at most */
#define FM_CUDA_SAMPLE_SPLIT_CTAS 128 /* CTAs a split launch aims at (rows x splits): a wave of one CTA an SM */
#define FM_CUDA_SAMPLE_MIN_SLICE 2048 /* ids a CTA at least */
#define FM_CUDA_SAMPLE_WS_BYTES (FM_CUDA_SAMPLE_SPLIT_ROWS * (8 + 24 * FM_CUDA_SAMPLE_MAX_SPLITS))
void fm_cuda_sample(const void *logits, bool f32, int32_t B, int32_t vocab, const int32_t *row_slot,
                    const fm_sampling *params, uint64_t *steps, int32_t *counts, uint8_t *seen,
                    const fm_logit_bias *bias, const uint32_t *mask, float *z, int32_t *ids, fm_sample_info *info,
                    void *split_ws, bool pdl, cudaStream_t s);
// The CTAs of each row of a batch of B rows of vocab ids (1: one CTA a row); ws: a split workspace is given
int32_t fm_cuda_sample_splits(int32_t B, int32_t vocab, bool ws);

#ifdef __cplusplus
}
#endif
#endif
