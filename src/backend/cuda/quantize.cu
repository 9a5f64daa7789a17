// Load-time weight conversion (see quantize.cuh). bf16: a grid-stride loop over elements. int4: one warp per
// (row, 128-group): each lane takes 4 consecutive elements, the warp reduces the group's amax, and each lane
// writes its 2 packed bytes. Runs once per weight at load; bound by the upload, not by these kernels.
#include <cuda_fp16.h>

#include "backend/cuda/quantize.cuh"

static __device__ float load_elem(const void *src, int dtype, int64_t i) {
    if (dtype == 0) return ((const float *)src)[i];
    if (dtype == 1) return __half2float(((const __half *)src)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
}

template <typename A>
static __global__ void convert_kernel(const void *src, int dtype, int64_t rows, int64_t cols, A *dst, int64_t ld) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (int64_t)gridDim.x * blockDim.x)
        act_store(&dst[(i / cols) * ld + i % cols], load_elem(src, dtype, i));
}

template <typename A>
static void convert(const void *src, int src_dtype, int64_t rows, int64_t cols, A *dst, int64_t ld, cudaStream_t s) {
    const int64_t blocks = fm_ceil_div(rows * cols, 256);
    if (blocks == 0) return;
    convert_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(src, src_dtype, rows, cols, dst, ld);
    FM_LAUNCH_CHECK("convert");
}

extern "C" void fm_cuda_convert_bf16(const void *src, int src_dtype, int64_t rows, int64_t cols, __nv_bfloat16 *dst,
                                     int64_t ld, cudaStream_t s) {
    convert(src, src_dtype, rows, cols, dst, ld, s);
}

extern "C" void fm_cuda_convert_f32(const void *src, int src_dtype, int64_t rows, int64_t cols, float *dst, int64_t ld,
                                    cudaStream_t s) {
    convert(src, src_dtype, rows, cols, dst, ld, s);
}

// the smallest bf16 >= s (s >= 0), saturated at the largest finite bf16 (as scale_round_up in int4.c)
static __device__ __nv_bfloat16 scale_round_up(float s) {
    __nv_bfloat16 h = __float2bfloat16_rn(s);
    unsigned short b = __bfloat16_as_ushort(h);
    if (__bfloat162float(h) < s) b++;
    if ((b & 0x7FFFu) >= 0x7F80u) b = 0x7F7Fu;
    return __ushort_as_bfloat16(b);
}

static __global__ void quantize_int4_kernel(const void *src, int dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                            int64_t ld, __nv_bfloat16 *scales, int64_t n_groups) {
    const int lane = threadIdx.x & 31;
    const int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); /* (row, group) */
    if (task >= rows * n_groups) return;
    const int64_t r = task / n_groups, g = task % n_groups;
    const int64_t k0 = g * 128 + lane * 4;
    float v[4];
    float amax = 0.0f;
    for (int i = 0; i < 4; i++) {
        v[i] = k0 + i < cols ? load_elem(src, dtype, r * cols + k0 + i) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i])); /* fmaxf skips NaN, as the CPU codec */
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const __nv_bfloat16 sb = scale_round_up(amax / 7.0f);
    const float sc = __bfloat162float(sb);
    if (lane == 0) scales[r * n_groups + g] = sb;
    uint8_t q[4];
    for (int i = 0; i < 4; i++) {
        float x = (sc == 0.0f || isnan(v[i])) ? 0.0f : rintf(v[i] / sc);
        x = fminf(fmaxf(x, -8.0f), 7.0f);
        q[i] = (uint8_t)((int)x & 0xF);
    }
    if (k0 < cols) {
        uint8_t *row = dst + r * ld + k0 / 2;
        row[0] = (uint8_t)(q[0] | (q[1] << 4));
        if (k0 + 2 < cols) row[1] = (uint8_t)(q[2] | (q[3] << 4));
    }
}

extern "C" void fm_cuda_quantize_int4(const void *src, int src_dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                      int64_t ld, __nv_bfloat16 *scales, int64_t n_groups, cudaStream_t s) {
    const int64_t tasks = rows * n_groups, warps_per_block = 8;
    if (tasks == 0) return;
    quantize_int4_kernel<<<(unsigned)fm_ceil_div(tasks, warps_per_block), 32 * warps_per_block, 0, s>>>(
        src, src_dtype, rows, cols, dst, ld, scales, n_groups);
    FM_LAUNCH_CHECK("quantize_int4");
}

static __global__ void synth_kernel(fm_synth s, int64_t first, int64_t n, int64_t cols, float *dst) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = fm_synth_value(&s, first + i, cols);
}

extern "C" void fm_cuda_synth_f32(const fm_synth *s, int64_t first, int64_t n, int64_t cols, float *dst,
                                  cudaStream_t stream) {
    const int64_t blocks = fm_ceil_div(n, 256);
    if (n == 0) return;
    synth_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(*s, first, n, cols, dst);
    FM_LAUNCH_CHECK("synth");
}
