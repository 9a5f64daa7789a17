/* The weight-format policy: the one place that decides the format a bank is stored in, from the precision plan, the
 * backend's kind and what the bank's sources are (float, or a checkpoint's own int4 or block-FP8), or refuses the
 * combination with a message naming the bank and the way out. The load (model.c) asks it with each bank's tensors,
 * the memory plan (memory_plan.c) and `inspect` with what the configuration says of them. */
#ifndef FM_ENGINE_WEIGHT_FORMAT_H
#define FM_ENGINE_WEIGHT_FORMAT_H

#include "backend/backend_kind.h"
#include "model/arch.h"
#include "model/model_src.h"

/* What the policy needs to know of a bank's sources. */
typedef struct fm_bank_origin {
    fm_quant_method ckpt;  /* the checkpoint's quantization (FM_QUANT_NONE: a float checkpoint) */
    bool quantized;        /* the bank's sources are pre-quantized (a quantized checkpoint's ignored linears are not) */
    bool fp8_block;        /* some source is block-FP8 */
    fm_native_int4 native; /* the least native of its sources (quant/int4_native.h); FM_NATIVE_NO with block-FP8 */
    fm_quant_method int4;  /* the method of its int4 sources (for messages) */
    int32_t group;         /* the weight group along K: int4's G, block-FP8's block K (the first that breaks the fp8
                              plans' rules, when one does); 0: unknown, not checked */
    int32_t block_n;       /* block-FP8: the block's rows */
    bool permuted;         /* an int4 source's input channels are permuted (act order; known from its g_idx only) */
} fm_bank_origin;

/* The origin of a bank's count sources (a float checkpoint's, a quantized one's) */
void fm_bank_origin_of_srcs(fm_quant_method ckpt, const fm_wsrc *srcs, int64_t count, fm_bank_origin *out);
/* The origin as the configuration describes the linears of a checkpoint of K-wide inputs: every linear quantized as
 * its quantization_config says (its ignore list is not modelled), act order unknown (g_idx may be the identity) */
void fm_bank_origin_of_config(const fm_quant_config *q, int64_t cols, fm_bank_origin *out);

/* The format of a bank of `family` under `plan` on a backend of `kind`:
 *  - families that are not linear projections (norms, router, embeddings, lm_head) take the plan's w_other; the
 *    lm_head takes w_dense under the plan's lm_head_dense (--lm-head dense), from a float source only;
 *  - a float plan (ref, ref32) dequantizes pre-quantized sources;
 *  - an int4 plan keeps a pre-quantized checkpoint's numbers: our own int4-g128 binds natively as the plan's int4
 *    banks (codes of -8 do not fit the tensor-core layout: such a bank keeps the checkpoint's format under the fp8
 *    plans); any other int4 is int4-zp with activations as stored (the int4 preset), int4-zp-tc with e4m3 1x128
 *    activations (the fp8 plans: G a multiple of 128, K in input order); block-FP8 with 128-wide K blocks is
 *    e4m3-block under the fp8 plans; the linears such a checkpoint left in float stay bf16;
 *  - an FP4 dispatch (or any quantized activation but e4m3 1x128) is refused on pre-quantized linears, on every
 *    backend: the kernels expand FP4 only into the experts we quantize ourselves.
 * FM_ERR_UNSUPPORTED naming `label` and what runs it otherwise. *native_out (may be NULL) says whether a pre-quantized
 * bank is bound natively (the plan's own int4 format built from the codes). */
fm_status fm_weight_format(const fm_plan *plan, const fm_backend_kind *kind, fm_wfamily family, const fm_bank_origin *o,
                           const char *label, fm_wformat *out, bool *native_out, fm_error *err);

#endif
