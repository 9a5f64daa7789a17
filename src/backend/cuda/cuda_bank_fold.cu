// Route w4a8.kernel=fold at load: an expert bank of int4-p2 weights moves its codes from the int4-tc layout into the
// fold GEMM's (backend/w4a8_fold.h; same bytes), once the scales are checked to have the int4-p2 form on every row.
// The scales stay where they are (the fold GEMM and GEMV read the int4-tc scale array); beside them the split the
// warp-specialised prefill GEMM reads (w4a8_fold_ws.cu): an exponent byte per (row, group) and an fp32 row scale per
// row, 1/64 + 1/(16 G) of the codes' bytes (the memory plan counts them: cuda_kind.c, cuda_workspace).
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/cuda/w4a8_gemm.cuh"

#include <stdlib.h>

extern "C" {
#include "backend/w4a8_fold.h"
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
    /* every row's scales: [n][G][rows_pad] bf16, split into the warp-specialised kernel's exponents and row
       scales (w4a8_fold_ws.cu) as they are checked */
    const int64_t G = w->n_groups, rp = w->rows_pad, ns = (int64_t)w->n * G * rp, nr = (int64_t)w->n * rp;
    uint16_t *hs = (uint16_t *)malloc((size_t)ns * 2);
    int8_t *hj = (int8_t *)malloc((size_t)ns);
    float *hr = (float *)malloc((size_t)nr * sizeof(float));
    if (!hs || !hj || !hr) {
        free(hs), free(hj), free(hr);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of host memory checking its scales", src->label);
    }
    FM_CUDA_CHECK(cudaMemcpyAsync(hs, w->scales, (size_t)ns * 2, cudaMemcpyDeviceToHost, be->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    int32_t bad_m = -1;
    int64_t bad_r = -1;
    const bool p2 = fm_w4a8_fold_split_scales(hs, w->n, w->rows, rp, G, hj, hr, &bad_m, &bad_r);
    free(hs);
    if (!p2) {
        free(hj), free(hr);
        if (bad_m < 0) return fm_fail(err, FM_ERR_NOMEM, "%s: out of host memory checking its scales", src->label);
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: route w4a8.kernel=fold needs int4-p2 scales (each row's group scales a power of two "
                       "under its largest, docs/int4_p2.md), and matrix %d row %lld has others: load float weights "
                       "with --int4-scales p2, or a checkpoint made by `fp8moe requantize --scales p2`",
                       src->label, bad_m, (long long)bad_r);
    }
    if (cudaMalloc((void **)&w->fold_j, (size_t)ns) != cudaSuccess ||
        cudaMalloc((void **)&w->fold_rs, (size_t)nr * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        free(hj), free(hr);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for its %lld exponents and row scales", src->label,
                       (long long)(ns + 4 * nr)); /* the caller frees the bank */
    }
    FM_CUDA_CHECK(cudaMemcpy(w->fold_j, hj, (size_t)ns, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(w->fold_rs, hr, (size_t)nr * sizeof(float), cudaMemcpyHostToDevice));
    free(hj), free(hr);
    w->bytes += (size_t)(ns + 4 * nr);
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
