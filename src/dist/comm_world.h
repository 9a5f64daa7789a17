/* The world behind comm.h, shared by its implementations (comm_sim.c; the NCCL one, backend/cuda/comm_nccl.cu): the
 * ranks' ends and a table of the collectives, which comm.c dispatches to; an implementation keeps its own state in
 * the world's `impl` and each rank's. */
#ifndef FM_DIST_COMM_WORLD_H
#define FM_DIST_COMM_WORLD_H

#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_comm_vt {
    const char *name; /* "simulated", "NCCL" */
    fm_status (*all_reduce_sum)(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err);
    fm_status (*all_gather)(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err);
    fm_status (*all_to_all)(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err);
    void (*world_free)(fm_world *w); /* the implementation's state (not the fm_world itself) */
} fm_comm_vt;

struct fm_comm {
    fm_world *w;
    int rank;
    uint64_t sent;
    void *stream; /* fm_comm_set_stream */
    void *impl;
};

struct fm_world {
    const fm_comm_vt *vt;
    int n;
    fm_comm ranks[FM_COMM_MAX_RANKS];
    void *impl;
};

/* A world of n ranks (1..FM_COMM_MAX_RANKS) on vt, every rank's end set (rank, world); impl left to the caller. */
fm_status fm_world_alloc(const fm_comm_vt *vt, int n_ranks, fm_world **out, fm_error *err);

#ifdef __cplusplus
}
#endif

#endif
