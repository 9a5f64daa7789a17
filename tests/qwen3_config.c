/* Qwen/Qwen3-30B-A3B's configuration (qwen3_config.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "qwen3_config.h"

/* Qwen/Qwen3-30B-A3B's config.json (the fields fp8moe reads) */
static const char QWEN3_30B[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 2048,"
    " \"num_hidden_layers\": 48, \"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"head_dim\": 128,"
    " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 768, \"intermediate_size\": 6144,"
    " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"norm_topk_prob\": true, \"vocab_size\": 151936,"
    " \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"hidden_act\": \"silu\","
    " \"max_position_embeddings\": 40960, \"attention_bias\": false, \"use_sliding_window\": false}";

void qwen3_30b_config(fm_config *cfg) {
    fm_error err = {{0}};
    if (fm_config_parse(QWEN3_30B, sizeof QWEN3_30B - 1, "qwen3-30b config", cfg, &err)) fail_msg("%s", err.msg);
}
