/* The tokenizer's insides, shared by the files of src/text/ that implement tokenizer.h: the loaded pipeline
 * (normalizers, pre-tokenizers, BPE model, added tokens, post-processor, decoders) as flat arrays of steps. */
#ifndef FM_TEXT_TOK_INTERNAL_H
#define FM_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* ---- growable byte and id buffers ---- */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;
bool tok_buf_put(tok_buf *b, const void *s, size_t n);
bool tok_buf_putc(tok_buf *b, char c);

typedef struct tok_ids {
    int32_t *p;
    int64_t n, cap;
} tok_ids;
bool tok_ids_push(tok_ids *v, int32_t id);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when s starts with an invalid byte. */
int tok_utf8_len(const uint8_t *s, size_t n);
/* Code point of the valid sequence at s (len from tok_utf8_len). */
uint32_t tok_utf8_decode(const uint8_t *s, int len);
int tok_utf8_encode(uint32_t cp, char out[4]);
/* Appends s[0..n) to out with every invalid sequence replaced by U+FFFD the way Python's and Rust's lossy decoders
 * do (one U+FFFD per maximal subpart of an ill-formed sequence). */
bool tok_utf8_lossy(const char *s, size_t n, tok_buf *out);
/* True when s[0..n) is valid UTF-8. */
bool tok_utf8_valid(const char *s, size_t n);

/* The first occurrence of needle[0..m) (m > 0) in hay[0..n), or NULL (memmem without _GNU_SOURCE). */
const char *tok_find(const char *hay, size_t n, const char *needle, size_t m);

/* ---- GPT-2 byte-level alphabet: each byte is shown as one printable code point ---- */
uint32_t tok_byte_to_cp(uint8_t b);
/* The byte of a byte-level code point, or -1 when cp is not in the alphabet. */
int tok_cp_to_byte(uint32_t cp);

/* ---- hash maps ---- */
/* Byte string -> int32 (open addressing; keys point into memory the caller keeps alive). */
typedef struct tok_strmap {
    struct tok_strmap_slot {
        const char *key;
        uint32_t len;
        int32_t value;
    } * slots;
    uint32_t cap, n; /* cap a power of two */
} tok_strmap;
bool tok_strmap_init(tok_strmap *m, uint32_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts or replaces; false when out of memory. */
bool tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t value);
/* The value, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, uint32_t len);
uint64_t tok_hash_bytes(const void *p, size_t n);

/* (left id, right id) -> merge rank and merged id. */
typedef struct tok_pairmap {
    struct tok_pair_slot {
        uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
        int32_t rank, id;
    } * slots;
    uint32_t cap, n;
} tok_pairmap;
bool tok_pairmap_init(tok_pairmap *m, uint32_t expected);
void tok_pairmap_free(tok_pairmap *m);
bool tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* The slot for (a, b), or NULL when the pair does not merge. */
const struct tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);

/* ---- pipeline steps (a Sequence is flattened into its steps) ---- */
typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE } tok_norm_kind;
typedef struct tok_norm {
    tok_norm_kind kind;
    char *a, *b;    /* PREPEND: a = the prefix; REPLACE: a = the literal pattern (NULL with re), b = the content */
    pcre2_code *re; /* REPLACE with a Regex pattern */
} tok_norm;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE } tok_pre_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } tok_split_mode;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend_scheme;
typedef struct tok_pre {
    tok_pre_kind kind;
    pcre2_code *re;            /* SPLIT (a String pattern is compiled as a literal), BYTE_LEVEL with use_regex */
    tok_split_mode mode;       /* SPLIT */
    bool invert;               /* SPLIT */
    bool add_prefix_space;     /* BYTE_LEVEL */
    char repl[8];              /* METASPACE: the replacement character (UTF-8) */
    tok_prepend_scheme scheme; /* METASPACE */
    bool split;                /* METASPACE */
} tok_pre;

typedef enum { DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_BYTE_LEVEL, DEC_METASPACE } tok_dec_kind;
typedef struct tok_dec {
    tok_dec_kind kind;
    char *a, *b;       /* REPLACE: pattern (literal) and content */
    pcre2_code *re;    /* REPLACE with a Regex pattern */
    uint32_t strip_cp; /* STRIP: the character */
    int32_t strip_start, strip_stop;
    char repl[8]; /* METASPACE */
    tok_prepend_scheme scheme;
} tok_dec;

typedef struct tok_added {
    char *content;
    char *match; /* what is matched: content, or its normalized form when normalized */
    uint32_t match_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

#define TOK_MAX_STEPS 16

struct fm_tokenizer {
    /* vocabulary: id -> token string (added tokens first, as `tokenizers` looks them up) */
    int32_t n_ids;       /* largest id + 1 */
    const char **id_str; /* n_ids entries, NULL for a hole */
    uint32_t *id_len;
    bool *id_special; /* n_ids */
    bool *id_added;   /* n_ids */
    char *arena;      /* the strings */
    tok_strmap vocab; /* the model's vocabulary */
    tok_pairmap merges;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;        /* -1: none */
    int32_t byte_ids[256]; /* <0xNN> tokens (byte_fallback), -1 when absent */

    tok_norm norm[TOK_MAX_STEPS];
    int n_norm;
    tok_pre pre[TOK_MAX_STEPS];
    int n_pre;
    bool byte_level;             /* the last pre-tokenizer is ByteLevel: words are bytes shown in the GPT-2 alphabet */
    int32_t byte_level_ids[256]; /* byte-level mode: the vocabulary id of each byte's code point, -1 when absent */
    tok_dec dec[TOK_MAX_STEPS];
    int n_dec;
    bool has_decoder;

    tok_added *added;
    int n_added;
    bool any_normalized_added;
    int32_t first_added[256][2]; /* per first byte: index range [lo, hi) into added_by_byte */
    int32_t *added_by_byte;      /* indexes of added tokens sorted by first byte of their match */

    int32_t *bos_ids, *eos_ids; /* the post-processor's ids before and after the sequence (add_special) */
    int32_t n_bos, n_eos;
    bool has_post; /* tokenizer.json has a post_processor (tokenizer_config.json's add_bos_token is then ignored) */
};

/* ---- the steps, each in its file ---- */
/* Applies the normalizers to s[0..n) into out (replacing its contents). */
fm_status tok_normalize(const fm_tokenizer *t, const char *s, size_t n, tok_buf *out, fm_error *err);
/* False when the normalizers leave s[0..n) as it is for certain (none, or only NFC on text below U+0300). */
bool tok_normalize_changes(const fm_tokenizer *t, const char *s, size_t n);

/* A piece of text between the pipeline's stages: bytes, and whether it starts the original text. */
typedef struct tok_span {
    const char *s;
    size_t n;
    bool at_start;
} tok_span;
typedef struct tok_spans {
    tok_span *p;
    size_t n, cap;
} tok_spans;
bool tok_spans_push(tok_spans *v, const char *s, size_t n, bool at_start);

/* Scratch a pre-tokenization may allocate into: freed by tok_arena_free. */
typedef struct tok_arena {
    char **blocks;
    size_t n, cap;
} tok_arena;
/* A NUL-terminated copy of s[0..n) (s NULL: uninitialised n bytes) owned by the arena. */
char *tok_arena_copy(tok_arena *a, const char *s, size_t n);
void tok_arena_free(tok_arena *a);

/* Splits one normalized piece into words through the pre-tokenizers, calling word() on each in order as it is
 * found. md: match data the regexes share (any size); arena: for pieces a step rewrites (Metaspace, a prefix space). */
typedef fm_status (*tok_word_fn)(void *ctx, const char *s, size_t n, fm_error *err);
fm_status tok_pretokenize(const fm_tokenizer *t, tok_span piece, tok_word_fn word, void *ctx, tok_arena *arena,
                          pcre2_match_data *md, fm_error *err);

/* Finds each match of re in s[0..n), calling fn(start, end) in order; empty matches are skipped. */
fm_status tok_regex_each(const pcre2_code *re, const char *s, size_t n, pcre2_match_data *md,
                         void (*fn)(void *ctx, size_t start, size_t end), void *ctx, fm_error *err);

/* BPE of one word, ids appended. A per-call cache of words already seen (NULL: none). */
typedef struct tok_word_cache tok_word_cache;
tok_word_cache *tok_word_cache_new(void);
void tok_word_cache_free(tok_word_cache *c);
fm_status tok_bpe_word(const fm_tokenizer *t, const char *w, size_t n, tok_word_cache *cache, tok_ids *out,
                       fm_error *err);

/* Added tokens: splits s[0..n) at the added tokens of the given kind (normalized or not) that are allowed; calls
 * text(ctx, start, end) for the text between and token(ctx, id) for each. */
typedef struct tok_added_cb {
    fm_status (*text)(void *ctx, size_t start, size_t end, fm_error *err);
    fm_status (*token)(void *ctx, int32_t id, fm_error *err);
    void *ctx;
} tok_added_cb;
fm_status tok_split_added(const fm_tokenizer *t, const char *s, size_t n, bool normalized, bool parse_special,
                          const tok_added_cb *cb, fm_error *err);

/* Compiles a pattern with UTF + UCP (+ JIT); literal escapes it. what names it in messages. */
fm_status tok_regex_compile(const char *pattern, bool literal, const char *what, pcre2_code **out, fm_error *err);

/* Loading of the components (tok_load.c). */
fm_status tok_load_json(fm_tokenizer *t, const char *text, size_t len, const char *label, fm_error *err);
void tok_free_steps(fm_tokenizer *t);

#endif
