/* The tokenizer (src/text/): golden ids and strings from Hugging Face `tokenizers` (tests/tokenizers/NAME/golden.json,
 * made by tools/make_golden_tokenizer.py), hand-worked encodings of models/tiny-code-moe/tokenizer.json and of small
 * Llama/Mistral-style tokenizer.json files written here, round trips, the streaming detokenizer (its pieces are whole
 * UTF-8 characters and concatenate to the full decode), refused components and hostile files, and the CLI. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>

#include "cli_runner.h"
#include "text/tokenizer.h"

#define TINY "models/tiny-code-moe"

/* ---- helpers ---- */
static void write_text(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(s, 1, n, f), n);
    fclose(f);
}

/* A directory under cli_tmp holding tokenizer.json = json; returns its path (static buffer). */
static const char *tok_dir(const char *name, const char *json) {
    static char dir[512];
    char path[600];
    snprintf(dir, sizeof dir, "%s/%s", cli_tmp, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text(path, json, strlen(json));
    return dir;
}

static fm_tokenizer *load_ok(const char *dir) {
    fm_tokenizer *t = NULL;
    fm_error err = {{0}};
    fm_status st = fm_tokenizer_load(dir, &t, &err);
    if (st) fail_msg("loading %s: %s", dir, err.msg);
    return t;
}

static void expect_ids(const fm_tokenizer *t, const char *text, size_t len, bool add, bool parse, const int32_t *want,
                       int64_t n_want) {
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    if (fm_tokenizer_encode(t, text, len, add, parse, &ids, &n, &err)) fail_msg("encode: %s", err.msg);
    bool same = n == n_want;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        char got[4096] = "", exp[4096] = "";
        for (int64_t i = 0; i < n && strlen(got) < 4000; i++) snprintf(got + strlen(got), 16, " %d", ids[i]);
        for (int64_t i = 0; i < n_want && strlen(exp) < 4000; i++) snprintf(exp + strlen(exp), 16, " %d", want[i]);
        fail_msg("encode('%.*s', add_special=%d, parse_special=%d):\n  got %s\n want %s", (int)(len < 200 ? len : 200),
                 text, add, parse, got, exp);
    }
    free(ids);
}
#define EXPECT_IDS(t, text, add, parse, ...)                                                                           \
    do {                                                                                                               \
        static const int32_t want_[] = {__VA_ARGS__};                                                                  \
        expect_ids(t, text, strlen(text), add, parse, want_, (int64_t)(sizeof want_ / sizeof *want_));                 \
    } while (0)

static char *decode_ok(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip, size_t *len) {
    char *text = NULL;
    fm_error err = {{0}};
    if (fm_tokenizer_decode(t, ids, n, skip, &text, len, &err)) fail_msg("decode: %s", err.msg);
    assert_int_equal(strlen(text), *len); /* NUL-terminated at len (no NUL inside in these tests) */
    return text;
}

/* Valid UTF-8 (the streaming pieces must never hold half a character). */
static bool valid_utf8(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int len = *u < 0x80 ? 1 : (*u & 0xE0) == 0xC0 ? 2 : (*u & 0xF0) == 0xE0 ? 3 : (*u & 0xF8) == 0xF0 ? 4 : 0;
        if (!len) return false;
        for (int k = 1; k < len; k++)
            if ((u[k] & 0xC0) != 0x80) return false;
        u += len;
    }
    return true;
}

/* Streams ids through fm_detok one at a time: every piece valid UTF-8, their concatenation equal to want. */
static void expect_stream(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip, const char *want,
                          size_t want_len, const char *what) {
    fm_detok *d = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_detok_create(t, skip, &d, &err), FM_OK);
    size_t cap = want_len + 64, len = 0;
    char *all = malloc(cap);
    for (int64_t i = 0; i <= n; i++) {
        const char *piece = i < n ? fm_detok_push(d, ids[i]) : fm_detok_flush(d);
        assert_non_null(piece);
        if (!valid_utf8(piece)) fail_msg("%s: the piece after id %lld is not whole UTF-8", what, (long long)i);
        const size_t k = strlen(piece);
        if (len + k + 1 > cap) all = realloc(all, cap = 2 * (len + k + 1));
        memcpy(all + len, piece, k);
        len += k;
    }
    all[len] = '\0';
    if (len != want_len || memcmp(all, want, len) != 0)
        fail_msg("%s: streamed text differs from the full decode:\n  got  '%.300s'\n want '%.300s'", what, all, want);
    free(all);
    fm_detok_free(d);
}

/* ---- models/tiny-code-moe: byte-level BPE with the GPT-2 regex ---- */

/* Worked from its vocab and merges: the GPT-2 regex splits "def hello_world(self):" into "def", " hello", "_",
 * "world", "(", "self", "):"; merges by rank give def | Ġhe l lo | _ | w orld | ( | self | ): (ids from the vocab).
 * "    " is one word of four Ġ: merges rank 0 (Ġ Ġ) twice, then rank 1 (ĠĠ ĠĠ) -> ĠĠĠĠ = 258.
 * "x = 1" -> "x", " =", " 1" -> x = 88, Ġ= = 273, Ġ1 = 348. <|endoftext|> is the added special token 0. */
static void tiny_hand_worked(void **state) {
    (void)state;
    fm_tokenizer *t = load_ok(TINY);
    assert_int_equal(fm_tokenizer_vocab_size(t), 4096);
    EXPECT_IDS(t, "def hello_world(self):", true, true, 325, 1386, 76, 307, 63, 87, 3688, 8, 289, 320);
    EXPECT_IDS(t, "    ", true, true, 258);
    EXPECT_IDS(t, "x = 1", true, true, 88, 273, 348);
    EXPECT_IDS(t, "x<|endoftext|>x", true, true, 88, 0, 88);
    assert_int_equal(fm_tokenizer_token_id(t, "<|endoftext|>"), 0);
    assert_int_equal(fm_tokenizer_token_id(t, "self"), 289);
    assert_int_equal(fm_tokenizer_token_id(t, "no such token"), -1);
    assert_true(fm_tokenizer_is_special(t, 0));
    assert_false(fm_tokenizer_is_special(t, 289));
    /* parse_special false: the marker is text (<, |, endoftext, |, >: never id 0) */
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_tokenizer_encode(t, "<|endoftext|>", 13, true, false, &ids, &n, &err), FM_OK);
    assert_true(n > 1);
    for (int64_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 0);
    size_t len = 0;
    char *back = decode_ok(t, ids, n, false, &len);
    assert_string_equal(back, "<|endoftext|>");
    free(back), free(ids);
    /* decode: skip_special drops <|endoftext|>; an id outside the vocabulary is an error naming it */
    const int32_t seq[] = {88, 0, 88};
    back = decode_ok(t, seq, 3, false, &len);
    assert_string_equal(back, "x<|endoftext|>x");
    free(back);
    back = decode_ok(t, seq, 3, true, &len);
    assert_string_equal(back, "xx");
    free(back);
    const int32_t bad_ids[] = {88, 4096};
    char *text = NULL;
    assert_int_equal(fm_tokenizer_decode(t, bad_ids, 2, false, &text, &len, &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "4096"));
    fm_tokenizer_free(t);
}

/* The bundled eval ids (131,072 tokens of Python files) decode to text that encodes back to the same ids: the
 * tokenizer the model was trained with, end to end. The streamed decode of the first 4,096 equals their decode. */
static void tiny_eval_round_trip(void **state) {
    (void)state;
    fm_tokenizer *t = load_ok(TINY);
    FILE *f = fopen(TINY "/eval_ids.i32", "rb");
    assert_non_null(f);
    int32_t *ids = malloc(131072 * sizeof *ids);
    const int64_t n = (int64_t)fread(ids, sizeof *ids, 131072, f);
    fclose(f);
    assert_int_equal(n, 131072);
    size_t len = 0;
    char *text = decode_ok(t, ids, n, false, &len);
    expect_ids(t, text, len, true, true, ids, n);
    free(text);
    text = decode_ok(t, ids, 4096, false, &len);
    expect_stream(t, ids, 4096, false, text, len, "eval ids");
    free(text);
    free(ids);
    fm_tokenizer_free(t);
}

/* ByteLevel is lossless: decode(encode(s)) == s for any valid UTF-8, and invalid bytes come back as U+FFFD (one
 * per maximal ill-formed subpart, as Python's errors="replace"). Every case also streams to the same text. */
static void tiny_round_trips(void **state) {
    (void)state;
    fm_tokenizer *t = load_ok(TINY);
    static const char *texts[] = {
        "",
        "Hello world",
        "def f(x):\n\treturn x  \n\n\n    # comment\r\n",
        "   leading and trailing   ",
        "中文分词器把文本切成词元。日本語のテキスト。한국어",
        "emoji 🎉 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🇫🇷",
        "cafe\xcc\x81 (NFD) café (NFC)",
        "digits 0123456789 3.14159 1e-5",
        "a\x01\x02\x7f control \xc2\xa0 nbsp",
        "<|endoftext|>x<|endoftext|>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        fm_error err = {{0}};
        assert_int_equal(fm_tokenizer_encode(t, texts[i], strlen(texts[i]), true, true, &ids, &n, &err), FM_OK);
        size_t len = 0;
        char *back = decode_ok(t, ids, n, false, &len);
        assert_string_equal(back, texts[i]);
        expect_stream(t, ids, n, false, back, len, texts[i]);
        free(back), free(ids);
    }
    /* invalid UTF-8: a lone continuation byte, a truncated 3-byte sequence, a surrogate, 0xFF */
    static const struct {
        const char *in, *out;
    } bad[] = {{"ab\x80"
                "cd",
                "ab\xEF\xBF\xBD"
                "cd"},
               {"x\xe4\xb8 y", "x\xEF\xBF\xBD y"},
               {"\xed\xa0\x80!", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!"},
               {"\xff", "\xEF\xBF\xBD"},
               {"\xf0\x9f\x98", "\xEF\xBF\xBD"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        fm_error err = {{0}};
        assert_int_equal(fm_tokenizer_encode(t, bad[i].in, strlen(bad[i].in), true, true, &ids, &n, &err), FM_OK);
        size_t len = 0;
        char *back = decode_ok(t, ids, n, false, &len);
        assert_string_equal(back, bad[i].out);
        free(back), free(ids);
    }
    /* a NUL byte is text like any other */
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_tokenizer_encode(t, "a\0b", 3, true, true, &ids, &n, &err), FM_OK);
    size_t len = 0;
    char *back = NULL;
    assert_int_equal(fm_tokenizer_decode(t, ids, n, false, &back, &len, &err), FM_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(back, "a\0b", 3);
    free(back), free(ids);
    fm_tokenizer_free(t);
}

/* text with its first `from` replaced by `to` (malloc'd). */
static char *replace_first(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    assert_non_null(at);
    const size_t cap = strlen(text) + strlen(to) + 1;
    char *out = malloc(cap);
    snprintf(out, cap, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

/* models/tiny-code-moe/tokenizer.json with its first `from` replaced by `to` (malloc'd). */
static char *tiny_variant(const char *from, const char *to) {
    FILE *f = fopen(TINY "/tokenizer.json", "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(len + 1);
    assert_int_equal(fread(text, 1, len, f), len);
    fclose(f);
    text[len] = '\0';
    char *out = replace_first(text, from, to);
    free(text);
    return out;
}

/* Added tokens matched in the normalized text (normalized: true): "café" written with a combining accent is found
 * after NFC; a special one is text when parse_special is false, a plain one is matched either way. */
static void normalized_added_tokens(void **state) {
    (void)state;
    char *json =
        tiny_variant("\"special\": true\n    }\n  ],",
                     "\"special\": true\n    }, {\"id\": 4096, \"content\": \"caf\xc3\xa9\", \"single_word\": false, "
                     "\"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false}, {\"id\": "
                     "4097, \"content\": \"<x>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                     "\"normalized\": true, \"special\": true}],");
    char *json2 = replace_first(json, "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}");
    fm_tokenizer *t = load_ok(tok_dir("normalized-added", json2));
    free(json), free(json2);
    assert_int_equal(fm_tokenizer_vocab_size(t), 4098);
    EXPECT_IDS(t, "x cafe\xcc\x81<x>", false, true, 88, 221, 4096, 4097); /* x, Ġ, café, <x> */
    EXPECT_IDS(t, "cafe\xcc\x81", false, false, 4096);
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_tokenizer_encode(t, "<x>", 3, false, false, &ids, &n, &err), FM_OK);
    assert_true(n > 1);
    for (int64_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 4097);
    free(ids);
    fm_tokenizer_free(t);
}

/* NFC (computed by chunks between ASCII characters) equals utf8proc's NFC of the whole text, on random strings of
 * starters, combining marks in both canonical orders, Hangul jamo, singletons (U+212B) and CJK: the byte-level
 * tokenizer with an NFC normalizer decodes encode(s) to NFC(s). */
static void nfc_equals_whole_text_nfc(void **state) {
    (void)state;
    char *json = tiny_variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}");
    fm_tokenizer *t = load_ok(tok_dir("nfc", json));
    free(json);
    static const char *alphabet[] = {"a",
                                     "e",
                                     " ",
                                     "\n",
                                     "\xcc\x81" /* U+0301 ccc 230 */,
                                     "\xcc\xa3" /* U+0323 ccc 220 */,
                                     "\xcc\x88",
                                     "\xc3\x85" /* Å */,
                                     "\xe2\x84\xab" /* U+212B */,
                                     "\xe1\x84\x80" /* U+1100 */,
                                     "\xe1\x85\xa1" /* U+1161 */,
                                     "\xe1\x86\xa8" /* U+11A8 */,
                                     "\xe4\xb8\xad",
                                     "\xcd\x84" /* U+0344 */,
                                     "."};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int it = 0; it < 400; it++) {
        char s[512] = "";
        size_t n = 0;
        const int k = 1 + it % 40;
        for (int j = 0; j < k; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *a = alphabet[x % (sizeof alphabet / sizeof *alphabet)];
            memcpy(s + n, a, strlen(a) + 1);
            n += strlen(a);
        }
        utf8proc_uint8_t *want = utf8proc_NFC((const utf8proc_uint8_t *)s);
        assert_non_null(want);
        int32_t *ids = NULL;
        int64_t m = 0;
        fm_error err = {{0}};
        assert_int_equal(fm_tokenizer_encode(t, s, n, false, true, &ids, &m, &err), FM_OK);
        size_t got_len = 0;
        char *got = decode_ok(t, ids, m, false, &got_len);
        if (strcmp(got, (const char *)want) != 0) fail_msg("NFC of '%s': got '%s', want '%s'", s, got, want);
        free(got), free(ids), free(want);
    }
    fm_tokenizer_free(t);
}

/* Byte tokens of a 3-byte character pushed one at a time: nothing until the character is complete. */
static void detok_holds_partial_characters(void **state) {
    (void)state;
    fm_tokenizer *t = load_ok(TINY);
    /* 中 = E4 B8 AD: in the byte-level alphabet ä (U+00E4), ¸ (U+00B8) and ŃĮ.. : look the single bytes up */
    const int32_t e4 = fm_tokenizer_token_id(t, "\xc3\xa4"), b8 = fm_tokenizer_token_id(t, "\xc2\xb8"),
                  ad = fm_tokenizer_token_id(t, "\xc5\x83"); /* 0xAD is not printable: U+0143 (Ń) */
    assert_true(e4 >= 0 && b8 >= 0 && ad >= 0);
    fm_detok *d = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_detok_create(t, false, &d, &err), FM_OK);
    assert_string_equal(fm_detok_push(d, 88), "x");
    assert_string_equal(fm_detok_push(d, e4), "");
    assert_string_equal(fm_detok_push(d, b8), "");
    assert_string_equal(fm_detok_push(d, ad), "\xe4\xb8\xad");
    assert_string_equal(fm_detok_push(d, e4), "");
    assert_string_equal(fm_detok_flush(d), "\xEF\xBF\xBD"); /* an incomplete end becomes U+FFFD, as decode does */
    fm_detok_free(d);
    fm_tokenizer_free(t);
}

/* ---- Llama/Mistral-style BPE, written here: vocabulary <unk> <s> </s>, <0x00>..<0xFF> (ids 3..258), then ---- */
#define LLAMA_VOCAB                                                                                                    \
    "\"\xe2\x96\x81\": 259, \"h\": 260, \"e\": 261, \"l\": 262, \"o\": 263, \"w\": 264, \"r\": 265, \"d\": 266, "      \
    "\"\xe2\x96\x81h\": 267, \"ll\": 268, \"\xe2\x96\x81he\": 269, \"llo\": 270, \"\xe2\x96\x81hello\": 271, "         \
    "\"\xe2\x96\x81w\": 272, \"or\": 273, \"\xe2\x96\x81wor\": 274, \"\xe2\x96\x81world\": 275, "                      \
    "\"\xe2\x96\x81worl\": 276"
#define LLAMA_MERGES                                                                                                   \
    "[\"\xe2\x96\x81 h\", \"l l\", \"\xe2\x96\x81h e\", \"ll o\", \"\xe2\x96\x81he llo\", \"\xe2\x96\x81 w\", "        \
    "[\"o\", \"r\"], [\"\xe2\x96\x81w\", \"or\"], \"\xe2\x96\x81wor l\", \"\xe2\x96\x81worl d\"]"
#define LLAMA_ADDED                                                                                                    \
    "[{\"id\": 0, \"content\": \"<unk>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "              \
    "\"normalized\": false, \"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"single_word\": false, "            \
    "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 2, \"content\": "       \
    "\"</s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": "     \
    "true}]"
#define LLAMA_POST                                                                                                     \
    "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "          \
    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", " \
    "\"ids\": [1], \"tokens\": [\"<s>\"]}}}"
#define LLAMA_DECODER                                                                                                  \
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xe2\x96\x81\"}, "    \
    "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" "  \
    "\", "                                                                                                             \
    "\"start\": 1, \"stop\": 0}]}"
#define LLAMA_NORMALIZER                                                                                               \
    "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}, "              \
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}]}"

/* The tokenizer.json of the Llama-style tests: byte_fallback and fuse_unk as given; normalizer, pre_tokenizer and
 * decoder JSON. */
static char *llama_json(bool byte_fallback, bool fuse_unk, const char *normalizer, const char *pre,
                        const char *decoder) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": %s, "
                          "\"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s, "
                          "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
                          "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": %s, "
                          "\"byte_fallback\": %s, \"ignore_merges\": false, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, "
                          "\"</s>\": 2",
                          LLAMA_ADDED, normalizer, pre, LLAMA_POST, decoder, fuse_unk ? "true" : "false",
                          byte_fallback ? "true" : "false");
    for (int b = 0; b < 256; b++) n += (size_t)snprintf(s + n, cap - n, ", \"<0x%02X>\": %d", b, 3 + b);
    snprintf(s + n, cap - n, ", " LLAMA_VOCAB "}, \"merges\": " LLAMA_MERGES "}}");
    return s;
}

/* Worked by hand. "hello world": Prepend ▁ and Replace ' ' -> "▁hello▁world", one word (no pre-tokenizer); merges
 * by rank: ▁h, ll, ▁he, llo, ▁hello, ▁w, or, ▁wor, ▁worl, ▁world -> [271, 275]; <s> first with add_special.
 * "hi 中": "▁hi▁中": i and 中 are not in the vocabulary -> bytes <0x69> (3 + 0x69 = 108) and E4 B8 AD
 * (231, 187, 176); ▁h merges -> [267, 108, 259, 231, 187, 176]; decoding gives back "hi 中" (Strip removes the
 * prepended space). */
static void llama_style_hand_worked(void **state) {
    (void)state;
    char *json = llama_json(true, true, LLAMA_NORMALIZER, "null", LLAMA_DECODER);
    fm_tokenizer *t = load_ok(tok_dir("llama", json));
    free(json);
    EXPECT_IDS(t, "hello world", true, true, 1, 271, 275);
    EXPECT_IDS(t, "hello world", false, true, 271, 275);
    EXPECT_IDS(t, "hi \xe4\xb8\xad", false, true, 267, 108, 259, 231, 187, 176);
    /* <s> in the text is the special token; the text after it is its own piece and gets its own ▁ (Prepend is per
     * piece, as in `tokenizers`) */
    EXPECT_IDS(t, "<s>hello", false, true, 1, 271);
    size_t len = 0;
    const int32_t ids[] = {1, 267, 108, 259, 231, 187, 176};
    char *text = decode_ok(t, ids + 1, 6, false, &len);
    assert_string_equal(text, "hi \xe4\xb8\xad");
    expect_stream(t, ids + 1, 6, false, text, len, "llama hi");
    free(text);
    text = decode_ok(t, ids, 7, false, &len);
    assert_string_equal(text, "<s> hi \xe4\xb8\xad"); /* Strip looks at the first character only: '<' */
    expect_stream(t, ids, 7, false, text, len, "llama <s> hi");
    free(text);
    text = decode_ok(t, ids, 7, true, &len);
    assert_string_equal(text, "hi \xe4\xb8\xad");
    expect_stream(t, ids, 7, true, text, len, "llama <s> hi skip");
    free(text);
    /* byte tokens that are not UTF-8: one U+FFFD per byte (ByteFallback), then what follows */
    const int32_t broken[] = {231, 187, 271};
    text = decode_ok(t, broken, 3, false, &len);
    assert_string_equal(text, "\xEF\xBF\xBD\xEF\xBF\xBD hello");
    expect_stream(t, broken, 3, false, text, len, "llama broken bytes");
    free(text);
    fm_tokenizer_free(t);
}

/* tokenizer_config.json's add_bos_token counts only when tokenizer.json has no post_processor (as transformers adds
 * the bos itself then); with a TemplateProcessing, tokenizer.json decides (as `tokenizers`). */
static void config_add_bos(void **state) {
    (void)state;
    char *json = llama_json(true, true, LLAMA_NORMALIZER, "null", LLAMA_DECODER);
    char *post = strstr(json, "\"post_processor\": {");
    assert_non_null(post);
    char *end = strstr(post, "}}}, ") + 3; /* the post_processor object ends "}}}" */
    char *no_post = malloc(strlen(json) + 1);
    snprintf(no_post, strlen(json) + 1, "%.*s\"post_processor\": null%s", (int)(post - json), json, end);
    const char *dir = tok_dir("config-bos", no_post);
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *cfg = "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": {\"content\": \"<s>\"}, "
                      "\"eos_token\": \"</s>\"}";
    write_text(path, cfg, strlen(cfg));
    fm_tokenizer *t = load_ok(dir);
    EXPECT_IDS(t, "hello", true, true, 1, 271, 2);
    EXPECT_IDS(t, "hello", false, true, 271);
    fm_tokenizer_free(t);
    /* a bos that is not a token is an error naming the field */
    cfg = "{\"add_bos_token\": true, \"bos_token\": \"<bos>\"}";
    write_text(path, cfg, strlen(cfg));
    fm_error err = {{0}};
    assert_int_equal(fm_tokenizer_load(dir, &t, &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "bos_token"));
    /* with the post_processor, the config does not add anything */
    dir = tok_dir("config-bos", json);
    cfg = "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
    write_text(path, cfg, strlen(cfg));
    t = load_ok(dir);
    EXPECT_IDS(t, "hello", true, true, 1, 271);
    fm_tokenizer_free(t);
    free(no_post), free(json);
}

/* Without byte_fallback unknown characters become <unk>, a run of them one <unk> when fuse_unk. */
static void llama_style_unk(void **state) {
    (void)state;
    char *json = llama_json(false, true, LLAMA_NORMALIZER, "null", LLAMA_DECODER);
    fm_tokenizer *t = load_ok(tok_dir("llama-unk", json));
    free(json);
    EXPECT_IDS(t, "hi \xe4\xb8\xad", false, true, 267, 0, 259, 0);
    EXPECT_IDS(t, "hiiq", false, true, 267, 0);
    fm_tokenizer_free(t);
    json = llama_json(false, false, LLAMA_NORMALIZER, "null", LLAMA_DECODER);
    t = load_ok(tok_dir("llama-unk2", json));
    free(json);
    EXPECT_IDS(t, "hiiq", false, true, 267, 0, 0, 0);
    fm_tokenizer_free(t);
}

/* Metaspace (prepend_scheme first) instead of the normalizers: only the piece at the start of the text gets ▁.
 * "<s>hello world": the piece "hello world" starts at byte 3 -> "hello▁world": h e ll o -> h e llo, ▁world ->
 * [260, 261, 270, 275]. The Metaspace decoder drops the first token's ▁. */
static void metaspace_hand_worked(void **state) {
    (void)state;
    const char *pre = "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\", "
                      "\"split\": false}";
    const char *dec = "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\", "
                      "\"split\": false}";
    char *json = llama_json(true, true, "null", pre, dec);
    fm_tokenizer *t = load_ok(tok_dir("metaspace", json));
    free(json);
    EXPECT_IDS(t, "hello world", false, true, 271, 275);
    EXPECT_IDS(t, "<s>hello world", false, true, 1, 260, 261, 270, 275);
    const int32_t ids[] = {271, 275};
    size_t len = 0;
    char *text = decode_ok(t, ids, 2, false, &len);
    assert_string_equal(text, "hello world");
    expect_stream(t, ids, 2, false, text, len, "metaspace");
    free(text);
    fm_tokenizer_free(t);
    /* split: true cuts before each ▁ -> the same ids here (no merge crosses a ▁) */
    const char *pre_split = "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": "
                            "\"always\", \"split\": true}";
    json = llama_json(true, true, "null", pre_split, dec);
    t = load_ok(tok_dir("metaspace-split", json));
    free(json);
    EXPECT_IDS(t, "hello world", false, true, 271, 275);
    fm_tokenizer_free(t);
}

/* What fp8moe does not implement is refused by name. */
static void refused_components(void **state) {
    (void)state;
    static const struct {
        const char *normalizer, *pre, *decoder, *name;
    } cases[] = {
        {"{\"type\": \"Lowercase\"}", "null", "null", "Lowercase"},
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"StripAccents\"}]}", "null",
         "null", "StripAccents"},
        {"null", "{\"type\": \"Whitespace\"}", "null", "Whitespace"},
        {"null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true}]}",
         "null", "Digits"},
        {"null", "null", "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}", "WordPiece"},
        {"null", "null", "{\"type\": \"CTC\"}", "CTC"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *json = llama_json(true, true, cases[i].normalizer, cases[i].pre, cases[i].decoder);
        fm_tokenizer *t = NULL;
        fm_error err = {{0}};
        assert_int_equal(fm_tokenizer_load(tok_dir("refused", json), &t, &err), FM_ERR_UNSUPPORTED);
        assert_null(t);
        if (!strstr(err.msg, cases[i].name)) fail_msg("message does not name %s: %s", cases[i].name, err.msg);
        free(json);
    }
    /* a model other than BPE, a post-processor we do not implement, dropout */
    static const struct {
        const char *json, *name;
    } whole[] = {
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "WordPiece"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", "Unigram"},
        {"{\"post_processor\": {\"type\": \"RobertaProcessing\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": "
         "0}, \"merges\": []}}",
         "RobertaProcessing"},
        {"{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}", "dropout"},
        {"{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {\"a\": 0}, \"merges\": "
         "[]}}",
         "continuing_subword_prefix"},
        {"{\"truncation\": {\"max_length\": 8}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "truncation"},
    };
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++) {
        fm_tokenizer *t = NULL;
        fm_error err = {{0}};
        assert_int_equal(fm_tokenizer_load(tok_dir("refused2", whole[i].json), &t, &err), FM_ERR_UNSUPPORTED);
        if (!strstr(err.msg, whole[i].name)) fail_msg("message does not name %s: %s", whole[i].name, err.msg);
    }
}

/* Malformed files: a clear FM_ERR_FORMAT (or IO for a missing file), never a crash (this runs under ASan). */
static void hostile_files(void **state) {
    (void)state;
    static const struct {
        const char *json, *says;
    } cases[] = {
        {"", "empty"},
        {"{\"model\": ", "not valid JSON"},
        {"[1, 2]", "object"},
        {"{}", "model"},
        {"{\"model\": {\"type\": \"BPE\"}}", "vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\"]}}", "vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"zero\"}}}", "vocab['a']"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "vocab['a']"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1e12}}}", "vocab['a']"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0.5}}}", "vocab['a']"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", "id 0"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "empty"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", "merged token"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [42]}}", "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a a\"]}}", "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}", "merges"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"}}", "unk_token"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"byte_fallback\": \"yes\"}}", "byte_fallback"},
        {"{\"added_tokens\": {}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "added_tokens"},
        {"{\"added_tokens\": [{\"id\": 99999999999, \"content\": \"x\"}], \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 0}}}",
         "added_tokens"},
        {"{\"added_tokens\": [{\"id\": 1, \"content\": \"\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
         "content"},
        {"{\"added_tokens\": [{\"id\": 1}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "content"},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"x\"}, \"model\": "
         "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
         "does not compile"},
        {"{\"normalizer\": {\"type\": \"Prepend\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "prepend"},
        {"{\"normalizer\": 7, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "normalizer"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
         "behavior"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": \"Isolated\"}, \"model\": "
         "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
         "pattern"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}, \"model\": {\"type\": \"BPE\", "
         "\"vocab\": {\"a\": 0}}}",
         "one character"},
        {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
         "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": "
         "0}}}",
         "<s>"},
        {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
         "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [5]}}}, \"model\": {\"type\": "
         "\"BPE\", \"vocab\": {\"a\": 0}}}",
         "special token ids"},
        {"{\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -3}, \"model\": {\"type\": \"BPE\", "
         "\"vocab\": {\"a\": 0}}}",
         "start"},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": 3}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": "
         "0}}}",
         "decoders"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}}}", "twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fm_tokenizer *t = NULL;
        fm_error err = {{0}};
        const fm_status st = fm_tokenizer_load(tok_dir("hostile", cases[i].json), &t, &err);
        if (st != FM_ERR_FORMAT && st != FM_ERR_UNSUPPORTED)
            fail_msg("case %zu (%s): status %d, message: %s", i, cases[i].json, st, err.msg);
        assert_null(t);
        if (!strstr(err.msg, cases[i].says))
            fail_msg("case %zu: message does not say '%s': %s", i, cases[i].says, err.msg);
        if (!strstr(err.msg, "tokenizer.json")) fail_msg("case %zu: message does not name the file: %s", i, err.msg);
    }
    /* no tokenizer.json at all, and a directory in its place */
    fm_tokenizer *t = NULL;
    fm_error err = {{0}};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/none", cli_tmp);
    mkdir(dir, 0755);
    assert_int_equal(fm_tokenizer_load(dir, &t, &err), FM_ERR_IO);
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    char sub[700];
    snprintf(sub, sizeof sub, "%s/tokenizer.json", dir);
    mkdir(sub, 0755);
    assert_int_not_equal(fm_tokenizer_load(dir, &t, &err), FM_OK);
    assert_null(t);
}

/* ---- golden data from `tokenizers` ---- */
static int32_t *json_ids(const cJSON *a, int64_t *n) {
    assert_true(cJSON_IsArray(a));
    *n = cJSON_GetArraySize(a);
    int32_t *ids = malloc((size_t)*n * sizeof *ids + 4);
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) ids[i++] = (int32_t)e->valuedouble;
    return ids;
}

static void expect_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip, const char *want,
                          const char *what) {
    size_t len = 0;
    char *text = decode_ok(t, ids, n, skip, &len);
    if (strcmp(text, want) != 0)
        fail_msg("%s: decode(skip_special=%d):\n  got  '%s'\n want '%s'", what, skip, text, want);
    expect_stream(t, ids, n, skip, text, len, what);
    free(text);
}

static int golden_dir(const char *golden_path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", golden_path);
    *strrchr(dir, '/') = '\0';
    FILE *f = fopen(golden_path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
    text[size] = '\0';
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    const cJSON *tdir = cJSON_GetObjectItemCaseSensitive(root, "tokenizer_dir");
    fm_tokenizer *t = load_ok(cJSON_IsString(tdir) ? tdir->valuestring : dir);
    int checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "cases")) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        char what[256];
        snprintf(what, sizeof what, "%s: case %s", golden_path, name);
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(c, "text"),
                    *hex = cJSON_GetObjectItemCaseSensitive(c, "bytes_hex");
        char *in;
        size_t len;
        if (cJSON_IsString(txt)) in = strdup(txt->valuestring), len = strlen(in);
        else {
            assert_true(cJSON_IsString(hex));
            len = strlen(hex->valuestring) / 2;
            in = malloc(len + 1);
            for (size_t i = 0; i < len; i++) {
                unsigned v;
                sscanf(hex->valuestring + 2 * i, "%2x", &v);
                in[i] = (char)v;
            }
        }
        static const struct {
            const char *key;
            bool add, parse;
        } modes[] = {{"ids", true, true}, {"ids_no_special", false, true}, {"ids_text_special", false, false}};
        for (int m = 0; m < 3; m++) {
            int64_t n = 0;
            int32_t *want = json_ids(cJSON_GetObjectItemCaseSensitive(c, modes[m].key), &n);
            expect_ids(t, in, len, modes[m].add, modes[m].parse, want, n);
            free(want);
        }
        int64_t n = 0;
        int32_t *ids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
        expect_decode(t, ids, n, false, cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring, what);
        expect_decode(t, ids, n, true, cJSON_GetObjectItemCaseSensitive(c, "decoded_skip_special")->valuestring, what);
        free(ids), free(in);
        checked++;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "decode_cases")) {
        char what[256];
        snprintf(what, sizeof what, "%s: decode case %s", golden_path,
                 cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
        int64_t n = 0;
        int32_t *ids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
        expect_decode(t, ids, n, false, cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring, what);
        free(ids);
        checked++;
    }
    fm_tokenizer_free(t);
    cJSON_Delete(root);
    return checked;
}

static void golden_tokenizers(void **state) {
    (void)state;
    glob_t g;
    if (glob("tests/tokenizers/*/golden.json", 0, NULL, &g) != 0) {
        print_message("no golden tokenizer data yet: run tools/make_golden_tokenizer.py on the machine with "
                      "`tokenizers` (the hand-worked tests above still run)\n");
        return;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const int n = golden_dir(g.gl_pathv[i]);
        assert_true(n > 10);
        print_message("%s: %d cases equal to tokenizers\n", g.gl_pathv[i], n);
    }
    globfree(&g);
}

/* ---- the CLI ---- */
static void cli_tokenize_detokenize(void **state) {
    (void)state;
    assert_int_equal(fp8moe("tokenize --model " TINY " --text 'x = 1'"), 0);
    assert_string_equal(cli_out, "88 273 348\n");
    char ids[600], text[600];
    snprintf(ids, sizeof ids, "%s/ids.i32", cli_tmp);
    snprintf(text, sizeof text, "%s/in.txt", cli_tmp);
    write_text(text, "def f(x):\n    return x  # \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x8e\x89\n", 38);
    assert_int_equal(fp8moe("tokenize --model " TINY " --file %s --out %s", text, ids), 0);
    assert_int_equal(fp8moe("detokenize --model " TINY " --ids %s", ids), 0);
    assert_string_equal(cli_out, "def f(x):\n    return x  # \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x8e\x89\n");
    /* the ids file is little-endian int32: x = 1 */
    assert_int_equal(fp8moe("tokenize --model " TINY " --text 'x = 1' --out %s", ids), 0);
    unsigned char raw[12];
    FILE *f = fopen(ids, "rb");
    assert_non_null(f);
    assert_int_equal(fread(raw, 1, 12, f), 12);
    fclose(f);
    assert_int_equal(raw[0] | raw[1] << 8, 88);
    assert_int_equal(raw[4] | raw[5] << 8, 273);
    assert_int_equal(raw[8] | raw[9] << 8, 348);
    /* special tokens: parsed by default, text with --text-special */
    assert_int_equal(fp8moe("tokenize --model " TINY " --text 'a<|endoftext|>'"), 0);
    assert_non_null(strstr(cli_out, " 0\n"));
    assert_int_equal(fp8moe("tokenize --model " TINY " --text '<|endoftext|>' --text-special"), 0);
    assert_null(strstr(cli_out, " 0 "));
    assert_true(cli_out[0] != '0');
    /* usage errors exit 2, bad input 1 */
    assert_int_equal(fp8moe("tokenize --model " TINY), 2);
    assert_non_null(strstr(cli_err, "--text"));
    assert_int_equal(fp8moe("tokenize --model " TINY " --text a --file b"), 2);
    assert_int_equal(fp8moe("tokenize --text a"), 2);
    assert_int_equal(fp8moe("tokenize --model " TINY " --text a --bogus"), 2);
    assert_int_equal(fp8moe("tokenize --model %s --text a", cli_tmp), 1);
    assert_non_null(strstr(cli_err, "tokenizer.json"));
    assert_int_equal(fp8moe("tokenize --model " TINY " --file /nonexistent/file"), 1);
    assert_int_equal(fp8moe("detokenize --model " TINY), 2);
    write_text(ids, "\x00\x10\x00\x00", 4); /* id 4096: outside the vocabulary */
    assert_int_equal(fp8moe("detokenize --model " TINY " --ids %s", ids), 1);
    assert_non_null(strstr(cli_err, "4096"));
    assert_int_equal(fp8moe("tokenize --help"), 0);
    assert_non_null(strstr(cli_out, "usage: fp8moe tokenize"));
    assert_int_equal(fp8moe("detokenize --help"), 0);
    assert_int_equal(fp8moe("bench tokenize --help"), 0);
    assert_non_null(strstr(cli_out, "MB/s"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_hand_worked),        cmocka_unit_test(tiny_eval_round_trip),
        cmocka_unit_test(tiny_round_trips),        cmocka_unit_test(nfc_equals_whole_text_nfc),
        cmocka_unit_test(normalized_added_tokens), cmocka_unit_test(detok_holds_partial_characters),
        cmocka_unit_test(llama_style_hand_worked), cmocka_unit_test(llama_style_unk),
        cmocka_unit_test(config_add_bos),          cmocka_unit_test(metaspace_hand_worked),
        cmocka_unit_test(refused_components),      cmocka_unit_test(hostile_files),
        cmocka_unit_test(golden_tokenizers),       cmocka_unit_test(cli_tokenize_detokenize),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
