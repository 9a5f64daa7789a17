/* Jinja filters and tests, with jinja2's semantics (and Hugging Face's tojson). A filter jinja2 has but this
 * interpreter does not is refused by name when the template is parsed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/jinja_internal.h"

static const char *const k_filters[] = {
    "abs",    "capitalize", "count",      "d",       "default", "e",      "escape", "first",     "float",      "format",
    "indent", "int",        "items",      "join",    "last",    "length", "list",   "lower",     "map",        "max",
    "min",    "reject",     "rejectattr", "replace", "reverse", "round",  "safe",   "select",    "selectattr", "sort",
    "string", "sum",        "title",      "tojson",  "trim",    "unique", "upper",  "wordcount", NULL};

static const char *const k_tests[] = {
    "defined",     "undefined", "none",  "string",   "mapping", "iterable", "number", "sequence", "true", "false",
    "boolean",     "integer",   "float", "callable", "equalto", "eq",       "==",     "ne",       "!=",   "lt",
    "<",           "le",        "<=",    "gt",       ">",       "ge",       ">=",     "in",       "odd",  "even",
    "divisibleby", "sameas",    "lower", "upper",    "escaped", "filter",   "test",   NULL};

static bool in_names(const char *name, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(*l, name)) return true;
    return false;
}

bool jinja_filter_known(const char *name) { return in_names(name, k_filters); }
bool jinja_test_known(const char *name) { return in_names(name, k_tests); }

/* ---- helpers ---- */

static jv *str_map(jx *x, const jv *v, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    jv *s = jv_to_str(x, v);
    jbuf b;
    jb_init(&b, x);
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s->u.str.s;
    utf8proc_ssize_t n = (utf8proc_ssize_t)s->u.str.n, i = 0;
    bool prev_cased = false, first = true;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
        if (len <= 0) {
            jb_char(&b, (char)p[i++]);
            continue;
        }
        utf8proc_int32_t out = cp;
        if (mode == 0) out = utf8proc_tolower(cp);
        else if (mode == 1) out = utf8proc_toupper(cp);
        else if (mode == 2) out = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else out = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        const utf8proc_category_t cat = utf8proc_category(cp);
        prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        first = false;
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t el = utf8proc_encode_char(out, enc);
        jb_put(&b, (const char *)enc, (size_t)el);
        i += len;
    }
    return jv_str_own(x, b.p ? b.p : "", b.n);
}

jv *jinja_str_case(jx *x, const jv *v, int mode) { return str_map(x, v, mode); }

static int64_t length_of(jctx *c, jv *v) {
    switch (v->k) {
    case JV_UNDEF: return 0;
    case JV_STR: return (int64_t)ju_len(v->u.str.s, v->u.str.n);
    case JV_LIST: return (int64_t)v->u.list.n;
    case JV_DICT:
    case JV_NS: return (int64_t)v->u.dict.n;
    default: jx_fail(jctx_x(c), "object of type '%s' has no len()", jv_type_name(v));
    }
}

/* item.attr.sub as jinja2's attribute getters read it: each part by item first, integers as indexes. */
static jv *get_path(jctx *c, jv *item, jv *attr) {
    jx *x = jctx_x(c);
    if (attr->k == JV_INT) return jctx_getitem(c, item, attr);
    if (attr->k != JV_STR) jx_fail(x, "attribute names must be strings");
    const char *s = attr->u.str.s, *end = s + attr->u.str.n;
    while (s <= end) {
        const char *dot = memchr(s, '.', (size_t)(end - s));
        if (!dot) dot = end;
        char *part = jx_strndup(x, s, (size_t)(dot - s));
        char *stop;
        long long idx = strtoll(part, &stop, 10);
        jv *key = *part && !*stop ? jv_int(x, idx) : jv_str_own(x, part, (size_t)(dot - s));
        item = jctx_getitem(c, item, key);
        s = dot + 1;
    }
    return item;
}

static bool apply_test(jctx *c, const char *name, jv *v, jv **args, int nargs) {
    const jargs a = {.pos = args, .npos = nargs};
    bool r;
    if (!jinja_test(c, name, v, &a, &r)) jx_fail(jctx_x(c), "no test named '%s'", name);
    return r;
}

static jv *apply_filter(jctx *c, const char *name, jv *v, jv **args, int nargs) {
    const jargs a = {.pos = args, .npos = nargs};
    jv *out;
    if (!jinja_filter(c, name, v, &a, &out)) jx_fail(jctx_x(c), "no filter named '%s'", name);
    return out;
}

static const char *arg_str(jctx *c, jv *v, const char *what) {
    if (!v || v->k != JV_STR) jx_fail(jctx_x(c), "%s must be a string", what);
    return jx_strndup(jctx_x(c), v->u.str.s, v->u.str.n);
}

/* select/reject (attr NULL) and selectattr/rejectattr. */
static jv *select_items(jctx *c, jv *v, const jargs *a, bool keep, bool by_attr) {
    jx *x = jctx_x(c);
    jv *items = jv_truthy(v) ? jv_iterable_list(c, v) : jv_list(x, 0); /* jinja2: "if seq:" before iterating */
    int first = 0;
    jv *attr = NULL;
    if (by_attr) {
        if (a->npos < 1) jx_fail(x, "selectattr/rejectattr need an attribute name");
        attr = a->pos[0];
        first = 1;
    }
    const char *test = a->npos > first ? arg_str(c, a->pos[first], "the test name") : NULL;
    jv *out = jv_list(x, items->u.list.n);
    size_t k = 0;
    for (size_t i = 0; i < items->u.list.n; i++) {
        jctx_tick(c);
        jv *item = items->u.list.v[i], *probe = attr ? get_path(c, item, attr) : item;
        bool r = test ? apply_test(c, test, probe, a->pos + first + 1, a->npos - first - 1) : jv_truthy(probe);
        if (r == keep) out->u.list.v[k++] = item;
    }
    out->u.list.n = k;
    return out;
}

static jv *sort_key(jctx *c, jv *v, jv *attr, bool case_sensitive) {
    if (attr) v = get_path(c, v, attr);
    if (!case_sensitive && v->k == JV_STR) v = str_map(jctx_x(c), v, 0);
    return v;
}

/* A stable merge sort of items by key (Python's sorted is stable). */
static void merge_sort(jctx *c, jv **items, jv **keys, size_t n, jv **ti, jv **tk, bool reverse) {
    if (n < 2) return;
    const size_t h = n / 2;
    merge_sort(c, items, keys, h, ti, tk, reverse);
    merge_sort(c, items + h, keys + h, n - h, ti, tk, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int cmp = jv_compare(jctx_x(c), keys[j], keys[i], "<");
        bool take_right = reverse ? cmp > 0 : cmp < 0;
        if (take_right) ti[k] = items[j], tk[k++] = keys[j++];
        else ti[k] = items[i], tk[k++] = keys[i++];
    }
    while (i < h) ti[k] = items[i], tk[k++] = keys[i++];
    while (j < n) ti[k] = items[j], tk[k++] = keys[j++];
    memcpy(items, ti, n * sizeof *items), memcpy(keys, tk, n * sizeof *keys);
}

static jv *do_sort(jctx *c, jv *v, bool reverse, bool cs, jv *attr) {
    jx *x = jctx_x(c);
    jv *src = jv_iterable_list(c, v);
    const size_t n = src->u.list.n;
    jv *out = jv_list(x, n);
    jv **keys = jx_alloc(x, (n + 1) * sizeof *keys), **ti = jx_alloc(x, (n + 1) * sizeof *ti),
       **tk = jx_alloc(x, (n + 1) * sizeof *tk);
    for (size_t i = 0; i < n; i++)
        out->u.list.v[i] = src->u.list.v[i], keys[i] = sort_key(c, src->u.list.v[i], attr, cs);
    merge_sort(c, out->u.list.v, keys, n, ti, tk, reverse);
    return out;
}

static jv *min_max(jctx *c, jv *v, const jargs *a, bool max) {
    static const char *const kws[] = {"case_sensitive", "attribute", NULL};
    jargs_check(c, a, max ? "max" : "min", 2, kws);
    jv *cs = jargs_get(a, 0, "case_sensitive"), *attr = jargs_get(a, 1, "attribute");
    jv *items = jv_iterable_list(c, v), *best = NULL, *best_key = NULL;
    for (size_t i = 0; i < items->u.list.n; i++) {
        jv *k = sort_key(c, items->u.list.v[i], attr, cs && jv_truthy(cs));
        if (!best || (max ? jv_compare(jctx_x(c), k, best_key, ">") > 0 : jv_compare(jctx_x(c), k, best_key, "<") < 0))
            best = items->u.list.v[i], best_key = k;
    }
    return best ? best : jv_undef(jctx_x(c), "No aggregated item, sequence was empty.");
}

static bool is_py_space(unsigned char ch) {
    return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f);
}

static jv *do_trim(jctx *c, jv *v, jv *chars) {
    jv *s = jv_to_str(jctx_x(c), v);
    const char *p = s->u.str.s;
    size_t a = 0, b = s->u.str.n;
    if (chars && chars->k == JV_STR) {
        while (a < b && memchr(chars->u.str.s, p[a], chars->u.str.n)) a++;
        while (b > a && memchr(chars->u.str.s, p[b - 1], chars->u.str.n)) b--;
    } else {
        while (a < b && is_py_space((unsigned char)p[a])) a++;
        while (b > a && is_py_space((unsigned char)p[b - 1])) b--;
    }
    return jv_strn(jctx_x(c), p + a, b - a);
}

static jv *do_indent(jctx *c, jv *v, const jargs *a) {
    jx *x = jctx_x(c);
    static const char *const kws[] = {"width", "first", "blank", NULL};
    jargs_check(c, a, "indent", 3, kws);
    jv *w = jargs_get(a, 0, "width"), *first = jargs_get(a, 1, "first"), *blank = jargs_get(a, 2, "blank");
    jbuf ind;
    jb_init(&ind, x);
    if (w && w->k == JV_STR) jb_put(&ind, w->u.str.s, w->u.str.n);
    else
        for (int64_t i = 0; i < (w ? (w->k == JV_INT ? w->u.i : 0) : 4); i++) jb_char(&ind, ' ');
    jv *s = jv_to_str(x, v);
    /* jinja2: lines = (s + "\n").splitlines(); every line after the first is indented unless it is empty (blank=true:
     * empty ones too); lines end at \n, \r\n, \r, \v, \f and \x1c-\x1e */
    jbuf out;
    jb_init(&out, x);
    const char *p = s->u.str.s;
    const size_t n = s->u.str.n;
    size_t i = 0;
    for (int line = 0; i <= n; line++) {
        size_t e = i;
        while (e < n &&
               !(p[e] == '\n' || p[e] == '\r' || p[e] == '\v' || p[e] == '\f' || (p[e] >= 0x1c && p[e] <= 0x1e)))
            e++;
        if (line > 0) jb_char(&out, '\n');
        if (line > 0 && (e > i || (blank && jv_truthy(blank)))) jb_put(&out, ind.p ? ind.p : "", ind.n);
        jb_put(&out, p + i, e - i);
        if (e >= n) break; /* the "\n" jinja2 appends ends this last line */
        i = e + (p[e] == '\r' && e + 1 < n && p[e + 1] == '\n' ? 2 : 1);
    }
    jv *r = jv_str_own(x, out.p ? out.p : "", out.n);
    if (first && jv_truthy(first)) {
        jbuf f;
        jb_init(&f, x);
        jb_put(&f, ind.p ? ind.p : "", ind.n), jb_put(&f, r->u.str.s, r->u.str.n);
        r = jv_str_own(x, f.p, f.n);
    }
    return r;
}

static jv *to_int(jctx *c, jv *v, jv *def, jv *base) {
    jx *x = jctx_x(c);
    switch (v->k) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(x, v->u.b);
    case JV_FLOAT:
        if (isfinite(v->u.f) && fabs(v->u.f) < 9.2e18) return jv_int(x, (int64_t)v->u.f);
        break;
    case JV_STR: {
        char *s = jx_strndup(x, v->u.str.s, v->u.str.n), *end;
        while (*s && is_py_space((unsigned char)*s)) s++;
        long long i = strtoll(s, &end, base && base->k == JV_INT ? (int)base->u.i : 10);
        while (*end && is_py_space((unsigned char)*end)) end++;
        if (end != s && !*end) return jv_int(x, i);
        double d = strtod(s, &end);
        while (*end && is_py_space((unsigned char)*end)) end++;
        if (end != s && !*end && isfinite(d)) return jv_int(x, (int64_t)d);
        break;
    }
    default: break;
    }
    return def ? def : jv_int(x, 0);
}

static jv *to_float(jctx *c, jv *v, jv *def) {
    jx *x = jctx_x(c);
    if (jv_is_number(v)) return jv_float(x, jv_as_double(v));
    if (v->k == JV_STR) {
        char *s = jx_strndup(x, v->u.str.s, v->u.str.n), *end;
        double d = strtod(s, &end);
        while (*end && is_py_space((unsigned char)*end)) end++;
        if (end != s && !*end) return jv_float(x, d);
    }
    return def ? def : jv_float(x, 0.0);
}

static jv *do_round(jctx *c, jv *v, const jargs *a) {
    jx *x = jctx_x(c);
    static const char *const kws[] = {"precision", "method", NULL};
    jargs_check(c, a, "round", 2, kws);
    jv *pv = jargs_get(a, 0, "precision"), *mv = jargs_get(a, 1, "method");
    const int64_t prec = pv && pv->k == JV_INT ? pv->u.i : 0;
    const char *method = mv ? arg_str(c, mv, "round's method") : "common";
    if (!jv_is_number(v)) jx_fail(x, "round needs a number, not %s", jv_type_name(v));
    if (strcmp(method, "common")) {
        double scale = pow(10.0, (double)prec), f = jv_as_double(v) * scale;
        if (!strcmp(method, "ceil")) f = ceil(f);
        else if (!strcmp(method, "floor")) f = floor(f);
        else jx_fail(x, "method must be common, ceil or floor");
        return jv_float(x, f / scale);
    }
    if (v->k != JV_FLOAT && prec >= 0) return v->k == JV_BOOL ? jv_int(x, v->u.b) : v;
    if (prec < 0 || prec > 300) jx_fail(x, "round: precision %lld is not supported", (long long)prec);
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, jv_as_double(v)); /* correctly rounded, half to even */
    return jv_float(x, strtod(buf, NULL));
}

static jv *do_map(jctx *c, jv *v, const jargs *a) {
    jx *x = jctx_x(c);
    jv *items = jv_truthy(v) ? jv_iterable_list(c, v) : jv_list(x, 0); /* jinja2: "if value:" before iterating */
    jv *attr = jargs_get(a, -1, "attribute");
    jv *out = jv_list(x, items->u.list.n);
    if (attr) {
        jv *def = jargs_get(a, -1, "default");
        for (size_t i = 0; i < items->u.list.n; i++) {
            jv *r = get_path(c, items->u.list.v[i], attr);
            out->u.list.v[i] = r->k == JV_UNDEF && def ? def : r;
        }
        return out;
    }
    if (a->npos < 1) jx_fail(x, "map needs a filter name or attribute=");
    const char *f = arg_str(c, a->pos[0], "map's filter name");
    for (size_t i = 0; i < items->u.list.n; i++) {
        jctx_tick(c);
        out->u.list.v[i] = apply_filter(c, f, items->u.list.v[i], a->pos + 1, a->npos - 1);
    }
    return out;
}

static jv *do_tojson(jctx *c, jv *v, const jargs *a) {
    jx *x = jctx_x(c);
    static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jargs_check(c, a, "tojson", 4, kws);
    jv *ea = jargs_get(a, 0, "ensure_ascii"), *ind = jargs_get(a, 1, "indent"), *sep = jargs_get(a, 2, "separators"),
       *sk = jargs_get(a, 3, "sort_keys");
    jjson_opts o = {.ensure_ascii = ea && jv_truthy(ea), .sort_keys = sk && jv_truthy(sk), .indent = -1};
    if (ind && ind->k != JV_NONE) {
        if (ind->k != JV_INT) jx_fail(x, "tojson: indent must be an integer");
        o.indent = (int)(ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : ind->u.i);
    }
    o.item_sep = o.indent >= 0 ? "," : ", ";
    o.key_sep = ": ";
    if (sep && sep->k != JV_NONE) {
        if (sep->k != JV_LIST || sep->u.list.n != 2 || sep->u.list.v[0]->k != JV_STR || sep->u.list.v[1]->k != JV_STR)
            jx_fail(x, "tojson: separators must be a pair of strings");
        o.item_sep = jx_strndup(x, sep->u.list.v[0]->u.str.s, sep->u.list.v[0]->u.str.n);
        o.key_sep = jx_strndup(x, sep->u.list.v[1]->u.str.s, sep->u.list.v[1]->u.str.n);
    }
    jbuf b;
    jb_init(&b, x);
    jv_write_json(x, &b, v, &o, 0);
    return jv_str_own(x, b.p, b.n);
}

static jv *do_unique(jctx *c, jv *v, const jargs *a) {
    static const char *const kws[] = {"case_sensitive", "attribute", NULL};
    jargs_check(c, a, "unique", 2, kws);
    jv *cs = jargs_get(a, 0, "case_sensitive"), *attr = jargs_get(a, 1, "attribute");
    jv *items = jv_iterable_list(c, v);
    jv *out = jv_list(jctx_x(c), items->u.list.n), *seen = jv_list(jctx_x(c), items->u.list.n);
    size_t k = 0;
    for (size_t i = 0; i < items->u.list.n; i++) {
        jv *key = sort_key(c, items->u.list.v[i], attr, cs && jv_truthy(cs));
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++) dup = jv_equal(seen->u.list.v[j], key);
        if (!dup) seen->u.list.v[k] = key, out->u.list.v[k++] = items->u.list.v[i];
    }
    out->u.list.n = k;
    return out;
}

static jv *do_escape(jx *x, jv *v) {
    jv *s = jv_to_str(x, v);
    jbuf b;
    jb_init(&b, x);
    for (size_t i = 0; i < s->u.str.n; i++) {
        const char ch = s->u.str.s[i];
        if (ch == '&') jb_str(&b, "&amp;");
        else if (ch == '<') jb_str(&b, "&lt;");
        else if (ch == '>') jb_str(&b, "&gt;");
        else if (ch == '"') jb_str(&b, "&#34;");
        else if (ch == '\'') jb_str(&b, "&#39;");
        else jb_char(&b, ch);
    }
    return jv_str_own(x, b.p ? b.p : "", b.n);
}

static int64_t wordcount(const jv *s) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s->u.str.s;
    utf8proc_ssize_t n = (utf8proc_ssize_t)s->u.str.n, i = 0;
    int64_t words = 0;
    bool in = false;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
        if (len <= 0) len = 1, cp = 0;
        const utf8proc_category_t cat = utf8proc_category(cp);
        const bool w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                       (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
        if (w && !in) words++;
        in = w;
        i += len;
    }
    return words;
}

bool jinja_filter(jctx *c, const char *name, jv *v, const jargs *a, jv **out) {
    jx *x = jctx_x(c);
    jv *a0 = jargs_get(a, 0, NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        static const char *const kws[] = {"default_value", "boolean", NULL};
        jargs_check(c, a, "default", 2, kws);
        jv *def = jargs_get(a, 0, "default_value"), *boolean = jargs_get(a, 1, "boolean");
        const bool use = v->k == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v));
        *out = use ? (def ? def : jv_cstr(x, "")) : v;
        return true;
    }
    if (!strcmp(name, "safe")) {
        *out = v;
        return true;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        *out = jv_int(x, length_of(c, v));
        return true;
    }
    if (!strcmp(name, "tojson")) {
        *out = do_tojson(c, v, a);
        return true;
    }
    if (!strcmp(name, "items")) {
        if (v->k == JV_UNDEF) {
            *out = jv_list(x, 0);
            return true;
        }
        if (v->k != JV_DICT) jx_fail(x, "can only get item pairs from a mapping");
        jv *l = jv_list(x, v->u.dict.n);
        for (size_t i = 0; i < v->u.dict.n; i++) {
            jv *t = jv_list(x, 2);
            t->u.list.tuple = true;
            t->u.list.v[0] = v->u.dict.keys[i], t->u.list.v[1] = v->u.dict.vals[i];
            l->u.list.v[i] = t;
        }
        *out = l;
        return true;
    }
    /* jinja2's filters read an undefined as "" or an empty sequence, except these, that fail on it */
    if (v->k == JV_UNDEF &&
        (!strcmp(name, "abs") || !strcmp(name, "int") || !strcmp(name, "float") || !strcmp(name, "round")))
        jv_fail_undef(x, v);
    if (!strcmp(name, "string")) *out = jv_to_str(x, v);
    else if (!strcmp(name, "trim")) *out = do_trim(c, v, jargs_get(a, 0, "chars"));
    else if (!strcmp(name, "upper")) *out = str_map(x, v, 1);
    else if (!strcmp(name, "lower")) *out = str_map(x, v, 0);
    else if (!strcmp(name, "title")) *out = str_map(x, v, 2);
    else if (!strcmp(name, "capitalize")) *out = str_map(x, v, 3);
    else if (!strcmp(name, "escape") || !strcmp(name, "e")) *out = do_escape(x, v);
    else if (!strcmp(name, "wordcount")) *out = jv_int(x, wordcount(jv_to_str(x, v)));
    else if (!strcmp(name, "indent")) *out = do_indent(c, v, a);
    else if (!strcmp(name, "list")) *out = jv_iterable_list(c, v);
    else if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv *l = jv_iterable_list(c, v);
        *out = l->u.list.n ? l->u.list.v[name[0] == 'f' ? 0 : l->u.list.n - 1]
                           : jv_undef(x, name[0] == 'f' ? "No first item, sequence was empty."
                                                        : "No last item, sequence was empty.");
    } else if (!strcmp(name, "join")) {
        static const char *const kws[] = {"d", "attribute", NULL};
        jargs_check(c, a, "join", 2, kws);
        jv *sep = jargs_get(a, 0, "d"), *attr = jargs_get(a, 1, "attribute");
        jv *l = jv_iterable_list(c, v);
        jbuf b;
        jb_init(&b, x);
        for (size_t i = 0; i < l->u.list.n; i++) {
            if (i && sep) jv_write_str(x, &b, sep);
            jv_write_str(x, &b, attr ? get_path(c, l->u.list.v[i], attr) : l->u.list.v[i]);
        }
        *out = jv_str_own(x, b.p ? b.p : "", b.n);
    } else if (!strcmp(name, "replace")) {
        if (a->npos < 2) jx_fail(x, "replace needs old and new");
        const jargs m = {.pos = a->pos, .npos = a->npos};
        *out = jinja_call_method(c, jv_to_str(x, v), "replace", &m);
    } else if (!strcmp(name, "abs")) {
        if (v->k == JV_FLOAT) *out = jv_float(x, fabs(v->u.f));
        else if (v->k == JV_INT || v->k == JV_BOOL) {
            int64_t i = v->k == JV_INT ? v->u.i : v->u.b;
            if (i == INT64_MIN) jx_fail(x, "integer overflow");
            *out = jv_int(x, i < 0 ? -i : i);
        } else jx_fail(x, "bad operand type for abs(): '%s'", jv_type_name(v));
    } else if (!strcmp(name, "int")) *out = to_int(c, v, jargs_get(a, 0, "default"), jargs_get(a, 1, "base"));
    else if (!strcmp(name, "float")) *out = to_float(c, v, jargs_get(a, 0, "default"));
    else if (!strcmp(name, "round")) *out = do_round(c, v, a);
    else if (!strcmp(name, "reverse")) {
        if (v->k == JV_STR) {
            const jargs m = {0};
            jv *chars = jv_iterable_list(c, v);
            jbuf b;
            jb_init(&b, x);
            for (size_t i = chars->u.list.n; i-- > 0;) jv_write_str(x, &b, chars->u.list.v[i]);
            (void)m;
            *out = jv_str_own(x, b.p ? b.p : "", b.n);
        } else {
            jv *l = jv_iterable_list(c, v), *r = jv_list(x, l->u.list.n);
            for (size_t i = 0; i < l->u.list.n; i++) r->u.list.v[i] = l->u.list.v[l->u.list.n - 1 - i];
            *out = r;
        }
    } else if (!strcmp(name, "sort")) {
        static const char *const kws[] = {"reverse", "case_sensitive", "attribute", NULL};
        jargs_check(c, a, "sort", 3, kws);
        jv *rev = jargs_get(a, 0, "reverse"), *cs = jargs_get(a, 1, "case_sensitive");
        *out = do_sort(c, v, rev && jv_truthy(rev), cs && jv_truthy(cs), jargs_get(a, 2, "attribute"));
    } else if (!strcmp(name, "unique")) *out = do_unique(c, v, a);
    else if (!strcmp(name, "min") || !strcmp(name, "max")) *out = min_max(c, v, a, name[1] == 'a');
    else if (!strcmp(name, "sum")) {
        static const char *const kws[] = {"attribute", "start", NULL};
        jargs_check(c, a, "sum", 2, kws);
        jv *attr = jargs_get(a, 0, "attribute"), *acc = jargs_get(a, 1, "start");
        if (!acc) acc = jv_int(x, 0);
        jv *l = jv_iterable_list(c, v);
        for (size_t i = 0; i < l->u.list.n; i++) {
            jv *item = attr ? get_path(c, l->u.list.v[i], attr) : l->u.list.v[i];
            if (!jv_is_number(acc) || !jv_is_number(item))
                jx_fail(x, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(acc), jv_type_name(item));
            acc = acc->k == JV_FLOAT || item->k == JV_FLOAT
                      ? jv_float(x, jv_as_double(acc) + jv_as_double(item))
                      : jv_int(x, (int64_t)jv_as_double(acc) + (item->k == JV_INT ? item->u.i : item->u.b));
        }
        *out = acc;
    } else if (!strcmp(name, "map")) *out = do_map(c, v, a);
    else if (!strcmp(name, "select") || !strcmp(name, "reject")) *out = select_items(c, v, a, name[0] == 's', false);
    else if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        *out = select_items(c, v, a, name[0] == 's', true);
    else if (!strcmp(name, "format")) {
        jv *args;
        if (a->nkw) {
            args = jv_dict(x);
            for (int i = 0; i < a->nkw; i++) jv_dict_set(x, args, jv_cstr(x, a->kwn[i]), a->kwv[i]);
        } else {
            args = jv_list(x, (size_t)a->npos);
            args->u.list.tuple = true;
            for (int i = 0; i < a->npos; i++) args->u.list.v[i] = a->pos[i];
        }
        *out = jinja_percent_format(c, jv_to_str(x, v), args);
    } else return false;
    (void)a0;
    return true;
}

bool jinja_test(jctx *c, const char *name, jv *v, const jargs *a, bool *out) {
    jx *x = jctx_x(c);
    jv *arg = jargs_get(a, 0, NULL);
    static const char *const one_arg[] = {"divisibleby", "sameas", "in", "equalto", "eq", "==", "ne", "!=", "lt",
                                          "<",           "le",     "<=", "gt",      ">",  "ge", ">=", NULL};
    const int takes = in_names(name, one_arg) ? 1 : 0;
    if (jinja_test_known(name) && a->npos + a->nkw > takes)
        jx_fail(x, "the %s test takes %d argument(s), %d given", name, takes, a->npos + a->nkw);
    if (!strcmp(name, "defined")) *out = v->k != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v->k == JV_UNDEF;
    else if (!strcmp(name, "none")) *out = v->k == JV_NONE;
    else if (!strcmp(name, "string")) *out = v->k == JV_STR;
    else if (!strcmp(name, "mapping")) *out = v->k == JV_DICT;
    else if (!strcmp(name, "iterable")) *out = v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT || v->k == JV_UNDEF;
    else if (!strcmp(name, "sequence")) *out = v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT || v->k == JV_UNDEF;
    else if (!strcmp(name, "number")) *out = jv_is_number(v);
    else if (!strcmp(name, "integer")) *out = v->k == JV_INT;
    else if (!strcmp(name, "float")) *out = v->k == JV_FLOAT;
    else if (!strcmp(name, "boolean")) *out = v->k == JV_BOOL;
    else if (!strcmp(name, "true")) *out = v->k == JV_BOOL && v->u.b;
    else if (!strcmp(name, "false")) *out = v->k == JV_BOOL && !v->u.b;
    else if (!strcmp(name, "callable")) *out = v->k == JV_FUNC;
    else if (!strcmp(name, "escaped")) *out = false;
    else if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (!arg && v->k != JV_STR) jx_fail(x, "the %s test needs a name", name);
        const char *n = arg_str(c, v, "the name");
        *out = name[0] == 'f' ? jinja_filter_known(n) : jinja_test_known(n);
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->k != JV_STR) {
            *out = false;
            return true;
        }
        jv *m = str_map(x, v, name[0] == 'l' ? 0 : 1);
        bool cased = false;
        for (size_t i = 0; i < v->u.str.n; i++) {
            unsigned char ch = (unsigned char)v->u.str.s[i];
            cased |= (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80;
        }
        *out = cased && jv_equal(m, v);
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->k != JV_INT && v->k != JV_BOOL) jx_fail(x, "the %s test needs an integer", name);
        const int64_t i = v->k == JV_INT ? v->u.i : v->u.b;
        if (name[0] == 'o') *out = (i % 2) != 0;
        else if (name[0] == 'e') *out = (i % 2) == 0;
        else {
            if (!arg || (arg->k != JV_INT) || arg->u.i == 0) jx_fail(x, "divisibleby needs a non-zero integer");
            *out = i % arg->u.i == 0;
        }
    } else if (!strcmp(name, "sameas")) {
        if (!arg) jx_fail(x, "sameas needs an argument");
        *out = v == arg || (v->k == arg->k && (v->k == JV_NONE || (v->k == JV_BOOL && v->u.b == arg->u.b)));
    } else if (!strcmp(name, "in")) {
        if (!arg) jx_fail(x, "the in test needs a container");
        jv *m = jv_list(x, 1);
        m->u.list.v[0] = arg;
        const jargs ca = {.pos = m->u.list.v, .npos = 1};
        (void)ca;
        if (arg->k == JV_STR) {
            if (v->k != JV_STR) jx_fail(x, "'in <string>' requires string as left operand");
            *out = false;
            for (size_t i = 0; i + v->u.str.n <= arg->u.str.n; i++)
                if (!memcmp(arg->u.str.s + i, v->u.str.s, v->u.str.n)) *out = true;
        } else if (arg->k == JV_DICT) *out = jv_dict_find(arg, v) != NULL;
        else {
            jv *l = jv_iterable_list(c, arg);
            *out = false;
            for (size_t i = 0; i < l->u.list.n; i++) *out |= jv_equal(l->u.list.v[i], v);
        }
    } else {
        static const char *const cmp_names[][2] = {
            {"equalto", "=="}, {"eq", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"<", "<"},
            {"le", "<="},      {"<=", "<="}, {"gt", ">"},  {">", ">"},   {"ge", ">="}, {">=", ">="}};
        for (size_t i = 0; i < sizeof cmp_names / sizeof cmp_names[0]; i++) {
            if (strcmp(name, cmp_names[i][0])) continue;
            if (!arg) jx_fail(x, "the %s test needs an argument", name);
            const char *op = cmp_names[i][1];
            if (!strcmp(op, "==")) *out = jv_equal(v, arg);
            else if (!strcmp(op, "!=")) *out = !jv_equal(v, arg);
            else {
                int r = jv_compare(x, v, arg, op);
                *out = op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0);
            }
            return true;
        }
        return false;
    }
    return true;
}
