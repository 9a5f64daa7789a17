/* One rank's memory in a group of ranks (memory_plan.h, fm_memory_plan_rank): one model's plan with the rank's share
 * of the split weights, and what only a group has (the exchange buffers, the scratch of the received blocks). */
#include "backend/backend_kind.h"
#include "backend/ep_blocks.h"
#include "backend/size_math.h"
#include "dist/ep_moe.h"
#include "dist/rank_group.h"
#include "dist/tp_attention.h"
#include "engine/memory_plan.h"
#include "util/status.h"

/* --tp: the attention layers' q|k|v banks keep their heads' rows, o banks their heads' columns (model.c tp_views): the
 * bytes those banks lose on this rank, bank for bank as the load builds them */
static fm_status tp_attention_delta(fm_memory_plan *p, const fm_config *c, const fm_plan *plan, int32_t tp,
                                    int32_t rank, int64_t *delta, fm_error *err) {
    int32_t h0, nh, kv0, nkv;
    fm_tp_head_range(c->n_heads, c->n_kv_heads, tp, rank, &h0, &nh, &kv0, &nkv);
    *delta = 0;
    const fm_arch_desc *a = fm_arch_of(c);
    for (int32_t l = 0; l < p->n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *w = &d->specs[i];
            if ((w->bank != FM_BANK_QKV && w->bank != FM_BANK_O) || !fm_spec_present(w, c)) continue;
            const int32_t n = fm_spec_count(w, c);
            const int64_t rows = fm_spec_rows(w, c), cols = fm_spec_cols(w, c);
            int64_t r_rows = rows, r_cols = cols;
            if (w->bank == FM_BANK_QKV) { /* parts q, k, v: each part's rows per head of its kind */
                r_rows = 0;
                for (int32_t j = 0; j < w->n_parts; j++) {
                    const int64_t pr = fm_part_rows(&w->parts[j], c);
                    r_rows += j == 0 ? pr / c->n_heads * nh : pr / c->n_kv_heads * nkv;
                }
            } else {
                r_cols = cols / c->n_heads * nh;
            }
            size_t whole = 0, share = 0;
            fm_status st = fm_memory_bank_bytes(c, plan, p->backend, w->family, n, rows, cols, w->label, &whole, err);
            if (!st)
                st = fm_memory_bank_bytes(c, plan, p->backend, w->family, n, r_rows, r_cols, w->label, &share, err);
            if (st) return st;
            *delta += (int64_t)share - (int64_t)whole;
        }
    }
    return FM_OK;
}

/* --ep: fm_ep_buffers_alloc's send and receive blocks (each serving both trips), return rows and amaxes, and
 * forward.c's layer output of this rank's share of the tokens and every rank's, for p->tokens tokens */
static fm_status ep_exchange_bytes(const fm_memory_plan *p, const fm_config *c, const fm_plan *plan, int32_t ep,
                                   size_t act, size_t *out, fm_error *err) {
    const int64_t P = (p->tokens + ep - 1) / ep, H = c->hidden_size;
    fm_ep_layout L;
    fm_status st =
        fm_ep_layout_of(c->n_experts, ep, P, c->n_experts_per_tok, H, plan->a_dispatch, plan->act_bf16, &L, err);
    if (st) return st;
    fm_sz s = {false};
    const uint64_t block = L.dblock > L.rblock ? L.dblock : L.rblock;
    uint64_t b = fm_sz_mul(&s, fm_sz_mul(&s, 2, (uint64_t)ep), block);
    b = fm_sz_add(&s, b, (uint64_t)(L.cap > 0 ? L.cap : 1) * sizeof(int32_t));
    b = fm_sz_add(&s, b, (uint64_t)(1 + ep) * sizeof(float));
    b = fm_sz_add(&s, b, fm_sz_mul(&s, fm_sz_mul(&s, (uint64_t)(1 + ep), (uint64_t)(P * H)), act));
    *out = fm_sz_size(&s, b);
    if (s.ovf)
        return fm_fail(err, FM_ERR_FORMAT, "memory plan: the exchange buffers of %lld tokens overflow",
                       (long long)p->tokens);
    return FM_OK;
}

fm_status fm_memory_plan_rank(fm_memory_plan *p, const fm_config *cfg, const fm_plan *plan, int32_t ep, int32_t tp,
                              int32_t rank, fm_error *err) {
    ep = ep > 1 ? ep : 1, tp = tp > 1 ? tp : 1;
    fm_status st = fm_rank_split_check(cfg, ep, tp, err);
    if (st) return st;
    const int32_t N = ep > tp ? ep : tp;
    if (ep > 1 && tp > 1 && ep != tp)
        return fm_fail(err, FM_ERR_USAGE, "--ep %d with --tp %d: one group, the same ranks", ep, tp);
    if (rank < 0 || rank >= N) return fm_fail(err, FM_ERR_USAGE, "rank %d of a group of %d ranks", rank, N);
    if (p->ep_ranks > 1 || p->tp_ranks > 1)
        return fm_fail(err, FM_ERR_USAGE, "memory plan: already the plan of rank %d of a group", p->rank);
    const fm_backend_kind *kind = fm_backend_kind_find(p->backend);
    if (!kind) return fm_fail(err, FM_ERR_USAGE, "memory plan: unknown backend '%s'", p->backend);
    if (ep > 1 && p->experts_in == FM_EXPERTS_HOST)
        return fm_fail(err, FM_ERR_USAGE, "--ep with --experts-in host: each rank keeps its experts in its memory");
    p->ep_ranks = ep, p->tp_ranks = tp, p->rank = rank;
    if (ep > 1 && cfg->n_experts > 0) {
        int32_t first = 0, n = cfg->n_experts;
        fm_ep_expert_range(cfg->n_experts, ep, rank, &first, &n);
        /* an expert bank's bytes are n x a matrix's in every layout: the rank's n of the E */
        const size_t experts = p->weights[FM_MEM_EXPERTS] / (size_t)cfg->n_experts * (size_t)n;
        p->weight_total -= p->weights[FM_MEM_EXPERTS] - experts;
        p->weights[FM_MEM_EXPERTS] = experts;
        if ((st = ep_exchange_bytes(p, cfg, plan, ep, kind->act_size(plan), &p->ep_exchange, err))) return st;
        const uint64_t ws = kind->ep_workspace(cfg, plan, p->tokens, ep);
        if (ws > p->ws_moe) {
            p->workspace += (size_t)ws - p->ws_moe;
            p->ws_moe = (size_t)ws;
        }
    }
    if (tp > 1) {
        int64_t delta = 0;
        if ((st = tp_attention_delta(p, cfg, plan, tp, rank, &delta, err))) return st;
        p->weights[FM_MEM_ATTN] = (size_t)((int64_t)p->weights[FM_MEM_ATTN] + delta);
        p->weight_total = (size_t)((int64_t)p->weight_total + delta);
    }
    const size_t run = p->activations + p->workspace + p->kv_cache + p->kv_state + p->expert_pool + p->ep_exchange;
    p->total = p->weight_total + run;
    p->peak = p->weight_total + (run > p->load_staging ? run : p->load_staging);
    return FM_OK;
}
