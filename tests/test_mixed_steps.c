/* Mixed steps (scheduler.c): every running sequence's next token and prefill chunks under a token budget
 * (fm_options.max_step_tokens), one forward pass, on the CPU backend:
 *   - four requests with long prompts, arriving while others decode, give the same greedy tokens as each request run
 *     alone (budget off, the reference path), and log-probabilities of the chosen and top ids within fp32 noise of
 *     the lone run's, at every budget: off, the default, 12 (prompts split over steps), 3 (smaller than the decode
 *     batch), 1; on the ref preset (Qwen3-MoE and the hybrid Qwen3-Next: its Gated DeltaNet layers run each
 *     sequence's rows as one run) and on fp8 as the GPU computes it (plan_backend cuda);
 *   - a step runs at most the budget's tokens, decode rows included (a prompt joins the batch only while the running
 *     sequences leave room beside them: a budget below max_seqs bounds the batch); a running stream gets a token at
 *     every step while prompts arrive (a long prompt delays it by one budgeted step at most); with the budget off it
 *     waits behind prefill chunks;
 *   - a constrained request decoding while prompts complete beside it keeps to its mask, a logit bias holds, and
 *     the tokens are those of the lone runs (each sampled row with its own sequence's mask and bias);
 *   - two prompts with a common prefix submitted together: the second maps the first's blocks (the prefix cache
 *     works as with one prefill at a time);
 *   - a budget larger than the pass the model was loaded for, or below -1, is refused by name;
 *   - route paged.tiled (the steps with prompt chunks through attention_paged_runs) changes no bit on the CPU; nor
 *     does route mixed.graphs=on, which pads those steps' rows to their graph's bucket (no graphs on the CPU). */
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
#include "fp8moe_sched.h"
#include "sched_recorder.h"

enum { N_REQ = 4, NEW = 10, TOP = 3, MAX_PROMPT = 40, MAX_STEPS = 4000 };

typedef struct config {
    const char *model;
    fm_preset preset;
    const char *plan_backend; /* NULL: the cpu's plan; "cuda": the GPU's formats emulated */
    float tol;                /* log-probability difference to the lone run */
} config;

static const config k_configs[] = {
    {"tests/models/qwen3-moe-f32", FM_PRESET_REF, NULL, 1e-4f},
    {"tests/models/qwen3-next-f32", FM_PRESET_REF, NULL, 1e-4f},
    {"tests/models/qwen3-moe-bf16", FM_PRESET_FP8, "cuda", 2e-3f},
};

static const char *load_routes = NULL; /* fm_options.routes of the next loads */
static bool load_w8a8 = false;         /* the next loads' dense projections in W8A8 (fm_options.dense) */

static fm_model *load(const config *c, int64_t budget, bool prefix, fm_status *st_out, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.routes = load_routes;
    if (load_w8a8) opt.dense = FM_DENSE_W8A8;
    opt.preset = c->preset, opt.plan_backend = c->plan_backend;
    opt.max_seqs = N_REQ, opt.ctx = 96, opt.max_tokens = MAX_PROMPT, opt.prefix_cache = prefix;
    opt.max_step_tokens = budget;
    fm_model *m = NULL;
    const fm_status st = fm_model_load(c->model, &opt, &m, err);
    if (st_out) *st_out = st;
    else if (st) fail_msg("load %s: %s", c->model, err->msg);
    return m;
}

static void prompt_ids(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

/* every id came with the TOP log-probabilities its request asked for */
static void assert_tops(const sched_rec *r) {
    for (int q = 0; q < SCHED_REC_REQ; q++)
        for (int64_t k = 0; k < r->n[q]; k++) assert_int_equal(r->info[q][k].n_top, TOP);
}

static const int64_t k_len[N_REQ] = {30, 37, 25, 40};

/* The four requests: the first alone for a few steps, the second while it decodes, then the last two together; each
 * request's events into r (request ids 0..3 in this order). */
static void run_staggered(fm_model *m, int32_t p[N_REQ][MAX_PROMPT], sched_rec *r) {
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
    fm_sched_request q[N_REQ];
    for (int i = 0; i < N_REQ; i++) q[i] = sched_rec_request(r, p[i], k_len[i]);
    sched_rec_submit(s, &q[0]);
    while (r->n[0] < 3) assert_true(sched_rec_step(s, r));
    sched_rec_submit(s, &q[1]);
    sched_rec_step(s, r), sched_rec_step(s, r);
    sched_rec_submit(s, &q[2]), sched_rec_submit(s, &q[3]);
    while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
    assert_tops(r);
    fm_sched_stats st;
    fm_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.prefill_tokens, 30 + 37 + 25 + 40);
    assert_int_equal(st.decode_tokens, N_REQ * (NEW - 1));
    fm_sched_free(s);
}

static void test_budgets_match_lone_runs(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof k_configs / sizeof *k_configs; c++) {
        const config *cf = &k_configs[c];
        fm_error err;
        /* the reference: each request alone, the budget off (one prefill chunk, then decode steps) */
        fm_model *m = load(cf, -1, false, NULL, &err);
        const int32_t V = fm_model_vocab_size(m);
        int32_t p[N_REQ][MAX_PROMPT];
        sched_rec *ref = sched_rec_new(NEW, TOP);
        for (int i = 0; i < N_REQ; i++) {
            prompt_ids(p[i], k_len[i], V, 101u + (uint32_t)i);
            fm_sched *s;
            if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
            sched_rec *one = sched_rec_new(NEW, TOP);
            sched_rec_submit_prompt(s, one, p[i], k_len[i]);
            while (sched_rec_step(s, one)) assert_true(one->step < MAX_STEPS);
            assert_tops(one);
            assert_int_equal(one->n[0], NEW);
            memcpy(ref->ids[i], one->ids[0], sizeof ref->ids[i]);
            memcpy(ref->info[i], one->info[0], sizeof ref->info[i]);
            fm_sched_free(s);
            free(one);
        }
        fm_model_free(m);
        const int64_t budgets[] = {-1, 0, 12, 3, 1};
        for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
            m = load(cf, budgets[b], false, NULL, &err);
            const int64_t budget = fm_context_max_step_tokens(m->context);
            if (budgets[b] == 0) assert_int_equal(budget, MAX_PROMPT); /* N_REQ + 512, at most the pass */
            else assert_int_equal(budget, budgets[b] < 0 ? 0 : budgets[b]);
            sched_rec *r = sched_rec_new(NEW, TOP);
            run_staggered(m, p, r);
            float worst = 0.0f;
            for (int i = 0; i < N_REQ; i++) {
                assert_int_equal(r->finals[i], 1);
                assert_int_equal(r->end[i], FM_SCHED_LENGTH);
                assert_int_equal(r->n[i], NEW);
                if (memcmp(r->ids[i], ref->ids[i], sizeof ref->ids[i]))
                    fail_msg("%s %s budget %lld: request %d's tokens differ from its lone run", cf->model,
                             fm_preset_name(cf->preset), (long long)budgets[b], i);
                for (int k = 0; k < NEW; k++) {
                    const fm_sample_info *x = &r->info[i][k], *y = &ref->info[i][k];
                    worst = fmaxf(worst, fabsf(x->logprob - y->logprob));
                    for (int t = 0; t < TOP; t++) worst = fmaxf(worst, fabsf(x->top[t].logprob - y->top[t].logprob));
                }
            }
            printf("%s %s%s budget %lld: tokens equal to the lone runs, log-probabilities within %.2g; widest gap "
                   "while prompts arrive %lld steps\n",
                   cf->model, fm_preset_name(cf->preset), cf->plan_backend ? " (cuda plan)" : "", (long long)budgets[b],
                   (double)worst, (long long)sched_rec_gap_during_prefill(r, N_REQ));
            assert_true(worst <= cf->tol);
            if (budget >= N_REQ) assert_int_equal(sched_rec_gap_during_prefill(r, N_REQ), 1); /* a token every step */
            if (budget == 0)
                assert_true(sched_rec_gap_during_prefill(r, N_REQ) >= 2); /* prefill chunks between decode steps */
            if (budget > 0) assert_true(r->most_rows <= budget); /* the decode batch too: it never outgrows it */
            if (budget >= MAX_PROMPT) assert_true(r->most_rows > N_REQ); /* prompt and decode tokens together */
            free(r);
            fm_model_free(m);
        }
        free(ref);
    }
}

/* A route that must change no bit: the staggered requests' tokens and log-probabilities at `budget` with `route` and
 * without it, bit for bit; returns how many passes ran padded to a row bucket with it (kv_state.h) */
static int64_t route_same_tokens(const config *cf, const char *route, int64_t budget) {
    fm_error err;
    sched_rec *r[2];
    int32_t p[N_REQ][MAX_PROMPT];
    int64_t padded = 0;
    for (int run = 0; run < 2; run++) {
        load_routes = run ? route : NULL;
        fm_model *m = load(cf, budget, false, NULL, &err);
        load_routes = NULL;
        for (int i = 0; i < N_REQ; i++) prompt_ids(p[i], k_len[i], fm_model_vocab_size(m), 101u + (uint32_t)i);
        r[run] = sched_rec_new(NEW, TOP);
        run_staggered(m, p, r[run]);
        assert_true(r[run]->most_rows > N_REQ); /* mixed steps ran */
        if (run) padded = m->context->kv->mixed_padded_steps;
        fm_model_free(m);
    }
    for (int i = 0; i < N_REQ; i++) assert_int_equal(r[1]->n[i], NEW);
    assert_memory_equal(r[0]->ids, r[1]->ids, sizeof r[0]->ids);
    for (int i = 0; i < N_REQ; i++)
        for (int k = 0; k < NEW; k++) {
            const fm_sample_info *x = &r[0]->info[i][k], *y = &r[1]->info[i][k];
            assert_memory_equal(&x->logprob, &y->logprob, sizeof x->logprob);
            for (int t = 0; t < TOP; t++) assert_memory_equal(&x->top[t].logprob, &y->top[t].logprob, sizeof(float));
        }
    free(r[0]), free(r[1]);
    return padded;
}

/* --route paged.tiled=on (the steps that hold prompt chunks call attention_paged_runs, on the cpu backend its one
 * reference kernel) changes no bit */
static void test_paged_tiled_route_same_tokens(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof k_configs / sizeof *k_configs; c++)
        route_same_tokens(&k_configs[c], "paged.tiled=on", 0);
}

/* --route mixed.graphs=on on the cpu (no graphs): the steps with prompt chunks run padded to their row bucket
 * (step_graphs.c: copies of the first row, storing nothing), which changes no bit of the real rows, at the default
 * budget and at 12 (the prompts over several mixed steps), also with the dense projections in W8A8 (one activation
 * scale for all the pass's rows: padding rows of other values would move it); Qwen3-Next (Gated DeltaNet layers)
 * declines the route */
static void test_mixed_padding_same_tokens(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof k_configs / sizeof *k_configs; c++) {
        for (int w8a8 = 0; w8a8 < 2; w8a8++)
            for (int64_t budget = 0; budget <= 12; budget += 12) {
                load_w8a8 = w8a8;
                const int64_t padded = route_same_tokens(&k_configs[c], "mixed.graphs=on", budget);
                load_w8a8 = false;
                printf("%s %s%s budget %lld: %lld passes padded to their row bucket, the same bits\n",
                       k_configs[c].model, fm_preset_name(k_configs[c].preset), w8a8 ? " dense w8a8" : "",
                       (long long)budget, (long long)padded);
                if (strstr(k_configs[c].model, "next")) assert_int_equal(padded, 0);
                else assert_true(padded >= (budget ? 5 : 1));
            }
    }
}

/* a constraint: ids equal to 3 modulo 7 only */
static void mask_mod7(void *user, uint32_t *words, int32_t vocab) {
    (void)user;
    for (int32_t w = 0; w < (vocab + 31) / 32; w++) words[w] = 0;
    for (int32_t i = 3; i < vocab; i += 7) words[i / 32] |= 1u << (i % 32);
}
static bool accept_mod7(void *user, int32_t id) {
    (void)user;
    return id % 7 == 3;
}

/* requests a (constrained), b (a logit bias of +100 on one id) and c (plain) with their prompts and events into r */
static void masked_requests(fm_model *m, const int32_t p[3][MAX_PROMPT], bool alone, sched_rec *r) {
    static const fm_token_constraint mod7 = {NULL, mask_mod7, accept_mod7};
    static const fm_logit_bias bias = {77, 100.0f};
    fm_sched *s;
    fm_error err;
    if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
    fm_sched_request q[3];
    for (int i = 0; i < 3; i++) q[i] = sched_rec_request(r, p[i], k_len[i]);
    q[0].params.constraint = &mod7;
    q[1].params.logit_bias = &bias, q[1].params.n_logit_bias = 1;
    if (alone) {
        for (int i = 0; i < 3; i++) {
            sched_rec_submit(s, &q[i]);
            while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
        }
    } else {
        sched_rec_submit(s, &q[0]);
        while (r->n[0] < 2) assert_true(sched_rec_step(s, r));
        sched_rec_submit(s, &q[1]),
            sched_rec_submit(s, &q[2]); /* their prompts complete in steps where a decodes under its mask */
        while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(r->finals[i], 1), assert_int_equal(r->n[i], NEW);
    assert_tops(r);
    fm_sched_free(s);
}

static void test_masks_and_bias_in_mixed_steps(void **state) {
    (void)state;
    fm_error err;
    int32_t p[3][MAX_PROMPT];
    sched_rec *ref = sched_rec_new(NEW, TOP), *r = sched_rec_new(NEW, TOP);
    fm_model *m = load(&k_configs[0], -1, false, NULL, &err);
    for (int i = 0; i < 3; i++) prompt_ids(p[i], k_len[i], fm_model_vocab_size(m), 211u + (uint32_t)i);
    masked_requests(m, p, true, ref);
    fm_model_free(m);
    m = load(&k_configs[0], 12, false, NULL, &err);
    masked_requests(m, p, false, r);
    for (int k = 0; k < NEW; k++) {
        assert_int_equal(r->ids[0][k] % 7, 3);
        assert_int_equal(r->ids[1][k], 77);
    }
    for (int i = 0; i < 3; i++) assert_memory_equal(r->ids[i], ref->ids[i], sizeof ref->ids[i]);
    fm_model_free(m);
    free(ref), free(r);
}

static void test_prefix_shared_when_submitted_together(void **state) {
    (void)state;
    fm_error err;
    fm_model *m = load(&k_configs[0], 0, true, NULL, &err);
    const int32_t V = fm_model_vocab_size(m);
    const int32_t block = m->context->kv->pool.block_tokens;
    int32_t a[MAX_PROMPT], b[MAX_PROMPT];
    prompt_ids(a, MAX_PROMPT, V, 7), memcpy(b, a, sizeof a);
    prompt_ids(b + 2 * block, MAX_PROMPT - 2 * block, V, 8); /* two blocks in common */
    sched_rec *r = sched_rec_new(NEW, TOP);
    fm_sched *s;
    if (fm_sched_create(m->context, 0, &s, &err)) fail_msg("%s", err.msg);
    sched_rec_submit_prompt(s, r, a, MAX_PROMPT), sched_rec_submit_prompt(s, r, b, MAX_PROMPT);
    while (sched_rec_step(s, r)) assert_true(r->step < MAX_STEPS);
    assert_tops(r);
    assert_int_equal(r->n_cached[0], 0);
    assert_int_equal(r->n_cached[1], 2 * block);
    assert_int_equal(r->n[0], NEW), assert_int_equal(r->n[1], NEW);
    fm_sched_free(s);
    fm_model_free(m);
    free(r);
}

static void test_budget_refused(void **state) {
    (void)state;
    fm_error err;
    fm_status st;
    fm_model *m = load(&k_configs[0], MAX_PROMPT + 1, false, &st, &err);
    assert_null(m);
    assert_int_equal(st, FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--max-step-tokens 41"));
    m = load(&k_configs[0], -2, false, &st, &err);
    assert_null(m);
    assert_int_equal(st, FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--max-step-tokens"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budgets_match_lone_runs),
        cmocka_unit_test(test_masks_and_bias_in_mixed_steps),
        cmocka_unit_test(test_prefix_shared_when_submitted_together),
        cmocka_unit_test(test_budget_refused),
        cmocka_unit_test(test_paged_tiled_route_same_tokens),
        cmocka_unit_test(test_mixed_padding_same_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
