/* Automatic prefix caching in the paged KV cache (kv_cache.h's pool, with pool->prefix_cache on).
 *
 * A full block is named by the chain of tokens that ends with it: hash(parent's hash, its block_tokens ids), where the
 * parent is the named block before it in the sequence. The hash only picks a bucket: a match also compares the ids
 * and the parent (block id and generation), so two chains are the same only when every token is.
 *
 * A block is in one of three states:
 *   held   ref > 0: in the tables of ref sequences; when ref > 1 it is named (a block being filled is never shared);
 *   cached ref = 0, named: in the hash table and on the LRU list, least recently released first;
 *   empty  ref = 0, not named: on the free stack.
 * A sequence takes an empty block first, else evicts the least recently released cached one. Sequences only read
 * the blocks they map: their own writes start in a fresh block after the last mapped one. */
#ifndef FM_ENGINE_KV_PREFIX_H
#define FM_ENGINE_KV_PREFIX_H

#include <stddef.h>

#include "engine/kv_cache.h"

/* Maps the longest cached prefix of ids[0..n) into empty sequence seq (whole blocks only, so at most
 * floor(n / block_tokens) of them): the blocks are held (ref + 1) and the sequence holds their tokens. Returns the
 * tokens mapped (0 with the cache off). A caller that needs logits passes n = prompt - 1, so that one token runs. */
int64_t fm_kv_prefix_share(fm_kv_pool *p, int32_t seq, const int32_t *ids, int64_t n);

/* Names the full blocks of seq among its first n tokens (ids[0..n), whose K and V are written) not named yet, so
 * that later sequences can map them. n <= the sequence's tokens. */
void fm_kv_prefix_name(fm_kv_pool *p, int32_t seq, const int32_t *ids, int64_t n);

/* Checks every invariant of the pool: references against the tables, the three block states, the free stack, the
 * LRU list and the hash table agree; shared blocks are named; no two blocks in the table carry the same name.
 * false with msg naming the first broken one. Cost O(blocks x block_tokens + seqs x max_blocks): tests only. */
bool fm_kv_pool_check(const fm_kv_pool *p, char *msg, size_t len);

/* for kv_cache.c: a block whose last reference went (cached when named, else empty), and one taken from the cache
 * for new tokens (the least recently released, dropped from the table). */
void fm_kv_prefix_release(fm_kv_pool *p, int32_t b);
int32_t fm_kv_prefix_evict(fm_kv_pool *p);
/* whether the block is named and the sequence's writes must not reach it */
static inline bool fm_kv_prefix_named(const fm_kv_pool *p, int32_t seq, int32_t block_index) {
    return p->n_named && block_index < p->n_named[seq];
}

#endif
