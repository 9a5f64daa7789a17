/* What the two halves of the safetensors reader share (safetensors.c: one file; safetensors_dir.c: the shard index
 * and the checkpoint directory): names, the quoting of names in messages, the sort orders. Private to src/io. */
#ifndef FM_IO_SAFETENSORS_SHARED_H
#define FM_IO_SAFETENSORS_SHARED_H

#include <string.h>

#include "io/safetensors.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define SHARD_SUFFIX ".safetensors"
/* Longest piece of a name or label quoted in a message, so that one message keeps every part readable. */
#define QUOTE_MAX 160

typedef struct quoted {
    char s[QUOTE_MAX + 8];
} quoted;

/* A printable copy of s for a one-line message: control bytes become '?', long strings are cut with "...". */
static inline const char *q(quoted *b, const char *s) {
    if (!s) s = "(null)";
    size_t n = 0;
    for (; s[n] && n < QUOTE_MAX; n++) {
        unsigned char c = (unsigned char)s[n];
        b->s[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[n]) {
        memcpy(b->s + n, "...", 4);
    } else {
        b->s[n] = '\0';
    }
    return b->s;
}

static inline int cmp_tensor_ptr_name(const void *a, const void *b) {
    const fm_st_tensor *const *x = a;
    const fm_st_tensor *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static inline int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

#endif
