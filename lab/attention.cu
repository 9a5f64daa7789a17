// Lab for fm_cuda_attention (src/backend/cuda/attention.cu), llm.c dev/cuda style: random bf16 qkv, a CPU
// double-precision reference of exactly this op (on the bf16-rounded inputs), validation of the engine's
// launcher and of the tile variants below, then timings.
//
//   make -C lab attention && ./build/lab/attention            validate every shape, then time
//   ./build/lab/attention --small                              small shapes only (for compute-sanitizer)
//   ./build/lab/attention --profile                            only the timing of T = 8192, (32, 4, 128) (for ncu)
//   ./build/lab/attention --wgmma                              only the wgmma kernels (validation, then timing
//                                                              beside the mma.sync engine shapes)
//   ./build/lab/attention --profile-wgmma                      only the wgmma kernel at T = 8192 (for ncu)
//
// The op: qkv [T, (nh + 2 nkv) hd] bf16, out [T, nh hd] bf16, out[t, h] = softmax_j<=t(q_t,h . k_j,h/g / sqrt(hd))
// . v_j,h/g with g = nh / nkv. The engine files are included (not linked) so that the lab can instantiate tile
// configurations other than the engine's: attention.cu (mma.sync, every GPU) and attention_wgmma.cu (wgmma + TMA,
// sm_90 only, hd 128); cuda_common.cu is linked.
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/attention.cu"
#include "backend/cuda/attention_wgmma.cu"

#define PEAK_TFLOPS 790.0 // bf16 dense, measured on this H200 (KINDS.md, 8192^3 product through PyTorch)
#define TOL 1e-2          // ||out - ref|| / ||ref||

// ---------------------------------------------------------------------------------------------------------
// host bf16 and random numbers

static uint16_t f2bf(float f) { // round to nearest even (inputs are finite)
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t rng_next(uint64_t *s) { // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

// qkv ~ N(0, 1) (Box-Muller), with outlier channels: in every head, channels 1 and hd/2 + 3 are 5x larger (q, k
// and v). Row t draws from its own stream (seed, t), so the rows fill in parallel and the data is fixed.
static void make_qkv(uint16_t *h, int64_t T, int nh, int nkv, int hd, uint64_t seed) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd; // even: hd is a multiple of 16
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        uint64_t s = seed * 0x100000001b3ull + (uint64_t)t * 0x9e3779b97f4a7c15ull;
        for (int64_t i = 0; i < ld; i += 2) {
            const double r = sqrt(-2.0 * log(rng_unif(&s))), a = 6.283185307179586 * rng_unif(&s);
            const double z[2] = {r * cos(a), r * sin(a)};
            for (int e = 0; e < 2; e++) {
                const int ch = (int)((i + e) % hd);
                const float sc = (ch == 1 || ch == hd / 2 + 3) ? 5.0f : 1.0f;
                h[t * ld + i + e] = f2bf(sc * (float)z[e]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// CPU reference in double on the bf16 inputs: rows[] (or every row when rows == NULL) of every head into
// ref[nrows][nh * hd]

static void ref_attention(const float *qkv, int64_t T, int nh, int nkv, int hd, const int64_t *rows, int64_t nrows,
                          double *ref) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const int group = nh / nkv;
    const double scale = 1.0 / sqrt((double)hd);
#pragma omp parallel
    {
        double *p = (double *)malloc((size_t)T * sizeof(double));
        double *acc = (double *)malloc((size_t)hd * sizeof(double));
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int h = 0; h < nh; h++)
            for (int64_t ri = 0; ri < nrows; ri++) {
                const int64_t t = rows ? rows[ri] : ri;
                const float *q = qkv + t * ld + (int64_t)h * hd;
                const int64_t ko = (int64_t)(nh + h / group) * hd, vo = (int64_t)(nh + nkv + h / group) * hd;
                double mx = -DBL_MAX;
                for (int64_t j = 0; j <= t; j++) {
                    const float *k = qkv + j * ld + ko;
                    double d = 0.0;
                    for (int i = 0; i < hd; i++) d += (double)q[i] * (double)k[i];
                    p[j] = d * scale;
                    if (p[j] > mx) mx = p[j];
                }
                double sum = 0.0;
                for (int i = 0; i < hd; i++) acc[i] = 0.0;
                for (int64_t j = 0; j <= t; j++) {
                    const double e = exp(p[j] - mx);
                    const float *v = qkv + j * ld + vo;
                    sum += e;
                    for (int i = 0; i < hd; i++) acc[i] += e * (double)v[i];
                }
                for (int i = 0; i < hd; i++) ref[ri * (int64_t)nh * hd + (int64_t)h * hd + i] = acc[i] / sum;
            }
        free(p);
        free(acc);
    }
}

// ---------------------------------------------------------------------------------------------------------
// variants: the engine's launcher; the engine's tile shapes with the short-prompt choice forced either way
// (att_launch<HD>(..., small)); and tile configurations instantiated here (att_launch_cfg<HD, MT, BN, QREG>:
// BM = 64 MT query rows per block, BN keys per tile, Q fragments in registers or re-read from shared memory)

typedef void (*att_fn)(const __nv_bfloat16 *, int64_t, int32_t, int32_t, int32_t, __nv_bfloat16 *, cudaStream_t);
typedef struct {
    const char *name;
    int hd; // 0: any head_dim
    att_fn fn;
} variant;

static void engine_forced(const __nv_bfloat16 *q, int64_t T, int32_t nh, int32_t nkv, int32_t hd, __nv_bfloat16 *o,
                          cudaStream_t st, int small) {
    // a case per instantiated head size; clang-format does not settle on one layout for these macro lines
    // clang-format off
    switch (hd) {
#define CASE(HD) case HD: att_launch<HD>(q, T, nh, nkv, o, st, small); break;
        CASE(16) CASE(32) CASE(48) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128)
        CASE(144) CASE(160) CASE(176) CASE(192) CASE(208) CASE(224) CASE(240) CASE(256)
#undef CASE
    default: fprintf(stderr, "hd %d not instantiated\n", hd);
        abort();
    }
    // clang-format on
}
static void engine_bm128(const __nv_bfloat16 *q, int64_t T, int32_t nh, int32_t nkv, int32_t hd, __nv_bfloat16 *o,
                         cudaStream_t st) {
    engine_forced(q, T, nh, nkv, hd, o, st, 0);
}
static void engine_bm64(const __nv_bfloat16 *q, int64_t T, int32_t nh, int32_t nkv, int32_t hd, __nv_bfloat16 *o,
                        cudaStream_t st) {
    engine_forced(q, T, nh, nkv, hd, o, st, 1);
}

#define CFG(HD, MT, BN, QREG)                                                                                          \
    static void cfg_##HD##_##MT##_##BN##_##QREG(const __nv_bfloat16 *q, int64_t T, int32_t nh, int32_t nkv,            \
                                                int32_t hd, __nv_bfloat16 *o, cudaStream_t st) {                       \
        (void)hd;                                                                                                      \
        att_launch_cfg<HD, MT, BN, QREG>(q, T, nh, nkv, o, st);                                                        \
    }
CFG(128, 1, 64, true)
CFG(128, 2, 32, false)
CFG(128, 1, 128, false)
CFG(256, 1, 32, false)
#undef CFG

// the wgmma kernel (attention_wgmma.cu): the engine's launcher and each schedule (ATW_PLAIN, ATW_OVERLAP,
// ATW_PINGPONG: the kernel comment)
#define WCFG(SCHED, STAGES)                                                                                            \
    static void wgmma_##SCHED##_##STAGES(const __nv_bfloat16 *q, int64_t T, int32_t nh, int32_t nkv, int32_t hd,       \
                                         __nv_bfloat16 *o, cudaStream_t st) {                                          \
        (void)hd;                                                                                                      \
        atw_launch<128, SCHED, STAGES>(q, T, nh, nkv, o, st);                                                          \
    }
WCFG(ATW_PLAIN, 2)
WCFG(ATW_PLAIN, 3)
WCFG(ATW_OVERLAP, 3)
WCFG(ATW_PINGPONG, 3)
#undef WCFG

static const variant WGMMA_VARIANTS[] = {
    {"wgmma (fm_cuda_attention_wgmma)", 128, fm_cuda_attention_wgmma},
    {"wgmma plain, 2 stages", 128, wgmma_ATW_PLAIN_2},
    {"wgmma plain, 3 stages", 128, wgmma_ATW_PLAIN_3},
    {"wgmma overlap, 3 stages", 128, wgmma_ATW_OVERLAP_3},
    {"wgmma pingpong, 3 stages", 128, wgmma_ATW_PINGPONG_3},
};
#define NWGMMA ((int)(sizeof(WGMMA_VARIANTS) / sizeof(WGMMA_VARIANTS[0])))

static const variant VARIANTS[] = {
    {"engine (fm_cuda_attention)", 0, fm_cuda_attention},
    {"engine shapes, BM128 forced", 0, engine_bm128}, // hd > 128: the one shape (BM 64)
    {"engine shapes, BM64 forced", 0, engine_bm64},
    {"hd128 BM64  BN64  Q regs", 128, cfg_128_1_64_true},
    {"hd128 BM128 BN32  Q smem", 128, cfg_128_2_32_false},
    {"hd128 BM64  BN128 Q smem", 128, cfg_128_1_128_false},
    {"hd256 BM64  BN32  Q smem", 256, cfg_256_1_32_false},
};
#define NVARIANTS ((int)(sizeof(VARIANTS) / sizeof(VARIANTS[0])))

// ---------------------------------------------------------------------------------------------------------
// validation

#define GUARD 4096 // bf16 elements after out that must stay poisoned

typedef struct {
    double rel, maxabs;
    int64_t nan, guard_bad;
} check;

// Runs fn on fresh inputs and compares rows (all when nsample == 0, else nsample rows spread over [0, T) plus
// the last one) with the CPU reference.
static check validate(const variant *v, int64_t T, int nh, int nkv, int hd, int nsample, uint64_t seed) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, ldo = (int64_t)nh * hd;
    const size_t nqkv = (size_t)(T * ld), nout = (size_t)(T * ldo);
    uint16_t *hq = (uint16_t *)malloc(nqkv * 2);
    float *fq = (float *)malloc(nqkv * sizeof(float));
    uint16_t *ho = (uint16_t *)malloc((nout + GUARD) * 2);
    make_qkv(hq, T, nh, nkv, hd, seed);
#pragma omp parallel for
    for (size_t i = 0; i < nqkv; i++) fq[i] = bf2f(hq[i]);

    __nv_bfloat16 *dq, *dout;
    FM_CUDA_CHECK(cudaMalloc(&dq, nqkv * 2));
    FM_CUDA_CHECK(cudaMalloc(&dout, (nout + GUARD) * 2));
    FM_CUDA_CHECK(cudaMemcpy(dq, hq, nqkv * 2, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemset(dout, 0xff, (nout + GUARD) * 2)); // 0xffff: a NaN
    v->fn(dq, T, nh, nkv, hd, dout, 0);
    FM_CUDA_CHECK(cudaDeviceSynchronize());
    FM_CUDA_CHECK(cudaMemcpy(ho, dout, (nout + GUARD) * 2, cudaMemcpyDeviceToHost));

    int64_t nrows = T, *rows = NULL;
    if (nsample > 0 && nsample < T) {
        nrows = nsample + 1;
        rows = (int64_t *)malloc((size_t)nrows * sizeof(int64_t));
        for (int i = 0; i < nsample; i++) rows[i] = (int64_t)((double)i * (double)T / nsample);
        rows[nsample] = T - 1;
    }
    double *ref = (double *)malloc((size_t)(nrows * ldo) * sizeof(double));
    ref_attention(fq, T, nh, nkv, hd, rows, nrows, ref);

    check c = {0, 0, 0, 0};
    double num = 0, den = 0;
    for (int64_t ri = 0; ri < nrows; ri++) {
        const int64_t t = rows ? rows[ri] : ri;
        for (int64_t i = 0; i < ldo; i++) {
            const double o = bf2f(ho[t * ldo + i]), r = ref[ri * ldo + i];
            if (!isfinite(o)) {
                c.nan++;
                continue;
            }
            num += (o - r) * (o - r);
            den += r * r;
            if (fabs(o - r) > c.maxabs) c.maxabs = fabs(o - r);
        }
    }
    if (rows) // the rows not compared must still be written and finite
        for (size_t i = 0; i < nout; i++)
            if (!isfinite(bf2f(ho[i]))) c.nan++;
    for (size_t i = nout; i < nout + GUARD; i++)
        if (ho[i] != 0xffff) c.guard_bad++;
    c.rel = sqrt(num / (den > 0 ? den : 1));
    FM_CUDA_CHECK(cudaFree(dq));
    FM_CUDA_CHECK(cudaFree(dout));
    free(hq);
    free(fq);
    free(ho);
    free(ref);
    free(rows);
    return c;
}

static int n_checks = 0;
static double worst_rel = 0.0;

static int report(const variant *v, int64_t T, int nh, int nkv, int hd, int nsample, uint64_t seed) {
    const check c = validate(v, T, nh, nkv, hd, nsample, seed);
    const int ok = c.nan == 0 && c.guard_bad == 0 && c.rel <= TOL;
    n_checks++;
    if (c.rel > worst_rel) worst_rel = c.rel;
    printf("%-31s T=%-6lld nh=%-3d nkv=%-2d hd=%-3d %s rel err %.3e  max abs %.3e  non-finite %lld  guard %lld  %s\n",
           v->name, (long long)T, nh, nkv, hd, nsample ? "(sampled)" : "         ", c.rel, c.maxabs, (long long)c.nan,
           (long long)c.guard_bad, ok ? "OK" : "FAIL");
    fflush(stdout);
    return ok;
}

// ---------------------------------------------------------------------------------------------------------
// timing: 5 warm-up launches, then 30 samples, each CUDA events around 10 back-to-back launches (so the host's
// launch cost stays hidden at small T); the median sample over 10

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double time_ms(const variant *v, int64_t T, int nh, int nkv, int hd) {
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd;
    const size_t nqkv = (size_t)(T * ld), nout = (size_t)(T * nh * hd);
    uint16_t *hq = (uint16_t *)malloc(nqkv * 2);
    make_qkv(hq, T, nh, nkv, hd, 1234);
    __nv_bfloat16 *dq, *dout;
    FM_CUDA_CHECK(cudaMalloc(&dq, nqkv * 2));
    FM_CUDA_CHECK(cudaMalloc(&dout, nout * 2));
    FM_CUDA_CHECK(cudaMemcpy(dq, hq, nqkv * 2, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    FM_CUDA_CHECK(cudaEventCreate(&e0));
    FM_CUDA_CHECK(cudaEventCreate(&e1));
    enum { WARM = 5, REPS = 30, BATCH = 10 };
    float ms[REPS];
    for (int i = 0; i < WARM; i++) v->fn(dq, T, nh, nkv, hd, dout, 0);
    for (int i = 0; i < REPS; i++) {
        FM_CUDA_CHECK(cudaEventRecord(e0, 0));
        for (int b = 0; b < BATCH; b++) v->fn(dq, T, nh, nkv, hd, dout, 0);
        FM_CUDA_CHECK(cudaEventRecord(e1, 0));
        FM_CUDA_CHECK(cudaEventSynchronize(e1));
        FM_CUDA_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
        ms[i] /= BATCH;
    }
    qsort(ms, REPS, sizeof(float), cmp_float);
    FM_CUDA_CHECK(cudaEventDestroy(e0));
    FM_CUDA_CHECK(cudaEventDestroy(e1));
    FM_CUDA_CHECK(cudaFree(dq));
    FM_CUDA_CHECK(cudaFree(dout));
    free(hq);
    return (double)ms[REPS / 2];
}

static void report_time(const variant *v, int64_t T, int nh, int nkv, int hd) {
    const double ms = time_ms(v, T, nh, nkv, hd);
    const double flops = 2.0 * 2.0 * hd * nh * (double)T * (double)(T + 1) / 2.0;
    const double tf = flops / (ms * 1e-3) / 1e12;
    printf("%-31s T=%-6lld nh=%-3d nkv=%-2d hd=%-3d %9.4f ms %7.1f TFLOP/s %5.1f%% of %.0f\n", v->name, (long long)T,
           nh, nkv, hd, ms, tf, 100.0 * tf / PEAK_TFLOPS, PEAK_TFLOPS);
    fflush(stdout);
}

// ---------------------------------------------------------------------------------------------------------

// The wgmma kernel (sm_90 only): validated on hd 128 at every T of the list (every row up to 2048, 64 sampled rows
// + the last above), several head groupings, then timed beside the mma.sync engine in the same run. Returns the
// number of failed checks.
static int wgmma_section(int *seed) {
    static const int64_t TV[] = {1, 3, 17, 300, 1000, 2048};
    int fails = 0, ok[NWGMMA];
    printf("== validation of the wgmma kernels (hd 128)\n");
    for (int k = 0; k < NWGMMA; k++) {
        const variant *v = &WGMMA_VARIANTS[k];
        int f = 0;
        for (int i = 0; i < (int)(sizeof(TV) / sizeof(TV[0])); i++) f += !report(v, TV[i], 32, 4, 128, 0, (*seed)++);
        f += !report(v, 8192, 32, 4, 128, 64, (*seed)++);
        f += !report(v, 8191, 8, 1, 128, 64, (*seed)++);
        f += !report(v, 16384, 32, 4, 128, 64, (*seed)++);
        f += !report(v, 1000, 32, 8, 128, 0, (*seed)++);
        f += !report(v, 129, 2, 2, 128, 0, (*seed)++);
        f += !report(v, 255, 3, 1, 128, 0, (*seed)++);
        ok[k] = f == 0;
        fails += f;
    }
    printf("== timing: the mma.sync engine and the wgmma kernels, (32, 4, 128), one run\n");
    static const int64_t TT[] = {512, 1024, 2048, 4096, 8192, 16384};
    for (int i = 0; i < (int)(sizeof(TT) / sizeof(TT[0])); i++) {
        report_time(&VARIANTS[0], TT[i], 32, 4, 128);
        for (int k = 0; k < NWGMMA; k++)
            if (ok[k]) report_time(&WGMMA_VARIANTS[k], TT[i], 32, 4, 128);
            else printf("%-31s not timed: failed validation\n", WGMMA_VARIANTS[k].name);
    }
    report_time(&VARIANTS[0], 8192, 32, 8, 128);
    if (ok[0]) report_time(&WGMMA_VARIANTS[0], 8192, 32, 8, 128);
    return fails;
}

int main(int argc, char **argv) {
    int small = 0, profile = 0, wgmma_only = 0, profile_wgmma = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = 1;
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--wgmma")) wgmma_only = 1;
        else if (!strcmp(argv[i], "--profile-wgmma")) profile_wgmma = 1;
        else {
            fprintf(stderr, "usage: %s [--small | --profile | --wgmma | --profile-wgmma]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    const int hopper = prop.major == 9; // the wgmma kernel runs there only
    if ((wgmma_only || profile_wgmma) && !hopper) {
        fprintf(stderr, "the wgmma kernel needs an sm_90 GPU\n");
        return 1;
    }

    static const int HEADS[][3] = {{4, 2, 48}, {32, 4, 128}, {8, 8, 64}, {2, 1, 256}, {4, 4, 16}};
    static const int64_t TS[] = {1, 3, 17, 300, 1000};
    const int nheads = (int)(sizeof(HEADS) / sizeof(HEADS[0])), nts = (int)(sizeof(TS) / sizeof(TS[0]));
    int fails = 0, seed = 1;

    if (profile) { // one launch of the engine at T = 8192, (32, 4, 128), for ncu
        report_time(&VARIANTS[0], 8192, 32, 4, 128);
        return 0;
    }
    if (profile_wgmma) { // one launch of the wgmma kernel at T = 8192, (32, 4, 128), for ncu
        report_time(&WGMMA_VARIANTS[0], 8192, 32, 4, 128);
        return 0;
    }
    if (wgmma_only) {
        fails = wgmma_section(&seed);
        printf("%s\n", fails ? "SOME CHECKS FAILED" : "ALL CHECKS PASSED");
        return fails ? 1 : 0;
    }
    if (small) {
        static const int64_t TSMALL[] = {1, 17, 130};
        for (int s = 0; s < nheads; s++)
            for (int i = 0; i < 3; i++)
                for (int k = 0; k < 2; k++) // the launcher (BM 64 here) and the BM 128 shapes
                    fails += !report(&VARIANTS[k], TSMALL[i], HEADS[s][0], HEADS[s][1], HEADS[s][2], 0, seed++);
        for (int k = 0; hopper && k < NWGMMA; k++) // both wgmma versions, a partial tile and a full ring
            for (int i = 0; i < 3; i++) fails += !report(&WGMMA_VARIANTS[k], TSMALL[i] * 3, 4, 2, 128, 0, seed++);
        printf("%s\n", fails ? "SOME CHECKS FAILED" : "ALL CHECKS PASSED");
        return fails ? 1 : 0;
    }

    printf("== validation of the engine's launcher (every head_dim of the list, every T)\n");
    for (int s = 0; s < nheads; s++)
        for (int i = 0; i < nts; i++)
            fails += !report(&VARIANTS[0], TS[i], HEADS[s][0], HEADS[s][1], HEADS[s][2], 0, seed++);
    printf("== the other head_dims (16..256 step 16), T = 300, and long T sampled (64 rows + the last)\n");
    for (int hd = 16; hd <= 256; hd += 16) fails += !report(&VARIANTS[0], 300, 4, 2, hd, 0, seed++);
    fails += !report(&VARIANTS[0], 16384, 32, 4, 128, 64, seed++);
    fails += !report(&VARIANTS[0], 8192, 32, 8, 128, 64, seed++);
    fails += !report(&VARIANTS[0], 8191, 2, 1, 256, 64, seed++);
    fails += !report(&VARIANTS[0], 5000, 4, 2, 48, 64, seed++);
    printf("== validation of the tile variants\n");
    int vok[NVARIANTS];
    vok[0] = fails == 0;
    for (int k = 1; k < NVARIANTS; k++) {
        int f = 0;
        if (VARIANTS[k].hd == 0) { // every head_dim at T = 300, the listed head shapes at T = 1000, long T sampled
            for (int hd = 16; hd <= 256; hd += 16) f += !report(&VARIANTS[k], 300, 4, 2, hd, 0, seed++);
            for (int s = 0; s < nheads; s++)
                f += !report(&VARIANTS[k], 1000, HEADS[s][0], HEADS[s][1], HEADS[s][2], 0, seed++);
            f += !report(&VARIANTS[k], 8191, 32, 4, 128, 64, seed++);
            f += !report(&VARIANTS[k], 4099, 8, 8, 64, 64, seed++);
        } else {
            const int hd = VARIANTS[k].hd, nh = hd == 128 ? 32 : 4, nkv = hd == 128 ? 4 : 2;
            for (int i = 0; i < nts; i++) f += !report(&VARIANTS[k], TS[i], nh, nkv, hd, 0, seed++);
            f += !report(&VARIANTS[k], 4099, nh, nkv, hd, 64, seed++);
        }
        vok[k] = f == 0;
        fails += f;
    }
    if (hopper) fails += wgmma_section(&seed);
    printf("validation: %d checks, %d failed, worst rel err %.3e (threshold %.0e)\n", n_checks, fails, worst_rel, TOL);

    printf("== timing (CUDA events, 5 warm-ups, median of 30 samples of 10 launches; causal FLOPs = 4 hd nh T (T + 1) "
           "/ 2)\n");
    static const int64_t TT[] = {512, 1024, 2048, 8192};
    for (int k = 0; k < NVARIANTS; k++) {
        if (!vok[k]) {
            printf("%-31s not timed: failed validation\n", VARIANTS[k].name);
            continue;
        }
        const int hd = VARIANTS[k].hd ? VARIANTS[k].hd : 128;
        const int nh = hd == 128 ? 32 : 16, nkv = hd == 128 ? 4 : 2;
        for (int i = 0; i < 4; i++)
            if (hd == 128 || TT[i] == 8192) report_time(&VARIANTS[k], TT[i], nh, nkv, hd);
        if (VARIANTS[k].hd == 0 && k > 0)
            for (int i = 0; i < 3; i++) report_time(&VARIANTS[k], TT[i], 32, 4, 64);
    }
    printf("== engine, other shapes\n");
    for (int i = 0; i < 3; i++) report_time(&VARIANTS[0], TT[i], 32, 4, 64);
    report_time(&VARIANTS[0], 16384, 32, 4, 128);
    report_time(&VARIANTS[0], 8192, 32, 8, 128);
    report_time(&VARIANTS[0], 8192, 32, 4, 64);
    report_time(&VARIANTS[0], 8192, 16, 2, 256);
    report_time(&VARIANTS[0], 8192, 4, 2, 48);
    printf("== engine, the required shapes (32, 4, 128), again last\n");
    report_time(&VARIANTS[0], 512, 32, 4, 128);
    report_time(&VARIANTS[0], 2048, 32, 4, 128);
    report_time(&VARIANTS[0], 8192, 32, 4, 128);

    printf("%s\n", fails ? "SOME CHECKS FAILED" : "ALL CHECKS PASSED");
    return fails ? 1 : 0;
}
