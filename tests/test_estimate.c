/* The public API's look before a load (fp8moe.h): fm_checkpoint_probe describes a checkpoint from its config.json,
 * fm_memory_estimate_compute gives the bytes the load plans (a real load on the CPU holds exactly its weights; a rank
 * of --ep 2 its share), fm_memory_fit_generation the sequences and context that fit a budget. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "engine/engine.h"
#include "fp8moe.h"

#define MODEL "models/tiny-code-moe"

static void probe_describes_the_checkpoint(void **s) {
    (void)s;
    fm_checkpoint_info ck;
    fm_error err = {{0}};
    assert_int_equal(fm_checkpoint_probe(MODEL, &ck, &err), FM_OK);
    assert_string_equal(ck.model_type, "qwen3_moe");
    assert_true(ck.n_layers > 0 && ck.n_moe_layers > 0 && ck.n_moe_layers <= ck.n_layers);
    assert_int_equal(ck.n_experts, 16);
    assert_false(ck.prequantized);
    assert_string_equal(ck.quantization, "");
    assert_int_equal(fm_checkpoint_probe("tests/data/quant/gptq-v1-sym-g128", &ck, &err), FM_OK);
    assert_true(ck.prequantized);
    assert_non_null(strstr(ck.quantization, "gptq"));
    assert_int_not_equal(fm_checkpoint_probe("tests/no-such-dir", &ck, &err), FM_OK);
    assert_non_null(strstr(err.msg, "no-such-dir"));
}

static void estimate_is_what_a_load_holds(void **s) {
    (void)s;
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
    for (int i = 0; i < 3; i++)
        for (int ep = 1; ep <= 2; ep++) {
            fm_options opt;
            fm_options_init(&opt);
            opt.preset = presets[i], opt.max_tokens = 40, opt.ep_ranks = ep, opt.ep_rank = ep - 1;
            fm_memory_estimate e;
            fm_error err = {{0}};
            if (fm_memory_estimate_compute(MODEL, &opt, &e, &err)) fail_msg("estimate: %s", err.msg);
            fm_model *m = NULL;
            if (fm_model_load(MODEL, &opt, &m, &err)) fail_msg("load: %s", err.msg);
            assert_int_equal(e.weights, m->weight_bytes);
            assert_true(e.activations > 0);
            assert_int_equal(e.total, e.weights + e.activations + e.workspace + e.exchange);
            assert_true(ep == 1 ? e.exchange == 0 : e.exchange > 0);
            fm_model_free(m);
        }
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "tpu";
    fm_memory_estimate e;
    fm_error err = {{0}};
    assert_int_equal(fm_memory_estimate_compute(MODEL, &opt, &e, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "tpu"));
}

/* the fit: as many sequences as a budget holds beside the model, each adding its KV cache */
static void fit_on_a_budget(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = FM_PRESET_FP8, opt.max_tokens = 512;
    fm_memory_estimate alone, four;
    fm_error err = {{0}};
    assert_int_equal(fm_memory_estimate_compute(MODEL, &opt, &alone, &err), FM_OK);
    int32_t seqs = 0;
    int64_t ctx = 1024;
    const size_t budget = alone.peak + ((size_t)64 << 20);
    assert_int_equal(fm_memory_fit_generation(MODEL, &opt, 512, budget, 256, &seqs, &ctx, &err), FM_OK);
    assert_true(seqs >= 1 && seqs <= 256);
    assert_int_equal(ctx, 1024);
    opt.max_seqs = 4, opt.ctx = 1024;
    assert_int_equal(fm_memory_estimate_compute(MODEL, &opt, &four, &err), FM_OK);
    assert_true(four.kv_cache > 0 && four.total == alone.total + four.kv_cache + four.kv_state);
    seqs = 0, ctx = 1024;
    assert_int_equal(fm_memory_fit_generation(MODEL, &opt, 512, alone.peak / 2, 256, &seqs, &ctx, &err), FM_ERR_NOMEM);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(probe_describes_the_checkpoint),
        cmocka_unit_test(estimate_is_what_a_load_holds),
        cmocka_unit_test(fit_on_a_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
