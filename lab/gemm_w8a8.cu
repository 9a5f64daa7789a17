// Prefill-size W8A8 GEMM of our own (sm_90a): y [M, N] bf16 = sx sw x [M, K] W^T, both operands e4m3 K-major
// with one fp32 scale each (device pointers), fp32 accumulation, the scales and the bf16 rounding in the epilogue.
//
// Tiles: BM = 128 activation rows (two consumer warpgroups, one wgmma m64 block each) x BN weight rows (wgmma n =
// BN, 128 or 256) x 128 bytes of K per stage, STAGES stages; one persistent CTA per SM walks the tiles. A producer warp loads both operand tiles of a stage with
// bulk tensor copies (TMA, cp.async.bulk.tensor.2d, 128-byte swizzle, zero fill past the matrix edges) onto the
// stage's "full" mbarrier; each consumer warpgroup waits on it, issues the stage's 4 wgmma.m64nBNk32 with both
// operands read by the tensor cores from shared memory (SASS: QGMMA), and once the next stage's wgmmas are issued
// and this stage's have completed (one commit group kept in flight) arrives on the stage's "empty" barrier, which
// the producer waits on before it reuses the stage. The epilogue writes the fp32
// accumulator x sx sw as bf16 straight from the wgmma fragment.
//
// Floor: FLOPs / ~1.3 PFLOP/s (Qwen3-30B-A3B q|k|v at M = 2048: 43 GFLOP, 33 us); cuBLASLt FP8 reaches ~1.06
// PFLOP/s on these shapes (bench gemm). bench/NOTES.md has what this kernel reaches and which route the table takes.
#include <cuda.h>
#include <string.h>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemm_w8a8_wgmma.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"

#define BM        128
#define BK        128 // bytes of K (e4m3 elements) per stage: one 128-byte swizzle row
#define STAGES    4
#define CONSUMERS 2 // warpgroups
#define THREADS   ((CONSUMERS + 1) * 128) // the producer is one warp of a third warpgroup (the rest idle)

template <int BN> struct tile_smem {
    static constexpr int a_bytes = BM * BK, b_bytes = BN * BK, stage = a_bytes + b_bytes;
    static constexpr int bytes = STAGES * stage + 1024; // + alignment slack for the 1024-byte swizzle atoms
};

// d (an m64nBN f32 fragment: [n8 tile][4], the m16n8 D order) = A B (+ d when accumulate), both from shared memory
template <int BN>
static __device__ __forceinline__ void wgmma_ss(float d[BN / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BN == 256) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    } else
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    }
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}

template <int BN>
static __global__ __launch_bounds__(THREADS, 1) void w8a8_wgmma_kernel(const __grid_constant__ CUtensorMap map_x,
                                                                      const __grid_constant__ CUtensorMap map_w,
                                                                      int64_t M, int64_t N, int64_t K,
                                                                      const float *x_scale, const float *w_scale,
                                                                      __nv_bfloat16 *y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    uint8_t      *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int     wg = threadIdx.x >> 7, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int     kb_count = (int)((K + BK - 1) / BK);
    const int64_t tiles_n = (N + BN - 1) / BN, tiles = (M + BM - 1) / BM * tiles_n;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) bulk_barrier_init(&full[s], 1), bulk_barrier_init(&empty[s], CONSUMERS);
        FM_BULK_ASM("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    pdl_launch_dependents();
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
    const int   g = lane >> 2, t = lane & 3;
    int64_t     it = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
        float         acc[BN / 8][4];
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

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn encoder(void) {
    static encode_tiled_fn fn = NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        FM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) {
            fprintf(stderr, "fp8moe: the CUDA driver has no cuTensorMapEncodeTiled\n");
            abort();
        }
        fn = (encode_tiled_fn)p;
    }
    return fn;
}

// rows x cols bytes (row stride ld) as a 2-D tensor of tiles box_rows x 128 bytes, 128-byte swizzle, zeros past the edges
static CUtensorMap tile_map(const uint8_t *base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    CUtensorMap      map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    const CUresult   r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, elem,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fp8moe: cuTensorMapEncodeTiled failed (%d) for %lld x %lld bytes, ld %lld\n", (int)r,
                (long long)rows, (long long)cols, (long long)ld);
        abort();
    }
    return map;
}

bool fm_cuda_w8a8_wgmma_available(void) {
    static int ok = -1;
    if (ok < 0) ok = fm_cuda_device_attr(cudaDevAttrComputeCapabilityMajor) == 9;
    return ok == 1;
}

int fm_cuda_w8a8_wgmma_bn(void) {
    static int bn = 0;
    if (!bn) {
        const char *env = getenv("FP8MOE_W8A8_WGMMA_BN");
        bn = env && atoi(env) == 128 ? 128 : 256;
    }
    return bn;
}

template <int BN>
static void launch(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                   const float *x_scale, __nv_bfloat16 *y, cudaStream_t s) {
    static bool       allowed = false;
    const void       *fn = (const void *)w8a8_wgmma_kernel<BN>;
    const CUtensorMap mx = tile_map(x, M, ld, ld, BM), mw = tile_map(W, N, ld, ld, BN);
    int64_t           K = ld;
    if (!allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, tile_smem<BN>::bytes));
        allowed = true;
    }
    void *args[] = {(void *)&mx, (void *)&mw, (void *)&M, (void *)&N, (void *)&K, (void *)&x_scale, (void *)&w_scale, (void *)&y};
    static int    sms = 0;
    if (!sms) sms = fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    const int64_t tiles = fm_ceil_div(N, BN) * fm_ceil_div(M, BM);
    fm_cuda_launch_pdl(fn, dim3((unsigned)(tiles < sms ? tiles : sms)), dim3(THREADS),
                       tile_smem<BN>::bytes, s, args);
    FM_LAUNCH_CHECK("w8a8_wgmma");
}

void fm_cuda_w8a8_wgmma(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x, int64_t M,
                        const float *x_scale, __nv_bfloat16 *y, cudaStream_t s) {
    if (ld % 16 || M < 1 || M > INT32_MAX || N > INT32_MAX) {
        fprintf(stderr, "fp8moe: w8a8_wgmma: unsupported shape (M %lld, N %lld, ld %lld)\n", (long long)M, (long long)N,
                (long long)ld);
        abort();
    }
    if (fm_cuda_w8a8_wgmma_bn() == 128) launch<128>(W, N, ld, w_scale, x, M, x_scale, y, s);
    else launch<256>(W, N, ld, w_scale, x, M, x_scale, y, s);
}
