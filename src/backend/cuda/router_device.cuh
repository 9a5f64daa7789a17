// The routing arithmetic shared by the router kernels (router.cu) and the persistent decode MoE block
// (moe_decode_block.cu): each token's top-k by one warp, and the fused routers' GEMV of one expert row. Both users
// run the same code, so their logits, experts and weights agree bit for bit.
#ifndef FM_CUDA_ROUTER_DEVICE_CUH
#define FM_CUDA_ROUTER_DEVICE_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/router.cuh"

#define FM_ROUTE_MAX_K 32

// The k selected values (probabilities or logits, descending) become weights: renormalised probabilities
// (Qwen3 with norm_topk), the probabilities as they are, or a softmax over the k logits (Mixtral). With the shared
// expert in the bank (shared = its index, the last of the E logits, else -1), its pair (shared, sigmoid(shared_logit))
// follows the k: a token's k + 1 pairs.
template <typename A>
static __device__ void finish_route(float *w, const int32_t *id, int64_t t, int32_t k, bool softmax_topk,
                                    bool norm_topk, int32_t shared, float shared_logit, int32_t *ids, A *weights) {
    if (softmax_topk) {
        if (norm_topk) {
            float s = 0.0f;
            for (int32_t j = 0; j < k; j++) s += w[j];
            for (int32_t j = 0; j < k; j++) w[j] /= s;
        }
    } else {
        const float top = w[0];
        float s = 0.0f;
        for (int32_t j = 0; j < k; j++) s += (w[j] = expf(w[j] - top));
        for (int32_t j = 0; j < k; j++) w[j] /= s;
    }
    const int32_t stride = k + (shared >= 0);
    for (int32_t j = 0; j < k; j++) {
        ids[t * stride + j] = id[j];
        act_store(&weights[t * stride + j], w[j]);
    }
    if (shared >= 0) {
        ids[t * stride + k] = shared;
        act_store(&weights[t * stride + k], 1.0f / (1.0f + expf(-shared_logit)));
    }
}

#define WARP_E_MAX 32 /* experts per lane: E <= 1024 (the bit mask of taken experts has 32 bits) */

// The values a token's top-k compares, by one warp: lane l's v[i] for expert l + 32 i of the E <= 32 WARP_E logits at
// l (L2: read through L2 only, for logits another CTA of the same kernel wrote): the probabilities (softmax_topk; the
// max and the sum in this lane and shuffle order) or the logits; -inf past E.
template <typename A, bool L2, int WARP_E>
static __device__ __forceinline__ void route_warp_values(const A *l, int32_t E, bool softmax_topk, float (&v)[WARP_E]) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < WARP_E; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? act_load(L2 ? __ldcg(l + e) : l[e]) : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (softmax_topk) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < WARP_E; i++)
            if (lane + 32 * i < E) sum += expf(v[i] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < WARP_E; i++)
            if (lane + 32 * i < E) v[i] = expf(v[i] - mx) / sum;
    }
}

// A float's key in unsigned order (larger float, larger key; -0 as +0; not for NaN)
static __device__ __forceinline__ unsigned route_order_key(float v) {
    const unsigned b = __float_as_uint(v + 0.0f); /* -0 + 0 = +0 */
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// Token t's routing by one warp (route_warp_values, then k rounds of a warp argmax, ties to the lower index)
template <typename A, bool L2, int WARP_E>
static __device__ void route_warp_token_n(const A *l, int64_t t, int32_t E, int32_t k, bool softmax_topk,
                                          bool norm_topk, bool shared, int32_t *ids, A *weights) {
    const int lane = threadIdx.x & 31;
    float v[WARP_E];
    route_warp_values<A, L2, WARP_E>(l, E, softmax_topk, v);
    unsigned taken = 0; /* bit i: expert lane + 32 i already chosen */
    float w[FM_ROUTE_MAX_K];
    int32_t id[FM_ROUTE_MAX_K];
    for (int32_t j = 0; j < k; j++) {
        float bv = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < WARP_E; i++) {
            const int e = lane + 32 * i;
            if (e < E && !(taken >> i & 1u) && (v[i] > bv || (v[i] == bv && e < be))) bv = v[i], be = e;
        }
        /* the warp's largest value, then the lowest expert holding it: two redux.sync instead of five rounds of
           two shuffles and a compare (the same pick: bv is never NaN, and -0 counts as +0 as the compare does),
           and the winner's value from its lane */
        const unsigned key = route_order_key(bv), top = __reduce_max_sync(0xffffffffu, key);
        be = (int)__reduce_min_sync(0xffffffffu, key == top ? (unsigned)be : 0xffffffffu);
        bv = __shfl_sync(0xffffffffu, bv, be & 31); /* the value itself (a -0 stays -0) */
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        id[j] = be, w[j] = bv;
    }
    if (lane != 0) return;
    /* E, k: the candidates and their picks; the shared expert's logit follows the E */
    const float shared_logit = shared ? act_load(L2 ? __ldcg(l + E) : l[E]) : 0.0f;
    finish_route(w, id, t, k, softmax_topk, norm_topk, shared ? E : -1, shared_logit, ids, weights);
}

// The same with the fewest experts per lane that hold E (registers: one float per expert per lane). E and k count
// the shared expert when it is in the bank (shared): its logit is the last, no candidate; its pair comes last.
// WE > 0: that many experts per lane, fixed at compile time (warp_experts of E), so that a kernel carries one variant
// of the routing, not three: the fused router runs once a layer from a cold instruction cache, and ncu counted a
// quarter of its warp samples waiting for instructions (bench/NOTES.md, twenty-ninth session).
static inline int warp_experts(int32_t E, bool shared) {
    return E - shared <= 32 * 8 ? 8 : E - shared <= 32 * 16 ? 16 : 32;
}
template <typename A, bool L2, int WE = 0>
static __device__ void route_warp_token(const A *l, int64_t t, int32_t E, int32_t k, bool softmax_topk, bool norm_topk,
                                        bool shared, int32_t *ids, A *weights) {
    E -= shared, k -= shared;
    if constexpr (WE > 0) route_warp_token_n<A, L2, WE>(l, t, E, k, softmax_topk, norm_topk, shared, ids, weights);
    else if (E <= 32 * 8) route_warp_token_n<A, L2, 8>(l, t, E, k, softmax_topk, norm_topk, shared, ids, weights);
    else if (E <= 32 * 16) route_warp_token_n<A, L2, 16>(l, t, E, k, softmax_topk, norm_topk, shared, ids, weights);
    else route_warp_token_n<A, L2, 32>(l, t, E, k, softmax_topk, norm_topk, shared, ids, weights);
}

// The router at decode sizes in one launch (fm_cuda_router_fused): one warp per expert row of the bf16 router
// weights, RF_WARPS rows per CTA (Qwen3-30B-A3B: E = 128, 16 CTAs); a lane issues all of its row's 16-byte loads
// (8 for H = 2048) before using one, multiplies them with the T <= FM_ROUTER_FUSED_MAX_T token rows (read through
// L1/L2: 4 KiB each), and the warp sum, rounded to bf16 as the GEMM's output is, goes to logits. The last CTA to
// finish (a counter in device memory, reset by that CTA, so a captured graph replays it) routes every token as
// route_warp_kernel does. Floor: E x H x 2 bytes (512 KiB, 0.12 us at 4.25 TB/s); what it saves is the
// cuBLAS GEMM's launch and tail and the route kernel's launch (ncu: 5.8 + 5.3 us per layer before).
#define RF_WARPS 8
#define RF_U 8 /* 16-byte weight loads in flight per lane */

#define RF_X_SMEM 8192 /* bf16 elements of the token rows staged in shared memory (T x H up to this) */
// The fused routers' GEMV, a warp's row e of W (e < E; else zeros, no loads) against the T token rows. rf_first_loads
// issues the row's first round of 16-byte loads (weights: before pdl_wait); rf_stage_rows copies the token rows into
// the block's shared memory when they fit (nthreads: the block's threads; then a __syncthreads); rf_row_logits
// finishes the row: token t's logit in acc[t] of every lane (fp32; rounded to bf16 as the GEMM's output is by the
// caller).
static __device__ __forceinline__ void rf_first_loads(const uint4 *w, bool live, int64_t chunks, int lane,
                                                      uint4 (&wv)[RF_U]) {
#pragma unroll
    for (int u = 0; u < RF_U; u++) {
        const int64_t c = lane + 32 * u;
        wv[u] = live && c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
    }
}

static __device__ __forceinline__ bool rf_stage_rows(const __nv_bfloat16 *x, int32_t T, int64_t H, __nv_bfloat16 *xs,
                                                     int nthreads) {
    const int64_t chunks = H / 8;
    const bool staged = (int64_t)T * H <= RF_X_SMEM;
    if (staged) {
        for (int64_t c = threadIdx.x; c < T * chunks; c += nthreads) ((uint4 *)xs)[c] = __ldcg((const uint4 *)x + c);
        __syncthreads();
    }
    return staged;
}

static __device__ __forceinline__ void rf_row_logits(const uint4 *w, int64_t chunks, int lane, uint4 (&wv)[RF_U],
                                                     const __nv_bfloat16 *x, const __nv_bfloat16 *xs, bool staged,
                                                     int32_t T, int64_t H, float (&acc)[FM_ROUTER_FUSED_MAX_T]) {
#pragma unroll
    for (int t = 0; t < FM_ROUTER_FUSED_MAX_T; t++) acc[t] = 0.0f;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * RF_U) {
        if (c0 != lane)
#pragma unroll
            for (int u = 0; u < RF_U; u++) {
                const int64_t c = c0 + 32 * u;
                wv[u] = c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < RF_U; u++) {
            const int64_t c = c0 + 32 * u;
            if (c >= chunks) break;
            const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&wv[u];
            float2 wf[4];
#pragma unroll
            for (int i = 0; i < 4; i++) wf[i] = __bfloat1622float2(wp[i]);
#pragma unroll
            for (int t = 0; t < FM_ROUTER_FUSED_MAX_T; t++) {
                if (t >= T) break;
                const uint4 xv =
                    staged ? ((const uint4 *)xs)[t * chunks + c] : __ldcg((const uint4 *)(x + (int64_t)t * H) + c);
                const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&xv;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 xf = __bfloat1622float2(xp[i]);
                    acc[t] = fmaf(wf[i].x, xf.x, acc[t]);
                    acc[t] = fmaf(wf[i].y, xf.y, acc[t]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < FM_ROUTER_FUSED_MAX_T; t++) {
        if (t >= T) break;
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
    }
}

#endif
