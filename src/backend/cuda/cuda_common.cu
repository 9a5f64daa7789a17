// Launch checking for every kernel of the CUDA backend (see cuda_common.cuh), and the PDL launch (pdl.cuh).
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/pdl.cuh"

static int sync_mode = -1; // -1: not read yet; FP8MOE_SYNC=1 synchronises after every launch

bool fm_cuda_debug_mode(void) {
    if (sync_mode < 0) {
        const char *v = getenv("FP8MOE_SYNC");
        sync_mode = v && strcmp(v, "0") != 0;
    }
    return sync_mode == 1;
}

int fm_cuda_device_attr(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    FM_CUDA_CHECK(cudaGetDevice(&dev));
    FM_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}

void fm_cuda_launch_check(const char *kernel, const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && fm_cuda_debug_mode()) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "fp8moe: CUDA error in kernel %s (launched at %s:%d): %s\n", kernel, file, line,
                cudaGetErrorString(e));
        abort();
    }
}

void fm_cuda_launch_pdl(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void **args, bool pdl) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = pdl ? &attr : NULL, cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelExC(&cfg, fn, args); /* a failure is the last error: the caller's FM_LAUNCH_CHECK reports it */
}
