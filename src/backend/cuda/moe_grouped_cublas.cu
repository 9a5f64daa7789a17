// Grouped MoE through cuBLAS (see moe_grouped_cublas.cuh).
//
//   1. count the routed pairs per expert (atomics), copy the E counts to the host, prefix-sum them there
//   2. scatter: each pair p = t*k + j takes a slot in its expert's segment (order inside a segment does not
//      matter: every row is computed independently, and the combine reads rows by pair), gather x rows
//   3. gate|up, SwiGLU, down: two grouped GEMMs, one group per expert with rows, cuBLAS bf16 -> fp32 -> bf16
//   4. combine: out[t] = sum_j w[t, j] * y[slot(t, j)] in j order, fp32, one bf16 rounding
// The bf16 roundings match the per-token path and the CPU reference, so the three compute the same function.
// fp32 banks (the ref32 oracle) take the same route with fp32 activations and SGEMMs (no rounding at all).
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"

typedef __nv_bfloat16 bf16;

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

template <typename A>
static __global__ void gather_kernel(const A *x, int64_t P, int32_t k, int64_t H, const int32_t *slot_of, A *xs) {
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
static void grouped_gemm(cuda_backend *be, const fm_bank *w, const int *counts, const int *offsets, const char *x,
                         char *y, void **dev_ptrs, group_args *g) {
    const size_t      esz   = bank_elem_size(w);
    const cudaDataType dtype = w->fmt == FM_W_F32 ? CUDA_R_32F : CUDA_R_16BF;
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
        g->ptrs[i]              = bank_matrix(w, e);
        g->ptrs[groups + i]     = x + (size_t)offsets[e] * (size_t)w->cols * esz;
        g->ptrs[2 * groups + i] = y + (size_t)offsets[e] * (size_t)w->rows * esz;
        i++;
    }
    FM_CUDA_CHECK(cudaMemcpyAsync(dev_ptrs, g->ptrs, (size_t)(3 * groups) * sizeof(void *), cudaMemcpyHostToDevice,
                                  be->stream));
    const void *const *dA = (const void *const *)dev_ptrs;
    FM_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(be->cublas, g->ta, g->tb, g->m, g->n, g->k, g->alpha, dA, dtype, g->lda,
                                         dA + groups, dtype, g->ldb, g->beta, (void *const *)(dev_ptrs + 2 * groups),
                                         dtype, g->ldc, groups, g->size, CUBLAS_COMPUTE_32F));
    /* the pointer upload reads g->ptrs (pageable host memory) and dev_ptrs is reused by the next call */
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
}

void fm_cuda_moe_grouped_cublas(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                                const int32_t *ids, const void *weights, int32_t k, void *out) {
    const int64_t P = T * k, I = down->cols, H = down->rows, E = gate_up->n;
    if (P == 0) return;
    const bool   f32 = gate_up->fmt == FM_W_F32;
    const size_t esz = bank_elem_size(gate_up);
    /* workspace (fm_moe_grouped_cublas_ws_bytes): counts|fill|offsets [3E] int32, slot_of [P] int32, pointers [3E],
       xs [P,H], gu [P,2I], h [P,I], y [P,H] */
    const size_t ints = (size_t)(3 * E + P), ptr_off = fm_ceil_div((int64_t)(ints * 4), 256) * 256;
    const size_t act_off = ptr_off + (size_t)fm_ceil_div(3 * E * 8, 256) * 256;
    const size_t bytes = act_off + (size_t)(P * (H + 2 * I + I + H)) * esz;
    char *ws = (char *)fm_cuda_workspace(be, bytes);
    int32_t *counts = (int32_t *)ws, *fill = counts + E, *offsets_d = fill + E, *slot_of = offsets_d + E;
    void   **dev_ptrs = (void **)(ws + ptr_off);
    char *xs = ws + act_off, *gu = xs + P * H * esz, *h = gu + P * 2 * I * esz, *y = h + P * I * esz;

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
    if (f32) gather_kernel<<<blocks_for(P * H), 256, 0, be->stream>>>((const float *)x, P, k, H, slot_of, (float *)xs);
    else gather_kernel<<<blocks_for(P * H), 256, 0, be->stream>>>((const bf16 *)x, P, k, H, slot_of, (bf16 *)xs);
    FM_LAUNCH_CHECK("moe_gather");
    grouped_gemm(be, gate_up, cnt, off, xs, gu, dev_ptrs, &g);
    if (f32) fm_cuda_swiglu_f32((const float *)gu, P, I, (float *)h, be->stream);
    else fm_cuda_swiglu((const bf16 *)gu, P, I, (bf16 *)h, be->stream);
    grouped_gemm(be, down, cnt, off, h, y, dev_ptrs, &g);
    free(host);
    if (f32) fm_cuda_moe_combine_f32((const float *)y, slot_of, (const float *)weights, T, k, H, (float *)out, be->stream);
    else fm_cuda_moe_combine((const bf16 *)y, slot_of, (const bf16 *)weights, T, k, H, (bf16 *)out, be->stream);
}
