// int4-p2 quantization at load on the device (--int4-scales p2 on the cuda backend): bit for bit the CPU's
// fm_int4_p2_quantize (src/quant/int4_p2.c), so that both backends load float weights into the same codes and scales
// (and the fold route, w4a8.kernel=fold, runs on float checkpoints and synthetic models). The search is the CPU's:
// 16 row scales, each group's exponent and squared error per candidate, the least total error wins.
//
// One warp per row; lane l takes groups l, l + 32, ... and walks each group's elements in the CPU's order (the
// squared errors are double sums in order: the same roundings, no FMA contraction: __dmul_rn / __dadd_rn), lane 0
// adds the groups' errors in group order, as the CPU does. Shared memory per warp: each group's amax and error.
// Load time only (Qwen3-30B-A3B: ~30 G weights, tens of ms of arithmetic per layer at most).
#include "backend/cuda/quantize.cuh"
extern "C" {
#include "quant/int4_p2.h"
}

#define P2_WARPS 4

__constant__ float p2_octave16[16] = FM_INT4_P2_OCTAVE16;

static __device__ float p2_load(const void *src, int dtype, int64_t i) {
    if (dtype == 0) return ((const float *)src)[i];
    if (dtype == 1) return __half2float(((const __half *)src)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
}

// the smallest bf16 value >= s (s > 0 finite), saturated at the largest finite bf16 (int4_p2.c's bf16_up)
static __device__ float p2_bf16_up(float s) {
    unsigned short b = __bfloat16_as_ushort(__float2bfloat16_rn(s));
    if (__bfloat162float(__ushort_as_bfloat16(b)) < s) b++;
    if ((b & 0x7FFFu) >= 0x7F80u) b = 0x7F7Fu;
    return __bfloat162float(__ushort_as_bfloat16(b));
}

static __device__ __forceinline__ float p2_code(float w, float step) {
    const float r = rintf(w / step); /* nearbyintf in the default rounding mode */
    return r < -7.0f ? -7.0f : r > 7.0f ? 7.0f : r;
}

// the squared error of a group's n weights (w: element 0 of the group in src) with step, NaN skipped
static __device__ double p2_group_sse(const void *src, int dtype, int64_t w, int64_t n, float step) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float v = p2_load(src, dtype, w + i);
        if (isnan(v)) continue;
        const double d = __dsub_rn(__dmul_rn((double)p2_code(v, step), (double)step), (double)v);
        e = __dadd_rn(e, __dmul_rn(d, d));
    }
    return e;
}

// int4_p2.c's group_k: the finest step s 2^k >= amax / 7, or one octave finer when that costs less
static __device__ int p2_group_k(const void *src, int dtype, int64_t w, int64_t n, float amax, float s, double *sse) {
    int k = 0;
    while (k > -FM_INT4_P2_KSPAN && ldexpf(s, k - 1) * 7.0f >= amax) k--;
    double e = p2_group_sse(src, dtype, w, n, ldexpf(s, k));
    if (k > -FM_INT4_P2_KSPAN) {
        const double e1 = p2_group_sse(src, dtype, w, n, ldexpf(s, k - 1));
        if (e1 < e) e = e1, k--;
    }
    *sse = e;
    return k;
}

static __global__ void quantize_int4_p2_kernel(const void *src, int dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                               int64_t ld, __nv_bfloat16 *scales, int64_t ng) {
    extern __shared__ double p2_sm[]; /* [P2_WARPS][ng] errors, then [P2_WARPS][ng] amaxes */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * P2_WARPS + warp, G = FM_INT4_P2_GROUP;
    if (r >= rows) return; /* the whole warp; no block barrier below */
    double *sse = p2_sm + warp * ng;
    float *gmax = (float *)(p2_sm + P2_WARPS * ng) + warp * ng;
    const int64_t row = r * cols;
    float amax_row = 0.0f;
    for (int64_t g = lane; g < ng; g += 32) { /* fmaxf skips NaN */
        const int64_t n = cols - g * G < G ? cols - g * G : G;
        float m = 0.0f;
        for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(p2_load(src, dtype, row + g * G + i)));
        gmax[g] = m, amax_row = fmaxf(amax_row, m);
    }
    for (int o = 16; o > 0; o >>= 1) amax_row = fmaxf(amax_row, __shfl_xor_sync(0xffffffffu, amax_row, o));
    uint8_t *q = dst + r * ld;
    if (!(amax_row > 0.0f) || isinf(amax_row)) { /* codes and scales 0 (the bank's codes are zeroed before) */
        for (int64_t g = lane; g < ng; g += 32) scales[r * ng + g] = __float2bfloat16_rn(0.0f);
        for (int64_t b = lane; b < (cols + 1) / 2; b += 32) q[b] = 0;
        return;
    }
    __syncwarp();
    float best_s = 0.0f;
    double best = INFINITY;
    for (int j = 0; j < 16; j++) {
        const float s = p2_bf16_up(amax_row / 7.0f * p2_octave16[j]);
        for (int64_t g = lane; g < ng; g += 32) {
            const int64_t n = cols - g * G < G ? cols - g * G : G;
            p2_group_k(src, dtype, row + g * G, n, gmax[g], s, &sse[g]);
        }
        __syncwarp();
        if (lane == 0) { /* in group order, stopping once worse than the best (int4_p2.c: the same winner) */
            double e = 0.0;
            for (int64_t g = 0; g < ng && e < best; g++) e = __dadd_rn(e, sse[g]);
            if (e < best) best = e, best_s = s;
        }
        __syncwarp();
    }
    best_s = __shfl_sync(0xffffffffu, best_s, 0);
    for (int64_t g = lane; g < ng; g += 32) {
        const int64_t n = cols - g * G < G ? cols - g * G : G;
        double e;
        const float step = ldexpf(best_s, p2_group_k(src, dtype, row + g * G, n, gmax[g], best_s, &e));
        scales[r * ng + g] = __float2bfloat16_rn(step); /* a bf16 value times a power of two: exact */
        for (int64_t i = 0; i < n; i += 2) {            /* two's complement nibbles, element 2i low (the row layout) */
            uint32_t b = 0;
            for (int64_t h = 0; h < 2 && i + h < n; h++) {
                const float v = p2_load(src, dtype, row + g * G + i + h);
                b |= ((uint32_t)(isnan(v) ? 0 : (int)p2_code(v, step)) & 0xFu) << (4 * h);
            }
            q[(g * G + i) / 2] = (uint8_t)b;
        }
    }
}

extern "C" void fm_cuda_quantize_int4_p2(const void *src, int src_dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                         int64_t ld, __nv_bfloat16 *scales, int64_t n_groups, cudaStream_t s) {
    if (rows == 0) return;
    const size_t smem = (size_t)(P2_WARPS * n_groups) * (sizeof(double) + sizeof(float));
    if (n_groups != fm_ceil_div(cols, FM_INT4_P2_GROUP) || smem > 48 * 1024) {
        fprintf(stderr, "fp8moe: quantize_int4_p2: %lld columns in %lld groups (at most %d columns)\n", (long long)cols,
                (long long)n_groups, 48 * 1024 / P2_WARPS / 12 * FM_INT4_P2_GROUP);
        abort();
    }
    quantize_int4_p2_kernel<<<(unsigned)fm_ceil_div(rows, P2_WARPS), 32 * P2_WARPS, smem, s>>>(
        src, src_dtype, rows, cols, dst, ld, scales, n_groups);
    FM_LAUNCH_CHECK("quantize_int4_p2");
}
