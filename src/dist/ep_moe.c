/* Expert parallelism, one form for every backend (ep_moe.h). */
#include <stdlib.h>
#include <string.h>

#include "dist/ep_moe.h"
#include "util/status.h"

void fm_ep_expert_range(int32_t E, int n_ranks, int rank, int32_t *first, int32_t *n) {
    *n = E / n_ranks;
    *first = rank * *n;
}

fm_status fm_ep_buffers_alloc(fm_backend *be, const fm_ep_layout *L, fm_ep_buffers *b, fm_error *err) {
    const size_t block = L->dblock > L->rblock ? L->dblock : L->rblock; /* the buffers serve both trips */
    memset(b, 0, sizeof *b);
    b->send = be->ops->alloc(be, (size_t)L->n_ranks * block);
    b->recv = be->ops->alloc(be, (size_t)L->n_ranks * block);
    b->ret_row = be->ops->alloc(be, (size_t)(L->cap > 0 ? L->cap : 1) * sizeof(int32_t));
    b->amax = be->ops->alloc(be, (size_t)(1 + L->n_ranks) * sizeof(float));
    if (b->send && b->recv && b->ret_row && b->amax) return FM_OK;
    fm_ep_buffers_free(be, b);
    return fm_fail(err, FM_ERR_NOMEM,
                   "expert parallelism: out of %s memory for the exchange blocks (2 x %d x %zu bytes)", be->ops->name,
                   L->n_ranks, block);
}

void fm_ep_buffers_free(fm_backend *be, fm_ep_buffers *b) {
    if (b->send) be->ops->free(be, b->send);
    if (b->recv) be->ops->free(be, b->recv);
    if (b->ret_row) be->ops->free(be, b->ret_row);
    if (b->amax) be->ops->free(be, b->amax);
    memset(b, 0, sizeof *b);
}

/* an exchange's own error must not hide this rank's earlier one */
static void keep_first(fm_status *st, fm_status cst, fm_error *err, const fm_error *cerr) {
    if (*st == FM_OK && cst != FM_OK) {
        *st = cst;
        if (err) *err = *cerr;
    }
}

fm_status fm_ep_moe(fm_comm *c, fm_backend *be, const fm_ep_layout *L, const fm_ep_buffers *b, const fm_bank *gate_up,
                    const fm_bank *down, const void *x, int64_t T, const void *ids, const void *weights, void *out,
                    fm_ep_stats *stats, fm_error *err) {
    const int N = fm_comm_size(c);
    const fm_backend_ops *ops = be->ops;
    fm_status st = FM_OK;
    if (L->n_ranks != N)
        st = fm_fail(err, FM_ERR_USAGE, "expert parallelism: blocks for %d ranks in a world of %d", L->n_ranks, N);
    else if (!ops->ep_dispatch || !ops->moe_blocks || !ops->ep_combine)
        st = fm_fail(err, FM_ERR_UNSUPPORTED, "expert parallelism: the %s backend has no expert-parallel ops",
                     ops->name);
    else if (T > L->max_tokens)
        st = fm_fail(err, FM_ERR_USAGE, "%lld tokens on rank %d, more than the %lld the blocks hold", (long long)T,
                     fm_comm_rank(c), (long long)L->max_tokens);
    else if (L->fmt == FM_A_NVFP4 && !ops->amax)
        st = fm_fail(err, FM_ERR_UNSUPPORTED, "expert parallelism: the %s backend has no amax op (NVFP4)", ops->name);
    fm_error cerr = {{0}};
    /* NVFP4: the tensor scale is the group's, from every rank's amax, gathered in backend memory (no host round
       trip: a rank that failed passes no bytes, so every rank fails here together) */
    const float *amaxes = NULL;
    if (L->fmt == FM_A_NVFP4) {
        float *mine = (float *)b->amax;
        if (st == FM_OK) ops->amax(be, x, T * L->H, mine);
        keep_first(&st, fm_comm_all_gather(c, mine, mine + 1, st == FM_OK ? sizeof(float) : 0, &cerr), err, &cerr);
        amaxes = mine + 1;
    }

    if (st == FM_OK) ops->ep_dispatch(be, L, x, T, ids, amaxes, b->send, b->ret_row);
    if (stats) {
        const bool with_rows = stats->with_rows;
        memset(stats, 0, sizeof *stats);
        stats->with_rows = with_rows;
    }
    if (st == FM_OK && stats && stats->with_rows) { /* the rows per destination, from the blocks' headers */
        for (int d = 0; d < N; d++) {
            int32_t n = 0;
            ops->download_raw(be, (const uint8_t *)b->send + (size_t)d * L->dblock, sizeof n, &n);
            stats->rows_sent[d] = n;
        }
    }
    const uint64_t sent0 = fm_comm_bytes_sent(c);
    /* a rank that failed still takes part, with an empty block: the sizes then disagree, so every rank fails at this
       exchange (and none waits forever), and each passes the second one empty as well */
    keep_first(&st, fm_comm_all_to_all(c, b->send, b->recv, st == FM_OK ? L->dblock : 0, &cerr), err, &cerr);
    const uint64_t sent1 = fm_comm_bytes_sent(c);
    for (int s = 0; st == FM_OK && stats && stats->with_rows && s < N; s++) {
        int32_t n = 0;
        ops->download_raw(be, (const uint8_t *)b->recv + (size_t)s * L->dblock, sizeof n, &n);
        stats->rows_received += n;
    }
    /* the experts' outputs go into the send buffer, whose dispatch blocks have gone */
    if (st == FM_OK) ops->moe_blocks(be, L, gate_up, down, b->recv, amaxes, be->plan.a_expert, b->send);
    keep_first(&st, fm_comm_all_to_all(c, b->send, b->recv, st == FM_OK ? L->rblock : 0, &cerr), err, &cerr);
    const uint64_t sent2 = fm_comm_bytes_sent(c);
    if (st == FM_OK) ops->ep_combine(be, L, b->recv, b->ret_row, weights, T, out);
    if (st == FM_OK && stats) { stats->bytes_dispatch = sent1 - sent0, stats->bytes_combine = sent2 - sent1; }
    return st;
}
