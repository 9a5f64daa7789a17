/* The grouped W4A8 GEMV on fold banks (w4a8_fold_gemv.cu): the experts of a decode step under route
 * w4a8.kernel=fold. Plain C, so that the GPU tests call it; streams are cudaStream_t passed as void *. */
#ifndef FM_CUDA_W4A8_FOLD_GEMV_H
#define FM_CUDA_W4A8_FOLD_GEMV_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/w4a8_fold_gemm.h" /* fm_fold_ascale, fm_fold_tile */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_fold_gemv_args {
    /* the bank: n matrices of rows x K in the fold code layout (backend/w4a8_fold.h), bf16 scales [n][G][rows_pad] */
    const uint8_t *codes;
    const uint16_t *scales;
    int64_t rows, rows_pad, n_groups; /* rows_pad a multiple of 32; K = 128 n_groups */
    /* e4m3 activations [slots][ldx] (K padded with zeros) and their scales: PER_TOKEN xs [slots], PER_GROUP
       xs [n_groups][lds] */
    const uint8_t *x;
    int64_t ldx;
    fm_fold_ascale ascale;
    const float *xs;
    int64_t lds;
    /* the dispatch's tiles (device list and count; at most max_tiles), each of at most max_rows <= 16 rows */
    const fm_fold_tile *tiles;
    const int32_t *n_tiles;
    int64_t max_tiles, max_rows;
    /* swiglu (an interleaved gate|up bank): y bf16 [slots][ldy], y[slot][ch] = bf16(silu(bf16 gate) x bf16 up);
       else y[row_map ? row_map[slot] : slot][row] = bf16, y [..][ldy] */
    bool swiglu;
    void *y;
    int64_t ldy;
    const int32_t *row_map;
    bool pdl; /* launched with programmatic dependent launch (fm_routes_pdl) */
} fm_fold_gemv_args;

/* Aborts naming the argument on a broken precondition (the moe op checks the shapes first). */
void fm_cuda_w4a8_fold_gemv(const fm_fold_gemv_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
