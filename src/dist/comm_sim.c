/* The simulated communicator (comm.h): the ranks are threads of this process and exchange through host memory.
 * Each collective is two phases around a barrier: every rank publishes its buffer and sizes, waits for the others,
 * checks that the sizes agree, reads what it needs from the others' buffers, and waits again, so that no rank
 * writes its buffer (or publishes the next one) while another still reads it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "quant/bf16.h"
#include "util/status.h"

typedef enum { OP_ALL_REDUCE_F32, OP_ALL_REDUCE_BF16, OP_ALL_GATHER, OP_ALL_TO_ALL } op_kind;

struct fm_comm {
    fm_world *w;
    int rank;
    uint64_t sent;
};

struct fm_world {
    int n;
    pthread_barrier_t bar;
    fm_comm ranks[FM_COMM_MAX_RANKS];
    const void *pub[FM_COMM_MAX_RANKS]; /* the buffer each rank offers in the current collective */
    size_t size[FM_COMM_MAX_RANKS];     /* its size argument, and its operation, checked for agreement */
    int op[FM_COMM_MAX_RANKS];
};

static const char *op_name(int op) {
    return op == OP_ALL_REDUCE_F32    ? "all_reduce (f32)"
           : op == OP_ALL_REDUCE_BF16 ? "all_reduce (bf16)"
           : op == OP_ALL_GATHER      ? "all_gather"
                                      : "all_to_all";
}

fm_status fm_world_create_sim(int n_ranks, fm_world **out, fm_error *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > FM_COMM_MAX_RANKS)
        return fm_fail(err, FM_ERR_USAGE, "a world of %d ranks (1..%d)", n_ranks, FM_COMM_MAX_RANKS);
    fm_world *w = fm_calloc(1, sizeof *w, err, "the simulated world");
    if (!w) return FM_ERR_NOMEM;
    w->n = n_ranks;
    if (pthread_barrier_init(&w->bar, NULL, (unsigned)n_ranks) != 0) {
        free(w);
        return fm_fail(err, FM_ERR_IO, "the simulated world's barrier could not be made");
    }
    for (int r = 0; r < n_ranks; r++) w->ranks[r].w = w, w->ranks[r].rank = r;
    *out = w;
    return FM_OK;
}

void fm_world_free(fm_world *w) {
    if (!w) return;
    pthread_barrier_destroy(&w->bar);
    free(w);
}

fm_comm *fm_world_comm(fm_world *w, int rank) { return rank >= 0 && rank < w->n ? &w->ranks[rank] : NULL; }
int fm_comm_rank(const fm_comm *c) { return c->rank; }
int fm_comm_size(const fm_comm *c) { return c->w->n; }
uint64_t fm_comm_bytes_sent(const fm_comm *c) { return c->sent; }

/* Phase one: publish, wait, check. On a mismatch every rank sees the same tables, so every rank fails (after the
 * second barrier, which the caller still passes through: finish()). */
static fm_status publish(fm_comm *c, int op, const void *p, size_t size, fm_error *err) {
    fm_world *w = c->w;
    w->pub[c->rank] = p, w->size[c->rank] = size, w->op[c->rank] = op;
    pthread_barrier_wait(&w->bar);
    for (int r = 0; r < w->n; r++)
        if (w->op[r] != op || w->size[r] != size)
            return fm_fail(err, FM_ERR_USAGE,
                           "collective mismatch: rank %d called %s with %zu, rank %d called %s with %zu (every rank "
                           "must make the same call)",
                           c->rank, op_name(op), size, r, op_name(w->op[r]), w->size[r]);
    return FM_OK;
}

static fm_status finish(fm_comm *c, fm_status st) {
    pthread_barrier_wait(&c->w->bar);
    return st;
}

fm_status fm_comm_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err) {
    if (n < 0 || (n > 0 && !buf)) return fm_fail(err, FM_ERR_USAGE, "all_reduce of %lld elements", (long long)n);
    const size_t elem = t == FM_COMM_F32 ? 4 : 2;
    float *sum = n ? malloc((size_t)n * sizeof *sum) : NULL; /* before publishing: every rank must reach the barriers */
    fm_status st = publish(c, t == FM_COMM_F32 ? OP_ALL_REDUCE_F32 : OP_ALL_REDUCE_BF16, buf, (size_t)n * elem, err);
    if (st == FM_OK && n && !sum) st = fm_fail(err, FM_ERR_NOMEM, "all_reduce: out of host memory");
    if (st == FM_OK)
        for (int64_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int r = 0; r < c->w->n; r++) /* rank order: the same bits on every rank */
                s += t == FM_COMM_F32 ? ((const float *)c->w->pub[r])[i]
                                      : fm_bf16_to_f32(((const uint16_t *)c->w->pub[r])[i]);
            sum[i] = s;
        }
    st = finish(c, st); /* everyone has read every buffer: now each writes its own */
    if (st == FM_OK) {
        for (int64_t i = 0; i < n; i++) {
            if (t == FM_COMM_F32) ((float *)buf)[i] = sum[i];
            else ((uint16_t *)buf)[i] = fm_f32_to_bf16(sum[i]);
        }
        /* what a ring all-reduce sends per rank: 2 (N - 1) / N of the buffer */
        c->sent += 2 * (uint64_t)(c->w->n - 1) * (uint64_t)n * elem / (uint64_t)c->w->n;
    }
    free(sum);
    return st;
}

fm_status fm_comm_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err) {
    fm_status st = publish(c, OP_ALL_GATHER, send, bytes, err);
    if (st == FM_OK && bytes)
        for (int r = 0; r < c->w->n; r++) memcpy((char *)recv + (size_t)r * bytes, c->w->pub[r], bytes);
    if (st == FM_OK) c->sent += (uint64_t)(c->w->n - 1) * bytes;
    return finish(c, st);
}

fm_status fm_comm_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err) {
    fm_status st = publish(c, OP_ALL_TO_ALL, send, block, err);
    if (st == FM_OK && block)
        for (int r = 0; r < c->w->n; r++)
            memcpy((char *)recv + (size_t)r * block, (const char *)c->w->pub[r] + (size_t)c->rank * block, block);
    if (st == FM_OK) c->sent += (uint64_t)(c->w->n - 1) * block;
    return finish(c, st);
}
