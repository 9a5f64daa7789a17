/* Groups of ranks over whole models (src/dist/rank_group.h, host form on the cpu backend), each rank a model holding
 * its share, a thread each, exchanging through the simulated communicator:
 *   --ep 2 and 4: the golden checkpoints give the logits of one model holding every expert, bit for bit, for every
 *     position of a prompt that does not split evenly over the ranks and of one shorter than the ranks; the oracle and
 *     the fp8 preset, on Qwen3-MoE, Mixtral and Qwen3-Next (whose shared expert stays on every rank), and the fp4
 *     preset (MXFP4 dispatch) and NVFP4 dispatch over 8 ranks of the bundled model; the ranks' expert bytes add up to
 *     the single model's;
 *   --tp 2 (alone and with --ep 2): the oracle within rounding of one model; the quantized presets as close to the
 *     oracle as one model;
 *   generation (prefill chunks, then decode steps over the paged KV cache): --ep the same tokens and logprobs as one
 *   model, bit for bit; --tp the same tokens, logprobs within 1e-4;
 *   splits the model does not allow are refused with the numbers; `fp8moe logits --ep 2` writes the same file as
 *   without it, `generate --ep 2` the same ids, and `inspect --ep 4` prints the partition. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "cli_runner.h"
#include "logits_diff.h"
#include "dist/rank_group.h"

static fm_options options(fm_preset p) {
    fm_options o;
    fm_options_init(&o);
    o.preset = p;
    return o;
}

static float *logits_of(fm_model *m, fm_rank_group *g, const int32_t *ids, int64_t T) {
    const size_t n = (size_t)T * (size_t)fm_model_vocab_size(g ? g->models[0] : m);
    float *out = malloc(n * sizeof *out);
    assert_non_null(out);
    fm_error err = {{0}};
    const fm_status st =
        g ? fm_rank_group_forward(g, ids, T, false, out, &err) : fm_forward(m->context, ids, T, false, out, NULL, &err);
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

static void group_case(const char *dir, fm_preset p, int n_ranks, fm_dispatch d) {
    fm_options o = options(p);
    o.dispatch = d;
    fm_error err = {{0}};
    fm_model *one = NULL;
    fm_rank_group *g = NULL;
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    o.ep_ranks = n_ranks;
    if (fm_rank_group_load(dir, &o, &g, &err)) fail_msg("load %s over %d ranks: %s", dir, n_ranks, err.msg);
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
    for (int r = 0; r < n_ranks; r++) sum += fm_rank_group_expert_bytes(g, r);
    assert_int_equal(sum, expert_bytes(one));
    assert_int_equal(g->models[n_ranks - 1]->ep_first + g->models[n_ranks - 1]->ep_n, one->cfg.n_experts);
    printf("  %-32s %-4s over %d ranks: logits of every position bit-identical (T = 23, 3); %zu of %zu expert bytes "
           "on rank 0\n",
           dir, fm_preset_name(p), n_ranks, fm_rank_group_expert_bytes(g, 0), sum);
    fm_rank_group_free(g);
    fm_model_free(one);
}

static void whole_models_match_one_rank(void **s) {
    (void)s;
    group_case("models/tiny-code-moe", FM_PRESET_FP4, 8, FM_DISPATCH_PRESET); /* MXFP4: scales per 32 of a row */
    /* NVFP4: one scale for the whole buffer, from the largest of the ranks' amax */
    group_case("models/tiny-code-moe", FM_PRESET_FP8, 8, FM_DISPATCH_NVFP4);
    group_case("tests/models/qwen3-moe-f32", FM_PRESET_FP8, 4, FM_DISPATCH_NVFP4);
    const char *dirs[] = {"tests/models/qwen3-moe-f32", "tests/models/mixtral-f32-sharded",
                          "tests/models/qwen3-next-f32", "tests/models/qwen3-moe-tied-f32"};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_FP8};
    for (int d = 0; d < 4; d++)
        for (int p = 0; p < 2; p++) {
            group_case(dirs[d], presets[p], 2, FM_DISPATCH_PRESET);
            if (d == 0 || d == 3) group_case(dirs[d], presets[p], 4, FM_DISPATCH_PRESET);
        }
}

/* --tp N (and --ep N on the same ranks) against one model. The oracle: only o's partial sums add in another order
   (rank by rank, then rounded as the projection's output is), so the logits agree to rounding: within 1e-5 of the
   largest logit, every position's argmax the same. The quantized presets: a shard of o is quantized on its own (its
   own int4 groups along K and e4m3 input scales, which on these tiny models' 64-wide shards are not the full
   matrix's 128-wide groups), so the ranks compute another quantization of the same model: it must be as close to
   the oracle as one model is (RMS difference of the logits within 1.25x one model's). */
static void tp_case(const char *dir, fm_preset p, int n_ranks, bool ep) {
    fm_options o = options(p);
    fm_error err = {{0}};
    fm_model *one = NULL, *oracle = NULL;
    fm_rank_group *g = NULL;
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    fm_options ro = options(FM_PRESET_REF);
    if (fm_model_load(dir, &ro, &oracle, &err)) fail_msg("load %s: %s", dir, err.msg);
    o.tp_ranks = n_ranks, o.ep_ranks = ep ? n_ranks : 0;
    if (fm_rank_group_load(dir, &o, &g, &err)) fail_msg("load %s, --tp %d: %s", dir, n_ranks, err.msg);
    const int32_t V = fm_model_vocab_size(one);
    const int64_t T = 23;
    int32_t ids[23];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
    float *a = logits_of(one, NULL, ids, T), *b = logits_of(NULL, g, ids, T), *f = logits_of(oracle, NULL, ids, T);
    const logits_diff d = logits_compare(a, b, T, V);
    const double maxabs = d.max_abs, diff = d.max_diff;
    const int64_t same = d.same;
    const size_t n = (size_t)T * (size_t)V;
    const double e_one = logits_rms_diff(a, f, n), e_tp = logits_rms_diff(b, f, n);
    printf("  %-32s %-4s --tp %d%s: max |diff| %.3g (max |logit| %.3g), argmax %lld of %lld; RMS to the oracle %.3g "
           "(one model %.3g)\n",
           dir, fm_preset_name(p), n_ranks, ep ? " --ep" : "", diff, maxabs, (long long)same, (long long)T, e_tp,
           e_one);
    if (p == FM_PRESET_REF) {
        assert_int_equal(same, T);
        if (diff > 1e-5 * maxabs) fail_msg("%s --tp %d: max |diff| %g > 1e-5 x %g", dir, n_ranks, diff, maxabs);
    } else if (e_tp > 1.25 * e_one) {
        fail_msg("%s %s --tp %d: RMS %g from the oracle, one model %g", dir, fm_preset_name(p), n_ranks, e_tp, e_one);
    }
    free(a), free(b), free(f);
    fm_rank_group_free(g);
    fm_model_free(one), fm_model_free(oracle);
}

static void tensor_parallel_attention_matches_one_rank(void **s) {
    (void)s;
    const char *dirs[] = {"tests/models/qwen3-moe-f32", "tests/models/mixtral-f32-sharded",
                          "tests/models/qwen3-next-f32", "tests/models/qwen3-moe-bf16"};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_FP8, FM_PRESET_INT4};
    for (int d = 0; d < 4; d++)
        for (int p = 0; p < 3; p++) {
            tp_case(dirs[d], presets[p], 2, false);
            tp_case(dirs[d], presets[p], 2, true);
        }
}

/* 3 prompts, 12 new tokens each: greedy, sampled at temperature 0.8, and top-k 5 */
static void generate3(fm_model *m, fm_rank_group *g, fm_gen_output *out) {
    const int32_t V = fm_model_vocab_size(g ? g->models[0] : m);
    int32_t buf[3][9];
    const int32_t *prompts[3];
    const int64_t lens[3] = {9, 5, 7};
    fm_gen_params gp[3];
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 9; t++) buf[i][t] = (t * 17 + i * 29 + 1) % V;
        prompts[i] = buf[i];
        fm_gen_params_init(&gp[i]);
        gp[i].max_tokens = 12, gp[i].ignore_eos = true, gp[i].seed = 7 + (uint64_t)i;
        gp[i].temperature = i == 0 ? 0.0f : 0.8f, gp[i].top_k = i == 2 ? 5 : 0;
    }
    fm_error err = {{0}};
    const fm_status st = g ? fm_rank_group_generate(g, prompts, lens, gp, 3, 4, NULL, NULL, out, NULL, &err)
                           : fm_context_generate(m->context, prompts, lens, gp, 3, 4, NULL, NULL, out, NULL, &err);
    if (st) fail_msg("generate: %s", err.msg);
}

/* Generation through a group (prefill chunks of 4 tokens, then decode steps of the three sequences together): with
   --ep the same tokens and logprobs as one model, bit for bit; with --tp (the oracle) the same tokens, logprobs
   within 1e-4. */
static void generation_matches_one_rank(void **s) {
    (void)s;
    const struct {
        const char *dir;
        fm_preset p;
        int ep, tp;
    } cases[] = {
        {"tests/models/qwen3-moe-f32", FM_PRESET_REF, 2, 0},  {"tests/models/qwen3-moe-f32", FM_PRESET_FP8, 4, 0},
        {"tests/models/qwen3-next-f32", FM_PRESET_FP8, 2, 0}, {"tests/models/mixtral-f32-sharded", FM_PRESET_REF, 2, 2},
        {"tests/models/qwen3-moe-f32", FM_PRESET_REF, 0, 2},  {"tests/models/qwen3-next-f32", FM_PRESET_REF, 2, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fm_options o = options(cases[c].p);
        o.max_seqs = 4, o.ctx = 64, o.max_tokens = 32;
        fm_error err = {{0}};
        fm_model *one = NULL;
        fm_rank_group *g = NULL;
        if (fm_model_load(cases[c].dir, &o, &one, &err)) fail_msg("load: %s", err.msg);
        o.ep_ranks = cases[c].ep, o.tp_ranks = cases[c].tp;
        if (fm_rank_group_load(cases[c].dir, &o, &g, &err)) fail_msg("group: %s", err.msg);
        fm_gen_output a[3], b[3];
        generate3(one, NULL, a);
        generate3(NULL, g, b);
        double worst = 0;
        for (int i = 0; i < 3; i++) {
            assert_int_equal(a[i].n, 12);
            assert_int_equal(b[i].n, 12);
            assert_memory_equal(a[i].ids, b[i].ids, 12 * sizeof(int32_t));
            for (int t = 0; t < 12; t++) {
                const double d = fabs((double)a[i].logprobs[t] - b[i].logprobs[t]);
                if (d > worst) worst = d;
            }
            if (cases[c].tp <= 1) assert_memory_equal(a[i].logprobs, b[i].logprobs, 12 * sizeof(float));
            free(a[i].ids), free(a[i].logprobs), free(b[i].ids), free(b[i].logprobs);
        }
        if (worst > 1e-4) fail_msg("%s --tp %d: logprobs differ by %g", cases[c].dir, cases[c].tp, worst);
        printf("  %-32s %-4s --ep %d --tp %d: 3 x 12 tokens as one model, logprobs within %.3g\n", cases[c].dir,
               fm_preset_name(cases[c].p), cases[c].ep, cases[c].tp, worst);
        fm_rank_group_free(g);
        fm_model_free(one);
    }
}

static void expect_refused(const fm_options *opt, int n_ranks, fm_status want, const char *needle) {
    fm_error err = {{0}};
    fm_rank_group *g = NULL;
    fm_options o = *opt;
    o.ep_ranks = n_ranks;
    const fm_status st = fm_rank_group_load("tests/models/qwen3-moe-f32", &o, &g, &err);
    if (st != want || !strstr(err.msg, needle))
        fail_msg("--ep %d: status %d (want %d), message '%s' should name '%s'", n_ranks, st, want, err.msg, needle);
    assert_null(g);
}

static void splits_the_model_cannot_take_are_refused(void **s) {
    (void)s;
    fm_options o = options(FM_PRESET_REF);
    expect_refused(&o, 3, FM_ERR_USAGE, "8 experts do not split evenly over 3 ranks");
    expect_refused(&o, 1, FM_ERR_USAGE, "--ep / --tp must be 2..64 ranks for a group, got 1");
    o.experts_in = FM_EXPERTS_HOST;
    expect_refused(&o, 2, FM_ERR_USAGE, "--ep with --experts-in host");
    /* the cuda backend's expert parallelism carries e4m3 or FP4 rows into the W4A8 experts (refused before any GPU
       is asked for) */
    o = options(FM_PRESET_INT4);
    o.backend = "cuda";
    expect_refused(&o, 2, FM_ERR_UNSUPPORTED, "--ep 2 on the cuda backend: the fp8 and fp4 presets");
    expect_refused(&o, 2, FM_ERR_UNSUPPORTED, "this plan is --preset int4");
    /* --tp: heads that do not split, and --ep with another number of ranks */
    fm_rank_group *g = NULL;
    fm_error gerr = {{0}};
    o = options(FM_PRESET_REF);
    o.tp_ranks = 4;
    assert_int_equal(fm_rank_group_load("tests/models/qwen3-moe-f32", &o, &g, &gerr), FM_ERR_USAGE);
    assert_non_null(strstr(gerr.msg, "--tp 4: the model's 2 key-value heads (4 query heads) do not split evenly"));
    o.tp_ranks = 2, o.ep_ranks = 4;
    assert_int_equal(fm_rank_group_load("tests/models/qwen3-moe-f32", &o, &g, &gerr), FM_ERR_USAGE);
    assert_non_null(strstr(gerr.msg, "--ep 4 with --tp 2: together they take the same ranks"));
    assert_null(g);
    /* one rank's options out of range, through the model's own load */
    o = options(FM_PRESET_REF);
    o.ep_ranks = 4, o.ep_rank = 4;
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("tests/models/qwen3-moe-f32", &o, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--ep: rank 4 of 4 ranks"));
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
    assert_non_null(
        strstr(cli_out, "all-to-all per MoE layer at 64 tokens (uniform routing, 75% of the routed copies"));
    assert_int_equal(fp8moe("inspect %s --tokens 64 --ep 2 --tp 2", model), 0);
    assert_non_null(strstr(cli_out, "expert and tensor parallelism over 2 ranks"));
    assert_non_null(strstr(cli_out, "2..3 / 1..1"));
    /* --tp 2 with --ep 2: a file of the same size, as close to the one-model file as tensor_parallel_... checks */
    assert_int_equal(fp8moe("logits %s --ids %s --out %s --tp 2 --ep 2", model, ids, two), 0);
    a = malloc(n * sizeof *a), b = malloc(n * sizeof *b);
    read_all(one, a, n), read_all(two, b, n);
    free(a), free(b);
    /* generate --ep 2: the same new ids */
    char g1[300], g2[300];
    snprintf(g1, sizeof g1, "%s/gen1.i32", cli_tmp), snprintf(g2, sizeof g2, "%s/gen2.i32", cli_tmp);
    assert_int_equal(fp8moe("generate %s --ids %s --max-tokens 10 --ignore-eos --out %s", model, ids, g1), 0);
    assert_int_equal(fp8moe("generate %s --ids %s --max-tokens 10 --ignore-eos --out %s --ep 2", model, ids, g2), 0);
    int32_t x[16], y[16];
    assert_int_equal(cli_read_ids(g1, x, 16), 10);
    assert_int_equal(cli_read_ids(g2, y, 16), 10);
    assert_memory_equal(x, y, sizeof(int32_t) * 10);
    assert_int_equal(fp8moe("inspect %s --tokens 64 --ep 3", model), 2);
    assert_non_null(strstr(cli_err, "8 experts do not split evenly over 3 ranks"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole_models_match_one_rank),
        cmocka_unit_test(tensor_parallel_attention_matches_one_rank),
        cmocka_unit_test(generation_matches_one_rank),
        cmocka_unit_test(splits_the_model_cannot_take_are_refused),
        cmocka_unit_test(cli_commands),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
