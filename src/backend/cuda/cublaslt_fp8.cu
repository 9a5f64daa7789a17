// FP8 GEMMs through cuBLASLt (cublaslt_fp8.cuh).
//
// cuBLASLt is column-major and FP8 needs the "TN" form (A transposed, B not; both K-major), compute 32F, scale
// type 32F, K and N multiples of 16. A row-major weight W_e [N, K] is a column-major [K, N] matrix with ld K, so
// it is A with transa = T; a row-major activation block [n_e, K] is a column-major [K, n_e] matrix, B with
// transb = N; D column-major [N, n_e] with ld N is the row-major output [n_e, N]. So m = N, n = n_e, k = K.
// D = alpha * scale_A * scale_B * op(A) op(B) with scale_A / scale_B read from device pointers
// (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER). Fast accumulation stays off (the default): partial
// sums are promoted to fp32 periodically, as PyTorch's _scaled_mm does by default.
//
// Alignment. Every scale pointer gets its own 16-byte slot (FM_LT_SCALE_SLOT): cuBLASLt 12.9 and later are reported to
// accept a heuristic's algorithm and then refuse the matmul with CUBLAS_STATUS_NOT_SUPPORTED when a scale pointer is
// only 4- or 8-byte aligned. The first version of the MoE anchor packed its per-expert scales at base + 4 e and put
// s_x at 8 mod 16 bytes, its only misalignment, and cuBLASLt 13 refused its first matmul on the H200 with exactly
// that status. The callers make their operands 256-byte aligned by construction; each call still measures the alignment
// of its A, B and D pointers, asks the heuristic with exactly those (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES) and
// the exact layouts, and remembers the algorithm under (rows, alignments), so an algorithm is never reused for a shape
// or alignment it was not chosen for. The heuristic's answer is not a guarantee (cublasLt.h says so), so at a key's
// first use the candidates are tried in the heuristic's order until cuBLASLt accepts one; none accepted is a
// one-line error naming the shape.
#include <string.h>

#include "backend/cuda/cublaslt_fp8.cuh"

#define LT_WORKSPACE (32u << 20) // cuBLASLt workspace: the size NVIDIA recommends for Hopper
#define LT_CACHE 1024            // algorithms remembered per GEMM shape, keyed by rows and operand alignments
#define LT_ALGOS 8               // heuristic candidates tried, in order, at a key's first use

#define LT_CHECK(call)                                                                                                 \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                               \
            return fm_fail(err, FM_ERR_BACKEND, "cuBLASLt: %s failed: %s (%s)", #call, cublasLtGetStatusName(s_),      \
                           cublasLtGetStatusString(s_));                                                               \
    } while (0)

fm_status fm_lt_init(fm_lt *lt, fm_error *err) {
    memset(lt, 0, sizeof *lt);
    if (cudaMalloc(&lt->workspace, LT_WORKSPACE + 256) != cudaSuccess ||
        cudaMemset((char *)lt->workspace + LT_WORKSPACE, 0, 256) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) { /* zero before any stream of ours uses it */
        cudaGetLastError();
        return fm_fail(err, FM_ERR_NOMEM, "cuBLASLt: out of GPU memory for its %u-byte workspace", LT_WORKSPACE);
    }
    lt->grid_sync = (unsigned *)((char *)lt->workspace + LT_WORKSPACE);
    LT_CHECK(cublasLtCreate(&lt->handle));
    const uint64_t ws = LT_WORKSPACE;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&lt->pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    return FM_OK;
}

void fm_lt_destroy(fm_lt *lt) {
    if (lt->pref) cublasLtMatmulPreferenceDestroy(lt->pref);
    if (lt->handle) cublasLtDestroy(lt->handle);
    cudaFree(lt->workspace);
    memset(lt, 0, sizeof *lt);
}

fm_status fm_lt_gemm_init(fm_lt_gemm *g, int64_t N, int64_t K, fm_error *err) {
    memset(g, 0, sizeof *g);
    g->N = N, g->K = K;
    if (N % 16 || K % 16)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "cuBLASLt FP8 needs N and K multiples of 16, got N %lld, K %lld",
                       (long long)N, (long long)K);
    g->cache_key = (uint64_t *)calloc(LT_CACHE, sizeof *g->cache_key);
    g->cache_algo = (cublasLtMatmulAlgo_t *)malloc(LT_CACHE * sizeof *g->cache_algo);
    if (!g->cache_key || !g->cache_algo) return fm_fail(err, FM_ERR_NOMEM, "cuBLASLt: out of host memory");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->a, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->b, CUDA_R_8F_E4M3, (uint64_t)K, 1, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&g->d, CUDA_R_16BF, (uint64_t)N, 1, N));
    return FM_OK;
}

fm_status fm_lt_gemm_set_rowwise(fm_lt_gemm *g, fm_error *err) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    return FM_OK;
}

void fm_lt_gemm_destroy(fm_lt_gemm *g) {
    if (g->d) cublasLtMatrixLayoutDestroy(g->d);
    if (g->b) cublasLtMatrixLayoutDestroy(g->b);
    if (g->a) cublasLtMatrixLayoutDestroy(g->a);
    if (g->desc) cublasLtMatmulDescDestroy(g->desc);
    free(g->cache_key), free(g->cache_algo);
    memset(g, 0, sizeof *g);
}

// The largest power of two, at most 256, that divides the address: the alignment cuBLASLt may assume.
static uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

// Cache key: the row count and the alignments (log2, 0..8) of A, B and D; never 0 (n >= 1).
static uint64_t lt_key(int n, uint32_t al_a, uint32_t al_b, uint32_t al_d) {
    return (uint64_t)n << 12 | (uint64_t)__builtin_ctz(al_a) << 8 | (uint64_t)__builtin_ctz(al_b) << 4 |
           (uint64_t)__builtin_ctz(al_d);
}

// The algorithm for (n, alignments) is remembered (the heuristic query costs host time comparable to a small
// GEMM; row counts repeat from call to call); at a key's first use it is chosen as described at the top.
fm_status fm_lt_gemm_run(fm_lt *lt, fm_lt_gemm *g, const uint8_t *A, const float *a_scale, const uint8_t *B,
                         const float *b_scale, int n, __nv_bfloat16 *D, cudaStream_t stream, const char *what,
                         fm_error *err) {
    const uint32_t al_a = align_of(A), al_b = align_of(B), al_d = align_of(D);
    // FP8 needs 16-byte aligned operands and scales; the callers' layouts guarantee both, so this is a bug there
    if (al_a < 16 || al_b < 16 || al_d < 16 || align_of(a_scale) < 16 || align_of(b_scale) < 16)
        return fm_fail(err, FM_ERR_BACKEND,
                       "cuBLASLt FP8 %s: operands need 16-byte alignment, got A %u, B %u, D %u, "
                       "scales %u and %u bytes",
                       what, al_a, al_b, al_d, align_of(a_scale), align_of(b_scale));
    const uint64_t cols = (uint64_t)n;
    // descriptors are read when cublasLtMatmul enqueues the work, so changing them for the next call is safe
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale));
    LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(g->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(g->d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
    const float alpha = 1.0f, beta = 0.0f; // beta 0: C (= D, same bf16 layout, as FP8 with bf16 D requires) unread
    const uint64_t key = lt_key(n, al_a, al_b, al_d);
    int slot = -1;
    for (int i = 0, h = (int)(key * 0x9E3779B97F4A7C15ull >> 54) % LT_CACHE; i < LT_CACHE;
         i++, h = (h + 1) % LT_CACHE) {
        if (g->cache_key[h] == key) {
            const cublasStatus_t s = cublasLtMatmul(lt->handle, g->desc, &alpha, A, g->a, B, g->b, &beta, D, g->d, D,
                                                    g->d, &g->cache_algo[h], lt->workspace, LT_WORKSPACE, stream);
            if (s != CUBLAS_STATUS_SUCCESS)
                return fm_fail(err, FM_ERR_BACKEND,
                               "cuBLASLt: FP8 matmul D[%lld, %d] = A[%lld, %lld]^T B[%lld, %d] "
                               "(%s, remembered algorithm) failed: %s (%s)",
                               (long long)g->N, n, (long long)g->K, (long long)g->N, (long long)g->K, n, what,
                               cublasLtGetStatusName(s), cublasLtGetStatusString(s));
            return FM_OK;
        }
        if (g->cache_key[h] == 0) {
            slot = h;
            break;
        }
    }

    // first use of this key: the heuristic, told this call's exact alignments (C is D)
    LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(lt->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t res[LT_ALGOS];
    int found = 0;
    cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt->handle, g->desc, g->a, g->b, g->d, g->d, lt->pref, LT_ALGOS, res, &found);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
        return fm_fail(err, FM_ERR_BACKEND,
                       "cuBLASLt: cublasLtMatmulAlgoGetHeuristic for FP8 D[%lld, %d] (%s) failed: %s (%s)",
                       (long long)g->N, n, what, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
    if (s != CUBLAS_STATUS_SUCCESS) found = 0; // NOT_SUPPORTED: no algorithm at all
    int tried = 0;
    s = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < found; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > LT_WORKSPACE) continue;
        tried++;
        // a refused candidate enqueues nothing; any status but NOT_SUPPORTED is not about the algorithm
        s = cublasLtMatmul(lt->handle, g->desc, &alpha, A, g->a, B, g->b, &beta, D, g->d, D, g->d, &res[i].algo,
                           lt->workspace, LT_WORKSPACE, stream);
        if (s == CUBLAS_STATUS_SUCCESS) {
            if (slot >= 0) g->cache_key[slot] = key, g->cache_algo[slot] = res[i].algo;
            return FM_OK;
        }
        if (s != CUBLAS_STATUS_NOT_SUPPORTED) break;
    }
    return fm_fail(
        err, FM_ERR_BACKEND,
        "cuBLASLt: no FP8 algorithm runs D[%lld, %d] bf16 = A[%lld, %lld]^T B[%lld, %d] e4m3 "
        "(%s; A, B, D aligned %u, %u, %u bytes): %d found, %d tried, last %s (CUBLASLT_LOG_LEVEL=5 says why)",
        (long long)g->N, n, (long long)g->K, (long long)g->N, (long long)g->K, n, what, al_a, al_b, al_d, found, tried,
        cublasLtGetStatusName(s));
}
