/* config.json "quantization_config" -> fm_quant_config: which pre-quantized int4 format the checkpoint's
 * linear weights are stored in, with the parameters that fix their dequantization.
 *   gptq: bits, group_size (-1 = one group over all of K), sym, desc_act, checkpoint_format ("gptq" = v1, whose
 *         stored zero points are zero - 1; "gptq_v2" without that off-by-one)
 *   awq:  bits, group_size, zero_point (true), version "gemm" (the [K, N/8] interleaved packing)
 *   compressed-tensors, format "pack-quantized": one config group whose weights are {num_bits, type "int",
 *         symmetric, strategy "group" | "channel", group_size, actorder}, no input activation quantization, and
 *         the `ignore` list (module names, or "re:" regexes matched at the start of the name as Python's
 *         re.match does, by PCRE2 with bounded cost: io/ckpt_regex.h) of Linear modules left in float.
 *   fp8:  fmt "e4m3", weight_block_size [bn, bk] (block-wise FP8: F8_E4M3 weights, one weight_scale_inv per
 *         bn x bk block), activation_scheme "dynamic".
 * Anything else (other bits, methods, formats, several config groups, quantized activations) is
 * FM_ERR_UNSUPPORTED naming the field; a wrongly typed field is FM_ERR_FORMAT. */
#ifndef FM_IO_QUANT_CONFIG_H
#define FM_IO_QUANT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"

struct cJSON;

#define FM_QUANT_IGNORE_BYTES 8192 /* the ignore list, strings back to back */

typedef enum fm_quant_method {
    FM_QUANT_NONE,      /* float checkpoint */
    FM_QUANT_GPTQ,      /* qweight [K/8, N], qzeros [K/G, N/8], scales [K/G, N], g_idx [K] */
    FM_QUANT_AWQ,       /* qweight [K, N/8] interleaved, qzeros [K/G, N/8], scales [K/G, N] */
    FM_QUANT_CT_PACKED, /* compressed-tensors weight_packed [N, K/8] (q + 8), weight_scale [N, K/G], ... */
    FM_QUANT_FP8_BLOCK, /* weight F8_E4M3 [N, K], weight_scale_inv [ceil(N/bn), ceil(K/bk)] */
} fm_quant_method;

typedef struct fm_quant_config {
    fm_quant_method method;
    int32_t bits;                       /* 4 (8 for fp8) */
    int32_t group_size;                 /* > 0, or -1: one group spanning K (per output channel); fp8: the block's K */
    int32_t block_n;                    /* fp8: the block's N */
    bool sym;                           /* zero point fixed at 8 (no zero-point tensor needed) */
    bool act_order;                     /* g_idx tensors give each input channel's group (GPTQ desc_act, CT actorder) */
    bool native_layout;                 /* set by the binder, not the config: every pre-quantized int4 projection is
                                           in our own int4-g128 layout (quant/int4_native.h), which the plan's int4
                                           banks take as they are (the memory plan counts them so) */
    bool zero_minus_one;                /* GPTQ v1: qzeros hold zero - 1 */
    int32_t n_ignore;                   /* compressed-tensors ignore entries */
    char ignore[FM_QUANT_IGNORE_BYTES]; /* n_ignore NUL-terminated strings back to back */
} fm_quant_config;

const char *fm_quant_method_name(fm_quant_method m);

/* Parses a quantization_config object (NULL or JSON null: a float checkpoint). label names the file. */
fm_status fm_quant_config_parse(const struct cJSON *qc, const char *label, fm_quant_config *out, fm_error *err);

/* An AutoGPTQ quantize_config.json beside a config.json without quantization_config (older GPTQ checkpoints): bits,
 * group_size, desc_act, sym, checkpoint_format as for gptq; quant_method, when present, must be "gptq". */
fm_status fm_quant_config_parse_autogptq(const struct cJSON *qc, const char *label, fm_quant_config *out,
                                         fm_error *err);

/* Whether module (e.g. "model.layers.0.mlp.gate") is in the ignore list (*ignored). A regex that does not compile is
 * rejected by fm_quant_config_parse; a match that exceeds the regex limits (io/ckpt_regex.h) fails here. */
fm_status fm_quant_config_ignores(const fm_quant_config *q, const char *module, bool *ignored, fm_error *err);

/* One line describing the format ("gptq v1, int4, group 128, asymmetric, act-order"). */
void fm_quant_config_describe(const fm_quant_config *q, char *buf, size_t n);

#endif
