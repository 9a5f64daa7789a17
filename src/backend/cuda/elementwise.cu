// Row-wise and element-wise ops (see elementwise.cuh). Grid-stride loops over elements; RMSNorm is one block
// of 256 threads per row with a shared-memory reduction. Each kernel is written once over the activation type
// A (bf16 for the compute presets, fp32 for the ref32 oracle); arithmetic is fp32 either way.
//
// Programmatic dependent launch (pdl.cuh; `pdl` of each launcher, the route): every kernel lets the next one start
// at its top and waits for the earlier ones before its first load of an activation and its first store; the norms
// load their weight vector (no kernel writes it) before the wait, the rest has nothing to load early. An earlier
// kernel's output is never read through the non-coherent path (__ldg, or a const __restrict__ pointer the compiler
// turns into ld.global.nc): such a load may be hoisted above griddepcontrol.wait (bench/NOTES.md 2026-11-30 "v2 -> v4:
// what PDL, ordering and L1 did"); only the weights keep __restrict__.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"

static int grid_for(int64_t n) {
    const int64_t blocks = fm_ceil_div(n, 256);
    return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

template <typename A>
static __global__ void embed_kernel(const A *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H, A *out) {
    pdl_wait(); /* the ids */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        out[i] = table[(int64_t)ids[t] * ld + c];
    }
}

// one block per row: sum of squares in fp32, then w * (x * inv)
template <typename A>
static __global__ void rmsnorm_kernel(const A *x, const A *__restrict__ w, int64_t dim, float eps,
                                      A *__restrict__ out) {
    const A *xr = x + blockIdx.x * dim;
    A *yr = out + blockIdx.x * dim;
    const int t = threadIdx.x;
    if (norm_vec8(x, dim) && norm_vec8(w, dim) && norm_vec8(out, dim)) {
        float v[NORM_CHUNKS][8], wv[NORM_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) { /* the weights before the wait */
            const int64_t c = 8 * (t + j * NORM_THREADS);
            if (c < dim) load8f(w + c, wv[j]);
        }
        pdl_wait();
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * (t + j * NORM_THREADS);
            if (c < dim) load8f(xr + c, v[j]);
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++)
            if (8 * (t + j * NORM_THREADS) < dim)
#pragma unroll
                for (int e = 0; e < 8; e++) ss += v[j][e] * v[j][e];
        norm_store_chunks(v, wv, 1.0f / sqrtf(block_sum(ss) / (float)dim + eps), yr, dim);
        return;
    }
    pdl_wait();
    if (dim <= NORM_VEC * NORM_THREADS) {
        float v[NORM_VEC], wv[NORM_VEC];
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) {
            const int64_t i = t + j * NORM_THREADS;
            v[j] = i < dim ? act_load(xr[i]) : 0.0f;
            wv[j] = i < dim ? act_load(w[i]) : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) ss += v[j] * v[j]; /* + 0 past the row: the same sum */
        const float inv = 1.0f / sqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) {
            const int64_t i = t + j * NORM_THREADS;
            if (i < dim) act_store(&yr[i], wv[j] * (v[j] * inv));
        }
        return;
    }
    float ss = 0.0f;
    for (int64_t i = t; i < dim; i += NORM_THREADS) {
        const float v = act_load(xr[i]);
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)dim + eps);
    for (int64_t i = t; i < dim; i += NORM_THREADS) act_store(&yr[i], act_load(w[i]) * (act_load(xr[i]) * inv));
}

// acc += x, then out = rmsnorm(acc) * w, one block per row: the residual add and the next RMSNorm in one pass over
// the row (decode: one launch and one round trip of the row instead of two). Each thread adds, rounds to the
// activation type and stores its own elements, then normalises those same elements, with rmsnorm_kernel's block
// size, order of summation and arithmetic: the result is bit for bit that of add followed by rmsnorm.
template <typename A>
static __global__ void add_rmsnorm_kernel(A *__restrict__ acc, const A *x, const A *__restrict__ w, int64_t dim,
                                          float eps, A *__restrict__ out) {
    A *ar = acc + blockIdx.x * dim;
    const A *xr = x + blockIdx.x * dim;
    A *yr = out + blockIdx.x * dim;
    const int t = threadIdx.x;
    if (norm_vec8(acc, dim) && norm_vec8(x, dim) && norm_vec8(w, dim) && norm_vec8(out, dim)) {
        float v[NORM_CHUNKS][8], xv[NORM_CHUNKS][8], wv[NORM_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) { /* the weights before the wait */
            const int64_t c = 8 * (t + j * NORM_THREADS);
            if (c < dim) load8f(w + c, wv[j]);
        }
        pdl_wait();
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * (t + j * NORM_THREADS);
            if (c < dim) load8f(ar + c, v[j]), load8f(xr + c, xv[j]);
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * (t + j * NORM_THREADS);
            if (c >= dim) continue;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[j][e] = act_round(v[j][e] + xv[j][e], ar); /* the sum as stored */
                ss += v[j][e] * v[j][e];
            }
            store8f(ar + c, v[j]);
        }
        norm_store_chunks(v, wv, 1.0f / sqrtf(block_sum(ss) / (float)dim + eps), yr, dim);
        return;
    }
    pdl_wait();
    if (dim <= NORM_VEC * NORM_THREADS) {
        float v[NORM_VEC], xv[NORM_VEC], wv[NORM_VEC];
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) {
            const int64_t i = t + j * NORM_THREADS;
            v[j] = i < dim ? act_load(ar[i]) : 0.0f;
            xv[j] = i < dim ? act_load(xr[i]) : 0.0f;
            wv[j] = i < dim ? act_load(w[i]) : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) {
            const int64_t i = t + j * NORM_THREADS;
            v[j] = act_round(v[j] + xv[j], ar); /* the sum as stored */
            if (i < dim) act_store(&ar[i], v[j]);
            ss += v[j] * v[j];
        }
        const float inv = 1.0f / sqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < NORM_VEC; j++) {
            const int64_t i = t + j * NORM_THREADS;
            if (i < dim) act_store(&yr[i], wv[j] * (v[j] * inv));
        }
        return;
    }
    float ss = 0.0f;
    for (int64_t i = t; i < dim; i += NORM_THREADS) {
        act_store(&ar[i], act_load(ar[i]) + act_load(xr[i]));
        const float v = act_load(ar[i]);
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)dim + eps);
    for (int64_t i = t; i < dim; i += NORM_THREADS) act_store(&yr[i], act_load(w[i]) * (act_load(ar[i]) * inv));
}

template <typename A> static __global__ void swiglu_kernel(const A *gu, int64_t rows, int64_t I, A *out) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * I;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / I, c = i % I;
        const float g = act_load(gu[r * 2 * I + c]), u = act_load(gu[r * 2 * I + I + c]);
        act_store(&out[i], g / (1.0f + expf(-g)) * u);
    }
}

template <typename A> static __global__ void add_kernel(A *acc, const A *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        act_store(&acc[i], act_load(acc[i]) + act_load(x[i]));
}

template <typename A>
static __global__ void moe_combine_kernel(const A *y, const int32_t *slot_of, const A *w, int64_t T, int32_t k,
                                          int64_t H, A *out) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        float acc = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            const int64_t p = t * k + j, row = slot_of ? slot_of[p] : p;
            acc += act_load(w[p]) * act_load(y[row * H + c]);
        }
        act_store(&out[i], acc);
    }
}

// bf16 rows, H a multiple of 8: one thread per 8 columns of a token (16-byte loads and store; the scalar kernel
// above moved 2 bytes per load, 2.2x the HBM floor at T = 8192), the same products and order of sums.
static __global__ void moe_combine_bf16x8_kernel(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w,
                                                 int64_t T, int32_t k, int64_t H, __nv_bfloat16 *out) {
    pdl_wait();
    const int64_t H8 = H / 8;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H8; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H8, c = (i % H8) * 8;
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int32_t j = 0; j < k; j++) {
            const int64_t p = t * k + j, row = slot_of ? slot_of[p] : p;
            const float wj = __bfloat162float(w[p]);
            const uint4 raw = __ldcg((const uint4 *)(y + row * H + c)); /* not __ldg: see the top of the file */
            const __nv_bfloat162 *v = (const __nv_bfloat162 *)&raw;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                acc[2 * q] += wj * __low2float(v[q]);
                acc[2 * q + 1] += wj * __high2float(v[q]);
            }
        }
        uint4 packed;
        __nv_bfloat162 *o = (__nv_bfloat162 *)&packed;
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
        *(uint4 *)(out + t * H + c) = packed;
    }
}

template <typename A>
static void embed(const A *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H, A *out, bool pdl,
                  cudaStream_t s) {
    pdl_launch(embed_kernel<A>, grid_for(T * H), 256, 0, s, pdl, table, ld, ids, T, H, out);
    FM_LAUNCH_CHECK("embed");
}

template <typename A>
static void rmsnorm(const A *x, const A *w, int64_t rows, int64_t dim, float eps, A *out, bool pdl, cudaStream_t s) {
    if (rows <= 0) return;
    if (rows > INT32_MAX) {
        fprintf(stderr, "fp8moe: rmsnorm: %lld rows is too many\n", (long long)rows);
        abort();
    }
    pdl_launch(rmsnorm_kernel<A>, (unsigned)rows, NORM_THREADS, 0, s, pdl, x, w, dim, eps, out);
    FM_LAUNCH_CHECK("rmsnorm");
}

template <typename A>
static void add_rmsnorm(A *acc, const A *x, const A *w, int64_t rows, int64_t dim, float eps, A *out, bool pdl,
                        cudaStream_t s) {
    if (rows <= 0) return;
    if (rows > INT32_MAX) {
        fprintf(stderr, "fp8moe: add_rmsnorm: %lld rows is too many\n", (long long)rows);
        abort();
    }
    pdl_launch(add_rmsnorm_kernel<A>, (unsigned)rows, NORM_THREADS, 0, s, pdl, acc, x, w, dim, eps, out);
    FM_LAUNCH_CHECK("add_rmsnorm");
}

template <typename A> static void swiglu(const A *gu, int64_t rows, int64_t I, A *out, bool pdl, cudaStream_t s) {
    pdl_launch(swiglu_kernel<A>, grid_for(rows * I), 256, 0, s, pdl, gu, rows, I, out);
    FM_LAUNCH_CHECK("swiglu");
}

template <typename A> static void add(A *acc, const A *x, int64_t n, bool pdl, cudaStream_t s) {
    pdl_launch(add_kernel<A>, grid_for(n), 256, 0, s, pdl, acc, x, n);
    FM_LAUNCH_CHECK("add");
}

template <typename A>
static void moe_combine(const A *y, const int32_t *slot_of, const A *w, int64_t T, int32_t k, int64_t H, A *out,
                        bool pdl, cudaStream_t s) {
    if (T * H == 0) return;
    pdl_launch(moe_combine_kernel<A>, grid_for(T * H), 256, 0, s, pdl, y, slot_of, w, T, k, H, out);
    FM_LAUNCH_CHECK("moe_combine");
}

typedef __nv_bfloat16 bf16;

extern "C" void fm_cuda_embed(const bf16 *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H, bf16 *out,
                              bool pdl, cudaStream_t s) {
    embed(table, ld, ids, T, H, out, pdl, s);
}
extern "C" void fm_cuda_embed_f32(const float *table, int64_t ld, const int32_t *ids, int64_t T, int64_t H, float *out,
                                  bool pdl, cudaStream_t s) {
    embed(table, ld, ids, T, H, out, pdl, s);
}
extern "C" void fm_cuda_rmsnorm(const bf16 *x, const bf16 *w, int64_t rows, int64_t dim, float eps, bf16 *out, bool pdl,
                                cudaStream_t s) {
    rmsnorm(x, w, rows, dim, eps, out, pdl, s);
}
extern "C" void fm_cuda_rmsnorm_f32(const float *x, const float *w, int64_t rows, int64_t dim, float eps, float *out,
                                    bool pdl, cudaStream_t s) {
    rmsnorm(x, w, rows, dim, eps, out, pdl, s);
}
extern "C" void fm_cuda_add_rmsnorm(bf16 *acc, const bf16 *x, const bf16 *w, int64_t rows, int64_t dim, float eps,
                                    bf16 *out, bool pdl, cudaStream_t s) {
    add_rmsnorm(acc, x, w, rows, dim, eps, out, pdl, s);
}
extern "C" void fm_cuda_add_rmsnorm_f32(float *acc, const float *x, const float *w, int64_t rows, int64_t dim,
                                        float eps, float *out, bool pdl, cudaStream_t s) {
    add_rmsnorm(acc, x, w, rows, dim, eps, out, pdl, s);
}
extern "C" void fm_cuda_swiglu(const bf16 *gu, int64_t rows, int64_t I, bf16 *out, bool pdl, cudaStream_t s) {
    swiglu(gu, rows, I, out, pdl, s);
}
extern "C" void fm_cuda_swiglu_f32(const float *gu, int64_t rows, int64_t I, float *out, bool pdl, cudaStream_t s) {
    swiglu(gu, rows, I, out, pdl, s);
}
extern "C" void fm_cuda_add(bf16 *acc, const bf16 *x, int64_t n, bool pdl, cudaStream_t s) { add(acc, x, n, pdl, s); }
extern "C" void fm_cuda_add_f32(float *acc, const float *x, int64_t n, bool pdl, cudaStream_t s) {
    add(acc, x, n, pdl, s);
}
extern "C" void fm_cuda_moe_combine(const bf16 *y, const int32_t *slot_of, const bf16 *w, int64_t T, int32_t k,
                                    int64_t H, bf16 *out, bool pdl, cudaStream_t s) {
    if (H % 8 == 0 && ((uintptr_t)y | (uintptr_t)out) % 16 == 0) {
        if (T * H == 0) return;
        pdl_launch(moe_combine_bf16x8_kernel, grid_for(T * H / 8), 256, 0, s, pdl, y, slot_of, w, T, k, H, out);
        FM_LAUNCH_CHECK("moe_combine (bf16 x 8)");
        return;
    }
    moe_combine(y, slot_of, w, T, k, H, out, pdl, s);
}
extern "C" void fm_cuda_moe_combine_f32(const float *y, const int32_t *slot_of, const float *w, int64_t T, int32_t k,
                                        int64_t H, float *out, bool pdl, cudaStream_t s) {
    moe_combine(y, slot_of, w, T, k, H, out, pdl, s);
}
