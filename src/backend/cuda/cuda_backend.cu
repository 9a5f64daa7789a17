// CUDA backend entry point. The op table is not written yet (issue 3: kernels, presets on the GPU); this
// file already builds for sm_90a and sm_89 so that CI compiles CUDA code from the first commit, and it
// tells the user plainly whether a GPU is present and that the ops are not there yet.
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
#include "util/status.h"
}

extern "C" fm_status fm_cuda_backend_create(const fm_plan *plan, fm_backend **out, fm_error *err) {
    (void)plan;
    *out      = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: no usable GPU (%s); use --backend cpu",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess)
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cudaGetDeviceProperties failed: %s", cudaGetErrorString(e));
    return fm_fail(err, FM_ERR_BACKEND,
                   "cuda backend: found %s (sm_%d%d), but the CUDA op table is not built yet; use --backend cpu",
                   prop.name, prop.major, prop.minor);
}
