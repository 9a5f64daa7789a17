/* config.json -> fm_config (src/io/config.c): every field of a real Qwen3-MoE and Mixtral config, the
 * alternative spellings real files use, the HF class defaults, the layer kinds, and every rejected input
 * (each asserts the status and that the message names the field). Configs are JSON text written here;
 * variants are made by replacing or deleting one top-level key of a base config (cJSON) so that each
 * error case differs from a valid config in exactly the field under test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/config.h"

/* The committed models/tiny-code-moe/config.json (Qwen3-MoE, transformers 5 spelling). */
static const char QWEN3_JSON[] = "{\n"
                                 "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
                                 "  \"attention_bias\": false,\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 0,\n"
                                 "  \"decoder_sparse_step\": 1,\n"
                                 "  \"dtype\": \"bfloat16\",\n"
                                 "  \"eos_token_id\": 0,\n"
                                 "  \"head_dim\": 48,\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 192,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 512,\n"
                                 "  \"max_position_embeddings\": 2048,\n"
                                 "  \"mlp_only_layers\": [],\n"
                                 "  \"model_type\": \"qwen3_moe\",\n"
                                 "  \"moe_intermediate_size\": 128,\n"
                                 "  \"norm_topk_prob\": true,\n"
                                 "  \"num_attention_heads\": 4,\n"
                                 "  \"num_experts_per_tok\": 4,\n"
                                 "  \"num_hidden_layers\": 4,\n"
                                 "  \"num_key_value_heads\": 2,\n"
                                 "  \"num_local_experts\": 16,\n"
                                 "  \"output_router_logits\": false,\n"
                                 "  \"pad_token_id\": null,\n"
                                 "  \"rms_norm_eps\": 1e-06,\n"
                                 "  \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"},\n"
                                 "  \"router_aux_loss_coef\": 0.01,\n"
                                 "  \"sliding_window\": null,\n"
                                 "  \"tie_word_embeddings\": false,\n"
                                 "  \"transformers_version\": \"5.17.0\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"use_sliding_window\": false,\n"
                                 "  \"vocab_size\": 4096\n"
                                 "}\n";

/* The committed tests/models/mixtral-f32-sharded/config.json. */
static const char MIXTRAL_JSON[] = "{\n"
                                   "  \"architectures\": [\"MixtralForCausalLM\"],\n"
                                   "  \"attention_dropout\": 0.0,\n"
                                   "  \"bos_token_id\": 1,\n"
                                   "  \"dtype\": \"float32\",\n"
                                   "  \"eos_token_id\": 2,\n"
                                   "  \"head_dim\": null,\n"
                                   "  \"hidden_act\": \"silu\",\n"
                                   "  \"hidden_size\": 64,\n"
                                   "  \"initializer_range\": 0.02,\n"
                                   "  \"intermediate_size\": 96,\n"
                                   "  \"max_position_embeddings\": 256,\n"
                                   "  \"model_type\": \"mixtral\",\n"
                                   "  \"num_attention_heads\": 4,\n"
                                   "  \"num_experts_per_tok\": 2,\n"
                                   "  \"num_hidden_layers\": 2,\n"
                                   "  \"num_key_value_heads\": 2,\n"
                                   "  \"num_local_experts\": 8,\n"
                                   "  \"output_router_logits\": false,\n"
                                   "  \"pad_token_id\": null,\n"
                                   "  \"rms_norm_eps\": 1e-05,\n"
                                   "  \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},\n"
                                   "  \"router_aux_loss_coef\": 0.001,\n"
                                   "  \"router_jitter_noise\": 0.0,\n"
                                   "  \"sliding_window\": null,\n"
                                   "  \"tie_word_embeddings\": false,\n"
                                   "  \"transformers_version\": \"5.17.0\",\n"
                                   "  \"use_cache\": true,\n"
                                   "  \"vocab_size\": 300\n"
                                   "}\n";

/* tests/models/qwen3-next-f32/config.json (transformers 5.17), the fields fp8moe reads */
static const char QWEN3_NEXT_JSON[] =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"hidden_size\": 64,"
    " \"num_hidden_layers\": 4, \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\","
    " \"linear_attention\"], \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 24,"
    " \"partial_rotary_factor\": 0.25, \"rope_parameters\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 10000.0,"
    " \"rope_type\": \"default\"}, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
    " \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 12, \"linear_conv_kernel_dim\": 4,"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"
    " \"shared_expert_intermediate_size\": 40, \"intermediate_size\": 48, \"mlp_only_layers\": [1],"
    " \"decoder_sparse_step\": 1, \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-06, \"vocab_size\": 256,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\","
    " \"attention_bias\": false}";

/* ---------------------------------------------------------------- helpers */

/* base with top-level keys replaced: pairs (key, JSON value text or NULL = delete), ended by a NULL key.
 * Returns a malloc'd JSON string. */
static char *variant(const char *base, ...) {
    cJSON *root = cJSON_Parse(base);
    assert_non_null(root);
    va_list ap;
    va_start(ap, base);
    const char *key;
    while ((key = va_arg(ap, const char *))) {
        const char *val = va_arg(ap, const char *);
        cJSON_DeleteItemFromObjectCaseSensitive(root, key);
        if (val) {
            cJSON *v = cJSON_Parse(val);
            if (!v) fail_msg("test bug: bad JSON value text for %s: %s", key, val);
            cJSON_AddItemToObject(root, key, v);
        }
    }
    va_end(ap);
    char *s = cJSON_PrintUnformatted(root);
    assert_non_null(s);
    cJSON_Delete(root);
    return s;
}

static fm_status parse(const char *json, fm_config *c, fm_error *err) {
    memset(err, 0, sizeof *err);
    return fm_config_parse(json, strlen(json), "cfg.json", c, err);
}

static void parse_ok(const char *json, fm_config *c) {
    fm_error err;
    fm_status st = parse(json, c, &err);
    if (st != FM_OK) fail_msg("expected ok, got %s: %s", fm_status_name(st), err.msg);
}

/* Parses json (freed here), expects status want and a message that names the file label and contains each
 * of the given substrings (NULL-terminated), and an all-zero config (nothing half-filled). */
static void expect_fail_(char *json, fm_status want, ...) {
    fm_config c;
    memset(&c, 0x5a, sizeof c);
    fm_error err;
    fm_status st = parse(json, &c, &err);
    if (st != want)
        fail_msg("expected %s, got %s (%s) for %s", fm_status_name(want), fm_status_name(st), err.msg, json);
    if (!strstr(err.msg, "cfg.json")) fail_msg("message does not name the file: %s", err.msg);
    va_list ap;
    va_start(ap, want);
    const char *s;
    while ((s = va_arg(ap, const char *)))
        if (!strstr(err.msg, s)) fail_msg("message '%s' does not contain '%s'", err.msg, s);
    va_end(ap);
    fm_config zero;
    memset(&zero, 0, sizeof zero);
    assert_memory_equal(&c, &zero, sizeof c);
    free(json);
}
#define expect_fail(json, want, ...) expect_fail_((json), (want), __VA_ARGS__, (const char *)NULL)

static char *dup_str(const char *s) {
    char *d = malloc(strlen(s) + 1);
    assert_non_null(d);
    strcpy(d, s);
    return d;
}

/* ---------------------------------------------------------------- valid configs */

static void test_qwen3_every_field(void **state) {
    (void)state;
    fm_config c;
    parse_ok(QWEN3_JSON, &c);
    assert_int_equal(c.arch, FM_ARCH_QWEN3_MOE);
    assert_string_equal(c.model_type, "qwen3_moe");
    assert_int_equal(c.vocab_size, 4096);
    assert_int_equal(c.hidden_size, 192);
    assert_int_equal(c.n_layers, 4);
    assert_int_equal(c.n_heads, 4);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 48);
    assert_int_equal(c.n_experts, 16);
    assert_int_equal(c.n_experts_per_tok, 4);
    assert_int_equal(c.moe_intermediate, 128);
    assert_int_equal(c.dense_intermediate, 512);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(c.norm_topk_prob);
    assert_false(c.tie_word_embeddings);
    assert_true(c.qk_norm);
    assert_int_equal(c.router, FM_ROUTER_SOFTMAX_TOPK);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.max_position_embeddings, 2048);
    for (int i = 0; i < 4; i++) assert_true(c.layer_is_moe[i]);
    for (int i = 4; i < FM_MAX_LAYERS; i++) assert_false(c.layer_is_moe[i]);
}

/* The text need not be NUL-terminated: only len bytes are read. */
static void test_not_nul_terminated(void **state) {
    (void)state;
    size_t n = strlen(QWEN3_JSON);
    char *buf = malloc(n);
    assert_non_null(buf);
    memcpy(buf, QWEN3_JSON, n); /* no terminator: ASan catches a read past len */
    fm_config c;
    fm_error err;
    assert_int_equal(fm_config_parse(buf, n, "cfg.json", &c, &err), FM_OK);
    assert_int_equal(c.vocab_size, 4096);
    free(buf);
}

static void test_experts_spellings(void **state) {
    (void)state;
    fm_config c;
    /* num_experts (the Qwen3 spelling of published checkpoints) */
    char *j = variant(QWEN3_JSON, "num_local_experts", NULL, "num_experts", "16", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_experts, 16);
    free(j);
    /* num_local_experts (the transformers 5 / Mixtral spelling) */
    parse_ok(QWEN3_JSON, &c);
    assert_int_equal(c.n_experts, 16);
    /* both, equal */
    j = variant(QWEN3_JSON, "num_experts", "16", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_experts, 16);
    free(j);
    /* one of them null counts as absent */
    j = variant(QWEN3_JSON, "num_experts", "null", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_experts, 16);
    free(j);
    /* Mixtral with num_experts */
    j = variant(MIXTRAL_JSON, "num_local_experts", NULL, "num_experts", "8", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_experts, 8);
    free(j);
}

static void test_experts_spellings_disagree(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "num_experts", "8", NULL), FM_ERR_FORMAT, "num_experts", "num_local_experts", "8",
                "16");
    /* neither spelling */
    expect_fail(variant(QWEN3_JSON, "num_local_experts", NULL, NULL), FM_ERR_FORMAT, "num_local_experts");
}

static void test_rope_theta_spellings(void **state) {
    (void)state;
    fm_config c;
    /* top level */
    char *j = variant(QWEN3_JSON, "rope_parameters", NULL, "rope_theta", "1000000.0", NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 1e6);
    free(j);
    /* rope_parameters.rope_theta */
    j = variant(QWEN3_JSON, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":500000.0}", NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 5e5);
    free(j);
    /* top-level null falls back to rope_parameters */
    j = variant(QWEN3_JSON, "rope_theta", "null", "rope_parameters", "{\"rope_theta\":123456.0}", NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 123456.0);
    free(j);
    /* neither: the HF class defaults (Qwen3MoeConfig 10000, MixtralConfig 1e6) */
    j = variant(QWEN3_JSON, "rope_parameters", NULL, NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 10000.0);
    free(j);
    j = variant(MIXTRAL_JSON, "rope_parameters", NULL, NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 1e6);
    free(j);
    /* rope_parameters without a theta: still the default */
    j = variant(MIXTRAL_JSON, "rope_parameters", "{\"rope_type\":\"default\"}", NULL);
    parse_ok(j, &c);
    assert_true(c.rope_theta == 1e6);
    free(j);
}

static void test_head_dim(void **state) {
    (void)state;
    fm_config c;
    /* absent: hidden / heads */
    char *j = variant(QWEN3_JSON, "head_dim", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.head_dim, 192 / 4);
    free(j);
    /* null: the same */
    j = variant(QWEN3_JSON, "head_dim", "null", "hidden_size", "256", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.head_dim, 64);
    free(j);
    /* explicit and different from hidden / heads (Qwen3-30B-A3B: 2048 / 32 = 64, head_dim 128) */
    j = variant(QWEN3_JSON, "hidden_size", "2048", "num_attention_heads", "32", "num_key_value_heads", "4", "head_dim",
                "128", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 128);
    free(j);
    /* an explicit head_dim makes hidden % heads irrelevant */
    j = variant(QWEN3_JSON, "hidden_size", "200", "num_attention_heads", "3", "num_key_value_heads", "1", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.head_dim, 48);
    free(j);
    /* num_key_value_heads absent: = num_attention_heads (MHA) */
    j = variant(QWEN3_JSON, "num_key_value_heads", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_kv_heads, 4);
    free(j);
}

static void test_norm_topk_prob(void **state) {
    (void)state;
    fm_config c;
    /* absent: false, the Qwen3MoeConfig class default */
    char *j = variant(QWEN3_JSON, "norm_topk_prob", NULL, NULL);
    parse_ok(j, &c);
    assert_false(c.norm_topk_prob);
    free(j);
    j = variant(QWEN3_JSON, "norm_topk_prob", "false", NULL);
    parse_ok(j, &c);
    assert_false(c.norm_topk_prob);
    free(j);
    parse_ok(QWEN3_JSON, &c);
    assert_true(c.norm_topk_prob);
    expect_fail(variant(QWEN3_JSON, "norm_topk_prob", "1", NULL), FM_ERR_FORMAT, "norm_topk_prob");
}

static void test_sparse_step_and_mlp_only(void **state) {
    (void)state;
    fm_config c;
    /* layer i is MoE iff i not in mlp_only_layers and (i + 1) % step == 0: {0, 1, 0, 0} */
    char *j = variant(QWEN3_JSON, "decoder_sparse_step", "2", "mlp_only_layers", "[3]", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.decoder_sparse_step, 2);
    assert_false(c.layer_is_moe[0]);
    assert_true(c.layer_is_moe[1]);
    assert_false(c.layer_is_moe[2]);
    assert_false(c.layer_is_moe[3]);
    free(j);
    /* mlp_only_layers alone */
    j = variant(QWEN3_JSON, "mlp_only_layers", "[0, 2]", NULL);
    parse_ok(j, &c);
    assert_false(c.layer_is_moe[0]);
    assert_true(c.layer_is_moe[1]);
    assert_false(c.layer_is_moe[2]);
    assert_true(c.layer_is_moe[3]);
    free(j);
    /* absent: step 1, every layer MoE */
    j = variant(QWEN3_JSON, "decoder_sparse_step", NULL, "mlp_only_layers", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.decoder_sparse_step, 1);
    for (int i = 0; i < 4; i++) assert_true(c.layer_is_moe[i]);
    free(j);
    expect_fail(variant(QWEN3_JSON, "decoder_sparse_step", "0", NULL), FM_ERR_FORMAT, "decoder_sparse_step");
}

static void test_no_experts_all_dense(void **state) {
    (void)state;
    fm_config c;
    /* num_experts 0: every layer dense; top-k and moe_intermediate_size are then not needed */
    char *j =
        variant(QWEN3_JSON, "num_local_experts", "0", "num_experts_per_tok", NULL, "moe_intermediate_size", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.n_experts, 0);
    for (int i = 0; i < 4; i++) assert_false(c.layer_is_moe[i]);
    assert_int_equal(c.dense_intermediate, 512);
    free(j);
    /* Mixtral needs at least one expert */
    expect_fail(variant(MIXTRAL_JSON, "num_local_experts", "0", NULL), FM_ERR_FORMAT, "num_local_experts");
}

static void test_tie_word_embeddings(void **state) {
    (void)state;
    fm_config c;
    char *j = variant(QWEN3_JSON, "tie_word_embeddings", "true", NULL);
    parse_ok(j, &c);
    assert_true(c.tie_word_embeddings);
    free(j);
    j = variant(QWEN3_JSON, "tie_word_embeddings", NULL, NULL);
    parse_ok(j, &c);
    assert_false(c.tie_word_embeddings);
    free(j);
    j = variant(MIXTRAL_JSON, "tie_word_embeddings", "true", NULL);
    parse_ok(j, &c);
    assert_true(c.tie_word_embeddings);
    free(j);
}

static void test_mixtral_every_field(void **state) {
    (void)state;
    fm_config c;
    parse_ok(MIXTRAL_JSON, &c); /* "sliding_window": null and "head_dim": null accepted */
    assert_int_equal(c.arch, FM_ARCH_MIXTRAL);
    assert_string_equal(c.model_type, "mixtral");
    assert_int_equal(c.vocab_size, 300);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.n_layers, 2);
    assert_int_equal(c.n_heads, 4);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate, 96); /* = intermediate_size */
    assert_int_equal(c.dense_intermediate, 96);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(c.norm_topk_prob);
    assert_false(c.tie_word_embeddings);
    assert_false(c.qk_norm);
    assert_int_equal(c.router, FM_ROUTER_TOPK_SOFTMAX);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.max_position_embeddings, 256);
    assert_true(c.layer_is_moe[0]);
    assert_true(c.layer_is_moe[1]);
    assert_false(c.layer_is_moe[2]);
    /* absent sliding_window and head_dim, and an explicit head_dim */
    char *j = variant(MIXTRAL_JSON, "sliding_window", NULL, "head_dim", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.head_dim, 16);
    free(j);
    j = variant(MIXTRAL_JSON, "head_dim", "32", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.head_dim, 32);
    free(j);
    /* Mixtral ignores mlp_only_layers / decoder_sparse_step / norm_topk_prob (not MixtralConfig fields) */
    j = variant(MIXTRAL_JSON, "mlp_only_layers", "[0]", "decoder_sparse_step", "2", "norm_topk_prob", "false", NULL);
    parse_ok(j, &c);
    assert_true(c.layer_is_moe[0] && c.layer_is_moe[1]);
    assert_true(c.norm_topk_prob);
    free(j);
}

static void test_defaults_when_absent(void **state) {
    (void)state;
    fm_config c;
    /* rms_norm_eps absent: 1e-6 (Qwen3MoeConfig) / 1e-5 (MixtralConfig) */
    char *j = variant(QWEN3_JSON, "rms_norm_eps", NULL, "hidden_act", NULL, "attention_bias", NULL,
                      "use_sliding_window", NULL, NULL);
    parse_ok(j, &c);
    assert_true(c.rms_norm_eps == 1e-6f);
    free(j);
    j = variant(MIXTRAL_JSON, "rms_norm_eps", NULL, NULL);
    parse_ok(j, &c);
    assert_true(c.rms_norm_eps == 1e-5f);
    free(j);
}

static void test_rope_scaling_default_accepted(void **state) {
    (void)state;
    fm_config c;
    const char *ok[] = {"null", "{\"rope_type\":\"default\"}", "{\"type\":\"default\"}",
                        "{\"rope_type\":\"default\",\"factor\":1.0}"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char *j = variant(QWEN3_JSON, "rope_scaling", ok[i], NULL);
        parse_ok(j, &c);
        assert_true(c.rope_theta == 10000.0);
        free(j);
        j = variant(MIXTRAL_JSON, "rope_scaling", ok[i], NULL);
        parse_ok(j, &c);
        free(j);
    }
    char *j = variant(QWEN3_JSON, "rope_parameters", "null", NULL);
    parse_ok(j, &c);
    free(j);
    j = variant(QWEN3_JSON, "partial_rotary_factor", "1.0", NULL);
    parse_ok(j, &c);
    free(j);
}

/* ---------------------------------------------------------------- rejected configs */

/* Qwen3-Next: the layer kinds (layer_types, or every full_attention_interval-th layer full attention, default 4),
 * partial RoPE (default 0.25: transformers' own), the Gated DeltaNet's heads, the shared expert; the refusals */
static void test_qwen3_next_fields(void **state) {
    (void)state;
    fm_config c;
    parse_ok(QWEN3_NEXT_JSON, &c);
    assert_int_equal(c.arch, FM_ARCH_QWEN3_NEXT);
    const bool gdn[4] = {true, false, true, true}, moe[4] = {true, false, true, true};
    for (int l = 0; l < 4; l++)
        assert_int_equal(c.layer_is_gdn[l], gdn[l]), assert_int_equal(c.layer_is_moe[l], moe[l]);
    assert_int_equal(c.rotary_dim, 6);
    assert_true(c.attn_output_gate && c.qk_norm && c.norm_topk_prob);
    assert_int_equal(c.shared_expert_intermediate, 40);
    assert_int_equal(c.gdn_k_heads, 2), assert_int_equal(c.gdn_v_heads, 4), assert_int_equal(c.gdn_k_dim, 16);
    assert_int_equal(c.gdn_v_dim, 12), assert_int_equal(c.gdn_conv_kernel, 4);
    char *j = variant(QWEN3_NEXT_JSON, "layer_types", NULL, "full_attention_interval", "2", NULL);
    parse_ok(j, &c);
    for (int l = 0; l < 4; l++) assert_int_equal(c.layer_is_gdn[l], l % 2 == 0);
    free(j);
    j = variant(QWEN3_NEXT_JSON, "layer_types", NULL, "partial_rotary_factor", NULL, "rope_parameters", NULL, NULL);
    parse_ok(j, &c);
    for (int l = 0; l < 4; l++) assert_int_equal(c.layer_is_gdn[l], l != 3); /* every 4th */
    assert_int_equal(c.rotary_dim, 6);                                       /* 0.25 of 24 */
    free(j);
    j = variant(QWEN3_NEXT_JSON, "partial_rotary_factor", "0.5", NULL);
    parse_ok(j, &c);
    assert_int_equal(c.rotary_dim, 12);
    free(j);
    expect_fail(variant(QWEN3_NEXT_JSON, "partial_rotary_factor", "0.3", NULL), FM_ERR_FORMAT, "partial_rotary_factor",
                "7 rotary dims");
    expect_fail(variant(QWEN3_NEXT_JSON, "layer_types", "[\"linear_attention\"]", NULL), FM_ERR_FORMAT, "layer_types",
                "4 strings");
    expect_fail(variant(QWEN3_NEXT_JSON, "layer_types",
                        "[\"linear_attention\", \"sliding_attention\", \"full_attention\", \"full_attention\"]", NULL),
                FM_ERR_UNSUPPORTED, "layer_types[1]", "sliding_attention");
    expect_fail(variant(QWEN3_NEXT_JSON, "linear_num_value_heads", "3", NULL), FM_ERR_FORMAT, "linear_num_value_heads");
}

static void test_unsupported_model_type(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "model_type", "\"llama\"", NULL), FM_ERR_UNSUPPORTED, "model_type", "llama");
    expect_fail(variant(QWEN3_JSON, "model_type", NULL, NULL), FM_ERR_FORMAT, "model_type");
    expect_fail(variant(QWEN3_JSON, "model_type", "null", NULL), FM_ERR_FORMAT, "model_type");
    expect_fail(variant(QWEN3_JSON, "model_type", "3", NULL), FM_ERR_FORMAT, "model_type");
}

static void test_unsupported_rope(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "rope_scaling",
                        "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}", NULL),
                FM_ERR_UNSUPPORTED, "rope_scaling", "yarn");
    /* the older "type" key */
    expect_fail(variant(QWEN3_JSON, "rope_scaling", "{\"type\":\"dynamic\",\"factor\":2.0}", NULL), FM_ERR_UNSUPPORTED,
                "rope_scaling", "dynamic");
    /* a scaling factor without a type */
    expect_fail(variant(MIXTRAL_JSON, "rope_scaling", "{\"factor\":8.0}", NULL), FM_ERR_UNSUPPORTED, "rope_scaling",
                "factor");
    expect_fail(variant(QWEN3_JSON, "rope_parameters",
                        "{\"rope_type\":\"linear\",\"rope_theta\":10000.0,\"factor\":2.0}", NULL),
                FM_ERR_UNSUPPORTED, "rope_parameters", "linear");
    expect_fail(variant(QWEN3_JSON, "rope_scaling", "\"yarn\"", NULL), FM_ERR_FORMAT, "rope_scaling");
    expect_fail(variant(QWEN3_JSON, "partial_rotary_factor", "0.5", NULL), FM_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect_fail(variant(QWEN3_JSON, "rope_parameters",
                        "{\"rope_type\":\"default\",\"rope_theta\":10000.0,\"partial_rotary_factor\":0.5}", NULL),
                FM_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect_fail(variant(QWEN3_JSON, "rope_theta", "\"big\"", NULL), FM_ERR_FORMAT, "rope_theta");
    expect_fail(variant(QWEN3_JSON, "rope_theta", "0.5", NULL), FM_ERR_FORMAT, "rope_theta");
}

static void test_unsupported_switches(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "use_sliding_window", "true", "sliding_window", "4096", NULL), FM_ERR_UNSUPPORTED,
                "use_sliding_window");
    expect_fail(variant(MIXTRAL_JSON, "sliding_window", "4096", NULL), FM_ERR_UNSUPPORTED, "sliding_window", "4096");
    expect_fail(variant(QWEN3_JSON, "attention_bias", "true", NULL), FM_ERR_UNSUPPORTED, "attention_bias");
    expect_fail(variant(MIXTRAL_JSON, "attention_bias", "true", NULL), FM_ERR_UNSUPPORTED, "attention_bias");
    expect_fail(variant(QWEN3_JSON, "hidden_act", "\"gelu\"", NULL), FM_ERR_UNSUPPORTED, "hidden_act", "gelu");
    expect_fail(variant(MIXTRAL_JSON, "hidden_act", "\"relu\"", NULL), FM_ERR_UNSUPPORTED, "hidden_act", "relu");
}

static void test_bad_numbers(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "hidden_size", "\"abc\"", NULL), FM_ERR_FORMAT, "hidden_size");
    expect_fail(variant(QWEN3_JSON, "hidden_size", "1.5", NULL), FM_ERR_FORMAT, "hidden_size");
    expect_fail(variant(QWEN3_JSON, "hidden_size", "0", NULL), FM_ERR_FORMAT, "hidden_size");
    expect_fail(variant(QWEN3_JSON, "hidden_size", "1e300", NULL), FM_ERR_FORMAT, "hidden_size");
    expect_fail(variant(QWEN3_JSON, "hidden_size", NULL, NULL), FM_ERR_FORMAT, "hidden_size");
    expect_fail(variant(QWEN3_JSON, "vocab_size", "-5", NULL), FM_ERR_FORMAT, "vocab_size");
    expect_fail(variant(QWEN3_JSON, "num_hidden_layers", "2000", NULL), FM_ERR_FORMAT, "num_hidden_layers");
    expect_fail(variant(QWEN3_JSON, "num_attention_heads", "true", NULL), FM_ERR_FORMAT, "num_attention_heads");
    expect_fail(variant(QWEN3_JSON, "rms_norm_eps", "\"x\"", NULL), FM_ERR_FORMAT, "rms_norm_eps");
    expect_fail(variant(QWEN3_JSON, "rms_norm_eps", "0", NULL), FM_ERR_FORMAT, "rms_norm_eps");
    expect_fail(variant(QWEN3_JSON, "max_position_embeddings", "-1", NULL), FM_ERR_FORMAT, "max_position_embeddings");
    expect_fail(variant(QWEN3_JSON, "moe_intermediate_size", NULL, NULL), FM_ERR_FORMAT, "moe_intermediate_size");
    expect_fail(variant(MIXTRAL_JSON, "intermediate_size", NULL, NULL), FM_ERR_FORMAT, "intermediate_size");
    expect_fail(variant(QWEN3_JSON, "num_experts_per_tok", NULL, NULL), FM_ERR_FORMAT, "num_experts_per_tok");
    expect_fail(variant(QWEN3_JSON, "tie_word_embeddings", "\"no\"", NULL), FM_ERR_FORMAT, "tie_word_embeddings");
}

static void test_bad_json(void **state) {
    (void)state;
    expect_fail(dup_str("{\"model_type\": \"qwen3_moe\", "), FM_ERR_FORMAT, "JSON");
    expect_fail(dup_str(""), FM_ERR_FORMAT, "JSON");
    expect_fail(dup_str("[1, 2, 3]"), FM_ERR_FORMAT, "object");
    expect_fail(dup_str("\"qwen3_moe\""), FM_ERR_FORMAT, "object");
    /* the text is cut at len: a valid config truncated is malformed */
    fm_config c;
    fm_error err;
    assert_int_equal(fm_config_parse(QWEN3_JSON, strlen(QWEN3_JSON) / 2, "cfg.json", &c, &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "cfg.json"));
    /* text after the object is not JSON (cJSON alone accepts it); trailing whitespace is fine */
    size_t n = strlen(QWEN3_JSON);
    char *tail = malloc(n + 32);
    snprintf(tail, n + 32, "%s trailing garbage", QWEN3_JSON);
    expect_fail(tail, FM_ERR_FORMAT, "non-whitespace after the JSON value");
    tail = malloc(n + 32);
    snprintf(tail, n + 32, "%s \n\t ", QWEN3_JSON);
    assert_int_equal(fm_config_parse(tail, strlen(tail), "cfg.json", &c, &err), FM_OK);
    free(tail);
    /* an eps that vanishes in fp32 would divide by zero in RMSNorm */
    expect_fail(variant(QWEN3_JSON, "rms_norm_eps", "1e-50", NULL), FM_ERR_FORMAT, "rms_norm_eps");
    /* scaling fields of the wrong type are errors, not ignored */
    expect_fail(variant(QWEN3_JSON, "partial_rotary_factor", "\"0.5\"", NULL), FM_ERR_FORMAT, "partial_rotary_factor");
    expect_fail(variant(QWEN3_JSON, "rope_scaling", "{\"rope_type\":\"default\",\"factor\":\"4\"}", NULL),
                FM_ERR_FORMAT, "rope_scaling.factor");
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "[\"1\"]", NULL), FM_ERR_FORMAT, "mlp_only_layers", "a string");
}

static void test_bad_experts(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "num_experts_per_tok", "17", NULL), FM_ERR_FORMAT, "num_experts_per_tok", "17",
                "16");
    expect_fail(variant(MIXTRAL_JSON, "num_experts_per_tok", "9", NULL), FM_ERR_FORMAT, "num_experts_per_tok", "9",
                "8");
    expect_fail(variant(QWEN3_JSON, "num_experts_per_tok", "0", NULL), FM_ERR_FORMAT, "num_experts_per_tok");
}

static void test_bad_heads(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "num_attention_heads", "6", "num_key_value_heads", "4", NULL), FM_ERR_FORMAT,
                "num_attention_heads", "num_key_value_heads");
    /* head_dim absent and hidden not a multiple of heads */
    expect_fail(variant(QWEN3_JSON, "head_dim", NULL, "hidden_size", "190", NULL), FM_ERR_FORMAT, "head_dim",
                "hidden_size");
    expect_fail(variant(QWEN3_JSON, "head_dim", "47", NULL), FM_ERR_FORMAT, "head_dim");
    /* hidden / heads odd (Mixtral derived head_dim) */
    expect_fail(variant(MIXTRAL_JSON, "hidden_size", "36", NULL), FM_ERR_FORMAT, "head_dim");
    expect_fail(variant(QWEN3_JSON, "head_dim", "\"128\"", NULL), FM_ERR_FORMAT, "head_dim");
}

static void test_bad_mlp_only_layers(void **state) {
    (void)state;
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "[4]", NULL), FM_ERR_FORMAT, "mlp_only_layers");
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "[-1]", NULL), FM_ERR_FORMAT, "mlp_only_layers");
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "[1.5]", NULL), FM_ERR_FORMAT, "mlp_only_layers");
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "[\"a\"]", NULL), FM_ERR_FORMAT, "mlp_only_layers");
    expect_fail(variant(QWEN3_JSON, "mlp_only_layers", "3", NULL), FM_ERR_FORMAT, "mlp_only_layers");
}

static void test_dense_needs_intermediate(void **state) {
    (void)state;
    /* layer 0 dense and no intermediate_size */
    expect_fail(variant(QWEN3_JSON, "intermediate_size", NULL, "mlp_only_layers", "[0]", NULL), FM_ERR_FORMAT,
                "intermediate_size");
    expect_fail(variant(QWEN3_JSON, "intermediate_size", NULL, "decoder_sparse_step", "2", NULL), FM_ERR_FORMAT,
                "intermediate_size");
    /* every layer MoE: intermediate_size is not needed */
    fm_config c;
    char *j = variant(QWEN3_JSON, "intermediate_size", NULL, NULL);
    parse_ok(j, &c);
    assert_int_equal(c.dense_intermediate, 0);
    free(j);
}

static void test_load_missing_file(void **state) {
    (void)state;
    char dir[] = "/tmp/fm_cfg_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    fm_config c;
    fm_error err;
    memset(&err, 0, sizeof err);
    assert_int_equal(fm_config_load(dir, &c, &err), FM_ERR_IO);
    assert_non_null(strstr(err.msg, dir));
    assert_non_null(strstr(err.msg, "config.json"));

    /* a present file: errors name its path, and a valid one loads */
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"model_type\": \"llama\"}", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(fm_config_load(dir, &c, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, path));
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(MIXTRAL_JSON, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(fm_config_load(dir, &c, &err), FM_OK);
    assert_int_equal(c.n_experts, 8);
    unlink(path);
    rmdir(dir);

    /* the committed configs load */
    assert_int_equal(fm_config_load("tests/models/mixtral-f32-sharded", &c, &err), FM_OK);
    assert_int_equal(c.arch, FM_ARCH_MIXTRAL);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(fm_config_load("models/tiny-code-moe", &c, &err), FM_OK);
    assert_int_equal(c.arch, FM_ARCH_QWEN3_MOE);
    assert_int_equal(c.n_experts, 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_every_field),
        cmocka_unit_test(test_not_nul_terminated),
        cmocka_unit_test(test_experts_spellings),
        cmocka_unit_test(test_experts_spellings_disagree),
        cmocka_unit_test(test_rope_theta_spellings),
        cmocka_unit_test(test_head_dim),
        cmocka_unit_test(test_norm_topk_prob),
        cmocka_unit_test(test_sparse_step_and_mlp_only),
        cmocka_unit_test(test_no_experts_all_dense),
        cmocka_unit_test(test_tie_word_embeddings),
        cmocka_unit_test(test_mixtral_every_field),
        cmocka_unit_test(test_defaults_when_absent),
        cmocka_unit_test(test_rope_scaling_default_accepted),
        cmocka_unit_test(test_unsupported_model_type),
        cmocka_unit_test(test_unsupported_rope),
        cmocka_unit_test(test_unsupported_switches),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_experts),
        cmocka_unit_test(test_bad_heads),
        cmocka_unit_test(test_bad_mlp_only_layers),
        cmocka_unit_test(test_qwen3_next_fields),
        cmocka_unit_test(test_dense_needs_intermediate),
        cmocka_unit_test(test_load_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
