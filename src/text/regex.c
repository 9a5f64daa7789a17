/* PCRE2 as the tokenizer uses it: patterns from tokenizer.json compiled as written, with UTF and Unicode
 * properties (UCP: \s, \w, \d mean what they mean in `tokenizers`' Oniguruma and Rust regexes), JIT-compiled. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

fm_status tok_regex_compile(const char *pattern, bool literal, const char *what, pcre2_code **out, fm_error *err) {
    int code = 0;
    PCRE2_SIZE at = 0;
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    if (!tok_utf8_valid(pattern, strlen(pattern)))
        return fm_fail(err, FM_ERR_FORMAT, "tokenizer.json: %s: the pattern is not valid UTF-8", what);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "tokenizer.json: %s: regex '%.200s' does not compile (at offset %zu: %s)", what, pattern,
                       (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT (an unsupported CPU) the interpreter runs */
    *out = re;
    return FM_OK;
}

fm_status tok_regex_each(const pcre2_code *re, const char *s, size_t n, pcre2_match_data *md,
                         void (*fn)(void *ctx, size_t start, size_t end), void *ctx, fm_error *err) {
    size_t at = 0;
    while (at < n) {
        /* the JIT entry point skips pcre2_match's option checks; a pattern without JIT code takes the interpreter */
        int rc = pcre2_jit_match(re, (PCRE2_SPTR)s, n, at, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_BADOPTION) rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fm_fail(err, FM_ERR_FORMAT, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            fn(ctx, ov[0], ov[1]);
            at = ov[1];
        } else { /* an empty match: step over one character */
            at = ov[0] + 1;
            while (at < n && ((uint8_t)s[at] & 0xC0) == 0x80) at++;
        }
    }
    return FM_OK;
}
