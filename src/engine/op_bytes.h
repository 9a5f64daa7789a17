/* The bytes each op of a forward pass must move through device memory at least (the per-op profile's floor,
 * fm_step_profile_ops): the weights it reads, from the banks' stored sizes (so the plan's formats), and the
 * activations, KV cache and Gated DeltaNet states it reads and writes, from the shapes. A step of T rows; A bytes
 * per activation element (ops->act_size). */
#ifndef FM_ENGINE_OP_BYTES_H
#define FM_ENGINE_OP_BYTES_H

#include "engine/engine.h"

/* a projection: the bank once, T rows of `in` read and `out` written */
double fm_op_bytes_linear(const fm_model *m, const fm_bank *w, int64_t T, int64_t in, int64_t out);
/* T rows of n activations read `reads` times and written `writes` times (norms, adds, RoPE, gates) */
double fm_op_bytes_act(const fm_model *m, int64_t T, int64_t n, int reads, int writes);
/* the embedding's T rows gathered and written */
double fm_op_bytes_embed(const fm_model *m, int64_t T);
/* attention over the paged cache: q read, out written, and each row's K and V up to its position (pos[t] + 1
 * entries); pos NULL: a contiguous pass over the T rows themselves (K and V read once) */
double fm_op_bytes_attention(const fm_model *m, int64_t T, const int32_t *pos);
/* the routed experts of layer l: the expected count T rows select under uniform routing, E (1 - (1 - k / E)^T),
 * each expert's gate_up and down once, the rows in and out, and the k routed copies' intermediates */
double fm_op_bytes_experts(const fm_model *m, int32_t l, int64_t T);
/* Qwen3-Next's shared expert (gate_up, SwiGLU, down) */
double fm_op_bytes_shared_expert(const fm_model *m, int32_t l, int64_t T);
/* a Gated DeltaNet's conv (its state per sequence read and written when cached) and delta rule (the matrix state
 * read and written `states` times: once per run of a sequence, i.e. per prompt or prompt chunk and per decode row) */
double fm_op_bytes_gdn_conv(const fm_model *m, int32_t l, int64_t T, bool cached);
double fm_op_bytes_gdn_rule(const fm_model *m, int64_t T, int64_t states);
/* gdn_decode_fused: the conv's and the rule's inputs and states, the rule's output row (written, and read back by
 * the norm) and the norm's output; the conv output, the chain's other intermediate row, stays on chip */
double fm_op_bytes_gdn_decode_fused(const fm_model *m, int32_t l, int64_t T);

#endif
