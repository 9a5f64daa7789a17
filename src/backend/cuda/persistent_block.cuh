// The pieces of the persistent decode blocks (moe_decode_block.cu, attn_decode_block.cu): a grid barrier, a row
// quantized into shared memory, one warp's share of a decode GEMV's CTA and the slices' sum. Both kernels run CTAs of
// PB_THREADS threads (the decode GEMVs' 8 warps, so a "virtual CTA" of a GEMV is one of the GEMV's CTAs), at most as
// many as are resident at once.
#ifndef FM_CUDA_PERSISTENT_BLOCK_CUH
#define FM_CUDA_PERSISTENT_BLOCK_CUH

#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define PB_THREADS 256 /* the decode GEMVs' CTA (8 warps) = NORM_THREADS */
#define PB_WARPS (PB_THREADS / 32)
#define PB_U 4 /* 128-groups of codes a warp has in flight (8 spilled under 128 registers) */

// A sense-reversing grid barrier on two zeroed device words (bar[0] arrivals, bar[1] the generation), as the W8A8
// quantizer's (linear_w8a8.cu): the last CTA to arrive clears the count and advances the generation. Every CTA is
// resident: the grid is sized by the occupancy calculator, and the next kernel launches only once every CTA has
// passed its PDL wait. Thread 0 arrives with acquire-release semantics and polls with acquire loads (no full fence):
// writes before the barrier are visible to reads through L2 (ld.cg) after it.
static __device__ __forceinline__ void grid_barrier(unsigned *bar) {
    __syncthreads(); /* the CTA's writes happen before thread 0's release below (cumulativity) */
    if (threadIdx.x == 0) {
        unsigned gen, old;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
        if (old == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + 1) : "memory");
        } else {
            unsigned now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar + 1) : "memory");
            } while (now == gen);
        }
    }
    __syncthreads();
}

// The same meeting on a monotonic 64-bit count (route moe.block_barrier=count): thread 0 of each CTA adds one with
// acquire-release semantics; the CTA whose add completes a whole grid goes on, the others poll with acquire loads
// until the count reaches that multiple. No last arriver clears a count and releases a generation after its own
// atom has returned, so the others leave an L2 round trip earlier. The count must be a multiple of the grid at every
// launch's start: the word is its grid size's own (the launcher's table, fm_moe_block_args.counts), and every barrier
// adds a whole grid. 64 bits: no wrap in practice.
static __device__ __forceinline__ void grid_barrier_count(unsigned long long *cnt) {
    __syncthreads(); /* the CTA's writes happen before thread 0's release below (cumulativity) */
    if (threadIdx.x == 0) {
        unsigned long long old, now;
        asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(cnt) : "memory");
        const unsigned long long n = gridDim.x, target = old - old % n + n;
        if (old + 1 != target) {
            do {
                asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(cnt) : "memory");
            } while (now < target);
        }
    }
    __syncthreads();
}

// A row of K bf16 values (L2: from global memory through L2, written by another CTA of this grid; else a row in
// shared memory) into e4m3 codes q [G 128] and scales qs [G] in shared memory, a warp a group, as
// quantize_rows_kernel (and the small dispatch) quantize it. Ends with __syncthreads.
template <bool L2>
static __device__ void quantize_row_smem(const __nv_bfloat16 *x, int64_t K, int64_t G, uint8_t *q, float *qs) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t grp = warp; grp < G; grp += PB_WARPS) {
        float v[4], scale, sum;
        if (L2) load_group_cg(x, K, grp, v);
        else load_group(x, K, grp, v);
        const uint32_t word = quantize_group<false>(v, K, grp, &scale, &sum);
        *(uint32_t *)(q + grp * 128 + lane * 4) = word;
        if (lane == 0) qs[grp] = scale;
    }
    __syncthreads();
}

// A bf16 row of K values (K % 8 == 0, K <= 8 PB_THREADS U) written by another CTA or kernel, through L2 into
// shared memory xs with all of a thread's 16-byte loads in flight at once (one round trip, where
// quantize_row_smem<true> takes one a warp's group round); ends with __syncthreads
template <int U>
static __device__ __forceinline__ void stage_row_cg(const __nv_bfloat16 *x, int64_t K, __nv_bfloat16 *xs) {
    const int64_t chunks = K / 8;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t c = threadIdx.x + (int64_t)u * PB_THREADS;
        if (c < chunks) v[u] = __ldcg((const uint4 *)x + c);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t c = threadIdx.x + (int64_t)u * PB_THREADS;
        if (c < chunks) ((uint4 *)xs)[c] = v[u];
    }
    __syncthreads();
}

// The bytes a warp's prefetched round takes in shared memory (warp_round_prefetch): PB_U groups of 1 KB of codes
// (2 x 16 bytes a lane), then PB_U x 32 bytes of weight scales (the row block's 16 bf16 scales of each group)
#define PB_ROUND_BYTES (PB_U * 1024 + PB_U * 32)

// cp.async of a warp's first round of warp_rows (row block blk, groups s, s + KS, ...) into dst (PB_ROUND_BYTES,
// 16-byte aligned): issued before the data it multiplies exists (the weights are no kernel's output), waited for by
// warp_rows. Groups past G and a block past the bank are zero-filled.
static __device__ __forceinline__ void warp_round_prefetch(const uint8_t *codes, const __nv_bfloat16 *scales,
                                                           int64_t rows_pad, int64_t G, int64_t blk, int s, int KS,
                                                           uint8_t *dst) {
    const int lane = threadIdx.x & 31;
    const bool live = blk * 16 < rows_pad;
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
#pragma unroll
    for (int u = 0; u < PB_U; u++) {
        const int64_t grp = s + (int64_t)u * KS;
        const bool in = live && grp < G;
        const uint8_t *src = codes + (in ? blk * G * FM_TC_CHUNK + grp * FM_TC_CHUNK : 0) + 16 * lane;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + u * 1024 + 16 * lane), "l"(src),
                     "r"(in ? 16 : 0)
                     : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + u * 1024 + 512 + 16 * lane),
                     "l"(src + 512), "r"(in ? 16 : 0)
                     : "memory");
        if (lane < 2) { /* the 16 rows' scales of the group: 32 bytes */
            const __nv_bfloat16 *ss = scales + (in ? grp * rows_pad + blk * 16 : 0) + 8 * lane;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + PB_U * 1024 + u * 32 + 16 * lane),
                         "l"(ss), "r"(in ? 16 : 0)
                         : "memory");
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// One warp's share of a decode GEMV's CTA for one token (gemv_fp8.cu, w4a8_gemv_kernel at NT = 1, WK_INT4): row
// block blk of a matrix (codes, scales at its start), the groups s, s + KS, ... of K, against the token's e4m3 row q
// and scales qs in shared memory. acc: the C fragment; lanes with t = 0 hold the token's rows g (acc[0]) and g + 8
// (acc[2]). The chain per element is the GEMV's: acc = fma(partial, (weight scale x 512) x activation scale, acc)
// over the slice's groups in order; the activation rows 1..7 of the n8 tile are zeros, as the GEMV's padding rows.
// pre: NULL, or the first round, prefetched by warp_round_prefetch (the warp's only cp.async group in flight).
static __device__ __forceinline__ void warp_rows(const uint8_t *codes, const __nv_bfloat16 *scales, int64_t rows_pad,
                                                 int64_t G, int64_t blk, int s, int KS, const uint8_t *q,
                                                 const float *qs, float acc[4], const uint8_t *pre = NULL) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    const bool live = blk * 16 < rows_pad;
    const uint8_t *wq = codes + blk * G * FM_TC_CHUNK + 16 * lane;
    const __nv_bfloat16 *ws = scales + blk * 16 + g;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (pre) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncwarp(); /* the scales were copied by lanes 0 and 1 */
    }
    for (int64_t g0 = s; g0 < G; g0 += (int64_t)KS * PB_U) {
        uint4 v[PB_U][2];
        float wsa[PB_U], wsb[PB_U];
        if (pre && g0 == s) {
#pragma unroll
            for (int u = 0; u < PB_U; u++) {
                v[u][0] = *(const uint4 *)(pre + u * 1024 + 16 * lane);
                v[u][1] = *(const uint4 *)(pre + u * 1024 + 512 + 16 * lane);
                const __nv_bfloat16 *ss = (const __nv_bfloat16 *)(pre + PB_U * 1024 + u * 32);
                wsa[u] = __bfloat162float(ss[g]) * 512.0f, wsb[u] = __bfloat162float(ss[g + 8]) * 512.0f;
            }
        } else {
#pragma unroll
            for (int u = 0; u < PB_U; u++) {
                const int64_t grp = g0 + (int64_t)u * KS;
                const bool in = live && grp < G;
                v[u][0] = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK)) : zero;
                v[u][1] = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK + 512)) : zero;
                wsa[u] = in ? __bfloat162float(ws[grp * rows_pad]) * 512.0f : 0.0f;
                wsb[u] = in ? __bfloat162float(ws[grp * rows_pad + 8]) * 512.0f : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < PB_U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            if (grp >= G) break;
            const uint32_t w[8] = {v[u][0].x, v[u][0].y, v[u][0].z, v[u][0].w,
                                   v[u][1].x, v[u][1].y, v[u][1].z, v[u][1].w};
            const uint8_t *xb = q + grp * 128 + 4 * t;
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s4 = 0; s4 < 4; s4++) {
                uint32_t a[4];
                weight_fragment<WK_INT4>(w, s4, a);
                const uint32_t b0 = g == 0 ? *(const uint32_t *)(xb + 32 * s4) : 0u,
                               b1 = g == 0 ? *(const uint32_t *)(xb + 32 * s4 + 16) : 0u;
                mma_e4m3(part, a, b0, b1);
            }
            const float x0 = t == 0 ? qs[grp] : 0.0f; /* activation row 2t; row 2t + 1 is a zero row */
            acc[0] = fmaf(part[0], wsa[u] * x0, acc[0]);
            acc[1] = fmaf(part[1], wsa[u] * 0.0f, acc[1]);
            acc[2] = fmaf(part[2], wsb[u] * x0, acc[2]);
            acc[3] = fmaf(part[3], wsb[u] * 0.0f, acc[3]);
        }
    }
}

// The KS slices of each row block summed in slice order (the GEMV's reduce_slices); true for the warps that then
// hold their row block's sums (slice 0). Every thread calls it.
static __device__ __forceinline__ bool reduce_slices_smem(float acc[4], int KS, float (*red)[4][32]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (warp % KS) return false;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = red[warp][i][lane];
        for (int j = 1; j < KS; j++) a += red[warp + j][i][lane];
        acc[i] = a;
    }
    return true;
}

#endif
