// Grouped W4A8 GEMM (w4a8_gemm.cuh), two kernels with one tile shape, one layout and one epilogue (each kernel in a
// file of its own: w4a8_gemm_mma.cu, w4a8_gemm_wgmma.cu, and the FP4 producer form w4a8_gemm_fp4.cu; the device
// pieces they share in w4a8_gemm_device.cuh; this file checks the arguments and picks the kernel):
//   w4a8_wgmma_kernel  sm_90a: wgmma.m64n64k32 e4m3 (QGMMA), weights as register A fragments
//   w4a8_mma_kernel    sm_89+: mma.sync.m16n8k32 e4m3 (Ada's FP8 tensor cores; on Hopper this instruction is
//                      emulated through the fp16 units, about half the wgmma kernel's speed, so Hopper gets
//                      wgmma and the route w4a8.kernel=mma only serves to test this kernel there)
//
// Shapes: a CTA is 8 warps and computes 256 weight rows x 64 activation rows (one tile) over all of K.
// Swap-AB: the weights are the MMA's A operand (from registers) and the activations its B operand (from
// shared memory), so a warp owns 32 weight rows (two 16-row blocks) x 64 activation rows (eight n8 tiles):
//   * int4 weights go global -> registers with two 16-byte loads per 16-row block and 128-group, in the
//     fragment order of w4a8_layout.cuh, and become e4m3 A fragments with one LOP3 (or a funnel shift and a LOP3) per 4
//     codes; each weight byte is read once per CTA and converted once;
//   * activations: per 128-group, a 64 x 128-byte e4m3 tile and its 64 scales go global -> shared through a
//     3-stage cp.async pipeline (16-byte chunks XOR-swizzled by row, read conflict-free with ldmatrix);
//   * scales in the accumulator: each 128-group accumulates into a partial, then acc += partial * (weight
//     scale x 512 x activation scale) per element, as the CPU emulation (cpu_linear.c) does.
// The floor it chases: max(int4 bytes of the touched experts / 4.25 TB/s, FLOPs / ~1.3 PFLOP/s e4m3).
//
// The weight kind WK is a template parameter (same tiles, same pipeline; cuda_internal.cuh has the layouts):
//   WK_INT4    our int4-tc bank: sign-magnitude nibbles, bf16 scales
//   WK_INT4_ZP a checkpoint's unsigned nibbles (int4-zp-tc): an unsigned code u as an e4m3 byte is u / 512 exactly,
//              so A = w & 0x0F0F0F0F is the whole conversion; w = (u - z) s enters as
//              acc += partial x (512 s) x a  -  (z s) x X, X = the activation group's sum (a x sum of its codes,
//              written by the quantizer next to its scale)
//   WK_E4M3    a block-FP8 checkpoint's e4m3 bytes (e4m3-block): 2048-byte chunks, no conversion, fp32 scales
//
// The activation format AF is one too (fm_w4a8_dispatch, w4a8_workspace.h; the gate|up GEMM of --dispatch
// mxfp4|nvfp4, int4-tc banks, SwiGLU epilogue): an FP4 stage is BNT rows x 64 bytes of E2M1 codes and each row's
// 4 (MX) or 8 (NV) block-scale bytes, loaded by the same cp.async ring into a raw area. The CTA expands it into
// the e4m3 tile the MMAs read (expand_stage) and writes each row's group scale where the e4m3 path's cp.async puts
// the activation scales, so the MMAs and the promotion do not change. On the wgmma kernel (route w4a8.fp4, default
// producer) the expansion runs on a producer warpgroup of its own, a stage ahead of the MMA warpgroups
// (w4a8_wgmma_fp4_kernel): the layer costs +3-5% (MX) and +13-18% (NV) against the e4m3 dispatch at T = 16..8192
// (bench/NOTES.md 2026-12-02 "FP4 expansion off the MMA warps"). Inline (w4a8.fp4=inline, and the mma.sync kernel) it
// is a step of its own between the stage's wait and the MMAs, behind one more __syncthreads: +5-14% (MX) and +13-30%
// (NV) (bench/NOTES.md 2026-12-01 "FP4 (E2M1) activation dispatch on the GPU");
// expanding stage grp + 1 while group grp's wgmmas ran (no extra barrier, but a prefetch one stage shallower)
// measured slower still (+11-23% MX).
// Blocks of 32 (16) inside a 128-wide K group are rescaled into the group's range:
// S = the row's largest block scale of the group is the promotion's activation scale (NV: x the tensor scale),
// and each code becomes e4m3(e2m1 value x s_block / S): exact for MX while s_block / S >= 2^-8 (beyond, the
// products round into the e4m3 subnormals or to 0), an e4m3 rounding (2^-4 relative at most) for NV, whose
// scale ratios are not powers of two. A promotion per block would keep NV exact only at 16-element K steps,
// below the MMAs' K of 32. The CPU emulation expands the same way (fm_mxfp4_expand_e4m3, fm_nvfp4_expand_e4m3).
#include <string.h>

#include "backend/cuda/w4a8_gemm_device.cuh"

// Which kernel runs is the route w4a8.kernel (routes.h): wgmma on sm_90 (the binary carries sm_90a code), mma.sync
// elsewhere (sm_89: Ada); the caller passes the choice in fm_w4a8_args.wgmma.
template <int EPILOGUE, int WK, int BNT, int AF = FM_W4A8_DISPATCH_E4M3>
static void launch(const gemm_params &p, bool wgmma, bool codes_staged, dim3 grid, cudaStream_t s) {
    /* FP4 stages inline (AF): the codes stay on the register path (four raw FP4 stages would not fit beside the
       rest in static shared memory) */
    if constexpr (AF == FM_W4A8_DISPATCH_E4M3) {
        /* 32-row tiles: always the ring (two CTAs per SM leave 128 registers, where a group of codes held in
           registers spills) */
        if (wgmma && (codes_staged || BNT == FM_W4A8_BN_MID)) {
            w4a8_wgmma_launch<EPILOGUE, WK, BNT, AF, 1>(p, grid, s);
            return;
        }
    }
    (void)codes_staged;
    if (wgmma) w4a8_wgmma_launch<EPILOGUE, WK, BNT, AF, 0>(p, grid, s);
    else w4a8_mma_launch<EPILOGUE, WK, BNT, AF>(p, grid, s);
}

template <int EPILOGUE, int BNT>
static void launch_kind(const gemm_params &p, fm_wformat f, bool wgmma, bool cs, dim3 grid, cudaStream_t s) {
    if (f == FM_W_INT4_G128_TC) launch<EPILOGUE, WK_INT4, BNT>(p, wgmma, cs, grid, s);
    else if (f == FM_W_INT4_ZP_TC) launch<EPILOGUE, WK_INT4_ZP, BNT>(p, wgmma, cs, grid, s);
    else launch<EPILOGUE, WK_E4M3, BNT>(p, wgmma, cs, grid, s);
}

template <int BNT> static void launch_epilogue(const fm_w4a8_args *a, const gemm_params &p, dim3 grid, cudaStream_t s) {
    /* FP4 activations: the gate|up GEMM of int4-tc banks only (fm_cuda_w4a8_gemm checks) */
    /* the producer warpgroup's kernel has register splits for 64- and 16-row tiles; 32-row ones expand inline */
    if constexpr (BNT != FM_W4A8_BN_MID) {
        if (a->dispatch != FM_W4A8_DISPATCH_E4M3 && a->wgmma && a->fp4_producer) {
            if (a->dispatch == FM_W4A8_DISPATCH_MX) w4a8_wgmma_fp4_launch<BNT, FM_W4A8_DISPATCH_MX>(p, grid, s);
            else w4a8_wgmma_fp4_launch<BNT, FM_W4A8_DISPATCH_NV>(p, grid, s);
            return;
        }
    }
    if (a->token_scales) {
        launch<EPI_SWIGLU_TOK, WK_INT4, BNT>(p, a->wgmma, a->codes_staged, grid, s);
        return;
    }
    if (a->dispatch == FM_W4A8_DISPATCH_MX)
        launch<EPI_SWIGLU, WK_INT4, BNT, FM_W4A8_DISPATCH_MX>(p, a->wgmma, a->codes_staged, grid, s);
    else if (a->dispatch == FM_W4A8_DISPATCH_NV)
        launch<EPI_SWIGLU, WK_INT4, BNT, FM_W4A8_DISPATCH_NV>(p, a->wgmma, a->codes_staged, grid, s);
    else if (a->epilogue == FM_W4A8_OUT_BF16)
        launch_kind<EPI_BF16, BNT>(p, a->w->fmt, a->wgmma, a->codes_staged, grid, s);
    else if (a->hsum) launch_kind<EPI_SWIGLU_SUMS, BNT>(p, a->w->fmt, a->wgmma, a->codes_staged, grid, s);
    else launch_kind<EPI_SWIGLU, BNT>(p, a->w->fmt, a->wgmma, a->codes_staged, grid, s);
}

// split K (fm_w4a8_args.splits): the wgmma kernel's cluster form, 64-row tiles
static void launch_split(const fm_w4a8_args *a, const gemm_params &p, dim3 grid, cudaStream_t s) {
    const fm_wformat f = a->w->fmt;
    if (f == FM_W_INT4_G128_TC)
        a->codes_staged ? w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_INT4, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 1>(p, grid, s)
                        : w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_INT4, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 0>(p, grid, s);
    else if (f == FM_W_INT4_ZP_TC)
        a->codes_staged
            ? w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_INT4_ZP, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 1>(p, grid, s)
            : w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_INT4_ZP, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 0>(p, grid, s);
    else
        a->codes_staged ? w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_E4M3, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 1>(p, grid, s)
                        : w4a8_wgmma_launch<EPI_BF16_SPLIT, WK_E4M3, FM_W4A8_BN, FM_W4A8_DISPATCH_E4M3, 0>(p, grid, s);
}

void fm_cuda_w4a8_gemm(const fm_w4a8_args *a, cudaStream_t s) {
    const fm_bank *w = a->w;
    const bool tc = w->fmt == FM_W_INT4_G128_TC || w->fmt == FM_W_INT4_ZP_TC || w->fmt == FM_W_E4M3_B128;
    if (!tc || a->max_tiles <= 0 || (a->tiles == NULL) != (a->n_tiles == NULL) ||
        (w->fmt == FM_W_INT4_ZP_TC && !a->xsum) ||
        (a->epilogue == FM_W4A8_OUT_SWIGLU_E4M3 && (!w->interleaved || !a->h || !a->hs)) ||
        (a->epilogue == FM_W4A8_OUT_BF16 && !a->y) || a->max_tiles > 65535 ||
        !(a->tile_rows == 0 || a->tile_rows == FM_W4A8_BN || a->tile_rows == FM_W4A8_BN_MID ||
          a->tile_rows == FM_W4A8_BN_SMALL) ||
        ((uintptr_t)w->scales | (uintptr_t)w->fscales | (uintptr_t)w->zscales) % 16 /* cp.async of the scales */ ||
        (a->dispatch != FM_W4A8_DISPATCH_E4M3 &&
         (w->fmt != FM_W_INT4_G128_TC || a->epilogue != FM_W4A8_OUT_SWIGLU_E4M3 || a->hsum ||
          (a->dispatch == FM_W4A8_DISPATCH_NV && !a->xts))) ||
        (a->token_scales && (w->fmt != FM_W_INT4_G128_TC || a->dispatch != FM_W4A8_DISPATCH_E4M3 ||
                             a->epilogue != FM_W4A8_OUT_SWIGLU_E4M3 || a->hsum))) {
        fprintf(stderr,
                "fp8moe: w4a8_gemm: bad arguments (format %s, epilogue %d, tiles %lld, dispatch %d, token scales %d)\n",
                fm_wformat_name(w->fmt), (int)a->epilogue, (long long)a->max_tiles, (int)a->dispatch,
                (int)a->token_scales);
        abort();
    }
    const bool split = a->splits > 1;
    if (split && (a->tiles || a->epilogue != FM_W4A8_OUT_BF16 || w->interleaved || !a->wgmma ||
                  a->dispatch != FM_W4A8_DISPATCH_E4M3 || a->token_scales ||
                  !(a->tile_rows == 0 || a->tile_rows == FM_W4A8_BN) || a->splits > FM_W4A8_MAX_SPLITS ||
                  a->splits > w->n_groups)) {
        fprintf(stderr,
                "fp8moe: w4a8_gemm: split K over %d CTAs needs dense tiling, bf16 out, a plain bank, the wgmma kernel, "
                "64-row tiles and at most %d splits (the bank has %lld groups)\n",
                a->splits, FM_W4A8_MAX_SPLITS, (long long)w->n_groups);
        abort();
    }
    gemm_params p;
    memset(&p, 0, sizeof p);
    p.wq = (const uint8_t *)w->w, p.ws = w->scales, p.wsf = w->fscales, p.wzs = w->zscales;
    p.rows = w->rows, p.rows_pad = w->rows_pad, p.n_groups = w->n_groups, p.interleaved = w->interleaved;
    p.x = a->x, p.ldx = a->dispatch != FM_W4A8_DISPATCH_E4M3 ? w->ld / 2 : w->ld, p.xs = a->xs, p.xsum = a->xsum;
    p.lds = a->lds, p.xts = a->xts;
    p.tiles = a->tiles, p.n_tiles = a->n_tiles, p.m_dense = a->m_dense, p.dense_matrix = a->dense_matrix;
    p.y = a->y, p.ldy = a->ldy, p.row_map = a->row_map;
    p.h = a->h, p.ldh = a->ldh, p.hs = a->hs, p.hsum = a->hsum, p.ldhs = a->ldhs, p.pdl = a->pdl;
    p.tiles_early = a->tiles_early, p.early_codes = a->early_codes;
    const dim3 grid((unsigned)fm_ceil_div(w->rows_pad, BM), (unsigned)a->max_tiles, split ? (unsigned)a->splits : 1u);
    if (split) launch_split(a, p, grid, s);
    else if (a->tile_rows == FM_W4A8_BN_SMALL) launch_epilogue<FM_W4A8_BN_SMALL>(a, p, grid, s);
    else if (a->tile_rows == FM_W4A8_BN_MID) launch_epilogue<FM_W4A8_BN_MID>(a, p, grid, s);
    else launch_epilogue<FM_W4A8_BN>(a, p, grid, s);
    FM_LAUNCH_CHECK(split                             ? "w4a8 GEMM (split K, bf16 out)"
                    : a->epilogue == FM_W4A8_OUT_BF16 ? "w4a8 grouped GEMM (bf16 out)"
                                                      : "w4a8 grouped GEMM (swiglu e4m3 out)");
}
