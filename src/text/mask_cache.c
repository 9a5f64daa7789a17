/* Masks shared between matchers (mask_cache.h): a fixed array of entries under a readers-writer lock, each a key, its
 * hash and a mask; lookups compare the hash, then the key, and copy the mask under the read lock (a few microseconds,
 * concurrently with other lookups), against the walk it saves of up to ~0.7 ms. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"
#include "text/mask_cache.h"

typedef struct mc_entry {
    uint64_t hash;
    int32_t *key; /* MASK_CACHE_KEY_MAX words */
    int32_t n_key;
    uint32_t *words; /* NULL: an empty entry */
} mc_entry;

struct fm_mask_cache {
    pthread_rwlock_t lock;
    int32_t words, capacity;
    int32_t next; /* the entry replaced next once every one is taken */
    _Atomic int64_t hits, misses;
    mc_entry *e;
};

static uint64_t key_hash(const int32_t *key, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the words */
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)key[i]) * 0x100000001b3ull;
    return h;
}

fm_mask_cache *fm_mask_cache_create(int32_t words, int32_t capacity) {
    fm_mask_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->e = calloc((size_t)capacity, sizeof *c->e)) || pthread_rwlock_init(&c->lock, NULL)) {
        if (c) free(c->e);
        free(c);
        return NULL;
    }
    c->words = words, c->capacity = capacity;
    return c;
}

void fm_mask_cache_free(fm_mask_cache *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->capacity; i++) free(c->e[i].key), free(c->e[i].words);
    pthread_rwlock_destroy(&c->lock);
    free(c->e), free(c);
}

static mc_entry *find(fm_mask_cache *c, uint64_t h, const int32_t *key, int32_t n) {
    for (int32_t i = 0; i < c->capacity; i++) {
        mc_entry *e = &c->e[i];
        if (e->words && e->hash == h && e->n_key == n && !memcmp(e->key, key, (size_t)n * sizeof *key)) return e;
    }
    return NULL;
}

bool fm_mask_cache_get(fm_mask_cache *c, const int32_t *key, int32_t n, uint32_t *words) {
    const uint64_t h = key_hash(key, n);
    pthread_rwlock_rdlock(&c->lock);
    const mc_entry *e = find(c, h, key, n);
    if (e) memcpy(words, e->words, (size_t)c->words * sizeof *words);
    pthread_rwlock_unlock(&c->lock);
    atomic_fetch_add(e ? &c->hits : &c->misses, 1);
    return e != NULL;
}

void fm_mask_cache_put(fm_mask_cache *c, const int32_t *key, int32_t n, const uint32_t *words) {
    if (n < 0 || n > MASK_CACHE_KEY_MAX) return;
    const uint64_t h = key_hash(key, n);
    pthread_rwlock_wrlock(&c->lock);
    if (!find(c, h, key, n)) { /* another thread may have put it since its lookup */
        mc_entry *e = &c->e[c->next];
        if (!e->key) e->key = malloc(MASK_CACHE_KEY_MAX * sizeof *e->key);
        if (!e->words) e->words = malloc((size_t)c->words * sizeof *e->words);
        if (e->key && e->words) {
            e->hash = h, e->n_key = n;
            memcpy(e->key, key, (size_t)n * sizeof *key);
            memcpy(e->words, words, (size_t)c->words * sizeof *words);
            c->next = (c->next + 1) % c->capacity;
        } else free(e->words), e->words = NULL; /* out of memory: the entry stays empty */
    }
    pthread_rwlock_unlock(&c->lock);
}

void fm_mask_cache_stats(fm_mask_cache *c, int64_t *hits, int64_t *misses) {
    *hits = atomic_load(&c->hits), *misses = atomic_load(&c->misses);
}

/* Two hashes fed the same words: FNV-1a and a multiply-xorshift mix, each 64 bits. */
typedef struct fp_state {
    uint64_t a, b;
} fp_state;

static void fp_word(fp_state *s, uint64_t w) {
    for (int i = 0; i < 8; i++) s->a = (s->a ^ ((w >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    s->b ^= w + 0x9e3779b97f4a7c15ull + (s->b << 6) + (s->b >> 2);
    s->b = (s->b ^ (s->b >> 31)) * 0xbf58476d1ce4e5b9ull;
}

static void fp_double(fp_state *s, double d) {
    uint64_t w;
    memcpy(&w, &d, sizeof w);
    fp_word(s, w);
}

void fm_grammar_fingerprint(const fm_grammar *g, int32_t out[4]) {
    fp_state s = {0xcbf29ce484222325ull, 0x243f6a8885a308d3ull};
    fp_word(&s, (uint64_t)g->n_elems), fp_word(&s, (uint64_t)g->n_rules), fp_word(&s, (uint64_t)g->root);
    for (int32_t i = 0; i < g->n_elems; i++) fp_word(&s, (uint64_t)g->elems[i].kind << 32 | (uint32_t)g->elems[i].arg);
    for (int32_t r = 0; r <= g->n_rules; r++) fp_word(&s, (uint32_t)g->rule_alt[r]);
    for (int32_t a = 0; a < g->rule_alt[g->n_rules]; a++) fp_word(&s, (uint32_t)g->alt_pos[a]);
    fp_word(&s, (uint64_t)g->n_sets);
    for (int32_t i = 0; i < g->n_sets; i++)
        for (int k = 0; k < 8; k += 2) fp_word(&s, (uint64_t)g->sets[i].w[k] << 32 | g->sets[i].w[k + 1]);
    fp_word(&s, (uint64_t)g->n_strings);
    for (int32_t i = 0; i < g->n_strings; i++) {
        const g_string *p = &g->strings[i];
        fp_word(&s, (uint64_t)p->min_len << 32 | p->max_len);
        fp_word(&s, (uint64_t)p->no_escapes << 62 | (uint64_t)(uint32_t)p->excl_start << 31 | (uint32_t)p->excl_n);
    }
    fp_word(&s, (uint64_t)g->n_numbers);
    for (int32_t i = 0; i < g->n_numbers; i++) {
        const g_number *p = &g->numbers[i];
        fp_word(&s, (uint64_t)p->integer | (uint64_t)p->has_min << 1 | (uint64_t)p->min_excl << 2 |
                        (uint64_t)p->has_max << 3 | (uint64_t)p->max_excl << 4);
        fp_double(&s, p->min), fp_double(&s, p->max);
    }
    fp_word(&s, (uint64_t)g->n_excl);
    for (int32_t i = 0; i < g->n_excl; i++) fp_word(&s, g->excl[i]);
    out[0] = (int32_t)(uint32_t)s.a, out[1] = (int32_t)(uint32_t)(s.a >> 32);
    out[2] = (int32_t)(uint32_t)s.b, out[3] = (int32_t)(uint32_t)(s.b >> 32);
}
