/* The BPE model of `tokenizers` on one word: characters (or bytes, for byte-level vocabularies) become symbols,
 * unknown ones go to <0xNN> byte tokens (byte_fallback) or the unk token, then the adjacent pair of lowest merge
 * rank is merged, leftmost first, until no pair merges (a min-heap of candidate pairs with lazy deletion, as
 * `tokenizers`' Word::merge_all, so long words cost O(n log n)). Results are cached per encode call by word. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

/* ---- per-call word cache: word bytes -> ids ---- */
#define CACHE_MAX_WORD 256 /* longer words are not cached (as `tokenizers`) */
#define CACHE_MAX_ENTRIES (1u << 20)

struct tok_word_cache {
    struct cache_slot {
        uint64_t hash;
        uint32_t key_off, key_len, ids_off, n_ids; /* n_ids == UINT32_MAX: empty */
    } * slots;
    uint32_t cap, n;
    tok_buf keys;
    tok_ids ids;
};

tok_word_cache *tok_word_cache_new(void) {
    tok_word_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cap = 1024;
    c->slots = malloc(c->cap * sizeof *c->slots);
    if (!c->slots) return free(c), NULL;
    for (uint32_t i = 0; i < c->cap; i++) c->slots[i].n_ids = UINT32_MAX;
    return c;
}

void tok_word_cache_free(tok_word_cache *c) {
    if (!c) return;
    free(c->slots), free(c->keys.p), free(c->ids.p);
    free(c);
}

static struct cache_slot *cache_find(tok_word_cache *c, const char *w, uint32_t n, uint64_t h) {
    for (uint32_t i = (uint32_t)h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        struct cache_slot *s = &c->slots[i];
        if (s->n_ids == UINT32_MAX) return s;
        if (s->hash == h && s->key_len == n && memcmp(c->keys.p + s->key_off, w, n) == 0) return s;
    }
}

static void cache_insert(tok_word_cache *c, const char *w, uint32_t n, uint64_t h, const int32_t *ids, uint32_t k) {
    if (c->n >= CACHE_MAX_ENTRIES || c->keys.n + n > UINT32_MAX / 2 || (uint64_t)c->ids.n + k > UINT32_MAX / 2) return;
    if (2 * (c->n + 1) > c->cap) { /* grow: rehash into twice the slots */
        struct cache_slot *old = c->slots;
        const uint32_t old_cap = c->cap;
        struct cache_slot *bigger = malloc((size_t)old_cap * 2 * sizeof *bigger);
        if (!bigger) return;
        c->slots = bigger, c->cap = old_cap * 2;
        for (uint32_t i = 0; i < c->cap; i++) c->slots[i].n_ids = UINT32_MAX;
        for (uint32_t i = 0; i < old_cap; i++) {
            if (old[i].n_ids == UINT32_MAX) continue;
            uint32_t j = (uint32_t)old[i].hash & (c->cap - 1);
            while (c->slots[j].n_ids != UINT32_MAX) j = (j + 1) & (c->cap - 1);
            c->slots[j] = old[i];
        }
        free(old);
    }
    struct cache_slot *s = cache_find(c, w, n, h);
    if (s->n_ids != UINT32_MAX) return;
    const uint32_t key_off = (uint32_t)c->keys.n, ids_off = (uint32_t)c->ids.n;
    if (!tok_buf_put(&c->keys, w, n)) return;
    for (uint32_t i = 0; i < k; i++)
        if (!tok_ids_push(&c->ids, ids[i])) return;
    s->hash = h, s->key_off = key_off, s->key_len = n, s->ids_off = ids_off, s->n_ids = k;
    c->n++;
}

/* ---- the merge loop ---- */
typedef struct symbol {
    int32_t id, prev, next; /* prev/next: neighbours in the word, -1 at the ends; id -1: merged away */
} symbol;

typedef struct merge_cand {
    int32_t rank, pos, id;
} merge_cand;

static bool cand_less(const merge_cand *a, const merge_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(merge_cand *h, int32_t *n, merge_cand c) {
    int32_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, int32_t *n) {
    merge_cand top = h[0], last = h[--*n];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c], i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const fm_tokenizer *t, const symbol *sym, int32_t pos, merge_cand *heap, int32_t *nh) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    const struct tok_pair_slot *m = tok_pairmap_get(&t->merges, sym[pos].id, sym[next].id);
    if (m) heap_push(heap, nh, (merge_cand){m->rank, pos, m->id});
}

static void merge_all(const fm_tokenizer *t, symbol *sym, int32_t n, merge_cand *heap) {
    int32_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, sym, i, heap, &nh);
    while (nh > 0) {
        const merge_cand top = heap_pop(heap, &nh);
        symbol *s = &sym[top.pos];
        if (s->id < 0 || s->next < 0) continue;
        const struct tok_pair_slot *m = tok_pairmap_get(&t->merges, s->id, sym[s->next].id);
        if (!m || m->id != top.id) continue; /* a stale candidate: one of its symbols changed */
        const int32_t right = s->next;
        s->id = top.id;
        s->next = sym[right].next;
        sym[right].id = -1;
        if (s->next >= 0) sym[s->next].prev = top.pos;
        if (s->prev >= 0) try_pair(t, sym, s->prev, heap, &nh);
        try_pair(t, sym, top.pos, heap, &nh);
    }
}

/* ---- symbols of a word ---- */
typedef struct word_builder {
    symbol *sym;
    int32_t n;
    int32_t unk_pending; /* an unk symbol not yet added (fuse_unk joins a run of unknown characters) */
} word_builder;

static void add_symbol(word_builder *wb, int32_t id) {
    wb->sym[wb->n] = (symbol){id, wb->n - 1, -1};
    if (wb->n > 0) wb->sym[wb->n - 1].next = wb->n;
    wb->n++;
}

/* A character that is not in the vocabulary, as `tokenizers` treats it: its bytes as <0xNN> tokens when
 * byte_fallback and all exist (a pending unk is not flushed first, as there), else the unk token (fused with a
 * preceding unk when fuse_unk), else nothing. */
static void add_unknown(const fm_tokenizer *t, word_builder *wb, const uint8_t *c, int len) {
    if (t->byte_fallback) {
        bool all = true;
        for (int k = 0; k < len; k++) all &= t->byte_ids[c[k]] >= 0;
        if (all) {
            for (int k = 0; k < len; k++) add_symbol(wb, t->byte_ids[c[k]]);
            return;
        }
    }
    if (t->unk_id < 0) return;
    if (wb->unk_pending >= 0 && !t->fuse_unk) add_symbol(wb, wb->unk_pending);
    wb->unk_pending = t->unk_id;
}

static void add_known(word_builder *wb, int32_t id) {
    if (wb->unk_pending >= 0) add_symbol(wb, wb->unk_pending), wb->unk_pending = -1;
    add_symbol(wb, id);
}

fm_status tok_bpe_word(const fm_tokenizer *t, const char *w, size_t n, tok_word_cache *cache, tok_ids *out,
                       fm_error *err) {
    if (n == 0) return FM_OK;
    if (n > INT32_MAX / 4) return fm_fail(err, FM_ERR_USAGE, "tokenizer: one word of %zu bytes is too long", n);
    const uint8_t *u = (const uint8_t *)w;
    if (t->ignore_merges) { /* a word that is a token is that token, whatever the merges say */
        int32_t id;
        if (t->byte_level) {
            tok_buf mapped = {0};
            for (size_t i = 0; i < n; i++) {
                char cp[4];
                if (!tok_buf_put(&mapped, cp, (size_t)tok_utf8_encode(tok_byte_to_cp(u[i]), cp))) {
                    free(mapped.p);
                    return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
                }
            }
            id = tok_strmap_get(&t->vocab, mapped.p, (uint32_t)mapped.n);
            free(mapped.p);
        } else id = tok_strmap_get(&t->vocab, w, (uint32_t)n);
        if (id >= 0) return tok_ids_push(out, id) ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
    }
    uint64_t h = 0;
    if (cache && n <= CACHE_MAX_WORD) {
        h = tok_hash_bytes(w, n);
        const struct cache_slot *s = cache_find(cache, w, (uint32_t)n, h);
        if (s->n_ids != UINT32_MAX) {
            for (uint32_t i = 0; i < s->n_ids; i++)
                if (!tok_ids_push(out, cache->ids.p[s->ids_off + i]))
                    return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
            return FM_OK;
        }
    }
    /* at most 4 symbols per byte (a byte-level character missing from the vocabulary falls back to its 2 bytes) */
    symbol sym_small[64];
    merge_cand heap_small[3 * 64]; /* a merge pushes at most 2 candidates: 3n in all */
    const size_t max_sym = 4 * n + 1;
    symbol *sym = max_sym <= 64 ? sym_small : malloc(max_sym * sizeof *sym);
    merge_cand *heap = max_sym <= 64 ? heap_small : malloc(3 * max_sym * sizeof *heap);
    if (!sym || !heap) {
        if (sym != sym_small) free(sym);
        if (heap != heap_small) free(heap);
        return fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory for a word of %zu bytes", n);
    }
    word_builder wb = {sym, 0, -1};
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            if (t->byte_level_ids[u[i]] >= 0) add_known(&wb, t->byte_level_ids[u[i]]);
            else {
                char cp[4];
                const int len = tok_utf8_encode(tok_byte_to_cp(u[i]), cp);
                add_unknown(t, &wb, (const uint8_t *)cp, len);
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            int len = tok_utf8_len(u + i, n - i);
            if (!len) len = 1; /* input is valid UTF-8 by now; a stray byte stays one symbol */
            const int32_t id = tok_strmap_get(&t->vocab, w + i, (uint32_t)len);
            if (id >= 0) add_known(&wb, id);
            else add_unknown(t, &wb, u + i, len);
            i += (size_t)len;
        }
    }
    if (wb.unk_pending >= 0) add_symbol(&wb, wb.unk_pending);
    merge_all(t, sym, wb.n, heap);
    const int64_t first = out->n;
    bool ok = true;
    for (int32_t i = 0; ok && wb.n > 0 && i >= 0; i = sym[i].next) ok = tok_ids_push(out, sym[i].id);
    if (ok && cache && n <= CACHE_MAX_WORD)
        cache_insert(cache, w, (uint32_t)n, h, out->p + first, (uint32_t)(out->n - first));
    if (sym != sym_small) free(sym);
    if (heap != heap_small) free(heap);
    return ok ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "tokenizer: out of memory");
}
