// Row-wise and element-wise ops (see elementwise.cuh). Grid-stride loops over elements; RMSNorm is one block
// of 256 threads per row with a shared-memory reduction.
#include "backend/cuda/elementwise.cuh"

static __global__ void embed_kernel(const __nv_bfloat16 *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H,
                                    __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        out[i] = table[(int64_t)ids[t] * ld + c];
    }
}

static int grid_for(int64_t n) {
    const int64_t blocks = fm_ceil_div(n, 256);
    return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

extern "C" void fm_cuda_embed(const __nv_bfloat16 *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H,
                              __nv_bfloat16 *out, cudaStream_t s) {
    embed_kernel<<<grid_for(T * H), 256, 0, s>>>(table, ld, ids, T, H, out);
    FM_LAUNCH_CHECK("embed");
}

// one block per row: sum of squares in fp32, then w * (x * inv)
static __global__ void rmsnorm_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int64_t dim, float eps,
                                      __nv_bfloat16 *out) {
    const __nv_bfloat16 *xr = x + blockIdx.x * dim;
    __nv_bfloat16       *yr = out + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) part[0] = ss;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(part[0] / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = __float2bfloat16_rn(__bfloat162float(w[i]) * (__bfloat162float(xr[i]) * inv));
}

extern "C" void fm_cuda_rmsnorm(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int64_t rows, int64_t dim, float eps,
                                __nv_bfloat16 *out, cudaStream_t s) {
    if (rows <= 0) return;
    if (rows > INT32_MAX) { fprintf(stderr, "fp8moe: rmsnorm: %lld rows is too many\n", (long long)rows); abort(); }
    rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>(x, w, dim, eps, out);
    FM_LAUNCH_CHECK("rmsnorm");
}

static __global__ void swiglu_kernel(const __nv_bfloat16 *gu, int64_t rows, int64_t I, __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * I; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / I, c = i % I;
        const float g = __bfloat162float(gu[r * 2 * I + c]), u = __bfloat162float(gu[r * 2 * I + I + c]);
        out[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

extern "C" void fm_cuda_swiglu(const __nv_bfloat16 *gu, int64_t rows, int64_t I, __nv_bfloat16 *out, cudaStream_t s) {
    swiglu_kernel<<<grid_for(rows * I), 256, 0, s>>>(gu, rows, I, out);
    FM_LAUNCH_CHECK("swiglu");
}

static __global__ void add_kernel(__nv_bfloat16 *acc, const __nv_bfloat16 *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = __float2bfloat16_rn(__bfloat162float(acc[i]) + __bfloat162float(x[i]));
}

extern "C" void fm_cuda_add(__nv_bfloat16 *acc, const __nv_bfloat16 *x, int64_t n, cudaStream_t s) {
    add_kernel<<<grid_for(n), 256, 0, s>>>(acc, x, n);
    FM_LAUNCH_CHECK("add");
}

static __global__ void bf16_to_f32_kernel(const __nv_bfloat16 *x, int64_t n, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(x[i]);
}

extern "C" void fm_cuda_bf16_to_f32(const __nv_bfloat16 *x, int64_t n, float *out, cudaStream_t s) {
    bf16_to_f32_kernel<<<grid_for(n), 256, 0, s>>>(x, n, out);
    FM_LAUNCH_CHECK("bf16_to_f32");
}

static __global__ void moe_combine_kernel(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w,
                                          int64_t T, int32_t k, int64_t H, __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        float acc = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            const int64_t p = t * k + j, row = slot_of ? slot_of[p] : p;
            acc += __bfloat162float(w[p]) * __bfloat162float(y[row * H + c]);
        }
        out[i] = __float2bfloat16_rn(acc);
    }
}

extern "C" void fm_cuda_moe_combine(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w, int64_t T,
                                    int32_t k, int64_t H, __nv_bfloat16 *out, cudaStream_t s) {
    const int64_t blocks = fm_ceil_div(T * H, 256);
    if (blocks == 0) return;
    moe_combine_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(y, slot_of, w, T, k, H, out);
    FM_LAUNCH_CHECK("moe_combine");
}
