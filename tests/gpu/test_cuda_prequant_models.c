/* Pre-quantized checkpoints on the GPU, whole model: each tiny checkpoint of tests/data/quant (GPTQ v1/v2, AWQ,
 * compressed-tensors, block-FP8; made by tools/pack_quantized.py) under every preset that reads its format, the
 * CUDA logits against the CPU emulating the same plan (cosine >= 0.999, argmax >= 90%, nothing non-finite), and
 * against the CPU's fp32 reference on the same checkpoint (printed). ref/ref32 dequantize with the checkpoint's
 * own formula; int4 keeps its int4 (int4-zp, the W4A16 GEMV); fp8 runs the W4A8 kernels on int4-zp-tc (zero
 * points applied per 128-group) or e4m3-block banks. Needs a GPU (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8moe.h"
#include "gpu_test_util.h"
#include "util/metrics.h"

#define T_TOKENS 24

static float *run(const char *dir, const char *backend, const char *plan_backend, fm_preset p, const int32_t *ids,
                  int32_t *V) {
    fm_options opt;
    fm_options_init(&opt);
    opt.routes = gpu_test_routes();
    opt.backend = backend, opt.plan_backend = plan_backend, opt.preset = p;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(dir, &opt, &m, &err);
    if (st) fail_msg("load %s (%s) on %s: %s", dir, fm_preset_name(p), backend, err.msg);
    fm_context *ctx = NULL;
    if (fm_context_create(m, NULL, &ctx, &err)) fail_msg("context %s: %s", dir, err.msg);
    *V = fm_model_vocab_size(m);
    float *logits = malloc((size_t)T_TOKENS * (size_t)*V * sizeof(float));
    st = fm_context_logits(ctx, ids, T_TOKENS, logits, &err);
    if (st) fail_msg("logits %s on %s: %s", dir, backend, err.msg);
    fm_context_free(ctx);
    fm_model_free(m);
    return logits;
}

static void parity(const char *dir, const fm_preset *presets, int n) {
    int32_t ids[T_TOKENS], V = 0;
    for (int t = 0; t < T_TOKENS; t++) ids[t] = (t * 7 + 3) % 47; /* the fixtures have 48 tokens */
    float *oracle = run(dir, "cpu", "cpu", FM_PRESET_REF, ids, &V);
    for (int i = 0; i < n; i++) {
        float *emul = run(dir, "cpu", "cuda", presets[i], ids, &V);
        float *gpu = run(dir, "cuda", NULL, presets[i], ids, &V);
        fm_compare ce, co;
        fm_logits_compare(emul, gpu, T_TOKENS, V, &ce);
        fm_logits_compare(oracle, gpu, T_TOKENS, V, &co);
        printf("%-42s %-5s | vs cpu emulation: cos %.6f argmax %5.1f%% max|err| %.3g | vs fp32: cos %.6f\n", dir,
               fm_preset_name(presets[i]), ce.cosine, 100 * ce.argmax_agree, ce.max_abs_err, co.cosine);
        assert_int_equal(ce.n_nonfinite, 0);
        assert_true(ce.cosine >= 0.999);
        assert_true(ce.argmax_agree >= 0.9);
        free(emul), free(gpu);
    }
    free(oracle);
}

static const fm_preset all4[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
static const fm_preset no_fp8[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_INT4};
static const fm_preset block_fp8[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_FP8};

/* groups of 16 or 32 and act-order: the fp8 presets refuse them (test_fp8_prequant.c), the others run */
static void test_int4_small_groups(void **s) {
    (void)s;
    parity("tests/data/quant/gptq-v1-sym", no_fp8, 3);
    parity("tests/data/quant/gptq-v2-asym-channel", no_fp8, 3);
    parity("tests/data/quant/gptq-v1-asym-actorder", no_fp8, 3);
    parity("tests/data/quant/awq-gemm", no_fp8, 3);
    parity("tests/data/quant/ct-sym", no_fp8, 3);
    parity("tests/data/quant/ct-asym-actorder-ignore", no_fp8, 3);
    parity("tests/data/quant/ct-sym-g32", no_fp8, 3);
}

/* group 128 (and one group of 128): every preset, fp8 on int4-zp-tc banks */
static void test_int4_g128(void **s) {
    (void)s;
    parity("tests/data/quant/gptq-v1-sym-g128", all4, 4);
    parity("tests/data/quant/awq-g128", all4, 4);
    parity("tests/data/quant/gptq-v2-asym-channel-k128", all4, 4);
}

static void test_fp8_block(void **s) {
    (void)s;
    parity("tests/data/quant/fp8-block", block_fp8, 2); /* 16 x 16 blocks: the float presets only */
    parity("tests/data/quant/fp8-block-b128", block_fp8, 3);
    parity("tests/data/quant/fp8-block-b48", block_fp8, 3);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_int4_small_groups), cmocka_unit_test(test_int4_g128),
                                       cmocka_unit_test(test_fp8_block)};
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
