// Causal GQA attention in fp32 for the ref32 oracle (see attention_f32.cuh): the CPU reference's algorithm
// (src/backend/cpu/cpu_attention.c) on the GPU, written for being obviously right rather than fast. Also instantiated
// over bf16 activations for the head dims the tensor-core kernels do not take (not a multiple of 16: Qwen3-Next's tiny
// golden checkpoints).
//
// Grid: x = query position t, y = query head h. Block: 4 warps. Dynamic shared memory: the query row (hd
// floats) and the t + 1 scores of that row.
//   1. scores: warp w takes keys j = w, w + 4, ...; its lanes split the head dimension (coalesced reads of the
//      key row), a shuffle reduction gives q.k_j * hd^-0.5
//   2. softmax: block max, p_j = exp(s_j - max), block sum
//   3. out[t, h, d] = sum_j p_j v_j[d] / sum: thread d walks the keys (coalesced over d)
// Cost: 4 hd nh T^2 / 2 FLOPs on CUDA cores with the keys re-read from L2 for every query row; at T = 2048,
// nh = 32, hd = 128 a few ms per layer, which is fine for an oracle and slow for anything else.
#include "backend/cuda/attention_f32.cuh"

#define ATTF_THREADS 128

static __device__ float attf_block_reduce(float v, bool is_max, float *red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads(); /* red is reused by consecutive reductions */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < ATTF_THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

template <typename A>
static __global__ void attention_f32_kernel(const A *qkv, int32_t nh, int32_t nkv, int32_t hd, A *out) {
    extern __shared__ float attf_smem[];
    __shared__ float red[ATTF_THREADS / 32];
    const int64_t t = blockIdx.x;
    const int32_t h = blockIdx.y, kvh = h / (nh / nkv), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const A *kbase = qkv + (int64_t)(nh + kvh) * hd, *vbase = qkv + (int64_t)(nh + nkv + kvh) * hd;
    float *q = attf_smem, *p = attf_smem + hd;
    for (int32_t d = threadIdx.x; d < hd; d += ATTF_THREADS) q[d] = act_load(qkv[t * ld + (int64_t)h * hd + d]);
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t j = warp; j <= t; j += ATTF_THREADS / 32) {
        float dot = 0.0f;
        for (int32_t d = lane; d < hd; d += 32) dot += q[d] * act_load(kbase[j * ld + d]);
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) p[j] = dot * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j <= t; j += ATTF_THREADS) mx = fmaxf(mx, p[j]);
    mx = attf_block_reduce(mx, true, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j <= t; j += ATTF_THREADS) sum += (p[j] = expf(p[j] - mx));
    sum = attf_block_reduce(sum, false, red); /* its barriers also publish p */
    for (int32_t d = threadIdx.x; d < hd; d += ATTF_THREADS) {
        float acc = 0.0f;
        for (int64_t j = 0; j <= t; j++) acc += p[j] * act_load(vbase[j * ld + d]);
        act_store(out + t * (int64_t)nh * hd + (int64_t)h * hd + d, acc / sum);
    }
}

template <typename A>
static void attention_plain(const A *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, A *out, cudaStream_t s) {
    if (T == 0) return;
    const size_t smem = (size_t)(hd + T) * sizeof(float);
    int dev = 0, max_smem = 0;
    FM_CUDA_CHECK(cudaGetDevice(&dev));
    FM_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (nkv < 1 || nh % nkv != 0 || T > INT32_MAX || smem + sizeof(float) * ATTF_THREADS / 32 > (size_t)max_smem) {
        fprintf(stderr,
                "fp8moe: attention (plain kernel): %lld tokens x head_dim %d with %d/%d heads is not supported "
                "(the scores of a row must fit %d bytes of shared memory)\n",
                (long long)T, hd, nh, nkv, max_smem);
        abort();
    }
    FM_CUDA_CHECK(
        cudaFuncSetAttribute(attention_f32_kernel<A>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attention_f32_kernel<A><<<dim3((unsigned)T, (unsigned)nh), ATTF_THREADS, smem, s>>>(qkv, nh, nkv, hd, out);
    FM_LAUNCH_CHECK("attention_f32");
}

extern "C" void fm_cuda_attention_f32(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, float *out,
                                      cudaStream_t s) {
    attention_plain(qkv, T, nh, nkv, hd, out, s);
}

extern "C" void fm_cuda_attention_plain_bf16(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                             __nv_bfloat16 *out, cudaStream_t s) {
    attention_plain(qkv, T, nh, nkv, hd, out, s);
}
