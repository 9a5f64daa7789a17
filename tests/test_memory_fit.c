/* The server's default --max-seqs and --ctx on a GPU (engine/memory_fit.h), from the memory plan of
 * models/tiny-code-moe under the fp8 preset against budgets made from the plan itself: as many sequences as fit,
 * capped; a shorter context when the whole one does not fit; a refusal when the model alone does not. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/memory_fit.h"
#include "engine/memory_plan.h"

static fm_config cfg;
static fm_plan plan;
static size_t base, per_seq; /* the model's peak for a 512-token chunk; one sequence of the whole context */

static int setup(void **state) {
    (void)state;
    fm_error err;
    if (fm_config_load("models/tiny-code-moe", &cfg, &err)) return -1;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_plan_set_dense(&plan, FM_DENSE_W8A8);
    fm_memory_plan p;
    if (fm_memory_plan_compute(&cfg, &plan, "cuda", cfg.n_layers, 512, &p, &err)) return -1;
    base = p.peak;
    if (fm_memory_plan_add_generation(&p, &cfg, &plan, 1, cfg.max_position_embeddings, &err)) return -1;
    per_seq = p.peak - base;
    return per_seq > 0 ? 0 : -1;
}

static void fits_whole_context(void **state) {
    (void)state;
    fm_error err;
    int32_t seqs = 0;
    int64_t ctx = 0;
    assert_int_equal(fm_memory_fit_sequences(&cfg, &plan, cfg.n_layers, 512, base + 10 * per_seq + per_seq / 2, 256,
                                             &seqs, &ctx, &err),
                     FM_OK);
    assert_int_equal(seqs, 10);
    assert_int_equal(ctx, cfg.max_position_embeddings);
    seqs = 0, ctx = 0; /* a huge card: the cap */
    assert_int_equal(
        fm_memory_fit_sequences(&cfg, &plan, cfg.n_layers, 512, base + 1000 * per_seq, 64, &seqs, &ctx, &err), FM_OK);
    assert_int_equal(seqs, 64);
}

static void shortens_context(void **state) {
    (void)state;
    fm_error err;
    int32_t seqs = 8; /* --max-seqs 8 given, room for 2.5 whole contexts */
    int64_t ctx = 0;
    const size_t budget = base + 5 * per_seq / 2;
    assert_int_equal(fm_memory_fit_sequences(&cfg, &plan, cfg.n_layers, 512, budget, 256, &seqs, &ctx, &err), FM_OK);
    assert_int_equal(seqs, 8);
    assert_true(ctx < cfg.max_position_embeddings && ctx >= 16 && ctx % 16 == 0);
    fm_memory_plan p; /* what was chosen fits */
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", cfg.n_layers, 512, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, seqs, ctx, &err), FM_OK);
    assert_true(p.peak <= budget);
}

static void refuses_what_cannot_fit(void **state) {
    (void)state;
    fm_error err;
    int32_t seqs = 0;
    int64_t ctx = 0;
    assert_int_equal(fm_memory_fit_sequences(&cfg, &plan, cfg.n_layers, 512, base / 2, 256, &seqs, &ctx, &err),
                     FM_ERR_NOMEM);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(fits_whole_context), cmocka_unit_test(shortens_context),
                                       cmocka_unit_test(refuses_what_cannot_fit)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
