/* What a request body must be before it is parsed, and what the server's replies never echo:
 *   - UTF-8 (JSON text is UTF-8): invalid bytes are a 400 naming their offset, never passed on to the tokenizer
 *     or copied raw into an error message;
 *   - no \u0000 escape: the parsed strings are NUL-terminated, so a NUL would silently cut the text after it.
 * utf8_sanitize writes a string with each invalid sequence replaced by U+FFFD, for error messages that quote
 * what a client sent. */
#include <string.h>

#include "serve/serve_internal.h"

/* the length of the valid UTF-8 sequence at p (n bytes left), 0 when invalid (overlong, surrogate, > U+10FFFF) */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    const unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static bool hex_zero4(const char *p, size_t n) { return n >= 4 && !memcmp(p, "0000", 4); }

int body_check(const char *body, size_t len, oa_error *e) {
    const unsigned char *p = (const unsigned char *)body;
    for (size_t i = 0; i < len;) {
        if (p[i] == 0)
            return oa_fail(e, 400, "invalid_request_error", "invalid_body", NULL,
                           "the body holds a NUL byte at offset %zu: JSON text cannot", i);
        const size_t k = utf8_seq(p + i, len - i);
        if (!k)
            return oa_fail(e, 400, "invalid_request_error", "invalid_body", NULL,
                           "the body is not valid UTF-8 (byte 0x%02x at offset %zu)", p[i], i);
        /* outside strings valid JSON has no backslash, so every backslash starts an escape */
        if (p[i] == '\\' && i + 1 < len) {
            if (p[i + 1] == 'u' && hex_zero4(body + i + 2, len - i - 2))
                return oa_fail(e, 400, "invalid_request_error", "invalid_body", NULL,
                               "the body holds the escape \\u0000 (a NUL character) at offset %zu: text with NUL "
                               "characters is refused rather than cut short",
                               i);
            i += 2;
            continue;
        }
        i += k;
    }
    return 0;
}

void utf8_sanitize(sbuf *out, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_seq(p + i, n - i);
        if (k) sb_put(out, s + i, k), i += k;
        else sb_puts(out, "\xEF\xBF\xBD"), i++;
    }
    if (!out->p) sb_put(out, "", 0);
}
