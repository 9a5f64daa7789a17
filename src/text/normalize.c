/* The normalizers of `tokenizers` that Qwen and Llama/Mistral files use: NFC (and NFD, NFKC, NFKD) through
 * utf8proc, Prepend, Replace (a literal or a regex). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"
#include "util/status.h"

/* Text made only of code points below U+0300 is already NFC: none of them decomposes under NFC's rules or is
 * the second half of a canonical composition. Most text (code, English) takes this path and skips utf8proc. */
static bool below(const char *s, size_t n, uint32_t limit) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n; i++) {
        if (u[i] < 0x80) continue;
        if (limit <= 0x80 || u[i] >= 0xCC) return false; /* a lead byte >= 0xCC starts a code point >= U+0300 */
    }
    return true;
}

/* The normal forms are computed chunk by chunk: a chunk boundary before an ASCII character changes nothing (ASCII
 * characters are starters and the second half of no composition), so only the runs of non-ASCII characters that
 * hold a code point the form may change (>= U+0300 for NFC, any non-ASCII for the others), with the ASCII character
 * just before them (which may compose with what follows), go through utf8proc. */
static fm_status unicode_normal_form(tok_norm_kind kind, const tok_buf *in, tok_buf *out, fm_error *err) {
    const uint8_t hard = kind == NORM_NFC ? 0xCC : 0x80; /* a lead byte >= 0xCC starts a code point >= U+0300 */
    int opts = UTF8PROC_STABLE;
    switch (kind) {
    case NORM_NFC: opts |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    const uint8_t *u = (const uint8_t *)in->p;
    const size_t n = in->n;
    out->n = 0;
    bool ok = tok_buf_put(out, "", 0);
    for (size_t i = 0; ok && i < n;) {
        size_t h = i;
        while (h < n && u[h] < hard) h++;
        if (h == n) {
            ok = tok_buf_put(out, in->p + i, n - i);
            break;
        }
        size_t s = h, e = h;
        while (s > i && u[s - 1] >= 0x80) s--;
        if (s > i) s--; /* the ASCII character before the run */
        while (e < n && u[e] >= 0x80) e++;
        ok = tok_buf_put(out, in->p + i, s - i);
        utf8proc_uint8_t *res = NULL;
        const utf8proc_ssize_t len = utf8proc_map(u + s, (utf8proc_ssize_t)(e - s), &res, (utf8proc_option_t)opts);
        if (len < 0) {
            free(res);
            return fm_fail(err, FM_ERR_FORMAT, "tokenizer: unicode normalization failed: %s", utf8proc_errmsg(len));
        }
        ok = ok && tok_buf_put(out, res, (size_t)len);
        free(res);
        i = e;
    }
    return ok ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
}

/* A hostile tokenizer.json can stack normalizers that each double the text (40 Replace "a" -> "aa": 2^40 bytes for
 * one input character). The normalized text may grow to NORM_GROWTH x the input + NORM_SLACK bytes at most, well
 * above what real normalizers do (NFKC's widest expansion is 18 characters from one); beyond, encoding fails. */
enum { NORM_GROWTH = 64, NORM_SLACK = 4096 };

typedef struct replace_ctx {
    const tok_buf *in;
    tok_buf *out;
    const char *content;
    size_t done, limit;
    bool ok, too_long;
} replace_ctx;

static void replace_match(void *p, size_t start, size_t end) {
    replace_ctx *c = p;
    if (c->too_long || c->out->n > c->limit) { /* stop growing: the caller reports it */
        c->too_long = true;
        return;
    }
    c->ok &= tok_buf_put(c->out, c->in->p + c->done, start - c->done);
    c->ok &= tok_buf_put(c->out, c->content, strlen(c->content));
    c->done = end;
}

/* Replaces every match of re (or of the literal pat) in in by content, into out. md: NULL to allocate one. */
static fm_status replace_all(const char *pat, const pcre2_code *re, const char *content, const tok_buf *in,
                             tok_buf *out, size_t limit, fm_error *err) {
    out->n = 0;
    replace_ctx c = {in, out, content, 0, limit, true, false};
    if (!re) {
        const size_t pn = strlen(pat);
        for (size_t i = 0; pn && i + pn <= in->n && !c.too_long;) {
            const char *hit = tok_find(in->p + i, in->n - i, pat, pn);
            if (!hit) break;
            replace_match(&c, (size_t)(hit - in->p), (size_t)(hit - in->p) + pn);
            i = (size_t)(hit - in->p) + pn;
        }
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        if (!md) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
        fm_status st = tok_regex_each(re, in->p, in->n, md, replace_match, &c, err);
        pcre2_match_data_free(md);
        if (st) return st;
    }
    if (c.too_long) return FM_OK; /* out is past the limit: tok_normalize says so */
    c.ok &= tok_buf_put(out, in->p + c.done, in->n - c.done);
    return c.ok ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
}

bool tok_normalize_changes(const fm_tokenizer *t, const char *s, size_t n) {
    for (int i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind != NORM_NFC) return true;
    return t->n_norm > 0 && !below(s, n, 0x300);
}

fm_status tok_normalize(const fm_tokenizer *t, const char *s, size_t n, tok_buf *out, fm_error *err) {
    out->n = 0;
    if (!tok_buf_put(out, s, n)) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    tok_buf tmp = {0};
    fm_status st = FM_OK;
    const size_t limit = n > (SIZE_MAX - NORM_SLACK) / NORM_GROWTH ? SIZE_MAX : NORM_GROWTH * n + NORM_SLACK;
    for (int i = 0; !st && i < t->n_norm; i++) {
        const tok_norm *nm = &t->norm[i];
        switch (nm->kind) {
        case NORM_PREPEND: /* only a non-empty text gets the prefix */
            if (out->n == 0) continue;
            tmp.n = 0;
            if (!tok_buf_put(&tmp, nm->a, strlen(nm->a)) || !tok_buf_put(&tmp, out->p, out->n))
                st = fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
            break;
        case NORM_REPLACE: st = replace_all(nm->a, nm->re, nm->b, out, &tmp, limit, err); break;
        default: st = unicode_normal_form(nm->kind, out, &tmp, err); break;
        }
        if (!st && tmp.n > limit)
            st = fm_fail(err, FM_ERR_FORMAT,
                         "tokenizer: the normalizers of tokenizer.json grow %zu bytes of text past %zu bytes (at "
                         "step %d of %d): refused, as a normalizer chain that multiplies the text is malformed",
                         n, limit, i + 1, t->n_norm);
        if (!st) { /* the result becomes the input of the next step */
            tok_buf swap = *out;
            *out = tmp, tmp = swap;
        }
    }
    free(tmp.p);
    if (!st && !out->p && !tok_buf_put(out, "", 0)) st = fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    return st;
}
