/* The serve warm-up (fp8moe.h fm_context_warmup, src/engine/warmup.c) on the GPU: afterwards every decode bucket up to
 * max_seqs has its CUDA graph captured (the first request replays graphs only), the pool is as it was (every block
 * free, none cached), and three requests (greedy, sampled with a seed, and one whose prompt prefix the cache serves)
 * give the very tokens and cached-token counts of a model that was never warmed up, for the int4 and fp8 presets. Runs
 * only where a GPU is present (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/routes.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "fp8moe_sched.h"
#include "gpu_test_util.h"

#define TINY "models/tiny-code-moe"
#define N_OUT 12
#define MAX_SEQS 8

static fm_model *load(fm_preset preset) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = preset, opt.routes = gpu_test_routes();
    opt.max_seqs = MAX_SEQS, opt.max_tokens = 64, opt.ctx = 512;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(TINY, &opt, &m, &err)) fail_msg("load on cuda (%s): %s", fm_preset_name(preset), err.msg);
    return m;
}

typedef struct result {
    int32_t ids[N_OUT];
    int32_t n;
    int64_t n_cached;
    fm_sched_end end;
} result;

static void on_event(void *user, const fm_sched_event *ev) {
    result *r = user;
    if (ev->id >= 0 && r->n < N_OUT) r->ids[r->n++] = ev->id;
    r->n_cached = ev->n_cached, r->end = ev->end;
}

static void run_requests(fm_model *m, result *out) {
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37 + 5) % 300;
    fm_sched *s = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_sched_create(m->context, 64, &s, &err), FM_OK);
    for (int r = 0; r < 3; r++) {
        fm_sched_request q;
        fm_sched_request_init(&q);
        q.prompt = prompt, q.n_prompt = r == 1 ? 21 : 40;
        q.params.max_tokens = N_OUT;
        if (r == 1) q.params.temperature = 0.8f, q.params.seed = 7;
        q.on_event = on_event, q.user = &out[r];
        int64_t id;
        assert_int_equal(fm_sched_submit(s, &q, &id, &err), FM_OK);
        for (bool busy = true; busy;)
            if (fm_sched_step(s, &busy, &err)) fail_msg("step: %s", err.msg);
        assert_int_not_equal(out[r].end, FM_SCHED_ERROR);
    }
    fm_sched_free(s);
}

static void warmup_on(fm_preset preset) {
    fm_model *cold = load(preset), *warm = load(preset);
    fm_warmup_report rep;
    fm_error err = {{0}};
    if (fm_context_warmup(warm->context, 64, &rep, &err)) fail_msg("%s", err.msg);
    assert_int_equal(rep.buckets, 4); /* 1, 2, 4, 8 */
    for (int b = 0; b < 4 && fm_routes_decode_graphs(&warm->routes); b++) assert_non_null(warm->context->kv->graphs[b]);
    assert_int_equal(warm->context->kv->pool.n_free, warm->context->kv->pool.n_blocks);
    assert_int_equal(warm->context->kv->pool.n_lru, 0);
    result a[3], b[3];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b);
    run_requests(cold, a);
    run_requests(warm, b);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(a[r].n, b[r].n);
        assert_memory_equal(a[r].ids, b[r].ids, sizeof a[r].ids);
        assert_int_equal(a[r].n_cached, b[r].n_cached);
    }
    printf("  %s: warm-up in %.3f s (%lld prefill tokens, %d buckets captured); 3 requests identical\n",
           fm_preset_name(preset), rep.seconds, (long long)rep.prefill_tokens, rep.buckets);
    fm_model_free(cold), fm_model_free(warm);
}

static void int4(void **s) {
    (void)s;
    warmup_on(FM_PRESET_INT4);
}

static void fp8(void **s) {
    (void)s;
    warmup_on(FM_PRESET_FP8);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(int4), cmocka_unit_test(fp8)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
