/* The paged KV cache's bookkeeping (kv_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "util/status.h"

int64_t fm_kv_block_bytes(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, int32_t block_tokens,
                          int32_t elem_bytes) {
    return 2 * (int64_t)n_layers * n_kv_heads * head_dim * block_tokens * elem_bytes;
}

fm_status fm_kv_pool_init(fm_kv_pool *p, int32_t max_seqs, int64_t ctx, int32_t block_tokens, int64_t n_blocks,
                          fm_error *err) {
    memset(p, 0, sizeof *p);
    if (max_seqs < 1 || ctx < 1 || block_tokens < 1)
        return fm_fail(err, FM_ERR_USAGE, "KV cache: max_seqs (%d), ctx (%lld) and block size (%d) must be >= 1",
                       max_seqs, (long long)ctx, block_tokens);
    const int64_t per_seq = (ctx + block_tokens - 1) / block_tokens;
    const int64_t total = n_blocks > 0 ? n_blocks : per_seq * max_seqs;
    if (total > INT32_MAX / 2 || per_seq * max_seqs > INT32_MAX / 2)
        return fm_fail(err, FM_ERR_USAGE, "KV cache: %d sequences of %lld tokens need %lld blocks, more than %d",
                       max_seqs, (long long)ctx, (long long)total, INT32_MAX / 2);
    p->n_blocks = (int32_t)total, p->block_tokens = block_tokens, p->max_seqs = max_seqs;
    p->max_blocks = (int32_t)per_seq, p->ctx = ctx;
    p->free_stack = fm_malloc((size_t)total * sizeof *p->free_stack, err, "KV block stack");
    p->tables = fm_malloc((size_t)(per_seq * max_seqs) * sizeof *p->tables, err, "KV block tables");
    p->n_tokens = fm_malloc((size_t)max_seqs * sizeof *p->n_tokens, err, "KV sequence lengths");
    if (!p->free_stack || !p->tables || !p->n_tokens) {
        fm_kv_pool_free(p);
        return FM_ERR_NOMEM;
    }
    for (int32_t i = 0; i < p->n_blocks; i++) p->free_stack[i] = p->n_blocks - 1 - i; /* block 0 on top */
    p->n_free = p->n_blocks;
    for (int64_t i = 0; i < per_seq * max_seqs; i++) p->tables[i] = -1;
    for (int32_t s = 0; s < max_seqs; s++) p->n_tokens[s] = -1;
    return FM_OK;
}

void fm_kv_pool_free(fm_kv_pool *p) {
    free(p->free_stack), free(p->tables), free(p->n_tokens);
    memset(p, 0, sizeof *p);
}

fm_status fm_kv_seq_open(fm_kv_pool *p, int32_t *seq, fm_error *err) {
    for (int32_t s = 0; s < p->max_seqs; s++)
        if (p->n_tokens[s] < 0) {
            p->n_tokens[s] = 0;
            *seq = s;
            return FM_OK;
        }
    return fm_fail(err, FM_ERR_NOMEM, "KV cache: all %d sequence slots are in use (--max-seqs)", p->max_seqs);
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
    for (int64_t b = blocks_have; b < blocks_want; b++) table[b] = p->free_stack[--p->n_free];
    p->n_tokens[seq] = want;
    return FM_OK;
}

void fm_kv_seq_truncate(fm_kv_pool *p, int32_t seq, int64_t n) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0 || n < 0 || n >= p->n_tokens[seq]) return;
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    for (int64_t b = (n + p->block_tokens - 1) / p->block_tokens; b < p->max_blocks && table[b] >= 0; b++) {
        p->free_stack[p->n_free++] = table[b];
        table[b] = -1;
    }
    p->n_tokens[seq] = n;
}

void fm_kv_seq_close(fm_kv_pool *p, int32_t seq) {
    if (seq < 0 || seq >= p->max_seqs || p->n_tokens[seq] < 0) return;
    int32_t *table = p->tables + (int64_t)seq * p->max_blocks;
    for (int32_t b = 0; b < p->max_blocks && table[b] >= 0; b++) {
        p->free_stack[p->n_free++] = table[b];
        table[b] = -1;
    }
    p->n_tokens[seq] = -1;
}
