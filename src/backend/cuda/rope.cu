// Fused q/k RMSNorm + RoPE (see rope.cuh). One block per (token, head) of hd/2 threads rounded up to whole warps:
// thread j < hd/2 owns the pair (j, j + hd/2), the others only join the reduction. Memory-bound: reads and
// writes (nh + nkv) * hd activations per token (bf16, or fp32 for the ref32 oracle).
#include "backend/cuda/rope.cuh"

template <typename A>
static __global__ void qk_norm_rope_kernel(A *qkv, int32_t nh, int32_t nkv, int32_t hd, const A *q_norm,
                                           const A *k_norm, float eps, int64_t pos0, const int32_t *pos, float theta) {
    const int64_t t = blockIdx.x;
    const int32_t h = blockIdx.y, half = hd / 2, j = threadIdx.x;
    A *x = qkv + t * (int64_t)(nh + 2 * nkv) * hd + (int64_t)h * hd;
    const bool active = j < half;
    float a = active ? act_load(x[j]) : 0.0f, b = active ? act_load(x[j + half]) : 0.0f;
    const A *w = h < nh ? q_norm : k_norm;
    if (w) {
        __shared__ float part[32];
        float ss = a * a + b * b;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((j & 31) == 0) part[j >> 5] = ss;
        __syncthreads();
        if (j == 0) {
            float s = 0.0f;
            for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i];
            part[0] = s;
        }
        __syncthreads();
        const float inv = 1.0f / sqrtf(part[0] / (float)hd + eps);
        if (active) {
            a = act_load(w[j]) * (a * inv);
            b = act_load(w[j + half]) * (b * inv);
        }
    }
    if (!active) return;
    const float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
    const float f = (float)(pos ? (int64_t)pos[t] : pos0 + t) * inv_freq;
    float sn, cs;
    sincosf(f, &sn, &cs);
    act_store(&x[j], a * cs - b * sn);
    act_store(&x[j + half], b * cs + a * sn);
}

template <typename A>
static void qk_norm_rope(A *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const A *q_norm, const A *k_norm,
                         float eps, int64_t pos0, const int32_t *pos, double theta, cudaStream_t s) {
    if (hd % 2 != 0 || hd > 1024 || T > INT32_MAX) {
        fprintf(stderr, "fp8moe: qk_norm_rope: unsupported head_dim %d or T %lld\n", hd, (long long)T);
        abort();
    }
    if (T == 0) return;
    const int threads = (int)fm_ceil_div(hd / 2, 32) * 32; /* whole warps: the reduction shuffles with full masks */
    dim3 grid((unsigned)T, (unsigned)(nh + nkv));
    qk_norm_rope_kernel<<<grid, threads, 0, s>>>(qkv, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, (float)theta);
    FM_LAUNCH_CHECK("qk_norm_rope");
}

extern "C" void fm_cuda_qk_norm_rope(__nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                     const __nv_bfloat16 *q_norm, const __nv_bfloat16 *k_norm, float eps, int64_t pos0,
                                     const int32_t *pos, double theta, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, theta, s);
}

extern "C" void fm_cuda_qk_norm_rope_f32(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                         const float *q_norm, const float *k_norm, float eps, int64_t pos0,
                                         const int32_t *pos, double theta, cudaStream_t s) {
    qk_norm_rope(qkv, T, nh, nkv, hd, q_norm, k_norm, eps, pos0, pos, theta, s);
}
