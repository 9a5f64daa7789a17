/* Qwen3-MoE tensor names (HF modeling_qwen3_moe.py; published per-expert checkpoints):
 *   model.layers.L.mlp.gate.weight                 router [E, H]
 *   model.layers.L.mlp.experts.E.gate_proj.weight  [I, H]   (up_proj the same, down_proj [H, I])
 *   model.layers.L.mlp.{gate,up,down}_proj.weight  dense SwiGLU layers (mlp_only_layers, sparse step)
 * plus q_norm / k_norm [head_dim] in self_attn. */
#include "model/model_src.h"

static const fm_arch_names qwen3_moe = {
    .moe_prefixes = {"model.layers.%d.mlp", NULL, NULL},
    .expert_part = {"gate_proj", "up_proj", "down_proj"},
};

const fm_arch_names *fm_qwen3_moe_names(void) { return &qwen3_moe; }
