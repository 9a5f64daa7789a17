/* Added tokens (special and not) found in the text before anything else runs, as `tokenizers`' AddedVocabulary:
 * leftmost-longest, non-overlapping matches; a match that is skipped (a special token while parse_special is
 * false, a single_word token inside a word) is still consumed; lstrip/rstrip take the whitespace beside it. */
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"
#include "util/status.h"

/* The code point that ends s[0..n) (n > 0, valid UTF-8). */
static uint32_t last_cp(const char *s, size_t n, size_t *start) {
    size_t i = n - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    *start = i;
    const int len = tok_utf8_len((const uint8_t *)s + i, n - i);
    return len ? tok_utf8_decode((const uint8_t *)s + i, len) : 0xFFFD;
}

static uint32_t first_cp(const char *s, size_t n, size_t *len_out) {
    int len = tok_utf8_len((const uint8_t *)s, n);
    *len_out = len ? (size_t)len : 1;
    return len ? tok_utf8_decode((const uint8_t *)s, len) : 0xFFFD;
}

/* Rust regex's \s and \w (Unicode). */
static bool is_space(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
    const utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

static bool is_word(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
    }
}

/* The longest allowed-kind added token at s[i..n), or -1. The candidates of a first byte are sorted longest first. */
static int longest_at(const fm_tokenizer *t, const char *s, size_t n, size_t i, bool normalized) {
    const uint8_t b = (uint8_t)s[i];
    for (int32_t k = t->first_added[b][0]; k < t->first_added[b][1]; k++) {
        const tok_added *a = &t->added[t->added_by_byte[k]];
        if (a->normalized != normalized || a->match_len > n - i) continue;
        if (memcmp(s + i, a->match, a->match_len) == 0) return t->added_by_byte[k];
    }
    return -1;
}

fm_status tok_split_added(const fm_tokenizer *t, const char *s, size_t n, bool normalized, bool parse_special,
                          const tok_added_cb *cb, fm_error *err) {
    size_t done = 0; /* start_offset: the text before it has been emitted */
    fm_status st = FM_OK;
    const bool any = normalized ? t->any_normalized_added : t->n_added > 0;
    for (size_t i = 0; any && !st && i < n;) {
        if (t->first_added[(uint8_t)s[i]][0] == t->first_added[(uint8_t)s[i]][1]) {
            i++;
            continue;
        }
        const int k = longest_at(t, s, n, i, normalized);
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t start = i, stop = i + a->match_len;
        i = stop; /* the match is consumed even when it is skipped below */
        if (a->special && !parse_special) continue;
        if (a->single_word) {
            size_t at, len;
            const bool start_ok = start == 0 || !is_word(last_cp(s, start, &at));
            const bool stop_ok = stop == n || !is_word(first_cp(s + stop, n - stop, &len));
            if (!start_ok || !stop_ok) continue;
        }
        if (a->lstrip) {
            size_t at = start;
            while (at > 0) {
                size_t prev;
                if (!is_space(last_cp(s, at, &prev))) break;
                at = prev;
            }
            start = at > done ? at : done;
        }
        if (a->rstrip) {
            size_t len;
            while (stop < n && is_space(first_cp(s + stop, n - stop, &len))) stop += len;
        }
        if (start < done) start = done; /* an rstrip that reached into this match */
        if (start > done) st = cb->text(cb->ctx, done, start, err);
        if (!st) st = cb->token(cb->ctx, a->id, err);
        done = stop; /* the search goes on after the match itself, as `tokenizers` (not after the stripped space) */
    }
    if (!st && done < n) st = cb->text(cb->ctx, done, n, err);
    return st;
}
