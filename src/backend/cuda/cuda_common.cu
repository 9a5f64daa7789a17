// Launch checking for every kernel of the CUDA backend (see cuda_common.cuh).
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

static int sync_mode = -1; // -1: not read yet; FP8MOE_SYNC=1 synchronises after every launch

bool fm_cuda_debug_mode(void) {
    if (sync_mode < 0) {
        const char *v = getenv("FP8MOE_SYNC");
        sync_mode     = v && strcmp(v, "0") != 0;
    }
    return sync_mode == 1;
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
