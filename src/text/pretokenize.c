/* The pre-tokenizers of `tokenizers` that Qwen, GPT-2 and Llama/Mistral files use: Split (a regex or a literal,
 * with its five delimiter behaviours and invert), ByteLevel (add_prefix_space, the GPT-2 regex when use_regex; the
 * byte-to-character mapping itself is left to the BPE step, which reads bytes) and Metaspace. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

bool tok_spans_push(tok_spans *v, const char *s, size_t n, bool at_start) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        tok_span *p = realloc(v->p, cap * sizeof *p);
        if (!p) return false;
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = (tok_span){s, n, at_start};
    return true;
}

char *tok_arena_copy(tok_arena *a, const char *s, size_t n) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        char **p = realloc(a->blocks, cap * sizeof *p);
        if (!p) return NULL;
        a->blocks = p, a->cap = cap;
    }
    char *b = malloc(n + 1);
    if (!b) return NULL;
    if (n && s) memcpy(b, s, n);
    b[n] = '\0';
    a->blocks[a->n++] = b;
    return b;
}

void tok_arena_free(tok_arena *a) {
    for (size_t i = 0; i < a->n; i++) free(a->blocks[i]);
    free(a->blocks);
    a->blocks = NULL, a->n = a->cap = 0;
}

/* The pieces of a span at a pattern: matches and the text between them, in order (`tokenizers`' find_matches). */
typedef struct segs {
    struct seg {
        size_t s, e;
        bool match;
    } *p;
    size_t n, cap;
    size_t done;
    bool ok;
} segs;

static void seg_push(segs *v, size_t s, size_t e, bool match) {
    if (!v->ok) return;
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        struct seg *p = realloc(v->p, cap * sizeof *p);
        if (!p) {
            v->ok = false;
            return;
        }
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = (struct seg){s, e, match};
}

static void on_match(void *ctx, size_t start, size_t end) {
    segs *v = ctx;
    if (start > v->done) seg_push(v, v->done, start, false);
    seg_push(v, start, end, true);
    v->done = end;
}

static fm_status find_segments(const pcre2_code *re, const char *s, size_t n, bool invert, pcre2_match_data *md,
                               segs *v, fm_error *err) {
    v->n = 0, v->done = 0, v->ok = true;
    fm_status st = tok_regex_each(re, s, n, md, on_match, v, err);
    if (st) return st;
    if (v->done < n) seg_push(v, v->done, n, false);
    if (!v->ok) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    if (invert)
        for (size_t i = 0; i < v->n; i++) v->p[i].match = !v->p[i].match;
    return FM_OK;
}

/* Applies a delimiter behaviour to the segments of span and appends the resulting pieces to out. */
static bool split_by_mode(const tok_span *span, segs *v, tok_split_mode mode, tok_spans *out) {
    size_t k = 0; /* segments rewritten in place: (s, e, removed) */
    bool prev_match = false;
    switch (mode) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < v->n; i++) v->p[i].match = false;
        k = v->n;
        break;
    case SPLIT_REMOVED: k = v->n; break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < v->n; i++) {
            const bool m = v->p[i].match;
            if (m == prev_match && k > 0) v->p[k - 1].e = v->p[i].e;
            else v->p[k++] = (struct seg){v->p[i].s, v->p[i].e, false};
            prev_match = m;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < v->n; i++) {
            const bool m = v->p[i].match;
            if (m && !prev_match && k > 0) v->p[k - 1].e = v->p[i].e;
            else v->p[k++] = (struct seg){v->p[i].s, v->p[i].e, false};
            prev_match = m;
        }
        break;
    case SPLIT_MERGED_NEXT: /* the same from the right end */
        k = v->n;
        for (size_t i = v->n; i-- > 0;) {
            const bool m = v->p[i].match;
            if (m && !prev_match && k < v->n) v->p[k].s = v->p[i].s;
            else v->p[--k] = (struct seg){v->p[i].s, v->p[i].e, false};
            prev_match = m;
        }
        memmove(v->p, v->p + k, (v->n - k) * sizeof *v->p);
        k = v->n - k;
        break;
    }
    for (size_t i = 0; i < k; i++) {
        if (v->p[i].match || v->p[i].e == v->p[i].s) continue;
        if (!tok_spans_push(out, span->s + v->p[i].s, v->p[i].e - v->p[i].s, span->at_start && v->p[i].s == 0))
            return false;
    }
    return true;
}

static fm_status metaspace(const tok_pre *p, const tok_span *span, tok_spans *out, tok_arena *arena, segs *v,
                           pcre2_match_data *md, fm_error *err) {
    (void)md;
    tok_buf b = {0};
    const size_t rl = strlen(p->repl);
    bool ok = true;
    const bool starts = span->n >= rl && memcmp(span->s, p->repl, rl) == 0;
    /* the replacement of spaces comes first, so a leading space counts as a leading replacement */
    const bool starts_space = span->n > 0 && span->s[0] == ' ';
    if (!starts && !starts_space &&
        (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && span->at_start)))
        ok &= tok_buf_put(&b, p->repl, rl);
    for (size_t i = 0; ok && i < span->n; i++)
        ok &= span->s[i] == ' ' ? tok_buf_put(&b, p->repl, rl) : tok_buf_putc(&b, span->s[i]);
    char *s = ok ? tok_arena_copy(arena, b.p ? b.p : "", b.n) : NULL;
    const size_t n = b.n;
    free(b.p);
    if (!s) return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    const tok_span whole = {s, n, span->at_start};
    if (!p->split) return tok_spans_push(out, s, n, span->at_start) ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    /* split before each replacement character (MergedWithNext on a literal) */
    v->n = 0, v->done = 0, v->ok = true;
    for (size_t i = 0; i + rl <= n;) {
        if (memcmp(s + i, p->repl, rl) == 0) {
            on_match(v, i, i + rl);
            i += rl;
        } else i++;
    }
    if (v->done < n) seg_push(v, v->done, n, false);
    if (!v->ok || !split_by_mode(&whole, v, SPLIT_MERGED_NEXT, out))
        return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    return FM_OK;
}

fm_status tok_pretokenize(const fm_tokenizer *t, tok_span piece, tok_spans *words, tok_arena *arena,
                          pcre2_match_data *md, fm_error *err) {
    if (piece.n == 0) return FM_OK;
    if (t->n_pre == 0) return tok_spans_push(words, piece.s, piece.n, piece.at_start) ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    tok_spans cur = {0}, next = {0};
    segs v = {0};
    fm_status st = tok_spans_push(&cur, piece.s, piece.n, piece.at_start) ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < t->n_pre; i++) {
        const tok_pre *p = &t->pre[i];
        tok_spans *dst = i + 1 == t->n_pre ? words : &next; /* the last step writes the words */
        if (dst == &next) next.n = 0;
        for (size_t k = 0; !st && k < cur.n; k++) {
            tok_span sp = cur.p[k];
            switch (p->kind) {
            case PRE_SPLIT:
                st = find_segments(p->re, sp.s, sp.n, p->invert, md, &v, err);
                if (!st && !split_by_mode(&sp, &v, p->mode, dst)) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                break;
            case PRE_BYTE_LEVEL:
                if (p->add_prefix_space && sp.s[0] != ' ') {
                    char *s = tok_arena_copy(arena, NULL, 1 + sp.n);
                    if (!s) {
                        st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                        break;
                    }
                    s[0] = ' ';
                    memcpy(s + 1, sp.s, sp.n);
                    s[sp.n + 1] = '\0';
                    sp.s = s, sp.n++;
                }
                if (p->re) {
                    st = find_segments(p->re, sp.s, sp.n, false, md, &v, err);
                    if (!st && !split_by_mode(&sp, &v, SPLIT_ISOLATED, dst))
                        st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                } else if (!tok_spans_push(dst, sp.s, sp.n, sp.at_start))
                    st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                break;
            case PRE_METASPACE: st = metaspace(p, &sp, dst, arena, &v, md, err); break;
            }
        }
        tok_spans swap = cur;
        cur = next, next = swap;
    }
    free(cur.p), free(next.p), free(v.p);
    return st;
}
