/* The server's default --max-seqs and --ctx on a GPU: the memory plan of the model (weights, activation buffers and
 * workspace for a prefill chunk) and of one sequence's KV cache and decode state, against a budget of device bytes
 * (a fraction of the card's free memory, as vLLM's gpu_memory_utilization). */
#ifndef FM_ENGINE_MEMORY_FIT_H
#define FM_ENGINE_MEMORY_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"

/* Fills *max_seqs when <= 0 (as many sequences as fit, 1 to cap) and *ctx when <= 0 (the model's
 * max_position_embeddings, shortened to a multiple of 16 when *max_seqs sequences of it do not fit). FM_ERR_NOMEM
 * when the model alone, or 16 tokens per sequence, do not fit in budget bytes. */
fm_status fm_memory_fit_sequences(const fm_config *cfg, const fm_plan *plan, int32_t n_layers, int64_t chunk,
                                  size_t budget, int32_t cap, int32_t *max_seqs, int64_t *ctx, fm_error *err);
/* The same with memory beside the KV cache: `fixed` bytes, and `seq_extra` more per sequence (a hybrid model's state
 * snapshots of the prefix cache: --state-cache-slots N, or 2 per sequence by default). */
fm_status fm_memory_fit_sequences_with(const fm_config *cfg, const fm_plan *plan, int32_t n_layers, int64_t chunk,
                                       size_t budget, size_t fixed, size_t seq_extra, int32_t cap, int32_t *max_seqs,
                                       int64_t *ctx, fm_error *err);

#endif
