/* The W4A8 GEMM of int4-p2 weights with the group scale folded into the e4m3 operand ("fold"), as arithmetic: what
 * the CUDA kernel (cuda/w4a8_fold_gemm.cu) computes, the CPU's emulation of it (cpu/cpu_w4a8_fold.c) and the code
 * layout the kernel reads (w4a8_fold.c packs it). Plain C: the kernel's file includes it too.
 *
 * Weights: int4-p2 (quant/int4_p2.h): codes q in -7..7, groups of 128 along K, each scale = rs x 2^k with rs the
 * row's largest scale and k in [-12, 0]. With j = k + 6 in [-6, 6], q x 2^j is a normal e4m3 value (|q| 2^j in
 * [2^-6, 448]): the weight operand is e4m3(q x 2^j), exact, and rs x 2^-6 is left for the epilogue.
 * Activations: e4m3 with ONE scale per token (row): scale = max(amax / 448, FM_ACT_SCALE_FLOOR), code = e4m3(x /
 * scale) (fm_e4m3_quantize_groups with group = K). K is padded to a multiple of 128 with zero codes.
 *
 * y[n][r] = fp32(acc x fp32(rs_r 2^-6 x s_n)), acc = fp32 sum, in order, of the blocks of P 128-groups (the last
 * block may be shorter): acc = 0; for each block b: acc = fp32(acc + part_b). part_b is the block's sum of exact
 * products, summed by the tensor cores in their FP8 accumulator; our model of it (bench/NOTES.md 2026-12-04,
 * twentieth session): the exact products aligned per 16 to the running maximum exponent and truncated ~13 bits
 * below it (~14 significant bits, as DeepSeek-V3 reports for Hopper). The CPU emulation takes part_b as the exact
 * sum rounded once to fp32, so the GPU differs from it by the accumulator's truncation only: at most ~2^-13 of
 * the block's largest partial magnitude per block (the GPU op tests' tolerance says so). P is FM_FOLD_PROMOTE. */
#ifndef FM_BACKEND_W4A8_FOLD_H
#define FM_BACKEND_W4A8_FOLD_H

#include <stdbool.h>
#include <stdint.h>

/* 128-groups per fp32 promotion: the accumulator error model gives 2e-4 relative RMS at P = 4 against 8.5e-5 at
 * P = 1 and 2.2e-3 for all of K = 14336 (bench/NOTES.md 2026-12-04 "folding the group scale", part 2; this session
 * measures the same with this file's emulation: 2026-12-05 twenty-third session). */
#define FM_FOLD_PROMOTE 4
#define FM_FOLD_J_BIAS 6 /* j = k + 6: the exponent the operand carries */
#define FM_FOLD_J_MIN (-6)
#define FM_FOLD_J_MAX 6

/* The conversion's 8-entry tables: e4m3(m x 2^j) for m = 0..7 as bytes, m 0..3 in lo and 4..7 in hi. e4m3 of m 2^j
 * is byte ((e + j) << 3 | mantissa) with e, mantissa of m (1: 7,0; 2: 8,0; 3: 8,4; 4: 9,0; 5: 9,2; 6: 9,4; 7: 9,6),
 * so a table is the j = 0 one plus j in each nonzero byte's exponent field: one multiply-add each. */
#define FM_FOLD_TLO0 0x44403800u
#define FM_FOLD_TLO_STEP 0x08080800u
#define FM_FOLD_THI0 0x4E4C4A48u
#define FM_FOLD_THI_STEP 0x08080808u

/* The code layout of one matrix (bytes equal to the int4-tc layout's: rows_pad x pad128(K) / 2):
 *   [group g][segment s (0..3)][row r (rows_pad)][16 bytes], the codes of row r at k = 128 g + 32 s .. + 31,
 * so that 32 consecutive rows' 16-byte loads are one 512-byte run. Of the 4 words, word i holds k0 = 128 g + 32 s
 * + 8 i .. k0 + 7: the magnitude of code k0 + c in bits 4c .. 4c + 2 (c = 0..7); the sign of code k0 + c in bit
 * 8c + 7 for c < 4 and bit 8 (c - 4) + 3 for c >= 4. Then one mask makes the selectors of two byte permutes
 * through the row's table (the low and high 16 bits: codes k0..k0+3 and k0+4..k0+7), and the signs land on the
 * permuted bytes' bit 7 with a mask (and a shift by 4 for the high half): 7 instructions per 8 codes.
 * Rows are in the int4-tc order (gate|up banks interleaved by 8, fm_w4a8_fold_source_row); rows past the bank's
 * are zero. The scales stay the int4-tc bank's: bf16 [group][rows_pad]. */
static inline int64_t fm_w4a8_fold_code_offset(int64_t rows_pad, int64_t g, int64_t s, int64_t r) {
    return ((g * 4 + s) * rows_pad + r) * 16;
}

/* Source row of packed row r of a bank of `rows` rows (gate|up interleaved by 8 rows: as fm_tc_source_row). */
static inline int64_t fm_w4a8_fold_source_row(int64_t r, int64_t rows, bool interleaved) {
    if (!interleaved) return r;
    const int64_t b = r / 16, w = r % 16, I = rows / 2;
    return w < 8 ? 8 * b + w : I + 8 * b + (w - 8);
}

/* Packs one matrix of int4-p2 codes q [rows][K] (-7..7) into the fold layout (codes: rows_pad x pad128(K) / 2
 * bytes, rows_pad a multiple of 32 >= rows) and its scales [rows][ceil(K / 128)] (fp32 values of bf16 scales) into
 * bf16 bits [G][rows_pad], both zero past the bank. */
void fm_w4a8_fold_pack(const int8_t *q, const float *scales, int64_t rows, int64_t K, bool interleaved,
                       int64_t rows_pad, uint8_t *codes, uint16_t *scales_bf16);

/* The warp-specialised kernel's form of a bank's scales (cuda/w4a8_fold_ws.cu reads them instead of the bf16
 * scales): for n matrices with bf16 p2 scales [n][G][rows_pad] (bits), the operand's exponent j = k + 6 per (matrix,
 * group, row) into fold_j [n][G][rows_pad] and the row scale rs x 2^-6 per (matrix, row) into fold_rs [n][rows_pad]
 * (rows past `rows` and all-zero rows: j 0, rs 0). False, with *bad_m and *bad_r naming the first such row, when a
 * row's scales do not have the int4-p2 form (fm_int4_p2_split); the arrays are then incomplete. */
bool fm_w4a8_fold_split_scales(const uint16_t *scales_bf16, int32_t n, int64_t rows, int64_t rows_pad, int64_t G,
                               int8_t *fold_j, float *fold_rs, int32_t *bad_m, int64_t *bad_r);

/* The kernel's conversion of one code word with the table of exponent j, in C (the tests check it against e4m3 of
 * q x 2^j): lo gets the e4m3 bytes of codes k0..k0+3, hi of k0+4..k0+7. */
void fm_w4a8_fold_convert_word(uint32_t w, int32_t j, uint32_t *lo, uint32_t *hi);

/* Per-token e4m3: rows of x [rows][ld_in] (K used) into codes [rows][ldx] (zero past K) and one scale per row. */
void fm_w4a8_fold_quantize_tokens(const float *x, int64_t rows, int64_t K, int64_t ld_in, uint8_t *codes, int64_t ldx,
                                  float *scales);

/* The exact emulation (above, with part_b the exact block sum rounded to fp32): y [N][rows] = the kernel's fp32
 * output before its bf16 rounding, for one int4-p2 matrix q [rows][K], scales [rows][ceil(K / 128)] (fp32 values of
 * bf16 p2 scales), activations x8 [N][ldx] e4m3 with their scales, promoting every P groups (P <= 0: all of K).
 * Activation scales per token: xs[n]. Per (token, 128-group) when per_group (xs[g * lds + n], as the dispatch writes
 * them; the kernel then promotes every group: acc = fmaf(part_g, xs, acc), y = acc x rs 2^-6, P ignored).
 * Returns false, computing nothing, when a row's scales do not have the int4-p2 form (fm_int4_p2_split). */
bool fm_w4a8_fold_ref(const int8_t *q, const float *scales, int64_t rows, int64_t K, const uint8_t *x8, int64_t ldx,
                      const float *xs, int64_t lds, bool per_group, int64_t N, int32_t P, float *y);

#endif
