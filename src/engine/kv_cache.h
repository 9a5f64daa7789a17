/* The paged KV cache's bookkeeping: a pool of fixed-size blocks, a block table per sequence, blocks returned to the
 * pool when a sequence ends and reused by the next. With the prefix cache on (kv_prefix.h), a full block is named by
 * its tokens and those before it, stays cached after its sequence ends, and is mapped read-only into any sequence
 * whose tokens begin the same way. Host-side and backend-free: the backend holds the blocks' memory
 * ([n_blocks][layers][2][block_tokens][n_kv_heads][head_dim] in the activation dtype) and receives the block tables
 * as int32 [max_seqs][max_blocks_per_seq] (fm_kv_tables), the same layout every step, so a captured decode graph
 * reads them from a device buffer that is updated before each replay.
 *
 * Block size: FM_KV_BLOCK_TOKENS = 16 tokens. A sequence wastes at most block - 1 slots (7.5 on average at 16, 15.5
 * at 32), and 16 keys is the key tile of the attention kernels (mma.sync m16n8k16: one tile = one block, so a tile
 * never straddles two blocks). With Qwen3-30B-A3B (4 KV heads x 128, 48 layers, bf16) a block is 16 KiB per layer
 * and per K or V: one contiguous 16 KiB read per (block, layer, K|V), large enough for full-bandwidth loads. */
#ifndef FM_ENGINE_KV_CACHE_H
#define FM_ENGINE_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"

#define FM_KV_BLOCK_TOKENS 16

typedef struct fm_kv_pool {
    int32_t n_blocks;     /* blocks in the pool */
    int32_t block_tokens; /* tokens per block */
    int32_t max_seqs;     /* sequence slots */
    int64_t ctx;          /* tokens per sequence at most */
    int32_t max_blocks;   /* blocks per sequence at most: ceil(ctx / block_tokens) */
    int32_t n_free;       /* blocks a sequence can take: the empty ones and the cached ones no sequence holds */
    int32_t n_empty;      /* blocks on the free stack */
    int32_t *free_stack;  /* [n_blocks]: empty block ids, the top at n_empty - 1 (LIFO: a freed block is reused
                             first, while it may still be in L2) */
    int32_t *tables;      /* [max_seqs][max_blocks] block ids, -1 where none */
    int64_t *n_tokens;    /* [max_seqs] tokens held; -1: slot not in use */
    int32_t *ref;         /* [n_blocks] sequences whose table holds the block */
    /* the prefix cache (kv_prefix.c); off: nothing is named and every freed block goes back to the free stack */
    bool prefix_cache;
    int32_t *n_named;     /* [max_seqs] leading full blocks of the sequence named by their tokens */
    int32_t *tokens;      /* [n_blocks][block_tokens] the token ids of a named block */
    uint64_t *hash;       /* [n_blocks] hash of the chain of tokens up to the block's end (named blocks) */
    int32_t *parent;      /* [n_blocks] the named block before it in its chain (-1: the first of a sequence) */
    uint32_t *parent_gen; /* [n_blocks] that block's generation when this one was named */
    uint32_t *gen;        /* [n_blocks] bumped when a block leaves the table: an old name can never match again */
    int32_t *canon;       /* [n_blocks] the block in the table with the same name: itself, or the twin a sequence
                             that filled an identical block found there (its copy stays private) */
    uint32_t *canon_gen;  /* [n_blocks] canon's generation then (a twin may leave the table later) */
    uint8_t *in_table;    /* [n_blocks] named and in the hash table */
    int32_t *bucket_head; /* [n_buckets] first block of each hash bucket, -1: empty */
    int32_t *bucket_next; /* [n_blocks] the next block of the same bucket */
    int32_t n_buckets;    /* a power of two >= n_blocks */
    int32_t *lru_prev, *lru_next; /* [n_blocks] cached blocks no sequence holds, least recently released first */
    int32_t lru_head, lru_tail, n_lru;
    int64_t evictions; /* cached blocks given up for new ones */
} fm_kv_pool;

/* Bytes of one block on a backend: K and V of block_tokens tokens for every layer, row_bytes a token's K (or V) of one
 * layer (backend.h fm_kv_row_bytes: n_kv_heads x head_dim elements, or an e4m3 cache's codes and scales). */
int64_t fm_kv_block_bytes(int32_t n_layers, int64_t row_bytes, int32_t block_tokens);

/* A pool for max_seqs sequences of up to ctx tokens each, of n_blocks blocks: 0 = max_seqs x ceil(ctx / block_tokens)
 * (every sequence can reach ctx); fewer overcommits (sequences share the pool, and an append can find it full). */
fm_status fm_kv_pool_init(fm_kv_pool *p, int32_t max_seqs, int64_t ctx, int32_t block_tokens, int64_t n_blocks,
                          fm_error *err);
void fm_kv_pool_free(fm_kv_pool *p);

/* Takes a free sequence slot (FM_ERR_NOMEM naming max_seqs when none is free). */
fm_status fm_kv_seq_open(fm_kv_pool *p, int32_t *seq, fm_error *err);
/* Makes room for n more tokens of seq (allocating the blocks they need). When the sequence would exceed ctx or the
 * pool has too few free blocks, nothing changes and the error says how many blocks were needed and how many are
 * free: a full cache is an error, never an overwrite. */
fm_status fm_kv_seq_append(fm_kv_pool *p, int32_t seq, int64_t n, fm_error *err);
/* Shortens seq to its first n tokens (n <= its length): the blocks beyond ceil(n / block_tokens) go back to the
 * pool (a kept cache continued by a prompt that shares only part of it). A named block is read-only (others may map
 * it), so a cut inside one keeps only the blocks before it. Returns the tokens kept. */
int64_t fm_kv_seq_truncate(fm_kv_pool *p, int32_t seq, int64_t n);
/* Gives seq a private copy of its last block i (a named one it is about to write into, after a cut to within it): a
 * fresh block replaces it in the table (the old one loses this reference and is no longer counted as named for seq).
 * Returns the old block, whose contents the caller copies into the new one (fm_kv_block_of), or -1 when no block is
 * free (nothing changed). */
int32_t fm_kv_seq_fork_block(fm_kv_pool *p, int32_t seq, int64_t i);
/* Ends seq: its blocks go back to the pool (named ones stay cached until their memory is needed), its slot is
 * free. */
void fm_kv_seq_close(fm_kv_pool *p, int32_t seq);

/* Tokens held by seq (-1 when the slot is not in use). */
static inline int64_t fm_kv_seq_tokens(const fm_kv_pool *p, int32_t seq) { return p->n_tokens[seq]; }
/* The block holding token t of seq and the token's slot in it. */
static inline int32_t fm_kv_block_of(const fm_kv_pool *p, int32_t seq, int64_t t) {
    return p->tables[(int64_t)seq * p->max_blocks + t / p->block_tokens];
}
/* The block tables as the backend reads them: int32 [max_seqs][max_blocks]. */
static inline const int32_t *fm_kv_tables(const fm_kv_pool *p) { return p->tables; }

#endif
