/* The blocks of expert parallelism's two all-to-alls (dist/ep_moe.h), the same on every backend: each rank sends one
 * block of one fixed size to every rank (itself included), so the exchange needs no sizes and a step stays
 * graph-safe; the row counts travel inside the blocks.
 *
 *   dispatch block (rank s -> rank d): int32 rows, int32 pad[3] | int32 local expert id [cap], padded to 16 bytes |
 *                                      row [cap] in the dispatch format (backend/dispatch_row.h)
 *   return block (rank d -> rank s):   row [cap] in the activation format (FM_A_NATIVE): row i of the block is the
 *                                      expert output of row i of the dispatch block s sent d
 *
 * with cap = the most routed copies one rank can send one rank (the most tokens a rank passes x k, rounded up to a
 * multiple of 8). A routed copy's
 * place is fixed on the sending rank by its order: copies go to a block in (token, j) order, so copy p of a rank
 * comes back as return row ret_row[p] = d x cap + (its index in block d) of the receive buffer. */
#ifndef FM_BACKEND_EP_BLOCKS_H
#define FM_BACKEND_EP_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define FM_EP_HEADER 16    /* bytes before a dispatch block's ids: int32 rows and padding */
#define FM_EP_MAX_RANKS 64 /* FM_COMM_MAX_RANKS */

typedef struct fm_ep_layout {
    int32_t n_ranks, n_experts, k; /* experts E of the model, split in contiguous ranges of E / n_ranks */
    int64_t H, max_tokens, cap;    /* row width; the most tokens a rank passes; rows a block holds */
    fm_afmt fmt;                   /* the dispatch format */
    bool act_bf16;                 /* the plan's activations (the native rows' type) */
    size_t row_d, row_r;           /* bytes of a dispatched row, of a returned row */
    size_t ids_at, rows_at;        /* offsets in a dispatch block */
    size_t dblock, rblock;         /* bytes of a dispatch block, of a return block (multiples of 16) */
} fm_ep_layout;

/* NVFP4's tensor scale of the group from every rank's amax (fp32 [L->n_ranks], host memory): fm_nvfp4_scale_of_amax
 * of the largest; 1 for the other formats (amaxes may then be NULL). */
float fm_ep_nvfp4_scale(const fm_ep_layout *L, const float *amaxes);

/* The layout for E experts over n_ranks ranks, at most max_tokens tokens per rank, top-k, rows of H in fmt.
 * FM_ERR_USAGE when E does not split or fmt is not a dispatch format. */
fm_status fm_ep_layout_of(int32_t E, int32_t n_ranks, int64_t max_tokens, int32_t k, int64_t H, fm_afmt fmt,
                          bool act_bf16, fm_ep_layout *l, fm_error *err);

#endif
