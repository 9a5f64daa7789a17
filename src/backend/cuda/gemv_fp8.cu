// Decode-size FP8 projections (gemv_fp8.cuh): the weights stream through once, the few activation rows ride along.
//
// Swap-AB on mma.sync.m16n8k32 e4m3 (mma_e4m3.cuh): a 16-row block of weights is the A operand, read
// global -> registers with 16-byte loads (each weight byte read once, not staged), and the activation rows are the
// B operand, n = 8 per tile (NT = 1 tile for M <= 8, 2 for M <= 16), read from shared memory. A CTA is 8 warps =
// RB row blocks x KS slices of K (RB KS = 8); a warp walks every KS-th 64-byte chunk (W8A8) or 128-group (W4A8) of
// its rows, U of them in flight, and the KS partial sums of a row block meet in shared memory in a fixed order
// (deterministic, no atomics).
//
// Order of a CTA, for programmatic dependent launch (pdl.cuh): issue the first round of weight loads (no earlier
// kernel writes the weights), wait for the previous kernel, stage x in shared memory (e4m3 rows padded so the B
// reads are conflict-free; from an e4m3 input by copying, or from bf16 by quantizing it here: per tensor for
// W8A8, per (row, 128-group) for W4A8, bit for bit as the quantizer kernels), then the MMAs. x is read through L2
// only (ld.cg): L1 is not coherent, and a co-resident CTA of the previous kernel may have cached the same address.
//
//   W8A8 (weights e4m3 rows): the dot product does not care in which order k is visited as long as A and B
//   agree, so lane (g, t) loads the 16 bytes at k = 64 c + 16 t of rows g and g + 8 and of activation row g, and
//   feeds bytes 0-7 to one mma and 8-15 to the next: a0/a1 = bytes 0-3 of rows g/g+8, a2/a3 = bytes 4-7, b0/b1
//   the same bytes of x. No permutation of the bank is needed. One fp32 scale per matrix and one per tensor,
//   applied once at the end, as cuBLASLt does.
//   W4A8 (int4-tc bank): the bank is already in fragment order (w4a8_layout.cuh: two 16-byte loads per lane per
//   16-row block and 128-group); x is read in the matching mma order; per group a partial is promoted into the
//   accumulator with (weight scale x 512 x activation scale), as the grouped kernel and the CPU emulation do.
//
// Floor: weight bytes / 4.25 TB/s, e.g. Qwen3-30B-A3B's attention projections (qkv 5120 x 2048, o 2048 x 4096):
// 18.9 MB e4m3 per layer, 4.4 us; int4-tc 9.4 MB + scales, 2.3 us. At these sizes a kernel's fixed costs (launch,
// ramp, the wait, the last wave) are of the same order: bench/NOTES.md has the measured figures.
#include <string.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define WARPS  8
// Loads in flight per warp, for one activation tile (NT = 1; halved for NT = 2 to stay within 128 registers, so
// that two CTAs fit on an SM: the running kernel's and the next one's under PDL)
#define W8A8_U 8 // 64-byte chunks (a Qwen3 projection at M <= 8: all of a warp's chunks in one round)
#define W4A8_U 4 // 128-groups (likewise)

// the KS partial sums of each row block: warp w of the CTA is (row block w / KS, slice w % KS)
template <int NT, int KS>
static __device__ __forceinline__ void reduce_slices(float acc[NT][4], float (*red)[NT][4][32]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][nt][i][lane] = acc[nt][i];
    __syncthreads();
    if (warp % KS) return;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float a = red[warp][nt][i][lane];
            for (int j = 1; j < KS; j++) a += red[warp + j][nt][i][lane];
            acc[nt][i] = a;
        }
}

// y for rows r0 + g and r0 + g + 8, activation rows 8 nt + 2t and + 1 (the mma's C fragment), times scale
template <int NT>
static __device__ __forceinline__ void store_rows(const float acc[NT][4], int64_t r0, int64_t N, int64_t M, float scale,
                                                  __nv_bfloat16 *y) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t row = r0 + g + (i >= 2 ? 8 : 0), m = nt * 8 + 2 * t + (i & 1);
            if (row < N && m < M) y[m * N + row] = __float2bfloat16_rn(acc[nt][i] * scale);
        }
}

// ---- x into shared memory: after the wait, every thread of the CTA, ends with __syncthreads ----

#define W8A8_PAD 64 // bytes after each staged row: lane (g, t)'s 16-byte reads fall in distinct banks per phase
#define W4A8_PAD 16 // likewise for the 4-byte reads of the W4A8 fragments
static const int STAGE_UNROLL = 8; // loads in flight per thread while staging (a constant: #pragma unroll takes it)

static __device__ __forceinline__ float bf16_bits(uint32_t w, int hi) { return __uint_as_float(hi ? w & 0xFFFF0000u : w << 16); }

// 8 bf16 of a row from column c (zeros past K), packed as they are
static __device__ __forceinline__ uint4 load8_bf16(const __nv_bfloat16 *row, int64_t c, int64_t K) {
    if (c + 8 <= K && ((uintptr_t)(row + c) & 15) == 0) return __ldcg((const uint4 *)(row + c));
    uint32_t w[4] = {0, 0, 0, 0};
    for (int j = 0; j < 8; j++)
        if (c + j < K) w[j / 2] |= (uint32_t)__bfloat16_as_ushort(row[c + j]) << (16 * (j % 2));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

static __device__ __forceinline__ float amax8(const uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float          a = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(bf16_bits(w[j / 2], j % 2)));
    return a;
}

static __device__ __forceinline__ uint2 encode8(const uint4 v, float scale) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t       q[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++) q[j / 4] |= (uint32_t)e4m3t_encode(bf16_bits(w[j / 2], j % 2) / scale) << (8 * (j % 4));
    return make_uint2(q[0], q[1]);
}

// e4m3 rows x [M][ld_src] -> sm [R][ldsm] (rows past M, and bytes past ld_src, zero)
static __device__ void stage_copy(const uint8_t *x, int64_t M, int64_t ld_src, int R, int64_t ldsm, uint8_t *sm) {
    const int64_t per_row = ldsm / 16, n = R * per_row;
#pragma unroll STAGE_UNROLL
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t r = i / per_row, c = (i % per_row) * 16;
        *(uint4 *)(sm + r * ldsm + c) = r < M && c < ld_src ? __ldcg((const uint4 *)(x + r * ld_src + c)) : make_uint4(0, 0, 0, 0);
    }
}

// W8A8 from bf16 x [M][K]: the per-tensor scale max(amax / 448, 1e-12) (every CTA computes the same value from the
// same data), then the codes x / scale into sm [R][ldsm]; returns the scale
static __device__ float stage_w8a8_bf16(const __nv_bfloat16 *x, int64_t M, int64_t K, int R, int64_t ldsm, uint8_t *sm) {
    __shared__ float part[WARPS];
    const int64_t    per_row = ldsm / 8, n = R * per_row;
    float            a = 0.0f;
#pragma unroll STAGE_UNROLL
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t r = i / per_row, c = (i % per_row) * 8;
        if (r < M && c < K) a = fmaxf(a, amax8(load8_bf16(x + r * K, c, K)));
    }
    a = e4m3t_warp_max(a);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = a;
    __syncthreads();
    a = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) a = fmaxf(a, part[w]);
    const float scale = e4m3t_scale_of(__float_as_uint(a));
#pragma unroll STAGE_UNROLL
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) { /* the second pass hits L2 */
        const int64_t r = i / per_row, c = (i % per_row) * 8;
        *(uint2 *)(sm + r * ldsm + c) = r < M && c < K ? encode8(load8_bf16(x + r * K, c, K), scale) : make_uint2(0, 0);
    }
    __syncthreads();
    return scale;
}

// W4A8 from bf16 x [M][K]: one warp per (row, 128-group), 4 elements per lane, scale max(amax / 448, 1e-12) as
// quantize_group_warp (moe_dispatch.cu); codes into sm [R][ldsm], scales into ssc [R][G] (rows past M: zero codes)
static __device__ void stage_w4a8_bf16(const __nv_bfloat16 *x, int64_t M, int64_t K, int64_t G, int R, int64_t ldsm,
                                       uint8_t *sm, float *ssc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t t0 = warp; t0 < R * G; t0 += (int64_t)WARPS * STAGE_UNROLL) {
        uint2 raw[STAGE_UNROLL];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; u++) { /* all loads first: one round trip */
            const int64_t task = t0 + (int64_t)u * WARPS, r = task / G, k = (task % G) * 128 + 4 * lane;
            raw[u] = make_uint2(0, 0);
            if (task >= R * G || r >= M) continue;
            const __nv_bfloat16 *p = x + r * K + k;
            if (k + 4 <= K && ((uintptr_t)p & 7) == 0) raw[u] = __ldcg((const uint2 *)p);
            else
                for (int i = 0; i < 4; i++)
                    if (k + i < K) (i < 2 ? raw[u].x : raw[u].y) |= (uint32_t)__bfloat16_as_ushort(p[i]) << (16 * (i % 2));
        }
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; u++) {
            const int64_t task = t0 + (int64_t)u * WARPS;
            if (task >= R * G) break; /* warp-uniform */
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) a = fmaxf(a, fabsf(bf16_bits(i < 2 ? raw[u].x : raw[u].y, i % 2)));
            a = e4m3t_warp_max(a);
            const float scale = fmaxf(a / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
            uint32_t    q = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) q |= (uint32_t)e4m3t_encode(bf16_bits(i < 2 ? raw[u].x : raw[u].y, i % 2) / scale) << (8 * i);
            const int64_t r = task / G, grp = task % G;
            *(uint32_t *)(sm + r * ldsm + grp * 128 + 4 * lane) = q;
            if (lane == 0) ssc[r * G + grp] = scale;
        }
    }
    __syncthreads();
}

// W4A8 from e4m3 x [M][G 128] with scales xs[grp * ld_s + row]
static __device__ void stage_w4a8_e4m3(const uint8_t *x, const float *xs, int64_t ld_s, int64_t M, int64_t G, int R,
                                       int64_t ldsm, uint8_t *sm, float *ssc) {
    stage_copy(x, M, G * 128, R, ldsm, sm);
    for (int64_t i = threadIdx.x; i < R * G; i += blockDim.x) {
        const int64_t r = i / G, grp = i % G;
        ssc[i] = r < M ? __ldcg(xs + grp * ld_s + r) : 0.0f;
    }
    __syncthreads();
}

// ---- the kernels ----

// QX = 0: x is e4m3 [M][ld] with its scale at *x_scale (quantized by an earlier kernel); QX = 1: x is bf16 [M][K],
// quantized here (stage_w8a8_bf16). Dynamic shared memory: NT 8 rows of ld + W8A8_PAD bytes.
template <int NT, int KS, int QX>
static __global__ __launch_bounds__(WARPS * 32, 2) void w8a8_gemv_kernel(const uint8_t *W, int64_t N, int64_t ld,
                                                                       const float *w_scale, const void *x, int64_t M,
                                                                       int64_t K, const float *x_scale,
                                                                       __nv_bfloat16 *y) {
    extern __shared__ __align__(16) uint8_t xsm[];
    __shared__ float red[WARPS][NT][4][32];
    pdl_launch_dependents();
    const int     U = W8A8_U / NT;
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t r0 = ((int64_t)blockIdx.x * (WARPS / KS) + warp / KS) * 16;
    const int64_t pieces = ld / 16, chunks = (pieces + 3) / 4, ldsm = ld + W8A8_PAD; // 4 16-byte pieces per chunk
    const bool    ok_a = r0 + g < N, ok_b = r0 + g + 8 < N;
    const uint4  *wa = (const uint4 *)(W + (r0 + g) * ld), *wb = (const uint4 *)(W + (r0 + g + 8) * ld);

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4       va[U], vb[U];
#pragma unroll
    for (int u = 0; u < U; u++) { /* the first round of weights, before the wait */
        const int64_t p = 4 * (ks + (int64_t)u * KS) + t;
        va[u] = p < pieces && ok_a ? __ldcs(wa + p) : zero; // read once: streaming
        vb[u] = p < pieces && ok_b ? __ldcs(wb + p) : zero;
    }
    pdl_wait(); /* from here on x may be read and y written */
    float xscale;
    if (QX) {
        xscale = stage_w8a8_bf16((const __nv_bfloat16 *)x, M, K, NT * 8, ldsm, xsm);
    } else {
        stage_copy((const uint8_t *)x, M, ld, NT * 8, ldsm, xsm);
        xscale = __ldcg(x_scale);
        __syncthreads();
    }
    for (int64_t c0 = ks; c0 < chunks; c0 += (int64_t)KS * U) {
        if (c0 != ks)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t p = 4 * (c0 + (int64_t)u * KS) + t;
                va[u] = p < pieces && ok_a ? __ldcs(wa + p) : zero;
                vb[u] = p < pieces && ok_b ? __ldcs(wb + p) : zero;
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            /* p differs between the lanes of a quad: a piece past the row is zeros (va, vb too), never a skipped
               mma (mma.sync needs the whole warp) */
            const int64_t  p = 4 * (c0 + (int64_t)u * KS) + t;
            const uint32_t a0[4] = {va[u].x, vb[u].x, va[u].y, vb[u].y}, a1[4] = {va[u].z, vb[u].z, va[u].w, vb[u].w};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 b = p < pieces ? *(const uint4 *)(xsm + (nt * 8 + g) * ldsm + 16 * p) : zero;
                mma_e4m3(acc[nt], a0, b.x, b.y);
                mma_e4m3(acc[nt], a1, b.z, b.w);
            }
        }
    }
    reduce_slices<NT, KS>(acc, red);
    if (ks) return;
    store_rows<NT>(acc, r0, N, M, *w_scale * xscale, y);
}

// QX = 0: x is e4m3 [M][n_groups 128] with scales xs[group * ld_s + row] (quantized by an earlier kernel); QX = 1:
// x is bf16 [M][K] (K = ld_s), quantized here (stage_w4a8_bf16). Dynamic shared memory: NT 8 rows of
// n_groups 128 + W4A8_PAD bytes, then their scales [NT 8][n_groups] fp32.
template <int NT, int KS, int QX>
static __global__ __launch_bounds__(WARPS * 32, 2) void w4a8_gemv_kernel(const uint8_t *codes, const __nv_bfloat16 *wscales,
                                                                       int64_t N, int64_t rows_pad, int64_t n_groups,
                                                                       const void *x, const float *xs, int64_t ld_s,
                                                                       int64_t M, __nv_bfloat16 *y) {
    extern __shared__ __align__(16) uint8_t xsm[];
    __shared__ float red[WARPS][NT][4][32];
    pdl_launch_dependents();
    const int     U = W4A8_U / NT;
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t blk = (int64_t)blockIdx.x * (WARPS / KS) + warp / KS, r0 = blk * 16;
    const bool    live = r0 < rows_pad; // a block past the bank: no loads, zero partials (it still meets the others)
    const int64_t G = n_groups, ldsm = G * 128 + W4A8_PAD;
    float        *ssc = (float *)(xsm + NT * 8 * ldsm);
    const uint8_t *wq = codes + blk * G * FM_TC_CHUNK + 16 * lane;

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4       v0[U], v1[U];
    float       wsa[U], wsb[U];
    for (int64_t g0 = ks, first = 1; g0 < G || first; g0 += (int64_t)KS * U) {
        const bool any = live && g0 < G;
#pragma unroll
        for (int u = 0; u < U; u++) { /* codes and weight scales; the first round before the wait */
            const int64_t grp = g0 + (int64_t)u * KS;
            const bool    in = any && grp < G;
            v0[u]  = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK)) : zero;
            v1[u]  = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK + 512)) : zero;
            wsa[u] = in ? __bfloat162float(wscales[grp * rows_pad + r0 + g]) * 512.0f : 0.0f;
            wsb[u] = in ? __bfloat162float(wscales[grp * rows_pad + r0 + g + 8]) * 512.0f : 0.0f;
        }
        if (first) { /* every warp comes here once, whatever its share of K: the staging needs all of them */
            first = 0;
            pdl_wait();
            if (QX) stage_w4a8_bf16((const __nv_bfloat16 *)x, M, ld_s, G, NT * 8, ldsm, xsm, ssc);
            else stage_w4a8_e4m3((const uint8_t *)x, xs, ld_s, M, G, NT * 8, ldsm, xsm, ssc);
        }
        if (!any) continue;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            if (grp >= G) break;
            const uint32_t w[8] = {v0[u].x, v0[u].y, v0[u].z, v0[u].w, v1[u].x, v1[u].y, v1[u].z, v1[u].w};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* step s: words 2s and 2s + 1 hold k = 32 s + 4 t + 0..3 and 32 s + 16 + 4 t + 0..3 of the group
                   (w4a8_layout.cuh); b0 and b1 are the same bytes of activation row 8 nt + g */
                const uint8_t *xb = xsm + (nt * 8 + g) * ldsm + grp * 128 + 4 * t;
                float          part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const uint32_t a[4] = {codes_top(w[2 * s]), codes_bottom(w[2 * s]), codes_top(w[2 * s + 1]),
                                           codes_bottom(w[2 * s + 1])};
                    mma_e4m3(part, a, *(const uint32_t *)(xb + 32 * s), *(const uint32_t *)(xb + 32 * s + 16));
                }
                const float x0 = ssc[(nt * 8 + 2 * t) * G + grp], x1 = ssc[(nt * 8 + 2 * t + 1) * G + grp];
                acc[nt][0] = fmaf(part[0], wsa[u] * x0, acc[nt][0]);
                acc[nt][1] = fmaf(part[1], wsa[u] * x1, acc[nt][1]);
                acc[nt][2] = fmaf(part[2], wsb[u] * x0, acc[nt][2]);
                acc[nt][3] = fmaf(part[3], wsb[u] * x1, acc[nt][3]);
            }
        }
    }
    reduce_slices<NT, KS>(acc, red);
    if (ks || !live) return;
    store_rows<NT>(acc, r0, N, M, 1.0f, y); // the scales are in the accumulator
}

bool fm_cuda_gemv_fused_quant(void) {
    static int fused = -1;
    if (fused < 0) {
        const char *env = getenv("FP8MOE_GEMV_FUSED");
        fused = !(env && strcmp(env, "0") == 0);
    }
    return fused == 1;
}

// K slices per row block: about 8 chunks (W8A8) or 4 groups (W4A8) per warp, so a warp's loads are one round of U
// in flight where K allows, and the grid still has ~N / 16 KS / 8 CTAs
static int slices_for(int64_t steps, int64_t per_warp) {
    int ks = 1;
    while (ks < WARPS && steps >= 2 * ks * per_warp) ks *= 2;
    return ks;
}

// Dynamic shared memory above 48 KiB must be allowed per kernel, once.
static void allow_smem(const void *fn, size_t bytes, bool *done) {
    if (bytes > 48 * 1024 && !*done) {
        FM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FM_GEMV_FP8_SMEM_MAX));
        *done = true;
    }
}

size_t fm_cuda_gemv_fp8_smem(bool w4a8, int64_t M, int64_t ldx) {
    const int64_t rows = M <= 8 ? 8 : 16;
    if (!w4a8) return (size_t)(rows * (ldx + W8A8_PAD));
    return (size_t)(rows * (ldx + W4A8_PAD) + rows * (ldx / 128) * (int64_t)sizeof(float));
}

template <int NT, int KS, int QX>
static void launch_w8a8(const uint8_t *W, int64_t N, int64_t ld, const float *ws, const void *x, int64_t M, int64_t K,
                        const float *xsc, __nv_bfloat16 *y, cudaStream_t s) {
    static bool   allowed = false;
    const int64_t blocks = fm_ceil_div(fm_ceil_div(N, 16), WARPS / KS);
    const size_t  smem = fm_cuda_gemv_fp8_smem(false, M, ld);
    allow_smem((const void *)w8a8_gemv_kernel<NT, KS, QX>, smem, &allowed);
    void *args[] = {(void *)&W, (void *)&N, (void *)&ld, (void *)&ws, (void *)&x, (void *)&M, (void *)&K, (void *)&xsc,
                    (void *)&y};
    fm_cuda_launch_pdl((const void *)w8a8_gemv_kernel<NT, KS, QX>, dim3((unsigned)blocks), dim3(WARPS * 32), smem, s, args);
}

template <int NT, int QX>
static void dispatch_w8a8(int ks, const uint8_t *W, int64_t N, int64_t ld, const float *ws, const void *x, int64_t M,
                          int64_t K, const float *xsc, __nv_bfloat16 *y, cudaStream_t s) {
    switch (ks) {
    case 1: launch_w8a8<NT, 1, QX>(W, N, ld, ws, x, M, K, xsc, y, s); break;
    case 2: launch_w8a8<NT, 2, QX>(W, N, ld, ws, x, M, K, xsc, y, s); break;
    case 4: launch_w8a8<NT, 4, QX>(W, N, ld, ws, x, M, K, xsc, y, s); break;
    default: launch_w8a8<NT, 8, QX>(W, N, ld, ws, x, M, K, xsc, y, s); break;
    }
}

static void check_w8a8(int64_t M, int64_t N, int64_t ld, const char *what) {
    if (M < 1 || M > FM_GEMV_FP8_MAX_M || ld % 16 || fm_ceil_div(N, 16) > 2147483647LL ||
        fm_cuda_gemv_fp8_smem(false, M, ld) > FM_GEMV_FP8_SMEM_MAX) {
        fprintf(stderr, "fp8moe: %s: unsupported shape (M %lld, N %lld, ld %lld)\n", what, (long long)M, (long long)N,
                (long long)ld);
        abort();
    }
}

void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                       const float *x_scale, __nv_bfloat16 *y, cudaStream_t s) {
    check_w8a8(M, N, ld, "w8a8_gemv");
    const int ks = slices_for(fm_ceil_div(ld, 64), 8);
    if (M <= 8) dispatch_w8a8<1, 0>(ks, W, N, ld, w_scale, x, M, ld, x_scale, y, s);
    else dispatch_w8a8<2, 0>(ks, W, N, ld, w_scale, x, M, ld, x_scale, y, s);
    FM_LAUNCH_CHECK("w8a8_gemv");
}

void fm_cuda_w8a8_gemv_bf16(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const __nv_bfloat16 *x,
                            int64_t M, int64_t K, __nv_bfloat16 *y, cudaStream_t s) {
    check_w8a8(M, N, ld, "w8a8_gemv_bf16");
    const int ks = slices_for(fm_ceil_div(ld, 64), 8);
    if (M <= 8) dispatch_w8a8<1, 1>(ks, W, N, ld, w_scale, x, M, K, NULL, y, s);
    else dispatch_w8a8<2, 1>(ks, W, N, ld, w_scale, x, M, K, NULL, y, s);
    FM_LAUNCH_CHECK("w8a8_gemv_bf16");
}

template <int NT, int KS, int QX>
static void launch_w4a8(const fm_bank *w, int32_t idx, const void *x, const float *xs, int64_t ld_s, int64_t M,
                        __nv_bfloat16 *y, cudaStream_t s) {
    const int64_t  blocks = fm_ceil_div(w->rows_pad / 16, WARPS / KS);
    const uint8_t *codes = (const uint8_t *)w->w + (int64_t)idx * (w->rows_pad / 16) * w->n_groups * FM_TC_CHUNK;
    const __nv_bfloat16 *sc = w->scales + (int64_t)idx * w->n_groups * w->rows_pad;
    int64_t rows = w->rows, rows_pad = w->rows_pad, n_groups = w->n_groups;
    static bool  allowed = false;
    const size_t smem = fm_cuda_gemv_fp8_smem(true, M, n_groups * 128);
    allow_smem((const void *)w4a8_gemv_kernel<NT, KS, QX>, smem, &allowed);
    void   *args[] = {(void *)&codes, (void *)&sc,   (void *)&rows, (void *)&rows_pad, (void *)&n_groups,
                      (void *)&x,     (void *)&xs,   (void *)&ld_s, (void *)&M,        (void *)&y};
    fm_cuda_launch_pdl((const void *)w4a8_gemv_kernel<NT, KS, QX>, dim3((unsigned)blocks), dim3(WARPS * 32), smem, s, args);
}

template <int NT, int QX>
static void dispatch_w4a8(int ks, const fm_bank *w, int32_t idx, const void *x, const float *xs, int64_t ld_s,
                          int64_t M, __nv_bfloat16 *y, cudaStream_t s) {
    switch (ks) {
    case 1: launch_w4a8<NT, 1, QX>(w, idx, x, xs, ld_s, M, y, s); break;
    case 2: launch_w4a8<NT, 2, QX>(w, idx, x, xs, ld_s, M, y, s); break;
    case 4: launch_w4a8<NT, 4, QX>(w, idx, x, xs, ld_s, M, y, s); break;
    default: launch_w4a8<NT, 8, QX>(w, idx, x, xs, ld_s, M, y, s); break;
    }
}

static void check_w4a8(const fm_bank *w, int32_t idx, int64_t M, const char *what) {
    if (w->fmt != FM_W_INT4_G128_TC || w->interleaved || M < 1 || M > FM_GEMV_FP8_MAX_M || idx < 0 || idx >= w->n ||
        fm_cuda_gemv_fp8_smem(true, M, w->n_groups * 128) > FM_GEMV_FP8_SMEM_MAX) {
        fprintf(stderr, "fp8moe: %s: unsupported bank or shape (%s%s, M %lld, matrix %d of %d)\n", what,
                fm_wformat_name(w->fmt), w->interleaved ? ", interleaved" : "", (long long)M, idx, w->n);
        abort();
    }
}

void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, int64_t ld_s, int64_t M,
                       __nv_bfloat16 *y, cudaStream_t s) {
    check_w4a8(w, idx, M, "w4a8_gemv");
    const int ks = slices_for(w->n_groups, 4);
    if (M <= 8) dispatch_w4a8<1, 0>(ks, w, idx, x, xs, ld_s, M, y, s);
    else dispatch_w4a8<2, 0>(ks, w, idx, x, xs, ld_s, M, y, s);
    FM_LAUNCH_CHECK("w4a8_gemv");
}

void fm_cuda_w4a8_gemv_bf16(const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M, __nv_bfloat16 *y,
                            cudaStream_t s) {
    check_w4a8(w, idx, M, "w4a8_gemv_bf16");
    const int ks = slices_for(w->n_groups, 4);
    if (M <= 8) dispatch_w4a8<1, 1>(ks, w, idx, x, NULL, w->cols, M, y, s);
    else dispatch_w4a8<2, 1>(ks, w, idx, x, NULL, w->cols, M, y, s);
    FM_LAUNCH_CHECK("w4a8_gemv_bf16");
}
