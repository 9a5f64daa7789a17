/* The token matcher (token_matcher.h): a set of pushdown stacks over grammar positions, advanced byte by byte, and
 * the vocabulary trie walked against it.
 *
 * A stack is its top (a position in elems[], the native lexer's state there) and a chain of return frames, shared
 * between stacks and kept in one growing array (frames are immutable; a pop follows the parent link). The current
 * set sits at the front of the pool; a mask walk appends each trie depth's set after it and drops it on the way
 * back, frames included. */
#include <stdlib.h>
#include <string.h>

#include "text/json_lexeme.h"
#include "text/mask_cache.h"
#include "text/token_vocab_internal.h"
#include "util/status.h"

#define MAX_STACKS 256  /* per set: an ambiguous grammar beyond this loses parses (never a JSON Schema's) */
#define MAX_DEPTH 512   /* return frames per stack: nesting deeper than this is not allowed */
#define MAX_EXPAND 256  /* rule references followed without a byte: a cycle of them ends here */
#define GC_FRAMES 65536 /* frames kept across tokens before the unreachable ones are dropped */
#define CACHE_N 8       /* string masks kept per matcher (keys, values, at each depth) */
#define CACHE_KEY 512   /* positions in a cache key at most (longer: not cached) */

typedef struct m_frame {
    int32_t pos, parent, depth;
} m_frame;

typedef struct m_stack {
    int32_t pos;    /* the element to match next; -1: the grammar is complete */
    int32_t parent; /* the return frame, -1: none */
    int32_t depth;  /* frames in the chain */
    int32_t pad;    /* zero: stacks are compared with memcmp */
    lex_state lex;  /* the native lexer's state when elems[pos] is one */
} m_stack;

struct fm_matcher {
    const fm_grammar *g;
    const fm_token_vocab *v;
    int32_t *end_ids, n_end;
    m_frame *frames;
    int32_t n_frames, cap_frames;
    m_stack *pool;
    int32_t n_pool, cap_pool;
    int32_t n_cur;     /* the current set: pool[0..n_cur) */
    int32_t set_start; /* the set being built: pool[set_start..n_pool) */
    bool oom;
    bool ended; /* an end id was accepted */
    /* Inside a string with no length bound, its minimum length reached and no key to avoid, the mask depends only on
       the stacks' positions (each stack's and its return frames'): masks are kept under that key, so the rest of a
       string, and the next string at the same place in the grammar, copy it. */
    struct m_cache {
        uint32_t *words;
        int32_t key[CACHE_KEY];
        int32_t n_key; /* -1: empty */
    } cache[CACHE_N];
    int32_t cache_next;     /* the entry replaced next */
    int32_t fingerprint[4]; /* the grammar's (mask_cache.h): the shared masks' keys start with it */
    fm_token_constraint self;
};

static int32_t new_frame(fm_matcher *m, int32_t pos, int32_t parent, int32_t depth) {
    if (m->n_frames == m->cap_frames) {
        const int32_t cap = m->cap_frames ? 2 * m->cap_frames : 1024;
        m_frame *p = realloc(m->frames, (size_t)cap * sizeof *p);
        if (!p) return m->oom = true, -1;
        m->frames = p, m->cap_frames = cap;
    }
    m->frames[m->n_frames] = (m_frame){pos, parent, depth};
    return m->n_frames++;
}

static void add(fm_matcher *m, const m_stack *s) {
    for (int32_t i = m->set_start; i < m->n_pool; i++)
        if (!memcmp(&m->pool[i], s, sizeof *s)) return;
    if (m->n_pool - m->set_start >= MAX_STACKS) return;
    if (m->n_pool == m->cap_pool) {
        const int32_t cap = m->cap_pool ? 2 * m->cap_pool : 256;
        m_stack *p = realloc(m->pool, (size_t)cap * sizeof *p);
        if (!p) {
            m->oom = true;
            return;
        }
        m->pool = p, m->cap_pool = cap;
    }
    m->pool[m->n_pool++] = *s;
}

/* Adds to the set being built every stack s can become before its next byte: rule references opened (one stack per
 * alternative), finished rules returned from, optional whitespace both taken and skipped. */
static void expand(fm_matcher *m, m_stack s, int guard) {
    const fm_grammar *g = m->g;
    if (guard > MAX_EXPAND) return;
    for (;;) {
        if (s.pos < 0) {
            memset(&s.lex, 0, sizeof s.lex);
            add(m, &s);
            return;
        }
        const g_elem *e = &g->elems[s.pos];
        switch (e->kind) {
        case G_END:
            if (s.parent < 0) s.pos = -1;
            else s.pos = m->frames[s.parent].pos, s.depth--, s.parent = m->frames[s.parent].parent;
            continue;
        case G_REF: {
            int32_t ret = s.parent, depth = s.depth;
            if (g->elems[s.pos + 1].kind != G_END) { /* a call in tail position needs no frame */
                if (s.depth >= MAX_DEPTH) return;
                ret = new_frame(m, s.pos + 1, s.parent, s.depth);
                if (ret < 0) return;
                depth++;
            }
            for (int32_t a = g->rule_alt[e->arg]; a < g->rule_alt[e->arg + 1]; a++) {
                m_stack t = {g->alt_pos[a], ret, depth, 0, {0}};
                expand(m, t, guard + 1);
            }
            return;
        }
        case G_BYTES:
            memset(&s.lex, 0, sizeof s.lex);
            add(m, &s);
            return;
        case G_WS: /* may match nothing: also go on past it */
            lex_init(g, e, &s.lex);
            add(m, &s);
            s.pos++;
            continue;
        default:
            lex_init(g, e, &s.lex);
            add(m, &s);
            return;
        }
    }
}

/* The set pool[off..off+n) advanced by byte b, appended at the pool's end; returns its size. */
static int32_t step_set(fm_matcher *m, int32_t off, int32_t n, uint8_t b) {
    const fm_grammar *g = m->g;
    const int32_t saved = m->set_start;
    m->set_start = m->n_pool;
    for (int32_t i = 0; i < n; i++) {
        m_stack s = m->pool[off + i];
        if (s.pos < 0) continue;
        const g_elem *e = &g->elems[s.pos];
        if (e->kind == G_BYTES) {
            if (!g_byteset_has(&g->sets[e->arg], b)) continue;
            s.pos++;
            expand(m, s, 0);
            continue;
        }
        const int r = lex_step(g, e, &s.lex, b);
        if (r & LEX_MORE) add(m, &s);
        if (r & LEX_END) s.pos++, expand(m, s, 0);
    }
    const int32_t k = m->n_pool - m->set_start;
    m->set_start = saved;
    return k;
}

static void set_ids(const t_trie *t, const t_node *n, uint32_t *words) {
    for (int32_t j = 0; j < n->n_ids; j++) {
        const int32_t id = t->ids[n->first_id + j];
        words[id >> 5] |= 1u << (id & 31);
    }
}

/* Every token under node whose bytes keep some stack of pool[off..off+n) alive. */
static void walk(fm_matcher *m, const t_trie *t, int32_t node, int32_t off, int32_t n, uint32_t *words) {
    for (int32_t c = t->nodes[node].child; c >= 0; c = t->nodes[c].sibling) {
        const t_node *cn = &t->nodes[c];
        const int32_t frames = m->n_frames, at = m->n_pool;
        const int32_t k = step_set(m, off, n, cn->byte);
        if (k) {
            set_ids(t, cn, words);
            if (cn->child >= 0) walk(m, t, c, at, k, words);
        }
        m->n_pool = at, m->n_frames = frames;
    }
}

/* Every stack inside a string whose next masks cannot change (no maxLength, minLength met, no excluded keys). */
static bool stable_string(const fm_matcher *m) {
    for (int32_t i = 0; i < m->n_cur; i++) {
        const m_stack *s = &m->pool[i];
        const g_string *p = &m->g->strings[m->g->elems[s->pos].arg];
        if (p->max_len != UINT32_MAX || s->lex.s.count < p->min_len || p->excl_n) return false;
    }
    return true;
}

/* The current set's positions, each stack's then its frames', -1 after each stack; -1 when longer than the cap. */
static int32_t cache_key(const fm_matcher *m, int32_t *key) {
    int32_t n = 0;
    for (int32_t i = 0; i < m->n_cur; i++) {
        if (n + 2 > CACHE_KEY) return -1;
        key[n++] = m->pool[i].pos;
        for (int32_t f = m->pool[i].parent; f >= 0; f = m->frames[f].parent) {
            if (n + 2 > CACHE_KEY) return -1;
            key[n++] = m->frames[f].pos;
        }
        key[n++] = -1;
    }
    return n;
}

static bool cached(const fm_matcher *m, const int32_t *key, int32_t n, uint32_t *words) {
    for (int c = 0; n >= 0 && c < CACHE_N; c++)
        if (m->cache[c].n_key == n && !memcmp(m->cache[c].key, key, (size_t)n * sizeof *key)) {
            memcpy(words, m->cache[c].words, (size_t)m->v->words * sizeof *words);
            return true;
        }
    return false;
}

static void keep(fm_matcher *m, const int32_t *key, int32_t n, const uint32_t *words) {
    struct m_cache *c = &m->cache[m->cache_next];
    if (n < 0 || (!c->words && !(c->words = malloc((size_t)m->v->words * sizeof *c->words)))) return;
    memcpy(c->key, key, (size_t)n * sizeof *key);
    memcpy(c->words, words, (size_t)m->v->words * sizeof *words);
    c->n_key = n;
    m->cache_next = (m->cache_next + 1) % CACHE_N;
}

/* A stack's lexer state as far as the mask can tell it apart, as words: an unbounded string's count past its
 * minLength changes nothing, nor does the content's hash without excluded keys, nor an unbounded number's digit
 * values. The words that follow a position depend only on its element. */
static int32_t lex_key(const fm_grammar *g, const m_stack *s, int32_t *out) {
    if (s->pos < 0) return 0;
    const g_elem *e = &g->elems[s->pos];
    switch (e->kind) {
    case G_WS: out[0] = (int32_t)s->lex.ws; return 1;
    case G_STRING: {
        const g_string *p = &g->strings[e->arg];
        const lex_string *l = &s->lex.s;
        out[0] = (int32_t)(p->max_len == UINT32_MAX && l->count > p->min_len ? p->min_len : l->count);
        out[1] = l->need | l->lo << 8 | l->hi << 16 | l->esc << 24;
        if (!p->excl_n) return 2;
        out[2] = (int32_t)(uint32_t)l->hash, out[3] = (int32_t)(uint32_t)(l->hash >> 32);
        return 4;
    }
    case G_NUMBER: {
        const g_number *p = &g->numbers[e->arg];
        const lex_number *l = &s->lex.n;
        out[0] = l->phase | l->neg << 8 | l->n_int << 16 | l->n_frac << 24;
        out[1] = l->n_exp;
        if (!p->has_min && !p->has_max) return 2;
        memcpy(out + 2, &l->ival, sizeof l->ival), memcpy(out + 4, &l->fval, sizeof l->fval);
        return 6;
    }
    default: return 0;
    }
}

/* The shared masks' key of the current state: the grammar's fingerprint, the end ids, then each stack (its position,
 * its lexer's words, its return frames' positions, -1); -1 when longer than MASK_CACHE_KEY_MAX. */
static int32_t state_key(const fm_matcher *m, int32_t *key) {
    if (5 + m->n_end > MASK_CACHE_KEY_MAX) return -1;
    int32_t n = 0;
    for (int i = 0; i < 4; i++) key[n++] = m->fingerprint[i];
    key[n++] = m->n_end;
    for (int32_t i = 0; i < m->n_end; i++) key[n++] = m->end_ids[i];
    for (int32_t i = 0; i < m->n_cur; i++) {
        if (n + 8 > MASK_CACHE_KEY_MAX) return -1;
        key[n++] = m->pool[i].pos;
        n += lex_key(m->g, &m->pool[i], key + n);
        for (int32_t f = m->pool[i].parent; f >= 0; f = m->frames[f].parent) {
            if (n + 2 > MASK_CACHE_KEY_MAX) return -1;
            key[n++] = m->frames[f].pos;
        }
        key[n++] = -1;
    }
    return n;
}

bool fm_matcher_done(const fm_matcher *m) {
    for (int32_t i = 0; i < m->n_cur; i++)
        if (m->pool[i].pos < 0) return true;
    return false;
}

bool fm_matcher_finished(const fm_matcher *m) { return m->ended || (m->n_cur == 1 && m->pool[0].pos < 0); }

void fm_matcher_fill_mask(fm_matcher *m, uint32_t *words) {
    const fm_token_vocab *v = m->v;
    memset(words, 0, (size_t)v->words * sizeof *words);
    if (m->ended) return;
    if (fm_matcher_done(m))
        for (int32_t i = 0; i < m->n_end; i++) words[m->end_ids[i] >> 5] |= 1u << (m->end_ids[i] & 31);
    if (fm_matcher_finished(m)) return;
    /* inside a string, at a character boundary, in every parse: the plain-string tokens by their character count,
       then a walk of the others only */
    bool strings = m->n_cur > 0;
    uint32_t room = 0;
    for (int32_t i = 0; i < m->n_cur && strings; i++) {
        const m_stack *s = &m->pool[i];
        strings = s->pos >= 0 && m->g->elems[s->pos].kind == G_STRING && lex_string_at_boundary(&s->lex);
        if (strings) {
            const uint32_t r = lex_string_room(m->g, &m->g->elems[s->pos], &s->lex);
            if (r > room) room = r;
        }
    }
    const bool stable = strings && stable_string(m);
    int32_t key[CACHE_KEY], n_key = stable ? cache_key(m, key) : -1;
    if (stable && cached(m, key, n_key, words)) return;
    int32_t shared[MASK_CACHE_KEY_MAX]; /* another matcher's mask (or this one's, earlier) of an equal state */
    const int32_t n_shared = v->cache ? state_key(m, shared) : -1;
    if (n_shared >= 0 && fm_mask_cache_get(v->cache, shared, n_shared, words)) {
        if (stable) keep(m, key, n_key, words);
        return;
    }
    if (strings) {
        const uint32_t k = room > VOCAB_PURE_MAX ? VOCAB_PURE_MAX : room;
        const uint32_t *row = v->pure_upto + (size_t)k * v->words;
        for (int32_t w = 0; w < v->words; w++) words[w] |= row[w];
        /* a token of c characters is valid when some parse has room for c: the widest parse's row */
    }
    walk(m, strings ? &v->impure : &v->all, 0, 0, m->n_cur, words);
    m->set_start = m->n_cur;
    if (stable) keep(m, key, n_key, words);
    if (n_shared >= 0 && !m->oom) fm_mask_cache_put(v->cache, shared, n_shared, words); /* never a partial mask */
}

/* Replaces the current set by its advance over bytes; false (unchanged) when some byte kills every stack. */
static bool advance(fm_matcher *m, const uint8_t *b, size_t n) {
    const int32_t frames = m->n_frames;
    int32_t off = 0, k = m->n_cur;
    for (size_t i = 0; i < n && k; i++) {
        const int32_t at = m->n_pool;
        k = step_set(m, off, k, b[i]);
        off = at;
    }
    if (!k || m->oom) {
        m->n_pool = m->n_cur, m->n_frames = frames;
        return false;
    }
    memmove(m->pool, m->pool + off, (size_t)k * sizeof *m->pool);
    m->n_pool = m->n_cur = k;
    return true;
}

/* Drops the frames no current stack reaches (their chains are copied, order kept, parents first). */
static void collect(fm_matcher *m) {
    if (m->n_frames < GC_FRAMES) return;
    int32_t *map = malloc((size_t)m->n_frames * sizeof *map);
    m_frame *keep = malloc((size_t)m->n_frames * sizeof *keep);
    if (!map || !keep) {
        free(map), free(keep);
        return;
    }
    for (int32_t i = 0; i < m->n_frames; i++) map[i] = -1;
    for (int32_t i = 0; i < m->n_cur; i++) /* mark */
        for (int32_t f = m->pool[i].parent; f >= 0 && map[f] < 0; f = m->frames[f].parent) map[f] = 0;
    int32_t n = 0;
    for (int32_t f = 0; f < m->n_frames; f++) /* parents precede children: one pass renumbers */
        if (map[f] == 0) {
            keep[n] = m->frames[f];
            keep[n].parent = keep[n].parent >= 0 ? map[keep[n].parent] : -1;
            map[f] = n++;
        }
    for (int32_t i = 0; i < m->n_cur; i++)
        if (m->pool[i].parent >= 0) m->pool[i].parent = map[m->pool[i].parent];
    memcpy(m->frames, keep, (size_t)n * sizeof *keep);
    m->n_frames = n;
    free(map), free(keep);
}

bool fm_matcher_accept_bytes(fm_matcher *m, const void *bytes, size_t n) {
    if (m->ended) return false;
    const bool ok = advance(m, bytes, n);
    if (ok) collect(m);
    return ok;
}

bool fm_matcher_accept(fm_matcher *m, int32_t id) {
    if (m->ended || id < 0 || id >= m->v->n_ids) return false;
    for (int32_t i = 0; i < m->n_end; i++)
        if (m->end_ids[i] == id) {
            if (!fm_matcher_done(m)) return false;
            m->ended = true;
            return true;
        }
    if (m->v->special[id]) return false;
    uint32_t len;
    const uint8_t *b = fm_token_vocab_bytes(m->v, id, &len);
    return len > 0 && fm_matcher_accept_bytes(m, b, len);
}

void fm_matcher_free(fm_matcher *m) {
    if (!m) return;
    for (int c = 0; c < CACHE_N; c++) free(m->cache[c].words);
    free(m->end_ids), free(m->frames), free(m->pool), free(m);
}

fm_status fm_matcher_create(const fm_grammar *g, const fm_token_vocab *v, const int32_t *end_ids, int32_t n_end,
                            fm_matcher **out, fm_error *err) {
    *out = NULL;
    if (!g || !g->finished) return fm_fail(err, FM_ERR_USAGE, "the grammar is not finished (fm_grammar_finish)");
    if (n_end < 1 || !end_ids) return fm_fail(err, FM_ERR_USAGE, "constrained decoding needs at least one end id");
    for (int32_t i = 0; i < n_end; i++)
        if (end_ids[i] < 0 || end_ids[i] >= v->n_ids)
            return fm_fail(err, FM_ERR_USAGE, "end id %d is outside the vocabulary of %d", end_ids[i], v->n_ids);
    fm_matcher *m = calloc(1, sizeof *m);
    if (!m || !(m->end_ids = malloc((size_t)n_end * sizeof *m->end_ids))) {
        free(m);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for a matcher");
    }
    memcpy(m->end_ids, end_ids, (size_t)n_end * sizeof *end_ids);
    m->n_end = n_end, m->g = g, m->v = v;
    fm_grammar_fingerprint(g, m->fingerprint);
    for (int c = 0; c < CACHE_N; c++) m->cache[c].n_key = -1;
    m->set_start = 0;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        expand(m, (m_stack){g->alt_pos[a], -1, 0, 0, {0}}, 0);
    m->n_cur = m->n_pool;
    if (m->oom || !m->n_cur) {
        const bool oom = m->oom;
        fm_matcher_free(m);
        return oom ? fm_fail(err, FM_ERR_NOMEM, "out of memory for a matcher")
                   : fm_fail(err, FM_ERR_USAGE, "the grammar matches nothing");
    }
    *out = m;
    return FM_OK;
}

static void constraint_mask(void *user, uint32_t *words, int32_t vocab) {
    fm_matcher *m = user;
    if (vocab == m->v->n_ids) {
        fm_matcher_fill_mask(m, words);
        return;
    }
    /* a model vocabulary other than the matcher's: ids past the matcher's are never allowed */
    const int32_t w = (vocab + 31) / 32;
    memset(words, 0, (size_t)w * sizeof *words);
    uint32_t *tmp = malloc((size_t)m->v->words * sizeof *tmp);
    if (!tmp) return;
    fm_matcher_fill_mask(m, tmp);
    for (int32_t i = 0; i < vocab && i < m->v->n_ids; i++)
        if ((tmp[i >> 5] >> (i & 31)) & 1u) words[i >> 5] |= 1u << (i & 31);
    free(tmp);
}

static bool constraint_accept(void *user, int32_t id) { return fm_matcher_accept(user, id); }

fm_token_constraint fm_matcher_constraint(fm_matcher *m) {
    return (fm_token_constraint){m, constraint_mask, constraint_accept};
}
