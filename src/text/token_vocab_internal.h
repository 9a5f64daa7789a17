/* The vocabulary as the matcher walks it (token_vocab.c builds it, token_matcher.c reads it). */
#ifndef FM_TEXT_TOKEN_VOCAB_INTERNAL_H
#define FM_TEXT_TOKEN_VOCAB_INTERNAL_H

#include "text/mask_cache.h"
#include "text/token_matcher.h"

/* A prefix trie in preorder: a node's children are linked by sibling in byte order; the ids whose bytes end exactly
 * at a node are ids[first_id .. first_id + n_ids). Node 0 is the root (no byte). */
typedef struct t_node {
    int32_t child, sibling;
    int32_t first_id, n_ids;
    uint8_t byte;
} t_node;

typedef struct t_trie {
    t_node *nodes;
    int32_t n_nodes;
    int32_t *ids;
} t_trie;

#define VOCAB_PURE_MAX 32 /* plain-string tokens of more characters are walked instead */

struct fm_token_vocab {
    int32_t n_ids, words; /* words: (n_ids + 31) / 32 */
    uint8_t *bytes;       /* every id's bytes, concatenated */
    uint64_t *off;        /* [n_ids + 1] */
    uint8_t *special;     /* [n_ids] */
    t_trie all;           /* every allowed-able id */
    t_trie impure;        /* the ids that are not plain string characters, less those no string takes */
    uint32_t *pure_upto;  /* [VOCAB_PURE_MAX + 1][words]: plain-string ids of 1..k characters */
    fm_mask_cache *cache; /* masks shared by the matchers over this vocabulary; NULL: none */
};

#endif
