/* Native int4 sources of a bank into the row layout, in parallel over the sources (see int4_native_rows.h). */
#include "backend/int4_native_rows.h"

#include <stdlib.h>

#include "quant/int4_repack.h"
#include "util/status.h"

int64_t fm_bank_src_rows(const fm_bank_src *src, int64_t first, int64_t count) {
    int64_t rows = 0;
    for (int64_t s = first; s < first + count; s++) rows += src->srcs[s].rows;
    return rows;
}

fm_status fm_int4_native_bank_rows(const fm_bank_src *src, int64_t first, int64_t count, int64_t ng, int64_t ld,
                                   uint8_t *codes, uint16_t *scales, fm_error *err) {
    int64_t *row0 = malloc((size_t)(count > 0 ? count : 1) * sizeof *row0);
    if (!row0) return fm_fail(err, FM_ERR_NOMEM, "out of memory for the row offsets of %s", src->label);
    for (int64_t s = 0, r = 0; s < count; r += src->srcs[first + s].rows, s++) row0[s] = r;
    const int64_t K = src->srcs[first].cols;
    fm_status st = FM_OK;
    int64_t bad = count; /* the lowest failing source: its message is the one reported */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t s = 0; s < count; s++) {
        const fm_wsrc *w = &src->srcs[first + s];
        fm_error e;
        fm_status ss = FM_OK;
        if (!fm_wsrc_is_quantized(w))
            ss = fm_fail(&e, FM_ERR_UNSUPPORTED,
                         "%s: source %lld is not pre-quantized, so it cannot fill an int4 bank "
                         "from its codes",
                         src->label, (long long)(first + s));
        else if (w->cols != K)
            ss = fm_fail(&e, FM_ERR_FORMAT, "%s: source %lld has %lld columns, the bank %lld", src->label,
                         (long long)(first + s), (long long)w->cols, (long long)K);
        else
            ss = fm_int4_native_rows(&w->q, w->rows, K, ng, codes + row0[s] * ld, ld, scales + row0[s] * ng, src->label,
                                     &e);
        if (ss) {
#pragma omp critical(fm_int4_native_bank_rows)
            if (s < bad) {
                bad = s, st = ss;
                if (err) *err = e;
            }
        }
    }
    free(row0);
    return st;
}
