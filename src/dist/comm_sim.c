/* The simulated communicator (comm.h): the ranks are threads of this process and exchange through host memory.
 * Each collective is two phases around a barrier: every rank publishes its buffer and sizes, waits for the others,
 * checks that the sizes agree, reads what it needs from the others' buffers, and waits again, so that no rank
 * writes its buffer (or publishes the next one) while another still reads it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dist/comm_world.h"
#include "quant/bf16.h"
#include "util/status.h"

typedef enum { OP_ALL_REDUCE_F32, OP_ALL_REDUCE_BF16, OP_ALL_GATHER, OP_ALL_TO_ALL, OP_FAILED } op_kind;

typedef struct sim_world {
    pthread_barrier_t bar;
    const void *pub[FM_COMM_MAX_RANKS]; /* the buffer each rank offers in the current collective */
    size_t size[FM_COMM_MAX_RANKS];     /* its size argument, and its operation, checked for agreement */
    int op[FM_COMM_MAX_RANKS];
} sim_world;

static sim_world *sim(const fm_comm *c) { return (sim_world *)c->w->impl; }

static const char *op_name(int op) {
    return op == OP_ALL_REDUCE_F32    ? "all_reduce (f32)"
           : op == OP_ALL_REDUCE_BF16 ? "all_reduce (bf16)"
           : op == OP_ALL_GATHER      ? "all_gather"
           : op == OP_ALL_TO_ALL      ? "all_to_all"
                                      : "nothing (it failed before the collective)";
}

static fm_status sim_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err);
static fm_status sim_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err);
static fm_status sim_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err);

static void sim_world_free(fm_world *w) {
    sim_world *s = w->impl;
    if (!s) return;
    pthread_barrier_destroy(&s->bar);
    free(s);
}

static const fm_comm_vt sim_vt = {"simulated", sim_all_reduce_sum, sim_all_gather, sim_all_to_all, sim_world_free};

fm_status fm_world_create_sim(int n_ranks, fm_world **out, fm_error *err) {
    fm_world *w = NULL;
    fm_status st = fm_world_alloc(&sim_vt, n_ranks, &w, err);
    if (st) return st;
    sim_world *s = fm_calloc(1, sizeof *s, err, "the simulated world");
    if (!s) {
        free(w);
        return FM_ERR_NOMEM;
    }
    if (pthread_barrier_init(&s->bar, NULL, (unsigned)n_ranks) != 0) {
        free(s), free(w);
        return fm_fail(err, FM_ERR_IO, "the simulated world's barrier could not be made");
    }
    w->impl = s;
    *out = w;
    return FM_OK;
}

/* Phase one: publish, wait, check. On a mismatch every rank sees the same tables, so every rank fails (after the
 * second barrier, which the caller still passes through: finish()). */
static fm_status publish(fm_comm *c, int op, const void *p, size_t size, fm_error *err) {
    sim_world *w = sim(c);
    w->pub[c->rank] = p, w->size[c->rank] = size, w->op[c->rank] = op;
    pthread_barrier_wait(&w->bar);
    for (int r = 0; r < c->w->n; r++)
        if (w->op[r] != op || w->size[r] != size)
            return fm_fail(err, FM_ERR_USAGE,
                           "collective mismatch: rank %d called %s with %zu, rank %d called %s with %zu (every rank "
                           "must make the same call)",
                           c->rank, op_name(op), size, r, op_name(w->op[r]), w->size[r]);
    return FM_OK;
}

static fm_status finish(fm_comm *c, fm_status st) {
    pthread_barrier_wait(&sim(c)->bar);
    return st;
}

/* The collectives on host buffers (the cpu backend's memory, or a staged rank's host copies). `pre`: a failure of
 * this rank before the collective (its staging); it publishes an operation no rank makes, so every rank fails. */
static fm_status reduce_host(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_status pre, fm_error *err) {
    const size_t elem = t == FM_COMM_F32 ? 4 : 2;
    float *sum = n ? malloc((size_t)n * sizeof *sum) : NULL; /* before publishing: every rank must reach the barriers */
    const int op = pre ? OP_FAILED : t == FM_COMM_F32 ? OP_ALL_REDUCE_F32 : OP_ALL_REDUCE_BF16;
    fm_status st = publish(c, op, buf, (size_t)n * elem, err);
    if (pre) st = pre;
    if (st == FM_OK && n && !sum) st = fm_fail(err, FM_ERR_NOMEM, "all_reduce: out of host memory");
    if (st == FM_OK)
        for (int64_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int r = 0; r < c->w->n; r++) /* rank order: the same bits on every rank */
                s += t == FM_COMM_F32 ? ((const float *)sim(c)->pub[r])[i]
                                      : fm_bf16_to_f32(((const uint16_t *)sim(c)->pub[r])[i]);
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

static fm_status gather_host(fm_comm *c, const void *send, void *recv, size_t bytes, fm_status pre, fm_error *err) {
    fm_status st = publish(c, pre ? OP_FAILED : OP_ALL_GATHER, send, bytes, err);
    if (pre) st = pre;
    if (st == FM_OK && bytes)
        for (int r = 0; r < c->w->n; r++) memcpy((char *)recv + (size_t)r * bytes, sim(c)->pub[r], bytes);
    if (st == FM_OK) c->sent += (uint64_t)(c->w->n - 1) * bytes;
    return finish(c, st);
}

static fm_status all_to_all_host(fm_comm *c, const void *send, void *recv, size_t block, fm_status pre, fm_error *err) {
    fm_status st = publish(c, pre ? OP_FAILED : OP_ALL_TO_ALL, send, block, err);
    if (pre) st = pre;
    if (st == FM_OK && block)
        for (int r = 0; r < c->w->n; r++)
            memcpy((char *)recv + (size_t)r * block, (const char *)sim(c)->pub[r] + (size_t)c->rank * block, block);
    if (st == FM_OK) c->sent += (uint64_t)(c->w->n - 1) * block;
    return finish(c, st);
}

/* A staged rank (fm_comm_sim_stage_through): its buffers are its backend's memory, copied to host memory before the
 * collective (the download waits for the rank's device work) and back after it (stream-ordered). */
static fm_backend *stage_of(const fm_comm *c) { return (fm_backend *)c->impl; }

static void *staged_copy(fm_backend *be, const void *src, size_t bytes, size_t cap) {
    void *h = malloc(cap ? cap : 1);
    if (h && src && bytes) be->ops->download_raw(be, src, bytes, h);
    return h;
}

static fm_status nomem(fm_error *err, const char *what, size_t bytes) {
    return fm_fail(err, FM_ERR_NOMEM, "%s: out of host memory to stage %zu bytes", what, bytes);
}

static fm_status sim_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err) {
    if (n < 0 || (n > 0 && !buf)) return fm_fail(err, FM_ERR_USAGE, "all_reduce of %lld elements", (long long)n);
    fm_backend *be = stage_of(c);
    if (!be) return reduce_host(c, buf, n, t, FM_OK, err);
    const size_t bytes = (size_t)n * (t == FM_COMM_F32 ? 4 : 2);
    void *h = staged_copy(be, buf, bytes, bytes);
    const fm_status st = reduce_host(c, h, n, t, h ? FM_OK : nomem(err, "all_reduce", bytes), err);
    if (!st && bytes) be->ops->upload_raw(be, h, bytes, buf);
    free(h);
    return st;
}

/* A host exchange (gather_host, all_to_all_host) on staged copies: send_bytes of the rank's send buffer downloaded,
 * the exchange by unit (its bytes or block argument), recv_bytes uploaded into recv */
typedef fm_status (*host_exchange)(fm_comm *c, const void *send, void *recv, size_t unit, fm_status pre, fm_error *err);
static fm_status staged_exchange(fm_comm *c, fm_backend *be, host_exchange fn, const char *what, const void *send,
                                 void *recv, size_t unit, size_t send_bytes, size_t recv_bytes, fm_error *err) {
    void *hs = staged_copy(be, send, send_bytes, send_bytes), *hr = malloc(recv_bytes ? recv_bytes : 1);
    const fm_status st = fn(c, hs, hr, unit, hs && hr ? FM_OK : nomem(err, what, recv_bytes), err);
    if (!st && recv_bytes) be->ops->upload_raw(be, hr, recv_bytes, recv);
    free(hs), free(hr);
    return st;
}

static fm_status sim_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err) {
    fm_backend *be = stage_of(c);
    if (!be) return gather_host(c, send, recv, bytes, FM_OK, err);
    return staged_exchange(c, be, gather_host, "all_gather", send, recv, bytes, bytes, bytes * (size_t)c->w->n, err);
}

static fm_status sim_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err) {
    fm_backend *be = stage_of(c);
    if (!be) return all_to_all_host(c, send, recv, block, FM_OK, err);
    const size_t all = block * (size_t)c->w->n;
    return staged_exchange(c, be, all_to_all_host, "all_to_all", send, recv, block, all, all, err);
}

void fm_comm_sim_stage_through(fm_comm *c, fm_backend *be) {
    if (c->w->vt == &sim_vt) c->impl = be;
}
