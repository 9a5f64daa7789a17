// Routing (see router.cuh). One warp per token for E <= 1024: lane l holds experts l, l + 32, ... (8, 16 or 32 of
// them, by E) and each of the k rounds is a warp argmax (ties to the lower index); one thread per token beyond that
// (E = 512, k = 10, Qwen3-Next: 1.1 ms per token on one thread, 10 us on a warp). The selection order
// and formulas are those of the CPU reference (src/backend/cpu/cpu_moe.c), so ids match it.
//
// Programmatic dependent launch (pdl.cuh, `pdl`): the kernels let the next one start at their top; the route
// kernels wait for the earlier ones at once (their logits are the GEMM's), the fused router issues its first round
// of router-matrix loads (no kernel writes the weights) before its wait.
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/router_device.cuh"

template <typename A>
static __global__ void route_kernel(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk, bool norm_topk,
                                    bool shared, int32_t *ids, A *weights) {
    pdl_wait();
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const A *l = logits + t * E;
    const float shared_logit = shared ? act_load(l[E - 1]) : 0.0f;
    E -= shared, k -= shared; /* the shared expert is no candidate */
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
    finish_route(w, id, t, k, softmax_topk, norm_topk, shared ? E : -1, shared_logit, ids, weights);
}

// WE: experts a lane (warp_experts of E), fixed at compile time: one variant of the routing a kernel (with all three
// inlined, half of the kernel's stall samples at Qwen3's B = 64 were its warps waiting for instructions: ncu,
// bench/NOTES.md, forty-fourth session)
template <typename A, int WE>
static __global__ void route_warp_kernel(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                         bool norm_topk, bool shared, int32_t *ids, A *weights) {
    pdl_wait();
    const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T) return;
    route_warp_token<A, false, WE>(logits + t * E, t, E, k, softmax_topk, norm_topk, shared, ids, weights);
}

// DISPATCH (route moe.dispatch=fused, fm_cuda_router_dispatch): the last CTA then runs the e4m3 small dispatch of the
// experts' GEMVs (dispatch_block: fm_cuda_moe_dispatch_small's results) on the ids it just wrote, with its RF_WARPS
// warps, its plan in the shared memory of the staged rows (done with by then): the dispatch's launch saved.
static_assert(DISPATCH_BLOCK_SMEM(RF_WARPS * 32) * 4 <= RF_X_SMEM * 2, "the dispatch's plan fits the staged rows");

template <bool DISPATCH, int WE>
static __global__ void __launch_bounds__(RF_WARPS * 32)
    router_fused_kernel(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x, int32_t T,
                        int32_t k, bool softmax_topk, bool norm_topk, bool shared, __nv_bfloat16 *logits, int32_t *ids,
                        __nv_bfloat16 *weights, unsigned *counter, int32_t bn, fm_dispatch_bufs b) {
    __shared__ bool last;
    /* the token rows, when they fit: each lane's products then wait for shared memory, not for an L2 round trip per
       16-byte chunk (ncu, Qwen3-Next decode: 18 us, the samples on the uses of x loaded one chunk after another) */
    __shared__ __align__(16) __nv_bfloat16 xs[RF_X_SMEM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t e = blockIdx.x * RF_WARPS + warp;
    const int64_t chunks = H / 8;
    const uint4 *w = (const uint4 *)(W + (int64_t)(e < E ? e : 0) * ld);
    uint4 wv[RF_U];
    rf_first_loads(w, e < E, chunks, lane, wv);
    pdl_wait(); /* from here on x may be read, logits, ids, weights and the counter written */
    const bool staged = rf_stage_rows(x, T, H, xs, RF_WARPS * 32);
    if (e < E) {
        float acc[FM_ROUTER_FUSED_MAX_T];
        rf_row_logits(w, chunks, lane, wv, x, xs, staged, T, H, acc);
#pragma unroll
        for (int t = 0; t < FM_ROUTER_FUSED_MAX_T; t++) {
            if (t >= T) break;
            if (lane == 0) logits[(int64_t)t * E + e] = __float2bfloat16_rn(acc[t]);
        }
        __threadfence(); /* the logits before the count that tells the last CTA they are there */
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int32_t t = warp; t < T; t += RF_WARPS)
        route_warp_token<__nv_bfloat16, true, WE>(logits + (int64_t)t * E, t, E, k, softmax_topk, norm_topk, shared,
                                                  ids, weights);
    if (DISPATCH) {
        __syncthreads(); /* every token's ids (written above by lane 0 of its warp), and no thread still reads xs */
        dispatch_block<RF_WARPS * 32>(x, T, k, H, ids, E, bn, b, (int32_t *)xs);
    }
    if (threadIdx.x == 0) *counter = 0u;
}

// The same router as one thread-block cluster (route router.cluster, sm_90): RC_WARPS warps a CTA, one row each,
// ceil(E / RC_WARPS) <= 8 CTAs (E <= 128). Each warp's logits go to global memory and, through distributed shared
// memory, into CTA 0's table; one cluster barrier (release / acquire) then hands CTA 0 every logit, and its warps route
// the tokens from shared memory. What it saves against router_fused_kernel: the __threadfence after the logits, the
// atomic counter's round trip, the last CTA's fence and its reload of the logits through L2 (under ncu on an H100 that
// kernel takes 12 us for 0.5 MB, its stalls on membar, barrier and dependencies: bench/NOTES.md, twenty-ninth
// session). Every CTA arrives on the cluster barrier at its top and waits before its first remote store, so CTA 0 has
// started when it is written to. The logits are the same bits as router_fused_kernel's (the same row code).
#define RC_WARPS 16
#define RC_MAX_CTAS 8 /* the portable cluster size */

static __global__ void __launch_bounds__(RC_WARPS * 32)
    router_cluster_kernel(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x, int32_t T,
                          int32_t k, bool softmax_topk, bool norm_topk, bool shared, __nv_bfloat16 *logits,
                          int32_t *ids, __nv_bfloat16 *weights) {
    __shared__ __align__(16) __nv_bfloat16 xs[RF_X_SMEM];
    __shared__ __nv_bfloat16 table[FM_ROUTER_FUSED_MAX_T * RC_WARPS * RC_MAX_CTAS]; /* CTA 0's: [T][E] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t e = blockIdx.x * RC_WARPS + warp;
    const int64_t chunks = H / 8;
    const uint4 *w = (const uint4 *)(W + (int64_t)(e < E ? e : 0) * ld);
    cluster_arrive_relaxed(); /* this CTA has started (waited on before the first remote store) */
    uint4 wv[RF_U];
    rf_first_loads(w, e < E, chunks, lane, wv);
    pdl_wait(); /* from here on x may be read, logits, ids and weights written */
    const bool staged = rf_stage_rows(x, T, H, xs, RC_WARPS * 32);
    float acc[FM_ROUTER_FUSED_MAX_T];
    if (e < E) rf_row_logits(w, chunks, lane, wv, x, xs, staged, T, H, acc);
    cluster_wait_acquire(); /* every CTA of the cluster has started: CTA 0's table may be written */
    if (e < E && lane == 0)
#pragma unroll
        for (int t = 0; t < FM_ROUTER_FUSED_MAX_T; t++) {
            if (t >= T) break;
            const __nv_bfloat16 v = __float2bfloat16_rn(acc[t]);
            logits[(int64_t)t * E + e] = v;
            st_cluster_bf16(&table[t * E + e], 0, v);
        }
    cluster_arrive_release(); /* the remote stores, then */
    cluster_wait_acquire();   /* every CTA's: CTA 0 reads the whole table */
    if (cluster_rank() != 0) return;
    for (int32_t t = warp; t < T; t += RC_WARPS)
        route_warp_token<__nv_bfloat16, false, 8>(table + t * E, t, E, k, softmax_topk, norm_topk, shared, ids,
                                                  weights); /* E <= 128 */
}

// top-k of E experts (with the shared expert in the bank, E and k count it: top-(k - 1) of E - 1, then its pair)
static bool route_takes(int32_t E, int32_t k, bool shared) {
    const int32_t En = E - shared, kn = k - shared;
    return kn >= 1 && kn <= En && kn <= FM_ROUTE_MAX_K;
}

template <typename A>
static void route(const A *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                  int32_t *ids, A *weights, bool pdl, cudaStream_t s) {
    if (!route_takes(E, k, shared)) {
        fprintf(stderr, "fp8moe: route: top-%d of %d experts%s is not supported (k <= min(E, %d))\n", k, E,
                shared ? " (the shared expert counted)" : "", FM_ROUTE_MAX_K);
        abort();
    }
    if (T == 0) return;
    if (E - shared <= 32 * WARP_E_MAX) {
#define RW_LAUNCH(WE_)                                                                                                 \
    pdl_launch(route_warp_kernel<A, WE_>, (unsigned)fm_ceil_div(T, 4), 128, 0, s, pdl, logits, T, E, k, softmax_topk,  \
               norm_topk, shared, ids, weights)
        switch (warp_experts(E, shared)) {
        case 8: RW_LAUNCH(8); break;
        case 16: RW_LAUNCH(16); break;
        default: RW_LAUNCH(32); break;
        }
#undef RW_LAUNCH
    } else
        pdl_launch(route_kernel<A>, (unsigned)fm_ceil_div(T, 128), 128, 0, s, pdl, logits, T, E, k, softmax_topk,
                   norm_topk, shared, ids, weights);
    FM_LAUNCH_CHECK("route");
}

// router_fused_kernel with the routing's variant for E (warp_experts)
template <bool DISPATCH>
static void router_fused_launch(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x,
                                int64_t T, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                                __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights, unsigned *counter,
                                int32_t bn, const fm_dispatch_bufs &b, bool pdl, cudaStream_t s) {
    const unsigned grid = (unsigned)fm_ceil_div(E, RF_WARPS);
#define RF_LAUNCH(WE_)                                                                                                 \
    pdl_launch(router_fused_kernel<DISPATCH, WE_>, grid, RF_WARPS * 32, 0, s, pdl, W, ld, E, H, x, (int32_t)T, k,      \
               softmax_topk, norm_topk, shared, logits, ids, weights, counter, bn, b)
    switch (warp_experts(E, shared)) {
    case 8: RF_LAUNCH(8); break;
    case 16: RF_LAUNCH(16); break;
    default: RF_LAUNCH(32); break;
    }
#undef RF_LAUNCH
}

bool fm_cuda_router_fused_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld) {
    return T >= 1 && T <= FM_ROUTER_FUSED_MAX_T && E - shared <= 32 * WARP_E_MAX && route_takes(E, k, shared) &&
           H % 8 == 0 && ld % 8 == 0;
}

extern "C" void fm_cuda_router_fused(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x,
                                     int64_t T, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                                     __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights, unsigned *counter,
                                     bool pdl, cudaStream_t s) {
    if (!fm_cuda_router_fused_takes(T, E, k, shared, H, ld)) {
        fprintf(stderr, "fp8moe: router_fused: unsupported shape (T %lld, E %d, k %d, H %lld, ld %lld)\n", (long long)T,
                E, k, (long long)H, (long long)ld);
        abort();
    }
    fm_dispatch_bufs none;
    memset(&none, 0, sizeof none);
    router_fused_launch<false>(W, ld, E, H, x, T, k, softmax_topk, norm_topk, shared, logits, ids, weights, counter, 0,
                               none, pdl, s);
    FM_LAUNCH_CHECK("router_fused");
}

bool fm_cuda_router_cluster_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld) {
    return fm_cuda_router_fused_takes(T, E, k, shared, H, ld) && E <= RC_WARPS * RC_MAX_CTAS;
}

extern "C" void fm_cuda_router_cluster(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x,
                                       int64_t T, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                                       __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights, bool pdl,
                                       cudaStream_t s) {
    if (!fm_cuda_router_cluster_takes(T, E, k, shared, H, ld)) {
        fprintf(stderr, "fp8moe: router_cluster: unsupported shape (T %lld, E %d, k %d, H %lld, ld %lld; E <= %d)\n",
                (long long)T, E, k, (long long)H, (long long)ld, RC_WARPS * RC_MAX_CTAS);
        abort();
    }
    const unsigned ctas = (unsigned)fm_ceil_div(E, RC_WARPS);
    cudaLaunchAttribute attr[2] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = ctas, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ctas), cfg.blockDim = dim3(RC_WARPS * 32), cfg.stream = s;
    cfg.attrs = attr, cfg.numAttrs = pdl ? 2 : 1;
    cudaLaunchKernelEx(&cfg, router_cluster_kernel, W, ld, E, H, x, (int32_t)T, k, softmax_topk, norm_topk, shared,
                       logits, ids, weights);
    FM_LAUNCH_CHECK("router_cluster");
}

bool fm_cuda_router_dispatch_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld) {
    return fm_cuda_router_fused_takes(T, E, k, shared, H, ld) && E <= MAX_EXPERTS && T * k <= FM_MOE_GEMV_MAX_PAIRS;
}

extern "C" void fm_cuda_router_dispatch(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H,
                                        const __nv_bfloat16 *x, int64_t T, int32_t k, bool softmax_topk, bool norm_topk,
                                        bool shared, __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights,
                                        unsigned *counter, int32_t tile_rows, const fm_dispatch_bufs *b, bool pdl,
                                        cudaStream_t s) {
    if (!fm_cuda_router_dispatch_takes(T, E, k, shared, H, ld) || b->fmt != FM_W4A8_DISPATCH_E4M3 || b->per_token ||
        tile_rows < 1) {
        fprintf(stderr,
                "fp8moe: router_dispatch: unsupported (T %lld, E %d, k %d, H %lld, ld %lld, tile rows %d; e4m3 1x128 "
                "rows only, at most %d pairs)\n",
                (long long)T, E, k, (long long)H, (long long)ld, tile_rows, FM_MOE_GEMV_MAX_PAIRS);
        abort();
    }
    router_fused_launch<true>(W, ld, E, H, x, T, k, softmax_topk, norm_topk, shared, logits, ids, weights, counter,
                              tile_rows, *b, pdl, s);
    FM_LAUNCH_CHECK("router_dispatch");
}

extern "C" void fm_cuda_route(const __nv_bfloat16 *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                              bool norm_topk, bool shared, int32_t *ids, __nv_bfloat16 *weights, bool pdl,
                              cudaStream_t s) {
    route(logits, T, E, k, softmax_topk, norm_topk, shared, ids, weights, pdl, s);
}

extern "C" void fm_cuda_route_f32(const float *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                  bool norm_topk, bool shared, int32_t *ids, float *weights, bool pdl, cudaStream_t s) {
    route(logits, T, E, k, softmax_topk, norm_topk, shared, ids, weights, pdl, s);
}
