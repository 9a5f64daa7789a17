/* Automatic prefix caching (kv_prefix.h): naming full blocks, mapping cached prefixes, the LRU list of cached blocks
 * and the invariant check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_prefix.h"
#include "util/status.h"

/* splitmix64's finalizer: every input bit moves every output bit, so consecutive ids spread over the buckets */
static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t chain_hash(uint64_t parent_hash, const int32_t *ids, int32_t n) {
    uint64_t h = mix(parent_hash ^ 0x9e3779b97f4a7c15ull);
    for (int32_t i = 0; i < n; i++) h = mix(h ^ (uint32_t)ids[i]);
    return h;
}

/* The name of the block after index i - 1 of a sequence's chain: its parent and the parent's hash */
typedef struct chain_tip {
    int32_t parent; /* -1: the chain's first block */
    uint32_t parent_gen;
    uint64_t hash;
} chain_tip;

static chain_tip tip_after(const fm_kv_pool *p, int32_t seq, int64_t i) {
    if (i == 0) return (chain_tip){-1, 0, 0};
    const int32_t b = p->tables[(int64_t)seq * p->max_blocks + i - 1];
    return (chain_tip){p->canon[b], p->canon_gen[b], p->hash[b]};
}

static const int32_t *block_ids(const fm_kv_pool *p, int32_t b) { return p->tokens + (int64_t)b * p->block_tokens; }

/* the block in the table named (tip, ids) with hash h, else -1; the hash alone never decides */
static int32_t find(const fm_kv_pool *p, uint64_t h, chain_tip tip, const int32_t *ids) {
    for (int32_t b = p->bucket_head[h & (uint64_t)(p->n_buckets - 1)]; b >= 0; b = p->bucket_next[b])
        if (p->hash[b] == h && p->parent[b] == tip.parent && p->parent_gen[b] == tip.parent_gen &&
            !memcmp(block_ids(p, b), ids, (size_t)p->block_tokens * sizeof *ids))
            return b;
    return -1;
}

static void lru_unlink(fm_kv_pool *p, int32_t b) {
    const int32_t prev = p->lru_prev[b], next = p->lru_next[b];
    if (prev >= 0) p->lru_next[prev] = next;
    else p->lru_head = next;
    if (next >= 0) p->lru_prev[next] = prev;
    else p->lru_tail = prev;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_lru--;
}

void fm_kv_prefix_release(fm_kv_pool *p, int32_t b) {
    p->n_free++;
    if (!p->in_table[b]) {
        p->free_stack[p->n_empty++] = b;
        return;
    }
    p->lru_prev[b] = p->lru_tail, p->lru_next[b] = -1; /* the most recently released: evicted last */
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

int32_t fm_kv_prefix_evict(fm_kv_pool *p) {
    const int32_t b = p->lru_head;
    lru_unlink(p, b);
    int32_t *at = &p->bucket_head[p->hash[b] & (uint64_t)(p->n_buckets - 1)];
    while (*at != b) at = &p->bucket_next[*at];
    *at = p->bucket_next[b];
    p->in_table[b] = 0;
    p->gen[b]++; /* the children named after it (still cached, now unreachable) can never match a new chain */
    p->evictions++;
    return b;
}

int64_t fm_kv_prefix_share(fm_kv_pool *p, int32_t seq, const int32_t *ids, int64_t n) {
    if (!p->prefix_cache || seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] != 0) return 0;
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    const int32_t bt = p->block_tokens;
    chain_tip tip = {-1, 0, 0};
    int64_t i = 0;
    for (; i < p->max_blocks && (i + 1) * bt <= n; i++) {
        const uint64_t h = chain_hash(tip.hash, ids + i * bt, bt);
        const int32_t b = find(p, h, tip, ids + i * bt);
        if (b < 0) break;
        if (p->ref[b]++ == 0) lru_unlink(p, b), p->n_free--;
        table[i] = b;
        tip = (chain_tip){b, p->gen[b], h};
    }
    p->n_tokens[seq] = i * bt, p->n_named[seq] = (int32_t)i;
    return i * bt;
}

void fm_kv_prefix_name(fm_kv_pool *p, int32_t seq, const int32_t *ids, int64_t n) {
    if (!p->prefix_cache || seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0) return;
    const int32_t bt = p->block_tokens;
    const int64_t full = (n < p->n_tokens[seq] ? n : p->n_tokens[seq]) / bt;
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    for (int64_t i = p->n_named[seq]; i < full; i++) {
        const int32_t b = table[i];
        const chain_tip tip = tip_after(p, seq, i);
        const int32_t *bid = ids + i * bt;
        const uint64_t h = chain_hash(tip.hash, bid, bt);
        const int32_t twin = find(p, h, tip, bid);
        p->hash[b] = h;
        if (twin >= 0) { /* filled alongside an identical block: this copy stays private, its chain goes on */
            p->canon[b] = twin, p->canon_gen[b] = p->gen[twin];
        } else {
            memcpy(p->tokens + (int64_t)b * bt, bid, (size_t)bt * sizeof *bid);
            p->parent[b] = tip.parent, p->parent_gen[b] = tip.parent_gen;
            p->canon[b] = b, p->canon_gen[b] = p->gen[b];
            int32_t *head = &p->bucket_head[h & (uint64_t)(p->n_buckets - 1)];
            p->bucket_next[b] = *head, *head = b;
            p->in_table[b] = 1;
        }
        p->n_named[seq] = (int32_t)(i + 1);
    }
}

bool fm_kv_pool_check(const fm_kv_pool *p, char *msg, size_t len) {
    const int32_t B = p->n_blocks, bt = p->block_tokens;
    int32_t *refs = calloc((size_t)B, sizeof *refs);
    uint8_t *where = calloc((size_t)B, 1); /* 1: on the free stack, 2: on the LRU list */
    if (!refs || !where) {
        free(refs), free(where);
        return fm_check_failed(msg, len, "out of memory for the check");
    }
    bool ok = true;
    /* the tables: a sequence of n tokens holds exactly ceil(n / bt) blocks; named blocks are full ones */
    for (int32_t s = 0; ok && s < p->max_seqs; s++) {
        const int32_t *table = p->tables + (int64_t)s * p->max_blocks;
        const int64_t n = p->n_tokens[s], nb = n < 0 ? 0 : (n + bt - 1) / bt;
        if (n >= 0 && p->n_named[s] > n / bt)
            ok = fm_check_failed(msg, len, "sequence %d names %d blocks but holds %lld tokens", s, p->n_named[s],
                                 (long long)n);
        for (int64_t j = 0; ok && j < p->max_blocks; j++) {
            const int32_t b = table[j];
            if (j >= nb && b != -1)
                ok = fm_check_failed(msg, len, "sequence %d has block %d past its end at %lld", s, b, (long long)j);
            else if (j < nb && (b < 0 || b >= B))
                ok = fm_check_failed(msg, len, "sequence %d: entry %lld is %d", s, (long long)j, b);
            else if (j < nb) {
                refs[b]++;
                if (j >= p->n_named[s] && p->in_table[b])
                    ok = fm_check_failed(msg, len, "sequence %d writes block %d (entry %lld), which is in the table", s,
                                         b, (long long)j);
            }
        }
    }
    for (int32_t i = 0; ok && i < p->n_empty; i++) {
        const int32_t b = p->free_stack[i];
        if (b < 0 || b >= B || where[b])
            ok = fm_check_failed(msg, len, "free stack entry %d: block %d twice or bad", i, b);
        else where[b] = 1;
    }
    int32_t n_lru = 0;
    for (int32_t b = p->lru_head, prev = -1; ok && b >= 0; prev = b, b = p->lru_next[b]) {
        if (b >= B || where[b] || p->lru_prev[b] != prev || ++n_lru > B)
            ok = fm_check_failed(msg, len, "LRU list broken at block %d", b);
        else if (p->lru_next[b] < 0 && p->lru_tail != b) ok = fm_check_failed(msg, len, "LRU tail is not block %d", b);
        else where[b] = 2;
    }
    if (ok && n_lru != p->n_lru)
        ok = fm_check_failed(msg, len, "LRU list holds %d blocks, n_lru says %d", n_lru, p->n_lru);
    if (ok && p->n_free != p->n_empty + p->n_lru)
        ok = fm_check_failed(msg, len, "n_free %d != empty %d + cached %d", p->n_free, p->n_empty, p->n_lru);
    /* each block in exactly one state, its reference count that of the tables */
    int32_t named = 0;
    for (int32_t b = 0; ok && b < B; b++) {
        named += p->in_table[b];
        if (refs[b] != p->ref[b])
            ok = fm_check_failed(msg, len, "block %d: ref %d, the tables hold it %d times", b, p->ref[b], refs[b]);
        else if (refs[b] > 0 && where[b])
            ok = fm_check_failed(msg, len, "block %d is held and also free (%d)", b, where[b]);
        else if (refs[b] == 0 && !where[b]) ok = fm_check_failed(msg, len, "block %d is lost: not held, not free", b);
        else if (where[b] == 1 && p->in_table[b]) ok = fm_check_failed(msg, len, "empty block %d is in the table", b);
        else if (where[b] == 2 && !p->in_table[b])
            ok = fm_check_failed(msg, len, "cached block %d is not in the table", b);
        else if (refs[b] > 1 && !p->in_table[b]) ok = fm_check_failed(msg, len, "block %d is shared but not named", b);
    }
    /* the hash table: every named block in its bucket once, hashes of its ids, no two with the same name */
    int32_t in_buckets = 0;
    for (int32_t k = 0; ok && k < p->n_buckets; k++)
        for (int32_t b = p->bucket_head[k]; ok && b >= 0; b = p->bucket_next[b]) {
            if (b >= B || !p->in_table[b] || (int32_t)(p->hash[b] & (uint64_t)(p->n_buckets - 1)) != k ||
                ++in_buckets > named)
                ok = fm_check_failed(msg, len, "hash bucket %d holds block %d wrongly", k, b);
            else if (p->parent[b] >= 0 && p->in_table[p->parent[b]] && p->gen[p->parent[b]] == p->parent_gen[b] &&
                     chain_hash(p->hash[p->parent[b]], block_ids(p, b), bt) != p->hash[b])
                ok = fm_check_failed(msg, len, "block %d's hash is not that of its chain", b);
            else if (p->parent[b] < 0 && chain_hash(0, block_ids(p, b), bt) != p->hash[b])
                ok = fm_check_failed(msg, len, "block %d's hash is not that of its ids", b);
            for (int32_t c = p->bucket_next[b]; ok && c >= 0; c = p->bucket_next[c])
                if (p->hash[c] == p->hash[b] && p->parent[c] == p->parent[b] && p->parent_gen[c] == p->parent_gen[b] &&
                    !memcmp(block_ids(p, b), block_ids(p, c), (size_t)bt * sizeof(int32_t)))
                    ok = fm_check_failed(msg, len, "blocks %d and %d carry the same name", b, c);
        }
    if (ok && in_buckets != named)
        ok = fm_check_failed(msg, len, "%d blocks named, %d in the buckets", named, in_buckets);
    free(refs), free(where);
    if (ok && len) msg[0] = 0;
    return ok;
}
