// A grid's last CTA finishing the rows the grid wrote (decode.fused): a kernel that writes y [M][N] in many CTAs
// (the W8A8 decode GEMV) counts its CTAs out on a device counter, and the last one adds y into the residual and
// normalises it, the work of the add_rmsnorm launch that followed it.
//
// Every CTA writes a slice of the columns of every row, so no row is complete before the last CTA arrives; that CTA
// (NORM_THREADS threads, 8 warps) then finishes all the rows at once instead of one after another. Tiles: a pass
// takes 8 / P rows, P warps each (P = 8 at M = 1, 4 at M = 2, 2 at M = 3 or 4, 1 from 5 rows on; at least J, below);
// warp r takes row r / P of the pass. Layout: a row is add_rmsnorm_kernel's (norm_row.cuh): thread t of its block
// of NORM_THREADS owns the 8-element chunks t and t + NORM_THREADS. Here lane l of a warp plays the block's threads
// 32 w + l for the "virtual warps" w = q, q + P, ... (q = r mod P; 8 / P of them), holding their chunks in registers
// (at most 8 a lane: J = 1 chunk a thread for N <= 2048, J = 2 up to 4096, where P >= 2), sums each thread's squares
// in that thread's order, and runs the butterfly of block_sum's first stage for each virtual warp (its lanes are
// block_sum's lanes). The 8 warp sums of a row meet in shared memory (part[row][w]: one barrier per pass), and every
// warp of the row runs block_sum's second stage on them (the butterfly with zeros past lane 8). So each row gets
// the two kernels' additions in the same tree: the result is theirs bit for bit.
// Why it is parallel now: the tail it replaces walked the M rows one after another with the whole CTA (B = 8: 8 round
// trips to L2 and 16 barriers after the grid's last store, +3.3 % a decode step on the H200: bench/NOTES.md
// "twenty-second session"); here a pass issues every load of its rows (residual, y, norm weights) before the first
// use, so M <= 8 rows of up to 2048 are one pass: one round trip to L2 and two barriers. Bytes through the one SM:
// 4 N read and 4 N written a row, plus the weights (2 N a warp, mostly from L1): 64 + 64 KB at M = 8, N = 2048.
#ifndef FM_CUDA_ROW_TAIL_CUH
#define FM_CUDA_ROW_TAIL_CUH

#include "backend/cuda/norm_row.cuh"

typedef struct fm_row_tail {
    unsigned *counter; // NULL: no tail; else a device word, zero before the launch, left zero after it
    __nv_bfloat16 *acc;
    const __nv_bfloat16 *norm;
    float eps;
    __nv_bfloat16 *out;
} fm_row_tail;

// The shapes a tail takes: rows of a multiple of 8 up to the norms' 16-byte limit, 16-byte aligned buffers.
static inline bool fm_row_tail_takes(int64_t N, const void *y, const void *acc, const void *norm, const void *out) {
    return N % 8 == 0 && N <= 8 * NORM_CHUNKS * NORM_THREADS &&
           (((uintptr_t)y | (uintptr_t)acc | (uintptr_t)norm | (uintptr_t)out) & 15) == 0;
}

#define TAIL_VWARPS (NORM_THREADS / 32) // the warps of add_rmsnorm_kernel's block, and of the tail's CTA

// block_sum's butterfly within a warp (its first stage, and its second over the warps' sums)
static __device__ __forceinline__ float warp_butterfly(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// acc[m] += y[m], out[m] = rmsnorm(acc[m]) * norm for the M rows of N, by the whole CTA (TAIL_VWARPS warps), the rows
// in passes of TAIL_VWARPS / P, P warps a row (the file's comment). J: the chunks a thread of the norm's block owns.
// Both are constants, so that a lane's TAIL_VWARPS / P x J chunks are one base address and immediate offsets (a
// runtime P kept an address per chunk and spilled). Out of line: inlined, it spilled under the GEMV's 128-register
// bound (launch_bounds of 2 CTAs an SM); alone it needs no spill. part: the CTA's [row of the pass][virtual warp],
// block_sum's shared words.
template <int J, int P>
static __device__ __noinline__ void tail_rows(const fm_row_tail tl, const __nv_bfloat16 *y, int64_t N, int64_t M,
                                              float (*part)[TAIL_VWARPS]) {
    static_assert(TAIL_VWARPS % P == 0 && P >= J && (TAIL_VWARPS / P) * J <= 8, "at most 8 chunks a lane");
    const int V = TAIL_VWARPS / P; /* virtual warps a lane plays, and rows a pass */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = warp % P, rl = warp / P;
    const int c0 = 8 * (lane + 32 * q); /* chunk (i, j) of the lane: thread 32 (q + P i) + lane's j-th */
    for (int64_t m0 = 0; m0 < M; m0 += V) {
        const int64_t m = m0 + rl, row = (m < M ? m : 0) * N; /* a warp past the M rows only meets the barriers */
        const bool live = m < M;
        __nv_bfloat16 *ar = tl.acc + row + c0, *outr = tl.out + row + c0;
        const __nv_bfloat16 *yr = y + row + c0, *wr = tl.norm + c0;
        uint4 sum[V][J], wv[V][J]; /* the residual, then the rounded sum as stored; the norm weights */
        if (live) {
            uint4 yv[V][J]; /* all three in registers: at most 96 a lane, no spill under the GEMV's 128 */
#pragma unroll
            for (int i = 0; i < V; i++)
#pragma unroll
                for (int j = 0; j < J; j++) { /* every load before the first use: one round trip */
                    const int d = 8 * 32 * P * i + j * 8 * NORM_THREADS;
                    if (c0 + d >= N) continue;
                    sum[i][j] = __ldcg((const uint4 *)(ar + d)); /* rows other CTAs wrote: through L2 */
                    yv[i][j] = __ldcg((const uint4 *)(yr + d));
                    wv[i][j] = *(const uint4 *)(wr + d);
                }
            float ss[V];
#pragma unroll
            for (int i = 0; i < V; i++) {
                ss[i] = 0.0f; /* thread 32 (q + P i) + lane's, in its order */
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int d = 8 * 32 * P * i + j * 8 * NORM_THREADS;
                    if (c0 + d >= N) continue;
                    float v[8], xv[8];
                    unpack8(sum[i][j], v), unpack8(yv[i][j], xv);
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        v[e] = act_round(v[e] + xv[e], ar); /* the sum as stored */
                        ss[i] += v[e] * v[e];
                    }
                    sum[i][j] = pack8(v);
                    *(uint4 *)(ar + d) = sum[i][j];
                }
            }
#pragma unroll
            for (int i = 0; i < V; i++) {
                const float v = warp_butterfly(ss[i]);
                if (lane == 0) part[rl][q + P * i] = v;
            }
        }
        __syncthreads();
        if (live) {
            const float total = __shfl_sync(0xffffffffu, warp_butterfly(lane < TAIL_VWARPS ? part[rl][lane] : 0.0f), 0);
            const float inv = 1.0f / sqrtf(total / (float)N + tl.eps);
#pragma unroll
            for (int i = 0; i < V; i++)
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int d = 8 * 32 * P * i + j * 8 * NORM_THREADS;
                    if (c0 + d >= N) continue;
                    float v[8], w[8];
                    unpack8(sum[i][j], v), unpack8(wv[i][j], w);
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = w[e] * (v[e] * inv);
                    store8f(outr + d, v);
                }
        }
        __syncthreads(); /* part is read by every warp of the pass before the next pass writes it */
    }
}

// P: as many warps a row as leave every row of M <= 8 in one pass, at least J (a lane's 8 chunks)
static __device__ void tail_rows_add_rmsnorm(const fm_row_tail &tl, const __nv_bfloat16 *y, int64_t N, int64_t M) {
    __shared__ float part[TAIL_VWARPS][TAIL_VWARPS];
    const int J = N <= 8 * NORM_THREADS ? 1 : NORM_CHUNKS;
    int P = TAIL_VWARPS;
    while (P > J && P * M > TAIL_VWARPS) P >>= 1;
    if (J == 1) {
        if (P == 8) tail_rows<1, 8>(tl, y, N, M, part);
        else if (P == 4) tail_rows<1, 4>(tl, y, N, M, part);
        else if (P == 2) tail_rows<1, 2>(tl, y, N, M, part);
        else tail_rows<1, 1>(tl, y, N, M, part);
    } else {
        if (P == 8) tail_rows<NORM_CHUNKS, 8>(tl, y, N, M, part);
        else if (P == 4) tail_rows<NORM_CHUNKS, 4>(tl, y, N, M, part);
        else tail_rows<NORM_CHUNKS, 2>(tl, y, N, M, part);
    }
}

// Called by every thread of every CTA (NORM_THREADS threads) after its stores of y: the last CTA to arrive runs the
// tail and resets the counter (a captured graph replays the launch). The fence before the count makes each CTA's y
// visible to it.
static __device__ void tail_last_cta(const fm_row_tail &tl, const __nv_bfloat16 *y, int64_t N, int64_t M) {
    __shared__ unsigned arrived;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) arrived = atomicAdd(tl.counter, 1u);
    __syncthreads();
    if (arrived != gridDim.x - 1) return;
    __threadfence();
    tail_rows_add_rmsnorm(tl, y, N, M);
    if (threadIdx.x == 0) *tl.counter = 0u;
}

#endif
