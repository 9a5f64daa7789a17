// What the routing dispatch (moe_dispatch.cu) and the expert-parallel one (ep_dispatch.cu) share: the quantizers of
// a 128-group of a row, e4m3 with one scale and E2M1 with MX or NV block scales (bit for bit src/quant), and the tile
// plan of the routed rows. Included by those two files, the decode GEMVs (gemv_fp8.cu: quantize_group) and the fused
// router (router.cu: dispatch_block, the small dispatch in its last CTA).
#ifndef FM_CUDA_MOE_DISPATCH_DEVICE_CUH
#define FM_CUDA_MOE_DISPATCH_DEVICE_CUH

#include <cuda_fp8.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/w4a8_workspace.h"

#define MAX_EXPERTS 1024

// A 128-column group of a row of K columns, 4 columns per lane: load_group reads them (8-byte loads where aligned,
// zeros past K; plain loads, not __ldg: x is an earlier kernel's output, and a PDL kernel's invariant load may be
// hoisted above its pdl_wait, pdl.cuh), quantize_group makes their e4m3 codes (one word per lane) and the group's
// scale, and with SUMS the group's sum, scale x (sum of its codes), for the int4-zp banks' zero-point term (all lanes
// get both).
static __device__ __forceinline__ void load_group(const __nv_bfloat16 *x, int64_t K, int64_t grp, float v[4]) {
    const int64_t k = grp * 128 + (threadIdx.x & 31) * 4;
    if (k + 4 <= K && (((uintptr_t)(x + k)) & 7) == 0) {
        const uint2 raw = *(const uint2 *)(x + k);
        const __nv_bfloat162 a = *(const __nv_bfloat162 *)&raw.x, b = *(const __nv_bfloat162 *)&raw.y;
        v[0] = __low2float(a), v[1] = __high2float(a), v[2] = __low2float(b), v[3] = __high2float(b);
    } else {
        for (int i = 0; i < 4; i++) v[i] = k + i < K ? __bfloat162float(x[k + i]) : 0.0f;
    }
}

// The same through L2 (ld.cg), for rows another CTA of the running grid wrote, or a co-resident CTA of the previous
// kernel may have left in L1 (the decode GEMVs quantizing h, the persistent MoE block)
static __device__ __forceinline__ void load_group_cg(const __nv_bfloat16 *h, int64_t K, int64_t grp, float v[4]) {
    const int64_t k = grp * 128 + (threadIdx.x & 31) * 4;
    if (k + 4 <= K && (((uintptr_t)(h + k)) & 7) == 0) {
        const uint2 raw = __ldcg((const uint2 *)(h + k));
        const __nv_bfloat162 a = *(const __nv_bfloat162 *)&raw.x, b = *(const __nv_bfloat162 *)&raw.y;
        v[0] = __low2float(a), v[1] = __high2float(a), v[2] = __low2float(b), v[3] = __high2float(b);
    } else {
        for (int i = 0; i < 4; i++)
            v[i] =
                k + i < K ? __bfloat162float(__ushort_as_bfloat16(__ldcg((const unsigned short *)(h + k + i)))) : 0.0f;
    }
}

// a 128-group's scale from its largest magnitude, and a value's code under it: the activation quantizer's arithmetic,
// shared by every device form that must give its bits (quantize_group, moe_combine_row.cuh's quantize_chunks_e4m3)
static __device__ __forceinline__ float e4m3_group_scale(float amax) {
    return fmaxf(amax / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
}
static __device__ __forceinline__ uint32_t e4m3_group_code(float v, float scale) {
    return (uint32_t)__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
}

template <bool SUMS>
static __device__ __forceinline__ uint32_t quantize_group(const float v[4], int64_t K, int64_t grp, float *scale_out,
                                                          float *sum_out) {
    const int64_t k = grp * 128 + (threadIdx.x & 31) * 4;
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = e4m3_group_scale(amax);
    uint32_t word = 0;
    float sum = 0.0f;
    for (int i = 0; i < 4; i++) {
        const uint32_t c = k + i < K ? e4m3_group_code(v[i], scale) : 0u;
        word |= c << (8 * i);
        if (SUMS) sum += e4m3_decode(c);
    }
    if (SUMS)
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    *scale_out = scale, *sum_out = sum * scale;
    return word;
}

// One warp quantizes one 128-column group of a row into dst, xs[grp][slot] (and xsum).
template <bool SUMS>
static __device__ __forceinline__ void quantize_group_warp(const __nv_bfloat16 *x, int64_t K, int64_t grp, uint8_t *dst,
                                                           float *xs, float *xsum, int64_t ld_s, int64_t slot) {
    float v[4], scale, sum;
    load_group(x, K, grp, v);
    const uint32_t word = quantize_group<SUMS>(v, K, grp, &scale, &sum);
    *(uint32_t *)(dst + grp * 128 + (threadIdx.x & 31) * 4) = word;
    if ((threadIdx.x & 31) == 0) {
        xs[grp * ld_s + slot] = scale;
        if (SUMS) xsum[grp * ld_s + slot] = sum;
    }
}

// The gather (moe_dispatch.cu; the fused router's dispatch, router.cu): one warp per (token, 128-group): the group is
// quantized once and its codes stored into the token's k slots (the k copies are identical). Every task is one round of
// loads (the group, the k slots), so a decode-sized dispatch is one memory round trip. Before: one warp per pair
// walking its row's groups one after another (195 us at T = 8192 against a 40 us floor), then one warp per token (78 us
// at T = 8192 but 19 us at T = 16, ncu). One (token t, group grp) task of a warp: lane j < k holds slot, the slot of
// the token's j-th pair.
template <bool SUMS>
static __device__ __forceinline__ void gather_quantize_task(const __nv_bfloat16 *x, int64_t H, int32_t k, int64_t P,
                                                            int64_t t, int64_t grp, int32_t slot, uint8_t *x8,
                                                            float *xs, float *xsum) {
    const int lane = threadIdx.x & 31;
    const int64_t Hp = (H + 127) / 128 * 128;
    float v[4], scale, sum;
    load_group(x + t * H, H, grp, v);
    const uint32_t word = quantize_group<SUMS>(v, H, grp, &scale, &sum);
    for (int j = 0; j < k; j++) {
        const int64_t s = __shfl_sync(0xffffffffu, slot, j);
        *(uint32_t *)(x8 + s * Hp + grp * 128 + lane * 4) = word;
    }
    if (lane < k) {
        xs[grp * P + slot] = scale;
        if (SUMS) xsum[grp * P + slot] = sum;
    }
}

// The small dispatch of an e4m3 1x128 decode step (fm_cuda_moe_dispatch_small's results, bit for bit) by one block of
// NT threads (NT a power of two, 32..MAX_EXPERTS), for the fused router's last CTA (router.cu): each expert's rows
// counted, the tile plan (segments in expert order, bn rows per tile), each pair's slot (in pair order inside its
// expert's segment), then the block's warps gather and quantize the (token, group) tasks. Thread i owns experts
// i R .. i R + R - 1 (R = ceil(E / NT)): their counts summed, the sums scanned over the block, then each expert's
// start from its thread's offset. sm: shared scratch of DISPATCH_BLOCK_SMEM(NT) int32. ids, x: written before the
// caller's barrier (plain loads). P = T k <= FM_MOE_GEMV_MAX_PAIRS <= NT, E <= MAX_EXPERTS, k <= 32.
#define DISPATCH_BLOCK_SMEM(NT) (MAX_EXPERTS + 2 * (NT) + 2 * FM_MOE_GEMV_MAX_PAIRS)
template <int NT>
static __device__ void dispatch_block(const __nv_bfloat16 *x, int32_t T, int32_t k, int64_t H, const int32_t *ids,
                                      int32_t E, int32_t bn, const fm_dispatch_bufs &b, int32_t *sm) {
    int32_t *rows = sm, *sum_r = sm + MAX_EXPERTS, *sum_n = sum_r + NT, *sid = sum_n + NT;
    int32_t *sslot = sid + FM_MOE_GEMV_MAX_PAIRS;
    const int i = threadIdx.x, P = T * k, R = (E + NT - 1) / NT;
    if (i < P) sid[i] = __ldcg(ids + i); /* through L2: this kernel's own stores */
    for (int e = i; e < E; e += NT) rows[e] = 0;
    __syncthreads();
    if (i < P) atomicAdd(&rows[sid[i]], 1);
    __syncthreads();
    int32_t own_r = 0, own_n = 0; /* this thread's experts: rows and tiles */
    for (int e = i * R; e < i * R + R && e < E; e++) own_r += rows[e], own_n += (rows[e] + bn - 1) / bn;
    sum_r[i] = own_r, sum_n[i] = own_n;
    for (int o = 1; o < NT; o <<= 1) { /* inclusive scans of the threads' sums (Hillis-Steele) */
        __syncthreads();
        const int32_t r = i >= o ? sum_r[i - o] : 0, n = i >= o ? sum_n[i - o] : 0;
        __syncthreads();
        sum_r[i] += r, sum_n[i] += n;
    }
    __syncthreads();
    int32_t start = sum_r[i] - own_r, tile = sum_n[i] - own_n;
    for (int e = i * R; e < i * R + R && e < E; e++) {
        const int32_t c = rows[e];
        for (int32_t j = 0; j * bn < c; j++) {
            const fm_w4a8_tile t = {b.matrix_of ? b.matrix_of[e] : e, start + j * bn, c - j * bn < bn ? c - j * bn : bn,
                                    0};
            b.tiles[tile + j] = t;
        }
        rows[e] = start; /* the segment's start, for the slots below (each thread its own experts) */
        start += c, tile += (c + bn - 1) / bn;
        if (e == E - 1) *b.n_tiles = tile;
    }
    __syncthreads();
    if (i < P) { /* the pair's rank among the earlier pairs of its expert */
        const int32_t ex = sid[i];
        int32_t r = 0;
        for (int p = 0; p < i; p++) r += sid[p] == ex;
        const int32_t slot = rows[ex] + r;
        b.pair_of_slot[slot] = i, b.slot_of_pair[i] = slot, sslot[i] = slot;
    }
    __syncthreads();
    const int lane = i & 31;
    const int64_t G = (H + 127) / 128;
    for (int64_t task = i >> 5; task < (int64_t)T * G; task += NT / 32) {
        const int64_t t = task / G;
        const int32_t slot = lane < k ? sslot[t * k + lane] : 0;
        if (b.xsum) gather_quantize_task<true>(x, H, k, P, t, task % G, slot, b.x8, b.xs, b.xsum);
        else gather_quantize_task<false>(x, H, k, P, t, task % G, slot, b.x8, b.xs, NULL);
    }
}

// ---- FP4 dispatch: E2M1 codes with block scales, bit for bit src/quant/e2m1.c ------------------------------------

// fm_f32_to_e2m1: round to nearest even, sign of zero kept, finite overflow and +-inf saturate to +-6, NaN -> +6
static __device__ __forceinline__ uint32_t e2m1_encode(float f) {
    const uint32_t u = __float_as_uint(f), sign = (u >> 28) & 8u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 7u;
    if (a >= 0x40C00000u) return sign | 7u;
    if (a >= 0x3F800000u) {
        uint32_t h = a - (126u << 23);
        h = (h + 0x1FFFFFu + ((h >> 22) & 1u)) >> 22;
        return sign | h;
    }
    const uint32_t exp = a >> 23;
    const int shift = 149 - (int)exp;
    if (exp == 0 || shift > 24) return sign;
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    uint32_t k = m >> shift;
    if (rem > half || (rem == half && (k & 1u))) k++;
    return sign | k;
}

static __device__ __forceinline__ float e2m1_decode(uint32_t c) {
    const uint32_t m = c & 7u;
    const float v = m < 2 ? 0.5f * (float)m : __uint_as_float((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
    return (c & 8u) ? -v : v;
}

static __device__ __forceinline__ float e8m0_decode(uint32_t e) { return __uint_as_float(e ? e << 23 : 0x00400000u); }

// mx_scale_byte (RCEIL): 127 + ceil(log2(amax / 6)), clamped to 0..254; 0 for an all-zero block, 254 with an inf
static __device__ __forceinline__ uint32_t mx_scale_byte(float amax) {
    if (!(amax > 0.0f)) return 0u;
    if (isinf(amax)) return 254u;
    const uint32_t u = __float_as_uint(__fdiv_rn(amax, 6.0f)), E = u >> 23, M = u & 0x7FFFFFu;
    if (u == 0u) return 0u;
    const int x = E ? (int)E + (M != 0u) : (31 - __clz((int)M)) - 22 + ((M & (M - 1u)) != 0u); /* s = M 2^-149 */
    return (uint32_t)(x < 0 ? 0 : x > 254 ? 254 : x);
}

static __device__ __forceinline__ uint32_t e4m3_rne(float v) {
    return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// fm_nvfp4_tensor_scale of x from the amax word: max(amax / (6 x 448), floor)
static __device__ __forceinline__ float nv_tensor_scale(uint32_t amax_bits) {
    return fmaxf(__fdiv_rn(__uint_as_float(amax_bits), 2688.0f), 1e-12f); /* FM_NVFP4_TENSOR_SCALE_FLOOR */
}

// Expert parallelism's NVFP4 tensor scale: of the largest of the ranks' amax (fm_ep_nvfp4_scale)
static __device__ __forceinline__ float ep_tensor_scale(const float *amaxes, int32_t n_ranks) {
    float m = 0.0f;
    for (int32_t r = 0; r < n_ranks; r++) m = fmaxf(m, amaxes[r]);
    return nv_tensor_scale(__float_as_uint(m));
}

static __device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ float to_f32(float v) { return v; }

// One lane's 4 elements of a 128-group as E2M1 (nibble i: element 4 lane + i) with its block's scale byte (*byte);
// sc: the group's block scales as stored (MX: sc[0] = 4 bytes; NV: sc[0], sc[1] = 8 bytes), on every lane.
template <int FMT>
static __device__ __forceinline__ uint32_t quantize_group_fp4(const float v[4], float ts, uint32_t sc[2],
                                                              uint32_t *byte) {
    constexpr int LANES = FMT == FM_W4A8_DISPATCH_MX ? 8 : 4; /* lanes per block: 32 or 16 elements */
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    amax = fmaxf(0.0f, amax); /* all four NaN: 0, as the CPU's fmaxf from 0 */
    for (int o = 1; o < LANES; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    uint32_t b;
    float d;
    if (FMT == FM_W4A8_DISPATCH_MX) {
        b = mx_scale_byte(amax), d = e8m0_decode(254u - b); /* 1 / X, exact: x / X is x times it, bit for bit */
    } else {
        b = e4m3_rne(__fdiv_rn(amax, __fmul_rn(6.0f, ts))), d = __fmul_rn(ts, e4m3_decode(b));
    }
    uint32_t codes = 0;
#pragma unroll
    for (int i = 0; i < 4; i++)
        codes |= (FMT == FM_W4A8_DISPATCH_MX ? e2m1_encode(__fmul_rn(v[i], d))
                  : d != 0.0f                ? e2m1_encode(__fdiv_rn(v[i], d))
                                             : 0u)
                 << (4 * i);
    sc[0] = sc[1] = 0u;
#pragma unroll
    for (int k = 0; k < 32 / LANES; k++) sc[k / 4] |= __shfl_sync(0xffffffffu, b, k * LANES) << (8 * (k % 4));
    *byte = b;
    return codes;
}

static inline unsigned warp_blocks(int64_t n) { /* 8 warps per block, one task (row or group) per warp, capped grid */
    const int64_t b = fm_ceil_div(n, 8);
    return (unsigned)(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

// The tile plan of P routed rows (ids, -1 an empty place) over E experts in tiles of tile_rows: each expert's count,
// its segment and tiles (one block), then each row's slot in its expert's segment (b: seg_start, cursor, tiles,
// n_tiles, pair_of_slot, slot_of_pair; h and h_cols; NVFP4: amax[0] zeroed). plan_slots (route moe.plan_slots): the
// plan's block assigns the slots too, up to 4096 rows (one launch instead of two; above, the slot kernel runs).
// pdl: fm_routes_pdl.
void fm_cuda_moe_plan(const int32_t *ids, int64_t P, int32_t E, int32_t tile_rows, const fm_dispatch_bufs *b,
                      bool plan_slots, bool pdl, cudaStream_t s);

#endif
