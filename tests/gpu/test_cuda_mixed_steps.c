/* Mixed steps on the CUDA backend (scheduler.c; tests/test_mixed_steps.c is the CPU side): four requests with long
 * prompts arriving while others decode, under token budgets, against each request run alone with the budget off.
 *   - ref32 (fp32 throughout) on Qwen3-MoE and Qwen3-Next: the same greedy tokens, log-probabilities within 1e-3 (the
 *     lone run prefills a prompt with the contiguous kernel, a mixed step with the paged one: other summation orders);
 *   - fp8: the tokens agree up to a first divergence no earlier than the fourth token of any request, and before it
 *     the chosen ids' log-probabilities are within 0.15 (a bf16 or e4m3 rounding that falls the other way moves an
 *     activation by a whole step, 1/16), on the grouped GEMMs at every size (routes moe.gemv=off,dense.gemv=off; with
 *     the decode GEMVs a budget of 5 measured 0.24 on qwen3-moe-bf16, H200, 2026-12-05); a row given to the wrong
 *     sequence moves them by whole units;
 *   - on every model: no step runs more tokens than the budget, a running stream gets a token at every step while the
 *     prompts arrive, and the steps with only decode rows still replay the decode graph of their bucket (captured);
 *   - route mixed.graphs (on by default): the paged passes of Qwen3-MoE (attention layers only) replay the graphs of
 *     their row buckets, their rows padded (step_graphs.c), with the same bounds as above; Qwen3-Next's decline. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "model/arch.h"
#include "fp8moe_sched.h"
#include "gpu_test_util.h"
#include "../sched_recorder.h"

enum { N_REQ = 4, NEW = 12, MAX_PROMPT = 64, MAX_STEPS = 4000 };

static fm_model *load(const char *dir, fm_preset preset, int64_t budget) {
    fm_options opt;
    fm_options_init(&opt);
    /* the quantized presets on the grouped GEMMs at every size (no decode GEMVs), as test_cuda_generate's cached
       steps: a mixed step's rows and a lone prefill's then run the same kernels, and what is left to differ is the
       attention's summation order and the roundings it moves */
    char routes[256];
    snprintf(routes, sizeof routes, "%s%s%s", preset == FM_PRESET_REF32 ? "" : "moe.gemv=off,dense.gemv=off",
             preset != FM_PRESET_REF32 && gpu_test_routes() ? "," : "", gpu_test_routes() ? gpu_test_routes() : "");
    opt.backend = "cuda", opt.preset = preset, opt.routes = routes[0] ? routes : NULL;
    opt.max_seqs = N_REQ, opt.ctx = 128, opt.max_tokens = MAX_PROMPT, opt.prefix_cache = false;
    opt.max_step_tokens = budget;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
    return m;
}

static const int64_t k_len[N_REQ] = {50, 61, 33, 64};

/* alone: each request by itself; else the first, then the second while it decodes, then the last two */
static void run(fm_model *m, int32_t p[N_REQ][MAX_PROMPT], bool alone, sched_rec *r) {
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
    fm_sched_request q[N_REQ];
    for (int i = 0; i < N_REQ; i++) q[i] = sched_rec_request(r, p[i], k_len[i]);
    if (alone) {
        for (int i = 0; i < N_REQ; i++) {
            sched_rec_submit(s, &q[i]);
            while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
        }
    } else {
        sched_rec_submit(s, &q[0]);
        while (r->n[0] < 3) assert_true(sched_rec_step(s, r));
        sched_rec_submit(s, &q[1]);
        sched_rec_step(s, r), sched_rec_step(s, r);
        sched_rec_submit(s, &q[2]), sched_rec_submit(s, &q[3]);
        while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
    }
    for (int i = 0; i < N_REQ; i++) assert_int_equal(r->finals[i], 1), assert_int_equal(r->n[i], NEW);
    fm_sched_free(s);
}

static void mixed_vs_alone(const char *dir, fm_preset preset) {
    fm_model *m = load(dir, preset, -1);
    const int32_t V = fm_model_vocab_size(m);
    int32_t p[N_REQ][MAX_PROMPT];
    for (int i = 0; i < N_REQ; i++) {
        uint32_t seed = 301u + (uint32_t)i;
        for (int64_t t = 0; t < k_len[i]; t++)
            seed = seed * 1664525u + 1013904223u, p[i][t] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
    sched_rec *ref = sched_rec_new(NEW, 0);
    run(m, p, true, ref);
    fm_model_free(m);
    const int64_t budgets[] = {0, 24, 5};
    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
        m = load(dir, preset, budgets[b]);
        const int64_t budget = fm_context_max_step_tokens(m->context);
        sched_rec *r = sched_rec_new(NEW, 0);
        run(m, p, false, r);
        int first_diff = NEW;
        double worst = 0.0;
        for (int i = 0; i < N_REQ; i++) {
            int k = 0;
            while (k < NEW && r->ids[i][k] == ref->ids[i][k])
                worst = fmax(worst, fabs(r->info[i][k].logprob - ref->info[i][k].logprob)), k++;
            if (k < first_diff) first_diff = k;
        }
        const int64_t replays = m->context->kv->mixed_graph_steps;
        printf("%s %s budget %lld: tokens equal up to %d of %d, log-probabilities within %.3g there; at most %lld "
               "tokens a step; widest gap while prompts arrive %lld steps; %lld passes replayed from mixed graphs\n",
               dir, fm_preset_name(preset), (long long)budget, first_diff, NEW, worst, (long long)r->most_rows,
               (long long)sched_rec_gap_during_prefill(r, N_REQ), (long long)replays);
        /* route mixed.graphs: the paged passes of an attention-only model replay their row bucket's graph (padded
           rows included, the tokens above are unchanged by them); a Gated DeltaNet model's run as they are */
        if (fm_routes_mixed_graphs(&m->routes)) {
            if (fm_arch_attention_layers(&m->cfg, m->n_layers) == m->n_layers) assert_true(replays > 0);
            else assert_int_equal(replays, 0);
        }
        if (preset == FM_PRESET_REF32) {
            assert_int_equal(first_diff, NEW);
            assert_true(worst <= 1e-3);
        } else {
            assert_true(first_diff >= 3);
            assert_true(worst <= 0.15);
        }
        assert_true(r->most_rows <= budget);
        if (budget >= N_REQ) assert_int_equal(sched_rec_gap_during_prefill(r, N_REQ), 1);
        /* the last steps had decode rows only: their bucket's graph was captured and replayed */
        if (fm_routes_decode_graphs(&m->routes)) {
            bool captured = false;
            for (int g = 0; g < FM_DECODE_BUCKETS; g++) captured |= m->context->kv->graphs[g] != NULL;
            assert_true(captured);
        }
        free(r);
        fm_model_free(m);
    }
    free(ref);
}

static void test_mixed_ref32(void **state) {
    (void)state;
    mixed_vs_alone("tests/models/qwen3-moe-f32", FM_PRESET_REF32);
    mixed_vs_alone("tests/models/qwen3-next-f32", FM_PRESET_REF32);
}

static void test_mixed_fp8(void **state) {
    (void)state;
    mixed_vs_alone("tests/models/qwen3-moe-bf16", FM_PRESET_FP8);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_ref32),
        cmocka_unit_test(test_mixed_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
