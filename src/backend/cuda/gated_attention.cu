// Qwen3-Next's gated attention inputs and its two sigmoid gates (see gated_attention.cuh). Memory-bound and small
// beside the projections: blocks of 8 warps, grid (T, Y), for the split + norm + partial RoPE (warp w of block (t, y)
// takes token t's heads 8 y + w, + 8 Y, ...; Y > 1 only at decode sizes; a head goes through the warp's shared row
// so that a lane can read its rotation partner), grid-stride loops and rows for the gates.
//
// Programmatic dependent launch (pdl.cuh, `pdl`): every kernel lets the next one start and waits for the earlier ones
// at its top; the gated score's weight row is the one weight read, and it is read beside the activation row.
#include "backend/cuda/gated_attention.cuh"
#include "backend/cuda/pdl.cuh"

#define GA_WARPS 8
#define GA_MAX_HD 256

static int grid_for(int64_t n) {
    const int64_t blocks = fm_ceil_div(n, 256);
    return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

static __device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename A>
static __global__ __launch_bounds__(GA_WARPS * 32) void gated_qk_norm_rope_kernel(
    const A *qg, int32_t nh, int32_t nkv, int32_t hd, int32_t rot_dim, const A *q_norm, const A *k_norm, float eps,
    int64_t pos0, const int32_t *pos, float theta, A *qkv, A *gate) {
    __shared__ float xs[GA_WARPS][GA_MAX_HD];
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = rot_dim / 2;
    const int64_t ld_in = (int64_t)(2 * nh + 2 * nkv) * hd, ld = (int64_t)(nh + 2 * nkv) * hd;
    const A *in = qg + t * ld_in;
    A *row = qkv + t * ld;
    /* the v heads and the gates are copies, shared by the token's gridDim.y blocks */
    const int64_t i0 = (int64_t)blockIdx.y * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.y * blockDim.x;
    for (int64_t i = i0; i < (int64_t)nkv * hd; i += stride)
        row[(int64_t)(nh + nkv) * hd + i] = in[(int64_t)(2 * nh + nkv) * hd + i];
    for (int64_t i = i0; i < (int64_t)nh * hd; i += stride) gate[t * nh * hd + i] = in[(i / hd) * 2 * hd + hd + i % hd];
    const float p = (float)(pos ? (int64_t)pos[t] : pos0 + t);
    float *x = xs[warp];
    for (int h = (int)blockIdx.y * GA_WARPS + warp; h < nh + nkv; h += (int)gridDim.y * GA_WARPS) {
        const A *src = h < nh ? in + (int64_t)h * 2 * hd : in + (int64_t)2 * nh * hd + (int64_t)(h - nh) * hd;
        const A *w = h < nh ? q_norm : k_norm;
        float ss = 0.0f;
        for (int j = lane; j < hd; j += 32) {
            const float v = act_load(src[j]);
            x[j] = v, ss += v * v;
        }
        if (w) {
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
            for (int j = lane; j < hd; j += 32) x[j] = act_load(w[j]) * (x[j] * inv);
        }
        __syncwarp();
        A *dst = row + (int64_t)h * hd;
        for (int j = lane; j < hd; j += 32) {
            float y = x[j];
            if (j < rot_dim) {
                const int i = j < half ? j : j - half;
                const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
                float sn, cs;
                sincosf(p * inv_freq, &sn, &cs);
                y = j < half ? x[j] * cs - x[j + half] * sn : x[j] * cs + x[j - half] * sn;
            }
            act_store(dst + j, y);
        }
        __syncwarp(); /* x is rewritten by the warp's next head */
    }
}

template <typename A> static __global__ void sigmoid_mul_kernel(A *x, const A *gate, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        act_store(x + i, act_load(x[i]) * sigmoidf_(act_load(gate[i])));
}

template <typename A>
static __global__ void add_sigmoid_scaled_kernel(A *acc, const A *x, const A *score, int64_t rows, int64_t dim) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * dim;
         i += (int64_t)gridDim.x * blockDim.x)
        act_store(acc + i, act_load(acc[i]) + sigmoidf_(act_load(score[i / dim])) * act_load(x[i]));
}

// acc_row += g * x_row for bf16 rows of dim % 8 == 0 at 16-byte aligned addresses, by the block's threads: 8 elements
// per 16-byte load, each rounded once
static __device__ __forceinline__ void gate_row_bf16x8(__nv_bfloat16 *acc_row, const __nv_bfloat16 *x_row, float g,
                                                       int64_t dim) {
    uint4 *a = (uint4 *)acc_row;
    const uint4 *b = (const uint4 *)x_row;
    for (int64_t c = threadIdx.x; c < dim / 8; c += blockDim.x) {
        uint4 av = a[c];
        const uint4 bv = b[c];
        __nv_bfloat162 *ap = (__nv_bfloat162 *)&av;
        const __nv_bfloat162 *bp = (const __nv_bfloat162 *)&bv;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 af = __bfloat1622float2(ap[i]), bf = __bfloat1622float2(bp[i]);
            ap[i] = __floats2bfloat162_rn(af.x + g * bf.x, af.y + g * bf.y);
        }
        a[c] = av;
    }
}

// add_sigmoid_scaled for those rows (the shared expert's output at every Qwen3-Next MoE layer): a block per row, its
// score read once. The element-wise form took 24 us at T = 2048, H = 2048 (ncu: 64-bit division and 2-byte accesses
// per element) for 24 MB moved (6 us at 4.25 TB/s).
static __global__ void add_sigmoid_scaled_bf16x8_kernel(__nv_bfloat16 *acc, const __nv_bfloat16 *x,
                                                        const __nv_bfloat16 *score, int64_t dim) {
    pdl_wait();
    const int64_t row = blockIdx.x;
    gate_row_bf16x8(acc + row * dim, x + row * dim, sigmoidf_(__bfloat162float(score[row])), dim);
}

// add_sigmoid_gated: the score h[row] . w in the same block, then the gate as above. 256 threads per row; the dot in
// fp32 (bf16 rows of dim % 8 == 0: 16-byte lanes, V8), the warp sums added in warp order, the score rounded to the
// act dtype as linear stores it. At decode (one row) this one launch replaces cuBLAS's dot, its split-K reduction
// and the gate's own launch.
template <typename A, bool V8>
static __global__ __launch_bounds__(256) void add_sigmoid_gated_kernel(A *acc, const A *x, const A *h, const A *w,
                                                                       int64_t dim) {
    __shared__ float part[8];
    pdl_wait();
    const int64_t row = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const A *hr = h + row * dim;
    float s = 0.0f;
    if (V8) {
        for (int64_t c = tid; c < dim / 8; c += 256) {
            const uint4 hv = ((const uint4 *)hr)[c], wv = ((const uint4 *)w)[c];
            const __nv_bfloat162 *hp = (const __nv_bfloat162 *)&hv, *wp = (const __nv_bfloat162 *)&wv;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 a = __bfloat1622float2(hp[i]), b = __bfloat1622float2(wp[i]);
                s = fmaf(a.x, b.x, s), s = fmaf(a.y, b.y, s);
            }
        }
    } else {
        for (int64_t i = tid; i < dim; i += 256) s = fmaf(act_load(hr[i]), act_load(w[i]), s);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    float score = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) score += part[i];
    A stored;
    act_store(&stored, score);
    const float g = sigmoidf_(act_load(stored));
    if (V8) {
        gate_row_bf16x8((__nv_bfloat16 *)(acc + row * dim), (const __nv_bfloat16 *)(x + row * dim), g, dim);
    } else {
        for (int64_t i = tid; i < dim; i += 256)
            act_store(acc + row * dim + i, act_load(acc[row * dim + i]) + g * act_load(x[row * dim + i]));
    }
}

template <typename A>
static void gated_qk_norm_rope(const A *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t rot_dim,
                               const A *q_norm, const A *k_norm, float eps, int64_t pos0, const int32_t *pos,
                               double theta, A *qkv, A *gate, bool pdl, cudaStream_t s) {
    if (hd > GA_MAX_HD || rot_dim % 2 != 0 || rot_dim > hd || T > INT32_MAX) {
        fprintf(stderr, "fp8moe: gated_qk_norm_rope: unsupported head_dim %d, rotary dims %d or T %lld\n", hd, rot_dim,
                (long long)T);
        abort();
    }
    if (T == 0) return;
    /* Y blocks per token at decode sizes (about 2 per SM of an H200, at most one per group of GA_WARPS heads), so
       that a warp's heads do not run one after another on a single SM */
    const int64_t groups = fm_ceil_div(nh + nkv, GA_WARPS), want = fm_ceil_div(264, T);
    const dim3 grid((unsigned)T, (unsigned)(want < groups ? want : groups));
    pdl_launch(gated_qk_norm_rope_kernel<A>, grid, GA_WARPS * 32, 0, s, pdl, qg, nh, nkv, hd, rot_dim, q_norm, k_norm,
               eps, pos0, pos, (float)theta, qkv, gate);
    FM_LAUNCH_CHECK("gated_qk_norm_rope");
}

extern "C" void fm_cuda_gated_qk_norm_rope(bool f32, const void *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                           int32_t rot_dim, const void *q_norm, const void *k_norm, float eps,
                                           int64_t pos0, const int32_t *pos, double theta, void *qkv, void *gate,
                                           bool pdl, cudaStream_t s) {
    typedef __nv_bfloat16 bf16;
    if (f32)
        gated_qk_norm_rope((const float *)qg, T, nh, nkv, hd, rot_dim, (const float *)q_norm, (const float *)k_norm,
                           eps, pos0, pos, theta, (float *)qkv, (float *)gate, pdl, s);
    else
        gated_qk_norm_rope((const bf16 *)qg, T, nh, nkv, hd, rot_dim, (const bf16 *)q_norm, (const bf16 *)k_norm, eps,
                           pos0, pos, theta, (bf16 *)qkv, (bf16 *)gate, pdl, s);
}

extern "C" void fm_cuda_sigmoid_mul(bool f32, void *x, const void *gate, int64_t n, bool pdl, cudaStream_t s) {
    if (n <= 0) return;
    if (f32) pdl_launch(sigmoid_mul_kernel<float>, grid_for(n), 256, 0, s, pdl, (float *)x, (const float *)gate, n);
    else
        pdl_launch(sigmoid_mul_kernel<__nv_bfloat16>, grid_for(n), 256, 0, s, pdl, (__nv_bfloat16 *)x,
                   (const __nv_bfloat16 *)gate, n);
    FM_LAUNCH_CHECK("sigmoid_mul");
}

extern "C" void fm_cuda_add_sigmoid_scaled(bool f32, void *acc, const void *x, const void *score, int64_t rows,
                                           int64_t dim, bool pdl, cudaStream_t s) {
    if (rows * dim <= 0) return;
    typedef __nv_bfloat16 bf16;
    if (f32)
        pdl_launch(add_sigmoid_scaled_kernel<float>, grid_for(rows * dim), 256, 0, s, pdl, (float *)acc,
                   (const float *)x, (const float *)score, rows, dim);
    else if (dim % 8 == 0 && ((uintptr_t)acc | (uintptr_t)x) % 16 == 0 && rows <= INT32_MAX)
        pdl_launch(add_sigmoid_scaled_bf16x8_kernel, (unsigned)rows, 256, 0, s, pdl, (bf16 *)acc, (const bf16 *)x,
                   (const bf16 *)score, dim);
    else
        pdl_launch(add_sigmoid_scaled_kernel<bf16>, grid_for(rows * dim), 256, 0, s, pdl, (bf16 *)acc, (const bf16 *)x,
                   (const bf16 *)score, rows, dim);
    FM_LAUNCH_CHECK("add_sigmoid_scaled");
}

extern "C" void fm_cuda_add_sigmoid_gated(bool f32, void *acc, const void *x, const void *h, const void *w,
                                          int64_t rows, int64_t dim, bool pdl, cudaStream_t s) {
    if (rows <= 0 || dim <= 0) return;
    if (rows > INT32_MAX) {
        fprintf(stderr, "fp8moe: add_sigmoid_gated: %lld rows\n", (long long)rows);
        abort();
    }
    typedef __nv_bfloat16 bf16;
    if (f32)
        pdl_launch(add_sigmoid_gated_kernel<float, false>, (unsigned)rows, 256, 0, s, pdl, (float *)acc,
                   (const float *)x, (const float *)h, (const float *)w, dim);
    else if (dim % 8 == 0 && ((uintptr_t)acc | (uintptr_t)x | (uintptr_t)h | (uintptr_t)w) % 16 == 0)
        pdl_launch(add_sigmoid_gated_kernel<bf16, true>, (unsigned)rows, 256, 0, s, pdl, (bf16 *)acc, (const bf16 *)x,
                   (const bf16 *)h, (const bf16 *)w, dim);
    else
        pdl_launch(add_sigmoid_gated_kernel<bf16, false>, (unsigned)rows, 256, 0, s, pdl, (bf16 *)acc, (const bf16 *)x,
                   (const bf16 *)h, (const bf16 *)w, dim);
    FM_LAUNCH_CHECK("add_sigmoid_gated");
}
