/* Qwen3-Next's shared expert as one more routed expert (route moe.shared).
 *
 * The MoE block y = sum_j w_j expert_j(h) + sigmoid(h . g) shared(h) is the routed sum over k + 1 pairs when the
 * shared expert is expert E of the layer's bank and the router's weight has g appended as row E: the router emits
 * the softmax top-k of the first E logits and the pair (E, sigmoid(logit E)) (FM_ROUTER_SOFTMAX_TOPK_SHARED), and the
 * one grouped launch per projection (GEMV at decode, GEMM at prefill) and the combine compute all k + 1. Per layer
 * the shared expert's own launches (gate|up, SwiGLU, down, the gated add) go, and the MoE tail can fuse
 * (decode.fused). The same numbers up to the order of the combine's sum and the gate weight rounded to the
 * activation dtype (bf16 on the GPU).
 *
 * It takes the bank's form only where the shapes agree: the shared expert as wide as the routed ones, the plan
 * quantizing the dense projections as the experts (weights and both activations), a float checkpoint, one rank (expert
 * parallelism splits the bank by index; the shared expert belongs to every rank). */
#ifndef FM_ENGINE_SHARED_ROUTING_H
#define FM_ENGINE_SHARED_ROUTING_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "model/model_src.h"

/* Whether the shared expert of a model of configuration c (the checkpoint's) can be one more expert of its banks
 * (plan p, ep_ranks ranks); when it cannot, why (a phrase, into why[cap]). False without a shared expert. The load
 * (model.c) and the estimate before it (estimate.c) ask the same. */
bool fm_shared_routing_fits(const fm_config *c, const fm_plan *p, int32_t ep_ranks, char *why, size_t cap);

/* The configuration the engine runs with the shared expert in the bank (fm_config.shared_in_bank): n_experts and
 * n_experts_per_tok count it, the router kind takes its pair, it has no banks of its own. */
void fm_shared_routing_apply(fm_config *c);

/* Layer L's views of the bank of spec w (its parts' n views each, expert e's at [e * np + j]) into srcs, with np
 * parts: the spec's, as the binder made them, and with the shared expert in the bank: expert E's views are the
 * shared expert's, and the router's bank has a second part, shared_expert_gate's row. The parts of w's bank
 * (fm_shared_routing_parts) times its count. */
int32_t fm_shared_routing_parts(const fm_config *c, const fm_weight_spec *w);
void fm_shared_routing_views(const fm_config *c, const fm_layer_src *L, const fm_weight_spec *w, int32_t n,
                             fm_wsrc *srcs);

#endif
