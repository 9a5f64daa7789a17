/* The fold route's prefill GEMM (w4a8_fold_ws.cu): the warp-specialised kernel of int4-p2 banks in the fold code
 * layout (backend/w4a8_fold.h) on 256-row tiles of the dispatch, activations with one e4m3 scale per token, all of K
 * in one tensor-core accumulation (no promotion: fm_w4a8_fold_ref with P <= 0). Plain C, so that the backend's C
 * files and the GPU tests call it. Streams are cudaStream_t passed as void *. */
#ifndef FM_CUDA_W4A8_FOLD_WS_H
#define FM_CUDA_W4A8_FOLD_WS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/w4a8_fold_gemm.h" /* fm_fold_tile */

#ifdef __cplusplus
extern "C" {
#endif

#define FM_FOLD_WS_TILE_ROWS 256 /* the dispatch's tile rows for this kernel: one tile of rows a work item */

typedef enum fm_fold_ws_out {
    FM_FOLD_WS_OUT_BF16,   /* y[row_map[slot]][col] = bf16(acc x rs[col] xs[slot]), columns < rows */
    FM_FOLD_WS_OUT_SWIGLU, /* an interleaved gate|up bank: y[slot][ch] = bf16(silu(g) u), g and u each rounded to
                              bf16 first, channels ch < rows / 2 */
} fm_fold_ws_out;

typedef struct fm_fold_ws_args {
    /* the bank: n matrices of rows x 128 n_groups in the fold code layout; per (matrix, group, row) the exponent j =
       k + 6 of the operand (int8 [n][G][rows_pad]) and per (matrix, row) rs 2^-6 (fp32 [n][rows_pad]): the bank's
       int4-p2 scales split at load (fm_cuda_bank_fold) */
    const uint8_t *codes;
    const int8_t *fold_j;
    const float *fold_rs;
    int64_t rows, rows_pad, n_groups; /* rows_pad a multiple of 32 */
    /* e4m3 activations [slots][ldx] (zero past K; ldx >= 128 n_groups, a multiple of 16) and one scale per slot */
    const uint8_t *x;
    int64_t ldx, slots;
    const float *xs;
    /* the dispatch's tiles of at most FM_FOLD_WS_TILE_ROWS rows (a device list and its device count) */
    const fm_fold_tile *tiles;
    const int32_t *n_tiles;
    int64_t max_tiles;
    fm_fold_ws_out out;
    void *y; /* bf16 [..][ldy] */
    int64_t ldy;
    const int32_t *row_map; /* BF16: the output row of each slot (NULL: the slot's) */
} fm_fold_ws_args;

/* The GEMM (sm_90a); aborts naming the argument on a broken precondition. Graph safe: the work list is the device's
 * tile count, the launch's grid one CTA per SM. */
void fm_cuda_w4a8_fold_ws_gemm(const fm_fold_ws_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
