/* Qwen3-Next (transformers Qwen3NextForCausalLM, modeling_qwen3_next.py) as data (model/arch.h). A hybrid: each
 * layer's token mixer is either gated full attention or a Gated DeltaNet (linear attention), per layer_types
 * (default: every full_attention_interval-th layer full attention); the MLP is the routed experts plus a shared
 * expert whose output is scaled by sigmoid(shared_expert_gate x), or a dense SwiGLU (mlp_only_layers, sparse step).
 * Every Qwen3NextRMSNorm (input/post-attention layernorms, q/k norms, the final norm) scales by 1 + w: the weights
 * are zero-centred in the checkpoint and loaded as 1 + w. The Gated DeltaNet's own norm scales by w. Layer l:
 *   model.layers.L.{input,post_attention}_layernorm.weight   [H]
 *   full attention:
 *     model.layers.L.self_attn.q_proj.weight    [2 nh hd, H]: per head hd query rows then hd gate rows
 *     model.layers.L.self_attn.{k,v}_proj.weight [nkv hd, H];  o_proj [H, nh hd];  {q,k}_norm [hd]
 *   linear attention (Gated DeltaNet, r = nv / nk value heads per key head):
 *     model.layers.L.linear_attn.in_proj_qkvz.weight  [2 nk dk + 2 nv dv, H]: per key head q (dk), k (dk),
 *                                                      v (r dv), z (r dv) rows
 *     model.layers.L.linear_attn.in_proj_ba.weight    [2 nv, H]: per key head b (r), a (r) rows
 *     model.layers.L.linear_attn.conv1d.weight        [C, 1, K], C = 2 nk dk + nv dv (channels q | k | v)
 *     model.layers.L.linear_attn.{A_log,dt_bias}      [nv];  norm.weight [dv];  out_proj.weight [H, nv dv]
 *   MoE layers: mlp.gate.weight [E, H]; mlp.experts.E.{gate,up,down}_proj.weight (or the fused layouts);
 *     mlp.shared_expert.{gate,up,down}_proj.weight [Is, H], [Is, H], [H, Is];  mlp.shared_expert_gate.weight [1, H]
 *   dense layers: mlp.{gate,up,down}_proj.weight [Id, H], [Id, H], [H, Id]
 * The multi-token-prediction layers (mtp.*) are not run. */
#include "model/arch.h"
#include "util/status.h"

static int64_t dim_q_gated(const fm_config *c) { return 2 * (int64_t)c->n_heads * c->head_dim; }
static int64_t dim_shared(const fm_config *c) { return c->shared_expert_intermediate; }
static int64_t dim_one(const fm_config *c) { return (void)c, 1; }
static int64_t dim_gdn_key(const fm_config *c) { return (int64_t)c->gdn_k_heads * c->gdn_k_dim; }
static int64_t dim_gdn_value(const fm_config *c) { return (int64_t)c->gdn_v_heads * c->gdn_v_dim; }
static int64_t dim_gdn_qkvz(const fm_config *c) { return 2 * dim_gdn_key(c) + 2 * dim_gdn_value(c); }
static int64_t dim_gdn_ba(const fm_config *c) { return 2 * (int64_t)c->gdn_v_heads; }
static int64_t dim_gdn_conv_channels(const fm_config *c) { return 2 * dim_gdn_key(c) + dim_gdn_value(c); }
static int64_t dim_gdn_kernel(const fm_config *c) { return c->gdn_conv_kernel; }
static int64_t dim_gdn_heads(const fm_config *c) { return c->gdn_v_heads; }
static int64_t dim_gdn_v_dim(const fm_config *c) { return c->gdn_v_dim; }
static bool when_shared(const fm_config *c) { return c->shared_expert_intermediate > 0; }

#define LAYER "model.layers.{L}."

/* a vector [cols] of w_other */
#define VECTOR(bank_, slot_, label_, name_, cols_, inspect_)                                                           \
    {                                                                                                                  \
        .bank = bank_, .family = FM_WF_NORM, .fusion = FM_FUSE_NONE, .label = label_, .n_parts = 1, .parts = {         \
            {slot_, NULL, cols_, name_, label_, inspect_}                                                              \
        }                                                                                                              \
    }

/* one matrix */
#define MATRIX(bank_, family_, slot_, label_, name_, rows_, cols_, when_, inspect_)                                    \
    {                                                                                                                  \
        .bank = bank_, .family = family_, .fusion = FM_FUSE_NONE, .label = label_, .when = when_, .n_parts = 1,        \
        .parts = {                                                                                                     \
            {slot_, rows_, cols_, name_, label_, inspect_}                                                             \
        }                                                                                                              \
    }

#define NORMS                                                                                                          \
    VECTOR(FM_BANK_ATTN_NORM, FM_SRC_ATTN_NORM, "input_layernorm", LAYER "input_layernorm.weight", fm_dim_hidden,      \
           NULL),                                                                                                      \
        VECTOR(FM_BANK_FFN_NORM, FM_SRC_FFN_NORM, "post_attention_layernorm", LAYER "post_attention_layernorm.weight", \
               fm_dim_hidden, NULL)

/* gated full attention: q_proj's rows hold each head's query and gate */
#define FULL_ATTENTION                                                                                                 \
    {.bank = FM_BANK_QKV,                                                                                              \
     .family = FM_WF_ATTN,                                                                                             \
     .fusion = FM_FUSE_ROWS,                                                                                           \
     .label = "qkv",                                                                                                   \
     .n_parts = 3,                                                                                                     \
     .parts = {{FM_SRC_Q, dim_q_gated, fm_dim_hidden, LAYER "self_attn.q_proj.weight", "q_proj",                       \
                "q_proj (query | gate per head)"},                                                                     \
               {FM_SRC_K, fm_dim_kv, fm_dim_hidden, LAYER "self_attn.k_proj.weight", "k_proj", "k_proj"},              \
               {FM_SRC_V, fm_dim_kv, fm_dim_hidden, LAYER "self_attn.v_proj.weight", "v_proj", "v_proj"}}},            \
        MATRIX(FM_BANK_O, FM_WF_ATTN, FM_SRC_O, "o_proj", LAYER "self_attn.o_proj.weight", fm_dim_hidden, fm_dim_q,    \
               NULL, "o_proj"),                                                                                        \
        VECTOR(FM_BANK_Q_NORM, FM_SRC_Q_NORM, "q_norm", LAYER "self_attn.q_norm.weight", fm_dim_head,                  \
               "q_norm / k_norm"),                                                                                     \
        VECTOR(FM_BANK_K_NORM, FM_SRC_K_NORM, "k_norm", LAYER "self_attn.k_norm.weight", fm_dim_head, NULL)

/* the Gated DeltaNet: in_proj_qkvz and out_proj are the dense projections (--dense w8a8 takes them); the b|a rows
   and the conv stay at w_other */
#define GATED_DELTANET                                                                                                 \
    MATRIX(FM_BANK_GDN_QKVZ, FM_WF_ATTN, FM_SRC_GDN_QKVZ, "in_proj_qkvz", LAYER "linear_attn.in_proj_qkvz.weight",     \
           dim_gdn_qkvz, fm_dim_hidden, NULL, "in_proj_qkvz"),                                                         \
        MATRIX(FM_BANK_GDN_BA, FM_WF_ROUTER, FM_SRC_GDN_BA, "in_proj_ba", LAYER "linear_attn.in_proj_ba.weight",       \
               dim_gdn_ba, fm_dim_hidden, NULL, "in_proj_ba"),                                                         \
        MATRIX(FM_BANK_GDN_CONV, FM_WF_ROUTER, FM_SRC_GDN_CONV, "conv1d", LAYER "linear_attn.conv1d.weight",           \
               dim_gdn_conv_channels, dim_gdn_kernel, NULL, "conv1d [C, K]"),                                          \
        VECTOR(FM_BANK_GDN_A_LOG, FM_SRC_GDN_A_LOG, "A_log", LAYER "linear_attn.A_log", dim_gdn_heads,                 \
               "A_log / dt_bias"),                                                                                     \
        VECTOR(FM_BANK_GDN_DT_BIAS, FM_SRC_GDN_DT_BIAS, "dt_bias", LAYER "linear_attn.dt_bias", dim_gdn_heads, NULL),  \
        VECTOR(FM_BANK_GDN_NORM, FM_SRC_GDN_NORM, "linear_attn norm", LAYER "linear_attn.norm.weight", dim_gdn_v_dim,  \
               "linear_attn norm"),                                                                                    \
        MATRIX(FM_BANK_GDN_OUT, FM_WF_ATTN, FM_SRC_GDN_OUT, "out_proj", LAYER "linear_attn.out_proj.weight",           \
               fm_dim_hidden, dim_gdn_value, NULL, "out_proj")

/* the router first (model/bind.c finds the MoE block by it), the experts, the shared expert and its gate */
#define MOE                                                                                                            \
    MATRIX(FM_BANK_ROUTER, FM_WF_ROUTER, FM_SRC_ROUTER, "router", "{P}.gate.weight", fm_dim_experts, fm_dim_hidden,    \
           NULL, "router"),                                                                                            \
        {.bank = FM_BANK_GATE_UP,                                                                                      \
         .family = FM_WF_EXPERTS,                                                                                      \
         .fusion = FM_FUSE_GATE_UP,                                                                                    \
         .label = "experts gate_up",                                                                                   \
         .fused_name = "gate_up_proj",                                                                                 \
         .n_parts = 2,                                                                                                 \
         .parts = {{FM_SRC_EXPERT_GATE, fm_dim_moe_inter, fm_dim_hidden, "gate_proj", "expert gate",                   \
                    "expert gate / up (each)"},                                                                        \
                   {FM_SRC_EXPERT_UP, fm_dim_moe_inter, fm_dim_hidden, "up_proj", "expert up", NULL}}},                \
        {.bank = FM_BANK_DOWN,                                                                                         \
         .family = FM_WF_EXPERTS,                                                                                      \
         .fusion = FM_FUSE_NONE,                                                                                       \
         .label = "experts down",                                                                                      \
         .fused_name = "down_proj",                                                                                    \
         .n_parts = 1,                                                                                                 \
         .parts = {{FM_SRC_EXPERT_DOWN, fm_dim_hidden, fm_dim_moe_inter, "down_proj", "expert down",                   \
                    "expert down (each)"}}},                                                                           \
        {.bank = FM_BANK_SHARED_GATE_UP,                                                                               \
         .family = FM_WF_DENSE_MLP,                                                                                    \
         .fusion = FM_FUSE_GATE_UP,                                                                                    \
         .label = "shared expert gate_up",                                                                             \
         .when = when_shared,                                                                                          \
         .n_parts = 2,                                                                                                 \
         .parts = {{FM_SRC_SHARED_GATE, dim_shared, fm_dim_hidden, "{P}.shared_expert.gate_proj.weight",               \
                    "shared_expert gate_proj", "shared expert gate / up"},                                             \
                   {FM_SRC_SHARED_UP, dim_shared, fm_dim_hidden, "{P}.shared_expert.up_proj.weight",                   \
                    "shared_expert up_proj", NULL}}},                                                                  \
        MATRIX(FM_BANK_SHARED_DOWN, FM_WF_DENSE_MLP, FM_SRC_SHARED_DOWN, "shared expert down",                         \
               "{P}.shared_expert.down_proj.weight", fm_dim_hidden, dim_shared, when_shared, "shared expert down"),    \
        MATRIX(FM_BANK_SHARED_SCORE, FM_WF_ROUTER, FM_SRC_SHARED_SCORE, "shared_expert_gate",                          \
               "{P}.shared_expert_gate.weight", dim_one, fm_dim_hidden, when_shared, "shared_expert_gate")

#define DENSE_MLP                                                                                                      \
    {.bank = FM_BANK_GATE_UP,                                                                                          \
     .family = FM_WF_DENSE_MLP,                                                                                        \
     .fusion = FM_FUSE_GATE_UP,                                                                                        \
     .label = "mlp gate_up",                                                                                           \
     .n_parts = 2,                                                                                                     \
     .parts = {{FM_SRC_MLP_GATE, fm_dim_dense_inter, fm_dim_hidden, LAYER "mlp.gate_proj.weight",                      \
                "dense mlp gate_proj", "mlp gate / up"},                                                               \
               {FM_SRC_MLP_UP, fm_dim_dense_inter, fm_dim_hidden, LAYER "mlp.up_proj.weight", "dense mlp up_proj",     \
                NULL}}},                                                                                               \
        MATRIX(FM_BANK_DOWN, FM_WF_DENSE_MLP, FM_SRC_MLP_DOWN, "mlp down", LAYER "mlp.down_proj.weight",               \
               fm_dim_hidden, fm_dim_dense_inter, NULL, "mlp down")

static const fm_weight_spec attn_moe[] = {NORMS, MOE, FULL_ATTENTION};
static const fm_weight_spec attn_mlp[] = {NORMS, DENSE_MLP, FULL_ATTENTION};
static const fm_weight_spec gdn_moe[] = {NORMS, MOE, GATED_DELTANET};
static const fm_weight_spec gdn_mlp[] = {NORMS, DENSE_MLP, GATED_DELTANET};

/* widths (the class defaults of Qwen3NextConfig where a field is absent), the Gated DeltaNet's heads */
static fm_status read_fields(const fm_cfg_reader *r, fm_config *c) {
    fm_status st;
    const bool experts = c->n_experts > 0;
    if ((st = fm_cfg_read_i32(r, "moe_intermediate_size", experts, 0, 1, FM_MAX_DIM, &c->moe_intermediate)) ||
        (st = fm_cfg_read_i32(r, "intermediate_size", false, 0, 1, FM_MAX_DIM, &c->dense_intermediate)) ||
        (st = fm_cfg_read_i32(r, "shared_expert_intermediate_size", false, 512, 0, FM_MAX_DIM,
                              &c->shared_expert_intermediate)) ||
        (st = fm_cfg_read_bool(r, "norm_topk_prob", true, &c->norm_topk_prob)) ||
        (st = fm_cfg_read_bool(r, "tie_word_embeddings", false, &c->tie_word_embeddings)) ||
        (st = fm_cfg_read_i32(r, "linear_num_key_heads", false, 16, 1, 65536, &c->gdn_k_heads)) ||
        (st = fm_cfg_read_i32(r, "linear_num_value_heads", false, 32, 1, 65536, &c->gdn_v_heads)) ||
        (st = fm_cfg_read_i32(r, "linear_key_head_dim", false, 128, 1, 65536, &c->gdn_k_dim)) ||
        (st = fm_cfg_read_i32(r, "linear_value_head_dim", false, 128, 1, 65536, &c->gdn_v_dim)) ||
        (st = fm_cfg_read_i32(r, "linear_conv_kernel_dim", false, 4, 1, 64, &c->gdn_conv_kernel)))
        return st;
    if (c->gdn_v_heads % c->gdn_k_heads != 0)
        return fm_fail(r->err, FM_ERR_FORMAT,
                       "%s: linear_num_value_heads (%d) is not a multiple of linear_num_key_heads (%d)", r->label,
                       c->gdn_v_heads, c->gdn_k_heads);
    if (!experts) c->shared_expert_intermediate = 0;
    c->qk_norm = true;
    c->attn_output_gate = true;
    c->router = FM_ROUTER_SOFTMAX_TOPK;
    return FM_OK;
}

/* layer_types (or every full_attention_interval-th layer full attention, the rest linear), then the MoE layers as
 * Qwen3-MoE has them (mlp_only_layers, decoder_sparse_step) */
static fm_status read_layers(const fm_cfg_reader *r, fm_config *c) {
    fm_status st;
    if (fm_cfg_has(r, "layer_types")) {
        if ((st = fm_cfg_read_layer_types(r, "layer_types", c->n_layers, "linear_attention", "full_attention",
                                          c->layer_is_gdn)))
            return st;
    } else {
        int32_t every = 4;
        if ((st = fm_cfg_read_i32(r, "full_attention_interval", false, 4, 1, FM_MAX_LAYERS, &every))) return st;
        for (int i = 0; i < c->n_layers; i++) c->layer_is_gdn[i] = (i + 1) % every != 0;
    }
    bool mlp_only[FM_MAX_LAYERS] = {false};
    if ((st = fm_cfg_read_layer_list(r, "mlp_only_layers", c->n_layers, mlp_only)) ||
        (st = fm_cfg_read_i32(r, "decoder_sparse_step", false, 1, 1, FM_MAX_LAYERS, &c->decoder_sparse_step)))
        return st;
    for (int i = 0; i < c->n_layers; i++)
        c->layer_is_moe[i] = !mlp_only[i] && c->n_experts > 0 && (i + 1) % c->decoder_sparse_step == 0;
    return FM_OK;
}

static fm_layer_kind layer_kind(const fm_config *c, int32_t layer) {
    if (c->layer_is_gdn[layer]) return c->layer_is_moe[layer] ? FM_LAYER_GDN_MOE : FM_LAYER_GDN_MLP;
    return c->layer_is_moe[layer] ? FM_LAYER_ATTN_MOE : FM_LAYER_ATTN_MLP;
}

#define KIND(specs)                                                                                                    \
    { specs, sizeof specs / sizeof *specs }

static const fm_arch_desc qwen3_next = {
    .arch = FM_ARCH_QWEN3_NEXT,
    .model_type = "qwen3_next",
    .config = {.rms_norm_eps = 1e-6,
               .rope_theta = 10000.0,
               .min_experts = 0,
               .read_fields = read_fields,
               .read_layers = read_layers,
               .partial_rotary_factor = 0.25},
    .moe_prefixes = {"model.layers.{L}.mlp", NULL, NULL},
    .layer_kind = layer_kind,
    .kinds = {[FM_LAYER_ATTN_MOE] = KIND(attn_moe),
              [FM_LAYER_ATTN_MLP] = KIND(attn_mlp),
              [FM_LAYER_GDN_MOE] = KIND(gdn_moe),
              [FM_LAYER_GDN_MLP] = KIND(gdn_mlp)},
    .plus_one_banks = 1u << FM_BANK_ATTN_NORM | 1u << FM_BANK_FFN_NORM | 1u << FM_BANK_Q_NORM | 1u << FM_BANK_K_NORM,
    .final_norm_plus_one = true,
    .ignored = "mtp.* (the multi-token-prediction layers: not run)",
};

const fm_arch_desc *fm_arch_qwen3_next(void) { return &qwen3_next; }
