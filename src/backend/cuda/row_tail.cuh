// A grid's last CTA finishing the rows the grid wrote (decode.fused): a kernel that writes y [M][N] in many CTAs
// (the W8A8 decode GEMV) counts its CTAs out on a device counter, and the last one adds y into the residual and
// normalises it, the work of the add_rmsnorm launch that followed it. That CTA runs add_rmsnorm_kernel's arithmetic
// (norm_row.cuh: 16-byte chunks, NORM_THREADS threads, the same rounding and order of summation), so the result is
// the two kernels' bit for bit. It costs one CTA's pass over M rows (a few KB each) after the grid's last store,
// against a dependent launch.
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

// acc[m] += y[m], out[m] = rmsnorm(acc[m]) * norm for the M rows of N: the whole CTA (NORM_THREADS threads), row by row
static __device__ void tail_rows_add_rmsnorm(const fm_row_tail &tl, const __nv_bfloat16 *y, int64_t N, int64_t M) {
    float wv[NORM_CHUNKS][8];
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < N) load8f(tl.norm + c, wv[j]);
    }
    for (int64_t m = 0; m < M; m++) {
        __nv_bfloat16 *ar = tl.acc + m * N;
        const __nv_bfloat16 *yr = y + m * N;
        float v[NORM_CHUNKS][8], xv[NORM_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
            if (c < N) load8f_cg(ar + c, v[j]), load8f_cg(yr + c, xv[j]);
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
            if (c >= N) continue;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[j][e] = act_round(v[j][e] + xv[j][e], ar); /* the sum as stored */
                ss += v[j][e] * v[j][e];
            }
            store8f(ar + c, v[j]);
        }
        const float inv = 1.0f / sqrtf(block_sum(ss) / (float)N + tl.eps);
        __syncthreads(); /* block_sum's shared word is read by every thread before the next row writes it */
        norm_store_chunks(v, wv, inv, tl.out + m * N, N);
    }
}

// Called by every thread of every CTA after its stores of y: the last CTA to arrive runs the tail and resets the
// counter (a captured graph replays the launch). The fence before the count makes each CTA's y visible to it.
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
