/* config.json -> fm_config for the model families fp8moe implements (qwen3_moe, mixtral).
 * Spellings accepted as real files have them: num_experts | num_local_experts; rope_theta |
 * rope_parameters.rope_theta; head_dim absent = hidden_size / num_attention_heads. Anything not
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

typedef enum fm_arch { FM_ARCH_QWEN3_MOE, FM_ARCH_MIXTRAL } fm_arch;

/* How routing probabilities are formed from the router logits of one token. */
typedef enum fm_router_kind {
    FM_ROUTER_SOFTMAX_TOPK, /* Qwen3: softmax over all experts (fp32), top-k, renormalise if norm_topk_prob */
    FM_ROUTER_TOPK_SOFTMAX, /* Mixtral: top-k of the logits, softmax over the k */
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
    int64_t max_position_embeddings;
    int32_t eos_ids[FM_MAX_EOS]; /* eos_token_id: generation_config.json's when present, else config.json's */
    int32_t n_eos;
    bool layer_is_moe[FM_MAX_LAYERS];
    fm_quant_config quant; /* quantization_config: the format of pre-quantized linear weights */
} fm_config;

/* Parses config.json text (len bytes, not necessarily NUL-terminated); label names the file in errors. */
fm_status fm_config_parse(const char *json, uint64_t len, const char *label, fm_config *out, fm_error *err);
/* Reads DIR/config.json (and DIR/quantize_config.json when config.json has no quantization_config). */
fm_status fm_config_load(const char *dir, fm_config *out, fm_error *err);

#endif
