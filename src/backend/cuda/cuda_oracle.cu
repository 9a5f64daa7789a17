// The ref32 oracle on the GPU: the op table of the CUDA backend for the fp32 plan (preset ref32: fp32 weights
// and activations, fp32 arithmetic). It computes what the CPU reference computes, with different summation
// orders only, and exists so that models too large for the CPU (Qwen3-30B-A3B: 122 GB of fp32 weights, ~10 s
// per layer per prompt on the CPU) can be judged against fp32 at full depth on one H200.
//
// Routes: SGEMM through cuBLAS in pedantic math mode (linear.cu), the grouped cuBLAS MoE with fp32 groups
// (moe_grouped_cublas.cu), the element-wise kernels instantiated for fp32 (elementwise.cu, rope.cu,
// router.cu), and a plain fp32 attention kernel (attention_f32.cu). Speed is not a goal here.
#include "backend/cuda/attention_f32.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/linear.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/router.cuh"

bool fm_cuda_plan_is_oracle(const fm_plan *p) {
    return !p->act_bf16 && p->w_dense == FM_W_F32 && p->w_expert == FM_W_F32 && p->w_other == FM_W_F32 &&
           p->a_dense == FM_A_NATIVE && p->a_dispatch == FM_A_NATIVE && p->a_expert == FM_A_NATIVE;
}

static cudaStream_t stream(fm_backend *bb) { return cuda_be(bb)->stream; }

static void or_download_f32(fm_backend *bb, const void *src, int64_t n, float *dst) {
    fm_cu_download_raw(bb, src, (size_t)n * sizeof(float), dst);
}

static void or_upload_f32(fm_backend *bb, const float *src, int64_t n, void *dst) {
    FM_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream(bb)));
    FM_CUDA_CHECK(cudaStreamSynchronize(stream(bb))); /* src is the caller's memory */
}

static void or_embed(fm_backend *bb, const fm_bank *table, const void *ids, int64_t T, void *out) {
    fm_cuda_embed_f32(bank_f32(table, 0), table->ld, (const int32_t *)ids, T, table->cols, (float *)out, stream(bb));
}

static void or_rmsnorm(fm_backend *bb, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps, void *out) {
    fm_cuda_rmsnorm_f32((const float *)x, bank_f32(w, 0), rows, dim, eps, (float *)out, stream(bb));
}

static void or_linear(fm_backend *bb, const fm_bank *w, int32_t idx, const void *x, int64_t M, fm_afmt afmt, void *y) {
    (void)afmt; /* native: the backend accepts only the oracle's plan */
    fm_cuda_linear(cuda_be(bb), w, idx, x, M, y);
}

static void or_qk_norm_rope(fm_backend *bb, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, double theta) {
    fm_cuda_qk_norm_rope_f32((float *)qkv, T, nh, nkv, hd, q_norm ? bank_f32(q_norm, 0) : NULL,
                             k_norm ? bank_f32(k_norm, 0) : NULL, eps, pos0, theta, stream(bb));
}

static void or_attention(fm_backend *bb, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *out) {
    fm_cuda_attention_f32((const float *)qkv, T, nh, nkv, hd, (float *)out, stream(bb));
}

static void or_route(fm_backend *bb, const void *logits, int64_t T, int32_t E, int32_t k, fm_router_kind kind,
                     bool norm_topk, void *ids, void *weights) {
    fm_cuda_route_f32((const float *)logits, T, E, k, kind == FM_ROUTER_SOFTMAX_TOPK, norm_topk, (int32_t *)ids,
                      (float *)weights, stream(bb));
}

static void or_moe(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                   const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *out) {
    (void)a_dispatch, (void)a_down;
    fm_cuda_moe_grouped_cublas(cuda_be(bb), gate_up, down, x, T, (const int32_t *)ids, weights, k, out);
}

static void or_swiglu(fm_backend *bb, const void *gu, int64_t rows, int64_t I, void *out) {
    fm_cuda_swiglu_f32((const float *)gu, rows, I, (float *)out, stream(bb));
}

static void or_add(fm_backend *bb, void *acc, const void *x, int64_t n) {
    fm_cuda_add_f32((float *)acc, (const float *)x, n, stream(bb));
}

const fm_backend_ops fm_cuda_oracle_ops = {
    .name         = "cuda",
    .act_size     = sizeof(float),
    FM_CUDA_SHARED_OPS_HEAD,
    .download_f32 = or_download_f32,
    .upload_f32   = or_upload_f32,
    FM_CUDA_SHARED_OPS_TAIL,
    .embed        = or_embed,
    .rmsnorm      = or_rmsnorm,
    .linear       = or_linear,
    .qk_norm_rope = or_qk_norm_rope,
    .attention    = or_attention,
    .route        = or_route,
    .moe          = or_moe,
    .swiglu       = or_swiglu,
    .add          = or_add,
};
