/* What a model loaded for generation holds beside its weights: the paged KV cache on the backend, its block
 * bookkeeping (kv_cache.h), the per-step index buffers a decode step reads from backend memory, and the sampler's
 * per-sequence state. Allocated once at load when fm_options.max_seqs > 0 (sized by the memory plan's
 * generation terms, fm_memory_plan_add_generation), so a decode step allocates nothing and can be replayed as a
 * CUDA graph: every value it reads (ids, positions, slots, block tables, sampling parameters) is in backend memory,
 * written before the step. */
#ifndef FM_ENGINE_KV_STATE_H
#define FM_ENGINE_KV_STATE_H

#include "backend/backend.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "io/config.h"

typedef struct fm_context fm_context;

/* Decode steps run in batch buckets 1, 2, 4, ... 128: a step of B sequences is padded to the next bucket so that one
 * captured CUDA graph per bucket serves every batch (routes: decode.graphs). */
#define FM_DECODE_BUCKETS 8
static inline int32_t fm_decode_bucket(int32_t B) {
    int32_t b = 1;
    while (b < B) b *= 2;
    return b;
}

/* A pass over the paged cache holding prompt chunks (a mixed step) runs padded to its row bucket, so that one CUDA
 * graph per bucket serves every such step (routes: mixed.graphs; engine/step_graphs.c): multiples of 16 rows to 128,
 * of 32 to 256, of 64 to 1024, of 128 to 4096 (a prompt chunk's share of a step is a few hundred tokens; the
 * padding stays under an eighth of the rows above 128). Returns the bucket's index (its rows in *rows), -1 above
 * 4096 rows. */
#define FM_MIXED_BUCKETS 48
static inline int32_t fm_mixed_bucket(int64_t T, int64_t *rows) {
    static const int64_t top[] = {128, 256, 1024, 4096}, step[] = {16, 32, 64, 128};
    int32_t first = 0;
    for (int i = 0; i < 4; i++) {
        const int64_t lo = i ? top[i - 1] : 0;
        if (T <= top[i]) {
            const int64_t k = (T - lo + step[i] - 1) / step[i]; /* 1.. */
            *rows = lo + k * step[i];
            return first + (int32_t)k - 1;
        }
        first += (int32_t)((top[i] - lo) / step[i]);
    }
    return -1;
}

typedef struct fm_kv_state {
    fm_kv_pool pool;
    fm_kv_dtype dtype;   /* the cache's format (fm_options.kv_cache) */
    int64_t row_bytes;   /* one slot's K (or V) of one layer: backend.h fm_kv_row_bytes */
    int64_t layer_bytes; /* one layer's K (or V) cache: n_slots * row_bytes */
    void *k, *v;         /* [attention layers][n_slots][row_bytes]: nkv * hd elements in the activation dtype, or an
                            e4m3 cache's codes and scales (a Gated DeltaNet layer has none:
                            fm_arch_attention_layers counts the others) */
    /* Gated DeltaNet layers (Qwen3-Next), fp32, by sequence slot: the conv's last inputs and the delta rule's
       matrices (backend.h fm_gdn_conv_state_elems, fm_gdn_rec_state_elems per sequence and layer) */
    void *gdn_conv; /* [GDN layers][max_seqs][kernel - 1][C] */
    void *gdn_rec;  /* [GDN layers][max_seqs][nv][dk][dv] */
    /* per step, int32 in backend memory, one entry per token of the step (max_rows): */
    void *tok_seq, *tok_pos, *slots;
    void *tables;      /* int32 [max_seqs][max_blocks], uploaded before a step when they changed */
    void *att_scratch; /* attention_paged's scratch for max_rows tokens over ctx (its counters zeroed at create) */
    int64_t max_rows;  /* tokens of one step at most: max(max_tokens, max_seqs) */
    /* the sampler, by sequence slot */
    void *params;     /* fm_sampling [max_seqs + 1]: the last one is the padding rows' (pad_slot) */
    void *steps;      /* uint64 [max_seqs + 1] */
    void *counts;     /* int32 [max_seqs + 1][vocab] */
    void *seen;       /* uint8 [max_seqs + 1][vocab] */
    void *bias;       /* fm_logit_bias [max_seqs + 1][FM_MAX_LOGIT_BIAS]: each slot's logit_bias */
    void *mask;       /* uint32 [rows][(vocab + 31) / 32]: the allowed ids of each constrained row of a step */
    void *z;          /* float [rows][vocab] scratch, rows = the largest decode bucket */
    void *row_slot;   /* int32 [rows]: the slot of each sampled row */
    void *ids_out;    /* int32 [rows] */
    void *info_out;   /* fm_sample_info [rows] */
    int32_t pad_slot; /* the sampler slot of padding rows (a decode step padded to its graph's bucket) */
    /* a decode step as a captured graph per bucket (NULL until captured): the forward pass and the sampler; a step
       with constrained rows as two, the pass and the sampler, the host filling the step's masks while the first runs
       and uploading them between the two */
    fm_graph *graphs[FM_DECODE_BUCKETS];
    fm_graph *pass_graphs[FM_DECODE_BUCKETS];
    fm_graph *sample_graphs[FM_DECODE_BUCKETS];
    bool warm[FM_DECODE_BUCKETS]; /* the bucket ran once uncaptured (lazy library setup) */
    /* a mixed step's layers as a captured graph per row bucket (fm_mixed_bucket; NULL until captured) */
    fm_graph *mixed_graphs[FM_MIXED_BUCKETS];
    bool mixed_warm[FM_MIXED_BUCKETS]; /* the bucket ran once uncaptured, padded */
    int64_t mixed_graph_steps;         /* passes replayed from a mixed graph (for tests and stats) */
    int64_t mixed_padded_steps;        /* passes run padded to their bucket (replayed or not) */
    bool mixed_graphs_failed;          /* a capture failed: mixed steps run without graphs (step_graphs.c) */
    bool chunks_on_device; /* a padded pass's layers: attention_paged_runs whatever the staged rows (step_graphs.c) */
    /* host mirrors */
    int32_t *h_idx;         /* [3 * max_rows]: tok_seq | tok_pos | slots of the step being staged */
    int32_t *h_step;        /* [4 * rows]: a decode step's ids | sequences | positions | sampler slots */
    int32_t *h_pad;         /* [3 * max_rows]: a padded mixed step's ids | sequences | positions */
    fm_sample_info *h_info; /* [rows]: a decode step's log-probabilities */
    uint32_t *h_mask;       /* [rows][(vocab + 31) / 32]: the masks of a step, filled by the host (backend
                               host_alloc memory: unchanged from its upload until the step's sync) */
    bool tables_dirty;
    struct fm_state_cache *snaps; /* hybrid models with the prefix cache on: the Gated DeltaNet state snapshots
                                     (state_cache.h); NULL otherwise */
    int64_t step_tokens;          /* a scheduler step's token budget (fm_options.max_step_tokens); 0: no mixed steps */
    bool step_latency;            /* the prefill share of a mixed step sized by time (fm_options.step_budget) */
    double step_ratio;            /* then: a step within step_ratio x a decode-only step */
    int32_t step_wait;            /* then: the prompt wait W in steps (0: off; fm_options.prompt_wait_steps) */
} fm_kv_state;

/* The bytes the state takes on a backend whose KV rows (a token's K or V of one layer) are row_bytes (backend.h
 * fm_kv_row_bytes): the KV cache itself (with the Gated DeltaNet layers' conv and recurrent states) and the rest
 * (index buffers, attention scratch, sampler state), for the memory plan; allocates nothing. */
fm_status fm_kv_state_plan(const fm_config *c, int32_t n_layers, size_t row_bytes, int32_t max_seqs, int64_t ctx,
                           int64_t max_rows, size_t *cache, size_t *state, fm_error *err);

/* Allocates the state for max_seqs sequences of the model's n_ctx tokens on its backend (n_ctx must be set: a context
 * to plan for), for steps of up to max_rows tokens. */
fm_status fm_kv_state_create(fm_context *ctx, int32_t max_seqs, int64_t max_rows, fm_kv_state **out, fm_error *err);
void fm_kv_state_free(fm_context *ctx, fm_kv_state *s);

/* Turns the prefix cache (kv_prefix.h) on or off. A hybrid model (Gated DeltaNet layers) needs state snapshots beside
 * it (state_cache.h): `state_slots` of them (0: the cache stays off for it); the line printed on stderr gives their
 * bytes. */
fm_status fm_kv_state_prefix_cache(fm_context *ctx, bool on, int32_t state_slots, fm_error *err);

/* Opens a sequence for a prompt and sampling parameters: a slot, its sampler state reset (the prompt's ids marked
 * as seen for the repetition penalty), its step counter at 0. */
fm_status fm_kv_seq_begin(fm_context *ctx, const int32_t *prompt, int64_t n_prompt, const fm_sampling *sp, int32_t *seq,
                          fm_error *err);
/* Resets an open sequence's sampler state for a new prompt and parameters (what fm_kv_seq_begin does after taking
 * the slot): a kept cache continued by a new request. */
fm_status fm_kv_seq_sampler_reset(fm_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt,
                                  const fm_sampling *sp, fm_error *err);
/* Sets an open sequence's logit bias (n <= FM_MAX_LOGIT_BIAS entries; its fm_sampling.n_bias says how many are
 * read). */
void fm_kv_seq_set_bias(fm_context *ctx, int32_t seq, const fm_logit_bias *bias, int32_t n);
/* Shortens a kept sequence to its first n tokens (fm_kv_seq_truncate) without losing a partly kept named block: the
 * block the cut falls in is copied into a private one first (K and V of every layer, on the backend's stream), so
 * the next tokens are written there and the named block stays as others map it. Returns the tokens kept (fewer, cut
 * back to the block boundary, only when no block is free for the copy). */
int64_t fm_kv_seq_cut(fm_context *ctx, int32_t seq, int64_t n);
/* Ends a sequence: its blocks return to the pool (and the state snapshot slot it owned to the snapshot cache). */
void fm_kv_seq_end(fm_context *ctx, int32_t seq);

#endif
