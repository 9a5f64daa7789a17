/* Stand-in for the CUDA backend when the build found no nvcc. */
#include "backend/backend.h"
#include "engine/memory_plan.h"
#include "util/status.h"

#define NOT_BUILT "cuda backend: not built (nvcc was not found at build time); use --backend cpu"

fm_status fm_cuda_backend_create(const fm_plan *plan, fm_backend **out, fm_error *err) {
    (void)plan;
    *out = NULL;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}

void *fm_cuda_backend_stream(fm_backend *be) {
    (void)be;
    return NULL;
}

fm_status fm_cuda_free_memory(size_t *free_bytes, size_t *total, fm_error *err) {
    *free_bytes = 0;
    if (total) *total = 0;
    return fm_fail(err, FM_ERR_BACKEND, NOT_BUILT);
}
