// Decode-size FP8 projections, y [M, N] = x [M, K] W^T for M <= FM_GEMV_FP8_MAX_M, on mma.sync m16n8k32 e4m3
// (sm_89 and sm_90), launched with PDL (pdl.cuh). See gemv_fp8.cu for the shapes and the floor.
#ifndef FM_CUDA_GEMV_FP8_CUH
#define FM_CUDA_GEMV_FP8_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/moe_combine_row.cuh"
#include "backend/cuda/row_tail.cuh"

// FM_GEMV_FP8_MAX_M (two n8 tiles of activation rows), FM_GEMV_FP8_SMEM_MAX and fm_gemv_fp8_smem (the shared
// memory the W4A8 GEMV stages x in) are in the route table (src/backend/routes.h), which decides where these
// GEMVs run: fm_routes_dense_kernel (W8A8 up to w8a8.gemv_max_m rows, W4A8 up to 16, both off by dense.gemv=off).

// W8A8, M <= FM_W8A8_GEMV_MAX_M: W e4m3 [N][ld] with its scale at *w_scale, x e4m3 [M][ld] (columns past K zero)
// with its scale at *x_scale (both scales device pointers: nothing is read back), y bf16 [M][N]. ld a multiple of 16.
// pdl: launch with programmatic dependent launch (fm_routes_pdl).
extern "C" void fm_cuda_w8a8_gemv(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale, const uint8_t *x,
                                  int64_t M, const float *x_scale, __nv_bfloat16 *y, bool pdl, cudaStream_t s);
// The same, then its last CTA adds y into tail->acc and normalises it into tail->out (row_tail.cuh): the o projection
// and the next add_rmsnorm of a decode step in one launch (route decode.fused). Needs fm_row_tail_takes(N, ...).
extern "C" void fm_cuda_w8a8_gemv_add_rmsnorm(const uint8_t *W, int64_t N, int64_t ld, const float *w_scale,
                                              const uint8_t *x, int64_t M, const float *x_scale, __nv_bfloat16 *y,
                                              const fm_row_tail *tail, bool pdl, cudaStream_t s);

// W4A8: matrix idx of an int4-tc, int4-zp-tc or e4m3-block bank (w4a8_layout.cuh, not interleaved), x e4m3
// [M][n_groups * 128] with scales xs[group * ld_s + row] and, for int4-zp-tc, group sums xsum alike
// (fm_cuda_quantize_e4m3_rows), y bf16 [M][rows]. groups: the K groups a warp aims at (fm_routes_gemv_groups; 0:
// the most K slices whose grid fits one wave; every W4A8 GEMV below takes it). Needs M <= FM_GEMV_FP8_MAX_M and the
// staging within FM_GEMV_FP8_SMEM_MAX (fm_routes_dense_kernel says FM_DK_W4A8_GEMV).
extern "C" void fm_cuda_w4a8_gemv(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs, const float *xsum,
                                  int64_t ld_s, int64_t M, __nv_bfloat16 *y, int32_t groups, bool pdl, cudaStream_t s);
// The same, then its last CTA adds y into tail->acc and normalises it into tail->out, as the W8A8 GEMV's does (the
// fp8 preset's o projection, route decode.fused). Needs fm_row_tail_takes(w->rows, ...).
extern "C" void fm_cuda_w4a8_gemv_add_rmsnorm(const fm_bank *w, int32_t idx, const uint8_t *x, const float *xs,
                                              const float *xsum, int64_t ld_s, int64_t M, __nv_bfloat16 *y,
                                              const fm_row_tail *tail, int32_t groups, bool pdl, cudaStream_t s);
// The same from bf16 rows x [M][w->cols], which each CTA quantizes to e4m3 in 128-column groups as it stages them
// (route dense.quant=fused: the codes, scales and, for int4-zp-tc, sums of fm_cuda_quantize_e4m3_rows, so y is the
// bits of that launch followed by fm_cuda_w4a8_gemv); tail NULL, or as fm_cuda_w4a8_gemv_add_rmsnorm's.
extern "C" void fm_cuda_w4a8_gemv_bf16(const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                                       __nv_bfloat16 *y, const fm_row_tail *tail, int32_t groups, bool pdl,
                                       cudaStream_t s);

// Grouped W4A8 (moe_w4a8.cu, the experts of a decode step): for each tile of the dispatch (tiles[0..*n_tiles), at
// most max_tiles, each of rows <= max_rows <= FM_GEMV_FP8_MAX_M), the tile's activation rows of x (as for the
// dense GEMV, ld_s the scales' stride) times its expert's matrix of bank w. swiglu (w an interleaved gate|up bank):
// y[slot][ch] = bf16(silu(bf16 gate) * bf16 up), y [slots][ldy]; else y[row_map ? row_map[slot] : slot][row], bf16.
// tail (the down projection, row_map the pairs' rows, ldy = w->rows): NULL, or the MoE block's end in the same launch
// (route moe.combine=fused): the last CTA of each token combines its k rows of y with the routing weights [T k],
// adds them into acc and writes out = rmsnorm(acc) * norm, bit for bit fm_cuda_moe_combine_add_rmsnorm after it.
// counters: T device words, zero, left zero. Needs fm_combine_row_takes(w->rows, y, acc, norm, out).
#include "backend/cuda/w4a8_gemm.cuh"
typedef struct fm_moe_gemv_tail {
    unsigned *counters;
    const __nv_bfloat16 *weights;
    int32_t k;
    __nv_bfloat16 *acc;
    const __nv_bfloat16 *norm;
    float eps;
    __nv_bfloat16 *out;
} fm_moe_gemv_tail;
extern "C" void fm_cuda_w4a8_moe_gemv(const fm_bank *w, const fm_w4a8_tile *tiles, const int32_t *n_tiles,
                                      int64_t max_tiles, int64_t max_rows, const uint8_t *x, const float *xs,
                                      const float *xsum, int64_t ld_s, bool swiglu, const int32_t *row_map,
                                      __nv_bfloat16 *y, int64_t ldy, const fm_moe_gemv_tail *tail, int32_t groups,
                                      bool pdl, cudaStream_t s);
// The K slices a row block of bank w takes in fm_cuda_w4a8_moe_gemv at max_tiles tiles (groups: the route gemv.groups,
// 0 auto): what the persistent decode MoE block (moe_decode_block.cuh) takes to run the same chains.
extern "C" int fm_cuda_w4a8_moe_gemv_slices(const fm_bank *w, int64_t max_tiles, int32_t groups);
// The down projection (bank not interleaved) of the same tiles from bf16 rows h [slots][w->cols] (the SwiGLU output
// of the gate|up GEMV): each CTA quantizes its tile's rows into shared memory to e4m3 1x128 groups as
// fm_cuda_quantize_e4m3_rows does (the same codes, scales and, for int4-zp-tc, group sums), so the result is the
// quantizer + fm_cuda_w4a8_moe_gemv chain's bit for bit in one launch fewer (route moe.down_quant=fused).
extern "C" void fm_cuda_w4a8_moe_gemv_bf16(const fm_bank *w, const fm_w4a8_tile *tiles, const int32_t *n_tiles,
                                           int64_t max_tiles, int64_t max_rows, const __nv_bfloat16 *h,
                                           const int32_t *row_map, __nv_bfloat16 *y, int64_t ldy,
                                           const fm_moe_gemv_tail *tail, int32_t groups, bool pdl, cudaStream_t s);

#endif
