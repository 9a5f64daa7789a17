// Device queries the engine makes before it allocates anything: whether this binary has kernels for the GPU at all
// (fm_cuda_device_has_kernels: the cuda backend refuses at its creation, naming the GPU and the archs built), the
// free memory the memory plan is checked against (the cuda backend kind's free_memory, cuda_kind.c; declared in
// src/backend/backend.h) and the compute capability the route table's defaults come from (inspect --routes;
// src/backend/routes.h). The stand-ins for builds without nvcc are in no_cuda.c.
#include <cuda_runtime.h>

extern "C" {
#include "backend/routes.h"
#include "backend/backend.h"
#include "util/status.h"
}

#include <stdio.h>

#include "backend/cuda/cuda_internal.cuh"

// The archs every .cu file is compiled for: the Makefile passes its CUDA_ARCHS as this list.
#ifndef FM_CUDA_ARCH_LIST
#define FM_CUDA_ARCH_LIST "sm_90a sm_89"
#endif

// An empty kernel built like every other one: the runtime finds an image of it for the GPU exactly when it finds
// one for the engine's kernels. The binary embeds SASS only, no PTX, so nothing is JIT-compiled for another GPU and
// an A100 (sm_80) or a Blackwell (sm_100, sm_120) finds none.
__global__ void fm_kernel_image_probe() {}

extern "C" fm_status fm_cuda_device_has_kernels(int device, fm_error *err) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cannot query GPU %d (%s)", device, cudaGetErrorString(e));
    }
    int current = 0;
    cudaFuncAttributes attr;
    e = cudaGetDevice(&current);
    if (e == cudaSuccess && current != device) e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, fm_kernel_image_probe);
    if (current != device) cudaSetDevice(current);
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
        cudaGetLastError(); /* not sticky: leave nothing for the next call */
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "cuda backend: this binary has no kernels for %s (sm_%d%d); it was built for " FM_CUDA_ARCH_LIST
                       " (sm_90a: Hopper, H100 and H200; sm_89: Ada, L4, L40S and RTX 40xx), whose FP8 tensor cores "
                       "the kernels need; use --backend cpu",
                       prop.name, prop.major, prop.minor);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: %s (sm_%d%d) cannot run kernels (%s)", prop.name, prop.major,
                       prop.minor, cudaGetErrorString(e));
    }
    return FM_OK;
}

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
    fm_status st = fm_cuda_device_has_kernels(dev, err); /* a GPU the binary cannot run is no usable GPU */
    if (st) return st;
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
