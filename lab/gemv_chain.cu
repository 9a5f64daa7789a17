// Lab for the prefetching decode GEMV (src/backend/cuda/gemv_fp8_prefetch.cu): where the time of a chain of
// projections goes. Builds the Qwen3-30B-A3B attention projections of 48 layers as W8A8 (q|k|v 5120 x 2048, o
// 2048 x 4096, random e4m3, distinct per layer: 906 MB, more than the L2) or as int4-tc banks (W4A8, random codes
// and scales, 475 MB), captures the 96 GEMVs at M rows as one
// CUDA graph (PDL edges as the engine launches them), times its replays, then replays it once more with every
// CTA time-stamping (%globaltimer) its start, the return of its PDL wait, the arrival of its weights and its end,
// and prints the timeline of a few kernels in the middle of the chain.
//
//   make -C lab gemv_chain && ./build/lab/gemv_chain [w8a8|w4a8] [M]    (M <= 16, default w8a8 1)
//   FP8MOE_PDL=0 ./build/lab/gemv_chain                                 the same chain without PDL
//
// Correctness of the kernel is the op tests' business (tests/gpu/test_cuda_ops.c); this only times it.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct trace_rec {
    unsigned long long id, t[5];
    unsigned           block, smid, ready_at_wait;
} trace_rec;

#define TRACE_CAP (1 << 16)
static __device__ trace_rec g_trace[TRACE_CAP];
static __device__ unsigned  g_trace_n, g_trace_on;

static __device__ __forceinline__ void gemv_trace(int point, const void *id, uint64_t *bar) {
    __shared__ unsigned slot;
    if (threadIdx.x || !g_trace_on) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (point == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        slot = atomicAdd(&g_trace_n, 1u);
        if (slot < TRACE_CAP) g_trace[slot].id = (unsigned long long)id, g_trace[slot].block = blockIdx.x, g_trace[slot].smid = smid;
    }
    if (slot >= TRACE_CAP) return;
    g_trace[slot].t[point] = now;
    if (point == 1) {
        uint32_t ready;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ready) : "r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
        g_trace[slot].ready_at_wait = ready;
    }
}
#define GEMV_TRACE(point, id, bar) gemv_trace(point, id, bar)
/* point 4: x has arrived (the word depends on the loads) */
#define GEMV_TRACE_X(word)                                                                                    \
    do {                                                                                                      \
        asm volatile("" ::"r"(word));                                                                         \
        gemv_trace(4, NULL, NULL);                                                                            \
    } while (0)

#include "backend/cuda/gemv_fp8_prefetch.cu"

#define LAYERS 48

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fprintf(stderr, "gemv_chain: %s: %s\n", what, cudaGetErrorString(e)), exit(1);
}

static __global__ void fill_e4m3(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = (uint8_t)(h & 0x77); /* finite, |v| < 2 */
    }
}

static int cmp_ull(const void *a, const void *b) {
    const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const bool    w4 = argc > 1 && !strcmp(argv[1], "w4a8");
    const int64_t M = argc > 2 ? atoi(argv[2]) : 1;
    if ((argc > 1 && !w4 && strcmp(argv[1], "w8a8")) || M < 1 || M > 16)
        return fprintf(stderr, "usage: gemv_chain [w8a8|w4a8] [M <= 16]\n"), 2;
    const int64_t  shape[2][2] = {{5120, 2048}, {2048, 4096}}; /* N, K (multiples of 128 and 32) */
    uint8_t       *W[2 * LAYERS], *x[2];
    fm_bank        bank[2 * LAYERS];
    __nv_bfloat16 *y[2];
    float         *one, *xs[2];
    cudaStream_t   s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    memset(bank, 0, sizeof bank);
    for (int l = 0; l < 2 * LAYERS; l++) {
        const int64_t N = shape[l % 2][0], K = shape[l % 2][1];
        const size_t  n = (size_t)(w4 ? N * K / 2 : N * K);
        check(cudaMalloc((void **)&W[l], n), "weights");
        fill_e4m3<<<264, 256, 0, s>>>(W[l], n, 77u + l);
        if (!w4) continue;
        fm_bank *b = &bank[l];
        b->fmt = FM_W_INT4_G128_TC, b->n = 1, b->rows = b->rows_pad = N, b->cols = b->ld = K, b->n_groups = K / 128;
        b->w = W[l];
        check(cudaMalloc((void **)&b->scales, (size_t)(N * (K / 128)) * 2), "scales");
        check(cudaMemset(b->scales, 0x3c, (size_t)(N * (K / 128)) * 2), "scales"); /* bf16 0x3c3c ~ 0.0115 */
    }
    for (int p = 0; p < 2; p++) {
        check(cudaMalloc((void **)&x[p], (size_t)(M * shape[p][1])), "x");
        fill_e4m3<<<64, 256, 0, s>>>(x[p], (size_t)(M * shape[p][1]), 5u + p);
        check(cudaMalloc((void **)&y[p], (size_t)(M * shape[p][0]) * 2), "y");
        check(cudaMalloc((void **)&xs[p], (size_t)(M * shape[p][1] / 128) * sizeof(float)), "x scales");
        check(cudaMemset(xs[p], 0, (size_t)(M * shape[p][1] / 128) * sizeof(float)), "x scales");
    }
    const float h_one = 1.0f;
    check(cudaMalloc((void **)&one, sizeof(float)), "scale");
    check(cudaMemcpy(one, &h_one, sizeof h_one, cudaMemcpyHostToDevice), "scale");
    check(cudaStreamSynchronize(s), "fill");

    /* the chain, once eagerly (kernel attributes are set on first use, outside capture), then as a graph */
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
        for (int l = 0; l < 2 * LAYERS; l++) {
            const int p = l % 2;
            const bool ok = w4 ? fm_cuda_w4a8_gemv_prefetch(&bank[l], 0, x[p], xs[p], NULL, M, M, y[p], s)
                               : fm_cuda_w8a8_gemv_prefetch(W[l], shape[p][0], shape[p][1], one, x[p], M, one, y[p], s);
            if (!ok) return fprintf(stderr, "gemv_chain: the prefetching GEMV does not take this shape here\n"), 1;
        }
        if (pass) check(cudaStreamEndCapture(s, &graph), "capture");
    }
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event"), check(cudaEventCreate(&e1), "event");
    float ms[30];
    for (int r = -5; r < 30; r++) {
        check(cudaEventRecord(e0, s), "record");
        check(cudaGraphLaunch(exec, s), "replay");
        check(cudaEventRecord(e1, s), "record");
        check(cudaEventSynchronize(e1), "sync");
        if (r >= 0) check(cudaEventElapsedTime(&ms[r], e0, e1), "elapsed");
    }
    qsort(ms, 30, sizeof *ms, cmp_float);
    printf("%s M = %lld: 96 GEMVs (48 layers) median %.3f ms (min %.3f), %.2f us per GEMV; floor %s ms\n",
           w4 ? "w4a8" : "w8a8", (long long)M, ms[15], ms[0], ms[15] * 1000.0 / 96, w4 ? "0.110" : "0.213");

    /* one traced replay */
    const unsigned on = 1, zero = 0;
    check(cudaMemcpyToSymbol(g_trace_n, &zero, sizeof zero), "trace");
    check(cudaMemcpyToSymbol(g_trace_on, &on, sizeof on), "trace");
    check(cudaGraphLaunch(exec, s), "replay"), check(cudaStreamSynchronize(s), "sync");
    unsigned n = 0;
    check(cudaMemcpyFromSymbol(&n, g_trace_n, sizeof n), "trace");
    n = n < TRACE_CAP ? n : TRACE_CAP;
    trace_rec *tr = (trace_rec *)malloc(n * sizeof *tr);
    check(cudaMemcpyFromSymbol(tr, g_trace, n * sizeof *tr), "trace");

    /* per kernel (identified by its weights): first and last CTA start, earliest and latest wait return, latest
       arrival of the weights, earliest and latest end; microseconds from the chain's first start */
    unsigned long long t0 = ~0ull;
    for (unsigned i = 0; i < n; i++) t0 = tr[i].t[0] < t0 ? tr[i].t[0] : t0;
    printf("\n%u CTAs traced. Per kernel, us from the first CTA of the chain:\n", n);
    printf("| kernel | CTAs | start first..last | wait returns first..last | weights in (last) | x in first..last | end first..last | SMs | most CTAs on one SM | weights in at the wait |\n");
    printf("|---|---:|---|---|---:|---|---|---:|---:|---:|\n");
    unsigned long long prev_end = 0;
    const int shown[] = {0, 1, 2, 3, 42, 43, 44, 45, 92, 93, 94, 95};
    for (int si = 0; si < 12; si++) {
        const int l = shown[si];
        unsigned long long lo[5] = {~0ull, ~0ull, ~0ull, ~0ull, ~0ull}, hi[5] = {0, 0, 0, 0, 0}, sms[132 * 4];
        int ctas = 0, nsm = 0, ready = 0;
        for (unsigned i = 0; i < n; i++) {
            if (tr[i].id != (unsigned long long)W[l]) continue;
            ctas++;
            ready += tr[i].ready_at_wait;
            for (int p = 0; p < (w4 ? 4 : 5); p++) {
                lo[p] = tr[i].t[p] < lo[p] ? tr[i].t[p] : lo[p];
                hi[p] = tr[i].t[p] > hi[p] ? tr[i].t[p] : hi[p];
            }
            if (nsm < 132 * 4) sms[nsm++] = tr[i].smid;
        }
        qsort(sms, nsm, sizeof *sms, cmp_ull);
        int distinct = nsm > 0, run = 1, most = nsm > 0;
        for (int i = 1; i < nsm; i++) {
            distinct += sms[i] != sms[i - 1];
            run = sms[i] == sms[i - 1] ? run + 1 : 1;
            most = run > most ? run : most;
        }
        printf("| %d %s | %d | %.2f..%.2f | %.2f..%.2f | %.2f | %.2f..%.2f | %.2f..%.2f | %d | %d | %d of %d |  (end - previous end: %.2f)\n", l / 2,
               l % 2 ? "o" : "qkv", ctas, (lo[0] - t0) / 1e3, (hi[0] - t0) / 1e3, (lo[1] - t0) / 1e3, (hi[1] - t0) / 1e3,
               (hi[2] - t0) / 1e3, w4 ? 0.0 : (lo[4] - t0) / 1e3, w4 ? 0.0 : (hi[4] - t0) / 1e3, (lo[3] - t0) / 1e3, (hi[3] - t0) / 1e3, distinct, most, ready, ctas,
               prev_end ? (hi[3] - prev_end) / 1e3 : 0.0);
        prev_end = hi[3];
    }
    free(tr);
    return 0;
}
