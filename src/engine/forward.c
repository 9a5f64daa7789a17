/* The forward pass (prefill over positions 0..T-1), written once against the backend op table.
 *
 *   x = embed(ids)                                                  [T, H]
 *   per layer:  h = rmsnorm(x);  qkv = h Wqkv^T;  qk_norm + RoPE;  a = attention(qkv);  x += a Wo^T
 *               h = rmsnorm(x);  MoE: route(h Wr^T) -> x += sum_k w_k expert_k(h)
 *                                dense: x += down(swiglu(h Wgu^T))
 *   logits = rmsnorm(x) Wlm^T                                       [T, vocab]
 */
#include <string.h>

#include "engine/engine.h"
#include "util/status.h"

typedef struct fw_buffers {
    void *ids, *x, *h, *qkv, *att, *y, *gu, *act, *rlogits, *eids, *ew, *logits;
} fw_buffers;

static void free_buffers(fm_backend *be, fw_buffers *b) {
    void **p = (void **)b;
    for (size_t i = 0; i < sizeof *b / sizeof(void *); i++)
        if (p[i]) be->ops->free(be, p[i]);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static fm_status alloc_buffers(fm_model *m, int64_t T, fw_buffers *b, fm_error *err) {
    const fm_config *c = &m->cfg;
    fm_backend      *be = m->be;
    const size_t     a  = be->ops->act_size;
    const int64_t    H = c->hidden_size, hd = c->head_dim, qkv = (int64_t)(c->n_heads + 2 * c->n_kv_heads) * hd;
    const int64_t    I = max64(c->moe_intermediate, c->dense_intermediate), E = c->n_experts > 0 ? c->n_experts : 1;
    const int64_t    k = c->n_experts_per_tok > 0 ? c->n_experts_per_tok : 1;
    const struct { void **p; size_t bytes; const char *what; } want[] = {
        {&b->ids, (size_t)T * sizeof(int32_t), "ids"},
        {&b->x, (size_t)(T * H) * a, "residual"},
        {&b->h, (size_t)(T * H) * a, "normed"},
        {&b->qkv, (size_t)(T * qkv) * a, "qkv"},
        {&b->att, (size_t)(T * c->n_heads * hd) * a, "attention out"},
        {&b->y, (size_t)(T * H) * a, "block out"},
        {&b->gu, (size_t)(T * 2 * I) * a, "gate_up"},
        {&b->act, (size_t)(T * I) * a, "swiglu"},
        {&b->rlogits, (size_t)(T * E) * a, "router logits"},
        {&b->eids, (size_t)(T * k) * sizeof(int32_t), "expert ids"},
        {&b->ew, (size_t)(T * k) * a, "expert weights"},
        {&b->logits, (size_t)(T * c->vocab_size) * a, "logits"},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!(*want[i].p = be->ops->alloc(be, want[i].bytes)))
            return fm_fail(err, FM_ERR_NOMEM, "out of %s memory for the %s buffer (%zu bytes, %lld tokens)",
                           be->ops->name, want[i].what, want[i].bytes, (long long)T);
    return FM_OK;
}

fm_status fm_forward(fm_model *m, const int32_t *ids, int64_t T, float *logits, fm_error *err) {
    const fm_config      *c   = &m->cfg;
    const fm_plan        *p   = &m->plan;
    fm_backend           *be  = m->be;
    const fm_backend_ops *ops = be->ops;
    const int64_t H = c->hidden_size;
    const int32_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    fw_buffers b;
    memset(&b, 0, sizeof b);
    fm_status st = alloc_buffers(m, T, &b, err);
    if (st) {
        free_buffers(be, &b);
        return st;
    }
    ops->upload_ids(be, ids, T, b.ids);
    ops->embed(be, m->embed, b.ids, T, b.x);
    for (int l = 0; l < m->n_layers; l++) {
        const fm_layer_weights *L = &m->layers[l];
        ops->rmsnorm(be, b.x, L->attn_norm, T, H, c->rms_norm_eps, b.h);
        ops->linear(be, L->qkv, 0, b.h, T, p->a_dense, b.qkv);
        ops->qk_norm_rope(be, b.qkv, T, nh, nkv, hd, L->q_norm, L->k_norm, c->rms_norm_eps, 0, c->rope_theta);
        ops->attention(be, b.qkv, T, nh, nkv, hd, b.att);
        ops->linear(be, L->o, 0, b.att, T, p->a_dense, b.y);
        ops->add(be, b.x, b.y, T * H);

        ops->rmsnorm(be, b.x, L->ffn_norm, T, H, c->rms_norm_eps, b.h);
        if (L->is_moe) {
            ops->linear(be, L->router, 0, b.h, T, FM_A_NATIVE, b.rlogits);
            ops->route(be, b.rlogits, T, c->n_experts, c->n_experts_per_tok, c->router, c->norm_topk_prob, b.eids, b.ew);
            ops->moe(be, L->gate_up, L->down, b.h, T, b.eids, b.ew, c->n_experts_per_tok, p->a_dispatch, p->a_expert,
                     b.y);
        } else {
            ops->linear(be, L->gate_up, 0, b.h, T, p->a_dense, b.gu);
            ops->swiglu(be, b.gu, T, c->dense_intermediate, b.act);
            ops->linear(be, L->down, 0, b.act, T, p->a_dense, b.y);
        }
        ops->add(be, b.x, b.y, T * H);
    }
    ops->rmsnorm(be, b.x, m->final_norm, T, H, c->rms_norm_eps, b.h);
    ops->linear(be, m->lm_head, 0, b.h, T, FM_A_NATIVE, b.logits);
    st = ops->sync(be, err);
    if (!st) ops->download_f32(be, b.logits, T * c->vocab_size, logits);
    free_buffers(be, &b);
    return st;
}
