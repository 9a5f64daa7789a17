/* Scratch of the grouped cuBLAS MoE (src/backend/cuda/moe_grouped_cublas.cu: bf16 banks of ref, fp32 banks of
 * ref32), in one place so the memory plan (the cuda kind, src/backend/cuda/cuda_kind.c) and the op agree. Plain C:
 * included by both.
 *
 * The routed pairs are sorted by expert into tiles of `tile_rows` rows, each expert's segment padded to whole tiles,
 * so that every GEMM has the same shape and one batched cuBLAS call with device-built pointer arrays covers all
 * experts: the shapes come from P and E alone and nothing is read back on the host (graph-safe). For P routed pairs
 * over E experts, hidden H, width I, activation size a:
 *   counts, fill, segment row starts [E] int32; slot of each pair [P] int32          (256-byte aligned)
 *   pointer arrays, 3 per GEMM and 2 GEMMs, [max_tiles] each                          (256-byte aligned)
 *   xs [R, H], gu [R, 2I], h [R, I], y [R, H] activations, R = max_tiles * tile_rows
 * The tiles past the used ones compute on padding rows of their own (never read): at most E tiles. */
#ifndef FM_MOE_GROUPED_WORKSPACE_H
#define FM_MOE_GROUPED_WORKSPACE_H

#include <stdint.h>

#define FM_GROUPED_ALIGN 256

/* Rows per tile: the average rows an expert gets, as a power of two in [16, 128] (small tiles keep the padding of
 * decode steps small; 128 rows a GEMM at prefill) */
static inline uint64_t fm_grouped_tile_rows(uint64_t P, uint64_t E) {
    const uint64_t avg = E ? (P + E - 1) / E : P;
    uint64_t tr = 16;
    while (tr < avg && tr < 128) tr *= 2;
    return tr;
}

/* Tiles a call may use: each expert's segment rounded up to whole tiles, and never more tiles than pairs */
static inline uint64_t fm_grouped_max_tiles(uint64_t P, uint64_t E) {
    const uint64_t tr = fm_grouped_tile_rows(P, E), bound = (P + tr - 1) / tr + E;
    return bound < P ? bound : P;
}

typedef struct fm_grouped_ws {
    uint64_t tile_rows, max_tiles, rows;     /* rows = max_tiles * tile_rows */
    uint64_t counts, fill, seg_row, slot_of; /* byte offsets */
    uint64_t ptrs;                           /* 6 * max_tiles pointers */
    uint64_t xs, gu, h, y;
    uint64_t total;
} fm_grouped_ws;

static inline uint64_t fm_grouped_align(uint64_t b) {
    return (b + FM_GROUPED_ALIGN - 1) / FM_GROUPED_ALIGN * FM_GROUPED_ALIGN;
}

/* The layout for P pairs (callers bound P so that nothing here overflows: the memory plan checks the tokens) */
static inline fm_grouped_ws fm_grouped_layout(uint64_t P, uint64_t E, uint64_t H, uint64_t I, uint64_t act_size) {
    fm_grouped_ws L;
    L.tile_rows = fm_grouped_tile_rows(P, E);
    L.max_tiles = fm_grouped_max_tiles(P, E);
    L.rows = L.max_tiles * L.tile_rows;
    L.counts = 0;
    L.fill = L.counts + E * 4;
    L.seg_row = L.fill + E * 4;
    L.slot_of = L.seg_row + E * 4;
    L.ptrs = fm_grouped_align(L.slot_of + P * 4);
    L.xs = fm_grouped_align(L.ptrs + 6 * L.max_tiles * 8);
    L.gu = L.xs + L.rows * H * act_size;
    L.h = L.gu + L.rows * 2 * I * act_size;
    L.y = L.h + L.rows * I * act_size;
    L.total = L.y + L.rows * H * act_size;
    return L;
}

/* Expert parallelism's moe_blocks on bf16 / fp32 banks (moe_grouped_cublas.cu, fm_cuda_moe_grouped_cublas_blocks): a
 * rank's E / N experts over the N x cap places of its received blocks at top-1, cap = ceil(T / N) k rounded up to 8
 * (backend/ep_blocks.h), then an int32 id per place. */
static inline uint64_t fm_grouped_ep_ws_bytes(uint64_t T, uint64_t k, uint64_t E, uint64_t N, uint64_t H, uint64_t I,
                                              uint64_t act_size) {
    const uint64_t cap = ((T + N - 1) / N * k + 7) / 8 * 8, P = N * cap;
    return fm_grouped_layout(P, E / N, H, I, act_size).total + fm_grouped_align(P * 4);
}

#endif
