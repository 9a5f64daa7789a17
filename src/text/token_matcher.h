/* Constrained decoding: which token ids may come next under a grammar (grammar.h).
 *
 * A vocabulary (fm_token_vocab, built once per model) holds every id's bytes in a prefix trie; a matcher (one per
 * sequence) holds the grammar's parse state (a set of pushdown stacks over byte positions) and walks the trie
 * against it: a subtree dies at the first byte no stack accepts, so a token may span grammar boundaries (`"},` closes
 * a string, an object and starts the next member) and costs only the bytes it shares with other tokens. Inside an
 * unconstrained stretch of a JSON string the tokens that are plain string characters are allowed wholesale from
 * precomputed masks (by character count, for maxLength) and only the others are walked.
 *
 * Special tokens are never allowed inside the grammar; the end ids (eos and end-of-turn, given by the caller) are
 * allowed exactly when the grammar is complete. */
#ifndef FM_TEXT_TOKEN_MATCHER_H
#define FM_TEXT_TOKEN_MATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

typedef struct fm_token_vocab fm_token_vocab;

/* From each id's bytes (bytes[i][0..lens[i]); NULL or length 0: never allowed) and special flags (NULL: none).
 * n_ids is the model's vocabulary (ids past the tokenizer's are given as NULL). Copies what it needs. */
fm_status fm_token_vocab_create(int32_t n_ids, const uint8_t *const *bytes, const uint32_t *lens, const bool *special,
                                fm_token_vocab **out, fm_error *err);
/* From a tokenizer: byte-level BPE tokens as their raw bytes, Metaspace/byte-fallback tokens as the text they
 * decode to ('▁' a space, <0xNN> its byte); added special tokens marked special. n_ids: the model's vocab_size
 * (>= the tokenizer's ids; 0: the tokenizer's). */
fm_status fm_token_vocab_from_tokenizer(const fm_tokenizer *t, int32_t n_ids, fm_token_vocab **out, fm_error *err);
void fm_token_vocab_free(fm_token_vocab *v);
int32_t fm_token_vocab_size(const fm_token_vocab *v);
/* The bytes of id (NULL for none). */
const uint8_t *fm_token_vocab_bytes(const fm_token_vocab *v, int32_t id, uint32_t *len);
/* The masks the matchers over v share (text/mask_cache.h): a mask computed in one parse state is copied by every
 * later fill in an equal state (an equal grammar, end ids and parse), across matchers and threads. At most capacity
 * masks of (n_ids + 31) / 32 words are kept (memory taken as they are added); 0: none. A vocabulary starts with
 * FM_MASK_CACHE_DEFAULT. Not while a matcher over v fills a mask. */
#define FM_MASK_CACHE_DEFAULT 128 /* 2.4 MB at 151936 ids when full */
fm_status fm_token_vocab_set_mask_cache(fm_token_vocab *v, int32_t capacity, fm_error *err);
/* Fills that copied a shared mask, and fills that computed one, since the cache was set. */
void fm_token_vocab_mask_cache_stats(const fm_token_vocab *v, int64_t *hits, int64_t *misses);

typedef struct fm_matcher fm_matcher;

/* A matcher at the start of g (finished; it must outlive the matcher, as must v). end_ids: the ids that end the
 * generation (n_end >= 1). */
fm_status fm_matcher_create(const fm_grammar *g, const fm_token_vocab *v, const int32_t *end_ids, int32_t n_end,
                            fm_matcher **out, fm_error *err);
void fm_matcher_free(fm_matcher *m);
/* words[(n_ids + 31) / 32]: bit i set when id i may come next (every bit set or cleared). */
void fm_matcher_fill_mask(fm_matcher *m, uint32_t *words);
/* Advances past token id; false (state unchanged) when the grammar does not allow it. An end id is accepted when
 * the grammar is complete. */
bool fm_matcher_accept(fm_matcher *m, int32_t id);
/* The same for raw bytes (tests, and text forced by a caller). */
bool fm_matcher_accept_bytes(fm_matcher *m, const void *bytes, size_t n);
/* The grammar is complete here (end ids are allowed now; other tokens too when the grammar can go on). */
bool fm_matcher_done(const fm_matcher *m);
/* Complete and nothing can follow: only end ids are allowed. */
bool fm_matcher_finished(const fm_matcher *m);

/* The engine's per-request constraint (fp8moe.h fm_token_constraint) driven by m. */
fm_token_constraint fm_matcher_constraint(fm_matcher *m);

#endif
