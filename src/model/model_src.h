/* Where each weight of a model lives in a checkpoint: the canonical weight slots of a MoE decoder, each a
 * view of a 2-D row-major matrix inside a safetensors tensor. Per-architecture files (qwen3_moe.c,
 * mixtral.c) give the tensor names; bind.c finds them, whatever the expert layout (per-expert tensors or
 * fused 3-D banks), and checks every dtype and shape before anything is read. */
#ifndef FM_MODEL_SRC_H
#define FM_MODEL_SRC_H

#include "io/config.h"
#include "io/safetensors.h"

/* A [rows, cols] row-major matrix (cols = 1 row for vectors) starting at element `offset` of tensor t. */
typedef struct fm_wsrc {
    const fm_st_tensor *t;
    int64_t             offset;
    int64_t             rows, cols;
} fm_wsrc;

/* Decodes the view to fp32 (out has rows * cols elements). */
fm_status fm_wsrc_read(const fm_wsrc *w, float *out, fm_error *err);

typedef enum fm_expert_layout {
    FM_EXPERTS_PER_EXPERT, /* experts.E.{gate,up,down}_proj.weight (or Mixtral w1/w3/w2): published checkpoints */
    FM_EXPERTS_FUSED_V5,   /* experts.gate_up_proj [E, 2I, H] + experts.down_proj [E, H, I]: transformers v5 state */
    FM_EXPERTS_SPLIT_3D,   /* experts.{gate,up,down}_proj(.weight) as 3-D [E, ., .] tensors: third-party fused repos */
} fm_expert_layout;

const char *fm_expert_layout_name(fm_expert_layout l);

typedef struct fm_layer_src {
    fm_wsrc attn_norm;  /* [H] */
    fm_wsrc q, k, v;    /* [n_heads*hd, H], [n_kv*hd, H], [n_kv*hd, H] */
    fm_wsrc o;          /* [H, n_heads*hd] */
    fm_wsrc q_norm, k_norm; /* [hd] (Qwen3 only) */
    fm_wsrc ffn_norm;   /* [H] post_attention_layernorm */
    bool    is_moe;
    /* MoE layer */
    fm_expert_layout layout;
    fm_wsrc          router;       /* [E, H] */
    fm_wsrc         *expert_gate;  /* [E] of [I, H] */
    fm_wsrc         *expert_up;    /* [E] of [I, H] */
    fm_wsrc         *expert_down;  /* [E] of [H, I] */
    /* dense SwiGLU layer */
    fm_wsrc mlp_gate, mlp_up; /* [Id, H] */
    fm_wsrc mlp_down;         /* [H, Id] */
} fm_layer_src;

typedef struct fm_model_src {
    fm_config     cfg;
    fm_wsrc       embed;      /* [vocab, H] */
    fm_wsrc       final_norm; /* [H] */
    fm_wsrc       lm_head;    /* [vocab, H]; the embedding when tied */
    fm_layer_src *layers;     /* [n_layers] */
    int64_t       n_params;   /* elements bound (tied lm_head counted once) */
    int64_t       n_unused;   /* tensors in the checkpoint that no slot uses */
} fm_model_src;

/* Tensor names of one architecture. Format strings take the layer index, then the expert index. */
typedef struct fm_arch_names {
    const char *moe_prefixes[3];  /* "model.layers.%d.mlp", ... tried in order; NULL-terminated */
    const char *expert_part[3];   /* per-expert names of gate, up, down ("gate_proj"... / "w1","w3","w2") */
} fm_arch_names;

const fm_arch_names *fm_qwen3_moe_names(void);
const fm_arch_names *fm_mixtral_names(void);

fm_status fm_model_src_bind(const fm_config *cfg, const fm_st_set *set, fm_model_src *out, fm_error *err);
void      fm_model_src_free(fm_model_src *m);

#endif
