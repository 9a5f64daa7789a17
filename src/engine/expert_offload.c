/* Experts in host memory, the engine's side (backend.h, "Experts in host memory"): the expert cache created once at
 * load from the memory plan's slot count, and the one call the forward pass makes before each moe op. */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "util/status.h"

struct fm_expert_offload {
    fm_expert_cache *cache;
    const fm_bank *pool_gate_up, *pool_down; /* the banks the moe op runs on: S slots */
    void *slot_ids; /* int32 [tokens x top-k] in backend memory: what the moe op reads; NULL: the routed ids */
    fm_bank **gate_up, **down; /* [n_layers] the host banks (NULL for a dense layer) */
    int32_t n_slots;
    size_t slot_bytes;
    /* the prefetch's prediction (fm_moe_prefetch), rows of at most FM_EXPERT_PREFETCH_MAX_T tokens: the normed
       residual [R, H], router logits [R, E], ids and weights [R, k]; one allocation (memory_plan.h) */
    void *pf_mem, *pf_h, *pf_logits, *pf_ids, *pf_w;
};

fm_status fm_expert_offload_create(fm_context *ctx, int32_t n_slots, fm_expert_policy policy, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    if (!ops->expert_cache_create || !ops->expert_fetch)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "--experts-in host: the %s backend cannot keep experts in host memory yet; --experts-in device "
                       "runs the model with every expert in its memory",
                       ops->name);
    fm_expert_offload *x = fm_calloc(1, sizeof *x, err, "expert offload");
    if (!x) return FM_ERR_NOMEM;
    x->gate_up = fm_calloc((size_t)m->n_layers, sizeof *x->gate_up, err, "expert offload");
    x->down = fm_calloc((size_t)m->n_layers, sizeof *x->down, err, "expert offload");
    fm_status st = x->gate_up && x->down ? FM_OK : FM_ERR_NOMEM;
    for (int l = 0; !st && l < m->n_layers; l++)
        if (m->layers[l].is_moe) x->gate_up[l] = m->layers[l].gate_up, x->down[l] = m->layers[l].down;
    const fm_expert_cache_desc d = {m->n_layers, m->cfg.n_experts, n_slots, ctx->buf_tokens * m->cfg.n_experts_per_tok,
                                    policy,      x->gate_up,       x->down};
    if (!st) st = ops->expert_cache_create(be, &d, &x->cache, &x->pool_gate_up, &x->pool_down, &x->slot_ids, err);
    if (st) {
        free(x->gate_up), free(x->down), free(x);
        return st;
    }
    x->n_slots = n_slots;
    x->slot_bytes = (ops->bank_bytes(x->pool_gate_up) + ops->bank_bytes(x->pool_down)) / (size_t)n_slots;
    ctx->experts = x;
    if (ops->expert_prefetch) {
        fm_expert_prefetch_layout pf;
        fm_expert_prefetch_layout_of(&m->cfg, ctx->buf_tokens, &pf);
        if (!(x->pf_mem = ops->alloc(be, pf.total))) {
            fm_expert_offload_free(ctx);
            return fm_fail(err, FM_ERR_NOMEM, "out of %s memory for the expert prefetch's buffers (%zu bytes)",
                           ops->name, pf.total);
        }
        char *b = x->pf_mem;
        x->pf_h = b + pf.h, x->pf_logits = b + pf.logits, x->pf_ids = b + pf.ids, x->pf_w = b + pf.w;
    }
    return FM_OK;
}

void fm_expert_offload_free(fm_context *ctx) {
    const fm_model *m = ctx->m;
    fm_expert_offload *x = ctx->experts;
    if (!x) return;
    m->be->ops->expert_cache_free(m->be, x->cache);
    if (x->pf_mem) m->be->ops->free(m->be, x->pf_mem);
    free(x->gate_up), free(x->down), free(x);
    ctx->experts = NULL;
}

fm_moe_experts fm_moe_experts_of(fm_context *ctx, int32_t l, const void *ids, int64_t P) {
    const fm_model *m = ctx->m;
    const fm_layer_weights *L = &m->layers[l];
    fm_expert_offload *x = ctx->experts;
    if (!x) return (fm_moe_experts){L->gate_up, L->down, ids};
    m->be->ops->expert_fetch(m->be, x->cache, l, ids, P);
    /* no slot-id buffer: the pool banks take the routed ids as they are (cuda: views through a slot table) */
    return (fm_moe_experts){x->pool_gate_up, x->pool_down, x->slot_ids ? x->slot_ids : ids};
}

bool fm_moe_prefetch_on(const fm_context *ctx, int32_t l, int64_t T) {
    const fm_model *m = ctx->m;
    return ctx->experts && ctx->experts->pf_mem && m->layers[l].is_moe && !ctx->ep_comm &&
           fm_routes_expert_prefetch(&m->routes, T);
}

void fm_moe_prefetch(fm_context *ctx, int32_t l, const void *x, int64_t T) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    const fm_config *c = &m->cfg;
    const fm_layer_weights *L = &m->layers[l];
    fm_expert_offload *o = ctx->experts;
    ops->rmsnorm(be, x, L->ffn_norm, T, c->hidden_size, c->rms_norm_eps, o->pf_h);
    if (ops->side_begin) ops->side_begin(be);
    ops->router(be, L->router, o->pf_h, T, c->n_experts_per_tok, c->router, c->norm_topk_prob, o->pf_logits, o->pf_ids,
                o->pf_w);
    ops->expert_prefetch(be, o->cache, l, o->pf_ids, T, c->n_experts_per_tok,
                         fm_routes_expert_prefetch_top(&m->routes, c->n_experts_per_tok));
    if (ops->side_end) ops->side_end(be);
}

bool fm_context_expert_stats(const fm_context *ctx, fm_expert_stats *out) {
    const fm_model *m = ctx->m;
    *out = (fm_expert_stats){0};
    const fm_expert_offload *x = ctx->experts;
    if (!x) return false;
    fm_expert_cache_stats s;
    m->be->ops->expert_cache_stats(m->be, x->cache, &s);
    int32_t moe = 0;
    for (int l = 0; l < m->n_layers; l++) moe += m->layers[l].is_moe;
    *out = (fm_expert_stats){x->n_slots,        moe * m->cfg.n_experts, s.fetches,     s.hits,
                             s.misses,          s.bytes_copied,         x->slot_bytes, s.prefetches,
                             s.prefetch_copies, s.bytes_prefetched};
    return true;
}
