/* The paged KV cache's bookkeeping (kv_cache.h); the naming and caching of full blocks is kv_prefix.c. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "engine/kv_prefix.h"
#include "util/status.h"

int64_t fm_kv_block_bytes(int32_t n_layers, int64_t row_bytes, int32_t block_tokens) {
    return 2 * (int64_t)n_layers * row_bytes * block_tokens;
}

fm_status fm_kv_pool_init(fm_kv_pool *p, int32_t max_seqs, int64_t ctx, int32_t block_tokens, int64_t n_blocks,
                          fm_error *err) {
    memset(p, 0, sizeof *p);
    if (max_seqs < 1 || ctx < 1 || block_tokens < 1)
        return fm_fail(err, FM_ERR_USAGE, "KV cache: max_seqs (%d), ctx (%lld) and block size (%d) must be >= 1",
                       max_seqs, (long long)ctx, block_tokens);
    const int64_t per_seq = (ctx + block_tokens - 1) / block_tokens;
    const int64_t total = n_blocks > 0 ? n_blocks : per_seq * max_seqs;
    if (total > INT32_MAX / 2 || per_seq * max_seqs > INT32_MAX / 2 || total * block_tokens > INT32_MAX)
        return fm_fail(err, FM_ERR_USAGE, "KV cache: %d sequences of %lld tokens need %lld blocks, more than %d",
                       max_seqs, (long long)ctx, (long long)total, INT32_MAX / 2);
    p->n_blocks = (int32_t)total, p->block_tokens = block_tokens, p->max_seqs = max_seqs;
    p->max_blocks = (int32_t)per_seq, p->ctx = ctx;
    p->n_buckets = 1;
    while (p->n_buckets < p->n_blocks) p->n_buckets *= 2;
    const size_t B = (size_t)total;
    p->free_stack = fm_malloc(B * sizeof *p->free_stack, err, "KV block stack");
    p->tables = fm_malloc((size_t)(per_seq * max_seqs) * sizeof *p->tables, err, "KV block tables");
    p->n_tokens = fm_malloc((size_t)max_seqs * sizeof *p->n_tokens, err, "KV sequence lengths");
    p->ref = calloc(B, sizeof *p->ref);
    p->n_named = calloc((size_t)max_seqs, sizeof *p->n_named);
    p->tokens = calloc(B * (size_t)block_tokens, sizeof *p->tokens);
    p->hash = calloc(B, sizeof *p->hash);
    p->parent = calloc(B, sizeof *p->parent);
    p->parent_gen = calloc(B, sizeof *p->parent_gen);
    p->gen = calloc(B, sizeof *p->gen);
    p->canon = calloc(B, sizeof *p->canon);
    p->canon_gen = calloc(B, sizeof *p->canon_gen);
    p->in_table = calloc(B, sizeof *p->in_table);
    p->bucket_head = malloc((size_t)p->n_buckets * sizeof *p->bucket_head);
    p->bucket_next = calloc(B, sizeof *p->bucket_next);
    p->lru_prev = calloc(B, sizeof *p->lru_prev);
    p->lru_next = calloc(B, sizeof *p->lru_next);
    if (!p->free_stack || !p->tables || !p->n_tokens || !p->ref || !p->n_named || !p->tokens || !p->hash ||
        !p->parent || !p->parent_gen || !p->gen || !p->canon || !p->canon_gen || !p->in_table || !p->bucket_head ||
        !p->bucket_next || !p->lru_prev || !p->lru_next) {
        fm_kv_pool_free(p);
        return fm_fail(err, FM_ERR_NOMEM, "KV cache: out of memory for the bookkeeping of %lld blocks",
                       (long long)total);
    }
    for (int32_t i = 0; i < p->n_blocks; i++) p->free_stack[i] = p->n_blocks - 1 - i; /* block 0 on top */
    p->n_free = p->n_empty = p->n_blocks;
    for (int64_t i = 0; i < per_seq * max_seqs; i++) p->tables[i] = -1;
    for (int32_t s = 0; s < max_seqs; s++) p->n_tokens[s] = -1;
    for (int32_t i = 0; i < p->n_buckets; i++) p->bucket_head[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return FM_OK;
}

void fm_kv_pool_free(fm_kv_pool *p) {
    free(p->free_stack), free(p->tables), free(p->n_tokens), free(p->ref), free(p->n_named), free(p->tokens);
    free(p->hash), free(p->parent), free(p->parent_gen), free(p->gen), free(p->canon), free(p->canon_gen),
        free(p->in_table);
    free(p->bucket_head), free(p->bucket_next), free(p->lru_prev), free(p->lru_next);
    memset(p, 0, sizeof *p);
}

fm_status fm_kv_seq_open(fm_kv_pool *p, int32_t *seq, fm_error *err) {
    for (int32_t s = 0; s < p->max_seqs; s++)
        if (p->n_tokens[s] < 0) {
            p->n_tokens[s] = 0, p->n_named[s] = 0;
            *seq = s;
            return FM_OK;
        }
    return fm_fail(err, FM_ERR_NOMEM, "KV cache: all %d sequence slots are in use (--max-seqs)", p->max_seqs);
}

/* a block for new tokens: an empty one, else the least recently released cached one */
static int32_t take_block(fm_kv_pool *p) {
    const int32_t b = p->n_empty > 0 ? p->free_stack[--p->n_empty] : fm_kv_prefix_evict(p);
    p->n_free--;
    p->ref[b] = 1;
    return b;
}

static void drop_block(fm_kv_pool *p, int32_t b) {
    if (--p->ref[b] == 0) fm_kv_prefix_release(p, b);
}

fm_status fm_kv_seq_append(fm_kv_pool *p, int32_t seq, int64_t n, fm_error *err) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0 || n < 0)
        return fm_fail(err, FM_ERR_USAGE, "KV cache: sequence %d is not open (or %lld tokens asked)", seq,
                       (long long)n);
    const int64_t have = p->n_tokens[seq], want = have + n;
    if (want > p->ctx)
        return fm_fail(err, FM_ERR_USAGE,
                       "KV cache: sequence %d would hold %lld tokens, more than the %lld planned per sequence (--ctx)",
                       seq, (long long)want, (long long)p->ctx);
    const int64_t blocks_have = (have + p->block_tokens - 1) / p->block_tokens;
    const int64_t blocks_want = (want + p->block_tokens - 1) / p->block_tokens;
    const int64_t need = blocks_want - blocks_have;
    if (need > p->n_free)
        return fm_fail(err, FM_ERR_NOMEM,
                       "KV cache full: sequence %d needs %lld more blocks of %d tokens, %d of %d are free", seq,
                       (long long)need, p->block_tokens, p->n_free, p->n_blocks);
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    for (int64_t b = blocks_have; b < blocks_want; b++) table[b] = take_block(p);
    p->n_tokens[seq] = want;
    return FM_OK;
}

/* releases the blocks of seq from index `from` on, the last first: a chain's later blocks become older in the LRU
 * order than its earlier ones, so eviction takes a chain from its end */
static void drop_tail(fm_kv_pool *p, int32_t seq, int64_t from) {
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    int64_t end = from;
    while (end < p->max_blocks && table[end] >= 0) end++;
    for (int64_t b = end - 1; b >= from; b--) {
        drop_block(p, table[b]);
        table[b] = -1;
    }
    if (p->n_named[seq] > from) p->n_named[seq] = (int32_t)from;
}

int64_t fm_kv_seq_truncate(fm_kv_pool *p, int32_t seq, int64_t n) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0) return 0;
    if (n < 0) n = 0;
    if (n >= p->n_tokens[seq]) return p->n_tokens[seq];
    /* a cut inside a named block would write into it: keep only the whole blocks before it */
    if (n % p->block_tokens && fm_kv_prefix_named(p, seq, (int32_t)(n / p->block_tokens))) n -= n % p->block_tokens;
    drop_tail(p, seq, (n + p->block_tokens - 1) / p->block_tokens);
    p->n_tokens[seq] = n;
    return n;
}

int32_t fm_kv_seq_fork_block(fm_kv_pool *p, int32_t seq, int64_t i) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0 || i < 0 || i >= p->max_blocks || p->n_free < 1)
        return -1;
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    const int32_t old = table[i];
    if (old < 0 || (i + 1 < p->max_blocks && table[i + 1] >= 0)) return -1; /* not the last block */
    table[i] = take_block(p); /* before the old one is dropped: never the same block */
    drop_block(p, old);
    if (p->n_named[seq] > i) p->n_named[seq] = (int32_t)i;
    return old;
}

void fm_kv_seq_close(fm_kv_pool *p, int32_t seq) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0) return;
    drop_tail(p, seq, 0);
    p->n_tokens[seq] = -1;
}
