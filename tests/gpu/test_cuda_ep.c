/* Expert parallelism on the cuda backend (dist/ep_moe.h; backend/cuda/moe_dispatch.cu, moe_w4a8.cu): --ep 2 and 4,
 * every rank on this GPU holding its share of the experts, the e4m3 rows exchanged by the simulated world staged
 * through each rank's backend (dist/comm.h). Against one model on the GPU (fp8 preset, W4A8 experts), a 23-token
 * prompt:
 *   - the logits: every argmax the same, and the RMS distance to the ref32 oracle within 1.01x one model's (the rows
 *     are quantized as the one model quantizes them and each expert computes a row alone; what may differ is the
 *     tile height the grouped GEMM picks for the received rows, which the test reports as bits equal or not);
 *   - greedy generation of 12 tokens through the paged KV cache (decode steps without graphs): the same ids.
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

static fm_options options(fm_preset p, const char *backend) {
    fm_options o;
    fm_options_init(&o);
    o.backend = backend, o.preset = p, o.routes = gpu_test_routes();
    o.max_seqs = 1, o.ctx = 64, o.max_tokens = 32;
    return o;
}

static float *logits_of(fm_model *m, fm_rank_group *g, const int32_t *ids, int64_t T) {
    const int32_t V = fm_model_vocab_size(g ? g->models[0] : m);
    float *out = malloc((size_t)T * (size_t)V * sizeof *out);
    fm_error err = {{0}};
    const fm_status st =
        g ? fm_rank_group_forward(g, ids, T, false, out, &err) : fm_forward(m, ids, T, false, out, NULL, &err);
    if (st) fail_msg("forward: %s", err.msg);
    return out;
}

static void ep_case(const char *dir, int n_ranks) {
    fm_options o = options(FM_PRESET_FP8, "cuda"), ro = options(FM_PRESET_REF32, "cuda");
    fm_model *one = NULL, *oracle = NULL;
    fm_rank_group *g = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    if (fm_model_load(dir, &ro, &oracle, &err)) fail_msg("load %s: %s", dir, err.msg);
    o.ep_ranks = n_ranks;
    if (fm_rank_group_load(dir, &o, &g, &err)) fail_msg("load %s, --ep %d: %s", dir, n_ranks, err.msg);
    const int32_t V = fm_model_vocab_size(one);
    enum { T = 23 };
    int32_t ids[T];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
    float *a = logits_of(one, NULL, ids, T), *b = logits_of(NULL, g, ids, T), *f = logits_of(oracle, NULL, ids, T);
    const logits_diff d = logits_compare(a, b, T, V);
    const size_t n = (size_t)T * (size_t)V;
    const double e_one = logits_rms_diff(a, f, n), e_ep = logits_rms_diff(b, f, n);
    const bool bits = memcmp(a, b, n * sizeof *a) == 0;
    uint64_t sent = 0;
    for (int r = 0; r < n_ranks; r++) sent += g->models[r]->ep_bytes_dispatch;
    printf("  %-32s fp8 --ep %d on the GPU: %s, max |diff| %.3g (max |logit| %.3g), argmax %lld of %d; RMS to the "
           "oracle %.4g (one model %.4g); %llu dispatch bytes sent\n",
           dir, n_ranks, bits ? "bits equal" : "bits differ", d.max_diff, d.max_abs, (long long)d.same, (int)T, e_ep,
           e_one, (unsigned long long)sent);
    assert_int_equal(d.same, T);
    if (e_ep > 1.01 * e_one) fail_msg("%s --ep %d: RMS %g from the oracle, one model %g", dir, n_ranks, e_ep, e_one);
    assert_true(sent > 0);
    /* greedy generation through the paged cache */
    const int32_t *pp = ids;
    const int64_t np = 9;
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = 12, gp.ignore_eos = true;
    fm_gen_output x, y;
    if (fm_model_generate(one, &pp, &np, &gp, 1, 0, NULL, NULL, &x, NULL, &err)) fail_msg("%s", err.msg);
    if (fm_rank_group_generate(g, &pp, &np, &gp, 1, 0, NULL, NULL, &y, NULL, &err)) fail_msg("%s", err.msg);
    assert_int_equal(x.n, 12);
    assert_int_equal(y.n, 12);
    assert_memory_equal(x.ids, y.ids, 12 * sizeof *x.ids);
    printf("  %-32s fp8 --ep %d on the GPU: 12 greedy tokens as one model\n", dir, n_ranks);
    free(x.ids), free(x.logprobs), free(y.ids), free(y.logprobs);
    free(a), free(b), free(f);
    fm_rank_group_free(g);
    fm_model_free(one), fm_model_free(oracle);
}

static void test_expert_parallel(void **s) {
    (void)s;
    ep_case("tests/models/qwen3-moe-f32", 2);
    ep_case("tests/models/qwen3-moe-f32", 4);
    ep_case("tests/models/mixtral-f32-sharded", 2);
    ep_case("tests/models/qwen3-next-f32", 2);
    ep_case("tests/models/qwen3-moe-bf16", 2);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_expert_parallel)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
