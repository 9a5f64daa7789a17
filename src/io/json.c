/* JSON text hygiene shared by every JSON reader of fp8moe. */
#include "io/json.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

/* Checks what cJSON does not: strict UTF-8 (as the reference reader requires), no NUL byte and no \u0000
 * escape (cJSON strings are C strings: a NUL would silently cut a name short). Returns the byte offset of
 * the first problem, or -1 when the text is clean; *why says what it is. */
static int64_t text_problem(const uint8_t *s, uint64_t n, const char **why) {
    uint64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == 0) {
            *why = "a NUL byte";
            return (int64_t)i;
        }
        if (c == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' &&
                s[i + 5] == '0') {
                *why = "a \\u0000 escape";
                return (int64_t)i;
            }
            if (s[i + 1] == 0) {
                *why = "a NUL byte";
                return (int64_t)i + 1;
            }
            i += 2; /* the escaped character (ASCII if valid JSON) */
            continue;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int len;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            *why = "invalid UTF-8";
            return (int64_t)i;
        }
        if (n - i < (uint64_t)len) {
            *why = "invalid UTF-8 (truncated sequence)";
            return (int64_t)i;
        }
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                *why = "invalid UTF-8";
                return (int64_t)i;
            }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF)) {
            *why = "invalid UTF-8 (overlong, surrogate or out of range)";
            return (int64_t)i;
        }
        i += (uint64_t)len;
    }
    return -1;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key repeated in one object of the tree (cJSON keeps both; Python's json keeps the last, cJSON lookups the first:
 * the two would read different files). Returns FM_OK when every object's keys are distinct. where is the path of
 * v from the root ("quantization_config.config_groups"), for the message. */
static fm_status find_duplicate_key(const cJSON *v, char *where, size_t cap, const char *label, const char *what,
                                    fm_error *err) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return FM_OK;
    const size_t at = strlen(where);
    if (cJSON_IsObject(v)) {
        size_t n = 0;
        for (const cJSON *c = v->child; c; c = c->next) n++;
        if (n > 1) {
            const char **keys = fm_malloc(n * sizeof *keys, err, "JSON keys");
            if (!keys) return FM_ERR_NOMEM;
            size_t i = 0;
            for (const cJSON *c = v->child; c; c = c->next) keys[i++] = c->string ? c->string : "";
            qsort(keys, n, sizeof *keys, cmp_key);
            const char *dup = NULL;
            for (i = 1; i < n && !dup; i++)
                if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
            fm_status st = FM_OK;
            if (dup)
                st = fm_fail(err, FM_ERR_FORMAT,
                             "%.300s: %s: key '%.160s' appears twice%s%.200s%s (Python keeps the "
                             "last value, cJSON the first: remove one)",
                             label, what, dup, at ? " in '" : "", where, at ? "'" : "");
            free(keys);
            if (st) return st;
        }
    }
    int64_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        if (cJSON_IsObject(v)) snprintf(where + at, cap - at, "%s%s", at ? "." : "", c->string ? c->string : "");
        else snprintf(where + at, cap - at, "[%lld]", (long long)i);
        fm_status st = find_duplicate_key(c, where, cap, label, what, err);
        where[at] = '\0';
        if (st) return st;
    }
    return FM_OK;
}

/* Parses JSON text that is not NUL-terminated. The text is copied with zero padding first: cJSON can read
 * past the length it is given (DaveGamble/cJSON issues 804, 775), which must land in our own zeros.
 * Only JSON whitespace may follow the value. On success *root is the tree (caller deletes). */
fm_status fm_json_parse_object(const char *text, uint64_t len, const char *label, const char *what, cJSON **root,
                               fm_error *err) {
    const char *why = NULL;
    *root = NULL;
    int64_t bad = text_problem((const uint8_t *)text, len, &why);
    if (bad >= 0) {
        return fm_fail(err, FM_ERR_FORMAT, "%.300s: %s contains %s at byte %lld", label, what, why, (long long)bad);
    }
    if (len > SIZE_MAX - 16) return fm_fail(err, FM_ERR_NOMEM, "%.300s: %s too large to copy", label, what);
    char *copy = fm_malloc((size_t)len + 16, err, "JSON text");
    if (!copy) return FM_ERR_NOMEM;
    if (len) memcpy(copy, text, (size_t)len);
    memset(copy + len, 0, 16);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(copy, (size_t)len, &end, 0);
    if (!j) {
        uint64_t at = (end && end >= copy && (uint64_t)(end - copy) <= len) ? (uint64_t)(end - copy) : 0;
        free(copy);
        if (len == 0)
            return fm_fail(err, FM_ERR_FORMAT, "%.300s: %s is empty (0 bytes), expected a JSON object", label, what);
        return fm_fail(err, FM_ERR_FORMAT, "%.300s: %s is not valid JSON (error near byte %llu of %llu)", label, what,
                       (unsigned long long)at, (unsigned long long)len);
    }
    uint64_t pos = (end && end >= copy) ? (uint64_t)(end - copy) : len;
    while (pos < len && (copy[pos] == ' ' || copy[pos] == '\t' || copy[pos] == '\n' || copy[pos] == '\r')) pos++;
    free(copy);
    if (pos < len) {
        cJSON_Delete(j);
        return fm_fail(err, FM_ERR_FORMAT,
                       "%.300s: %s has %llu bytes of non-whitespace after the JSON value (from byte %llu)", label, what,
                       (unsigned long long)(len - pos), (unsigned long long)pos);
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fm_fail(err, FM_ERR_FORMAT, "%.300s: %s must be a JSON object at the top level", label, what);
    }
    char where[256] = "";
    fm_status st = find_duplicate_key(j, where, sizeof where, label, what, err);
    if (st) {
        cJSON_Delete(j);
        return st;
    }
    *root = j;
    return FM_OK;
}
