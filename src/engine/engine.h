/* The engine's view of a loaded model (configuration, plan, backend and the weight banks per layer: read only after
 * the load) and of its context (what a run mutates), fp8moe.h's fm_model and fm_context. */
#ifndef FM_ENGINE_H
#define FM_ENGINE_H

#include <stddef.h>

#include "backend/backend.h"
#include "backend/routes.h"
#include "engine/sampler.h"

/* One layer's banks, by slot (model/arch.h fm_bank_slot; NULL where the layer's description has none). The named
 * members alias the same pointers: the forward pass reads the layer through them. */
typedef struct fm_layer_weights {
    union {
        fm_bank *bank[FM_BANK_COUNT];
        struct {
            fm_bank *attn_norm, *ffn_norm; /* [H] */
            fm_bank *qkv;                  /* [(nh + 2 nkv) hd, H]: q | k | v rows */
            fm_bank *o;                    /* [H, nh hd] */
            fm_bank *q_norm, *k_norm;      /* [hd] (Qwen3) or NULL */
            fm_bank *router;               /* [E, H] */
            fm_bank *gate_up;              /* MoE: [E][2I, H]; dense: [1][2Id, H] (gate rows, then up rows) */
            fm_bank *down;                 /* MoE: [E][H, I]; dense: [1][H, Id] */
            /* Qwen3-Next (model/arch.h's slots): the shared expert and its sigmoid gate; a Gated DeltaNet layer */
            fm_bank *shared_gate_up, *shared_down, *shared_score;
            fm_bank *gdn_qkvz, *gdn_ba, *gdn_conv, *gdn_a_log, *gdn_dt_bias, *gdn_norm, *gdn_out;
        };
    };
    fm_layer_kind kind;
    bool is_moe; /* the kind has routed experts */
} fm_layer_weights;

_Static_assert(offsetof(fm_layer_weights, down) == offsetof(fm_layer_weights, bank) + FM_BANK_DOWN * sizeof(fm_bank *),
               "fm_layer_weights: the named members follow fm_bank_slot");
_Static_assert(offsetof(fm_layer_weights, gdn_out) ==
                   offsetof(fm_layer_weights, bank) + FM_BANK_GDN_OUT * sizeof(fm_bank *),
               "fm_layer_weights: the named members follow fm_bank_slot");
_Static_assert(offsetof(fm_layer_weights, qkv) == offsetof(fm_layer_weights, bank) + FM_BANK_QKV * sizeof(fm_bank *),
               "fm_layer_weights: the named members follow fm_bank_slot");

struct fm_model {
    fm_config cfg;
    fm_plan plan;
    fm_backend *be;
    int32_t n_layers;                      /* layers loaded and run (--layers) */
    fm_bank *embed, *final_norm, *lm_head; /* lm_head may be embed (tied) */
    fm_layer_weights *layers;
    fm_expert_layout expert_layout;
    int64_t n_params;
    size_t weight_bytes;      /* held by the backend */
    fm_routes routes;         /* the route overrides the model was loaded with (opt->routes over the defaults): the
                                 memory plan sizes the backend's scratch with them */
    int64_t n_ctx;            /* longest sequence accepted (fm_options.ctx or max_position_embeddings); 0 = any */
    bool n_ctx_explicit;      /* set by the caller (--ctx), not by the config */
    bool experts_host;        /* experts in host memory (--experts-in, resolved by the memory plan at load) */
    int32_t expert_slots;     /* then: the expert cache's slots (the plan's expert_slots) */
    size_t expert_host_bytes; /* then: the expert banks' bytes in host memory (not in weight_bytes) */
    /* expert parallelism (fm_options.ep_ranks > 1): this rank's experts [ep_first, ep_first + ep_n) of every MoE
       layer; tensor parallelism of attention (tp_ranks > 1): its query heads [tp_h0, tp_h0 + tp_nh) and key-value
       heads [tp_kv0, tp_kv0 + tp_nkv) (without: every head). The run state of the group (communicators, exchange
       buffers) is the context's. */
    int32_t ep_ranks, ep_rank, ep_first, ep_n;
    int32_t tp_ranks, tp_rank, tp_h0, tp_nh, tp_kv0, tp_nkv;
    /* The run state the memory plan reserved at load for this model's one context (engine/context.c): the load
       allocates it (the pre-load check promises that nothing the plan counted fails later), fm_context_create
       hands it out, one holder at a time (the backend's scratch is one). Only a context's functions touch it. */
    struct fm_context *context;
};

/* What a run mutates, apart from the weights (fp8moe.h fm_context): the forward buffers, the generation state (KV
 * cache with its pool, sampler state, masks, captured decode graphs), the expert cache of --experts-in host, and a
 * rank's state of --ep/--tp. Functions that run or mutate take a context and reach the model through it; functions
 * that only read weights or configuration take a const fm_model. */
struct fm_context {
    const fm_model *m; /* the model it runs: weights and configuration, read only */
    bool held;         /* handed out by fm_context_create and not yet given back */
    /* the limits the holder asked for (fm_context_params), at most what the load reserved: sequences at once, tokens
       per sequence (0: any), tokens of one pass */
    int32_t n_seqs;
    int64_t n_ctx, n_tokens;
    struct fw_buffers *bufs; /* the forward pass's activation buffers, allocated once at load for buf_tokens */
    int64_t buf_tokens;
    struct fm_kv_state *kv;            /* generation state (KV cache, sampler), when loaded with max_seqs > 0 */
    struct fm_expert_offload *experts; /* experts in host memory: the expert cache (engine/expert_offload.c) */
    /* ep_comm / tp_comm: this rank's end of the group's communicator (dist/rank_group.c sets them after the load). A
       failed exchange during a forward pass is kept in dist_status / dist_err and returned by fm_forward. */
    struct fm_comm *ep_comm, *tp_comm;
    struct fm_ep_state *ep; /* expert parallelism's exchange buffers (forward.c), reserved with the forward buffers */
    uint64_t ep_bytes_dispatch, ep_bytes_combine; /* since the load: what this rank's MoE all-to-alls sent */
    fm_status dist_status;
    fm_error dist_err;
};

/* Experts in host memory (engine/expert_offload.c). create: the backend's expert cache of n_slots slots over the
 * layers' host expert banks, after the forward buffers are reserved (slot ids for buf_tokens x top-k routed ids);
 * FM_ERR_UNSUPPORTED naming the backend when it has no expert cache. */
typedef struct fm_expert_offload fm_expert_offload;
fm_status fm_expert_offload_create(fm_context *ctx, int32_t n_slots, fm_expert_policy policy, fm_error *err);
void fm_expert_offload_free(fm_context *ctx);

/* What layer l's moe op runs on: its own expert banks and the routed ids as they are, or, with experts in host memory,
 * the pool's banks and the slot ids after the backend's expert_fetch made the P routed experts resident. */
typedef struct fm_moe_experts {
    const fm_bank *gate_up, *down;
    const void *ids;
} fm_moe_experts;
fm_moe_experts fm_moe_experts_of(fm_context *ctx, int32_t l, const void *ids, int64_t P);

/* The expert prefetch (route expert.prefetch; experts in host memory on a backend with expert_prefetch): whether a
 * pass of T rows prefetches layer l's experts, and the prefetch itself, issued at the layer's start from the residual
 * stream x [T, H] entering it: ffn_norm(x) (on the main chain, which overwrites x later), then on the side chain
 * (backend side ops) the layer's router on it and expert_prefetch of its top-k. The caller joins the side chain
 * (ops->side_join) before the layer's router: the prefetch's router and the real one share the router's state. */
bool fm_moe_prefetch_on(const fm_context *ctx, int32_t l, int64_t T);
void fm_moe_prefetch(fm_context *ctx, int32_t l, const void *x, int64_t T);

/* Once, at load (after the banks): the forward buffers (the memory plan's activations) and the backend's scratch
 * (ops->reserve: the plan's ws_moe) for up to T tokens. No forward pass allocates or grows anything afterwards; a
 * longer prompt is refused (fm_forward_stage). */
fm_status fm_forward_reserve(fm_context *ctx, int64_t T, fm_error *err);

/* FM_OK when a sequence of T tokens fits the model's context, else a message naming the limit and --ctx; the
 * context's version also checks the shorter limit it may have been created with. */
fm_status fm_model_check_ctx(const fm_model *m, int64_t T, fm_error *err);
fm_status fm_context_check_ctx(const fm_context *ctx, int64_t T, fm_error *err);
/* The context's limits back to what the load reserved (engine/context.c; the load calls it once everything is). */
void fm_context_limits_reset(fm_context *ctx);
void fm_forward_buffers_free(fm_context *ctx);

/* Stages of a forward pass, for the benchmark's breakdown. */
typedef enum fm_stage {
    FM_STAGE_ATTN_PROJ, /* q|k|v and o projections */
    FM_STAGE_ATTENTION, /* q/k norm + RoPE, attention */
    FM_STAGE_GDN,     /* Gated DeltaNet layers (Qwen3-Next): conv, delta rule, gated norm (their projections: above) */
    FM_STAGE_ROUTING, /* router projection, top-k */
    FM_STAGE_FETCH,   /* experts in host memory: the expert cache's fetch (residency, copies of the misses) */
    FM_STAGE_EXPERTS, /* expert FFN (or dense MLP) */
    FM_STAGE_OTHER,   /* embedding, norms, residual adds, lm_head */
    FM_STAGE_COUNT
} fm_stage;

const char *fm_stage_name(fm_stage s);

/* Per-stage time of one forward pass (device time between stream marks on the GPU, wall time on the CPU). */
typedef struct fm_profile {
    double stage_ms[FM_STAGE_COUNT];
    double total_ms;
} fm_profile;

/* Runs the forward pass over ids (positions 0..T-1) and writes logits: [T, vocab], or only the last position's
 * [vocab] when last_only. prof (may be NULL) receives the per-stage times. T above the tokens the model was loaded
 * for (fm_options.max_tokens) fails with FM_ERR_USAGE, naming both. */
fm_status fm_forward(fm_context *ctx, const int32_t *ids, int64_t T, bool last_only, float *logits, fm_profile *prof,
                     fm_error *err);

/* fm_forward in its three steps, run in this order (what a CUDA graph captures is the middle one):
 *   stage    checks T against the plan and copies the ids to their device buffer (no wait for the device);
 *   device   the pass itself, launches only: no host synchronisation, no allocation, no branch on values (shape
 *            branches only), so on the GPU it can be captured on the backend's stream (ops->graph_capture) and
 *            replayed; the debug switches FP8MOE_SYNC and FP8MOE_DUMP synchronise, and are not for capture;
 *   collect  waits for the device and downloads the logits ([T, vocab] or [vocab] when last_only). */
fm_status fm_forward_stage(fm_context *ctx, const int32_t *ids, int64_t T, fm_error *err);
void fm_forward_device(fm_context *ctx, int64_t T, bool last_only);
fm_status fm_forward_collect(fm_context *ctx, int64_t T, bool last_only, float *logits, fm_error *err);

/* Generation steps (src/engine/generate.c drives them): T tokens of sequences whose KV cache already holds room for
 * them (fm_kv_seq_append), token t of sequence seq[t] at position pos[t].
 *   stage         copies ids, sequences, positions and cache slots (and the block tables when they changed) to
 *                 backend memory, without waiting for the device;
 *   device        the pass (launches only: capturable, like fm_forward_device), writing each token's K and V into
 *                 the cache; logits of every token, or of the last only;
 *   sample_device one token per logits row (B rows) with the sampler state of the rows' slots (kv->row_slot,
 *                 uploaded before), into kv->ids_out / kv->info_out;
 *   logits        waits and downloads `rows` rows of logits. */
typedef enum fm_attn_mode {
    FM_ATTN_NO_CACHE, /* positions 0..T-1 of one sequence, nothing kept: prompt logits, perplexity */
    FM_ATTN_FRESH,    /* one sequence from position 0: the contiguous kernel, K and V stored for later steps */
    FM_ATTN_PAGED,    /* any tokens at any positions: attention over the paged cache (decode, prefill chunks) */
    FM_ATTN_DECODE,   /* as paged, the rows a decode step's: each a token of its own sequence, or a padding row (a
                         copy of row 0, generate.c); the Gated DeltaNet then runs as one op (gdn_decode_fused) under
                         route decode.fused */
} fm_attn_mode;
fm_status fm_step_stage(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                        fm_error *err);
/* fm_step_stage where rows n_real..T-1 pad the step to a graph's bucket (copies of row 0): they store no K and V
 * (slot -1), as a decode step's padding rows do */
fm_status fm_step_stage_padded(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                               int64_t n_real, fm_error *err);
void fm_step_device(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn);
/* fm_step_device with the logits of chosen rows only (a mixed step: each decoding sequence's row and the last row of
 * each prompt that completes): rows [first, first + n) of each run, in run order, become logits rows 0, 1, ... */
typedef struct fm_row_run {
    int64_t first, n;
} fm_row_run;
void fm_step_device_rows(fm_context *ctx, int64_t T, const fm_row_run *runs, int32_t n_runs, fm_attn_mode attn);
/* fm_step_device_rows in its two parts: the layers over the T staged rows (launches that depend on T alone: what a
 * mixed step's graph captures), then the final norm and lm_head of the runs' rows */
void fm_step_device_layers(fm_context *ctx, int64_t T, fm_attn_mode attn);
void fm_step_device_tail(fm_context *ctx, const fm_row_run *runs, int32_t n_runs);
/* A pass over the paged cache that holds prompt chunks (a mixed step, scheduler.c): stages the T rows and runs
 * fm_step_device_rows(runs) with attn; on a backend with graphs (routes mixed.graphs, decode.graphs) and a model
 * whose layers are all attention layers, on one rank, experts on the device, the layers run as the CUDA graph of the
 * step's row bucket (the rows padded to it: step_graphs.c), captured the second time the bucket runs. Launches only. */
fm_status fm_step_run_rows(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                           const fm_row_run *runs, int32_t n_runs, fm_attn_mode attn, fm_error *err);
void fm_step_sample_device(fm_context *ctx, int32_t B);
fm_status fm_step_logits(fm_context *ctx, int64_t rows, float *logits, fm_error *err);
/* A group's rank (--ep, --tp): the first failed exchange of the passes since the last call (then cleared), else
 * FM_OK. fm_forward, fm_step_logits and fm_decode_run return it. */
fm_status fm_dist_status_take(fm_context *ctx, fm_error *err);
/* The same device work with the forward pass's stage marks (not capturable): per-stage times of one step. */
fm_status fm_step_profile(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn, fm_profile *prof,
                          fm_error *err);

/* One op of a step's profile (fm_step_profile_ops): an op of the forward pass, summed over the layers of its kind.
 * kind: "attention", "deltanet" (the token mixers, with the residual add and norm after them), "moe", "dense" (the
 * FFN blocks, with the add and norm after them), "step" (embedding, final norm and lm_head). bytes: what the op must
 * move through device memory at least, from the shapes and the banks' stored sizes (ops->bank_bytes): the weights it
 * reads (the experts: the expected number a step's tokens select under uniform routing), the activations it reads and
 * writes, the KV cache and the Gated DeltaNet states it reads and writes. */
typedef struct fm_op_row {
    const char *kind, *op;
    int32_t count; /* times it ran in the step: the layers of its kind that run it */
    double ms;     /* summed device time between its marks (wall time on the CPU) */
    double bytes;
} fm_op_row;
enum { FM_OP_ROWS = 48 };
typedef struct fm_op_profile {
    int32_t n;
    fm_op_row rows[FM_OP_ROWS]; /* in the order they first ran */
    double step_ms;             /* first mark to last: the rows' ms add up to it */
    double step_bytes;          /* the rows' bytes summed */
} fm_op_profile;
/* fm_step_profile with a mark after every op (ops may be NULL: stage marks only, as fm_step_profile); prof and ops
 * both come from the one step. */
fm_status fm_step_profile_ops(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn, fm_profile *prof,
                              fm_op_profile *ops, fm_error *err);

/* One decode step of n open sequences: each gets room for one token in its cache, runs ids[j] at its next position,
 * and samples its next token with its own sampler state (out_ids, out_logprobs: the raw log-probability). On the
 * cuda backend the step replays as the CUDA graph of its batch bucket (routes: decode.graphs). Waits for the step. */
fm_status fm_decode_step(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs, int32_t *out_ids,
                         float *out_logprobs, fm_error *err);

/* fm_decode_step when the room is already reserved (fm_kv_reserve, one token per sequence): the scheduler reserves
 * per request first, so a full pool fails that request only. info[0..n) receives the rows' log-probabilities. */
fm_status fm_decode_run(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs, int32_t *out_ids,
                        fm_sample_info *info, fm_error *err);
/* The host's share of a constrained decode step: fill writes the step's masks into kv->h_mask (row j: sampled row j,
 * read for rows whose sequence is masked) and returns how many rows [0, rows) to copy to the device (0: none). */
typedef struct fm_step_masks {
    int32_t (*fill)(void *user);
    void *user;
} fm_step_masks;
/* fm_decode_run with masks (NULL: no row of the step is constrained, the step is one graph): fill runs after the
 * forward pass is launched, while the device computes it, and the masks are copied after the pass, before the sampler
 * (the step as two graphs); the tokens are those of filling them first. */
fm_status fm_decode_run_masked(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs,
                               const fm_step_masks *masks, int32_t *out_ids, fm_sample_info *info, fm_error *err);
/* The nodes of the graphs a decode step of n sequences replays (its bucket's: the step's, or the pass's and the
 * sampler's), by kind, into *out; false (out zero) where that bucket has none yet (no step of it ran twice) or the
 * backend has no graphs (cpu; route decode.graphs=off). */
bool fm_decode_graph_nodes(const fm_context *ctx, int32_t n, fm_graph_nodes *out);
/* Decode steps replay as graphs on a backend that has them (cuda; route decode.graphs), except under the debug
 * switches FP8MOE_SYNC and FP8MOE_DUMP, which synchronise inside the pass. */
bool fm_decode_graphs_on(const fm_context *ctx);
/* The rows a paged pass of T rows runs (fm_step_run_rows): its row bucket's where it is padded, else T */
int64_t fm_step_rows_padded(const fm_context *ctx, int64_t T);
/* The nodes of the graph that a mixed step of T rows replays (its row bucket's); false: none captured */
bool fm_mixed_graph_nodes(const fm_context *ctx, int64_t T, fm_graph_nodes *out);
/* Appends n tokens of room to an open sequence's cache (the block tables are re-uploaded before the next step when a
 * block was taken); a full pool or the context is an error and changes nothing. */
fm_status fm_kv_reserve(fm_context *ctx, int32_t seq, int64_t n, fm_error *err);

/* Creates the backend and its weight banks for an already bound model (m->cfg set). */
fm_status fm_model_build(fm_model *m, const fm_model_src *src, const fm_options *opt, fm_error *err);

/* The configuration of a synthetic model (its depth and vocabulary before anything is generated). */
fm_status fm_synthetic_config(const char *name, fm_config *out, fm_error *err);
/* fm_options.synthetic_routing: NULL or "uniform" (*zipf_s = 0), or "zipf:S" (0 < S <= 8); FM_ERR_USAGE naming
 * --synthetic-routing otherwise. How the skew is made: synthetic.c. */
fm_status fm_synthetic_routing_parse(const char *text, double *zipf_s, fm_error *err);
/* The frequency with which a token of layer `layer` of synthetic model `name` routes to each expert (freq[E], sum
 * top-k), as the routing option targets it: k/E each for uniform; for zipf:S, k (r + 1)^-S / sum over ranks r (each
 * layer ranks its experts in its own order), capped at 0.45 with the excess spread over the others. */
fm_status fm_synthetic_routing_targets(const char *name, const char *routing, int32_t layer, double *freq,
                                       fm_error *err);

#endif
