/* Where each weight of a model lives in a checkpoint: the weight slots of a decoder layer (model/arch.h), each a
 * view of a 2-D row-major matrix inside a safetensors tensor. Per-architecture descriptions (qwen3_moe.c,
 * mixtral.c) give the slots, shapes and tensor names; bind.c finds them, whatever the expert layout (per-expert
 * tensors or fused 3-D banks), and checks every dtype and shape before anything is read. */
#ifndef FM_MODEL_SRC_H
#define FM_MODEL_SRC_H

#include <stddef.h>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "quant/int4_ckpt.h"

/* Synthetic weights (benchmarks at real shapes without a checkpoint): element i of a view is
 * bias + scale * u(seed, i) with u uniform in [-1, 1) from a counter-based hash, times 8 in every column c with
 * c % outlier_period == 3 (outlier channels; 0 = none). The same function runs on the CPU and the GPU. */
typedef struct fm_synth {
    uint64_t seed;
    float scale, bias;
    int32_t outlier_period;
} fm_synth;

/* A [rows, cols] row-major matrix (cols = 1 row for vectors) starting at element `offset` of tensor t, or,
 * when t is NULL, synthetic values described by synth, or, when q.method is not FM_QUANT_NONE, a whole
 * pre-quantized int4 linear [rows = N, cols = K] (t NULL, offset 0) in the checkpoint's own format. */
typedef struct fm_wsrc {
    const fm_st_tensor *t;
    int64_t offset;
    int64_t rows, cols;
    fm_synth synth;
    fm_qsrc q;
} fm_wsrc;

static inline bool fm_wsrc_is_quantized(const fm_wsrc *w) { return w->q.method != FM_QUANT_NONE; }

/* Decodes the view to fp32 (out has rows * cols elements); a pre-quantized source is dequantized with its
 * format's exact formula. */
fm_status fm_wsrc_read(const fm_wsrc *w, float *out, fm_error *err);

#ifdef __CUDACC__
#define FM_HOST_DEVICE __host__ __device__
#else
#define FM_HOST_DEVICE
#endif

/* The synthetic value of element i (row-major index inside the view) of a view whose row length is cols. */
static inline FM_HOST_DEVICE float fm_synth_value(const fm_synth *s, int64_t i, int64_t cols) {
    uint64_t z = s->seed + (uint64_t)i * 0x9E3779B97F4A7C15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (float)(int32_t)(z >> 40) * (1.0f / 8388608.0f) - 1.0f; /* 24 bits -> [-1, 1) */
    float v = s->bias + s->scale * u;
    if (s->outlier_period && (i % cols) % s->outlier_period == 3) v *= 8.0f;
    return v;
}

typedef enum fm_expert_layout {
    FM_EXPERTS_PER_EXPERT, /* experts.E.{gate,up,down}_proj.weight (or Mixtral w1/w3/w2): published checkpoints */
    FM_EXPERTS_FUSED_V5,   /* experts.gate_up_proj [E, 2I, H] + experts.down_proj [E, H, I]: transformers v5 state */
    FM_EXPERTS_SPLIT_3D,   /* experts.{gate,up,down}_proj(.weight) as 3-D [E, ., .] tensors: third-party fused repos */
} fm_expert_layout;

const char *fm_expert_layout_name(fm_expert_layout l);

/* One layer's matrices, by source slot (model/arch.h): w[slot] for the layer's own, ew[slot - FM_SRC_N_LAYER] for
 * the experts' ([E] each); a slot the layer's description does not have stays zero (rows 0). The named members
 * alias the same storage, for readers of one known layer kind. */
typedef struct fm_layer_src {
    union {
        fm_wsrc w[FM_SRC_N_LAYER];
        struct {
            fm_wsrc attn_norm;        /* [H] */
            fm_wsrc q, k, v;          /* [n_heads*hd, H], [n_kv*hd, H], [n_kv*hd, H] */
            fm_wsrc o;                /* [H, n_heads*hd] */
            fm_wsrc q_norm, k_norm;   /* [hd] (Qwen3 only) */
            fm_wsrc ffn_norm;         /* [H] post_attention_layernorm */
            fm_wsrc router;           /* [E, H] */
            fm_wsrc mlp_gate, mlp_up; /* [Id, H] dense SwiGLU layer */
            fm_wsrc mlp_down;         /* [H, Id] */
        };
    };
    union {
        fm_wsrc *ew[FM_SRC_N_EXPERT];
        struct {
            fm_wsrc *expert_gate; /* [E] of [I, H] */
            fm_wsrc *expert_up;   /* [E] of [I, H] */
            fm_wsrc *expert_down; /* [E] of [H, I] */
        };
    };
    fm_layer_kind kind;
    bool is_moe; /* the kind has routed experts */
    fm_expert_layout layout;
} fm_layer_src;

#ifndef __cplusplus
_Static_assert(offsetof(fm_layer_src, mlp_down) == offsetof(fm_layer_src, w) + FM_SRC_MLP_DOWN * sizeof(fm_wsrc),
               "fm_layer_src: the named members follow fm_src_slot");
_Static_assert(offsetof(fm_layer_src, ffn_norm) == offsetof(fm_layer_src, w) + FM_SRC_FFN_NORM * sizeof(fm_wsrc),
               "fm_layer_src: the named members follow fm_src_slot");
_Static_assert(offsetof(fm_layer_src, expert_down) ==
                   offsetof(fm_layer_src, ew) + (FM_SRC_EXPERT_DOWN - FM_SRC_N_LAYER) * sizeof(fm_wsrc *),
               "fm_layer_src: the named members follow fm_src_slot");
#endif

/* The views of one source slot (count: 1, or E for an expert slot; NULL when an expert slot is not bound). */
static inline fm_wsrc *fm_layer_src_views(fm_layer_src *L, fm_src_slot s) {
    return s < FM_SRC_N_LAYER ? &L->w[s] : L->ew[s - FM_SRC_N_LAYER];
}
static inline const fm_wsrc *fm_layer_src_cviews(const fm_layer_src *L, fm_src_slot s) {
    return s < FM_SRC_N_LAYER ? &L->w[s] : L->ew[s - FM_SRC_N_LAYER];
}

typedef struct fm_model_src {
    fm_config cfg;
    fm_wsrc embed;        /* [vocab, H] */
    fm_wsrc final_norm;   /* [H] */
    fm_wsrc lm_head;      /* [vocab, H]; the embedding when tied */
    fm_layer_src *layers; /* [n_layers] */
    int64_t n_params;     /* elements bound (tied lm_head counted once) */
    int64_t n_unused;     /* tensors in the checkpoint that no slot uses */
} fm_model_src;

fm_status fm_model_src_bind(const fm_config *cfg, const fm_st_set *set, fm_model_src *out, fm_error *err);
void fm_model_src_free(fm_model_src *m);

#endif
