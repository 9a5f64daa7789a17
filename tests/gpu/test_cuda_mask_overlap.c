/* Constrained decode steps on the CUDA backend, whose masks the host fills while the device runs the forward pass
 * (the pass and the sampler replayed as two graphs per bucket, the masks copied from pinned memory between them):
 *   - json_object over models/tiny-code-moe's real vocabulary, 4 requests decoded together (3 constrained, 1 not;
 *     sampled at temperature 0.8 and greedy), with graphs against launches one by one (route decode.graphs=off):
 *     the same ids bit for bit, every constrained id accepted by a fresh matcher, both graphs of the bucket
 *     captured; the fp8 and ref presets;
 *   - the same steps with every mask computed (no shared masks) give the same ids. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "gpu_test_util.h"
#include "text/grammar.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"

#define MODEL "models/tiny-code-moe"
#define N 4
#define MAX_TOKENS 48

static fm_model *load(fm_preset preset, bool graphs) {
    char routes[300];
    snprintf(routes, sizeof routes, "%s%s%s", graphs ? "" : "decode.graphs=off",
             gpu_test_routes() && !graphs ? "," : "", gpu_test_routes() ? gpu_test_routes() : "");
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = preset;
    opt.max_seqs = N, opt.ctx = 128, opt.max_tokens = 64, opt.routes = routes[0] ? routes : NULL;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(MODEL, &opt, &m, &err)) fail_msg("load %s: %s", MODEL, err.msg);
    return m;
}

/* N requests, rows 0, 2, 3 constrained to JSON objects; out[i] their ids. */
static void generate(fm_model *m, fm_token_vocab *v, const fm_grammar *g, fm_gen_output *out) {
    const int32_t end = fm_token_vocab_size(v) - 1;
    fm_matcher *mt[N];
    fm_token_constraint cons[N];
    fm_gen_params params[N];
    const int32_t *prompts[N];
    int64_t lens[N];
    static int32_t prompt[N][6];
    fm_error err;
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < 6; t++) prompt[i][t] = (t * 31 + i * 97 + 3) % 256;
        assert_int_equal(fm_matcher_create(g, v, &end, 1, &mt[i], &err), FM_OK);
        cons[i] = fm_matcher_constraint(mt[i]);
        fm_gen_params_init(&params[i]);
        params[i].temperature = i == 2 ? 0.0f : 0.8f, params[i].seed = 40 + (uint64_t)i;
        params[i].max_tokens = MAX_TOKENS, params[i].stop_ids = &end, params[i].n_stop_ids = 1;
        params[i].constraint = i == 1 ? NULL : &cons[i];
        prompts[i] = prompt[i], lens[i] = 6;
    }
    if (fm_context_generate(m->context, prompts, lens, params, N, 0, NULL, NULL, out, NULL, &err))
        fail_msg("generate: %s", err.msg);
    for (int i = 0; i < N; i++) fm_matcher_free(mt[i]);
}

static void check_allowed(const fm_token_vocab *v, const fm_grammar *g, const fm_gen_output *o) {
    const int32_t end = fm_token_vocab_size(v) - 1;
    fm_matcher *r;
    fm_error err;
    assert_int_equal(fm_matcher_create(g, v, &end, 1, &r, &err), FM_OK);
    for (int64_t k = 0; k < o->n; k++) assert_true(fm_matcher_accept(r, o->ids[k]));
    fm_matcher_free(r);
}

static void test_overlapped_masks_graphs_equal_launches(void **state) {
    (void)state;
    fm_tokenizer *t;
    fm_token_vocab *v;
    fm_grammar *g;
    fm_error err;
    assert_int_equal(fm_tokenizer_load(MODEL, &t, &err), FM_OK);
    assert_int_equal(fm_grammar_json_object(&g, &err), FM_OK);
    const fm_preset presets[] = {FM_PRESET_FP8, FM_PRESET_REF};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        fm_model *gm = load(presets[p], true), *lm = load(presets[p], false);
        assert_int_equal(fm_token_vocab_from_tokenizer(t, fm_model_vocab_size(gm), &v, &err), FM_OK);
        fm_gen_output a[N], b[N], c[N];
        generate(gm, v, g, a);
        assert_non_null(gm->context->kv->pass_graphs[2]); /* bucket 4: the pass and the sampler, captured */
        assert_non_null(gm->context->kv->sample_graphs[2]);
        generate(lm, v, g, b);
        assert_int_equal(fm_token_vocab_set_mask_cache(v, 0, &err), FM_OK);
        generate(gm, v, g, c);
        for (int i = 0; i < N; i++) {
            assert_int_equal(a[i].n, b[i].n);
            assert_memory_equal(a[i].ids, b[i].ids, (size_t)a[i].n * sizeof *a[i].ids);
            assert_int_equal(a[i].n, c[i].n);
            assert_memory_equal(a[i].ids, c[i].ids, (size_t)a[i].n * sizeof *a[i].ids);
            if (i != 1) check_allowed(v, g, &a[i]);
            free(a[i].ids), free(a[i].logprobs), free(b[i].ids), free(b[i].logprobs);
            free(c[i].ids), free(c[i].logprobs);
        }
        printf("  %s: %d requests (3 constrained to JSON objects): graphs with overlapped masks equal launches, shared "
               "masks equal computed ones\n",
               fm_preset_name(presets[p]), N);
        fm_token_vocab_free(v);
        fm_model_free(gm), fm_model_free(lm);
    }
    fm_grammar_free(g);
    fm_tokenizer_free(t);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlapped_masks_graphs_equal_launches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
