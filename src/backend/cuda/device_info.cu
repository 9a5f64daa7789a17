// Device queries the engine makes before it allocates anything: the free memory the memory plan is checked
// against (src/engine/model.c, fm_memory_plan_check; declared in src/engine/memory_plan.h) and the compute
// capability the route table's defaults come from (inspect --routes; src/backend/routes.h). The stand-ins for
// builds without nvcc are in no_cuda.c.
#include <cuda_runtime.h>

extern "C" {
#include "backend/routes.h"
#include "engine/memory_plan.h"
#include "util/status.h"
}

#include <stdio.h>

extern "C" fm_status fm_cuda_device_query(int *sm_major, char *name, size_t cap, fm_error *err) {
    *sm_major = 0;
    if (cap) name[0] = '\0';
    int count = 0, dev = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count == 0) e = cudaErrorNoDevice;
    cudaDeviceProp prop;
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: no usable GPU (%s)", cudaGetErrorString(e));
    }
    *sm_major = prop.major;
    if (cap) snprintf(name, cap, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
    return FM_OK;
}

extern "C" fm_status fm_cuda_free_memory(size_t *free_bytes, size_t *total, fm_error *err) {
    *free_bytes = 0;
    if (total) *total = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError(); /* not sticky, but leave nothing behind for the next check */
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: no usable GPU (%s); use --backend cpu",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    }
    size_t f = 0, t = 0;
    e = cudaMemGetInfo(&f, &t); /* the current device: the one the backend will use */
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cannot query device memory (%s)", cudaGetErrorString(e));
    }
    *free_bytes = f;
    if (total) *total = t;
    return FM_OK;
}
