// Routing (see router.cuh). One warp per token for E <= 256: lane l holds experts l, l + 32, ... and each of the
// k rounds is a warp argmax (ties to the lower index); one thread per token beyond that. The selection order
// and formulas are those of the CPU reference (src/backend/cpu/cpu_moe.c), so ids match it.
#include "backend/cuda/router.cuh"

#define FM_ROUTE_MAX_K 32

// The k selected values (probabilities or logits, descending) become weights: renormalised probabilities
// (Qwen3 with norm_topk), the probabilities as they are, or a softmax over the k logits (Mixtral).
template <typename A>
static __device__ void finish_route(float *w, const int32_t *id, int64_t t, int32_t k, bool softmax_topk,
                                    bool norm_topk, int32_t *ids, A *weights) {
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
    for (int32_t j = 0; j < k; j++) {
        ids[t * k + j] = id[j];
        act_store(&weights[t * k + j], w[j]);
    }
}

template <typename A>
static __global__ void route_kernel(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk, bool norm_topk,
                                    int32_t *ids, A *weights) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const A *l = logits + t * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int32_t e = 0; e < E; e++) mx = fmaxf(mx, act_load(l[e]));
    if (softmax_topk)
        for (int32_t e = 0; e < E; e++) sum += expf(act_load(l[e]) - mx);
    int32_t id[FM_ROUTE_MAX_K];
    float w[FM_ROUTE_MAX_K];
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        float bv = 0.0f;
        for (int32_t e = 0; e < E; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j; i++) taken |= id[i] == e;
            /* the value compared is the one the CPU compares: the probability, or the logit */
            const float v = softmax_topk ? expf(act_load(l[e]) - mx) / sum : act_load(l[e]);
            if (!taken && (best < 0 || v > bv)) best = e, bv = v;
        }
        id[j] = best;
        w[j] = bv;
    }
    finish_route(w, id, t, k, softmax_topk, norm_topk, ids, weights);
}

#define WARP_E 8 /* experts per lane: E <= 256 */

template <typename A>
static __global__ void route_warp_kernel(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                         bool norm_topk, int32_t *ids, A *weights) {
    const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= T) return;
    const A *l = logits + t * E;
    float v[WARP_E];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < WARP_E; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? act_load(l[e]) : -INFINITY;
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
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (ov > bv || (ov == bv && oe < be)) bv = ov, be = oe;
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        id[j] = be, w[j] = bv;
    }
    if (lane != 0) return;
    finish_route(w, id, t, k, softmax_topk, norm_topk, ids, weights);
}

template <typename A>
static void route(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk, bool norm_topk, int32_t *ids,
                  A *weights, cudaStream_t s) {
    if (k < 1 || k > E || k > FM_ROUTE_MAX_K) {
        fprintf(stderr, "fp8moe: route: top-%d of %d experts is not supported (k <= min(E, %d))\n", k, E,
                FM_ROUTE_MAX_K);
        abort();
    }
    if (T == 0) return;
    if (E <= 32 * WARP_E)
        route_warp_kernel<<<(unsigned)fm_ceil_div(T, 4), 128, 0, s>>>(logits, T, E, k, softmax_topk, norm_topk, ids,
                                                                      weights);
    else
        route_kernel<<<(unsigned)fm_ceil_div(T, 128), 128, 0, s>>>(logits, T, E, k, softmax_topk, norm_topk, ids,
                                                                   weights);
    FM_LAUNCH_CHECK("route");
}

extern "C" void fm_cuda_route(const __nv_bfloat16 *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                              bool norm_topk, int32_t *ids, __nv_bfloat16 *weights, cudaStream_t s) {
    route(logits, T, E, k, softmax_topk, norm_topk, ids, weights, s);
}

extern "C" void fm_cuda_route_f32(const float *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                  bool norm_topk, int32_t *ids, float *weights, cudaStream_t s) {
    route(logits, T, E, k, softmax_topk, norm_topk, ids, weights, s);
}
