// CUDA graphs of what a caller enqueues on the cuda backend's stream (cuda_graph.h).
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_graph.h"

extern "C" {
#include "util/status.h"
}

#define GRAPH_CHECK(call, what)                                                                                        \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            cudaGetLastError();                                                                                        \
            return fm_fail(err, e_ == cudaErrorMemoryAllocation ? FM_ERR_NOMEM : FM_ERR_BACKEND, "CUDA graph: %s: %s", \
                           what, cudaGetErrorString(e_));                                                              \
        }                                                                                                              \
    } while (0)

struct fm_graph {
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

extern "C" fm_status fm_cuda_graph_capture(fm_backend *bb, fm_status (*body)(void *ctx, fm_error *err), void *ctx,
                                           fm_cuda_graph **out, fm_error *err) {
    *out = NULL;
    if (strcmp(bb->ops->name, "cuda") != 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "CUDA graphs need the cuda backend, not %s", bb->ops->name);
    fm_cuda_graph *g = (fm_cuda_graph *)calloc(1, sizeof *g);
    if (!g) return fm_fail(err, FM_ERR_NOMEM, "out of host memory");
    g->stream = cuda_be(bb)->stream;
    const cudaError_t be = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed);
    if (be != cudaSuccess) {
        cudaGetLastError();
        free(g);
        return fm_fail(err, FM_ERR_BACKEND, "CUDA graph: begin capture: %s", cudaGetErrorString(be));
    }
    const fm_status st = body(ctx, err);
    const cudaError_t e = cudaStreamEndCapture(g->stream, &g->graph);
    if (st || e != cudaSuccess) {
        cudaGetLastError();
        fm_cuda_graph_free(g);
        return st ? st : fm_fail(err, FM_ERR_BACKEND, "CUDA graph: capture: %s", cudaGetErrorString(e));
    }
    const cudaError_t ie = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (ie != cudaSuccess) {
        cudaGetLastError();
        fm_cuda_graph_free(g);
        return fm_fail(err, FM_ERR_BACKEND, "CUDA graph: instantiating: %s", cudaGetErrorString(ie));
    }
    *out = g;
    return FM_OK;
}

extern "C" fm_status fm_cuda_graph_launch(fm_cuda_graph *g, fm_error *err) {
    GRAPH_CHECK(cudaGraphLaunch(g->exec, g->stream), "graph launch");
    return FM_OK;
}

extern "C" void fm_cuda_graph_free(fm_cuda_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}

extern "C" fm_status fm_cuda_graph_launch_op(fm_backend *bb, fm_graph *g, fm_error *err) {
    (void)bb;
    return fm_cuda_graph_launch(g, err);
}

// the nodes of graph (and of its child graphs) by kind, added to *out; a query that fails counts nothing more
static void graph_count(cudaGraph_t graph, fm_graph_nodes *out) {
    size_t n = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return;
    }
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    if (!nodes || cudaGraphGetNodes(graph, nodes, &n) != cudaSuccess) {
        cudaGetLastError();
        free(nodes);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType type;
        if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        cudaGraph_t child;
        if (type == cudaGraphNodeTypeKernel) out->kernels++;
        else if (type == cudaGraphNodeTypeMemcpy || type == cudaGraphNodeTypeMemset) out->copies++;
        else if (type == cudaGraphNodeTypeGraph && cudaGraphChildGraphNodeGetGraph(nodes[i], &child) == cudaSuccess)
            graph_count(child, out);
        else out->other++;
    }
    free(nodes);
}

extern "C" void fm_cuda_graph_nodes_op(fm_backend *bb, const fm_graph *g, fm_graph_nodes *out) {
    (void)bb;
    if (g && g->graph) graph_count(g->graph, out);
}

extern "C" void fm_cuda_graph_free_op(fm_backend *bb, fm_graph *g) {
    (void)bb;
    fm_cuda_graph_free(g);
}
