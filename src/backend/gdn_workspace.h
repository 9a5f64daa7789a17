/* Scratch of the Gated DeltaNet's chunked form on tensor cores (src/backend/cuda/gdn_chunked_tc.cu), in one place so
 * that the memory plan (the cuda kind, src/backend/cuda/cuda_kind.c) and the kernel agree. Plain C: included by both.
 *
 * The form runs a prompt in segments of at most FM_GDN_TC_SEG_CHUNKS chunks of 64 tokens; per (chunk, value head) of
 * a segment the intra-chunk kernel leaves W, U, Q e^G, K e^(G_last - G) [64][128] fp32 each, the decayed causal
 * q.k block [64][64] fp32 and e^(G_last) (one float, the array padded to 64); then a [128][128] fp32 slot per
 * chunk (the state pass leaves there the state before the chunk and v' as bf16 for its
 * parallel output pass; Q e^G and the q.k block are then bf16 too); after them,
 * a state [nv][128][128] fp32 that carries the rule between segments when the op keeps no state of its own. */
#ifndef FM_GDN_WORKSPACE_H
#define FM_GDN_WORKSPACE_H

#include <stdbool.h>
#include <stdint.h>

#define FM_GDN_TC_SEG_CHUNKS 32
#define FM_GDN_TC_DIM 128

/* whether the tensor-core chunked form takes a shape: dk = dv = 128 (Qwen3-Next's heads), bf16 activations */
static inline bool fm_gdn_tc_takes(int32_t dk, int32_t dv, bool act_bf16) {
    return act_bf16 && dk == FM_GDN_TC_DIM && dv == FM_GDN_TC_DIM;
}

/* chunk-heads of a segment for a prompt of T tokens */
static inline uint64_t fm_gdn_tc_seg_units(uint64_t T, uint64_t nv) {
    uint64_t chunks = (T + 63) / 64;
    if (chunks > FM_GDN_TC_SEG_CHUNKS) chunks = FM_GDN_TC_SEG_CHUNKS;
    return chunks * nv;
}

static inline uint64_t fm_gdn_tc_ws_bytes(uint64_t T, uint64_t nv) {
    const uint64_t n = fm_gdn_tc_seg_units(T, nv), D = FM_GDN_TC_DIM;
    return (n * (4 * 64 * D + 64 * 64 + D * D) + (n + 63) / 64 * 64 + nv * D * D) * sizeof(float);
}

#endif
