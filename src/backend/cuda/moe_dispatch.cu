// Device-side routing dispatch and e4m3 row quantization (moe_dispatch.cuh). Memory-bound except the tile
// planning, which is one small block: the floor is reading x once per routed pair and writing the e4m3 copy.
#include <cuda_fp8.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/ep_blocks.h"
#include "backend/w4a8_workspace.h"

#define MAX_EXPERTS 1024

static __global__ void count_kernel(const int32_t *ids, int64_t P, int32_t E, int32_t *counts) {
    __shared__ int32_t local[MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) local[e] = 0;
    __syncthreads();
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
        if (ids[p] >= 0) atomicAdd(&local[ids[p]], 1); /* -1: an empty place (expert parallelism's blocks) */
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (local[e]) atomicAdd(&counts[e], local[e]);
}

// One block of MAX_EXPERTS threads: scans of the counts and of the tiles (bn rows at most) per expert
// (Hillis-Steele in shared).
static __global__ void plan_kernel(const int32_t *counts, int32_t E, int32_t bn, int32_t *seg_start, int32_t *cursor,
                                   fm_w4a8_tile *tiles, int32_t *n_tiles, const int32_t *matrix_of) {
    __shared__ int32_t rows[MAX_EXPERTS], ntl[MAX_EXPERTS];
    const int e = threadIdx.x;
    const int32_t c = e < E ? counts[e] : 0;
    rows[e] = c, ntl[e] = (c + bn - 1) / bn;
    __syncthreads();
    for (int o = 1; o < MAX_EXPERTS; o <<= 1) {
        const int32_t r = e >= o ? rows[e - o] : 0, n = e >= o ? ntl[e - o] : 0;
        __syncthreads();
        rows[e] += r, ntl[e] += n;
        __syncthreads();
    }
    if (e >= E) return;
    const int32_t start = rows[e] - c, first_tile = ntl[e] - (c + bn - 1) / bn;
    seg_start[e] = start;
    cursor[e] = 0;
    for (int32_t i = 0; i * bn < c; i++) {
        const int32_t n = c - i * bn < bn ? c - i * bn : bn;
        fm_w4a8_tile t = {matrix_of ? matrix_of[e] : e, start + i * bn, n, 0};
        tiles[first_tile + i] = t;
    }
    if (e == E - 1) *n_tiles = ntl[e];
}

// A 128-column group of a row of K columns, 4 columns per lane: load_group reads them (8-byte loads where aligned,
// zeros past K), quantize_group makes their e4m3 codes (one word per lane) and the group's scale, and with SUMS the
// group's sum, scale x (sum of its codes), for the int4-zp banks' zero-point term (all lanes get both).
static __device__ __forceinline__ void load_group(const __nv_bfloat16 *x, int64_t K, int64_t grp, float v[4]) {
    const int64_t k = grp * 128 + (threadIdx.x & 31) * 4;
    if (k + 4 <= K && (((uintptr_t)(x + k)) & 7) == 0) {
        const uint2 raw = __ldg((const uint2 *)(x + k));
        const __nv_bfloat162 a = *(const __nv_bfloat162 *)&raw.x, b = *(const __nv_bfloat162 *)&raw.y;
        v[0] = __low2float(a), v[1] = __high2float(a), v[2] = __low2float(b), v[3] = __high2float(b);
    } else {
        for (int i = 0; i < 4; i++) v[i] = k + i < K ? __bfloat162float(x[k + i]) : 0.0f;
    }
}

template <bool SUMS>
static __device__ __forceinline__ uint32_t quantize_group(const float v[4], int64_t K, int64_t grp, float *scale_out,
                                                          float *sum_out) {
    const int64_t k = grp * 128 + (threadIdx.x & 31) * 4;
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = fmaxf(amax / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
    uint32_t word = 0;
    float sum = 0.0f;
    for (int i = 0; i < 4; i++) {
        const uint32_t c = k + i < K ? (uint32_t)__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3) : 0u;
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

// One thread per routed pair: its slot in its expert's segment (pair_of_slot for the down GEMM's rows and
// slot_of_pair for the gather below).
static __global__ void slot_kernel(const int32_t *ids, int64_t P, const int32_t *seg_start, int32_t *cursor,
                                   int32_t *pair_of_slot, int32_t *slot_of_pair) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[p];
        if (e < 0) { /* an empty place */
            slot_of_pair[p] = -1;
            continue;
        }
        const int32_t slot = seg_start[e] + atomicAdd(&cursor[e], 1);
        pair_of_slot[slot] = (int32_t)p;
        slot_of_pair[p] = slot;
    }
}

// One warp per (token, 128-group): the group is quantized once and its codes stored into the token's k slots (the k
// copies are identical). Every task is one round of loads (the group, the k slots), so a decode-sized dispatch is
// one memory round trip. Before: one warp per pair walking its row's groups one after another (195 us at T = 8192
// against a 40 us floor), then one warp per token (78 us at T = 8192 but 19 us at T = 16, ncu).
// One (token t, group grp) task of a warp: lane j < k holds slot, the slot of the token's j-th pair.
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

template <bool SUMS>
static __global__ void gather_quantize_kernel(const __nv_bfloat16 *x, int64_t T, int32_t k, int64_t H,
                                              const int32_t *slot_of_pair, uint8_t *x8, float *xs, float *xsum) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < T * G; task += warps) {
        const int64_t t = task / G;
        gather_quantize_task<SUMS>(x, H, k, T * k, t, task % G, lane < k ? slot_of_pair[t * k + lane] : 0, x8, xs,
                                   xsum);
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

// amax of the finite |x| over n bf16 (or fp32) values into *amax (zeroed before; non-negative floats order as their
// bits)
template <typename X> static __global__ void amax_kernel(const X *x, int64_t n, uint32_t *amax) {
    float m = 0.0f;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = fabsf(to_f32(x[i]));
        if (v < INFINITY) m = fmaxf(m, v); /* NaN and inf fail the test */
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

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
    pdl_launch_dependents();
    pdl_wait();
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (K + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < M * G; task += warps) {
        const int64_t r = task / G;
        quantize_group_warp<SUMS>(x + r * K, K, task % G, x8 + r * G * 128, xs, xsum, ld_s, r);
    }
}

static unsigned warp_blocks(int64_t n) { /* 8 warps per block, one task (row or group) per warp, capped grid */
    const int64_t b = fm_ceil_div(n, 8);
    return (unsigned)(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

void fm_cuda_moe_dispatch(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                          int32_t tile_rows, const fm_dispatch_bufs *b, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || k < 1 || k > 32) {
        fprintf(stderr, "fp8moe: moe_dispatch: %d experts, top-%d (1..%d experts and top-1..32 supported)\n", E, k,
                MAX_EXPERTS);
        abort();
    }
    const int64_t P = T * k;
    const int64_t blocks = fm_ceil_div(P, 256);
    count_kernel<<<(unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024), 256, 0, s>>>(ids, P, E, b->counts);
    FM_LAUNCH_CHECK("moe_dispatch_count");
    plan_kernel<<<1, MAX_EXPERTS, 0, s>>>(b->counts, E, tile_rows, b->seg_start, b->cursor, b->tiles, b->n_tiles,
                                          b->matrix_of);
    FM_LAUNCH_CHECK("moe_dispatch_plan");
    slot_kernel<<<(unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024), 256, 0, s>>>(
        ids, P, b->seg_start, b->cursor, b->pair_of_slot, b->slot_of_pair);
    FM_LAUNCH_CHECK("moe_dispatch_slots");
    const unsigned qblocks = warp_blocks(T * fm_ceil_div(H, 128));
    if (b->fmt == FM_W4A8_DISPATCH_NV) {
        fm_cuda_amax(x, true, T * H, (float *)b->amax, s);
        gather_quantize_fp4_kernel<FM_W4A8_DISPATCH_NV><<<qblocks, 256, 0, s>>>(x, T, k, H, *b);
    } else if (b->fmt == FM_W4A8_DISPATCH_MX) {
        gather_quantize_fp4_kernel<FM_W4A8_DISPATCH_MX><<<qblocks, 256, 0, s>>>(x, T, k, H, *b);
    } else if (b->xsum)
        gather_quantize_kernel<true><<<qblocks, 256, 0, s>>>(x, T, k, H, b->slot_of_pair, b->x8, b->xs, b->xsum);
    else gather_quantize_kernel<false><<<qblocks, 256, 0, s>>>(x, T, k, H, b->slot_of_pair, b->x8, b->xs, NULL);
    FM_LAUNCH_CHECK("moe_dispatch_gather_quantize");
}

// fm_cuda_moe_dispatch_small: one block of MAX_EXPERTS threads; thread e is expert e in the plan, thread p pair p
// in the slots; then its 32 warps gather and quantize (token, group) tasks as gather_quantize_kernel does.
// FMT (an FP4 dispatch): the block's amax pass over x first (NVFP4), the codes, and their e4m3 expansion for the
// GEMVs (xg, xgs).
template <bool SUMS, int FMT>
static __global__ void __launch_bounds__(MAX_EXPERTS)
    dispatch_small_kernel(const __nv_bfloat16 *x, int32_t T, int32_t k, int64_t H, const int32_t *ids, int32_t E,
                          int32_t bn, fm_dispatch_bufs b) {
    __shared__ int32_t rows[MAX_EXPERTS], ntl[MAX_EXPERTS], seg[MAX_EXPERTS];
    __shared__ int32_t sid[FM_MOE_GEMV_MAX_PAIRS], sslot[FM_MOE_GEMV_MAX_PAIRS];
    __shared__ uint32_t amax;
    const int e = threadIdx.x, P = T * k;
    if (e < P) sid[e] = ids[e];
    rows[e] = 0;
    if (e == 0) amax = 0u;
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
    for (int64_t task = threadIdx.x >> 5; task < T * G; task += MAX_EXPERTS / 32) {
        const int64_t t = task / G;
        if (FMT == FM_W4A8_DISPATCH_E4M3)
            gather_quantize_task<SUMS>(x, H, k, P, t, task % G, lane < k ? sslot[t * k + lane] : 0, b.x8, b.xs, b.xsum);
        else gather_quantize_fp4_task<FMT, true>(x, H, k, P, t, task % G, lane < k ? sslot[t * k + lane] : 0, ts, b);
    }
}

void fm_cuda_moe_dispatch_small(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                                int32_t tile_rows, const fm_dispatch_bufs *b, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || k < 1 || k > 32 || T * k > FM_MOE_GEMV_MAX_PAIRS) {
        fprintf(stderr,
                "fp8moe: moe_dispatch_small: %d experts, top-%d, %lld tokens (at most %d experts, top-32, %d pairs)\n",
                E, k, (long long)T, MAX_EXPERTS, FM_MOE_GEMV_MAX_PAIRS);
        abort();
    }
    if (T == 0) return;
    const int32_t t32 = (int32_t)T;
    if (b->fmt == FM_W4A8_DISPATCH_MX)
        dispatch_small_kernel<false, FM_W4A8_DISPATCH_MX>
            <<<1, MAX_EXPERTS, 0, s>>>(x, t32, k, H, ids, E, tile_rows, *b);
    else if (b->fmt == FM_W4A8_DISPATCH_NV)
        dispatch_small_kernel<false, FM_W4A8_DISPATCH_NV>
            <<<1, MAX_EXPERTS, 0, s>>>(x, t32, k, H, ids, E, tile_rows, *b);
    else if (b->xsum)
        dispatch_small_kernel<true, FM_W4A8_DISPATCH_E4M3>
            <<<1, MAX_EXPERTS, 0, s>>>(x, t32, k, H, ids, E, tile_rows, *b);
    else
        dispatch_small_kernel<false, FM_W4A8_DISPATCH_E4M3>
            <<<1, MAX_EXPERTS, 0, s>>>(x, t32, k, H, ids, E, tile_rows, *b);
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

// ---- expert parallelism (backend/ep_blocks.h): the sending rank's blocks, the receiving rank's dispatch ----------

// One block of 1024 threads over the P routed copies in chunks of 1024, in (token, j) order: each copy's index in its
// destination's block (the copies of a warp to one rank ranked by __match_any_sync, the warps' counts scanned per
// rank), its local expert id into that block, ret_row[p]; the blocks' row counts into their headers last.
static __global__ void __launch_bounds__(1024)
    ep_positions_kernel(const int32_t *ids, int64_t P, int32_t el, int32_t N, int64_t cap, uint8_t *send,
                        int64_t dblock, int64_t ids_at, int32_t *ret_row) {
    __shared__ int32_t wcount[32][FM_EP_MAX_RANKS];
    __shared__ int32_t base[FM_EP_MAX_RANKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < FM_EP_MAX_RANKS) base[threadIdx.x] = 0;
    for (int64_t c0 = 0; c0 < P; c0 += 1024) {
        for (int i = threadIdx.x; i < 32 * FM_EP_MAX_RANKS; i += 1024) (&wcount[0][0])[i] = 0;
        __syncthreads();
        const int64_t p = c0 + threadIdx.x;
        const int32_t e = p < P ? ids[p] : -1, d = e >= 0 ? e / el : -1;
        const unsigned same = __match_any_sync(0xffffffffu, d);
        const int rank = __popc(same & ((1u << lane) - 1u));
        if (d >= 0 && rank == 0) wcount[warp][d] = __popc(same);
        __syncthreads();
        if ((int)threadIdx.x < N) {
            int32_t acc = base[threadIdx.x];
            for (int w = 0; w < 32; w++) {
                const int32_t n = wcount[w][threadIdx.x];
                wcount[w][threadIdx.x] = acc;
                acc += n;
            }
            base[threadIdx.x] = acc;
        }
        __syncthreads();
        if (d >= 0) {
            const int32_t pos = wcount[warp][d] + rank;
            ((int32_t *)(send + d * dblock + ids_at))[pos] = e - d * el;
            ret_row[p] = (int32_t)(d * cap + pos);
        }
        __syncthreads();
    }
    if ((int)threadIdx.x < N) {
        int32_t *h = (int32_t *)(send + threadIdx.x * dblock);
        h[0] = base[threadIdx.x], h[1] = 0, h[2] = 0, h[3] = 0;
    }
}

// One warp per (routed copy p, 128-group g): the token's group quantized as the moe's dispatch quantizes it, into
// the copy's row (backend/dispatch_row.h). e4m3: the group's H codes, then its fp32 scale. FP4 (FMT; NVFP4's
// tensor scale, of the ranks' amaxes): its E2M1 pairs, then its block scales (4 UE8M0 or 8 e4m3 bytes) among the row's
// ceil(H / 32 or 16).
// H % 4 == 0 (the launcher checks): whole lanes. FP4 rows are byte-aligned only (their length may be odd): bytes.
template <int FMT>
static __global__ void ep_rows_kernel(const __nv_bfloat16 *x, int64_t H, int32_t k, int64_t P, const int32_t *ret_row,
                                      int64_t cap, uint8_t *send, int64_t dblock, int64_t rows_at, int64_t row_d,
                                      const float *amaxes, int32_t n_ranks) {
    constexpr int BLOCKS = FMT == FM_W4A8_DISPATCH_NV ? 8 : 4; /* FP4 block scales per 128-group */
    const float ts = FMT == FM_W4A8_DISPATCH_NV ? ep_tensor_scale(amaxes, n_ranks) : 1.0f;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < P * G; task += warps) {
        const int64_t p = task / G, g = task % G, c = g * 128 + lane * 4;
        const int32_t rr = ret_row[p];
        uint8_t *row = send + (rr / cap) * dblock + rows_at + (rr % cap) * row_d;
        float v[4];
        load_group(x + (p / k) * H, H, g, v);
        if (FMT == FM_W4A8_DISPATCH_E4M3) {
            float scale, sum;
            const uint32_t word = quantize_group<false>(v, H, g, &scale, &sum);
            if (c < H) *(uint32_t *)(row + c) = word;
            if (lane == 0) *(float *)(row + H + 4 * g) = scale;
        } else {
            uint32_t sc[2], byte;
            const uint32_t codes = quantize_group_fp4<FMT>(v, ts, sc, &byte);
            const int64_t nb = (H + 1) / 2, blocks = (H + 128 / BLOCKS - 1) / (128 / BLOCKS);
            if (c < H) {
                row[c / 2] = (uint8_t)codes;
                row[c / 2 + 1] = (uint8_t)(codes >> 8);
            }
            if (lane < BLOCKS && g * BLOCKS + lane < blocks)
                row[nb + g * BLOCKS + lane] = (uint8_t)(sc[lane / 4] >> (8 * (lane % 4)));
        }
    }
}

// The native format (FM_A_NATIVE: the activations as they are, bf16 or fp32): each copy's row is its token's row.
template <typename A>
static __global__ void ep_native_rows_kernel(const A *x, int64_t H, int32_t k, int64_t P, const int32_t *ret_row,
                                             int64_t cap, uint8_t *send, int64_t dblock, int64_t rows_at,
                                             int64_t row_d) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * H; i += stride) {
        const int64_t p = i / H, c = i % H;
        const int32_t rr = ret_row[p];
        ((A *)(send + (rr / cap) * dblock + rows_at + (rr % cap) * row_d))[c] = x[(p / k) * H + c];
    }
}

static unsigned elem_blocks(int64_t n) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

void fm_cuda_ep_dispatch(const void *x, int64_t T, const int32_t *ids, const fm_ep_layout *L, const float *amaxes,
                         uint8_t *send, int32_t *ret_row, cudaStream_t s) {
    const bool native = L->fmt == FM_A_NATIVE;
    const bool fmt_ok = native || L->fmt == FM_A_E4M3_G128 || L->fmt == FM_A_MXFP4 || L->fmt == FM_A_NVFP4;
    if (!fmt_ok || (!native && L->H % 4) || L->n_ranks > FM_EP_MAX_RANKS) {
        fprintf(stderr,
                "fp8moe: ep_dispatch: %s rows of %lld over %d ranks (the native, e4m3, MXFP4 and NVFP4 dispatch; "
                "H %% 4 == 0 for the quantized ones)\n",
                fm_afmt_name(L->fmt), (long long)L->H, L->n_ranks);
        abort();
    }
    const int64_t P = T * L->k;
    ep_positions_kernel<<<1, 1024, 0, s>>>(ids, P, L->n_experts / L->n_ranks, L->n_ranks, L->cap, send,
                                           (int64_t)L->dblock, (int64_t)L->ids_at, ret_row);
    FM_LAUNCH_CHECK("ep_positions");
    if (P == 0) return;
    if (native) {
        const int64_t db = (int64_t)L->dblock, at = (int64_t)L->rows_at, rd = (int64_t)L->row_d;
        if (L->act_bf16)
            ep_native_rows_kernel<__nv_bfloat16><<<elem_blocks(P * L->H), 256, 0, s>>>(
                (const __nv_bfloat16 *)x, L->H, L->k, P, ret_row, L->cap, send, db, at, rd);
        else
            ep_native_rows_kernel<float><<<elem_blocks(P * L->H), 256, 0, s>>>((const float *)x, L->H, L->k, P, ret_row,
                                                                               L->cap, send, db, at, rd);
        FM_LAUNCH_CHECK("ep_native_rows");
        return;
    }
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    const unsigned grid = warp_blocks(P * fm_ceil_div(L->H, 128));
    const int64_t dblock = (int64_t)L->dblock, rows_at = (int64_t)L->rows_at, row_d = (int64_t)L->row_d;
    switch (fm_w4a8_dispatch_of(L->fmt)) {
    case FM_W4A8_DISPATCH_E4M3:
        ep_rows_kernel<FM_W4A8_DISPATCH_E4M3>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    case FM_W4A8_DISPATCH_MX:
        ep_rows_kernel<FM_W4A8_DISPATCH_MX>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    case FM_W4A8_DISPATCH_NV:
        ep_rows_kernel<FM_W4A8_DISPATCH_NV>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    }
    FM_LAUNCH_CHECK("ep_rows");
}

// The receiving rank: place q = s cap + i of the N x cap the blocks hold gets block s's local id of row i, or -1
// past its count (the tile plan skips those).
static __global__ void ep_flatten_kernel(const uint8_t *recv, int64_t NQ, int64_t cap, int64_t dblock, int64_t ids_at,
                                         int32_t *ids) {
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < NQ; q += (int64_t)gridDim.x * blockDim.x) {
        const uint8_t *b = recv + (q / cap) * dblock;
        const int64_t i = q % cap;
        ids[q] = i < *(const int32_t *)b ? ((const int32_t *)(b + ids_at))[i] : -1;
    }
}

// One warp per (place q, 128-group g) of a received row: its codes and scale where the moe's dispatch would have
// quantized them (x8 row slot, zeros past H; xs[g][slot]), with SUMS the group's sum as quantize_group makes it.
template <bool SUMS>
static __global__ void ep_gather_kernel(const uint8_t *recv, int64_t NQ, int64_t H, int64_t cap, int64_t dblock,
                                        int64_t rows_at, int64_t row_d, const int32_t *slot_of_pair, uint8_t *x8,
                                        float *xs, float *xsum) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128, Hp = G * 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < NQ * G; task += warps) {
        const int64_t q = task / G, g = task % G, c = g * 128 + lane * 4;
        const int32_t slot = slot_of_pair[q];
        if (slot < 0) continue; /* warp-uniform: one place per warp */
        const uint8_t *row = recv + (q / cap) * dblock + rows_at + (q % cap) * row_d;
        const uint32_t word = c < H ? *(const uint32_t *)(row + c) : 0u;
        const float scale = *(const float *)(row + H + 4 * g);
        *(uint32_t *)(x8 + slot * Hp + c) = word;
        float sum = 0.0f;
        if (SUMS) {
            for (int i = 0; i < 4; i++) sum += e4m3_decode((word >> (8 * i)) & 0xFFu);
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        }
        if (lane == 0) {
            xs[g * NQ + slot] = scale;
            if (SUMS) xsum[g * NQ + slot] = sum * scale;
        }
    }
}

// An FP4 dispatch's ep_gather_kernel: place q's E2M1 pairs of group g into x8 (the slot's pad128(H) / 2 bytes), its
// block scales as the group's word(s) of xs (fm_dispatch_bufs); NVFP4: the tensor scale (of the ranks' amaxes) where
// the GEMM reads it.
template <int FMT>
static __global__ void ep_gather_fp4_kernel(const uint8_t *recv, int64_t NQ, int64_t H, int64_t cap, int64_t dblock,
                                            int64_t rows_at, int64_t row_d, const int32_t *slot_of_pair, uint8_t *x8,
                                            uint32_t *xs, const float *amaxes, int32_t n_ranks, uint32_t *amax) {
    constexpr int BLOCKS = FMT == FM_W4A8_DISPATCH_NV ? 8 : 4;
    if (FMT == FM_W4A8_DISPATCH_NV && blockIdx.x == 0 && threadIdx.x == 0)
        ((float *)amax)[1] = ep_tensor_scale(amaxes, n_ranks);
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128, Hp = G * 128;
    const int64_t nb = (H + 1) / 2, blocks = (H + 128 / BLOCKS - 1) / (128 / BLOCKS);
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < NQ * G; task += warps) {
        const int64_t q = task / G, g = task % G, c2 = g * 64 + lane * 2;
        const int32_t slot = slot_of_pair[q];
        if (slot < 0) continue; /* warp-uniform: one place per warp */
        const uint8_t *row = recv + (q / cap) * dblock + rows_at + (q % cap) * row_d;
        const uint32_t codes = c2 < nb ? (uint32_t)row[c2] | (uint32_t)row[c2 + 1] << 8 : 0u;
        *(uint16_t *)(x8 + slot * (Hp / 2) + c2) = (uint16_t)codes;
        const uint32_t byte = lane < BLOCKS && g * BLOCKS + lane < blocks ? row[nb + g * BLOCKS + lane] : 0u;
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < BLOCKS; j++) w[j / 4] |= __shfl_sync(0xffffffffu, byte, j) << (8 * (j % 4));
        if (lane == 0) {
            if (FMT == FM_W4A8_DISPATCH_MX) xs[g * NQ + slot] = w[0];
            else ((uint2 *)xs)[g * NQ + slot] = make_uint2(w[0], w[1]);
        }
    }
}

void fm_cuda_ep_flatten(const uint8_t *recv, const fm_ep_layout *L, int32_t *ids, cudaStream_t s) {
    const int64_t NQ = (int64_t)L->n_ranks * L->cap, blocks = fm_ceil_div(NQ, 256);
    const unsigned grid = (unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024);
    ep_flatten_kernel<<<grid, 256, 0, s>>>(recv, NQ, L->cap, (int64_t)L->dblock, (int64_t)L->ids_at, ids);
    FM_LAUNCH_CHECK("ep_flatten");
}

void fm_cuda_ep_receive(const uint8_t *recv, const fm_ep_layout *L, int32_t E, int32_t tile_rows, const float *amaxes,
                        int32_t *ids, const fm_dispatch_bufs *b, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || b->fmt != (int32_t)fm_w4a8_dispatch_of(L->fmt) ||
        (L->fmt != FM_A_E4M3_G128 && L->fmt != FM_A_MXFP4 && L->fmt != FM_A_NVFP4)) {
        fprintf(stderr, "fp8moe: ep_receive: %d experts (1..%d), %s rows (the e4m3, MXFP4 and NVFP4 dispatch)\n", E,
                MAX_EXPERTS, fm_afmt_name(L->fmt));
        abort();
    }
    const int64_t NQ = (int64_t)L->n_ranks * L->cap, blocks = fm_ceil_div(NQ, 256);
    const unsigned grid = (unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024);
    fm_cuda_ep_flatten(recv, L, ids, s);
    count_kernel<<<grid, 256, 0, s>>>(ids, NQ, E, b->counts);
    FM_LAUNCH_CHECK("ep_count");
    plan_kernel<<<1, MAX_EXPERTS, 0, s>>>(b->counts, E, tile_rows, b->seg_start, b->cursor, b->tiles, b->n_tiles,
                                          b->matrix_of);
    FM_LAUNCH_CHECK("ep_plan");
    slot_kernel<<<grid, 256, 0, s>>>(ids, NQ, b->seg_start, b->cursor, b->pair_of_slot, b->slot_of_pair);
    FM_LAUNCH_CHECK("ep_slots");
    const unsigned qblocks = warp_blocks(NQ * fm_ceil_div(L->H, 128));
    const int64_t dblock = (int64_t)L->dblock, rows_at = (int64_t)L->rows_at, row_d = (int64_t)L->row_d;
    if (b->fmt == FM_W4A8_DISPATCH_MX)
        ep_gather_fp4_kernel<FM_W4A8_DISPATCH_MX>
            <<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair, b->x8,
                                     (uint32_t *)b->xs, amaxes, L->n_ranks, b->amax);
    else if (b->fmt == FM_W4A8_DISPATCH_NV)
        ep_gather_fp4_kernel<FM_W4A8_DISPATCH_NV>
            <<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair, b->x8,
                                     (uint32_t *)b->xs, amaxes, L->n_ranks, b->amax);
    else if (b->xsum)
        ep_gather_kernel<true><<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair,
                                                       b->x8, b->xs, b->xsum);
    else
        ep_gather_kernel<false><<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair,
                                                        b->x8, b->xs, NULL);
    FM_LAUNCH_CHECK("ep_gather");
}

void fm_cuda_amax(const void *x, bool bf16, int64_t n, float *out, cudaStream_t s) {
    FM_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof *out, s));
    if (n <= 0) return;
    const int64_t blocks = fm_ceil_div(n, 256);
    const unsigned grid = (unsigned)(blocks < 1024 ? blocks : 1024);
    if (bf16) amax_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((const __nv_bfloat16 *)x, n, (uint32_t *)out);
    else amax_kernel<float><<<grid, 256, 0, s>>>((const float *)x, n, (uint32_t *)out);
    FM_LAUNCH_CHECK("amax");
}
