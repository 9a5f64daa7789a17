/* A pre-quantized Linear [N, K] in our own int4 format (quant/int4_native.h) written straight into the int4 row
 * layout both backends start from: codes as two's complement nibbles q = u - 8 (element 2i in the low nibble of byte
 * i, each row ld bytes, the bytes past ceil(K / 2) zero) and scales as bf16 bits [N][n_groups]. The
 * compressed-tensors form `fp8moe requantize` writes (weight_packed [N, ceil(K/8)] I32 along K, symmetric, bf16
 * scales [N, ng]) is already that layout up to the code offset: each word is xored with 0x88888888 (u ^ 8 is the
 * nibble of u - 8) and the scales are copied, so a row costs what reading it costs. GPTQ and AWQ words (packed along
 * N, or interleaved) go through the decoder (int4_ckpt.h). Either way the bytes are the same as decoding first. */
#ifndef FM_QUANT_INT4_REPACK_H
#define FM_QUANT_INT4_REPACK_H

#include <stdint.h>

#include "quant/int4_ckpt.h"
#include "util/status.h"

/* Fills codes (N rows of ld >= ceil(K / 2) bytes) and scales (N x ng bf16 bits) from a source whose layout is native
 * (fm_qsrc_native_layout), whose ceil(K / group) must be ng. Checks what the decoder checks: zero points all 8, every
 * scale finite (FM_ERR_UNSUPPORTED / FM_ERR_FORMAT naming label and the tensor). One thread: callers run sources in
 * parallel. */
fm_status fm_int4_native_rows(const fm_qsrc *q, int64_t N, int64_t K, int64_t ng, uint8_t *codes, int64_t ld,
                              uint16_t *scales, const char *label, fm_error *err);

/* The same through the decoder, for every native format: the reference the fast path is tested against. */
fm_status fm_int4_native_rows_decoded(const fm_qsrc *q, int64_t N, int64_t K, int64_t ng, uint8_t *codes, int64_t ld,
                                      uint16_t *scales, const char *label, fm_error *err);

#endif
