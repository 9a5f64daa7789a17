/* Architecture descriptions: what a decoder layer of a model family holds, as data, in one file per family
 * (src/model/qwen3_moe.c, src/model/mixtral.c). The generic code iterates a description instead of restating the
 * layer: binding a checkpoint (model/bind.c), loading and freeing the banks (engine/model.c), the memory plan's
 * weights (engine/memory_plan.c), the prefill cost model (engine/cost.c), synthetic models (engine/synthetic.c),
 * `inspect` (cli/cmd_inspect.c), requantize's linears and ignore list (engine/requantize.c, requantize_dir.c) and
 * the family's own config.json fields (io/config.c). The forward pass
 * (engine/forward.c) is the one place the math is written; it reads a layer's banks by slot.
 *
 * A description is
 *   config        the config.json fields the family reads beyond the shared ones (each required or with its
 *                 default), as two readers that io/config.c calls in turn, and the defaults of two shared fields
 *                 (rms_norm_eps, rope_theta);
 *   layer kinds   which kind each layer is (attention + MoE, attention + dense MLP, ...), from the configuration;
 *   per kind      an ordered list of weight specs. A spec is one bank of the loaded model:
 *     bank        its slot in the layer's bank array (fm_layer_weights.bank[], fm_bank_slot)
 *     family      norm / attention projection / router / expert bank / dense MLP projection: picks the plan's
 *                 format (w_other, w_dense, w_expert) and activations, the memory plan's family, the cost stage
 *                 and inspect's quantization row
 *     fusion      how its parts become one bank: one matrix, q|k|v rows stacked, gate|up for a SwiGLU (a backend
 *                 may interleave those rows)
 *     parts       1 to FM_MAX_PARTS matrices, each {source slot (fm_layer_src.w[] / .ew[], fm_src_slot), shape
 *                 [rows, cols] as functions of the configuration (rows NULL: a 1-D vector [cols]), checkpoint
 *                 name, the role errors name it by, the row inspect prints it under}
 *     when        a predicate on the configuration (NULL: always), e.g. q/k norms only where qk_norm is set
 *     fused_name  an expert bank's name as one 3-D tensor in transformers v5 checkpoints ("gate_up_proj")
 *   MoE block     the checkpoint prefixes of the block, tried in order ("{P}" in router names); an expert part's
 *                 name is its name inside one expert ("gate_proj", Mixtral's "w1"): model/bind.c finds the experts
 *                 in any of the layouts transformers writes (per expert, fused gate_up_proj, 3-D banks).
 * Name patterns: "{L}" the layer index, "{P}" the MoE block prefix found for the layer.
 * Spec order is the order of binding, loading, planning and of the synthetic seeds (so the synthetic models keep
 * their values); expert parts are bound and seeded expert by expert (gate, up, down of expert 0, then 1, ...).
 *
 * Qwen3-Next (src/model/qwen3_next.c) adds the Gated DeltaNet layer kinds, the shared expert and zero-centred norms.
 *
 * A new architecture is a new description (its slots appended to the enums below when it has new weights) and
 * the ops of its new layer kinds in the forward pass (and its entry in arch.c's list, its fm_arch value). What still
 * restates a layer outside the descriptions: the forward pass and its buffers (forward.c; memory_plan.c
 * fm_forward_buffer_list and add_workspace), the activation traffic of cost.c's stages, the KV cache and the Gated
 * DeltaNet states (kv_state.c). */
#ifndef FM_MODEL_ARCH_H
#define FM_MODEL_ARCH_H

#include <stdbool.h>
#include <stdint.h>

#include "io/config.h"

/* Matrices bound from a checkpoint: the slots of fm_layer_src. The first FM_SRC_N_LAYER hold one matrix each
 * (fm_layer_src.w[slot]); the expert slots hold one matrix per expert (fm_layer_src.ew[slot - FM_SRC_N_LAYER]). */
typedef enum fm_src_slot {
    FM_SRC_ATTN_NORM,
    FM_SRC_Q,
    FM_SRC_K,
    FM_SRC_V,
    FM_SRC_O,
    FM_SRC_Q_NORM,
    FM_SRC_K_NORM,
    FM_SRC_FFN_NORM,
    FM_SRC_ROUTER,
    FM_SRC_MLP_GATE,
    FM_SRC_MLP_UP,
    FM_SRC_MLP_DOWN,
    /* Qwen3-Next: the shared expert and its gate, the Gated DeltaNet (linear attention) weights */
    FM_SRC_SHARED_GATE,  /* shared_expert.gate_proj [Is, H] */
    FM_SRC_SHARED_UP,    /* shared_expert.up_proj [Is, H] */
    FM_SRC_SHARED_DOWN,  /* shared_expert.down_proj [H, Is] */
    FM_SRC_SHARED_SCORE, /* shared_expert_gate [1, H]: the sigmoid gate of the shared expert's output */
    FM_SRC_GDN_QKVZ,     /* in_proj_qkvz [2 nk dk + 2 nv dv, H], rows grouped by key head (q, k, v, z of each) */
    FM_SRC_GDN_BA,       /* in_proj_ba [2 nv, H], rows grouped by key head (b, a of each) */
    FM_SRC_GDN_CONV,     /* conv1d [C, 1, K] read as [C, K], C = 2 nk dk + nv dv */
    FM_SRC_GDN_A_LOG,    /* A_log [nv] */
    FM_SRC_GDN_DT_BIAS,  /* dt_bias [nv] */
    FM_SRC_GDN_NORM,     /* norm [dv]: the gated RMSNorm's weight (not zero-centred) */
    FM_SRC_GDN_OUT,      /* out_proj [H, nv dv] */
    FM_SRC_N_LAYER,      /* per-expert slots from here */
    FM_SRC_EXPERT_GATE = FM_SRC_N_LAYER,
    FM_SRC_EXPERT_UP,
    FM_SRC_EXPERT_DOWN,
    FM_SRC_COUNT
} fm_src_slot;

#define FM_SRC_N_EXPERT (FM_SRC_COUNT - FM_SRC_N_LAYER)

/* Banks of a loaded layer: the slots of fm_layer_weights. gate_up and down hold the experts in a MoE layer
 * ([E] matrices) and the dense SwiGLU in a dense one ([1]). */
typedef enum fm_bank_slot {
    FM_BANK_ATTN_NORM,
    FM_BANK_FFN_NORM,
    FM_BANK_QKV,
    FM_BANK_O,
    FM_BANK_Q_NORM,
    FM_BANK_K_NORM,
    FM_BANK_ROUTER,
    FM_BANK_GATE_UP,
    FM_BANK_DOWN,
    FM_BANK_SHARED_GATE_UP, /* [1][2Is, H] gate rows then up rows (Qwen3-Next's shared expert) */
    FM_BANK_SHARED_DOWN,    /* [1][H, Is] */
    FM_BANK_SHARED_SCORE,   /* [1][1, H] */
    FM_BANK_GDN_QKVZ, /* Gated DeltaNet layers: in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias, norm, out_proj */
    FM_BANK_GDN_BA,
    FM_BANK_GDN_CONV,
    FM_BANK_GDN_A_LOG,
    FM_BANK_GDN_DT_BIAS,
    FM_BANK_GDN_NORM,
    FM_BANK_GDN_OUT,
    FM_BANK_COUNT
} fm_bank_slot;

typedef enum fm_wfamily {
    FM_WF_NORM,      /* RMSNorm weights: w_other; not a linear */
    FM_WF_ATTN,      /* attention projections: w_dense, a_dense activations */
    FM_WF_ROUTER,    /* MoE router and the other small matrices kept at w_other (bf16 from a pre-quantized checkpoint):
                        Qwen3-Next's shared_expert_gate, in_proj_ba (the b|a rows) and conv1d */
    FM_WF_EXPERTS,   /* expert banks [E]: w_expert, a_dispatch in, a_expert out */
    FM_WF_DENSE_MLP, /* dense SwiGLU projections: w_dense, a_dense */
    FM_WF_LM_HEAD,   /* the lm_head: w_other, or with the plan's lm_head_dense (--lm-head dense) w_dense and a_dense,
                        quantized at load from a float lm_head */
    FM_WF_COUNT
} fm_wfamily;

typedef enum fm_fusion {
    FM_FUSE_NONE,    /* one part */
    FM_FUSE_ROWS,    /* parts' rows stacked (q | k | v) */
    FM_FUSE_GATE_UP, /* gate rows then up rows feeding a SwiGLU (fm_bank_src.gate_up: a backend may interleave) */
} fm_fusion;

typedef enum fm_layer_kind {
    FM_LAYER_ATTN_MOE, /* attention + routed experts (Qwen3-Next: gated attention, experts + shared expert) */
    FM_LAYER_ATTN_MLP, /* attention + dense SwiGLU */
    FM_LAYER_GDN_MOE,  /* Gated DeltaNet (linear attention) + routed experts and the shared expert (Qwen3-Next) */
    FM_LAYER_GDN_MLP,  /* Gated DeltaNet + dense SwiGLU */
    FM_LAYER_KIND_COUNT
} fm_layer_kind;

/* A dimension of a weight: an expression over the configuration. */
typedef int64_t (*fm_dim_fn)(const fm_config *c);

#define FM_MAX_PARTS 3

typedef struct fm_part_spec {
    fm_src_slot slot;
    fm_dim_fn rows; /* NULL: a vector [cols], 1-D in the checkpoint */
    fm_dim_fn cols;
    const char *name;    /* checkpoint tensor, "{L}" / "{P}"; an expert part: its name inside one expert */
    const char *role;    /* what errors call it: "q_proj", "expert gate" */
    const char *inspect; /* inspect's row of layer 0's shapes ("q_proj"); NULL: not printed */
} fm_part_spec;

typedef struct fm_weight_spec {
    fm_bank_slot bank;
    fm_wfamily family;
    fm_fusion fusion;
    const char *label;                /* load messages ("layer 3 qkv") and the memory plan's */
    const char *fused_name;           /* an expert bank stored whole as one 3-D tensor [E, rows, cols] (transformers
                                         v5: "gate_up_proj", "down_proj"); NULL otherwise */
    bool (*when)(const fm_config *c); /* NULL: always present */
    int32_t n_parts;
    fm_part_spec parts[FM_MAX_PARTS];
} fm_weight_spec;

typedef struct fm_layer_desc {
    const fm_weight_spec *specs;
    int32_t n_specs;
} fm_layer_desc;

/* What config.json means for the architecture: io/config.c reads the fields every family shares (sizes, heads,
 * experts, eps, RoPE, the refusals) and calls these for the family's own, in this order. */
typedef struct fm_arch_config {
    double rms_norm_eps; /* default when config.json has none (the transformers class's) */
    double rope_theta;   /* default when config.json has none */
    int32_t min_experts; /* num_experts below this is refused (0: dense models are valid) */
    /* after the experts: widths, tie_word_embeddings, the router and whether q/k are normed */
    fm_status (*read_fields)(const fm_cfg_reader *r, fm_config *c);
    /* after the shared refusals: the family's own refusals (sliding window), then the layer kinds (layer_is_moe) */
    fm_status (*read_layers)(const fm_cfg_reader *r, fm_config *c);
    /* partial_rotary_factor when config.json has none; 0: the family rotates whole heads and refuses any other */
    double partial_rotary_factor;
} fm_arch_config;

#define FM_MAX_MOE_PREFIXES 3

typedef struct fm_arch_desc {
    fm_arch arch;
    const char *model_type; /* config.json's model_type */
    fm_arch_config config;
    const char *moe_prefixes[FM_MAX_MOE_PREFIXES]; /* "model.layers.{L}.mlp", ...: tried in order; NULL-terminated */
    fm_layer_kind (*layer_kind)(const fm_config *c, int32_t layer);
    fm_layer_desc kinds[FM_LAYER_KIND_COUNT];
    /* zero-centred RMSNorm weights (Qwen3-Next's norms scale by 1 + w): the bank slots (bit 1 << slot) whose
       weights load as 1 + w, and whether the final norm does */
    uint64_t plus_one_banks;
    bool final_norm_plus_one;
    const char *ignored; /* checkpoint tensors the family has and the engine does not run, for inspect (NULL) */
} fm_arch_desc;

/* The description of a configuration's architecture. */
const fm_arch_desc *fm_arch_of(const fm_config *c);
/* The description of a config.json model_type, NULL when none; the supported ones, comma-separated. */
const fm_arch_desc *fm_arch_find(const char *model_type);
const char *fm_arch_supported(void);
const fm_arch_desc *fm_arch_qwen3_moe(void);
const fm_arch_desc *fm_arch_mixtral(void);
const fm_arch_desc *fm_arch_qwen3_next(void);

/* The specs of layer l. */
const fm_layer_desc *fm_arch_layer(const fm_arch_desc *a, const fm_config *c, int32_t layer);
/* Whether a spec is present under c (its predicate). */
static inline bool fm_spec_present(const fm_weight_spec *s, const fm_config *c) { return !s->when || s->when(c); }
/* Matrices in the spec's bank: E for an expert bank, else 1. */
int32_t fm_spec_count(const fm_weight_spec *s, const fm_config *c);
/* The bank's [rows, cols]: the parts' rows stacked (1 for a vector), the parts' cols. */
int64_t fm_spec_rows(const fm_weight_spec *s, const fm_config *c);
int64_t fm_spec_cols(const fm_weight_spec *s, const fm_config *c);
static inline int64_t fm_part_rows(const fm_part_spec *p, const fm_config *c) { return p->rows ? p->rows(c) : 1; }
/* Whether a family's banks are linears (quantizable projections: attention, experts, dense MLP). */
static inline bool fm_wfamily_is_linear(fm_wfamily f) {
    return f == FM_WF_ATTN || f == FM_WF_EXPERTS || f == FM_WF_DENSE_MLP;
}
/* The widest input (K) of the attention and dense MLP projections of the first n_layers layers: what the dense
 * linears' activation scratch is sized for. */
int64_t fm_arch_widest_dense_k(const fm_config *c, int32_t n_layers);

/* Writes pattern with "{L}" -> layer, "{P}" -> prefix (NULL: none) into out; false when it does not fit. */
bool fm_arch_name(char *out, size_t cap, const char *pattern, int32_t layer, const char *prefix);

/* Dimensions common to the descriptions. */
int64_t fm_dim_hidden(const fm_config *c);      /* H */
int64_t fm_dim_head(const fm_config *c);        /* head_dim */
int64_t fm_dim_q(const fm_config *c);           /* n_heads * head_dim */
int64_t fm_dim_kv(const fm_config *c);          /* n_kv_heads * head_dim */
int64_t fm_dim_experts(const fm_config *c);     /* E */
int64_t fm_dim_moe_inter(const fm_config *c);   /* expert width I */
int64_t fm_dim_dense_inter(const fm_config *c); /* dense MLP width */
bool fm_when_qk_norm(const fm_config *c);
/* Whether a layer kind's token mixer is a Gated DeltaNet (no KV cache: a recurrent state per sequence). */
static inline bool fm_layer_kind_is_gdn(fm_layer_kind k) { return k == FM_LAYER_GDN_MOE || k == FM_LAYER_GDN_MLP; }
/* Layers among the first n that attend over a KV cache (the others keep Gated DeltaNet states). */
int32_t fm_arch_attention_layers(const fm_config *c, int32_t n_layers);
/* config.layer_is_moe: the kind of Qwen3-MoE and Mixtral layers */
fm_layer_kind fm_layer_kind_moe_or_mlp(const fm_config *c, int32_t layer);

#endif
