/* Grammars for constrained decoding (src/text/grammar.h, json_schema.c, token_matcher.h): JSON Schemas compiled and
 * matched against texts that are and are not valid (over a vocabulary of the 256 single bytes, so every text is
 * spelled byte by byte), refused keywords named in the error, the builder's literals/sequences/alternatives/
 * repetitions (a forced tool call), and the matcher over the real tiny-code-moe vocabulary: a valid JSON text's own
 * tokens are each allowed by the mask before they are accepted, tokens that span grammar boundaries included, and
 * masks agree with accept for every id. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"

#define END_ID 256

/* ids 0..255: the bytes; 256: the end id (no bytes) */
static fm_token_vocab *byte_vocab(void) {
    static uint8_t b[256];
    const uint8_t *p[257];
    uint32_t lens[257];
    for (int i = 0; i < 256; i++) b[i] = (uint8_t)i, p[i] = &b[i], lens[i] = 1;
    p[256] = NULL, lens[256] = 0;
    fm_token_vocab *v;
    fm_error err;
    assert_int_equal(fm_token_vocab_create(257, p, lens, NULL, &v, &err), FM_OK);
    return v;
}

static fm_grammar *compile(const char *schema_text) {
    cJSON *s = cJSON_Parse(schema_text);
    assert_non_null(s);
    fm_grammar *g;
    fm_error err;
    const fm_status st = fm_grammar_from_json_schema(s, &g, &err);
    if (st) fail_msg("schema %s: %s", schema_text, err.msg);
    cJSON_Delete(s);
    return g;
}

/* Whether the whole text matches g, byte by byte (and the masks agree with accept at every step). */
static bool matches(const fm_grammar *g, const fm_token_vocab *v, const char *text) {
    fm_matcher *m;
    fm_error err;
    const int32_t end = END_ID;
    assert_int_equal(fm_matcher_create(g, v, &end, 1, &m, &err), FM_OK);
    uint32_t words[9];
    bool ok = true;
    for (const char *p = text; *p && ok; p++) {
        fm_matcher_fill_mask(m, words);
        const uint8_t b = (uint8_t)*p;
        const bool allowed = (words[b >> 5] >> (b & 31)) & 1u;
        ok = fm_matcher_accept(m, b);
        assert_int_equal(allowed, ok);
    }
    if (ok) {
        fm_matcher_fill_mask(m, words);
        assert_int_equal((words[END_ID >> 5] >> (END_ID & 31)) & 1u, fm_matcher_done(m));
        ok = fm_matcher_accept(m, END_ID);
    }
    fm_matcher_free(m);
    return ok;
}

typedef struct schema_case {
    const char *schema;
    const char *good[8];
    const char *bad[10];
} schema_case;

static const schema_case k_cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
     "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
     {"{\"name\":\"Ann\",\"age\":31}", "{ \"name\" : \"A\\\"b\\u00e9\" , \"age\" : -4 }", "{\"name\":\"\",\"age\":0}",
      "{\"name\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\",\"age\":7}"},
     {"{\"age\":31,\"name\":\"Ann\"}", "{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":3.5}",
      "{\"name\":\"Ann\",\"age\":31,\"x\":1}", "{\"name\":\"A\nb\",\"age\":1}", "{\"name\":\"\\ud800\",\"age\":1}",
      "{\"name\":\"a\",\"age\":01}", "{\"name\":\"\xed\xa0\x80\",\"age\":1}",
      "{\"name\":\"a\",             \"age\":1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
     "\"c\":{\"type\":\"number\"}},\"required\":[\"b\"]}",
     {"{\"b\":null}", "{\"a\":true,\"b\":null}", "{\"b\":null,\"c\":-1.5e+3}", "{\"a\":false,\"b\":null,\"c\":0}",
      "{\"b\":null,\"zz\":[1,{\"q\":\"r\"}],\"y\":\"s\"}"},
     {"{}", "{\"a\":true}", "{\"b\":null,\"a\":true}", "{\"b\":null,\"c\":1.}", "{\"b\":null,\"b\":null}",
      "{\"b\":null,\"c\":+1}"}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"\"ab\"", "\"abc\"", "\"\\n\\u0041\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\""},
     {"\"a\"", "\"abcd\"", "\"\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""}},
    {"{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}",
     {"-5", "0", "119", "42", "-0"},
     {"-6", "120", "1000", "3.0", "1e2", "007"}},
    {"{\"type\":\"number\",\"minimum\":0.5,\"maximum\":2.25}",
     {"0.5", "2.25", "1", "2.2", "0.75"},
     {"0.4", "2.26", "3", "-1", "0", "1e0"}},
    {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yz\",3,null]},\"minItems\":1,\"maxItems\":3}",
     {"[\"x\"]", "[3, null, \"yz\"]", "[ \"x\" ]"},
     {"[]", "[\"x\",\"x\",\"x\",\"x\"]", "[\"y\"]", "[4]", "[\"x\",]"}},
    {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\",\"maximum\":9}]}",
     {"\"a\"", "9", "-3"},
     {"\"ab\"", "10", "true"}},
    {"{\"type\":[\"string\",\"null\"]}", {"null", "\"s\""}, {"1", "nul"}},
    {"{\"const\":{\"k\":[1,\"two\"]}}", {"{\"k\":[1,\"two\"]}"}, {"{\"k\":[1,\"tw\"]}", "{\"k\": [1,\"two\"]}"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":"
     "[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}"},
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"}},
    {"{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", {"{}", "{ }"}, {"{\"a\":1}"}},
    /* zod's int(): the safe-integer bounds, beyond every integer of at most 15 digits */
    {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
     {"42", "-7", "0", "999999999999999"},
     {"1.5", "1e3", "1000000000000000"}},
    {"{\"description\":\"anything\"}", {"1", "[]", "{\"a\":[true,null]}", "\"s\""}, {"", "tru", "[1,]"}},
};

static void schemas_accept_and_reject(void **state) {
    (void)state;
    fm_token_vocab *v = byte_vocab();
    for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
        fm_grammar *g = compile(k_cases[c].schema);
        for (int i = 0; i < 8 && k_cases[c].good[i]; i++)
            if (!matches(g, v, k_cases[c].good[i])) fail_msg("schema %zu should accept %s", c, k_cases[c].good[i]);
        for (int i = 0; i < 10 && k_cases[c].bad[i]; i++)
            if (matches(g, v, k_cases[c].bad[i])) fail_msg("schema %zu should refuse %s", c, k_cases[c].bad[i]);
        fm_grammar_free(g);
    }
    fm_token_vocab_free(v);
}

static void json_object_mode(void **state) {
    (void)state;
    fm_token_vocab *v = byte_vocab();
    fm_grammar *g;
    fm_error err;
    assert_int_equal(fm_grammar_json_object(&g, &err), FM_OK);
    assert_true(matches(g, v, "{\"a\":{\"b\":[1,2.5,\"c\",false]}}"));
    assert_true(matches(g, v, "{}"));
    assert_false(matches(g, v, "[1]"));
    assert_false(matches(g, v, "\"s\""));
    fm_grammar_free(g);
    fm_token_vocab_free(v);
}

static void refused_keywords_are_named(void **state) {
    (void)state;
    const char *const cases[][2] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'"},
        {"{\"type\":\"string\",\"format\":\"date\"}", "'format'"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"oneOf\":[{}]}}}", "#/properties/x: 'oneOf'"},
        {"{\"allOf\":[{}]}", "'allOf'"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "'multipleOf'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "names nothing"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer"},
        {"{\"type\":\"integer\",\"minimum\":1e16}", "1e15"},
        {"{\"type\":\"number\",\"maximum\":1e16}", "1e15"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "required 'a'"},
        {"{\"type\":\"array\",\"items\":[{}]}", "tuple"},
        {"{\"type\":\"strin\"}", "type 'strin'"},
        {"false", "no value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *s = cJSON_Parse(cases[i][0]);
        assert_non_null(s);
        fm_grammar *g;
        fm_error err = {{0}};
        assert_int_equal(fm_grammar_from_json_schema(s, &g, &err), FM_ERR_USAGE);
        assert_null(g);
        if (!strstr(err.msg, cases[i][1])) fail_msg("%s: message '%s' lacks '%s'", cases[i][0], err.msg, cases[i][1]);
        cJSON_Delete(s);
    }
}

static void builder_tool_calls(void **state) {
    (void)state;
    fm_token_vocab *v = byte_vocab();
    cJSON *params = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                                "\"required\":[\"city\"],\"additionalProperties\":false}");
    fm_grammar *g = fm_grammar_new();
    const int32_t parts[] = {fm_grammar_literal(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
                             fm_grammar_json_schema(g, params), fm_grammar_literal(g, "}\n</tool_call>")};
    const int32_t call = fm_grammar_seq(g, parts, 3);
    const int32_t other[] = {fm_grammar_literal(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"),
                             call};
    fm_error err;
    assert_int_equal(fm_grammar_finish(
                         g, fm_grammar_repeat(g, fm_grammar_alt(g, other, 2), fm_grammar_literal(g, "\n"), 1, 2), &err),
                     FM_OK);
    const char *one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", one);
    char three[1024];
    snprintf(three, sizeof three, "%s\n%s", two, one);
    assert_true(matches(g, v, one));
    assert_true(matches(g, v, two));
    assert_false(matches(g, v, three));
    assert_false(matches(g, v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    assert_false(matches(g, v, ""));
    fm_grammar_free(g);
    cJSON_Delete(params);
    /* an error inside a chain is reported by finish */
    g = fm_grammar_new();
    cJSON *bad = cJSON_Parse("{\"type\":\"string\",\"pattern\":\"x\"}");
    const int32_t p2[] = {fm_grammar_literal(g, "a"), fm_grammar_json_schema(g, bad)};
    assert_int_equal(fm_grammar_finish(g, fm_grammar_seq(g, p2, 2), &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "'pattern'"));
    fm_grammar_free(g);
    cJSON_Delete(bad);
    fm_token_vocab_free(v);
}

static bool bit(const uint32_t *w, int32_t i) { return (w[i >> 5] >> (i & 31)) & 1u; }

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)((rs >> 11) % n);
}

/* Every node of a JSON tree below the root, preorder, with its parent. */
static int collect(cJSON *j, cJSON **nodes, cJSON **parents, int n, int cap) {
    for (cJSON *c = j->child; c; c = c->next) {
        if (n < cap) nodes[n] = c, parents[n] = j, n++;
        n = collect(c, nodes, parents, n, cap);
    }
    return n;
}

/* Mutated schemas (a random node's value replaced by a value of another kind) compile or fail with a message, and
 * random walks through the masks of those that compile only take bytes that accept takes, ending when allowed. */
static void mutated_schemas_never_crash(void **state) {
    (void)state;
    fm_token_vocab *v = byte_vocab();
    static const char *const values[] = {"-1",
                                         "1e300",
                                         "0",
                                         "2.5",
                                         "\"x\"",
                                         "[]",
                                         "[1,\"a\"]",
                                         "{}",
                                         "true",
                                         "null",
                                         "{\"type\":\"string\"}",
                                         "\"#\"",
                                         "\"#/$defs/node\"",
                                         "4097"};
    uint32_t words[9];
    int compiled = 0, refused = 0;
    for (int it = 0; it < 600; it++) {
        cJSON *s = cJSON_Parse(k_cases[rnd(sizeof k_cases / sizeof *k_cases)].schema);
        cJSON *nodes[256], *parents[256];
        const int n = collect(s, nodes, parents, 0, 256);
        const int k = (int)rnd((uint32_t)n); /* one node's value replaced */
        cJSON *repl = cJSON_Parse(values[rnd(sizeof values / sizeof *values)]);
        if (cJSON_IsObject(parents[k])) cJSON_ReplaceItemInObjectCaseSensitive(parents[k], nodes[k]->string, repl);
        else cJSON_ReplaceItemViaPointer(parents[k], nodes[k], repl);
        fm_grammar *g = NULL;
        fm_error err = {{0}};
        const fm_status st = fm_grammar_from_json_schema(s, &g, &err);
        fm_matcher *m = NULL;
        const int32_t end = END_ID;
        /* a grammar that compiles may still match nothing ("$ref": "#" around a required self): the matcher says so */
        const fm_status mst = st ? st : fm_matcher_create(g, v, &end, 1, &m, &err);
        if (mst) {
            assert_int_equal(mst, FM_ERR_USAGE);
            assert_true(strlen(err.msg) > 0);
            fm_grammar_free(g); /* NULL when the schema was refused */
            refused++;
        } else {
            compiled++;
            for (int step = 0; step < 200; step++) {
                fm_matcher_fill_mask(m, words);
                int32_t allowed[257], na = 0;
                for (int32_t id = 0; id < 257; id++)
                    if (bit(words, id)) allowed[na++] = id;
                if (!na) break;
                const int32_t id = allowed[rnd((uint32_t)na)];
                assert_true(fm_matcher_accept(m, id));
                if (id == END_ID) break;
            }
            fm_matcher_free(m);
            fm_grammar_free(g);
        }
        cJSON_Delete(s);
    }
    assert_true(compiled > 0 && refused > 0);
    fm_token_vocab_free(v);
}

/* The tiny model's real byte-level BPE vocabulary: a valid text's own tokens pass, and the mask equals accept. */
static void tiny_vocabulary(void **state) {
    (void)state;
    fm_tokenizer *t;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("models/tiny-code-moe", &t, &err), FM_OK);
    const int32_t V = fm_tokenizer_vocab_size(t);
    fm_token_vocab *v;
    assert_int_equal(fm_token_vocab_from_tokenizer(t, V + 7, &v, &err), FM_OK); /* a padded model vocabulary */
    assert_int_equal(fm_token_vocab_size(v), V + 7);
    fm_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\"},\"n\":{\"type\":"
                            "\"array\",\"items\":{\"type\":\"integer\"}}},\"required\":[\"code\",\"n\"],"
                            "\"additionalProperties\":false}");
    const char *text = "{\"code\": \"def f(x):\\n    return x + 1 # \xc3\xa9t\xc3\xa9\", \"n\": [10, 200, 3]}";
    int32_t *ids;
    int64_t n;
    assert_int_equal(fm_tokenizer_encode(t, text, strlen(text), false, false, &ids, &n, &err), FM_OK);
    int32_t end = fm_tokenizer_token_id(t, "<|endoftext|>");
    if (end < 0) end = V; /* a padding id works as well */
    fm_matcher *m;
    assert_int_equal(fm_matcher_create(g, v, &end, 1, &m, &err), FM_OK);
    uint32_t *words = calloc((size_t)(V + 7 + 31) / 32, sizeof *words);
    int spanning = 0;
    for (int64_t i = 0; i < n; i++) {
        fm_matcher_fill_mask(m, words);
        assert_true(bit(words, ids[i]));
        assert_false(bit(words, end));
        for (int32_t p = V; p < V + 7; p++) assert_false(bit(words, p));
        if (i % 5 == 0) /* the mask is exactly the set of ids accept takes (on a copy of the state: a fresh replay) */
            for (int32_t id = 0; id < V; id += 7) {
                fm_matcher *c;
                assert_int_equal(fm_matcher_create(g, v, &end, 1, &c, &err), FM_OK);
                for (int64_t j = 0; j < i; j++) assert_true(fm_matcher_accept(c, ids[j]));
                assert_int_equal(fm_matcher_accept(c, id), bit(words, id));
                fm_matcher_free(c);
            }
        uint32_t len;
        const uint8_t *b = fm_token_vocab_bytes(v, ids[i], &len);
        spanning += len > 1 && (memchr(b, '"', len) || memchr(b, ',', len)) && len > 1;
        assert_true(fm_matcher_accept(m, ids[i]));
    }
    assert_true(spanning > 0);
    assert_true(fm_matcher_done(m));
    fm_matcher_fill_mask(m, words);
    assert_true(bit(words, end));
    for (int32_t id = 0; id < V; id++)
        if (id != end) assert_false(bit(words, id)); /* the object is closed: only the end */
    assert_true(fm_matcher_accept(m, end));
    free(words), free(ids);
    fm_matcher_free(m);
    fm_grammar_free(g);
    fm_token_vocab_free(v);
    fm_tokenizer_free(t);
}

/* A Llama/Mistral-style tokenizer (Metaspace, byte fallback): '▁' is a space, <0xNN> its byte, specials never. */
static void metaspace_vocabulary(void **state) {
    (void)state;
    fm_tokenizer *t;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("tests/tokenizers/llama-spm", &t, &err), FM_OK);
    fm_token_vocab *v;
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &v, &err), FM_OK);
    uint32_t len;
    const int32_t star = fm_tokenizer_token_id(t, "\xe2\x96\x81*"), byte_a = fm_tokenizer_token_id(t, "<0x41>");
    assert_true(star >= 0 && byte_a >= 0);
    const uint8_t *b = fm_token_vocab_bytes(v, star, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(b, " *", 2);
    b = fm_token_vocab_bytes(v, byte_a, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 'A');
    fm_grammar *g = compile("{\"enum\":[\" *A\"]}");
    const int32_t end = fm_tokenizer_token_id(t, "</s>");
    fm_matcher *m;
    assert_int_equal(fm_matcher_create(g, v, &end, 1, &m, &err), FM_OK);
    assert_true(fm_matcher_accept_bytes(m, "\"", 1));
    assert_true(fm_matcher_accept(m, star));
    assert_true(fm_matcher_accept(m, byte_a));
    assert_false(fm_matcher_accept(m, fm_tokenizer_token_id(t, "<s>"))); /* special */
    assert_false(fm_matcher_accept(m, end));                             /* not complete yet */
    assert_true(fm_matcher_accept_bytes(m, "\"", 1));
    assert_true(fm_matcher_accept(m, end));
    fm_matcher_free(m);
    fm_grammar_free(g);
    fm_token_vocab_free(v);
    fm_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(schemas_accept_and_reject),
        cmocka_unit_test(json_object_mode),
        cmocka_unit_test(refused_keywords_are_named),
        cmocka_unit_test(builder_tool_calls),
        cmocka_unit_test(tiny_vocabulary),
        cmocka_unit_test(mutated_schemas_never_crash),
        cmocka_unit_test(metaspace_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
