/* The floor of a prefill: per stage, the fewest bytes it must move through device memory (each weight read
 * once, each activation read once and written once) and the FLOPs it must do. What a benchmark prints next to
 * its times: floor time = max(bytes / bandwidth, FLOPs / matrix rate). */
#include "engine/cost.h"

#include <math.h>
#include <string.h>

static double weight_bytes(fm_wformat f, double rows, double cols) {
    if (fm_wformat_is_int4(f)) return rows * cols / 2 + rows * ceil(cols / 128) * 2; /* codes + bf16 scales */
    if (f == FM_W_E4M3_PT) return rows * cols; /* + one scale per matrix, negligible */
    return rows * cols * (f == FM_W_F32 ? 4 : 2);
}

void fm_prefill_cost(const fm_config *c, const fm_plan *p, int32_t n_layers, int64_t T, bool last_only, fm_cost *out) {
    memset(out, 0, sizeof *out);
    const double A = p->act_bf16 ? 2 : 4; /* bytes per activation */
    const double t = (double)T, H = c->hidden_size, hd = c->head_dim, nq = c->n_heads * hd;
    const double nqkv = (c->n_heads + 2.0 * c->n_kv_heads) * hd, E = c->n_experts, k = c->n_experts_per_tok;
    const double I = c->moe_intermediate, Id = c->dense_intermediate, V = c->vocab_size;
    for (int32_t l = 0; l < n_layers; l++) {
        out->bytes[FM_STAGE_ATTN_PROJ] +=
            weight_bytes(p->w_dense, nqkv, H) + weight_bytes(p->w_dense, H, nq) + A * t * (H + nqkv + nq + H);
        out->flops[FM_STAGE_ATTN_PROJ] += 2 * t * H * nqkv + 2 * t * nq * H;
        /* qk-norm + RoPE read and write q and k; attention reads q, k, v and writes the output */
        out->bytes[FM_STAGE_ATTENTION] += A * t * (2 * (nqkv - c->n_kv_heads * hd) + nqkv + nq);
        out->flops[FM_STAGE_ATTENTION] += 2.0 * c->n_heads * hd * t * (t + 1);   /* causal q.k and p.v */
        out->bytes[FM_STAGE_OTHER] += 2 * (2 * A * t * H) + 2 * (3 * A * t * H); /* 2 norms, 2 residual adds */
        if (c->layer_is_moe[l]) {
            out->bytes[FM_STAGE_ROUTING] += weight_bytes(p->w_other, E, H) + A * t * (H + E) + t * k * (4 + A);
            out->flops[FM_STAGE_ROUTING] += 2 * t * H * E;
            /* an ideal grouped kernel reads each expert touched once: with T*k routed pairs spread over E
               experts, the expected number touched is E * (1 - (1 - 1/E)^(T*k)) */
            double untouched = 1.0;
            for (int64_t i = 0; i < T * c->n_experts_per_tok && untouched > 1e-12; i++) untouched *= 1.0 - 1.0 / E;
            const double touched = E * (1.0 - untouched);
            out->bytes[FM_STAGE_EXPERTS] +=
                touched * (weight_bytes(p->w_expert, 2 * I, H) + weight_bytes(p->w_expert, H, I)) + A * t * (H + H) +
                A * t * k * (2 * I + I);
            out->flops[FM_STAGE_EXPERTS] += 2 * t * k * (2 * I * H + I * H);
            out->expert_weight_reads_per_token_design +=
                t * k * (weight_bytes(p->w_expert, 2 * I, H) + weight_bytes(p->w_expert, H, I));
        } else {
            out->bytes[FM_STAGE_EXPERTS] +=
                weight_bytes(p->w_dense, 2 * Id, H) + weight_bytes(p->w_dense, H, Id) + A * t * (H + 2 * Id + Id + H);
            out->flops[FM_STAGE_EXPERTS] += 2 * t * 3 * Id * H;
        }
    }
    const double rows = last_only ? 1 : t;
    out->bytes[FM_STAGE_OTHER] += A * t * H * 2 + weight_bytes(p->w_other, V, H) + A * rows * (H + V);
    out->flops[FM_STAGE_OTHER] += 2 * rows * H * V;
    for (int s = 0; s < FM_STAGE_COUNT; s++) out->total_bytes += out->bytes[s], out->total_flops += out->flops[s];
}
