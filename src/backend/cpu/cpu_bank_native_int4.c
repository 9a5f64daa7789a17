/* int4-g128 (and -tc) banks on the CPU from pre-quantized sources in our own format (quant/int4_native.h): the codes
 * q = u - 8 and the bf16 scales go straight into the layout the int4 preset builds by quantizing a float checkpoint
 * (codes as floats [n][rows][cols], scales [n][rows][ceil(cols / 128)]), never through float weights, so a
 * checkpoint written by `fp8moe requantize` gives the very bank its float source gives. */
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "quant/int4.h"
#include "util/status.h"

fm_status cpu_bank_fill_native_int4(fm_bank *w, const fm_bank_src *src, fm_error *err) {
    const int64_t K = w->cols, rows = w->rows;
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_wsrc *s = &src->srcs[i], *s0 = &src->srcs[i % src->n_parts];
        if (!fm_wsrc_is_quantized(s) || !fm_qsrc_native_layout(&s->q, s->cols))
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: source %lld is not int4 symmetric with groups of %d and bf16 scales, so it cannot "
                           "fill a %s bank directly",
                           src->label, (long long)i, FM_NATIVE_GROUP, fm_wformat_name(w->fmt));
        if (s->cols != K || s->rows != s0->rows)
            return fm_fail(err, FM_ERR_FORMAT, "%s: source %lld is [%lld, %lld], expected [%lld, %lld]", src->label,
                           (long long)i, (long long)s->rows, (long long)s->cols, (long long)s0->rows, (long long)K);
    }
    w->n_groups = fm_int4_n_groups(K, FM_CPU_GROUP);
    const int64_t ng = w->n_groups;
    w->w = fm_malloc((size_t)(w->n * rows * K) * sizeof(float), err, src->label);
    w->scales = fm_malloc((size_t)(w->n * rows * ng) * sizeof(float), err, src->label);
    if (!w->w || !w->scales) return FM_ERR_NOMEM;
    fm_status st = FM_OK;
    for (int32_t i = 0; !st && i < w->n; i++) {
        int64_t row0 = 0;
        for (int32_t j = 0; !st && j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            fm_int4_ckpt c;
            if ((st = fm_int4_ckpt_decode(&s->q, s->rows, K, &c, err))) break;
            st = fm_int4_ckpt_check_symmetric(&c, src->label, s->q.packed->name, err);
            for (int64_t n = 0; !st && n < s->rows; n++) {
                const int64_t r = (int64_t)i * rows + row0 + n;
                for (int64_t k = 0; k < K; k++) w->w[r * K + k] = (float)((int32_t)c.codes[n * K + k] - 8);
                for (int64_t g = 0; g < ng; g++) w->scales[r * ng + g] = c.scales[n * ng + g]; /* bf16 values */
            }
            row0 += s->rows;
            fm_int4_ckpt_free(&c);
        }
    }
    return st;
}
