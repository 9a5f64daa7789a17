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

#define ATTENTION_SPECS                                                                                               \
    {FM_BANK_ATTN_NORM, FM_WF_NORM, FM_FUSE_NONE, "input_layernorm", NULL, NULL, 1,                                         \
     {{FM_SRC_ATTN_NORM, NULL, fm_dim_hidden, "model.layers.{L}.input_layernorm.weight", "input_layernorm", NULL}}}, \
        {FM_BANK_FFN_NORM, FM_WF_NORM, FM_FUSE_NONE, "post_attention_layernorm", NULL, NULL, 1,                            \
         {{FM_SRC_FFN_NORM, NULL, fm_dim_hidden, "model.layers.{L}.post_attention_layernorm.weight",                  \
           "post_attention_layernorm", NULL}}},                                                                       \
        {FM_BANK_QKV, FM_WF_ATTN, FM_FUSE_ROWS, "qkv", NULL, NULL, 3,                                                       \
         {{FM_SRC_Q, fm_dim_q, fm_dim_hidden, "model.layers.{L}.self_attn.q_proj.weight", "q_proj", "q_proj"},        \
          {FM_SRC_K, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.k_proj.weight", "k_proj", "k_proj"},       \
          {FM_SRC_V, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.v_proj.weight", "v_proj", "v_proj"}}},     \
        {FM_BANK_O, FM_WF_ATTN, FM_FUSE_NONE, "o_proj", NULL, NULL, 1,                                                      \
         {{FM_SRC_O, fm_dim_hidden, fm_dim_q, "model.layers.{L}.self_attn.o_proj.weight", "o_proj", "o_proj"}}},      \
        {FM_BANK_Q_NORM, FM_WF_NORM, FM_FUSE_NONE, "q_norm", NULL, fm_when_qk_norm, 1,                                      \
         {{FM_SRC_Q_NORM, NULL, fm_dim_head, "model.layers.{L}.self_attn.q_norm.weight", "q_norm",                   \
           "q_norm / k_norm"}}},                                                                                      \
        {FM_BANK_K_NORM, FM_WF_NORM, FM_FUSE_NONE, "k_norm", NULL, fm_when_qk_norm, 1,                                      \
         {{FM_SRC_K_NORM, NULL, fm_dim_head, "model.layers.{L}.self_attn.k_norm.weight", "k_norm", NULL}}}

static const fm_weight_spec moe_layer[] = {
    ATTENTION_SPECS,
    {FM_BANK_ROUTER, FM_WF_ROUTER, FM_FUSE_NONE, "router", NULL, NULL, 1,
     {{FM_SRC_ROUTER, fm_dim_experts, fm_dim_hidden, "{P}.gate.weight", "router", "router"}}},
    {FM_BANK_GATE_UP, FM_WF_EXPERTS, FM_FUSE_GATE_UP, "experts gate_up", "gate_up_proj", NULL, 2,
     {{FM_SRC_EXPERT_GATE, fm_dim_moe_inter, fm_dim_hidden, "gate_proj", "expert gate", "expert gate / up (each)"},
      {FM_SRC_EXPERT_UP, fm_dim_moe_inter, fm_dim_hidden, "up_proj", "expert up", NULL}}},
    {FM_BANK_DOWN, FM_WF_EXPERTS, FM_FUSE_NONE, "experts down", "down_proj", NULL, 1,
     {{FM_SRC_EXPERT_DOWN, fm_dim_hidden, fm_dim_moe_inter, "down_proj", "expert down", "expert down (each)"}}},
};

static const fm_weight_spec mlp_layer[] = {
    ATTENTION_SPECS,
    {FM_BANK_GATE_UP, FM_WF_DENSE_MLP, FM_FUSE_GATE_UP, "mlp gate_up", NULL, NULL, 2,
     {{FM_SRC_MLP_GATE, fm_dim_dense_inter, fm_dim_hidden, "model.layers.{L}.mlp.gate_proj.weight",
       "dense mlp gate_proj", "mlp gate / up"},
      {FM_SRC_MLP_UP, fm_dim_dense_inter, fm_dim_hidden, "model.layers.{L}.mlp.up_proj.weight", "dense mlp up_proj",
       NULL}}},
    {FM_BANK_DOWN, FM_WF_DENSE_MLP, FM_FUSE_NONE, "mlp down", NULL, NULL, 1,
     {{FM_SRC_MLP_DOWN, fm_dim_hidden, fm_dim_dense_inter, "model.layers.{L}.mlp.down_proj.weight",
       "dense mlp down_proj", "mlp down"}}},
};

static const fm_arch_desc qwen3_moe = {
    .arch = FM_ARCH_QWEN3_MOE,
    .model_type = "qwen3_moe",
    .moe_prefixes = {"model.layers.{L}.mlp", NULL, NULL},
    .layer_kind = fm_layer_kind_moe_or_mlp,
    .kinds = {[FM_LAYER_ATTN_MOE] = {moe_layer, sizeof moe_layer / sizeof *moe_layer},
              [FM_LAYER_ATTN_MLP] = {mlp_layer, sizeof mlp_layer / sizeof *mlp_layer}},
};

const fm_arch_desc *fm_arch_qwen3_moe(void) { return &qwen3_moe; }
