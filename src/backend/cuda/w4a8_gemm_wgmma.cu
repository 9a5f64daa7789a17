// The grouped W4A8 GEMM on wgmma.m64nNk32 e4m3 (sm_90a), the codes in registers (CS = 0) or through the stage ring
// (CS = 1): w4a8_gemm.cu describes the tiles and picks the kernel.
#include "backend/cuda/w4a8_gemm_device.cuh"

// ---- sm_90a: wgmma ----------------------------------------------------------------------------------------
// Same tile (256 weight rows x 64 activation rows), same layouts, same epilogue. Two warpgroups, each owning
// 128 weight rows as two m64 blocks; per k step of 32 a warpgroup issues wgmma.m64n64k32 e4m3 with A (the
// weights, converted in registers: the A fragment of a warp is the m16n8k32 one, warp w of the warpgroup holding
// rows 16w..16w+15 of the m64 block) and B (the activations) read by the tensor cores straight from the
// 128-byte-swizzled shared tile. A 128-group is 8 wgmmas in one commit group; then wait, promote the partial
// into the accumulator with the scales, as the mma.sync kernel does.

// Two warpgroups of 4 warps; each owns 128 weight rows as two m64 blocks (warp w of a warpgroup: rows 16w..16w+15
// of each block). All 256 threads load the next activation stages with cp.async (a 3-stage ring) and meet at one
// __syncthreads per 128-group. Per group: convert both blocks' fragments (nothing in flight: ptxas serialises every
// wgmma if a fragment register is redefined while one may still read it), issue the 8 wgmmas (2 blocks x 4 k steps)
// as one commit group, wait, promote. The other warpgroup's wgmmas fill the tensor cores meanwhile. (Measured
// against: a producer warpgroup with an mbarrier ring, 20-25% slower; promoting block 0 while block 1 runs, 2% slower;
// each warpgroup with its own stage ring, 8-19% slower, and taking turns at the tensor cores on top, 12-22% slower:
// bench/NOTES.md.)
// Where the codes come from is CS (route w4a8.codes):
//   CS = 0  each warp loads its codes global -> registers a group ahead (issued while the group's wgmmas run): one
//           group of codes in flight per CTA, ~16 KB per SM with one CTA per SM;
//   CS = 1  the CTA's codes of a group travel in the cp.async ring with its activation tile (CSTAGES = 4 stages, 16
//           KB of codes each in dynamic shared memory) and each warp reads its words from shared memory after the
//           barrier: three groups in flight, and no words held across the wgmmas (7 fewer registers; what lets
//           32-row tiles run two CTAs per SM within 128). Measured (bench/NOTES.md 2026-12-02 "the grouped W4A8
//           GEMM in the few-rows-per-expert regime"): 4-9% faster where experts get few rows (each tile streams
//           its own expert's codes from DRAM), 5% slower at 512 rows per expert: the code loads' latency was not
//           what bounds the kernel (ncu: 40% of DRAM bandwidth, 22% of the tensor pipe, 0.44 eligible warps per
//           scheduler at one CTA per SM).
template <int EPILOGUE, int WK, int BNT, int AF, int CS>
static __global__ __launch_bounds__(THREADS,
                                    BNT <= FM_W4A8_BN_MID ? 2 : 1) void w4a8_wgmma_kernel(const gemm_params p) {
    constexpr int S = CS ? CSTAGES : STAGES;
    __shared__ __align__(1024) uint8_t xs_smem[S][BNT * 128];
    __shared__ float sc_smem[S][BNT];
    __shared__ float sum_smem[WK == WK_INT4_ZP ? S : 1][BNT];
    __shared__ __align__(16) uint8_t wsc_smem[S][BM * wk_scales<WK>::row_bytes];
    __shared__ float red[THREADS / 32][BNT];
    __shared__ float red_sum[EPILOGUE == EPI_SWIGLU_SUMS ? THREADS / 32 : 1][BNT];
    __shared__ __align__(16) uint8_t raw_smem[AF ? S : 1][AF ? BNT * 72 : 16]; /* FP4 stages (load_stage) */
    extern __shared__ __align__(16) uint8_t code_smem[];                       /* CS: [S][code_stage<WK>::bytes] */
    constexpr int NW = wk_shape<WK>::words, NP = wk_shape<WK>::parts;
    constexpr bool TOK = EPILOGUE == EPI_SWIGLU_TOK; /* one activation scale per token: promote_token */
    static_assert(!TOK || (WK == WK_INT4 && AF == FM_W4A8_DISPATCH_E4M3), "per-token scales: int4-tc, e4m3 rows");
    constexpr bool SPLIT = EPILOGUE == EPI_BF16_SPLIT; /* K split over the cluster's CTAs along z: epilogue_split */
    static_assert(!SPLIT || (BNT == FM_W4A8_BN && AF == FM_W4A8_DISPATCH_E4M3), "split K: 64-row tiles, e4m3 rows");

    /* PDL (pdl.cuh): the tiles, activations and outputs are earlier kernels'. A CTA whose tile is known before the
       wait (early: dense tiling, whose tile is its index, or tiles written two launches back, tiles_early: the
       grouped down GEMM, whose CTAs take the SMs the gate|up GEMM's last wave leaves idle) issues its first codes
       before it (route w4a8.early_codes): the ring's first S - 1 stages (CS), or group 0's words (registers) */
    const int64_t tile_idx = blockIdx.y;
    const bool early = p.early_codes && (!p.tiles || p.tiles_early);
    fm_w4a8_tile tile = {0, 0, 0, 0};
    if (early) {
        if (p.n_tiles && tile_idx >= __ldcg(p.n_tiles)) {
            pdl_wait();
            return;
        }
        tile = tile_of_early<BNT>(p, tile_idx);
    } else {
        pdl_wait();
        if (p.n_tiles && tile_idx >= *p.n_tiles) return;
        tile = tile_of<BNT>(p, tile_idx);
    }
    const stage_loader ld = stage_loader_at<WK, BNT, AF>(p, tile);
    const int warp = threadIdx.x >> 5, wg = warp >> 2, w4 = warp & 3, lane = threadIdx.x & 31;
    const int64_t blk0 = ((int64_t)blockIdx.x * BM + wg * 128) / 16 + w4; /* m64 block mb: 16-row block blk0 + 4 mb */
    const int64_t blk[2] = {blk0, blk0 + 4};
    const bool blk_ok[2] = {blk[0] * 16 < p.rows_pad, blk[1] * 16 < p.rows_pad};
    /* this CTA's 128-groups [G0, G0 + KG) of the bank's n_groups (all of them but under SPLIT) */
    const int64_t G0 = SPLIT ? p.n_groups * blockIdx.z / gridDim.z : 0;
    const int64_t KG = SPLIT ? p.n_groups * (blockIdx.z + 1) / gridDim.z - G0 : p.n_groups;
    warp_weights ww = warp_weights_at<WK>(p, tile.expert, blk);
    code_loader cl;
    if (CS) cl = code_loader_at<WK>(p, tile.expert);
    if (SPLIT) {
        ww.codes[0] += G0 * wk_shape<WK>::chunk, ww.codes[1] += G0 * wk_shape<WK>::chunk;
        if (CS) cl.src += G0 * wk_shape<WK>::chunk;
    }
    /* CS: this lane's 16 bytes of part 0 of block mb in a code stage */
    const int coff[2] = {(wg * 8 + w4) * wk_shape<WK>::chunk + lane * 16,
                         (wg * 8 + w4 + 4) * wk_shape<WK>::chunk + lane * 16};

    float acc[2][BNT / 8][4];
    uint32_t words[2][NW], nxt[2][NW];
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
#pragma unroll
        for (int j = 0; j < NW; j++) nxt[mb][j] = 0u;
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mb][nt][i] = 0.0f;
#pragma unroll
        for (int j = 0; j < NW; j++) words[mb][j] = 0u; /* a block past the bank multiplies as zeros */
    }
    /* group 0's words (registers) or the ring's first stages of codes (CS; uncommitted: the prologue's first commit
       takes them into its group), before the wait when early. Registers: both blocks of a warp are present or absent
       together when rows_pad is a multiple of 64; otherwise the absent one keeps zero codes (and reads zero scales:
       the stage zero-fills rows past the bank) */
    if (!CS) {
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
    } else {
#pragma unroll
        for (int st = 0; st < S - 1; st++)
            if (KG > st) load_codes<WK>(cl, st, code_smem + st * code_stage<WK>::bytes);
    }
    if (early) pdl_wait();
    const float ts = AF == FM_W4A8_DISPATCH_NV ? *p.xts : 1.0f;

    /* stages 0 .. S - 2 of the activations and weight scales (a GEMM has at least one group) */
    load_stage<WK, BNT, AF>(p, ld, G0, xs_smem[0], sc_smem[0], sum_smem[0], wsc_smem[0], raw_smem[0]);
    cp_async_commit();
#pragma unroll
    for (int s = 1; s < S - 1; s++) {
        if (KG > s)
            load_stage<WK, BNT, AF>(p, ld, G0 + s, xs_smem[s], sc_smem[s], sum_smem[WK == WK_INT4_ZP ? s : 0],
                                    wsc_smem[s], raw_smem[AF ? s : 0]);
        cp_async_commit();
    }

    /* 64-bit group counter and stage 0 outside the prologue loop: the register path's PTX as before the ring's CS
       variant, whose 32-bit counter measured 5-11 % slower (bench/NOTES.md 2026-12-02 "a regression in the W4A8
       GEMM's register path") */
    for (int64_t grp = 0, st = 0; grp < KG; grp++, st = st == S - 1 ? 0 : st + 1) { /* st = grp % S */
        const bool more = grp + 1 < KG;
        const int stl = st == 0 ? S - 1 : (int)st - 1; /* (grp + S - 1) % S: freed by the barrier below */
        cp_async_wait<S - 2>();
        __syncthreads(); /* stage grp landed for all threads; stage grp - 1 is free */
        if (grp + S - 1 < KG) {
            load_stage<WK, BNT, AF>(p, ld, G0 + grp + S - 1, xs_smem[stl], sc_smem[stl],
                                    sum_smem[WK == WK_INT4_ZP ? stl : 0], wsc_smem[stl], raw_smem[AF ? stl : 0]);
            if (CS) load_codes<WK>(cl, grp + S - 1, code_smem + stl * code_stage<WK>::bytes);
        }
        cp_async_commit();
        if (AF) { /* FP4: the stage's expansion, visible to every warp before the MMAs read it */
            expand_stage<AF, BNT, THREADS>(raw_smem[AF ? st : 0], xs_smem[st], sc_smem[st], ts, (int)threadIdx.x);
            __syncthreads();
        }
        const uint32_t xt = smem_u32(xs_smem[st]);
        const float *sc = sc_smem[st];
        const float *xsum = sum_smem[WK == WK_INT4_ZP ? st : 0];
        const uint8_t *wsm = wsc_smem[st];
        if (CS) { /* this group's words from the stage (zeros for a block past the bank: zero-filled) */
            const uint8_t *cs = code_smem + st * code_stage<WK>::bytes;
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
#pragma unroll
                for (int q = 0; q < NP; q++) {
                    const uint4 v = *(const uint4 *)(cs + coff[mb] + q * 512);
                    words[mb][4 * q] = v.x, words[mb][4 * q + 1] = v.y, words[mb][4 * q + 2] = v.z,
                                  words[mb][4 * q + 3] = v.w;
                }
        }

        uint32_t a[2][4][4]; /* [block][k step][fragment]: alive until the wait (the tensor cores read them) */
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int ks = 0; ks < 4; ks++) weight_fragment<WK>(words[mb], ks, a[mb][ks]);
        float part[2][BNT / 8][4];
        /* the scales of this group: int4 kernels read them while the wgmmas run; e4m3 ones, which promote after every
           k step, read the activation scales after each wait (before it, 16 more registers made them spill) */
        float2 xsc[BNT / 8];
        float wsc[2][2], zs[2][2];
        /* e4m3 x e4m3 products carry 8 significant bits and the FP8 wgmma accumulates in less than fp32: a 128-group
           summed in the tensor cores lost accuracy on a real block-FP8 checkpoint (cosine 0.9981 against the CPU
           emulation, 0.99993 when every k step of 32 is promoted: bench/NOTES.md). int4 codes (3-4 significant bits)
           do not need it. So e4m3 banks promote after each k step; the last step's MMA overlaps the loads below. */
        constexpr int KSTEP = WK == WK_E4M3 ? 1 : 4; /* k steps of 32 per promotion */
#pragma unroll
        for (int k0 = 0; k0 < 4 - KSTEP; k0 += KSTEP) { /* every chunk but the last (none for int4) */
            wgmma_fence();
#pragma unroll
            for (int ks = k0; ks < k0 + KSTEP; ks++)
#pragma unroll
                for (int mb = 0; mb < 2; mb++) wgmma_tile<BNT>(part[mb], a[mb][ks], desc_sw128(xt + 32 * ks), ks > k0);
            wgmma_commit();
            wgmma_wait_all();
            settle_block<BNT>(part[0], a[0]);
            settle_block<BNT>(part[1], a[1]);
            if (k0 == 0) load_weight_scales<WK>(wsm, ww.lrow, wsc, zs);
            load_act_scales<BNT>(sc, xsc);
            promote<WK, BNT>(acc, part, wsc, zs, xsc, xsum);
        }
        wgmma_fence();
#pragma unroll
        for (int ks = 4 - KSTEP; ks < 4; ks++)
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
                wgmma_tile<BNT>(part[mb], a[mb][ks], desc_sw128(xt + 32 * ks), ks > 4 - KSTEP);
        wgmma_commit();
        /* while the tensor cores run (CS = 0): the next group's codes and scales */
        /* e4m3 fragments are the loaded words themselves (no conversion), so the compiler may hand the wgmma the words'
           own registers: the next group's codes then go to registers of their own until the wait (nxt), or a load
           landing early would change an operand the tensor cores have not read yet (measured: wrong rows). With CS
           the words are reloaded only after the wait. */
        uint32_t(*dst)[NW] = WK == WK_E4M3 ? nxt : words;
        if (!CS)
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
                if (more && blk_ok[mb]) {
                    const uint8_t *q = ww.codes[mb] + (grp + 1) * wk_shape<WK>::chunk;
#pragma unroll
                    for (int pq = 0; pq < NP; pq++) {
                        const uint4 v = __ldg((const uint4 *)(q + pq * 512));
                        dst[mb][4 * pq] = v.x, dst[mb][4 * pq + 1] = v.y, dst[mb][4 * pq + 2] = v.z,
                                    dst[mb][4 * pq + 3] = v.w;
                    }
                }
        if (WK != WK_E4M3) {
            load_weight_scales<WK>(wsm, ww.lrow, wsc, zs);
            if (!TOK) load_act_scales<BNT>(sc, xsc);
        }
        wgmma_wait_all();
        settle_block<BNT>(part[0], a[0]);
        settle_block<BNT>(part[1], a[1]);
        if (!CS && WK == WK_E4M3 && more)
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
#pragma unroll
                for (int j = 0; j < NW; j++) words[mb][j] = nxt[mb][j];
        if (WK == WK_E4M3) load_act_scales<BNT>(sc, xsc);
        if (TOK) promote_token<BNT>(acc, part, wsc);
        else promote<WK, BNT>(acc, part, wsc, zs, xsc, xsum);
    }
    if (TOK) scale_by_token<BNT>(acc, sc_smem[(KG - 1) % S]); /* the last group's stage: still in place */
    static_assert(sizeof xs_smem >= epi_scratch<BNT>::bytes, "epilogue scratch in the activation stages");
    if constexpr (SPLIT) {
        cp_async_wait<0>(); /* the last (empty) groups of the ring: the dynamic shared memory holds the partials */
        __syncthreads();    /* and every warp is done reading the code stages (CS) */
        epilogue_split<BNT>(p, tile, acc, (float *)code_smem);
    } else {
        epilogue<TOK ? EPI_SWIGLU : EPILOGUE, BNT>(p, tile, acc, blk, blk_ok, red, red_sum, &xs_smem[0][0]);
    }
}

template <int EPILOGUE, int WK, int BNT, int AF, int CS>
void w4a8_wgmma_launch(const gemm_params &p, dim3 grid, cudaStream_t s) {
    if constexpr (EPILOGUE == EPI_BF16_SPLIT) { /* one cluster of grid.z CTAs a tile; the partials in dynamic smem */
        constexpr int code_bytes = CS ? CSTAGES * code_stage<WK>::bytes : 0;
        constexpr int smem = code_bytes > split_shape<BNT>::bytes ? code_bytes : split_shape<BNT>::bytes;
        FM_CUDA_CHECK(cudaFuncSetAttribute(w4a8_wgmma_kernel<EPILOGUE, WK, BNT, AF, CS>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        cudaLaunchAttribute attr[2] = {};
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = grid.z;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid, cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = smem, cfg.stream = s;
        cfg.attrs = attr, cfg.numAttrs = p.pdl ? 2 : 1;
        cudaLaunchKernelEx(&cfg, w4a8_wgmma_kernel<EPILOGUE, WK, BNT, AF, CS>, p); /* errors: the caller's check */
        return;
    }
    if constexpr (CS) {
        constexpr int smem = CSTAGES * code_stage<WK>::bytes;
        FM_CUDA_CHECK(cudaFuncSetAttribute(w4a8_wgmma_kernel<EPILOGUE, WK, BNT, AF, 1>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        pdl_launch(w4a8_wgmma_kernel<EPILOGUE, WK, BNT, AF, 1>, grid, THREADS, smem, s, p.pdl, p);
    } else {
        pdl_launch(w4a8_wgmma_kernel<EPILOGUE, WK, BNT, AF, 0>, grid, THREADS, 0, s, p.pdl, p);
    }
}

#define W4A8_WGMMA_REGISTERS(E, WK, BNT, AF)                                                                           \
    template void w4a8_wgmma_launch<E, WK, BNT, AF, 0>(const gemm_params &, dim3, cudaStream_t);
#define W4A8_WGMMA_STAGED(E, WK, BNT, AF)                                                                              \
    template void w4a8_wgmma_launch<E, WK, BNT, AF, 1>(const gemm_params &, dim3, cudaStream_t);
W4A8_EACH_E4M3(W4A8_WGMMA_REGISTERS)
W4A8_EACH_E4M3(W4A8_WGMMA_STAGED)
W4A8_EACH_FP4(W4A8_WGMMA_REGISTERS) /* FP4 stages keep the codes on the register path */
W4A8_EACH_TOKEN(W4A8_WGMMA_REGISTERS)
W4A8_EACH_TOKEN(W4A8_WGMMA_STAGED)
W4A8_EACH_SPLIT(W4A8_WGMMA_REGISTERS)
W4A8_EACH_SPLIT(W4A8_WGMMA_STAGED)
