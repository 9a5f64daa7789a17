/* int4-g128 (and -tc) banks on the CPU from pre-quantized sources in our own format (quant/int4_native.h): the codes
 * q = u - 8 and the bf16 scales go straight into the layout the int4 preset builds by quantizing a float checkpoint
 * (codes as floats [n][rows][cols], scales [n][rows][ceil(cols / 128)]), never through float weights, so a
 * checkpoint written by `fp8moe requantize` gives the very bank its float source gives. The sources go through the
 * int4 row layout on every core (backend/int4_native_rows.h), then expand to floats on every core. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/int4_native_rows.h"
#include "quant/bf16.h"
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
    const int64_t ng = w->n_groups, ld = (K + 1) / 2, all_rows = (int64_t)w->n * rows;
    w->w = fm_malloc((size_t)(all_rows * K) * sizeof(float), err, src->label);
    w->scales = fm_malloc((size_t)(all_rows * ng) * sizeof(float), err, src->label);
    uint8_t *codes = fm_malloc((size_t)(all_rows * ld), err, src->label);
    uint16_t *sc16 = fm_malloc((size_t)(all_rows * ng) * sizeof *sc16, err, src->label);
    fm_status st = w->w && w->scales && codes && sc16 ? FM_OK : FM_ERR_NOMEM;
    if (!st) st = fm_int4_native_bank_rows(src, 0, (int64_t)src->n * src->n_parts, ng, ld, codes, sc16, err);
    float pair[256][2]; /* a byte of two two's complement nibbles as its two values: ((x ^ 8) - 8) sign-extends x */
    for (int b = 0; b < 256; b++) pair[b][0] = (float)(((b & 15) ^ 8) - 8), pair[b][1] = (float)(((b >> 4) ^ 8) - 8);
    if (!st) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < all_rows; r++) {
            const uint8_t *row = codes + r * ld;
            float *dst = w->w + r * K;
            for (int64_t b = 0; b < K / 2; b++) memcpy(dst + 2 * b, pair[row[b]], sizeof pair[0]);
            if (K % 2) dst[K - 1] = pair[row[K / 2]][0];
            for (int64_t g = 0; g < ng; g++) w->scales[r * ng + g] = fm_bf16_to_f32(sc16[r * ng + g]); /* exact */
        }
    }
    free(codes);
    free(sc16);
    return st;
}
