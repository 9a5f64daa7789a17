/* Expert parallelism, host form (ep_moe.h). */
#include <stdlib.h>
#include <string.h>

#include "dist/ep_moe.h"
#include "quant/bf16.h"
#include "util/status.h"

#define HEADER 16 /* bytes before a block's ids or rows: int32 rows and padding (rows stay 16-byte aligned) */

void fm_ep_expert_range(int32_t E, int n_ranks, int rank, int32_t *first, int32_t *n) {
    *n = E / n_ranks;
    *first = rank * *n;
}

fm_status fm_ep_moe_host(fm_comm *c, fm_backend *be, const fm_bank *gate_up, const fm_bank *down, int32_t E,
                         const float *x, int64_t T, int64_t H, const int32_t *ids, const float *weights, int32_t k,
                         int64_t max_tokens, float *out, fm_ep_stats *stats, fm_error *err) {
    const int N = fm_comm_size(c), me = fm_comm_rank(c);
    /* what every rank shares fails on every rank before any exchange; what is this rank's own (its tokens, its ids)
       fails here and takes the others down at the next exchange (an empty block: the sizes disagree), never a hang */
    if (E % N) return fm_fail(err, FM_ERR_USAGE, "%d experts do not split over %d ranks (--ep must divide them)", E, N);
    const int32_t el = E / N;
    const int64_t cap = max_tokens * k;
    const size_t dblock = HEADER + (size_t)cap * 4 + (size_t)(cap * H) * sizeof(float);
    const size_t rblock = HEADER + (size_t)(cap * H) * sizeof(float);
    char *send = calloc((size_t)N, dblock), *recv = calloc((size_t)N, dblock);
    int64_t *pos = malloc((size_t)(T * k + 1) * sizeof *pos); /* each routed copy's row in its destination's block */
    int32_t rows[FM_COMM_MAX_RANKS] = {0};
    float *xl = NULL, *yl = NULL, *ones = NULL;
    int32_t *idl = NULL;
    fm_status st = FM_OK;
    if (!send || !recv || !pos) st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of host memory");
    else if (T > max_tokens)
        st = fm_fail(err, FM_ERR_USAGE, "%lld tokens on rank %d, more than the %lld the blocks hold", (long long)T, me,
                     (long long)max_tokens);

    /* dispatch: each routed copy to the block of its expert's rank, in (token, j) order */
    for (int64_t p = 0; st == FM_OK && p < T * k; p++) {
        const int32_t e = ids[p];
        if (e < 0 || e >= E) {
            st = fm_fail(err, FM_ERR_USAGE, "routed expert %d out of 0..%d", e, E - 1);
            break;
        }
        const int d = e / el;
        char *b = send + (size_t)d * dblock;
        pos[p] = rows[d]++;
        ((int32_t *)(b + HEADER))[pos[p]] = e - d * el;
        memcpy(b + HEADER + (size_t)cap * 4 + (size_t)(pos[p] * H) * sizeof(float), x + (p / k) * H,
               (size_t)H * sizeof(float));
    }
    for (int d = 0; st == FM_OK && d < N; d++) *(int32_t *)(send + (size_t)d * dblock) = rows[d];
    const uint64_t sent0 = fm_comm_bytes_sent(c);
    /* a rank that failed still takes part, with an empty block: the sizes then disagree, so every rank fails at this
       exchange (and none waits forever), and each passes the second one empty as well */
    fm_error cerr = {{0}}; /* the exchange's own error, which must not hide this rank's */
    fm_status cst = fm_comm_all_to_all(c, send, recv, st == FM_OK ? dblock : 0, &cerr);
    if (st == FM_OK && cst != FM_OK) {
        st = cst;
        if (err) *err = cerr;
    }
    const uint64_t sent1 = fm_comm_bytes_sent(c);

    /* this rank's experts on everything it received, source rank by source rank */
    int64_t R = 0;
    for (int s = 0; st == FM_OK && s < N; s++) R += *(const int32_t *)(recv + (size_t)s * dblock);
    if (st == FM_OK) {
        xl = be->ops->alloc(be, (size_t)((R ? R : 1) * H) * sizeof(float));
        yl = be->ops->alloc(be, (size_t)((R ? R : 1) * H) * sizeof(float));
        idl = be->ops->alloc(be, (size_t)(R ? R : 1) * sizeof(int32_t));
        ones = be->ops->alloc(be, (size_t)(R ? R : 1) * sizeof(float));
        if (!xl || !yl || !idl || !ones) st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of memory");
    }
    if (st == FM_OK) {
        int64_t r = 0;
        for (int s = 0; s < N; s++) {
            const char *b = recv + (size_t)s * dblock;
            const int32_t n = *(const int32_t *)b;
            memcpy(idl + r, b + HEADER, (size_t)n * 4);
            memcpy(xl + r * H, b + HEADER + (size_t)cap * 4, (size_t)(n * H) * sizeof(float));
            r += n;
        }
        for (int64_t i = 0; i < R; i++) ones[i] = 1.0f;
        if (R) be->ops->moe(be, gate_up, down, xl, R, idl, ones, 1, be->plan.a_dispatch, be->plan.a_expert, yl);
    }

    /* return: the outputs to their sources, in the order received (the dispatch buffers are reused: rblock < dblock) */
    if (st == FM_OK) {
        int64_t r = 0;
        for (int s = 0; s < N; s++) {
            const int32_t n = *(const int32_t *)(recv + (size_t)s * dblock);
            char *b = send + (size_t)s * rblock;
            *(int32_t *)b = n;
            memcpy(b + HEADER, yl + r * H, (size_t)(n * H) * sizeof(float));
            r += n;
        }
    }
    const uint64_t sent2 = fm_comm_bytes_sent(c);
    cst = fm_comm_all_to_all(c, send, recv, st == FM_OK ? rblock : 0, &cerr);
    if (st == FM_OK && cst != FM_OK) {
        st = cst;
        if (err) *err = cerr;
    }
    const uint64_t sent3 = fm_comm_bytes_sent(c);

    /* combine per token in routing order, as the single-rank moe does (cpu_moe.c: acc += w y, then the activation
       rounding of the plan) */
    if (st == FM_OK) {
        for (int64_t t = 0; t < T; t++) {
            float *acc = out + t * H;
            for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
            for (int32_t j = 0; j < k; j++) {
                const int64_t p = t * k + j;
                const int d = ids[p] / el;
                const float *y = (const float *)(recv + (size_t)d * rblock + HEADER) + pos[p] * H;
                const float wj = weights[p];
                for (int64_t i = 0; i < H; i++) acc[i] += wj * y[i];
            }
        }
        if (be->plan.act_bf16) fm_round_bf16_array(out, T * H);
        if (stats) {
            memset(stats, 0, sizeof *stats);
            for (int d = 0; d < N; d++) stats->rows_sent[d] = rows[d];
            stats->rows_received = R;
            stats->bytes_dispatch = sent1 - sent0, stats->bytes_combine = sent3 - sent2;
        }
    }
    if (xl) be->ops->free(be, xl);
    if (yl) be->ops->free(be, yl);
    if (idl) be->ops->free(be, idl);
    if (ones) be->ops->free(be, ones);
    free(send), free(recv), free(pos);
    return st;
}
