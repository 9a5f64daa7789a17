/* Text to ids, the order of `tokenizers`' encode: invalid UTF-8 replaced by U+FFFD (as Python's decode with
 * errors="replace" would before the text reaches `tokenizers`), added tokens split out of the raw text, the normalizer
 * on each remaining piece, normalized added tokens split out of that, the pre-tokenizers, BPE on each word, then the
 * post-processor's special tokens. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

typedef struct encode_ctx {
    const fm_tokenizer *t;
    const char *text;   /* the (valid UTF-8) input */
    tok_buf normalized; /* the current piece after the normalizers */
    bool piece_at_start;
    tok_spans words;
    tok_arena arena;
    tok_word_cache *cache;
    pcre2_match_data *md;
    tok_ids out;
} encode_ctx;

static fm_status push_id(void *p, int32_t id, fm_error *err) {
    encode_ctx *c = p;
    return tok_ids_push(&c->out, id) ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
}

/* Pre-tokenizes a normalized piece and runs BPE on its words. */
static fm_status encode_normalized(void *p, size_t start, size_t end, fm_error *err) {
    encode_ctx *c = p;
    const tok_span piece = {c->normalized.p + start, end - start, c->piece_at_start && start == 0};
    c->words.n = 0;
    fm_status st = tok_pretokenize(c->t, piece, &c->words, &c->arena, c->md, err);
    for (size_t i = 0; !st && i < c->words.n; i++)
        st = tok_bpe_word(c->t, c->words.p[i].s, c->words.p[i].n, c->cache, &c->out, err);
    tok_arena_free(&c->arena);
    return st;
}

/* A piece of the raw text between added tokens: normalized, then split at the normalized added tokens. */
static fm_status encode_raw(void *p, size_t start, size_t end, fm_error *err) {
    encode_ctx *c = p;
    fm_status st = tok_normalize(c->t, c->text + start, end - start, &c->normalized, err);
    if (st) return st;
    c->piece_at_start = start == 0;
    if (!c->t->any_normalized_added) return encode_normalized(c, 0, c->normalized.n, err);
    const tok_added_cb cb = {encode_normalized, push_id, c};
    return tok_split_added(c->t, c->normalized.p, c->normalized.n, true, true, &cb, err);
}

fm_status fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, int64_t *n, fm_error *err) {
    *ids = NULL, *n = 0;
    if (!t || (!text && len)) return fm_fail(err, FM_ERR_USAGE, "fm_tokenizer_encode: no tokenizer or no text");
    tok_buf fixed = {0};
    if (len && !tok_utf8_valid(text, len)) {
        if (!tok_utf8_lossy(text, len, &fixed)) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
        text = fixed.p, len = fixed.n;
    }
    encode_ctx c = {.t = t, .text = text};
    c.cache = tok_word_cache_new();
    c.md = pcre2_match_data_create(16, NULL);
    fm_status st = c.cache && c.md ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    for (int32_t i = 0; !st && add_special && i < t->n_bos; i++) st = push_id(&c, t->bos_ids[i], err);
    if (!st) {
        /* parse_special false: special tokens are text, as `tokenizers` with encode_special_tokens = True */
        const tok_added_cb cb = {encode_raw, push_id, &c};
        st = tok_split_added(t, text, len, false, parse_special, &cb, err);
    }
    for (int32_t i = 0; !st && add_special && i < t->n_eos; i++) st = push_id(&c, t->eos_ids[i], err);
    tok_word_cache_free(c.cache);
    if (c.md) pcre2_match_data_free(c.md);
    free(c.normalized.p), free(c.words.p), free(fixed.p);
    tok_arena_free(&c.arena);
    if (st) {
        free(c.out.p);
        return st;
    }
    if (!c.out.p && !(c.out.p = malloc(sizeof(int32_t)))) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    *ids = c.out.p, *n = c.out.n;
    return FM_OK;
}
