// Grouped MoE through cuBLAS (see moe_grouped_cublas.cuh).
//
//   1. count the routed pairs per expert (atomics), copy the E counts to the host, prefix-sum them there
//   2. scatter: each pair p = t*k + j takes a slot in its expert's segment (order inside a segment does not
//      matter: every row is computed independently, and the combine reads rows by pair), gather x rows
//   3. gate|up, SwiGLU, down: two grouped GEMMs, one group per expert with rows, cuBLAS bf16 -> fp32 -> bf16
//   4. combine: out[t] = sum_j w[t, j] * y[slot(t, j)] in j order, fp32, one bf16 rounding
// The bf16 roundings match the per-token path and the CPU reference, so the three compute the same function.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"

static __global__ void count_kernel(const int32_t *ids, int64_t P, int32_t *counts) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(&counts[ids[p]], 1);
}

// slot_of[p] = offsets[e] + (arrival order within e); x rows gathered into xs[slot]
static __global__ void scatter_kernel(const int32_t *ids, int64_t P, int32_t k, const int32_t *offsets, int32_t *fill,
                                      int32_t *slot_of) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[p];
        slot_of[p] = offsets[e] + atomicAdd(&fill[e], 1);
    }
    (void)k;
}

static __global__ void gather_kernel(const __nv_bfloat16 *x, int64_t P, int32_t k, int64_t H, const int32_t *slot_of,
                                     __nv_bfloat16 *xs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i / H, c = i % H;
        xs[(int64_t)slot_of[p] * H + c] = x[(p / k) * H + c];
    }
}

static unsigned blocks_for(int64_t n) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}


// Host-side arguments of one grouped call, one entry per expert that has rows (at most E).
typedef struct group_args {
    cublasOperation_t *ta, *tb;
    int               *m, *n, *k, *lda, *ldb, *ldc, *size;
    float             *alpha, *beta;
    const void       **ptrs; /* A[groups], B[groups], C[groups] */
} group_args;

// y_e [M_e, N] = x_e [M_e, K] W_e^T for every expert with rows, in one grouped call
static void grouped_gemm(cuda_backend *be, const fm_bank *w, const int *counts, const int *offsets, const __nv_bfloat16 *x,
                         __nv_bfloat16 *y, void **dev_ptrs, group_args *g) {
    int groups = 0;
    for (int e = 0; e < w->n; e++)
        if (counts[e]) groups++;
    if (!groups) return;
    int i = 0;
    for (int e = 0; e < w->n; e++) {
        if (!counts[e]) continue;
        g->ta[i] = CUBLAS_OP_T, g->tb[i] = CUBLAS_OP_N;
        g->m[i] = (int)w->rows, g->n[i] = counts[e], g->k[i] = (int)w->cols;
        g->lda[i] = (int)w->ld, g->ldb[i] = (int)w->cols, g->ldc[i] = (int)w->rows;
        g->alpha[i] = 1.0f, g->beta[i] = 0.0f, g->size[i] = 1;
        g->ptrs[i]              = bank_bf16(w, e);
        g->ptrs[groups + i]     = x + (int64_t)offsets[e] * w->cols;
        g->ptrs[2 * groups + i] = y + (int64_t)offsets[e] * w->rows;
        i++;
    }
    FM_CUDA_CHECK(cudaMemcpyAsync(dev_ptrs, g->ptrs, (size_t)(3 * groups) * sizeof(void *), cudaMemcpyHostToDevice,
                                  be->stream));
    const void *const *dA = (const void *const *)dev_ptrs;
    FM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(be->cublas, g->ta, g->tb, g->m, g->n, g->k, g->alpha, dA, CUDA_R_16BF, g->lda,
                                         dA + groups, CUDA_R_16BF, g->ldb, g->beta, (void *const *)(dev_ptrs + 2 * groups),
                                         CUDA_R_16BF, g->ldc, groups, g->size, CUBLAS_COMPUTE_32F));
    /* the pointer upload reads g->ptrs (pageable host memory) and dev_ptrs is reused by the next call */
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
}

void fm_cuda_moe_grouped_cublas(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x,
                                int64_t T, const int32_t *ids, const __nv_bfloat16 *weights, int32_t k,
                                __nv_bfloat16 *out) {
    const int64_t P = T * k, I = down->cols, H = down->rows, E = gate_up->n;
    if (P == 0) return;
    /* workspace: counts|fill|offsets [3E] int32, slot_of [P] int32, pointers [3E], xs [P,H], gu [P,2I], h [P,I], y [P,H] */
    const size_t ints = (size_t)(3 * E + P), ptr_off = fm_ceil_div((int64_t)(ints * 4), 256) * 256;
    const size_t act_off = ptr_off + (size_t)fm_ceil_div(3 * E * 8, 256) * 256;
    const size_t bytes = act_off + (size_t)(P * (H + 2 * I + I + H)) * sizeof(__nv_bfloat16);
    char *ws = (char *)fm_cuda_workspace(be, bytes);
    int32_t *counts = (int32_t *)ws, *fill = counts + E, *offsets_d = fill + E, *slot_of = offsets_d + E;
    void   **dev_ptrs = (void **)(ws + ptr_off);
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(ws + act_off), *gu = xs + P * H, *h = gu + P * 2 * I, *y = h + P * I;

    FM_CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)(2 * E) * sizeof(int32_t), be->stream));
    count_kernel<<<blocks_for(P), 256, 0, be->stream>>>(ids, P, counts);
    FM_LAUNCH_CHECK("moe_count");
    /* host scratch: counts, offsets and the grouped-call arguments (one allocation) */
    const size_t per = 2 * sizeof(cublasOperation_t) + 9 * sizeof(int) + 2 * sizeof(float) + 3 * sizeof(void *);
    char *host = (char *)malloc((size_t)E * (2 * sizeof(int) + per));
    if (!host) { fprintf(stderr, "fp8moe: moe: out of host memory\n"); abort(); }
    int *cnt = (int *)host, *off = cnt + E;
    group_args g;
    g.ptrs  = (const void **)(off + E);
    g.ta    = (cublasOperation_t *)(g.ptrs + 3 * E), g.tb = g.ta + E;
    g.m     = (int *)(g.tb + E), g.n = g.m + E, g.k = g.n + E, g.lda = g.k + E, g.ldb = g.lda + E, g.ldc = g.ldb + E;
    g.size  = g.ldc + E;
    g.alpha = (float *)(g.size + E), g.beta = g.alpha + E;
    FM_CUDA_CHECK(cudaMemcpyAsync(cnt, counts, (size_t)E * sizeof(int32_t), cudaMemcpyDeviceToHost, be->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    for (int64_t e = 0, acc = 0; e < E; e++) off[e] = (int)acc, acc += cnt[e];
    FM_CUDA_CHECK(cudaMemcpyAsync(offsets_d, off, (size_t)E * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream));
    scatter_kernel<<<blocks_for(P), 256, 0, be->stream>>>(ids, P, k, offsets_d, fill, slot_of);
    FM_LAUNCH_CHECK("moe_scatter");
    gather_kernel<<<blocks_for(P * H), 256, 0, be->stream>>>(x, P, k, H, slot_of, xs);
    FM_LAUNCH_CHECK("moe_gather");
    grouped_gemm(be, gate_up, cnt, off, xs, gu, dev_ptrs, &g);
    fm_cuda_swiglu(gu, P, I, h, be->stream);
    grouped_gemm(be, down, cnt, off, h, y, dev_ptrs, &g);
    free(host);
    fm_cuda_moe_combine(y, slot_of, weights, T, k, H, out, be->stream);
}
