/* Qwen3-MoE (transformers Qwen3MoeForCausalLM, modeling_qwen3_moe.py) as data (model/arch.h). Layer l:
 *   model.layers.L.input_layernorm.weight            [H]
 *   model.layers.L.post_attention_layernorm.weight   [H]
 *   model.layers.L.self_attn.{q,k,v,o}_proj.weight   [nh hd, H], [nkv hd, H] (k, v), [H, nh hd]
 *   model.layers.L.self_attn.{q,k}_norm.weight       [hd] per-head RMSNorm before RoPE
 *   MoE layers (not in mlp_only_layers, every decoder_sparse_step-th):
 *     model.layers.L.mlp.gate.weight                 router [E, H]
 *     model.layers.L.mlp.experts.E.gate_proj.weight  [I, H]   (up_proj the same, down_proj [H, I]; or the fused
 *                                                    layouts model/bind.c finds)
 *   dense layers: model.layers.L.mlp.{gate,up,down}_proj.weight  [Id, H], [Id, H], [H, Id] */
#include "model/arch.h"
#include "util/status.h"

/* the two norms and the attention of every layer */
#define NORM(bank, slot, label, name, when, inspect)                                                                   \
    {                                                                                                                  \
        bank, FM_WF_NORM, FM_FUSE_NONE, label, NULL, when, 1, {                                                        \
            { slot, NULL, fm_dim_hidden, name, label, inspect }                                                        \
        }                                                                                                              \
    }
#define ATTENTION_SPECS                                                                                                \
    NORM(FM_BANK_ATTN_NORM, FM_SRC_ATTN_NORM, "input_layernorm", "model.layers.{L}.input_layernorm.weight", NULL,      \
         NULL),                                                                                                        \
        NORM(FM_BANK_FFN_NORM, FM_SRC_FFN_NORM, "post_attention_layernorm",                                            \
             "model.layers.{L}.post_attention_layernorm.weight", NULL, NULL),                                          \
        {FM_BANK_QKV,                                                                                                  \
         FM_WF_ATTN,                                                                                                   \
         FM_FUSE_ROWS,                                                                                                 \
         "qkv",                                                                                                        \
         NULL,                                                                                                         \
         NULL,                                                                                                         \
         3,                                                                                                            \
         {{FM_SRC_Q, fm_dim_q, fm_dim_hidden, "model.layers.{L}.self_attn.q_proj.weight", "q_proj", "q_proj"},         \
          {FM_SRC_K, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.k_proj.weight", "k_proj", "k_proj"},        \
          {FM_SRC_V, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.v_proj.weight", "v_proj", "v_proj"}}},      \
        {FM_BANK_O,                                                                                                    \
         FM_WF_ATTN,                                                                                                   \
         FM_FUSE_NONE,                                                                                                 \
         "o_proj",                                                                                                     \
         NULL,                                                                                                         \
         NULL,                                                                                                         \
         1,                                                                                                            \
         {{FM_SRC_O, fm_dim_hidden, fm_dim_q, "model.layers.{L}.self_attn.o_proj.weight", "o_proj", "o_proj"}}},       \
        {FM_BANK_Q_NORM,                                                                                               \
         FM_WF_NORM,                                                                                                   \
         FM_FUSE_NONE,                                                                                                 \
         "q_norm",                                                                                                     \
         NULL,                                                                                                         \
         fm_when_qk_norm,                                                                                              \
         1,                                                                                                            \
         {{FM_SRC_Q_NORM, NULL, fm_dim_head, "model.layers.{L}.self_attn.q_norm.weight", "q_norm",                     \
           "q_norm / k_norm"}}},                                                                                       \
    {                                                                                                                  \
        FM_BANK_K_NORM, FM_WF_NORM, FM_FUSE_NONE, "k_norm", NULL, fm_when_qk_norm, 1, {                                \
            { FM_SRC_K_NORM, NULL, fm_dim_head, "model.layers.{L}.self_attn.k_norm.weight", "k_norm", NULL }           \
        }                                                                                                              \
    }

static const fm_weight_spec moe_layer[] = {
    ATTENTION_SPECS,
    {FM_BANK_ROUTER,
     FM_WF_ROUTER,
     FM_FUSE_NONE,
     "router",
     NULL,
     NULL,
     1,
     {{FM_SRC_ROUTER, fm_dim_experts, fm_dim_hidden, "{P}.gate.weight", "router", "router"}}},
    {FM_BANK_GATE_UP,
     FM_WF_EXPERTS,
     FM_FUSE_GATE_UP,
     "experts gate_up",
     "gate_up_proj",
     NULL,
     2,
     {{FM_SRC_EXPERT_GATE, fm_dim_moe_inter, fm_dim_hidden, "gate_proj", "expert gate", "expert gate / up (each)"},
      {FM_SRC_EXPERT_UP, fm_dim_moe_inter, fm_dim_hidden, "up_proj", "expert up", NULL}}},
    {FM_BANK_DOWN,
     FM_WF_EXPERTS,
     FM_FUSE_NONE,
     "experts down",
     "down_proj",
     NULL,
     1,
     {{FM_SRC_EXPERT_DOWN, fm_dim_hidden, fm_dim_moe_inter, "down_proj", "expert down", "expert down (each)"}}},
};

static const fm_weight_spec mlp_layer[] = {
    ATTENTION_SPECS,
    {FM_BANK_GATE_UP,
     FM_WF_DENSE_MLP,
     FM_FUSE_GATE_UP,
     "mlp gate_up",
     NULL,
     NULL,
     2,
     {{FM_SRC_MLP_GATE, fm_dim_dense_inter, fm_dim_hidden, "model.layers.{L}.mlp.gate_proj.weight",
       "dense mlp gate_proj", "mlp gate / up"},
      {FM_SRC_MLP_UP, fm_dim_dense_inter, fm_dim_hidden, "model.layers.{L}.mlp.up_proj.weight", "dense mlp up_proj",
       NULL}}},
    {FM_BANK_DOWN,
     FM_WF_DENSE_MLP,
     FM_FUSE_NONE,
     "mlp down",
     NULL,
     NULL,
     1,
     {{FM_SRC_MLP_DOWN, fm_dim_hidden, fm_dim_dense_inter, "model.layers.{L}.mlp.down_proj.weight",
       "dense mlp down_proj", "mlp down"}}},
};

/* moe_intermediate_size (required with experts), intermediate_size (dense layers), norm_topk_prob */
static fm_status read_fields(const fm_cfg_reader *r, fm_config *c) {
    fm_status st;
    const bool experts = c->n_experts > 0;
    if ((st = fm_cfg_read_i32(r, "moe_intermediate_size", experts, 0, 1, FM_MAX_DIM, &c->moe_intermediate)) ||
        (st = fm_cfg_read_i32(r, "intermediate_size", false, 0, 1, FM_MAX_DIM, &c->dense_intermediate)) ||
        (st = fm_cfg_read_bool(r, "norm_topk_prob", false, &c->norm_topk_prob)) ||
        (st = fm_cfg_read_bool(r, "tie_word_embeddings", false, &c->tie_word_embeddings)))
        return st;
    c->qk_norm = true;
    c->router = FM_ROUTER_SOFTMAX_TOPK;
    return FM_OK;
}

/* use_sliding_window (transformers forces sliding_window to None unless it is true); a layer is MoE unless it is
 * in mlp_only_layers, and then every decoder_sparse_step-th */
static fm_status read_layers(const fm_cfg_reader *r, fm_config *c) {
    fm_status st;
    bool b = false;
    if ((st = fm_cfg_read_bool(r, "use_sliding_window", false, &b))) return st;
    if (b) return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: use_sliding_window = true is not implemented", r->label);
    bool mlp_only[FM_MAX_LAYERS] = {false};
    if ((st = fm_cfg_read_layer_list(r, "mlp_only_layers", c->n_layers, mlp_only)) ||
        (st = fm_cfg_read_i32(r, "decoder_sparse_step", false, 1, 1, FM_MAX_LAYERS, &c->decoder_sparse_step)))
        return st;
    for (int i = 0; i < c->n_layers; i++)
        c->layer_is_moe[i] = !mlp_only[i] && c->n_experts > 0 && (i + 1) % c->decoder_sparse_step == 0;
    return FM_OK;
}

static const fm_arch_desc qwen3_moe = {
    .arch = FM_ARCH_QWEN3_MOE,
    .model_type = "qwen3_moe",
    .config = {1e-6, 10000.0, 0, read_fields, read_layers},
    .moe_prefixes = {"model.layers.{L}.mlp", NULL, NULL},
    .layer_kind = fm_layer_kind_moe_or_mlp,
    .kinds = {[FM_LAYER_ATTN_MOE] = {moe_layer, sizeof moe_layer / sizeof *moe_layer},
              [FM_LAYER_ATTN_MLP] = {mlp_layer, sizeof mlp_layer / sizeof *mlp_layer}},
};

const fm_arch_desc *fm_arch_qwen3_moe(void) { return &qwen3_moe; }
