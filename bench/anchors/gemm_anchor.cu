// GEMM-only routes for bench gemm (gemm_anchor.cuh).
#include <string.h>

#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/linear_w8a8.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_w4a8.cuh"
#include "backend/w4a8_workspace.h"
#include "gemm_anchor.cuh"

struct fm_gemm_only {
    cuda_backend *be;
    fm_gemm_only_kind kind;
    const fm_bank *w;
    int64_t M;
    uint8_t *x8;    // quantized x
    float *xs;      // its scale(s): one 16-byte slot (tensor), M (row-wise) or [groups][M] (W4A8)
    float *wscales; // LT_ROW: [n][rows] one scale per weight row
    fm_lt lt;       // LT_ROW: its own handle and shape
    fm_lt_gemm row_gemm;
    bool lt_ready, gemm_ready;
};

#define GO_CHECK(call, what)                                                                                           \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            cudaGetLastError();                                                                                        \
            return fm_fail(err, e_ == cudaErrorMemoryAllocation ? FM_ERR_NOMEM : FM_ERR_BACKEND, "bench gemm: %s: %s", \
                           what, cudaGetErrorString(e_));                                                              \
        }                                                                                                              \
    } while (0)

static fm_status prepare(fm_gemm_only *g, const __nv_bfloat16 *x, fm_error *err) {
    cuda_backend *be = g->be;
    const fm_bank *w = g->w;
    const int64_t M = g->M, K = w->cols;
    if (g->kind == FM_GEMM_ONLY_W4A8) {
        const int64_t Kp = (int64_t)fm_w4a8_pad128((uint64_t)K);
        GO_CHECK(cudaMalloc((void **)&g->x8, (size_t)(M * Kp)), "activations");
        GO_CHECK(cudaMalloc((void **)&g->xs, (size_t)(M * (Kp / 128)) * sizeof(float)), "activation scales");
        fm_cuda_quantize_e4m3_rows(x, M, K, g->x8, g->xs, NULL, M, fm_routes_pdl(&be->routes), be->stream);
        return FM_OK;
    }
    unsigned *scratch = NULL;
    const int64_t n_scales = g->kind == FM_GEMM_ONLY_LT_ROW ? (M + 3) / 4 * 4 : FM_LT_SCALE_SLOT;
    GO_CHECK(cudaMalloc((void **)&g->x8, (size_t)(M * w->ld)), "activations");
    GO_CHECK(cudaMalloc((void **)&g->xs, (size_t)n_scales * sizeof(float)), "activation scales");
    GO_CHECK(cudaMalloc((void **)&scratch, 2 * sizeof(unsigned)), "scratch");
    fm_cuda_w8a8_quantize_act(x, M, K, w->ld, g->x8, g->xs, scratch, be->lt->grid_sync, true,
                              fm_routes_pdl(&be->routes), fm_routes_w8a8_fused_elems(&be->routes), be->stream);
    GO_CHECK(cudaStreamSynchronize(be->stream), "quantizing the activations");
    cudaFree(scratch);
    if (g->kind != FM_GEMM_ONLY_LT_ROW) return FM_OK;

    // row-wise: the tensor scales copied to every row of both operands
    float s = 0.0f;
    float *host = (float *)malloc((size_t)(w->n * w->rows > M ? w->n * w->rows : M) * sizeof(float));
    float *tscale = (float *)malloc((size_t)w->n * FM_LT_SCALE_SLOT * sizeof(float));
    if (!host || !tscale) {
        free(host), free(tscale);
        return fm_fail(err, FM_ERR_NOMEM, "bench gemm: out of host memory");
    }
    cudaError_t e = cudaMemcpy(&s, g->xs, sizeof s, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < M; i++) host[i] = s;
    if (e == cudaSuccess) e = cudaMemcpy(g->xs, host, (size_t)M * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(tscale, w->tscale, (size_t)w->n * FM_LT_SCALE_SLOT * sizeof(float), cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < w->n * w->rows; i++) host[i] = tscale[(i / w->rows) * FM_LT_SCALE_SLOT];
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->wscales, (size_t)(w->n * w->rows) * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemcpy(g->wscales, host, (size_t)(w->n * w->rows) * sizeof(float), cudaMemcpyHostToDevice);
    free(host), free(tscale);
    GO_CHECK(e, "row-wise scales");
    fm_status st = fm_lt_init(&g->lt, err);
    g->lt_ready = st == FM_OK;
    if (!st) st = fm_lt_gemm_init(&g->row_gemm, w->rows, w->ld, err);
    g->gemm_ready = st == FM_OK;
    if (!st) st = fm_lt_gemm_set_rowwise(&g->row_gemm, err);
    if (st) return fm_fail(err, FM_ERR_UNSUPPORTED, "%s", err->msg);
    if (w->rows % 4) return fm_fail(err, FM_ERR_UNSUPPORTED, "row-wise scales need rows %% 4 == 0 (16-byte aligned)");
    return FM_OK;
}

extern "C" fm_status fm_gemm_only_create(fm_backend *bb, fm_gemm_only_kind kind, const fm_bank *w, const void *x,
                                         int64_t M, fm_gemm_only **out, fm_error *err) {
    *out = NULL;
    if (strcmp(bb->ops->name, "cuda") != 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "GEMM-only routes need the cuda backend, not %s", bb->ops->name);
    const fm_wformat want = kind == FM_GEMM_ONLY_W4A8 ? FM_W_INT4_G128_TC : FM_W_E4M3_PT;
    if (w->fmt != want)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "this GEMM-only route wants a %s bank, got %s", fm_wformat_name(want),
                       fm_wformat_name(w->fmt));
    if (M < 1 || M > INT32_MAX) return fm_fail(err, FM_ERR_USAGE, "bench gemm: %lld rows", (long long)M);
    fm_gemm_only *g = (fm_gemm_only *)calloc(1, sizeof *g);
    if (!g) return fm_fail(err, FM_ERR_NOMEM, "bench gemm: out of host memory");
    g->be = cuda_be(bb), g->kind = kind, g->w = w, g->M = M;
    const fm_status st = prepare(g, (const __nv_bfloat16 *)x, err);
    if (st) {
        fm_gemm_only_free(g);
        return st;
    }
    *out = g;
    return FM_OK;
}

extern "C" fm_status fm_gemm_only_run(fm_gemm_only *g, int32_t idx, void *y, fm_error *err) {
    const fm_bank *w = g->w;
    cuda_backend *be = g->be;
    __nv_bfloat16 *yb = (__nv_bfloat16 *)y;
    const uint8_t *A = (const uint8_t *)w->w + (int64_t)idx * w->rows * w->ld;
    switch (g->kind) {
    case FM_GEMM_ONLY_LT_TENSOR:
        return fm_lt_gemm_run(be->lt, w->lt_gemm, A, w->tscale + (int64_t)idx * FM_LT_SCALE_SLOT, g->x8, g->xs,
                              (int)g->M, yb, be->stream, "bench gemm (per-tensor)", err);
    case FM_GEMM_ONLY_LT_ROW:
        return fm_lt_gemm_run(&g->lt, &g->row_gemm, A, g->wscales + (int64_t)idx * w->rows, g->x8, g->xs, (int)g->M, yb,
                              be->stream, "bench gemm (row-wise)", err);
    case FM_GEMM_ONLY_W8A8: fm_cuda_w8a8_gemm(be, w, idx, g->x8, g->xs, g->M, yb); return FM_OK;
    case FM_GEMM_ONLY_W4A8: fm_cuda_w4a8_linear_gemm(be, w, idx, g->x8, g->xs, NULL, g->M, yb); return FM_OK;
    }
    return fm_fail(err, FM_ERR_USAGE, "bench gemm: unknown route %d", (int)g->kind);
}

extern "C" void fm_gemm_only_free(fm_gemm_only *g) {
    if (!g) return;
    if (g->gemm_ready) fm_lt_gemm_destroy(&g->row_gemm);
    if (g->lt_ready) fm_lt_destroy(&g->lt);
    cudaFree(g->x8), cudaFree(g->xs), cudaFree(g->wscales);
    free(g);
}
