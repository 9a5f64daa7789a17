/* The per-op floor's bytes (op_bytes.h). */
#include "engine/op_bytes.h"

#include "engine/kv_state.h"

#include <math.h>

static double act(const fm_model *m) { return (double)m->be->ops->act_size; }
static double bank(const fm_model *m, const fm_bank *w) { return w ? (double)m->be->ops->bank_bytes(w) : 0; }

double fm_op_bytes_linear(const fm_model *m, const fm_bank *w, int64_t T, int64_t in, int64_t out) {
    return bank(m, w) + act(m) * (double)T * (double)(in + out);
}

double fm_op_bytes_act(const fm_model *m, int64_t T, int64_t n, int reads, int writes) {
    return act(m) * (double)T * (double)n * (reads + writes);
}

double fm_op_bytes_embed(const fm_model *m, int64_t T) {
    const double row = bank(m, m->embed) / (double)m->cfg.vocab_size; /* one token's row, as stored */
    return (double)T * row + fm_op_bytes_act(m, T, m->cfg.hidden_size, 0, 1);
}

/* K and V entries the paged rows read: each row's up to its position */
static double attention_entries(int64_t T, const int32_t *pos) {
    double entries = 0;
    for (int64_t t = 0; t < T; t++) entries += pos[t] + 1.0;
    return entries;
}

/* bytes of one cached K or V element as stored: the act dtype's, or an e4m3 row's codes and scales per element */
static double kv_elem(const fm_model *m) {
    const fm_context *ctx = m->context;
    if (!ctx || !ctx->kv || ctx->kv->dtype != FM_KV_E4M3) return act(m);
    return (double)ctx->kv->row_bytes / ((double)m->cfg.n_kv_heads * m->cfg.head_dim);
}

double fm_op_bytes_attention(const fm_model *m, int64_t T, const int32_t *pos) {
    const double A = act(m), q = (double)m->tp_nh * m->cfg.head_dim, kv = 2.0 * m->tp_nkv * m->cfg.head_dim;
    if (pos) /* the paged cache as stored, the queries in and out */
        return A * (double)T * 2 * q + (double)attention_entries(T, pos) * kv * kv_elem(m);
    return A * ((double)T * 2 * q + (double)T * kv); /* the pass's own K and V */
}

double fm_op_bytes_experts(const fm_model *m, int32_t l, int64_t T) {
    const fm_config *c = &m->cfg;
    const fm_layer_weights *L = &m->layers[l];
    const double E = c->n_experts, k = c->n_experts_per_tok, t = (double)T;
    /* with the shared expert in the bank (moe.shared) every token routes to it: it is touched, the rest as before */
    const double s = c->shared_in_bank ? 1.0 : 0.0;
    const double touched = s + (E - s) * (1.0 - pow(1.0 - (k - s) / (E - s), t));
    const double per_expert = (bank(m, L->gate_up) + bank(m, L->down)) / E;
    return touched * per_expert + act(m) * (t * 2.0 * c->hidden_size + t * k * 3.0 * c->moe_intermediate);
}

double fm_op_bytes_shared_expert(const fm_model *m, int32_t l, int64_t T) {
    const fm_layer_weights *L = &m->layers[l];
    const int64_t H = m->cfg.hidden_size, I = m->cfg.shared_expert_intermediate;
    return fm_op_bytes_linear(m, L->shared_gate_up, T, H, 2 * I) + fm_op_bytes_act(m, T, I, 2, 1) +
           fm_op_bytes_linear(m, L->shared_down, T, I, H);
}

double fm_op_bytes_gdn_conv(const fm_model *m, int32_t l, int64_t T, bool cached) {
    const fm_gdn_shape g = fm_gdn_shape_of(&m->cfg);
    const double state = cached ? (double)T * 2.0 * 4.0 * (double)fm_gdn_conv_state_elems(g) : 0; /* fp32 */
    return bank(m, m->layers[l].gdn_conv) + fm_op_bytes_act(m, T, fm_gdn_channels(g), 1, 1) + state;
}

double fm_op_bytes_gdn_rule(const fm_model *m, int64_t T, int64_t states) {
    const fm_gdn_shape g = fm_gdn_shape_of(&m->cfg);
    return fm_op_bytes_act(m, T, fm_gdn_channels(g) + 2 * g.nv, 1, 0) +
           fm_op_bytes_act(m, T, (int64_t)g.nv * g.dv, 0, 1) +
           (double)states * 2.0 * 4.0 * (double)fm_gdn_rec_state_elems(g);
}

double fm_op_bytes_gdn_decode_fused(const fm_model *m, int32_t l, int64_t T) {
    const fm_gdn_shape g = fm_gdn_shape_of(&m->cfg);
    const int64_t C = fm_gdn_channels(g), nvdv = (int64_t)g.nv * g.dv;
    const double conv_state = (double)T * 2.0 * 4.0 * (double)fm_gdn_conv_state_elems(g); /* fp32, read and written */
    const double rec_state = (double)T * 2.0 * 4.0 * (double)fm_gdn_rec_state_elems(g);
    /* q | k | v and z of qkvz, b and a in; the rule's row out and back in; the normed row out */
    return bank(m, m->layers[l].gdn_conv) + fm_op_bytes_act(m, T, C + nvdv + 2 * (int64_t)g.nv, 1, 0) +
           fm_op_bytes_act(m, T, nvdv, 1, 2) + conv_state + rec_state;
}
