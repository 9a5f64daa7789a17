/* A constrained decode step whose masks are filled while the forward pass runs (fm_decode_run_masked), on the CPU
 * backend (the oracle), against the same steps with the masks filled and copied before the step (the order the engine
 * had before):
 *   - json_object matchers over a vocabulary whose tokens span JSON boundaries, sampled at temperature 1 from the
 *     random tiny model (tests/models/qwen3-moe-f32, 320 ids), 4 sequences of which rows 0 and 2 are constrained
 *     (3 rows copied): the same ids and log-probabilities bit for bit over 48 steps, every constrained id accepted by
 *     its matcher, the fill called once per step after the pass (the step's new logits are there when it runs);
 *   - the unconstrained rows 1 and 3 sample what they sample with no constraint in the step at all;
 *   - through the scheduler (fm_context_generate, which fills its masks during the pass): json_object outputs that end
 *     parse as JSON objects. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "text/grammar.h"
#include "text/token_matcher.h"

#define MODEL "tests/models/qwen3-moe-f32"
#define V 320
#define END 319
#define B 4
#define STEPS 48
#define PROMPT 5

static fm_model *load(void) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = B, opt.ctx = 512, opt.max_tokens = 32;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(MODEL, &opt, &m, &err)) fail_msg("load %s: %s", MODEL, err.msg);
    assert_int_equal(fm_model_vocab_size(m), V);
    return m;
}

/* ids 0..255: the bytes; then tokens across JSON boundaries, repeated up to 318; 319: the end (no bytes) */
static fm_token_vocab *vocab(void) {
    static const char *const multi[] = {"\"},", "\":",   "\": ", "\", \"", "{\"", "[{\"", "}]",  "}}", "],", "null",
                                        "true", "false", "-1",   "0.",     "12",  "\"\n", "  ",  "{}", "[]", "\"id\"",
                                        "\"}",  "\"]}",  "ab",   "\\\"",   "3]",  "9.5",  "},{", "[[", "]]", "\"\""};
    static uint8_t bytes[256];
    const uint8_t *p[V];
    uint32_t lens[V];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, p[i] = &bytes[i], lens[i] = 1;
    const int n_multi = (int)(sizeof multi / sizeof *multi);
    for (int i = 256; i < END; i++) {
        const char *s = multi[(i - 256) % n_multi];
        p[i] = (const uint8_t *)s, lens[i] = (uint32_t)strlen(s);
    }
    p[END] = NULL, lens[END] = 0;
    fm_token_vocab *v;
    fm_error err;
    assert_int_equal(fm_token_vocab_create(V, p, lens, NULL, &v, &err), FM_OK);
    return v;
}

/* One run's sequences: matcher j (NULL: row j unconstrained), and what the fill saw. */
typedef struct run {
    fm_model *m;
    fm_matcher *mt[B];
    int32_t fills;
    float *logits_before; /* [B][V]: the logits buffer before the step */
    bool fresh_logits;    /* every fill so far saw logits other than those before its step */
} run;

static int32_t fill(void *user) {
    run *r = user;
    fm_kv_state *kv = r->m->context->kv;
    const size_t words = (V + 31) / 32;
    float *now = malloc((size_t)B * V * sizeof *now);
    fm_error err;
    assert_int_equal(fm_step_logits(r->m->context, B, now, &err), FM_OK);
    r->fresh_logits &= memcmp(now, r->logits_before, (size_t)B * V * sizeof *now) != 0;
    free(now);
    r->fills++;
    int32_t rows = 0;
    for (int32_t j = 0; j < B; j++)
        if (r->mt[j]) fm_matcher_fill_mask(r->mt[j], kv->h_mask + (size_t)j * words), rows = j + 1;
    return rows;
}

/* B sequences prefilled, then STEPS steps: masks during the pass (overlap) or before the step; constrained: rows 0
 * and 2 under json_object. ids[STEPS][B], lp[STEPS][B]. */
static void decode(const fm_grammar *g, const fm_token_vocab *v, bool overlap, bool constrained, int32_t *ids,
                   float *lp) {
    run r = {.m = load(), .fresh_logits = true};
    fm_context *ctx = r.m->context;
    fm_error err;
    int32_t seq[B], in[B], out[B], prompt[PROMPT], sq[PROMPT], pos[PROMPT];
    const int32_t end = END;
    r.logits_before = malloc((size_t)B * V * sizeof *r.logits_before);
    for (int32_t j = 0; j < B; j++) {
        for (int32_t t = 0; t < PROMPT; t++) prompt[t] = (t * 37 + j * 101 + 7) % 256, sq[t] = 0, pos[t] = t;
        fm_sampling sp;
        fm_sampling_init(&sp);
        sp.temperature = 1.0f, sp.seed = 77 + (uint64_t)j, sp.masked = constrained && j % 2 == 0;
        assert_int_equal(fm_kv_seq_begin(ctx, prompt, PROMPT, &sp, &seq[j], &err), FM_OK);
        for (int32_t t = 0; t < PROMPT - 1; t++) sq[t] = seq[j];
        assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, seq[j], PROMPT - 1, &err), FM_OK);
        ctx->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(ctx, prompt, sq, pos, PROMPT - 1, &err), FM_OK);
        fm_step_device(ctx, PROMPT - 1, true, FM_ATTN_FRESH);
        in[j] = prompt[PROMPT - 1];
        r.mt[j] = NULL;
        if (sp.masked) assert_int_equal(fm_matcher_create(g, v, &end, 1, &r.mt[j], &err), FM_OK);
    }
    const fm_step_masks masks = {fill, &r};
    const size_t mask_bytes = (size_t)B * ((V + 31) / 32) * sizeof(uint32_t);
    for (int32_t s = 0; s < STEPS; s++) {
        for (int32_t j = 0; j < B; j++) assert_int_equal(fm_kv_reserve(ctx, seq[j], 1, &err), FM_OK);
        assert_int_equal(fm_step_logits(ctx, B, r.logits_before, &err), FM_OK);
        if (!overlap) {
            const int32_t rows = fill(&r);
            r.m->be->ops->upload_raw(r.m->be, ctx->kv->h_mask, mask_bytes, ctx->kv->mask);
            assert_int_equal(rows, constrained ? 3 : 0);
        }
        assert_int_equal(fm_decode_run_masked(ctx, B, in, seq, overlap ? &masks : NULL, out, ctx->kv->h_info, &err),
                         FM_OK);
        for (int32_t j = 0; j < B; j++) {
            ids[s * B + j] = in[j] = out[j], lp[s * B + j] = ctx->kv->h_info[j].logprob;
            if (!r.mt[j]) continue;
            assert_true(fm_matcher_accept(r.mt[j], out[j]));
            if (fm_matcher_finished(r.mt[j])) { /* a complete object: the next one */
                fm_matcher_free(r.mt[j]);
                assert_int_equal(fm_matcher_create(g, v, &end, 1, &r.mt[j], &err), FM_OK);
            }
        }
    }
    assert_int_equal(r.fills, STEPS);
    if (overlap) assert_true(r.fresh_logits); /* the fill ran after the step's pass */
    for (int32_t j = 0; j < B; j++) fm_matcher_free(r.mt[j]), fm_kv_seq_end(ctx, seq[j]);
    free(r.logits_before);
    fm_model_free(r.m);
}

static void overlap_equals_masks_before(void **state) {
    (void)state;
    fm_token_vocab *v = vocab();
    fm_grammar *g;
    fm_error err;
    assert_int_equal(fm_grammar_json_object(&g, &err), FM_OK);
    int32_t a[STEPS * B], b[STEPS * B], free_ids[STEPS * B];
    float la[STEPS * B], lb[STEPS * B], lf[STEPS * B];
    decode(g, v, true, true, a, la);
    decode(g, v, false, true, b, lb);
    decode(g, v, true, false, free_ids, lf);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(la, lb, sizeof la);
    int32_t differ = 0;
    for (int32_t s = 0; s < STEPS; s++)
        for (int32_t j = 0; j < B; j++) {
            if (j % 2) assert_int_equal(a[s * B + j], free_ids[s * B + j]); /* unconstrained rows: untouched */
            else differ += a[s * B + j] != free_ids[s * B + j];
        }
    assert_true(differ > 0); /* the constrained rows did follow their masks */
    printf("  %d steps x %d rows: overlapped masks equal masks before the step; %d of %d constrained ids differ from "
           "unconstrained sampling\n",
           STEPS, B, differ, STEPS * B / 2);
    fm_grammar_free(g);
    fm_token_vocab_free(v);
}

static void scheduler_json_object(void **state) {
    (void)state;
    fm_model *m = load();
    fm_token_vocab *v = vocab();
    fm_grammar *g;
    fm_error err;
    assert_int_equal(fm_grammar_json_object(&g, &err), FM_OK);
    const int32_t end = END;
    fm_matcher *mt[B];
    fm_token_constraint cons[B];
    fm_gen_params params[B];
    fm_gen_output out[B];
    const int32_t *prompts[B];
    int64_t lens[B];
    static const int32_t prompt[3] = {5, 17, 101};
    for (int32_t i = 0; i < B; i++) {
        assert_int_equal(fm_matcher_create(g, v, &end, 1, &mt[i], &err), FM_OK);
        cons[i] = fm_matcher_constraint(mt[i]);
        fm_gen_params_init(&params[i]);
        params[i].temperature = 1.0f, params[i].seed = 500 + (uint64_t)i, params[i].max_tokens = 400;
        params[i].stop_ids = &end, params[i].n_stop_ids = 1;
        params[i].constraint = i == 1 ? NULL : &cons[i];
        prompts[i] = prompt, lens[i] = 3;
    }
    if (fm_context_generate(m->context, prompts, lens, params, B, 0, NULL, NULL, out, NULL, &err))
        fail_msg("generate: %s", err.msg);
    int32_t ended = 0;
    for (int32_t i = 0; i < B; i++) {
        if (i != 1) { /* every id its matcher's (replayed through a fresh one); an output that ended is an object */
            fm_matcher *r;
            assert_int_equal(fm_matcher_create(g, v, &end, 1, &r, &err), FM_OK);
            size_t n = 1;
            char *text = calloc(1, 1);
            for (int64_t k = 0; k < out[i].n; k++) {
                assert_true(fm_matcher_accept(r, out[i].ids[k]));
                uint32_t len;
                const uint8_t *b = fm_token_vocab_bytes(v, out[i].ids[k], &len);
                text = realloc(text, n + len);
                memcpy(text + n - 1, b, len), n += len, text[n - 1] = 0;
            }
            if (out[i].finish == FM_FINISH_EOS) {
                cJSON *o = cJSON_Parse(text);
                if (!o || !cJSON_IsObject(o)) fail_msg("output %d is not a JSON object: %s", i, text);
                cJSON_Delete(o);
                ended++;
            }
            free(text);
            fm_matcher_free(r);
        }
        free(out[i].ids), free(out[i].logprobs);
        fm_matcher_free(mt[i]);
    }
    printf("  scheduler: %d of 3 constrained outputs ended as JSON objects, every id allowed\n", ended);
    assert_true(ended >= 2);
    fm_grammar_free(g);
    fm_token_vocab_free(v);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(overlap_equals_masks_before),
        cmocka_unit_test(scheduler_json_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
