#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fm_status_name(fm_status st) {
    switch (st) {
    case FM_OK: return "ok";
    case FM_ERR_USAGE: return "usage error";
    case FM_ERR_IO: return "i/o error";
    case FM_ERR_FORMAT: return "bad input";
    case FM_ERR_UNSUPPORTED: return "unsupported";
    case FM_ERR_NOMEM: return "out of memory";
    case FM_ERR_BACKEND: return "backend error";
    }
    return "unknown status";
}

fm_status fm_fail(fm_error *err, fm_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* messages are one line: control characters from file contents (names, JSON strings) become spaces */
        for (char *c = err->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    }
    return st;
}

void fm_error_prefix(fm_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    /* the result is cut at the buffer's end when too long; the prefix matters most */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
}

void *fm_malloc(size_t bytes, fm_error *err, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fm_fail(err, FM_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *fm_calloc(size_t n, size_t size, fm_error *err, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fm_fail(err, FM_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", n, size, what);
    return p;
}

bool fm_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
bool fm_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

bool fm_check_failed(char *msg, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (len) vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return false;
}
