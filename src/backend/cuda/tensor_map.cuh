// The driver's tensor-map encoder (cuTensorMapEncodeTiled), reached through the runtime so that nothing links -lcuda:
// the TMA kernels' maps (attention_wgmma.cu, w4a8_fold_ws.cu; lab/gemm_w8a8.cu and lab/w4a8_ws.cu). A driver
// without it aborts naming `who` (the kernels that need it run on sm_90 only, where every supported driver has it).
#ifndef FM_CUDA_TENSOR_MAP_CUH
#define FM_CUDA_TENSOR_MAP_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

typedef CUresult (*fm_tensor_map_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                            const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                            CUtensorMapFloatOOBfill);

static inline fm_tensor_map_encode_fn fm_tensor_map_encoder(const char *who) {
    static fm_tensor_map_encode_fn fn = NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        FM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) {
            fprintf(stderr, "fp8moe: the CUDA driver has no cuTensorMapEncodeTiled (needed by %s)\n", who);
            abort();
        }
        fn = (fm_tensor_map_encode_fn)p;
    }
    return fn;
}

#endif
