// The grouped W4A8 GEMM's device pieces, shared by its three kernels (w4a8_gemm_mma.cu, w4a8_gemm_wgmma.cu,
// w4a8_gemm_fp4.cu; w4a8_gemm.cu says how they work and picks one per call): the parameters, the activation stage
// ring, the FP4 expansion, the warps' weight fragments and scales, the promotion, the epilogues and the wgmma
// instruction; then the kernels' launchers and the list of the instances the launch tree calls. Included by those
// four files only, and by the fold kernel (w4a8_fold_gemm.cu), which runs the same epilogue.
#ifndef FM_CUDA_W4A8_GEMM_DEVICE_CUH
#define FM_CUDA_W4A8_GEMM_DEVICE_CUH

#include <cuda_fp8.h>

#include "backend/cuda/w4a8_gemm.cuh"
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/w4a8_layout.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/w4a8_workspace.h"

#define BM 256
#define BN FM_W4A8_BN /* the widest tile; BNT (a template value) is the tile a kernel runs: 64, 32 or 16 */
#define STAGES 3      /* cp.async ring of activation tiles, one __syncthreads per 128-group */
#define CSTAGES 4     /* the wgmma kernel's ring when the codes travel in it too (route w4a8.codes, CS = 1) */
#define THREADS 256

typedef struct gemm_params {
    const uint8_t *wq;
    const __nv_bfloat16 *ws; // WK_INT4
    const float *wsf;        // WK_INT4_ZP (scale x 512), WK_E4M3
    const float *wzs;        // WK_INT4_ZP (zero x scale)
    int64_t rows, rows_pad, n_groups;
    bool interleaved;
    const uint8_t *x;
    int64_t ldx;
    const float *xs;
    const float *xsum; // WK_INT4_ZP: activation group sums, laid out as xs
    int64_t lds;
    const float *xts; // AF NV: the tensor scale (device)
    const fm_w4a8_tile *tiles;
    const int32_t *n_tiles;
    int64_t m_dense;
    int32_t dense_matrix;
    __nv_bfloat16 *y;
    int64_t ldy;
    const int32_t *row_map;
    uint8_t *h;
    int64_t ldh;
    float *hs;
    float *hsum; // OUT_SWIGLU_E4M3 when the down bank is int4-zp: h's group sums, laid out as hs
    int64_t ldhs;
    bool pdl; // the host's launch with programmatic dependent launch (fm_w4a8_args.pdl); the kernels wait at their top
    bool tiles_early; // fm_w4a8_args.tiles_early: the tile list may be read before the wait (through L2)
    bool early_codes; // fm_w4a8_args.early_codes: the first codes before the wait where the tile is known
} gemm_params;

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_1(void) { asm volatile("cp.async.wait_group 1;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <int BNT> static __device__ __forceinline__ fm_w4a8_tile tile_of(const gemm_params &p, int64_t i) {
    if (p.tiles) return p.tiles[i];
    const int64_t r0 = i * BNT, n = p.m_dense - r0 < BNT ? p.m_dense - r0 : BNT;
    fm_w4a8_tile t = {p.dense_matrix, (int32_t)r0, (int32_t)n, 0};
    return t;
}
// Before the PDL wait (tiles_early): the tile list through L2 (ld.global.cg). Its writer completed before the kernel
// launched just before this one passed its own wait, which is what let this one start (pdl.cuh), so L2 holds it;
// L1 is not coherent and might hold an earlier layer's list.
template <int BNT> static __device__ __forceinline__ fm_w4a8_tile tile_of_early(const gemm_params &p, int64_t i) {
    if (!p.tiles) return tile_of<BNT>(p, i);
    const int4 v = __ldcg((const int4 *)(p.tiles + i));
    fm_w4a8_tile t = {v.x, v.y, v.z, v.w};
    return t;
}

// One thread's share of loading an activation stage (BNT rows x 128 bytes of 128-group grp, the rows' scales and,
// for int4-zp banks, their group sums), fixed once per CTA: a stage is then one or two 16-byte cp.async per thread
// and, for the first BNT threads, one or two 4-byte ones, with no loop (the generic strided loop this replaces
// compiled to ~100 instructions per group, ~15 % of the kernel's samples under ncu). Rows past the tile are
// zero-filled (source size 0, pointed at the tile's first row).
#define STAGE_CHUNKS 2 /* at most, per thread: BN * 128 / 16 / THREADS */
static_assert(BN * 128 / 16 == STAGE_CHUNKS * THREADS && BN <= THREADS, "stage loader: chunks must divide evenly");
template <int BNT> struct stage_shape {
    static constexpr int chunks = BNT * 128 / 16;                       /* 16-byte chunks of a stage's tile */
    static constexpr int per_thread = (chunks + THREADS - 1) / THREADS; /* 2 (BNT 64) or 1 (BNT 16: threads < 128) */
};
static_assert(STAGES == 3, "the group loop rotates three stages");
// The CTA's weight row scales of a 128-group travel in the same stage (bytes per weight row: bf16 for int4-tc,
// fp32 for e4m3-block, an fp32 scale and an fp32 zero x scale for int4-zp-tc, in two arrays of BM): read from shared
// memory at the promotion, their global latency is off the loop's chain (loaded into registers a group ahead, the
// copy into the current group's registers at the loop's end waited for them: ncu long-scoreboard stalls).
template <int WK> struct wk_scales {
    static constexpr int row_bytes = WK == WK_INT4 ? 2 : WK == WK_E4M3 ? 4 : 8;
    static constexpr int chunks = BM * row_bytes / 16; /* 16-byte chunks per stage */
};
typedef struct stage_loader {
    const uint8_t *src[STAGE_CHUNKS]; // 128-group 0 of the chunk's row
    uint32_t dst[STAGE_CHUNKS];       // its offset in a stage's tile (16-byte chunks XOR-swizzled by row)
    int bytes[STAGE_CHUNKS];
    const float *sc; // threads < BNT: row tid's scale (and sum), 128-group 0; else NULL
    const float *sum;
    int sc_bytes;
    const uint8_t *wsrc; // threads < wk_scales<WK>::chunks: a 16-byte chunk of weight scales, group 0
    int wbytes;          // 16, or 0 past the bank's padded rows (zero scales)
    int64_t wstride;     // bytes from one group's scales to the next
} stage_loader;

template <int WK, int BNT, int AF>
static __device__ __forceinline__ stage_loader stage_loader_at(const gemm_params &p, const fm_w4a8_tile &tile) {
    stage_loader l;
    const int tid = (int)threadIdx.x;
    if (AF != FM_W4A8_DISPATCH_E4M3) { /* FP4: BNT rows x 64 bytes of codes, 16-byte chunks in row order */
        const int n = tid >> 2;
        const bool ok = n < tile.rows;
        l.src[0] = p.x + (int64_t)(tile.slot0 + (ok ? n : 0)) * p.ldx + (tid & 3) * 16;
        l.dst[0] = (uint32_t)tid * 16, l.bytes[0] = ok ? 16 : 0;
    }
#pragma unroll
    for (int i = 0; i < (AF == FM_W4A8_DISPATCH_E4M3 ? stage_shape<BNT>::per_thread : 0); i++) {
        const int c = tid + i * THREADS, n = c >> 3, ch = c & 7;
        const bool ok = n < tile.rows; /* c past the tile (BNT 16, threads >= 128): never loaded (load_stage) */
        l.src[i] = p.x + (int64_t)(tile.slot0 + (ok ? n : 0)) * p.ldx + ch * 16;
        l.dst[i] = (uint32_t)(n * 128 + ((ch ^ (n & 7)) << 4));
        l.bytes[i] = ok ? 16 : 0;
    }
    const bool ok = tid < tile.rows;
    l.sc = tid < BNT ? p.xs + tile.slot0 + (ok ? tid : 0) : NULL;
    if (AF == FM_W4A8_DISPATCH_NV && tid < BNT) l.sc = p.xs + 2 * (tile.slot0 + (ok ? tid : 0)); /* 8-byte words */
    l.sum = tid < BNT && WK == WK_INT4_ZP ? p.xsum + tile.slot0 + (ok ? tid : 0) : NULL;
    l.sc_bytes = ok ? 4 : 0;
    /* weight scales: [matrix][group][rows_pad], this CTA's BM rows from row0; int4-zp-tc: scales, then zero x scale */
    const int64_t row0 = (int64_t)blockIdx.x * BM;
    l.wsrc = NULL, l.wbytes = 0, l.wstride = p.rows_pad * (WK == WK_INT4 ? 2 : 4);
    if (tid < wk_scales<WK>::chunks) {
        const int per = 16 / (WK == WK_INT4 ? 2 : 4); /* rows per chunk */
        const int part = WK == WK_INT4_ZP ? tid / (BM / per) : 0, c = tid - part * (BM / per);
        const int64_t row = row0 + (int64_t)c * per, base = (int64_t)tile.expert * p.n_groups * p.rows_pad;
        const bool in = row < p.rows_pad;
        const uint8_t *arr = WK == WK_INT4 ? (const uint8_t *)p.ws
                             : part        ? (const uint8_t *)p.wzs
                                           : (const uint8_t *)p.wsf;
        l.wsrc = arr + (base + (in ? row : row0)) * (WK == WK_INT4 ? 2 : 4);
        l.wbytes = in ? 16 : 0;
    }
    return l;
}

static __device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Activation tile and weight scales of 128-group grp into one stage (an FP4 tile and its block scales: into raw,
// [BNT][64] code bytes then [BNT][8] scale bytes).
template <int WK, int BNT, int AF>
static __device__ __forceinline__ void load_stage(const gemm_params &p, const stage_loader &l, int64_t grp,
                                                  uint8_t *xs_smem, float *sc_smem, float *sum_smem, uint8_t *wsc_smem,
                                                  uint8_t *raw) {
    if (AF != FM_W4A8_DISPATCH_E4M3) {
        const uint32_t rb = smem_u32(raw);
        if ((int)threadIdx.x < BNT * 4) cp_async16(rb + l.dst[0], l.src[0] + grp * 64, l.bytes[0]);
        if (l.wsrc) cp_async16(smem_u32(wsc_smem + threadIdx.x * 16), l.wsrc + grp * l.wstride, l.wbytes);
        const uint32_t sd = rb + BNT * 64 + threadIdx.x * 8;
        if (l.sc && AF == FM_W4A8_DISPATCH_MX) cp_async4(sd, l.sc + grp * p.lds, l.sc_bytes);
        if (l.sc && AF == FM_W4A8_DISPATCH_NV) cp_async8(sd, l.sc + 2 * grp * p.lds, 2 * l.sc_bytes);
        return;
    }
    const uint32_t base = smem_u32(xs_smem);
#pragma unroll
    for (int i = 0; i < stage_shape<BNT>::per_thread; i++)
        if (stage_shape<BNT>::chunks % THREADS == 0 || (int)threadIdx.x + i * THREADS < stage_shape<BNT>::chunks)
            cp_async16(base + l.dst[i], l.src[i] + grp * 128, l.bytes[i]);
    if (l.wsrc) cp_async16(smem_u32(wsc_smem + threadIdx.x * 16), l.wsrc + grp * l.wstride, l.wbytes);
    if (l.sc) {
        const int tid = (int)threadIdx.x;
        cp_async4(smem_u32(sc_smem + tid), l.sc + grp * p.lds, l.sc_bytes);
        if (WK == WK_INT4_ZP) cp_async4(smem_u32(sum_smem + tid), l.sum + grp * p.lds, l.sc_bytes);
    }
}

// The CTA's codes of one 128-group through the stage ring (the wgmma kernel with CS = 1, route w4a8.codes): its 16
// blocks of 16 rows x one group, chunk bytes each, into [16][chunk] of the stage, the global order (a warp then reads
// its block's words from shared memory as it would from global memory). Per thread 16 x chunk / 16 / THREADS
// 16-byte cp.async (4 for int4, 8 for e4m3): chunk c = tid + i THREADS is block c / (chunk / 16) of the CTA. Blocks
// past the bank's padded rows are zero-filled (they multiply as zeros, as the register path's absent blocks).
template <int WK> struct code_stage {
    static constexpr int bytes = 16 * wk_shape<WK>::chunk;                     /* per stage */
    static constexpr int per_thread = bytes / 16 / THREADS;                    /* 4 (int4) or 8 (e4m3) */
    static constexpr int blocks_per_step = THREADS * 16 / wk_shape<WK>::chunk; /* block stride between i and i + 1 */
};
typedef struct code_loader {
    const uint8_t *src; // chunk i = 0 of this thread, group 0
    int64_t step;       // bytes from chunk i to i + 1 (blocks_per_step blocks of all groups)
    uint32_t valid;     // bit i: chunk i's block lies inside the bank's padded rows
} code_loader;

template <int WK> static __device__ __forceinline__ code_loader code_loader_at(const gemm_params &p, int32_t matrix) {
    constexpr int CPB = wk_shape<WK>::chunk / 16; /* 16-byte chunks per block */
    const int tid = (int)threadIdx.x;
    const int64_t blocks = p.rows_pad / 16, b0 = (int64_t)blockIdx.x * (BM / 16) + tid / CPB;
    const int64_t bstride = p.n_groups * wk_shape<WK>::chunk; /* one 16-row block, all groups */
    code_loader c;
    c.src = p.wq + ((int64_t)matrix * blocks + b0) * bstride + (tid % CPB) * 16;
    c.step = code_stage<WK>::blocks_per_step * bstride;
    c.valid = 0;
#pragma unroll
    for (int i = 0; i < code_stage<WK>::per_thread; i++)
        if (b0 + i * code_stage<WK>::blocks_per_step < blocks) c.valid |= 1u << i;
    return c;
}

template <int WK> static __device__ __forceinline__ void load_codes(const code_loader &c, int64_t grp, uint8_t *stage) {
    const uint32_t base = smem_u32(stage) + threadIdx.x * 16;
    const uint8_t *src = c.src + grp * wk_shape<WK>::chunk;
#pragma unroll
    for (int i = 0; i < code_stage<WK>::per_thread; i++) {
        const bool ok = (c.valid >> i) & 1u;
        cp_async16(base + i * THREADS * 16, ok ? src + i * c.step : c.src, ok ? 16 : 0);
    }
}

// FP4 -> e4m3 on chip, one stage (raw, as load_stage or fp4_load_stage left it) into the e4m3 tile of the MMAs (the
// same swizzle as the e4m3 path's) and the rows' group scales into sc. Per block a table of the 8 magnitudes times
// s_block / S as e4m3 bytes (MX within 5 binades of S: integer steps on constant bytes; NV on the producer when
// c1's exponent >= 2: integer steps on the bytes of one conversion; else 4 conversions), then per 4 codes a byte
// permute picks the magnitudes and a second one the sign bits. Rows past the tile were zero-filled: codes 0.
static __device__ __forceinline__ uint32_t fp8x2(float a, float b) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// NT threads expand a stage; thread tid (0..NT-1) takes W = BNT x 16 / NT words of row n. The CTA-wide expansion
// (NT = THREADS) reads the row's block scales where load_stage put them ([BNT][8] after the codes); the producer
// warpgroup's (NT = FP4_PRODUCERS) each thread loaded its own copy ([NT][8] after the codes, fp4_load_stage), so that
// a producer thread reads only bytes its own cp.async wrote and needs no barrier with the other producers.
template <int AF, int BNT, int NT>
static __device__ __forceinline__ void expand_stage(const uint8_t *raw, uint8_t *tile, float *sc, float ts, int tid) {
    constexpr int W = BNT * 16 / NT, BLOCK_WORDS = AF == FM_W4A8_DISPATCH_MX ? 4 : 2; /* code words per thread, block */
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "expand_stage: 1, 2, 4 or 8 code words per thread");
    const int n = tid * W >> 4, j0 = tid * W & 15;
    uint32_t w[W];
    const uint8_t *src = raw + n * 64 + j0 * 4;
    if constexpr (W >= 4) {
#pragma unroll
        for (int q = 0; q < W / 4; q++) {
            const uint4 v = *(const uint4 *)(src + 16 * q);
            w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
        }
    } else if constexpr (W == 2) {
        const uint2 v = *(const uint2 *)src;
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = *(const uint32_t *)src;
    }
    const uint8_t *sb = raw + BNT * 64 + (NT == THREADS ? n : tid) * 8;
    const uint32_t s0 = *(const uint32_t *)sb, s1 = AF == FM_W4A8_DISPATCH_NV ? *(const uint32_t *)(sb + 4) : 0u;
    /* the largest scale byte, as two 16-bit lanes (NV: non-negative e4m3 codes order as their values) */
    uint32_t m = __vmaxu2(s0 & 0x00FF00FFu, (s0 >> 8) & 0x00FF00FFu);
    if (AF == FM_W4A8_DISPATCH_NV) m = __vmaxu2(m, __vmaxu2(s1 & 0x00FF00FFu, (s1 >> 8) & 0x00FF00FFu));
    const uint32_t smax = max(m & 0xFFFFu, m >> 16);
    const float S = AF == FM_W4A8_DISPATCH_MX ? __uint_as_float(smax ? smax << 23 : 0x00400000u) : e4m3_decode(smax);
    const float inv = AF == FM_W4A8_DISPATCH_NV && S > 0.0f ? __frcp_rn(S) : 0.0f; /* NV: 1 / S, as the CPU's */
    uint32_t out[2 * W], lo = 0u, hi = 0u;
#pragma unroll
    for (int i = 0; i < W; i++) {
        if (i % BLOCK_WORDS == 0) {
            const int blk = (j0 + i) / BLOCK_WORDS;
            const uint32_t byte = (blk < 4 ? s0 >> (8 * blk) : s1 >> (8 * (blk - 4))) & 0xFFu;
            /* MX: the code x 2^-min(d, 24) (exact in fp32); NV: (the code x s_b, exact) x (1 / S) */
            const uint32_t d = smax - byte;
            /* NV on the producer: p1 = s_b x (1 / S) and p15 = (1.5 s_b) x (1 / S) are the only products that
               round (the others are them times 2^-1, 2, 4: exact in fp32), so one conversion gives c1 = e4m3(p1),
               c15 = e4m3(p15). In the MMA warps' expansion (NT = THREADS) it measured slower than the 4
               conversions (bench/NOTES.md 2026-12-02 "FP4 expansion off the MMA warps"), so they keep those. */
            constexpr bool NV_STEPS = AF == FM_W4A8_DISPATCH_NV && NT != THREADS;
            const float bs = AF == FM_W4A8_DISPATCH_NV ? e4m3_decode(byte) : 0.0f;
            const uint32_t c = NV_STEPS ? fp8x2(__fmul_rn(bs, inv), __fmul_rn(__fmul_rn(1.5f, bs), inv)) : 0u;
            if (AF == FM_W4A8_DISPATCH_MX && d <= 5u) {
                /* the table's e4m3 bytes (0, 0.5, 1, 1.5 | 2, 3, 4, 6) with the exponent field lowered by d: exact
                   and normal while 0.5 x 2^-d >= 2^-6, the same bytes as the conversions below give */
                lo = 0x3C383000u - d * 0x08080800u, hi = 0x4C484440u - d * 0x08080808u;
            } else if (NV_STEPS && (c & 0x78u) >= 0x10u) {
                /* c1's exponent field >= 2: scaling by 2^j (j = -1, 1, 2) commutes with the e4m3 rounding (p1 / 2
                   stays normal, or rounds up to the smallest normal exactly as c1 - 8 says; 4 p15 <= 6, no
                   overflow), so the table is (0, c1 - 8, c1, c15 | c1 + 8, c15 + 8, c1 + 16, c15 + 16) */
                lo = __byte_perm(c, 0u, 0x1004) - 0x00000800u, hi = __byte_perm(c, 0u, 0x1010) + 0x10100808u;
            } else {
                const float r = AF == FM_W4A8_DISPATCH_MX ? __uint_as_float((127u - (d < 24u ? d : 24u)) << 23) : inv;
                const float b1 = AF == FM_W4A8_DISPATCH_MX ? 1.0f : bs;
                lo = fp8x2(0.0f, __fmul_rn(__fmul_rn(0.5f, b1), r)) |
                     fp8x2(__fmul_rn(b1, r), __fmul_rn(__fmul_rn(1.5f, b1), r)) << 16;
                hi = fp8x2(__fmul_rn(__fmul_rn(2.0f, b1), r), __fmul_rn(__fmul_rn(3.0f, b1), r)) |
                     fp8x2(__fmul_rn(__fmul_rn(4.0f, b1), r), __fmul_rn(__fmul_rn(6.0f, b1), r)) << 16;
            }
        }
        const uint32_t mag = w[i] & 0x77777777u, sgn = (w[i] >> 3) & 0x11111111u; /* 8 codes, both halves */
        out[2 * i] = __byte_perm(lo, hi, mag) | __byte_perm(0x8000u, 0u, sgn);
        out[2 * i + 1] = __byte_perm(lo, hi, mag >> 16) | __byte_perm(0x8000u, 0u, sgn >> 16);
    }
    uint8_t *row = tile + n * 128;
    if constexpr (W >= 2) {
#pragma unroll
        for (int c = 0; c < W / 2; c++) { /* 16 bytes: chunk (j0 >> 1) + c */
            const int ch = (j0 >> 1) + c;
            *(uint4 *)(row + ((ch ^ (n & 7)) << 4)) =
                make_uint4(out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3]);
        }
    } else {
        *(uint2 *)(row + (((j0 >> 1) ^ (n & 7)) << 4) + (j0 & 1) * 8) = make_uint2(out[0], out[1]);
    }
    if (j0 == 0) sc[n] = AF == FM_W4A8_DISPATCH_MX ? S : __fmul_rn(S, ts);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* the tile is wgmma's B: read by the async proxy */
#endif
}

// Where one warp's weight codes live: its two 16-row blocks (any two blocks of a matrix) for this lane, and the
// CTA-local index of its rows g of each block (the scales' place in the stage).
typedef struct warp_weights {
    const uint8_t *codes[2]; // block mb, group 0, this lane's 16 bytes of part 0
    int lrow[2];             // blk[mb] * 16 + g - the CTA's first row
} warp_weights;

template <int WK>
static __device__ __forceinline__ warp_weights warp_weights_at(const gemm_params &p, int32_t matrix,
                                                               const int64_t blk[2]) {
    const int lane = threadIdx.x & 31;
    warp_weights w;
    for (int mb = 0; mb < 2; mb++) {
        w.codes[mb] =
            p.wq + ((int64_t)matrix * (p.rows_pad / 16) + blk[mb]) * p.n_groups * wk_shape<WK>::chunk + lane * 16;
        w.lrow[mb] = (int)(blk[mb] * 16 - (int64_t)blockIdx.x * BM) + (lane >> 2);
    }
    return w;
}

// Part q of the warp's codes for 128-group grp: words 4q..4q+3 of both blocks (int4: k steps 2q, 2q + 1; e4m3:
// k step q).
template <int WK>
static __device__ __forceinline__ void load_weight_part(const warp_weights &w, int64_t grp, int q,
                                                        uint32_t words[2][wk_shape<WK>::words]) {
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const uint4 v = __ldg((const uint4 *)(w.codes[mb] + grp * wk_shape<WK>::chunk + q * 512));
        words[mb][4 * q] = v.x, words[mb][4 * q + 1] = v.y, words[mb][4 * q + 2] = v.z, words[mb][4 * q + 3] = v.w;
    }
}

// The row scales of the current 128-group for this thread's rows (g and g + 8 of both blocks: local rows lrow[mb]
// and + 8 of the CTA's BM) from the stage, as the partial sums want them: int4 codes are e4m3 subnormals q / 512, so
// their scales carry the 512 (int4-zp-tc stores it folded in); zs: zero x scale. Rows past the bank read zeros.
template <int WK>
static __device__ __forceinline__ void load_weight_scales(const uint8_t *wsm, const int lrow[2], float sc[2][2],
                                                          float zs[2][2]) {
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        if (WK == WK_INT4) {
            const __nv_bfloat16 *s = (const __nv_bfloat16 *)wsm + lrow[mb];
            sc[mb][0] = __bfloat162float(s[0]) * 512.0f, sc[mb][1] = __bfloat162float(s[8]) * 512.0f;
        } else {
            const float *s = (const float *)wsm + lrow[mb];
            sc[mb][0] = s[0], sc[mb][1] = s[8];
        }
        if (WK == WK_INT4_ZP) {
            const float *z = (const float *)wsm + BM + lrow[mb];
            zs[mb][0] = z[0], zs[mb][1] = z[8];
        } else {
            zs[mb][0] = zs[mb][1] = 0.0f;
        }
    }
}

static __device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// SiLU on the fast exponential and reciprocal (MUFU.EX2 and MUFU.RCP, 4 instructions where expf and an IEEE
// division took ~16 and a branch; the epilogue was about a third of the gate|up kernel's ncu samples at T = 2048).
// Their few-ulp error is absorbed by the bf16 rounding that follows, except at rare rounding ties.
static __device__ __forceinline__ float silu_fast(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

// The epilogue, shared by both kernels: acc[mb][nt][i] is the accumulator of 16-row block blk[mb] (rows g and
// g + 8: i / 2), activation rows nt * 8 + 2t + i % 2 of the tile (the m16n8 / wgmma D layout). A block past the
// bank (blk_ok false) holds zeros and stores nothing. SwiGLU: the CTA's 256 rows are the gate and up rows of
// 128 channels, one 128-group of h, so the amax per activation row is a CTA reduction (red[warp][row]).
// EPI_SWIGLU_SUMS, after the SwiGLU epilogue left each thread's decoded-code sums of rows n in acc[0][nt][c]: the
// down bank is int4-zp, so h's group sums X = scale x (sum of the 128 codes) are written beside hs (a second CTA
// reduction, as the amax one)
template <int BNT>
static __device__ __forceinline__ void write_group_sums(const gemm_params &p, const fm_w4a8_tile &tile,
                                                        const float acc[2][BNT / 8][4], float (*red)[BNT],
                                                        float (*red_sum)[BNT]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int n = nt * 8 + 2 * t + c;
            float v = n < tile.rows ? acc[0][nt][c] : 0.0f;
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) red_sum[warp][n] = v;
        }
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
    for (int n = threadIdx.x; n < tile.rows; n += THREADS) {
        float v = 0.0f;
        for (int w = 0; w < THREADS / 32; w++) v += red_sum[w][n];
        const int64_t slot = tile.slot0 + n;
        p.hsum[(int64_t)blockIdx.x * p.ldhs + slot] = v * red[0][n]; /* the row's scale (epilogue) */
    }
}

// The epilogues: fm_w4a8_epilogue's two, and the SwiGLU one that also writes h's group sums (a down bank of int4-zp
// weights needs them); a template value of its own so that the other two compile as if it did not exist.
// EPI_SWIGLU_TOK: the SwiGLU epilogue of a GEMM whose activations carry one scale per token (route moe.act_scale,
// every group's scale of a row the same): the kernel promotes with the weight scale alone and multiplies by the
// token's scale before the epilogue, which then runs as EPI_SWIGLU (both kernels, int4-tc banks, e4m3 rows).
// EPI_BF16_SPLIT: the bf16 epilogue of a dense, non-interleaved bank whose K is split over the CTAs of a thread-block
// cluster along z (route w4a8.splits; the wgmma kernel only, epilogue_split below).
enum {
    EPI_BF16 = FM_W4A8_OUT_BF16,
    EPI_SWIGLU = FM_W4A8_OUT_SWIGLU_E4M3,
    EPI_SWIGLU_SUMS,
    EPI_SWIGLU_TOK,
    EPI_BF16_SPLIT
};

// The output tiles pass through shared memory (scratch: the CTA's activation stages, free once every warp is past
// its last group) so that global memory sees 16-byte stores of whole rows: a thread's accumulators hold 4 weight rows
// x 16 activation rows, i.e. 2-byte (bf16) or 1-byte (e4m3) pieces 8 and 64 elements apart, which as single stores
// with their addresses and bounds were about 30 % of the SwiGLU epilogue's instructions and most of the bf16 one's.
// Rows of the scratch tiles are padded by 16 bytes: the column writes of a warp's 8 x 4 lanes then fall in distinct
// banks, and the row reads stay 16-byte aligned.
#define EPI_ROW_PAD 16
// Row strides in bytes: e4m3 h, BNT rows x 128 channels; bf16 y, BNT rows x 128 columns (one half of the CTA's 256).
template <int BNT> struct epi_scratch {
    static constexpr int h_stride = 128 + EPI_ROW_PAD;
    static constexpr int y_stride = 2 * 128 + EPI_ROW_PAD;
    static constexpr int bytes = BNT * y_stride;
};

// The bf16 output of one half (128 weight rows = output columns) of the CTA's tile from scratch, where warps of that
// half left it: 16-byte stores where the row allows (ldy a multiple of 8, the columns inside the bank), else 2-byte.
template <int BNT>
static __device__ __forceinline__ void store_y_half(const gemm_params &p, const fm_w4a8_tile &tile,
                                                    const uint8_t *scratch, int half, const int32_t *out_row) {
    constexpr int CHUNKS = BNT * 16; /* 16-byte chunks: BNT rows x 128 columns */
    const int64_t col0 = (int64_t)blockIdx.x * BM + 128 * half;
    const bool wide = p.ldy % 8 == 0 && (uintptr_t)p.y % 16 == 0;
#pragma unroll
    for (int j = 0; j < (CHUNKS + THREADS - 1) / THREADS; j++) {
        const int i = (int)threadIdx.x + j * THREADS, n = i >> 4, k = i & 15;
        if ((CHUNKS % THREADS && i >= CHUNKS) || out_row[j] < 0) continue;
        const int64_t col = col0 + 8 * k;
        const uint4 v = *(const uint4 *)(scratch + n * epi_scratch<BNT>::y_stride + 16 * k);
        __nv_bfloat16 *dst = p.y + (int64_t)out_row[j] * p.ldy + col;
        if (wide && col + 8 <= p.rows) {
            *(uint4 *)dst = v;
        } else {
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (col + q < p.rows) dst[q] = __ushort_as_bfloat16((unsigned short)(w[q / 2] >> (16 * (q & 1))));
        }
    }
}

template <int EPILOGUE, int BNT>
static __device__ __forceinline__ void epilogue(const gemm_params &p, const fm_w4a8_tile &tile,
                                                float acc[2][BNT / 8][4], const int64_t blk[2], const bool blk_ok[2],
                                                float (*red)[BNT], float (*red_sum)[BNT], uint8_t *scratch) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (EPILOGUE == EPI_BF16 && !p.interleaved) {
        /* the output rows of the chunks this thread stores (the same rows for both halves) */
        constexpr int CHUNKS = BNT * 16;
        int32_t out_row[(CHUNKS + THREADS - 1) / THREADS];
#pragma unroll
        for (int j = 0; j < (CHUNKS + THREADS - 1) / THREADS; j++) {
            const int n = ((int)threadIdx.x + j * THREADS) >> 4;
            const int32_t slot = tile.slot0 + n;
            out_row[j] = n >= tile.rows ? -1 : p.row_map ? __ldcg(p.row_map + slot) : slot;
        }
        /* local weight row of this thread's (block mb, row g + 8 half): which half of the CTA's 256 it lies in */
        const int lr0 = (int)(blk[0] * 16 - (int64_t)blockIdx.x * BM) + g,
                  lr1 = (int)(blk[1] * 16 - (int64_t)blockIdx.x * BM) + g;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory"); /* every warp past its last group / stores */
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                const int lr = mb ? lr1 : lr0;
                if ((lr >> 7) != half) continue;
                uint8_t *col = scratch + 2 * (lr & 127);
#pragma unroll
                for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int n = nt * 8 + 2 * t + c;
                        *(__nv_bfloat16 *)(col + n * epi_scratch<BNT>::y_stride) = __float2bfloat16_rn(acc[mb][nt][c]);
                        *(__nv_bfloat16 *)(col + n * epi_scratch<BNT>::y_stride + 16) =
                            __float2bfloat16_rn(acc[mb][nt][2 + c]);
                    }
            }
            asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
            store_y_half<BNT>(p, tile, scratch, half, out_row);
        }
        return;
    }
    if (EPILOGUE == EPI_BF16) { /* an interleaved bank (a dense MLP's gate|up): its columns back in bank order */
        int64_t col[2][2];      /* the output columns of this thread's 4 weight rows, -1 past the bank */
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int64_t tr = blk[mb] * 16 + g + 8 * half;
                col[mb][half] = blk_ok[mb] && tr < p.rows ? fm_tc_source_row(tr, p.rows, p.interleaved) : -1;
            }
        /* the output rows of this thread's 16 activation rows, all loads first (interleaved with the stores, each
           lookup waited for the stores before it: the compiler cannot tell row_map from y; ncu: a third of the
           down GEMM's samples), then 4 values per row */
        int32_t out_row[BNT / 8][2];
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int n = nt * 8 + 2 * t + c;
                const int32_t slot = tile.slot0 + n;
                out_row[nt][c] = n >= tile.rows ? -1 : p.row_map ? __ldcg(p.row_map + slot) : slot;
            }
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                if (out_row[nt][c] < 0) continue;
                __nv_bfloat16 *yr = p.y + (int64_t)out_row[nt][c] * p.ldy;
#pragma unroll
                for (int mb = 0; mb < 2; mb++)
#pragma unroll
                    for (int half = 0; half < 2; half++)
                        if (col[mb][half] >= 0) yr[col[mb][half]] = __float2bfloat16_rn(acc[mb][nt][2 * half + c]);
            }
        return;
    }
    const int64_t I = p.rows / 2;
    float amax[BNT / 8][2];
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++) amax[nt][0] = amax[nt][1] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const int64_t ch = blk[mb] * 8 + g;
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float gate = round_bf16(acc[mb][nt][c]), up = round_bf16(acc[mb][nt][2 + c]);
                const float hv = (blk_ok[mb] && ch < I) ? round_bf16(silu_fast(gate) * up) : 0.0f;
                acc[mb][nt][c] = hv;
                amax[nt][c] = fmaxf(amax[nt][c], fabsf(hv));
            }
    }
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float m = amax[nt][c];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            if (g == 0) red[warp][nt * 8 + 2 * t + c] = m;
        }
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory"); /* the CTA's 8 warps */
    /* one thread per activation row n finishes its amax over the warps and leaves the row's scale in red[0][n] and
       its reciprocal in red[1][n] (column n of red is read and written by that thread only; every thread doing all
       of its 16 rows' reductions was ~250 instructions each) */
    if (threadIdx.x < BNT) {
        const int n = threadIdx.x;
        float m = 0.0f;
#pragma unroll
        for (int w = 0; w < THREADS / 32; w++) m = fmaxf(m, red[w][n]);
        const float scale = fmaxf(m / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
        red[0][n] = scale;
        /* one division per row and a multiply per element (the CPU divides each element: a product can differ from
           the quotient by an ulp, which moves an e4m3 code only at a rounding tie) */
        red[1][n] = 1.0f / scale;
        if (n < tile.rows) p.hs[(int64_t)blockIdx.x * p.ldhs + tile.slot0 + n] = scale;
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
    /* the codes into scratch [BNT][128 channels] (an invalid channel's h is 0: code 0, as the zeroed h holds there),
       then out as 16-byte row pieces: this CTA's 128 channels are one 128-byte run of each h row */
    const int ch0 = (int)(blk[0] * 8 - (int64_t)blockIdx.x * 128) + g,
              ch1 = (int)(blk[1] * 8 - (int64_t)blockIdx.x * 128) + g;
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int n = nt * 8 + 2 * t + c;
            const float inv = red[1][n];
            float sum = 0.0f; /* EPI_SWIGLU_SUMS: this thread's codes of row n, decoded, for the group sum */
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                const uint8_t code = (uint8_t)__nv_cvt_float_to_fp8(acc[mb][nt][c] * inv, __NV_SATFINITE, __NV_E4M3);
                scratch[n * epi_scratch<BNT>::h_stride + (mb ? ch1 : ch0)] = code;
                if (EPILOGUE == EPI_SWIGLU_SUMS && blk_ok[mb] && blk[mb] * 8 + g < I) sum += e4m3_decode(code);
            }
            if (EPILOGUE == EPI_SWIGLU_SUMS) acc[0][nt][c] = sum; /* reused: h is written */
        }
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
    constexpr int CHUNKS = BNT * 8; /* 16-byte chunks: BNT rows x 128 bytes */
#pragma unroll
    for (int j = 0; j < (CHUNKS + THREADS - 1) / THREADS; j++) {
        const int i = (int)threadIdx.x + j * THREADS, n = i >> 3, k = i & 7;
        if ((CHUNKS % THREADS && i >= CHUNKS) || n >= tile.rows) continue;
        *(uint4 *)(p.h + (tile.slot0 + n) * p.ldh + (int64_t)blockIdx.x * 128 + 16 * k) =
            *(const uint4 *)(scratch + n * epi_scratch<BNT>::h_stride + 16 * k);
    }
    if (EPILOGUE == EPI_SWIGLU_SUMS) write_group_sums<BNT>(p, tile, acc, red, red_sum);
}

// The activation scales of this thread's columns (rows nt * 8 + 2t, + 1 of the tile) from the stage in shared
// memory.
template <int BNT> static __device__ __forceinline__ void load_act_scales(const float *sc, float2 xsc[BNT / 8]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++) xsc[nt] = *(const float2 *)(sc + nt * 8 + 2 * t);
}

// EPI_SWIGLU_TOK: acc += partial x (weight scale x 512), one FFMA per element and 128-group; the token's scale
// comes in once, after the last group (scale_by_token)
template <int BNT>
static __device__ __forceinline__ void promote_token(float acc[2][BNT / 8][4], const float part[2][BNT / 8][4],
                                                     const float wsc[2][2]) {
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int mb = 0; mb < 2; mb++) {
            acc[mb][nt][0] = fmaf(part[mb][nt][0], wsc[mb][0], acc[mb][nt][0]);
            acc[mb][nt][1] = fmaf(part[mb][nt][1], wsc[mb][0], acc[mb][nt][1]);
            acc[mb][nt][2] = fmaf(part[mb][nt][2], wsc[mb][1], acc[mb][nt][2]);
            acc[mb][nt][3] = fmaf(part[mb][nt][3], wsc[mb][1], acc[mb][nt][3]);
        }
}

// EPI_SWIGLU_TOK, after the last group: acc x the token's scale (sc: any stage's activation scales, every group's the
// token's)
template <int BNT> static __device__ __forceinline__ void scale_by_token(float acc[2][BNT / 8][4], const float *sc) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++) {
        const float2 xs = *(const float2 *)(sc + nt * 8 + 2 * t);
#pragma unroll
        for (int mb = 0; mb < 2; mb++) {
            acc[mb][nt][0] *= xs.x, acc[mb][nt][1] *= xs.y;
            acc[mb][nt][2] *= xs.x, acc[mb][nt][3] *= xs.y;
        }
    }
}

// acc += partial x (weight scale x 512) x (activation scale), per element, once per 128-group;
// int4-zp: then acc -= (zero x scale) x (the activation group's sum)
template <int WK, int BNT>
static __device__ __forceinline__ void promote(float acc[2][BNT / 8][4], const float part[2][BNT / 8][4],
                                               const float wsc[2][2], const float zs[2][2],
                                               const float2 xsc_all[BNT / 8], const float *sum) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++) {
        const float2 xsc = xsc_all[nt];
#pragma unroll
        for (int mb = 0; mb < 2; mb++) {
            acc[mb][nt][0] = fmaf(part[mb][nt][0], wsc[mb][0] * xsc.x, acc[mb][nt][0]);
            acc[mb][nt][1] = fmaf(part[mb][nt][1], wsc[mb][0] * xsc.y, acc[mb][nt][1]);
            acc[mb][nt][2] = fmaf(part[mb][nt][2], wsc[mb][1] * xsc.x, acc[mb][nt][2]);
            acc[mb][nt][3] = fmaf(part[mb][nt][3], wsc[mb][1] * xsc.y, acc[mb][nt][3]);
        }
        if (WK == WK_INT4_ZP) {
            const float2 xs = *(const float2 *)(sum + nt * 8 + 2 * t);
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                acc[mb][nt][0] = fmaf(-zs[mb][0], xs.x, acc[mb][nt][0]);
                acc[mb][nt][1] = fmaf(-zs[mb][0], xs.y, acc[mb][nt][1]);
                acc[mb][nt][2] = fmaf(-zs[mb][1], xs.x, acc[mb][nt][2]);
                acc[mb][nt][3] = fmaf(-zs[mb][1], xs.y, acc[mb][nt][3]);
            }
        }
    }
}

// ---- sm_90a: the wgmma instruction (the wgmma kernel and the FP4 producer kernel) ---------------------------

#define WGMMA_PART_ARGS(d)                                                                                             \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),           \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

// Split K (EPI_BF16_SPLIT, route w4a8.splits): a decode batch's dense projection has a few 256-row tiles (Qwen3-
// 30B-A3B's q|k|v 20, o 8 at one CTA an SM), so one CTA per tile leaves most SMs idle while each streams all of K.
// With the cluster (1, 1, Z) over the grid's z, CTA z of a tile's cluster computes the 128-groups [KG z / Z,
// KG (z + 1) / Z) into the usual accumulators; then every CTA writes its partial sums into its own shared memory as
// the tile's transpose (part[n][R]: activation row n, weight row R of the tile, rows of BM + 4 floats: the m16n8 D
// order's lanes then hit 32 banks), one cluster barrier (release / acquire) publishes them, and the CTA of rank r
// sums chunks [r NC / Z, (r + 1) NC / Z) over the cluster's CTAs in rank order (the same bits whichever CTA sums, and
// at every run). A chunk is 8 weight rows of one activation row, 4 at R and 4 at R + BM / 2: two 16-byte loads from
// each CTA of the cluster, all of them in flight together, and two 8-byte bf16 stores; a warp's loads then cover 512
// contiguous bytes and its stores one activation row's 256 outputs (8 adjacent rows a thread, 16-byte loads at a
// 32-byte stride, measured slower than the first form). A second barrier keeps each CTA's shared memory until the
// others have read it. The sum of Z partials rounds differently from one accumulation: a few ulp of fp32 before the
// bf16 rounding (the op tests' tolerance is the CPU emulation's).
// (The first form summed one float of every CTA at a time in the D order, 2-byte stores: half of the kernel's
// instructions and stall samples at Qwen3's q|k|v, B = 64, under ncu: bench/NOTES.md, forty-fourth session.)
template <int BNT> struct split_shape {
    static constexpr int stride = BM + 4;          /* floats of one activation row's partials */
    static constexpr int bytes = BNT * stride * 4; /* the partials, in the dynamic shared memory */
    static constexpr int chunks = BNT * (BM / 8);  /* 8 weight rows of one activation row */
};
template <int BNT>
static __device__ __forceinline__ void epilogue_split(const gemm_params &p, const fm_w4a8_tile &tile,
                                                      float acc[2][BNT / 8][4], float *part) {
    constexpr int PS = split_shape<BNT>::stride, NC = split_shape<BNT>::chunks;
    const int tid = (int)threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int warp = tid >> 5, r0 = (warp >> 2) * 128 + (warp & 3) * 16 + g; /* the tile's weight row of blk0, g */
#pragma unroll
    for (int mb = 0; mb < 2; mb++)
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                part[(nt * 8 + 2 * t + (i & 1)) * PS + r0 + 64 * mb + 8 * (i >> 1)] = acc[mb][nt][i];
    cluster_arrive_release(); /* this CTA's partials, then */
    cluster_wait_acquire();   /* every CTA's */
    const uint32_t Z = gridDim.z, r = cluster_rank(), base = smem_u32(part);
    const int c1 = (int)((r + 1) * NC / Z);
    for (int c = (int)(r * NC / Z) + tid; c < c1; c += THREADS) {
        /* chunk c: activation row n, weight rows R + [0, 4) and R + BM / 2 + [0, 4) (a warp's 16-byte loads and
           8-byte stores cover 512 and 256 contiguous bytes) */
        const int n = c / (BM / 8), R = (c % (BM / 8)) * 4;
        const uint32_t local = base + (uint32_t)(n * PS + R) * 4u;
        float4 q[FM_W4A8_MAX_SPLITS][2];
#pragma unroll
        for (int z = 0; z < FM_W4A8_MAX_SPLITS; z++)
            if (z < (int)Z) {
                const uint32_t remote = cluster_map(local, (uint32_t)z);
                q[z][0] = ld_cluster_f32x4(remote), q[z][1] = ld_cluster_f32x4(remote + (uint32_t)(BM / 2) * 4u);
            }
        float v[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int z = 0; z < FM_W4A8_MAX_SPLITS; z++)
            if (z < (int)Z)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    v[h][0] += q[z][h].x, v[h][1] += q[z][h].y, v[h][2] += q[z][h].z, v[h][3] += q[z][h].w;
        if (n >= tile.rows) continue;
        const int32_t slot = tile.slot0 + n;
        __nv_bfloat16 *yr = p.y + (p.row_map ? __ldcg(p.row_map + slot) : slot) * p.ldy;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = (int64_t)blockIdx.x * BM + R + h * (BM / 2);
            __nv_bfloat16 *y = yr + row;
            if (row + 4 <= p.rows && ((uintptr_t)y & 7) == 0) {
                __align__(8) __nv_bfloat162 o[2] = {__floats2bfloat162_rn(v[h][0], v[h][1]),
                                                    __floats2bfloat162_rn(v[h][2], v[h][3])};
                *(uint2 *)y = *(const uint2 *)o;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (row + j < p.rows) y[j] = __float2bfloat16_rn(v[h][j]);
            }
        }
    }
    cluster_arrive_release(); /* done reading the others' partials: */
    cluster_wait_acquire();   /* no CTA leaves while its shared memory is read */
}

// d (an m64nN f32 fragment, N = BNT: [n8 tile][4], the m16n8 D order) = A B (+ d when accumulate)
template <int BNT>
static __device__ __forceinline__ void wgmma_tile(float d[BNT / 8][4], const uint32_t a[4], uint64_t desc_b,
                                                  int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BNT == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
            "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
            : WGMMA_PART_ARGS(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    } else if constexpr (BNT == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, "
                     "%20, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                       "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    } else {
        static_assert(BNT == 16, "wgmma tiles: n64, n32 or n16");
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                       "+f"(d[1][2]), "+f"(d[1][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    }
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}

// After a wait: the block's partial and fragments belong to the program again (see fence_f).
template <int BNT> static __device__ __forceinline__ void settle_block(float part[BNT / 8][4], uint32_t a[4][4]) {
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) fence_f(part[nt][i]);
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
#pragma unroll
        for (int i = 0; i < 4; i++) fence_u(a[ks][i]);
}

// ---- the kernels' launchers (one per kernel file) and the instances the launch tree of w4a8_gemm.cu calls -----
template <int EPILOGUE, int WK, int BNT, int AF> void w4a8_mma_launch(const gemm_params &p, dim3 grid, cudaStream_t s);
template <int EPILOGUE, int WK, int BNT, int AF, int CS>
void w4a8_wgmma_launch(const gemm_params &p, dim3 grid, cudaStream_t s);
template <int BNT, int AF> void w4a8_wgmma_fp4_launch(const gemm_params &p, dim3 grid, cudaStream_t s);

// X(EPILOGUE, WK, BNT, AF) for every tile height
#define W4A8_EACH_TILE(X, E, WK, AF)                                                                                   \
    X(E, WK, FM_W4A8_BN, AF) X(E, WK, FM_W4A8_BN_MID, AF) X(E, WK, FM_W4A8_BN_SMALL, AF)
// e4m3 activations: every epilogue and weight kind
#define W4A8_EACH_E4M3(X)                                                                                              \
    W4A8_EACH_TILE(X, EPI_BF16, WK_INT4, FM_W4A8_DISPATCH_E4M3)                                                        \
    W4A8_EACH_TILE(X, EPI_BF16, WK_INT4_ZP, FM_W4A8_DISPATCH_E4M3)                                                     \
    W4A8_EACH_TILE(X, EPI_BF16, WK_E4M3, FM_W4A8_DISPATCH_E4M3)                                                        \
    W4A8_EACH_TILE(X, EPI_SWIGLU, WK_INT4, FM_W4A8_DISPATCH_E4M3)                                                      \
    W4A8_EACH_TILE(X, EPI_SWIGLU, WK_INT4_ZP, FM_W4A8_DISPATCH_E4M3)                                                   \
    W4A8_EACH_TILE(X, EPI_SWIGLU, WK_E4M3, FM_W4A8_DISPATCH_E4M3)                                                      \
    W4A8_EACH_TILE(X, EPI_SWIGLU_SUMS, WK_INT4, FM_W4A8_DISPATCH_E4M3)                                                 \
    W4A8_EACH_TILE(X, EPI_SWIGLU_SUMS, WK_INT4_ZP, FM_W4A8_DISPATCH_E4M3)                                              \
    W4A8_EACH_TILE(X, EPI_SWIGLU_SUMS, WK_E4M3, FM_W4A8_DISPATCH_E4M3)
// split K over a cluster (route w4a8.splits): dense banks, bf16 out, 64-row tiles, every weight kind (wgmma only)
#define W4A8_EACH_SPLIT(X)                                                                                             \
    X(EPI_BF16_SPLIT, WK_INT4, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3)                                                      \
    X(EPI_BF16_SPLIT, WK_INT4_ZP, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3)                                                   \
    X(EPI_BF16_SPLIT, WK_E4M3, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3)
// one scale per token (route moe.act_scale=token): the gate|up GEMM of int4-tc banks, e4m3 rows
#define W4A8_EACH_TOKEN(X) W4A8_EACH_TILE(X, EPI_SWIGLU_TOK, WK_INT4, FM_W4A8_DISPATCH_E4M3)
// FP4 activations (MX, NV): the gate|up GEMM of int4-tc banks only
#define W4A8_EACH_FP4(X)                                                                                               \
    W4A8_EACH_TILE(X, EPI_SWIGLU, WK_INT4, FM_W4A8_DISPATCH_MX)                                                        \
    W4A8_EACH_TILE(X, EPI_SWIGLU, WK_INT4, FM_W4A8_DISPATCH_NV)

#endif
