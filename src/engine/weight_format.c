/* The weight-format policy (weight_format.h). */
#include "engine/weight_format.h"

#include "quant/int4_ckpt.h"
#include "util/status.h"

void fm_bank_origin_of_srcs(fm_quant_method ckpt, const fm_wsrc *srcs, int64_t count, fm_bank_origin *out) {
    *out = (fm_bank_origin){ckpt, false, false, FM_NATIVE_YES, FM_QUANT_NONE, 0, 0, false};
    int32_t bad_group = 0; /* the first group that breaks the fp8 plans' rules */
    for (int64_t i = 0; i < count; i++) {
        const fm_wsrc *s = &srcs[i];
        const fm_qsrc *q = &s->q;
        out->quantized |= fm_wsrc_is_quantized(s);
        const fm_native_int4 nat = fm_wsrc_is_quantized(s) ? fm_qsrc_native_int4(q, s->rows, s->cols) : FM_NATIVE_NO;
        if (nat < out->native) out->native = nat;
        if (q->method == FM_QUANT_FP8_BLOCK) {
            out->fp8_block = true;
            if (!out->group) out->group = q->group, out->block_n = q->block_n;
            if (q->group != 128 && !bad_group) bad_group = q->group, out->block_n = q->block_n;
        } else if (q->method != FM_QUANT_NONE) {
            if (out->int4 == FM_QUANT_NONE) out->int4 = q->method;
            if (!out->group) out->group = q->group;
            if (q->group % 128 != 0 && !bad_group) bad_group = q->group;
            if (!fm_qsrc_in_input_order(q, s->cols)) out->permuted = true;
        }
    }
    if (bad_group) out->group = bad_group;
    if (out->fp8_block) out->native = FM_NATIVE_NO;
}

void fm_bank_origin_of_config(const fm_quant_config *q, int64_t cols, fm_bank_origin *out) {
    const bool quantized = q->method != FM_QUANT_NONE, fp8_block = q->method == FM_QUANT_FP8_BLOCK;
    *out = (fm_bank_origin){q->method, quantized, fp8_block, FM_NATIVE_NO, FM_QUANT_NONE, 0, 0, false};
    if (!quantized) return;
    if (fp8_block) out->group = q->group_size, out->block_n = q->block_n;
    else {
        out->int4 = q->method;
        out->group = q->group_size > 0 ? q->group_size : (int32_t)cols; /* -1: one group per output channel */
        out->native = q->native_layout ? FM_NATIVE_YES : FM_NATIVE_NO;  /* found by the binder */
    }
}

/* The fp8 plans (activations e4m3 with one scale per (row, 128-group)) on pre-quantized sources keep the checkpoint's
 * own numbers and quantize the activations as the plan says. Block-FP8 becomes e4m3-block when its K-block is 128
 * (one weight scale per activation group, DeepSeek-V3's recipe). int4 becomes int4-zp-tc when each activation group
 * lies inside one weight group (G a multiple of 128, per-channel G = K included) and the input is in checkpoint order:
 * act-order permutes K, while the 1x128 groups are taken along the input as it comes. */
static fm_status fp8_prequant(const fm_plan *plan, const fm_bank_origin *o, const char *label, fm_wformat *out,
                              fm_error *err) {
    const char *preset = fm_preset_name(plan->preset);
    if (o->fp8_block && o->group && o->group != 128)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: block-FP8 blocks of [%d, %d] (weight_block_size); the %s preset's e4m3 1x128 activations "
                       "need blocks 128 wide along K (one weight scale per activation group); --preset ref or ref32 "
                       "reads this checkpoint",
                       label, o->block_n, o->group, preset);
    if (!o->fp8_block && o->permuted)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: act-order int4 (%s, g_idx permutes the input channels) cannot take the %s preset's e4m3 "
                       "1x128 activations, whose groups follow the input order; --preset int4 handles it",
                       label, fm_quant_method_name(o->int4), preset);
    if (!o->fp8_block && o->group && o->group % 128 != 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: int4 group size %d (%s) is not a multiple of 128, so an e4m3 1x128 activation group of the "
                       "%s preset would span more than one weight group; --preset int4 handles it",
                       label, o->group, fm_quant_method_name(o->int4), preset);
    *out = o->fp8_block ? FM_W_E4M3_B128 : FM_W_INT4_ZP_TC;
    return FM_OK;
}

/* the policy's choice, before the backend is asked whether it stores it */
static fm_status choose(const fm_plan *plan, fm_wfamily family, const fm_bank_origin *o, const char *label,
                        fm_wformat *out, bool *native_out, fm_error *err) {
    fm_afmt a_in = plan->a_dense, a_out = plan->a_dense;
    *out = plan->w_other;
    if (family == FM_WF_LM_HEAD && plan->lm_head_dense) {
        /* --lm-head dense: our own quantization of the checkpoint's float lm_head, whatever its other linears are */
        if (o->quantized)
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: --lm-head dense quantizes a float lm_head at load; this checkpoint's is pre-quantized "
                           "(%s): leave --lm-head at float",
                           label, fm_quant_method_name(o->ckpt));
        *out = plan->w_dense;
        return FM_OK;
    }
    if (family == FM_WF_ATTN || family == FM_WF_DENSE_MLP) *out = plan->w_dense;
    else if (family == FM_WF_EXPERTS) *out = plan->w_expert, a_in = plan->a_dispatch, a_out = plan->a_expert;
    else return FM_OK;
    /* a float plan dequantizes; a float bank of a quantized checkpoint (its ignore list) stays as its author kept it */
    if (!fm_wformat_is_int4(*out)) return FM_OK;
    if (!o->quantized) {
        if (o->ckpt != FM_QUANT_NONE) *out = FM_W_BF16;
        return FM_OK;
    }
    const bool fp8 = a_in == FM_A_E4M3_G128 && a_out == FM_A_E4M3_G128;
    if (!fp8 && (a_in != FM_A_NATIVE || a_out != FM_A_NATIVE))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: pre-quantized weights (%s) with %s activations (the %s preset) are not supported; --preset "
                       "fp8 (e4m3 1x128 activations) or int4 run them",
                       label, fm_quant_method_name(o->ckpt), fm_afmt_name(a_in != FM_A_NATIVE ? a_in : a_out),
                       fm_preset_name(plan->preset));
    if (!o->fp8_block && (o->native == FM_NATIVE_YES || (o->native == FM_NATIVE_MINUS8 && *out == FM_W_INT4_G128))) {
        if (native_out) *native_out = true;
        return FM_OK; /* the plan's own format, built from the codes */
    }
    if (fp8) { return fp8_prequant(plan, o, label, out, err); }
    if (o->fp8_block)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: block-FP8 weights are read by --preset fp8, ref and ref32; the %s preset would requantize "
                       "them to int4",
                       label, fm_preset_name(plan->preset));
    *out = FM_W_INT4_ZP;
    return FM_OK;
}

fm_status fm_weight_format(const fm_plan *plan, const fm_backend_kind *kind, fm_wfamily family, const fm_bank_origin *o,
                           const char *label, fm_wformat *out, bool *native_out, fm_error *err) {
    if (native_out) *native_out = false;
    const fm_status st = choose(plan, family, o, label, out, native_out, err);
    if (st) return st;
    /* a format the backend has no layout for (one matrix of one element: every layout stores it) */
    if (fm_wformat_is_int4zp(*out) ? kind->bank_bytes_int4zp(*out == FM_W_INT4_ZP_TC, 1, 1, 1, 1, false) == 0
                                   : kind->bank_bytes(*out, 1, 1, 1) == 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: weight format %s is not available on the %s backend", label,
                       fm_wformat_name(*out), kind->name);
    return FM_OK;
}
