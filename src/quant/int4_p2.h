/* int4 with power-of-two group scales ("int4-p2"): the int4-g128 format (codes -7..7, groups of 128 along K, one
 * bf16 scale per (row, group)) with every scale of a row equal to one bf16 row scale times 2^k, k in
 * [-FM_INT4_P2_KSPAN, 0] per group. Stored and computed exactly as int4-g128 (the scales are bf16 values), so every
 * bank, checkpoint and kernel that reads int4-g128 reads it; what the constraint buys is that q x 2^k is exact in
 * e4m3 (|q| 2^(k + 6) is a normal e4m3 value <= 448 for k in -12..0), so a W4A8 kernel can fold the group scale into
 * the e4m3 operand it converts the codes to and keep only the row scale for its epilogue (bench/NOTES.md 2026-12-04
 * "folding the group scale into the e4m3 operand").
 *
 * The quantizer searches: the row scale over 16 fractional octaves (amax_row / 7 x 2^(j / 16), rounded up to bf16),
 * and per group k = the smallest step that does not clip the group, or one octave finer when clipping the group's
 * largest elements costs less squared error than the coarser step; the row scale with the least squared error
 * wins. Unlike fm_int4_quantize, elements may clip (|w - dequant| is not bounded by scale / 2); on the bundled
 * model's experts and on synthetic rows it lands at or below int4-g128's error (lab/w4a8_fold_study.c).
 * Groups more than 2^12 below the row's largest step get k = -12 (coarser than their own amax would give).
 * NaN weights are ignored by the amax and encode as 0; an all-zero row gets scales 0 and codes 0 (so does a row with
 * an infinite weight, which the loaders never pass: fm_wsrc_read refuses non-finite weights). The last group may be
 * partial. All arithmetic is fp32 (the error sums in double), deterministic. */
#ifndef FM_QUANT_INT4_P2_H
#define FM_QUANT_INT4_P2_H

#include <stdbool.h>
#include <stdint.h>

#define FM_INT4_P2_GROUP 128
#define FM_INT4_P2_KSPAN 12
/* 2^(j / 16), j = 0..15: the row scale's fractional octaves (constants, so that every build and the cuda backend's
 * quantizer, cuda/quantize_int4_p2.cu, search the same) */
#define FM_INT4_P2_OCTAVE16                                                                                            \
    {                                                                                                                  \
        1.0f, 1.0442737824f, 1.0905077327f, 1.1387886348f, 1.1892071150f, 1.2418578121f, 1.2968395547f, 1.3542555469f, \
            1.4142135624f, 1.4768261459f, 1.5422108254f, 1.6104903319f, 1.6817928305f, 1.7562521604f, 1.8340080864f,   \
            1.9152065614f                                                                                              \
    }

/* q is [rows, K] (-7..7); scales is [rows, ceil(K / 128)], bf16 values, each row's = row scale x 2^k. */
void fm_int4_p2_quantize(const float *w, int64_t rows, int64_t K, int8_t *q, float *scales);

/* Whether one row's group scales have the int4-p2 form: all zero, or one positive row scale (the largest) times
 * 2^k with k in [-FM_INT4_P2_KSPAN, 0] (zero scales allowed: all-zero groups). When true and k is not NULL, k[g]
 * receives each group's exponent (0 for a zero scale) and *row_scale the largest scale. A checkpoint's int4-g128
 * scales may or may not have it: this is what a loader would ask before choosing a folding kernel. */
bool fm_int4_p2_split(const float *scales, int64_t n_groups, float *row_scale, int8_t *k);

#endif
