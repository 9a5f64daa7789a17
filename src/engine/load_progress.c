/* Bytes loaded, and their rate (see load_progress.h). */
#include "engine/load_progress.h"

#include <stdio.h>
#include <time.h>

#include "util/progress.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fm_load_progress_start(fm_load_progress *p, bool verbose) { *p = (fm_load_progress){verbose, now(), 0}; }

static uint64_t tensor_bytes(const fm_st_tensor *t) { return t ? t->nbytes : 0; }

void fm_load_progress_add(fm_load_progress *p, const fm_wsrc *srcs, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const fm_wsrc *w = &srcs[i];
        if (fm_wsrc_is_quantized(w))
            p->bytes += tensor_bytes(w->q.packed) + tensor_bytes(w->q.scales) + tensor_bytes(w->q.zeros) +
                        tensor_bytes(w->q.g_idx);
        else p->bytes += (uint64_t)(w->rows * w->cols) * (uint64_t)(w->t ? fm_dtype_size(w->t->dtype) : 4);
    }
}

double fm_load_progress_seconds(const fm_load_progress *p) { return now() - p->t0; }

static double rate(const fm_load_progress *p, double s) { return s > 0 ? (double)p->bytes / 1e9 / s : 0; }

void fm_load_progress_layer(const fm_load_progress *p, int layer, int n_layers) {
    if (!p->verbose) return;
    fm_progress("loading layer %d/%d, %.2f GB, %.2f GB/s", layer, n_layers, (double)p->bytes / 1e9,
                rate(p, fm_load_progress_seconds(p)));
}

void fm_load_progress_done(const fm_load_progress *p, const char *what) {
    fm_progress_end();
    if (!p->verbose) return;
    const double s = fm_load_progress_seconds(p);
    fprintf(stderr, "loaded %.2f GB in %.2f s (%.2f GB/s)%s%s\n", (double)p->bytes / 1e9, s, rate(p, s),
            what && *what ? ": " : "", what ? what : "");
}
