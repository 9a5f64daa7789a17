/* Quality on a real trained model: the ref preset on models/tiny-code-moe (a small Qwen3-MoE trained with
 * transformers; bf16 checkpoint) must reproduce transformers' fp32 perplexity 9.1431 within 0.002 under the
 * protocol of models/README.md (first 256 windows of 512 tokens, loss on positions 1..511). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fp8moe.h"
#include "util/ids.h"

static void ref_perplexity_matches_transformers(void **s) {
    (void)s;
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("models/tiny-code-moe/eval_ids.i32", &ids, &n, &err), FM_OK);
    assert_int_equal(n, 131072);
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_OK);
    fm_context *ctx = NULL;
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    double ppl = 0, loss = 0;
    fm_status st = fm_context_perplexity(ctx, ids, n, 512, 256, NULL, NULL, &ppl, &loss, &err);
    if (st) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, FM_OK);
    printf("ref perplexity %.5f (transformers fp32: 9.1431), mean loss %.6f\n", ppl, loss);
    assert_true(fabs(ppl - 9.1431) <= 0.002);
    fm_context_free(ctx);
    fm_model_free(m);
    free(ids);
}

/* The window arithmetic refuses requests the ids cannot satisfy. */
static void perplexity_rejects_bad_windows(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("tests/models/qwen3-moe-f32", &opt, &m, &err), FM_OK);
    fm_context *ctx = NULL;
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    int32_t ids[40] = {0};
    double ppl = 0, loss = 0;
    assert_int_equal(fm_context_perplexity(ctx, ids, 40, 16, 3, NULL, NULL, &ppl, &loss, &err), FM_ERR_FORMAT);
    assert_int_equal(fm_context_perplexity(ctx, ids, 40, 1, 1, NULL, NULL, &ppl, &loss, &err), FM_ERR_USAGE);
    assert_int_equal(fm_context_perplexity(ctx, ids, 40, 16, 2, NULL, NULL, &ppl, &loss, &err), FM_OK);
    assert_true(ppl > 1.0 && isfinite(ppl));
    fm_context_free(ctx);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(perplexity_rejects_bad_windows),
        cmocka_unit_test(ref_perplexity_matches_transformers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
