// Route w4a8.kernel=fold at load: an expert bank of int4-p2 weights moves its codes from the int4-tc layout into the
// fold GEMM's (backend/w4a8_fold.h; same bytes, so the memory plan is unchanged), once the scales are checked to have
// the int4-p2 form on every row. The scales stay where they are: the fold GEMM reads the int4-tc scale array.
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/cuda/w4a8_gemm.cuh"

#include <stdlib.h>

extern "C" {
#include "quant/bf16.h"
#include "quant/int4_p2.h"
#include "util/status.h"
}

fm_status fm_cuda_bank_fold(cuda_backend *be, const fm_bank_src *src, fm_bank *w, fm_error *err) {
    /* experts off the W4A8 GEMM (the int4 preset's GEMVs, bf16) do not take the route, as for its other values */
    if (!src->experts || !fm_routes_w4a8_fold(&be->routes) || !fm_cuda_w4a8_takes(w->fmt)) return FM_OK;
    if (w->fmt != FM_W_INT4_G128_TC)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: route w4a8.kernel=fold takes int4 experts with int4-p2 scales (the fp8 preset with "
                       "--int4-scales p2, or on a checkpoint made by `fp8moe requantize --scales p2`); this bank is %s",
                       src->label, fm_wformat_name(w->fmt));
    if (be->base.plan.a_dispatch != FM_A_E4M3_G128)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: route w4a8.kernel=fold reads e4m3 activations; --dispatch %s is not built for it: use "
                       "--dispatch fp8",
                       src->label, fm_afmt_name(be->base.plan.a_dispatch));
    /* every row's scales: [n][G][rows_pad] bf16 */
    const int64_t G = w->n_groups, rp = w->rows_pad, ns = (int64_t)w->n * G * rp;
    uint16_t *hs = (uint16_t *)malloc((size_t)ns * 2);
    float *row = (float *)malloc((size_t)G * sizeof(float));
    if (!hs || !row) {
        free(hs), free(row);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of host memory checking its scales", src->label);
    }
    FM_CUDA_CHECK(cudaMemcpyAsync(hs, w->scales, (size_t)ns * 2, cudaMemcpyDeviceToHost, be->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    int32_t bad_m = -1;
    int64_t bad_r = -1;
    for (int32_t m = 0; m < w->n && bad_m < 0; m++)
        for (int64_t r = 0; r < w->rows && bad_m < 0; r++) {
            for (int64_t g = 0; g < G; g++) row[g] = fm_bf16_to_f32(hs[((int64_t)m * G + g) * rp + r]);
            if (!fm_int4_p2_split(row, G, NULL, NULL)) bad_m = m, bad_r = r;
        }
    free(hs), free(row);
    if (bad_m >= 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: route w4a8.kernel=fold needs int4-p2 scales (each row's group scales a power of two "
                       "under its largest, docs/int4_p2.md), and matrix %d row %lld has others: load float weights "
                       "with --int4-scales p2, or a checkpoint made by `fp8moe requantize --scales p2`",
                       src->label, bad_m, (long long)bad_r);
    const size_t bytes = (size_t)(w->n * rp * G * 64);
    uint8_t *codes = NULL;
    if (cudaMalloc((void **)&codes, bytes) != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory repacking %zu bytes of int4 codes", src->label, bytes);
    }
    fm_cuda_repack_tc_to_fold((const uint8_t *)w->w, w->n, rp, G, codes, be->stream);
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    FM_CUDA_CHECK(cudaFree(w->w));
    w->w = codes, w->fold = true;
    return FM_OK;
}
