/* Expert parallelism for one MoE layer: the experts are split over the ranks in contiguous ranges (rank r holds
 * experts [r E / N, (r + 1) E / N)), every rank routes its own tokens, sends each routed copy of a token to the rank
 * that holds the expert (all-to-all), runs its experts on what it received (top-1, weight 1), sends the expert
 * outputs back (all-to-all) and combines them per token in routing order, as the single-rank moe does: the same bits
 * as one rank computing every expert (tests/test_ep.c, tests/gpu/test_cuda_ep.c).
 *
 * One form for every backend: three backend ops (backend.h: ep_dispatch, moe_blocks, ep_combine) around the two
 * exchanges, on fixed-size blocks (backend/ep_blocks.h) in the backend's memory, the row counts inside the blocks,
 * so that no size reaches the host (the GPU's form is graph-safe given a graph-safe communicator). The rows travel in
 * the plan's dispatch format (e4m3 1x128, MXFP4 or NVFP4 codes and scales, or the activations as they are) and the
 * receiving rank's experts read them as they arrived; NVFP4's one tensor scale is the whole group's, from the largest
 * of the ranks' amax (the backend's amax op, then one small all-gather, all in the backends' memory). The expert
 * outputs come back in the activation format. */
#ifndef FM_DIST_EP_MOE_H
#define FM_DIST_EP_MOE_H

#include "backend/backend.h"
#include "backend/ep_blocks.h"
#include "dist/comm.h"

/* What one layer's exchanges carried. The row counts are read back from the blocks only when with_rows is set on the
 * way in (a download: it waits for the backend, so a forward pass leaves it unset). */
typedef struct fm_ep_stats {
    bool with_rows;
    int64_t rows_sent[FM_COMM_MAX_RANKS];   /* routed copies sent to each rank (self included) */
    int64_t rows_received;                  /* rows this rank's experts computed */
    uint64_t bytes_dispatch, bytes_combine; /* sent to other ranks by each all-to-all */
} fm_ep_stats;

/* The experts [first, first + n) of rank r out of E over N ranks (E % N == 0). */
void fm_ep_expert_range(int32_t E, int n_ranks, int rank, int32_t *first, int32_t *n);

/* The exchange buffers of one rank for layout L (and any of smaller blocks), in its backend's memory: send and recv
 * hold L->n_ranks blocks of either trip; ret_row, int32 [cap], the place of each routed copy's output (ep_blocks.h);
 * amax, fp32 [1 + n_ranks], NVFP4's all-gather of the ranks' amax (this rank's, then every rank's). */
typedef struct fm_ep_buffers {
    void *send, *recv, *ret_row, *amax;
} fm_ep_buffers;
fm_status fm_ep_buffers_alloc(fm_backend *be, const fm_ep_layout *L, fm_ep_buffers *b, fm_error *err);
void fm_ep_buffers_free(fm_backend *be, fm_ep_buffers *b);

/* One MoE layer with expert parallelism, on rank fm_comm_rank(c): x [T][H] this rank's tokens, ids / weights [T][k]
 * their routing over all E experts (the route op's outputs), all in be's memory and types; gate_up / down the banks
 * of this rank's experts (fm_ep_expert_range); L the group's layout (T x k <= L->cap); out [T][H]. Every rank of the
 * world calls it together; a rank that fails here (T too large, a backend without the ops) takes part in the
 * exchanges with empty blocks, so that every rank fails together and none waits forever. */
fm_status fm_ep_moe(fm_comm *c, fm_backend *be, const fm_ep_layout *L, const fm_ep_buffers *b, const fm_bank *gate_up,
                    const fm_bank *down, const void *x, int64_t T, const void *ids, const void *weights, void *out,
                    fm_ep_stats *stats, fm_error *err);

#endif
