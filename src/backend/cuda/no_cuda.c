/* Stand-in for the CUDA backend when the build found no nvcc. */
#include "backend/backend.h"
#include "backend/routes.h"
#include "engine/memory_plan.h"
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
