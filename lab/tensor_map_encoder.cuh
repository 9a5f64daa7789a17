// The driver's tensor-map encoder (cuTensorMapEncodeTiled), reached through the runtime so that the lab programs need
// no -lcuda; shared by lab/gemm_w8a8.cu and lab/w4a8_ws.cu (the engine's attention_wgmma.cu has its own).
#ifndef LAB_TENSOR_MAP_ENCODER_CUH
#define LAB_TENSOR_MAP_ENCODER_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn encoder(void) {
    static encode_tiled_fn fn = NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        FM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) {
            fprintf(stderr, "lab: the CUDA driver has no cuTensorMapEncodeTiled\n");
            abort();
        }
        fn = (encode_tiled_fn)p;
    }
    return fn;
}

#endif
