// The CUDA backend's op table (see src/backend/backend.h): one table, each op written once and dispatching on
// the backend's activation type to kernels instantiated for both: bf16 activations for the compute presets, fp32
// for the ref32 plan. One stream, every launch checked (cuda_common.cuh). Presets here: ref (bf16 weights, the
// bf16 reference) and int4 (w4a16, per-token expert dispatch), fp8 (W4A8: int4-tc banks, e4m3 1x128 activations,
// the grouped expert kernel and W4A8 dense projections), fp4 (fp8 with an MXFP4 dispatch buffer; --dispatch
// mxfp4|nvfp4 on fp8: the gate|up GEMM expands E2M1 to e4m3 on chip, w4a8_gemm.cu), and ref32. A bf16 dispatch on
// fp8 (another GEMM: bf16 activations into the int4 experts) is refused by name, never a silent fallback.
//
// ref32, the oracle on the GPU: fp32 weights and activations, fp32 arithmetic. It computes what the CPU reference
// computes, with different summation orders only, and exists so that models too large for the CPU (Qwen3-30B-A3B:
// 122 GB of fp32 weights, ~10 s per layer per prompt on the CPU) can be judged against fp32 at full depth on one
// H200. Its routes: SGEMM through cuBLAS in pedantic math mode (linear.cu), the grouped cuBLAS MoE with fp32 groups
// (moe_grouped_cublas.cu), the element-wise kernels instantiated for fp32 (elementwise.cu, rope.cu, router.cu), and
// a plain fp32 attention kernel (attention_f32.cu). Speed is not a goal there.
//
// Graph safety: no op allocates or synchronises the host. The scratch and cuBLAS's workspace are reserved once at
// load (cu_reserve, for the memory plan's shapes); the debug switches (FP8MOE_SYNC, and FP8MOE_DUMP in the engine)
// do synchronise, and are not for capture.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_f32.cuh"
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/load_stage.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gated_attention.cuh"
#include "backend/cuda/gdn.cuh"
#include "backend/cuda/attn_decode_block.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/kv_store.cuh"
#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/linear.cuh"
#include "backend/cuda/linear_w8a8.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"
#include "backend/cuda/expert_cache.cuh"
#include "backend/cuda/moe_decode_block.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_per_token.cuh"
#include "backend/cuda/moe_w4a8.cuh"
#include "backend/ep_blocks.h"
#include "backend/cuda/quantize.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/sampler.cuh"
#include "backend/cuda/w4a8_gemm.cuh"
#include "backend/routes.h"

extern "C" {
#include "quant/bf16.h"
#include "util/status.h"
}

#include <nvtx3/nvToolsExt.h> /* header-only (NVTX v3): cu_range */

typedef __nv_bfloat16 bf16;

void *fm_cuda_workspace(cuda_backend *be, size_t bytes) {
    if (bytes <= be->work_bytes) return be->work;
    if (be->work_fixed) {
        fprintf(
            stderr,
            "fp8moe: cuda workspace: an op asked for %zu bytes of scratch, the load reserved %zu for the "
            "memory plan's shapes; the plan (src/backend/cuda/cuda_kind.c, cuda_workspace) does not count this op at "
            "this shape: a bug\n",
            bytes, be->work_bytes);
        abort();
    }
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FM_CUDA_CHECK(cudaStreamIsCapturing(be->stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
        fprintf(stderr,
                "fp8moe: cuda workspace: %zu bytes asked during a stream capture with %zu reserved; reserve "
                "the workspace first (ops->reserve)\n",
                bytes, be->work_bytes);
        abort();
    }
    /* a backend without a reservation (op tests, kernel benchmarks): grow; cudaFree waits for the kernels using it */
    if (be->work) FM_CUDA_CHECK(cudaFree(be->work));
    FM_CUDA_CHECK(cudaMalloc(&be->work, bytes));
    be->work_bytes = bytes;
    return be->work;
}

/* True when the plan is the ref32 oracle's: fp32 weights everywhere, activations not rounded. */
static bool plan_is_oracle(const fm_plan *p) {
    return !p->act_bf16 && p->w_dense == FM_W_F32 && p->w_expert == FM_W_F32 && p->w_other == FM_W_F32 &&
           p->a_dense == FM_A_NATIVE && p->a_dispatch == FM_A_NATIVE && p->a_expert == FM_A_NATIVE;
}

static cudaStream_t stream(fm_backend *bb) { return cuda_be(bb)->stream; }
/* fp32 activations (ref32) or bf16: what every op below dispatches on */
static bool f32(fm_backend *bb) { return cuda_be(bb)->f32; }

/* route pdl: the decode ops' kernels launched with programmatic dependent launch (pdl.cuh) */
static bool pdl(fm_backend *bb) { return fm_routes_pdl(&cuda_be(bb)->routes); }

static void cu_mark(fm_backend *bb, int32_t slot) {
    cuda_backend *be = cuda_be(bb);
    if (!be->marks) {
        be->marks = (cudaEvent_t *)calloc(FM_MARK_SLOTS, sizeof(cudaEvent_t));
        if (!be->marks) abort();
        for (int i = 0; i < FM_MARK_SLOTS; i++) FM_CUDA_CHECK(cudaEventCreate(&be->marks[i]));
    }
    FM_CUDA_CHECK(cudaEventRecord(be->marks[slot], be->stream));
}

static void cu_range(fm_backend *bb, const char *name) {
    (void)bb;
    if (name) nvtxRangePushA(name);
    else nvtxRangePop();
}

static double cu_elapsed_ms(fm_backend *bb, int32_t a, int32_t b) {
    float ms = 0.0f;
    FM_CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_be(bb)->marks[a], cuda_be(bb)->marks[b]));
    return ms;
}

static const char *cu_device_name(fm_backend *bb) { return cuda_be(bb)->device_label; }

static void cu_destroy(fm_backend *bb) {
    cuda_backend *be = cuda_be(bb);
    if (be->marks) {
        for (int i = 0; i < FM_MARK_SLOTS; i++) cudaEventDestroy(be->marks[i]);
        free(be->marks);
    }
    if (be->work) cudaFree(be->work);
    if (be->lt) fm_lt_destroy(be->lt), free(be->lt);
    if (be->cublas) cublasDestroy(be->cublas);
    if (be->cublas_ws) cudaFree(be->cublas_ws);
    if (be->router_counter) cudaFree(be->router_counter);
    if (be->sample_ws) cudaFree(be->sample_ws);
    if (be->tail_counter) cudaFree(be->tail_counter);
    if (be->gdn_arrivals) cudaFree(be->gdn_arrivals);
    if (be->block_barrier) cudaFree(be->block_barrier);
    if (be->block_counts) cudaFree(be->block_counts);
    if (be->side_cublas) cublasDestroy(be->side_cublas);
    if (be->side_cublas_ws) cudaFree(be->side_cublas_ws);
    if (be->side_work) cudaFree(be->side_work);
    if (be->side_fork) cudaEventDestroy(be->side_fork);
    if (be->side_done) cudaEventDestroy(be->side_done);
    if (be->side_stream) cudaStreamDestroy(be->side_stream);
    fm_cuda_load_stage_free(be);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
}

static void *cu_alloc(fm_backend *bb, size_t bytes) {
    (void)bb;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(fm_backend *bb, void *p) {
    (void)bb;
    FM_CUDA_CHECK(cudaFree(p));
}

/* Scratch for the plan's shapes and cuBLAS's workspace, once, before the first forward pass: after this no op
   allocates (fm_cuda_workspace refuses to grow). cublasSetStream resets cuBLAS to its default workspace pool, so
   the workspace is given after the stream. */
/* The side stream: its own stream, events, cuBLAS handle (a handle is bound to one stream and one workspace) and
   scratch (the quantized linears' input buffers: the main stream's moe op uses the main scratch meanwhile). */
static fm_status reserve_side(cuda_backend *be, size_t bytes, fm_error *err) {
    if (cudaStreamCreateWithFlags(&be->side_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&be->side_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&be->side_done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: could not create the side stream and its events");
    }
    if (cudaMalloc(&be->side_work, bytes) != cudaSuccess ||
        cudaMalloc(&be->side_cublas_ws, FM_CUDA_SIDE_CUBLAS_WS) != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_NOMEM, "out of cuda memory for the side stream's scratch (%zu + %zu bytes)", bytes,
                       FM_CUDA_SIDE_CUBLAS_WS);
    }
    be->side_work_bytes = bytes;
    if (cublasCreate(&be->side_cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(be->side_cublas, be->side_stream) != CUBLAS_STATUS_SUCCESS ||
        (plan_is_oracle(&be->base.plan) &&
         cublasSetMathMode(be->side_cublas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) ||
        cublasSetWorkspace(be->side_cublas, be->side_cublas_ws, FM_CUDA_SIDE_CUBLAS_WS) != CUBLAS_STATUS_SUCCESS)
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cuBLAS initialisation of the side stream failed");
    return FM_OK;
}

static void swap_side(cuda_backend *be) {
    cudaStream_t s = be->stream;
    be->stream = be->side_stream, be->side_stream = s;
    cublasHandle_t h = be->cublas;
    be->cublas = be->side_cublas, be->side_cublas = h;
    void *w = be->work;
    be->work = be->side_work, be->side_work = w;
    size_t n = be->work_bytes;
    be->work_bytes = be->side_work_bytes, be->side_work_bytes = n;
    be->in_side = !be->in_side;
}

static void cu_side_begin(fm_backend *bb) {
    cuda_backend *be = cuda_be(bb);
    if (!be->side_stream || be->in_side) return;
    FM_CUDA_CHECK(cudaEventRecord(be->side_fork, be->stream));
    FM_CUDA_CHECK(cudaStreamWaitEvent(be->side_stream, be->side_fork, 0));
    swap_side(be);
}

static void cu_side_end(fm_backend *bb) {
    cuda_backend *be = cuda_be(bb);
    if (!be->in_side) return;
    FM_CUDA_CHECK(cudaEventRecord(be->side_done, be->stream));
    swap_side(be);
}

static void cu_side_join(fm_backend *bb) {
    cuda_backend *be = cuda_be(bb);
    if (!be->side_stream || be->in_side) return;
    FM_CUDA_CHECK(cudaStreamWaitEvent(be->stream, be->side_done, 0));
}

static fm_status cu_reserve(fm_backend *bb, size_t workspace, size_t side_workspace, fm_error *err) {
    cuda_backend *be = cuda_be(bb);
    if (be->work_fixed) return fm_fail(err, FM_ERR_USAGE, "cuda backend: the workspace is already reserved");
    fm_cuda_load_stage_free(be); /* the load is over: its pinned staging goes back to the host */
    if (side_workspace > 0) {
        fm_status st = reserve_side(be, side_workspace, err);
        if (st) return st;
    }
    if (workspace > be->work_bytes) {
        if (be->work) FM_CUDA_CHECK(cudaFree(be->work));
        be->work = NULL, be->work_bytes = 0;
        if (cudaMalloc(&be->work, workspace) != cudaSuccess) {
            cudaGetLastError();
            be->work = NULL;
            return fm_fail(err, FM_ERR_NOMEM,
                           "out of cuda memory for the ops' workspace (%zu bytes, the memory plan's)", workspace);
        }
        be->work_bytes = workspace;
    }
    if (!be->cublas_ws) {
        if (cudaMalloc(&be->cublas_ws, FM_CUDA_CUBLAS_WS) != cudaSuccess) {
            cudaGetLastError();
            be->cublas_ws = NULL;
            return fm_fail(err, FM_ERR_NOMEM, "out of cuda memory for cuBLAS's workspace (%zu bytes)",
                           FM_CUDA_CUBLAS_WS);
        }
        if (cublasSetWorkspace(be->cublas, be->cublas_ws, FM_CUDA_CUBLAS_WS) != CUBLAS_STATUS_SUCCESS)
            return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cublasSetWorkspace failed");
    }
    be->work_fixed = true;
    return FM_OK;
}

/* The ids of a forward pass into their device buffer. A copy from pageable host memory returns once the source has
   been staged by the driver (CUDA's API synchronisation rules), so the caller may reuse ids at once; no sync. */
static void cu_upload_ids(fm_backend *bb, const int32_t *ids, int64_t n, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, ids, (size_t)n * sizeof *ids, cudaMemcpyHostToDevice, stream(bb)));
}

static void cu_upload_raw(fm_backend *bb, const void *src, size_t bytes, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                  stream(bb))); /* pageable: staged on return; pinned: read in stream order */
}

/* Pinned host memory: an upload from it is a DMA in stream order, so the host goes on while the stream runs. */
static void *cu_host_alloc(fm_backend *bb, size_t bytes) {
    (void)bb;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(fm_backend *bb, void *p) {
    (void)bb;
    if (p) FM_CUDA_CHECK(cudaFreeHost(p));
}

static void cu_copy(fm_backend *bb, const void *src, size_t bytes, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(bb)));
}

static void cu_copy_rows(fm_backend *bb, const void *src, size_t src_pitch, void *dst, size_t dst_pitch,
                         size_t row_bytes, size_t rows) {
    FM_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, stream(bb)));
}

static void cu_download_raw(fm_backend *bb, const void *src, size_t bytes, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(bb)));
    FM_CUDA_CHECK(cudaStreamSynchronize(stream(bb)));
}

/* Activations to fp32 on the host, with no device staging: fp32 as it is; bf16 copied into the upper half of dst
   and widened in place from the front (element i's 4 bytes end at or before element i + 1's bf16, exact). */
static void cu_download_f32(fm_backend *bb, const void *src, int64_t n, float *dst) {
    if (n <= 0) return;
    if (f32(bb)) {
        cu_download_raw(bb, src, (size_t)n * sizeof(float), dst);
        return;
    }
    unsigned char *h = (unsigned char *)dst + (size_t)n * sizeof(uint16_t); /* bytes only: the two views alias */
    cu_download_raw(bb, src, (size_t)n * sizeof(uint16_t), h);
    for (int64_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, h + (size_t)i * sizeof v, sizeof v);
        const uint32_t u = (uint32_t)v << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* Host fp32 into activations, rounded to bf16 on the host (round to nearest even, as the device does) */
static void cu_upload_f32(fm_backend *bb, const float *src, int64_t n, void *dst) {
    if (n <= 0) return;
    if (f32(bb)) {
        FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream(bb)));
        FM_CUDA_CHECK(cudaStreamSynchronize(stream(bb))); /* src is the caller's memory */
        return;
    }
    uint16_t *h = (uint16_t *)malloc((size_t)n * sizeof *h);
    if (!h) {
        fprintf(stderr, "fp8moe: cuda upload: out of host memory (%lld values)\n", (long long)n);
        abort();
    }
    for (int64_t i = 0; i < n; i++) h[i] = fm_f32_to_bf16(src[i]);
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, h, (size_t)n * sizeof *h, cudaMemcpyHostToDevice, stream(bb)));
    FM_CUDA_CHECK(cudaStreamSynchronize(stream(bb)));
    free(h);
}

static fm_status cu_sync(fm_backend *bb, fm_error *err) {
    cudaError_t e = cudaStreamSynchronize(stream(bb));
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? FM_OK : fm_fail(err, FM_ERR_BACKEND, "cuda backend: %s", cudaGetErrorString(e));
}

static void cu_embed(fm_backend *bb, const fm_bank *table, const void *ids, int64_t T, void *out) {
    if (f32(bb))
        fm_cuda_embed_f32(bank_f32(table, 0), table->ld, (const int32_t *)ids, T, table->cols, (float *)out, pdl(bb),
                          stream(bb));
    else
        fm_cuda_embed(bank_bf16(table, 0), table->ld, (const int32_t *)ids, T, table->cols, (bf16 *)out, pdl(bb),
                      stream(bb));
}

static void cu_rmsnorm(fm_backend *bb, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps,
                       void *out) {
    if (f32(bb))
        fm_cuda_rmsnorm_f32((const float *)x, bank_f32(w, 0), rows, dim, eps, (float *)out, pdl(bb), stream(bb));
    else fm_cuda_rmsnorm((const bf16 *)x, bank_bf16(w, 0), rows, dim, eps, (bf16 *)out, pdl(bb), stream(bb));
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

/* bf16 and f32 banks (ref, ref32, and every plan's router and lm_head): cuBLAS in the bank's type; the int4 banks
   of the int4 preset: the W4A16 GEMV; int4-tc and pre-quantized tc banks: W4A8; e4m3-tensor: W8A8 */
static void cu_linear(fm_backend *bb, const fm_bank *w, int32_t idx, const void *x, int64_t M, fm_afmt afmt, void *y) {
    require_afmt(w, afmt, "linear");
    if (fm_cuda_w4a8_takes(w->fmt)) fm_cuda_linear_w4a8(cuda_be(bb), w, idx, (const bf16 *)x, M, (bf16 *)y);
    else if (w->fmt == FM_W_E4M3_PT) fm_cuda_linear_w8a8(cuda_be(bb), w, idx, (const bf16 *)x, M, (bf16 *)y);
    else fm_cuda_linear(cuda_be(bb), w, idx, x, M, y);
}

static void cu_qk_norm_rope(fm_backend *bb, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, const void *pos,
                            double theta) {
    if (f32(bb))
        fm_cuda_qk_norm_rope_f32((float *)qkv, T, nh, nkv, hd, q_norm ? bank_f32(q_norm, 0) : NULL,
                                 k_norm ? bank_f32(k_norm, 0) : NULL, eps, pos0, (const int32_t *)pos, theta, pdl(bb),
                                 stream(bb));
    else
        fm_cuda_qk_norm_rope((bf16 *)qkv, T, nh, nkv, hd, q_norm ? bank_bf16(q_norm, 0) : NULL,
                             k_norm ? bank_bf16(k_norm, 0) : NULL, eps, pos0, (const int32_t *)pos, theta, pdl(bb),
                             stream(bb));
}

/* bf16: the wgmma kernel on Hopper where the head dim has one (attention_wgmma.cu; route attention.kernel), else the
   flash-style mma.sync kernel (attention.cu); fp32: the plain kernel of the oracle (attention_f32.cu), which also
   takes bf16 head dims that are not a multiple of 16 (no tensor-core kernel has them: tiny test models only) */
static void cu_attention(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *out) {
    const cuda_backend *be = cuda_be(bb);
    if (f32(bb)) fm_cuda_attention_f32((const float *)qkv, T, nh, nkv, hd, (float *)out, stream(bb));
    else if (hd % 16 != 0) fm_cuda_attention_plain_bf16((const bf16 *)qkv, T, nh, nkv, hd, (bf16 *)out, stream(bb));
    else if (fm_routes_attention_wgmma(&be->routes, hd))
        fm_cuda_attention_wgmma((const bf16 *)qkv, T, nh, nkv, hd, (bf16 *)out, stream(bb));
    else fm_cuda_attention((const bf16 *)qkv, T, nh, nkv, hd, (bf16 *)out, stream(bb));
}

/* the e4m3 cache's forms exist for bf16 activations only (the engine refuses the others before) */
static void cu_kv_e4m3_refuse(fm_backend *bb, const char *op, fm_kv_dtype kv) {
    if (kv == FM_KV_E4M3 && f32(bb)) {
        fprintf(stderr, "fp8moe: cuda %s: the e4m3 KV cache needs bf16 activations (this backend's are fp32)\n", op);
        abort();
    }
}

static void cu_kv_store(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                        const void *slots, void *k_cache, void *v_cache, fm_kv_dtype kv) {
    cu_kv_e4m3_refuse(bb, "kv_store", kv);
    fm_cuda_kv_store(qkv, T, nh, nkv, hd, (int32_t)bb->ops->act_size, (const int32_t *)slots, k_cache, v_cache, kv,
                     pdl(bb), stream(bb));
}

static void cu_qk_norm_rope_store(fm_backend *bb, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                  const fm_bank *q_norm, const fm_bank *k_norm, float eps, const void *pos,
                                  double theta, const void *slots, void *k_cache, void *v_cache, fm_kv_dtype kv) {
    cu_kv_e4m3_refuse(bb, "qk_norm_rope_store", kv);
    if (f32(bb))
        fm_cuda_qk_norm_rope_store_f32((float *)qkv, T, nh, nkv, hd, q_norm ? bank_f32(q_norm, 0) : NULL,
                                       k_norm ? bank_f32(k_norm, 0) : NULL, eps, (const int32_t *)pos, theta,
                                       (const int32_t *)slots, (float *)k_cache, (float *)v_cache, pdl(bb), stream(bb));
    else
        fm_cuda_qk_norm_rope_store((bf16 *)qkv, T, nh, nkv, hd, q_norm ? bank_bf16(q_norm, 0) : NULL,
                                   k_norm ? bank_bf16(k_norm, 0) : NULL, eps, (const int32_t *)pos, theta,
                                   (const int32_t *)slots, k_cache, v_cache, kv, pdl(bb), stream(bb));
}

/* bf16: flash-decoding on tensor cores, split along the context (attention_paged.cu; a bf16 or an e4m3 cache); fp32,
   and bf16 head dims that are not a multiple of 16: the plain kernel (bf16 and fp32 caches only: the engine refuses
   the e4m3 cache for those) */
static void cu_attention_paged(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                               const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                               const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                               int64_t max_len, void *scratch, void *out) {
    cu_kv_e4m3_refuse(bb, "attention_paged", kv);
    if (kv == FM_KV_E4M3 && hd % 16 != 0) {
        fprintf(stderr,
                "fp8moe: cuda attention_paged: the e4m3 KV cache needs a head dim that is a multiple of 16 "
                "(the split kernel's), not %d\n",
                hd);
        abort();
    }
    if (f32(bb))
        fm_cuda_attention_paged_f32((const float *)qkv, T, nh, nkv, hd, (const float *)k_cache, (const float *)v_cache,
                                    (const int32_t *)tok_seq, (const int32_t *)tok_pos, (const int32_t *)tables,
                                    max_blocks, block_tokens, max_len, (float *)out, pdl(bb), stream(bb));
    else if (hd % 16 != 0)
        fm_cuda_attention_paged_plain_bf16((const bf16 *)qkv, T, nh, nkv, hd, (const bf16 *)k_cache,
                                           (const bf16 *)v_cache, (const int32_t *)tok_seq, (const int32_t *)tok_pos,
                                           (const int32_t *)tables, max_blocks, block_tokens, max_len, (bf16 *)out,
                                           pdl(bb), stream(bb));
    else
        fm_cuda_attention_paged((const bf16 *)qkv, T, nh, nkv, hd, k_cache, v_cache, kv, (const int32_t *)tok_seq,
                                (const int32_t *)tok_pos, (const int32_t *)tables, max_blocks, block_tokens, max_len,
                                scratch, (bf16 *)out, fm_routes_paged_combine_fused(&cuda_be(bb)->routes),
                                fm_routes_paged_splits_waves(&cuda_be(bb)->routes),
                                fm_routes_paged_swap(&cuda_be(bb)->routes),
                                fm_routes_paged_early_kv(&cuda_be(bb)->routes), pdl(bb), stream(bb));
}

/* bf16 head dims that are multiples of 16 (either cache form): the rows of runs on the tiled kernel, the others on
   the split kernel (attention_paged_tiled.cu); fp32 and the other head dims: attention_paged's plain kernel (no tiled
   form) */
static void cu_attention_paged_runs(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                    const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                                    const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                                    int64_t max_len, void *scratch, void *out) {
    if (f32(bb) || hd % 16 != 0)
        cu_attention_paged(bb, qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks,
                           block_tokens, max_len, scratch, out);
    else
        fm_cuda_attention_paged_tiled(
            (const bf16 *)qkv, T, nh, nkv, hd, k_cache, v_cache, kv, (const int32_t *)tok_seq, (const int32_t *)tok_pos,
            (const int32_t *)tables, max_blocks, block_tokens, max_len, scratch, (bf16 *)out,
            fm_routes_paged_combine_fused(&cuda_be(bb)->routes), fm_routes_paged_splits_waves(&cuda_be(bb)->routes),
            fm_routes_paged_swap(&cuda_be(bb)->routes), stream(bb));
}

static void cu_route(fm_backend *bb, const void *logits, int64_t T, int32_t E, int32_t k, fm_router_kind kind,
                     bool norm_topk, void *ids, void *weights) {
    const bool shared = kind == FM_ROUTER_SOFTMAX_TOPK_SHARED; /* the shared expert's pair last (config.h) */
    const bool softmax_topk = kind == FM_ROUTER_SOFTMAX_TOPK || shared;
    if (f32(bb))
        fm_cuda_route_f32((const float *)logits, T, E, k, softmax_topk, norm_topk, shared, (int32_t *)ids,
                          (float *)weights, pdl(bb), stream(bb));
    else
        fm_cuda_route((const bf16 *)logits, T, E, k, softmax_topk, norm_topk, shared, (int32_t *)ids, (bf16 *)weights,
                      pdl(bb), stream(bb));
}

static void cu_router(fm_backend *bb, const fm_bank *w, const void *x, int64_t T, int32_t k, fm_router_kind kind,
                      bool norm_topk, void *logits, void *ids, void *weights) {
    cuda_backend *be = cuda_be(bb);
    const int32_t E = (int32_t)w->rows;
    const bool shared = kind == FM_ROUTER_SOFTMAX_TOPK_SHARED;
    const bool softmax_topk = kind == FM_ROUTER_SOFTMAX_TOPK || shared;
    if (!f32(bb) && w->fmt == FM_W_BF16 && be->router_counter && fm_routes_router_fused(&be->routes, T) &&
        fm_cuda_router_fused_takes(T, E, k, shared, w->cols, w->ld)) {
        if (fm_routes_router_cluster(&be->routes) && fm_cuda_router_cluster_takes(T, E, k, shared, w->cols, w->ld)) {
            fm_cuda_router_cluster((const bf16 *)bank_matrix(w, 0), w->ld, E, w->cols, (const bf16 *)x, T, k,
                                   softmax_topk, norm_topk, shared, (bf16 *)logits, (int32_t *)ids, (bf16 *)weights,
                                   pdl(bb), stream(bb));
            return;
        }
        fm_cuda_router_fused((const bf16 *)bank_matrix(w, 0), w->ld, E, w->cols, (const bf16 *)x, T, k, softmax_topk,
                             norm_topk, shared, (bf16 *)logits, (int32_t *)ids, (bf16 *)weights, be->router_counter,
                             pdl(bb), stream(bb));
        return;
    }
    cu_linear(bb, w, 0, x, T, FM_A_NATIVE, logits);
    cu_route(bb, logits, T, E, k, kind, norm_topk, ids, weights);
}

/* bf16 and f32 expert banks (ref, ref32): the grouped GEMMs through cuBLAS in the activation type */
static bool cublas_experts(const fm_bank *gate_up, const fm_bank *down) {
    return (gate_up->fmt == FM_W_BF16 && down->fmt == FM_W_BF16) || (gate_up->fmt == FM_W_F32 && down->fmt == FM_W_F32);
}

static void cu_moe(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                   const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *out) {
    const bool fp4 = a_dispatch == FM_A_MXFP4 || a_dispatch == FM_A_NVFP4; /* e4m3-bank plans only (creation) */
    require_afmt(gate_up, fp4 ? FM_A_E4M3_G128 : a_dispatch, "moe");
    require_afmt(down, a_down, "moe");
    /* bf16 and f32 banks (ref, ref32): grouped GEMMs through cuBLAS in the activation type; int4-tc, int4-zp-tc,
       e4m3-block (fp8): the grouped W4A8 kernels; int4, int4-zp: the per-token W4A16 baseline */
    if (gate_up->slot_of && gate_up->fmt != FM_W_INT4_G128_TC) { /* expert_cache.cu keeps int4-tc banks only */
        fprintf(stderr, "fp8moe: moe: an expert cache's pool of %s banks\n", fm_wformat_name(gate_up->fmt));
        abort();
    }
    if (fm_cuda_w4a8_takes(gate_up->fmt))
        fm_cuda_moe_w4a8(cuda_be(bb), gate_up, down, (const bf16 *)x, T, (const int32_t *)ids, (const bf16 *)weights, k,
                         a_dispatch, NULL, (bf16 *)out, NULL);
    else if (cublas_experts(gate_up, down))
        fm_cuda_moe_grouped_cublas(cuda_be(bb), gate_up, down, x, T, (const int32_t *)ids, weights, k, out);
    else
        fm_cuda_moe_per_token(cuda_be(bb), gate_up, down, (const bf16 *)x, T, (const int32_t *)ids,
                              (const bf16 *)weights, k, (bf16 *)out);
}

/* Expert parallelism (dist/ep_moe.h), what model.c lets --ep load on this backend: the W4A8 experts of the fp8 and
   fp4 presets (bf16 activations; e4m3, MXFP4 or NVFP4 rows), and the bf16 / fp32 experts of ref and ref32 through
   cuBLAS (the activations' own rows) */
static void cu_ep_dispatch(fm_backend *bb, const fm_ep_layout *L, const void *x, int64_t T, const void *ids,
                           const void *amaxes, void *send, void *ret_row) {
    if (f32(bb) && L->fmt != FM_A_NATIVE) {
        fprintf(stderr, "fp8moe: ep_dispatch: %s rows from fp32 activations (the bf16 plans only)\n",
                fm_afmt_name(L->fmt));
        abort();
    }
    fm_cuda_ep_dispatch(x, T, (const int32_t *)ids, L, (const float *)amaxes, (uint8_t *)send, (int32_t *)ret_row,
                        stream(bb));
}

static void cu_moe_blocks(fm_backend *bb, const fm_ep_layout *L, const fm_bank *gate_up, const fm_bank *down,
                          const void *recv, const void *amaxes, fm_afmt a_down, void *yret) {
    require_afmt(down, a_down, "moe_blocks");
    if (fm_cuda_w4a8_takes(gate_up->fmt))
        fm_cuda_moe_w4a8_blocks(cuda_be(bb), L, gate_up, down, (const uint8_t *)recv, (const float *)amaxes,
                                (bf16 *)yret);
    else if (cublas_experts(gate_up, down))
        fm_cuda_moe_grouped_cublas_blocks(cuda_be(bb), L, gate_up, down, (const uint8_t *)recv, yret);
    else {
        fprintf(stderr, "fp8moe: moe_blocks: %s banks (the W4A8, bf16 and fp32 experts only)\n",
                fm_wformat_name(gate_up->fmt));
        abort();
    }
}

static void cu_ep_combine(fm_backend *bb, const fm_ep_layout *L, const void *yrecv, const void *ret_row,
                          const void *weights, int64_t T, void *out) {
    if (f32(bb))
        fm_cuda_moe_combine_f32((const float *)yrecv, (const int32_t *)ret_row, (const float *)weights, T, L->k, L->H,
                                (float *)out, pdl(bb), stream(bb));
    else
        fm_cuda_moe_combine((const bf16 *)yrecv, (const int32_t *)ret_row, (const bf16 *)weights, T, L->k, L->H,
                            (bf16 *)out, pdl(bb), stream(bb));
}

static void cu_amax(fm_backend *bb, const void *x, int64_t n, void *out) {
    fm_cuda_amax(x, !f32(bb), n, (float *)out, stream(bb));
}

static void cu_swiglu(fm_backend *bb, const void *gu, int64_t rows, int64_t I, void *out) {
    if (f32(bb)) fm_cuda_swiglu_f32((const float *)gu, rows, I, (float *)out, pdl(bb), stream(bb));
    else fm_cuda_swiglu((const bf16 *)gu, rows, I, (bf16 *)out, pdl(bb), stream(bb));
}

static void cu_sample(fm_backend *bb, const void *logits, int32_t B, int32_t vocab, const void *row_slot,
                      const void *params, void *steps, void *counts, void *seen, const void *bias, const void *mask,
                      void *z, void *ids, void *info) {
    fm_cuda_sample(logits, f32(bb), B, vocab, (const int32_t *)row_slot, (const fm_sampling *)params, (uint64_t *)steps,
                   (int32_t *)counts, (uint8_t *)seen, (const fm_logit_bias *)bias, (const uint32_t *)mask, (float *)z,
                   (int32_t *)ids, (fm_sample_info *)info, cuda_be(bb)->sample_ws, pdl(bb), stream(bb));
}

static void cu_add_rmsnorm(fm_backend *bb, void *acc, const void *x, const fm_bank *w, int64_t rows, int64_t dim,
                           float eps, void *out) {
    if (f32(bb))
        fm_cuda_add_rmsnorm_f32((float *)acc, (const float *)x, bank_f32(w, 0), rows, dim, eps, (float *)out, pdl(bb),
                                stream(bb));
    else
        fm_cuda_add_rmsnorm((bf16 *)acc, (const bf16 *)x, bank_bf16(w, 0), rows, dim, eps, (bf16 *)out, pdl(bb),
                            stream(bb));
}

/* the W4A8 experts (fp8, fp4): the combine, residual add and norm in the moe's last kernel, which also quantizes out
   into q8, qs (fm_qrows; NULL: not asked); other banks (ref, ref32, int4): the two ops, then the quantizer */
static void moe_add_rmsnorm_q(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                              const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down,
                              void *y, void *acc, const fm_bank *norm, float eps, void *out, uint8_t *q8, float *qs) {
    if (!f32(bb) && fm_cuda_w4a8_takes(gate_up->fmt) && !(gate_up->slot_of && gate_up->fmt != FM_W_INT4_G128_TC)) {
        const bool fp4 = a_dispatch == FM_A_MXFP4 || a_dispatch == FM_A_NVFP4;
        require_afmt(gate_up, fp4 ? FM_A_E4M3_G128 : a_dispatch, "moe_add_rmsnorm");
        require_afmt(down, a_down, "moe_add_rmsnorm");
        const fm_moe_norm_tail tail = {(bf16 *)acc, bank_bf16(norm, 0), eps, (bf16 *)y, q8, qs};
        fm_cuda_moe_w4a8(cuda_be(bb), gate_up, down, (const bf16 *)x, T, (const int32_t *)ids, (const bf16 *)weights, k,
                         a_dispatch, &tail, (bf16 *)out, NULL);
        return;
    }
    if (q8 && f32(bb)) {
        fprintf(stderr, "fp8moe: moe_add_rmsnorm: out_q asked of fp32 activations (the quantizer reads bf16 rows)\n");
        abort(); /* forward.c asks for it only where the dense linears read e4m3 1x128 rows */
    }
    cu_moe(bb, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y);
    cu_add_rmsnorm(bb, acc, y, norm, T, down->rows, eps, out);
    if (q8) fm_cuda_quantize_e4m3_rows((const bf16 *)out, T, down->rows, q8, qs, NULL, T, pdl(bb), stream(bb));
}

static void cu_moe_add_rmsnorm(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                               const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down,
                               void *y, void *acc, const fm_bank *norm, float eps, void *out, void *out_q) {
    uint8_t *q8 = (uint8_t *)out_q;
    float *qs = q8 ? (float *)(q8 + fm_qrows_scales_at(T, down->rows)) : NULL;
    moe_add_rmsnorm_q(bb, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y, acc, norm, eps, out, q8, qs);
}

/* route moe.dispatch=fused: the fused router's launch also dispatches the rows of the W4A8 experts' decode GEMVs
   (e4m3 rows, bf16 router); elsewhere the router op, then the moe op (or moe_add_rmsnorm with a norm) */
static void cu_router_moe(fm_backend *bb, const fm_bank *rw, const fm_bank *gate_up, const fm_bank *down, void *x,
                          int64_t T, int32_t k, fm_router_kind kind, bool norm_topk, void *logits, void *ids,
                          void *weights, fm_afmt a_dispatch, fm_afmt a_down, void *y, void *acc, const fm_bank *norm,
                          float eps, void *out, void *out_q, const fm_pre_norm *pre) {
    cuda_backend *be = cuda_be(bb);
    const int32_t E = (int32_t)rw->rows;
    /* out_q: the kernel that ends the block (the persistent block's tail, the combine + norm) quantizes out */
    const int64_t H = down->rows;
    uint8_t *q8 = (uint8_t *)out_q;
    float *qs = out_q && norm ? (float *)(q8 + fm_qrows_scales_at(T, H)) : NULL;
    const bool shared = kind == FM_ROUTER_SOFTMAX_TOPK_SHARED;
    const bool softmax_topk = kind == FM_ROUTER_SOFTMAX_TOPK || shared;
    const bool fused = !f32(bb) && fm_routes_moe_dispatch_fused(&be->routes) && rw->fmt == FM_W_BF16 &&
                       be->router_counter && fm_routes_router_fused(&be->routes, T) &&
                       fm_cuda_router_dispatch_takes(T, E, k, shared, rw->cols, rw->ld) && gate_up->n == E &&
                       fm_cuda_moe_w4a8_router_takes(be, gate_up, down, T, k, a_dispatch);
    /* route moe.persistent: the router and the experts of one token in one launch, where it applies */
    if (!f32(bb) && norm && fm_routes_moe_persistent(&be->routes) && rw->fmt == FM_W_BF16 && gate_up->n == E) {
        /* the formats are the kernel's to check (e4m3 1x128 both): other dispatches take the ops below */
        const fm_moe_router r = {
            (const bf16 *)bank_matrix(rw, 0), rw->ld, softmax_topk, norm_topk, shared, (bf16 *)logits, NULL};
        const fm_moe_norm_tail tail = {(bf16 *)acc, bank_bf16(norm, 0), eps, (bf16 *)y, q8, qs};
        /* route moe.block_norm: the add + norm that make x, in the block */
        const fm_moe_pre bpre = {pre ? (const bf16 *)pre->y : NULL, pre ? bank_bf16(pre->norm, 0) : NULL,
                                 pre ? pre->eps : 0.0f, (bf16 *)x};
        if (fm_cuda_moe_w4a8_block(be, &r, gate_up, down, (const bf16 *)x, T, k, (int32_t *)ids, (bf16 *)weights,
                                   a_dispatch, a_down, &tail, (bf16 *)out, pre ? &bpre : NULL))
            return;
    }
    if (pre) {
        if (!norm) {
            fprintf(stderr, "fp8moe: router_moe: a pre step (the add + norm before it) without the tail's norm\n");
            abort(); /* forward.c passes one only with the fused tail */
        }
        cu_add_rmsnorm(bb, acc, pre->y, pre->norm, T, down->rows, pre->eps, x);
    }
    if (!fused) {
        cu_router(bb, rw, x, T, k, kind, norm_topk, logits, ids, weights);
        if (norm)
            moe_add_rmsnorm_q(bb, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y, acc, norm, eps, out, q8,
                              qs);
        else cu_moe(bb, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y);
    } else {
        require_afmt(gate_up, a_dispatch, "router_moe");
        require_afmt(down, a_down, "router_moe");
        const fm_moe_router r = {(const bf16 *)bank_matrix(rw, 0),
                                 rw->ld,
                                 softmax_topk,
                                 norm_topk,
                                 shared,
                                 (bf16 *)logits,
                                 be->router_counter};
        const fm_moe_norm_tail tail = {(bf16 *)acc, norm ? bank_bf16(norm, 0) : NULL, eps, (bf16 *)y, q8, qs};
        fm_cuda_moe_w4a8(be, gate_up, down, (const bf16 *)x, T, (const int32_t *)ids, (const bf16 *)weights, k,
                         a_dispatch, norm ? &tail : NULL, (bf16 *)(norm ? out : y), &r);
    }
}

/* linear from rows its input's producer quantized (router_moe's out_q): the W4A8 projection reads them where it
   would quantize x itself (int4-tc and e4m3-block banks, not the GEMV's own quantizer of dense.quant=fused) */
static void cu_linear_rows(fm_backend *bb, const fm_bank *w, int32_t idx, const void *x, const void *xq, int64_t M,
                           fm_afmt afmt, void *y) {
    cuda_backend *be = cuda_be(bb);
    require_afmt(w, afmt, "linear_rows");
    if (f32(bb) || M < 1 || afmt != FM_A_E4M3_G128 || (w->fmt != FM_W_INT4_G128_TC && w->fmt != FM_W_E4M3_B128) ||
        w->interleaved || w->fold || fm_routes_dense_quant_fused(&be->routes)) {
        cu_linear(bb, w, idx, x, M, afmt, y);
        return;
    }
    const uint8_t *q8 = (const uint8_t *)xq;
    fm_cuda_linear_w4a8_from_rows(be, w, idx, q8, (const float *)(q8 + fm_qrows_scales_at(M, w->cols)), NULL, M,
                                  (bf16 *)y, NULL);
}

/* W8A8 and W4A8 dense weights at the decode GEMVs' rows: the add + norm in the GEMV's last CTA; else the two ops */
static void cu_linear_add_rmsnorm(fm_backend *bb, const fm_bank *w, const void *x, int64_t M, fm_afmt afmt, void *y,
                                  void *acc, const fm_bank *norm, float eps, void *out) {
    require_afmt(w, afmt, "linear_add_rmsnorm");
    if (!f32(bb) && w->fmt == FM_W_E4M3_PT &&
        fm_cuda_linear_w8a8_add_rmsnorm(cuda_be(bb), w, (const bf16 *)x, M, (bf16 *)y, (bf16 *)acc, bank_bf16(norm, 0),
                                        eps, (bf16 *)out))
        return;
    if (!f32(bb) && fm_cuda_w4a8_takes(w->fmt) &&
        fm_cuda_linear_w4a8_add_rmsnorm(cuda_be(bb), w, (const bf16 *)x, M, (bf16 *)y, (bf16 *)acc, bank_bf16(norm, 0),
                                        eps, (bf16 *)out))
        return;
    cu_linear(bb, w, 0, x, M, afmt, y);
    cu_add_rmsnorm(bb, acc, y, norm, M, w->rows, eps, out);
}

/* route dense.quant=producer (else false): paged attention with the o projection's e4m3 rows
   written by the merge of its splits (attention_paged.cu), then the projection from those rows, its add + RMSNorm in
   the GEMV's last CTA where linear_add_rmsnorm would put it there. Takes int4-tc and e4m3-block banks (no group sums)
   under e4m3 1x128 activations and the split kernel (not a step of prompt chunks, not dense.quant=fused, whose GEMV
   quantizes x itself); else false and the caller runs the ops. */
static bool cu_attention_paged_o(fm_backend *bb, bool runs, const void *qkv, int64_t T, int32_t nh, int32_t nkv,
                                 int32_t hd, const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                 const void *tok_seq, const void *tok_pos, const void *tables, int32_t max_blocks,
                                 int32_t block_tokens, int64_t max_len, void *scratch, void *att, const fm_bank *o,
                                 fm_afmt afmt, void *y, void *acc, const fm_bank *norm, float eps, void *out) {
    cuda_backend *be = cuda_be(bb);
    const fm_routes *r = &be->routes;
    if (!fm_routes_dense_quant_producer(r) || runs || f32(bb) || hd % 16 != 0 || T < 1 || afmt != FM_A_E4M3_G128 ||
        (o->fmt != FM_W_INT4_G128_TC && o->fmt != FM_W_E4M3_B128) || o->interleaved || o->fold ||
        o->cols != (int64_t)nh * hd || afmt != afmt_for(o->fmt) || fm_routes_dense_quant_fused(r))
        return false;
    cu_kv_e4m3_refuse(bb, "attention_paged_o", kv);
    fm_row_tail tail;
    const bool in_gemv =
        norm && fm_cuda_linear_w4a8_tail(be, o, T, (bf16 *)y, (bf16 *)acc, bank_bf16(norm, 0), eps, (bf16 *)out, &tail);
    uint8_t *x8;
    float *xs, *xsum;
    fm_cuda_w4a8_linear_rows(be, o, T, &x8, &xs, &xsum);
    fm_cuda_attention_paged_quant((const bf16 *)qkv, T, nh, nkv, hd, k_cache, v_cache, kv, (const int32_t *)tok_seq,
                                  (const int32_t *)tok_pos, (const int32_t *)tables, max_blocks, block_tokens, max_len,
                                  scratch, (bf16 *)att, x8, xs, fm_routes_paged_combine_fused(r),
                                  fm_routes_paged_splits_waves(r), fm_routes_paged_swap(r), fm_routes_paged_early_kv(r),
                                  pdl(bb), stream(bb));
    fm_cuda_linear_w4a8_from_rows(be, o, 0, x8, xs, xsum, T, (bf16 *)y, in_gemv ? &tail : NULL);
    if (norm && !in_gemv) cu_add_rmsnorm(bb, acc, y, norm, T, o->rows, eps, out);
    return true;
}

/* route attn.persistent: the decode attention block in one launch (attn_decode_block.cu) where the chain it equals
   is the one it reproduces: int4-tc projections (not interleaved) on the W4A8 decode GEMV, a bf16 cache, head dim
   128; else false and the caller runs the ops */
static bool cu_attention_block(fm_backend *bb, const fm_bank *qkv, const fm_bank *o, const void *h, fm_afmt afmt,
                               int32_t nh, int32_t nkv, int32_t hd, const fm_bank *q_norm, const fm_bank *k_norm,
                               float qk_eps, const void *pos, double theta, const void *slots, void *k_cache,
                               void *v_cache, fm_kv_dtype kv, const void *tok_seq, const void *tables,
                               int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch, void *b_qkv,
                               void *att, void *y, void *acc, const fm_bank *norm, float eps, void *out) {
    cuda_backend *be = cuda_be(bb);
    const fm_routes *r = &be->routes;
    const int64_t H = o->rows;
    if (f32(bb) || !be->block_barrier || !fm_routes_attn_persistent(r) || kv != FM_KV_ACT ||
        qkv->fmt != FM_W_INT4_G128_TC || o->fmt != FM_W_INT4_G128_TC || qkv->interleaved || o->interleaved ||
        qkv->fold || o->fold || afmt != afmt_for(qkv->fmt) || qkv->cols != H ||
        qkv->rows != (int64_t)(nh + 2 * nkv) * hd || o->cols != (int64_t)nh * hd ||
        fm_routes_dense_kernel(r, qkv->fmt, 1, qkv->cols) != FM_DK_W4A8_GEMV ||
        fm_routes_dense_kernel(r, o->fmt, 1, o->cols) != FM_DK_W4A8_GEMV ||
        !fm_cuda_attn_decode_block_takes(H, nh, nkv, hd) ||
        ((uintptr_t)b_qkv | (uintptr_t)k_cache | (uintptr_t)v_cache | (uintptr_t)scratch) % 16 != 0 ||
        !fm_row_tail_takes(H, y, acc, bank_bf16(norm, 0), out))
        return false;
    const int32_t gg = fm_routes_gemv_groups(r);
    fm_attn_block_args a;
    memset(&a, 0, sizeof a);
    a.x = (const bf16 *)h, a.H = H, a.nh = nh, a.nkv = nkv, a.hd = hd;
    a.qkv_codes = (const uint8_t *)qkv->w, a.o_codes = (const uint8_t *)o->w;
    a.qkv_scales = qkv->scales, a.o_scales = o->scales;
    a.qkv_rows_pad = qkv->rows_pad, a.o_rows_pad = o->rows_pad;
    a.qkv_slices = fm_cuda_w4a8_moe_gemv_slices(qkv, 1, gg), a.o_slices = fm_cuda_w4a8_moe_gemv_slices(o, 1, gg);
    a.qkv = (bf16 *)b_qkv;
    a.q_norm = q_norm ? bank_bf16(q_norm, 0) : NULL, a.k_norm = k_norm ? bank_bf16(k_norm, 0) : NULL;
    a.qk_eps = qk_eps, a.theta = (float)theta;
    a.tok_seq = (const int32_t *)tok_seq, a.tok_pos = (const int32_t *)pos, a.slot = (const int32_t *)slots;
    a.k_cache = (bf16 *)k_cache, a.v_cache = (bf16 *)v_cache, a.tables = (const int32_t *)tables;
    a.max_blocks = max_blocks, a.block_tokens = block_tokens;
    a.splits = fm_cuda_attention_paged_split_count(1, nh, nkv, hd, kv, max_len, fm_routes_paged_splits_waves(r));
    a.scratch = scratch, a.att = (bf16 *)att, a.y = (bf16 *)y, a.acc = (bf16 *)acc, a.norm = bank_bf16(norm, 0);
    a.eps = eps, a.out = (bf16 *)out, a.barrier = be->block_barrier;
    if (a.splits > 1 && !scratch) return false;
    fm_cuda_attn_decode_block(&a, pdl(bb), stream(bb));
    return true;
}

static void cu_add(fm_backend *bb, void *acc, const void *x, int64_t n) {
    if (f32(bb)) fm_cuda_add_f32((float *)acc, (const float *)x, n, pdl(bb), stream(bb));
    else fm_cuda_add((bf16 *)acc, (const bf16 *)x, n, pdl(bb), stream(bb));
}

/* Qwen3-Next's ops (gated_attention.cu, gdn.cu): the norm, conv and gate banks are of the activation type (w_other:
   bf16, or f32 for ref32); the GDN states are fp32 */

/* an optional vector bank's data, or NULL when the layer has none */
static const void *vec_or_null(const fm_bank *w) { return w ? bank_matrix(w, 0) : NULL; }

static void cu_gated_qk_norm_rope(fm_backend *bb, const void *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                  int32_t rot_dim, const fm_bank *q_norm, const fm_bank *k_norm, float eps,
                                  int64_t pos0, const void *pos, double theta, void *qkv, void *gate) {
    fm_cuda_gated_qk_norm_rope(f32(bb), qg, T, nh, nkv, hd, rot_dim, vec_or_null(q_norm), vec_or_null(k_norm), eps,
                               pos0, (const int32_t *)pos, theta, qkv, gate, pdl(bb), stream(bb));
}

static void cu_sigmoid_mul(fm_backend *bb, void *x, const void *gate, int64_t n) {
    fm_cuda_sigmoid_mul(f32(bb), x, gate, n, pdl(bb), stream(bb));
}

static void cu_add_sigmoid_scaled(fm_backend *bb, void *acc, const void *x, const void *score, int64_t rows,
                                  int64_t dim) {
    fm_cuda_add_sigmoid_scaled(f32(bb), acc, x, score, rows, dim, pdl(bb), stream(bb));
}

static void cu_add_sigmoid_gated(fm_backend *bb, void *acc, const void *x, const void *h, const fm_bank *w,
                                 int64_t rows, int64_t dim) {
    if (w->fmt != (f32(bb) ? FM_W_F32 : FM_W_BF16) || w->cols != dim) { /* w_other: the act type (backend.c) */
        fprintf(stderr, "fp8moe: cuda add_sigmoid_gated: the gate's weights are %s [%lld], not the activations' type\n",
                fm_wformat_name(w->fmt), (long long)w->cols);
        abort();
    }
    fm_cuda_add_sigmoid_gated(f32(bb), acc, x, h, bank_matrix(w, 0), rows, dim, pdl(bb), stream(bb));
}

static void cu_gdn_conv(fm_backend *bb, const void *qkvz, const fm_bank *conv, int64_t T, fm_gdn_shape g, void *states,
                        const void *tok_seq, const void *tok_pos, void *out) {
    fm_cuda_gdn_conv(f32(bb), qkvz, bank_matrix(conv, 0), conv->ld, T, g, (float *)states, (const int32_t *)tok_seq,
                     (const int32_t *)tok_pos, out, pdl(bb), stream(bb));
}

/* the chunked form on tensor cores where the route takes the shape (gdn.tc: dk = dv = 128, bf16), its scratch in the
   workspace; else the token-by-token kernel over the one run */
static void cu_gdn_chunked(fm_backend *bb, const void *qkv, const void *ba, const fm_bank *a_log,
                           const fm_bank *dt_bias, int64_t T, fm_gdn_shape g, void *states, const void *tok_seq,
                           const void *tok_pos, void *out) {
    cuda_backend *be = cuda_be(bb);
    if (fm_routes_gdn_tc(&be->routes, g.dk, g.dv, !f32(bb))) {
        void *ws = fm_cuda_workspace(be, fm_gdn_tc_ws_bytes((uint64_t)T, (uint64_t)g.nv));
        fm_cuda_gdn_chunked_tc(qkv, ba, bank_matrix(a_log, 0), bank_matrix(dt_bias, 0), T, g, (float *)states,
                               (const int32_t *)tok_seq, (const int32_t *)tok_pos, ws, out, stream(bb));
        return;
    }
    fm_cuda_gdn_chunked(f32(bb), qkv, ba, bank_matrix(a_log, 0), bank_matrix(dt_bias, 0), T, g, (float *)states,
                        (const int32_t *)tok_seq, (const int32_t *)tok_pos, out, stream(bb));
}

static void cu_gdn_recurrent(fm_backend *bb, const void *qkv, const void *ba, const fm_bank *a_log,
                             const fm_bank *dt_bias, int64_t T, fm_gdn_shape g, void *states, const void *tok_seq,
                             const void *tok_pos, void *out) {
    fm_cuda_gdn_recurrent(f32(bb), qkv, ba, bank_matrix(a_log, 0), bank_matrix(dt_bias, 0), T, g, (float *)states,
                          (const int32_t *)tok_seq, (const int32_t *)tok_pos, out, pdl(bb), stream(bb));
}

/* out_q: fm_qrows of out's T rows of nv dv columns (codes, then the scales) */
static void gdn_out_q(fm_backend *bb, void *out_q, int64_t T, fm_gdn_shape g, uint8_t **q8, float **qs) {
    *q8 = (uint8_t *)out_q, *qs = out_q ? (float *)(*q8 + fm_qrows_scales_at(T, (int64_t)g.nv * g.dv)) : NULL;
    if (out_q && f32(bb)) {
        fprintf(stderr, "fp8moe: gdn_norm_gate: out_q asked of fp32 activations (the quantizer reads bf16 rows)\n");
        abort(); /* forward.c asks for it only where the dense linears read e4m3 1x128 rows */
    }
}

static void cu_gdn_norm_gate(fm_backend *bb, const void *core, const void *qkvz, const fm_bank *w, int64_t T,
                             fm_gdn_shape g, float eps, void *out, void *out_q) {
    uint8_t *q8;
    float *qs;
    gdn_out_q(bb, out_q, T, g, &q8, &qs);
    fm_cuda_gdn_norm_gate(f32(bb), core, qkvz, bank_matrix(w, 0), T, g, eps, out, q8, qs, pdl(bb), stream(bb));
}

/* the fused kernel where it takes the shape (gdn_decode.cu), else the chain it stands for. ba_w: the in_proj_ba
   projection of h, in the kernel where its weights are the activation type and fm_cuda_gdn_ba_fits, else the linear
   op before it (or before the chain) */
static void cu_gdn_decode_fused(fm_backend *bb, const void *qkvz, const void *ba, const fm_bank *ba_w, const void *h,
                                const fm_bank *conv, const fm_bank *a_log, const fm_bank *dt_bias, const fm_bank *norm,
                                int64_t T, fm_gdn_shape g, float eps, void *conv_states, void *rec_states,
                                const void *tok_seq, const void *tok_pos, void *qkv, void *core, void *out,
                                void *out_q) {
    uint8_t *q8;
    float *qs;
    gdn_out_q(bb, out_q, T, g, &q8, &qs);
    const fm_gdn_ba in_ba = {ba_w ? bank_matrix(ba_w, 0) : NULL, h, ba_w ? ba_w->ld : 0, ba_w ? ba_w->cols : 0};
    const bool ba_native = ba_w && ba_w->fmt == (f32(bb) ? FM_W_F32 : FM_W_BF16) && ba_w->rows == 2 * (int64_t)g.nv;
    const bool ba_in = ba_native && fm_cuda_gdn_ba_fits(f32(bb), &in_ba);
    if (ba_w && !ba_in) cu_linear(bb, ba_w, 0, h, T, FM_A_NATIVE, (void *)ba);
    const fm_routes *r = &cuda_be(bb)->routes;
    if (fm_cuda_gdn_decode_fused(f32(bb), qkvz, ba, ba_in ? &in_ba : NULL, fm_routes_gdn_early_state(r),
                                 bank_matrix(conv, 0), conv->ld, bank_matrix(a_log, 0), bank_matrix(dt_bias, 0),
                                 bank_matrix(norm, 0), T, g, eps, (float *)conv_states, (float *)rec_states,
                                 (const int32_t *)tok_seq, (const int32_t *)tok_pos, qkv, core,
                                 cuda_be(bb)->gdn_arrivals, FM_CUDA_GDN_ARRIVALS, out, q8, qs, pdl(bb), stream(bb)))
        return;
    if (ba_in) cu_linear(bb, ba_w, 0, h, T, FM_A_NATIVE, (void *)ba); /* the kernel did not run: the chain's input */
    cu_gdn_conv(bb, qkvz, conv, T, g, conv_states, tok_seq, tok_pos, qkv);
    cu_gdn_recurrent(bb, qkv, ba, a_log, dt_bias, T, g, rec_states, tok_seq, tok_pos, core);
    cu_gdn_norm_gate(bb, core, qkvz, norm, T, g, eps, out, out_q);
}

/* act_size is the bf16 one here; a backend created for the ref32 plan copies the table with 4 (fm_cuda_backend_create)
 */
static const fm_backend_ops cuda_ops = {
    .name = "cuda",
    .act_size = sizeof(bf16),
    .kv_e4m3_codes = true, /* FM_KV_E4M3 rows of codes and scales (backend.h) */
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .reserve = cu_reserve,
    .side_begin = cu_side_begin,
    .side_end = cu_side_end,
    .side_join = cu_side_join,
    .upload_ids = cu_upload_ids,
    .download_f32 = cu_download_f32,
    .upload_f32 = cu_upload_f32,
    .download_raw = cu_download_raw,
    .upload_raw = cu_upload_raw,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy = cu_copy,
    .copy_rows = cu_copy_rows,
    .sync = cu_sync,
    .graph_capture = fm_cuda_graph_capture,
    .graph_launch = fm_cuda_graph_launch_op,
    .graph_free = fm_cuda_graph_free_op,
    .graph_nodes = fm_cuda_graph_nodes_op,
    .mark = cu_mark,
    .elapsed_ms = cu_elapsed_ms,
    .range = cu_range,
    .device_name = cu_device_name,
    .bank_create = fm_cuda_bank_create,
    .bank_free = fm_cuda_bank_free,
    .bank_bytes = fm_cuda_bank_bytes,
    /* experts in host memory (expert_cache.cu: int4-tc banks, the fp8 and fp4 presets) */
    .bank_create_host = fm_cuda_bank_create_host,
    .expert_cache_create = fm_cuda_expert_cache_create,
    .expert_fetch = fm_cuda_expert_fetch,
    .expert_prefetch = fm_cuda_expert_prefetch,
    .expert_cache_stats = fm_cuda_expert_cache_stats,
    .expert_cache_free = fm_cuda_expert_cache_free,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .linear = cu_linear,
    .qk_norm_rope = cu_qk_norm_rope,
    .attention = cu_attention,
    .kv_store = cu_kv_store,
    .qk_norm_rope_store = cu_qk_norm_rope_store,
    .attention_paged = cu_attention_paged,
    .attention_paged_runs = cu_attention_paged_runs,
    .route = cu_route,
    .router = cu_router,
    .moe = cu_moe,
    .ep_dispatch = cu_ep_dispatch,
    .moe_blocks = cu_moe_blocks,
    .ep_combine = cu_ep_combine,
    .amax = cu_amax,
    .swiglu = cu_swiglu,
    .add = cu_add,
    .add_rmsnorm = cu_add_rmsnorm,
    .moe_add_rmsnorm = cu_moe_add_rmsnorm,
    .router_moe = cu_router_moe,
    .linear_rows = cu_linear_rows,
    .linear_add_rmsnorm = cu_linear_add_rmsnorm,
    .attention_paged_o = cu_attention_paged_o,
    .attention_block = cu_attention_block,
    .sample = cu_sample,
    .gated_qk_norm_rope = cu_gated_qk_norm_rope,
    .sigmoid_mul = cu_sigmoid_mul,
    .add_sigmoid_scaled = cu_add_sigmoid_scaled,
    .add_sigmoid_gated = cu_add_sigmoid_gated,
    .gdn_conv = cu_gdn_conv,
    .gdn_chunked = cu_gdn_chunked,
    .gdn_recurrent = cu_gdn_recurrent,
    .gdn_norm_gate = cu_gdn_norm_gate,
    .gdn_decode_fused = cu_gdn_decode_fused,
};

extern "C" void *fm_cuda_backend_stream(fm_backend *bb) {
    return bb && bb->ops->destroy == cu_destroy ? (void *)cuda_be(bb)->stream : NULL;
}

extern "C" fm_status fm_cuda_backend_create(const fm_plan *plan, const char *routes, fm_backend **out, fm_error *err) {
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: no usable GPU (%s); use --backend cpu",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    /* what the kernels cover: native bf16 activations with bf16/int4 weights, e4m3 1x128 with int4-tc weights;
       or the oracle's plan (fp32 throughout) */
    const bool oracle = plan_is_oracle(plan);
    const bool dense_ok = plan->a_dense == afmt_for(plan->w_dense);
    const fm_afmt want_e = plan->w_expert == FM_W_INT4_G128_TC ? FM_A_E4M3_G128 : FM_A_NATIVE;
    /* the W4A8 experts also take an FP4 dispatch buffer (MXFP4, NVFP4), expanded to e4m3 in the gate|up GEMM */
    const bool fp4 = plan->a_dispatch == FM_A_MXFP4 || plan->a_dispatch == FM_A_NVFP4;
    const bool dispatch_ok = plan->a_dispatch == want_e || (want_e == FM_A_E4M3_G128 && fp4);
    if (!oracle && (!dense_ok || !dispatch_ok || plan->a_expert != want_e || plan->w_other != FM_W_BF16 ||
                    !plan->act_bf16 || plan->w_dense == FM_W_F32 || plan->w_expert == FM_W_F32))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "cuda backend: preset %s (dense %s/%s, experts %s/%s/%s) has no GPU kernels; available on cuda: "
                       "ref, ref32, int4, fp8 and fp4 (--dispatch fp8, mxfp4 or nvfp4 with fp8 and fp4)",
                       fm_preset_name(plan->preset), fm_wformat_name(plan->w_dense), fm_afmt_name(plan->a_dense),
                       fm_wformat_name(plan->w_expert), fm_afmt_name(plan->a_dispatch), fm_afmt_name(plan->a_expert));
    int device = 0;
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDevice(&device));
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    /* a GPU the binary has no kernels for (A100, Blackwell) is refused here, by name, before anything runs */
    fm_status kst = fm_cuda_device_has_kernels(device, err);
    if (kst) return kst;
    /* the route table: the defaults for this GPU, then the caller's overrides (the model parses the same string
       against the same key table for its memory plan: routes.c) */
    fm_routes table;
    fm_routes_default(&table, prop.major);
    fm_status st = fm_routes_apply(&table, routes, err);
    if (st) return st;
    cuda_backend *be = (cuda_backend *)calloc(1, sizeof *be);
    if (!be) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    be->ops = cuda_ops;
    be->ops.act_size = oracle ? sizeof(float) : sizeof(bf16);
    be->f32 = oracle;
    be->base.ops = &be->ops;
    be->base.plan = *plan;
    be->device = device, be->prop = prop, be->routes = table;
    /* say which FP8 kernels the routes pick wherever the device is named: the W4A8 GEMM (wgmma on Hopper, mma.sync
       elsewhere) and, for FP8 dense projections, the decode GEMVs (mma.sync; PDL where the GPU has it) */
    const bool fp8_dense = plan->w_dense == FM_W_INT4_G128_TC || plan->w_dense == FM_W_E4M3_PT;
    char dense[160] = "";
    if (fp8_dense)
        snprintf(dense, sizeof dense, ", decode GEMVs %s%s%s",
                 !fm_routes_gemv(&table) ? "off (route dense.gemv=off)" : "mma.sync m16n8k32 e4m3",
                 fm_routes_gemv(&table) && fm_routes_pdl(&table) ? " + PDL" : "",
                 plan->w_dense == FM_W_E4M3_PT ? ", W8A8 prefill cuBLASLt FP8" : "");
    if (plan->w_dense == FM_W_INT4_G128_TC || plan->w_expert == FM_W_INT4_G128_TC)
        snprintf(be->device_label, sizeof be->device_label, "%s, W4A8 kernel %s%s", be->prop.name,
                 fm_routes_w4a8_kernel_name(&table), dense);
    else snprintf(be->device_label, sizeof be->device_label, "%s%s", be->prop.name, dense);
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking));
    if (cudaMalloc(&be->router_counter, sizeof *be->router_counter) != cudaSuccess ||
        cudaMemset(be->router_counter, 0, sizeof *be->router_counter) != cudaSuccess ||
        cudaMalloc(&be->tail_counter, (1 + FM_MOE_GEMV_MAX_PAIRS) * sizeof *be->tail_counter) != cudaSuccess ||
        cudaMemset(be->tail_counter, 0, (1 + FM_MOE_GEMV_MAX_PAIRS) * sizeof *be->tail_counter) != cudaSuccess ||
        cudaMalloc(&be->gdn_arrivals, FM_CUDA_GDN_ARRIVALS * sizeof *be->gdn_arrivals) != cudaSuccess ||
        cudaMemset(be->gdn_arrivals, 0, FM_CUDA_GDN_ARRIVALS * sizeof *be->gdn_arrivals) != cudaSuccess ||
        cudaMalloc(&be->block_barrier, FM_MOE_BLOCK_BARRIER_WORDS * sizeof *be->block_barrier) != cudaSuccess ||
        cudaMemset(be->block_barrier, 0, FM_MOE_BLOCK_BARRIER_WORDS * sizeof *be->block_barrier) != cudaSuccess ||
        cudaMalloc(&be->block_counts, FM_MOE_BLOCK_COUNTS * sizeof *be->block_counts) != cudaSuccess ||
        cudaMemset(be->block_counts, 0, FM_MOE_BLOCK_COUNTS * sizeof *be->block_counts) != cudaSuccess ||
        cudaMalloc(&be->sample_ws, FM_CUDA_SAMPLE_WS_BYTES) != cudaSuccess ||
        cudaMemset(be->sample_ws, 0, FM_CUDA_SAMPLE_WS_BYTES) != cudaSuccess) {
        cu_destroy(&be->base);
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: out of device memory for the CTA counters");
    }
    /* the oracle's SGEMMs stay fp32 even under NVIDIA_TF32_OVERRIDE=1 (pedantic: no TF32, no reduced precision) */
    if (cublasCreate(&be->cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(be->cublas, be->stream) != CUBLAS_STATUS_SUCCESS ||
        (oracle && cublasSetMathMode(be->cublas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)) {
        cu_destroy(&be->base);
        return fm_fail(err, FM_ERR_BACKEND, "cuda backend: cuBLAS initialisation failed");
    }
    *out = &be->base;
    return FM_OK;
}
