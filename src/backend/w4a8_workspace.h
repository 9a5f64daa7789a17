/* Scratch of the W4A8 paths on the CUDA backend (src/backend/cuda/moe_w4a8.cu, linear_w4a8.cu), in one place so
 * the memory plan (the cuda kind, src/backend/cuda/cuda_kind.c) and the kernels agree. Plain C: included by both.
 *
 * MoE, for P = T * k routed pairs over E experts, hidden H, width I (K padded to 128 for the e4m3 buffers):
 *   counts, cursor, segment starts [E] int32; tile count; tiles [max_tiles] x 16 B; pair of each slot and slot
 *   of each pair [P] int32;
 *   dispatched input e4m3 [P][pad128(H)] + scales [H/128][P] fp32 + group sums (for int4-zp banks, as the scales);
 *   or, with an FP4 dispatch (--dispatch mxfp4|nvfp4), E2M1 codes [P][pad128(H) / 2] (two per byte) + block scales
 *   [H/128][P] of 4 bytes (MX: 4 UE8M0) or 8 bytes (NV: 8 e4m3), the NVFP4 amax word and tensor scale, and the
 *   e4m3 expansion of at most FM_MOE_GEMV_MAX_PAIRS rows that the decode GEMVs read (as the e4m3 input + scales);
 *   SwiGLU output e4m3 [P][pad128(I)] + scales + group sums;
 *   expert outputs bf16 [P][H] (combined per token, in routing order, by a separate kernel: deterministic).
 * Dense W4A8 linear, M rows, K inputs: the input as e4m3 [M][pad128(K)] + scales [K/128][M] fp32 + group sums. */
#ifndef FM_W4A8_WORKSPACE_H
#define FM_W4A8_WORKSPACE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/routes.h" /* FM_W4A8_BN, _MID, _SMALL: the tile rows, fm_routes_w4a8_tile_rows */

#define FM_W4A8_ALIGN 256 /* every sub-buffer starts 256-byte aligned */

static inline uint64_t fm_w4a8_align(uint64_t b) { return (b + FM_W4A8_ALIGN - 1) / FM_W4A8_ALIGN * FM_W4A8_ALIGN; }
static inline uint64_t fm_w4a8_pad128(uint64_t k) { return (k + 127) / 128 * 128; }

/* The most tiles P routed pairs over E experts make with tiles of bn rows (fm_routes_w4a8_tile_rows picks bn from
 * the shapes and the route w4a8.tile): each expert's last tile may be partial. */
static inline uint64_t fm_w4a8_max_tiles(uint64_t P, uint64_t E, uint64_t bn) {
    return (P + bn - 1) / bn + (E < P ? E : P);
}

/* The dispatch buffer's format: e4m3 1x128 (the fp8 preset's), MXFP4 or NVFP4 (fm_w4a8_dispatch_of: the plan's
 * a_dispatch). */
typedef enum fm_w4a8_dispatch { FM_W4A8_DISPATCH_E4M3, FM_W4A8_DISPATCH_MX, FM_W4A8_DISPATCH_NV } fm_w4a8_dispatch;

static inline fm_w4a8_dispatch fm_w4a8_dispatch_of(fm_afmt a) {
    return a == FM_A_MXFP4 ? FM_W4A8_DISPATCH_MX : a == FM_A_NVFP4 ? FM_W4A8_DISPATCH_NV : FM_W4A8_DISPATCH_E4M3;
}

/* Offsets of the MoE sub-buffers for tiles of bn rows; total is the workspace size. x and xs hold the dispatch
 * buffer in its format; ts (NVFP4: the amax word, then the tensor scale), xg and xgs (FP4: the decode GEMVs' e4m3
 * input and scales) are empty otherwise. */
typedef struct fm_w4a8_moe_ws {
    uint64_t counts, cursor, seg_start, n_tiles, tiles, pair_of_slot, slot_of_pair, x, xs, xsum, ts, xg, xgs, h, hs,
        hsum, y, h16, total;
} fm_w4a8_moe_ws;

static inline fm_w4a8_moe_ws fm_w4a8_moe_layout(uint64_t T, uint64_t k, uint64_t E, uint64_t H, uint64_t I, uint64_t bn,
                                                fm_w4a8_dispatch d, bool h16_all) {
    const uint64_t P = T * k, Hp = fm_w4a8_pad128(H), Ip = fm_w4a8_pad128(I);
    const uint64_t Pg = P < FM_MOE_GEMV_MAX_PAIRS ? P : FM_MOE_GEMV_MAX_PAIRS;
    const bool fp4 = d != FM_W4A8_DISPATCH_E4M3;
    fm_w4a8_moe_ws w;
    uint64_t o = 0;
    w.counts = o, o += fm_w4a8_align(E * 4);
    w.cursor = o, o += fm_w4a8_align(E * 4);
    w.seg_start = o, o += fm_w4a8_align(E * 4);
    w.n_tiles = o, o += fm_w4a8_align(4);
    w.tiles = o, o += fm_w4a8_align(fm_w4a8_max_tiles(P, E, bn) * 16);
    w.pair_of_slot = o, o += fm_w4a8_align(P * 4);
    w.slot_of_pair = o, o += fm_w4a8_align(P * 4);
    w.x = o, o += fm_w4a8_align(fp4 ? P * Hp / 2 : P * Hp);
    w.xs = o, o += fm_w4a8_align(Hp / 128 * P * (d == FM_W4A8_DISPATCH_NV ? 8 : 4));
    w.xsum = o, o += fm_w4a8_align(Hp / 128 * P * 4);
    w.ts = o, o += d == FM_W4A8_DISPATCH_NV ? fm_w4a8_align(8) : 0;
    w.xg = o, o += fp4 ? fm_w4a8_align(Pg * Hp) : 0;
    w.xgs = o, o += fp4 ? fm_w4a8_align(Hp / 128 * Pg * 4) : 0;
    w.h = o, o += fm_w4a8_align(P * Ip);
    w.hs = o, o += fm_w4a8_align(Ip / 128 * P * 4);
    w.hsum = o, o += fm_w4a8_align(Ip / 128 * P * 4);
    w.y = o, o += fm_w4a8_align(P * H * 2);
    /* the grouped GEMV route (decode: moe.gemv_max_pairs) writes h in bf16 before quantizing it; sized for at most
       FM_MOE_GEMV_MAX_PAIRS pairs so the total grows with P (a plan made at the largest step covers every step);
       h16_all: for every pair (the fold route's warp-specialised GEMMs, w4a8.fold_ws: fm_routes_fold_ws) */
    w.h16 = o, o += fm_w4a8_align((h16_all || P < FM_MOE_GEMV_MAX_PAIRS ? P : FM_MOE_GEMV_MAX_PAIRS) * I * 2);
    w.total = o;
    return w;
}

static inline uint64_t fm_w4a8_linear_ws_bytes(uint64_t M, uint64_t K) {
    const uint64_t Kp = fm_w4a8_pad128(K);
    return fm_w4a8_align(M * Kp) + 2 * fm_w4a8_align(Kp / 128 * M * 4);
}

/* Expert parallelism's moe_blocks (moe_w4a8.cu, fm_cuda_moe_w4a8_blocks): a rank's E / N experts over the N x cap
 * places of its received blocks at top-1, cap = ceil(T / N) k rounded up to 8 (backend/ep_blocks.h), in dispatch
 * format d, then an int32 id per place; sized for the smallest tiles (the longest tile list), whichever the route
 * picks. */
static inline uint64_t fm_w4a8_ep_ws_bytes(uint64_t T, uint64_t k, uint64_t E, uint64_t N, uint64_t H, uint64_t I,
                                           fm_w4a8_dispatch d) {
    const uint64_t cap = ((T + N - 1) / N * k + 7) / 8 * 8, P = N * cap;
    return fm_w4a8_moe_layout(P, 1, E / N, H, I, FM_W4A8_BN_SMALL, d, false).total + fm_w4a8_align(P * 4);
}

#endif
