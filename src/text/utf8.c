/* UTF-8 as the tokenizer needs it: validation, the lossy decoding `tokenizers` applies to bytes, and the growable
 * buffers every stage writes into. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

bool tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

bool tok_buf_putc(tok_buf *b, char c) { return tok_buf_put(b, &c, 1); }

bool tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->p, (size_t)cap * sizeof *p);
        if (!p) return false;
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = id;
    return true;
}

/* Well-formed sequences, Unicode table 3-7: the length a multi-byte lead byte c announces and the range [lo, hi] of
 * the second byte, which depends on c; 0 for a byte that cannot lead one. */
static int lead_byte(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c == 0xE0) return *lo = 0xA0, 3;
    if (c == 0xED) return *hi = 0x9F, 3;
    if (c >= 0xE1 && c <= 0xEF) return 3;
    if (c == 0xF0) return *lo = 0x90, 4;
    if (c == 0xF4) return *hi = 0x8F, 4;
    if (c >= 0xF1 && c <= 0xF3) return 4;
    return 0;
}

int tok_utf8_len(const uint8_t *s, size_t n) {
    const uint8_t c = s[0];
    if (c < 0x80) return 1;
    uint8_t lo, hi;
    const int len = lead_byte(c, &lo, &hi);
    if (!len) return 0;
    if (n < (size_t)len || s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

/* How many bytes of the ill-formed sequence at s form one maximal subpart (replaced by one U+FFFD): the lead byte
 * and the continuation bytes that were still valid for it. */
static size_t maximal_subpart(const uint8_t *s, size_t n) {
    uint8_t lo, hi;
    const int len = lead_byte(s[0], &lo, &hi);
    if (!len) return 1;
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) k++;
    else return 1;
    while (k < (size_t)len && k < n && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

uint32_t tok_utf8_decode(const uint8_t *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
               (s[3] & 0x3F);
    }
}

int tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tok_utf8_valid(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        const int len = tok_utf8_len(u + i, n - i);
        if (!len) return false;
        i += (size_t)len;
    }
    return true;
}

bool tok_utf8_lossy(const char *s, size_t n, tok_buf *out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t run = 0; /* start of the valid run not yet copied */
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        const int len = tok_utf8_len(u + i, n - i);
        if (len) {
            i += (size_t)len;
            continue;
        }
        if (!tok_buf_put(out, s + run, i - run) || !tok_buf_put(out, "\xEF\xBF\xBD", 3)) return false;
        i += maximal_subpart(u + i, n - i);
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

const char *tok_find(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || m > n) return NULL;
    for (const char *p = hay, *end = hay + n - m; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, m) == 0) return p;
        p++;
    }
    return NULL;
}
