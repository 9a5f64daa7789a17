/* Qwen3-Next's shared expert as one more expert of the bank (route moe.shared, engine/shared_routing.h) against its
 * own projections: the routing op's extra pair, the banks a routed load builds, the forms a load falls back to, and
 * the logits and greedy generations of the synthetic toy-next (the shared expert as wide as the routed ones) under
 * both values of the route.
 *
 * Why not bit for bit: the separate form rounds the routed experts' sum and the shared expert's scaled output to the
 * activation dtype apart and adds them; the routed form sums k + 1 products once, and rounds the gate weight
 * sigmoid(g . h) to the activation dtype with the other routing weights. In fp32 (ref) that is a few ulps; with bf16
 * activations (int4, fp8) a bf16 rounding of the block's output here and there, which the later layers carry on. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "fp8moe.h"
#include "util/metrics.h"

static uint64_t g_rng = 0x5eed;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* the route op: FM_ROUTER_SOFTMAX_TOPK_SHARED over E + 1 logits is FM_ROUTER_SOFTMAX_TOPK over the first E, then the
   pair (E, sigmoid(logit E)); odd token counts, with and without renormalisation */
static void route_appends_the_shared_pair(void **s) {
    (void)s;
    fm_plan plan;
    fm_plan_from_preset(FM_PRESET_REF, &plan);
    fm_backend *be = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &be, &err), FM_OK);
    const int32_t E = 13, k = 3;
    const int64_t Ts[] = {1, 3, 17};
    for (int n = 0; n < 3; n++)
        for (int norm = 0; norm < 2; norm++) {
            const int64_t T = Ts[n];
            float *l1 = be->ops->alloc(be, (size_t)(T * (E + 1)) * sizeof(float));
            float *l0 = be->ops->alloc(be, (size_t)(T * E) * sizeof(float));
            int32_t *id1 = be->ops->alloc(be, (size_t)(T * (k + 1)) * sizeof(int32_t));
            int32_t *id0 = be->ops->alloc(be, (size_t)(T * k) * sizeof(int32_t));
            float *w1 = be->ops->alloc(be, (size_t)(T * (k + 1)) * sizeof(float));
            float *w0 = be->ops->alloc(be, (size_t)(T * k) * sizeof(float));
            for (int64_t t = 0; t < T; t++)
                for (int32_t e = 0; e <= E; e++) {
                    l1[t * (E + 1) + e] = 4.0f * frand();
                    if (e < E) l0[t * E + e] = l1[t * (E + 1) + e];
                }
            be->ops->route(be, l1, T, E + 1, k + 1, FM_ROUTER_SOFTMAX_TOPK_SHARED, norm, id1, w1);
            be->ops->route(be, l0, T, E, k, FM_ROUTER_SOFTMAX_TOPK, norm, id0, w0);
            for (int64_t t = 0; t < T; t++) {
                for (int32_t j = 0; j < k; j++) {
                    assert_int_equal(id1[t * (k + 1) + j], id0[t * k + j]);
                    assert_true(w1[t * (k + 1) + j] == w0[t * k + j]); /* the same sums, in the same order */
                }
                const float g = l1[t * (E + 1) + E];
                assert_int_equal(id1[t * (k + 1) + k], E);
                assert_float_equal(w1[t * (k + 1) + k], 1.0f / (1.0f + expf(-g)), 1e-7f);
            }
            be->ops->free(be, l1), be->ops->free(be, l0), be->ops->free(be, id1), be->ops->free(be, id0);
            be->ops->free(be, w1), be->ops->free(be, w0);
        }
    be->ops->destroy(be);
}

static void random_ids(int32_t *ids, int64_t T, int32_t V) {
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
}

static int32_t g_layers = 0; /* the loads' depth: 0 all */

static fm_model *load(const char *synthetic, const char *dir, fm_preset p, fm_dense dense, const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.n_layers = g_layers;
    opt.preset = p;
    opt.dense = dense;
    opt.routes = routes;
    opt.max_seqs = 2;
    fm_model *m = NULL;
    fm_error err = {{0}};
    const fm_status st =
        synthetic ? fm_model_load_synthetic(synthetic, g_layers, &opt, &m, &err) : fm_model_load(dir, &opt, &m, &err);
    if (st) fprintf(stderr, "load: %s\n", err.msg);
    assert_int_equal(st, FM_OK);
    return m;
}

static float *logits_of(fm_model *m, const int32_t *ids, int64_t T) {
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    float *out = malloc((size_t)T * (size_t)fm_model_vocab_size(m) * sizeof *out);
    assert_non_null(out);
    assert_int_equal(fm_context_logits(ctx, ids, T, out, &err), FM_OK);
    fm_context_free(ctx);
    return out;
}

/* greedy generation of n new tokens after the prompt, through the KV cache (prefill, then decode steps) */
static int32_t *greedy(fm_model *m, const int32_t *prompt, int64_t T, int64_t n) {
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    fm_gen_params p;
    fm_gen_params_init(&p);
    p.max_tokens = n, p.ignore_eos = true;
    fm_gen_output out = {0};
    const fm_status st = fm_context_generate(ctx, &prompt, &T, &p, 1, 0, NULL, NULL, &out, NULL, &err);
    if (st) fprintf(stderr, "generate: %s\n", err.msg);
    assert_int_equal(st, FM_OK);
    assert_int_equal(out.n, n);
    free(out.logprobs);
    fm_context_free(ctx);
    return out.ids;
}

/* the routed load's banks: no shared banks, E + 1 experts, the router's E + 1 rows; the model's counts include it */
static void check_routed_banks(const fm_model *routed, const fm_model *separate) {
    const fm_config *c = &routed->cfg;
    const int32_t E = separate->cfg.n_experts;
    assert_true(c->shared_in_bank);
    assert_false(separate->cfg.shared_in_bank);
    assert_int_equal(c->n_experts, E + 1);
    assert_int_equal(c->n_experts_per_tok, separate->cfg.n_experts_per_tok + 1);
    assert_int_equal(c->router, FM_ROUTER_SOFTMAX_TOPK_SHARED);
    const fm_backend_ops *o = routed->be->ops;
    for (int l = 0; l < routed->n_layers; l++) {
        const fm_layer_weights *R = &routed->layers[l], *S = &separate->layers[l];
        if (!R->is_moe) continue;
        assert_null(R->shared_gate_up), assert_null(R->shared_down), assert_null(R->shared_score);
        assert_non_null(S->shared_gate_up);
        /* every matrix of a bank has the same bytes: one expert more */
        assert_int_equal(o->bank_bytes(R->gate_up) * (size_t)E, o->bank_bytes(S->gate_up) * (size_t)(E + 1));
        assert_int_equal(o->bank_bytes(R->down) * (size_t)E, o->bank_bytes(S->down) * (size_t)(E + 1));
        assert_int_equal(o->bank_bytes(R->router) * (size_t)E, o->bank_bytes(S->router) * (size_t)(E + 1));
    }
    /* the memory plan of the routed configuration holds what the load allocated (no shared banks, E + 1 experts) */
    const fm_model *ms[] = {routed, separate};
    for (int i = 0; i < 2; i++) {
        fm_config cfg = ms[i]->cfg;
        cfg.tie_word_embeddings = ms[i]->lm_head == ms[i]->embed;
        fm_memory_plan plan;
        fm_error err = {{0}};
        assert_int_equal(fm_memory_plan_compute(&cfg, &ms[i]->plan, "cpu", ms[i]->n_layers, 37, &plan, &err), FM_OK);
        assert_int_equal(ms[i]->weight_bytes, plan.weight_total);
    }
}

/* Logits of the toy-next under moe.shared=routed and =separate, preset by preset, after one layer and after all
   four. fp32 (ref): equal within a few ulps (they come out bit for bit on the cpu), and greedy generations (prefill,
   then decode steps through the KV cache) equal. bf16 activations (int4, fp8): after one layer, where both forms see
   the same input, the logits within two bf16 ulps of the largest (2^-7 of it: the block's output rounded apart);
   after four, the forms' distance (1 - cosine) under a tenth of the preset's own distance from fp32: this
   random-weight model amplifies every rounding (int4 against fp32: 1 - cosine 0.01 after one layer, 0.1 after four;
   fp8's e4m3 activations flip a step on a rounded input), so only a bound relative to it says "rounding, not another
   computation". */
static void routed_equals_separate(void **s) {
    (void)s;
    const int64_t T = 37;
    int32_t ids[37];
    random_ids(ids, T, 256);
    const int32_t depths[] = {1, 0};
    for (int d = 0; d < 2; d++) {
        g_layers = depths[d];
        fm_model *oracle = load("toy-next", NULL, FM_PRESET_REF, FM_DENSE_PRESET, "moe.shared=separate");
        float *ref = logits_of(oracle, ids, T);
        const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
        for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
            const fm_preset p = presets[i];
            fm_model *sep = load("toy-next", NULL, p, FM_DENSE_PRESET, "moe.shared=separate");
            fm_model *rt = load("toy-next", NULL, p, FM_DENSE_PRESET, "moe.shared=routed");
            check_routed_banks(rt, sep);
            const int32_t V = fm_model_vocab_size(sep);
            float *a = logits_of(sep, ids, T), *b = logits_of(rt, ids, T);
            fm_compare c, q;
            fm_logits_compare(a, b, T, V, &c);
            fm_logits_compare(ref, a, T, V, &q);
            printf("toy-next %-4s %d layer(s), routed vs separate: 1 - cosine %.3g (the preset against fp32: %.3g), "
                   "max|diff| %.3g (%.2g x max|logit|), argmax %.1f%%\n",
                   fm_preset_name(p), sep->n_layers, 1 - c.cosine, 1 - q.cosine, c.max_abs_err,
                   c.max_abs_err / c.max_abs_ref, 100 * c.argmax_agree);
            assert_int_equal(c.n_nonfinite, 0);
            if (p == FM_PRESET_REF) {
                assert_true(c.max_abs_err <= 1e-5 * c.max_abs_ref);
                int32_t *ga = greedy(sep, ids, 9, 12), *gb = greedy(rt, ids, 9, 12);
                assert_memory_equal(ga, gb, 12 * sizeof *ga);
                free(ga), free(gb);
            } else if (sep->n_layers == 1) {
                assert_true(c.max_abs_err <= 0x1p-7 * c.max_abs_ref);
            } else {
                assert_true(q.cosine < 0.99); /* the bound is relative to a real quantization error */
                assert_true(1 - c.cosine <= 0.1 * (1 - q.cosine));
            }
            free(a), free(b);
            fm_model_free(sep), fm_model_free(rt);
        }
        free(ref);
        fm_model_free(oracle);
    }
    g_layers = 0;
}

/* Where the shapes differ the load keeps the shared expert apart even when routed is asked for: a shared expert
   wider than the routed ones (the transformers goldens: 40 against 16), a plan that quantizes the dense projections
   unlike the experts (--dense w8a8; the fp4 preset's MXFP4 dispatch); auto is separate. The logits are then those
   of the separate form, bit for bit. */
static void falls_back_where_shapes_differ(void **s) {
    (void)s;
    const char *dir = "tests/models/qwen3-next-f32";
    fm_model *a = load(NULL, dir, FM_PRESET_REF, FM_DENSE_PRESET, "moe.shared=routed");
    fm_model *b = load(NULL, dir, FM_PRESET_REF, FM_DENSE_PRESET, NULL);
    assert_false(a->cfg.shared_in_bank);
    assert_false(b->cfg.shared_in_bank);
    assert_non_null(a->layers[0].shared_gate_up);
    int32_t ids[9];
    random_ids(ids, 9, fm_model_vocab_size(a));
    float *la = logits_of(a, ids, 9), *lb = logits_of(b, ids, 9);
    assert_memory_equal(la, lb, (size_t)9 * (size_t)fm_model_vocab_size(a) * sizeof *la);
    free(la), free(lb);
    fm_model_free(a), fm_model_free(b);
    const struct {
        fm_preset p;
        fm_dense dense;
        const char *routes;
    } apart[] = {{FM_PRESET_FP8, FM_DENSE_W8A8, "moe.shared=routed"},
                 {FM_PRESET_FP4, FM_DENSE_PRESET, "moe.shared=routed"},
                 {FM_PRESET_REF, FM_DENSE_PRESET, "moe.shared=auto"}};
    for (size_t i = 0; i < sizeof apart / sizeof *apart; i++) {
        fm_model *m = load("toy-next", NULL, apart[i].p, apart[i].dense, apart[i].routes);
        assert_false(m->cfg.shared_in_bank);
        assert_int_equal(m->cfg.n_experts, 8);
        fm_model_free(m);
    }
}

/* experts in host memory (the cpu backend's emulation of the expert cache): the shared expert is one more expert of
   the host banks, cached like the others; the logits are the device-resident routed model's, bit for bit */
static void routed_with_experts_in_host(void **s) {
    (void)s;
    const int64_t T = 11;
    int32_t ids[11];
    random_ids(ids, T, 256);
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = FM_PRESET_REF;
    opt.routes = "moe.shared=routed";
    fm_model *dev = NULL, *host = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load_synthetic("toy-next", 0, &opt, &dev, &err), FM_OK);
    opt.experts_in = FM_EXPERTS_HOST, opt.expert_slots = 10; /* one layer's 9 experts and one more */
    const fm_status st = fm_model_load_synthetic("toy-next", 0, &opt, &host, &err);
    if (st) fprintf(stderr, "load: %s\n", err.msg);
    assert_int_equal(st, FM_OK);
    assert_true(host->cfg.shared_in_bank);
    float *a = logits_of(dev, ids, T), *b = logits_of(host, ids, T);
    assert_memory_equal(a, b, (size_t)T * (size_t)fm_model_vocab_size(dev) * sizeof *a);
    free(a), free(b);
    fm_model_free(dev), fm_model_free(host);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(route_appends_the_shared_pair),
        cmocka_unit_test(routed_equals_separate),
        cmocka_unit_test(falls_back_where_shapes_differ),
        cmocka_unit_test(routed_with_experts_in_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
