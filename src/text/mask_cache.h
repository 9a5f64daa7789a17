/* Allowed-token masks shared between matchers (token_matcher.h): a bounded, thread-safe store from a parse state's key
 * to the mask computed for it, so that the rows of a decode step in the same state (64 requests in json_object mode
 * open a string, close an object, start a value at the same depth) and the same state at a later step copy the mask
 * (19 KB at 151936 ids) instead of walking the vocabulary again (up to ~0.7 ms on one core).
 *
 * The vocabulary owns one (fm_token_vocab_set_mask_cache); a key names everything the mask depends on: the grammar's
 * content (its fingerprint: equal grammars built for different requests share entries), the end ids and the parse
 * state (token_matcher.c builds it). Entries are replaced in turn once the store is full. */
#ifndef FM_TEXT_MASK_CACHE_H
#define FM_TEXT_MASK_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "text/grammar.h"

#define MASK_CACHE_KEY_MAX 1024 /* int32 words of a key at most: a deeper parse is not cached */

typedef struct fm_mask_cache fm_mask_cache;

/* A store of up to capacity masks of `words` uint32 each (their memory taken as entries are added); NULL when out of
 * memory. */
fm_mask_cache *fm_mask_cache_create(int32_t words, int32_t capacity);
void fm_mask_cache_free(fm_mask_cache *c);
/* On a hit, the mask of key[0..n) copied into words; false otherwise. Safe from concurrent threads. */
bool fm_mask_cache_get(fm_mask_cache *c, const int32_t *key, int32_t n, uint32_t *words);
/* Keeps words as the mask of key[0..n) (n <= MASK_CACHE_KEY_MAX), replacing the oldest entry when full. */
void fm_mask_cache_put(fm_mask_cache *c, const int32_t *key, int32_t n, const uint32_t *words);
/* Lookups that hit and that missed since creation. */
void fm_mask_cache_stats(fm_mask_cache *c, int64_t *hits, int64_t *misses);

/* A finished grammar's content as 4 key words (two independent 64-bit hashes of every element, rule, byte set,
 * string and number constraint and the root): equal grammars, equal fingerprints. */
void fm_grammar_fingerprint(const fm_grammar *g, int32_t out[4]);

#endif
