/* The load's progress in bytes: the checkpoint bytes behind every bank built so far, shown as a rate on the progress
 * line (util/progress.h: on a terminal, with --verbose) and summed up in one final line with --verbose:
 * "loaded X GB in Y s (Z GB/s)". GB are 10^9 bytes, as disks and links count them. */
#ifndef FM_ENGINE_LOAD_PROGRESS_H
#define FM_ENGINE_LOAD_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model_src.h"

typedef struct fm_load_progress {
    bool verbose;
    double t0;      /* seconds, monotonic clock, at the start */
    uint64_t bytes; /* source bytes of the banks built so far */
} fm_load_progress;

void fm_load_progress_start(fm_load_progress *p, bool verbose);
/* Counts the bytes of count source views: a float view's elements in its dtype (f32 for a synthetic one), a
 * pre-quantized view's packed, scale, zero-point and group-index tensors. */
void fm_load_progress_add(fm_load_progress *p, const fm_wsrc *srcs, int64_t count);
/* The progress line: "loading layer l/L, X GB, Z GB/s". */
void fm_load_progress_layer(const fm_load_progress *p, int layer, int n_layers);
/* Seconds since the start. */
double fm_load_progress_seconds(const fm_load_progress *p);
/* Clears the progress line; with verbose, prints "loaded X GB in Y s (Z GB/s)" and what followed `what`. */
void fm_load_progress_done(const fm_load_progress *p, const char *what);

#endif
