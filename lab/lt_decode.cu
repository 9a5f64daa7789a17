// lab: cuBLASLt FP8 at decode sizes, every candidate the heuristic offers and the split-K variants of its first,
// timed where the engine runs them (the weights not in L2, launches under a CUDA graph).
//
//   make -C lab lt_decode           -> build/lab/lt_decode (run from the repository root)
//   ./build/lab/lt_decode           Qwen3-30B-A3B's q|k|v (N 5120, K 2048) and o (N 2048, K 4096) at n = 1..64 rows
//   ./build/lab/lt_decode N K n...  one shape
//
// Why: with `--dense w8a8` the fp8 + w8a8 preset's attention projections at B = 64 run at ~550 GB/s a step
// (docs/RESULTS.md 2.34, per op, H100) against 3.4 TB/s; the engine takes the heuristic's first candidate that runs
// (src/backend/cuda/cublaslt_fp8.cu). This program says whether another candidate, or the first with its K split,
// is faster at these shapes, and by how much: the answer decides whether the engine times candidates at warm-up.
//
// The GEMM is the engine's (cublaslt_fp8.cu's header): D [n, N] bf16 = sA sB W [N, K]^T x [n, K], both operands
// e4m3 K-major, fp32 scales from device pointers, compute 32F, fast accumulation off. Each launch reads its own copy
// of W from a ring whose bytes exceed the L2 (the engine's weights are read once a step, never from L2); a graph of
// ITER launches is timed, median of REPS. Every candidate's D is compared with the first's (max |diff| relative to
// max |D|): split-K and other tilings sum in other orders, so small differences are expected, large ones are a bug.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                        \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define LK(x)                                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusName(s_));                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define CANDIDATES 32
#define WORKSPACE (32u << 20)
#define RING_BYTES (256ull << 20) /* > any GPU's L2 by 4x */
#define ITER 50
#define REPS 7

typedef struct {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    void *ws;
    float *scales; /* sA, sB */
} lt_t;

static void lt_setup(lt_t *l, int64_t N, int64_t K, int64_t n) {
    LK(cublasLtCreate(&l->h));
    LK(cublasLtMatmulDescCreate(&l->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(l->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(l->desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
    CK(cudaMalloc(&l->scales, 64));
    /* each scale its own 16-byte slot (cublaslt_fp8.cu: cuBLASLt refuses 4-byte-aligned scale pointers) */
    const float host[8] = {0.01f, 0, 0, 0, 0.02f, 0, 0, 0};
    CK(cudaMemcpy(l->scales, host, sizeof host, cudaMemcpyHostToDevice));
    const float *sa = l->scales, *sb = l->scales + 4;
    LK(cublasLtMatmulDescSetAttribute(l->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    LK(cublasLtMatmulDescSetAttribute(l->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    LK(cublasLtMatrixLayoutCreate(&l->a, CUDA_R_8F_E4M3, K, N, K));
    LK(cublasLtMatrixLayoutCreate(&l->b, CUDA_R_8F_E4M3, K, n, K));
    LK(cublasLtMatrixLayoutCreate(&l->d, CUDA_R_16BF, N, n, N));
    LK(cublasLtMatmulPreferenceCreate(&l->pref));
    const uint64_t ws = WORKSPACE;
    LK(cublasLtMatmulPreferenceSetAttribute(l->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CK(cudaMalloc(&l->ws, WORKSPACE));
}

static void lt_teardown(lt_t *l) {
    cublasLtMatmulPreferenceDestroy(l->pref);
    cublasLtMatrixLayoutDestroy(l->a), cublasLtMatrixLayoutDestroy(l->b), cublasLtMatrixLayoutDestroy(l->d);
    cublasLtMatmulDescDestroy(l->desc);
    cublasLtDestroy(l->h);
    cudaFree(l->ws), cudaFree(l->scales);
}

static void fill_e4m3(uint8_t *d, size_t bytes) {
    uint8_t *h = (uint8_t *)malloc(bytes);
    uint32_t s = 12345;
    for (size_t i = 0; i < bytes; i++) {
        s = s * 1664525u + 1013904223u;
        /* sign, exponent 3..10 (values ~2^-4..2^3), any mantissa: no NaN (0x7f / 0xff) */
        h[i] = (uint8_t)(((s >> 31) << 7) | ((3 + ((s >> 20) & 7)) << 3) | ((s >> 12) & 7));
    }
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
}

static const char *algo_text(const cublasLtMatmulAlgo_t *a, char *buf, size_t len) {
    int id = 0, tile = 0, splitk = 0, stages = 0, red = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    snprintf(buf, len, "algo %d tile %d stages %d splitk %d red %d", id, tile, stages, splitk, red);
    return buf;
}

/* one launch on ring copy i; false when cuBLASLt refuses the algorithm */
static bool launch(lt_t *l, const cublasLtMatmulAlgo_t *algo, const uint8_t *w, const uint8_t *x, __nv_bfloat16 *d,
                   cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(l->h, l->desc, &alpha, w, l->a, x, l->b, &beta, d, l->d, d, l->d, algo, l->ws, WORKSPACE,
                          s) == CUBLAS_STATUS_SUCCESS;
}

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* median microseconds per launch over the ring, or -1 when refused */
static float time_algo(lt_t *l, const cublasLtMatmulAlgo_t *algo, const uint8_t *ring, int copies, size_t wbytes,
                       const uint8_t *x, __nv_bfloat16 *d, cudaStream_t s) {
    if (!launch(l, algo, ring, x, d, s)) return -1.0f;
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < ITER; i++) launch(l, algo, ring + (size_t)(i % copies) * wbytes, x, d, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[REPS];
    CK(cudaGraphLaunch(ge, s)); /* warm */
    for (int r = 0; r < REPS; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, REPS, sizeof t[0], cmp_f);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return t[REPS / 2] * 1000.0f / ITER;
}

static float diff_rel(const __nv_bfloat16 *d, const float *ref, size_t cnt) {
    __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(cnt * sizeof *h);
    CK(cudaMemcpy(h, d, cnt * sizeof *h, cudaMemcpyDeviceToHost));
    float mx = 0, md = 0;
    for (size_t i = 0; i < cnt; i++) {
        mx = fmaxf(mx, fabsf(ref[i]));
        md = fmaxf(md, fabsf(__bfloat162float(h[i]) - ref[i]));
    }
    free(h);
    return mx > 0 ? md / mx : md;
}

static void run_shape(int64_t N, int64_t K, int64_t n, double peak_gbs) {
    lt_t l;
    lt_setup(&l, N, K, n);
    const size_t wbytes = (size_t)N * K;
    const int copies = (int)(RING_BYTES / wbytes) > 1 ? (int)(RING_BYTES / wbytes) : 2;
    uint8_t *ring, *x;
    __nv_bfloat16 *d;
    CK(cudaMalloc(&ring, wbytes * copies));
    CK(cudaMalloc(&x, (size_t)n * K));
    CK(cudaMalloc(&d, (size_t)n * N * sizeof *d));
    fill_e4m3(ring, wbytes);
    for (int i = 1; i < copies; i++) CK(cudaMemcpy(ring + wbytes * i, ring, wbytes, cudaMemcpyDeviceToDevice));
    fill_e4m3(x, (size_t)n * K);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    int found = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(l.h, l.desc, l.a, l.b, l.d, l.d, l.pref, CANDIDATES, res, &found));
    const double floor_us = (wbytes + (double)n * K + 2.0 * n * N) / (peak_gbs * 1e3);
    printf("\n## N %lld K %lld n %lld: %d candidates; read floor %.2f us at %.0f GB/s\n", (long long)N, (long long)K,
           (long long)n, found, floor_us, peak_gbs);
    printf("| candidate | config | us | GB/s | vs first | max diff / max |D| |\n|---|---|---:|---:|---:|---:|\n");
    /* the reference D: the first candidate that runs */
    float *ref = (float *)malloc((size_t)n * N * sizeof *ref);
    int first = -1;
    for (int i = 0; i < found && first < 0; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && launch(&l, &res[i].algo, ring, x, d, s)) first = i;
    if (first < 0) {
        printf("no candidate runs\n");
    } else {
        CK(cudaStreamSynchronize(s));
        __nv_bfloat16 *h = (__nv_bfloat16 *)malloc((size_t)n * N * sizeof *h);
        CK(cudaMemcpy(h, d, (size_t)n * N * sizeof *h, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)n * N; i++) ref[i] = __bfloat162float(h[i]);
        free(h);
        float t_first = -1, best = 1e30f;
        char buf[128], best_text[200] = "";
        /* every candidate, then the first's split-K variants */
        const int splits[] = {2, 3, 4, 6, 8, 12, 16};
        const int n_split = (int)(sizeof splits / sizeof splits[0]);
        for (int i = 0; i < found + n_split; i++) {
            cublasLtMatmulAlgo_t algo;
            char name[32];
            if (i < found) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                algo = res[i].algo;
                snprintf(name, sizeof name, "heuristic %d", i);
            } else {
                algo = res[first].algo;
                const int sk = splits[i - found];
                const cublasLtReductionScheme_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
                if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) ||
                    cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                         sizeof red))
                    continue;
                cublasLtMatmulHeuristicResult_t chk;
                if (cublasLtMatmulAlgoCheck(l.h, l.desc, l.a, l.b, l.d, l.d, &algo, &chk) != CUBLAS_STATUS_SUCCESS ||
                    chk.workspaceSize > WORKSPACE)
                    continue;
                snprintf(name, sizeof name, "first, split %d", sk);
            }
            const float us = time_algo(&l, &algo, ring, copies, wbytes, x, d, s);
            if (us < 0) continue;
            CK(cudaMemset(d, 0, (size_t)n * N * sizeof *d));
            launch(&l, &algo, ring, x, d, s);
            CK(cudaStreamSynchronize(s));
            const float df = diff_rel(d, ref, (size_t)n * N);
            if (t_first < 0) t_first = us;
            algo_text(&algo, buf, sizeof buf);
            if (us < best) best = us, snprintf(best_text, sizeof best_text, "%s (%s)", name, buf);
            printf("| %s | %s | %.2f | %.0f | %.2fx | %.1e |\n", name, buf, us, (wbytes + (double)n * K) / (us * 1e3),
                   t_first / us, df);
        }
        printf("\nbest: %.2f us, %s; first %.2f us; floor %.2f us\n", best, best_text, t_first, floor_us);
        printf("SUMMARY N %lld K %lld n %lld first %.2f best %.2f floor %.2f\n", (long long)N, (long long)K,
               (long long)n, t_first, best, floor_us);
    }
    free(ref);
    CK(cudaStreamDestroy(s));
    cudaFree(ring), cudaFree(x), cudaFree(d);
    lt_teardown(&l);
}

int main(int argc, char **argv) {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    /* the copy ceiling measured on the H200 (bench/NOTES.md), ~3.35 TB/s on the H100: the floor's bandwidth */
    const double peak = strstr(p.name, "H200") ? 4250.0 : 3350.0;
    printf("# %s, cuBLASLt %zu\n", p.name, cublasLtGetVersion());
    if (argc >= 4) {
        for (int i = 3; i < argc; i++) run_shape(atoll(argv[1]), atoll(argv[2]), atoll(argv[i]), peak);
        return 0;
    }
    const int64_t shapes[2][2] = {{5120, 2048}, {2048, 4096}};
    const int64_t rows[] = {1, 8, 16, 32, 64};
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < 5; r++) run_shape(shapes[s][0], shapes[s][1], rows[r], peak);
    return 0;
}
