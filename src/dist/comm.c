/* The communicator's calls (comm.h), dispatched to the world's implementation (comm_world.h). */
#include <stdlib.h>

#include "dist/comm_world.h"
#include "util/status.h"

fm_status fm_world_alloc(const fm_comm_vt *vt, int n_ranks, fm_world **out, fm_error *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > FM_COMM_MAX_RANKS)
        return fm_fail(err, FM_ERR_USAGE, "a world of %d ranks (1..%d)", n_ranks, FM_COMM_MAX_RANKS);
    fm_world *w = fm_calloc(1, sizeof *w, err, "the world of ranks");
    if (!w) return FM_ERR_NOMEM;
    w->vt = vt, w->n = n_ranks;
    for (int r = 0; r < n_ranks; r++) w->ranks[r].w = w, w->ranks[r].rank = r;
    *out = w;
    return FM_OK;
}

void fm_world_free(fm_world *w) {
    if (!w) return;
    w->vt->world_free(w);
    free(w);
}

fm_comm *fm_world_comm(fm_world *w, int rank) { return rank >= 0 && rank < w->n ? &w->ranks[rank] : NULL; }
int fm_comm_rank(const fm_comm *c) { return c->rank; }
int fm_comm_size(const fm_comm *c) { return c->w->n; }
uint64_t fm_comm_bytes_sent(const fm_comm *c) { return c->sent; }
void fm_comm_set_stream(fm_comm *c, void *stream) { c->stream = stream; }
const char *fm_comm_kind(const fm_comm *c) { return c->w->vt->name; }

fm_status fm_comm_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err) {
    return c->w->vt->all_reduce_sum(c, buf, n, t, err);
}

fm_status fm_comm_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err) {
    return c->w->vt->all_gather(c, send, recv, bytes, err);
}

fm_status fm_comm_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err) {
    return c->w->vt->all_to_all(c, send, recv, block, err);
}
