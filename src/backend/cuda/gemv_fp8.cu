// Decode-size FP8 projections (gemv_fp8.cuh): the weights stream through once, the few activation rows ride along.
//
// Swap-AB on mma.sync.m16n8k32 e4m3 (mma_e4m3.cuh): a 16-row block of weights is the A operand, read
// global -> registers with 16-byte loads (each weight byte read once, not staged), and the activation rows, already
// quantized by the op's quantizer kernel, are the B operand, n = 8 per tile (NT = 1 tile for M <= 8, 2 for
// M <= 16). A CTA is 8 warps = RB row blocks x KS slices of K (RB KS = 8); a warp walks every KS-th 64-byte chunk
// (W8A8) or 128-group (W4A8) of its rows, U of them in flight, and the KS partial sums of a row block meet in
// shared memory in a fixed order (deterministic, no atomics).
//
// Order of a CTA, for programmatic dependent launch (pdl.cuh): issue the first round of weight loads (no earlier
// kernel writes the weights), wait for the previous kernel, then read x: W8A8 one 16-byte piece per lane straight
// from L2, W4A8 staged once per CTA in shared memory (padded rows, conflict-free 4-byte fragment reads). x is read
// through L2 only (ld.cg): L1 is not coherent, and a co-resident CTA of the previous kernel may have cached the
// same address. (Quantizing x inside the GEMV instead of a quantizer launch was built and measured slower at every
// M: each CTA redoes it. bench/NOTES.md 2026-11-30 "decode-size FP8 GEMVs".)
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
// ramp, the wait, the last wave) are of the same order: bench/NOTES.md 2026-11-30 "decode-size FP8 GEMVs" has the
// measured figures.
#include <string.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_combine_row.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_tail.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define WARPS 8
static_assert(WARPS * 32 == NORM_THREADS, "the add + RMSNorm tail (row_tail.cuh) runs in a CTA of the norm's block");
// Loads in flight per warp, for one activation tile (NT = 1; halved for NT = 2 to stay within 128 registers, so
// that two CTAs fit on an SM: the running kernel's and the next one's under PDL)
#define W8A8_U 8 // 64-byte chunks (a Qwen3 projection at M <= 8: all of a warp's chunks in one round)
#define W4A8_U 4 // 128-groups (likewise)

template <int NT> static __device__ __forceinline__ void zero_acc(float acc[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
}

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

#define W4A8_PAD 16                // likewise for the 4-byte reads of the W4A8 fragments
static const int STAGE_UNROLL = 8; // loads in flight per thread while staging (a constant: #pragma unroll takes it)

// e4m3 rows x [M][ld_src] -> sm [R][ldsm] (rows past M, and bytes past ld_src, zero). Warp w copies rows w, w + the
// block's warps, ..., its lanes a row's 16-byte units: no division. The first form walked one flat index over R x
// ldsm / 16 units and divided it by the padded row's units (not a power of two) for every unit: a 32-bit division's
// ~20 dependent instructions each, four or five a thread, on the critical path after griddepcontrol.wait (ncu at B = 1:
// ~960 instructions a warp for 4 K groups of the QKV GEMV, bench/NOTES.md, twenty-ninth session).
static __device__ void stage_copy(const uint8_t *x, int64_t M, int64_t ld_src, int R, int64_t ldsm, uint8_t *sm) {
    const int64_t per_row = ldsm / 16;
    const int warps = (int)(blockDim.x >> 5), lane = (int)(threadIdx.x & 31);
    for (int r = (int)(threadIdx.x >> 5); r < R; r += warps) {
        const uint8_t *src = x + r * ld_src;
        uint8_t *dst = sm + r * ldsm;
        const bool live = r < M;
#pragma unroll STAGE_UNROLL
        for (int64_t u = lane; u < per_row; u += 32) {
            const int64_t c = u * 16;
            *(uint4 *)(dst + c) = live && c < ld_src ? __ldcg((const uint4 *)(src + c)) : make_uint4(0, 0, 0, 0);
        }
    }
}

// W4A8 from e4m3 x [M][G 128] with scales xs[grp * ld_s + row] (and, for int4-zp banks, the group sums xsum laid
// out alike, staged after the scales) into ssc [R][G] (sums at ssc + R G): row r to warps r, r + the block's warps,
// ..., group g to lanes, as stage_copy does the rows (no division)
static __device__ void stage_w4a8_e4m3(const uint8_t *x, const float *xs, const float *xsum, int64_t ld_s, int64_t M,
                                       int64_t G, int R, int64_t ldsm, uint8_t *sm, float *ssc) {
    /* each thread's first scale (and sum), row `warp` and group `lane`, is loaded before the rows, so that the two
       round trips to L2 overlap */
    const int warps = (int)(blockDim.x >> 5), warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const bool first = warp < R && lane < G && warp < M;
    const float sc0 = first ? __ldcg(xs + lane * ld_s + warp) : 0.0f,
                sum0 = first && xsum ? __ldcg(xsum + lane * ld_s + warp) : 0.0f;
    stage_copy(x, M, G * 128, R, ldsm, sm);
    for (int r = warp; r < R; r += warps)
        for (int64_t g = lane; g < G; g += 32) {
            const bool live = r < M, mine = r == warp && g == lane;
            ssc[r * G + g] = mine ? sc0 : live ? __ldcg(xs + g * ld_s + r) : 0.0f;
            if (xsum) ssc[R * G + r * G + g] = mine ? sum0 : live ? __ldcg(xsum + g * ld_s + r) : 0.0f;
        }
    __syncthreads();
}

// W4A8 from bf16 rows h [M][K] instead (the down GEMV of a decode step's experts quantizing the gate|up GEMV's SwiGLU
// output itself, route moe.down_quant=fused): a warp per (row, 128-group), QB of them loaded before the first is
// quantized (M G <= 8 QB tasks, e.g. every tile of up to 5 rows of Qwen3's I = 768 at QB = 4, is one round trip to
// L2; QB = 2 with the group sums of int4-zp banks: at 4 the kernel spilled 120 bytes under its 128 registers, the
// first round of weights being in flight meanwhile), each quantized by quantize_group (moe_dispatch_device.cuh), the
// arithmetic of quantize_rows_kernel, so sm and ssc hold the bytes stage_w4a8_e4m3 would have copied from that kernel's
// output: the same codes, scales and (SUMS, int4-zp banks) group sums. Rows past M are zeros, as stage_copy leaves
// them. h is read through L2 (ld.cg): the previous kernel wrote it.

template <bool SUMS>
static __device__ void stage_w4a8_quantize(const __nv_bfloat16 *h, int64_t K, int64_t M, int64_t G, int R, int64_t ldsm,
                                           uint8_t *sm, float *ssc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    constexpr int QB = SUMS ? 2 : 4;
    const int64_t tasks = M * G;
    for (int64_t i0 = warp; i0 < tasks; i0 += (int64_t)warps * QB) {
        float v[QB][4];
#pragma unroll
        for (int q = 0; q < QB; q++) {
            const int64_t i = i0 + (int64_t)q * warps;
            if (i < tasks) load_group_cg(h + (i / G) * K, K, i % G, v[q]);
        }
#pragma unroll
        for (int q = 0; q < QB; q++) {
            const int64_t i = i0 + (int64_t)q * warps; /* the same for the whole warp */
            if (i >= tasks) break;
            const int64_t r = i / G, grp = i % G;
            float scale, sum;
            const uint32_t word = quantize_group<SUMS>(v[q], K, grp, &scale, &sum);
            *(uint32_t *)(sm + r * ldsm + grp * 128 + lane * 4) = word;
            if (lane == 0) {
                ssc[i] = scale; /* i = r G + grp: stage_w4a8_e4m3's place of (row r, group grp) */
                if (SUMS) ssc[R * G + i] = sum;
            }
        }
    }
    const int64_t per_row = ldsm / 16;
    for (int64_t i = M * per_row + threadIdx.x; i < R * per_row; i += blockDim.x)
        *(uint4 *)(sm + (i / per_row) * ldsm + (i % per_row) * 16) = make_uint4(0, 0, 0, 0);
    for (int64_t i = M * G + threadIdx.x; i < R * G; i += blockDim.x) {
        ssc[i] = 0.0f;
        if (SUMS) ssc[R * G + i] = 0.0f;
    }
    __syncthreads();
}

// ---- the kernels ----

// x is e4m3 [M][ld] with its scale at *x_scale (quantized by an earlier kernel). Each lane's B piece is one 16-byte
// load through L2 (the same 16 bytes of x serve every CTA: they stay in L2). tail.counter: the last CTA adds y into
// the residual and normalises it (row_tail.cuh; the o projection of a decode step, route decode.fused).
template <int NT, int KS>
static __global__ __launch_bounds__(WARPS * 32, 2) void w8a8_gemv_kernel(const uint8_t *W, int64_t N, int64_t ld,
                                                                         const float *w_scale, const uint8_t *x,
                                                                         int64_t M, const float *x_scale,
                                                                         __nv_bfloat16 *y, const fm_row_tail tail) {
    __shared__ float red[WARPS][NT][4][32];
    const int U = W8A8_U / NT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t r0 = ((int64_t)blockIdx.x * (WARPS / KS) + warp / KS) * 16;
    const int64_t pieces = ld / 16, chunks = (pieces + 3) / 4; // 16-byte pieces of a row; 4 pieces per chunk
    const bool ok_a = r0 + g < N, ok_b = r0 + g + 8 < N;
    const uint4 *wa = (const uint4 *)(W + (r0 + g) * ld), *wb = (const uint4 *)(W + (r0 + g + 8) * ld);
    const uint4 *xr[NT];
    bool ok_x[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) ok_x[nt] = nt * 8 + g < M, xr[nt] = (const uint4 *)(x + (nt * 8 + g) * ld);

    float acc[NT][4];
    zero_acc<NT>(acc);

    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 va[U], vb[U];
#pragma unroll
    for (int u = 0; u < U; u++) { /* the first round of weights, before the wait */
        const int64_t p = 4 * (ks + (int64_t)u * KS) + t;
        va[u] = p < pieces && ok_a ? __ldcs(wa + p) : zero; // read once: streaming
        vb[u] = p < pieces && ok_b ? __ldcs(wb + p) : zero;
    }
    pdl_wait(); /* from here on x may be read and y written */
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
            for (int nt = 0; nt < NT; nt++) vx[u][nt] = p < pieces && ok_x[nt] ? __ldcg(xr[nt] + p) : zero;
        }
        /* p differs between the lanes of a quad: a piece past the row is zeros, never a skipped mma */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t a0[4] = {va[u].x, vb[u].x, va[u].y, vb[u].y},
                               a1[4] = {va[u].z, vb[u].z, va[u].w, vb[u].w};
                mma_e4m3(acc[nt], a0, vx[u][nt].x, vx[u][nt].y);
                mma_e4m3(acc[nt], a1, vx[u][nt].z, vx[u][nt].w);
            }
    }
    reduce_slices<NT, KS>(acc, red);
    if (!ks) store_rows<NT>(acc, r0, N, M, *w_scale * __ldcg(x_scale), y);
    if (tail.counter) tail_last_cta(tail, y, N, M); /* every thread: the tail is the whole CTA's */
}

// x is e4m3 [M][n_groups 128] with scales xs[group * ld_s + row] (quantized by an earlier kernel), staged in
// dynamic shared memory: NT 8 rows of n_groups 128 + W4A8_PAD bytes, then their scales [NT 8][n_groups] fp32
// (each lane's B fragment is 8 separate 4-byte words, which through L2 alone cost 2x: bench/NOTES.md 2026-11-30
// "decode-size FP8 GEMVs"), then for int4-zp-tc banks their group sums. WK (w4a8_layout.cuh): the bank's kind; int4-zp
// adds -(zero x scale) x sum per group, as the grouped kernel does.
typedef struct gemv_w4a8_weights {
    const uint8_t *codes;
    const __nv_bfloat16 *ws; // int4-tc: bf16 scales [group][rows_pad]
    const float *wsf;        // int4-zp-tc (x 512) and e4m3-block: fp32 scales, same layout
    const float *wzs;        // int4-zp-tc: zero x scale
} gemv_w4a8_weights;

// Grouped use (the experts of a decode step, moe_w4a8.cu): blockIdx.y is a tile of the dispatch (expert, first
// slot, rows <= NT * 8); the CTA multiplies those activation rows by that expert's matrix. OUT_BF16 writes y rows
// through row_map (the down projection: slot -> routed pair); OUT_SWIGLU takes an interleaved gate|up bank, whose
// 16-row block b holds gate and up of channels 8b..8b+7 in one thread's accumulators, and writes
// h = bf16(silu(bf16 gate) * bf16 up) as bf16 [slot][I] (the grouped GEMM's epilogue arithmetic); the 128-group
// quantization of h for the down GEMV is either the activation quantizer's (one more launch: a group's amax spans 16
// CTAs of the gate|up GEMV) or the down GEMV's own (xh: each CTA quantizes its tile's rows while staging them,
// stage_w4a8_quantize; the CTAs of a tile repeat that work, 1.5 KB a row from L2, to save the launch).
// GV_DENSE only: tail.counter, the o projection's residual add + RMSNorm in the last CTA (row_tail.cuh).
// GV_GROUPED_FUSED is GV_GROUPED with the down GEMV's fused forms (xh, tt: routes moe.down_quant and moe.combine) in
// its code; GV_GROUPED, the default routes' form, carries none of it (with it compiled in, the down GEMV took 123
// registers against 98 and 8.59 us a launch against 7.83 under ncu: H100, 2026-12-05, bench/NOTES.md).
// GV_DENSE_BF16 is GV_DENSE from bf16 rows (gr.xh [M][gr.kh]) the CTAs quantize as they stage them (dense.quant).
enum { GV_DENSE, GV_GROUPED, GV_GROUPED_SWIGLU, GV_GROUPED_FUSED, GV_DENSE_BF16 };
typedef struct gemv_groups {
    const fm_w4a8_tile *tiles;
    const int32_t *n_tiles;
    int64_t codes_stride, scales_stride; // per matrix: bytes of codes, elements of scales
    const int32_t *row_map;              // GV_GROUPED(_FUSED): output row of each slot (NULL: the slot)
    int64_t ldy;                         // y's row stride
    const __nv_bfloat16 *xh; // GV_GROUPED_FUSED: NULL, or bf16 rows [slot][kh] quantized here (x, xs unused);
                             // GV_DENSE_BF16: the bf16 rows [M][kh]
    int64_t kh;
    fm_moe_gemv_tail tt; // GV_GROUPED_FUSED: tt.counters NULL, or each token's end in its last CTA
} gemv_groups;

static __device__ __forceinline__ float gv_round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// the grouped epilogues (see above): rows r0 + g (+ 8) of the tile's M activation rows, from slot slot0
template <int NT, bool SWIGLU>
static __device__ __forceinline__ void store_grouped(const float acc[NT][4], int64_t r0, int64_t blk, int64_t N,
                                                     int64_t M, int64_t slot0, const gemv_groups &gr,
                                                     __nv_bfloat16 *y) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int64_t m = nt * 8 + 2 * t + c;
            if (m >= M) continue;
            if (SWIGLU) { /* rows r0 + g and r0 + g + 8: gate and up of channel 8 blk + g */
                const int64_t ch = blk * 8 + g;
                const float gate = gv_round_bf16(acc[nt][c]), up = gv_round_bf16(acc[nt][2 + c]);
                if (ch < N / 2)
                    y[(slot0 + m) * gr.ldy + ch] = __float2bfloat16_rn(__fdividef(gate, 1.0f + __expf(-gate)) * up);
            } else {
                const int64_t out = gr.row_map ? gr.row_map[slot0 + m] : slot0 + m;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int64_t row = r0 + g + 8 * i;
                    if (row < N) y[out * gr.ldy + row] = __float2bfloat16_rn(acc[nt][2 * i + c]);
                }
            }
        }
}

// The down GEMV's tokens ended in its CTAs (route moe.combine=fused): every CTA of the grid writes a slice of the
// columns of each of its tile's rows (pairs), so a token's row is whole once k x gridDim.x CTAs (its k pairs, each in
// one tile: a token's experts are distinct) have counted themselves out on the token's counter (after a fence); the
// last one combines its k rows, adds the residual and normalises it (moe_combine_row.cuh, the moe_add_rmsnorm kernel's
// arithmetic) and zeroes the counter for the next launch (a captured graph replays it). A CTA can be the last of
// several of its tile's tokens: it ends them one after another. Out of line, as the dense tail, to stay clear of the
// GEMV's registers. Every thread of every CTA that holds a tile calls it.
static __device__ __noinline__ void token_tails(const fm_moe_gemv_tail tt, const int32_t *row_map, int64_t slot0,
                                                int64_t M, const __nv_bfloat16 *y, int64_t H) {
    __shared__ int32_t last[FM_GEMV_FP8_MAX_M];
    __shared__ int n_last;
    __threadfence();
    if (threadIdx.x == 0) n_last = 0;
    __syncthreads();
    if (threadIdx.x < M) {
        const int32_t t = row_map[slot0 + threadIdx.x] / tt.k;
        if (atomicAdd(tt.counters + t, 1u) == (unsigned)tt.k * gridDim.x - 1u) last[atomicAdd(&n_last, 1)] = t;
    }
    __syncthreads();
    const int n = n_last;
    if (n == 0) return;
    __threadfence();
    float wv[NORM_CHUNKS][8];
    combine_row_norm_weights(tt.norm, H, wv);
    for (int i = 0; i < n; i++) {
        if (i) __syncthreads(); /* block_sum's shared words are read by every thread before the next token's */
        combine_add_rmsnorm_row(y, NULL, tt.weights, tt.k, H, last[i], tt.acc, tt.eps, wv, tt.out, NULL, NULL, 0);
        if (threadIdx.x == 0) tt.counters[last[i]] = 0u;
    }
}

template <int NT, int KS, int WK, int MODE>
static __global__ __launch_bounds__(WARPS * 32, 2) void w4a8_gemv_kernel(
    gemv_w4a8_weights wt, int64_t N, int64_t rows_pad, int64_t n_groups, const uint8_t *x, const float *xs,
    const float *xsum, int64_t ld_s, int64_t M, __nv_bfloat16 *y, const gemv_groups gr, const fm_row_tail tail) {
    extern __shared__ __align__(16) uint8_t xsm[];
    __shared__ float red[WARPS][NT][4][32];
    constexpr int NP = wk_shape<WK>::parts, CH = wk_shape<WK>::chunk;
    const int U = W4A8_U * 2 / (NT * NP); /* the same bytes in flight whatever the code width */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ks = warp % KS;
    const int64_t blk = (int64_t)blockIdx.x * (WARPS / KS) + warp / KS, r0 = blk * 16;
    const bool live = r0 < rows_pad; // a block past the bank: no loads, zero partials (it still meets the others)
    const int64_t G = n_groups, ldsm = G * 128 + W4A8_PAD;
    float *ssc = (float *)(xsm + NT * 8 * ldsm), *ssum = ssc + NT * 8 * G;
    int64_t slot0 = 0;
    constexpr bool GROUPED = MODE == GV_GROUPED || MODE == GV_GROUPED_SWIGLU || MODE == GV_GROUPED_FUSED;
    constexpr bool BF16_ROWS = MODE == GV_GROUPED_FUSED || MODE == GV_DENSE_BF16; /* may stage bf16 rows */
    /* GV_GROUPED_FUSED with gr.xh: the tile's bf16 rows (set below); GV_DENSE_BF16: the rows */
    const __nv_bfloat16 *xh = MODE == GV_DENSE_BF16 ? gr.xh : NULL;
    if (!GROUPED && gridDim.y > 1) { /* dense rows past NT 8: grid row c takes rows [NT 8 c, NT 8 (c + 1)) */
        const int64_t r = (int64_t)blockIdx.y * (NT * 8);
        M = M - r < NT * 8 ? M - r : NT * 8;
        if (xh) xh += r * gr.kh;
        else x += r * G * 128, xs += r, xsum = xsum ? xsum + r : NULL;
        y += r * N;
    }
    if (GROUPED) { /* the tile list is the dispatch's output: wait before reading it (no weight prefetch) */
        pdl_wait();
        if ((int32_t)blockIdx.y >= __ldcg(gr.n_tiles)) return; /* the whole CTA: before any barrier */
        const fm_w4a8_tile tl = gr.tiles[blockIdx.y];
        slot0 = tl.slot0, M = tl.rows;
        wt.codes += tl.expert * gr.codes_stride;
        const int64_t so = tl.expert * gr.scales_stride;
        if (wt.ws) wt.ws += so;
        if (wt.wsf) wt.wsf += so;
        if (wt.wzs) wt.wzs += so;
        if (MODE == GV_GROUPED_FUSED && gr.xh) {
            xh = gr.xh + slot0 * gr.kh;
        } else {
            x += slot0 * G * 128, xs += slot0;
            if (xsum) xsum += slot0;
        }
    }
    const uint8_t *wq = wt.codes + blk * G * CH + 16 * lane;

    float acc[NT][4];
    zero_acc<NT>(acc);

    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 v[U][NP];
    float wsa[U], wsb[U], wza[U], wzb[U];
    for (int64_t g0 = ks, first = 1; g0 < G || first; g0 += (int64_t)KS * U) {
        const bool any = live && g0 < G;
#pragma unroll
        for (int u = 0; u < U; u++) { /* codes and weight scales; the first round before the wait */
            const int64_t grp = g0 + (int64_t)u * KS, sa = grp * rows_pad + r0 + g;
            const bool in = any && grp < G;
#pragma unroll
            for (int q = 0; q < NP; q++) v[u][q] = in ? __ldcs((const uint4 *)(wq + grp * CH + q * 512)) : zero;
            if (WK == WK_INT4) {
                wsa[u] = in ? __bfloat162float(wt.ws[sa]) * 512.0f : 0.0f;
                wsb[u] = in ? __bfloat162float(wt.ws[sa + 8]) * 512.0f : 0.0f;
            } else {
                wsa[u] = in ? wt.wsf[sa] : 0.0f, wsb[u] = in ? wt.wsf[sa + 8] : 0.0f;
            }
            if (WK == WK_INT4_ZP) wza[u] = in ? wt.wzs[sa] : 0.0f, wzb[u] = in ? wt.wzs[sa + 8] : 0.0f;
        }
        if (first) { /* every warp comes here once, whatever its share of K: the staging needs all of them */
            first = 0;
            pdl_wait();
            if (BF16_ROWS && xh) stage_w4a8_quantize<WK == WK_INT4_ZP>(xh, gr.kh, M, G, NT * 8, ldsm, xsm, ssc);
            else stage_w4a8_e4m3(x, xs, WK == WK_INT4_ZP ? xsum : NULL, ld_s, M, G, NT * 8, ldsm, xsm, ssc);
        }
        if (!any) continue;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            if (grp >= G) break;
            uint32_t w[4 * NP];
#pragma unroll
            for (int q = 0; q < NP; q++)
                w[4 * q] = v[u][q].x, w[4 * q + 1] = v[u][q].y, w[4 * q + 2] = v[u][q].z, w[4 * q + 3] = v[u][q].w;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* step s: words 2s and 2s + 1 hold k = 32 s + 4 t + 0..3 and 32 s + 16 + 4 t + 0..3 of the group
                   (w4a8_layout.cuh); b0 and b1 are the same bytes of activation row 8 nt + g */
                const uint8_t *xb = xsm + (nt * 8 + g) * ldsm + grp * 128 + 4 * t;
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    uint32_t a[4];
                    weight_fragment<WK>(w, s, a);
                    mma_e4m3(part, a, *(const uint32_t *)(xb + 32 * s), *(const uint32_t *)(xb + 32 * s + 16));
                }
                const float x0 = ssc[(nt * 8 + 2 * t) * G + grp], x1 = ssc[(nt * 8 + 2 * t + 1) * G + grp];
                acc[nt][0] = fmaf(part[0], wsa[u] * x0, acc[nt][0]);
                acc[nt][1] = fmaf(part[1], wsa[u] * x1, acc[nt][1]);
                acc[nt][2] = fmaf(part[2], wsb[u] * x0, acc[nt][2]);
                acc[nt][3] = fmaf(part[3], wsb[u] * x1, acc[nt][3]);
                if (WK == WK_INT4_ZP) {
                    const float s0 = ssum[(nt * 8 + 2 * t) * G + grp], s1 = ssum[(nt * 8 + 2 * t + 1) * G + grp];
                    acc[nt][0] = fmaf(-wza[u], s0, acc[nt][0]);
                    acc[nt][1] = fmaf(-wza[u], s1, acc[nt][1]);
                    acc[nt][2] = fmaf(-wzb[u], s0, acc[nt][2]);
                    acc[nt][3] = fmaf(-wzb[u], s1, acc[nt][3]);
                }
            }
        }
    }
    reduce_slices<NT, KS>(acc, red);
    if constexpr (!GROUPED) {
        if (!ks && live) store_rows<NT>(acc, r0, N, M, 1.0f, y); // the scales are in the accumulator
        if (tail.counter) tail_last_cta(tail, y, N, M);          /* every thread: the tail is the whole CTA's */
    } else {
        if (!ks && live) store_grouped<NT, MODE == GV_GROUPED_SWIGLU>(acc, r0, blk, N, M, slot0, gr, y);
        if (MODE == GV_GROUPED_FUSED && gr.tt.counters) token_tails(gr.tt, gr.row_map, slot0, M, y, N);
    }
}

// K slices per row block: about 8 chunks (W8A8) or 4 groups (W4A8) per warp, so a warp's loads are one round of U
// in flight where K allows, and the grid still has ~N / 16 KS / 8 CTAs
static int slices_for(int64_t steps, int64_t per_warp) {
    int ks = 1;
    while (ks < WARPS && steps >= 2 * ks * per_warp) ks *= 2;
    return ks;
}

static_assert(W4A8_PAD == 16, "fm_gemv_fp8_smem (routes.h) counts 16 bytes of padding per staged row");

// K slices of a W4A8 GEMV of n_groups K groups, row_blocks 16-row blocks and `tiles` grid rows (1 dense; the grouped
// GEMVs' max_tiles). groups > 0 (route gemv.groups): about that many groups a warp. 0 (auto): the most slices, up to
// WARPS and at least one group a warp, whose grid stays within one wave of W4A8_GEMV_CTAS_PER_SM CTAs an SM (98-128
// registers a thread at 256 threads: two CTAs in 64K registers). At B = 1 these GEMVs are bound by each warp's chain
// of dependent instructions, so more slices shorten the chain, until a second wave adds a whole chain again
// (bench/NOTES.md, twenty-ninth session: under ncu on an H100 the gate|up GEMV of Qwen3-30B-A3B takes 13.6 us at 4
// slices and 432 CTAs, 11.5 at 2 and 216; QKV 8.7 at 4 and 160, 9.4-10.0 at 8 and 320).
#define W4A8_GEMV_CTAS_PER_SM 2
static int w4a8_slices(int64_t n_groups, int64_t row_blocks, int64_t tiles, int32_t groups) {
    if (groups > 0) return slices_for(n_groups, groups);
    const int64_t wave = (int64_t)W4A8_GEMV_CTAS_PER_SM * fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    int ks = 1;
    while (ks < WARPS && 2 * ks <= n_groups && fm_ceil_div(row_blocks, WARPS / (2 * ks)) * tiles <= wave) ks *= 2;
    return ks;
}

extern "C" int fm_cuda_w4a8_moe_gemv_slices(const fm_bank *w, int64_t max_tiles, int32_t groups) {
    return w4a8_slices(w->n_groups, w->rows_pad / 16, max_tiles, groups);
}

template <int NT, int KS>
static void launch_w8a8(const uint8_t *W, int64_t N, int64_t ld, const float *ws, const uint8_t *x, int64_t M,
                        const float *xsc, __nv_bfloat16 *y, const fm_row_tail &tail, bool pdl, cudaStream_t s) {
    const int64_t blocks = fm_ceil_div(fm_ceil_div(N, 16), WARPS / KS);
    void *args[] = {(void *)&W, (void *)&N,   (void *)&ld, (void *)&ws,  (void *)&x,
                    (void *)&M, (void *)&xsc, (void *)&y,  (void *)&tail};
    fm_cuda_launch_pdl((const void *)w8a8_gemv_kernel<NT, KS>, dim3((unsigned)blocks), dim3(WARPS * 32), 0, s, args,
                       pdl);
}

template <int NT>
static void dispatch_w8a8(int ks, const uint8_t *W, int64_t N, int64_t ld, const float *ws, const uint8_t *x, int64_t M,
                          const float *xsc, __nv_bfloat16 *y, const fm_row_tail &tail, bool pdl, cudaStream_t s) {
    switch (ks) {
    case 1: launch_w8a8<NT, 1>(W, N, ld, ws, x, M, xsc, y, tail, pdl, s); break;
    case 2: launch_w8a8<NT, 2>(W, N, ld, ws, x, M, xsc, y, tail, pdl, s); break;
    case 4: launch_w8a8<NT, 4>(W, N, ld, ws, x, M, xsc, y, tail, pdl, s); break;
    default: launch_w8a8<NT, 8>(W, N, ld, ws, x, M, xsc, y, tail, pdl, s); break;
    }
}

static void w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                      const float *x_scale, __nv_bfloat16 *y, const fm_row_tail &tail, bool pdl, cudaStream_t s) {
    if (M < 1 || M > FM_GEMV_FP8_MAX_M || ld % 16 || fm_ceil_div(N, 16) > 2147483647LL) {
        fprintf(stderr, "fp8moe: w8a8_gemv: unsupported shape (M %lld, N %lld, ld %lld)\n", (long long)M, (long long)N,
                (long long)ld);
        abort();
    }
    const int ks = slices_for(fm_ceil_div(ld, 64), 8);
    if (M <= 8) dispatch_w8a8<1>(ks, W, N, ld, w_scale, x, M, x_scale, y, tail, pdl, s); /* one n8 tile */
    else
        dispatch_w8a8<2>(ks, W, N, ld, w_scale, x, M, x_scale, y, tail, pdl, s); /* two: only where the route
                                                                                     w8a8.gemv_max_m allows it
                                                                                     (cuBLASLt is faster) */
    FM_LAUNCH_CHECK(tail.counter ? "w8a8_gemv + add_rmsnorm" : "w8a8_gemv");
}

void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                       const float *x_scale, __nv_bfloat16 *y, bool pdl, cudaStream_t s) {
    const fm_row_tail none = {NULL, NULL, NULL, 0.0f, NULL};
    w8a8_gemv(W, N, ld, w_scale, x, M, x_scale, y, none, pdl, s);
}

void fm_cuda_w8a8_gemv_add_rmsnorm(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                   int64_t M, const float *x_scale, __nv_bfloat16 *y, const fm_row_tail *tail, bool pdl,
                                   cudaStream_t s) {
    if (!tail->counter || !fm_row_tail_takes(N, y, tail->acc, tail->norm, tail->out)) {
        fprintf(stderr, "fp8moe: w8a8_gemv_add_rmsnorm: rows of %lld or buffers the tail does not take\n",
                (long long)N);
        abort(); /* the caller checks fm_row_tail_takes */
    }
    w8a8_gemv(W, N, ld, w_scale, x, M, x_scale, y, *tail, pdl, s);
}

// The dense W4A8 GEMV's arguments past the bank, passed down the dispatch below as one value
typedef struct dense_args {
    int32_t idx;
    const uint8_t *x;
    const float *xs, *xsum;
    int64_t ld_s, M;
    __nv_bfloat16 *y;
    fm_row_tail tail;        // counter NULL: none
    const __nv_bfloat16 *xh; // NULL, or bf16 rows [M][w->cols] the GEMV quantizes itself (x, xs, xsum unused)
} dense_args;

template <int NT, int KS, int WK, int MODE>
static void launch_w4a8(const fm_bank *w, const dense_args &d, bool pdl, cudaStream_t s) {
    static bool allowed = false; /* dynamic shared memory above 48 KiB must be allowed per kernel, once */
    const int64_t blocks = fm_ceil_div(w->rows_pad / 16, WARPS / KS), sc0 = (int64_t)d.idx * w->n_groups * w->rows_pad;
    gemv_w4a8_weights wt;
    wt.codes = (const uint8_t *)w->w + (int64_t)d.idx * (w->rows_pad / 16) * w->n_groups * wk_shape<WK>::chunk;
    wt.ws = w->scales ? w->scales + sc0 : NULL, wt.wsf = w->fscales ? w->fscales + sc0 : NULL;
    wt.wzs = w->zscales ? w->zscales + sc0 : NULL;
    /* past FM_GEMV_FP8_MAX_M rows, chunks of that many (NT = 2), one a grid row: each CTA stages its chunk */
    const int64_t chunks = fm_ceil_div(d.M, FM_GEMV_FP8_MAX_M);
    const size_t smem = (size_t)fm_gemv_fp8_smem(d.M, w->n_groups * 128);
    if (smem > 48 * 1024 && !allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute((const void *)w4a8_gemv_kernel<NT, KS, WK, MODE>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FM_GEMV_FP8_SMEM_MAX));
        allowed = true;
    }
    int64_t rows = w->rows, rows_pad = w->rows_pad, n_groups = w->n_groups, ld_s = d.ld_s, M = d.M;
    const uint8_t *x = d.x;
    const float *xs = d.xs, *xsum = d.xsum;
    __nv_bfloat16 *y = d.y;
    fm_row_tail tail = d.tail;
    gemv_groups gr;
    memset(&gr, 0, sizeof gr);
    gr.xh = d.xh, gr.kh = w->cols;
    void *args[] = {(void *)&wt,   (void *)&rows, (void *)&rows_pad, (void *)&n_groups, (void *)&x,  (void *)&xs,
                    (void *)&xsum, (void *)&ld_s, (void *)&M,        (void *)&y,        (void *)&gr, (void *)&tail};
    fm_cuda_launch_pdl((const void *)w4a8_gemv_kernel<NT, KS, WK, MODE>, dim3((unsigned)blocks, (unsigned)chunks),
                       dim3(WARPS * 32), smem, s, args, pdl);
}

template <int NT, int WK, int MODE>
static void dispatch_w4a8(int ks, const fm_bank *w, const dense_args &d, bool pdl, cudaStream_t s) {
    switch (ks) {
    case 1: launch_w4a8<NT, 1, WK, MODE>(w, d, pdl, s); break;
    case 2: launch_w4a8<NT, 2, WK, MODE>(w, d, pdl, s); break;
    case 4: launch_w4a8<NT, 4, WK, MODE>(w, d, pdl, s); break;
    default: launch_w4a8<NT, 8, WK, MODE>(w, d, pdl, s); break;
    }
}

template <int WK, int MODE>
static void dispatch_nt(int ks, const fm_bank *w, const dense_args &d, bool pdl, cudaStream_t s) {
    if (d.M <= 8) dispatch_w4a8<1, WK, MODE>(ks, w, d, pdl, s);
    else dispatch_w4a8<2, WK, MODE>(ks, w, d, pdl, s);
}

template <int WK> static void dispatch_rows(int ks, const fm_bank *w, const dense_args &d, bool pdl, cudaStream_t s) {
    if (d.xh) dispatch_nt<WK, GV_DENSE_BF16>(ks, w, d, pdl, s);
    else dispatch_nt<WK, GV_DENSE>(ks, w, d, pdl, s);
}

// groups: K groups a warp aims at (route gemv.groups; 0: w4a8_slices' rule)
static void w4a8_gemv(const fm_bank *w, const dense_args &d, int32_t groups, bool pdl, cudaStream_t s) {
    const bool kind_ok =
        w->fmt == FM_W_INT4_G128_TC || w->fmt == FM_W_E4M3_B128 || (w->fmt == FM_W_INT4_ZP_TC && (d.xsum || d.xh));
    /* past FM_GEMV_FP8_MAX_M rows: chunks of that many, no tail (its counter counts one grid row) */
    if (!kind_ok || w->interleaved || d.idx < 0 || d.idx >= w->n || d.M < 1 || d.M > FM_W4A8_GEMV_DENSE_MAX_M ||
        (d.M > FM_GEMV_FP8_MAX_M && d.tail.counter) ||
        fm_gemv_fp8_smem(d.M, w->n_groups * 128) > FM_GEMV_FP8_SMEM_MAX) {
        fprintf(stderr, "fp8moe: w4a8_gemv: unsupported bank or shape (%s%s, M %lld, K %lld, matrix %d of %d)\n",
                fm_wformat_name(w->fmt), w->interleaved ? ", interleaved" : "", (long long)d.M, (long long)w->cols,
                d.idx, w->n);
        abort();
    }
    const int ks = w4a8_slices(w->n_groups, w->rows_pad / 16, fm_ceil_div(d.M, FM_GEMV_FP8_MAX_M), groups);
    if (w->fmt == FM_W_INT4_G128_TC) dispatch_rows<WK_INT4>(ks, w, d, pdl, s);
    else if (w->fmt == FM_W_INT4_ZP_TC) dispatch_rows<WK_INT4_ZP>(ks, w, d, pdl, s);
    else dispatch_rows<WK_E4M3>(ks, w, d, pdl, s);
    FM_LAUNCH_CHECK(d.tail.counter ? "w4a8_gemv + add_rmsnorm"
                    : d.xh         ? "w4a8_gemv (quantizing its rows)"
                                   : "w4a8_gemv");
}

void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                       int64_t ld_s, int64_t M, __nv_bfloat16 *y, int32_t groups, bool pdl, cudaStream_t s) {
    const dense_args d = {idx, x, xs, xsum, ld_s, M, y, {NULL, NULL, NULL, 0.0f, NULL}, NULL};
    w4a8_gemv(w, d, groups, pdl, s);
}

void fm_cuda_w4a8_gemv_add_rmsnorm(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                                   int64_t ld_s, int64_t M, __nv_bfloat16 *y, const fm_row_tail *tail, int32_t groups,
                                   bool pdl, cudaStream_t s) {
    if (!tail->counter || !fm_row_tail_takes(w->rows, y, tail->acc, tail->norm, tail->out)) {
        fprintf(stderr, "fp8moe: w4a8_gemv_add_rmsnorm: rows of %lld or buffers the tail does not take\n",
                (long long)w->rows);
        abort(); /* the caller checks fm_row_tail_takes */
    }
    const dense_args d = {idx, x, xs, xsum, ld_s, M, y, *tail, NULL};
    w4a8_gemv(w, d, groups, pdl, s);
}

void fm_cuda_w4a8_gemv_bf16(const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M, __nv_bfloat16 *y,
                            const fm_row_tail *tail, int32_t groups, bool pdl, cudaStream_t s) {
    const fm_row_tail none = {NULL, NULL, NULL, 0.0f, NULL};
    if (tail && (!tail->counter || !fm_row_tail_takes(w->rows, y, tail->acc, tail->norm, tail->out))) {
        fprintf(stderr, "fp8moe: w4a8_gemv_bf16: rows of %lld or buffers the tail does not take\n", (long long)w->rows);
        abort(); /* the caller checks fm_row_tail_takes */
    }
    const dense_args d = {idx, NULL, NULL, NULL, 0, M, y, tail ? *tail : none, x};
    w4a8_gemv(w, d, groups, pdl, s);
}

// ---- grouped: the experts of a decode step ----

template <int NT, int KS, int WK, int MODE>
static void launch_moe(const fm_bank *w, const gemv_groups *gr, int64_t max_tiles, const uint8_t *x, const float *xs,
                       const float *xsum, int64_t ld_s, int64_t max_rows, __nv_bfloat16 *y, bool pdl, cudaStream_t s) {
    static bool allowed = false;
    const int64_t blocks = fm_ceil_div(w->rows_pad / 16, WARPS / KS);
    gemv_w4a8_weights wt;
    wt.codes = (const uint8_t *)w->w, wt.ws = w->scales, wt.wsf = w->fscales, wt.wzs = w->zscales;
    const size_t smem = (size_t)fm_gemv_fp8_smem(max_rows, w->n_groups * 128);
    if (smem > 48 * 1024 && !allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute((const void *)w4a8_gemv_kernel<NT, KS, WK, MODE>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FM_GEMV_FP8_SMEM_MAX));
        allowed = true;
    }
    int64_t rows = w->rows, rows_pad = w->rows_pad, n_groups = w->n_groups, M = max_rows;
    fm_row_tail none = {NULL, NULL, NULL, 0.0f, NULL};
    void *args[] = {(void *)&wt,   (void *)&rows, (void *)&rows_pad, (void *)&n_groups, (void *)&x, (void *)&xs,
                    (void *)&xsum, (void *)&ld_s, (void *)&M,        (void *)&y,        (void *)gr, (void *)&none};
    fm_cuda_launch_pdl((const void *)w4a8_gemv_kernel<NT, KS, WK, MODE>, dim3((unsigned)blocks, (unsigned)max_tiles),
                       dim3(WARPS * 32), smem, s, args, pdl);
}

template <int WK, int MODE>
static void moe_ks(int ks, int nt, const fm_bank *w, const gemv_groups *gr, int64_t max_tiles, const uint8_t *x,
                   const float *xs, const float *xsum, int64_t ld_s, int64_t max_rows, __nv_bfloat16 *y, bool pdl,
                   cudaStream_t s) {
#define FM_MOE_GEMV(NT_, KS_) launch_moe<NT_, KS_, WK, MODE>(w, gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s)
    if (nt == 1) {
        switch (ks) {
        case 1: FM_MOE_GEMV(1, 1); break;
        case 2: FM_MOE_GEMV(1, 2); break;
        case 4: FM_MOE_GEMV(1, 4); break;
        default: FM_MOE_GEMV(1, 8); break;
        }
    } else {
        switch (ks) {
        case 1: FM_MOE_GEMV(2, 1); break;
        case 2: FM_MOE_GEMV(2, 2); break;
        case 4: FM_MOE_GEMV(2, 4); break;
        default: FM_MOE_GEMV(2, 8); break;
        }
    }
#undef FM_MOE_GEMV
}

template <int WK>
static void moe_mode(bool swiglu, int ks, int nt, const fm_bank *w, const gemv_groups *gr, int64_t max_tiles,
                     const uint8_t *x, const float *xs, const float *xsum, int64_t ld_s, int64_t max_rows,
                     __nv_bfloat16 *y, bool pdl, cudaStream_t s) {
    if (swiglu) moe_ks<WK, GV_GROUPED_SWIGLU>(ks, nt, w, gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
    else if (gr->xh || gr->tt.counters)
        moe_ks<WK, GV_GROUPED_FUSED>(ks, nt, w, gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
    else moe_ks<WK, GV_GROUPED>(ks, nt, w, gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
}

// xh: NULL, or (the down projection, not swiglu) bf16 rows [slots][w->cols] the GEMV quantizes itself (x, xs and xsum
// then unused)
static void moe_gemv(const fm_bank *w, const fm_w4a8_tile *tiles, const int32_t *n_tiles, int64_t max_tiles,
                     int64_t max_rows, const uint8_t *x, const float *xs, const float *xsum, const __nv_bfloat16 *xh,
                     int64_t ld_s, bool swiglu, const int32_t *row_map, __nv_bfloat16 *y, int64_t ldy,
                     const fm_moe_gemv_tail *tt, int32_t groups, bool pdl, cudaStream_t s) {
    const bool kind_ok =
        w->fmt == FM_W_INT4_G128_TC || w->fmt == FM_W_E4M3_B128 || (w->fmt == FM_W_INT4_ZP_TC && (xsum || xh));
    const bool tail_ok = !tt || (!swiglu && row_map && tt->counters && tt->k >= 1 && ldy == w->rows &&
                                 fm_combine_row_takes(w->rows, y, tt->acc, tt->norm, tt->out));
    if (!kind_ok || !tail_ok || swiglu != w->interleaved || (swiglu && xh) || max_rows < 1 ||
        max_rows > FM_GEMV_FP8_MAX_M || max_tiles < 1 || max_tiles > 65535 ||
        fm_gemv_fp8_smem(max_rows, w->n_groups * 128) > FM_GEMV_FP8_SMEM_MAX) {
        fprintf(stderr, "fp8moe: w4a8_moe_gemv: unsupported bank or shape (%s%s, rows %lld, K %lld, tiles %lld%s)\n",
                fm_wformat_name(w->fmt), w->interleaved ? ", interleaved" : "", (long long)max_rows, (long long)w->cols,
                (long long)max_tiles, xh ? ", bf16 rows" : "");
        abort();
    }
    gemv_groups gr;
    gr.tiles = tiles, gr.n_tiles = n_tiles, gr.row_map = row_map, gr.ldy = ldy;
    gr.scales_stride = w->n_groups * w->rows_pad;
    const int64_t chunk = w->fmt == FM_W_E4M3_B128 ? wk_shape<WK_E4M3>::chunk : wk_shape<WK_INT4>::chunk;
    gr.codes_stride = (w->rows_pad / 16) * w->n_groups * chunk;
    gr.xh = xh, gr.kh = w->cols;
    memset(&gr.tt, 0, sizeof gr.tt);
    if (tt) gr.tt = *tt;
    const int ks = w4a8_slices(w->n_groups, w->rows_pad / 16, max_tiles, groups), nt = max_rows <= 8 ? 1 : 2;
    if (w->fmt == FM_W_INT4_G128_TC)
        moe_mode<WK_INT4>(swiglu, ks, nt, w, &gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
    else if (w->fmt == FM_W_INT4_ZP_TC)
        moe_mode<WK_INT4_ZP>(swiglu, ks, nt, w, &gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
    else moe_mode<WK_E4M3>(swiglu, ks, nt, w, &gr, max_tiles, x, xs, xsum, ld_s, max_rows, y, pdl, s);
    FM_LAUNCH_CHECK(tt   ? "w4a8_moe_gemv + combine_add_rmsnorm"
                    : xh ? "w4a8_moe_gemv (quantizing its rows)"
                         : "w4a8_moe_gemv");
}

void fm_cuda_w4a8_moe_gemv(const fm_bank *w, const fm_w4a8_tile *tiles, const int32_t *n_tiles, int64_t max_tiles,
                           int64_t max_rows, const uint8_t *x, const float *xs, const float *xsum, int64_t ld_s,
                           bool swiglu, const int32_t *row_map, __nv_bfloat16 *y, int64_t ldy,
                           const fm_moe_gemv_tail *tail, int32_t groups, bool pdl, cudaStream_t s) {
    moe_gemv(w, tiles, n_tiles, max_tiles, max_rows, x, xs, xsum, NULL, ld_s, swiglu, row_map, y, ldy, tail, groups,
             pdl, s);
}

void fm_cuda_w4a8_moe_gemv_bf16(const fm_bank *w, const fm_w4a8_tile *tiles, const int32_t *n_tiles, int64_t max_tiles,
                                int64_t max_rows, const __nv_bfloat16 *h, const int32_t *row_map, __nv_bfloat16 *y,
                                int64_t ldy, const fm_moe_gemv_tail *tail, int32_t groups, bool pdl, cudaStream_t s) {
    moe_gemv(w, tiles, n_tiles, max_tiles, max_rows, NULL, NULL, NULL, h, 0, false, row_map, y, ldy, tail, groups, pdl,
             s);
}
