// What the decode-size FP8 GEMVs share (gemv_fp8.cu: weights streamed through registers; gemv_fp8_prefetch.cu:
// weights prefetched into shared memory before the PDL wait): the mma.sync fragment conventions of mma_e4m3.cuh,
// the staging of x in shared memory, one W4A8 (16-row block, 128-group) step, and the output rows.
#ifndef FM_CUDA_GEMV_FP8_COMMON_CUH
#define FM_CUDA_GEMV_FP8_COMMON_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define GEMV_WARPS 8  // warps per CTA, both kernel families
#define W4A8_PAD   16 // bytes after each staged x row: the 4-byte W4A8 fragment reads of the 8 rows then fall in
                      // different banks

template <int NT>
static __device__ __forceinline__ void zero_acc(float acc[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
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

static const int STAGE_UNROLL = 8; // loads in flight per thread while staging (a constant: #pragma unroll takes it)

// e4m3 rows x [M][ld_src] -> sm [R][ldsm] (rows past M, and bytes past ld_src, zero)
static __device__ void stage_copy(const uint8_t *x, int64_t M, int64_t ld_src, int R, int64_t ldsm, uint8_t *sm) {
    const int64_t per_row = ldsm / 16, n = R * per_row;
#pragma unroll STAGE_UNROLL
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t r = i / per_row, c = (i % per_row) * 16;
        *(uint4 *)(sm + r * ldsm + c) = r < M && c < ld_src ? __ldcg((const uint4 *)(x + r * ld_src + c)) : make_uint4(0, 0, 0, 0);
    }
}

// W4A8 from e4m3 x [M][G 128] with scales xs[grp * ld_s + row] (and, for int4-zp banks, the group sums xsum laid
// out alike, staged after the scales)
static __device__ void stage_w4a8_e4m3(const uint8_t *x, const float *xs, const float *xsum, int64_t ld_s, int64_t M,
                                       int64_t G, int R, int64_t ldsm, uint8_t *sm, float *ssc) {
    /* each thread's first scale (and sum) is loaded before the rows, so that the two round trips to L2 overlap */
    const int64_t i0 = threadIdx.x, r0 = i0 / G, g0 = i0 % G;
    const bool    first = i0 < R * G && r0 < M;
    const float   sc0 = first ? __ldcg(xs + g0 * ld_s + r0) : 0.0f, sum0 = first && xsum ? __ldcg(xsum + g0 * ld_s + r0) : 0.0f;
    stage_copy(x, M, G * 128, R, ldsm, sm);
    if (i0 < R * G) {
        ssc[i0] = sc0;
        if (xsum) ssc[R * G + i0] = sum0;
    }
    for (int64_t i = i0 + blockDim.x; i < R * G; i += blockDim.x) {
        const int64_t r = i / G, grp = i % G;
        ssc[i] = r < M ? __ldcg(xs + grp * ld_s + r) : 0.0f;
        if (xsum) ssc[R * G + i] = r < M ? __ldcg(xsum + grp * ld_s + r) : 0.0f;
    }
    __syncthreads();
}

// Bytes of dynamic shared memory x takes when staged for W4A8: NT 8 rows of G 128 + W4A8_PAD e4m3, then their
// scales [NT 8][G] fp32, then (int4-zp-tc) their group sums alike
static inline __host__ __device__ int64_t w4a8_stage_bytes(int NT, int64_t G) {
    return NT * 8 * (G * 128 + W4A8_PAD) + 2 * NT * 8 * G * (int64_t)sizeof(float);
}

// The weights of a W4A8 GEMV: one matrix of an int4-tc, int4-zp-tc or e4m3-block bank (w4a8_layout.cuh)
typedef struct gemv_w4a8_weights {
    const uint8_t       *codes;
    const __nv_bfloat16 *ws;  // int4-tc: bf16 scales [group][rows_pad]
    const float         *wsf; // int4-zp-tc (x 512) and e4m3-block: fp32 scales, same layout
    const float         *wzs; // int4-zp-tc: zero x scale
} gemv_w4a8_weights;

// One 16-row block and one 128-group into acc: w the lane's 4 NP words of the chunk (w4a8_layout.cuh), xb the
// staged x at the group (row 0, byte 0), ssc / ssum the staged scales and sums [NT 8][G], wsa / wsb the weight
// scales of rows g and g + 8 (x 512 for int4-tc), wza / wzb (int4-zp-tc) their zero x scale. Per group a partial
// is promoted into the accumulator with weight scale x activation scale, as the grouped kernel and the CPU
// emulation do; int4-zp-tc adds -(zero x scale) x the group sum of x.
template <int NT, int WK>
static __device__ __forceinline__ void w4a8_group_mma(float acc[NT][4], const uint32_t *w, const uint8_t *xb,
                                                      int64_t ldsm, const float *ssc, const float *ssum, int64_t G,
                                                      int64_t grp, float wsa, float wsb, float wza, float wzb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        /* step s: words 2s and 2s + 1 hold k = 32 s + 4 t + 0..3 and 32 s + 16 + 4 t + 0..3 of the group; b0 and
           b1 are the same bytes of activation row 8 nt + g */
        const uint8_t *xr = xb + (nt * 8 + g) * ldsm + 4 * t;
        float          part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < 4; s++) {
            uint32_t a[4];
            weight_fragment<WK>(w, s, a);
            mma_e4m3(part, a, *(const uint32_t *)(xr + 32 * s), *(const uint32_t *)(xr + 32 * s + 16));
        }
        const float x0 = ssc[(nt * 8 + 2 * t) * G + grp], x1 = ssc[(nt * 8 + 2 * t + 1) * G + grp];
        acc[nt][0] = fmaf(part[0], wsa * x0, acc[nt][0]);
        acc[nt][1] = fmaf(part[1], wsa * x1, acc[nt][1]);
        acc[nt][2] = fmaf(part[2], wsb * x0, acc[nt][2]);
        acc[nt][3] = fmaf(part[3], wsb * x1, acc[nt][3]);
        if (WK == WK_INT4_ZP) {
            const float s0 = ssum[(nt * 8 + 2 * t) * G + grp], s1 = ssum[(nt * 8 + 2 * t + 1) * G + grp];
            acc[nt][0] = fmaf(-wza, s0, acc[nt][0]);
            acc[nt][1] = fmaf(-wza, s1, acc[nt][1]);
            acc[nt][2] = fmaf(-wzb, s0, acc[nt][2]);
            acc[nt][3] = fmaf(-wzb, s1, acc[nt][3]);
        }
    }
}

#endif
