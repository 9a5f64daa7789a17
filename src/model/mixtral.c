/* Mixtral (transformers MixtralForCausalLM) as data (model/arch.h): every layer attention + MoE, no q/k norm,
 * head_dim = hidden / heads. Published checkpoints name the block model.layers.L.block_sparse_moe.{gate,
 * experts.E.w1/w3/w2} (w1 = gate, w3 = up, w2 = down); transformers v5 renames it .mlp on load, so both prefixes
 * are accepted. */
#include "model/arch.h"
#include "util/status.h"

static const fm_weight_spec moe_layer[] = {
    {FM_BANK_ATTN_NORM,
     FM_WF_NORM,
     FM_FUSE_NONE,
     "input_layernorm",
     NULL,
     NULL,
     1,
     {{FM_SRC_ATTN_NORM, NULL, fm_dim_hidden, "model.layers.{L}.input_layernorm.weight", "input_layernorm", NULL}}},
    {FM_BANK_FFN_NORM,
     FM_WF_NORM,
     FM_FUSE_NONE,
     "post_attention_layernorm",
     NULL,
     NULL,
     1,
     {{FM_SRC_FFN_NORM, NULL, fm_dim_hidden, "model.layers.{L}.post_attention_layernorm.weight",
       "post_attention_layernorm", NULL}}},
    {FM_BANK_QKV,
     FM_WF_ATTN,
     FM_FUSE_ROWS,
     "qkv",
     NULL,
     NULL,
     3,
     {{FM_SRC_Q, fm_dim_q, fm_dim_hidden, "model.layers.{L}.self_attn.q_proj.weight", "q_proj", "q_proj"},
      {FM_SRC_K, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.k_proj.weight", "k_proj", "k_proj"},
      {FM_SRC_V, fm_dim_kv, fm_dim_hidden, "model.layers.{L}.self_attn.v_proj.weight", "v_proj", "v_proj"}}},
    {FM_BANK_O,
     FM_WF_ATTN,
     FM_FUSE_NONE,
     "o_proj",
     NULL,
     NULL,
     1,
     {{FM_SRC_O, fm_dim_hidden, fm_dim_q, "model.layers.{L}.self_attn.o_proj.weight", "o_proj", "o_proj"}}},
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
     {{FM_SRC_EXPERT_GATE, fm_dim_moe_inter, fm_dim_hidden, "w1", "expert gate", "expert gate / up (each)"},
      {FM_SRC_EXPERT_UP, fm_dim_moe_inter, fm_dim_hidden, "w3", "expert up", NULL}}},
    {FM_BANK_DOWN,
     FM_WF_EXPERTS,
     FM_FUSE_NONE,
     "experts down",
     "down_proj",
     NULL,
     1,
     {{FM_SRC_EXPERT_DOWN, fm_dim_hidden, fm_dim_moe_inter, "w2", "expert down", "expert down (each)"}}},
};

/* intermediate_size is the experts' width; routing is top-k of the logits, then a softmax over the k (always
 * normalised) */
static fm_status read_fields(const fm_cfg_reader *r, fm_config *c) {
    fm_status st;
    if ((st = fm_cfg_read_i32(r, "intermediate_size", true, 0, 1, FM_MAX_DIM, &c->moe_intermediate)) ||
        (st = fm_cfg_read_bool(r, "tie_word_embeddings", false, &c->tie_word_embeddings)))
        return st;
    c->dense_intermediate = c->moe_intermediate;
    c->norm_topk_prob = true;
    c->qk_norm = false;
    c->router = FM_ROUTER_TOPK_SOFTMAX;
    c->decoder_sparse_step = 1;
    return FM_OK;
}

/* sliding_window set at all is refused; every layer is MoE */
static fm_status read_layers(const fm_cfg_reader *r, fm_config *c) {
    bool present = false;
    double w = 0;
    fm_status st = fm_cfg_read_number(r, "sliding_window", &present, &w);
    if (st) return st;
    if (present)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: sliding_window = %g: sliding-window attention is not implemented", r->label, w);
    for (int i = 0; i < c->n_layers; i++) c->layer_is_moe[i] = true;
    return FM_OK;
}

static const fm_arch_desc mixtral = {
    .arch = FM_ARCH_MIXTRAL,
    .model_type = "mixtral",
    .config = {1e-5, 1e6, 1, read_fields, read_layers},
    .moe_prefixes = {"model.layers.{L}.block_sparse_moe", "model.layers.{L}.mlp", NULL},
    .layer_kind = fm_layer_kind_moe_or_mlp,
    .kinds = {[FM_LAYER_ATTN_MOE] = {moe_layer, sizeof moe_layer / sizeof *moe_layer}},
};

const fm_arch_desc *fm_arch_mixtral(void) { return &mixtral; }
