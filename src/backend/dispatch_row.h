/* One routed activation row in the experts' dispatch format, as an expert-parallel all-to-all carries it
 * (dist/ep_moe.c) and the backends' moe_dispatched op reads it: a row of H values is
 *   FM_A_NATIVE     H values: bf16 when the plan's activations are bf16 (their values are bf16 already, so the
 *                   encoding is exact), else fp32
 *   FM_A_E4M3_G128  H e4m3 codes, then ceil(H / 128) fp32 scales (fm_e4m3_quantize_groups)
 *   FM_A_MXFP4      ceil(H / 2) bytes of E2M1 pairs, then ceil(H / 32) UE8M0 scales (RCEIL: fm_mxfp4_quantize)
 *   FM_A_NVFP4      ceil(H / 2) bytes of E2M1 pairs, then ceil(H / 16) e4m3 scales (fm_nvfp4_quantize with the
 *                   buffer's tensor scale, which travels apart)
 * These are the codes the backends' moe op makes from the same row, so the experts compute the same bits from
 * either. */
#ifndef FM_BACKEND_DISPATCH_ROW_H
#define FM_BACKEND_DISPATCH_ROW_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Bytes of one row; 0 when f is not a dispatch format. */
size_t fm_dispatch_row_bytes(fm_afmt f, bool act_bf16, int64_t H);
/* x [H] -> out [fm_dispatch_row_bytes]; tensor_scale: NVFP4's (fm_nvfp4_tensor_scale of the whole buffer), else
 * unused. */
void fm_dispatch_row_encode(const float *x, int64_t H, fm_afmt f, bool act_bf16, float tensor_scale, uint8_t *out);
/* The values of a FM_A_NATIVE row (the expert outputs' return trip uses the native format). */
void fm_dispatch_row_decode_native(const uint8_t *row, int64_t H, bool act_bf16, float *x);

#endif
