// lab: the grouped W4A8 GEMM (src/backend/cuda/w4a8_gemm.cu, fm_cuda_w4a8_gemm), llm.c dev/cuda style: random int4
// weights (codes -7..7, bf16 scales per 128-group) and e4m3 activations (one fp32 scale per row and 128-group), a
// float64 reference of exactly this product on the host, validation of each kernel route, then timings at the shapes
// of real models beside their floors.
//
//   make -C lab w4a8_gemm && ./build/lab/w4a8_gemm     validate every shape and route, then time (sm_90: all routes)
//   ./build/lab/w4a8_gemm --small                      the small shapes only, no timing (for compute-sanitizer)
//   ./build/lab/w4a8_gemm --profile                    only the Qwen3 gate|up shape at T = 2048, wgmma (for ncu)
//
// The op: y[slot][n] = sum over 128-groups g of ws[e][g][n] xs[g][slot] sum_{k in g} q[e][n][k] x8[slot][k], for each
// slot of a tile routed to matrix e, bf16 out (epilogue FM_W4A8_OUT_BF16; the engine's gate|up GEMM runs the SwiGLU
// epilogue instead, whose cost the bf16 one does not include). The engine files are included (not linked) so that
// the lab can instantiate kernel variants the engine does not use; the bank is made by the engine's own repack
// (w4a8_layout.cu) from the row layout.
//
// Floor per problem: max(int4 bytes of the touched matrices + x + y / 4.25 TB/s, FLOPs / 1.3 PFLOP/s), the H200's
// measured copy and cuBLASLt FP8 rates (bench/NOTES.md).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/w4a8_gemm.cu"
#include "backend/cuda/w4a8_layout.cu"
extern "C" {
#include "quant/e4m3.h"
}

// the launcher's messages name the bank format (src/backend/backend.c, which would bring the whole backend with it)
extern "C" const char *fm_wformat_name(fm_wformat f) { return f == FM_W_INT4_G128_TC ? "int4-g128-tc" : "other"; }

#define THRESHOLD 1e-2 /* ||y - ref|| / ||ref|| over the checked rows */
#define GUARD 4096     /* bf16 elements after y that no launch may touch */
#define COPY_TBS 4.25
#define FP8_TFS 1300.0

// ---------------------------------------------------------------------------------------------------------
// host random numbers (stateless, so that the large problems fill in parallel) and bf16

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
static uint64_t seed = 1;
static float rndu(uint64_t i) { return (float)(mix(seed ^ (i * 0x632BE59BD9B4E019ULL)) >> 40) * (1.0f / 16777216.0f); }
static float rndn(uint64_t i) { /* Box-Muller */
    const float u = rndu(2 * i) + 1e-7f, v = rndu(2 * i + 1);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---------------------------------------------------------------------------------------------------------
// a problem: E matrices [N][K] of int4, P activation rows routed to them (rows[e] each, in matrix order, as the
// engine's dispatch lays them out), tiles of `bn` rows

typedef struct problem {
    const char *name;
    int32_t E;
    int64_t N, K, Kp, G, P;
    int32_t *rows;         // [E] routed rows per matrix
    int8_t *q;             // [E][N][K] codes
    uint16_t *ws;          // [E][N][G] bf16 scales (the row layout's order)
    uint8_t *x8;           // [P][Kp] e4m3 codes
    float *xs;             // [G][P]
    fm_bank bank;          // int4-tc on the device
    uint8_t *d_x8;         // [P][Kp]
    float *d_xs;           // [G][P]
    __nv_bfloat16 *d_y;    // [P][N] + GUARD
    fm_w4a8_tile *d_tiles; // per tile height: [max tiles]
    int32_t *d_n_tiles;    // per tile height
    int64_t max_tiles[2];  // tile heights FM_W4A8_BN, FM_W4A8_BN_SMALL
    fm_w4a8_tile *d_tl[2];
    int32_t *d_ntl[2];
} problem;

// Routing: P rows over E matrices, skewed (a matrix's share ~ 1 / (1 + e / 8)) with some matrices given none, or
// uniform (every matrix rows_each). Dense problems: E = 1.
static void problem_init(problem *p, const char *name, int32_t E, int64_t N, int64_t K, int64_t P, bool skewed) {
    memset(p, 0, sizeof *p);
    p->name = name, p->E = E, p->N = N, p->K = K, p->P = P;
    p->Kp = (K + 127) / 128 * 128, p->G = p->Kp / 128;
    p->rows = (int32_t *)calloc((size_t)E, sizeof(int32_t));
    if (!skewed) {
        for (int64_t r = 0; r < P; r++) p->rows[r % E]++;
    } else {
        double tot = 0;
        for (int32_t e = 0; e < E; e++) tot += (e % 5 == 3) ? 0.0 : 1.0 / (1.0 + e / 8.0);
        int64_t left = P;
        for (int32_t e = 0; e < E && left > 0; e++) {
            const double share = (e % 5 == 3) ? 0.0 : 1.0 / (1.0 + e / 8.0) / tot;
            int64_t n = (int64_t)(share * (double)P);
            if (n > left) n = left;
            p->rows[e] = (int32_t)n, left -= n;
        }
        p->rows[0] += (int32_t)left;
    }
    // weights: codes -7..7 (the quantizer never makes -8), scales ~ 0.01 x [0.5, 1.5)
    seed++;
    p->q = (int8_t *)malloc((size_t)(E * N * K));
    p->ws = (uint16_t *)malloc((size_t)(E * N * p->G) * 2);
#pragma omp parallel for
    for (int64_t i = 0; i < E * N * K; i++)
        p->q[i] = (int8_t)((int)(mix(seed * 0x100000001B3ULL + (uint64_t)i) % 15) - 7);
#pragma omp parallel for
    for (int64_t i = 0; i < E * N * p->G; i++) p->ws[i] = f2bf(0.01f * (0.5f + rndu(~(uint64_t)i)));
    // activations: N(0, 1) with every 97th channel x 8 (outliers), quantized per row and 128-group on the host
    p->x8 = (uint8_t *)calloc((size_t)(P * p->Kp), 1);
    p->xs = (float *)malloc((size_t)(p->G * P) * 4);
#pragma omp parallel
    {
        float *row = (float *)malloc((size_t)K * 4), *sc = (float *)malloc((size_t)p->G * 4);
#pragma omp for
        for (int64_t r = 0; r < P; r++) {
            for (int64_t k = 0; k < K; k++)
                row[k] = bf2f(f2bf(rndn((uint64_t)(r * K + k)) * (k % 97 == 0 ? 8.0f : 1.0f)));
            fm_e4m3_quantize_groups(row, K, 128, p->x8 + r * p->Kp, sc);
            for (int64_t g = 0; g < p->G; g++) p->xs[g * P + r] = sc[g];
        }
        free(row), free(sc);
    }

    // the bank: row layout (two's complement nibbles, [E][N][K / 2]) -> the engine's tensor-core repack
    const int64_t ld = (K + 1) / 2, rows_pad = (N + FM_TC_ROW_PAD - 1) / FM_TC_ROW_PAD * FM_TC_ROW_PAD;
    uint8_t *packed = (uint8_t *)calloc((size_t)(E * N * ld), 1);
#pragma omp parallel for
    for (int64_t m = 0; m < E * N; m++)
        for (int64_t k = 0; k < K; k++)
            packed[m * ld + k / 2] |= (uint8_t)(((uint8_t)p->q[m * K + k] & 0xF) << (4 * (k & 1)));
    uint8_t *d_src = NULL;
    __nv_bfloat16 *d_src_scales = NULL;
    int *d_bad = NULL;
    FM_CUDA_CHECK(cudaMalloc((void **)&d_src, (size_t)(E * N * ld)));
    FM_CUDA_CHECK(cudaMalloc((void **)&d_src_scales, (size_t)(E * N * p->G) * 2));
    FM_CUDA_CHECK(cudaMalloc((void **)&d_bad, sizeof(int)));
    FM_CUDA_CHECK(cudaMemcpy(d_src, packed, (size_t)(E * N * ld), cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(d_src_scales, p->ws, (size_t)(E * N * p->G) * 2, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemset(d_bad, 0, sizeof(int)));
    fm_bank *b = &p->bank;
    b->fmt = FM_W_INT4_G128_TC, b->n = E, b->rows = N, b->cols = K, b->n_groups = p->G, b->rows_pad = rows_pad;
    b->interleaved = false, b->ld = p->G * FM_TC_K_GROUP;
    const size_t code_bytes = (size_t)(E * rows_pad * p->G * FM_TC_K_GROUP / 2);
    FM_CUDA_CHECK(cudaMalloc(&b->w, code_bytes));
    FM_CUDA_CHECK(cudaMalloc((void **)&b->scales, (size_t)(E * rows_pad * p->G) * 2));
    fm_cuda_repack_int4_tc(d_src, d_src_scales, E, N, K, ld, p->G, false, (uint8_t *)b->w, b->scales, rows_pad, d_bad,
                           0);
    int bad = 0;
    FM_CUDA_CHECK(cudaMemcpy(&bad, d_bad, sizeof(int), cudaMemcpyDeviceToHost));
    if (bad) {
        fprintf(stderr, "w4a8_gemm lab: %d codes -8 after the repack\n", bad);
        exit(1);
    }
    b->bytes = code_bytes + (size_t)(E * rows_pad * p->G) * 2;
    cudaFree(d_src), cudaFree(d_src_scales), cudaFree(d_bad), free(packed);

    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_x8, (size_t)(P * p->Kp)));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_xs, (size_t)(p->G * P) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_y, (size_t)(P * N + GUARD) * 2));
    FM_CUDA_CHECK(cudaMemcpy(p->d_x8, p->x8, (size_t)(P * p->Kp), cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->d_xs, p->xs, (size_t)(p->G * P) * 4, cudaMemcpyHostToDevice));

    // tiles of each height, as the dispatch plans them (moe_dispatch.cu): matrix order, bn rows at most
    const int32_t heights[2] = {FM_W4A8_BN, FM_W4A8_BN_SMALL};
    for (int h = 0; h < 2; h++) {
        const int32_t bn = heights[h];
        int64_t n = 0;
        for (int32_t e = 0; e < E; e++) n += (p->rows[e] + bn - 1) / bn;
        fm_w4a8_tile *t = (fm_w4a8_tile *)malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
        int64_t i = 0, start = 0;
        for (int32_t e = 0; e < E; e++) {
            for (int32_t r = 0; r < p->rows[e]; r += bn) {
                fm_w4a8_tile tile = {e, (int32_t)(start + r), p->rows[e] - r < bn ? p->rows[e] - r : bn, 0};
                t[i++] = tile;
            }
            start += p->rows[e];
        }
        p->max_tiles[h] = n > 0 ? n : 1;
        const int32_t nt = (int32_t)n;
        FM_CUDA_CHECK(cudaMalloc((void **)&p->d_tl[h], (size_t)p->max_tiles[h] * sizeof *t));
        FM_CUDA_CHECK(cudaMalloc((void **)&p->d_ntl[h], sizeof(int32_t)));
        FM_CUDA_CHECK(cudaMemcpy(p->d_tl[h], t, (size_t)n * sizeof *t, cudaMemcpyHostToDevice));
        FM_CUDA_CHECK(cudaMemcpy(p->d_ntl[h], &nt, sizeof nt, cudaMemcpyHostToDevice));
        free(t);
    }
}

static void problem_free(problem *p) {
    cudaFree(p->bank.w), cudaFree(p->bank.scales), cudaFree(p->d_x8), cudaFree(p->d_xs), cudaFree(p->d_y);
    for (int h = 0; h < 2; h++) cudaFree(p->d_tl[h]), cudaFree(p->d_ntl[h]);
    free(p->rows), free(p->q), free(p->ws), free(p->x8), free(p->xs);
}

// ---------------------------------------------------------------------------------------------------------
// the variants: the engine's launcher on each route (wgmma or mma.sync kernel, tile height)

typedef struct variant {
    const char *name;
    bool wgmma;
    int tile; /* 0: FM_W4A8_BN rows per tile, 1: FM_W4A8_BN_SMALL */
} variant;

static const variant variants[] = {
    {"wgmma, 64-row tiles", true, 0},
    {"wgmma, 16-row tiles", true, 1},
    {"mma.sync, 64-row tiles", false, 0},
};
#define VARIANTS (int)(sizeof variants / sizeof *variants)

static void run(const variant *v, const problem *p, cudaStream_t s) {
    fm_w4a8_args a;
    memset(&a, 0, sizeof a);
    a.w = &p->bank, a.wgmma = v->wgmma, a.x = p->d_x8, a.xs = p->d_xs, a.lds = p->P;
    a.tiles = p->d_tl[v->tile], a.n_tiles = p->d_ntl[v->tile], a.max_tiles = p->max_tiles[v->tile];
    a.tile_rows = v->tile ? FM_W4A8_BN_SMALL : FM_W4A8_BN;
    a.epilogue = FM_W4A8_OUT_BF16, a.y = p->d_y, a.ldy = p->N;
    fm_cuda_w4a8_gemm(&a, s);
}

// ||y - ref|| / ||ref|| over every `stride`-th row (float64 reference), after poisoning y with NaN; -1 when an
// element of a checked row is not finite or the guard changed.
static double validate(const variant *v, const problem *p, int64_t stride, const float *dec, cudaStream_t s) {
    const size_t y_elems = (size_t)(p->P * p->N);
    FM_CUDA_CHECK(cudaMemsetAsync(p->d_y, 0xFF, (y_elems + GUARD) * 2, s)); /* NaN everywhere, guard included */
    run(v, p, s);
    uint16_t *y = (uint16_t *)malloc((y_elems + GUARD) * 2);
    FM_CUDA_CHECK(cudaMemcpyAsync(y, p->d_y, (y_elems + GUARD) * 2, cudaMemcpyDeviceToHost, s));
    FM_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < GUARD; i++)
        if (y[y_elems + i] != 0xFFFF) {
            free(y);
            return -1.0;
        }
    // each slot's matrix
    int32_t *mat = (int32_t *)malloc((size_t)p->P * 4);
    for (int32_t e = 0, slot = 0; e < p->E; e++)
        for (int32_t r = 0; r < p->rows[e]; r++) mat[slot++] = e;
    double num = 0.0, den = 0.0;
    bool finite = true;
#pragma omp parallel for reduction(+ : num, den) reduction(&& : finite) schedule(dynamic)
    for (int64_t slot = 0; slot < p->P; slot += stride) {
        const int32_t e = mat[slot];
        for (int64_t n = 0; n < p->N; n++) {
            const int8_t *q = p->q + ((int64_t)e * p->N + n) * p->K;
            const uint16_t *ws = p->ws + ((int64_t)e * p->N + n) * p->G;
            double ref = 0.0;
            for (int64_t g = 0; g < p->G; g++) {
                double d = 0.0;
                const int64_t k1 = (g + 1) * 128 < p->K ? (g + 1) * 128 : p->K;
                for (int64_t k = g * 128; k < k1; k++) d += (double)q[k] * (double)dec[p->x8[slot * p->Kp + k]];
                ref += d * (double)bf2f(ws[g]) * (double)p->xs[g * p->P + slot];
            }
            const float got = bf2f(y[slot * p->N + n]);
            finite = finite && isfinite(got);
            num += (got - ref) * (got - ref), den += ref * ref;
        }
    }
    free(mat), free(y);
    return finite ? sqrt(num / (den > 0 ? den : 1.0)) : -1.0;
}

// median ms of `samples` launches (CUDA events), each after a 256 MiB memset that flushes the L2 (60 MB)
static float time_median(const variant *v, const problem *p, cudaStream_t s, void *flush, size_t flush_bytes,
                         int samples) {
    for (int i = 0; i < 3; i++) run(v, p, s);
    cudaEvent_t a, b;
    FM_CUDA_CHECK(cudaEventCreate(&a));
    FM_CUDA_CHECK(cudaEventCreate(&b));
    float *ms = (float *)malloc((size_t)samples * 4);
    for (int i = 0; i < samples; i++) {
        FM_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, s));
        FM_CUDA_CHECK(cudaEventRecord(a, s));
        run(v, p, s);
        FM_CUDA_CHECK(cudaEventRecord(b, s));
        FM_CUDA_CHECK(cudaEventSynchronize(b));
        FM_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    for (int i = 1; i < samples; i++) /* insertion sort */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    const float med = ms[samples / 2];
    free(ms);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return med;
}

// floor in ms: bytes (int4 codes and bf16 scales of the matrices with rows, x8 and its scales, y) at the copy rate,
// or FLOPs at the FP8 rate, whichever is larger
static double floor_ms(const problem *p, double *flops_out) {
    int32_t touched = 0;
    for (int32_t e = 0; e < p->E; e++) touched += p->rows[e] > 0;
    const double bytes = (double)touched * (double)p->N * (double)p->Kp * (0.5 + 2.0 / 128.0) +
                         (double)p->P * ((double)p->Kp + 4.0 * (double)p->G) + 2.0 * (double)p->P * (double)p->N;
    const double flops = 2.0 * (double)p->P * (double)p->N * (double)p->K;
    *flops_out = flops;
    const double t_mem = bytes / (COPY_TBS * 1e12) * 1e3, t_fl = flops / (FP8_TFS * 1e12) * 1e3;
    return t_mem > t_fl ? t_mem : t_fl;
}

int main(int argc, char **argv) {
    const bool small = argc > 1 && !strcmp(argv[1], "--small");
    const bool profile = argc > 1 && !strcmp(argv[1], "--profile");
    if (argc > 2 || (argc == 2 && !small && !profile)) {
        fprintf(stderr, "usage: %s [--small | --profile]\n", argv[0]);
        return 2;
    }
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const bool sm90 = prop.major == 9;
    printf("%s (sm_%d%d), %d SMs; floors: copy %.2f TB/s, FP8 %.0f TFLOP/s%s\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, COPY_TBS, FP8_TFS, sm90 ? "" : "; the wgmma routes need sm_90 and are skipped");
    float dec[256];
    for (int c = 0; c < 256; c++) dec[c] = fm_e4m3_to_f32((uint8_t)c);
    cudaStream_t s;
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    if (profile) {
        problem p;
        problem_init(&p, "qwen3 gate|up", 128, 1536, 2048, 2048 * 8, false);
        for (int i = 0; i < 5; i++) run(&variants[0], &p, s);
        FM_CUDA_CHECK(cudaStreamSynchronize(s));
        problem_free(&p);
        return 0;
    }

    // validation: N not a multiple of 256 (nor of 32), K not a multiple of 128, matrices with no rows, tiles with
    // one row, a dense matrix (E = 1)
    struct {
        const char *name;
        int32_t E;
        int64_t N, K, P;
        bool skewed;
    } const shapes[] = {
        {"tiny", 3, 40, 96, 7, true},
        {"odd", 7, 200, 300, 61, true},
        {"dense", 1, 272, 512, 129, false},
        {"qwen3 down", 128, 2048, 768, 1200, true},
        {"qwen3 gate|up", 128, 1536, 2048, 1200, true},
        {"mixtral-like", 8, 1024, 4096, 700, true},
    };
    const int n_shapes = small ? 3 : (int)(sizeof shapes / sizeof *shapes);
    int checks = 0, failed = 0;
    double worst = 0.0;
    printf("\nvalidation (threshold %.0e; y poisoned with NaN, %d-element guard):\n", THRESHOLD, GUARD);
    for (int i = 0; i < n_shapes; i++) {
        problem p;
        problem_init(&p, shapes[i].name, shapes[i].E, shapes[i].N, shapes[i].K, shapes[i].P, shapes[i].skewed);
        for (int v = 0; v < VARIANTS; v++) {
            if (variants[v].wgmma && !sm90) continue;
            const double e = validate(&variants[v], &p, p.P > 200 ? 7 : 1, dec, s);
            const bool ok = e >= 0 && e <= THRESHOLD;
            printf("  %-14s E %3d N %5lld K %5lld rows %5lld  %-24s err %.3e  %s\n", p.name, p.E, (long long)p.N,
                   (long long)p.K, (long long)p.P, variants[v].name, e, ok ? "ok" : "FAILED");
            checks++, failed += !ok, worst = e > worst ? e : worst;
        }
        problem_free(&p);
    }
    printf("%d checks, %d failed; worst relative error %.3e\n", checks, failed, worst);
    if (failed || small) return failed ? 1 : 0;

    // timing at the engine's shapes: one MoE layer's two GEMMs (uniform routing, as random router weights give),
    // and a dense projection
    const size_t flush_bytes = (size_t)256 << 20;
    void *flush = NULL;
    FM_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    struct {
        const char *name;
        int32_t E;
        int64_t N, K, P;
    } const timed[] = {
        {"qwen3 gate|up T=512", 128, 1536, 2048, 512 * 8},
        {"qwen3 down T=512", 128, 2048, 768, 512 * 8},
        {"qwen3 gate|up T=2048", 128, 1536, 2048, 2048 * 8},
        {"qwen3 down T=2048", 128, 2048, 768, 2048 * 8},
        {"qwen3 gate|up T=8192", 128, 1536, 2048, 8192 * 8},
        {"qwen3 down T=8192", 128, 2048, 768, 8192 * 8},
        {"mixtral gate|up T=2048", 8, 28672, 4096, 2048 * 2},
        {"mixtral down T=2048", 8, 4096, 14336, 2048 * 2},
        {"q|k|v M=2048", 1, 5120, 2048, 2048},
        {"o M=2048", 1, 2048, 4096, 2048},
    };
    printf("\ntiming (CUDA events, 3 warm-ups, median of 20 launches, each after a 256 MiB L2 flush):\n");
    printf("  %-24s %-24s %9s %9s %9s %8s\n", "shape", "variant", "ms", "TFLOP/s", "floor ms", "x floor");
    for (size_t i = 0; i < sizeof timed / sizeof *timed; i++) {
        problem p;
        problem_init(&p, timed[i].name, timed[i].E, timed[i].N, timed[i].K, timed[i].P, false);
        double flops;
        const double fl = floor_ms(&p, &flops);
        for (int v = 0; v < VARIANTS; v++) {
            if (variants[v].wgmma && !sm90) continue;
            const float ms = time_median(&variants[v], &p, s, flush, flush_bytes, 20);
            printf("  %-24s %-24s %9.4f %9.1f %9.4f %8.2f\n", p.name, variants[v].name, ms, flops / (ms * 1e-3) / 1e12,
                   fl, ms / fl);
        }
        problem_free(&p);
    }
    cudaFree(flush);
    return 0;
}
