/* A checked copy in pieces, one piece per thread (see safetensors_copy.h). */
#include "io/safetensors_copy.h"

#include <string.h>

#include "util/status.h"

/* elements of a piece: 1 MiB of bf16, large enough that a piece is worth a thread */
#define PIECE ((int64_t)1 << 19)

fm_status fm_st_copy_finite(const fm_st_tensor *t, int64_t first, int64_t n, void *dst, fm_error *err) {
    if (!t || first < 0 || n < 0 || first > t->n_elements || n > t->n_elements - first)
        return fm_st_check_finite(t, first, n, err); /* its message names the bad range */
    const int64_t esz = fm_dtype_size(t->dtype), pieces = (n + PIECE - 1) / PIECE;
    int64_t bad = pieces; /* the lowest failing piece reports */
    fm_status st = FM_OK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t a = p * PIECE, len = n - a < PIECE ? n - a : PIECE;
        fm_error e;
        const fm_status ps = fm_st_check_finite(t, first + a, len, &e);
        if (ps) {
#pragma omp critical(fm_st_copy_finite)
            if (p < bad) {
                bad = p, st = ps;
                if (err) *err = e;
            }
        } else {
            memcpy((uint8_t *)dst + a * esz, t->data + (first + a) * esz, (size_t)(len * esz));
        }
    }
    return st;
}
