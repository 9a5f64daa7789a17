/* The backend op table: everything the forward pass (src/engine) needs from a device.
 *
 * Memory is opaque to the engine: activation buffers come from ops->alloc and hold `act_size` bytes per
 * element (fp32 on the CPU, bf16 on the GPU). Weights are banks of n matrices [n][rows, cols] (n = 1 for a
 * dense projection, n = E for an expert projection), stored in the format the plan asks for; a bank is
 * built from one or more source views per matrix concatenated along rows (q|k|v, gate|up).
 *
 * Ops do not return a status: arguments are checked by the engine, and a device fault is recorded and
 * reported by ops->sync (the CUDA backend also stops at the faulting launch in FP8MOE_SYNC=1 mode). */
#ifndef FM_BACKEND_H
#define FM_BACKEND_H

#include "fp8moe.h"
#include "io/config.h"
#include "model/model_src.h"
#include "quant/int4_native.h"

#define FM_MARK_SLOTS 4096

/* Storage of a weight bank. */
typedef enum fm_wformat {
    FM_W_F32,          /* fp32 (the oracle) */
    FM_W_BF16,         /* bf16 values */
    FM_W_INT4_G128,    /* int4 symmetric, groups of 128 along K, bf16 scales */
    FM_W_INT4_G128_TC, /* the same codes and scales, laid out for the W4A8 tensor-core kernels (GPU: fragment-
                          ordered sign-magnitude nibbles, src/backend/cuda/w4a8_layout.cuh; CPU: as int4-g128) */
    FM_W_E4M3_PT,      /* e4m3 with one fp32 scale per matrix, max(amax / 448, floor), quantized at load (W8A8) */
    FM_W_INT4_ZP,      /* a pre-quantized checkpoint's int4 as it is (GPTQ, AWQ, compressed-tensors), repacked once at
                          load: unsigned codes 0..15, a zero point (0..16) and an fp32 scale per (row, group of any size
                          along K), K permuted so that act-order groups are contiguous; w = (code - zero) * scale.
                          The engine picks it for an int4 plan when a bank's sources are pre-quantized int4 and not our
                          own int4-g128 (those bind natively as int4-g128 / int4-g128-tc: quant/int4_native.h). */
    FM_W_INT4_ZP_TC,   /* the same numbers for an fp8 plan (e4m3 1x128 activations: the group a multiple of 128, K in
                          input order). GPU: w4a8_layout.cuh's tiles of unsigned nibbles, the zero point applied per
                          128-group (cuda_bank_prequant.cu); CPU: as int4-zp */
    FM_W_E4M3_B128, /* a block-FP8 checkpoint's e4m3 bytes as they are, with its weight_scale_inv per (bn x 128) block
                       stored expanded per row: sinv[n][row][ceil(K / 128)] fp32; w = e4m3(code) * sinv. The engine
                       picks it for the fp8 plans (DeepSeek-V3's recipe: 1x128 activations, 128-wide K blocks).
                       GPU: w4a8_layout.cuh's tiles with 8-bit codes */
} fm_wformat;

/* int4 banks quantized by us (symmetric, group 128); FM_W_INT4_ZP is the checkpoint's own int4 */
static inline bool fm_wformat_is_int4(fm_wformat f) { return f == FM_W_INT4_G128 || f == FM_W_INT4_G128_TC; }
/* a checkpoint's own int4, in either layout */
static inline bool fm_wformat_is_int4zp(fm_wformat f) { return f == FM_W_INT4_ZP || f == FM_W_INT4_ZP_TC; }

/* How a linear op quantizes its activation input (the A side of y = x W^T). */
typedef enum fm_afmt {
    FM_A_NATIVE,    /* as stored: fp32 (ref) or bf16 (quantized presets) */
    FM_A_E4M3_G128, /* e4m3 with one fp32 scale per (row, 128-group along K) */
    FM_A_MXFP4,     /* E2M1 with one UE8M0 scale per 32 elements (RCEIL) */
    FM_A_NVFP4,     /* E2M1 with one e4m3 scale per 16 elements and one fp32 scale for the whole input (its amax:
                       quant/e2m1.h); the expert dispatch only (--dispatch nvfp4) */
    FM_A_E4M3_PT,   /* e4m3 with one dynamic fp32 scale for the whole input [M, K], max(amax / 448, floor) (W8A8) */
    FM_A_E4M3_ROW,  /* e4m3 with one dynamic fp32 scale per input row (token): the W8A8 row-wise variant; CPU only
                       for now (the accuracy study of bench/NOTES.md 2026-11-30 "decode-size FP8 GEMVs"), no plan selects
                       it */
} fm_afmt;

/* Activation rows quantized for the dense linears (plan a_dense FM_A_E4M3_G128) by the op that writes them (route
 * dense.quant=producer; router_moe's out_q, linear_rows): for M rows of K, e4m3 codes [M][pad128(K)] (zero past K)
 * from the start, then the fp32 scales [pad128(K) / 128][M] (group g of row m at g M + m) from
 * fm_qrows_scales_at(M, K) bytes on (a multiple of 128); fm_qrows_bytes(M, K) bytes in all, M times a row's. */
static inline size_t fm_qrows_scales_at(int64_t M, int64_t K) { return (size_t)M * (size_t)((K + 127) / 128 * 128); }
static inline size_t fm_qrows_bytes(int64_t M, int64_t K) {
    return fm_qrows_scales_at(M, K) + (size_t)((K + 127) / 128) * (size_t)M * 4;
}

const char *fm_wformat_name(fm_wformat f);
const char *fm_afmt_name(fm_afmt f);

/* The precision plan: what each weight family is stored as and how its activations are quantized. */
typedef struct fm_plan {
    fm_preset preset;
    bool act_bf16;      /* activations rounded to bf16 at op boundaries */
    fm_wformat w_dense; /* q/k/v/o and dense-MLP projections */
    fm_afmt a_dense;
    fm_wformat w_expert; /* expert gate_up and down banks */
    fm_afmt a_dispatch;  /* expert gate_up input (the routed activation buffer) */
    fm_afmt a_expert;    /* expert down input */
    fm_wformat w_other;  /* embeddings, norms, router, lm_head (unless lm_head_dense) */
    bool int4_p2;        /* int4 banks quantized at load get int4-p2 scales (quant/int4_p2.h; the cpu backend) */
    fm_kv_dtype kv;      /* the paged KV cache's format (fm_plan_set_kv) */
    bool lm_head_dense;  /* the lm_head stored as w_dense with a_dense activations (fm_plan_set_lm_head) */
} fm_plan;

void fm_plan_from_preset(fm_preset p, fm_plan *plan);
/* Applies a --dense choice to a plan: FM_DENSE_W8A8 makes the dense projections e4m3 per tensor (weights and
 * activations); FM_DENSE_PRESET leaves the preset's. */
void fm_plan_set_dense(fm_plan *plan, fm_dense dense);
/* Applies an --int4-scales choice: FM_ERR_USAGE when the plan quantizes no weights to int4 (ref, ref32, or every
 * family e4m3 by --dense w8a8 and a float expert format). Both backends quantize at load with int4-p2 scales, bit
 * for bit alike (the cuda backend on the device: cuda/quantize_int4_p2.cu). */
fm_status fm_plan_set_int4_scales(fm_plan *plan, fm_int4_scales s, fm_error *err);
/* Applies a --lm-head choice: FM_LM_HEAD_DENSE stores the lm_head as the dense projections (w_dense, a_dense);
 * FM_ERR_USAGE where those are the lm_head's own format (ref, ref32 without --dense w8a8). */
fm_status fm_plan_set_lm_head(fm_plan *plan, fm_lm_head h, fm_error *err);
/* Applies a --kv-cache choice: FM_ERR_USAGE for e4m3 on a plan of fp32 activations (ref32, and ref on the cpu) */
fm_status fm_plan_set_kv(fm_plan *plan, fm_kv_dtype kv, fm_error *err);
/* Applies a --dispatch choice: the format of the expert dispatch buffer (the routed copies of each token, the gate|up
 * GEMM's input); the down GEMM's input stays the preset's (it is made on chip by the SwiGLU epilogue and crosses no
 * dispatch). FM_ERR_USAGE on the oracle presets. */
fm_status fm_plan_set_dispatch(fm_plan *plan, fm_dispatch d, fm_error *err);
/* The plan a preset means on a backend. On "cuda", ref is the bf16 reference: bf16 weights and activations,
 * fp32 accumulation (a CPU backend given this plan emulates it exactly, which is how the GPU ops are tested). */
void fm_plan_for_backend(fm_preset p, const char *backend, fm_plan *plan);

/* A Gated DeltaNet layer's shape (Qwen3-Next's linear attention): nk key heads of dk, nv value heads of dv (nv a
 * multiple of nk: value head h reads key head h / (nv / nk)), a causal depthwise conv of `kernel` taps over the
 * C = 2 nk dk + nv dv channels q | k | v. in_proj_qkvz's output [T, 2 nk dk + 2 nv dv] holds, per key head, its q
 * (dk), k (dk), then the v (nv/nk * dv) and z (nv/nk * dv) of its value heads; in_proj_ba's [T, 2 nv] per key head
 * the b, then the a, of its value heads. */
typedef struct fm_gdn_shape {
    int32_t nk, nv, dk, dv, kernel;
} fm_gdn_shape;

static inline fm_gdn_shape fm_gdn_shape_of(const fm_config *c) {
    return (fm_gdn_shape){c->gdn_k_heads, c->gdn_v_heads, c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv_kernel};
}
static inline int64_t fm_gdn_channels(fm_gdn_shape g) { return 2 * (int64_t)g.nk * g.dk + (int64_t)g.nv * g.dv; }
static inline int64_t fm_gdn_qkvz_width(fm_gdn_shape g) { return 2 * (int64_t)g.nk * g.dk + 2 * (int64_t)g.nv * g.dv; }
/* fp32 elements of one sequence's states in one layer: the conv's last kernel - 1 inputs [kernel - 1][C], and the
 * delta rule's matrix per value head [nv][dk][dv] */
static inline int64_t fm_gdn_conv_state_elems(fm_gdn_shape g) { return (int64_t)(g.kernel - 1) * fm_gdn_channels(g); }
static inline int64_t fm_gdn_rec_state_elems(fm_gdn_shape g) { return (int64_t)g.nv * g.dk * g.dv; }

typedef struct fm_backend fm_backend; /* per-backend state */
typedef struct fm_bank fm_bank;       /* a weight bank on the backend */
struct fm_ep_layout;                  /* backend/ep_blocks.h */

/* One projection bank's source: n matrices, each the row-concatenation of n_parts views srcs[i*n_parts + j]. */
typedef struct fm_bank_src {
    const fm_wsrc *srcs;
    int32_t n;
    int32_t n_parts;
    const char *label; /* for messages: "layer 3 expert gate_up" */
    bool gate_up;      /* two parts, gate rows then up rows, feeding a SwiGLU (a backend may interleave them) */
    bool experts;      /* an MoE layer's expert bank (the moe op's): route w4a8.kernel=fold lays these out for it */
} fm_bank_src;

/* The least native of a bank's sources (quant/int4_native.h): FM_NATIVE_NO when any is float or not our format.
 * An int4-g128 / int4-g128-tc bank given pre-quantized sources is built from their codes and scales directly; the
 * engine asks for that only when this says so (model.c, pick_format). */
fm_native_int4 fm_bank_src_native_int4(const fm_bank_src *src);
/* Whether any source of the bank is pre-quantized. */
bool fm_bank_src_any_quantized(const fm_bank_src *src);

/* Experts in host memory (fm_options.experts_in): every layer's expert banks stay in host memory in their backend
 * layout (bank_create_host), and one pool of S expert slots in backend memory, shared by all layers, caches them. A
 * slot holds one expert's gate|up and down matrices: slot s is matrix s of two pool banks shaped like a layer's
 * expert banks with n = S. Before a layer's moe op, expert_fetch maps the routed expert ids [P] to slot ids [P],
 * copying each needed expert that is not resident into a slot that this call does not need; the moe op then runs on
 * the pool banks with the slot ids as its routed ids: the same bytes through the same kernels, so the results are
 * bit-identical to all-resident experts. The residency bookkeeping (which slot, which victim) is
 * backend/expert_residency.h, the reference every backend follows exactly. */
typedef struct fm_expert_cache fm_expert_cache; /* per-backend state: the pool, the slot table, the counters */

typedef struct fm_expert_cache_desc {
    int32_t n_layers;  /* layers of the model (entries of gate_up / down) */
    int32_t n_experts; /* E: experts per MoE layer */
    int32_t n_slots;   /* S >= E (a prefill of one layer may need every expert) */
    int64_t max_ids;   /* routed ids one fetch maps at most (tokens x top-k of the largest forward pass) */
    fm_expert_policy policy;
    fm_bank *const *gate_up; /* [n_layers] host banks [E][2I, H] from bank_create_host; NULL for a dense layer */
    fm_bank *const *down;    /* [n_layers] host banks [E][H, I]; NULL for a dense layer */
} fm_expert_cache_desc;

/* The cache's counters (fm_expert_stats in fp8moe.h counts the same things). */
typedef struct fm_expert_cache_stats {
    int64_t fetches, hits, misses;
    uint64_t bytes_copied; /* the fetches' copies (their misses) */
    int64_t prefetches, prefetch_copies;
    uint64_t bytes_prefetched; /* the prefetches' copies */
} fm_expert_cache_stats;

/* A captured sequence of ops, replayed as one launch (cuda: a CUDA graph) */
typedef struct fm_graph fm_graph;
/* The nodes of a captured graph by kind: kernel launches, memory copies and sets, the rest (events, empty joins) */
typedef struct fm_graph_nodes {
    int64_t kernels, copies, other;
} fm_graph_nodes;

/* router_moe's first step (route moe.block_norm): the residual add and the norm that make its input */
typedef struct fm_pre_norm {
    const void *y;       /* the rows added to the residual (the attention's output) */
    const fm_bank *norm; /* the norm's weights */
    float eps;
} fm_pre_norm;

typedef struct fm_backend_ops {
    const char *name;
    size_t act_size; /* bytes per activation element */
    /* FM_KV_E4M3 slot rows hold the codes and scales (fm_kv_row_bytes: cuda); false: the values a reader of the codes
     * sees, in the act dtype (the cpu backend's emulation: the same numbers, rows as wide as FM_KV_ACT's) */
    bool kv_e4m3_codes;

    void (*destroy)(fm_backend *be);
    void *(*alloc)(fm_backend *be, size_t bytes); /* NULL on failure */
    void (*free)(fm_backend *be, void *p);
    /* Reserves, once at load (after the banks, before the first forward pass), the scratch the ops need for the
     * memory plan's shapes: `workspace` bytes (engine/memory_plan.h: ws_moe) and what the backend's libraries need
     * (cuda: cuBLAS's workspace); side_workspace > 0: a second stream for the side ops below, its ops' own scratch
     * of that many bytes (ws_side) and its own library handles. A forward pass then allocates nothing. NULL where
     * ops need none kept (cpu). */
    fm_status (*reserve)(fm_backend *be, size_t workspace, size_t side_workspace, fm_error *err);
    /* Work beside the main chain of ops (cuda: a second stream, captured into a graph as a fork and a join).
     * side_begin: the ops issued until side_end run after everything issued before side_begin, concurrently with
     * what is issued between side_end and side_join, which must not touch their outputs; side_join: everything
     * issued after it runs after them. Without a reserved side stream (and on a backend whose ops run in order:
     * NULL, cpu) the ops simply run in issue order, which is one of the orders the contract allows. Timing marks
     * belong to the main chain: none between side_begin and side_end. */
    void (*side_begin)(fm_backend *be);
    void (*side_end)(fm_backend *be);
    void (*side_join)(fm_backend *be);
    /* Copies host data in/out of backend memory: ids (int32) and activations (as fp32 on the host side).
     * upload_ids does not wait for the device (the caller's ids may be reused at once): the staging step of a
     * forward pass. The others return when the copy is done. */
    void (*upload_ids)(fm_backend *be, const int32_t *ids, int64_t n, void *dst);
    void (*download_f32)(fm_backend *be, const void *src, int64_t n, float *dst);
    void (*upload_f32)(fm_backend *be, const float *src, int64_t n, void *dst);     /* rounded to the act dtype */
    void (*download_raw)(fm_backend *be, const void *src, size_t bytes, void *dst); /* bytes as they are */
    /* bytes as they are, host to backend; like upload_ids it does not wait for the device (src may be reused, except
     * memory from host_alloc, which the copy reads when the stream reaches it: unchanged until the next sync) */
    void (*upload_raw)(fm_backend *be, const void *src, size_t bytes, void *dst);
    /* Host memory that upload_raw copies from without the driver staging it first (cuda: pinned): the upload then
     * returns at once and runs in stream order, after the work issued before it, instead of waiting for that work.
     * NULL where plain memory does as well (cpu): malloc and free. */
    void *(*host_alloc)(fm_backend *be, size_t bytes);
    void (*host_free)(fm_backend *be, void *p);
    /* bytes of backend memory to backend memory, stream-ordered (a device copy on a GPU) */
    void (*copy)(fm_backend *be, const void *src, size_t bytes, void *dst);
    /* rows x row_bytes of backend memory, the source rows src_pitch bytes apart, the destination's dst_pitch apart
     * (pitches >= row_bytes), stream-ordered, as one copy (a strided slice: one sequence's state in every layer) */
    void (*copy_rows)(fm_backend *be, const void *src, size_t src_pitch, void *dst, size_t dst_pitch, size_t row_bytes,
                      size_t rows);
    fm_status (*sync)(fm_backend *be, fm_error *err);
    /* Graphs (NULL where the backend has none: cpu, whose ops run as they are issued). graph_capture records what
     * body issues (body must not allocate or synchronise: run it once before capturing, so that workspaces have
     * their size); graph_launch replays it in stream order; graph_free takes NULL. */
    fm_status (*graph_capture)(fm_backend *be, fm_status (*body)(void *ctx, fm_error *err), void *ctx, fm_graph **out,
                               fm_error *err);
    fm_status (*graph_launch)(fm_backend *be, fm_graph *g, fm_error *err);
    void (*graph_free)(fm_backend *be, fm_graph *g);
    /* adds g's nodes (those of its child graphs too) to *out, by kind: bench decode's launches per step */
    void (*graph_nodes)(fm_backend *be, const fm_graph *g, fm_graph_nodes *out);
    /* Timing for benchmarks: mark(slot) records a point in stream order (slot < FM_MARK_SLOTS); after sync,
     * elapsed_ms(a, b) is the time between two marks. device_name names the hardware. */
    void (*mark)(fm_backend *be, int32_t slot);
    double (*elapsed_ms)(fm_backend *be, int32_t a, int32_t b);
    /* Profiler ranges for benchmarks: range(name) opens a range named name on the host's timeline, range(NULL)
     * closes the innermost one (cuda: NVTX, so `ncu --nvtx --nvtx-include "name/"` profiles the kernels launched
     * inside it; nothing without a profiler attached). NULL where the backend has no profiler (cpu). */
    void (*range)(fm_backend *be, const char *name);
    const char *(*device_name)(fm_backend *be);

    fm_status (*bank_create)(fm_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err);
    void (*bank_free)(fm_backend *be, fm_bank *w);
    size_t (*bank_bytes)(const fm_bank *w);

    /* Experts in host memory (NULL where the backend cannot keep them there yet: the engine refuses
     * --experts-in host by the backend's name).
     * bank_create_host: a bank like bank_create's, in host memory (cuda: pinned and mapped) in the backend's layout;
     *   only expert_fetch reads it; bank_free and bank_bytes take it.
     * expert_cache_create: the pool (two banks of n_slots matrices in backend memory, shaped and formatted like every
     *   layer's gate_up and down banks, which must all agree: FM_ERR_UNSUPPORTED naming the layer otherwise), an
     *   empty slot table, a slot-id buffer of max_ids int32 in backend memory or NULL (the views above);
     *   *pool_gate_up and *pool_down are the pool banks to give the moe op, *slot_ids the buffer expert_fetch writes
     *   (all owned by the cache).
     * expert_fetch: for layer `layer`, routed expert ids ids[0..P) (int32 in backend memory, each in [0, E)): every
     *   needed expert resident, as backend/expert_residency.h defines, then slot ids slot_ids[0..P) or the views'
     *   slot table. Stream-ordered like every op (cuda: device kernels reading the ids and the table on the device,
     *   no host synchronisation: graph-safe).
     * expert_prefetch: layer `layer`'s predicted experts made resident ahead of its fetch: ids [rows][k] (int32 in
     *   backend memory, each row in order of score), the first m of each row, as backend/expert_residency.h defines
     *   a prefetch (the copies only: no slot ids written, no use counted); stream-ordered, graph-safe; NULL where
     *   the backend has none (the engine then prefetches nothing).
     * expert_cache_stats: the counters since creation (waits for the device).
     * expert_cache_free: the pool, the table and the slot ids (not the host banks). */
    fm_status (*bank_create_host)(fm_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err);
    fm_status (*expert_cache_create)(fm_backend *be, const fm_expert_cache_desc *d, fm_expert_cache **out,
                                     const fm_bank **pool_gate_up, const fm_bank **pool_down, void **slot_ids,
                                     fm_error *err);
    void (*expert_fetch)(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P);
    void (*expert_prefetch)(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t rows, int32_t k,
                            int32_t m);
    void (*expert_cache_stats)(fm_backend *be, const fm_expert_cache *c, fm_expert_cache_stats *out);
    void (*expert_cache_free)(fm_backend *be, fm_expert_cache *c);

    /* out[t, :] = table[ids[t], :] */
    void (*embed)(fm_backend *be, const fm_bank *table, const void *ids, int64_t T, void *out);
    /* out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w, rows of `dim` elements */
    void (*rmsnorm)(fm_backend *be, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps, void *out);
    /* y[M, N] = x[M, K] W[idx]^T with x quantized as afmt; W is matrix idx of the bank */
    void (*linear)(fm_backend *be, const fm_bank *w, int32_t idx, const void *x, int64_t M, fm_afmt afmt, void *y);
    /* In place on a fused qkv buffer [T, (nh + 2 nkv) hd]: optional per-head RMSNorm of q and k (q_norm/k_norm
     * may be NULL), then RoPE (rotate-half pairs (j, j + hd/2)) at position pos[t] (pos: int32 [T] in backend
     * memory, read by the device, so a captured graph replays with new positions), or pos0 + t when pos is NULL. */
    void (*qk_norm_rope)(fm_backend *be, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                         const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, const void *pos,
                         double theta);
    /* Causal GQA attention reading q, k, v from the fused qkv buffer; out is [T, nh * hd]. */
    void (*attention)(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *out);
    /* The paged KV cache (one layer's): k_cache and v_cache are [n_slots] rows of fm_kv_row_bytes (kv: FM_KV_ACT, nkv *
     * hd elements in the activation dtype; FM_KV_E4M3, quant/kv_e4m3.h's codes and scales, or their values); the
     * slot of position p of sequence s is tables[s * max_blocks + p / block_tokens] * block_tokens
     * + p % block_tokens (tables: int32 [max_seqs][max_blocks] in backend memory, engine/kv_cache.h).
     *
     * kv_store copies token t's k and v heads (from the fused qkv buffer [T, (nh + 2 nkv) hd], after
     * qk_norm_rope) to slot slots[t] of k_cache and v_cache (slots: int32 [T] in backend memory; distinct, or -1: a
     * padding row, nothing stored); FM_KV_E4M3 quantizes each (token, kv head) row as quant/kv_e4m3.h does. */
    void (*kv_store)(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const void *slots,
                     void *k_cache, void *v_cache, fm_kv_dtype kv);
    /* qk_norm_rope at positions pos (backend memory), then kv_store of the roped rows: exactly the two ops in that
     * order, in one launch where the backend fuses them (a decode step's attention layer: route rope.store). */
    void (*qk_norm_rope_store)(fm_backend *be, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                               const fm_bank *q_norm, const fm_bank *k_norm, float eps, const void *pos, double theta,
                               const void *slots, void *k_cache, void *v_cache, fm_kv_dtype kv);
    /* Attention over the paged cache: token t (its query heads from qkv row t; its k and v already stored) attends
     * causally to positions 0..tok_pos[t] (inclusive) of sequence tok_seq[t], read through the block table; GQA
     * (query head h reads kv head h / (nh / nkv)), scores q.k * hd^-0.5, softmax in fp32; out [T, nh * hd] in the
     * act dtype. tok_seq, tok_pos, tables: int32 in backend memory, read by the device only (a captured graph
     * replays with other positions and tables). max_len: an upper bound of tok_pos[t] + 1 known on the host (the
     * planned context), used only to size the split along the context. scratch: backend memory of
     * fm_attention_paged_scratch_bytes(T, nh, hd, max_len) bytes (backend/attention_paged.h; the CPU ignores it).
     * FM_KV_E4M3: the keys and values are the codes' values (exact in bf16), the rest as for a bf16 cache.
     * Preconditions: the table entries of positions 0..tok_pos[t] are valid blocks; tok_pos[t] < max_len. */
    void (*attention_paged)(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                            const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                            int64_t max_len, void *scratch, void *out);
    /* attention_paged for a step that holds prompt chunks (route paged.tiled): the same arguments and results (within
     * the op's bound), the rows of runs (a row whose neighbour in the step has its sequence) on a kernel tiled over
     * query rows that reads each K and V tile once for several tokens. The CPU's is its attention_paged. */
    void (*attention_paged_runs)(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                 const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                                 const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                                 int64_t max_len, void *scratch, void *out);
    /* Routing from router logits [T, E]: top-k expert ids [T, k] (int32) and weights [T, k] (act dtype). */
    void (*route)(fm_backend *be, const void *logits, int64_t T, int32_t E, int32_t k, fm_router_kind kind,
                  bool norm_topk, void *ids, void *weights);
    /* The router in one op: logits [T, E] = x W^T (bank w, matrix 0, E = w->rows, stored in the act dtype as
     * linear stores it), then route as `route` does. linear followed by route, up to the order in which the logits'
     * dot products are summed (a backend may fuse the two: one launch at decode). */
    void (*router)(fm_backend *be, const fm_bank *w, const void *x, int64_t T, int32_t k, fm_router_kind kind,
                   bool norm_topk, void *logits, void *ids, void *weights);
    /* Expert FFN of every routed (token, expert): out[t] = sum_j w[t,j] * down_e(silu(gate_e x) * up_e x),
     * gate_up bank [E][2I, H] (gate rows first), down bank [E][H, I]. */
    void (*moe)(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T, const void *ids,
                const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *out);
    /* Expert parallelism's three steps on one rank, around the two all-to-alls (dist/ep_moe.c; the blocks'
     * layout L: backend/ep_blocks.h, the same on every backend). Routing ids are the route op's (0..E-1).
     * ep_dispatch: x [T, H] this rank's tokens, ids [T, k] -> send (L->n_ranks dispatch blocks: each routed copy, in
     *   the dispatch format, in the block of its expert's rank with its local id, the rows' counts in the headers)
     *   and ret_row [T, k] (int32: where each copy's output comes back, ep_blocks.h). amaxes: NVFP4's, fp32
     *   [L->n_ranks] of every rank's amax op on its x (backend memory), whose largest gives the whole group's tensor
     *   scale (fm_ep_nvfp4_scale); NULL for the other formats.
     * moe_blocks: the rank's experts on what it received (recv: L->n_ranks dispatch blocks) -> yret (L->n_ranks
     *   return blocks): the bits moe computes for the same pairs; rows past a block's count are not written. amaxes as
     *   ep_dispatch's.
     * ep_combine: out [T, H] = sum_j w[t, j] y[ret_row[t, j]] in routing order over yrecv (the return blocks, one
     *   array of rows), rounded as moe rounds: the bits of moe over every expert.
     * NULL where the backend has none. */
    void (*ep_dispatch)(fm_backend *be, const struct fm_ep_layout *L, const void *x, int64_t T, const void *ids,
                        const void *amaxes, void *send, void *ret_row);
    void (*moe_blocks)(fm_backend *be, const struct fm_ep_layout *L, const fm_bank *gate_up, const fm_bank *down,
                       const void *recv, const void *amaxes, fm_afmt a_down, void *yret);
    void (*ep_combine)(fm_backend *be, const struct fm_ep_layout *L, const void *yrecv, const void *ret_row,
                       const void *weights, int64_t T, void *out);
    /* out (fp32 [1], backend memory) = the largest finite |x| of n activations, 0 when none (fm_nvfp4_amax): what
     * NVFP4's tensor scale is made from, kept on the device */
    void (*amax)(fm_backend *be, const void *x, int64_t n, void *out);
    /* out[r, i] = silu(gu[r, i]) * gu[r, I + i] for a [rows, 2I] gate|up buffer */
    void (*swiglu)(fm_backend *be, const void *gu, int64_t rows, int64_t I, void *out);
    /* acc += x (n elements) */
    void (*add)(fm_backend *be, void *acc, const void *x, int64_t n);
    /* acc += x, then out = rmsnorm(acc) * w: rows of dim elements; exactly add followed by rmsnorm (the residual add
     * and the next block's norm, fused into one pass where the backend can) */
    void (*add_rmsnorm)(fm_backend *be, void *acc, const void *x, const fm_bank *w, int64_t rows, int64_t dim,
                        float eps, void *out);
    /* The MoE block's end in one op (route decode.fused): exactly moe(gate_up, down, x, T, ids, weights, k,
     * a_dispatch, a_down) into y, then add_rmsnorm(acc, y, norm, T, H, eps, out), H = down->rows. The backend may fold
     * the routed rows' weighted combine, the residual add and the norm into one kernel, y then left unspecified (it is
     * scratch [T, H]); out may be x (the moe reads x before the norm writes out). out_q (NULL: none): out's rows also
     * quantized for the next dense linear, as fm_qrows lays them out, for linear_rows (route dense.quant=producer: the
     * kernel that ends the block writes them; a backend without linear_rows ignores it). NULL where a backend has none.
     */
    void (*moe_add_rmsnorm)(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                            const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down,
                            void *y, void *acc, const fm_bank *norm, float eps, void *out, void *out_q);
    /* The router and the routed experts in one op (route moe.dispatch: at decode the router's launch also dispatches
     * the rows): exactly router(rw, x, T, k, kind, norm_topk, logits, ids, weights), then moe(gate_up, down, x, T,
     * ids, weights, k, a_dispatch, a_down, y) or, with norm (not NULL), moe_add_rmsnorm(gate_up, down, x, T, ids,
     * weights, k, a_dispatch, a_down, y, acc, norm, eps, out, out_q). Routing ids are the experts' bank indices (no
     * expert cache's slots, no expert parallelism). out_q: as moe_add_rmsnorm's, with norm only. pre (NULL: none;
     * with norm only): first add_rmsnorm(acc, pre->y, pre->norm, T, H, pre->eps, x), x then the normed rows (route
     * moe.block_norm: the persistent block makes them itself; pre->y is not y). NULL where a backend has none: the
     * caller runs the ops in order. */
    void (*router_moe)(fm_backend *be, const fm_bank *rw, const fm_bank *gate_up, const fm_bank *down, void *x,
                       int64_t T, int32_t k, fm_router_kind kind, bool norm_topk, void *logits, void *ids,
                       void *weights, fm_afmt a_dispatch, fm_afmt a_down, void *y, void *acc, const fm_bank *norm,
                       float eps, void *out, void *out_q, const fm_pre_norm *pre);
    /* linear(w, idx, x, M, afmt, y) where xq holds x's M rows quantized by the op that wrote x (fm_qrows, afmt
     * FM_A_E4M3_G128): the backend reads the rows from xq where its kernel takes them, else x. NULL where a backend
     * never writes such rows (its moe_add_rmsnorm and router_moe ignore out_q). */
    void (*linear_rows)(fm_backend *be, const fm_bank *w, int32_t idx, const void *x, const void *xq, int64_t M,
                        fm_afmt afmt, void *y);
    /* A projection and the residual add + RMSNorm after it in one op (route decode.fused: a decode step's o
     * projection): exactly linear(w, 0, x, M, afmt, y), then add_rmsnorm(acc, y, norm, M, w->rows, eps, out); y holds
     * the projection after it as after linear. NULL where a backend has none. */
    void (*linear_add_rmsnorm)(fm_backend *be, const fm_bank *w, const void *x, int64_t M, fm_afmt afmt, void *y,
                               void *acc, const fm_bank *norm, float eps, void *out);
    /* Paged attention and the o projection after it in one op (route dense.quant=producer): exactly (runs ?
     * attention_paged_runs : attention_paged)(qkv, T, ..., scratch, att), then linear(o, 0, att, T, afmt, y), or with
     * norm given linear_add_rmsnorm(o, att, T, afmt, y, acc, norm, eps, out) (acc, norm and out NULL: none); att holds
     * the attention's output after it as after attention_paged. A GPU quantizes the attention's rows for o where the
     * attention's merge writes them, instead of by a launch of its own. Returns false, having run nothing, where the
     * backend does not take these banks or shapes; the caller then runs the ops. NULL where a backend has none. */
    bool (*attention_paged_o)(fm_backend *be, bool runs, const void *qkv, int64_t T, int32_t nh, int32_t nkv,
                              int32_t hd, const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                              const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                              int64_t max_len, void *scratch, void *att, const fm_bank *o, fm_afmt afmt, void *y,
                              void *acc, const fm_bank *norm, float eps, void *out);
    /* A decode step's attention block for one token in one op (route attn.persistent): exactly linear(qkv, 0, h, 1,
     * afmt, b_qkv), qk_norm_rope_store(b_qkv, 1, nh, nkv, hd, q_norm, k_norm, qk_eps, pos, theta, slots, k_cache,
     * v_cache, kv), attention_paged(b_qkv, 1, ... , scratch, att), linear(o, 0, att, 1, afmt, y), then
     * add_rmsnorm(acc, y, norm, 1, H, eps, out) (out may be h). Returns false, having run nothing, where the backend
     * does not take these banks, shapes or cache; the caller then runs the ops. NULL where a backend has none. */
    bool (*attention_block)(fm_backend *be, const fm_bank *qkv, const fm_bank *o, const void *h, fm_afmt afmt,
                            int32_t nh, int32_t nkv, int32_t hd, const fm_bank *q_norm, const fm_bank *k_norm,
                            float qk_eps, const void *pos, double theta, const void *slots, void *k_cache,
                            void *v_cache, fm_kv_dtype kv, const void *tok_seq, const void *tables, int32_t max_blocks,
                            int32_t block_tokens, int64_t max_len, void *scratch, void *b_qkv, void *att, void *y,
                            void *acc, const fm_bank *norm, float eps, void *out);
    /* One token per row of logits [B, vocab] (act dtype), as src/engine/sampler.h defines the step. Row r belongs to
     * sequence slot row_slot[r] (int32 [B]); indexed by slot, in backend memory: params (fm_sampling), steps
     * (uint64: the draw's counter, incremented), counts (int32 [slots][vocab]) and seen (uint8 [slots][vocab]), the
     * penalty state, both NULL when no slot has penalties, to which the chosen id is added; bias (fm_logit_bias
     * [slots][FM_MAX_LOGIT_BIAS], params.n_bias of them used); by row: mask (uint32 [B][(vocab + 31) / 32], read
     * for rows whose slot has params.masked; may be NULL when none has). z: scratch of B * vocab floats; ids: int32
     * [B] out; info: fm_sample_info [B] out (raw log-probabilities) or NULL. Values never reach the host: a decode
     * step and its sampling replay as one CUDA graph. */
    void (*sample)(fm_backend *be, const void *logits, int32_t B, int32_t vocab, const void *row_slot,
                   const void *params, void *steps, void *counts, void *seen, const void *bias, const void *mask,
                   void *z, void *ids, void *info);

    /* Qwen3-Next's ops (backend/cpu/cpu_gated_attention.c, cpu_gdn.c): NULL on a backend without them, where the
     * engine refuses the architecture at load (model.c, check_backend_runs_arch).
     *
     * Gated attention's inputs: from qg [T, (2 nh + 2 nkv) hd] (per query head hd query values then hd gate values,
     * then the k heads and the v heads) writes qkv [T, (nh + 2 nkv) hd] as qk_norm_rope leaves it (per-head q/k
     * RMSNorm, then RoPE on the first rot_dim dims of each head: rotate-half pairs (j, j + rot_dim / 2), inv_freq
     * theta^(-2j / rot_dim); the other dims pass) and gate [T, nh hd]. pos, pos0 as in qk_norm_rope. */
    void (*gated_qk_norm_rope)(fm_backend *be, const void *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                               int32_t rot_dim, const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0,
                               const void *pos, double theta, void *qkv, void *gate);
    /* x[i] *= sigmoid(gate[i]) for n elements (the gated attention's output) */
    void (*sigmoid_mul)(fm_backend *be, void *x, const void *gate, int64_t n);
    /* acc[r, :] += sigmoid(score[r]) * x[r, :], rows of dim (the shared expert's output under its gate) */
    void (*add_sigmoid_scaled)(fm_backend *be, void *acc, const void *x, const void *score, int64_t rows, int64_t dim);
    /* The same with the score computed: acc[r, :] += sigmoid(h[r, :] . w) * x[r, :], w matrix 0 of a [1, dim] bank
     * (Qwen3-Next's shared_expert_gate). Exactly linear(w, h) (FM_A_NATIVE, the score stored in the act dtype)
     * followed by add_sigmoid_scaled, up to the order in which the dot product is summed: one launch where the
     * backend fuses them. */
    void (*add_sigmoid_gated)(fm_backend *be, void *acc, const void *x, const void *h, const fm_bank *w, int64_t rows,
                              int64_t dim);
    /* The Gated DeltaNet's causal depthwise conv + SiLU: out [T, C] (channels q | k | v, C = fm_gdn_channels) from
     * the q, k, v columns of qkvz [T, fm_gdn_qkvz_width] (their grouped order undone), conv [C, kernel] (tap
     * kernel - 1 on the current token). states NULL: the T tokens are one sequence from position 0 (no history, none
     * kept). Else token t belongs to sequence tok_seq[t] at position tok_pos[t], in order: its history is that
     * sequence's conv state (fp32 [max_seqs][kernel - 1][C]: fm_gdn_conv_state_elems per sequence), zero at
     * position 0, and the state is advanced. */
    void (*gdn_conv)(fm_backend *be, const void *qkvz, const fm_bank *conv, int64_t T, fm_gdn_shape g, void *states,
                     const void *tok_seq, const void *tok_pos, void *out);
    /* The gated delta rule over one run of T tokens of one sequence, in chunks of 64 (a prompt or a prompt chunk):
     * per value head h (key head h / (nv / nk)), q and k L2-normalised (eps 1e-6), q scaled by dk^-1/2, beta =
     * sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); S_t = e^g S_{t-1} + k_t (beta (v_t - e^g S_{t-1}^T k_t))^T,
     * out_t = S_t^T q_t [T, nv dv]. qkv: gdn_conv's out; ba: in_proj_ba's out; a_log, dt_bias: [nv] banks. states
     * NULL: the run starts at position 0 from a zero state and nothing is kept. Else the run is sequence tok_seq[0]'s
     * from position tok_pos[0] (tok_pos NULL: 0; both device int32, read by the device only): it starts from that
     * sequence's recurrent state (fp32 [max_seqs][nv][dk][dv]; zero at position 0) and leaves its final S there. */
    void (*gdn_chunked)(fm_backend *be, const void *qkv, const void *ba, const fm_bank *a_log, const fm_bank *dt_bias,
                        int64_t T, fm_gdn_shape g, void *states, const void *tok_seq, const void *tok_pos, void *out);
    /* The same rule token by token (decode rows; any rows of any sequences, which the engine gives it only for rows
     * outside prompt chunks): token t updates the state of sequence tok_seq[t] (zeroed first when tok_pos[t] == 0),
     * in order. */
    void (*gdn_recurrent)(fm_backend *be, const void *qkv, const void *ba, const fm_bank *a_log, const fm_bank *dt_bias,
                          int64_t T, fm_gdn_shape g, void *states, const void *tok_seq, const void *tok_pos, void *out);
    /* The gated RMSNorm per value head: out[t, h] = w * rmsnorm(core[t, h]) * silu(z[t, h]) with z from qkvz's
     * grouped columns; core and out [T, nv dv], w [dv]. out_q (NULL: none): out's rows also quantized for the out
     * projection, as fm_qrows lays them out, for linear_rows (route dense.quant=producer: the norm's kernel writes
     * them; a backend without linear_rows ignores it). */
    void (*gdn_norm_gate)(fm_backend *be, const void *core, const void *qkvz, const fm_bank *w, int64_t T,
                          fm_gdn_shape g, float eps, void *out, void *out_q);
    /* A decode step's Gated DeltaNet in one op (route decode.fused): exactly gdn_conv(qkvz, conv, T, g, conv_states,
     * tok_seq, tok_pos, qkv), gdn_recurrent(qkv, ba, a_log, dt_bias, T, g, rec_states, tok_seq, tok_pos, core), then
     * gdn_norm_gate(core, qkvz, norm, T, g, eps, out). For decode rows only: each row a token of its own sequence,
     * or, where the ops take them (cuda: gdn.cuh), a padding row (row 0's sequence and position again, no state
     * changed, its output finite and meaningless); the cpu backend stops on two rows of one sequence. It may keep the
     * conv output and the rule's output on chip: qkv [T, C] and core [T, nv dv] are scratch, left unspecified; out
     * may be qkv. out_q: as gdn_norm_gate's. ba_w (NULL: ba holds the rows' b | a values): the in_proj_ba matrix [2 nv,
     * H]; then the op first computes ba = h ba_w^T from the normed rows h [T, H] (route gdn.decode_ba), as
     * linear(ba_w, h) would up to its order of summation, and ba is scratch it may leave unwritten. NULL where a
     * backend has none. */
    void (*gdn_decode_fused)(fm_backend *be, const void *qkvz, const void *ba, const fm_bank *ba_w, const void *h,
                             const fm_bank *conv, const fm_bank *a_log, const fm_bank *dt_bias, const fm_bank *norm,
                             int64_t T, fm_gdn_shape g, float eps, void *conv_states, void *rec_states,
                             const void *tok_seq, const void *tok_pos, void *qkv, void *core, void *out, void *out_q);
} fm_backend_ops;

struct fm_backend {
    const fm_backend_ops *ops;
    fm_plan plan;
    int32_t n_threads;
};

/* Creates the named backend ("cpu", "cuda") for a plan. routes: the kernel route overrides, "key=value,..." or NULL
 * (src/backend/routes.h; the cuda backend fills its route table from the device, then these; the cpu backend has
 * one kernel per op and only checks them). A backend that cannot run here (not built, no GPU) returns
 * FM_ERR_BACKEND with the reason; a bad route FM_ERR_USAGE, a route the GPU cannot run FM_ERR_UNSUPPORTED. */
/* Bytes of one FM_KV_E4M3 row of codes and scales: nkv x hd e4m3 codes, then nkv fp32 scales, padded to 16 bytes
 * (the kernels' 16-byte loads of a row's heads stay aligned) */
static inline int64_t fm_kv_e4m3_row_bytes(int32_t nkv, int32_t hd) {
    return (int64_t)nkv * hd + ((int64_t)nkv * 4 + 15) / 16 * 16;
}
/* Bytes of one slot's row (K or V of every kv head of one token) of the paged cache on a backend whose e4m3 rows hold
 * codes (e4m3_codes) and whose activations are act_size bytes; fm_kv_row_bytes asks the backend's ops, the memory plan
 * its kind (backend_kind.h) */
static inline int64_t fm_kv_row_bytes_as(bool e4m3_codes, size_t act_size, int32_t nkv, int32_t hd, fm_kv_dtype kv) {
    return kv == FM_KV_E4M3 && e4m3_codes ? fm_kv_e4m3_row_bytes(nkv, hd) : (int64_t)nkv * hd * (int64_t)act_size;
}
static inline int64_t fm_kv_row_bytes(const fm_backend_ops *ops, int32_t nkv, int32_t hd, fm_kv_dtype kv) {
    return fm_kv_row_bytes_as(ops->kv_e4m3_codes, ops->act_size, nkv, hd, kv);
}

fm_status fm_backend_create(const char *name, const fm_plan *plan, int32_t n_threads, const char *routes,
                            fm_backend **out, fm_error *err);

fm_status fm_cpu_backend_create(const fm_plan *plan, int32_t n_threads, fm_backend **out, fm_error *err);
/* Free and total bytes of the current CUDA device (cudaMemGetInfo; total may be NULL): device_info.cu (no_cuda.c in a
 * build without nvcc: FM_ERR_BACKEND). The engine asks it through the backend kinds (backend_kind.h). */
fm_status fm_cuda_free_memory(size_t *free_bytes, size_t *total, fm_error *err);
fm_status fm_cuda_backend_create(const fm_plan *plan, const char *routes, fm_backend **out, fm_error *err);
/* The CUDA backend's stream (a cudaStream_t) for capturing a forward pass into a CUDA graph (tests); NULL for
 * another backend or a build without CUDA. */
void *fm_cuda_backend_stream(fm_backend *be);
/* Op tests: the FP4 dispatch buffer that the last moe op of a T x k routing over E experts (hidden H, width I, W4A8
 * experts, --dispatch mxfp4|nvfp4) left in the CUDA backend's workspace, in pair order p = t k + j: E2M1 codes
 * [T k][pad128(H) / 2] and block scales [T k][pad128(H) / 128][4 (MX) or 8 (NV) bytes], and the NVFP4 tensor scale
 * (1 for MX); under route w4a8.kernel=fold the e4m3 rows with one scale per token: codes [T k][pad128(H)] and fp32
 * scales [T k] (4 bytes each), tensor scale 1. Synchronises. False on another backend, dispatch format or a build
 * without CUDA. */
bool fm_cuda_moe_dispatch_read(fm_backend *be, int64_t T, int32_t k, int32_t E, int64_t H, int64_t I, uint8_t *codes,
                               uint8_t *scales, float *tensor_scale);
/* Op tests: the CUDA expert cache's table after the fetches so far: slot_of [n_layers * E] (the slot of each
 * (layer, expert), -1 when not resident) and owner [S] (layer * E + expert held by each slot, -1 when empty), as
 * backend/expert_residency.h keeps them. Synchronises. FM_ERR_BACKEND on a build without CUDA. */
/* Benchmarks: the host link as the CUDA expert cache uses it, `bytes` from pinned host memory into GPU memory, in
 * GB/s: by the DMA engines (cudaMemcpyAsync) and by the cache's copy kernel reading mapped host memory (the floor of
 * a miss). FM_ERR_BACKEND without CUDA. */
fm_status fm_cuda_host_link(size_t bytes, double *dma_gbps, double *mapped_gbps, fm_error *err);
fm_status fm_cuda_expert_cache_table(fm_backend *be, const fm_expert_cache *c, int32_t *slot_of, int32_t *owner,
                                     fm_error *err);

#endif
