// Fused q/k RMSNorm + RoPE (see rope.cuh). Memory-bound: reads and writes (nh + nkv) * hd activations per token
// (bf16, or fp32 for the ref32 oracle); floor at T = 2048, Qwen3-30B-A3B (40 heads of 128): 21 MB each way, ~10 us.
//
// Blocks of 8 warps, grid (T, Y); warp w of block (t, y) takes token t's heads 8 y + w, + 8 Y, ... (Y = 1 for long
// prompts; at decode sizes Y spreads the heads over more SMs); lane l owns the element pairs (j, j + hd/2) for
// j = 64 r + 2 l, + 1 (r < R), loaded two at a time, so a head is one round of loads per lane, its norm a warp shuffle,
// and the token's sines and cosines are computed once per warp for all of its heads. (The kernel it replaced ran one
// 64-thread block per (token, head) with two block barriers and recomputed powf and sincosf per head: 55.6 us at the
// shape above, ncu.)
//
// STORE (qk_norm_rope_store, a decode step over the paged KV cache): the token's k heads, as rounded, and its v heads
// also go to slot slots[t] of the layer's caches ([n_slots][nkv * hd], nothing for slot -1: a padding row); the v
// heads are extra warps' work in the same loop (the kv_store launch that it saves is one launch's latency, ~2 us in a
// graph).
//
// STORE of the e4m3 cache (FM_KV_E4M3, quant/kv_e4m3.h): the same warps write codes and scales instead: a head's
// values are its warp's lanes' pairs, so its amax is one more warp max (over the values as rounded to bf16 for a k
// head, what kv_store reads back from the qkv row), then each lane converts its pairs with the scale of kv_store.cu's
// kernel (kv_store.cuh's helpers): the bits of qk_norm_rope + kv_store(e4m3).
//
// Programmatic dependent launch (pdl.cuh, `pdl`): the positions and slots are the step's inputs, staged by the host,
// so the kernel reads them and computes its token's sines and cosines (powf, sincosf) before it waits for the
// earlier kernels, then lets the next one start; the rows are the projection's output, read after the wait. The
// norm weights are read where they are used, after the wait: a few hundred bytes, not worth registers held early.
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/rope_device.cuh"

#define ROPE_WARPS 8

// k_cache, v_cache: A [n_slots][nkv hd] (ROPE_STORE_ACT) or e4m3 rows of row_b bytes (ROPE_STORE_E4M3, bf16)
template <typename A, int R, int STORE>
static __global__ __launch_bounds__(ROPE_WARPS * 32) void qk_norm_rope_kernel(
    A *qkv, int32_t nh, int32_t nkv, int32_t hd, const A *q_norm, const A *k_norm, float eps, int64_t pos0,
    const int32_t *pos, float theta, const int32_t *slots, void *k_cache, void *v_cache, int64_t row_b) {
    const int64_t t = blockIdx.x;
    const int64_t slot = STORE ? (int64_t)slots[t] : -1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* this lane's pairs: j = 64 r + 2 lane + c, c in {0, 1}, where j < half */
    float cs[R][2], sn[R][2];
    rope_angles<R>((float)(pos ? (int64_t)pos[t] : pos0 + t), theta, hd, lane, cs, sn);
    pdl_wait(); /* the positions and slots above are the host's; the rows below the projection's */
    const int heads = STORE ? nh + 2 * nkv : nh + nkv;
    for (int h = (int)blockIdx.y * ROPE_WARPS + warp; h < heads; h += (int)gridDim.y * ROPE_WARPS)
        rope_head<A, R, STORE>(qkv + t * (int64_t)(nh + 2 * nkv) * hd, h, nh, nkv, hd, q_norm, k_norm, eps, cs, sn,
                               slot, k_cache, v_cache, row_b);
}
template <typename A>
using rope_kernel_t = void (*)(A *, int32_t, int32_t, int32_t, const A *, const A *, float, int64_t, const int32_t *,
                               float, const int32_t *, void *, void *, int64_t);
// the e4m3 store's kernel: bf16 only (the launcher refuses fp32 before), so no fp32 instance is compiled
template <int R> static rope_kernel_t<__nv_bfloat16> rope_e4m3_kernel(__nv_bfloat16 *) {
    return qk_norm_rope_kernel<__nv_bfloat16, R, ROPE_STORE_E4M3>;
}
template <int R> static rope_kernel_t<float> rope_e4m3_kernel(float *) { return NULL; }

template <typename A>
static void qk_norm_rope(A *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const A *q_norm, const A *k_norm,
                         float eps, int64_t pos0, const int32_t *pos, double theta, const int32_t *slots, void *k_cache,
                         void *v_cache, fm_kv_dtype kv, bool pdl, cudaStream_t s) {
    if (hd % 4 != 0 || hd > 256 || T > INT32_MAX) {
        fprintf(stderr, "fp8moe: qk_norm_rope: unsupported head_dim %d or T %lld\n", hd, (long long)T);
        abort();
    }
    const bool store = slots != NULL, e4m3 = store && kv == FM_KV_E4M3;
    if (e4m3 && sizeof(A) != 2) {
        fprintf(stderr, "fp8moe: qk_norm_rope_store: the e4m3 KV cache takes bf16 activations only\n");
        abort();
    }
    if (e4m3 && ((uintptr_t)k_cache | (uintptr_t)v_cache) % 16 != 0) {
        fprintf(stderr, "fp8moe: qk_norm_rope_store: the e4m3 caches must be 16-byte aligned\n");
        abort();
    }
    if (T == 0) return;
    /* Y: head groups per token, so that short steps still fill the GPU (about 2 blocks per SM of an H200); R =
       ceil(hd / 2 / 64) pair rounds per lane */
    const float th = (float)theta;
    const int64_t groups = fm_ceil_div(nh + nkv + (store ? nkv : 0), ROPE_WARPS), want = fm_ceil_div(264, T);
    const int64_t row_b = e4m3 ? fm_kv_e4m3_row_bytes(nkv, hd) : 0;
    dim3 grid((unsigned)T, (unsigned)(want < groups ? want : groups)), block(ROPE_WARPS * 32);
    rope_kernel_t<A> kernel;
    if (hd <= 128)
        kernel = e4m3    ? rope_e4m3_kernel<1>((A *)NULL)
                 : store ? qk_norm_rope_kernel<A, 1, ROPE_STORE_ACT>
                         : qk_norm_rope_kernel<A, 1, ROPE_STORE_NONE>;
    else
        kernel = e4m3    ? rope_e4m3_kernel<2>((A *)NULL)
                 : store ? qk_norm_rope_kernel<A, 2, ROPE_STORE_ACT>
                         : qk_norm_rope_kernel<A, 2, ROPE_STORE_NONE>;
    pdl_launch(kernel, grid, block, 0, s, pdl, qkv, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, th, slots, k_cache,
               v_cache, row_b);
    FM_LAUNCH_CHECK(store ? "qk_norm_rope_store" : "qk_norm_rope");
}

extern "C" void fm_cuda_qk_norm_rope(__nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                     const __nv_bfloat16 *q_norm, const __nv_bfloat16 *k_norm, float eps, int64_t pos0,
                                     const int32_t *pos, double theta, bool pdl, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, theta, (const int32_t *)NULL, NULL, NULL,
                 FM_KV_ACT, pdl, s);
}

extern "C" void fm_cuda_qk_norm_rope_f32(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                         const float *q_norm, const float *k_norm, float eps, int64_t pos0,
                                         const int32_t *pos, double theta, bool pdl, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, theta, (const int32_t *)NULL, NULL, NULL,
                 FM_KV_ACT, pdl, s);
}

extern "C" void fm_cuda_qk_norm_rope_store(__nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                           const __nv_bfloat16 *q_norm, const __nv_bfloat16 *k_norm, float eps,
                                           const int32_t *pos, double theta, const int32_t *slots, void *k_cache,
                                           void *v_cache, fm_kv_dtype kv, bool pdl, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, 0, pos, theta, slots, k_cache, v_cache, kv, pdl, s);
}

extern "C" void fm_cuda_qk_norm_rope_store_f32(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                               const float *q_norm, const float *k_norm, float eps, const int32_t *pos,
                                               double theta, const int32_t *slots, float *k_cache, float *v_cache,
                                               bool pdl, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, 0, pos, theta, slots, k_cache, v_cache, FM_KV_ACT, pdl, s);
}
