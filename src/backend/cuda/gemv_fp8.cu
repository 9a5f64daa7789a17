// Decode-size FP8 projections (gemv_fp8.cuh): the weights stream through once, the few activation rows ride along.
//
// Swap-AB on mma.sync.m16n8k32 e4m3 (mma_e4m3.cuh): a 16-row block of weights is the A operand, read
// global -> registers with 16-byte loads (nothing staged in shared memory, each weight byte read once), and the
// activation rows are the B operand, n = 8 per tile (NT = 1 tile for M <= 8, 2 for M <= 16), read from L1/L2
// (x is at most 16 x K bytes). A CTA is 8 warps = RB row blocks x KS slices of K (RB KS = 8); a warp walks every
// KS-th 64-byte chunk (W8A8) or 128-group (W4A8) of its rows, U of them in flight, and the KS partial sums of a
// row block meet in shared memory in a fixed order (deterministic, no atomics).
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
// ramp, the last wave) are of the same order: bench/NOTES.md has the measured figures.
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

// The per-tensor scale of x [n elements] bf16, max(amax / 448, 1e-12), computed by the whole CTA (QX = 1 of the
// W8A8 kernel; every CTA computes the same value from the same data, as the fused quantizer of linear_w8a8.cu does
// once). 16-byte loads through L2 where x allows.
static __device__ float block_tensor_scale(const __nv_bfloat16 *x, int64_t n) {
    __shared__ float part[WARPS];
    float            a = 0.0f;
    const bool       vec = ((uintptr_t)x & 15) == 0;
    for (int64_t i = 8 * (int64_t)threadIdx.x; i < n; i += 8 * (int64_t)blockDim.x) {
        if (vec && i + 8 <= n) {
            const uint4 v = __ldcg((const uint4 *)(x + i));
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(__uint_as_float(j % 2 ? w[j / 2] & 0xFFFF0000u : w[j / 2] << 16)));
        } else {
            for (int64_t j = i; j < i + 8 && j < n; j++) a = fmaxf(a, fabsf(__bfloat162float(x[j])));
        }
    }
    a = e4m3t_warp_max(a);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = a;
    __syncthreads();
    a = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) a = fmaxf(a, part[w]);
    return e4m3t_scale_of(__float_as_uint(a));
}

// 16 elements of a bf16 row from column c0 (zeros past K) as e4m3 codes of v / scale: one B-fragment piece
static __device__ __forceinline__ uint4 quantize16(const __nv_bfloat16 *row, int64_t c0, int64_t K, float scale) {
    uint32_t w[8];
    if (c0 + 16 <= K && ((uintptr_t)(row + c0) & 15) == 0) {
        const uint4 a = __ldcg((const uint4 *)(row + c0)), b = __ldcg((const uint4 *)(row + c0 + 8));
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = 0;
        for (int j = 0; j < 16; j++)
            if (c0 + j < K) w[j / 2] |= (uint32_t)__bfloat16_as_ushort(row[c0 + j]) << (16 * (j % 2));
    }
    uint32_t q[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const float v = __uint_as_float(j % 2 ? w[j / 2] & 0xFFFF0000u : w[j / 2] << 16);
        q[j / 4] |= (uint32_t)e4m3t_encode(v / scale) << (8 * (j % 4));
    }
    return make_uint4(q[0], q[1], q[2], q[3]);
}

// QX = 0: x is e4m3 [M][ld] with its scale at *x_scale (quantized by an earlier kernel); QX = 1: x is bf16 [M][K]
// and the kernel quantizes it (block_tensor_scale, then quantize16 for each B piece), which saves the quantizer's
// launch and its round trip through memory on a decode step's critical path.
template <int NT, int KS, int QX>
static __global__ __launch_bounds__(WARPS * 32, 2) void w8a8_gemv_kernel(const uint8_t *W, int64_t N, int64_t ld,
                                                                       const float *w_scale, const void *x, int64_t M,
                                                                       int64_t K, const float *x_scale,
                                                                       __nv_bfloat16 *y) {
    __shared__ float red[WARPS][NT][4][32];
    pdl_launch_dependents();
    const int     U = (QX ? W8A8_U / 2 : W8A8_U) / NT; // QX: room for the bf16 pieces
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t r0 = ((int64_t)blockIdx.x * (WARPS / KS) + warp / KS) * 16;
    const int64_t pieces = ld / 16, chunks = (pieces + 3) / 4; // 16-byte pieces of a row; 4 pieces per chunk
    const bool    ok_a = r0 + g < N, ok_b = r0 + g + 8 < N;
    const uint4  *wa = (const uint4 *)(W + (r0 + g) * ld), *wb = (const uint4 *)(W + (r0 + g + 8) * ld);
    bool          ok_x[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) ok_x[nt] = nt * 8 + g < M;

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4       va[U], vb[U];
#pragma unroll
    for (int u = 0; u < U; u++) { /* the first round of weights: no earlier kernel writes them, so before the wait */
        const int64_t p = 4 * (ks + (int64_t)u * KS) + t;
        va[u] = p < pieces && ok_a ? __ldcs(wa + p) : zero; // read once: streaming
        vb[u] = p < pieces && ok_b ? __ldcs(wb + p) : zero;
    }
    pdl_wait(); /* from here on x may be read and y written */
    const float xscale = QX ? block_tensor_scale((const __nv_bfloat16 *)x, M * K) : *x_scale;
    for (int64_t c0 = ks; c0 < chunks; c0 += (int64_t)KS * U) {
        if (c0 != ks)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t p = 4 * (c0 + (int64_t)u * KS) + t;
                va[u] = p < pieces && ok_a ? __ldcs(wa + p) : zero;
                vb[u] = p < pieces && ok_b ? __ldcs(wb + p) : zero;
            }
        uint4 vx[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t p = 4 * (c0 + (int64_t)u * KS) + t;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int64_t row = nt * 8 + g;
                if (!(p < pieces && ok_x[nt])) vx[u][nt] = zero;
                else if (QX) vx[u][nt] = quantize16((const __nv_bfloat16 *)x + row * K, 16 * p, K, xscale);
                else vx[u][nt] = __ldcg((const uint4 *)((const uint8_t *)x + row * ld) + p);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t a0[4] = {va[u].x, vb[u].x, va[u].y, vb[u].y}, a1[4] = {va[u].z, vb[u].z, va[u].w, vb[u].w};
                mma_e4m3(acc[nt], a0, vx[u][nt].x, vx[u][nt].y);
                mma_e4m3(acc[nt], a1, vx[u][nt].z, vx[u][nt].w);
            }
    }
    reduce_slices<NT, KS>(acc, red);
    if (ks) return;
    store_rows<NT>(acc, r0, N, M, *w_scale * xscale, y);
}

// The B fragments of one (activation row, 128-group) quantized here from bf16 (QX = 1): the lane's 32 elements are
// k = 16 j + 4 t + 0..3 (j = 0..7) of the group, its quad (the 4 lanes of one g) holds the whole group, so the
// group's amax is two shuffles away; then scale = max(amax / 448, 1e-12) and the codes x / scale, exactly as
// quantize_group_warp (moe_dispatch.cu) and the CPU's 1x128 quantizer. Returns the scale (1e-12 for a row past M,
// whose codes are zero). raw holds the 8 loads of 4 bf16 (issued earlier, all at once).
static __device__ __forceinline__ void load_group_bf16(const __nv_bfloat16 *xrow, int64_t K, int64_t grp, bool ok,
                                                       uint2 raw[8]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t k = grp * 128 + 16 * j + 4 * t;
        raw[j] = make_uint2(0, 0);
        if (!ok) continue;
        if (k + 4 <= K && ((uintptr_t)(xrow + k) & 7) == 0) {
            raw[j] = __ldcg((const uint2 *)(xrow + k));
        } else {
            uint32_t w[2] = {0, 0};
            for (int i = 0; i < 4; i++)
                if (k + i < K) w[i / 2] |= (uint32_t)__bfloat16_as_ushort(xrow[k + i]) << (16 * (i % 2));
            raw[j] = make_uint2(w[0], w[1]);
        }
    }
}

static __device__ __forceinline__ float bf16_bits_to_float(uint32_t w, int hi) {
    return __uint_as_float(hi ? w & 0xFFFF0000u : w << 16);
}

static __device__ __forceinline__ float quantize_group_b(const uint2 raw[8], uint32_t xw[8]) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) amax = fmaxf(amax, fabsf(bf16_bits_to_float(i < 2 ? raw[j].x : raw[j].y, i & 1)));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float scale = fmaxf(amax / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t w = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float v = bf16_bits_to_float(i < 2 ? raw[j].x : raw[j].y, i & 1);
            w |= (uint32_t)e4m3t_encode(v / scale) << (8 * i);
        }
        xw[j] = w;
    }
    return scale;
}

// QX = 0: x is e4m3 [M][n_groups 128] with scales xs[group * ld_s + row] (quantized by an earlier kernel);
// QX = 1: x is bf16 [M][K] (ld_s = K), quantized per (row, 128-group) in the prologue (quantize_group_b), which
// saves the quantizer's launch and its round trip through memory on a decode step's critical path.
template <int NT, int KS, int QX>
static __global__ __launch_bounds__(WARPS * 32, 2) void w4a8_gemv_kernel(const uint8_t *codes, const __nv_bfloat16 *wscales,
                                                                       int64_t N, int64_t rows_pad, int64_t n_groups,
                                                                       const void *x, const float *xs, int64_t ld_s,
                                                                       int64_t M, __nv_bfloat16 *y) {
    __shared__ float red[WARPS][NT][4][32];
    pdl_launch_dependents();
    const int     U = W4A8_U / NT;
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t blk = (int64_t)blockIdx.x * (WARPS / KS) + warp / KS, r0 = blk * 16;
    const bool    live = r0 < rows_pad; // a block past the bank: no loads, zero partials (it still meets the others)
    const int64_t ldx = n_groups * 128;
    const uint8_t *wq = codes + blk * n_groups * FM_TC_CHUNK + 16 * lane;
    const uint32_t      *xr[NT];
    const __nv_bfloat16 *xb[NT];
    bool                 ok_x[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        ok_x[nt] = nt * 8 + g < M;
        xr[nt]   = (const uint32_t *)((const uint8_t *)x + (nt * 8 + g) * ldx) + t;
        xb[nt]   = (const __nv_bfloat16 *)x + (nt * 8 + g) * ld_s;
    }

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    bool        waited = false;
    for (int64_t g0 = ks; live && g0 < n_groups; g0 += (int64_t)KS * U) {
        uint4 v0[U], v1[U];
        float wsa[U], wsb[U];
#pragma unroll
        for (int u = 0; u < U; u++) { /* codes and weight scales: before the wait */
            const int64_t grp = g0 + (int64_t)u * KS;
            const bool    in = grp < n_groups;
            v0[u]  = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK)) : zero;
            v1[u]  = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK + 512)) : zero;
            wsa[u] = in ? __bfloat162float(wscales[grp * rows_pad + r0 + g]) * 512.0f : 0.0f;
            wsb[u] = in ? __bfloat162float(wscales[grp * rows_pad + r0 + g + 8]) * 512.0f : 0.0f;
        }
        if (!waited) pdl_wait(), waited = true;
        /* step s of a group: words 2s and 2s + 1 hold k = 32 s + 4 t + 0..3 and 32 s + 16 + 4 t + 0..3
           (w4a8_layout.cuh); b0 and b1 are the same bytes of activation row g: 4-byte words 8 s (+ 4) past the
           lane's t. All of them, and the activation scales, are loaded before the first mma. */
        uint32_t xw[U][NT][8];
        float    xsc[U][NT][2];
        if (QX) {
            uint2 raw[U][NT][8];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    load_group_bf16(xb[nt], ld_s, g0 + (int64_t)u * KS, g0 + (int64_t)u * KS < n_groups && ok_x[nt],
                                    raw[u][nt]);
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const float sc = quantize_group_b(raw[u][nt], xw[u][nt]); /* the scale of row 8 nt + g */
                    xsc[u][nt][0] = __shfl_sync(0xffffffffu, sc, 8 * t);     /* rows 8 nt + 2t, + 1: lanes 4 (2t) */
                    xsc[u][nt][1] = __shfl_sync(0xffffffffu, sc, 8 * t + 4);
                }
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t grp = g0 + (int64_t)u * KS;
                const bool    in = grp < n_groups;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int64_t m = nt * 8 + 2 * t;
#pragma unroll
                    for (int j = 0; j < 8; j++) xw[u][nt][j] = in && ok_x[nt] ? __ldcg(xr[nt] + 32 * grp + 4 * j) : 0u;
                    xsc[u][nt][0] = in && m < M ? __ldcg(xs + grp * ld_s + m) : 0.0f;
                    xsc[u][nt][1] = in && m + 1 < M ? __ldcg(xs + grp * ld_s + m + 1) : 0.0f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t w[8] = {v0[u].x, v0[u].y, v0[u].z, v0[u].w, v1[u].x, v1[u].y, v1[u].z, v1[u].w};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const uint32_t a[4] = {codes_top(w[2 * s]), codes_bottom(w[2 * s]), codes_top(w[2 * s + 1]),
                                           codes_bottom(w[2 * s + 1])};
                    mma_e4m3(part, a, xw[u][nt][2 * s], xw[u][nt][2 * s + 1]);
                }
                acc[nt][0] = fmaf(part[0], wsa[u] * xsc[u][nt][0], acc[nt][0]);
                acc[nt][1] = fmaf(part[1], wsa[u] * xsc[u][nt][1], acc[nt][1]);
                acc[nt][2] = fmaf(part[2], wsb[u] * xsc[u][nt][0], acc[nt][2]);
                acc[nt][3] = fmaf(part[3], wsb[u] * xsc[u][nt][1], acc[nt][3]);
            }
        }
    }
    if (!waited) pdl_wait(); /* before the stores (an earlier kernel may still read y) */
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

template <int NT, int KS, int QX>
static void launch_w8a8(const uint8_t *W, int64_t N, int64_t ld, const float *ws, const void *x, int64_t M, int64_t K,
                        const float *xsc, __nv_bfloat16 *y, cudaStream_t s) {
    const int64_t blocks = fm_ceil_div(fm_ceil_div(N, 16), WARPS / KS);
    void *args[] = {(void *)&W, (void *)&N, (void *)&ld, (void *)&ws, (void *)&x, (void *)&M, (void *)&K, (void *)&xsc,
                    (void *)&y};
    fm_cuda_launch_pdl((const void *)w8a8_gemv_kernel<NT, KS, QX>, dim3((unsigned)blocks), dim3(WARPS * 32), 0, s, args);
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
    if (M < 1 || M > FM_GEMV_FP8_MAX_M || ld % 16 || fm_ceil_div(N, 16) > 2147483647LL) {
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
    void   *args[] = {(void *)&codes, (void *)&sc,   (void *)&rows, (void *)&rows_pad, (void *)&n_groups,
                      (void *)&x,     (void *)&xs,   (void *)&ld_s, (void *)&M,        (void *)&y};
    fm_cuda_launch_pdl((const void *)w4a8_gemv_kernel<NT, KS, QX>, dim3((unsigned)blocks), dim3(WARPS * 32), 0, s, args);
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
    if (w->fmt != FM_W_INT4_G128_TC || w->interleaved || M < 1 || M > FM_GEMV_FP8_MAX_M || idx < 0 || idx >= w->n) {
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
