/* Pre-quantized checkpoint formats (int4 here, block-FP8 beside it): one Linear W [N, K] (y = x W^T) as GPTQ, AWQ or
 * compressed-tensors store it, checked and decoded to the numbers that define it. Every format reduces to W[n, k] =
 * (u[n, k] - z[n, g]) * s[n, g],   g = g_idx[k] (act-order) or k / G with u the unsigned 4-bit code, z the zero point,
 * s the stored fp16/bf16/fp32 scale (exact in fp32): GPTQ:  qweight I32 [K/8, N], k = 8r + i at bits 4i..4i+3 of row r;
 * qzeros I32 [K/G, N/8], n = 8c + i at bits 4i of column c, holding z - 1 in v1 (checkpoint_format "gptq") and z in
 * gptq_v2; scales [K/G, N]; g_idx I32 [K] read only with desc_act (GPTQ's own kernels ignore it otherwise). sym: z = 8
 * (v1 stores 7). AWQ:   qweight I32 [K, N/8] packed along N, nibble slot i of word c holding column 8c +
 * {0,2,4,6,1,3,5,7}[i]; qzeros I32 [K/G, N/8] the same interleave, no off-by-one; scales [K/G, N]. compressed-tensors
 * pack-quantized: weight_packed I32 [N, ceil(K/8)], k = 8j + i at bits 4i of word j, storing the signed q + 8;
 * weight_scale [N, K/G]; weight_zero_point I32 [ceil(N/8), K/G] packed along dim 0 (n = 8r + i at bits 4i of row r),
 * signed zero + 8 (asymmetric only; symmetric z = 8); weight_g_idx I32 [K] when present (actorder "group"). (q - zp) *
 * s with both offset by 8 is (u - z) * s. G must divide K (the scale tensors have exactly K/G groups), except in
 * compressed-tensors, whose ceil(K/G) groups end with a partial one; group -1 in a config is G = K. In the v1 format a
 * stored zero nibble of 15 reads as zero 16 (GPTQ's off-by-one), so z is in 0..16.
 */
#ifndef FM_QUANT_INT4_CKPT_H
#define FM_QUANT_INT4_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "io/quant_config.h"
#include "io/safetensors.h"

/* The tensors of one pre-quantized Linear, as the binder found them. */
typedef struct fm_qsrc {
    fm_quant_method method;     /* FM_QUANT_NONE: not a quantized source */
    const fm_st_tensor *packed; /* qweight / weight_packed */
    const fm_st_tensor *zeros;  /* qzeros / weight_zero_point; NULL when symmetric */
    const fm_st_tensor *scales; /* scales / weight_scale */
    const fm_st_tensor *g_idx;  /* g_idx / weight_g_idx when it is read; NULL: group of k is k / group */
    int32_t group;              /* G along K (fp8: the block's K) */
    bool zero_minus_one;        /* GPTQ v1 */
    int32_t block_n;            /* fp8 block: the block's N */
} fm_qsrc;

/* The decoded numbers of one Linear [N, K] (codes one per byte: a transient of the load, never resident). */
typedef struct fm_int4_ckpt {
    int64_t N, K, n_groups;
    int32_t group;
    uint8_t *codes; /* [N, K] 0..15, input channels in checkpoint order */
    uint8_t *zeros; /* [N, n_groups] 0..16 */
    float *scales;  /* [N, n_groups] */
    int32_t *g_idx; /* [K] group of input channel k, each group holding exactly G channels (the last: the rest) */
} fm_int4_ckpt;

/* Fills q for the Linear `module` (e.g. "model.layers.0.mlp.experts.3.down_proj") of a checkpoint quantized as
 * qc, with N outputs and K inputs, looking tensors up with find(ctx, name); checks every tensor's dtype and shape.
 * FM_ERR_FORMAT names the tensor and what was expected when one is missing or malformed. */
typedef const fm_st_tensor *(*fm_tensor_lookup)(const void *ctx, const char *name);
fm_status fm_qsrc_bind(const fm_quant_config *qc, const char *module, int64_t N, int64_t K, fm_tensor_lookup find,
                       const void *ctx, fm_qsrc *q, fm_error *err);
/* Whether the module has the packed-weight tensor of qc's format (is stored quantized). */
bool fm_qsrc_present(const fm_quant_config *qc, const char *module, fm_tensor_lookup find, const void *ctx);

/* Block-wise FP8 (src/quant/fp8_block_ckpt.c): "<module>.weight" F8_E4M3 [N, K] and "<module>.weight_scale_inv"
 * F32/BF16/F16 [ceil(N/bn), ceil(K/bk)]; W[n, k] = e4m3(w[n, k]) * scale_inv[n / bn, k / bk], one fp32 product.
 * fm_qsrc_bind checks them when qc is fp8; this dequantizes (the ref presets' path). */
fm_status fm_fp8_block_bind(const fm_quant_config *qc, const char *module, int64_t N, int64_t K, fm_tensor_lookup find,
                            const void *ctx, fm_qsrc *q, fm_error *err);
fm_status fm_fp8_block_dequantize(const fm_qsrc *q, int64_t N, int64_t K, float *w, fm_error *err);

/* Checks that t (module.suffix, NULL when absent) is I32 (or a float dtype when is_float) of shape [d0] (n_dims 1)
 * or [d0, d1]; the message names the tensor, its role and expected vs found. */
fm_status fm_qsrc_expect(const fm_st_tensor *t, const char *module, const char *suffix, const char *role, bool is_float,
                         int64_t d0, int64_t d1, int n_dims, fm_error *err);

/* Decodes (and checks the values of: g_idx range and group sizes) a bound source. */
fm_status fm_int4_ckpt_decode(const fm_qsrc *q, int64_t N, int64_t K, fm_int4_ckpt *out, fm_error *err);
void fm_int4_ckpt_free(fm_int4_ckpt *c);
/* Whether the source's groups follow the input order (no g_idx, or g_idx[k] == k / G for every k): an act-order
 * checkpoint whose order is the identity needs no permutation. Reads g_idx only; its range is checked by decode. */
bool fm_qsrc_in_input_order(const fm_qsrc *q, int64_t K);
/* w[n, k] = (codes - zero) * scale, exact in fp32. */
void fm_int4_ckpt_dequantize(const fm_int4_ckpt *c, float *w);

#endif
