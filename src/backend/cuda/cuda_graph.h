/* CUDA graphs of a sequence of backend calls (bench gemm replays its projections as one graph; decode steps will be
 * captured the same way). Plain C declarations (no CUDA types): C callers include this header. */
#ifndef FM_CUDA_GRAPH_H
#define FM_CUDA_GRAPH_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

typedef struct fm_graph fm_cuda_graph; /* backend.h's fm_graph: the ops graph_* take these */

/* Captures what body enqueues on the cuda backend's stream into a graph (relaxed capture mode). body must not
 * allocate device memory or synchronise: run it once before capturing, so that workspaces have their size.
 * FM_ERR_UNSUPPORTED for another backend. */
fm_status fm_cuda_graph_capture(fm_backend *be, fm_status (*body)(void *ctx, fm_error *err), void *ctx,
                                fm_cuda_graph **out, fm_error *err);
/* Launches the graph on the backend's stream (marks around it time it). */
fm_status fm_cuda_graph_launch(fm_cuda_graph *g, fm_error *err);
void fm_cuda_graph_free(fm_cuda_graph *g);
/* The same as backend ops (fm_backend_ops graph_capture, graph_launch, graph_free) */
fm_status fm_cuda_graph_launch_op(fm_backend *be, fm_graph *g, fm_error *err);
void fm_cuda_graph_free_op(fm_backend *be, fm_graph *g);
void fm_cuda_graph_nodes_op(fm_backend *be, const fm_graph *g, fm_graph_nodes *out);

#ifdef __cplusplus
}
#endif

#endif
