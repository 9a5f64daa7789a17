/* Pre-quantized linears made in memory from float weight views, in the formats checkpoints ship (benchmarks of the
 * pre-quantized paths at real shapes, where no such checkpoint is at hand):
 *   FM_QSYNTH_INT4_ASYM   compressed-tensors pack-quantized, asymmetric int4, groups of 128 along K, fp16 scales: the
 *                         numbers a GPTQ/AWQ asymmetric export holds (our asymmetric quantizer, src/quant/int4.h)
 *   FM_QSYNTH_FP8_BLOCK   block-FP8, e4m3 codes with one fp32 weight_scale_inv per 128 x 128 block (amax / 448), as
 *                         DeepSeek-V3 and Qwen3-*-FP8 ship
 * The result is bound through fm_qsrc_bind, the same checks a checkpoint's tensors go through. */
#ifndef FM_BENCH_QSYNTH_H
#define FM_BENCH_QSYNTH_H

#include "model/model_src.h"

typedef enum fm_qsynth_kind { FM_QSYNTH_INT4_ASYM, FM_QSYNTH_FP8_BLOCK } fm_qsynth_kind;

/* One linear: its tensors (owned) and the bound source (src.q points into them). */
typedef struct fm_qsynth {
    fm_st_tensor t[3];
    char names[3][40];
    uint8_t *data[3];
    fm_wsrc src;
} fm_qsynth;

/* Quantizes the float view w ([rows, cols], read with fm_wsrc_read) into q. q must stay where it is while it is
 * used: q->src.q points at its tensors. */
fm_status fm_qsynth_make(const fm_wsrc *w, fm_qsynth_kind kind, fm_qsynth *q, fm_error *err);
void fm_qsynth_free(fm_qsynth *q);

#endif
