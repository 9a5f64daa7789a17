/* Status helpers: fill an fm_error and return the status in one expression. */
#ifndef FM_UTIL_STATUS_H
#define FM_UTIL_STATUS_H

#include "fp8moe.h"

#if defined(__GNUC__)
#define FM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FM_PRINTF(a, b)
#endif

/* Writes the formatted message into err (when err is not NULL) and returns st. */
fm_status fm_fail(fm_error *err, fm_status st, const char *fmt, ...) FM_PRINTF(3, 4);

/* Prepends "prefix: " to the message already in err (for adding the file or tensor name on the way up). */
void fm_error_prefix(fm_error *err, const char *fmt, ...) FM_PRINTF(2, 3);

/* For the invariant checkers (fm_kv_pool_check and its kin): writes the formatted message into msg[len] and returns
   false, so a check reads `return fm_check_failed(msg, len, "...", ...)`. */
bool fm_check_failed(char *msg, size_t len, const char *fmt, ...) FM_PRINTF(3, 4);

/* Allocation that reports failure through err; returns NULL on failure. */
void *fm_malloc(size_t bytes, fm_error *err, const char *what);
void *fm_calloc(size_t n, size_t size, fm_error *err, const char *what);

/* Checked arithmetic for sizes from untrusted files: false on overflow. */
bool fm_mul_u64(uint64_t a, uint64_t b, uint64_t *out);
bool fm_add_u64(uint64_t a, uint64_t b, uint64_t *out);

#endif
