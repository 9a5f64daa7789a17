/* The floor of a prefill: per stage, the fewest bytes it must move through device memory (each weight read
 * once, each activation read once and written once) and the FLOPs it must do. What a benchmark prints next to
 * its times: floor time = max(bytes / bandwidth, FLOPs / matrix rate). The weights and projections come from the
 * architecture's description (model/arch.h); the attention, norms and residual adds from the configuration. */
#include "engine/cost.h"
#include "model/arch.h"

#include <math.h>
#include <string.h>

static double weight_bytes(fm_wformat f, double rows, double cols) {
    if (fm_wformat_is_int4(f)) return rows * cols / 2 + rows * ceil(cols / 128) * 2; /* codes + bf16 scales */
    if (f == FM_W_E4M3_PT) return rows * cols; /* + one scale per matrix, negligible */
    return rows * cols * (f == FM_W_F32 ? 4 : 2);
}

/* One layer's linears by family, from its description: weight bytes, the activations each reads and writes per
 * token (cols in, rows out), and multiply-adds per token (rows x cols). Expert banks form a chain (gate_up, then
 * down): its first input and last output are per token, the rest per routed pair. */
typedef struct layer_sums {
    bool has[FM_WF_COUNT];
    double w[FM_WF_COUNT], act[FM_WF_COUNT], macs[FM_WF_COUNT];
    double x_token, x_pair; /* expert chain activations */
} layer_sums;

static void sum_layer(const fm_config *c, const fm_plan *p, int32_t l, layer_sums *s) {
    memset(s, 0, sizeof *s);
    const fm_layer_desc *d = fm_arch_layer(fm_arch_of(c), c, l);
    int32_t first = -1, last = -1;
    for (int32_t i = 0; i < d->n_specs; i++)
        if (d->specs[i].family == FM_WF_EXPERTS && fm_spec_present(&d->specs[i], c)) {
            if (first < 0) first = i;
            last = i;
        }
    for (int32_t i = 0; i < d->n_specs; i++) {
        const fm_weight_spec *w = &d->specs[i];
        if (w->family == FM_WF_NORM || !fm_spec_present(w, c)) continue;
        const double rows = (double)fm_spec_rows(w, c), cols = (double)fm_spec_cols(w, c);
        const fm_wformat f = w->family == FM_WF_EXPERTS  ? p->w_expert
                             : w->family == FM_WF_ROUTER ? p->w_other
                                                         : p->w_dense;
        s->has[w->family] = true;
        s->w[w->family] += weight_bytes(f, rows, cols);
        s->act[w->family] += cols + rows;
        s->macs[w->family] += rows * cols;
        if (w->family == FM_WF_EXPERTS) {
            if (i == first) s->x_token += cols;
            else s->x_pair += cols;
            if (i == last) s->x_token += rows;
            else s->x_pair += rows;
        }
    }
}

void fm_prefill_cost(const fm_config *c, const fm_plan *p, int32_t n_layers, int64_t T, bool last_only, fm_cost *out) {
    memset(out, 0, sizeof *out);
    const double A = p->act_bf16 ? 2 : 4; /* bytes per activation */
    const double t = (double)T, H = c->hidden_size, hd = c->head_dim, nq = c->n_heads * hd;
    const double nqkv = (c->n_heads + 2.0 * c->n_kv_heads) * hd, E = c->n_experts, k = c->n_experts_per_tok;
    const double V = c->vocab_size;
    for (int32_t l = 0; l < n_layers; l++) {
        layer_sums s;
        sum_layer(c, p, l, &s);
        out->bytes[FM_STAGE_ATTN_PROJ] += s.w[FM_WF_ATTN] + A * t * s.act[FM_WF_ATTN];
        out->flops[FM_STAGE_ATTN_PROJ] += 2 * t * s.macs[FM_WF_ATTN];
        if (c->layer_is_gdn[l]) {
            /* a Gated DeltaNet (Qwen3-Next): the conv reads and writes its C channels, the rule reads them and b|a and
               writes nv dv, the gated norm reads it and z and writes it; per token and value head three dk x dv
               products (S^T k, the rank-1 update, S^T q) */
            const double C = 2.0 * c->gdn_k_heads * c->gdn_k_dim + (double)c->gdn_v_heads * c->gdn_v_dim;
            const double vd = (double)c->gdn_v_heads * c->gdn_v_dim;
            out->bytes[FM_STAGE_GDN] += A * t * (3 * C + 2.0 * c->gdn_v_heads + 4 * vd);
            out->flops[FM_STAGE_GDN] += 2.0 * 3.0 * t * c->gdn_v_heads * c->gdn_k_dim * c->gdn_v_dim;
        } else {
            /* qk-norm + RoPE read and write q and k; attention reads q, k, v and writes the output (gated: the
               gate's read is left out) */
            out->bytes[FM_STAGE_ATTENTION] += A * t * (2 * (nqkv - c->n_kv_heads * hd) + nqkv + nq);
            out->flops[FM_STAGE_ATTENTION] += 2.0 * c->n_heads * hd * t * (t + 1); /* causal q.k and p.v */
        }
        out->bytes[FM_STAGE_OTHER] += 2 * (2 * A * t * H) + 2 * (3 * A * t * H); /* 2 norms, 2 residual adds */
        if (s.has[FM_WF_ROUTER]) {
            /* logits in and out, then the k expert ids and weights per token */
            out->bytes[FM_STAGE_ROUTING] += s.w[FM_WF_ROUTER] + A * t * s.act[FM_WF_ROUTER] + t * k * (4 + A);
            out->flops[FM_STAGE_ROUTING] += 2 * t * s.macs[FM_WF_ROUTER];
        }
        if (s.has[FM_WF_EXPERTS]) {
            /* an ideal grouped kernel reads each expert touched once: with T*k routed pairs spread over E
               experts, the expected number touched is E * (1 - (1 - 1/E)^(T*k)); the shared expert in the bank
               (moe.shared) is touched by every token, the other E - 1 by T * (k - 1) pairs */
            const int32_t sh = c->shared_in_bank ? 1 : 0;
            const double Er = E - sh;
            double untouched = 1.0;
            for (int64_t i = 0; i < T * (c->n_experts_per_tok - sh) && untouched > 1e-12; i++)
                untouched *= 1.0 - 1.0 / Er;
            const double touched = sh + Er * (1.0 - untouched);
            out->bytes[FM_STAGE_EXPERTS] += touched * s.w[FM_WF_EXPERTS] + A * t * s.x_token + A * t * k * s.x_pair;
            out->flops[FM_STAGE_EXPERTS] += 2 * t * k * s.macs[FM_WF_EXPERTS];
            out->expert_weight_reads_per_token_design += t * k * s.w[FM_WF_EXPERTS];
        }
        if (s.has[FM_WF_DENSE_MLP]) {
            out->bytes[FM_STAGE_EXPERTS] += s.w[FM_WF_DENSE_MLP] + A * t * s.act[FM_WF_DENSE_MLP];
            out->flops[FM_STAGE_EXPERTS] += 2 * t * s.macs[FM_WF_DENSE_MLP];
        }
    }
    const double rows = last_only ? 1 : t;
    out->bytes[FM_STAGE_OTHER] +=
        A * t * H * 2 + weight_bytes(p->lm_head_dense ? p->w_dense : p->w_other, V, H) + A * rows * (H + V);
    out->flops[FM_STAGE_OTHER] += 2 * rows * H * V;
    for (int s = 0; s < FM_STAGE_COUNT; s++) out->total_bytes += out->bytes[s], out->total_flops += out->flops[s];
}
