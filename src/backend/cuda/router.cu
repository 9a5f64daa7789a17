// Routing (see router.cuh). One thread per token: E is small (8..256) and the work per token is k scans of E
// logits, negligible next to the expert GEMMs. The selection order and formulas are those of the CPU
// reference (src/backend/cpu/cpu_moe.c), so ids match it exactly.
#include "backend/cuda/router.cuh"

#define FM_ROUTE_MAX_K 32

static __global__ void route_kernel(const __nv_bfloat16 *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                    bool norm_topk, int32_t *ids, __nv_bfloat16 *weights) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const __nv_bfloat16 *l = logits + t * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int32_t e = 0; e < E; e++) mx = fmaxf(mx, __bfloat162float(l[e]));
    if (softmax_topk)
        for (int32_t e = 0; e < E; e++) sum += expf(__bfloat162float(l[e]) - mx);
    int32_t id[FM_ROUTE_MAX_K];
    float   w[FM_ROUTE_MAX_K];
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        float   bv   = 0.0f;
        for (int32_t e = 0; e < E; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j; i++) taken |= id[i] == e;
            /* the value compared is the one the CPU compares: the probability, or the logit */
            const float v = softmax_topk ? expf(__bfloat162float(l[e]) - mx) / sum : __bfloat162float(l[e]);
            if (!taken && (best < 0 || v > bv)) best = e, bv = v;
        }
        id[j] = best;
        w[j]  = bv;
    }
    if (softmax_topk) {
        if (norm_topk) {
            float s = 0.0f;
            for (int32_t j = 0; j < k; j++) s += w[j];
            for (int32_t j = 0; j < k; j++) w[j] /= s;
        }
    } else {
        const float top = w[0];
        float       s   = 0.0f;
        for (int32_t j = 0; j < k; j++) s += (w[j] = expf(w[j] - top));
        for (int32_t j = 0; j < k; j++) w[j] /= s;
    }
    for (int32_t j = 0; j < k; j++) {
        ids[t * k + j]     = id[j];
        weights[t * k + j] = __float2bfloat16_rn(w[j]);
    }
}

extern "C" void fm_cuda_route(const __nv_bfloat16 *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                              bool norm_topk, int32_t *ids, __nv_bfloat16 *weights, cudaStream_t s) {
    if (k < 1 || k > E || k > FM_ROUTE_MAX_K) {
        fprintf(stderr, "fp8moe: route: top-%d of %d experts is not supported (k <= min(E, %d))\n", k, E, FM_ROUTE_MAX_K);
        abort();
    }
    if (T == 0) return;
    route_kernel<<<(unsigned)fm_ceil_div(T, 128), 128, 0, s>>>(logits, T, E, k, softmax_topk, norm_topk, ids, weights);
    FM_LAUNCH_CHECK("route");
}
