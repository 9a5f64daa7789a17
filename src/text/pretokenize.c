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
    } * p;
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

/* One pre-tokenization in progress: each step hands its pieces to the next, the last one to word(). */
typedef struct pre_run {
    const fm_tokenizer *t;
    tok_arena *arena;
    pcre2_match_data *md;
    tok_word_fn word;
    void *ctx;
    fm_error *err;
} pre_run;

static fm_status step(pre_run *r, int i, tok_span sp);

/* A piece out of step i - 1: into step i, or a word after the last step. Empty pieces vanish (as in `tokenizers`). */
static fm_status emit(pre_run *r, int i, const char *s, size_t n, bool at_start) {
    if (n == 0) return FM_OK;
    if (i == r->t->n_pre) return r->word(r->ctx, s, n, r->err);
    return step(r, i, (tok_span){s, n, at_start});
}

/* Isolated and Removed need no look-ahead: pieces go on as the regex finds them. */
typedef struct stream_split {
    pre_run *r;
    int next;
    tok_span sp;
    bool keep_gaps, keep_matches;
    size_t done;
    fm_status st;
} stream_split;

static void on_stream_match(void *p, size_t start, size_t end) {
    stream_split *c = p;
    if (c->st) return;
    if (start > c->done && c->keep_gaps)
        c->st = emit(c->r, c->next, c->sp.s + c->done, start - c->done, c->sp.at_start && c->done == 0);
    if (!c->st && c->keep_matches)
        c->st = emit(c->r, c->next, c->sp.s + start, end - start, c->sp.at_start && start == 0);
    c->done = end;
}

static fm_status split_regex(pre_run *r, int i, const tok_span *sp, const pcre2_code *re, tok_split_mode mode,
                             bool invert) {
    if (mode == SPLIT_ISOLATED || mode == SPLIT_REMOVED) {
        stream_split c = {r, i + 1, *sp, true, true, 0, FM_OK};
        if (mode == SPLIT_REMOVED) c.keep_gaps = !invert, c.keep_matches = invert; /* invert: the matches are kept */
        fm_status st = tok_regex_each(re, sp->s, sp->n, r->md, on_stream_match, &c, r->err);
        if (!st) st = c.st;
        if (!st && c.done < sp->n && c.keep_gaps)
            st = emit(r, i + 1, sp->s + c.done, sp->n - c.done, sp->at_start && c.done == 0);
        return st;
    }
    segs v = {0};
    tok_spans out = {0};
    fm_status st = find_segments(re, sp->s, sp->n, invert, r->md, &v, r->err);
    if (!st && !split_by_mode(sp, &v, mode, &out)) st = fm_fail(r->err, FM_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t k = 0; !st && k < out.n; k++) st = emit(r, i + 1, out.p[k].s, out.p[k].n, out.p[k].at_start);
    free(v.p), free(out.p);
    return st;
}

/* Metaspace: spaces become the replacement character, which is prepended as the scheme says; with split, a piece
 * starts at each replacement character (MergedWithNext). */
static fm_status metaspace(pre_run *r, int i, const tok_pre *p, const tok_span *sp) {
    tok_buf b = {0};
    const size_t rl = strlen(p->repl);
    bool ok = true;
    const bool starts = sp->n >= rl && memcmp(sp->s, p->repl, rl) == 0;
    /* the replacement of spaces comes first, so a leading space counts as a leading replacement */
    const bool starts_space = sp->n > 0 && sp->s[0] == ' ';
    if (!starts && !starts_space && (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && sp->at_start)))
        ok &= tok_buf_put(&b, p->repl, rl);
    for (size_t k = 0; ok && k < sp->n; k++)
        ok &= sp->s[k] == ' ' ? tok_buf_put(&b, p->repl, rl) : tok_buf_putc(&b, sp->s[k]);
    char *s = ok ? tok_arena_copy(r->arena, b.p ? b.p : "", b.n) : NULL;
    const size_t n = b.n;
    free(b.p);
    if (!s) return fm_fail(r->err, FM_ERR_NOMEM, "tokenizer: out of memory");
    if (!p->split) return emit(r, i + 1, s, n, sp->at_start);
    size_t from = 0;
    fm_status st = FM_OK;
    for (size_t k = 1; !st && k + rl <= n; k++)
        if (memcmp(s + k, p->repl, rl) == 0)
            st = emit(r, i + 1, s + from, k - from, sp->at_start && from == 0), from = k;
    return st ? st : emit(r, i + 1, s + from, n - from, sp->at_start && from == 0);
}

static fm_status step(pre_run *r, int i, tok_span sp) {
    const tok_pre *p = &r->t->pre[i];
    switch (p->kind) {
    case PRE_SPLIT: return split_regex(r, i, &sp, p->re, p->mode, p->invert);
    case PRE_BYTE_LEVEL:
        if (p->add_prefix_space && sp.s[0] != ' ') {
            char *s = tok_arena_copy(r->arena, NULL, 1 + sp.n);
            if (!s) return fm_fail(r->err, FM_ERR_NOMEM, "tokenizer: out of memory");
            s[0] = ' ';
            memcpy(s + 1, sp.s, sp.n);
            s[sp.n + 1] = '\0';
            sp.s = s, sp.n++;
        }
        return p->re ? split_regex(r, i, &sp, p->re, SPLIT_ISOLATED, false) : emit(r, i + 1, sp.s, sp.n, sp.at_start);
    case PRE_METASPACE: return metaspace(r, i, p, &sp);
    }
    return FM_OK;
}

fm_status tok_pretokenize(const fm_tokenizer *t, tok_span piece, tok_word_fn word, void *ctx, tok_arena *arena,
                          pcre2_match_data *md, fm_error *err) {
    pre_run r = {t, arena, md, word, ctx, err};
    return emit(&r, 0, piece.s, piece.n, piece.at_start);
}
