// lab: how long a decode-sized weight read takes inside a CUDA graph, and what cp.async.bulk.prefetch.L2 does to it.
//
//   make -C lab read_floor           -> build/lab/read_floor (run it from the repository root; sm_90 for the prefetch)
//   ./build/lab/read_floor           validate the read kernel's XOR against the host's, then the tables
//
// Why: a B = 1 decode step is ~680 kernels; its GEMVs read 0.75-6 MB each and reach 0.5-0.9 TB/s of the H100/H200's
// 3.3-4.25. This program separates what any kernel pays for such a read (launch inside a graph, ramp, HBM round
// trips) from what our GEMVs add, and measures the route gemv.prefetch refuted in bench/NOTES.md (twenty-ninth
// session): a one-CTA kernel asking for 12 MB of bulk L2 prefetches, and a read after them.
//
// Kernels: read_kernel<U> streams S bytes as 16-byte loads (ld.global.cs, as the GEMVs load weights), U loads in
// flight per thread, 256 threads a CTA, G CTAs, one atomicXor a CTA; with PDL (cudaLaunchAttributeProgrammatic-
// StreamSerialization, as the engine launches decode kernels) its loads are issued before griddepcontrol.wait, only
// the result after it. prefetch_kernel: thread 0 of each of G CTAs asks for its share of S, 64 KB an instruction.
// spin_kernel: one CTA waits ~T us on %globaltimer, HBM idle, and releases the next node only by ending (a small
// kernel between two GEMVs, without PDL's early start of the read's loads).
//
// Timing: a graph of N nodes (or node pairs / triples), node i on region i of a ring whose footprint (>= 256 MB) is
// far beyond L2 (50 MB), so every read is cold; 7 replays after 2 warm-ups, median, divided by N.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define THREADS 256
#define FOOTPRINT (256ll << 20)

static __device__ __forceinline__ uint4 ld_cs(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

static __device__ __forceinline__ void pdl_wait(void) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_launch(void) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// S = n16 16-byte units; CTA b, round r covers units [(r G + b) THREADS U, + THREADS U), load u of thread t unit
// base + u THREADS + t (coalesced per load instruction)
template <int U>
static __global__ void __launch_bounds__(THREADS) read_kernel(const uint4 *w, int64_t n16, uint32_t *out) {
    uint32_t acc = 0;
    bool waited = false;
    for (int64_t base = (int64_t)blockIdx.x * THREADS * U; base < n16; base += (int64_t)gridDim.x * THREADS * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = base + u * THREADS + threadIdx.x;
            v[u] = i < n16 ? ld_cs(w + i) : make_uint4(0, 0, 0, 0);
        }
        if (!waited) pdl_wait(), pdl_launch(), waited = true; /* the first round in flight before the wait */
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (!waited) pdl_wait(), pdl_launch();
    for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc) atomicXor(out, acc);
}

static __global__ void prefetch_kernel(const uint8_t *p, int64_t bytes) {
    pdl_wait(), pdl_launch();
#if __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0) return;
    const int64_t units = bytes / 16, u0 = units * blockIdx.x / gridDim.x, u1 = units * (blockIdx.x + 1) / gridDim.x;
    for (int64_t u = u0; u < u1; u += 4096) { /* 64 KB an instruction */
        const uint32_t n = (uint32_t)((u1 - u < 4096 ? u1 - u : 4096) * 16);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + u * 16), "r"(n) : "memory");
    }
#else
    (void)p, (void)bytes;
#endif
}

static __global__ void spin_kernel(int64_t ns) { /* no early release: the next node starts when it ends */
    pdl_wait();
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while ((int64_t)(t - t0) < ns);
}

static void launch(const void *fn, int grid, int threads, void **args, bool pdl, cudaStream_t s) {
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    c.gridDim = dim3((unsigned)grid), c.blockDim = dim3((unsigned)threads), c.stream = s;
    c.attrs = &a, c.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelExC(&c, fn, args));
}

static const void *read_fn(int U) {
    switch (U) {
    case 1: return (const void *)read_kernel<1>;
    case 2: return (const void *)read_kernel<2>;
    case 4: return (const void *)read_kernel<4>;
    default: return (const void *)read_kernel<8>;
    }
}

// one step of a graph: what node i launches (region i of the ring)
typedef struct step {
    int64_t bytes;    // S
    int read_grid, U; // read_grid 0: no read
    int pf_grid;      // 0: no prefetch; the prefetch is of the same region, before the read (and the spin)
    int64_t spin_ns;  // 0: no spin
    bool pdl;
} step;

static uint8_t *g_buf;
static uint32_t *g_out;

static void record(const step *st, int64_t region_off, cudaStream_t s) {
    const uint8_t *p = g_buf + region_off;
    int64_t bytes = st->bytes, n16 = st->bytes / 16, ns = st->spin_ns;
    if (st->pf_grid) {
        void *a[] = {(void *)&p, (void *)&bytes};
        launch((const void *)prefetch_kernel, st->pf_grid, 32, a, st->pdl, s);
    }
    if (st->spin_ns) {
        void *a[] = {(void *)&ns};
        launch((const void *)spin_kernel, 1, 32, a, st->pdl, s);
    }
    if (st->read_grid) {
        const uint4 *w = (const uint4 *)p;
        void *a[] = {(void *)&w, (void *)&n16, (void *)&g_out};
        launch(read_fn(st->U), st->read_grid, THREADS, a, st->pdl, s);
    }
}

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

// us per step: a graph of N steps over the ring, median of 7 replays
static float time_steps(const step *st, cudaStream_t s) {
    const int64_t stride = ((st->bytes + (1 << 20) - 1) >> 20) << 20;
    int n = (int)(FOOTPRINT / stride);
    if (n < 48) n = 48;
    if ((int64_t)n * stride > 2 * FOOTPRINT) n = (int)(2 * FOOTPRINT / stride);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) record(st, (int64_t)i * stride, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[7];
    for (int r = -2; r < 7; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, 7, sizeof t[0], cmp_f);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[3] * 1000.0f / (float)n;
}

static int validate(cudaStream_t s) {
    const int64_t bytes = 6 << 20;
    uint32_t *h = (uint32_t *)malloc(bytes), want = 0, got = 0;
    CK(cudaMemcpy(h, g_buf + (3 << 20), bytes, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < bytes / 4; i++) want ^= h[i];
    free(h);
    int bad = 0;
    const int Us[] = {1, 2, 4, 8}, Gs[] = {1, 132, 1000};
    for (int ui = 0; ui < 4; ui++)
        for (int gi = 0; gi < 3; gi++) {
            CK(cudaMemsetAsync(g_out, 0, 4, s));
            step st = {bytes, Gs[gi], Us[ui], 0, 0, true};
            record(&st, 3 << 20, s);
            CK(cudaMemcpyAsync(&got, g_out, 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            if (got != want) printf("read U=%d G=%d: XOR %08x, host %08x\n", Us[ui], Gs[gi], got, want), bad++;
        }
    printf("validation: read_kernel's XOR of 6 MB against the host's, 12 shapes: %s\n", bad ? "FAILED" : "equal");
    return bad;
}

int main(void) {
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int sms = pr.multiProcessorCount;
    printf("%s, %d SMs, L2 %d MB\n", pr.name, sms, pr.l2CacheSize >> 20);
    CK(cudaMalloc(&g_buf, 2 * FOOTPRINT + (64 << 20)));
    CK(cudaMalloc(&g_out, 4));
    { /* a pattern, not zeros: the XOR must see the data */
        const int64_t n = (2 * FOOTPRINT + (64 << 20)) / 4;
        uint32_t *h = (uint32_t *)malloc(n * 4);
        for (int64_t i = 0; i < n; i++) h[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 7);
        CK(cudaMemcpy(g_buf, h, n * 4, cudaMemcpyHostToDevice));
        free(h);
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (validate(s)) return 1;

    printf("\n## a node's floor: an empty launch (1 CTA, no read) and the spin kernel at 5 us\n\n| node | PDL | us |\n"
           "|---|---|---:|\n");
    for (int pdl = 0; pdl < 2; pdl++) {
        step e = {16, 1, 1, 0, 0, pdl != 0};
        printf("| read of 16 bytes | %s | %.2f |\n", pdl ? "on" : "off", time_steps(&e, s));
        step sp = {16, 0, 1, 0, 5000, pdl != 0};
        printf("| spin 5 us | %s | %.2f |\n", pdl ? "on" : "off", time_steps(&sp, s));
    }

    const double MB[] = {0.75, 1.5, 4.2, 5.4, 6.3, 12.6, 50.0};
    const int U_[] = {2, 4, 8}, G_[] = {1, 2, 4, 8}; /* G in SMs */
    printf("\n## a read of S MB, cold, us per node (GB/s), PDL on: G CTAs x %d threads, U 16-byte loads in flight a "
           "thread\n\n| S MB | U | G = %d | G = %d | G = %d | G = %d |\n|---:|---:|---:|---:|---:|---:|\n",
           THREADS, sms, 2 * sms, 4 * sms, 8 * sms);
    for (int si = 0; si < 7; si++)
        for (int ui = 0; ui < 3; ui++) {
            const int64_t bytes = (int64_t)(MB[si] * 1048576.0) & ~(int64_t)4095;
            printf("| %.2f | %d |", MB[si], U_[ui]);
            for (int gi = 0; gi < 4; gi++) {
                step st = {bytes, G_[gi] * sms, U_[ui], 0, 0, true};
                const float us = time_steps(&st, s);
                printf(" %.2f (%.0f) |", us, bytes / (us * 1e3));
            }
            printf("\n");
        }
    printf("\n## the same without PDL (U = 8, G = %d)\n\n| S MB | us | GB/s |\n|---:|---:|---:|\n", 2 * sms);
    for (int si = 0; si < 7; si++) {
        const int64_t bytes = (int64_t)(MB[si] * 1048576.0) & ~(int64_t)4095;
        step st = {bytes, 2 * sms, 8, 0, 0, false};
        const float us = time_steps(&st, s);
        printf("| %.2f | %.2f | %.0f |\n", MB[si], us, bytes / (us * 1e3));
    }

    printf("\n## bulk L2 prefetch (PDL on), us per step: the prefetch alone, then before a spin of 5 us and a read "
           "(U = 8, G = %d) of the same bytes\n\n| S MB | prefetch CTAs | prefetch alone | spin + read | prefetch + "
           "spin + read |\n|---:|---:|---:|---:|---:|\n",
           2 * sms);
    const double PMB[] = {1.5, 5.4, 12.6};
    const int PG[] = {1, 8, sms};
    for (int si = 0; si < 3; si++)
        for (int gi = 0; gi < 3; gi++) {
            const int64_t bytes = (int64_t)(PMB[si] * 1048576.0) & ~(int64_t)4095;
            step pf = {bytes, 0, 8, PG[gi], 0, true}, sr = {bytes, 2 * sms, 8, 0, 5000, true},
                 psr = {bytes, 2 * sms, 8, PG[gi], 5000, true};
            printf("| %.2f | %d | %.2f | %.2f | %.2f |\n", PMB[si], PG[gi], time_steps(&pf, s), time_steps(&sr, s),
                   time_steps(&psr, s));
        }
    CK(cudaStreamDestroy(s));
    CK(cudaFree(g_buf));
    CK(cudaFree(g_out));
    return 0;
}
