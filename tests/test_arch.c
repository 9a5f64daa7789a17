/* The architecture descriptions (src/model/arch.h): every description is well formed (what the generic code that
 * iterates them assumes), the lookups, the name patterns, and the shapes a description gives at Qwen3-30B-A3B's and
 * Mixtral-8x7B's configurations. A new description is checked here by adding it to the list. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "model/arch.h"
#include "model/model_src.h"
#include "qwen3_config.h"

static const fm_arch_desc *all(int i) {
    const fm_arch_desc *(*const list[])(void) = {fm_arch_qwen3_moe, fm_arch_mixtral, fm_arch_qwen3_next};
    return i < (int)(sizeof list / sizeof *list) ? list[i]() : NULL;
}

/* Every kind: bank slots used once, source slots used once, parts of one bank as wide as each other, expert parts
 * exactly in expert banks, a fusion that matches the parts, names with a layer (or the MoE prefix) in them. */
static void descriptions_are_well_formed(void **s) {
    (void)s;
    fm_config c;
    qwen3_30b_config(&c);
    for (int i = 0; all(i); i++) {
        const fm_arch_desc *a = all(i);
        assert_non_null(a->config.read_fields);
        assert_non_null(a->config.read_layers);
        assert_non_null(a->layer_kind);
        assert_non_null(a->moe_prefixes[0]);
        int n_kinds = 0;
        for (int k = 0; k < FM_LAYER_KIND_COUNT; k++) {
            const fm_layer_desc *d = &a->kinds[k];
            n_kinds += d->n_specs > 0;
            bool bank_used[FM_BANK_COUNT] = {false}, src_used[FM_SRC_COUNT] = {false};
            for (int32_t j = 0; j < d->n_specs; j++) {
                const fm_weight_spec *w = &d->specs[j];
                assert_true(w->bank >= 0 && w->bank < FM_BANK_COUNT);
                assert_false(bank_used[w->bank]);
                bank_used[w->bank] = true;
                assert_true(w->n_parts >= 1 && w->n_parts <= FM_MAX_PARTS);
                assert_int_equal(w->fusion == FM_FUSE_NONE, w->n_parts == 1);
                if (w->fusion == FM_FUSE_GATE_UP) assert_int_equal(w->n_parts, 2);
                assert_non_null(w->label);
                assert_int_equal(w->fused_name != NULL, w->family == FM_WF_EXPERTS);
                for (int32_t p = 0; p < w->n_parts; p++) {
                    const fm_part_spec *q = &w->parts[p];
                    assert_true(q->slot >= 0 && q->slot < FM_SRC_COUNT);
                    assert_false(src_used[q->slot]);
                    src_used[q->slot] = true;
                    assert_int_equal(q->slot >= FM_SRC_N_LAYER, w->family == FM_WF_EXPERTS);
                    assert_int_equal(q->rows == NULL, w->family == FM_WF_NORM);
                    assert_non_null(q->cols);
                    assert_int_equal(q->cols(&c), w->parts[0].cols(&c));
                    assert_non_null(q->name);
                    assert_non_null(q->role);
                    if (w->family != FM_WF_EXPERTS)
                        assert_true(strstr(q->name, "{L}") != NULL || strstr(q->name, "{P}") != NULL);
                }
            }
        }
        assert_true(n_kinds >= 1);
    }
}

static void model_types_are_found(void **s) {
    (void)s;
    assert_ptr_equal(fm_arch_find("qwen3_moe"), fm_arch_qwen3_moe());
    assert_ptr_equal(fm_arch_find("mixtral"), fm_arch_mixtral());
    assert_null(fm_arch_find("llama"));
    assert_ptr_equal(fm_arch_find("qwen3_next"), fm_arch_qwen3_next());
    assert_string_equal(fm_arch_supported(), "qwen3_moe, mixtral, qwen3_next");
    fm_config c = {0};
    c.arch = FM_ARCH_MIXTRAL;
    assert_ptr_equal(fm_arch_of(&c), fm_arch_mixtral());
    c.arch = FM_ARCH_QWEN3_MOE;
    assert_ptr_equal(fm_arch_of(&c), fm_arch_qwen3_moe());
    c.arch = FM_ARCH_QWEN3_NEXT;
    assert_ptr_equal(fm_arch_of(&c), fm_arch_qwen3_next());
}

/* Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (the fields fp8moe reads; no layer_types: every 4th layer is full
 * attention): the four layer kinds' banks and shapes, the attention layers, the rotary dims */
static const char QWEN3_NEXT_80B[] =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"hidden_size\": 2048,"
    " \"num_hidden_layers\": 48, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256,"
    " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512,"
    " \"shared_expert_intermediate_size\": 512, \"intermediate_size\": 5120, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [], \"norm_topk_prob\": true, \"vocab_size\": 151936, \"tie_word_embeddings\": false,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, \"hidden_act\": \"silu\","
    " \"max_position_embeddings\": 262144, \"attention_bias\": false, \"full_attention_interval\": 4,"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 16,"
    " \"linear_num_value_heads\": 32, \"linear_value_head_dim\": 128}";

static void qwen3_next_shapes(void **s) {
    (void)s;
    fm_config c;
    fm_error err = {{0}};
    if (fm_config_parse(QWEN3_NEXT_80B, sizeof QWEN3_NEXT_80B - 1, "qwen3-next config", &c, &err))
        fail_msg("%s", err.msg);
    const fm_arch_desc *a = fm_arch_of(&c);
    assert_ptr_equal(a, fm_arch_qwen3_next());
    assert_int_equal(a->layer_kind(&c, 0), FM_LAYER_GDN_MOE);
    assert_int_equal(a->layer_kind(&c, 3), FM_LAYER_ATTN_MOE);
    assert_int_equal(fm_arch_attention_layers(&c, 48), 12);
    assert_int_equal(c.rotary_dim, 64);
    assert_true(c.attn_output_gate);
    int64_t got[2][FM_BANK_COUNT][3] = {{{0}}}; /* layer 0 (GDN), layer 3 (attention): n, rows, cols */
    for (int k = 0; k < 2; k++) {
        const fm_layer_desc *d = fm_arch_layer(a, &c, k ? 3 : 0);
        for (int32_t j = 0; j < d->n_specs; j++) {
            const fm_weight_spec *w = &d->specs[j];
            if (!fm_spec_present(w, &c)) continue;
            got[k][w->bank][0] = fm_spec_count(w, &c), got[k][w->bank][1] = fm_spec_rows(w, &c);
            got[k][w->bank][2] = fm_spec_cols(w, &c);
        }
    }
    const int64_t gdn[][4] = {
        {FM_BANK_GDN_QKVZ, 1, 12288, 2048},      {FM_BANK_GDN_BA, 1, 64, 2048},
        {FM_BANK_GDN_CONV, 1, 8192, 4},          {FM_BANK_GDN_A_LOG, 1, 1, 32},
        {FM_BANK_GDN_NORM, 1, 1, 128},           {FM_BANK_GDN_OUT, 1, 2048, 4096},
        {FM_BANK_ROUTER, 1, 512, 2048},          {FM_BANK_GATE_UP, 512, 1024, 2048},
        {FM_BANK_SHARED_GATE_UP, 1, 1024, 2048}, {FM_BANK_SHARED_DOWN, 1, 2048, 512},
        {FM_BANK_SHARED_SCORE, 1, 1, 2048},
    };
    for (size_t i = 0; i < sizeof gdn / sizeof *gdn; i++)
        for (int k = 0; k < 3; k++) assert_int_equal(got[0][gdn[i][0]][k], gdn[i][k + 1]);
    assert_int_equal(got[0][FM_BANK_QKV][0], 0); /* no attention in a GDN layer */
    const int64_t attn[][4] = {
        {FM_BANK_QKV, 1, 8192 + 1024, 2048}, {FM_BANK_O, 1, 2048, 4096}, {FM_BANK_Q_NORM, 1, 1, 256}};
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
        for (int k = 0; k < 3; k++) assert_int_equal(got[1][attn[i][0]][k], attn[i][k + 1]);
    assert_int_equal(got[1][FM_BANK_GDN_QKVZ][0], 0);
    assert_int_equal(fm_arch_widest_dense_k(&c, 4), 4096); /* out_proj's and o_proj's input */
}

static void name_patterns_expand(void **s) {
    (void)s;
    char out[64];
    assert_true(fm_arch_name(out, sizeof out, "model.layers.{L}.self_attn.q_proj.weight", 17, NULL));
    assert_string_equal(out, "model.layers.17.self_attn.q_proj.weight");
    assert_true(fm_arch_name(out, sizeof out, "{P}.gate.weight", 3, "model.layers.3.block_sparse_moe"));
    assert_string_equal(out, "model.layers.3.block_sparse_moe.gate.weight");
    assert_true(fm_arch_name(out, sizeof out, "{P}.x", 0, NULL));
    assert_string_equal(out, ".x");
    char small[8];
    assert_false(fm_arch_name(small, sizeof small, "model.layers.{L}", 5, NULL)); /* truncated, still terminated */
    assert_true(strlen(small) < sizeof small);
}

/* Qwen3-30B-A3B (48 MoE layers, q/k norms): the banks of a layer, their shapes, and the dense inputs */
static void qwen3_shapes(void **s) {
    (void)s;
    fm_config c;
    qwen3_30b_config(&c);
    const fm_layer_desc *d = fm_arch_layer(fm_arch_of(&c), &c, 0);
    int64_t want[FM_BANK_COUNT][3] = {{0}}; /* n, rows, cols */
    for (int32_t j = 0; j < d->n_specs; j++) {
        const fm_weight_spec *w = &d->specs[j];
        if (!fm_spec_present(w, &c)) continue;
        want[w->bank][0] = fm_spec_count(w, &c), want[w->bank][1] = fm_spec_rows(w, &c);
        want[w->bank][2] = fm_spec_cols(w, &c);
    }
    const int64_t expect[FM_BANK_COUNT][3] = {
        [FM_BANK_ATTN_NORM] = {1, 1, 2048}, [FM_BANK_FFN_NORM] = {1, 1, 2048},     [FM_BANK_QKV] = {1, 5120, 2048},
        [FM_BANK_O] = {1, 2048, 4096},      [FM_BANK_Q_NORM] = {1, 1, 128},        [FM_BANK_K_NORM] = {1, 1, 128},
        [FM_BANK_ROUTER] = {1, 128, 2048},  [FM_BANK_GATE_UP] = {128, 1536, 2048}, [FM_BANK_DOWN] = {128, 2048, 768},
    };
    for (int b = 0; b < FM_BANK_COUNT; b++)
        for (int k = 0; k < 3; k++)
            if (want[b][k] != expect[b][k])
                fail_msg("bank %d [%d]: %lld, want %lld", b, k, (long long)want[b][k], (long long)expect[b][k]);
    assert_int_equal(fm_arch_widest_dense_k(&c, c.n_layers), 4096); /* o_proj's input, nh * hd */
    c.qk_norm = false;                                              /* the predicate drops the q/k norms */
    int present = 0;
    for (int32_t j = 0; j < d->n_specs; j++) present += fm_spec_present(&d->specs[j], &c);
    assert_int_equal(present, d->n_specs - 2);
}

/* A dense layer (mlp_only_layers) is the other kind: its MLP is the widest dense input when wider than the rest */
static void dense_layers_take_the_mlp_kind(void **s) {
    (void)s;
    fm_config c;
    qwen3_30b_config(&c);
    c.layer_is_moe[1] = false, c.dense_intermediate = 6144;
    const fm_arch_desc *a = fm_arch_of(&c);
    assert_int_equal(a->layer_kind(&c, 0), FM_LAYER_ATTN_MOE);
    assert_int_equal(a->layer_kind(&c, 1), FM_LAYER_ATTN_MLP);
    assert_int_equal(fm_arch_widest_dense_k(&c, 1), 4096);
    assert_int_equal(fm_arch_widest_dense_k(&c, 2), 6144);
    const fm_layer_desc *d = fm_arch_layer(a, &c, 1);
    bool experts = false;
    for (int32_t j = 0; j < d->n_specs; j++) experts |= d->specs[j].family == FM_WF_EXPERTS;
    assert_false(experts);
}

/* The named members of the layer structs alias the slot arrays */
static void named_members_alias_the_slots(void **s) {
    (void)s;
    fm_layer_src L;
    memset(&L, 0, sizeof L);
    L.w[FM_SRC_O].rows = 7;
    L.w[FM_SRC_K_NORM].cols = 9;
    assert_int_equal(L.o.rows, 7);
    assert_int_equal(L.k_norm.cols, 9);
    fm_wsrc views[2];
    L.ew[FM_SRC_EXPERT_UP - FM_SRC_N_LAYER] = views;
    assert_ptr_equal(L.expert_up, views);
    assert_ptr_equal(fm_layer_src_views(&L, FM_SRC_EXPERT_UP), views);
    assert_ptr_equal(fm_layer_src_views(&L, FM_SRC_ROUTER), &L.router);
    fm_layer_weights W;
    memset(&W, 0, sizeof W);
    W.bank[FM_BANK_GATE_UP] = (fm_bank *)&W;
    assert_ptr_equal(W.gate_up, (fm_bank *)&W);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(descriptions_are_well_formed),
        cmocka_unit_test(model_types_are_found),
        cmocka_unit_test(name_patterns_expand),
        cmocka_unit_test(qwen3_shapes),
        cmocka_unit_test(dense_layers_take_the_mlp_kind),
        cmocka_unit_test(named_members_alias_the_slots),
        cmocka_unit_test(qwen3_next_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
