// lab: a prefill-size W8A8 GEMM of our own (sm_90a, TMA + wgmma) against cuBLASLt FP8 (lab/README.md).
//
//   make -C lab gemm_w8a8            -> build/lab/gemm_w8a8 (run it from the repository root)
//   ./build/lab/gemm_w8a8            validate both tile widths and cuBLASLt at every shape, then time them
//   ./build/lab/gemm_w8a8 --small    the small shapes only, no timing (for compute-sanitizer)
//
// It was the engine's opt-in W8A8 prefill route until it measured 0.77-0.83x of cuBLASLt at M = 2048 and far less
// below (bench/NOTES.md 2026-11-30, "A W8A8 prefill GEMM of our own"): it wins nowhere, so the engine keeps cuBLASLt
// and the kernel lives here.
//
// The kernel: y [M, N] bf16 = sx sw x [M, K] W^T, both operands e4m3 K-major with one fp32 scale each (device
// pointers), fp32 accumulation, the scales and the bf16 rounding in the epilogue.
//
// Tiles: BM = 128 activation rows (two consumer warpgroups, one wgmma m64 block each) x BN weight rows (wgmma n =
// BN, 128 or 256) x 128 bytes of K per stage, STAGES stages; one persistent CTA per SM walks the tiles. A producer warp
// loads both operand tiles of a stage with bulk tensor copies (TMA, cp.async.bulk.tensor.2d, 128-byte swizzle, zero
// fill past the matrix edges) onto the stage's "full" mbarrier; each consumer warpgroup waits on it, issues the stage's
// 4 wgmma.m64nBNk32 with both operands read by the tensor cores from shared memory (SASS: QGMMA), and once the next
// stage's wgmmas are issued and this stage's have completed (one commit group kept in flight) arrives on the stage's
// "empty" barrier, which the producer waits on before it reuses the stage. The epilogue writes the fp32 accumulator x
// sx sw as bf16 straight from the wgmma fragment.
//
// Floor: FLOPs / ~1.3 PFLOP/s (Qwen3-30B-A3B q|k|v at M = 2048: 43 GFLOP, 33 us); cuBLASLt FP8 reaches ~1.06
// PFLOP/s on these shapes (bench gemm). lab/README.md has what this kernel reaches.
#include <cuda.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/wgmma_ss_e4m3.cuh"
#include "backend/cuda/bulk_copy.cuh"
extern "C" {
#include "quant/e4m3.h"
}

#define BM 128
#define BK 128 // bytes of K (e4m3 elements) per stage: one 128-byte swizzle row
#define STAGES 4
#define CONSUMERS 2                     // warpgroups
#define THREADS ((CONSUMERS + 1) * 128) // the producer is one warp of a third warpgroup (the rest idle)

template <int BN> struct tile_smem {
    static constexpr int a_bytes = BM * BK, b_bytes = BN * BK, stage = a_bytes + b_bytes;
    static constexpr int bytes = STAGES * stage + 1024; // + alignment slack for the 1024-byte swizzle atoms
};

// (wgmma_ss: src/backend/cuda/wgmma_ss_e4m3.cuh)

template <int BN>
static __global__ __launch_bounds__(THREADS, 1) void w8a8_wgmma_kernel(const __grid_constant__ CUtensorMap map_x,
                                                                       const __grid_constant__ CUtensorMap map_w,
                                                                       int64_t M, int64_t N, int64_t K,
                                                                       const float *x_scale, const float *w_scale,
                                                                       __nv_bfloat16 *y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kb_count = (int)((K + BK - 1) / BK);
    const int64_t tiles_n = (N + BN - 1) / BN, tiles = (M + BM - 1) / BM * tiles_n;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) bulk_barrier_init(&full[s], 1), bulk_barrier_init(&empty[s], CONSUMERS);
        FM_BULK_ASM("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    pdl_wait(); /* x comes from the kernel before */

    /* persistent: CTA b takes tiles b, b + grid, ... (n fastest); the ring's stage and phase follow one running
       count of k blocks across tiles, so the producer loads the next tile while the consumers store this one */
    if (wg == CONSUMERS) { /* the producer: one thread of its first warp */
        if (warp == CONSUMERS * 4 && lane == 0) {
            int64_t it = 0;
            for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (int)(tile / tiles_n * BM), n0 = (int)(tile % tiles_n * BN);
                for (int kb = 0; kb < kb_count; kb++, it++) {
                    const int s = (int)(it % STAGES);
                    if (it >= STAGES) bulk_barrier_wait(&empty[s], (uint32_t)((it / STAGES - 1) & 1));
                    uint8_t *a = smem + s * tile_smem<BN>::stage, *b = a + tile_smem<BN>::a_bytes;
                    bulk_barrier_expect(&full[s], tile_smem<BN>::stage);
                    bulk_tensor_load_2d(a, &map_x, kb * BK, m0, &full[s]);
                    bulk_tensor_load_2d(b, &map_w, kb * BK, n0, &full[s]);
                }
            }
        }
        return;
    }

    const float sc = __ldg(x_scale) * __ldg(w_scale);
    const int g = lane >> 2, t = lane & 3;
    int64_t it = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
        float acc[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
        for (int kb = 0; kb < kb_count; kb++, it++) {
            const int s = (int)(it % STAGES);
            bulk_barrier_wait(&full[s], (uint32_t)((it / STAGES) & 1));
            const uint32_t a = smem_u32(smem + s * tile_smem<BN>::stage), b = a + tile_smem<BN>::a_bytes;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 32; ks++)
                wgmma_ss<BN>(acc, desc_sw128(a + wg * 64 * BK + 32 * ks), desc_sw128(b + 32 * ks), 1);
            wgmma_commit();
            wgmma_wait<1>(); /* this stage's group may still run; the one before has read its stage, which goes back */
            if (kb > 0 && (threadIdx.x & 127) == 0) bulk_barrier_arrive(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) fence_f(acc[nt][i]);
        if ((threadIdx.x & 127) == 0) bulk_barrier_arrive(&empty[(it - 1) % STAGES]);

        /* epilogue: warp w of the warpgroup holds rows 16 w .. 16 w + 15 of its m64 block; lane (g, t) rows g, g + 8,
           columns 8 nt + 2 t, + 1 */
        const int64_t r0 = m0 + wg * 64 + (warp & 3) * 16 + g;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            const int64_t c = n0 + nt * 8 + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t r = r0 + 8 * h;
                if (r >= M || c >= N) continue;
                __nv_bfloat162 v = __floats2bfloat162_rn(acc[nt][2 * h] * sc, acc[nt][2 * h + 1] * sc);
                if (c + 1 < N) *(__nv_bfloat162 *)(y + r * N + c) = v;
                else y[r * N + c] = v.x;
            }
        }
    }
#else
    (void)map_x, (void)map_w, (void)M, (void)N, (void)K, (void)x_scale, (void)w_scale, (void)y;
    __trap();
#endif
}

// ---- host: tensor maps (the driver's encoder, reached through the runtime: no -lcuda) ----

// (the encoder: src/backend/cuda/tensor_map.cuh)

// rows x cols bytes (row stride ld) as a 2-D tensor of tiles box_rows x 128 bytes, 128-byte swizzle, zeros past the
// edges
static CUtensorMap tile_map(const uint8_t *base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    const CUresult r = fm_tensor_map_encoder("lab")(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fp8moe: cuTensorMapEncodeTiled failed (%d) for %lld x %lld bytes, ld %lld\n", (int)r,
                (long long)rows, (long long)cols, (long long)ld);
        abort();
    }
    return map;
}

// One launch of the BN variant: a persistent grid of min(tiles, SMs) CTAs, launched with PDL (as the engine did).
template <int BN>
static void launch_wgmma(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                         const float *x_scale, __nv_bfloat16 *y, int sms, cudaStream_t s) {
    static bool allowed = false;
    const void *fn = (const void *)w8a8_wgmma_kernel<BN>;
    const CUtensorMap mx = tile_map(x, M, ld, ld, BM), mw = tile_map(W, N, ld, ld, BN);
    int64_t K = ld;
    if (!allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, tile_smem<BN>::bytes));
        allowed = true;
    }
    void *args[] = {(void *)&mx, (void *)&mw,      (void *)&M,       (void *)&N,
                    (void *)&K,  (void *)&x_scale, (void *)&w_scale, (void *)&y};
    const int64_t tiles = fm_ceil_div(N, BN) * fm_ceil_div(M, BM);
    fm_cuda_launch_pdl(fn, dim3((unsigned)(tiles < sms ? tiles : sms)), dim3(THREADS), tile_smem<BN>::bytes, s, args,
                       true);
    FM_LAUNCH_CHECK("w8a8_wgmma");
}

// ---- the lab harness ----

enum { V_WGMMA256, V_WGMMA128, V_CUBLASLT, VARIANTS };
static const char *const variant_name[VARIANTS] = {"wgmma BM128 BN256 (4 stages)", "wgmma BM128 BN128 (4 stages)",
                                                   "cuBLASLt FP8 (the engine's route)"};

#define GUARD 4096       // bf16 elements of poison after the output
#define FLOOR_TFS 1300.0 // FP8 dense rate measured on the H200 (bench/NOTES.md; DESIGN.md), TFLOP/s
#define THRESHOLD 1e-2   // ||y - ref|| / ||ref||: one bf16 rounding of the output, fp32 accumulation

typedef struct problem {
    int64_t M, N, K;
    uint8_t *x, *w;   // device e4m3 [M][K], [N][K]
    float *scales;    // device: x scale at [0], w scale at [FM_LT_SCALE_SLOT] (16-byte slots)
    uint8_t *hx, *hw; // host codes
    float sx, sw;
    __nv_bfloat16 *y; // device [M][N] + GUARD
} problem;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* (0, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

// n values to e4m3 codes with one per-tensor scale (the engine's W8A8 recipe: amax / 448); returns the scale
static float quantize(const float *v, int64_t n, uint8_t *codes) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float s = fmaxf(amax / 448.0f, 1e-12f);
    for (int64_t i = 0; i < n; i++) codes[i] = fm_f32_to_e4m3(v[i] / s);
    return s;
}

// x ~ N(0, 1) with every 97th channel x8 (outliers, as bench gemm), W ~ U(-1, 1) / sqrt(K)
static void problem_init(problem *p, int64_t M, int64_t N, int64_t K) {
    p->M = M, p->N = N, p->K = K;
    float *v = (float *)malloc((size_t)((M > N ? M : N) * K) * sizeof(float));
    p->hx = (uint8_t *)malloc((size_t)(M * K)), p->hw = (uint8_t *)malloc((size_t)(N * K));
    for (int64_t i = 0; i < M * K; i++) v[i] = (float)normal() * (i % K % 97 == 0 ? 8.0f : 1.0f);
    p->sx = quantize(v, M * K, p->hx);
    for (int64_t i = 0; i < N * K; i++) v[i] = (float)((2.0 * uniform() - 1.0) / sqrt((double)K));
    p->sw = quantize(v, N * K, p->hw);
    free(v);
    const float hs[2 * FM_LT_SCALE_SLOT] = {p->sx, 0, 0, 0, p->sw, 0, 0, 0};
    FM_CUDA_CHECK(cudaMalloc(&p->x, (size_t)(M * K)));
    FM_CUDA_CHECK(cudaMalloc(&p->w, (size_t)(N * K)));
    FM_CUDA_CHECK(cudaMalloc(&p->scales, sizeof hs));
    FM_CUDA_CHECK(cudaMalloc(&p->y, (size_t)(M * N + GUARD) * sizeof(__nv_bfloat16)));
    FM_CUDA_CHECK(cudaMemcpy(p->x, p->hx, (size_t)(M * K), cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->w, p->hw, (size_t)(N * K), cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->scales, hs, sizeof hs, cudaMemcpyHostToDevice));
}

static void problem_free(problem *p) {
    cudaFree(p->x), cudaFree(p->w), cudaFree(p->scales), cudaFree(p->y);
    free(p->hx), free(p->hw);
}

static void run(int v, problem *p, fm_lt *lt, fm_lt_gemm *g, int sms, cudaStream_t s) {
    const float *sx = p->scales, *sw = p->scales + FM_LT_SCALE_SLOT;
    if (v == V_WGMMA256) launch_wgmma<256>(p->w, p->N, p->K, sw, p->x, p->M, sx, p->y, sms, s);
    else if (v == V_WGMMA128) launch_wgmma<128>(p->w, p->N, p->K, sw, p->x, p->M, sx, p->y, sms, s);
    else {
        fm_error err = {{0}};
        if (fm_lt_gemm_run(lt, g, p->w, sw, p->x, sx, (int)p->M, p->y, s, "lab", &err)) {
            fprintf(stderr, "cuBLASLt: %s\n", err.msg);
            exit(1);
        }
    }
}

// float64 reference of row m: y[n] = sx sw sum_k x[m][k] w[n][k] over the decoded codes
static void reference_row(const problem *p, const float *dec, int64_t m, double *ref) {
#pragma omp parallel for
    for (int64_t n = 0; n < p->N; n++) {
        double acc = 0.0;
        for (int64_t k = 0; k < p->K; k++) acc += (double)dec[p->hx[m * p->K + k]] * (double)dec[p->hw[n * p->K + k]];
        ref[n] = acc * (double)p->sx * (double)p->sw;
    }
}

static float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Output poisoned (NaN, guard after it), one run, then: the guard intact, every element written and finite, and
// ||y - ref|| / ||ref|| over every row (M <= 512) or 64 sampled rows. Returns the error, or -1 on a failed check.
static double validate(int v, problem *p, fm_lt *lt, fm_lt_gemm *g, const float *dec, int sms, cudaStream_t s) {
    const int64_t n_out = p->M * p->N;
    FM_CUDA_CHECK(cudaMemsetAsync(p->y, 0xFF, (size_t)(n_out + GUARD) * sizeof(__nv_bfloat16), s));
    run(v, p, lt, g, sms, s);
    uint16_t *y = (uint16_t *)malloc((size_t)(n_out + GUARD) * sizeof(uint16_t));
    FM_CUDA_CHECK(cudaMemcpyAsync(y, p->y, (size_t)(n_out + GUARD) * sizeof(uint16_t), cudaMemcpyDeviceToHost, s));
    FM_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int64_t i = 0; i < GUARD; i++)
        if (y[n_out + i] != 0xFFFF) {
            printf("    guard overwritten at +%lld\n", (long long)i);
            free(y);
            return -1;
        }
    for (int64_t i = 0; i < n_out; i++)
        if (!isfinite(bf16_to_f32(y[i]))) {
            printf("    element %lld (row %lld, col %lld) not written or not finite\n", (long long)i,
                   (long long)(i / p->N), (long long)(i % p->N));
            free(y);
            return -1;
        }
    const int64_t rows = p->M <= 512 ? p->M : 64;
    double *ref = (double *)malloc((size_t)p->N * sizeof(double)), num = 0.0, den = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t m = p->M <= 512 ? r : (r * 7919) % p->M;
        reference_row(p, dec, m, ref);
        for (int64_t n = 0; n < p->N; n++) {
            const double d = (double)bf16_to_f32(y[m * p->N + n]) - ref[n];
            num += d * d, den += ref[n] * ref[n];
        }
    }
    free(ref), free(y);
    return sqrt(num / (den > 0 ? den : 1.0));
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// median ms of `samples` launches, each after an L2 flush (a 256 MiB memset: the H200's L2 is 60 MB)
static float time_median(int v, problem *p, fm_lt *lt, fm_lt_gemm *g, int sms, cudaStream_t s, void *flush,
                         size_t flush_bytes) {
    enum { WARMUP = 5, SAMPLES = 30 };
    cudaEvent_t a, b;
    FM_CUDA_CHECK(cudaEventCreate(&a));
    FM_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < WARMUP; i++) run(v, p, lt, g, sms, s);
    float ms[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) {
        FM_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, s));
        FM_CUDA_CHECK(cudaEventRecord(a, s));
        run(v, p, lt, g, sms, s);
        FM_CUDA_CHECK(cudaEventRecord(b, s));
        FM_CUDA_CHECK(cudaEventSynchronize(b));
        FM_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    qsort(ms, SAMPLES, sizeof *ms, cmp_float);
    return ms[SAMPLES / 2];
}

int main(int argc, char **argv) {
    const bool small = argc > 1 && !strcmp(argv[1], "--small");
    if (argc > 2 || (argc == 2 && !small)) {
        fprintf(stderr, "usage: %s [--small]\n", argv[0]);
        return 2;
    }
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) {
        fprintf(stderr, "gemm_w8a8: the wgmma kernel needs an sm_90 GPU (this is %s, sm_%d%d)\n", prop.name, prop.major,
                prop.minor);
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    printf("%s, %d SMs; FP8 floor %.0f TFLOP/s\n", prop.name, sms, FLOOR_TFS);
    float dec[256];
    for (int c = 0; c < 256; c++) dec[c] = fm_e4m3_to_f32((uint8_t)c);
    cudaStream_t s;
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fm_lt lt;
    fm_error err = {{0}};
    if (fm_lt_init(&lt, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }

    // validation: odd M, N not a multiple of either BN, K not a multiple of 128 (TMA zero-fills past the edges),
    // and the Qwen3-30B-A3B projections (q|k|v 5120 x 2048, o 2048 x 4096)
    static const int64_t shapes[][3] = {{1, 160, 96},      {3, 208, 336},     {17, 400, 272},     {300, 5120, 2048},
                                        {129, 2048, 4096}, {1000, 1040, 528}, {2048, 5120, 2048}, {2048, 2048, 4096}};
    const int n_shapes = small ? 3 : (int)(sizeof shapes / sizeof *shapes);
    int checks = 0, failed = 0;
    double worst = 0.0;
    printf("\nvalidation (threshold %.0e; poisoned output, %d-element guard):\n", THRESHOLD, GUARD);
    for (int i = 0; i < n_shapes; i++) {
        problem p;
        fm_lt_gemm g;
        problem_init(&p, shapes[i][0], shapes[i][1], shapes[i][2]);
        if (fm_lt_gemm_init(&g, p.N, p.K, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        for (int v = 0; v < VARIANTS; v++) {
            const double e = validate(v, &p, &lt, &g, dec, sms, s);
            const bool ok = e >= 0 && e <= THRESHOLD;
            printf("  M %5lld N %5lld K %5lld  %-34s err %.3e  %s\n", (long long)p.M, (long long)p.N, (long long)p.K,
                   variant_name[v], e, ok ? "ok" : "FAILED");
            checks++, failed += !ok, worst = e > worst ? e : worst;
        }
        fm_lt_gemm_destroy(&g);
        problem_free(&p);
    }
    printf("%d checks, %d failed; worst relative error %.3e\n", checks, failed, worst);
    if (failed || small) {
        fm_lt_destroy(&lt);
        return failed ? 1 : 0;
    }

    // timing: the Qwen3-30B-A3B attention projections
    const size_t flush_bytes = (size_t)256 << 20;
    void *flush = NULL;
    FM_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    static const int64_t proj[][2] = {{5120, 2048}, {2048, 4096}};
    static const int64_t rows[] = {1, 16, 128, 2048};
    printf("\ntiming (CUDA events, 5 warm-ups, median of 30 launches, each after a 256 MiB L2 flush):\n");
    printf("  %-10s %-6s %-34s %10s %9s %7s %9s\n", "N x K", "M", "variant", "ms", "TFLOP/s", "% floor", "x cuBLASLt");
    for (int j = 0; j < 2; j++)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
            problem p;
            fm_lt_gemm g;
            problem_init(&p, rows[r], proj[j][0], proj[j][1]);
            if (fm_lt_gemm_init(&g, p.N, p.K, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            float ms[VARIANTS];
            for (int v = 0; v < VARIANTS; v++) ms[v] = time_median(v, &p, &lt, &g, sms, s, flush, flush_bytes);
            const double flops = 2.0 * (double)p.M * (double)p.N * (double)p.K;
            for (int v = 0; v < VARIANTS; v++) {
                const double tfs = flops / (ms[v] * 1e-3) / 1e12;
                printf("  %5lldx%-4lld %-6lld %-34s %10.4f %9.1f %7.1f %9.2fx\n", (long long)p.N, (long long)p.K,
                       (long long)p.M, variant_name[v], ms[v], tfs, 100.0 * tfs / FLOOR_TFS, ms[V_CUBLASLT] / ms[v]);
            }
            fm_lt_gemm_destroy(&g);
            problem_free(&p);
        }
    cudaFree(flush);
    fm_lt_destroy(&lt);
    cudaStreamDestroy(s);
    return 0;
}
