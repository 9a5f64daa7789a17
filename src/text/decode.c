/* Ids to text, as `tokenizers`' decode: each id becomes its token string (an added token's content first), special
 * ones dropped when asked, then the decoder chain (Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace) runs
 * over the list of strings, which is finally joined; without a decoder the tokens are joined with spaces. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

/* A list of strings in one buffer. */
typedef struct strlist {
    tok_buf buf;
    struct str_ref {
        size_t off, len;
    } * s;
    size_t n, cap;
    bool ok;
} strlist;

static void sl_add(strlist *l, const char *s, size_t n) {
    if (!l->ok) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct str_ref *p = realloc(l->s, cap * sizeof *p);
        if (!p) {
            l->ok = false;
            return;
        }
        l->s = p, l->cap = cap;
    }
    l->s[l->n] = (struct str_ref){l->buf.n, n};
    l->ok &= tok_buf_put(&l->buf, s, n);
    l->n++;
}

/* Extends the last string (there must be one). */
static void sl_append(strlist *l, const char *s, size_t n) {
    if (!l->ok) return;
    l->ok &= tok_buf_put(&l->buf, s, n);
    l->s[l->n - 1].len += n;
}

static const char *sl_str(const strlist *l, size_t i) { return l->buf.p + l->s[i].off; }

static void sl_free(strlist *l) {
    free(l->buf.p), free(l->s);
    memset(l, 0, sizeof *l);
}

static void replace_in(const tok_dec *d, const char *s, size_t n, strlist *out) {
    sl_add(out, "", 0);
    const size_t pn = strlen(d->a), cn = strlen(d->b);
    size_t done = 0;
    for (size_t i = 0; pn && i + pn <= n;) {
        const char *hit = tok_find(s + i, n - i, d->a, pn);
        if (!hit) break;
        const size_t at = (size_t)(hit - s);
        sl_append(out, s + done, at - done);
        sl_append(out, d->b, cn);
        done = i = at + pn;
    }
    sl_append(out, s + done, n - done);
}

/* <0xNN> as a byte, or -1 (`tokenizers` checks the length, the "<0x" prefix and '>' and parses two hex digits). */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        const char c = s[k];
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A run of byte tokens: its text when valid UTF-8, else one U+FFFD per byte (as `tokenizers`' ByteFallback). */
static void flush_bytes(tok_buf *run, strlist *out) {
    if (!run->n) return;
    if (tok_utf8_valid(run->p, run->n)) sl_add(out, run->p, run->n);
    else
        for (size_t k = 0; k < run->n; k++) sl_add(out, "\xEF\xBF\xBD", 3);
    run->n = 0;
}

static fm_status apply_step(const tok_dec *d, const strlist *in, strlist *out, fm_error *err) {
    tok_buf run = {0};
    switch (d->kind) {
    case DEC_REPLACE:
        if (d->re) return fm_fail(err, FM_ERR_UNSUPPORTED, "tokenizer.json: decoder Replace with a Regex pattern");
        for (size_t i = 0; i < in->n; i++) replace_in(d, sl_str(in, i), in->s[i].len, out);
        break;
    case DEC_BYTE_FALLBACK:
        for (size_t i = 0; i < in->n; i++) {
            const int b = byte_token(sl_str(in, i), in->s[i].len);
            if (b >= 0) {
                const char c = (char)b;
                out->ok &= tok_buf_put(&run, &c, 1);
                continue;
            }
            flush_bytes(&run, out);
            sl_add(out, sl_str(in, i), in->s[i].len);
        }
        flush_bytes(&run, out);
        break;
    case DEC_FUSE:
        sl_add(out, "", 0);
        for (size_t i = 0; i < in->n; i++) sl_append(out, sl_str(in, i), in->s[i].len);
        break;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = sl_str(in, i);
            size_t a = 0, b = in->s[i].len;
            char c[4];
            const size_t cl = (size_t)tok_utf8_encode(d->strip_cp, c);
            for (int32_t k = 0; k < d->strip_start && b - a >= cl && memcmp(s + a, c, cl) == 0; k++) a += cl;
            for (int32_t k = 0; k < d->strip_stop && b - a >= cl && memcmp(s + b - cl, c, cl) == 0; k++) b -= cl;
            sl_add(out, s + a, b - a);
        }
        break;
    case DEC_BYTE_LEVEL: {
        tok_buf bytes = {0};
        for (size_t i = 0; i < in->n; i++) {
            const uint8_t *s = (const uint8_t *)sl_str(in, i);
            const size_t n = in->s[i].len, mark = bytes.n;
            bool mapped = true;
            for (size_t k = 0; mapped && k < n;) {
                const int len = tok_utf8_len(s + k, n - k);
                const int b = len ? tok_cp_to_byte(tok_utf8_decode(s + k, len)) : -1;
                if (b < 0) mapped = false;
                else out->ok &= tok_buf_putc(&bytes, (char)b), k += (size_t)len;
            }
            if (!mapped) { /* a token outside the alphabet stands for its own bytes */
                bytes.n = mark;
                out->ok &= tok_buf_put(&bytes, s, n);
            }
        }
        tok_buf text = {0};
        out->ok &= tok_utf8_lossy(bytes.p ? bytes.p : "", bytes.n, &text);
        sl_add(out, text.p ? text.p : "", text.n);
        free(bytes.p), free(text.p);
        break;
    }
    case DEC_METASPACE: {
        const size_t rl = strlen(d->repl);
        for (size_t i = 0; i < in->n; i++) {
            const char *s = sl_str(in, i);
            const size_t n = in->s[i].len;
            sl_add(out, "", 0);
            size_t done = 0;
            for (size_t k = 0; rl && k + rl <= n;) {
                if (memcmp(s + k, d->repl, rl) != 0) {
                    k++;
                    continue;
                }
                sl_append(out, s + done, k - done);
                if (!(i == 0 && d->scheme != PREPEND_NEVER)) sl_append(out, " ", 1);
                done = k = k + rl;
            }
            sl_append(out, s + done, n - done);
        }
        break;
    }
    }
    free(run.p);
    return out->ok ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
}

fm_status fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, char **text,
                              size_t *len, fm_error *err) {
    *text = NULL, *len = 0;
    if (!t || (n && !ids) || n < 0) return fm_fail(err, FM_ERR_USAGE, "fm_tokenizer_decode: no tokenizer or no ids");
    strlist a = {.ok = true}, b = {.ok = true};
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_str[id]) {
            sl_free(&a);
            return fm_fail(err, FM_ERR_FORMAT, "token id %d (at index %lld) is not in the vocabulary (%d ids)", id,
                           (long long)i, t->n_ids);
        }
        if (skip_special && t->id_special[id]) continue;
        sl_add(&a, t->id_str[id], t->id_len[id]);
    }
    fm_status st = a.ok ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    for (int k = 0; !st && k < t->n_dec; k++) {
        b.n = 0, b.buf.n = 0;
        st = apply_step(&t->dec[k], &a, &b, err);
        strlist swap = a;
        a = b, b = swap;
    }
    tok_buf joined = {0};
    for (size_t i = 0; !st && i < a.n; i++) {
        if (!t->has_decoder && i > 0 && !tok_buf_putc(&joined, ' ')) st = FM_ERR_NOMEM;
        if (!st && !tok_buf_put(&joined, sl_str(&a, i), a.s[i].len)) st = FM_ERR_NOMEM;
    }
    if (!st && !joined.p && !tok_buf_put(&joined, "", 0)) st = FM_ERR_NOMEM;
    sl_free(&a), sl_free(&b);
    if (st) {
        free(joined.p);
        return st == FM_ERR_NOMEM ? fm_fail(err, st, "tokenizer: out of memory") : st;
    }
    *text = joined.p, *len = joined.n;
    return FM_OK;
}
