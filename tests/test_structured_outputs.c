/* Structured outputs and logit_bias through the engine on the CPU backend (the oracle):
 *   - random JSON Schemas (objects, arrays, bounded strings, bounded integers and numbers, enums, consts, anyOf, type
 *     arrays, nested) sampled at temperature 1 from a random tiny model (tests/models/qwen3-moe-f32, 320 ids: the
 *     256 bytes, 63 multi-byte tokens that span JSON boundaries such as `"},` or `\xa9"`, and an end id), several
 *     requests decoded together: every output ends with the end id, parses, and is valid against its schema by
 *     python3-jsonschema (tools/check_json_schema.py), an oracle this code does not share;
 *   - the same with models/tiny-code-moe's real byte-level BPE vocabulary and a schema; json_object mode too, whose
 *     keys and strings have no bound: outputs that end are validated, the others replayed through a fresh matcher;
 *   - logit_bias: -100 bans the greedy choice, +100 forces an id, bad entries are refused by name;
 *   - the reference sampler with a mask: greedy takes the best allowed id, sampling draws allowed ids only. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_runner.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "text/grammar.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"

#define RANDOM_MODEL "tests/models/qwen3-moe-f32"
#define V320 320
#define END320 319

static fm_model *load(const char *dir, int32_t max_seqs, int64_t ctx) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = max_seqs, opt.ctx = ctx, opt.max_tokens = 64;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
    return m;
}

/* ids 0..255: the bytes; 256..318: tokens across JSON boundaries; 319: the end (no bytes) */
static fm_token_vocab *vocab320(void) {
    static const char *const multi[] = {
        "\"},",   "\":",      "\": ",    "\", \"",    "{\"",         "[{\"",  "}]",  "}}",       "],",
        "null",   "true",     "false",   "-1",        "0.",          "e+",    "12",  "\\u00",    "\\n",
        "\"\n",   "\xc3\xa9", "\xc3",    "\xa9\"",    "  ",          "\n  ",  "{}",  "[]",       "\"id\"",
        "\"name", "tags\"",   "\"ok\":", "1,",        "\",",         "\"]",   ", ",  "\"}",      "\"]}",
        "ab",     "red",      "green\"", "\"fixed",   "\\\"",        "3]",    "-0",  "9.5",      "E-",
        "100",    "\t",       " \"",     "\"v\": ",   "null,",       "true]", "é\"", "\xe2\x82", "\xac",
        "},{",    "[[",       "]]",      "{\"a\":1}", "\"tags\": [", "\\",    ":",   "\"\"",     "xyz",
    };
    static uint8_t bytes[256];
    const uint8_t *p[V320];
    uint32_t lens[V320];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, p[i] = &bytes[i], lens[i] = 1;
    const int n_multi = (int)(sizeof multi / sizeof *multi);
    assert_true(n_multi <= END320 - 256);
    for (int i = 256; i < END320; i++) {
        const char *s = multi[(i - 256) % n_multi];
        p[i] = (const uint8_t *)s, lens[i] = (uint32_t)strlen(s);
    }
    p[END320] = NULL, lens[END320] = 0;
    fm_token_vocab *v;
    fm_error err;
    assert_int_equal(fm_token_vocab_create(V320, p, lens, NULL, &v, &err), FM_OK);
    return v;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)((rs >> 11) % n);
}

/* A random schema whose every valid value is short (bounded strings, digits, items), so a sampled output ends. */
static cJSON *random_schema(int depth) {
    cJSON *s = cJSON_CreateObject();
    switch (rnd(depth >= 2 ? 7 : 10)) {
    case 0:
        cJSON_AddStringToObject(s, "type", "string");
        cJSON_AddNumberToObject(s, "maxLength", 1 + rnd(6));
        if (rnd(2)) cJSON_AddNumberToObject(s, "minLength", rnd(2));
        break;
    case 1:
        cJSON_AddStringToObject(s, "type", "integer");
        if (rnd(2)) cJSON_AddNumberToObject(s, "minimum", -(double)rnd(50));
        cJSON_AddNumberToObject(s, rnd(2) ? "maximum" : "exclusiveMaximum", 1 + rnd(1000));
        break;
    case 2:
        cJSON_AddStringToObject(s, "type", "number");
        cJSON_AddNumberToObject(s, "minimum", rnd(2) ? -2.5 : 0.25);
        cJSON_AddNumberToObject(s, rnd(2) ? "maximum" : "exclusiveMaximum", 100.25);
        break;
    case 3: cJSON_AddStringToObject(s, "type", "boolean"); break;
    case 4: {
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(t, cJSON_CreateString("string"));
        cJSON_AddItemToArray(t, cJSON_CreateString("null"));
        cJSON_AddNumberToObject(s, "maxLength", 4);
        break;
    }
    case 5: {
        cJSON *e = cJSON_AddArrayToObject(s, "enum");
        cJSON_AddItemToArray(e, cJSON_CreateString("red"));
        cJSON_AddItemToArray(e, cJSON_CreateString("green"));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(3));
        cJSON_AddItemToArray(e, cJSON_CreateNull());
        cJSON_AddItemToArray(e, cJSON_CreateString("r\xc3\xa9"));
        break;
    }
    case 6:
        if (rnd(2)) cJSON_AddStringToObject(s, "const", "fixed");
        else cJSON_AddItemToObject(s, "const", cJSON_Parse("{\"a\":1}"));
        break;
    case 7: {
        static const char *const names[] = {"id", "name", "tags", "ok", "v", "\xc3\xa9t\xc3\xa9"};
        cJSON_AddStringToObject(s, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_AddArrayToObject(s, "required");
        const uint32_t n = 1 + rnd(3), first = rnd(6);
        for (uint32_t i = 0; i < n; i++) {
            const char *k = names[(first + i) % 6];
            cJSON_AddItemToObject(props, k, random_schema(depth + 1));
            if (rnd(3)) cJSON_AddItemToArray(req, cJSON_CreateString(k));
        }
        cJSON_AddBoolToObject(s, "additionalProperties", 0);
        break;
    }
    case 8: {
        cJSON_AddStringToObject(s, "type", "array");
        cJSON_AddItemToObject(s, "items", random_schema(depth + 1));
        const uint32_t lo = rnd(2);
        cJSON_AddNumberToObject(s, "minItems", lo);
        cJSON_AddNumberToObject(s, "maxItems", lo + rnd(3));
        break;
    }
    default: {
        cJSON *a = cJSON_AddArrayToObject(s, "anyOf");
        cJSON_AddItemToArray(a, random_schema(depth + 1));
        cJSON_AddItemToArray(a, random_schema(depth + 1));
        break;
    }
    }
    if (rnd(4) == 0) cJSON_AddStringToObject(s, "description", "documentation only");
    return s;
}

/* The output's text: its ids' bytes. */
static char *text_of(const fm_token_vocab *v, const int32_t *ids, int64_t n) {
    size_t total = 1;
    for (int64_t i = 0; i < n; i++) {
        uint32_t len;
        fm_token_vocab_bytes(v, ids[i], &len);
        total += len;
    }
    char *t = malloc(total), *p = t;
    for (int64_t i = 0; i < n; i++) {
        uint32_t len;
        const uint8_t *b = fm_token_vocab_bytes(v, ids[i], &len);
        memcpy(p, b, len), p += len;
    }
    *p = 0;
    return t;
}

/* Generates one output per grammar (temperature 1, together), checks each ends and parses, and appends
 * {"schema", "output"} to cases (schemas[i] NULL: json_object mode, checked against {"type":"object"}). may_stop:
 * an output cut by max_tokens is only replayed through a fresh matcher (every token accepted). */
static void sample_all(fm_model *m, const fm_token_vocab *v, fm_grammar **g, cJSON **schemas, int32_t n, int32_t end,
                       int64_t max_tokens, uint64_t seed, bool may_stop, cJSON *cases) {
    fm_matcher **mt = calloc((size_t)n, sizeof *mt);
    fm_token_constraint *cons = calloc((size_t)n, sizeof *cons);
    fm_gen_params *params = calloc((size_t)n, sizeof *params);
    fm_gen_output *out = calloc((size_t)n, sizeof *out);
    const int32_t **prompts = calloc((size_t)n, sizeof *prompts);
    int64_t *lens = calloc((size_t)n, sizeof *lens);
    static int32_t prompt[3] = {5, 17, 101};
    fm_error err;
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(fm_matcher_create(g[i], v, &end, 1, &mt[i], &err), FM_OK);
        cons[i] = fm_matcher_constraint(mt[i]);
        fm_gen_params_init(&params[i]);
        params[i].temperature = 1.0f, params[i].seed = seed + (uint64_t)i, params[i].max_tokens = max_tokens;
        params[i].stop_ids = &end, params[i].n_stop_ids = 1;
        params[i].constraint = &cons[i];
        prompts[i] = prompt, lens[i] = 3;
    }
    const fm_status st = fm_context_generate(m->context, prompts, lens, params, n, 0, NULL, NULL, out, NULL, &err);
    if (st) fail_msg("generate: %s", err.msg);
    for (int32_t i = 0; i < n; i++) {
        char *text = text_of(v, out[i].ids, out[i].n);
        if (may_stop && out[i].finish == FM_FINISH_LENGTH) {
            fm_matcher *r;
            assert_int_equal(fm_matcher_create(g[i], v, &end, 1, &r, &err), FM_OK);
            for (int64_t k = 0; k < out[i].n; k++) assert_true(fm_matcher_accept(r, out[i].ids[k]));
            fm_matcher_free(r), fm_matcher_free(mt[i]);
            free(text), free(out[i].ids), free(out[i].logprobs);
            continue;
        }
        if (out[i].finish != FM_FINISH_EOS)
            fail_msg("output %d did not end within %lld tokens: %s", i, (long long)max_tokens, text);
        cJSON *parsed = cJSON_Parse(text);
        if (!parsed) fail_msg("output %d does not parse: %s", i, text);
        cJSON_Delete(parsed);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToObject(c, "schema",
                              schemas[i] ? cJSON_Duplicate(schemas[i], 1) : cJSON_Parse("{\"type\":\"object\"}"));
        cJSON_AddStringToObject(c, "output", text);
        cJSON_AddItemToArray(cases, c);
        free(text), free(out[i].ids), free(out[i].logprobs);
        fm_matcher_free(mt[i]);
    }
    free(mt), free(cons), free(params), free(out), free(prompts), free(lens);
}

/* The independent validator over every case. */
static void validate(cJSON *cases, const char *name) {
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/%s.json", cli_tmp, name);
    char *t = cJSON_PrintUnformatted(cases);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(t, f);
    fclose(f);
    free(t);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/check_json_schema.py %s", path);
    const int rc = system(cmd);
    if (rc != 0) fail_msg("%s: tools/check_json_schema.py found invalid outputs (or is missing its module)", name);
}

static void random_schemas_from_a_random_model(void **state) {
    (void)state;
    enum { N = 24, BATCH = 6 };
    fm_model *m = load(RANDOM_MODEL, 4, 2048);
    assert_int_equal(fm_model_vocab_size(m), V320);
    fm_token_vocab *v = vocab320();
    cJSON *cases = cJSON_CreateArray();
    for (int32_t b = 0; b < N; b += BATCH) {
        fm_grammar *g[BATCH];
        cJSON *schemas[BATCH];
        for (int32_t i = 0; i < BATCH; i++) {
            schemas[i] = random_schema(0);
            fm_error err;
            if (fm_grammar_from_json_schema(schemas[i], &g[i], &err)) fail_msg("compile: %s", err.msg);
        }
        sample_all(m, v, g, schemas, BATCH, END320, 1800, 1000 + (uint64_t)b, false, cases);
        for (int32_t i = 0; i < BATCH; i++) fm_grammar_free(g[i]), cJSON_Delete(schemas[i]);
    }
    validate(cases, "random_model");
    cJSON_Delete(cases);
    fm_token_vocab_free(v);
    fm_model_free(m);
}

static void real_vocabulary_json_object_and_schema(void **state) {
    (void)state;
    fm_model *m = load("models/tiny-code-moe", 2, 1024);
    fm_tokenizer *t;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("models/tiny-code-moe", &t, &err), FM_OK);
    fm_token_vocab *v;
    assert_int_equal(fm_token_vocab_from_tokenizer(t, fm_model_vocab_size(m), &v, &err), FM_OK);
    int32_t end = fm_tokenizer_token_id(t, "<|endoftext|>");
    if (end < 0) end = fm_model_vocab_size(m) - 1;
    cJSON *schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                                "\"line\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":999},\"kind\":{\"enum\":["
                                "\"def\",\"class\"]}},\"required\":[\"name\",\"line\",\"kind\"],"
                                "\"additionalProperties\":false}");
    fm_grammar *g[4];
    cJSON *schemas[4] = {schema, schema, NULL, NULL};
    assert_int_equal(fm_grammar_from_json_schema(schema, &g[0], &err), FM_OK);
    assert_int_equal(fm_grammar_from_json_schema(schema, &g[1], &err), FM_OK);
    assert_int_equal(fm_grammar_json_object(&g[2], &err), FM_OK);
    assert_int_equal(fm_grammar_json_object(&g[3], &err), FM_OK);
    cJSON *cases = cJSON_CreateArray();
    sample_all(m, v, g, schemas, 2, end, 200, 7, false, cases);
    sample_all(m, v, g + 2, schemas + 2, 2, end, 120, 11, true, cases);
    validate(cases, "tiny_code_moe");
    for (int i = 0; i < 4; i++) fm_grammar_free(g[i]);
    cJSON_Delete(cases), cJSON_Delete(schema);
    fm_token_vocab_free(v);
    fm_tokenizer_free(t);
    fm_model_free(m);
}

static void greedy(fm_model *m, const fm_logit_bias *bias, int32_t n_bias, int32_t *ids, int64_t *n, fm_status *st,
                   fm_error *err) {
    static const int32_t prompt[4] = {3, 9, 27, 81};
    const int32_t *prompts[1] = {prompt};
    const int64_t lens[1] = {4};
    fm_gen_params p;
    fm_gen_params_init(&p);
    p.max_tokens = 6, p.ignore_eos = true, p.logit_bias = bias, p.n_logit_bias = n_bias;
    fm_gen_output out;
    *st = fm_context_generate(m->context, prompts, lens, &p, 1, 0, NULL, NULL, &out, NULL, err);
    if (*st) return;
    *n = out.n;
    memcpy(ids, out.ids, (size_t)out.n * sizeof *ids);
    free(out.ids), free(out.logprobs);
}

static void logit_bias_bans_and_forces(void **state) {
    (void)state;
    fm_model *m = load(RANDOM_MODEL, 2, 256);
    int32_t base[8], ids[8];
    int64_t n;
    fm_status st;
    fm_error err;
    greedy(m, NULL, 0, base, &n, &st, &err);
    assert_int_equal(st, FM_OK);
    assert_int_equal(n, 6);
    const fm_logit_bias ban = {base[0], -100.0f};
    greedy(m, &ban, 1, ids, &n, &st, &err);
    assert_int_equal(st, FM_OK);
    for (int64_t i = 0; i < n; i++) assert_int_not_equal(ids[i], base[0]);
    const fm_logit_bias force[2] = {{77, 100.0f}, {base[0], -3.5f}};
    greedy(m, force, 2, ids, &n, &st, &err);
    assert_int_equal(st, FM_OK);
    for (int64_t i = 0; i < n; i++) assert_int_equal(ids[i], 77);
    const struct {
        fm_logit_bias b[2];
        int32_t n;
        const char *msg;
    } bad[] = {
        {{{V320, 1.0f}}, 1, "outside the vocabulary"},
        {{{5, 100.5f}}, 1, "[-100, 100]"},
        {{{5, 1.0f}, {5, 2.0f}}, 2, "given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        greedy(m, bad[i].b, bad[i].n, ids, &n, &st, &err);
        assert_int_equal(st, FM_ERR_USAGE);
        if (!strstr(err.msg, bad[i].msg)) fail_msg("message '%s' lacks '%s'", err.msg, bad[i].msg);
    }
    fm_model_free(m);
}

static void reference_sampler_mask(void **state) {
    (void)state;
    enum { V = 40 };
    float l[V], scratch[2 * V];
    for (int i = 0; i < V; i++) l[i] = 8.0f + (float)(i % 3); /* the masked-out ids are the likely ones */
    l[3] = 0.5f, l[8] = 0.9f, l[33] = -0.5f;
    uint32_t mask[2] = {0, 0};
    const int allowed[] = {3, 8, 33};
    for (int i = 0; i < 3; i++) mask[allowed[i] >> 5] |= 1u << (allowed[i] & 31);
    fm_sampling s;
    fm_sampling_init(&s);
    s.masked = 1;
    int best = allowed[0];
    for (int i = 1; i < 3; i++)
        if (l[allowed[i]] > l[best]) best = allowed[i];
    assert_int_equal(fm_sample_row(l, V, &s, NULL, NULL, NULL, mask, 0, scratch, NULL), best);
    s.temperature = 1.0f, s.seed = 5;
    int hits[3] = {0};
    for (uint64_t step = 0; step < 300; step++) {
        const int32_t id = fm_sample_row(l, V, &s, NULL, NULL, NULL, mask, step, scratch, NULL);
        int k = 0;
        while (k < 3 && allowed[k] != id) k++;
        assert_true(k < 3);
        hits[k]++;
    }
    assert_true(hits[0] > 0 && hits[1] > 0 && hits[2] > 0);
    /* a bias in the reference: +100 on an allowed id wins greedy; on a masked-out id it changes nothing */
    s.temperature = 0.0f, s.n_bias = 2;
    const fm_logit_bias b[2] = {{0, 100.0f}, {33, 50.0f}};
    assert_int_equal(fm_sample_row(l, V, &s, NULL, NULL, b, mask, 0, scratch, NULL), 33);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reference_sampler_mask),
        cmocka_unit_test(logit_bias_bans_and_forces),
        cmocka_unit_test(random_schemas_from_a_random_model),
        cmocka_unit_test(real_vocabulary_json_object_and_schema),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
