/* Scratch of the W4A8 paths on the CUDA backend (src/backend/cuda/moe_w4a8.cu, linear_w4a8.cu), in one place so
 * the memory plan (src/engine/memory_plan.c) and the kernels agree. Plain C: included by both.
 *
 * MoE, for P = T * k routed pairs over E experts, hidden H, width I (K padded to 128 for the e4m3 buffers):
 *   counts, cursor, segment starts [E] int32; tile count; tiles [max_tiles] x 16 B; pair of each slot and slot
 *   of each pair [P] int32;
 *   dispatched input e4m3 [P][pad128(H)] + scales [H/128][P] fp32 + group sums (for int4-zp banks, as the scales);
 *   SwiGLU output e4m3 [P][pad128(I)] + scales + group sums;
 *   expert outputs bf16 [P][H] (combined per token, in routing order, by a separate kernel: deterministic).
 * Dense W4A8 linear, M rows, K inputs: the input as e4m3 [M][pad128(K)] + scales [K/128][M] fp32 + group sums. */
#ifndef FM_W4A8_WORKSPACE_H
#define FM_W4A8_WORKSPACE_H

#include <stdint.h>
#include <stdlib.h>

#define FM_W4A8_BN       64 /* routed rows per tile of the grouped GEMM (w4a8_gemm.cu) */
#define FM_W4A8_BN_SMALL 16 /* ... when the experts get few rows each (fm_w4a8_tile_rows) */
#define FM_W4A8_ALIGN    256 /* every sub-buffer starts 256-byte aligned */

static inline uint64_t fm_w4a8_align(uint64_t b) { return (b + FM_W4A8_ALIGN - 1) / FM_W4A8_ALIGN * FM_W4A8_ALIGN; }
static inline uint64_t fm_w4a8_pad128(uint64_t k) { return (k + 127) / 128 * 128; }

/* The tile rows of a MoE call with P routed pairs over E experts, from the shapes only (no host sync): 16-row
 * tiles (wgmma n16, two CTAs per SM) while the experts get fewer than 32 rows each on average (decode, short
 * prompts: a 64-row tile is then mostly padding, its promotion and epilogue work wasted), 64 from there. Measured on
 * the Qwen3 shape (E 128, top-8; bench/NOTES.md): 16-row tiles 1.24-1.58x faster up to T = 256 (P = 16 E), equal at
 * T = 512 (P = 32 E).
 * FP8MOE_W4A8_TILE=16 or 64 forces one (to measure the threshold; the memory plan follows it too). */
static inline uint32_t fm_w4a8_tile_rows(uint64_t P, uint64_t E) {
    const char *force = getenv("FP8MOE_W4A8_TILE");
    if (force && atoi(force) == FM_W4A8_BN_SMALL) return FM_W4A8_BN_SMALL;
    if (force && atoi(force) == FM_W4A8_BN) return FM_W4A8_BN;
    return P < 32 * E ? FM_W4A8_BN_SMALL : FM_W4A8_BN;
}
static inline uint64_t fm_w4a8_max_tiles(uint64_t P, uint64_t E) {
    const uint64_t bn = fm_w4a8_tile_rows(P, E);
    return (P + bn - 1) / bn + (E < P ? E : P);
}

/* Offsets of the MoE sub-buffers; total is the workspace size. */
typedef struct fm_w4a8_moe_ws {
    uint64_t counts, cursor, seg_start, n_tiles, tiles, pair_of_slot, slot_of_pair, x, xs, xsum, h, hs, hsum, y, total;
} fm_w4a8_moe_ws;

static inline fm_w4a8_moe_ws fm_w4a8_moe_layout(uint64_t T, uint64_t k, uint64_t E, uint64_t H, uint64_t I) {
    const uint64_t P = T * k, Hp = fm_w4a8_pad128(H), Ip = fm_w4a8_pad128(I);
    fm_w4a8_moe_ws w;
    uint64_t o = 0;
    w.counts = o, o += fm_w4a8_align(E * 4);
    w.cursor = o, o += fm_w4a8_align(E * 4);
    w.seg_start = o, o += fm_w4a8_align(E * 4);
    w.n_tiles = o, o += fm_w4a8_align(4);
    w.tiles = o, o += fm_w4a8_align(fm_w4a8_max_tiles(P, E) * 16);
    w.pair_of_slot = o, o += fm_w4a8_align(P * 4);
    w.slot_of_pair = o, o += fm_w4a8_align(P * 4);
    w.x = o, o += fm_w4a8_align(P * Hp);
    w.xs = o, o += fm_w4a8_align(Hp / 128 * P * 4);
    w.xsum = o, o += fm_w4a8_align(Hp / 128 * P * 4);
    w.h = o, o += fm_w4a8_align(P * Ip);
    w.hs = o, o += fm_w4a8_align(Ip / 128 * P * 4);
    w.hsum = o, o += fm_w4a8_align(Ip / 128 * P * 4);
    w.y = o, o += fm_w4a8_align(P * H * 2);
    w.total = o;
    return w;
}

static inline uint64_t fm_w4a8_linear_ws_bytes(uint64_t M, uint64_t K) {
    const uint64_t Kp = fm_w4a8_pad128(K);
    return fm_w4a8_align(M * Kp) + 2 * fm_w4a8_align(Kp / 128 * M * 4);
}

#endif
