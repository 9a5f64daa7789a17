/* The route table: which kernel computes an op at a given shape, in one place.
 *
 * Filled once when the CUDA backend is created (fm_routes_default from the device, then fm_routes_apply with the
 * caller's "key=value,..." overrides: fm_options.routes, the CLI's --route), stored in the backend and read by its
 * ops; the memory plan reads the same table (the W4A8 MoE tile rows size its workspace), and `fp8moe inspect
 * --routes` prints it. Plain C: the memory plan, inspect and the build without CUDA use it too.
 *
 * Keys (value `auto` everywhere = the default rule):
 *   w4a8.kernel      auto | wgmma | mma   the grouped W4A8 GEMM (MoE experts, W4A8 dense projections above the
 *                                         GEMV's rows): wgmma m64n64k32 on sm_90, mma.sync m16n8k32 elsewhere
 *   attention.kernel auto | wgmma | mma   prefill attention (bf16): wgmma + TMA (attention_wgmma.cu, FlashAttention-3's
 *                                         recipe) on sm_90 for the head dims it supports (128), mma.sync
 *                                         (attention.cu) elsewhere and for every other head dim; wgmma forces it
 *                                         where the head dim is supported, mma forces the mma.sync kernel everywhere
 *   w4a8.tile        auto | 16 | 64       routed rows per tile of the W4A8 MoE GEMM (the memory plan follows it)
 *   w4a8.fp4         auto | producer | inline   where the wgmma gate|up GEMM of an FP4 dispatch (--dispatch mxfp4|
 *                                         nvfp4) expands E2M1 to e4m3: a producer warpgroup of its own, a stage ahead
 *                                         of the MMA warpgroups, or the MMA warps themselves between the stage's
 *                                         barrier and the MMAs (w4a8_gemm.cu)
 *   dense.gemv       auto | on | off      the mma.sync FP8 GEMVs of the dense projections at decode sizes
 *   w8a8.gemv_max_m  auto | 1..16         the W8A8 GEMV up to this many rows, cuBLASLt FP8 above
 *   moe.gemv         auto | off | 1..64   the grouped W4A8 GEMV for the experts of steps of at most this many routed
 *                                         pairs (decode), the grouped GEMM above (auto: 8, or one token's top-k
 *                                         when more)
 *   router.fused     auto | on | off      the router GEMV and top-k in one launch (auto: T = 1; on: T <= 8)
 *   pdl              auto | on | off      programmatic dependent launch of the decode kernels (sm_90)
 *   decode.graphs    auto | on | off      each decode step (its batch bucket 1, 2, 4, ... 128) captured once as a CUDA
 *                                         graph and replayed (on by default)
 *   gdn.tc           auto | on | off      the Gated DeltaNet's chunked form (a prompt from position 0) on tensor cores
 *                                         (gdn_chunked_tc.cu) where it takes the shape (dk = dv = 128, bf16
 *                                         activations), else token by token (gdn.cu). auto = on (H200, T = 8192:
 *                                         2.9x the token-by-token kernel, docs/RESULTS.md); off forces token by
 *                                         token
 *   gdn.state        auto | 4 | 8 | split that form's sequential state pass: on 4 warps (state and output chunk by
 *                                         chunk, TF32), on 8 (the output beside the state update), or split: the
 *                                         sequential pass computes only the states (bf16 mma.sync) and a parallel
 *                                         pass the outputs of every chunk from them (FLA's form). auto = split (H200,
 *                                         T = 2048, 48 layers: Gated DeltaNet 22.1 -> 12.5 ms against 8,
 *                                         bench/NOTES.md twelfth session)
 *   rope.store       auto | on | off      a decode step's attention layer stores its k and v in the paged cache
 *                                         from the q/k norm + RoPE kernel (one launch) rather than a kv_store
 *                                         launch after it (auto = on)
 *   shared.stream    auto | on | off      Qwen3-Next's shared expert on a second stream, beside the router and the
 *                                         routed experts (auto = on, every pass: H200, qwen3-next-80b-a3b, decode
 *                                         batch 1 4.82 -> 4.34 ms, prefill T = 2048 49.9 -> 48.6 ms; bench/NOTES.md
 *                                         fifteenth session)
 *   expert.prefetch  auto|on|off|1..64    experts in host memory: each MoE layer's experts predicted at the layer's
 *                                         start (its router on the residual stream before the token mixer) and
 *                                         copied on the side stream while the mixer runs, in steps of at most 8
 *                                         rows (a prefill needs most experts of every layer anyway); on: each
 *                                         token's top-k prediction, N: its top N. auto = off: on the synthetic
 *                                         Qwen3-30B-A3B at --vram-limit 8G the whole top-k copied 1.5x the bytes
 *                                         and made a step 6-17 % slower (bench/NOTES.md fifteenth session)
 * An override is for measuring a threshold or testing a kernel on a GPU where it is not the default; it never
 * changes what an op computes, only which kernel computes it. */
#ifndef FM_BACKEND_ROUTES_H
#define FM_BACKEND_ROUTES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"
#include "backend/gdn_workspace.h"

typedef enum fm_route_switch {
    FM_ROUTE_AUTO = 0,
    FM_ROUTE_ON,
    FM_ROUTE_OFF,
} fm_route_switch;

typedef enum fm_route_w4a8_kernel {
    FM_ROUTE_W4A8_AUTO = 0,
    FM_ROUTE_W4A8_WGMMA, /* wgmma m64n64k32 e4m3, sm_90a only */
    FM_ROUTE_W4A8_MMA,   /* mma.sync m16n8k32 e4m3, sm_89 and sm_90 */
} fm_route_w4a8_kernel;

typedef enum fm_route_w4a8_fp4 {
    FM_ROUTE_FP4_AUTO = 0,
    FM_ROUTE_FP4_PRODUCER, /* a producer warpgroup expands (wgmma kernel only) */
    FM_ROUTE_FP4_INLINE,   /* the MMA warps expand each stage */
} fm_route_w4a8_fp4;

typedef enum fm_route_w4a8_codes {
    FM_ROUTE_CODES_AUTO = 0,
    FM_ROUTE_CODES_REGS, /* each warp loads its int4 codes into registers a group ahead */
    FM_ROUTE_CODES_SMEM, /* the CTA's codes travel in the cp.async stage ring (wgmma kernel only) */
} fm_route_w4a8_codes;

typedef enum fm_route_attention_kernel {
    FM_ROUTE_ATTENTION_AUTO = 0,
    FM_ROUTE_ATTENTION_WGMMA, /* wgmma + TMA, sm_90a only, hd 128 */
    FM_ROUTE_ATTENTION_MMA,   /* mma.sync m16n8k16 bf16, every GPU and head dim */
} fm_route_attention_kernel;

typedef struct fm_routes {
    int32_t sm_major;                           /* the GPU the defaults are for: 9 Hopper, 8 Ada / Ampere, 0 no GPU */
    fm_route_w4a8_kernel w4a8_kernel;           /* w4a8.kernel */
    fm_route_attention_kernel attention_kernel; /* attention.kernel */
    int32_t w4a8_tile;                          /* w4a8.tile: 0 auto, FM_W4A8_BN_SMALL, _MID or FM_W4A8_BN */
    fm_route_w4a8_fp4 w4a8_fp4;                 /* w4a8.fp4 */
    fm_route_w4a8_codes w4a8_codes;             /* w4a8.codes */
    fm_route_switch dense_gemv;                 /* dense.gemv */
    int32_t w8a8_gemv_max_m;                    /* w8a8.gemv_max_m: 0 auto, 1..FM_GEMV_FP8_MAX_M */
    fm_route_switch pdl;                        /* pdl */
    fm_route_switch decode_graphs;              /* decode.graphs */
    int32_t moe_gemv;                           /* moe.gemv: 0 auto, -1 off, 1..FM_MOE_GEMV_MAX_PAIRS */
    fm_route_switch router_fused;               /* router.fused */
    fm_route_switch gdn_tc;                     /* gdn.tc */
    int32_t gdn_state;                          /* gdn.state: 0 auto, 4, 8 or FM_GDN_STATE_SPLIT */
    fm_route_switch rope_store;                 /* rope.store */
    fm_route_switch shared_stream;              /* shared.stream */
    int32_t expert_prefetch;                    /* expert.prefetch: 0 auto (off), -1 off, N >= 1 the top N (on: all) */
} fm_routes;

/* Rows per tile of the grouped W4A8 GEMM (w4a8_gemm.cu, w4a8_workspace.h). */
#define FM_W4A8_BN 64
#define FM_W4A8_BN_MID 32 /* two CTAs per SM on the wgmma kernel (w4a8.tile=32) */
#define FM_W4A8_BN_SMALL 16

/* The FP8 GEMVs (gemv_fp8.cu) take at most two n8 tiles of activation rows; the W4A8 one stages x in shared memory,
 * at most FM_GEMV_FP8_SMEM_MAX bytes (fm_gemv_fp8_smem). */
#define FM_GEMV_FP8_MAX_M 16
#define FM_GEMV_FP8_SMEM_MAX (96 * 1024)
/* Shared memory of the W4A8 GEMV: M rows (rounded up to 8 or 16) of k_pad e4m3 bytes + 16 bytes of padding, and
 * two fp32 words per (row, 128-group) */
static inline uint64_t fm_gemv_fp8_smem(int64_t M, int64_t k_pad) {
    const uint64_t rows = M <= 8 ? 8 : 16;
    return rows * (uint64_t)(k_pad + 16) + 2 * rows * (uint64_t)(k_pad / 128) * 4;
}

/* The W8A8 GEMV against cuBLASLt FP8, same run (bench gemm, H200, bench/NOTES.md "v2 -> v4: what PDL,
 * ordering and L1 did"): the GEMV wins at
 * M = 1 and 8 (0.449 / 0.494 ms for 48 layers of Qwen3 projections against 0.600 / 0.559) and loses at M = 16
 * (0.670 against 0.564), where it runs two n8 tiles: threshold 8. */
#define FM_W8A8_GEMV_MAX_M_DEFAULT 8

/* The grouped W4A8 GEMV (gemv_fp8.cu) for the experts: at most FM_MOE_GEMV_MAX_PAIRS routed pairs (its bf16 h
 * buffer in the workspace is sized for that many), 16-row tiles. The default threshold: see fm_routes_moe_gemv. */
#define FM_MOE_GEMV_MAX_PAIRS 64
#define FM_MOE_GEMV_PAIRS_DEFAULT 8

/* The defaults for a GPU of compute capability sm_major (9 Hopper: the wgmma W4A8 GEMM and PDL; 8 and others:
 * mma.sync, no PDL; 0: no GPU, resolved as "others"): every key auto. */
void fm_routes_default(fm_routes *r, int sm_major);

/* Applies "key=value[,key=value...]" (NULL or empty: nothing). FM_ERR_USAGE for an unknown key or a bad value, the
 * message listing the valid keys or values; FM_ERR_UNSUPPORTED for a kernel the GPU of r->sm_major cannot run
 * (w4a8.kernel=wgmma or attention.kernel=wgmma off sm_90, pdl=on below sm_90; not checked when sm_major is 0). r is
 * unchanged on failure. */
fm_status fm_routes_apply(fm_routes *r, const char *spec, fm_error *err);

/* Resolved choices: */
bool fm_routes_w4a8_wgmma(const fm_routes *r); /* the W4A8 GEMM runs the wgmma kernel */
/* The FP4 gate|up GEMM of tile_rows-row tiles expands on a producer warpgroup (the wgmma kernel only; mma.sync
 * expands inline). Measured (bench moe, Qwen3 T = 512 / 2048 / 8192, H200, bench/NOTES.md "tenth session"): MX
 * 0.216 / 0.493 / 1.584 ms against 0.222 / 0.525 / 1.712 inline, NV 0.243 / 0.555 / 1.783 against 0.247 / 0.581 /
 * 1.882 (fp8 dispatch 0.209 / 0.474 / 1.508); T = 16 (16-row tiles) within 0.002 ms of inline. */
bool fm_routes_w4a8_fp4_producer(const fm_routes *r, uint32_t tile_rows);
/* The wgmma W4A8 GEMM of P routed pairs over E experts (dense projections: E = 1) takes its codes through the
 * shared-memory stage ring rather than into registers a group ahead (w4a8_gemm.cu, CS): auto while the experts
 * average fewer than 64 rows (P < 64 E, E > 1), where each tile streams its own expert's codes from DRAM. Measured
 * (bench moe, fp8-grouped, H200, bench/NOTES.md "thirteenth session"): Qwen3-Next (E 512, top-10) T = 16 / 512 / 2048
 * 0.100 / 0.272 / 0.580 ms against 0.108 / 0.299 / 0.604, T = 8192 equal; Qwen3 (E 128, top-8) T = 16 / 512 0.081 /
 * 0.213 against 0.085 / 0.221, T = 2048 equal, T = 8192 1.660 against 1.585 (P = 512 E: registers). 32-row tiles
 * take the ring whatever this says (two CTAs per SM leave 128 registers: w4a8_gemm.cu). */
bool fm_routes_w4a8_codes_staged(const fm_routes *r, uint64_t P, uint64_t E);
/* Prefill attention of head dim hd runs the wgmma kernel (attention_wgmma.cu: hd 128 only). Measured (lab/attention,
 * H200, (32, 4, 128) causal, bench/NOTES.md "eighth session"): T = 2048 0.0725 ms against 0.110 for mma.sync, T =
 * 8192 0.959 ms against 1.500. */
bool fm_routes_attention_wgmma(const fm_routes *r, int32_t hd);
#define FM_ATTENTION_WGMMA_HD 128
bool fm_routes_pdl(const fm_routes *r);           /* decode kernels launch with PDL */
bool fm_routes_decode_graphs(const fm_routes *r); /* decode steps replay as CUDA graphs (cuda backend) */
bool fm_routes_gemv(const fm_routes *r);          /* the FP8 GEMVs run at all */
int32_t fm_routes_w8a8_gemv_max_m(const fm_routes *r);
/* The tile rows of a W4A8 MoE call with P routed pairs over E experts, from the shapes only (no host sync): 16-row
 * tiles (wgmma n16, two CTAs per SM) while the experts get fewer than 32 rows each on average (decode, short
 * prompts: a 64-row tile is then mostly padding, its promotion and epilogue work wasted), 64 from there. Measured on
 * the Qwen3 shape (E 128, top-8; bench/NOTES.md "v6: 16-row tiles for small batches"): 16-row tiles 1.24-1.58x faster
 * up to T = 256 (P = 16 E), equal at T = 512 (P = 32 E). On the wgmma kernel 32-row tiles (n32, two CTAs per SM,
 * the codes through the stage ring) from 32 to 256 rows per expert: bench moe, H200, bench/NOTES.md "thirteenth
 * session": Qwen3 T = 512 / 2048 0.172 / 0.475 ms against 0.215 / 0.511 with 64, T = 8192 (P = 512 E) 1.659
 * against 1.599; Qwen3-Next (E 512, top-10) T = 2048 / 8192 0.548 / 1.609 against 0.581 / 1.726. w4a8.tile forces
 * one. */
uint32_t fm_routes_w4a8_tile_rows(const fm_routes *r, uint64_t P, uint64_t E);
/* The same for expert banks of format f and an FP4 dispatch or not: auto keeps 64 where it would take 32 unless f is
 * int4-tc with an e4m3 dispatch (where 32 was measured; a checkpoint's int4-zp-tc and e4m3-block banks have not run
 * 32-row tiles by default), or int4-tc with an FP4 dispatch while P < 64 E: there it loses its producer warpgroup,
 * which has no 32-row form, and gains anyway (H200, Qwen3 T = 512: MX 0.219 -> 0.205 ms, NV 0.243 -> 0.240; at
 * T = 2048 32-row tiles cost MX 0.498 -> 0.545: bench/NOTES.md, sixteenth session). The
 * workspace the memory plan sizes with fm_routes_w4a8_tile_rows holds either (64-row tiles make the shorter list). */
uint32_t fm_routes_w4a8_moe_tile_rows(const fm_routes *r, uint64_t P, uint64_t E, fm_wformat f, bool fp4_dispatch,
                                      uint64_t expert_bytes);
/* ... and 64 where one expert's gate|up codes (expert_bytes) exceed this: the tiles of one expert re-read its weights,
 * from L2 while they fit there (Qwen3: 1.5 MB), from DRAM when they do not (Mixtral: 58.7 MB of the H200's 50 MB),
 * and 32-row tiles make twice the tiles. Measured (bench moe, H200, bench/NOTES.md "sixteenth session"): Mixtral
 * T = 512 0.88 ms on 32-row tiles against 0.78 on 64. */
#define FM_W4A8_MID_MAX_EXPERT_BYTES (16ull << 20)
/* The experts of a W4A8 MoE call with P routed pairs over E experts run as grouped GEMVs (each 16-row tile of the
 * dispatch streams its expert's weights once through mma.sync, every SM busy even at P = 8) rather than the grouped
 * GEMM, whose tiles at decode sizes leave most SMs idle and most of each tile empty (ncu, Qwen3 shape, B = 1: 11 us
 * per GEMM call against a 3 us floor). Measured (bench decode, fp8 + w8a8, Qwen3 shape, H200, bench/NOTES.md
 * "seventh session"): a step 0.31 ms faster at P = 8 (B = 1), equal at P = 16, 0.56 / 0.95 ms slower at P = 32 / 64
 * (one CTA per 64 rows of one tile: the per-CTA costs grow with the tile count): default P <= 8. Needs 16-row
 * tiles. */
bool fm_routes_moe_gemv(const fm_routes *r, uint64_t P, uint64_t E, uint64_t k);
/* The router's GEMV and top-k run as one kernel (router.cu, bf16) rather than a cuBLAS GEMM and the route kernel for
 * T tokens: `on` up to FM_ROUTER_FUSED_MAX_T, auto at T = 1 only. Measured (bench decode, fp8 + w8a8, Qwen3 shape,
 * H200): 0.02 ms per step faster at B = 1, 0.09 / 0.29 / 0.6 ms slower at B = 2 / 4 / 8 (each lane reads the
 * T token rows from L2 once per weight chunk). */
bool fm_routes_router_fused(const fm_routes *r, int64_t T);
/* The Gated DeltaNet's chunked op runs on tensor cores (gdn_chunked_tc.cu) for heads of dk x dv over bf16 (act_bf16)
 * or fp32 activations: unless gdn.tc=off, where fm_gdn_tc_takes the shape; the memory
 * plan sizes its scratch by the same answer. */
bool fm_routes_gdn_tc(const fm_routes *r, int32_t dk, int32_t dv, bool act_bf16);
/* The tensor-core form's state pass (gdn.state): 4 or 8 (its warps, the output computed in the pass) or
 * FM_GDN_STATE_SPLIT (the states in the pass, the outputs in a parallel one; the default). */
#define FM_GDN_STATE_SPLIT 1
int fm_routes_gdn_state(const fm_routes *r);
/* The attention layers of a step over the paged KV cache run qk_norm_rope_store (the k and v stored by the RoPE
 * kernel) rather than qk_norm_rope and kv_store: one launch fewer per attention layer. */
bool fm_routes_rope_store(const fm_routes *r);
/* A pass of T rows runs the shared expert on the backend's second stream (shared.stream: unless off), and the rows
 * that stream's scratch is sized for in a plan of T tokens (0: none). */
bool fm_routes_shared_stream(const fm_routes *r, int64_t T);
int64_t fm_routes_shared_stream_rows(const fm_routes *r, int64_t T);
/* A pass of T rows with experts in host memory prefetches each layer's predicted experts (expert.prefetch=on: steps of
 * at most FM_EXPERT_PREFETCH_MAX_T rows; the prediction's buffers are sized for that many). */
#define FM_EXPERT_PREFETCH_MAX_T 8
#define FM_EXPERT_PREFETCH_ALL 1024 /* expert.prefetch=on: every one of a token's top-k */
bool fm_routes_expert_prefetch(const fm_routes *r, int64_t T);
/* How many of each token's top-k predicted experts a prefetch takes (1..k), when it runs. */
int32_t fm_routes_expert_prefetch_top(const fm_routes *r, int32_t k);

/* The kernel of a dense projection (the backend's linear op) of weight format f, M rows and K inputs. */
typedef enum fm_dense_kernel {
    FM_DK_CUBLAS,        /* bf16 / fp32 weights: cuBLAS GEMM */
    FM_DK_W4A16_GEMV,    /* int4-g128, int4-zp: the int4 GEMV, one input row at a time (the W4A16 baseline) */
    FM_DK_W4A8_GEMV,     /* int4-g128-tc, int4-zp-tc, e4m3-block at M <= 16: the mma.sync W4A8 GEMV */
    FM_DK_W4A8_GEMM,     /* ... above: the grouped W4A8 GEMM with one matrix (wgmma or mma.sync: w4a8.kernel) */
    FM_DK_W8A8_GEMV,     /* e4m3-tensor at M <= w8a8.gemv_max_m: the mma.sync W8A8 GEMV */
    FM_DK_W8A8_CUBLASLT, /* ... above: cuBLASLt FP8 */
} fm_dense_kernel;

fm_dense_kernel fm_routes_dense_kernel(const fm_routes *r, fm_wformat f, int64_t M, int64_t K);
/* The kernel in words, as logs and inspect print it (the W4A8 GEMM's names its MMA). */
const char *fm_dense_kernel_name(const fm_routes *r, fm_dense_kernel k);
/* The grouped W4A8 GEMM in words: "wgmma m64n64k32 e4m3 (sm_90a)" or "mma.sync m16n8k32 e4m3 (sm_89+)". */
const char *fm_routes_w4a8_kernel_name(const fm_routes *r);

/* Prints the table: each key, its value, the default, what it decides and what it resolves to. */
void fm_routes_print(const fm_routes *r, FILE *out);

/* The GPU the cuda backend would run on: compute capability major and the device's name (device_info.cu; the build
 * without CUDA, no_cuda.c, and a machine without a GPU: FM_ERR_BACKEND with the reason). */
fm_status fm_cuda_device_query(int *sm_major, char *name, size_t cap, fm_error *err);

#ifdef __cplusplus
}
#endif

#endif
