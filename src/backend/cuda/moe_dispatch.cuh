// Routing dispatch on the device, no host synchronisation (CUDA-graph safe), and the fused gather + e4m3
// quantization that feeds the W4A8 GEMMs (w4a8_gemm.cuh).
//
//   1. one block: the routed pairs per expert (a shared-memory histogram), seg_start[e] = exclusive scan of those
//      counts, tiles of <= tile_rows rows per expert (empty experts get none), *n_tiles, cursor[e] = 0
//   2. one thread per pair p: slot = seg_start[e] + atomicAdd(cursor[e]); pair_of_slot[slot] = p, slot_of_pair[p]
//      (and, where h is given, the slot's row of h zeroed past its width)
//   3. NVFP4 only: the amax pass over x (into the word step 1 zeroed)
//   4. one warp per (token t, 128-group): the group of row t of x quantized once to e4m3 with one fp32 scale and
//      stored into x8[slot], xs[group][slot] for each of the token's k slots (k <= 32). With an FP4 dispatch
//      (fmt MX or NV, --dispatch mxfp4|nvfp4) the group becomes E2M1 codes (two per byte) with its block scales,
//      bit for bit the CPU's fm_mxfp4_quantize (RCEIL) / fm_nvfp4_quantize (src/quant/e2m1.c); NVFP4's tensor
//      scale comes from an amax pass over x on the device before step 4 (every routed row is a row of x), so
//      nothing is read back on the host. With per_token (fold banks, route w4a8.kernel=fold) the row gets one scale
//      from the amax of all of it instead, xs[slot] (one warp per token; the small dispatch's warps share a
//      token's amax through shared memory): the fold GEMM's input with no second pass over x. With token_groups
//      (route moe.act_scale=token) the token's scale goes to xs[group][slot] for each group instead.
// The order of slots inside an expert's segment depends on the atomics, but no result does: every GEMM row is
// computed on its own and the combine reads rows by pair, in routing order.
// pdl (fm_routes_pdl): every kernel launches with programmatic dependent launch (pdl.cuh) and needs no buffer zeroed
// before it, so no memset node sits between the router and the expert GEMMs (the chain of early launches holds).
#ifndef FM_CUDA_MOE_DISPATCH_CUH
#define FM_CUDA_MOE_DISPATCH_CUH

#include "backend/cuda/w4a8_gemm.cuh"

typedef struct fm_dispatch_bufs {
    int32_t *cursor, *seg_start, *n_tiles, *pair_of_slot, *slot_of_pair; // [E], [E], 1, [P], [P]: no zeroing needed
    fm_w4a8_tile *tiles;
    int32_t fmt;    // fm_w4a8_dispatch (w4a8_workspace.h): what x8 and xs hold
    uint8_t *x8;    // [P][pad128(H)] e4m3; FP4: [P][pad128(H) / 2] E2M1, element 2i in the low nibble
    float *xs;      // [pad128(H) / 128][P] fp32; FP4: the same places as words of block scales, 4 bytes each (MX: the
                    // 4 UE8M0 bytes of the group, block b in byte b) or 8 (NV: 8 e4m3 bytes)
    float *xsum;    // as xs: each group's sum, scale x (sum of its codes), for int4-zp banks; or NULL
    uint32_t *amax; // NV: [0] the amax word (finite |x|, as fp32 bits), [1] the tensor scale (fp32) after it
    uint8_t *xg;    // FP4, small dispatch only: the e4m3 expansion the decode GEMVs read, as x8 of an e4m3
    float *xgs;     // dispatch, and its group scales as xs (the grouped GEMM's expansion, done here for them)
    const int32_t *matrix_of; // [E] the bank matrix of each expert (an expert cache's slot table), or NULL: matrix e
    bool per_token; // e4m3 rows with ONE scale per token (the fold banks' gate|up input, backend/w4a8_fold.h): xs [P],
                    // bit for bit fm_cuda_fold_quantize_tokens of the slot's token; no sums, no FP4
    bool token_groups; // per_token, the grouped dispatch: the token's scale written as each of its groups' (xs
                       // [pad128(H) / 128][P], as per-group rows: route moe.act_scale=token) instead of xs [P]
    uint8_t *h;        // the gate|up GEMM's e4m3 output [P][pad128(h_cols)] when h_cols % 128 (else NULL): the grouped
    int64_t h_cols;    // dispatch zeroes each slot's row past h_cols (no CTA writes those columns, the down GEMM reads
                       // them); the small dispatch does not (its GEMVs' h is quantized in whole groups)
} fm_dispatch_bufs;

// tile_rows: FM_W4A8_BN, FM_W4A8_BN_MID or FM_W4A8_BN_SMALL (fm_routes_w4a8_moe_tile_rows), as the GEMMs after it are
// launched with. plan_slots (fm_routes_moe_plan_slots): steps 1 and 2 in one block up to 4096 rows.
void fm_cuda_moe_dispatch(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                          int32_t tile_rows, const fm_dispatch_bufs *b, bool plan_slots, bool pdl, cudaStream_t s);

// The same four steps in one block, for a decode-sized dispatch (T k <= FM_MOE_GEMV_MAX_PAIRS, the route
// moe.gemv): one launch instead of three (cursor is not used, h not zeroed); slots inside an expert's segment in pair
// order.
void fm_cuda_moe_dispatch_small(const __nv_bfloat16 *x, int64_t T, int64_t H, const int32_t *ids, int32_t k, int32_t E,
                                int32_t tile_rows, const fm_dispatch_bufs *b, bool pdl, cudaStream_t s);

// x8[r][:] (ld = pad128(K), padding zero), xs[g][r] (ld_s) = e4m3 1x128 quantization of rows x[r][:K], r < M.
// The same arithmetic as fm_e4m3_quantize_groups (src/quant/e4m3.c): scale = max(amax / 448, 1e-12),
// code = e4m3_rne_satfinite(x / scale). xsum (NULL: not wanted): scale x the sum of the group's codes, as xs.
// pdl: launched with programmatic dependent launch (fm_routes_pdl).
void fm_cuda_quantize_e4m3_rows(const __nv_bfloat16 *x, int64_t M, int64_t K, uint8_t *x8, float *xs, float *xsum,
                                int64_t ld_s, bool pdl, cudaStream_t s);

// Expert parallelism (backend/ep_blocks.h; the e4m3, MXFP4 and NVFP4 dispatch). ep_dispatch: the sending rank's blocks
// from x [T][H] and ids [T][k] (all E experts): positions, local ids, row counts, then each copy's row quantized as
// the moe's dispatch quantizes it (amaxes: NVFP4's, every rank's amax, device memory [N]; the tensor scale is made
// from them on the device); ret_row [T k]. ep_receive: the receiving rank's tile plan and rows from its received
// blocks (N x cap places, the empty ones id -1 in ids [N cap]), in b (counts and cursor zeroed; b->fmt the blocks'
// format), as fm_cuda_moe_dispatch leaves them for T = N cap tokens at k = 1 (NVFP4: the tensor scale where the GEMM
// reads it, b->amax[1]); its kernels launch plainly (the exchange's collectives around them break the PDL chain).
struct fm_ep_layout;
// x: bf16 [T][H], or the plan's activations (bf16 or fp32) for the native format (FM_A_NATIVE: rows copied).
void fm_cuda_ep_dispatch(const void *x, int64_t T, const int32_t *ids, const struct fm_ep_layout *L,
                         const float *amaxes, uint8_t *send, int32_t *ret_row, cudaStream_t s);
// ids [N cap] of the received blocks' places: block s's local id of row i at q = s cap + i, -1 past its count
void fm_cuda_ep_flatten(const uint8_t *recv, const struct fm_ep_layout *L, int32_t *ids, cudaStream_t s);
void fm_cuda_ep_receive(const uint8_t *recv, const struct fm_ep_layout *L, int32_t E, int32_t tile_rows,
                        const float *amaxes, int32_t *ids, const fm_dispatch_bufs *b, cudaStream_t s);
// *out (device fp32) = the largest finite |x| of n bf16 (or fp32) values, 0 when none (fm_nvfp4_amax)
void fm_cuda_amax(const void *x, bool bf16, int64_t n, float *out, cudaStream_t s);

#endif
