/* e4m3-block banks on the CPU: a block-FP8 checkpoint's linears (DeepSeek-V3, Qwen3-*-FP8) kept as they are:
 *   codes  [n][rows][K]             the checkpoint's e4m3 bytes, never re-rounded
 *   scales [n][rows][ceil(K/128)]   weight_scale_inv[row / bn, g] of the part the row belongs to, fp32
 * The scale is stored per row (not per block of bn rows) so that the parts of a fused bank (q|k|v, gate|up), each
 * with its own block grid and a row count bn need not divide, concatenate along rows without re-blocking; the GPU
 * layout wants a scale per row as well. The K-block must be 128, the activation group of the fp8 plans: one weight
 * scale per activation group. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/status.h"

static fm_status check_part(const fm_bank_src *src, int32_t i, int32_t j, int64_t cols, fm_error *err) {
    const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j], *s0 = &src->srcs[j];
    if (s->q.method != FM_QUANT_FP8_BLOCK)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: part %d of matrix %d is not stored as block-FP8 while other parts are; an e4m3-block bank "
                       "cannot mix them (use --preset ref)",
                       src->label, j, i);
    if (s->cols != cols || s->rows != s0->rows)
        return fm_fail(err, FM_ERR_FORMAT, "%s: matrix %d part %d is [%lld, %lld], expected [%lld, %lld]", src->label,
                       i, j, (long long)s->rows, (long long)s->cols, (long long)s0->rows, (long long)cols);
    if (s->q.group != FM_CPU_GROUP)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: block-FP8 blocks are %d wide along K; the e4m3-block bank takes 128 (one weight scale per "
                       "1x128 activation group)",
                       src->label, s->q.group);
    return FM_OK;
}

/* rows of one part: its bytes, and each row's scales from its block row */
static fm_status fill_part(fm_bank *w, const fm_wsrc *s, int64_t r0, float *blocks, fm_error *err) {
    const int64_t K = w->cols, ng = w->n_groups, bn = s->q.block_n, n_blocks = (s->rows + bn - 1) / bn * ng;
    fm_status st = fm_st_check_finite(s->q.packed, 0, s->rows * K, err); /* NaN codes */
    if (!st) st = fm_st_read_f32(s->q.scales, 0, n_blocks, blocks, err);
    for (int64_t b = 0; !st && b < n_blocks; b++)
        if (!isfinite(blocks[b]))
            st = fm_fail(err, FM_ERR_FORMAT, "tensor '%s': scale %lld is not finite", s->q.scales->name, (long long)b);
    if (st) return st;
    memcpy(w->codes + r0 * K, s->q.packed->data, (size_t)(s->rows * K));
    for (int64_t n = 0; n < s->rows; n++)
        memcpy(w->scales + (r0 + n) * ng, blocks + (n / bn) * ng, (size_t)ng * sizeof(float));
    return FM_OK;
}

fm_status cpu_bank_fill_e4m3b(fm_bank *w, const fm_bank_src *src, fm_error *err) {
    const int64_t K = w->cols, rows = w->rows;
    fm_status st = FM_OK;
    for (int32_t i = 0; !st && i < src->n; i++)
        for (int32_t j = 0; !st && j < src->n_parts; j++) st = check_part(src, i, j, K, err);
    if (st) return st;
    w->group = FM_CPU_GROUP;
    w->n_groups = (K + FM_CPU_GROUP - 1) / FM_CPU_GROUP;
    int64_t max_blocks = 0; /* the largest part's block grid, read once per part */
    for (int32_t j = 0; j < src->n_parts; j++) {
        const int64_t b = (src->srcs[j].rows + src->srcs[j].q.block_n - 1) / src->srcs[j].q.block_n * w->n_groups;
        max_blocks = b > max_blocks ? b : max_blocks;
    }
    w->codes = fm_malloc((size_t)(w->n * rows * K), err, src->label);
    w->scales = fm_malloc((size_t)(w->n * rows * w->n_groups) * sizeof(float), err, src->label);
    float *blocks = fm_malloc((size_t)max_blocks * sizeof(float), err, src->label);
    if (!w->codes || !w->scales || !blocks) st = FM_ERR_NOMEM;
    for (int32_t i = 0; !st && i < w->n; i++) {
        int64_t r0 = (int64_t)i * rows;
        for (int32_t j = 0; !st && j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            st = fill_part(w, s, r0, blocks, err);
            r0 += s->rows;
        }
    }
    free(blocks);
    return st;
}
