/* Expert parallelism, host form (ep_moe.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/dispatch_row.h"
#include "dist/ep_moe.h"
#include "quant/e2m1.h"
#include "quant/bf16.h"
#include "util/status.h"

#define HEADER 16 /* bytes before a block's ids or rows: int32 rows and padding */

void fm_ep_expert_range(int32_t E, int n_ranks, int rank, int32_t *first, int32_t *n) {
    *n = E / n_ranks;
    *first = rank * *n;
}

/* NVFP4: the tensor scale of the whole buffer every rank routes, from the largest of the ranks' amax (all-gathered;
 * a rank that already failed passes no bytes, so every rank fails here together) */
static fm_status nvfp4_scale(fm_comm *c, const float *x, int64_t n, bool failed, float *scale, fm_error *err) {
    float amax = fm_nvfp4_amax(x, n), all[FM_COMM_MAX_RANKS];
    fm_status st = fm_comm_all_gather(c, &amax, all, failed ? 0 : sizeof amax, err);
    if (st) return st;
    for (int r = 0; r < fm_comm_size(c); r++) amax = all[r] > amax ? all[r] : amax;
    *scale = fm_nvfp4_scale_of_amax(amax);
    return FM_OK;
}

fm_status fm_ep_moe_host(fm_comm *c, fm_backend *be, const fm_bank *gate_up, const fm_bank *down, int32_t E,
                         const float *x, int64_t T, int64_t H, const int32_t *ids, const float *weights, int32_t k,
                         int64_t max_tokens, float *out, fm_ep_stats *stats, fm_error *err) {
    const int N = fm_comm_size(c), me = fm_comm_rank(c);
    /* what every rank shares fails on every rank before any exchange; what is this rank's own (its tokens, its ids)
       fails here and takes the others down at the next exchange (an empty block: the sizes disagree), never a hang */
    if (E % N) return fm_fail(err, FM_ERR_USAGE, "%d experts do not split over %d ranks (--ep must divide them)", E, N);
    if (!be->ops->moe_dispatched)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "expert parallelism: the %s backend has no moe on dispatched rows",
                       be->ops->name);
    const int32_t el = E / N;
    const int64_t cap = max_tokens * k;
    const bool bf16 = be->plan.act_bf16;
    const fm_afmt fmt = be->plan.a_dispatch;
    const size_t row_d = fm_dispatch_row_bytes(fmt, bf16, H), row_r = fm_dispatch_row_bytes(FM_A_NATIVE, bf16, H);
    if (!row_d) return fm_fail(err, FM_ERR_USAGE, "expert parallelism: %s is not a dispatch format", fm_afmt_name(fmt));
    /* blocks of whole 16-byte units, so that each block's counts and ids stay aligned */
    const size_t dblock = (HEADER + (size_t)cap * 4 + (size_t)cap * row_d + 15) / 16 * 16;
    const size_t rblock = (HEADER + (size_t)cap * row_r + 15) / 16 * 16;
    const size_t block = dblock > rblock ? dblock : rblock; /* the buffers serve both trips: N blocks of either */
    char *send = calloc((size_t)N, block), *recv = calloc((size_t)N, block);
    int64_t *pos = malloc((size_t)(T * k + 1) * sizeof *pos); /* each routed copy's row in its destination's block */
    int32_t rows[FM_COMM_MAX_RANKS] = {0};
    uint8_t *xl = NULL;
    float *yl = NULL;
    int32_t *idl = NULL;
    fm_status st = FM_OK;
    if (!send || !recv || !pos) st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of host memory");
    else if (T > max_tokens)
        st = fm_fail(err, FM_ERR_USAGE, "%lld tokens on rank %d, more than the %lld the blocks hold", (long long)T, me,
                     (long long)max_tokens);
    float ts = 1.0f;
    fm_error cerr = {{0}}; /* an exchange's own error, which must not hide this rank's */
    if (fmt == FM_A_NVFP4) {
        const fm_status nst = nvfp4_scale(c, x, st == FM_OK ? T * H : 0, st != FM_OK, &ts, &cerr);
        if (st == FM_OK && nst != FM_OK) {
            st = nst;
            if (err) *err = cerr;
        }
    }

    /* dispatch: each routed copy, in the dispatch format, to the block of its expert's rank, in (token, j) order */
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
        fm_dispatch_row_encode(x + (p / k) * H, H, fmt, bf16, ts,
                               (uint8_t *)b + HEADER + (size_t)cap * 4 + (size_t)pos[p] * row_d);
    }
    for (int d = 0; st == FM_OK && d < N; d++) *(int32_t *)(send + (size_t)d * dblock) = rows[d];
    const uint64_t sent0 = fm_comm_bytes_sent(c);
    /* a rank that failed still takes part, with an empty block: the sizes then disagree, so every rank fails at this
       exchange (and none waits forever), and each passes the second one empty as well */
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
        xl = be->ops->alloc(be, (size_t)(R ? R : 1) * row_d);
        yl = be->ops->alloc(be, (size_t)((R ? R : 1) * H) * sizeof(float));
        idl = be->ops->alloc(be, (size_t)(R ? R : 1) * sizeof(int32_t));
        if (!xl || !yl || !idl) st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of memory");
    }
    if (st == FM_OK) {
        int64_t r = 0;
        for (int s = 0; s < N; s++) {
            const char *b = recv + (size_t)s * dblock;
            const int32_t n = *(const int32_t *)b;
            memcpy(idl + r, b + HEADER, (size_t)n * 4);
            memcpy(xl + (size_t)r * row_d, b + HEADER + (size_t)cap * 4, (size_t)n * row_d);
            r += n;
        }
        if (R) be->ops->moe_dispatched(be, gate_up, down, xl, R, idl, fmt, ts, be->plan.a_expert, yl);
    }

    /* return: the outputs to their sources in the activation format (bf16 when the activations are: exact), in the
       order received (the dispatch's buffers are reused: its row counts were read above) */
    if (st == FM_OK) {
        int64_t r = 0;
        for (int s = 0; s < N; s++) {
            const int32_t n = *(const int32_t *)(recv + (size_t)s * dblock);
            char *b = send + (size_t)s * rblock;
            *(int32_t *)b = n;
            for (int32_t i = 0; i < n; i++)
                fm_dispatch_row_encode(yl + (r + i) * H, H, FM_A_NATIVE, bf16, 1.0f,
                                       (uint8_t *)b + HEADER + (size_t)i * row_r);
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
        float *y = malloc((size_t)H * sizeof *y);
        if (!y) st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of host memory");
        for (int64_t t = 0; st == FM_OK && t < T; t++) {
            float *acc = out + t * H;
            for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
            for (int32_t j = 0; j < k; j++) {
                const int64_t p = t * k + j;
                const int d = ids[p] / el;
                fm_dispatch_row_decode_native(
                    (const uint8_t *)recv + (size_t)d * rblock + HEADER + (size_t)pos[p] * row_r, H, bf16, y);
                const float wj = weights[p];
                for (int64_t i = 0; i < H; i++) acc[i] += wj * y[i];
            }
        }
        free(y);
        if (st == FM_OK && bf16) fm_round_bf16_array(out, T * H);
        if (st == FM_OK && stats) {
            memset(stats, 0, sizeof *stats);
            for (int d = 0; d < N; d++) stats->rows_sent[d] = rows[d];
            stats->rows_received = R;
            stats->bytes_dispatch = sent1 - sent0, stats->bytes_combine = sent3 - sent2;
        }
    }
    if (xl) be->ops->free(be, xl);
    if (yl) be->ops->free(be, yl);
    if (idl) be->ops->free(be, idl);
    free(send), free(recv), free(pos);
    return st;
}
