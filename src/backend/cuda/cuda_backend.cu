// The CUDA backend's op table (see src/backend/backend.h): bf16 activations in device memory, one stream,
// every launch checked (cuda_common.cuh). Presets here: ref (bf16 weights, the bf16 reference) and int4
// (w4a16, per-token expert dispatch), fp8 (W4A8: int4-tc banks, e4m3 1x128 activations, the grouped expert
// kernel and W4A8 dense projections). fp4 (MXFP4 dispatch) has no GPU kernel yet: asking for it is a clear
// error, never a silent fallback. ref32 (fp32 throughout) gets the oracle's op table, cuda_oracle.cu.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/linear.cuh"
#include "backend/cuda/linear_w8a8.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"
#include "backend/cuda/moe_per_token.cuh"
#include "backend/cuda/moe_w4a8.cuh"
#include "backend/cuda/quantize.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/w4a8_gemm.cuh"
#include "backend/routes.h"

extern "C" {
#include "util/status.h"
}

typedef __nv_bfloat16 bf16;

void *fm_cuda_workspace(cuda_backend *be, size_t bytes) {
    if (bytes > be->work_bytes) {
        if (be->work) FM_CUDA_CHECK(cudaFree(be->work)); /* cudaFree waits for the kernels still using it */
        FM_CUDA_CHECK(cudaMalloc(&be->work, bytes));
        be->work_bytes = bytes;
    }
    return be->work;
}

void fm_cu_mark(fm_backend *bb, int32_t slot) {
    cuda_backend *be = cuda_be(bb);
    if (!be->marks) {
        be->marks = (cudaEvent_t *)calloc(FM_MARK_SLOTS, sizeof(cudaEvent_t));
        if (!be->marks) abort();
        for (int i = 0; i < FM_MARK_SLOTS; i++) FM_CUDA_CHECK(cudaEventCreate(&be->marks[i]));
    }
    FM_CUDA_CHECK(cudaEventRecord(be->marks[slot], be->stream));
}

double fm_cu_elapsed_ms(fm_backend *bb, int32_t a, int32_t b) {
    float ms = 0.0f;
    FM_CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_be(bb)->marks[a], cuda_be(bb)->marks[b]));
    return ms;
}

const char *fm_cu_device_name(fm_backend *bb) { return cuda_be(bb)->device_label; }

void fm_cu_destroy(fm_backend *bb) {
    cuda_backend *be = cuda_be(bb);
    if (be->marks) {
        for (int i = 0; i < FM_MARK_SLOTS; i++) cudaEventDestroy(be->marks[i]);
        free(be->marks);
    }
    if (be->work) cudaFree(be->work);
    if (be->lt) fm_lt_destroy(be->lt), free(be->lt);
    if (be->cublas) cublasDestroy(be->cublas);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
}

void *fm_cu_alloc(fm_backend *bb, size_t bytes) {
    (void)bb;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

void fm_cu_free(fm_backend *bb, void *p) {
    (void)bb;
    FM_CUDA_CHECK(cudaFree(p));
}

void fm_cu_upload_ids(fm_backend *bb, const int32_t *ids, int64_t n, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, ids, (size_t)n * sizeof *ids, cudaMemcpyHostToDevice, cuda_be(bb)->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(cuda_be(bb)->stream)); /* ids is the caller's memory */
}

static void cu_download_f32(fm_backend *bb, const void *src, int64_t n, float *dst) {
    cuda_backend *be = cuda_be(bb);
    float *tmp = NULL;
    FM_CUDA_CHECK(cudaMalloc(&tmp, (size_t)(n ? n : 1) * sizeof(float)));
    fm_cuda_bf16_to_f32((const bf16 *)src, n, tmp, be->stream);
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, be->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    FM_CUDA_CHECK(cudaFree(tmp));
}

static void cu_upload_f32(fm_backend *bb, const float *src, int64_t n, void *dst) {
    cuda_backend *be = cuda_be(bb);
    void *tmp = NULL;
    FM_CUDA_CHECK(cudaMalloc(&tmp, (size_t)(n ? n : 1) * sizeof(float)));
    FM_CUDA_CHECK(cudaMemcpyAsync(tmp, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, be->stream));
    fm_cuda_convert_bf16(tmp, 0 /* F32 */, 1, n, (bf16 *)dst, n, be->stream);
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    FM_CUDA_CHECK(cudaFree(tmp));
}

void fm_cu_download_raw(fm_backend *bb, const void *src, size_t bytes, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_be(bb)->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(cuda_be(bb)->stream));
}

fm_status fm_cu_sync(fm_backend *bb, fm_error *err) {
    cudaError_t e = cudaStreamSynchronize(cuda_be(bb)->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? FM_OK : fm_fail(err, FM_ERR_BACKEND, "cuda backend: %s", cudaGetErrorString(e));
}

static void cu_embed(fm_backend *bb, const fm_bank *table, const void *ids, int64_t T, void *out) {
    fm_cuda_embed(bank_bf16(table, 0), table->ld, (const int32_t *)ids, T, table->cols, (bf16 *)out, cuda_be(bb)->stream);
}

static void cu_rmsnorm(fm_backend *bb, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps, void *out) {
    fm_cuda_rmsnorm((const bf16 *)x, bank_bf16(w, 0), rows, dim, eps, (bf16 *)out, cuda_be(bb)->stream);
}

/* the activation format each bank format takes (the plans the backend accepts) */
static fm_afmt afmt_for(fm_wformat f) {
    return fm_cuda_w4a8_takes(f) ? FM_A_E4M3_G128 : f == FM_W_E4M3_PT ? FM_A_E4M3_PT : FM_A_NATIVE;
}

static void require_afmt(const fm_bank *w, fm_afmt afmt, const char *op) {
    const fm_afmt want = afmt_for(w->fmt);
    if (afmt != want) {
        fprintf(stderr, "fp8moe: cuda %s: %s weights with %s activations are not implemented on the GPU\n", op,
                fm_wformat_name(w->fmt), fm_afmt_name(afmt));
        abort(); /* unreachable: the backend refuses such plans at creation */
    }
}

static void cu_linear(fm_backend *bb, const fm_bank *w, int32_t idx, const void *x, int64_t M, fm_afmt afmt, void *y) {
    require_afmt(w, afmt, "linear");
    if (fm_cuda_w4a8_takes(w->fmt)) fm_cuda_linear_w4a8(cuda_be(bb), w, idx, (const bf16 *)x, M, (bf16 *)y);
    else if (w->fmt == FM_W_E4M3_PT) fm_cuda_linear_w8a8(cuda_be(bb), w, idx, (const bf16 *)x, M, (bf16 *)y);
    else fm_cuda_linear(cuda_be(bb), w, idx, x, M, y);
}

static void cu_qk_norm_rope(fm_backend *bb, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, double theta) {
    fm_cuda_qk_norm_rope((bf16 *)qkv, T, nh, nkv, hd, q_norm ? bank_bf16(q_norm, 0) : NULL,
                         k_norm ? bank_bf16(k_norm, 0) : NULL, eps, pos0, theta, cuda_be(bb)->stream);
}

static void cu_attention(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *out) {
    fm_cuda_attention((const bf16 *)qkv, T, nh, nkv, hd, (bf16 *)out, cuda_be(bb)->stream);
}

static void cu_route(fm_backend *bb, const void *logits, int64_t T, int32_t E, int32_t k, fm_router_kind kind,
                     bool norm_topk, void *ids, void *weights) {
    fm_cuda_route((const bf16 *)logits, T, E, k, kind == FM_ROUTER_SOFTMAX_TOPK, norm_topk, (int32_t *)ids,
                  (bf16 *)weights, cuda_be(bb)->stream);
}

static void cu_moe(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                   const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *out) {
    require_afmt(gate_up, a_dispatch, "moe");
    require_afmt(down, a_down, "moe");
    /* bf16 banks (ref): grouped GEMMs through cuBLAS; int4-tc, int4-zp-tc, e4m3-block (fp8): the grouped W4A8
       kernels; int4, int4-zp: the per-token W4A16 baseline */
    if (fm_cuda_w4a8_takes(gate_up->fmt))
        fm_cuda_moe_w4a8(cuda_be(bb), gate_up, down, (const bf16 *)x, T, (const int32_t *)ids, (const bf16 *)weights, k,
                         (bf16 *)out);
    else if (gate_up->fmt == FM_W_BF16 && down->fmt == FM_W_BF16)
        fm_cuda_moe_grouped_cublas(cuda_be(bb), gate_up, down, x, T, (const int32_t *)ids, weights, k, out);
    else
        fm_cuda_moe_per_token(cuda_be(bb), gate_up, down, (const bf16 *)x, T, (const int32_t *)ids,
                              (const bf16 *)weights, k, (bf16 *)out);
}

static void cu_swiglu(fm_backend *bb, const void *gu, int64_t rows, int64_t I, void *out) {
    fm_cuda_swiglu((const bf16 *)gu, rows, I, (bf16 *)out, cuda_be(bb)->stream);
}

static void cu_add(fm_backend *bb, void *acc, const void *x, int64_t n) {
    fm_cuda_add((bf16 *)acc, (const bf16 *)x, n, cuda_be(bb)->stream);
}

static const fm_backend_ops cuda_ops = {
    .name         = "cuda",
    .act_size     = sizeof(bf16),
    FM_CUDA_SHARED_OPS_HEAD,
    .download_f32 = cu_download_f32,
    .upload_f32   = cu_upload_f32,
    FM_CUDA_SHARED_OPS_TAIL,
    .embed        = cu_embed,
    .rmsnorm      = cu_rmsnorm,
    .linear       = cu_linear,
    .qk_norm_rope = cu_qk_norm_rope,
    .attention    = cu_attention,
    .route        = cu_route,
    .moe          = cu_moe,
    .swiglu       = cu_swiglu,
    .add          = cu_add,
};

extern "C" fm_status fm_cuda_backend_create(const fm_plan *plan, const char *routes, fm_backend **out, fm_error *err) {
    *out      = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: no usable GPU (%s); use --backend cpu",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    /* what the kernels cover: native bf16 activations with bf16/int4 weights, e4m3 1x128 with int4-tc weights;
       or the oracle's plan (fp32 throughout) */
    const bool    oracle   = fm_cuda_plan_is_oracle(plan);
    const bool    dense_ok = plan->a_dense == afmt_for(plan->w_dense);
    const fm_afmt want_e   = plan->w_expert == FM_W_INT4_G128_TC ? FM_A_E4M3_G128 : FM_A_NATIVE;
    if (!oracle && (!dense_ok || plan->a_dispatch != want_e || plan->a_expert != want_e || plan->w_other != FM_W_BF16 ||
                    !plan->act_bf16 || plan->w_dense == FM_W_F32 || plan->w_expert == FM_W_F32))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "cuda backend: preset %s (dense %s/%s, experts %s/%s/%s) has no GPU kernels; available on cuda: "
                       "ref, ref32, int4, fp8",
                       fm_preset_name(plan->preset), fm_wformat_name(plan->w_dense), fm_afmt_name(plan->a_dense),
                       fm_wformat_name(plan->w_expert), fm_afmt_name(plan->a_dispatch), fm_afmt_name(plan->a_expert));
    int           device = 0;
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDevice(&device));
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    /* the route table, once: the defaults for this GPU, then the caller's overrides (nothing reads it elsewhere) */
    fm_routes table;
    fm_routes_default(&table, prop.major);
    fm_status st = fm_routes_apply(&table, routes, err);
    if (st) return st;
    cuda_backend *be = (cuda_backend *)calloc(1, sizeof *be);
    if (!be) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    be->base.ops  = oracle ? &fm_cuda_oracle_ops : &cuda_ops;
    be->base.plan = *plan;
    be->device = device, be->prop = prop, be->routes = table;
    /* say which FP8 kernels the routes pick wherever the device is named: the W4A8 GEMM (wgmma on Hopper, mma.sync
       elsewhere) and, for FP8 dense projections, the decode GEMVs (mma.sync; PDL where the GPU has it) */
    const bool fp8_dense = plan->w_dense == FM_W_INT4_G128_TC || plan->w_dense == FM_W_E4M3_PT;
    char       dense[160] = "";
    if (fp8_dense)
        snprintf(dense, sizeof dense, ", decode GEMVs %s%s%s",
                 !fm_routes_gemv(&table) ? "off (route dense.gemv=off)" : "mma.sync m16n8k32 e4m3",
                 fm_routes_gemv(&table) && fm_routes_pdl(&table) ? " + PDL" : "",
                 plan->w_dense == FM_W_E4M3_PT ? ", W8A8 prefill cuBLASLt FP8" : "");
    if (plan->w_dense == FM_W_INT4_G128_TC || plan->w_expert == FM_W_INT4_G128_TC)
        snprintf(be->device_label, sizeof be->device_label, "%s, W4A8 kernel %s%s", be->prop.name,
                 fm_routes_w4a8_kernel_name(&table), dense);
    else
        snprintf(be->device_label, sizeof be->device_label, "%s%s", be->prop.name, dense);
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking));
    /* the oracle's SGEMMs stay fp32 even under NVIDIA_TF32_OVERRIDE=1 (pedantic: no TF32, no reduced precision) */
    if (cublasCreate(&be->cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(be->cublas, be->stream) != CUBLAS_STATUS_SUCCESS ||
        (oracle && cublasSetMathMode(be->cublas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)) {
        fm_cu_destroy(&be->base);
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cuBLAS initialisation failed");
    }
    *out = &be->base;
    return FM_OK;
}
