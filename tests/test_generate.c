/* Generation on the CPU backend (the oracle): the KV cache, positions, batched decode and the generate loop.
 *   - the logits of cached steps (a prefill of the first tokens, then one decode step per token, or the prompt in
 *     chunks) equal the full prefill's logits at the same positions: cosine >= 0.99999 per row (fp32 throughout;
 *     only the attention's summation order differs between the contiguous and the paged path);
 *   - greedy generate equals greedy decoding by full forward passes without any cache (the definition);
 *   - sequences decoded together give the same tokens as each decoded alone, with max_seqs below the number of
 *     prompts (slots are freed and reused, blocks too);
 *   - a fixed seed reproduces its tokens, another seed gives others; eos ids and max_tokens stop a sequence;
 *   - a prompt that does not fit the planned context is refused with numbers;
 *   - greedy generation (ref, fp32) equals transformers' generate(do_sample=False) token for token on every model
 *     with a golden_generate.json (tools/make_golden_generate.py, tools/make_qwen3_next_golden.py: 32 new tokens;
 *     prompts chosen so that no step's top-1/top-2 logit margin is a near tie, the smallest margin is in the file);
 *   - Qwen3-Next (Gated DeltaNet states per sequence beside the KV cache) passes the cache tests above too. */
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

static const char *k_model = "tests/models/qwen3-moe-f32"; /* the model of the next test (qwen3-next runs some again) */

static fm_model *load(int32_t max_seqs, int64_t ctx, int64_t max_tokens) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = max_seqs, opt.ctx = ctx, opt.max_tokens = max_tokens;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(k_model, &opt, &m, &err)) fail_msg("load: %s", err.msg);
    return m;
}

static void prompt_ids(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

static double cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* rows [first, first + rows) of a step's logits against the full pass's */
static void expect_rows(const float *full, const float *step, int64_t first, int64_t rows, int32_t V,
                        const char *what) {
    for (int64_t r = 0; r < rows; r++) {
        const double c = cosine(full + (first + r) * V, step + r * V, V);
        if (!(c >= 0.99999))
            fail_msg("%s: position %lld: cosine %.8f against the full prefill", what, (long long)(first + r), c);
    }
}

static void test_cached_steps_equal_prefill(void **state) {
    (void)state;
    enum { N = 20, P = 12 };
    fm_model *m = load(2, 64, 32);
    const int32_t V = fm_model_vocab_size(m);
    int32_t ids[N];
    prompt_ids(ids, N, V, 7);
    float *full = malloc((size_t)N * V * sizeof *full), *step = malloc((size_t)N * V * sizeof *step);
    fm_error err;
    assert_int_equal(fm_forward(m->context, ids, N, false, full, NULL, &err), FM_OK);
    fm_sampling sp;
    fm_sampling_init(&sp);
    /* a fresh prefill of P tokens, then one decode step per token */
    int32_t seq, seqs[N], pos[N];
    assert_int_equal(fm_kv_seq_begin(m->context, ids, P, &sp, &seq, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, P, &err), FM_OK);
    m->context->kv->tables_dirty = true;
    for (int t = 0; t < N; t++) seqs[t] = seq, pos[t] = t;
    assert_int_equal(fm_step_stage(m->context, ids, seqs, pos, P, &err), FM_OK);
    fm_step_device(m->context, P, false, FM_ATTN_FRESH);
    assert_int_equal(fm_step_logits(m->context, P, step, &err), FM_OK);
    expect_rows(full, step, 0, P, V, "fresh prefill");
    for (int t = P; t < N; t++) {
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, 1, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(m->context, ids + t, seqs, pos + t, 1, &err), FM_OK);
        fm_step_device(m->context, 1, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, 1, step, &err), FM_OK);
        expect_rows(full, step, t, 1, V, "decode step");
    }
    fm_kv_seq_end(m->context, seq);
    /* the same tokens as a prompt in chunks of 7 (paged attention over the cached prefix) */
    assert_int_equal(fm_kv_seq_begin(m->context, ids, N, &sp, &seq, &err), FM_OK);
    for (int p0 = 0; p0 < N; p0 += 7) {
        const int T = N - p0 < 7 ? N - p0 : 7;
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, T, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        for (int t = 0; t < T; t++) seqs[t] = seq;
        assert_int_equal(fm_step_stage(m->context, ids + p0, seqs, pos + p0, T, &err), FM_OK);
        fm_step_device(m->context, T, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, T, step, &err), FM_OK);
        expect_rows(full, step, p0, T, V, "prefill chunk");
    }
    fm_kv_seq_end(m->context, seq);
    free(full), free(step);
    fm_model_free(m);
}

/* greedy by definition: full forward passes, argmax of the last row */
static void greedy_reference(fm_model *ref, const int32_t *prompt, int64_t n, int64_t new_tokens, int32_t *out) {
    const int32_t V = fm_model_vocab_size(ref);
    int32_t *seq = malloc((size_t)(n + new_tokens) * sizeof *seq);
    float *lg = malloc((size_t)V * sizeof *lg);
    memcpy(seq, prompt, (size_t)n * sizeof *seq);
    fm_error err;
    for (int64_t t = 0; t < new_tokens; t++) {
        assert_int_equal(fm_forward(ref->context, seq, n + t, true, lg, NULL, &err), FM_OK);
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        seq[n + t] = out[t] = best;
    }
    free(seq), free(lg);
}

static void test_greedy_and_batches(void **state) {
    (void)state;
    enum { NP = 5, NEW = 10 };
    fm_model *m = load(3, 64, 16); /* 3 slots for 5 prompts; prefill chunks of 16 */
    fm_model *ref = load(0, 0, 64);
    const int32_t V = fm_model_vocab_size(m);
    const int64_t lens[NP] = {1, 16, 17, 30, 9}; /* 16: one full block; 17: one token into the second */
    int32_t buf[NP][30];
    const int32_t *prompts[NP];
    fm_gen_params gp[NP];
    for (int i = 0; i < NP; i++) {
        prompt_ids(buf[i], lens[i], V, 100 + (uint32_t)i);
        prompts[i] = buf[i];
        fm_gen_params_init(&gp[i]);
        gp[i].max_tokens = NEW, gp[i].ignore_eos = true;
    }
    fm_gen_output together[NP], alone;
    fm_gen_stats stats;
    fm_error err;
    if (fm_context_generate(m->context, prompts, lens, gp, NP, 0, NULL, NULL, together, &stats, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(stats.prefill_tokens, 1 + 16 + 17 + 30 + 9);
    assert_int_equal(stats.decode_tokens, NP * (NEW - 1));
    int32_t want[NEW];
    for (int i = 0; i < NP; i++) {
        assert_int_equal(together[i].n, NEW);
        assert_int_equal(together[i].finish, FM_FINISH_LENGTH);
        greedy_reference(ref, prompts[i], lens[i], NEW, want);
        assert_memory_equal(together[i].ids, want, sizeof want);
        if (fm_context_generate(m->context, &prompts[i], &lens[i], &gp[i], 1, 5, NULL, NULL, &alone, NULL, &err))
            fail_msg("%s", err.msg);
        assert_memory_equal(alone.ids, want, sizeof want); /* alone, and prefilled in chunks of 5 */
        for (int t = 0; t < NEW; t++) assert_true(together[i].logprobs[t] <= 0.0f && isfinite(together[i].logprobs[t]));
        free(alone.ids), free(alone.logprobs);
        free(together[i].ids), free(together[i].logprobs);
    }
    assert_int_equal(m->context->kv->pool.n_free, m->context->kv->pool.n_blocks); /* every block back in the pool */
    fm_model_free(m), fm_model_free(ref);
}

static void test_sampling_seed_and_stops(void **state) {
    (void)state;
    fm_model *m = load(2, 64, 16);
    const int32_t V = fm_model_vocab_size(m);
    int32_t p[8];
    prompt_ids(p, 8, V, 3);
    const int32_t *prompts[1] = {p};
    const int64_t len[1] = {8};
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = 24, gp.temperature = 1.0f, gp.top_p = 0.95f, gp.seed = 42, gp.ignore_eos = true;
    fm_gen_output a, b, c;
    fm_error err;
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &a, NULL, &err), FM_OK);
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &b, NULL, &err), FM_OK);
    gp.seed = 43;
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &c, NULL, &err), FM_OK);
    assert_int_equal(a.n, 24);
    assert_memory_equal(a.ids, b.ids, 24 * sizeof *a.ids);
    assert_memory_not_equal(a.ids, c.ids, 24 * sizeof *a.ids);
    /* a stop id: the sequence ends at its first occurrence, the id itself not in the output */
    const int32_t stop = a.ids[5];
    int first = 0;
    while (a.ids[first] != stop) first++;
    gp.seed = 42, gp.stop_ids = &stop, gp.n_stop_ids = 1;
    free(b.ids), free(b.logprobs);
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &b, NULL, &err), FM_OK);
    assert_int_equal(b.finish, FM_FINISH_EOS);
    assert_int_equal(b.n, first);
    assert_memory_equal(b.ids, a.ids, (size_t)first * sizeof *a.ids);
    /* a stop sequence of two ids */
    const int32_t two[2] = {a.ids[10], a.ids[11]};
    const int32_t *seqs[1] = {two};
    const int32_t lens2[1] = {2};
    gp.stop_ids = NULL, gp.n_stop_ids = 0, gp.stop_seqs = seqs, gp.stop_seq_lens = lens2, gp.n_stop_seqs = 1;
    free(b.ids), free(b.logprobs);
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &b, NULL, &err), FM_OK);
    assert_int_equal(b.finish, FM_FINISH_STOP);
    assert_true(b.n <= 10);
    free(a.ids), free(a.logprobs), free(b.ids), free(b.logprobs), free(c.ids), free(c.logprobs);
    /* more than the planned context: refused with the numbers */
    gp.max_tokens = 60;
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &a, NULL, &err),
                     FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "64 tokens per sequence"));
    fm_model_free(m);
}

static void test_without_cache(void **state) {
    (void)state;
    fm_model *m = load(0, 0, 16);
    int32_t p[2] = {1, 2};
    const int32_t *prompts[1] = {p};
    const int64_t len[1] = {2};
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    fm_gen_output o;
    fm_error err;
    assert_int_equal(fm_context_generate(m->context, prompts, len, &gp, 1, 0, NULL, NULL, &o, NULL, &err),
                     FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "max_seqs"));
    fm_model_free(m);
}

/* Qwen3-Next: the Gated DeltaNet layers keep a conv and a recurrent state per sequence beside the attention layers'
 * KV cache; a fresh prefill (the chunked rule) then decode steps (the recurrent one), prompts in chunks, slots
 * reused by later sequences, batched decode: the same logits and tokens as full passes without a cache. */
static void test_qwen3_next_cached_steps(void **state) {
    k_model = "tests/models/qwen3-next-f32";
    test_cached_steps_equal_prefill(state);
    k_model = "tests/models/qwen3-moe-f32";
}

/* Qwen3-Next: a 150-token prompt in chunks of 50 over the paged cache (each chunk's delta rule by the chunked form
 * from the state the chunks before it left; chunks that start inside one of the rule's 64-token chunks and cross
 * two), beside a decode row of another sequence in the last step: the logits equal the full pass's. */
static void test_qwen3_next_long_chunks(void **state) {
    (void)state;
    enum { N = 150, CHUNK = 50 };
    k_model = "tests/models/qwen3-next-f32";
    fm_model *m = load(2, 160, 160);
    k_model = "tests/models/qwen3-moe-f32";
    fm_context *ctx = m->context;
    const int32_t V = fm_model_vocab_size(m);
    int32_t ids[N], seqs[CHUNK + 1], pos[CHUNK + 1], a, b;
    prompt_ids(ids, N, V, 11);
    float *full = malloc((size_t)N * V * sizeof *full), *step = malloc((size_t)(CHUNK + 1) * V * sizeof *step);
    float *b_full = malloc((size_t)2 * V * sizeof *b_full); /* b's two tokens: ids[0], ids[1] */
    fm_error err;
    assert_int_equal(fm_forward(ctx, ids, N, false, full, NULL, &err), FM_OK);
    assert_int_equal(fm_forward(ctx, ids, 2, false, b_full, NULL, &err), FM_OK);
    fm_sampling sp;
    fm_sampling_init(&sp);
    assert_int_equal(fm_kv_seq_begin(ctx, ids, N, &sp, &a, &err), FM_OK);
    assert_int_equal(fm_kv_seq_begin(ctx, ids, 1, &sp, &b, &err), FM_OK); /* b: its first token, then a decode row */
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, b, 1, &err), FM_OK);
    ctx->kv->tables_dirty = true;
    const int32_t p0b = 0;
    assert_int_equal(fm_step_stage(ctx, ids, &b, &p0b, 1, &err), FM_OK);
    fm_step_device(ctx, 1, true, FM_ATTN_FRESH);
    for (int p0 = 0; p0 < N; p0 += CHUNK) {
        const bool last = p0 + CHUNK >= N;
        assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, a, CHUNK, &err), FM_OK);
        for (int t = 0; t < CHUNK; t++) seqs[t] = a, pos[t] = p0 + t;
        if (last) { /* b's second token after the chunk's rows */
            assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, b, 1, &err), FM_OK);
            seqs[CHUNK] = b, pos[CHUNK] = 1;
        }
        ctx->kv->tables_dirty = true;
        const int T = CHUNK + last;
        int32_t step_ids[CHUNK + 1];
        memcpy(step_ids, ids + p0, CHUNK * sizeof *ids);
        step_ids[CHUNK] = ids[1];
        assert_int_equal(fm_step_stage(ctx, step_ids, seqs, pos, T, &err), FM_OK);
        fm_step_device(ctx, T, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(ctx, T, step, &err), FM_OK);
        expect_rows(full, step, p0, CHUNK, V, "prompt chunk");
        if (last) expect_rows(b_full, step + (size_t)CHUNK * V, 1, 1, V, "decode row beside the chunk");
    }
    fm_kv_seq_end(ctx, a), fm_kv_seq_end(ctx, b);
    free(full), free(step), free(b_full);
    fm_model_free(m);
}

static void test_qwen3_next_greedy_and_batches(void **state) {
    k_model = "tests/models/qwen3-next-tied-f32";
    test_greedy_and_batches(state);
    k_model = "tests/models/qwen3-moe-f32";
}

/* 5 prompts over 3 slots of dir's model decoded together, with routes and with base (NULL: the defaults): the same
 * tokens and log-probabilities, bit for bit */
static void decode_same_with_routes(const char *dir, const char *base, const char *routes) {
    enum { NP = 5, NEW = 12 };
    fm_gen_output out[2][NP];
    for (int routed = 0; routed < 2; routed++) {
        fm_options opt;
        fm_options_init(&opt);
        opt.max_seqs = 3, opt.ctx = 64, opt.max_tokens = 16;
        opt.routes = routed ? routes : base;
        fm_model *m = NULL;
        fm_error err;
        if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
        const int32_t V = fm_model_vocab_size(m);
        const int64_t lens[NP] = {1, 16, 17, 30, 9};
        int32_t buf[NP][30];
        const int32_t *prompts[NP];
        fm_gen_params gp[NP];
        for (int i = 0; i < NP; i++) {
            prompt_ids(buf[i], lens[i], V, 300 + (uint32_t)i);
            prompts[i] = buf[i];
            fm_gen_params_init(&gp[i]);
            gp[i].max_tokens = NEW, gp[i].ignore_eos = true;
        }
        if (fm_context_generate(m->context, prompts, lens, gp, NP, 0, NULL, NULL, out[routed], NULL, &err))
            fail_msg("%s", err.msg);
        fm_model_free(m);
    }
    for (int i = 0; i < NP; i++) {
        assert_int_equal(out[0][i].n, NEW);
        assert_int_equal(out[1][i].n, NEW);
        assert_memory_equal(out[1][i].ids, out[0][i].ids, NEW * sizeof(int32_t));
        assert_memory_equal(out[1][i].logprobs, out[0][i].logprobs, NEW * sizeof(float));
        for (int f = 0; f < 2; f++) free(out[f][i].ids), free(out[f][i].logprobs);
    }
}

/* Route decode.fused on Qwen3-Next: each decode step's Gated DeltaNet layers as one op (gdn_decode_fused, the chain of
 * the three on the cpu backend, which also stops on a step that is not one row per sequence) and the attention
 * layers' o projection with its add and norm */
static void test_qwen3_next_decode_fused(void **state) {
    (void)state;
    decode_same_with_routes("tests/models/qwen3-next-f32", NULL, "decode.fused=on");
    decode_same_with_routes("tests/models/qwen3-next-bf16", NULL, "decode.fused=on");
}

/* Route gdn.decode_ba on Qwen3-Next: the fused op's own in_proj_ba projection (on the cpu backend: the linear, then
 * the chain), and gdn.early_state (a kernel's schedule: the same numbers everywhere) */
static void test_qwen3_next_decode_ba(void **state) {
    (void)state;
    decode_same_with_routes("tests/models/qwen3-next-f32", "decode.fused=on",
                            "decode.fused=on,gdn.decode_ba=on,gdn.early_state=on");
    decode_same_with_routes("tests/models/qwen3-next-bf16", "decode.fused=on", "decode.fused=on,gdn.decode_ba=on");
}

/* Route dense.quant=producer (the default) on Qwen3-MoE against dense.quant=kernel: paged attention and the o
 * projection as one op (attention_paged_o, the chain on the cpu backend), alone (the layer's add and norm after it)
 * and with decode.fused (in it) */
static void test_dense_quant_producer_route(void **state) {
    (void)state;
    const char *dir = "tests/models/qwen3-moe-bf16";
    decode_same_with_routes(dir, "dense.quant=kernel", "dense.quant=producer");
    decode_same_with_routes(dir, "dense.quant=kernel", "dense.quant=producer,decode.fused=on");
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
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        char path[256];
        snprintf(path, sizeof path, "%s/golden_generate.json", dirs[d]);
        FILE *f = fopen(path, "rb");
        if (!f) fail_msg("%s: missing (tools/make_golden_generate.py makes it)", path);
        static char text[1 << 16];
        const size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        cJSON *root = cJSON_Parse(text);
        const cJSON *jp = cJSON_GetObjectItem(root, "prompt"), *jw = cJSON_GetObjectItem(root, "new_ids");
        const int np = cJSON_GetArraySize(jp), nw = cJSON_GetArraySize(jw);
        int32_t prompt[64], want[64];
        assert_true(np <= 64 && nw <= 64);
        for (int i = 0; i < np; i++) prompt[i] = cJSON_GetArrayItem(jp, i)->valueint;
        for (int i = 0; i < nw; i++) want[i] = cJSON_GetArrayItem(jw, i)->valueint;
        const double margin = cJSON_GetObjectItem(root, "min_margin")->valuedouble;
        cJSON_Delete(root);
        fm_options opt;
        fm_options_init(&opt);
        opt.max_seqs = 1, opt.ctx = np + nw, opt.max_tokens = np;
        fm_model *m = NULL;
        fm_error err;
        if (fm_model_load(dirs[d], &opt, &m, &err)) fail_msg("%s: %s", dirs[d], err.msg);
        fm_gen_params gp;
        fm_gen_params_init(&gp);
        gp.max_tokens = nw;
        const int32_t *prompts[1] = {prompt};
        const int64_t lens[1] = {np};
        fm_gen_output o;
        if (fm_context_generate(m->context, prompts, lens, &gp, 1, 0, NULL, NULL, &o, NULL, &err))
            fail_msg("%s", err.msg);
        /* transformers returns the eos it stopped on; ours ends before it */
        int64_t got = o.n;
        if (o.finish == FM_FINISH_EOS)
            assert_true(got < nw && m->cfg.n_eos > 0 && want[got] == m->cfg.eos_ids[0]), got++;
        printf("  %-34s %d new tokens as transformers (smallest top-1/top-2 margin %.4f)\n", dirs[d], nw, margin);
        assert_int_equal(got, nw);
        assert_memory_equal(o.ids, want, (size_t)o.n * sizeof *want);
        free(o.ids), free(o.logprobs);
        fm_model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_steps_equal_prefill),
        cmocka_unit_test(test_greedy_and_batches),
        cmocka_unit_test(test_sampling_seed_and_stops),
        cmocka_unit_test(test_without_cache),
        cmocka_unit_test(test_qwen3_next_cached_steps),
        cmocka_unit_test(test_qwen3_next_long_chunks),
        cmocka_unit_test(test_qwen3_next_greedy_and_batches),
        cmocka_unit_test(test_qwen3_next_decode_fused),
        cmocka_unit_test(test_qwen3_next_decode_ba),
        cmocka_unit_test(test_dense_quant_producer_route),
        cmocka_unit_test(test_golden_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
