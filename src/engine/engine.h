/* The engine's view of a loaded model: configuration, plan, backend and the weight banks per layer. */
#ifndef FM_ENGINE_H
#define FM_ENGINE_H

#include "backend/backend.h"

typedef struct fm_layer_weights {
    fm_bank *attn_norm, *ffn_norm; /* [H] */
    fm_bank *qkv;                  /* [(nh + 2 nkv) hd, H]: q | k | v rows */
    fm_bank *o;                    /* [H, nh hd] */
    fm_bank *q_norm, *k_norm;      /* [hd] (Qwen3) or NULL */
    bool     is_moe;
    fm_bank *router;               /* [E, H] */
    fm_bank *gate_up;              /* MoE: [E][2I, H]; dense: [1][2Id, H] (gate rows, then up rows) */
    fm_bank *down;                 /* MoE: [E][H, I]; dense: [1][H, Id] */
} fm_layer_weights;

struct fm_model {
    fm_config         cfg;
    fm_plan           plan;
    fm_backend       *be;
    int32_t           n_layers;   /* layers loaded and run (--layers) */
    fm_bank          *embed, *final_norm, *lm_head; /* lm_head may be embed (tied) */
    fm_layer_weights *layers;
    fm_expert_layout  expert_layout;
    int64_t           n_params;
    size_t            weight_bytes; /* held by the backend */
};

/* Runs the forward pass over ids (positions 0..T-1) and writes logits [T, vocab]. */
fm_status fm_forward(fm_model *m, const int32_t *ids, int64_t T, float *logits, fm_error *err);

#endif
