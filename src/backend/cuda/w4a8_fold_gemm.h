/* The fold GEMM's launchers (w4a8_fold_gemm.cu; the arithmetic is backend/w4a8_fold.h): plain C, so that the
 * backend's C files and the GPU tests call them. Streams are cudaStream_t passed as void *. */
#ifndef FM_CUDA_W4A8_FOLD_GEMM_H
#define FM_CUDA_W4A8_FOLD_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The activations' scales: one per token (row), or one per (row, 128-group) as the dispatch and the SwiGLU
 * epilogue of today's kernel write them ([group][lds]; the accumulator then takes the scale at every group: P = 1). */
typedef enum fm_fold_ascale {
    FM_FOLD_PER_TOKEN,
    FM_FOLD_PER_GROUP,
} fm_fold_ascale;

typedef enum fm_fold_out {
    FM_FOLD_OUT_BF16,        /* y[row_map ? row_map[slot] : slot][col] = bf16(y), columns in the bank's row order */
    FM_FOLD_OUT_SWIGLU_E4M3, /* an interleaved gate|up bank: h e4m3 with one scale per (slot, 128 channels), as
                                the int4-tc kernel's SwiGLU epilogue (w4a8_gemm.cuh) */
} fm_fold_out;

/* One tile of the grouped GEMM: as fm_w4a8_tile (w4a8_gemm.cuh) */
typedef struct fm_fold_tile {
    int32_t expert, slot0, rows, pad;
} fm_fold_tile;

typedef struct fm_fold_gemm_args {
    /* the bank: n matrices of rows x K in the fold code layout (w4a8_fold.h), bf16 scales [n][G][rows_pad] */
    const uint8_t *codes;
    const uint16_t *scales;
    int64_t rows, rows_pad, n_groups; /* rows_pad a multiple of 32; K = 128 n_groups */
    bool interleaved;                 /* gate|up rows interleaved by 8 (the SwiGLU epilogue needs it) */
    /* e4m3 activations [slots][ldx] (K padded with zeros) and their scales */
    const uint8_t *x;
    int64_t ldx;
    fm_fold_ascale ascale;
    const float *xs; /* PER_TOKEN: [slots]; PER_GROUP: [n_groups][lds] */
    int64_t lds;
    /* tiles: a device list and its device count, or NULL for dense tiling of m_dense rows of matrix dense_matrix */
    const fm_fold_tile *tiles;
    const int32_t *n_tiles;
    int64_t max_tiles;
    int32_t tile_rows; /* 64, 32 or 16 (FM_W4A8_BN, _MID, _SMALL) */
    int64_t m_dense;
    int32_t dense_matrix;
    fm_fold_out out;
    void *y; /* bf16 [..][ldy] */
    int64_t ldy;
    const int32_t *row_map;
    uint8_t *h; /* SWIGLU_E4M3: [slots][ldh], scales hs[ch / 128][ldhs] */
    int64_t ldh;
    float *hs;
    int64_t ldhs;
    bool pdl; /* launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl): it may start while the kernel
                 before it in the stream finishes, and waits for it before reading anything */
} fm_fold_gemm_args;

/* Whether the current device runs the fold kernel (sm_90: wgmma); callers take today's kernel otherwise. */
bool fm_cuda_fold_supported(void);

/* The GEMM; aborts naming the argument on a broken precondition (the route and the loader check them first). */
void fm_cuda_w4a8_fold_gemm(const fm_fold_gemm_args *a, void *stream);

/* Per-token e4m3 (w4a8_fold.h): row i of x8 [rows][ld8] (zero past K) and xs[i] from bf16 row src of x [..][ldx],
 * src = src_of ? src_of[i] / src_div : i. Device-side amax, no host synchronisation (graph safe). */
void fm_cuda_fold_quantize_tokens(const void *x, int64_t ldx, const int32_t *src_of, int32_t src_div, int64_t rows,
                                  int64_t K, uint8_t *x8, int64_t ld8, float *xs, void *stream);

/* Repacks n int4-tc matrices (w4a8_layout.cuh: codes [n][rows_pad / 16][G][1024]) into the fold code layout (same
 * bytes, dst distinct from src); the scales stay as they are. */
void fm_cuda_repack_tc_to_fold(const uint8_t *src, int32_t n, int64_t rows_pad, int64_t n_groups, uint8_t *dst,
                               void *stream);

#ifdef __cplusplus
}
#endif

#endif
