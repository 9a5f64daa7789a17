// The MoE block's end in one kernel (moe_combine_norm.cuh). Decode floor: a token reads its k routed rows and its
// residual row and writes the residual and the normed row, (k + 3) H bf16 = 45 KB at Qwen3-30B-A3B's k = 8, H = 2048:
// ~10 ns at 4.25 TB/s, so the kernel is all launch, wait and ramp; what it saves is the second of the two launches
// (~2-4 us under a graph, bench/NOTES.md 2026-12-05) and one write + read of the combined row.
//
// Layout: one block of NORM_THREADS per token; thread t owns the 8-element chunks t, t + NORM_THREADS of the row
// (norm_row.cuh), combines them from the k routed rows with the products and order of moe_combine_bf16x8_kernel,
// rounds to bf16 as that kernel stores, then adds, rounds, sums squares and normalises exactly as add_rmsnorm_kernel:
// the result is the two kernels' bit for bit.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_combine_norm.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"

typedef __nv_bfloat16 bf16;

static __global__ __launch_bounds__(NORM_THREADS) void moe_combine_add_rmsnorm_kernel(
    const bf16 *__restrict__ y, const int32_t *__restrict__ slot_of, const bf16 *__restrict__ w, int32_t k, int64_t H,
    bf16 *__restrict__ acc, const bf16 *__restrict__ norm, float eps, bf16 *__restrict__ out) {
    pdl_launch_dependents();
    const int64_t t = blockIdx.x;
    float wv[NORM_CHUNKS][8], v[NORM_CHUNKS][8], m[NORM_CHUNKS][8];
    /* the norm's weights are no earlier kernel's output: loaded while the down projection finishes */
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) load8f(norm + c, wv[j]);
#pragma unroll
        for (int e = 0; e < 8; e++) m[j][e] = 0.0f;
    }
    pdl_wait();
    bf16 *ar = acc + t * H;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) load8f_cg(ar + c, v[j]); /* through L2: the residual and the rows are earlier kernels' */
    }
    for (int32_t i = 0; i < k; i++) {
        const int64_t p = t * k + i, row = slot_of ? slot_of[p] : p;
        const float wi = __bfloat162float(w[p]);
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) {
            const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
            if (c >= H) continue;
            const uint4 raw = __ldcg((const uint4 *)(y + row * H + c));
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                m[j][2 * q] += wi * __low2float(h[q]);
                m[j][2 * q + 1] += wi * __high2float(h[q]);
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c >= H) continue;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            /* the combined value as moe_combine stores it, then the sum as add_rmsnorm stores it */
            v[j][e] = act_round(v[j][e] + act_round(m[j][e], ar), ar);
            ss += v[j][e] * v[j][e];
        }
        store8f(ar + c, v[j]);
    }
    norm_store_chunks(v, wv, 1.0f / sqrtf(block_sum(ss) / (float)H + eps), out + t * H, H);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" void fm_cuda_moe_combine_add_rmsnorm(const bf16 *y, const int32_t *slot_of, const bf16 *w, int64_t T,
                                                int32_t k, int64_t H, bf16 *scratch, bf16 *acc, const bf16 *norm,
                                                float eps, bf16 *out, bool pdl, cudaStream_t s) {
    if (T <= 0) return;
    const bool one_kernel = H % 8 == 0 && H <= 8 * NORM_CHUNKS * NORM_THREADS && T <= INT32_MAX && aligned16(y) &&
                            aligned16(acc) && aligned16(norm) && aligned16(out);
    if (!one_kernel) { /* the two kernels it fuses, in their order */
        fm_cuda_moe_combine(y, slot_of, w, T, k, H, scratch, pdl, s);
        fm_cuda_add_rmsnorm(acc, scratch, norm, T, H, eps, out, pdl, s);
        return;
    }
    void *args[] = {(void *)&y,   (void *)&slot_of, (void *)&w,   (void *)&k,  (void *)&H,
                    (void *)&acc, (void *)&norm,    (void *)&eps, (void *)&out};
    fm_cuda_launch_pdl((const void *)moe_combine_add_rmsnorm_kernel, dim3((unsigned)T), dim3(NORM_THREADS), 0, s, args,
                       pdl);
    FM_LAUNCH_CHECK("moe_combine_add_rmsnorm");
}
