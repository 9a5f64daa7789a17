/* Generation on the CUDA backend.
 *   - cached steps against the full prefill on the GPU (a fresh prefill, one decode step per token through the
 *     paged cache, the prompt in chunks): cosine per row >= 0.99999 for ref32 (fp32; the two attention kernels sum
 *     in different orders), >= 0.999 for ref and int4 (both kernels round P to bf16, at different tiles, and the
 *     projections run other kernels at M = 1), >= 0.995 for fp8 (the same bf16 differences, where one crosses an
 *     e4m3 rounding boundary of an activation, move that activation by a whole e4m3 step, 1/16 relative: measured
 *     0.99837 on qwen3-moe-bf16);
 *   - decode steps replayed as CUDA graphs give the tokens of the same steps launched one by one (route
 *     decode.graphs=off), bit for bit: four sequences of equal length, so both runs have the same batch shapes;
 *   - route paged.combine=fused gives the tokens and log-probabilities of paged.combine=kernel bit for bit, its
 *     decode graph one kernel node fewer per attention layer;
 *   - Qwen3-Next (its Gated DeltaNet states beside the KV cache): the same, and three sequences replaying a 4-row
 *     decode graph (one padding row) against launches without padding; the default routes (the shared expert on
 *     the side stream, k and v stored by the RoPE kernel) against shared.stream=off,rope.store=off, bit for bit;
 *   - ref32 greedy generation equals transformers' generate(do_sample=False) for 32 new tokens on every model with
 *     a golden_generate.json (prompts chosen where no step's top-1/top-2 margin is a near tie), and every preset's
 *     agreement with it is printed. */
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

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "model/arch.h"
#include "gpu_test_util.h"

static fm_model *load(const char *dir, fm_preset preset, bool w8a8, int32_t max_seqs, const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = preset, opt.dense = w8a8 ? FM_DENSE_W8A8 : FM_DENSE_PRESET;
    opt.max_seqs = max_seqs, opt.ctx = 128, opt.max_tokens = 64, opt.routes = routes ? routes : gpu_test_routes();
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
    return m;
}

static double cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* *w, *at: the lowest cosine so far and its position */
static void worse(double *w, int *at, double c, int t) {
    if (c < *w) *w = c, *at = t;
}

/* What this checks is the cache: positions, slots, paged attention. So both passes run the experts on one kernel
   (route moe.gemv=off: the grouped GEMM at every size). The default decode route, the grouped GEMVs, equals the CPU
   emulation exactly where the GEMM is within 5e-3 of it (test_cuda_ops, test_moe_w4a8), and a step on one against a
   prefill on the other measures the GEMM's rounding, not the cache (tiny-code-moe fp8: cosine 0.9917). */
static void cached_vs_prefill_routes(const char *dir, fm_preset preset, double bound, const char *routes) {
    enum { N = 40, P = 17 };
    /* the case's routes, then the command line's (--route): later keys win, so a forced route applies and the
       case's other keys stay */
    char all[256];
    snprintf(all, sizeof all, "%s%s%s", routes, gpu_test_routes() ? "," : "",
             gpu_test_routes() ? gpu_test_routes() : "");
    fm_model *m = load(dir, preset, false, 2, all);
    const int32_t V = fm_model_vocab_size(m);
    int32_t ids[N], seqs[N], pos[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 11) % V, pos[i] = i;
    float *full = malloc((size_t)N * V * sizeof *full), *row = malloc((size_t)N * V * sizeof *row);
    fm_error err;
    assert_int_equal(fm_forward(m->context, ids, N, false, full, NULL, &err), FM_OK);
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq;
    double worst = 1.0, phase[3] = {1.0, 1.0, 1.0}; /* fresh prefill, decode steps, chunks */
    int at[3] = {-1, -1, -1};                       /* each phase's worst position */
    assert_int_equal(fm_kv_seq_begin(m->context, ids, P, &sp, &seq, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, P, &err), FM_OK);
    m->context->kv->tables_dirty = true;
    for (int t = 0; t < N; t++) seqs[t] = seq;
    assert_int_equal(fm_step_stage(m->context, ids, seqs, pos, P, &err), FM_OK);
    fm_step_device(m->context, P, false, FM_ATTN_FRESH);
    assert_int_equal(fm_step_logits(m->context, P, row, &err), FM_OK);
    for (int t = 0; t < P; t++) worse(&phase[0], &at[0], cosine(full + (size_t)t * V, row + (size_t)t * V, V), t);
    for (int t = P; t < N; t++) {
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, 1, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(m->context, ids + t, seqs, pos + t, 1, &err), FM_OK);
        fm_step_device(m->context, 1, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, 1, row, &err), FM_OK);
        worse(&phase[1], &at[1], cosine(full + (size_t)t * V, row, V), t);
    }
    fm_kv_seq_end(m->context, seq);
    assert_int_equal(fm_kv_seq_begin(m->context, ids, N, &sp, &seq, &err), FM_OK);
    for (int p0 = 0; p0 < N; p0 += 9) {
        const int T = N - p0 < 9 ? N - p0 : 9;
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, T, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(m->context, ids + p0, seqs, pos + p0, T, &err), FM_OK);
        fm_step_device(m->context, T, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, T, row, &err), FM_OK);
        for (int t = 0; t < T; t++)
            worse(&phase[2], &at[2], cosine(full + (size_t)(p0 + t) * V, row + (size_t)t * V, V), p0 + t);
    }
    fm_kv_seq_end(m->context, seq);
    worst = fmin(phase[0], fmin(phase[1], phase[2]));
    printf("  %-32s %-5s cached steps vs full prefill: worst cosine %.8f (bound %g; fresh %.8f at %d, decode %.8f at "
           "%d, chunks %.8f at %d; routes %s)\n",
           dir, fm_preset_name(preset), worst, bound, phase[0], at[0], phase[1], at[1], phase[2], at[2], all);
    assert_true(worst >= bound);
    free(full), free(row);
    fm_model_free(m);
}

static void cached_vs_prefill(const char *dir, fm_preset preset, double bound) {
    cached_vs_prefill_routes(dir, preset, bound, "moe.gemv=off");
}

static void test_cached_steps(void **state) {
    (void)state;
    cached_vs_prefill("tests/models/qwen3-moe-bf16", FM_PRESET_REF32, 0.99999);
    cached_vs_prefill("tests/models/qwen3-moe-bf16", FM_PRESET_REF, 0.999);
    cached_vs_prefill("tests/models/qwen3-moe-bf16", FM_PRESET_FP8, 0.995);
    cached_vs_prefill("models/tiny-code-moe", FM_PRESET_FP8, 0.995);
    cached_vs_prefill("tests/models/qwen3-moe-tied-f32", FM_PRESET_FP8, 0.995); /* a dense MLP layer: W4A8 at M = 1 */
    cached_vs_prefill("tests/models/mixtral-f32-sharded", FM_PRESET_INT4, 0.999);
    /* Qwen3-Next: the Gated DeltaNet's conv and recurrent states carried through the fresh prefill (the chunked
       rule), the decode steps and the chunks (token by token) */
    cached_vs_prefill("tests/models/qwen3-next-bf16", FM_PRESET_REF32, 0.99999);
    cached_vs_prefill("tests/models/qwen3-next-bf16", FM_PRESET_REF, 0.999);
    cached_vs_prefill_routes("tests/models/qwen3-next-bf16", FM_PRESET_FP8, 0.0, "moe.gemv=off"); /* printed */
    cached_vs_prefill_routes("tests/models/qwen3-next-bf16", FM_PRESET_FP8, 0.995, "moe.gemv=off,dense.gemv=off");
    cached_vs_prefill_routes("tests/models/qwen3-next-bf16", FM_PRESET_INT4, 0.999, "moe.gemv=off");
    cached_vs_prefill("tests/models/qwen3-next-tied-f32", FM_PRESET_INT4, 0.999);
}

/* 4 sequences of 20-token prompts, 24 new tokens each (two greedy, two sampled) */
static void generate4(fm_model *m, int32_t V, fm_gen_output *out) {
    int32_t buf[4][20];
    const int32_t *prompts[4];
    const int64_t lens[4] = {20, 20, 20, 20};
    fm_gen_params gp[4];
    for (int i = 0; i < 4; i++) {
        for (int t = 0; t < 20; t++) buf[i][t] = (t * 13 + i * 101 + 5) % V;
        prompts[i] = buf[i];
        fm_gen_params_init(&gp[i]);
        gp[i].max_tokens = 24, gp[i].ignore_eos = true, gp[i].temperature = i % 2 ? 0.8f : 0.0f;
        gp[i].seed = 9, gp[i].top_k = i == 3 ? 20 : 0;
    }
    fm_error err;
    if (fm_context_generate(m->context, prompts, lens, gp, 4, 0, NULL, NULL, out, NULL, &err)) fail_msg("%s", err.msg);
}

static void test_graphs_equal_launches(void **state) {
    (void)state;
    const struct {
        fm_preset p;
        bool w8a8;
    } cases[] = {{FM_PRESET_REF, false}, {FM_PRESET_FP8, false}, {FM_PRESET_FP8, true}, {FM_PRESET_REF32, false}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fm_model *g = load("tests/models/qwen3-moe-bf16", cases[c].p, cases[c].w8a8, 4, NULL);
        char off[300];
        snprintf(off, sizeof off, "decode.graphs=off%s%s", gpu_test_routes() ? "," : "",
                 gpu_test_routes() ? gpu_test_routes() : "");
        fm_model *e = load("tests/models/qwen3-moe-bf16", cases[c].p, cases[c].w8a8, 4, off);
        const int32_t V = fm_model_vocab_size(g);
        fm_gen_output a[4], b[4];
        generate4(g, V, a);
        generate4(e, V, b);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(a[i].n, 24);
            assert_int_equal(b[i].n, 24);
            assert_memory_equal(a[i].ids, b[i].ids, 24 * sizeof(int32_t));
            free(a[i].ids), free(a[i].logprobs), free(b[i].ids), free(b[i].logprobs);
        }
        printf("  %s%s: 4 x 24 tokens, graphs equal launches\n", fm_preset_name(cases[c].p),
               cases[c].w8a8 ? " + w8a8" : "");
        fm_model_free(g), fm_model_free(e);
    }
}

/* Route paged.combine: the same tokens from decode graphs whose paged attention merges its splits in the split
 * kernel's last CTAs (fused) as from graphs with the combine kernel, bit for bit; the step's graph (its batch bucket's,
 * fm_decode_graph_nodes) has one kernel node fewer per attention layer (the op splits at these shapes: bf16, head dim
 * 32, a context of 128 in 2 splits), and its counts are printed (bench decode's launches per step). */
static void test_paged_combine_graphs(void **state) {
    (void)state;
    const char *forms[2] = {"paged.combine=kernel", "paged.combine=fused"};
    fm_gen_output out[2][4];
    fm_graph_nodes nodes[2];
    int32_t attn = 0;
    for (int f = 0; f < 2; f++) {
        char routes[300];
        snprintf(routes, sizeof routes, "%s%s%s", gpu_test_routes() ? gpu_test_routes() : "",
                 gpu_test_routes() ? "," : "", forms[f]);
        fm_model *m = load("tests/models/qwen3-moe-bf16", FM_PRESET_REF, false, 4, routes);
        assert_int_equal(m->cfg.head_dim % 16, 0); /* the split kernel's head dims */
        generate4(m, fm_model_vocab_size(m), out[f]);
        if (!fm_decode_graph_nodes(m->context, 4, &nodes[f])) fail_msg("%s: no decode graph for 4 rows", forms[f]);
        attn = fm_arch_attention_layers(&m->cfg, m->n_layers);
        printf("  %s: a decode step of 4 rows is %lld kernels, %lld copies, %lld other nodes\n", forms[f],
               (long long)nodes[f].kernels, (long long)nodes[f].copies, (long long)nodes[f].other);
        fm_model_free(m);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(out[0][i].n, 24);
        assert_int_equal(out[1][i].n, 24);
        assert_memory_equal(out[0][i].ids, out[1][i].ids, 24 * sizeof(int32_t));
        assert_memory_equal(out[0][i].logprobs, out[1][i].logprobs, 24 * sizeof(float));
        for (int f = 0; f < 2; f++) free(out[f][i].ids), free(out[f][i].logprobs);
    }
    assert_true(nodes[1].kernels > 0);
    assert_int_equal(nodes[0].kernels - nodes[1].kernels, attn);
    assert_int_equal(nodes[0].copies, nodes[1].copies);
}

/* Greedy decode steps of n sequences of the Qwen3-Next golden model, all n in every step: sequence i prefilled alone
   with prompt i % 3 (a fourth sequence repeats the first's prompt, so its rows are copies of the first's), then
   `steps` steps from the prompt's last id. ids, lps: [n][steps]. */
#define NEXT_STEPS 16
static void decode_together(fm_model *m, int32_t n, int32_t ids[4][NEXT_STEPS], float lps[4][NEXT_STEPS]) {
    const int32_t V = fm_model_vocab_size(m), P = 19;
    int32_t prompt[3][20], seq[4], in[4], pos[20];
    fm_sampling sp;
    fm_sampling_init(&sp);
    fm_error err = {{0}};
    for (int32_t i = 0; i < n; i++) {
        for (int t = 0; t < 20; t++) prompt[i % 3][t] = (t * 13 + (i % 3) * 101 + 5) % V;
        assert_int_equal(fm_kv_seq_begin(m->context, prompt[i % 3], P, &sp, &seq[i], &err), FM_OK);
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq[i], P, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        int32_t seqs[20];
        for (int t = 0; t < P; t++) seqs[t] = seq[i], pos[t] = t;
        assert_int_equal(fm_step_stage(m->context, prompt[i % 3], seqs, pos, P, &err), FM_OK);
        fm_step_device(m->context, P, true, FM_ATTN_FRESH);
        in[i] = prompt[i % 3][P];
    }
    for (int s = 0; s < NEXT_STEPS; s++) {
        int32_t out[4];
        float lp[4];
        if (fm_decode_step(m->context, n, in, seq, out, lp, &err)) fail_msg("decode step %d: %s", s, err.msg);
        for (int32_t i = 0; i < n; i++) ids[i][s] = in[i] = out[i], lps[i][s] = lp[i];
    }
    for (int32_t i = 0; i < n; i++) fm_kv_seq_end(m->context, seq[i]);
}

/* the first step where two sequences' tokens or logprobs differ (NEXT_STEPS: none) */
static int first_difference(const int32_t *a, const float *alp, const int32_t *b, const float *blp) {
    int s = 0;
    while (s < NEXT_STEPS && a[s] == b[s] && !memcmp(&alp[s], &blp[s], sizeof *alp)) s++;
    return s;
}

/* Qwen3-Next's states under decode graphs. Three sequences replay the 4-row graph with one padding row (a copy of
   row 0, generate.c), which must not advance sequence 0's conv and recurrent states a second time. The same three
   with a fourth, real sequence in that row (the first's prompt again: the same row, its own states) run the same
   kernels on the same rows, so the three must come out bit for bit as with the padding row; a second update of
   sequence 0's states would change its next tokens' logprobs. Then graphs against launches at 4 rows, bit for bit,
   and the default routes against the shared expert on the main stream and the k and v stored by kv_store (routes
   shared.stream=off, rope.store=off): the same kernels in another order or launch, bit for bit.
   Qwen3-MoE (no recurrent state) runs the same comparisons, so that a difference is placed: the padding of the
   recurrent layers, or any model. Every comparison is printed before the first failing one fails the test. */
static void test_qwen3_next_graphs(void **state) {
    (void)state;
    const char *dirs[] = {"tests/models/qwen3-next-bf16", "tests/models/qwen3-moe-bf16"};
    char off[300], plain[300];
    snprintf(off, sizeof off, "decode.graphs=off%s%s", gpu_test_routes() ? "," : "",
             gpu_test_routes() ? gpu_test_routes() : "");
    snprintf(plain, sizeof plain, "shared.stream=off,rope.store=off%s%s", gpu_test_routes() ? "," : "",
             gpu_test_routes() ? gpu_test_routes() : "");
    const fm_preset presets[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_FP8};
    char failed[256] = "";
    for (int di = 0; di < 2; di++)
        for (size_t c = 0; c < sizeof presets / sizeof *presets; c++) {
            fm_model *g = load(dirs[di], presets[c], false, 4, NULL), *e = load(dirs[di], presets[c], false, 4, off),
                     *q = load(dirs[di], presets[c], false, 4, plain);
            int32_t pad[4][NEXT_STEPS], four[4][NEXT_STEPS], launched[4][NEXT_STEPS], serial[4][NEXT_STEPS];
            float pad_lp[4][NEXT_STEPS], four_lp[4][NEXT_STEPS], launched_lp[4][NEXT_STEPS], serial_lp[4][NEXT_STEPS];
            decode_together(g, 3, pad, pad_lp);
            decode_together(g, 4, four, four_lp);
            decode_together(e, 4, launched, launched_lp);
            decode_together(q, 4, serial, serial_lp);
            int d_pad[3], d_launch[4], d_serial[4];
            for (int i = 0; i < 4; i++) {
                if (i < 3) d_pad[i] = first_difference(pad[i], pad_lp[i], four[i], four_lp[i]);
                d_launch[i] = first_difference(four[i], four_lp[i], launched[i], launched_lp[i]);
                d_serial[i] = first_difference(four[i], four_lp[i], serial[i], serial_lp[i]);
            }
            const int d_rep = first_difference(four[3], four_lp[3], four[0], four_lp[0]);
            printf("  %s %s: of %d steps, equal until step | padding row vs a 4th sequence: %d %d %d | graphs vs "
                   "launches: %d %d %d %d | vs shared.stream=off,rope.store=off: %d %d %d %d | the repeated prompt "
                   "vs the first: %d\n",
                   dirs[di], fm_preset_name(presets[c]), NEXT_STEPS, d_pad[0], d_pad[1], d_pad[2], d_launch[0],
                   d_launch[1], d_launch[2], d_launch[3], d_serial[0], d_serial[1], d_serial[2], d_serial[3], d_rep);
            bool ok = true;
            for (int i = 0; i < 4; i++)
                ok &= (i == 3 || d_pad[i] == NEXT_STEPS) && d_launch[i] == NEXT_STEPS && d_serial[i] == NEXT_STEPS;
            if (!ok && !failed[0])
                snprintf(failed, sizeof failed, "%s %s: decode steps differ (above)", dirs[di],
                         fm_preset_name(presets[c]));
            fm_model_free(g), fm_model_free(e), fm_model_free(q);
        }
    if (failed[0]) fail_msg("%s", failed);
}

/* the golden generation of a model directory, or false when it has none */
static bool golden(const char *dir, int32_t **prompt, int64_t *n_prompt, int32_t **want, int64_t *n_want) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden_generate.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char *text = malloc(1 << 20);
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    const cJSON *p = cJSON_GetObjectItem(root, "prompt"), *w = cJSON_GetObjectItem(root, "new_ids");
    *n_prompt = cJSON_GetArraySize(p), *n_want = cJSON_GetArraySize(w);
    *prompt = malloc((size_t)*n_prompt * sizeof **prompt), *want = malloc((size_t)*n_want * sizeof **want);
    for (int i = 0; i < *n_prompt; i++) (*prompt)[i] = cJSON_GetArrayItem(p, i)->valueint;
    for (int i = 0; i < *n_want; i++) (*want)[i] = cJSON_GetArrayItem(w, i)->valueint;
    cJSON_Delete(root);
    return true;
}

static void test_golden_greedy(void **state) {
    (void)state;
    const char *dirs[] = {"tests/models/qwen3-moe-f32",
                          "tests/models/qwen3-moe-bf16",
                          "tests/models/qwen3-moe-tied-f32",
                          "tests/models/mixtral-f32-sharded",
                          "models/tiny-code-moe",
                          "tests/models/qwen3-next-f32",
                          "tests/models/qwen3-next-bf16",
                          "tests/models/qwen3-next-tied-f32"};
    const fm_preset presets[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
    int found = 0;
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        int32_t *prompt, *want;
        int64_t np, nw;
        if (!golden(dirs[d], &prompt, &np, &want, &nw)) continue;
        found++;
        for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
            fm_model *m = load(dirs[d], presets[p], false, 1, NULL);
            fm_gen_params gp;
            fm_gen_params_init(&gp);
            gp.max_tokens = nw;
            fm_gen_output o;
            fm_error err;
            const int32_t *pr[1] = {prompt};
            if (fm_context_generate(m->context, pr, &np, &gp, 1, 0, NULL, NULL, &o, NULL, &err))
                fail_msg("%s", err.msg);
            /* transformers returns an eos it stopped on; ours ends the output before it */
            const int64_t got = o.n + (o.finish == FM_FINISH_EOS);
            int64_t agree = 0;
            while (agree < o.n && agree < nw && o.ids[agree] == want[agree]) agree++;
            if (o.finish == FM_FINISH_EOS && agree == o.n && agree < nw) agree++; /* the eos itself */
            printf("  %-34s %-5s greedy: %lld of %lld tokens as transformers\n", dirs[d], fm_preset_name(presets[p]),
                   (long long)agree, (long long)nw);
            if (presets[p] == FM_PRESET_REF32) {
                assert_int_equal(got, nw);
                assert_int_equal(agree, nw);
            }
            free(o.ids), free(o.logprobs);
            fm_model_free(m);
        }
        free(prompt), free(want);
    }
    assert_true(found > 0);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_steps),         cmocka_unit_test(test_graphs_equal_launches),
        cmocka_unit_test(test_paged_combine_graphs), cmocka_unit_test(test_qwen3_next_graphs),
        cmocka_unit_test(test_golden_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
