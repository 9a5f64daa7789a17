// Device-side routing dispatch and e4m3 row quantization (moe_dispatch.cuh; the expert-parallel dispatch of the ranks
// is ep_dispatch.cu, the group quantizers both use moe_dispatch_device.cuh). Memory-bound except the tile planning,
// which is one small block: the floor is reading x once per routed pair and writing the e4m3 copy.
#include <cuda_fp8.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/ep_blocks.h"
#include "backend/w4a8_workspace.h"

// One block of MAX_EXPERTS threads: each expert's rows counted in shared memory (no counters in global memory, so
// nothing to zero before the dispatch: a memset is a graph node that breaks the PDL chain), then scans of the counts
// and of the tiles (bn rows at most) per expert (Hillis-Steele in shared). amax_word (NVFP4: the word the amax pass
// accumulates into; else NULL) is zeroed here for the same reason. SLOTS (route moe.plan_slots, P <= PLAN_SLOTS_MAX):
// the block then gives every pair its slot as slot_kernel does (each thread its own pairs, from the ids it counted,
// the cursors in shared memory): that kernel's launch saved.
#define PLAN_SLOTS_MAX (4 * MAX_EXPERTS)
template <bool SLOTS>
static __global__ void __launch_bounds__(MAX_EXPERTS)
    plan_kernel(const int32_t *ids, int64_t P, int32_t E, int32_t bn, int32_t *seg_start, int32_t *cursor,
                fm_w4a8_tile *tiles, int32_t *n_tiles, const int32_t *matrix_of, uint32_t *amax_word,
                int32_t *pair_of_slot, int32_t *slot_of_pair, uint8_t *h, int64_t h_cols) {
    __shared__ int32_t rows[MAX_EXPERTS], ntl[MAX_EXPERTS];
    __shared__ int32_t seg[SLOTS ? MAX_EXPERTS : 1], cur[SLOTS ? MAX_EXPERTS : 1];
    const int e = threadIdx.x;
    rows[e] = 0;
    if (SLOTS) cur[e] = 0;
    pdl_wait(); /* ids are the router's; the buffers written below, what the previous layer's kernels read */
    __syncthreads();
    int32_t id[4] = {-1, -1, -1, -1};                     /* SLOTS: the one round's ids, kept for the slots */
    for (int64_t p0 = 0; p0 < P; p0 += 4 * MAX_EXPERTS) { /* 4 loads in flight per thread before the atomics */
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t p = p0 + u * MAX_EXPERTS + e;
            id[u] = p < P ? ids[p] : -1;
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (id[u] >= 0) atomicAdd(&rows[id[u]], 1); /* -1: an empty place (expert parallelism's blocks) */
    }
    __syncthreads();
    const int32_t c = e < E ? rows[e] : 0;
    rows[e] = c, ntl[e] = (c + bn - 1) / bn; /* each thread its own entry: no barrier between the read and the write */
    __syncthreads();
    for (int o = 1; o < MAX_EXPERTS; o <<= 1) {
        const int32_t r = e >= o ? rows[e - o] : 0, n = e >= o ? ntl[e - o] : 0;
        __syncthreads();
        rows[e] += r, ntl[e] += n;
        __syncthreads();
    }
    if (e < E) {
        const int32_t start = rows[e] - c, first_tile = ntl[e] - (c + bn - 1) / bn;
        seg_start[e] = start;
        if (SLOTS) seg[e] = start;
        else cursor[e] = 0; /* the slot kernel's counters */
        for (int32_t i = 0; i * bn < c; i++) {
            const int32_t n = c - i * bn < bn ? c - i * bn : bn;
            fm_w4a8_tile t = {matrix_of ? matrix_of[e] : e, start + i * bn, n, 0};
            tiles[first_tile + i] = t;
        }
        if (e == E - 1) *n_tiles = ntl[e];
    }
    if (e == 0 && amax_word) *amax_word = 0u;
    if (!SLOTS) return;
    __syncthreads(); /* every expert's segment start */
    const int64_t ldh = (h_cols + 127) / 128 * 128;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int64_t p = u * MAX_EXPERTS + e;
        if (p >= P) break;
        if (id[u] < 0) { /* an empty place */
            slot_of_pair[p] = -1;
            continue;
        }
        const int32_t slot = seg[id[u]] + atomicAdd(&cur[id[u]], 1);
        pair_of_slot[slot] = (int32_t)p;
        slot_of_pair[p] = slot;
        if (h)
            for (int64_t col = h_cols & ~(int64_t)3; col < ldh; col += 4) *(uint32_t *)(h + slot * ldh + col) = 0u;
    }
}

// One thread per routed pair: its slot in its expert's segment (pair_of_slot for the down GEMM's rows and
// slot_of_pair for the gather below). h (fm_dispatch_bufs.h): the slot's row of h zeroed past h_cols, in words from
// h_cols rounded down to 4 (columns the gate|up GEMM, launched after this kernel, overwrites).
static __global__ void slot_kernel(const int32_t *ids, int64_t P, const int32_t *seg_start, int32_t *cursor,
                                   int32_t *pair_of_slot, int32_t *slot_of_pair, uint8_t *h, int64_t h_cols) {
    pdl_wait();
    const int64_t ldh = (h_cols + 127) / 128 * 128;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[p];
        if (e < 0) { /* an empty place */
            slot_of_pair[p] = -1;
            continue;
        }
        const int32_t slot = seg_start[e] + atomicAdd(&cursor[e], 1);
        pair_of_slot[slot] = (int32_t)p;
        slot_of_pair[p] = slot;
        if (h)
            for (int64_t c = h_cols & ~(int64_t)3; c < ldh; c += 4) *(uint32_t *)(h + slot * ldh + c) = 0u;
    }
}

template <bool SUMS>
static __global__ void gather_quantize_kernel(const __nv_bfloat16 *x, int64_t T, int32_t k, int64_t H,
                                              const int32_t *slot_of_pair, uint8_t *x8, float *xs, float *xsum) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < T * G; task += warps) {
        const int64_t t = task / G;
        gather_quantize_task<SUMS>(x, H, k, T * k, t, task % G, lane < k ? slot_of_pair[t * k + lane] : 0, x8, xs,
                                   xsum);
    }
}

// ---- per token (fold banks): one scale per row, fm_w4a8_fold_quantize_tokens bit for bit -------------------------
// The row's amax is the largest of its groups' (exact: a max), each from 0 with fmaxf (NaN skipped), as
// fm_cuda_fold_quantize_tokens takes it; scale = max(amax / 448, 1e-12), code = e4m3_rne_satfinite(x / scale).

// the largest |v| of this lane's 4 values of a group, over the warp (every lane gets it)
static __device__ __forceinline__ float group_amax(const float v[4]) {
    float m = fmaxf(0.0f, fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

static __device__ __forceinline__ float token_scale(float amax) {
    return fmaxf(amax / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
}

// group grp of row t (x [T][H]) with the token's scale into its k slots (lane j < k holds the j-th slot)
static __device__ __forceinline__ void token_group_store(const __nv_bfloat16 *x, int64_t H, int32_t k, int64_t t,
                                                         int64_t grp, float scale, int32_t slot, uint8_t *x8) {
    const int lane = threadIdx.x & 31;
    const int64_t Hp = (H + 127) / 128 * 128, k0 = grp * 128 + lane * 4;
    float v[4];
    load_group(x + t * H, H, grp, v);
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; i++)
        word |= (k0 + i < H ? (uint32_t)__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3) : 0u) << (8 * i);
    for (int j = 0; j < k; j++) {
        const int64_t s = __shfl_sync(0xffffffffu, slot, j);
        *(uint32_t *)(x8 + s * Hp + grp * 128 + lane * 4) = word;
    }
}

// One CTA (TOKEN_WARPS warps) per token: each warp takes groups warp, warp + TOKEN_WARPS, ... of the row for the
// amax, the CTA's warps meet in shared memory, then each warp stores its groups with the token's scale into the k
// slots (the second read of the row from L1) and xs[slot] = scale; with spread (token_groups) xs[g * spread + slot]
// = scale for each group g instead. (One warp per token, looping over the groups, made every token a chain of 2 G
// dependent loads: ~15 us for 2,048 tokens where the per-group dispatch takes a few.) The max is exact in any order,
// so the codes and scales are those of fm_cuda_fold_quantize_tokens bit for bit.
#define TOKEN_WARPS 8
static __global__ void __launch_bounds__(TOKEN_WARPS * 32)
    gather_quantize_token_kernel(const __nv_bfloat16 *x, int64_t T, int32_t k, int64_t H, const int32_t *slot_of_pair,
                                 uint8_t *x8, float *xs, int64_t spread) {
    __shared__ float warp_amax[TOKEN_WARPS];
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t G = (H + 127) / 128;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t slot = lane < k ? slot_of_pair[t * k + lane] : 0;
        float amax = 0.0f, v[4];
        for (int64_t grp = warp; grp < G; grp += TOKEN_WARPS) {
            load_group(x + t * H, H, grp, v);
            amax = fmaxf(amax, group_amax(v));
        }
        if (lane == 0) warp_amax[warp] = amax;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < TOKEN_WARPS; w++) amax = fmaxf(amax, warp_amax[w]);
        __syncthreads(); /* warp_amax is the next token's */
        const float scale = token_scale(amax);
        for (int64_t grp = warp; grp < G; grp += TOKEN_WARPS) {
            token_group_store(x, H, k, t, grp, scale, slot, x8);
            if (spread && lane < k) xs[grp * spread + slot] = scale;
        }
        if (!spread && warp == 0 && lane < k) xs[slot] = scale;
    }
}

// amax of the finite |x| over n bf16 (or fp32) values into *amax (zeroed before; non-negative floats order as their
// bits)
template <typename X> static __global__ void amax_kernel(const X *x, int64_t n, uint32_t *amax) {
    pdl_wait();
    float m = 0.0f;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = fabsf(to_f32(x[i]));
        if (v < INFINITY) m = fmaxf(m, v); /* NaN and inf fail the test */
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

// The grouped GEMM's expansion of this lane's 4 codes (w4a8_gemm.cu; fm_mxfp4_expand_e4m3, fm_nvfp4_expand_e4m3):
// e4m3(e2m1 value x block scale / S), S the group's largest block scale; *scale: S (MX) or S x ts (NV).
template <int FMT>
static __device__ __forceinline__ uint32_t expand_lane(uint32_t codes, uint32_t byte, const uint32_t sc[2], float ts,
                                                       float *scale) {
    uint32_t mx = __vmaxu4(sc[0], sc[1]);
    mx = __vmaxu4(mx, mx >> 16);
    const uint32_t smax = __vmaxu4(mx, mx >> 8) & 0xFFu;
    float r, m; /* MX: the code x 2^-min(d, 24); NV: (the code x s_b, exact) x (1 / S) */
    if (FMT == FM_W4A8_DISPATCH_MX) {
        const uint32_t d = smax - byte;
        r = __uint_as_float((127u - (d < 24u ? d : 24u)) << 23), m = 1.0f;
        *scale = e8m0_decode(smax);
    } else {
        const float S = e4m3_decode(smax);
        r = S > 0.0f ? __frcp_rn(S) : 0.0f, m = e4m3_decode(byte);
        *scale = __fmul_rn(S, ts);
    }
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) word |= e4m3_rne(__fmul_rn(__fmul_rn(e2m1_decode(codes >> (4 * i)), m), r)) << (8 * i);
    return word;
}

// gather_quantize_task for an FP4 dispatch: codes into x8 (2 bytes per lane and slot), the block scales into xs;
// EXPAND (the small dispatch, for the decode GEMVs): also the e4m3 expansion into xg and its scale into xgs.
template <int FMT, bool EXPAND>
static __device__ __forceinline__ void gather_quantize_fp4_task(const __nv_bfloat16 *x, int64_t H, int32_t k, int64_t P,
                                                                int64_t t, int64_t grp, int32_t slot, float ts,
                                                                const fm_dispatch_bufs &b) {
    const int lane = threadIdx.x & 31;
    const int64_t Hp = (H + 127) / 128 * 128;
    float v[4];
    uint32_t sc[2], byte;
    load_group(x + t * H, H, grp, v);
    const uint32_t codes = quantize_group_fp4<FMT>(v, ts, sc, &byte);
    float gscale = 0.0f;
    const uint32_t word = EXPAND ? expand_lane<FMT>(codes, byte, sc, ts, &gscale) : 0u;
    for (int j = 0; j < k; j++) {
        const int64_t s = __shfl_sync(0xffffffffu, slot, j);
        *(uint16_t *)(b.x8 + s * (Hp / 2) + grp * 64 + lane * 2) = (uint16_t)codes;
        if (EXPAND) *(uint32_t *)(b.xg + s * Hp + grp * 128 + lane * 4) = word;
    }
    if (lane < k) {
        if (FMT == FM_W4A8_DISPATCH_MX) ((uint32_t *)b.xs)[grp * P + slot] = sc[0];
        else ((uint2 *)b.xs)[grp * P + slot] = make_uint2(sc[0], sc[1]);
        if (EXPAND) b.xgs[grp * P + slot] = gscale;
    }
}

template <int FMT>
static __global__ void gather_quantize_fp4_kernel(const __nv_bfloat16 *x, int64_t T, int32_t k, int64_t H,
                                                  const fm_dispatch_bufs b) {
    pdl_wait(); /* before the amax word: the amax pass's */
    const int lane = threadIdx.x & 31;
    const float ts = FMT == FM_W4A8_DISPATCH_NV ? nv_tensor_scale(*b.amax) : 1.0f;
    if (FMT == FM_W4A8_DISPATCH_NV && blockIdx.x == 0 && threadIdx.x == 0) ((float *)b.amax)[1] = ts; /* the GEMM's */
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < T * G; task += warps) {
        const int64_t t = task / G;
        gather_quantize_fp4_task<FMT, false>(x, H, k, T * k, t, task % G, lane < k ? b.slot_of_pair[t * k + lane] : 0,
                                             ts, b);
    }
}

// Dense rows: one warp per (row, group), so that a decode-sized input is one round of loads; launched with PDL
// (pdl.cuh): the GEMM after it may start loading its weights meanwhile.
template <bool SUMS>
static __global__ void quantize_rows_kernel(const __nv_bfloat16 *x, int64_t M, int64_t K, uint8_t *x8, float *xs,
                                            float *xsum, int64_t ld_s) {
    pdl_wait();
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (K + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < M * G; task += warps) {
        const int64_t r = task / G;
        quantize_group_warp<SUMS>(x + r * K, K, task % G, x8 + r * G * 128, xs, xsum, ld_s, r);
    }
}

// the amax pass into *amax, zeroed before (by the caller)
static void amax_launch(const void *x, bool bf16, int64_t n, uint32_t *amax, bool pdl, cudaStream_t s) {
    if (n <= 0) return;
    const int64_t blocks = fm_ceil_div(n, 256);
    const dim3 grid((unsigned)(blocks < 1024 ? blocks : 1024)), threads(256);
    if (bf16) pdl_launch(amax_kernel<__nv_bfloat16>, grid, threads, 0, s, pdl, (const __nv_bfloat16 *)x, n, amax);
    else pdl_launch(amax_kernel<float>, grid, threads, 0, s, pdl, (const float *)x, n, amax);
    FM_LAUNCH_CHECK("amax");
}

void fm_cuda_moe_plan(const int32_t *ids, int64_t P, int32_t E, int32_t tile_rows, const fm_dispatch_bufs *b,
                      bool plan_slots, bool pdl, cudaStream_t s) {
    const int64_t blocks = fm_ceil_div(P, 256);
    const unsigned grid = (unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024);
    uint32_t *amax_word = b->fmt == FM_W4A8_DISPATCH_NV ? b->amax : NULL;
    if (plan_slots && P <= PLAN_SLOTS_MAX) {
        pdl_launch(plan_kernel<true>, dim3(1), dim3(MAX_EXPERTS), 0, s, pdl, ids, P, E, tile_rows, b->seg_start,
                   b->cursor, b->tiles, b->n_tiles, b->matrix_of, amax_word, b->pair_of_slot, b->slot_of_pair, b->h,
                   b->h_cols);
        FM_LAUNCH_CHECK("moe_dispatch_plan_slots");
        return;
    }
    pdl_launch(plan_kernel<false>, dim3(1), dim3(MAX_EXPERTS), 0, s, pdl, ids, P, E, tile_rows, b->seg_start, b->cursor,
               b->tiles, b->n_tiles, b->matrix_of, amax_word, (int32_t *)NULL, (int32_t *)NULL, (uint8_t *)NULL,
               (int64_t)0);
    FM_LAUNCH_CHECK("moe_dispatch_plan");
    pdl_launch(slot_kernel, dim3(grid), dim3(256), 0, s, pdl, ids, P, b->seg_start, b->cursor, b->pair_of_slot,
               b->slot_of_pair, b->h, b->h_cols);
    FM_LAUNCH_CHECK("moe_dispatch_slots");
}

// per-token rows are e4m3 with no group sums (the fold banks' input: cuda_bank_fold.cu refuses the rest at load)
static void per_token_check(const fm_dispatch_bufs *b, const char *who) {
    if (b->per_token && (b->fmt != FM_W4A8_DISPATCH_E4M3 || b->xsum)) {
        fprintf(stderr, "fp8moe: %s: per-token rows are e4m3 without group sums\n", who);
        abort();
    }
}

void fm_cuda_moe_dispatch(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                          int32_t tile_rows, const fm_dispatch_bufs *b, bool plan_slots, bool pdl, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || k < 1 || k > 32) {
        fprintf(stderr, "fp8moe: moe_dispatch: %d experts, top-%d (1..%d experts and top-1..32 supported)\n", E, k,
                MAX_EXPERTS);
        abort();
    }
    per_token_check(b, "moe_dispatch");
    fm_cuda_moe_plan(ids, T * k, E, tile_rows, b, plan_slots, pdl, s);
    const dim3 qblocks(warp_blocks(T * fm_ceil_div(H, 128))), threads(256);
    const fm_dispatch_bufs bv = *b;
    if (b->fmt == FM_W4A8_DISPATCH_NV) {
        amax_launch(x, true, T * H, b->amax, pdl, s); /* into the word the plan kernel zeroed */
        pdl_launch(gather_quantize_fp4_kernel<FM_W4A8_DISPATCH_NV>, qblocks, threads, 0, s, pdl, x, T, k, H, bv);
    } else if (b->fmt == FM_W4A8_DISPATCH_MX) {
        pdl_launch(gather_quantize_fp4_kernel<FM_W4A8_DISPATCH_MX>, qblocks, threads, 0, s, pdl, x, T, k, H, bv);
    } else if (b->per_token) {
        const unsigned tok_blocks = (unsigned)(T < 1 ? 1 : T < 65536 ? T : 65536);
        pdl_launch(gather_quantize_token_kernel, dim3(tok_blocks), dim3(TOKEN_WARPS * 32), 0, s, pdl, x, T, k, H,
                   b->slot_of_pair, b->x8, b->xs, b->token_groups ? T * k : (int64_t)0);
    } else if (b->xsum) {
        pdl_launch(gather_quantize_kernel<true>, qblocks, threads, 0, s, pdl, x, T, k, H, b->slot_of_pair, b->x8, b->xs,
                   b->xsum);
    } else {
        pdl_launch(gather_quantize_kernel<false>, qblocks, threads, 0, s, pdl, x, T, k, H, b->slot_of_pair, b->x8,
                   b->xs, (float *)NULL);
    }
    FM_LAUNCH_CHECK("moe_dispatch_gather_quantize");
}

// fm_cuda_moe_dispatch_small: one block of MAX_EXPERTS threads; thread e is expert e in the plan, thread p pair p
// in the slots; then its 32 warps gather and quantize (token, group) tasks as gather_quantize_kernel does.
// FMT (an FP4 dispatch): the block's amax pass over x first (NVFP4), the codes, and their e4m3 expansion for the
// GEMVs (xg, xgs).
// TOK (per_token rows, e4m3): each (token, group) task's amax into its token's word (tok_amax, as fp32 bits: non-
// negative floats order as their bits), then the tasks again with the token's scale.
template <bool SUMS, int FMT, bool TOK>
static __global__ void __launch_bounds__(MAX_EXPERTS)
    dispatch_small_kernel(const __nv_bfloat16 *x, int32_t T, int32_t k, int64_t H, const int32_t *ids, int32_t E,
                          int32_t bn, fm_dispatch_bufs b) {
    __shared__ int32_t rows[MAX_EXPERTS], ntl[MAX_EXPERTS], seg[MAX_EXPERTS];
    __shared__ int32_t sid[FM_MOE_GEMV_MAX_PAIRS], sslot[FM_MOE_GEMV_MAX_PAIRS];
    __shared__ uint32_t amax, tok_amax[TOK ? FM_MOE_GEMV_MAX_PAIRS : 1];
    const int e = threadIdx.x, P = T * k;
    pdl_wait(); /* ids are the router's, x the norm's; every buffer below, what the previous layer's kernels read */
    if (e < P) sid[e] = ids[e];
    rows[e] = 0;
    if (e == 0) amax = 0u;
    if (TOK && e < T) tok_amax[e] = 0u;
    __syncthreads();
    if (FMT == FM_W4A8_DISPATCH_NV) {
        float m = 0.0f;
        for (int64_t i = e; i < (int64_t)T * H; i += MAX_EXPERTS) {
            const float v = fabsf(__bfloat162float(x[i]));
            if (v < INFINITY) m = fmaxf(m, v);
        }
        atomicMax(&amax, __float_as_uint(m));
    }
    if (e < P) atomicAdd(&rows[sid[e]], 1);
    __syncthreads();
    const int32_t c = e < E ? rows[e] : 0;
    ntl[e] = (c + bn - 1) / bn;
    for (int o = 1; o < MAX_EXPERTS; o <<= 1) { /* inclusive scans, as plan_kernel */
        __syncthreads();
        const int32_t r = e >= o ? rows[e - o] : 0, n = e >= o ? ntl[e - o] : 0;
        __syncthreads();
        rows[e] += r, ntl[e] += n;
    }
    __syncthreads();
    if (e < E) {
        const int32_t start = rows[e] - c, first_tile = ntl[e] - (c + bn - 1) / bn;
        seg[e] = start;
        for (int32_t i = 0; i * bn < c; i++) {
            const int32_t n = c - i * bn < bn ? c - i * bn : bn;
            fm_w4a8_tile t = {b.matrix_of ? b.matrix_of[e] : e, start + i * bn, n, 0};
            b.tiles[first_tile + i] = t;
        }
        if (e == E - 1) *b.n_tiles = ntl[e];
    }
    __syncthreads();
    if (e < P) { /* the pair's rank among the earlier pairs of its expert */
        const int32_t ex = sid[e];
        int32_t r = 0;
        for (int p = 0; p < e; p++) r += sid[p] == ex;
        const int32_t slot = seg[ex] + r;
        b.pair_of_slot[slot] = e, b.slot_of_pair[e] = slot, sslot[e] = slot;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t G = (H + 127) / 128;
    const float ts = FMT == FM_W4A8_DISPATCH_NV ? nv_tensor_scale(amax) : 1.0f;
    if (FMT == FM_W4A8_DISPATCH_NV && e == 0) b.amax[0] = amax, ((float *)b.amax)[1] = ts;
    if constexpr (TOK) {
        float v[4];
        for (int64_t task = threadIdx.x >> 5; task < T * G; task += MAX_EXPERTS / 32) {
            load_group(x + task / G * H, H, task % G, v);
            const float m = group_amax(v);
            if (lane == 0) atomicMax(&tok_amax[task / G], __float_as_uint(m));
        }
        __syncthreads();
        for (int64_t task = threadIdx.x >> 5; task < T * G; task += MAX_EXPERTS / 32) {
            const int64_t t = task / G;
            const int32_t slot = lane < k ? sslot[t * k + lane] : 0;
            const float scale = token_scale(__uint_as_float(tok_amax[t]));
            token_group_store(x, H, k, t, task % G, scale, slot, b.x8);
            if (task % G == 0 && lane < k) b.xs[slot] = scale;
        }
    } else {
        for (int64_t task = threadIdx.x >> 5; task < T * G; task += MAX_EXPERTS / 32) {
            const int64_t t = task / G;
            if (FMT == FM_W4A8_DISPATCH_E4M3)
                gather_quantize_task<SUMS>(x, H, k, P, t, task % G, lane < k ? sslot[t * k + lane] : 0, b.x8, b.xs,
                                           b.xsum);
            else
                gather_quantize_fp4_task<FMT, true>(x, H, k, P, t, task % G, lane < k ? sslot[t * k + lane] : 0, ts, b);
        }
    }
}

void fm_cuda_moe_dispatch_small(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                                int32_t tile_rows, const fm_dispatch_bufs *b, bool pdl, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || k < 1 || k > 32 || T * k > FM_MOE_GEMV_MAX_PAIRS) {
        fprintf(stderr,
                "fp8moe: moe_dispatch_small: %d experts, top-%d, %lld tokens (at most %d experts, top-32, %d pairs)\n",
                E, k, (long long)T, MAX_EXPERTS, FM_MOE_GEMV_MAX_PAIRS);
        abort();
    }
    per_token_check(b, "moe_dispatch_small");
    if (b->token_groups) {
        fprintf(stderr, "fp8moe: moe_dispatch_small: per-token scales as group scales are the grouped GEMM's\n");
        abort(); /* fm_routes_moe_token_scales: never on the GEMVs' steps */
    }
    if (T == 0) return;
    const int32_t t32 = (int32_t)T;
    const dim3 one(1), threads(MAX_EXPERTS);
    const fm_dispatch_bufs bv = *b;
    if (b->fmt == FM_W4A8_DISPATCH_MX)
        pdl_launch(dispatch_small_kernel<false, FM_W4A8_DISPATCH_MX, false>, one, threads, 0, s, pdl, x, t32, k, H, ids,
                   E, tile_rows, bv);
    else if (b->fmt == FM_W4A8_DISPATCH_NV)
        pdl_launch(dispatch_small_kernel<false, FM_W4A8_DISPATCH_NV, false>, one, threads, 0, s, pdl, x, t32, k, H, ids,
                   E, tile_rows, bv);
    else if (b->per_token)
        pdl_launch(dispatch_small_kernel<false, FM_W4A8_DISPATCH_E4M3, true>, one, threads, 0, s, pdl, x, t32, k, H,
                   ids, E, tile_rows, bv);
    else if (b->xsum)
        pdl_launch(dispatch_small_kernel<true, FM_W4A8_DISPATCH_E4M3, false>, one, threads, 0, s, pdl, x, t32, k, H,
                   ids, E, tile_rows, bv);
    else
        pdl_launch(dispatch_small_kernel<false, FM_W4A8_DISPATCH_E4M3, false>, one, threads, 0, s, pdl, x, t32, k, H,
                   ids, E, tile_rows, bv);
    FM_LAUNCH_CHECK("moe_dispatch_small");
}

void fm_cuda_quantize_e4m3_rows(const __nv_bfloat16 *x, int64_t M, int64_t K, uint8_t *x8, float *xs, float *xsum,
                                int64_t ld_s, bool pdl, cudaStream_t s) {
    if (M == 0) return;
    void *args[] = {(void *)&x, (void *)&M, (void *)&K, (void *)&x8, (void *)&xs, (void *)&xsum, (void *)&ld_s};
    const void *kernel = xsum ? (const void *)quantize_rows_kernel<true> : (const void *)quantize_rows_kernel<false>;
    fm_cuda_launch_pdl(kernel, dim3(warp_blocks(M * fm_ceil_div(K, 128))), dim3(256), 0, s, args, pdl);
    FM_LAUNCH_CHECK("quantize_e4m3_rows");
}

void fm_cuda_amax(const void *x, bool bf16, int64_t n, float *out, cudaStream_t s) {
    FM_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof *out, s));
    amax_launch(x, bf16, n, (uint32_t *)out, false, s);
}
