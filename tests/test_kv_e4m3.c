/* The e4m3 KV cache (--kv-cache e4m3) at the engine's level, on the CPU backend's emulation (each cached row holds
 * its codes' values; the ops and the row format: test_cpu_ops.c, and the GPU's bits against it: tests/gpu):
 *   - decode steps through an e4m3 cache follow the bf16 cache's logits closely (cosine per position, the same
 *     top-1), and differ from them (the cache is quantized: not a no-op);
 *   - a prompt in chunks over its cached prefix gives the decode steps' logits at the same positions (the same
 *     quantized keys and values, whichever step wrote them);
 *   - refused, naming the option: with fp32 activations (the ref plan on the cpu), and without a KV cache;
 *   - the command line: generate and perplexity --cache-chunk run with it (the perplexity through the cache close to
 *     the bf16 cache's), a bad value or --kv-cache without a cache is a usage error naming it; bench prefill --at
 *     takes it (a prompt chunk over the cache), and refuses it without --at. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_runner.h"
#include "engine/engine.h"
#include "engine/kv_state.h"

static const char *k_model = "models/tiny-code-moe"; /* trained: its logits are not a random model's near ties */

static fm_status load(fm_preset preset, fm_kv_dtype kv, int32_t max_seqs, fm_model **m, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset, opt.kv_cache = kv;
    opt.max_seqs = max_seqs, opt.ctx = 64, opt.max_tokens = 32;
    return fm_model_load(k_model, &opt, m, err);
}

static double cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* logits [N][V] of ids: a fresh prefill of P tokens, then one decode step per token (chunk 1), or chunks of `chunk`
   tokens over the cached prefix after the prefill */
static void cached_logits(fm_model *m, const int32_t *ids, int N, int P, int chunk, float *out) {
    const int32_t V = fm_model_vocab_size(m);
    fm_error err;
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq, seqs[64], pos[64];
    for (int t = 0; t < N; t++) pos[t] = t;
    assert_int_equal(fm_kv_seq_begin(m->context, ids, N, &sp, &seq, &err), FM_OK);
    for (int t = 0; t < N; t++) seqs[t] = seq;
    for (int p0 = 0; p0 < N;) {
        const int T = p0 == 0 ? P : (N - p0 < chunk ? N - p0 : chunk);
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, T, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(m->context, ids + p0, seqs, pos + p0, T, &err), FM_OK);
        fm_step_device(m->context, T, false, p0 == 0 ? FM_ATTN_FRESH : FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, T, out + (int64_t)p0 * V, &err), FM_OK);
        p0 += T;
    }
    fm_kv_seq_end(m->context, seq);
}

/* Bounds, from the run on models/tiny-code-moe (fp8 preset, the first 40 tokens of its eval text, decode steps after
   a prefill of 8): cosine of the e4m3 cache's logits against the bf16 cache's, mean 0.9978, worst 0.983; the
   same top-1 at 38 of 40 positions. The bounds (0.995, 0.97, 36) leave room for another compiler's rounding; the
   accuracy that counts is the perplexity through the cache (docs/kv-cache.md). */
static void test_decode_follows_bf16(void **state) {
    (void)state;
    enum { N = 40, P = 8 };
    fm_model *a = NULL, *b = NULL;
    fm_error err;
    if (load(FM_PRESET_FP8, FM_KV_ACT, 1, &a, &err)) fail_msg("load: %s", err.msg);
    if (load(FM_PRESET_FP8, FM_KV_E4M3, 1, &b, &err)) fail_msg("load e4m3: %s", err.msg);
    assert_int_equal(b->context->kv->dtype, FM_KV_E4M3);
    assert_int_equal(fm_context_kv_cache(b->context), FM_KV_E4M3);
    assert_int_equal(fm_context_kv_cache(a->context), FM_KV_ACT);
    const int32_t V = fm_model_vocab_size(a);
    int32_t ids[N]; /* the start of its eval text */
    FILE *f = fopen("models/tiny-code-moe/eval_ids.i32", "rb");
    assert_non_null(f);
    assert_int_equal(fread(ids, sizeof *ids, N, f), N);
    fclose(f);
    float *la = malloc((size_t)N * V * sizeof *la), *lb = malloc((size_t)N * V * sizeof *lb),
          *lc = malloc((size_t)N * V * sizeof *lc);
    cached_logits(a, ids, N, P, 1, la);
    cached_logits(b, ids, N, P, 1, lb);
    double worst = 1.0, mean = 0.0;
    int same_top = 0, differ = 0;
    for (int t = 0; t < N; t++) {
        const double c = cosine(la + (int64_t)t * V, lb + (int64_t)t * V, V);
        worst = c < worst ? c : worst, mean += c / N;
        same_top += argmax(la + (int64_t)t * V, V) == argmax(lb + (int64_t)t * V, V);
        differ += t >= P && memcmp(la + (int64_t)t * V, lb + (int64_t)t * V, (size_t)V * sizeof *la) != 0;
    }
    printf("  e4m3 against bf16 cache: cosine mean %.6f worst %.6f, same top-1 at %d of %d positions, %d decode steps "
           "differ\n",
           mean, worst, same_top, N, differ);
    assert_true(mean >= 0.995);
    assert_true(worst >= 0.97);
    assert_true(same_top >= N - 4);
    assert_true(differ > 0);
    /* the prefill's own positions attend to the pass's rows, not the cache: equal to the bf16 cache's */
    assert_memory_equal(la, lb, (size_t)P * V * sizeof *la);
    /* chunks of 5 over the cached prefix read the same cached values as the decode steps */
    cached_logits(b, ids, N, P, 5, lc);
    for (int t = P; t < N; t++) {
        const double c = cosine(lb + (int64_t)t * V, lc + (int64_t)t * V, V);
        if (!(c >= 0.99999)) fail_msg("position %d: chunked %.8f against decode steps", t, c);
    }
    free(la), free(lb), free(lc);
    fm_model_free(a), fm_model_free(b);
}

static void test_refusals(void **state) {
    (void)state;
    fm_model *m = NULL;
    fm_error err;
    assert_int_equal(load(FM_PRESET_REF, FM_KV_E4M3, 1, &m, &err), FM_ERR_USAGE);
    assert_null(m);
    assert_non_null(strstr(err.msg, "--kv-cache e4m3"));
    assert_non_null(strstr(err.msg, "fp32 activations"));
    assert_int_equal(load(FM_PRESET_FP8, FM_KV_E4M3, 0, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "without a KV cache"));
    fm_kv_dtype d;
    assert_true(fm_kv_dtype_parse("e4m3", &d) && d == FM_KV_E4M3);
    assert_true(fm_kv_dtype_parse("auto", &d) && d == FM_KV_ACT);
    assert_false(fm_kv_dtype_parse("fp8", &d));
    assert_string_equal(fm_kv_dtype_name(FM_KV_E4M3), "e4m3");
}

static double ppl_of(const char *out) {
    const char *p = strstr(out, "perplexity = ");
    if (!p) fail_msg("no perplexity line in: %s", out);
    return atof(p + 13);
}

static void test_command_line(void **state) {
    (void)state;
    const char *M = "--model models/tiny-code-moe --preset fp8";
    if (fp8moe("generate %s --prompt 'def add(a, b):' --max-tokens 12 --kv-cache e4m3", M))
        fail_msg("generate --kv-cache e4m3: %s", cli_err);
    assert_true(strlen(cli_out) > 0);
    assert_int_equal(fp8moe("generate %s --prompt x --max-tokens 2 --kv-cache fp16", M), 2);
    assert_non_null(strstr(cli_err, "--kv-cache expects auto or e4m3, got 'fp16'"));
    assert_int_equal(fp8moe("perplexity %s --ids models/tiny-code-moe/eval_ids.i32 --windows 1 --kv-cache e4m3", M), 2);
    assert_non_null(strstr(cli_err, "--cache-chunk"));
    double ppl[2];
    for (int i = 0; i < 2; i++) {
        if (fp8moe("perplexity %s --ids models/tiny-code-moe/eval_ids.i32 --windows 2 --cache-chunk 64 --kv-cache %s",
                   M, i ? "e4m3" : "auto"))
            fail_msg("perplexity: %s", cli_err);
        assert_non_null(strstr(cli_out, i ? "cache e4m3" : "cache auto"));
        ppl[i] = ppl_of(cli_out);
    }
    printf("  perplexity through the cache, 2 windows: auto %.4f, e4m3 %.4f\n", ppl[0], ppl[1]);
    assert_true(fabs(ppl[1] / ppl[0] - 1.0) < 0.01);
    /* bench prefill --at: a prompt chunk over an e4m3 cache; without --at there is no cache to format */
    if (fp8moe("bench prefill --synthetic toy-moe --backend cpu --preset fp8 --layers 1 --tokens 8 --at 24 --repeat 1 "
               "--warmup 0 --kv-cache e4m3"))
        fail_msg("bench prefill --at --kv-cache e4m3: %s", cli_err);
    assert_non_null(strstr(cli_out, "KV cache e4m3"));
    assert_int_equal(fp8moe("bench prefill --synthetic toy-moe --backend cpu --layers 1 --tokens 8 --kv-cache e4m3"),
                     2);
    assert_non_null(strstr(cli_err, "--kv-cache needs --at"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_follows_bf16),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_command_line),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
