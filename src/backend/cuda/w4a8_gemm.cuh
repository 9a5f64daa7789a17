// Grouped W4A8 GEMM on tensor cores (mma.sync m16n8k32 e4m3, sm_89 and sm_90): y = x W_e^T for row tiles of
// an e4m3 activation matrix, each tile multiplied by the matrix (expert) it was routed to. The dense W4A8
// projections are the same kernel with one matrix and identity tiles.
#ifndef FM_CUDA_W4A8_GEMM_CUH
#define FM_CUDA_W4A8_GEMM_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/w4a8_workspace.h"

// One tile: rows [slot0, slot0 + rows) of the activation matrix (rows <= the tile rows the GEMM is launched with:
// FM_W4A8_BN, FM_W4A8_BN_MID or FM_W4A8_BN_SMALL by rows per expert, routes.h) times matrix `expert`.
typedef struct fm_w4a8_tile {
    int32_t expert, slot0, rows, pad;
} fm_w4a8_tile;

typedef enum fm_w4a8_epilogue {
    FM_W4A8_OUT_BF16,        // y[row_map ? row_map[slot] : slot][col] = bf16(acc), col in the bank's row order
    FM_W4A8_OUT_SWIGLU_E4M3, // interleaved gate|up bank: h = bf16(silu(bf16 gate) * bf16 up) quantized to e4m3
                             // with one fp32 scale per (slot, 128 channels): h[slot][ch], hs[ch / 128][slot]
} fm_w4a8_epilogue;

typedef struct fm_w4a8_args {
    const fm_bank *w;  // int4-tc, int4-zp-tc or e4m3-block bank (w4a8_layout.cuh, cuda_internal.cuh)
    bool wgmma;        // the wgmma kernel (sm_90a only), else mma.sync: fm_routes_w4a8_wgmma
    bool codes_staged; // wgmma kernel: the codes through the shared-memory stage ring (fm_routes_w4a8_codes_staged)
    bool pdl;          // launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl)
    // the wgmma kernel's CTAs whose tile is known before the PDL wait (dense tiling, or tiles_early) issue their
    // first weight codes before it (fm_routes_w4a8_early_codes)
    bool early_codes;
    const uint8_t *x;  // e4m3 activations [slots][w->ld] (K padded to 128 with zeros)
    const float *xs;   // activation scales [w->n_groups][lds]
    const float *xsum; // int4-zp-tc banks: the activation group sums (scale x sum of codes), as xs
    int64_t lds;
    // the activations' format (fm_w4a8_dispatch): e4m3 as above, or FP4 (int4-tc banks, the SwiGLU epilogue): x holds
    // E2M1 codes [slots][w->ld / 2] and xs the block-scale words of moe_dispatch.cuh; xts the NVFP4 tensor scale
    int32_t dispatch;
    const float *xts;
    bool fp4_producer; // FP4 on the wgmma kernel: a producer warpgroup expands (fm_routes_w4a8_fp4_producer)
    // one activation scale per token (route moe.act_scale=token; xs as above, every group's scale of a row the
    // token's): the SwiGLU GEMM of an int4-tc bank on e4m3 rows, either kernel
    bool token_scales;
    // tiles: a device list and its device count (grouped), or NULL for dense tiling of m_dense rows
    const fm_w4a8_tile *tiles;
    const int32_t *n_tiles;
    // the tiles and their count were written at least two launches before this GEMM's (the dispatch before the
    // gate|up GEMM, for the down GEMM), so a CTA may read its tile before its PDL wait (through L2)
    bool tiles_early;
    int64_t max_tiles; // grid size in tiles (an upper bound of *n_tiles)
    int32_t tile_rows; // the tiles' rows: FM_W4A8_BN (64; 0 means it), FM_W4A8_BN_MID (32) or FM_W4A8_BN_SMALL (16)
    int64_t m_dense;
    int32_t dense_matrix; // the bank matrix of dense tiling
    fm_w4a8_epilogue epilogue;
    __nv_bfloat16 *y; // OUT_BF16
    int64_t ldy;
    // K split over a thread-block cluster of this many CTAs a tile (route w4a8.splits; 0 or 1: none): dense tiling,
    // OUT_BF16, a non-interleaved bank, e4m3 rows, 64-row tiles, the wgmma kernel; at most FM_W4A8_MAX_SPLITS and
    // the bank's 128-groups
    int32_t splits;
    const int32_t *row_map;
    uint8_t *h; // OUT_SWIGLU_E4M3
    int64_t ldh;
    float *hs;
    float *hsum; // OUT_SWIGLU_E4M3 feeding an int4-zp-tc down bank: h's group sums, as hs (else NULL)
    int64_t ldhs;
} fm_w4a8_args;

#define FM_W4A8_MAX_SPLITS 8 /* the portable cluster size */

void fm_cuda_w4a8_gemm(const fm_w4a8_args *a, cudaStream_t s);

// The bank formats the kernel reads: ours (int4-tc) and a checkpoint's (int4-zp-tc, e4m3-block).
static inline bool fm_cuda_w4a8_takes(fm_wformat f) {
    return f == FM_W_INT4_G128_TC || f == FM_W_INT4_ZP_TC || f == FM_W_E4M3_B128;
}

#endif
