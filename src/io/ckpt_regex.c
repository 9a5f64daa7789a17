#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/ckpt_regex.h"

#include <pcre2.h>
#include <string.h>

#include "util/status.h"

/* Generous for module names (a few hundred bytes) and small enough that a hostile pattern costs milliseconds. */
#define MATCH_LIMIT 100000
#define DEPTH_LIMIT 1000
#define HEAP_LIMIT_KIB 1024

fm_status fm_regex_match(const char *pattern, const char *subject, bool *hit, fm_error *err) {
    *hit = false;
    const size_t len = strlen(pattern);
    if (len > FM_REGEX_MAX_PATTERN)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "regex \"%.60s...\" is %zu bytes long, more than the limit of %d",
                       pattern, len, FM_REGEX_MAX_PATTERN);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) return fm_fail(err, FM_ERR_NOMEM, "out of memory compiling regex \"%.80s\"", pattern);
    pcre2_set_max_pattern_length(cc, FM_REGEX_MAX_PATTERN);
    pcre2_set_parens_nest_limit(cc, 64);
    int code = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_ANCHORED | PCRE2_UTF, &code, &off, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR why[160];
        pcre2_get_error_message(code, why, sizeof why);
        return fm_fail(err, FM_ERR_UNSUPPORTED, "regex \"%.80s\" is not a valid regular expression: %s at offset %zu",
                       pattern, (const char *)why, (size_t)off);
    }
    fm_status st = FM_OK;
    if (subject) {
        pcre2_match_context *mc = pcre2_match_context_create(NULL);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        if (!mc || !md) st = fm_fail(err, FM_ERR_NOMEM, "out of memory matching regex \"%.80s\"", pattern);
        if (!st) {
            pcre2_set_match_limit(mc, MATCH_LIMIT);
            pcre2_set_depth_limit(mc, DEPTH_LIMIT);
            pcre2_set_heap_limit(mc, HEAP_LIMIT_KIB);
            const int rc = pcre2_match(re, (PCRE2_SPTR)subject, strlen(subject), 0, 0, md, mc);
            if (rc >= 0) *hit = true;
            else if (rc != PCRE2_ERROR_NOMATCH) {
                PCRE2_UCHAR why[160];
                pcre2_get_error_message(rc, why, sizeof why);
                st = fm_fail(err, FM_ERR_UNSUPPORTED,
                             "regex \"%.80s\" on '%.160s': %s (a pattern that backtracks this "
                             "much is refused)",
                             pattern, subject, (const char *)why);
            }
        }
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
    }
    pcre2_code_free(re);
    return st;
}
