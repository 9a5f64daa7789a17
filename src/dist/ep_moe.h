/* Expert parallelism for one MoE layer: the experts are split over the ranks in contiguous ranges (rank r holds
 * experts [r E / N, (r + 1) E / N)), every rank routes its own tokens, sends each routed copy of a token to the rank
 * that holds the expert (all-to-all), runs its experts on what it received (one moe call, top-1, weight 1), sends the
 * expert outputs back (all-to-all) and combines them per token in routing order, as the single-rank moe does: the
 * same bits as one rank computing every expert (tests/test_ep.c).
 *
 * This is the host form, for backends whose buffers are host memory (the CPU backend): the plan (which row goes
 * where, and where it comes back) is computed on the host; the rows travel in the plan's dispatch format
 * (backend/dispatch_row.h: e4m3 1x128, MXFP4 or NVFP4 codes and scales, or the activations as they are) and the
 * receiving rank's experts read them as they arrived (moe_dispatched); NVFP4's one tensor scale is the whole
 * buffer's, from the largest of the ranks' amax (one small all-gather). The expert outputs come back in the
 * activation format. The GPU form keeps the same block layout but builds it with kernels, with the row counts
 * inside the blocks so that no size reaches the host.
 *
 * Block layout (one per destination rank, all of one size so that the all-to-all needs no size exchange; whole
 * 16-byte units):
 *   int32 rows, int32 pad[3], int32 local expert id [cap], row [cap] in the dispatch format      (dispatch)
 *   int32 rows, int32 pad[3], row [cap] in the activation format                                 (return)
 * with cap = the most routed copies one rank can send one rank: max tokens per rank x k. */
#ifndef FM_DIST_EP_MOE_H
#define FM_DIST_EP_MOE_H

#include "backend/backend.h"
#include "dist/comm.h"

typedef struct fm_ep_stats {
    int64_t rows_sent[FM_COMM_MAX_RANKS];   /* routed copies sent to each rank (self included) */
    int64_t rows_received;                  /* rows this rank's experts computed */
    uint64_t bytes_dispatch, bytes_combine; /* sent to other ranks by each all-to-all */
} fm_ep_stats;

/* The experts [first, first + n) of rank r out of E over N ranks (E % N == 0). */
void fm_ep_expert_range(int32_t E, int n_ranks, int rank, int32_t *first, int32_t *n);

/* One MoE layer with expert parallelism, on rank fm_comm_rank(c): x [T][H] this rank's tokens (activation format of
 * be: fp32 on the CPU backend), ids / weights [T][k] their routing over all E experts, gate_up / down the banks of this
 * rank's experts (fm_ep_expert_range), max_tokens the most tokens any rank passes (the blocks' capacity), out [T][H].
 * Every rank of the world calls it together. */
fm_status fm_ep_moe_host(fm_comm *c, fm_backend *be, const fm_bank *gate_up, const fm_bank *down, int32_t E,
                         const float *x, int64_t T, int64_t H, const int32_t *ids, const float *weights, int32_t k,
                         int64_t max_tokens, float *out, fm_ep_stats *stats, fm_error *err);

#endif
