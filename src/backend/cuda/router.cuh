// Routing from router logits: top-k experts and their weights per token.
#ifndef FM_CUDA_ROUTER_CUH
#define FM_CUDA_ROUTER_CUH

#include "backend/cuda/cuda_common.cuh"

// logits [T, E] bf16 -> ids [T, k] int32 (descending, ties to the lower index) and weights [T, k] bf16.
// softmax_topk (Qwen3): fp32 softmax over all E, top-k, renormalise the k when norm_topk.
// otherwise (Mixtral): top-k of the logits, fp32 softmax over the k.
// shared (Qwen3-Next, its shared expert the bank's last expert; with softmax_topk): E and k count it; the top-(k - 1)
// of the first E - 1 as above, then the pair (E - 1, sigmoid(logit E - 1)).
// Preconditions: 1 <= k - shared <= min(E - shared, 32). pdl: launched with programmatic dependent launch (pdl.cuh;
// fm_routes_pdl of the caller's route table).
extern "C" void fm_cuda_route(const __nv_bfloat16 *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                              bool norm_topk, bool shared, int32_t *ids, __nv_bfloat16 *weights, bool pdl,
                              cudaStream_t s);
// the same over fp32 logits and weights (the ref32 oracle)
extern "C" void fm_cuda_route_f32(const float *logits, int64_t T, int32_t E, int32_t k, bool softmax_topk,
                                  bool norm_topk, bool shared, int32_t *ids, float *weights, bool pdl, cudaStream_t s);

// The router GEMV and the routing in one launch (router.cu), for T <= FM_ROUTER_FUSED_MAX_T tokens, E <= 1024
// experts, H and ld multiples of 8 (fm_cuda_router_fused_takes). W bf16 [E][ld]; logits [T][E] bf16 as the GEMM
// writes them. counter: one unsigned in device memory, zero before the first launch (left zero after each).
#define FM_ROUTER_FUSED_MAX_T 8
extern "C" bool fm_cuda_router_fused_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld);
extern "C" void fm_cuda_router_fused(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x,
                                     int64_t T, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                                     __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights, unsigned *counter,
                                     bool pdl, cudaStream_t s);
// The same in one thread-block cluster of ceil(E / 16) <= 8 CTAs (route router.cluster; sm_90 only): the logits meet
// in the first CTA's shared memory, with no counter, fence or reload through L2 (router.cu, router_cluster_kernel).
// The same logits, ids and weights as fm_cuda_router_fused, bit for bit. Needs fm_cuda_router_cluster_takes
// (fm_cuda_router_fused_takes and E <= 128).
extern "C" bool fm_cuda_router_cluster_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld);
extern "C" void fm_cuda_router_cluster(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H, const __nv_bfloat16 *x,
                                       int64_t T, int32_t k, bool softmax_topk, bool norm_topk, bool shared,
                                       __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights, bool pdl,
                                       cudaStream_t s);

// The same launch whose last CTA then dispatches the routed rows for the experts' decode GEMVs (route
// moe.dispatch=fused): b and tile_rows as fm_cuda_moe_dispatch_small takes them (x the same rows, ids the routing
// above, k and E the router's), with its results bit for bit; e4m3 1x128 rows only (b->fmt e4m3, no per-token rows),
// T k <= FM_MOE_GEMV_MAX_PAIRS, E <= 1024 (fm_cuda_router_dispatch_takes).
struct fm_dispatch_bufs;
extern "C" bool fm_cuda_router_dispatch_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t ld);
extern "C" void fm_cuda_router_dispatch(const __nv_bfloat16 *W, int64_t ld, int32_t E, int64_t H,
                                        const __nv_bfloat16 *x, int64_t T, int32_t k, bool softmax_topk, bool norm_topk,
                                        bool shared, __nv_bfloat16 *logits, int32_t *ids, __nv_bfloat16 *weights,
                                        unsigned *counter, int32_t tile_rows, const struct fm_dispatch_bufs *b,
                                        bool pdl, cudaStream_t s);

#endif
