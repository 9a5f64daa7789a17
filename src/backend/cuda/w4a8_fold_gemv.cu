// The grouped W4A8 GEMV on fold banks (w4a8_fold_gemv.h): under route w4a8.kernel=fold the experts of a decode step
// (P <= moe.gemv's pairs) stream their weights once through mma.sync, as the int4-tc GEMV (gemv_fp8.cu) does for
// today's banks, instead of the fold GEMM's 256 x 64 tiles (one token in a 64-row tile, most SMs idle).
//
// Swap-AB on mma.sync.m16n8k32 e4m3 (mma_e4m3.cuh): a 16-row block of weights is A, the tile's activation rows are
// B (NT n8 tiles: 1 for <= 8 rows, 2 for <= 16). A CTA is 8 warps = RB row blocks x KS slices of K (RB KS = 8);
// a warp walks every KS-th 128-group of its rows, U groups in flight, and the slices meet in shared memory in a
// fixed order (deterministic). x is staged once per CTA in shared memory (rows of G 128 + 16 bytes: the 16-byte
// B reads below are conflict-free), with its scales.
//
// The A fragment from the fold layout (backend/w4a8_fold.h: [group][segment s][row][16 bytes], word i of a segment
// holds k = 32 s + 8 i .. + 7): lane (g, t) loads segment t of rows g and g + 8 (two 16-byte loads per group,
// each 128 contiguous bytes per 8 lanes) and converts each word into two e4m3 words through the row's 8-entry table
// of exponent j = k + 6 (7 instructions per 8 codes, the fold GEMM's conversion). For mma step m it passes word m:
// a0 / a2 = its low / high half of row g, a1 / a3 of row g + 8, so the mma's k index 4t + b stands for k = 32 t +
// 8 m + b and 16 + 4t + b for 32 t + 8 m + 4 + b, for every row; B follows: b0, b1 = the 8 bytes of x at 32 t + 8 m.
// The mma never sees a scale: the operand carries the group's power of two exactly.
//
// Arithmetic (within the bound the fold GEMM's tests hold it to against fm_w4a8_fold_ref): each group's sum is
// taken in the mma's accumulator from zero and added into fp32 (promotion every group, where the GEMM promotes
// every FM_FOLD_PROMOTE groups: a finer partition of the same sum, so the accumulator's truncation is smaller, and
// the fp32 sums of the K slices add in another order than the emulation's: both far inside the bound, 2^-11 of
// the sum of |products|). Per token (the gate|up input): acc += part, y = acc x fp32(rs 2^-6 x s_token); per group
// (h, the down input): acc = fma(part, s_group, acc), y = acc x rs 2^-6; rs = the row's largest group scale (each
// lane scans a quarter of its two rows' groups before the first conversion, two shuffles give the row's).
// Epilogues as the int4-tc GEMV's: SwiGLU of an interleaved gate|up bank into bf16 h [slot][ch] (16-row block b:
// gate and up of channels 8b..8b+7), or bf16 rows through the row map (down: slot -> routed pair).
//
// Floor: the touched experts' bytes once (Qwen3-30B-A3B, one expert: 1.57 MB gate|up + 0.79 MB down codes and
// scales), as the int4-tc GEMV; the conversion adds ~60 instructions per lane and group to its ~30, which the
// memory time still hides at these widths (a prediction: bench/NOTES.md 2026-12-05, twenty-fourth session).
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/w4a8_fold_gemv.h"
extern "C" {
#include "backend/w4a8_fold.h"
}

#define FG_WARPS 8
#define FG_U 4    // groups in flight per warp at NT = 1 (halved at NT = 2: 128 registers, two CTAs per SM)
#define FG_PAD 16 // bytes after each staged x row: row strides of 4 words mod 32 banks

typedef struct fold_gemv_params {
    const uint8_t *codes;
    const uint16_t *scales;
    int64_t rows, rows_pad, n_groups;
    const uint8_t *x;
    int64_t ldx;
    const float *xs;
    int64_t lds;
    const fm_fold_tile *tiles;
    const int32_t *n_tiles;
    __nv_bfloat16 *y;
    int64_t ldy;
    const int32_t *row_map;
    int32_t ks; // K slices per row block
} fold_gemv_params;

// Shared memory of a CTA staging R rows of G groups: the rows, then the scales (per token R, per group R G)
static inline int64_t fold_gemv_smem(int64_t R, int64_t G, bool per_group) {
    return R * (G * 128 + FG_PAD) + (per_group ? R * G : R) * 4;
}

// The tile's rows of x (rows past M zero) and their scales into shared memory; every thread, then a barrier
template <int AS>
static __device__ void fold_stage_x(const fold_gemv_params &p, int64_t slot0, int64_t M, int R, uint8_t *sm,
                                    float *ssc) {
    const int64_t G = p.n_groups, ldsm = G * 128 + FG_PAD, per_row = G * 8, n = R * per_row;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t r = i / per_row, c = (i % per_row) * 16;
        *(uint4 *)(sm + r * ldsm + c) =
            r < M ? __ldcg((const uint4 *)(p.x + (slot0 + r) * p.ldx + c)) : make_uint4(0u, 0u, 0u, 0u);
    }
    if (AS == FM_FOLD_PER_TOKEN) {
        for (int64_t i = threadIdx.x; i < R; i += blockDim.x) ssc[i] = i < M ? __ldcg(p.xs + slot0 + i) : 0.0f;
    } else {
        for (int64_t i = threadIdx.x; i < R * G; i += blockDim.x) {
            const int64_t r = i / G, grp = i % G;
            ssc[i] = r < M ? __ldcg(p.xs + grp * p.lds + slot0 + r) : 0.0f;
        }
    }
    __syncthreads();
}

// The row scale of rows g and g + 8 of the block (wsc points at row g's scale of group 0): the largest bf16 scale
// (positive bf16 values order as their bits), its exponent field er and rs x 2^-6 (exact)
static __device__ __forceinline__ void fold_row_scales(const uint16_t *wsc, int64_t rows_pad, int64_t G, int t,
                                                       uint32_t er[2], float rs[2]) {
    uint32_t m[2] = {0u, 0u};
    for (int64_t grp = t; grp < G; grp += 4)
#pragma unroll
        for (int h = 0; h < 2; h++)
            m[h] = max(m[h], (uint32_t)__ldg((const unsigned short *)wsc + grp * rows_pad + 8 * h));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
        m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
        er[h] = (m[h] >> 7) & 0xFFu;
        rs[h] = __uint_as_float(m[h] << 16) * 0.015625f; /* x 2^-FM_FOLD_J_BIAS */
    }
}

// One 16-byte segment's 4 code words into e4m3 words through the table of exponent j (w4a8_fold.h): lo[m] the codes
// k0..k0+3 of word m, hi[m] k0+4..k0+7
static __device__ __forceinline__ void fold_convert_segment(const uint4 v, int32_t j, uint32_t lo[4], uint32_t hi[4]) {
    const uint32_t tlo = FM_FOLD_TLO0 + (uint32_t)j * FM_FOLD_TLO_STEP;
    const uint32_t thi = FM_FOLD_THI0 + (uint32_t)j * FM_FOLD_THI_STEP;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const uint32_t sel = w[m] & 0x77777777u;
        lo[m] = __byte_perm(tlo, thi, sel) | (w[m] & 0x80808080u);
        hi[m] = __byte_perm(tlo, thi, sel >> 16) | ((w[m] << 4) & 0x80808080u);
    }
}

static __device__ __forceinline__ float fg_round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <int NT, int AS, bool SWIGLU>
static __global__ __launch_bounds__(FG_WARPS * 32, 2) void fold_gemv_kernel(const fold_gemv_params p) {
    extern __shared__ __align__(16) uint8_t xsm[];
    __shared__ float red[FG_WARPS][NT][4][32];
    constexpr int U = FG_U / NT, R = NT * 8;
    const int KS = p.ks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t blk = (int64_t)blockIdx.x * (FG_WARPS / KS) + warp / KS, r0 = blk * 16;
    const bool live = r0 < p.rows_pad; // a block past the bank: no loads, zero partials (it still meets the others)
    const int64_t G = p.n_groups, ldsm = G * 128 + FG_PAD, rp = p.rows_pad;
    float *ssc = (float *)(xsm + R * ldsm);
    pdl_wait(); /* the tile list, x and its scales are the dispatch's and the quantizer's */
    if ((int32_t)blockIdx.y >= __ldcg(p.n_tiles)) return; /* the whole CTA: before any barrier */
    const int4 tl = __ldcg((const int4 *)(p.tiles + blockIdx.y));
    const int64_t expert = tl.x, slot0 = tl.y, M = tl.z;
    /* segment t of row r0 + g (row g + 8: 128 bytes on); group grp 64 rows_pad bytes on */
    const uint8_t *wq = p.codes + expert * rp * G * 64 + ((int64_t)t * rp + r0 + g) * 16;
    const uint16_t *wsc = p.scales + expert * G * rp + r0 + g;

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
    uint32_t er[2] = {0u, 0u};
    float rs[2] = {0.0f, 0.0f};

    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 v[U][2];
    uint32_t sb[U][2];
    for (int64_t g0 = ks, first = 1; g0 < G || first; g0 += (int64_t)KS * U) {
        const bool any = live && g0 < G;
#pragma unroll
        for (int u = 0; u < U; u++) { /* codes (read once: streaming) and the groups' scales */
            const int64_t grp = g0 + (int64_t)u * KS;
            const bool in = any && grp < G;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                v[u][h] = in ? __ldcs((const uint4 *)(wq + grp * 64 * rp + 128 * h)) : zero;
                sb[u][h] = in ? (uint32_t)__ldg((const unsigned short *)wsc + grp * rp + 8 * h) : 0u;
            }
        }
        if (first) { /* every warp comes here once: the staging needs all of them */
            first = 0;
            if (live) fold_row_scales(wsc, rp, G, t, er, rs);
            fold_stage_x<AS>(p, slot0, M, R, xsm, ssc);
        }
        if (!any) continue;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            if (grp >= G) break;
            /* j = k + 6 from the exponent fields (a zero scale's codes are zeros: any table gives 0 for them) */
            uint32_t lo[2][4], hi[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
                fold_convert_segment(v[u][h], (int32_t)((sb[u][h] >> 7) & 0xFFu) - (int32_t)er[h] + FM_FOLD_J_BIAS,
                                     lo[h], hi[h]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint8_t *xb = xsm + (nt * 8 + g) * ldsm + grp * 128 + 32 * t;
                const uint4 b01 = *(const uint4 *)xb, b23 = *(const uint4 *)(xb + 16);
                const uint32_t b[8] = {b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w};
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const uint32_t a[4] = {lo[0][m], lo[1][m], hi[0][m], hi[1][m]};
                    mma_e4m3(part, a, b[2 * m], b[2 * m + 1]);
                }
                if (AS == FM_FOLD_PER_TOKEN) {
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[nt][i] += part[i];
                } else {
                    const float x0 = ssc[(nt * 8 + 2 * t) * G + grp], x1 = ssc[(nt * 8 + 2 * t + 1) * G + grp];
                    acc[nt][0] = fmaf(part[0], x0, acc[nt][0]);
                    acc[nt][1] = fmaf(part[1], x1, acc[nt][1]);
                    acc[nt][2] = fmaf(part[2], x0, acc[nt][2]);
                    acc[nt][3] = fmaf(part[3], x1, acc[nt][3]);
                }
            }
        }
    }
    /* the KS partial sums of each row block meet in a fixed order */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][nt][i][lane] = acc[nt][i];
    __syncthreads();
    if (ks || !live) return;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            for (int j = 1; j < KS; j++) acc[nt][i] += red[warp + j][nt][i][lane];

                /* C fragment: acc[nt][c] row g, acc[nt][2 + c] row g + 8, activation row nt 8 + 2t + c */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int64_t m = nt * 8 + 2 * t + c;
            if (m >= M) continue;
            const float sx = AS == FM_FOLD_PER_TOKEN ? ssc[m] : 1.0f;
            const float y0 = acc[nt][c] * (AS == FM_FOLD_PER_TOKEN ? rs[0] * sx : rs[0]);
            const float y1 = acc[nt][2 + c] * (AS == FM_FOLD_PER_TOKEN ? rs[1] * sx : rs[1]);
            if (SWIGLU) { /* rows r0 + g and r0 + g + 8: gate and up of channel 8 blk + g */
                const int64_t ch = blk * 8 + g;
                const float gate = fg_round_bf16(y0), up = fg_round_bf16(y1);
                if (ch < p.rows / 2)
                    p.y[(slot0 + m) * p.ldy + ch] = __float2bfloat16_rn(__fdividef(gate, 1.0f + __expf(-gate)) * up);
            } else {
                const int64_t out = p.row_map ? __ldcg(p.row_map + slot0 + m) : slot0 + m;
                if (r0 + g < p.rows) p.y[out * p.ldy + r0 + g] = __float2bfloat16_rn(y0);
                if (r0 + g + 8 < p.rows) p.y[out * p.ldy + r0 + g + 8] = __float2bfloat16_rn(y1);
            }
        }
}

// K slices per row block: about 4 groups per warp, so a warp's loads are one round of U in flight where K allows
// (the int4-tc GEMV's rule), and the grid still has ~rows / 16 KS / 8 CTAs per tile
static int fold_slices(int64_t G) {
    int ks = 1;
    while (ks < FG_WARPS && G >= 2 * ks * 4) ks *= 2;
    return ks;
}

template <int NT, int AS, bool SWIGLU>
static void fold_gemv_launch(const fold_gemv_params &p, int64_t max_tiles, bool pdl, cudaStream_t s) {
    static bool allowed = false; /* dynamic shared memory above 48 KiB must be allowed per kernel, once */
    const size_t smem = (size_t)fold_gemv_smem(NT * 8, p.n_groups, AS == FM_FOLD_PER_GROUP);
    const void *fn = (const void *)fold_gemv_kernel<NT, AS, SWIGLU>;
    if (smem > 48 * 1024 && !allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FM_GEMV_FP8_SMEM_MAX));
        allowed = true;
    }
    const int64_t blocks = fm_ceil_div(p.rows_pad / 16, FG_WARPS / p.ks);
    fold_gemv_params q = p;
    void *args[] = {(void *)&q};
    fm_cuda_launch_pdl(fn, dim3((unsigned)blocks, (unsigned)max_tiles), dim3(FG_WARPS * 32), smem, s, args, pdl);
}

template <int NT> static void fold_gemv_mode(const fm_fold_gemv_args *a, const fold_gemv_params &p, cudaStream_t s) {
    const bool tok = a->ascale == FM_FOLD_PER_TOKEN;
    if (a->swiglu) {
        if (tok) fold_gemv_launch<NT, FM_FOLD_PER_TOKEN, true>(p, a->max_tiles, a->pdl, s);
        else fold_gemv_launch<NT, FM_FOLD_PER_GROUP, true>(p, a->max_tiles, a->pdl, s);
    } else {
        if (tok) fold_gemv_launch<NT, FM_FOLD_PER_TOKEN, false>(p, a->max_tiles, a->pdl, s);
        else fold_gemv_launch<NT, FM_FOLD_PER_GROUP, false>(p, a->max_tiles, a->pdl, s);
    }
}

extern "C" void fm_cuda_w4a8_fold_gemv(const fm_fold_gemv_args *a, void *stream) {
    const int64_t R = a->max_rows <= 8 ? 8 : 16;
    const char *bad = !a->codes || !a->scales                                                ? "bank"
                      : a->rows_pad % 32 || a->rows > a->rows_pad || a->n_groups <= 0        ? "bank shape"
                      : (uintptr_t)a->codes % 16                                             ? "alignment of the codes"
                      : !a->x || !a->xs || a->ldx < 128 * a->n_groups || a->ldx % 16         ? "activations"
                      : (uintptr_t)a->x % 16                                                 ? "alignment of x"
                      : !a->tiles || !a->n_tiles || a->max_tiles < 1 || a->max_tiles > 65535 ? "tiles"
                      : a->max_rows < 1 || a->max_rows > FM_GEMV_FP8_MAX_M                   ? "rows per tile"
                      : fold_gemv_smem(R, a->n_groups, a->ascale == FM_FOLD_PER_GROUP) > FM_GEMV_FP8_SMEM_MAX
                          ? "K (shared memory)"
                      : !a->y ? "y"
                              : NULL;
    if (bad) {
        fprintf(stderr, "fp8moe: w4a8_fold_gemv: bad arguments: %s\n", bad);
        abort();
    }
    fold_gemv_params p;
    memset(&p, 0, sizeof p);
    p.codes = a->codes, p.scales = a->scales, p.rows = a->rows, p.rows_pad = a->rows_pad, p.n_groups = a->n_groups;
    p.x = a->x, p.ldx = a->ldx, p.xs = a->xs, p.lds = a->lds, p.tiles = a->tiles, p.n_tiles = a->n_tiles;
    p.y = (__nv_bfloat16 *)a->y, p.ldy = a->ldy, p.row_map = a->row_map, p.ks = fold_slices(a->n_groups);
    cudaStream_t s = (cudaStream_t)stream;
    if (R == 8) fold_gemv_mode<1>(a, p, s);
    else fold_gemv_mode<2>(a, p, s);
    FM_LAUNCH_CHECK("w4a8 fold GEMV");
}
