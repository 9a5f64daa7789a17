/* Jinja values with Python's semantics: truthiness, equality, ordering, str() and repr(). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/jinja_internal.h"

static jv k_none = {.k = JV_NONE};

jv *jv_new(jx *x, jv_kind k) {
    jv *v = jx_alloc(x, sizeof *v);
    v->k = k;
    return v;
}

jv *jv_int(jx *x, int64_t i) {
    jv *v = jv_new(x, JV_INT);
    v->u.i = i;
    return v;
}

jv *jv_float(jx *x, double f) {
    jv *v = jv_new(x, JV_FLOAT);
    v->u.f = f;
    return v;
}

jv *jv_bool(jx *x, bool b) {
    jv *v = jv_new(x, JV_BOOL);
    v->u.b = b;
    return v;
}

jv *jv_none(void) { return &k_none; }

jv *jv_undef(jx *x, const char *what) {
    jv *v = jv_new(x, JV_UNDEF);
    v->u.undef.what = what;
    return v;
}

jv *jv_str_own(jx *x, const char *s, size_t n) {
    jv *v = jv_new(x, JV_STR);
    v->u.str.s = s, v->u.str.n = n;
    return v;
}

jv *jv_strn(jx *x, const char *s, size_t n) { return jv_str_own(x, jx_strndup(x, s, n), n); }
jv *jv_cstr(jx *x, const char *s) { return jv_strn(x, s, strlen(s)); }

jv *jv_list(jx *x, size_t n) {
    jv *v = jv_new(x, JV_LIST);
    v->u.list.v = n ? jx_alloc(x, n * sizeof(jv *)) : NULL;
    v->u.list.n = n;
    return v;
}

jv *jv_dict(jx *x) { return jv_new(x, JV_DICT); }

jv *jv_dict_find(const jv *d, const jv *key) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.keys[i], key)) return d->u.dict.vals[i];
    return NULL;
}

jv *jv_dict_get(const jv *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const jv *k = d->u.dict.keys[i];
        if (k->k == JV_STR && k->u.str.n == n && memcmp(k->u.str.s, key, n) == 0) return d->u.dict.vals[i];
    }
    return NULL;
}

void jv_dict_set(jx *x, jv *d, jv *key, jv *val) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.keys[i], key)) {
            d->u.dict.vals[i] = val;
            return;
        }
    if (d->u.dict.n == d->u.dict.cap) {
        size_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 4;
        jv **k = jx_alloc(x, cap * sizeof *k), **v = jx_alloc(x, cap * sizeof *v);
        if (d->u.dict.n) {
            memcpy(k, d->u.dict.keys, d->u.dict.n * sizeof *k);
            memcpy(v, d->u.dict.vals, d->u.dict.n * sizeof *v);
        }
        d->u.dict.keys = k, d->u.dict.vals = v, d->u.dict.cap = cap;
    }
    d->u.dict.keys[d->u.dict.n] = key;
    d->u.dict.vals[d->u.dict.n++] = val;
}

bool jv_truthy(const jv *v) {
    switch (v->k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.str.n != 0;
    case JV_LIST: return v->u.list.n != 0;
    case JV_DICT: return v->u.dict.n != 0;
    case JV_NS:
    case JV_FUNC: return true;
    }
    return true;
}

bool jv_is_number(const jv *v) { return v->k == JV_INT || v->k == JV_FLOAT || v->k == JV_BOOL; }

double jv_as_double(const jv *v) {
    return v->k == JV_FLOAT ? v->u.f : v->k == JV_INT ? (double)v->u.i : v->k == JV_BOOL ? (double)v->u.b : 0.0;
}

bool jv_equal(const jv *a, const jv *b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT) {
            int64_t x = a->k == JV_INT ? a->u.i : a->u.b, y = b->k == JV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a->u.str.n == b->u.str.n && memcmp(a->u.str.s, b->u.str.s, a->u.str.n) == 0;
    case JV_LIST:
        if (a->u.list.tuple != b->u.list.tuple || a->u.list.n != b->u.list.n) return false;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!jv_equal(a->u.list.v[i], b->u.list.v[i])) return false;
        return true;
    case JV_DICT:
        if (a->u.dict.n != b->u.dict.n) return false;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            const jv *o = jv_dict_find(b, a->u.dict.keys[i]);
            if (!o || !jv_equal(a->u.dict.vals[i], o)) return false;
        }
        return true;
    default: return a == b;
    }
}

const char *jv_type_name(const jv *v) {
    switch (v->k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->u.list.tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "function";
    }
    return "object";
}

int jv_compare(jx *x, const jv *a, const jv *b, const char *op) {
    if (a->k == JV_UNDEF) jv_fail_undef(x, a);
    if (b->k == JV_UNDEF) jv_fail_undef(x, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT) {
            int64_t p = a->k == JV_INT ? a->u.i : a->u.b, q = b->k == JV_INT ? b->u.i : b->u.b;
            return (p > q) - (p < q);
        }
        double p = jv_as_double(a), q = jv_as_double(b);
        return (p > q) - (p < q);
    }
    if (a->k == JV_STR && b->k == JV_STR) {
        size_t n = a->u.str.n < b->u.str.n ? a->u.str.n : b->u.str.n;
        int c = n ? memcmp(a->u.str.s, b->u.str.s, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return (a->u.str.n > b->u.str.n) - (a->u.str.n < b->u.str.n);
    }
    if (a->k == JV_LIST && b->k == JV_LIST && a->u.list.tuple == b->u.list.tuple) {
        for (size_t i = 0; i < a->u.list.n && i < b->u.list.n; i++) {
            if (jv_equal(a->u.list.v[i], b->u.list.v[i])) continue;
            return jv_compare(x, a->u.list.v[i], b->u.list.v[i], op);
        }
        return (a->u.list.n > b->u.list.n) - (a->u.list.n < b->u.list.n);
    }
    jx_fail(x, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

void jv_fail_undef(jx *x, const jv *v) { jx_fail(x, "%s", v->u.undef.what ? v->u.undef.what : "undefined value"); }

/* ---- UTF-8 ---- */

size_t ju_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t ju_offset(const char *s, size_t n, size_t i) {
    size_t off = 0;
    while (off < n && i > 0) {
        off++;
        while (off < n && ((unsigned char)s[off] & 0xC0) == 0x80) off++;
        i--;
    }
    return off;
}

/* ---- str and repr ---- */

void jv_write_float(jbuf *b, double f) {
    if (isnan(f)) {
        jb_str(b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_str(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) { /* the shortest digits that read back as f, as Python's repr */
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, i = 0;
    if (e[i] == '-') jb_char(b, '-'), i++;
    for (; e[i] && e[i] != 'e'; i++)
        if (e[i] != '.') digits[nd++] = e[i];
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    const int exp = atoi(e + i + 1);
    if (exp < -4 || exp >= 16) {
        jb_char(b, digits[0]);
        if (nd > 1) jb_char(b, '.'), jb_put(b, digits + 1, (size_t)nd - 1);
        jb_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp >= 0) {
        for (int k = 0; k <= exp; k++) jb_char(b, k < nd ? digits[k] : '0');
        jb_char(b, '.');
        if (nd > exp + 1) jb_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
        else jb_char(b, '0');
    } else {
        jb_str(b, "0.");
        for (int k = 0; k < -exp - 1; k++) jb_char(b, '0');
        jb_put(b, digits, (size_t)nd);
    }
}

static void write_str_repr(jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    const char q = has_sq && !has_dq ? '"' : '\'';
    jb_char(b, q);
    size_t i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            if (c == (unsigned char)q || c == '\\') jb_char(b, '\\'), jb_char(b, (char)c);
            else if (c == '\n') jb_str(b, "\\n");
            else if (c == '\r') jb_str(b, "\\r");
            else if (c == '\t') jb_str(b, "\\t");
            else if (c < 0x20 || c == 0x7f) jb_printf(b, "\\x%02x", c);
            else jb_char(b, (char)c);
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (len <= 0) { /* not UTF-8: Python would not have such a str; show the byte */
            jb_printf(b, "\\x%02x", c);
            i++;
            continue;
        }
        const utf8proc_category_t cat = utf8proc_category(cp);
        const bool printable =
            !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
              cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
              cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
        if (printable) jb_put(b, s + i, (size_t)len);
        else if (cp < 0x100) jb_printf(b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000) jb_printf(b, "\\u%04x", (unsigned)cp);
        else jb_printf(b, "\\U%08x", (unsigned)cp);
        i += (size_t)len;
    }
    jb_char(b, q);
}

static void write_repr(jx *x, jbuf *b, const jv *v, int depth);

void jv_write_repr(jx *x, jbuf *b, const jv *v) { write_repr(x, b, v, 0); }

static void write_repr(jx *x, jbuf *b, const jv *v, int depth) {
    if (depth > 200) jx_fail(x, "the value is nested too deeply to print (does a namespace hold itself?)");
    switch (v->k) {
    case JV_UNDEF: jb_str(b, "Undefined"); return;
    case JV_NONE: jb_str(b, "None"); return;
    case JV_BOOL: jb_str(b, v->u.b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: jv_write_float(b, v->u.f); return;
    case JV_STR: write_str_repr(b, v->u.str.s, v->u.str.n); return;
    case JV_LIST:
        jb_char(b, v->u.list.tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_str(b, ", ");
            write_repr(x, b, v->u.list.v[i], depth + 1);
        }
        if (v->u.list.tuple && v->u.list.n == 1) jb_char(b, ',');
        jb_char(b, v->u.list.tuple ? ')' : ']');
        return;
    case JV_NS:
    case JV_DICT:
        if (v->k == JV_NS) jb_str(b, "<Namespace ");
        jb_char(b, '{');
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i) jb_str(b, ", ");
            write_repr(x, b, v->u.dict.keys[i], depth + 1);
            jb_str(b, ": ");
            write_repr(x, b, v->u.dict.vals[i], depth + 1);
        }
        jb_char(b, '}');
        if (v->k == JV_NS) jb_char(b, '>');
        return;
    case JV_FUNC: jb_printf(b, "<function %s>", v->u.fn.name ? v->u.fn.name : "?"); return;
    }
}

void jv_write_str(jx *x, jbuf *b, const jv *v) {
    if (v->k == JV_STR) jb_put(b, v->u.str.s, v->u.str.n);
    else if (v->k != JV_UNDEF) jv_write_repr(x, b, v);
}

jv *jv_to_str(jx *x, const jv *v) {
    if (v->k == JV_STR) return (jv *)v;
    jbuf b;
    jb_init(&b, x);
    jv_write_str(x, &b, v);
    return jv_str_own(x, b.p ? b.p : "", b.n);
}
