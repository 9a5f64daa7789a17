/* Stand-in for the CUDA backend when the build found no nvcc. */
#include "backend/backend.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/routes.h"
#include "dist/comm.h"
#include "util/status.h"

#define NOT_BUILT "cuda backend: not built (nvcc was not found at build time); use --backend cpu"

fm_status fm_cuda_backend_create(const fm_plan *plan, const char *routes, fm_backend **out, fm_error *err) {
    (void)plan, (void)routes;
    *out = NULL;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

void *fm_cuda_backend_stream(fm_backend *be) {
    (void)be;
    return NULL;
}

bool fm_cuda_moe_dispatch_read(fm_backend *be, int64_t T, int32_t k, int32_t E, int64_t H, int64_t I, uint8_t *codes,
                               uint8_t *scales, float *tensor_scale) {
    (void)be, (void)T, (void)k, (void)E, (void)H, (void)I, (void)codes, (void)scales, (void)tensor_scale;
    return false;
}

fm_status fm_cuda_expert_cache_table(fm_backend *be, const fm_expert_cache *c, int32_t *slot_of, int32_t *owner,
                                     fm_error *err) {
    (void)be, (void)c, (void)slot_of, (void)owner;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

fm_status fm_cuda_host_link(size_t bytes, double *dma_gbps, double *mapped_gbps, fm_error *err) {
    (void)bytes;
    *dma_gbps = *mapped_gbps = 0;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

fm_status fm_cuda_device_query(int *sm_major, char *name, size_t cap, fm_error *err) {
    *sm_major = 0;
    if (cap) name[0] = '\0';
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

fm_status fm_cuda_free_memory(size_t *free_bytes, size_t *total, fm_error *err) {
    *free_bytes = 0;
    if (total) *total = 0;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

fm_status fm_cuda_graph_capture(fm_backend *be, fm_status (*body)(void *ctx, fm_error *err), void *ctx,
                                fm_cuda_graph **out, fm_error *err) {
    (void)be, (void)body, (void)ctx;
    *out = NULL;
    return fm_fail(err, FM_ERR_UNSUPPORTED, NOT_BUILT);
}

fm_status fm_cuda_graph_launch(fm_cuda_graph *g, fm_error *err) {
    (void)g;
    return fm_fail(err, FM_ERR_UNSUPPORTED, NOT_BUILT);
}

void fm_cuda_graph_free(fm_cuda_graph *g) { (void)g; }

fm_status fm_world_create_nccl(int n_ranks, const int *devices, fm_world **out, fm_error *err) {
    (void)n_ranks, (void)devices;
    *out = NULL;
    return fm_fail(err, FM_ERR_BACKEND, "NCCL world: not built (nvcc was not found at build time)");
}

int fm_nccl_version(void) { return 0; }
