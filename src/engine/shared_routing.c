/* The shared expert in the routed experts' bank (shared_routing.h). */
#include <stdio.h>

#include "engine/shared_routing.h"

/* the shared expert's slot that stands for an expert slot at index E */
static fm_src_slot shared_slot_of(fm_src_slot s) {
    return s == FM_SRC_EXPERT_GATE ? FM_SRC_SHARED_GATE : s == FM_SRC_EXPERT_UP ? FM_SRC_SHARED_UP : FM_SRC_SHARED_DOWN;
}

bool fm_shared_routing_fits(const fm_config *c, const fm_plan *p, int32_t ep_ranks, char *why, size_t cap) {
    if (c->shared_expert_intermediate <= 0 || c->n_experts <= 0) {
        snprintf(why, cap, "the model has no shared expert");
        return false;
    }
    if (c->shared_expert_intermediate != c->moe_intermediate) {
        snprintf(why, cap, "its width %d differs from the routed experts' %d", c->shared_expert_intermediate,
                 c->moe_intermediate);
        return false;
    }
    if (p->w_dense != p->w_expert || p->a_dense != p->a_dispatch || p->a_dense != p->a_expert) {
        snprintf(why, cap, "the plan quantizes it (%s weights, %s activations) unlike the experts (%s, %s / %s)",
                 fm_wformat_name(p->w_dense), fm_afmt_name(p->a_dense), fm_wformat_name(p->w_expert),
                 fm_afmt_name(p->a_dispatch), fm_afmt_name(p->a_expert));
        return false;
    }
    if (c->quant.method != FM_QUANT_NONE) {
        snprintf(why, cap, "the checkpoint is pre-quantized (%s); the bank is built from float weights",
                 fm_quant_method_name(c->quant.method));
        return false;
    }
    if (ep_ranks > 1) {
        snprintf(why, cap, "--ep %d splits the routed experts across ranks; every rank runs the shared expert",
                 ep_ranks);
        return false;
    }
    return true;
}

void fm_shared_routing_apply(fm_config *c) {
    c->shared_in_bank = true;
    c->n_experts += 1;
    c->n_experts_per_tok += 1;
    c->router = FM_ROUTER_SOFTMAX_TOPK_SHARED;
    c->shared_expert_intermediate = 0;
}

int32_t fm_shared_routing_parts(const fm_config *c, const fm_weight_spec *w) {
    return c->shared_in_bank && w->bank == FM_BANK_ROUTER ? w->n_parts + 1 : w->n_parts;
}

void fm_shared_routing_views(const fm_config *c, const fm_layer_src *L, const fm_weight_spec *w, int32_t n,
                             fm_wsrc *srcs) {
    const int32_t np = fm_shared_routing_parts(c, w);
    const bool experts = c->shared_in_bank && w->family == FM_WF_EXPERTS;
    for (int32_t j = 0; j < w->n_parts; j++) {
        const fm_wsrc *v = fm_layer_src_cviews(L, w->parts[j].slot);
        for (int32_t e = 0; e < n; e++)
            srcs[(size_t)e * (size_t)np + (size_t)j] =
                experts && e == n - 1 ? *fm_layer_src_cviews(L, shared_slot_of(w->parts[j].slot)) : v[e];
    }
    if (np > w->n_parts) srcs[w->n_parts] = *fm_layer_src_cviews(L, FM_SRC_SHARED_SCORE); /* router row E */
}
