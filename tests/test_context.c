/* The context (fp8moe.h fm_context) through the public API only, on the CPU backend:
 *   - created with NULL params it has what the model was loaded for (max_seqs, ctx, max_tokens, the prefix cache);
 *   - one context per model at a time: a second create is refused by name, and works again after fm_context_free;
 *   - asking for more than the load planned is refused naming the field and the load option; asking for less is
 *     enforced: a longer prompt than its max_tokens or its ctx is refused naming fm_context_params, and a scheduler
 *     over a context of one sequence runs two requests one after the other, to the tokens each gets alone;
 *   - a context given back holds no KV block, even when its caller kept a cache and never released it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fp8moe.h"
#include "fp8moe_sched.h"

static const char *k_model = "tests/models/qwen3-moe-f32";

static fm_model *load(int32_t max_seqs, int64_t ctx, int64_t max_tokens) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = max_seqs, opt.ctx = ctx, opt.max_tokens = max_tokens;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(k_model, &opt, &m, &err);
    if (st) fail_msg("load %s: %s", k_model, err.msg);
    return m;
}

static void defaults_are_the_load(void **state) {
    (void)state;
    fm_model *m = load(3, 48, 12);
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    assert_ptr_equal(fm_context_model(ctx), m);
    assert_int_equal(fm_context_max_seqs(ctx), 3);
    assert_int_equal(fm_context_ctx(ctx), 48);
    assert_int_equal(fm_context_max_tokens(ctx), 12);
    assert_true(fm_context_prefix_cache(ctx));
    int32_t used = -1, total = -1;
    fm_context_kv_blocks(ctx, &used, &total);
    assert_int_equal(used, 0);
    assert_true(total > 0);
    fm_context_free(ctx);
    fm_model_free(m);
}

static void one_context_at_a_time(void **state) {
    (void)state;
    fm_model *m = load(0, 0, 8);
    fm_context *a = NULL, *b = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &a, &err), FM_OK);
    assert_int_equal(fm_context_create(m, NULL, &b, &err), FM_ERR_USAGE);
    assert_null(b);
    assert_non_null(strstr(err.msg, "already has a context"));
    assert_int_equal(fm_context_max_seqs(a), 0); /* no KV cache: logits and perplexity only */
    fm_context_free(a);
    assert_int_equal(fm_context_create(m, NULL, &b, &err), FM_OK);
    fm_context_free(b);
    fm_model_free(m);
}

static void more_than_planned_is_refused(void **state) {
    (void)state;
    fm_model *m = load(2, 32, 8);
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    fm_context_params p = {.max_seqs = 3};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "fm_context_params.max_seqs 3"));
    assert_non_null(strstr(err.msg, "--max-seqs"));
    p = (fm_context_params){.ctx = 33};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "fm_context_params.ctx 33"));
    assert_non_null(strstr(err.msg, "--ctx"));
    p = (fm_context_params){.max_tokens = 9};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "fm_context_params.max_tokens 9"));
    p = (fm_context_params){.max_seqs = -1};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_ERR_USAGE);
    assert_null(ctx);
    /* a refusal holds nothing: the next create works */
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    fm_context_free(ctx);
    fm_model_free(m);
}

static void less_than_planned_is_enforced(void **state) {
    (void)state;
    fm_model *m = load(0, 32, 8);
    const int32_t V = fm_model_vocab_size(m);
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    const int32_t ids[8] = {1, 5, 9, 13, 17, 21, 25, 29};
    float *logits = malloc(8 * (size_t)V * sizeof *logits);
    fm_context_params p = {.max_tokens = 4};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_OK);
    assert_int_equal(fm_context_max_tokens(ctx), 4);
    assert_int_equal(fm_context_logits(ctx, ids, 5, logits, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "fm_context_params.max_tokens"));
    assert_int_equal(fm_context_logits(ctx, ids, 4, logits, &err), FM_OK);
    fm_context_free(ctx);
    p = (fm_context_params){.ctx = 6};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_OK);
    assert_int_equal(fm_context_ctx(ctx), 6);
    assert_int_equal(fm_context_logits(ctx, ids, 7, logits, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "fm_context_params.ctx"));
    assert_int_equal(fm_context_logits(ctx, ids, 6, logits, &err), FM_OK);
    fm_context_free(ctx);
    /* given back, the context has the load's limits again */
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    assert_int_equal(fm_context_logits(ctx, ids, 8, logits, &err), FM_OK);
    fm_context_free(ctx);
    free(logits);
    fm_model_free(m);
}

/* greedy tokens of one prompt, generated alone */
static void generate_alone(fm_context *ctx, const int32_t *prompt, int64_t n, int32_t *out, int64_t max_new) {
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = max_new, gp.ignore_eos = true;
    fm_gen_output o = {0};
    fm_error err = {{0}};
    const int32_t *pp = prompt;
    assert_int_equal(fm_context_generate(ctx, &pp, &n, &gp, 1, 0, NULL, NULL, &o, NULL, &err), FM_OK);
    assert_int_equal(o.n, max_new);
    memcpy(out, o.ids, (size_t)max_new * sizeof *out);
    free(o.ids), free(o.logprobs);
}

typedef struct seen {
    int32_t ids[2][6];
    int32_t n[2];
    int64_t first;
} seen;

static void on_event(void *user, const fm_sched_event *ev) {
    seen *s = user;
    const int64_t i = ev->req - s->first;
    if (ev->id >= 0 && s->n[i] < 6) s->ids[i][s->n[i]++] = ev->id;
}

static void one_sequence_context_runs_requests_in_turn(void **state) {
    (void)state;
    fm_model *m = load(2, 32, 8);
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    const int32_t a[5] = {3, 14, 15, 92, 65}, b[4] = {27, 18, 28, 18};
    int32_t want_a[6], want_b[6];
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    generate_alone(ctx, a, 5, want_a, 6);
    generate_alone(ctx, b, 4, want_b, 6);
    fm_context_free(ctx);

    fm_context_params p = {.max_seqs = 1};
    assert_int_equal(fm_context_create(m, &p, &ctx, &err), FM_OK);
    fm_sched *s = NULL;
    assert_int_equal(fm_sched_create(ctx, 0, &s, &err), FM_OK);
    seen got = {0};
    for (int i = 0; i < 2; i++) {
        fm_sched_request r;
        fm_sched_request_init(&r);
        r.prompt = i ? b : a, r.n_prompt = i ? 4 : 5;
        r.params.max_tokens = 6, r.params.ignore_eos = true;
        r.on_event = on_event, r.user = &got;
        int64_t id;
        assert_int_equal(fm_sched_submit(s, &r, &id, &err), FM_OK);
        if (!i) got.first = id;
    }
    bool busy = true;
    int32_t most_running = 0;
    while (busy) {
        assert_int_equal(fm_sched_step(s, &busy, &err), FM_OK);
        fm_sched_stats st;
        fm_sched_get_stats(s, &st);
        if (st.running > most_running) most_running = st.running;
    }
    assert_int_equal(most_running, 1); /* the second request waited for the first one's sequence */
    assert_int_equal(got.n[0], 6);
    assert_int_equal(got.n[1], 6);
    assert_memory_equal(got.ids[0], want_a, sizeof want_a);
    assert_memory_equal(got.ids[1], want_b, sizeof want_b);
    fm_sched_free(s);
    fm_context_free(ctx);
    fm_model_free(m);
}

static void given_back_holds_no_block(void **state) {
    (void)state;
    fm_model *m = load(2, 32, 8);
    fm_context *ctx = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    fm_sched *s = NULL;
    assert_int_equal(fm_sched_create(ctx, 0, &s, &err), FM_OK);
    const int32_t prompt[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    fm_sched_request r;
    fm_sched_request_init(&r);
    r.prompt = prompt, r.n_prompt = 20, r.keep = true; /* a kept cache outlives its request */
    r.params.max_tokens = 2;
    int64_t id;
    assert_int_equal(fm_sched_submit(s, &r, &id, &err), FM_OK);
    bool busy = true;
    while (busy) assert_int_equal(fm_sched_step(s, &busy, &err), FM_OK);
    int32_t used, total;
    fm_context_kv_blocks(ctx, &used, &total);
    assert_true(used > 0); /* the kept sequence holds its blocks */
    fm_sched_free(s);      /* never released by the caller */
    fm_context_free(ctx);
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    fm_context_kv_blocks(ctx, &used, &total);
    assert_int_equal(used, 0);
    fm_context_free(ctx);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_are_the_load),
        cmocka_unit_test(one_context_at_a_time),
        cmocka_unit_test(more_than_planned_is_refused),
        cmocka_unit_test(less_than_planned_is_enforced),
        cmocka_unit_test(one_sequence_context_runs_requests_in_turn),
        cmocka_unit_test(given_back_holds_no_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
