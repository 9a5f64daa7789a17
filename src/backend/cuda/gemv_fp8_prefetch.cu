// Decode-size FP8 projections whose weights arrive before the previous kernel has finished (sm_90).
//
// Why: under PDL (pdl.cuh) a GEMV may start while its predecessor still runs, but it can keep only what its
// registers hold in flight (gemv_fp8.cu: 64 KB per CTA), and a CTA that is not yet resident issues nothing. Measured
// there: 4.7 us per Qwen3 projection against 2.2 us of transfer. Here each CTA owns UPC 16-row blocks of the matrix
// *whole* (every k), sized so that all CTAs are resident at once, one per SM, beside a CTA of the kernel before:
// its first act is one bulk copy per row (the TMA unit, bulk_copy.cuh) of its whole slice into shared memory, then
// it lets the next kernel launch and waits. So a projection's weights stream in while the one before computes, and
// after the wait only x (from L2), the MMAs out of shared memory and one reduction remain.
//
// Shapes: 8 warps; warp w takes the 64-byte chunks (W8A8) or 128-groups (W4A8) w, w + 8, ... of every row block
// of the CTA, and the 8 partial sums of a row block meet in shared memory in a fixed order (deterministic). The
// MMAs are those of gemv_fp8.cu (mma.sync m16n8k32 e4m3, weights the A operand, <= 16 activation rows the B):
//   W8A8: rows in shared memory at a pitch of K rounded up to 128, + 64 bytes, so that the 16-byte A reads of a
//         quarter warp (rows g, g + 1 at the same k) fall in different banks; x read once per lane from L2.
//   W4A8: the int4-tc / int4-zp-tc / e4m3-block chunks copied as they lie (already in fragment order: conflict-
//         free), their weight scales one copy per group; x staged in shared memory after the wait, as gemv_fp8.cu.
// A CTA's shared memory stays <= FM_GEMV_PREFETCH_SMEM so that two kernels' CTAs fit on one SM. Shapes that need
// more than one CTA per SM, or more, take gemv_fp8.cu's kernels.
//
// Floor: weight bytes / 4.25 TB/s (Qwen3-30B-A3B q|k|v 10.5 MB: 2.5 us; o 8.4 MB: 2.0 us).
#include <string.h>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/gemv_fp8_common.cuh"
#include "backend/cuda/gemv_fp8_prefetch.cuh"
#include "backend/cuda/pdl.cuh"

#define WARPS   GEMV_WARPS
#define UPC_MAX 4 // 16-row blocks per CTA
#define PIECES_MAX 8 // W8A8: the slice is copied in up to this many pieces (of whole rows)

// lab/gemv_chain.cu defines this to time-stamp each CTA at points 0 (start), 1 (after the PDL wait; it also notes
// whether the weights were in by then), 2 (weights arrived), 3 (done): the timeline of a chain of these kernels
#ifndef GEMV_TRACE
#define GEMV_TRACE(point, id, bar)
#define GEMV_TRACE_X(word)
#endif

static __host__ __device__ inline int64_t w8a8_pitch(int64_t ld) { return (ld + 127) / 128 * 128 + 64; }

// The partials of the UPC row blocks of every warp, [warp][b][nt][i][lane], over the (then read) weights; warp b
// sums block b's in warp order and stores it
template <int NT, int UPC>
static __device__ __forceinline__ void reduce_store(float acc[UPC][NT][4], float *red, int64_t row0, int64_t N,
                                                    int64_t M, float scale, __nv_bfloat16 *y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* every warp is done with the weights */
#pragma unroll
    for (int b = 0; b < UPC; b++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[(((warp * UPC + b) * NT + nt) * 4 + i) * 32 + lane] = acc[b][nt][i];
    __syncthreads();
    if (warp >= UPC) return;
    float sum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float a = 0.0f;
            for (int w = 0; w < WARPS; w++) a += red[(((w * UPC + warp) * NT + nt) * 4 + i) * 32 + lane];
            sum[nt][i] = a;
        }
    store_rows<NT>(sum, row0 + 16 * warp, N, M, scale, y);
}

// ---- W8A8: W e4m3 [N][ld] with *w_scale, x e4m3 [M][ld] with *x_scale ----

template <int NT, int UPC>
static __global__ __launch_bounds__(WARPS * 32, 2) void w8a8_prefetch_kernel(const uint8_t *W, int64_t N, int64_t ld,
                                                                           const float *w_scale, const uint8_t *x,
                                                                           int64_t M, const float *x_scale,
                                                                           __nv_bfloat16 *y, int depth) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t bars[PIECES_MAX];
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * UPC * 16, pitch = w8a8_pitch(ld);
    const int     rows = (int)(N - row0 < UPC * 16 ? N - row0 : UPC * 16);
    const int     rpp = (rows + PIECES_MAX - 1) / PIECES_MAX, np = (rows + rpp - 1) / rpp; /* rows per piece, pieces */
    GEMV_TRACE(0, W, &bars[0]);
    pdl_launch_dependents();
    if (threadIdx.x == 0)
        for (int p = 0; p < np; p++) bulk_barrier_init(&bars[p]);
    __syncthreads(); /* the barriers are initialised for everyone */
    if (threadIdx.x == 0) { /* the producer: the slice in pieces of rpp rows, one bulk copy per row, depth pieces in
                               flight (rows past N stay unwritten: their outputs are not stored) */
        const uint64_t policy = l2_evict_first();
        for (int p = 0; p < np; p++) {
            if (p >= depth) bulk_barrier_wait(&bars[p - depth], 0);
            const int r1 = (p + 1) * rpp < rows ? (p + 1) * rpp : rows;
            bulk_barrier_expect(&bars[p], (uint32_t)((r1 - p * rpp) * ld));
            for (int r = p * rpp; r < r1; r++) bulk_load(sm + r * pitch, W + (row0 + r) * ld, (uint32_t)ld, &bars[p], policy);
        }
    }
    const float w_sc = *w_scale; /* a weight: readable before the wait */
    pdl_wait();                  /* from here on x may be read and y written */
    GEMV_TRACE(1, W, &bars[np - 1]);
    const float scale = w_sc * __ldcg(x_scale); /* in flight with x, not after the MMAs */

    const int     XU = 8 / NT; /* chunks of x in flight per lane */
    const int64_t pieces = ld / 16, chunks = (pieces + 3) / 4;
    const uint4   zero = make_uint4(0, 0, 0, 0);
    float         acc[UPC][NT][4];
#pragma unroll
    for (int b = 0; b < UPC; b++) zero_acc<NT>(acc[b]);
    for (int64_t c0 = warp; c0 < chunks; c0 += (int64_t)WARPS * XU) {
        uint4 vx[XU][NT];
#pragma unroll
        for (int u = 0; u < XU; u++) {
            const int64_t p = 4 * (c0 + (int64_t)u * WARPS) + t;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                vx[u][nt] = p < pieces && nt * 8 + g < M ? __ldcg((const uint4 *)(x + (nt * 8 + g) * ld) + p) : zero;
        }
        for (int p = 0; p < np; p++) bulk_barrier_wait(&bars[p], 0);
        GEMV_TRACE(2, W, &bars[0]);
        GEMV_TRACE_X(vx[0][0].x | vx[XU - 1][NT - 1].w);
#pragma unroll
        for (int u = 0; u < XU; u++) {
            if (c0 + (int64_t)u * WARPS >= chunks) break; /* warp-uniform */
            const int64_t p = 4 * (c0 + (int64_t)u * WARPS) + t;
#pragma unroll
            for (int b = 0; b < UPC; b++) {
                /* a piece past the row (p differs within a quad) is zeros, never a skipped mma */
                const uint8_t *wr = sm + (16 * b + g) * pitch + 16 * p;
                const uint4    va = p < pieces ? *(const uint4 *)wr : zero, vb = p < pieces ? *(const uint4 *)(wr + 8 * pitch) : zero;
                const uint32_t a0[4] = {va.x, vb.x, va.y, vb.y}, a1[4] = {va.z, vb.z, va.w, vb.w};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    mma_e4m3(acc[b][nt], a0, vx[u][nt].x, vx[u][nt].y);
                    mma_e4m3(acc[b][nt], a1, vx[u][nt].z, vx[u][nt].w);
                }
            }
        }
    }
    for (int p = 0; p < np; p++) bulk_barrier_wait(&bars[p], 0); /* a warp without chunks must not reuse the buffer
                                                                    under a copy in flight */
    reduce_store<NT, UPC>(acc, (float *)sm, row0, N, M, scale, y);
    GEMV_TRACE(3, W, &bars[0]);
#else
    __trap();
#endif
}

// ---- W4A8: matrix codes of an int4-tc, int4-zp-tc or e4m3-block bank, x e4m3 [M][G 128] with xs (and xsum) ----

// Shared memory: codes [UPC][G][CH] | weight scales [G][UPC 16] (bf16 for int4-tc, else fp32) | int4-zp-tc: zero
// x scale [G][UPC 16] fp32 | x staged (w4a8_stage_bytes)
template <int WK> static __host__ __device__ inline int64_t w4a8_scale_bytes(void) { return WK == WK_INT4 ? 2 : 4; }
template <int WK> static __host__ __device__ inline int64_t w4a8_weight_bytes(int upc, int64_t G) {
    return upc * G * wk_shape<WK>::chunk + G * upc * 16 * w4a8_scale_bytes<WK>() * (WK == WK_INT4_ZP ? 2 : 1);
}

template <int NT, int UPC, int WK>
static __global__ __launch_bounds__(WARPS * 32, 2) void w4a8_prefetch_kernel(const gemv_w4a8_weights wt, int64_t N,
                                                                           int64_t rows_pad, int64_t G,
                                                                           const uint8_t *x, const float *xs,
                                                                           const float *xsum, int64_t ld_s, int64_t M,
                                                                           __nv_bfloat16 *y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t bar;
    constexpr int  NP = wk_shape<WK>::parts, CH = wk_shape<WK>::chunk;
    const int      warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int64_t  blk0 = (int64_t)blockIdx.x * UPC, row0 = blk0 * 16;
    const int      nb = (int)(rows_pad / 16 - blk0 < UPC ? rows_pad / 16 - blk0 : UPC); /* row blocks present */
    const int64_t  es = w4a8_scale_bytes<WK>(), sc_bytes = nb * 16 * es; /* one group's scales of the CTA's rows */
    uint8_t       *wsc = sm + UPC * G * CH, *wzs = wsc + G * UPC * 16 * es;
    uint8_t       *xsm = sm + w4a8_weight_bytes<WK>(UPC, G);
    const int64_t  ldsm = G * 128 + W4A8_PAD;
    float         *ssc = (float *)(xsm + NT * 8 * ldsm), *ssum = ssc + NT * 8 * G;
    GEMV_TRACE(0, wt.codes, &bar);
    if (warp == 0) { /* the codes of nb blocks are one run; the scales one short run per group */
        const int64_t code_bytes = nb * G * CH, piece = 16384;
        if (lane == 0)
            bulk_barrier_init(&bar),
                bulk_barrier_expect(&bar, (uint32_t)(code_bytes + G * sc_bytes * (WK == WK_INT4_ZP ? 2 : 1)));
        __syncwarp();
        const uint64_t policy = l2_evict_first();
        const uint8_t *codes = wt.codes + blk0 * G * CH;
        for (int64_t o = lane * piece; o < code_bytes; o += 32 * piece)
            bulk_load(sm + o, codes + o, (uint32_t)(code_bytes - o < piece ? code_bytes - o : piece), &bar, policy);
        const uint8_t *scales = WK == WK_INT4 ? (const uint8_t *)wt.ws : (const uint8_t *)wt.wsf;
        for (int64_t grp = lane; grp < G; grp += 32) {
            const int64_t at = (grp * rows_pad + row0) * es;
            bulk_load(wsc + grp * UPC * 16 * es, scales + at, (uint32_t)sc_bytes, &bar, policy);
            if (WK == WK_INT4_ZP) bulk_load(wzs + grp * UPC * 16 * 4, (const uint8_t *)wt.wzs + at, (uint32_t)sc_bytes, &bar, policy);
        }
    }
    pdl_launch_dependents();
    __syncthreads(); /* the barrier is initialised for everyone */
    pdl_wait();      /* from here on x may be read and y written */
    GEMV_TRACE(1, wt.codes, &bar);
    stage_w4a8_e4m3(x, xs, WK == WK_INT4_ZP ? xsum : NULL, ld_s, M, G, NT * 8, ldsm, xsm, ssc);
    bulk_barrier_wait(&bar, 0);
    GEMV_TRACE(2, wt.codes, &bar);

    float acc[UPC][NT][4];
#pragma unroll
    for (int b = 0; b < UPC; b++) zero_acc<NT>(acc[b]);
    for (int64_t grp = warp; grp < G; grp += WARPS)
#pragma unroll
        for (int b = 0; b < UPC; b++) {
            if (b >= nb) break;
            uint32_t w[4 * NP];
#pragma unroll
            for (int q = 0; q < NP; q++) {
                const uint4 v = *(const uint4 *)(sm + (b * G + grp) * CH + q * 512 + 16 * lane);
                w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
            }
            const int64_t s = grp * UPC * 16 + b * 16 + g;
            float         wsa, wsb, wza = 0.0f, wzb = 0.0f;
            if (WK == WK_INT4) {
                const __nv_bfloat16 *ws = (const __nv_bfloat16 *)wsc;
                wsa = __bfloat162float(ws[s]) * 512.0f, wsb = __bfloat162float(ws[s + 8]) * 512.0f;
            } else {
                wsa = ((const float *)wsc)[s], wsb = ((const float *)wsc)[s + 8];
            }
            if (WK == WK_INT4_ZP) wza = ((const float *)wzs)[s], wzb = ((const float *)wzs)[s + 8];
            w4a8_group_mma<NT, WK>(acc[b], w, xsm + grp * 128, ldsm, ssc, ssum, G, grp, wsa, wsb, wza, wzb);
        }
    reduce_store<NT, UPC>(acc, (float *)sm, row0, N, M, 1.0f, y); /* the scales are in the accumulator */
    GEMV_TRACE(3, wt.codes, &bar);
#else
    __trap();
#endif
}

// ---- host side ----

static int sm_count(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        FM_CUDA_CHECK(cudaGetDevice(&dev));
        FM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}

bool fm_cuda_gemv_prefetch_enabled(void) {
    static int on = -1;
    if (on < 0) {
        int         dev = 0, major = 0;
        const char *env = getenv("FP8MOE_GEMV_PREFETCH");
        FM_CUDA_CHECK(cudaGetDevice(&dev));
        FM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        on = major == 9 && !(env && strcmp(env, "0") == 0);
    }
    return on == 1;
}

// Row blocks per CTA so that the grid is one CTA per SM at most, or 0 when no UPC <= UPC_MAX fits the shared memory
static int blocks_per_cta(int64_t row_blocks, int64_t smem_per_block, int64_t smem_fixed) {
    const char   *env = getenv("FP8MOE_GEMV_UPC"); /* experiments only */
    const int64_t upc = env ? atoi(env) : (row_blocks + sm_count() - 1) / sm_count();
    if (upc > UPC_MAX || upc * smem_per_block + smem_fixed > FM_GEMV_PREFETCH_SMEM) return 0;
    return (int)upc;
}

// Dynamic shared memory above 48 KiB is allowed per kernel, once
static void allow_smem(const void *fn, bool *done) {
    if (*done) return;
    FM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, FM_GEMV_PREFETCH_SMEM));
    *done = true;
}

template <int NT, int UPC>
static void launch_w8a8(const uint8_t *W, int64_t N, int64_t ld, const float *ws, const uint8_t *x, int64_t M,
                        const float *xsc, __nv_bfloat16 *y, cudaStream_t s) {
    static bool   allowed = false;
    const void   *fn = (const void *)w8a8_prefetch_kernel<NT, UPC>;
    const int64_t weights = UPC * 16 * w8a8_pitch(ld), red = WARPS * UPC * NT * 4 * 32 * (int64_t)sizeof(float);
    allow_smem(fn, &allowed);
    int   depth = getenv("FP8MOE_GEMV_DEPTH") ? atoi(getenv("FP8MOE_GEMV_DEPTH")) : PIECES_MAX; /* experiments */
    void *args[] = {(void *)&W, (void *)&N, (void *)&ld, (void *)&ws, (void *)&x, (void *)&M, (void *)&xsc, (void *)&y, (void *)&depth};
    int64_t smem = weights > red ? weights : red;
    if (getenv("FP8MOE_GEMV_SMEM")) smem = atoi(getenv("FP8MOE_GEMV_SMEM")) > smem ? atoi(getenv("FP8MOE_GEMV_SMEM")) : smem; /* experiments */
    fm_cuda_launch_pdl(fn, dim3((unsigned)fm_ceil_div(N, 16 * UPC)), dim3(WARPS * 32), (size_t)smem, s, args);
    FM_LAUNCH_CHECK("w8a8_prefetch");
}

template <int NT>
static bool dispatch_w8a8(int upc, const uint8_t *W, int64_t N, int64_t ld, const float *ws, const uint8_t *x,
                          int64_t M, const float *xsc, __nv_bfloat16 *y, cudaStream_t s) {
    switch (upc) {
    case 1: launch_w8a8<NT, 1>(W, N, ld, ws, x, M, xsc, y, s); return true;
    case 2: launch_w8a8<NT, 2>(W, N, ld, ws, x, M, xsc, y, s); return true;
    case 3: launch_w8a8<NT, 3>(W, N, ld, ws, x, M, xsc, y, s); return true;
    case 4: launch_w8a8<NT, 4>(W, N, ld, ws, x, M, xsc, y, s); return true;
    default: return false;
    }
}

bool fm_cuda_w8a8_gemv_prefetch(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                int64_t M, const float *x_scale, __nv_bfloat16 *y, cudaStream_t s) {
    if (!fm_cuda_gemv_prefetch_enabled() || M < 1 || M > FM_GEMV_FP8_MAX_M || ld % 16) return false;
    const int upc = blocks_per_cta(fm_ceil_div(N, 16), 16 * w8a8_pitch(ld), 0);
    if (M <= 8) return dispatch_w8a8<1>(upc, W, N, ld, w_scale, x, M, x_scale, y, s);
    return dispatch_w8a8<2>(upc, W, N, ld, w_scale, x, M, x_scale, y, s);
}

template <int NT, int UPC, int WK>
static void launch_w4a8(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                        int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s) {
    static bool       allowed = false;
    const void       *fn = (const void *)w4a8_prefetch_kernel<NT, UPC, WK>;
    const int64_t     G = w->n_groups, rows_pad = w->rows_pad, rows = w->rows;
    const int64_t     sc0 = (int64_t)idx * G * rows_pad;
    gemv_w4a8_weights wt;
    wt.codes = (const uint8_t *)w->w + (int64_t)idx * (rows_pad / 16) * G * wk_shape<WK>::chunk;
    wt.ws = w->scales ? w->scales + sc0 : NULL, wt.wsf = w->fscales ? w->fscales + sc0 : NULL;
    wt.wzs = w->zscales ? w->zscales + sc0 : NULL;
    allow_smem(fn, &allowed);
    const int64_t used = w4a8_weight_bytes<WK>(UPC, G) + w4a8_stage_bytes(NT, G);
    const int64_t red = WARPS * UPC * NT * 4 * 32 * (int64_t)sizeof(float);
    int64_t       smem = used > red ? used : red;
    if (getenv("FP8MOE_GEMV_SMEM")) smem = atoi(getenv("FP8MOE_GEMV_SMEM")) > smem ? atoi(getenv("FP8MOE_GEMV_SMEM")) : smem; /* experiments */
    void *args[] = {(void *)&wt, (void *)&rows, (void *)&rows_pad, (void *)&G, (void *)&x,
                    (void *)&xs, (void *)&xsum, (void *)&ld_s, (void *)&M, (void *)&y};
    fm_cuda_launch_pdl(fn, dim3((unsigned)fm_ceil_div(rows_pad / 16, UPC)), dim3(WARPS * 32), (size_t)smem, s, args);
    FM_LAUNCH_CHECK("w4a8_prefetch");
}

template <int NT, int WK>
static bool dispatch_w4a8(int upc, const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs,
                          const float *xsum, int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s) {
    switch (upc) {
    case 1: launch_w4a8<NT, 1, WK>(w, idx, x, xs, xsum, ld_s, M, y, s); return true;
    case 2: launch_w4a8<NT, 2, WK>(w, idx, x, xs, xsum, ld_s, M, y, s); return true;
    case 3: launch_w4a8<NT, 3, WK>(w, idx, x, xs, xsum, ld_s, M, y, s); return true;
    case 4: launch_w4a8<NT, 4, WK>(w, idx, x, xs, xsum, ld_s, M, y, s); return true;
    default: return false;
    }
}

template <int WK>
static bool dispatch_kind(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                          int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s) {
    const int64_t G = w->n_groups, per_block = w4a8_weight_bytes<WK>(1, G);
    const int     nt = M <= 8 ? 1 : 2, upc = blocks_per_cta(w->rows_pad / 16, per_block, w4a8_stage_bytes(nt, G));
    if (nt == 1) return dispatch_w4a8<1, WK>(upc, w, idx, x, xs, xsum, ld_s, M, y, s);
    return dispatch_w4a8<2, WK>(upc, w, idx, x, xs, xsum, ld_s, M, y, s);
}

bool fm_cuda_w4a8_gemv_prefetch(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                                int64_t ld_s, int64_t M, __nv_bfloat16 *y, cudaStream_t s) {
    if (!fm_cuda_gemv_prefetch_enabled() || M < 1 || M > FM_GEMV_FP8_MAX_M) return false;
    if (w->fmt == FM_W_INT4_G128_TC) return dispatch_kind<WK_INT4>(w, idx, x, xs, xsum, ld_s, M, y, s);
    if (w->fmt == FM_W_INT4_ZP_TC) return dispatch_kind<WK_INT4_ZP>(w, idx, x, xs, xsum, ld_s, M, y, s);
    return dispatch_kind<WK_E4M3>(w, idx, x, xs, xsum, ld_s, M, y, s);
}
