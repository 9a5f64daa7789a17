// The grouped W4A8 GEMM on mma.sync.m16n8k32 e4m3 (sm_89: Ada's FP8 tensor cores; on Hopper the route
// w4a8.kernel=mma, which serves to test it there): w4a8_gemm.cu describes the tiles and picks the kernel.
#include "backend/cuda/w4a8_gemm_device.cuh"

template <int EPILOGUE, int WK, int BNT, int AF>
static __global__ __launch_bounds__(THREADS,
                                    BNT == FM_W4A8_BN_SMALL ? 2 : 1) void w4a8_mma_kernel(const gemm_params p) {
    __shared__ __align__(128) uint8_t xs_smem[STAGES][BNT * 128];
    __shared__ float sc_smem[STAGES][BNT];
    __shared__ float sum_smem[WK == WK_INT4_ZP ? STAGES : 1][BNT];
    __shared__ __align__(16) uint8_t wsc_smem[STAGES][BM * wk_scales<WK>::row_bytes];
    __shared__ float red[THREADS / 32][BNT];
    __shared__ float red_sum[EPILOGUE == EPI_SWIGLU_SUMS ? THREADS / 32 : 1][BNT];
    __shared__ __align__(16) uint8_t raw_smem[AF ? STAGES : 1][AF ? BNT * 72 : 16]; /* FP4 stages (load_stage) */
    constexpr int NW = wk_shape<WK>::words;
    constexpr bool TOK = EPILOGUE == EPI_SWIGLU_TOK; /* one activation scale per token: promote_token */
    static_assert(!TOK || (WK == WK_INT4 && AF == FM_W4A8_DISPATCH_E4M3), "per-token scales: int4-tc, e4m3 rows");

    /* PDL (pdl.cuh): the tiles, activations and outputs are earlier kernels'; a tile's weights are known only from
       its expert, so nothing is loaded before the wait */
    pdl_wait();
    const int64_t tile_idx = blockIdx.y;
    if (p.n_tiles && tile_idx >= *p.n_tiles) return;
    const fm_w4a8_tile tile = tile_of<BNT>(p, tile_idx);
    const stage_loader ld = stage_loader_at<WK, BNT, AF>(p, tile);
    const float ts = AF == FM_W4A8_DISPATCH_NV ? *p.xts : 1.0f;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row_base = (int64_t)blockIdx.x * BM + warp * 32; /* first tiled weight row of this warp */
    const bool active = row_base < p.rows_pad;
    const int64_t KG = p.n_groups;
    const int64_t blk[2] = {row_base / 16, row_base / 16 + 1};
    const bool blk_ok[2] = {active, active};
    const warp_weights ww = warp_weights_at<WK>(p, tile.expert, blk);

    float acc[2][BNT / 8][4];
    uint32_t words[2][NW]; /* the current group's codes; each part is reloaded with the next group's once used */
#pragma unroll
    for (int mb = 0; mb < 2; mb++)
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mb][nt][i] = 0.0f;

    load_stage<WK, BNT, AF>(p, ld, 0, xs_smem[0], sc_smem[0], sum_smem[0], wsc_smem[0], raw_smem[0]);
    cp_async_commit();
    if (KG > 1)
        load_stage<WK, BNT, AF>(p, ld, 1, xs_smem[1], sc_smem[1], sum_smem[WK == WK_INT4_ZP ? 1 : 0], wsc_smem[1],
                                raw_smem[AF ? 1 : 0]);
    cp_async_commit();
    if (active) {
#pragma unroll
        for (int q = 0; q < wk_shape<WK>::parts; q++) load_weight_part<WK>(ww, 0, q, words);
    }

    for (int64_t grp = 0, st = 0; grp < KG; grp++, st = st == STAGES - 1 ? 0 : st + 1) { /* st = grp % STAGES */
        const bool more = grp + 1 < KG;
        const int st2 = st == 0 ? 2 : (int)st - 1; /* (grp + 2) % STAGES */
        cp_async_wait_1();
        __syncthreads(); /* stage grp landed for all threads; stage grp - 1 is free */
        if (grp + 2 < KG)
            load_stage<WK, BNT, AF>(p, ld, grp + 2, xs_smem[st2], sc_smem[st2], sum_smem[WK == WK_INT4_ZP ? st2 : 0],
                                    wsc_smem[st2], raw_smem[AF ? st2 : 0]);
        cp_async_commit();
        if (AF) { /* FP4: the stage's expansion, visible to every warp before the MMAs read it */
            expand_stage<AF, BNT, THREADS>(raw_smem[AF ? st : 0], xs_smem[st], sc_smem[st], ts, (int)threadIdx.x);
            __syncthreads();
        }
        if (!active) continue;
        const uint8_t *xt = xs_smem[st];
        const float *sc = sc_smem[st];
        const float *xsum = sum_smem[WK == WK_INT4_ZP ? st : 0];
        float part[2][BNT / 8][4];
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mb][nt][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mb = 0; mb < 2; mb++) weight_fragment<WK>(words[mb], s, a[mb]);
            /* a full group ahead: the part whose last k step this was */
            if (more && (WK == WK_E4M3 || s % 2 == 1))
                load_weight_part<WK>(ww, grp + 1, WK == WK_E4M3 ? s : s / 2, words);
#pragma unroll
            for (int np = 0; np < BNT / 16; np++) {
                /* matrices: n8 tile 2np (k chunks 2s, 2s + 1), then n8 tile 2np + 1 */
                const int n = (2 * np + (lane >> 4)) * 8 + (lane & 7), chunk = 2 * s + ((lane >> 3) & 1);
                uint32_t b[4];
                ldmatrix_x4(b, smem_u32(xt + n * 128 + ((chunk ^ (n & 7)) << 4)));
#pragma unroll
                for (int mb = 0; mb < 2; mb++) {
                    mma_e4m3(part[mb][2 * np], a[mb], b[0], b[1]);
                    mma_e4m3(part[mb][2 * np + 1], a[mb], b[2], b[3]);
                }
            }
        }
        float2 xsc[BNT / 8];
        float wsc[2][2], zs[2][2];
        load_weight_scales<WK>(wsc_smem[st], ww.lrow, wsc, zs);
        if (TOK) {
            promote_token<BNT>(acc, part, wsc);
        } else {
            load_act_scales<BNT>(sc, xsc);
            promote<WK, BNT>(acc, part, wsc, zs, xsc, xsum);
        }
    }
    if (TOK) scale_by_token<BNT>(acc, sc_smem[(KG - 1) % STAGES]); /* the last group's stage: still in place */

    static_assert(sizeof xs_smem >= epi_scratch<BNT>::bytes, "epilogue scratch in the activation stages");
    epilogue<TOK ? EPI_SWIGLU : EPILOGUE, BNT>(p, tile, acc, blk, blk_ok, red, red_sum, &xs_smem[0][0]);
}

template <int EPILOGUE, int WK, int BNT, int AF> void w4a8_mma_launch(const gemm_params &p, dim3 grid, cudaStream_t s) {
    pdl_launch(w4a8_mma_kernel<EPILOGUE, WK, BNT, AF>, grid, THREADS, 0, s, p.pdl, p);
}

#define W4A8_MMA_INSTANCE(E, WK, BNT, AF)                                                                              \
    template void w4a8_mma_launch<E, WK, BNT, AF>(const gemm_params &, dim3, cudaStream_t);
W4A8_EACH_E4M3(W4A8_MMA_INSTANCE)
W4A8_EACH_FP4(W4A8_MMA_INSTANCE)
W4A8_EACH_TOKEN(W4A8_MMA_INSTANCE)
