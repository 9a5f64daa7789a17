// The grouped W4A8 GEMM's FP4 gate|up form on sm_90a: the wgmma kernel's two warpgroups and a producer warpgroup
// that expands the FP4 stages (route w4a8.fp4=producer): w4a8_gemm.cu describes the tiles and the expansion.
#include "backend/cuda/w4a8_gemm_device.cuh"

// ---- sm_90a: the FP4 gate|up GEMM with a producer warpgroup ----------------------------------------------
// The FP4 dispatch's gate|up GEMM (int4-tc bank, SwiGLU epilogue, both tile heights) with the expansion off the MMA
// warps: a CTA of three warpgroups, the two of w4a8_wgmma_kernel (consumers: fragments, wgmmas, promotion, epilogue,
// unchanged) and a producer warpgroup that loads every stage (FP4 codes, block scales, weight scales) and expands
// stage grp + 1 into the e4m3 tile while the consumers run group grp. One barrier of all 384 threads per group, as
// the e4m3 path has one: at barrier grp the producer has expanded stage grp and the consumers are done with group
// grp - 1, so two e4m3 tiles suffice; the consumers issue no stage loads at all. Registers: the producer gives all
// but FP4_PRODUCER_REGS back (setmaxnreg), the consumers take FP4_CONSUMER_REGS (the 256-thread kernel uses 235).
// The producer's cp.async ring is private to each producer thread: it loads the code bytes it expands and its own
// copy of its row's block scales, so its wait_group alone makes them visible to it (no barrier among producers).
#define FP4_PRODUCERS 128
#define FP4_CTA_THREADS (THREADS + FP4_PRODUCERS)
/* registers per thread after setmaxnreg, by tile height: 64-row tiles run one CTA per SM (384 x 168 allocated at
   launch), 16-row tiles two (384 x 80); fewer producer registers spilled (ptxas -v) */
#define FP4_PRODUCER_REGS(BNT) ((BNT) == FM_W4A8_BN ? 56 : 32)
#define FP4_CONSUMER_REGS(BNT) ((BNT) == FM_W4A8_BN ? 224 : 104)
#define FP4_CTAS_PER_SM(BNT) ((BNT) == FM_W4A8_BN ? 1 : 2)
#define FP4_RAW_STAGES 3 /* the producer loads stage grp + 3 while expanding grp + 1 */
#define FP4_WSC_STAGES 4 /* weight scales: stages grp (consumers) .. grp + 3 (producer) */
static_assert(2 * FP4_CONSUMER_REGS(FM_W4A8_BN) * 128 + FP4_PRODUCER_REGS(FM_W4A8_BN) * 128 <= 168 * 384 &&
                  2 * FP4_CONSUMER_REGS(FM_W4A8_BN_SMALL) * 128 + FP4_PRODUCER_REGS(FM_W4A8_BN_SMALL) * 128 <= 80 * 384,
              "fp4 kernel: the registers allocated at launch");
static_assert(wk_scales<WK_INT4>::chunks <= FP4_PRODUCERS, "fp4 kernel: weight scale chunks per producer");

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the fp4 kernel's own: sm_90a only */
static __device__ __forceinline__ void fp4_barrier(void) {
    asm volatile("bar.sync 2, %0;\n" ::"n"(FP4_CTA_THREADS) : "memory"); /* 0: __syncthreads, 1: the epilogue's */
}
static __device__ __forceinline__ void cp_async_wait_2(void) { asm volatile("cp.async.wait_group 2;\n" ::); }
#endif

template <int R> static __device__ __forceinline__ void setmaxnreg_dec(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R> static __device__ __forceinline__ void setmaxnreg_inc(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// One producer thread's share of a stage: BNT / 2 code bytes of row n (the bytes expand_stage gives it), its row's
// block scales, and (pt < wk_scales chunks) 16 bytes of the CTA's weight scales.
typedef struct fp4_loader {
    const uint8_t *codes;  // group 0
    const uint8_t *scales; // group 0
    int64_t sstride;       // bytes from one group's block scales to the next
    bool ok;               // row n inside the tile (else zero-filled)
    const uint8_t *wsrc;   // as stage_loader's
    int wbytes;
    int64_t wstride;
} fp4_loader;

template <int BNT, int AF>
static __device__ __forceinline__ fp4_loader fp4_loader_at(const gemm_params &p, const fm_w4a8_tile &tile, int pt) {
    constexpr int CB = BNT * 64 / FP4_PRODUCERS, SB = AF == FM_W4A8_DISPATCH_NV ? 8 : 4;
    fp4_loader l;
    const int n = pt * CB / 64;
    l.ok = n < tile.rows;
    const int64_t slot = tile.slot0 + (l.ok ? n : 0);
    l.codes = p.x + slot * p.ldx + (pt * CB & 63);
    l.scales = (const uint8_t *)p.xs + slot * SB, l.sstride = p.lds * SB;
    const int64_t row0 = (int64_t)blockIdx.x * BM;
    l.wsrc = NULL, l.wbytes = 0, l.wstride = p.rows_pad * 2;
    if (pt < wk_scales<WK_INT4>::chunks) {
        const int64_t row = row0 + (int64_t)pt * 8, base = (int64_t)tile.expert * p.n_groups * p.rows_pad;
        const bool in = row < p.rows_pad;
        l.wsrc = (const uint8_t *)p.ws + (base + (in ? row : row0)) * 2;
        l.wbytes = in ? 16 : 0;
    }
    return l;
}

// Stage grp into raw (codes at [pt x CB], which is row n's place in [BNT][64]; scales at [BNT x 64 + pt x 8]) and wsc.
template <int BNT, int AF>
static __device__ __forceinline__ void fp4_load_stage(const fp4_loader &l, int64_t grp, uint8_t *raw, uint8_t *wsc,
                                                      int pt) {
    constexpr int CB = BNT * 64 / FP4_PRODUCERS;
    const uint32_t rb = smem_u32(raw);
    const uint8_t *c = l.codes + grp * 64;
    if constexpr (CB == 32) {
        cp_async16(rb + pt * 32, c, l.ok ? 16 : 0);
        cp_async16(rb + pt * 32 + 16, c + 16, l.ok ? 16 : 0);
    } else {
        static_assert(CB == 8, "fp4 producer: 32 or 8 code bytes per thread");
        cp_async8(rb + pt * 8, c, l.ok ? 8 : 0);
    }
    const uint32_t sd = rb + BNT * 64 + pt * 8;
    if (AF == FM_W4A8_DISPATCH_MX) cp_async4(sd, l.scales + grp * l.sstride, l.ok ? 4 : 0);
    else cp_async8(sd, l.scales + grp * l.sstride, l.ok ? 8 : 0);
    if (l.wsrc) cp_async16(smem_u32(wsc + pt * 16), l.wsrc + grp * l.wstride, l.wbytes);
}

template <int BNT, int AF>
static __global__ __launch_bounds__(FP4_CTA_THREADS,
                                    FP4_CTAS_PER_SM(BNT)) void w4a8_wgmma_fp4_kernel(const gemm_params p) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL) /* wgmma and setmaxnreg: sm_90a only (the route never launches it elsewhere)   \
                                         */
    __trap();
#else
    __shared__ __align__(1024) uint8_t xs_smem[2][BNT * 128];
    __shared__ float sc_smem[2][BNT];
    __shared__ __align__(16) uint8_t wsc_smem[FP4_WSC_STAGES][BM * wk_scales<WK_INT4>::row_bytes];
    __shared__ __align__(16) uint8_t raw_smem[FP4_RAW_STAGES][BNT * 64 + FP4_PRODUCERS * 8];
    __shared__ float red[THREADS / 32][BNT];
    constexpr int NW = wk_shape<WK_INT4>::words, NP = wk_shape<WK_INT4>::parts;
    /* PDL (pdl.cuh): the tiles, activations and outputs are earlier kernels'; a tile's weights are known only from
       its expert, so nothing is loaded before the wait */
    pdl_wait();
    const int64_t tile_idx = blockIdx.y;
    if (p.n_tiles && tile_idx >= *p.n_tiles) return;
    const fm_w4a8_tile tile = tile_of<BNT>(p, tile_idx);
    const int64_t KG = p.n_groups;

    if ((int)threadIdx.x >= THREADS) { /* the producer warpgroup */
        setmaxnreg_dec<FP4_PRODUCER_REGS(BNT)>();
        const int pt = (int)threadIdx.x - THREADS;
        const fp4_loader ld = fp4_loader_at<BNT, AF>(p, tile, pt);
        const float ts = AF == FM_W4A8_DISPATCH_NV ? *p.xts : 1.0f;
#pragma unroll
        for (int s = 0; s < FP4_RAW_STAGES; s++) {
            if (s < KG) fp4_load_stage<BNT, AF>(ld, s, raw_smem[s], wsc_smem[s], pt);
            cp_async_commit();
        }
        cp_async_wait_2();
        expand_stage<AF, BNT, FP4_PRODUCERS>(raw_smem[0], xs_smem[0], sc_smem[0], ts, pt);
        for (int64_t grp = 0, r = 1; grp < KG; grp++, r = r == 2 ? 0 : r + 1) { /* r = (grp + 1) % 3 */
            fp4_barrier(); /* stage grp expanded; the consumers are done with grp - 1 (its tile, scales, raw slot) */
            if (grp + 3 < KG)
                fp4_load_stage<BNT, AF>(ld, grp + 3, raw_smem[r == 0 ? 2 : r - 1], wsc_smem[(grp + 3) & 3], pt);
            cp_async_commit();
            if (grp + 1 < KG) {
                cp_async_wait_2(); /* stage grp + 1 landed (this thread's bytes) */
                expand_stage<AF, BNT, FP4_PRODUCERS>(raw_smem[r], xs_smem[(grp + 1) & 1], sc_smem[(grp + 1) & 1], ts,
                                                     pt);
            }
        }
        return;
    }

    setmaxnreg_inc<FP4_CONSUMER_REGS(BNT)>();
    const int warp = threadIdx.x >> 5, wg = warp >> 2, w4 = warp & 3;
    const int64_t blk0 = ((int64_t)blockIdx.x * BM + wg * 128) / 16 + w4; /* m64 block mb: 16-row block blk0 + 4 mb */
    const int64_t blk[2] = {blk0, blk0 + 4};
    const bool blk_ok[2] = {blk[0] * 16 < p.rows_pad, blk[1] * 16 < p.rows_pad};
    const warp_weights ww = warp_weights_at<WK_INT4>(p, tile.expert, blk);

    float acc[2][BNT / 8][4];
    uint32_t words[2][NW];
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mb][nt][i] = 0.0f;
#pragma unroll
        for (int j = 0; j < NW; j++) words[mb][j] = 0u; /* a block past the bank multiplies as zeros */
    }
#pragma unroll
    for (int mb = 0; mb < 2; mb++)
        if (blk_ok[mb]) {
#pragma unroll
            for (int q = 0; q < NP; q++) {
                const uint4 v = __ldg((const uint4 *)(ww.codes[mb] + q * 512));
                words[mb][4 * q] = v.x, words[mb][4 * q + 1] = v.y, words[mb][4 * q + 2] = v.z,
                              words[mb][4 * q + 3] = v.w;
            }
        }

    for (int64_t grp = 0; grp < KG; grp++) {
        const bool more = grp + 1 < KG;
        fp4_barrier(); /* stage grp expanded and its weight scales landed */
        const uint32_t xt = smem_u32(xs_smem[grp & 1]);
        const float *sc = sc_smem[grp & 1];
        const uint8_t *wsm = wsc_smem[grp & 3];
        uint32_t a[2][4][4];
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int ks = 0; ks < 4; ks++) weight_fragment<WK_INT4>(words[mb], ks, a[mb][ks]);
        float part[2][BNT / 8][4];
        float2 xsc[BNT / 8];
        float wsc[2][2], zs[2][2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int mb = 0; mb < 2; mb++) wgmma_tile<BNT>(part[mb], a[mb][ks], desc_sw128(xt + 32 * ks), ks > 0);
        wgmma_commit();
        /* while the tensor cores run: the next group's codes and this group's scales */
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
            if (more && blk_ok[mb]) {
                const uint8_t *q = ww.codes[mb] + (grp + 1) * wk_shape<WK_INT4>::chunk;
#pragma unroll
                for (int pq = 0; pq < NP; pq++) {
                    const uint4 v = __ldg((const uint4 *)(q + pq * 512));
                    words[mb][4 * pq] = v.x, words[mb][4 * pq + 1] = v.y, words[mb][4 * pq + 2] = v.z,
                                  words[mb][4 * pq + 3] = v.w;
                }
            }
        load_weight_scales<WK_INT4>(wsm, ww.lrow, wsc, zs);
        load_act_scales<BNT>(sc, xsc);
        wgmma_wait_all();
        settle_block<BNT>(part[0], a[0]);
        settle_block<BNT>(part[1], a[1]);
        promote<WK_INT4, BNT>(acc, part, wsc, zs, xsc, NULL);
    }
    static_assert(sizeof xs_smem >= BNT * epi_scratch<BNT>::h_stride, "epilogue scratch in the activation stages");
    epilogue<EPI_SWIGLU, BNT>(p, tile, acc, blk, blk_ok, red, red, &xs_smem[0][0]);
#endif
}

template <int BNT, int AF> void w4a8_wgmma_fp4_launch(const gemm_params &p, dim3 grid, cudaStream_t s) {
    pdl_launch(w4a8_wgmma_fp4_kernel<BNT, AF>, grid, FP4_CTA_THREADS, 0, s, p.pdl, p);
}

/* the producer's register split exists for 64- and 16-row tiles; 32-row ones expand inline (w4a8_gemm.cu) */
template void w4a8_wgmma_fp4_launch<FM_W4A8_BN, FM_W4A8_DISPATCH_MX>(const gemm_params &, dim3, cudaStream_t);
template void w4a8_wgmma_fp4_launch<FM_W4A8_BN, FM_W4A8_DISPATCH_NV>(const gemm_params &, dim3, cudaStream_t);
template void w4a8_wgmma_fp4_launch<FM_W4A8_BN_SMALL, FM_W4A8_DISPATCH_MX>(const gemm_params &, dim3, cudaStream_t);
template void w4a8_wgmma_fp4_launch<FM_W4A8_BN_SMALL, FM_W4A8_DISPATCH_NV>(const gemm_params &, dim3, cudaStream_t);
