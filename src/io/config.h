/* config.json -> fm_config for the model families fp8moe implements (qwen3_moe, mixtral: model/arch.h lists them, and
 * each family's description reads its own fields through fm_cfg_reader).
 * Spellings accepted as real files have them: num_experts | num_local_experts; rope_theta |
 * rope_parameters.rope_theta; partial_rotary_factor | rope_parameters.partial_rotary_factor (qwen3_next only: other
 * families rotate whole heads); head_dim absent = hidden_size / num_attention_heads. Anything not
 * implemented (another model_type, rope scaling other than default, sliding-window attention turned on,
 * attention bias, an activation other than silu) is an FM_ERR_UNSUPPORTED naming the field.
 * quantization_config (pre-quantized int4 checkpoints) is read by io/quant_config.c into cfg.quant; without one,
 * fm_config_load reads an AutoGPTQ quantize_config.json beside config.json as GPTQ. */
#ifndef FM_IO_CONFIG_H
#define FM_IO_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"
#include "io/quant_config.h"

#define FM_MAX_LAYERS 1024
#define FM_MAX_DIM (1 << 24) /* sanity cap on any width or count read from a config */

typedef enum fm_arch { FM_ARCH_QWEN3_MOE, FM_ARCH_MIXTRAL, FM_ARCH_QWEN3_NEXT } fm_arch;

/* How routing probabilities are formed from the router logits of one token. */
typedef enum fm_router_kind {
    FM_ROUTER_SOFTMAX_TOPK, /* Qwen3: softmax over all experts (fp32), top-k, renormalise if norm_topk_prob */
    FM_ROUTER_TOPK_SOFTMAX, /* Mixtral: top-k of the logits, softmax over the k */
    /* Qwen3-Next with its shared expert as the bank's last expert (fm_config.shared_in_bank): of E logits, the
       first E - 1 as FM_ROUTER_SOFTMAX_TOPK with top-(k - 1), then the pair (E - 1, sigmoid(logit E - 1)) */
    FM_ROUTER_SOFTMAX_TOPK_SHARED,
} fm_router_kind;

#define FM_MAX_EOS 8 /* end-of-sequence ids a config may list */

typedef struct fm_config {
    fm_arch arch;
    char model_type[32];
    int32_t vocab_size;
    int32_t hidden_size; /* residual width H */
    int32_t n_layers;
    int32_t n_heads;            /* query heads */
    int32_t n_kv_heads;         /* key/value heads (GQA) */
    int32_t head_dim;           /* explicit in Qwen3 (q_proj out = n_heads * head_dim may differ from H) */
    int32_t n_experts;          /* routed experts E */
    int32_t n_experts_per_tok;  /* top-k */
    int32_t moe_intermediate;   /* expert FFN width I */
    int32_t dense_intermediate; /* width of dense SwiGLU layers (mlp_only_layers, sparse step) */
    int32_t decoder_sparse_step;
    bool norm_topk_prob;      /* renormalise the k selected probabilities (Mixtral: always) */
    bool tie_word_embeddings; /* lm_head = embed_tokens, no lm_head tensor */
    bool qk_norm;             /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    fm_router_kind router;
    float rms_norm_eps;
    double rope_theta;
    int32_t rotary_dim; /* leading dims of each head that RoPE rotates: head_dim * partial_rotary_factor (even) */
    /* Qwen3-Next */
    bool attn_output_gate;              /* q_proj yields [query | gate] per head; attention out * sigmoid(gate) */
    int32_t shared_expert_intermediate; /* width of the shared expert of MoE layers (0: none) */
    /* the shared expert routed as one more expert (route moe.shared, engine/shared_routing.h): set at load in the
       model's copy, which then counts it in n_experts and n_experts_per_tok, routes with
       FM_ROUTER_SOFTMAX_TOPK_SHARED and has shared_expert_intermediate 0 (no bank of its own) */
    bool shared_in_bank;
    int32_t gdn_k_heads, gdn_v_heads; /* Gated DeltaNet layers: key and value heads (linear_num_*_heads) */
    int32_t gdn_k_dim, gdn_v_dim;     /* linear_key_head_dim, linear_value_head_dim */
    int32_t gdn_conv_kernel;          /* linear_conv_kernel_dim */
    bool layer_is_gdn[FM_MAX_LAYERS]; /* layer_types[i] == "linear_attention" */
    int64_t max_position_embeddings;
    int32_t eos_ids[FM_MAX_EOS]; /* eos_token_id: generation_config.json's when present, else config.json's */
    int32_t n_eos;
    bool layer_is_moe[FM_MAX_LAYERS];
    fm_quant_config quant; /* quantization_config: the format of pre-quantized linear weights */
} fm_config;

/* config.json as the architecture descriptions read their own fields (model/arch.h fm_arch_config): the object
 * and the file's label for messages. The readers fail with a message naming the file and the field. */
struct cJSON;
typedef struct fm_cfg_reader {
    const struct cJSON *root;
    const char *label;
    fm_error *err;
} fm_cfg_reader;

/* Whether key is present and not null. */
bool fm_cfg_has(const fm_cfg_reader *r, const char *key);
/* An integer in [lo, hi]; absent: *out = dflt, or an error when required. */
fm_status fm_cfg_read_i32(const fm_cfg_reader *r, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                          int32_t *out);
/* true or false; absent: dflt. */
fm_status fm_cfg_read_bool(const fm_cfg_reader *r, const char *key, bool dflt, bool *out);
/* A finite number when present (*present says whether it is). */
fm_status fm_cfg_read_number(const fm_cfg_reader *r, const char *key, bool *present, double *out);
/* An optional list of layer indices in [0, n_layers): marked[i] set for each. */
fm_status fm_cfg_read_layer_list(const fm_cfg_reader *r, const char *key, int32_t n_layers, bool *marked);

/* A list of n_layers strings, each `marked_value` (marked[i] set) or `other_value`; anything else is refused. */
fm_status fm_cfg_read_layer_types(const fm_cfg_reader *r, const char *key, int32_t n_layers, const char *marked_value,
                                  const char *other_value, bool *marked);

/* Parses config.json text (len bytes, not necessarily NUL-terminated); label names the file in errors. */
fm_status fm_config_parse(const char *json, uint64_t len, const char *label, fm_config *out, fm_error *err);
/* Reads DIR/config.json (and DIR/quantize_config.json when config.json has no quantization_config). */
fm_status fm_config_load(const char *dir, fm_config *out, fm_error *err);

#endif
