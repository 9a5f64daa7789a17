/* Expert parallelism over whole models (src/dist/ep_model.h, host form on the cpu backend): the golden checkpoints
 * split over 2 and 4 ranks (each rank a model holding its share of the experts, a thread each, exchanging through the
 * simulated communicator) give the logits of one model holding every expert, bit for bit, for every position of a
 * prompt that does not split evenly over the ranks and of one shorter than the ranks; for the oracle and the fp8
 * preset, on Qwen3-MoE, Mixtral and Qwen3-Next (whose shared expert stays on every rank). The ranks' expert bytes add
 * up to the single model's; splits the model does not allow are refused with the numbers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_runner.h"
#include "dist/ep_model.h"

static fm_options options(fm_preset p) {
    fm_options o;
    fm_options_init(&o);
    o.preset = p;
    return o;
}

static float *logits_of(fm_model *m, fm_ep_group *g, const int32_t *ids, int64_t T) {
    const size_t n = (size_t)T * (size_t)fm_model_vocab_size(g ? g->models[0] : m);
    float *out = malloc(n * sizeof *out);
    assert_non_null(out);
    fm_error err = {{0}};
    const fm_status st =
        g ? fm_ep_group_forward(g, ids, T, false, out, &err) : fm_forward(m, ids, T, false, out, NULL, &err);
    if (st) fail_msg("forward: %s", err.msg);
    return out;
}

static size_t expert_bytes(const fm_model *m) {
    size_t b = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe)
            b += m->be->ops->bank_bytes(m->layers[l].gate_up) + m->be->ops->bank_bytes(m->layers[l].down);
    return b;
}

static void group_case(const char *dir, fm_preset p, int n_ranks) {
    fm_options o = options(p);
    fm_error err = {{0}};
    fm_model *one = NULL;
    fm_ep_group *g = NULL;
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    if (fm_ep_group_load(dir, &o, n_ranks, &g, &err)) fail_msg("load %s over %d ranks: %s", dir, n_ranks, err.msg);
    const int32_t V = fm_model_vocab_size(one);
    const int64_t Ts[] = {23, 3}; /* 23: shares of 12/11 or 6/6/6/5 rows; 3 over 4 ranks: the last one sends none */
    for (int i = 0; i < 2; i++) {
        int32_t ids[23];
        for (int64_t t = 0; t < Ts[i]; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
        float *a = logits_of(one, NULL, ids, Ts[i]), *b = logits_of(NULL, g, ids, Ts[i]);
        if (memcmp(a, b, (size_t)Ts[i] * (size_t)V * sizeof *a)) {
            int64_t first = 0;
            while (a[first] == b[first]) first++;
            fail_msg("%s %s over %d ranks, T = %lld: logit %lld is %.9g, one model gives %.9g", dir, fm_preset_name(p),
                     n_ranks, (long long)Ts[i], (long long)first, (double)b[first], (double)a[first]);
        }
        free(a), free(b);
    }
    size_t sum = 0;
    for (int r = 0; r < n_ranks; r++) sum += fm_ep_group_expert_bytes(g, r);
    assert_int_equal(sum, expert_bytes(one));
    assert_int_equal(g->models[n_ranks - 1]->ep_first + g->models[n_ranks - 1]->ep_n, one->cfg.n_experts);
    printf("  %-32s %-4s over %d ranks: logits of every position bit-identical (T = 23, 3); %zu of %zu expert bytes "
           "on rank 0\n",
           dir, fm_preset_name(p), n_ranks, fm_ep_group_expert_bytes(g, 0), sum);
    fm_ep_group_free(g);
    fm_model_free(one);
}

static void whole_models_match_one_rank(void **s) {
    (void)s;
    const char *dirs[] = {"tests/models/qwen3-moe-f32", "tests/models/mixtral-f32-sharded",
                          "tests/models/qwen3-next-f32", "tests/models/qwen3-moe-tied-f32"};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_FP8};
    for (int d = 0; d < 4; d++)
        for (int p = 0; p < 2; p++) {
            group_case(dirs[d], presets[p], 2);
            if (d == 0 || d == 3) group_case(dirs[d], presets[p], 4);
        }
}

static void expect_refused(const fm_options *o, int n_ranks, fm_status want, const char *needle) {
    fm_error err = {{0}};
    fm_ep_group *g = NULL;
    const fm_status st = fm_ep_group_load("tests/models/qwen3-moe-f32", o, n_ranks, &g, &err);
    if (st != want || !strstr(err.msg, needle))
        fail_msg("--ep %d: status %d (want %d), message '%s' should name '%s'", n_ranks, st, want, err.msg, needle);
    assert_null(g);
}

static void splits_the_model_cannot_take_are_refused(void **s) {
    (void)s;
    fm_options o = options(FM_PRESET_REF);
    expect_refused(&o, 3, FM_ERR_USAGE, "8 experts do not split evenly over 3 ranks");
    expect_refused(&o, 1, FM_ERR_USAGE, "--ep must be 2..64 ranks for a group, got 1");
    o.experts_in = FM_EXPERTS_HOST;
    expect_refused(&o, 2, FM_ERR_USAGE, "--ep with --experts-in host");
    o = options(FM_PRESET_FP8);
    o.backend = "cuda";
    expect_refused(&o, 2, FM_ERR_UNSUPPORTED, "the GPU form over NCCL is not built yet");
    /* one rank's options out of range, through the model's own load */
    o = options(FM_PRESET_REF);
    o.ep_ranks = 4, o.ep_rank = 4;
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("tests/models/qwen3-moe-f32", &o, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "expert-parallel rank 4 of 4 ranks"));
    assert_null(m);
}

static void read_all(const char *path, float *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, sizeof *buf, n, f), n);
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
}

/* `fp8moe logits --ep N` writes the file the command writes without it; `inspect --ep N` prints the partition; bad
   values are usage errors */
static void cli_commands(void **s) {
    (void)s;
    char ids[300], one[300], two[300];
    snprintf(ids, sizeof ids, "%s/ids.i32", cli_tmp);
    snprintf(one, sizeof one, "%s/one.f32", cli_tmp);
    snprintf(two, sizeof two, "%s/two.f32", cli_tmp);
    int32_t prompt[17];
    for (int t = 0; t < 17; t++) prompt[t] = (t * 11 + 5) % 64;
    cli_write_ids(ids, prompt, 17);
    const char *model = "--model tests/models/qwen3-moe-f32 --preset fp8";
    assert_int_equal(fp8moe("logits %s --ids %s --out %s", model, ids, one), 0);
    assert_int_equal(fp8moe("logits %s --ids %s --out %s --ep 2", model, ids, two), 0);
    fm_options o = options(FM_PRESET_FP8);
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("tests/models/qwen3-moe-f32", &o, &m, &err), FM_OK);
    const size_t n = 17 * (size_t)fm_model_vocab_size(m);
    fm_model_free(m);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    read_all(one, a, n), read_all(two, b, n);
    assert_memory_equal(a, b, n * sizeof *a);
    free(a), free(b);
    assert_int_equal(fp8moe("logits %s --ids %s --out %s --ep 3", model, ids, two), 2);
    assert_non_null(strstr(cli_err, "8 experts do not split evenly over 3 ranks"));
    assert_int_equal(fp8moe("logits %s --ids %s --out %s --ep 0", model, ids, two), 2);
    assert_non_null(strstr(cli_err, "--ep"));
    /* inspect: the partition, rank by rank */
    assert_int_equal(fp8moe("inspect %s --tokens 64 --ep 4", model), 0);
    assert_non_null(strstr(cli_out, "expert parallelism over 4 ranks"));
    assert_non_null(strstr(cli_out, "6..7 of 8"));
    assert_int_equal(fp8moe("inspect %s --tokens 64 --ep 3", model), 2);
    assert_non_null(strstr(cli_err, "8 experts do not split evenly over 3 ranks"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole_models_match_one_rank),
        cmocka_unit_test(splits_the_model_cannot_take_are_refused),
        cmocka_unit_test(cli_commands),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
