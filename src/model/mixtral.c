/* Mixtral tensor names: published checkpoints use model.layers.L.block_sparse_moe.{gate, experts.E.w1/w3/w2}
 * (w1 = gate, w3 = up, w2 = down); transformers v5 renames the block to .mlp on load, so both prefixes are
 * accepted. No q/k norm; head_dim = hidden / heads. */
#include "model/model_src.h"

static const fm_arch_names mixtral = {
    .moe_prefixes = {"model.layers.%d.block_sparse_moe", "model.layers.%d.mlp", NULL},
    .expert_part = {"w1", "w3", "w2"},
};

const fm_arch_names *fm_mixtral_names(void) { return &mixtral; }
