/* Tensor parallelism on the cuda backend (dist/rank_group.h): --tp 2, both ranks on this GPU, each holding its query
 * and key-value heads and o's columns of them, the partial o projections summed by the simulated world staged
 * through each rank's backend (dist/comm.h) in rank order. Against one model on the GPU, a 23-token prompt:
 *   - ref32: max |diff| <= 1e-5 x max |logit|, every argmax the same (only the order of o's partial sums differs);
 *   - ref and fp8 (bf16 activations: each rank's partial is rounded to bf16 before the sum): the RMS distance to the
 *     ref32 oracle within 1.25x one model's, as the cpu backend's test bounds it;
 *   - greedy generation of 12 tokens through the paged KV cache (decode steps without graphs), ref32: the same ids.
 * Runs only where a GPU is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/rank_group.h"
#include "engine/engine.h"
#include "../logits_diff.h"
#include "gpu_test_util.h"

static fm_options options(fm_preset p) {
    fm_options o;
    fm_options_init(&o);
    o.backend = "cuda", o.preset = p, o.routes = gpu_test_routes();
    o.max_seqs = 1, o.ctx = 64, o.max_tokens = 32;
    return o;
}

static float *logits_of(fm_model *m, fm_rank_group *g, const int32_t *ids, int64_t T) {
    const int32_t V = fm_model_vocab_size(g ? g->models[0] : m);
    float *out = malloc((size_t)T * (size_t)V * sizeof *out);
    fm_error err = {{0}};
    const fm_status st =
        g ? fm_rank_group_forward(g, ids, T, false, out, &err) : fm_forward(m->context, ids, T, false, out, NULL, &err);
    if (st) fail_msg("forward: %s", err.msg);
    return out;
}

static void tp_case(const char *dir, fm_preset p) {
    fm_options o = options(p), ro = options(FM_PRESET_REF32);
    fm_model *one = NULL, *oracle = NULL;
    fm_rank_group *g = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    if (fm_model_load(dir, &ro, &oracle, &err)) fail_msg("load %s: %s", dir, err.msg);
    o.tp_ranks = 2;
    if (fm_rank_group_load(dir, &o, &g, &err)) fail_msg("load %s, --tp 2: %s", dir, err.msg);
    const int32_t V = fm_model_vocab_size(one);
    enum { T = 23 };
    int32_t ids[T];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
    float *a = logits_of(one, NULL, ids, T), *b = logits_of(NULL, g, ids, T), *f = logits_of(oracle, NULL, ids, T);
    const logits_diff d = logits_compare(a, b, T, V);
    const double maxabs = d.max_abs, diff = d.max_diff;
    const int64_t same = d.same;
    const size_t n = (size_t)T * (size_t)V;
    const double e_one = logits_rms_diff(a, f, n), e_tp = logits_rms_diff(b, f, n);
    printf("  %-32s %-5s --tp 2 on the GPU: max |diff| %.3g (max |logit| %.3g), argmax %lld of %d; RMS to the oracle "
           "%.3g (one model %.3g)\n",
           dir, fm_preset_name(p), diff, maxabs, (long long)same, (int)T, e_tp, e_one);
    if (p == FM_PRESET_REF32) {
        assert_int_equal(same, T);
        if (diff > 1e-5 * maxabs) fail_msg("%s --tp 2: max |diff| %g > 1e-5 x %g", dir, diff, maxabs);
    } else if (e_tp > 1.25 * e_one) {
        fail_msg("%s %s --tp 2: RMS %g from the oracle, one model %g", dir, fm_preset_name(p), e_tp, e_one);
    }
    if (p == FM_PRESET_REF32) { /* greedy generation through the paged cache */
        const int32_t *pp = ids;
        const int64_t np = 9;
        fm_gen_params gp;
        fm_gen_params_init(&gp);
        gp.max_tokens = 12, gp.ignore_eos = true;
        fm_gen_output x, y;
        if (fm_context_generate(one->context, &pp, &np, &gp, 1, 0, NULL, NULL, &x, NULL, &err)) fail_msg("%s", err.msg);
        if (fm_rank_group_generate(g, &pp, &np, &gp, 1, 0, NULL, NULL, &y, NULL, &err)) fail_msg("%s", err.msg);
        assert_int_equal(x.n, 12);
        assert_int_equal(y.n, 12);
        assert_memory_equal(x.ids, y.ids, 12 * sizeof *x.ids);
        printf("  %-32s %-5s --tp 2 on the GPU: 12 greedy tokens as one model\n", dir, fm_preset_name(p));
        free(x.ids), free(x.logprobs), free(y.ids), free(y.logprobs);
    }
    free(a), free(b), free(f);
    fm_rank_group_free(g);
    fm_model_free(one), fm_model_free(oracle);
}

static void test_tensor_parallel(void **s) {
    (void)s;
    const char *dirs[] = {"tests/models/qwen3-moe-f32", "tests/models/mixtral-f32-sharded",
                          "tests/models/qwen3-next-f32", "tests/models/qwen3-moe-bf16"};
    const fm_preset presets[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_FP8};
    for (int d = 0; d < 4; d++)
        for (int p = 0; p < 3; p++) tp_case(dirs[d], presets[p]);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tensor_parallel)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
