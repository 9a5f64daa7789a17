/* The Jinja lexer (jinja_lex.h). Whitespace follows jinja2's lexer with trim_blocks and lstrip_blocks on:
 * - "{%-"/"{{-"/"{#-" strip all whitespace before the tag, "-%}"/"-}}"/"-#}" all whitespace after it;
 * - lstrip_blocks: spaces and tabs between a line start and "{%" or "{#" go ("{%+" keeps them);
 * - trim_blocks: one newline right after "%}" or "#}" goes ("+%}" keeps it). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"

typedef struct lexer {
    jx *x;
    const char *s;
    size_t n, pos;
    int line;
    jtoks out;
} lexer;

static jtok *push(lexer *L, jtok_kind k) {
    jtoks *t = &L->out;
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        jtok *v = jx_alloc(L->x, (size_t)cap * sizeof *v);
        if (t->n) memcpy(v, t->v, (size_t)t->n * sizeof *v);
        t->v = v, t->cap = cap;
    }
    jtok *k0 = &t->v[t->n++];
    *k0 = (jtok){.kind = k, .line = L->line};
    return k0;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Emits literal text s[0..n) after the controls of the tag that follows it. */
static void emit_text(lexer *L, const char *s, size_t n, char sign, bool block_like, bool line_starting) {
    const int lines = count_lines(s, n);
    if (sign == '-') {
        while (n && is_ws(s[n - 1])) n--;
    } else if (sign != '+' && block_like) {
        size_t l = n;
        while (l && s[l - 1] != '\n') l--;
        if (l > 0 || line_starting) {
            bool blank = l < n;
            for (size_t i = l; i < n; i++)
                if (!is_ws(s[i])) blank = false;
            if (blank) n = l;
        }
    }
    if (n) {
        jtok *t = push(L, T_TEXT);
        t->s = s, t->n = n;
    }
    L->line += lines;
}

/* After a closing tag at L->pos: "-" strips all whitespace, trim (block and comment ends) one newline.
 * Returns whether the consumed text ended with a newline (jinja2's line_starting). */
static bool after_end(lexer *L, bool minus, bool trim) {
    bool nl = false;
    if (minus) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            nl = L->s[L->pos] == '\n';
            L->line += nl;
            L->pos++;
        }
    } else if (trim && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++, L->line++, nl = true;
    }
    return nl;
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static void put_utf8(jbuf *b, uint32_t cp) {
    char u[4];
    if (cp < 0x80) u[0] = (char)cp, jb_put(b, u, 1);
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), jb_put(b, u, 2);
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)),
        jb_put(b, u, 3);
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), jb_put(b, u, 4);
}

/* A string literal from its opening quote: Python's escapes (unknown ones keep their backslash). */
static void lex_string(lexer *L) {
    const char q = L->s[L->pos];
    const int line = L->line;
    size_t i = L->pos + 1;
    jbuf b;
    jb_init(&b, L->x);
    while (i < L->n && L->s[i] != q) {
        char c = L->s[i];
        if (c == '\n') L->line++;
        if (c != '\\' || i + 1 >= L->n) {
            jb_char(&b, c), i++;
            continue;
        }
        char e = L->s[i + 1];
        i += 2;
        switch (e) {
        case 'n': jb_char(&b, '\n'); break;
        case 't': jb_char(&b, '\t'); break;
        case 'r': jb_char(&b, '\r'); break;
        case 'a': jb_char(&b, '\a'); break;
        case 'b': jb_char(&b, '\b'); break;
        case 'f': jb_char(&b, '\f'); break;
        case 'v': jb_char(&b, '\v'); break;
        case '\\': jb_char(&b, '\\'); break;
        case '\'': jb_char(&b, '\''); break;
        case '"': jb_char(&b, '"'); break;
        case '\n': L->line++; break; /* a continued line */
        case 'x':
        case 'u':
        case 'U': {
            const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i + (size_t)k < L->n ? hexval(L->s[i + (size_t)k]) : -1;
                if (h < 0) jx_fail(L->x, "line %d: truncated \\%c escape in a string", line, e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                jx_fail(L->x, "line %d: the \\%c escape is not a character", line, e);
            put_utf8(&b, cp);
            i += (size_t)digits;
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < L->n && L->s[i] >= '0' && L->s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->s[i++] - '0');
                put_utf8(&b, cp);
            } else jb_char(&b, '\\'), jb_char(&b, e);
        }
    }
    if (i >= L->n) jx_fail(L->x, "line %d: unterminated string", line);
    jtok *t = push(L, T_STRING);
    t->line = line;
    t->s = b.p ? b.p : "", t->n = b.n;
    L->pos = i + 1;
}

static void lex_number(lexer *L) {
    size_t i = L->pos;
    const char r = i + 2 < L->n && L->s[i] == '0' ? (char)(L->s[i + 1] | 0x20) : 0;
    if (r == 'x' || r == 'o' || r == 'b') { /* 0x1F, 0o17, 0b101 (underscores allowed between digits) */
        const int base = r == 'x' ? 16 : r == 'o' ? 8 : 2;
        uint64_t v = 0;
        size_t j = i + 2, digits = 0;
        for (; j < L->n; j++) {
            if (L->s[j] == '_') continue;
            const int d = hexval(L->s[j]);
            if (d < 0 || d >= base) break;
            if (v > (uint64_t)(INT64_MAX - d) / (uint64_t)base)
                jx_fail(L->x, "line %d: the integer literal is too large", L->line);
            v = v * (uint64_t)base + (uint64_t)d, digits++;
        }
        if (digits) {
            jtok *t = push(L, T_INT);
            t->i = (int64_t)v;
            L->pos = j;
            return;
        }
    }
    bool is_float = false;
    while (i < L->n && (isdigit((unsigned char)L->s[i]) || L->s[i] == '_')) i++;
    if (i + 1 < L->n && L->s[i] == '.' && isdigit((unsigned char)L->s[i + 1])) {
        is_float = true, i++;
        while (i < L->n && (isdigit((unsigned char)L->s[i]) || L->s[i] == '_')) i++;
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-')) j++;
        if (j < L->n && isdigit((unsigned char)L->s[j])) {
            is_float = true, i = j;
            while (i < L->n && isdigit((unsigned char)L->s[i])) i++;
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t p = L->pos; p < i && k + 1 < sizeof buf; p++)
        if (L->s[p] != '_') buf[k++] = L->s[p];
    buf[k] = 0;
    jtok *t = push(L, is_float ? T_FLOAT : T_INT);
    if (is_float) t->f = strtod(buf, NULL);
    else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (v > INT64_MAX) jx_fail(L->x, "line %d: the integer %s is too large", L->line, buf);
        t->i = (int64_t)v;
    }
    L->pos = i;
}

static const char *const k_ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char k_ops1[] = "+-/*%~<>=()[]{},.:|;";

/* Tokens inside a tag up to its end; returns whether the end carried "-" and, for a block, "+". */
static void lex_tag(lexer *L, bool is_var, bool *minus, bool *plus) {
    const int line = L->line;
    int depth = 0; /* open brackets: a "}" inside them is an operator, not the end of {{ }} */
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
        if (L->pos >= L->n) jx_fail(L->x, "line %d: the tag is not closed", line);
        const char *p = L->s + L->pos;
        const size_t left = L->n - L->pos;
        const char close = is_var ? '}' : '%';
        if (depth == 0) {
            if (left >= 3 && (p[0] == '-' || (p[0] == '+' && !is_var)) && p[1] == close && p[2] == '}') {
                *minus = p[0] == '-', *plus = p[0] == '+';
                L->pos += 3;
                return;
            }
            if (left >= 2 && p[0] == close && p[1] == '}') {
                *minus = *plus = false;
                L->pos += 2;
                return;
            }
        }
        const char c = *p;
        if (c == '\'' || c == '"') {
            lex_string(L);
        } else if (isdigit((unsigned char)c)) {
            lex_number(L);
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t i = L->pos;
            while (i < L->n && (isalnum((unsigned char)L->s[i]) || L->s[i] == '_')) i++;
            jtok *t = push(L, T_NAME);
            t->s = jx_strndup(L->x, p, i - L->pos), t->n = i - L->pos;
            L->pos = i;
        } else {
            const char *op = NULL;
            for (size_t k = 0; k < sizeof k_ops2 / sizeof k_ops2[0]; k++)
                if (left >= 2 && memcmp(p, k_ops2[k], 2) == 0) op = k_ops2[k];
            if (!op && strchr(k_ops1, c) && c) op = jx_strndup(L->x, p, 1);
            if (!op) { /* show the whole UTF-8 sequence, not its first byte */
                int len = 1;
                while (len < 4 && (size_t)len < left && ((unsigned char)p[len] & 0xC0) == 0x80) len++;
                jx_fail(L->x, "line %d: unexpected character '%.*s'", L->line, len, p);
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            jtok *t = push(L, T_OP);
            t->s = op, t->n = strlen(op);
            L->pos += strlen(op);
        }
    }
}

/* {% raw %}...{% endraw %}: the content is text. L->pos is just after "{%" and its sign. */
static bool try_raw(lexer *L, bool *line_starting) {
    size_t i = L->pos;
    while (i < L->n && is_ws(L->s[i])) i++;
    if (L->n - i < 3 || memcmp(L->s + i, "raw", 3) != 0) return false;
    i += 3;
    while (i < L->n && is_ws(L->s[i])) i++;
    bool minus = false;
    if (i < L->n && L->s[i] == '-') minus = true, i++;
    if (L->n - i < 2 || L->s[i] != '%' || L->s[i + 1] != '}') return false;
    L->pos = i + 2;
    after_end(L, minus, false);
    const size_t start = L->pos;
    for (size_t j = start; j + 1 < L->n; j++) { /* find {%[-+]? endraw [-+]?%} */
        if (L->s[j] != '{' || L->s[j + 1] != '%') continue;
        size_t k = j + 2;
        char sign = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) sign = L->s[k++];
        while (k < L->n && is_ws(L->s[k])) k++;
        if (L->n - k < 6 || memcmp(L->s + k, "endraw", 6) != 0) continue;
        k += 6;
        while (k < L->n && is_ws(L->s[k])) k++;
        char esign = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) esign = L->s[k++];
        if (L->n - k < 2 || L->s[k] != '%' || L->s[k + 1] != '}') continue;
        emit_text(L, L->s + start, j - start, sign, true, false);
        L->pos = k + 2;
        *line_starting = after_end(L, esign == '-', esign != '+');
        return true;
    }
    jx_fail(L->x, "line %d: {%% raw %%} without {%% endraw %%}", L->line);
}

jtoks jinja_lex(jx *x, const char *src, size_t n) {
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline (keep_trailing_newline=False) */
    char *s = jx_alloc(x, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n') m--;
    lexer L = {.x = x, .s = s, .n = m, .line = 1};
    bool line_starting = true;
    while (L.pos < L.n) {
        size_t t = L.pos;
        while (t + 1 < L.n && !(L.s[t] == '{' && (L.s[t + 1] == '{' || L.s[t + 1] == '%' || L.s[t + 1] == '#'))) t++;
        if (t + 1 >= L.n) {
            emit_text(&L, L.s + L.pos, L.n - L.pos, 0, false, line_starting);
            break;
        }
        const char kind = L.s[t + 1];
        const char sign = t + 2 < L.n && (L.s[t + 2] == '-' || L.s[t + 2] == '+') ? L.s[t + 2] : 0;
        emit_text(&L, L.s + L.pos, t - L.pos, sign, kind != '{', line_starting);
        L.pos = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const int line = L.line;
            size_t e = L.pos;
            while (e + 1 < L.n && !(L.s[e] == '#' && L.s[e + 1] == '}')) e++;
            if (e + 1 >= L.n) jx_fail(x, "line %d: the comment is not closed", line);
            L.line += count_lines(L.s + L.pos, e - L.pos);
            const char esign = e > L.pos && (L.s[e - 1] == '-' || L.s[e - 1] == '+') ? L.s[e - 1] : 0;
            L.pos = e + 2;
            line_starting = after_end(&L, esign == '-', esign != '+');
            continue;
        }
        if (kind == '%' && try_raw(&L, &line_starting)) continue;
        push(&L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN);
        bool minus, plus;
        lex_tag(&L, kind == '{', &minus, &plus);
        push(&L, kind == '{' ? T_VAR_END : T_BLOCK_END);
        line_starting = after_end(&L, minus, kind == '%' && !plus);
    }
    push(&L, T_EOF);
    return L.out;
}
