/* Stand-in for the CUDA backend when the build found no nvcc. */
#include "backend/backend.h"
#include "util/status.h"

fm_status fm_cuda_backend_create(const fm_plan *plan, fm_backend **out, fm_error *err) {
    (void)plan;
    *out = NULL;
    return fm_fail(err, FM_ERR_BACKEND, "cuda backend: not built (nvcc was not found at build time); use --backend cpu");
}
