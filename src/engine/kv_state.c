/* The generation state of a loaded model (kv_state.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/attention_paged.h"
#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "engine/state_cache.h"
#include "model/arch.h"
#include "util/status.h"

/* the backend allocations, in one list so that create and free cannot disagree */
#define KV_BUFFERS(s)                                                                                                  \
    void **bufs[] = {&(s)->k,      &(s)->v,           &(s)->tok_seq,  &(s)->tok_pos, &(s)->slots,                      \
                     &(s)->tables, &(s)->att_scratch, &(s)->params,   &(s)->steps,   &(s)->counts,                     \
                     &(s)->seen,   &(s)->z,           &(s)->row_slot, &(s)->ids_out, &(s)->info_out,                   \
                     &(s)->bias,   &(s)->mask,        &(s)->gdn_conv, &(s)->gdn_rec}

void fm_kv_state_free(fm_context *ctx, fm_kv_state *s) {
    const fm_model *m = ctx->m;
    if (!s) return;
    for (int b = 0; b < FM_DECODE_BUCKETS && m->be->ops->graph_free; b++) {
        m->be->ops->graph_free(m->be, s->graphs[b]);
        m->be->ops->graph_free(m->be, s->pass_graphs[b]);
        m->be->ops->graph_free(m->be, s->sample_graphs[b]);
    }
    for (int b = 0; b < FM_MIXED_BUCKETS && m->be->ops->graph_free; b++)
        m->be->ops->graph_free(m->be, s->mixed_graphs[b]);
    fm_state_cache_free(ctx, s->snaps);
    KV_BUFFERS(s);
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (*bufs[i]) m->be->ops->free(m->be, *bufs[i]);
    fm_kv_pool_free(&s->pool);
    free(s->h_idx), free(s->h_step), free(s->h_info), free(s->h_pad);
    if (m->be->ops->host_free) m->be->ops->host_free(m->be, s->h_mask);
    else free(s->h_mask);
    free(s);
}

enum { KV_N_BUFFERS = 19 };

/* attention_paged's scratch for any step of 1..max_rows tokens: the split count falls as T grows, so the largest
 * need is not at max_rows (one split, no scratch, from 512 tokens) but at a small T */
static size_t paged_scratch(const fm_config *c, int64_t max_rows, int64_t ctx) {
    size_t most = 0;
    for (int64_t T = 1; T <= max_rows; T++) {
        const size_t b = fm_attention_paged_scratch_bytes(T, c->n_heads, c->head_dim, ctx);
        most = b > most ? b : most;
    }
    return most;
}

/* The bytes of each buffer of KV_BUFFERS, in its order: the single source of the sizes (create and the memory plan) */
static void kv_bytes(const fm_config *c, int32_t n_layers, size_t row_bytes, const fm_kv_pool *pool, int64_t ctx,
                     int64_t max_rows, size_t bytes[KV_N_BUFFERS]) {
    const int64_t slots = (int64_t)pool->n_blocks * pool->block_tokens;
    const int32_t n_attn = fm_arch_attention_layers(c, n_layers), n_gdn = n_layers - n_attn;
    const size_t gdn_seqs = (size_t)n_gdn * (size_t)pool->max_seqs * sizeof(float);
    const fm_gdn_shape g = fm_gdn_shape_of(c);
    const size_t V = (size_t)c->vocab_size, S = (size_t)pool->max_seqs + 1, layer = (size_t)slots * row_bytes;
    const size_t R = (size_t)fm_decode_bucket(pool->max_seqs); /* sampled rows at most: a padded decode step */
    const size_t b[KV_N_BUFFERS] = {
        (size_t)n_attn * layer, /* k */
        (size_t)n_attn * layer, /* v */
        (size_t)max_rows * 4,
        (size_t)max_rows * 4,
        (size_t)max_rows * 4,                                  /* tok_seq, tok_pos, slots */
        (size_t)pool->max_seqs * (size_t)pool->max_blocks * 4, /* tables */
        paged_scratch(c, max_rows, ctx),
        S * sizeof(fm_sampling),
        S * sizeof(uint64_t), /* params, steps */
        S * V * sizeof(int32_t),
        S * V,
        R * V * sizeof(float), /* counts, seen, z */
        R * 4,
        R * 4,
        R * sizeof(fm_sample_info), /* row_slot, ids_out, info_out */
        S * FM_MAX_LOGIT_BIAS * sizeof(fm_logit_bias),
        R * ((V + 31) / 32) * sizeof(uint32_t), /* bias, mask */
        n_gdn ? gdn_seqs * (size_t)fm_gdn_conv_state_elems(g) : 0,
        n_gdn ? gdn_seqs * (size_t)fm_gdn_rec_state_elems(g) : 0, /* gdn_conv, gdn_rec */
    };
    memcpy(bytes, b, sizeof b);
}

fm_status fm_kv_state_plan(const fm_config *c, int32_t n_layers, size_t row_bytes, int32_t max_seqs, int64_t ctx,
                           int64_t max_rows, size_t *cache, size_t *state, fm_error *err) {
    fm_kv_pool pool;
    fm_status st = fm_kv_pool_init(&pool, max_seqs, ctx, FM_KV_BLOCK_TOKENS, 0, err);
    if (st) return st;
    size_t bytes[KV_N_BUFFERS];
    kv_bytes(c, n_layers, row_bytes, &pool, ctx,
             max_rows > fm_decode_bucket(max_seqs) ? max_rows : fm_decode_bucket(max_seqs), bytes);
    fm_kv_pool_free(&pool);
    *cache = bytes[0] + bytes[1] + bytes[KV_N_BUFFERS - 2] + bytes[KV_N_BUFFERS - 1]; /* K, V and the GDN states */
    *state = 0;
    for (int i = 2; i < KV_N_BUFFERS - 2; i++) *state += bytes[i];
    return FM_OK;
}

fm_status fm_kv_state_create(fm_context *ctx, int32_t max_seqs, int64_t max_rows, fm_kv_state **out, fm_error *err) {
    const fm_model *m = ctx->m;
    *out = NULL;
    const fm_config *c = &m->cfg;
    if (m->n_ctx <= 0)
        return fm_fail(err, FM_ERR_USAGE,
                       "generation needs a context to plan the KV cache for: the config has no "
                       "max_position_embeddings; pass --ctx N");
    fm_kv_state *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    fm_status st = fm_kv_pool_init(&s->pool, max_seqs, m->n_ctx, FM_KV_BLOCK_TOKENS, 0, err);
    if (st) {
        free(s);
        return st;
    }
    s->dtype = m->plan.kv;
    s->row_bytes = fm_kv_row_bytes(m->be->ops, c->n_kv_heads, c->head_dim, m->plan.kv);
    s->layer_bytes = (int64_t)s->pool.n_blocks * s->pool.block_tokens * s->row_bytes;
    s->max_rows = max_rows > fm_decode_bucket(max_seqs) ? max_rows : fm_decode_bucket(max_seqs);
    s->pad_slot = max_seqs;
    size_t bytes[KV_N_BUFFERS];
    kv_bytes(c, m->n_layers, (size_t)s->row_bytes, &s->pool, m->n_ctx, s->max_rows, bytes);
    KV_BUFFERS(s);
    _Static_assert(sizeof bufs / sizeof *bufs == KV_N_BUFFERS, "one size per buffer");
    for (size_t i = 0; i < KV_N_BUFFERS; i++)
        if (!(*bufs[i] = m->be->ops->alloc(m->be, bytes[i] ? bytes[i] : 1))) {
            fm_kv_state_free(ctx, s);
            return fm_fail(err, FM_ERR_NOMEM, "out of %s memory for the KV cache and decode state (%zu bytes)",
                           m->be->ops->name, bytes[i]);
        }
    const size_t rows = (size_t)fm_decode_bucket(max_seqs);
    s->h_step = malloc(4 * rows * sizeof *s->h_step);
    s->h_info = malloc(rows * sizeof *s->h_info);
    const size_t mask_bytes = rows * (size_t)((c->vocab_size + 31) / 32) * sizeof *s->h_mask;
    /* pinned where the backend has it: the masks' upload must not wait for the forward pass it overlaps */
    s->h_mask = m->be->ops->host_alloc ? m->be->ops->host_alloc(m->be, mask_bytes) : malloc(mask_bytes);
    s->h_pad = malloc((size_t)s->max_rows * 3 * sizeof *s->h_pad);
    if (!(s->h_idx = malloc((size_t)s->max_rows * 3 * sizeof *s->h_idx)) || !s->h_step || !s->h_info || !s->h_mask ||
        !s->h_pad) {
        fm_kv_state_free(ctx, s);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    s->tables_dirty = true;
    /* the padding rows' sampler slot: greedy, no penalty state (its ids are never read) */
    fm_sampling greedy;
    fm_sampling_init(&greedy);
    const uint64_t zero = 0;
    uint8_t *zeros = calloc((size_t)c->vocab_size, sizeof(int32_t));
    if (!zeros) {
        fm_kv_state_free(ctx, s);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    const size_t V = (size_t)c->vocab_size, p = (size_t)s->pad_slot;
    m->be->ops->upload_raw(m->be, &greedy, sizeof greedy, (char *)s->params + p * sizeof greedy);
    m->be->ops->upload_raw(m->be, &zero, sizeof zero, (char *)s->steps + p * sizeof zero);
    m->be->ops->upload_raw(m->be, zeros, V * sizeof(int32_t), (char *)s->counts + p * V * sizeof(int32_t));
    m->be->ops->upload_raw(m->be, zeros, V, (char *)s->seen + p * V);
    /* attention_paged's counters (backend/attention_paged.h), zero before the first call; each call leaves them so */
    if (paged_scratch(c, s->max_rows, m->n_ctx)) {
        const size_t cb = fm_attention_paged_counter_bytes(c->n_heads);
        for (size_t o = 0; o < cb; o += V * sizeof(int32_t)) {
            const size_t n = cb - o < V * sizeof(int32_t) ? cb - o : V * sizeof(int32_t);
            m->be->ops->upload_raw(m->be, zeros, n, (char *)s->att_scratch + o);
        }
    }
    st = m->be->ops->sync(m->be, err);
    free(zeros);
    if (st) {
        fm_kv_state_free(ctx, s);
        return st;
    }
    *out = s;
    return FM_OK;
}

fm_status fm_kv_seq_sampler_reset(fm_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt,
                                  const fm_sampling *sp, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_kv_state *s = ctx->kv;
    fm_status st = fm_sampling_check(sp, err);
    if (st) return st;
    const size_t V = (size_t)m->cfg.vocab_size;
    int32_t *counts = calloc(V, sizeof *counts);
    uint8_t *seen = calloc(V, 1);
    if (!counts || !seen) {
        free(counts), free(seen);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n_prompt; i++) fm_sample_state_add((int32_t)V, prompt[i], false, counts, seen);
    const uint64_t zero = 0;
    fm_backend *be = m->be;
    be->ops->upload_raw(be, sp, sizeof *sp, (char *)s->params + (size_t)seq * sizeof *sp);
    be->ops->upload_raw(be, &zero, sizeof zero, (char *)s->steps + (size_t)seq * sizeof zero);
    be->ops->upload_raw(be, counts, V * sizeof *counts, (char *)s->counts + (size_t)seq * V * sizeof *counts);
    be->ops->upload_raw(be, seen, V, (char *)s->seen + (size_t)seq * V);
    free(counts), free(seen);
    return FM_OK;
}

fm_status fm_kv_seq_begin(fm_context *ctx, const int32_t *prompt, int64_t n_prompt, const fm_sampling *sp, int32_t *seq,
                          fm_error *err) {
    fm_status st = fm_sampling_check(sp, err);
    int32_t open = 0;
    for (int32_t i = 0; !st && i < ctx->kv->pool.max_seqs; i++) open += ctx->kv->pool.n_tokens[i] >= 0;
    if (!st && ctx->n_seqs < ctx->kv->pool.max_seqs && open >= ctx->n_seqs)
        st = fm_fail(err, FM_ERR_USAGE, "the context's %d sequences are all open (fm_context_params.max_seqs)",
                     ctx->n_seqs);
    if (!st) st = fm_kv_seq_open(&ctx->kv->pool, seq, err);
    if (st) return st;
    st = fm_kv_seq_sampler_reset(ctx, *seq, prompt, n_prompt, sp, err);
    if (st) fm_kv_seq_close(&ctx->kv->pool, *seq);
    return st;
}

void fm_kv_seq_set_bias(fm_context *ctx, int32_t seq, const fm_logit_bias *bias, int32_t n) {
    const fm_model *m = ctx->m;
    if (n > 0)
        m->be->ops->upload_raw(m->be, bias, (size_t)n * sizeof *bias,
                               (char *)ctx->kv->bias + (size_t)seq * FM_MAX_LOGIT_BIAS * sizeof *bias);
}

int64_t fm_kv_seq_cut(fm_context *ctx, int32_t seq, int64_t n) {
    const fm_model *m = ctx->m;
    fm_kv_state *s = ctx->kv;
    fm_kv_pool *p = &s->pool;
    const int32_t bt = p->block_tokens, i = (int32_t)(n / bt);
    if (n >= 0 && n < fm_kv_seq_tokens(p, seq) && n % bt && fm_kv_prefix_named(p, seq, i)) {
        fm_kv_seq_truncate(p, seq, ((int64_t)i + 1) * bt); /* block i is the last one now */
        const int32_t from = fm_kv_seq_fork_block(p, seq, i);
        if (from >= 0) {
            const int32_t to = fm_kv_block_of(p, seq, (int64_t)i * bt);
            const size_t layer = (size_t)s->layer_bytes;
            const size_t block = layer / (size_t)p->n_blocks; /* one block's K (or V) of one layer */
            const int32_t n_attn = fm_arch_attention_layers(&m->cfg, m->n_layers);
            for (int32_t l = 0; l < n_attn; l++)
                for (int kv = 0; kv < 2; kv++) {
                    char *base = (char *)(kv ? s->v : s->k) + (size_t)l * layer;
                    m->be->ops->copy(m->be, base + (size_t)from * block, block, base + (size_t)to * block);
                }
        }
    }
    s->tables_dirty = true;
    return fm_kv_seq_truncate(p, seq, n);
}

void fm_kv_seq_end(fm_context *ctx, int32_t seq) {
    fm_state_cache_seq_end(ctx, seq);
    fm_kv_seq_close(&ctx->kv->pool, seq);
    ctx->kv->tables_dirty = true;
}

fm_status fm_kv_state_prefix_cache(fm_context *ctx, bool on, int32_t state_slots, fm_error *err) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    fm_kv_state *kv = ctx->kv;
    const int32_t n_attn = fm_arch_attention_layers(c, m->n_layers), n_gdn = m->n_layers - n_attn;
    fm_state_cache_free(ctx, kv->snaps);
    kv->snaps = NULL;
    kv->pool.prefix_cache = on && (n_gdn == 0 || state_slots > 0);
    if (!on || n_gdn == 0) return FM_OK;
    /* what one snapshot costs, against what a block of KV holds */
    const double snap = (double)fm_state_cache_snapshot_bytes(c, m->n_layers);
    const double block = (double)fm_kv_block_bytes(n_attn, kv->row_bytes, kv->pool.block_tokens);
    if (state_slots <= 0) {
        fprintf(stderr,
                "fp8moe: prefix caching is off for this hybrid model: --state-cache-slots 0 (a snapshot of its %d "
                "Gated DeltaNet layers' states is %.0f KiB, %.1fx a %d-token block's %.0f KiB of KV)\n",
                n_gdn, snap / 1024.0, block > 0 ? snap / block : 0.0, kv->pool.block_tokens, block / 1024.0);
        return FM_OK;
    }
    fm_status st = fm_state_cache_create(ctx, state_slots, &kv->snaps, err);
    if (st) {
        kv->pool.prefix_cache = false;
        return st;
    }
    char each[32], all[32];
    fprintf(stderr,
            "fp8moe: prefix cache of this hybrid model: %d snapshots of its %d Gated DeltaNet layers' states, %s each "
            "(%.1fx a %d-token block's KV), %s in all (--state-cache-slots)\n",
            state_slots, n_gdn, fm_mem_format((size_t)snap, each, sizeof each), block > 0 ? snap / block : 0.0,
            kv->pool.block_tokens, fm_mem_format((size_t)snap * (size_t)state_slots, all, sizeof all));
    return FM_OK;
}
