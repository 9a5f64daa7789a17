/* Whether a pre-quantized int4 Linear is exactly the engine's own int4-g128 format (quant/int4.h, the int4 preset's
 * banks): symmetric (zero point 8 everywhere, so q = u - 8), groups of 128 along K in order (no act-order g_idx; the
 * last group may be partial, as in our banks; a single group of K <= 128 is the same), scales stored as BF16 (the
 * bank's scale dtype, so they are kept exactly). Such a Linear binds natively: its codes and scales become the
 * int4-g128 bank directly, with no float detour, which is how a checkpoint written by `fp8moe requantize` loads to
 * the same numbers as quantizing the float checkpoint at load, and runs the presets the GPU has for int4-g128.
 * Everything else keeps the checkpoint's own format (int4-zp). */
#ifndef FM_QUANT_INT4_NATIVE_H
#define FM_QUANT_INT4_NATIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "quant/int4_ckpt.h"

#define FM_NATIVE_GROUP 128

typedef enum fm_native_int4 {
    FM_NATIVE_NO,     /* not our format: int4-zp */
    FM_NATIVE_MINUS8, /* our format with some code -8 (u = 0): int4-g128, but not the tensor-core layout, which
                         holds -7..7 only (our quantizer never makes -8; other quantizers do) */
    FM_NATIVE_YES,    /* our format, codes -7..7: int4-g128 and int4-g128-tc */
} fm_native_int4;

/* What the tensors' metadata says (format, dtypes, group, g_idx), without reading values: the necessary part. */
bool fm_qsrc_native_layout(const fm_qsrc *q, int64_t K);

/* The full check of a bound source [N, K]: the layout, every zero point 8 (GPTQ stores them even when symmetric),
 * and whether any code is -8. Reads the packed words once, allocating nothing. */
fm_native_int4 fm_qsrc_native_int4(const fm_qsrc *q, int64_t N, int64_t K);

/* A decoded native source's zero points are all 8 (else FM_ERR_UNSUPPORTED naming label and the tensor): the check
 * both backends make while filling a bank from the codes. */
fm_status fm_int4_ckpt_check_symmetric(const fm_int4_ckpt *c, const char *label, const char *tensor, fm_error *err);

#endif
