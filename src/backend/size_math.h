/* Checked size arithmetic for the byte formulas of the memory plan and the backend kinds: an overflow sets the flag
 * and the result is garbage (callers test the flag). */
#ifndef FM_BACKEND_SIZE_MATH_H
#define FM_BACKEND_SIZE_MATH_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

typedef struct fm_sz {
    bool ovf;
} fm_sz;

static inline uint64_t fm_sz_mul(fm_sz *s, uint64_t a, uint64_t b) {
    uint64_t r = 0;
    if (!fm_mul_u64(a, b, &r)) s->ovf = true;
    return r;
}

static inline uint64_t fm_sz_add(fm_sz *s, uint64_t a, uint64_t b) {
    uint64_t r = 0;
    if (!fm_add_u64(a, b, &r)) s->ovf = true;
    return r;
}

static inline uint64_t fm_sz_ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* SIZE_MAX once anything overflowed */
static inline size_t fm_sz_size(const fm_sz *s, uint64_t v) {
    return s->ovf || v > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)v;
}

#endif
