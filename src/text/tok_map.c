/* The tokenizer's hash maps: token string -> id and (left id, right id) -> merge. Open addressing, linear probing,
 * load factor <= 1/2; built once at load time and only read afterwards (safe to share between threads). */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

uint64_t tok_hash_bytes(const void *p, size_t n) {
    /* FNV-1a over 8-byte words then bytes, finished with a 64-bit mixer: fast for short keys, well spread. */
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8, n -= 8;
    }
    while (n--) h = (h ^ *s++) * 0x100000001b3ull;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33;
    return h;
}

static uint32_t cap_for(uint32_t expected) {
    uint32_t cap = 16;
    while (cap < 2u * expected + 2 && cap < (1u << 31)) cap *= 2;
    return cap;
}

bool tok_strmap_init(tok_strmap *m, uint32_t expected) {
    m->cap = cap_for(expected), m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots != NULL;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL, m->cap = m->n = 0;
}

static bool strmap_grow(tok_strmap *m) {
    tok_strmap bigger = {calloc((size_t)m->cap * 2, sizeof *m->slots), m->cap * 2, 0};
    if (!bigger.slots) return false;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) tok_strmap_put(&bigger, m->slots[i].key, m->slots[i].len, m->slots[i].value);
    free(m->slots);
    *m = bigger;
    return true;
}

bool tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t value) {
    if (2 * (m->n + 1) > m->cap && !strmap_grow(m)) return false;
    uint32_t i = (uint32_t)tok_hash_bytes(key, len) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        struct tok_strmap_slot *s = &m->slots[i];
        if (!s->key) {
            s->key = key, s->len = len, s->value = value;
            m->n++;
            return true;
        }
        if (s->len == len && memcmp(s->key, key, len) == 0) {
            s->value = value;
            return true;
        }
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, uint32_t len) {
    if (!m->cap) return -1;
    uint32_t i = (uint32_t)tok_hash_bytes(key, len) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        const struct tok_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s->value;
    }
}

static uint32_t pair_hash(uint64_t key) {
    key ^= key >> 33, key *= 0xff51afd7ed558ccdull, key ^= key >> 33, key *= 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(key ^ (key >> 33));
}

bool tok_pairmap_init(tok_pairmap *m, uint32_t expected) {
    m->cap = cap_for(expected), m->n = 0;
    m->slots = malloc((size_t)m->cap * sizeof *m->slots);
    if (!m->slots) return false;
    for (uint32_t i = 0; i < m->cap; i++) m->slots[i].key = UINT64_MAX;
    return true;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slots);
    m->slots = NULL, m->cap = m->n = 0;
}

bool tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if (2 * (m->n + 1) > m->cap) {
        tok_pairmap bigger;
        if (!tok_pairmap_init(&bigger, m->cap)) return false;
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->slots[i].key != UINT64_MAX)
                tok_pairmap_put(&bigger, (int32_t)(m->slots[i].key >> 32), (int32_t)(uint32_t)m->slots[i].key,
                                m->slots[i].rank, m->slots[i].id);
        free(m->slots);
        *m = bigger;
    }
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = pair_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct tok_pair_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX || s->key == key) {
            m->n += s->key == UINT64_MAX;
            s->key = key, s->rank = rank, s->id = id; /* a repeated merge keeps the later rank, as `tokenizers` */
            return true;
        }
    }
}

const struct tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = pair_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct tok_pair_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}
