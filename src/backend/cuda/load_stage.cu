// The load's two pinned staging buffers (see load_stage.cuh).
#include "backend/cuda/load_stage.cuh"

extern "C" {
#include "util/status.h"
}

// unchecked, as the backend's other teardown: it also runs from destroy, after a fault
void fm_cuda_load_stage_free(cuda_backend *be) {
    for (int b = 0; b < 2; b++) {
        if (be->load_copied[b]) cudaEventSynchronize(be->load_copied[b]);
        if (be->load_stage[b]) cudaFreeHost(be->load_stage[b]);
        if (be->load_copied[b]) cudaEventDestroy(be->load_copied[b]);
        be->load_stage[b] = NULL, be->load_copied[b] = NULL;
    }
    be->load_stage_bytes = 0;
}

fm_status fm_cuda_load_stage(cuda_backend *be, size_t bytes, fm_error *err) {
    if (be->load_stage[0] && be->load_stage_bytes >= bytes) return FM_OK;
    fm_cuda_load_stage_free(be);
    const size_t want = bytes > FM_LOAD_STAGE_MIN ? bytes : FM_LOAD_STAGE_MIN;
    for (int b = 0; b < 2; b++)
        if (cudaMallocHost(&be->load_stage[b], want) != cudaSuccess ||
            cudaEventCreateWithFlags(&be->load_copied[b], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError(); // clear the sticky allocation error
            fm_cuda_load_stage_free(be);
            return fm_fail(err, FM_ERR_NOMEM, "out of pinned host memory for the load's staging (2 x %zu bytes)", want);
        }
    be->load_stage_bytes = want;
    return FM_OK;
}

void *fm_cuda_load_stage_take(cuda_backend *be, int b) {
    FM_CUDA_CHECK(cudaEventSynchronize(be->load_copied[b])); // a never recorded event is complete
    return be->load_stage[b];
}

void fm_cuda_load_stage_send(cuda_backend *be, int b, size_t offset, void *dev, size_t bytes) {
    FM_CUDA_CHECK(
        cudaMemcpyAsync(dev, (const char *)be->load_stage[b] + offset, bytes, cudaMemcpyHostToDevice, be->stream));
    FM_CUDA_CHECK(cudaEventRecord(be->load_copied[b], be->stream));
}
