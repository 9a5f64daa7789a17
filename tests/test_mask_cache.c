/* The masks shared between matchers (src/text/mask_cache.h) against masks computed afresh:
 *   - random walks through json_object mode and two schemas (bounded integers and numbers, a maxLength string, an
 *     enum array, extra keys that must not equal a declared one; a recursive $ref through anyOf) over
 *     models/tiny-code-moe's real vocabulary, 12 walks interleaved so that they share one small cache (16 entries:
 *     entries replaced), their fills run in parallel threads: at every step the mask equals that of a twin matcher
 *     over a vocabulary without a cache, bit for bit, and the cache did hit;
 *   - prefixes whose parse states differ only in a bounded string's count, an excluded key's content, a bounded
 *     number's digits, the whitespace so far or the nesting: each mask equals the fresh one;
 *   - two json_object grammars built apart share entries (equal fingerprints); a schema's grammar does not take
 *     json_object's masks (the fingerprints differ);
 *   - capacities out of range are refused by name. */
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
#include "text/mask_cache.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"

#define WALKS 12
#define STEPS 160

static const char *const SCHEMAS[] = {
    NULL, /* json_object */
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":300},\"name\":{"
    "\"type\":\"string\",\"maxLength\":6},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\"]},"
    "\"maxItems\":3},\"x\":{\"type\":\"number\",\"minimum\":0.5,\"maximum\":9.25}},\"required\":[\"id\"]}",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{"
    "\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},"
    "\"$ref\":\"#/$defs/n\"}",
};

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)((rs >> 11) % n);
}

static fm_grammar *grammar(int k) {
    fm_grammar *g;
    fm_error err;
    if (!SCHEMAS[k]) {
        assert_int_equal(fm_grammar_json_object(&g, &err), FM_OK);
        return g;
    }
    cJSON *s = cJSON_Parse(SCHEMAS[k]);
    assert_non_null(s);
    if (fm_grammar_from_json_schema(s, &g, &err)) fail_msg("schema %d: %s", k, err.msg);
    cJSON_Delete(s);
    return g;
}

static bool structural(const fm_token_vocab *v, int32_t id) {
    uint32_t len;
    const uint8_t *b = fm_token_vocab_bytes(v, id, &len);
    for (uint32_t i = 0; i < len; i++)
        if (strchr("\"{}[],:0123456789-.", b[i]) && b[i]) return true;
    return false;
}

/* An allowed id: half the time one with a JSON structural byte, so that walks leave their strings and end. */
static int32_t pick(const fm_token_vocab *v, const uint32_t *words, int32_t n_ids) {
    int32_t n = 0, n_struct = 0;
    for (int32_t i = 0; i < n_ids; i++)
        if ((words[i >> 5] >> (i & 31)) & 1u) n++, n_struct += structural(v, i);
    assert_true(n > 0);
    const bool want_struct = n_struct > 0 && rnd(2);
    int32_t k = (int32_t)rnd((uint32_t)(want_struct ? n_struct : n));
    for (int32_t i = 0; i < n_ids; i++)
        if ((words[i >> 5] >> (i & 31)) & 1u && (!want_struct || structural(v, i)) && k-- == 0) return i;
    fail_msg("no id picked");
    return -1;
}

static void shared_masks_equal_fresh_ones(void **state) {
    (void)state;
    fm_tokenizer *t;
    fm_token_vocab *cached, *fresh;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("models/tiny-code-moe", &t, &err), FM_OK);
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &cached, &err), FM_OK);
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &fresh, &err), FM_OK);
    assert_int_equal(fm_token_vocab_set_mask_cache(cached, 16, &err), FM_OK);
    assert_int_equal(fm_token_vocab_set_mask_cache(fresh, 0, &err), FM_OK);
    const int32_t V = fm_token_vocab_size(cached), W = (V + 31) / 32, end = V - 1;
    fm_grammar *g[WALKS];
    fm_matcher *a[WALKS], *b[WALKS];
    for (int w = 0; w < WALKS; w++) {
        g[w] = grammar(w % 3);
        assert_int_equal(fm_matcher_create(g[w], cached, &end, 1, &a[w], &err), FM_OK);
        assert_int_equal(fm_matcher_create(g[w], fresh, &end, 1, &b[w], &err), FM_OK);
    }
    uint32_t *ma = malloc((size_t)WALKS * W * sizeof *ma), *mb = malloc((size_t)WALKS * W * sizeof *mb);
    int32_t ended = 0, steps = 0;
    for (int s = 0; s < STEPS; s++) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int w = 0; w < WALKS; w++) {
            fm_matcher_fill_mask(a[w], ma + (size_t)w * W);
            fm_matcher_fill_mask(b[w], mb + (size_t)w * W);
        }
        for (int w = 0; w < WALKS; w++) {
            if (memcmp(ma + (size_t)w * W, mb + (size_t)w * W, (size_t)W * sizeof *ma))
                fail_msg("walk %d (schema %d), step %d: the shared mask differs from the fresh one", w, w % 3, s);
            const int32_t id = pick(cached, ma + (size_t)w * W, V);
            assert_true(fm_matcher_accept(a[w], id));
            assert_true(fm_matcher_accept(b[w], id));
            steps++;
            if (fm_matcher_finished(a[w])) { /* the end id accepted: a new walk in its place */
                assert_true(fm_matcher_finished(b[w]));
                fm_matcher_free(a[w]), fm_matcher_free(b[w]);
                assert_int_equal(fm_matcher_create(g[w], cached, &end, 1, &a[w], &err), FM_OK);
                assert_int_equal(fm_matcher_create(g[w], fresh, &end, 1, &b[w], &err), FM_OK);
                ended++;
            }
        }
    }
    int64_t hits, misses, fresh_hits, fresh_misses;
    fm_token_vocab_mask_cache_stats(cached, &hits, &misses);
    fm_token_vocab_mask_cache_stats(fresh, &fresh_hits, &fresh_misses);
    printf("  %d steps of %d walks (%d objects ended): every shared mask equal to the fresh one; %lld hits, %lld "
           "misses\n",
           steps, WALKS, ended, (long long)hits, (long long)misses);
    assert_true(hits > 0 && misses > 16); /* entries were replaced */
    assert_true(ended > 0);
    assert_true(fresh_hits == 0 && fresh_misses == 0);
    for (int w = 0; w < WALKS; w++) fm_matcher_free(a[w]), fm_matcher_free(b[w]), fm_grammar_free(g[w]);
    free(ma), free(mb);
    fm_token_vocab_free(cached), fm_token_vocab_free(fresh);
    fm_tokenizer_free(t);
}

/* Parse states that differ only in what a key must keep apart: a bounded string's count, an excluded key's content,
 * a bounded number's digits, the whitespace so far, the nesting; each prefix's mask (the cache filled by the
 * prefixes before it) equals the fresh one. */
static void states_the_key_keeps_apart(void **state) {
    (void)state;
    static const struct {
        int schema;
        const char *prefix;
    } cases[] = {
        {1, "{\"id\": 2"},
        {1, "{\"id\": 3"},
        {1, "{\"id\": 30"},
        {1, "{\"id\": 29"},
        {1, "{\"id\": -"},
        {1, "{\"id\": 1, \"name\": \""},
        {1, "{\"id\": 1, \"name\": \"a"},
        {1, "{\"id\": 1, \"name\": \"ab"},
        {1, "{\"id\": 1, \"name\": \"abc"},
        {1, "{\"id\": 1, \"name\": \"abcde"},
        {1, "{\"id\": 1, \"name\": \"abcdef"},
        {1, "{\"id\": 1, \"ie"},
        {1, "{\"id\": 1, \"id"},
        {1, "{\"id\": 1, \"x\": 1.2"},
        {1, "{\"id\": 1, \"x\": 9.2"},
        {0, "{\"a\":"},
        {0, "{\"a\": "},
        {0, "{\"a\":           "},
        {0, "{\"a\": \"xy"},
        {0, "{\"a\": \"xyz"},
        {0, "{\"a\": 12"},
        {0, "{\"a\": 1.5e"},
        {0, "{\"a\": [[["},
        {0, "{\"a\": [["},
        {0, "{\"a\": [{\"b\": [1, {"},
        {0, "{\"a\": [{\"b\": [1, "},
        {0, "{\"a\": [1"},
        {0, "{\"a\": {\"b\": 1"},
        {0, "{\"a\": [[1"},
        {0, "{\"a\": [{\"c\": 1"},
        {0, "{\"a\": {\"b\": [1"},
        {2, "{\"v\": 1, \"next\": {\"v\": 2, \"next\": "},
        {2, "{\"v\": 1, \"next\": "},
    };
    fm_tokenizer *t;
    fm_token_vocab *cached, *fresh;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("models/tiny-code-moe", &t, &err), FM_OK);
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &cached, &err), FM_OK);
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &fresh, &err), FM_OK);
    assert_int_equal(fm_token_vocab_set_mask_cache(fresh, 0, &err), FM_OK);
    const int32_t V = fm_token_vocab_size(cached), W = (V + 31) / 32, end = V - 1;
    uint32_t *ma = malloc((size_t)W * sizeof *ma), *mb = malloc((size_t)W * sizeof *mb);
    fm_grammar *g[3] = {grammar(0), grammar(1), grammar(2)};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fm_matcher *a, *b;
        assert_int_equal(fm_matcher_create(g[cases[c].schema], cached, &end, 1, &a, &err), FM_OK);
        assert_int_equal(fm_matcher_create(g[cases[c].schema], fresh, &end, 1, &b, &err), FM_OK);
        const size_t n = strlen(cases[c].prefix);
        if (!fm_matcher_accept_bytes(a, cases[c].prefix, n) || !fm_matcher_accept_bytes(b, cases[c].prefix, n))
            fail_msg("the grammar refuses %s", cases[c].prefix);
        fm_matcher_fill_mask(a, ma), fm_matcher_fill_mask(b, mb);
        if (memcmp(ma, mb, (size_t)W * sizeof *ma)) fail_msg("after %s: the shared mask differs", cases[c].prefix);
        fm_matcher_free(a), fm_matcher_free(b);
    }
    int64_t hits, misses;
    fm_token_vocab_mask_cache_stats(cached, &hits, &misses);
    printf("  %zu prefixes: shared masks equal fresh ones (%lld hits: unbounded strings at any length)\n",
           sizeof cases / sizeof *cases, (long long)hits);
    assert_true(hits >= 1);
    for (int k = 0; k < 3; k++) fm_grammar_free(g[k]);
    free(ma), free(mb);
    fm_token_vocab_free(cached), fm_token_vocab_free(fresh);
    fm_tokenizer_free(t);
}

static void equal_grammars_share_and_others_do_not(void **state) {
    (void)state;
    fm_tokenizer *t;
    fm_token_vocab *v;
    fm_error err;
    assert_int_equal(fm_tokenizer_load("models/tiny-code-moe", &t, &err), FM_OK);
    assert_int_equal(fm_token_vocab_from_tokenizer(t, 0, &v, &err), FM_OK);
    const int32_t V = fm_token_vocab_size(v), end = V - 1;
    uint32_t *words = malloc((size_t)(V + 31) / 32 * sizeof *words);
    fm_grammar *g1 = grammar(0), *g2 = grammar(0), *g3 = grammar(1);
    int32_t f1[4], f2[4], f3[4];
    fm_grammar_fingerprint(g1, f1), fm_grammar_fingerprint(g2, f2), fm_grammar_fingerprint(g3, f3);
    assert_memory_equal(f1, f2, sizeof f1);
    assert_memory_not_equal(f1, f3, sizeof f1);
    fm_matcher *m1, *m2, *m3;
    assert_int_equal(fm_matcher_create(g1, v, &end, 1, &m1, &err), FM_OK);
    assert_int_equal(fm_matcher_create(g2, v, &end, 1, &m2, &err), FM_OK);
    assert_int_equal(fm_matcher_create(g3, v, &end, 1, &m3, &err), FM_OK);
    int64_t h0, m0, h, m;
    fm_matcher_fill_mask(m1, words);
    fm_token_vocab_mask_cache_stats(v, &h0, &m0);
    assert_true(h0 == 0 && m0 == 1);
    fm_matcher_fill_mask(m2, words); /* an equal grammar built apart: json_object's first mask, copied */
    fm_token_vocab_mask_cache_stats(v, &h, &m);
    assert_true(h == 1 && m == 1);
    fm_matcher_fill_mask(m3, words); /* the schema: its own first mask */
    fm_token_vocab_mask_cache_stats(v, &h, &m);
    assert_true(h == 1 && m == 2);
    fm_matcher_free(m1), fm_matcher_free(m2), fm_matcher_free(m3);
    fm_grammar_free(g1), fm_grammar_free(g2), fm_grammar_free(g3);
    assert_int_equal(fm_token_vocab_set_mask_cache(v, -1, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "mask cache"));
    assert_int_equal(fm_token_vocab_set_mask_cache(v, 1 << 20, &err), FM_ERR_USAGE);
    free(words);
    fm_token_vocab_free(v);
    fm_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_masks_equal_fresh_ones),
        cmocka_unit_test(states_the_key_keeps_apart),
        cmocka_unit_test(equal_grammars_share_and_others_do_not),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
