/* Python's methods of str, dict and list as templates call them, the global functions (range, namespace, dict,
 * raise_exception, strftime_now) and "%" formatting. Mutating methods (list.append, dict.update, ...) exist, as
 * in Python, but calling one is refused, as jinja2's ImmutableSandboxedEnvironment refuses it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_internal.h"

jv *jinja_str_case(jx *x, const jv *v, int mode); /* jinja_filters.c: 0 lower, 1 upper, 2 title, 3 capitalize */

static const char *const k_str_methods[] = {
    "startswith", "endswith",     "strip",        "lstrip",       "rstrip",     "split",     "rsplit",    "replace",
    "upper",      "lower",        "title",        "capitalize",   "find",       "rfind",     "index",     "rindex",
    "count",      "join",         "format",       "isdigit",      "isalpha",    "isalnum",   "isspace",   "islower",
    "isupper",    "splitlines",   "removeprefix", "removesuffix", "zfill",      "center",    "ljust",     "rjust",
    "swapcase",   "casefold",     "partition",    "rpartition",   "expandtabs", "encode",    "isnumeric", "isdecimal",
    "istitle",    "isidentifier", "isprintable",  "isascii",      "format_map", "translate", "maketrans", NULL};
static const char *const k_dict_methods[] = {"items",   "keys",   "values", "get",        "copy",     "pop",
                                             "popitem", "update", "clear",  "setdefault", "fromkeys", NULL};
static const char *const k_list_methods[] = {"index", "count",  "copy",    "append", "extend", "insert",
                                             "pop",   "remove", "reverse", "sort",   "clear",  NULL};
static const char *const k_unsafe[] = {"pop",    "popitem", "update", "clear",   "setdefault", "append",
                                       "extend", "insert",  "remove", "reverse", "sort",       NULL};

static bool in_names(const char *name, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(*l, name)) return true;
    return false;
}

bool jinja_has_method(const jv *obj, const char *name) {
    switch (obj->k) {
    case JV_STR: return in_names(name, k_str_methods);
    case JV_DICT: return in_names(name, k_dict_methods);
    case JV_LIST:
        return in_names(name, k_list_methods) &&
               (!obj->u.list.tuple || !strcmp(name, "index") || !strcmp(name, "count"));
    default: return false;
    }
}

static bool is_space(unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f); }

static jv *need_str(jctx *c, jv *v, const char *what) {
    if (!v || v->k != JV_STR) jx_fail(jctx_x(c), "%s must be str, not %s", what, v ? jv_type_name(v) : "nothing");
    return v;
}

static const char *find_sub(const char *h, size_t hn, const char *n, size_t nn, bool last) {
    if (nn > hn) return NULL;
    if (!last) {
        for (size_t i = 0; i + nn <= hn; i++)
            if (!memcmp(h + i, n, nn)) return h + i;
    } else {
        for (size_t i = hn - nn + 1; i-- > 0;)
            if (!memcmp(h + i, n, nn)) return h + i;
    }
    return NULL;
}

static jv *strip(jctx *c, jv *self, jv *chars, bool left, bool right) {
    const char *p = self->u.str.s;
    size_t a = 0, b = self->u.str.n;
    if (chars && chars->k == JV_STR) {
        while (left && a < b && memchr(chars->u.str.s, p[a], chars->u.str.n)) a++;
        while (right && b > a && memchr(chars->u.str.s, p[b - 1], chars->u.str.n)) b--;
    } else {
        if (chars && chars->k != JV_NONE) jx_fail(jctx_x(c), "strip arg must be None or str");
        while (left && a < b && is_space((unsigned char)p[a])) a++;
        while (right && b > a && is_space((unsigned char)p[b - 1])) b--;
    }
    return jv_strn(jctx_x(c), p + a, b - a);
}

static jv *split(jctx *c, jv *self, jv *sepv, jv *maxv, bool from_right) {
    jx *x = jctx_x(c);
    int64_t max = maxv && maxv->k == JV_INT ? maxv->u.i : -1;
    const char *s = self->u.str.s;
    const size_t n = self->u.str.n;
    jv **parts = jx_alloc(x, (n + 2) * sizeof *parts);
    size_t np = 0;
    if (!sepv || sepv->k == JV_NONE) { /* runs of whitespace, none at the ends */
        if (!from_right) {
            size_t i = 0;
            while (i < n) {
                while (i < n && is_space((unsigned char)s[i])) i++;
                if (i >= n) break;
                size_t j = i;
                if (max >= 0 && (int64_t)np == max) {
                    size_t e = n;
                    while (e > i && is_space((unsigned char)s[e - 1])) e--;
                    parts[np++] = jv_strn(x, s + i, e - i);
                    break;
                }
                while (j < n && !is_space((unsigned char)s[j])) j++;
                parts[np++] = jv_strn(x, s + i, j - i);
                i = j;
            }
        } else {
            size_t e = n;
            while (e > 0) {
                while (e > 0 && is_space((unsigned char)s[e - 1])) e--;
                if (!e) break;
                if (max >= 0 && (int64_t)np == max) {
                    size_t i = 0;
                    while (i < e && is_space((unsigned char)s[i])) i++;
                    parts[np++] = jv_strn(x, s + i, e - i);
                    break;
                }
                size_t i = e;
                while (i > 0 && !is_space((unsigned char)s[i - 1])) i--;
                parts[np++] = jv_strn(x, s + i, e - i);
                e = i;
            }
        }
    } else {
        need_str(c, sepv, "the separator");
        const char *sep = sepv->u.str.s;
        const size_t sn = sepv->u.str.n;
        if (!sn) jx_fail(x, "empty separator");
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *hit = max >= 0 && (int64_t)np == max ? NULL : find_sub(s + i, n - i, sep, sn, false);
                if (!hit) {
                    parts[np++] = jv_strn(x, s + i, n - i);
                    break;
                }
                parts[np++] = jv_strn(x, s + i, (size_t)(hit - (s + i)));
                i = (size_t)(hit - s) + sn;
            }
        } else {
            size_t e = n;
            for (;;) {
                const char *hit = max >= 0 && (int64_t)np == max ? NULL : find_sub(s, e, sep, sn, true);
                if (!hit) {
                    parts[np++] = jv_strn(x, s, e);
                    break;
                }
                const size_t at = (size_t)(hit - s);
                parts[np++] = jv_strn(x, s + at + sn, e - at - sn);
                e = at;
            }
        }
    }
    jv *l = jv_list(x, np);
    for (size_t i = 0; i < np; i++) l->u.list.v[i] = parts[from_right ? np - 1 - i : i];
    return l;
}

static jv *replace(jctx *c, jv *self, jv *old, jv *new_, jv *countv) {
    jx *x = jctx_x(c);
    need_str(c, old, "replace's old"), need_str(c, new_, "replace's new");
    int64_t count = countv && countv->k == JV_INT ? countv->u.i : -1;
    jbuf b;
    jb_init(&b, x);
    const char *s = self->u.str.s;
    const size_t n = self->u.str.n, on = old->u.str.n;
    size_t i = 0;
    if (!on) { /* Python inserts new between every character */
        size_t len = ju_len(s, n);
        for (size_t k = 0; k <= len; k++) {
            if (count < 0 || (int64_t)k < count) jb_put(&b, new_->u.str.s, new_->u.str.n);
            if (k < len) {
                size_t step = ju_offset(s + i, n - i, 1);
                jb_put(&b, s + i, step);
                i += step;
            }
        }
        return jv_str_own(x, b.p ? b.p : "", b.n);
    }
    while (i < n) {
        const char *hit = count == 0 ? NULL : find_sub(s + i, n - i, old->u.str.s, on, false);
        if (!hit) break;
        jb_put(&b, s + i, (size_t)(hit - (s + i)));
        jb_put(&b, new_->u.str.s, new_->u.str.n);
        i = (size_t)(hit - s) + on;
        if (count > 0) count--;
    }
    jb_put(&b, s + i, n - i);
    return jv_str_own(x, b.p ? b.p : "", b.n);
}

static bool affix(jctx *c, jv *self, jv *arg, bool end) {
    if (arg && arg->k == JV_LIST && arg->u.list.tuple) {
        for (size_t i = 0; i < arg->u.list.n; i++)
            if (affix(c, self, arg->u.list.v[i], end)) return true;
        return false;
    }
    need_str(c, arg, end ? "endswith's argument" : "startswith's argument");
    if (arg->u.str.n > self->u.str.n) return false;
    const char *at = end ? self->u.str.s + self->u.str.n - arg->u.str.n : self->u.str.s;
    return !memcmp(at, arg->u.str.s, arg->u.str.n);
}

/* str.format: {} {0} {name} with !r/!s; format specs are refused. */
static jv *str_format(jctx *c, jv *self, const jargs *a) {
    jx *x = jctx_x(c);
    jbuf b;
    jb_init(&b, x);
    const char *s = self->u.str.s;
    const size_t n = self->u.str.n;
    int auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '{' && i + 1 < n && s[i + 1] == '{') {
            jb_char(&b, '{'), i++;
            continue;
        }
        if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
            jb_char(&b, '}'), i++;
            continue;
        }
        if (s[i] == '}') jx_fail(x, "Single '}' encountered in format string");
        if (s[i] != '{') {
            jb_char(&b, s[i]);
            continue;
        }
        size_t e = i + 1;
        while (e < n && s[e] != '}') e++;
        if (e >= n) jx_fail(x, "Single '{' encountered in format string");
        char *field = jx_strndup(x, s + i + 1, e - i - 1);
        char conv = 0;
        char *bang = strchr(field, '!');
        if (strchr(field, ':')) jx_fail(x, "str.format: format specs are not supported");
        if (bang) conv = bang[1], *bang = 0;
        jv *v;
        if (!*field) v = jargs_get(a, auto_idx++, NULL);
        else if (*field >= '0' && *field <= '9') {
            const long idx = strtol(field, NULL, 10);
            v = idx < a->npos ? a->pos[idx] : NULL;
        } else v = jargs_get(a, -1, field);
        if (!v) jx_fail(x, "str.format: no argument for {%s}", field);
        if (conv == 'r') jv_write_repr(x, &b, v);
        else jv_write_str(x, &b, v);
        i = e;
    }
    return jv_str_own(x, b.p ? b.p : "", b.n);
}

static jv *str_method(jctx *c, jv *self, const char *name, const jargs *a) {
    jx *x = jctx_x(c);
    jv *a0 = jargs_get(a, 0, NULL), *a1 = jargs_get(a, 1, NULL), *a2 = jargs_get(a, 2, NULL);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (a->npos > 1) jx_fail(x, "%s: start and end arguments are not supported", name);
        return jv_bool(x, affix(c, self, a0, name[0] == 'e'));
    }
    if (!strcmp(name, "strip")) return strip(c, self, a0, true, true);
    if (!strcmp(name, "lstrip")) return strip(c, self, a0, true, false);
    if (!strcmp(name, "rstrip")) return strip(c, self, a0, false, true);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit"))
        return split(c, self, jargs_get(a, 0, "sep"), jargs_get(a, 1, "maxsplit"), name[0] == 'r');
    if (!strcmp(name, "replace")) return replace(c, self, a0, a1, a2);
    if (!strcmp(name, "upper")) return jinja_str_case(x, self, 1);
    if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return jinja_str_case(x, self, 0);
    if (!strcmp(name, "title")) return jinja_str_case(x, self, 2);
    if (!strcmp(name, "capitalize")) return jinja_str_case(x, self, 3);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
        !strcmp(name, "count")) {
        need_str(c, a0, "the substring");
        if (a->npos > 1) jx_fail(x, "%s: start and end arguments are not supported", name);
        if (!strcmp(name, "count")) {
            int64_t k = 0;
            if (!a0->u.str.n) return jv_int(x, (int64_t)ju_len(self->u.str.s, self->u.str.n) + 1);
            for (size_t i = 0; i + a0->u.str.n <= self->u.str.n;)
                if (!memcmp(self->u.str.s + i, a0->u.str.s, a0->u.str.n)) k++, i += a0->u.str.n;
                else i++;
            return jv_int(x, k);
        }
        const char *hit = find_sub(self->u.str.s, self->u.str.n, a0->u.str.s, a0->u.str.n, name[0] == 'r');
        if (!hit && (name[0] == 'i' || name[1] == 'i')) jx_fail(x, "substring not found");
        return jv_int(x, hit ? (int64_t)ju_len(self->u.str.s, (size_t)(hit - self->u.str.s)) : -1);
    }
    if (!strcmp(name, "join")) {
        jv *l = jv_iterable_list(c, a0 ? a0 : jv_list(x, 0));
        jbuf b;
        jb_init(&b, x);
        for (size_t i = 0; i < l->u.list.n; i++) {
            if (i) jb_put(&b, self->u.str.s, self->u.str.n);
            jv_write_str(x, &b, need_str(c, l->u.list.v[i], "join's items"));
        }
        return jv_str_own(x, b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "format")) return str_format(c, self, a);
    if (!strncmp(name, "is", 2) && strcmp(name, "isidentifier") && strcmp(name, "istitle") &&
        strcmp(name, "isprintable")) {
        const char *s = self->u.str.s;
        const size_t n = self->u.str.n;
        bool ok = n > 0, cased = false;
        for (size_t i = 0; i < n; i++) {
            const unsigned char ch = (unsigned char)s[i];
            if (ch >= 0x80 && strcmp(name, "isascii")) jx_fail(x, "str.%s on non-ASCII text is not supported", name);
            bool digit = ch >= '0' && ch <= '9', upper = ch >= 'A' && ch <= 'Z', lower = ch >= 'a' && ch <= 'z';
            cased |= upper || lower;
            if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") || !strcmp(name, "isdecimal")) ok &= digit;
            else if (!strcmp(name, "isalpha")) ok &= upper || lower;
            else if (!strcmp(name, "isalnum")) ok &= upper || lower || digit;
            else if (!strcmp(name, "isspace")) ok &= is_space(ch);
            else if (!strcmp(name, "islower")) ok &= !upper;
            else if (!strcmp(name, "isupper")) ok &= !lower;
            else if (!strcmp(name, "isascii")) ok &= ch < 0x80;
        }
        if (!strcmp(name, "isascii")) ok = true;
        if (!strcmp(name, "islower") || !strcmp(name, "isupper")) ok = ok && cased;
        return jv_bool(x, ok);
    }
    if (!strcmp(name, "splitlines")) {
        jv *l = jv_list(x, self->u.str.n + 1);
        size_t np = 0, i = 0;
        const char *s = self->u.str.s;
        const size_t n = self->u.str.n;
        while (i < n) {
            size_t e = i;
            while (e < n && s[e] != '\n' && s[e] != '\r') e++;
            l->u.list.v[np++] = jv_strn(x, s + i, e - i);
            i = e < n && s[e] == '\r' && e + 1 < n && s[e + 1] == '\n' ? e + 2 : e + 1;
        }
        l->u.list.n = np;
        return l;
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        need_str(c, a0, "the affix");
        const bool suffix = name[6] == 's';
        if (!affix(c, self, a0, suffix)) return self;
        return jv_strn(x, self->u.str.s + (suffix ? 0 : a0->u.str.n), self->u.str.n - a0->u.str.n);
    }
    jx_fail(x, "the str method '%s' is not supported", name);
}

static jv *pairs(jctx *c, jv *d, int which) { /* 0 items, 1 keys, 2 values */
    jv *l = jv_list(jctx_x(c), d->u.dict.n);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        if (which == 1) l->u.list.v[i] = d->u.dict.keys[i];
        else if (which == 2) l->u.list.v[i] = d->u.dict.vals[i];
        else {
            jv *t = jv_list(jctx_x(c), 2);
            t->u.list.tuple = true;
            t->u.list.v[0] = d->u.dict.keys[i], t->u.list.v[1] = d->u.dict.vals[i];
            l->u.list.v[i] = t;
        }
    }
    return l;
}

jv *jinja_call_method(jctx *c, jv *self, const char *name, const jargs *a) {
    jx *x = jctx_x(c);
    if (in_names(name, k_unsafe))
        jx_fail(x, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(self));
    if (self->k == JV_STR) return str_method(c, self, name, a);
    jv *a0 = jargs_get(a, 0, NULL);
    if (self->k == JV_DICT) {
        if (!strcmp(name, "items")) return pairs(c, self, 0);
        if (!strcmp(name, "keys")) return pairs(c, self, 1);
        if (!strcmp(name, "values")) return pairs(c, self, 2);
        if (!strcmp(name, "get")) {
            if (!a0) jx_fail(x, "get expected at least 1 argument, got 0");
            jv *v = jv_dict_find(self, a0), *def = jargs_get(a, 1, NULL);
            return v ? v : def ? def : jv_none();
        }
        if (!strcmp(name, "copy")) {
            jv *d = jv_dict(x);
            for (size_t i = 0; i < self->u.dict.n; i++) jv_dict_set(x, d, self->u.dict.keys[i], self->u.dict.vals[i]);
            return d;
        }
    }
    if (self->k == JV_LIST) {
        if (!strcmp(name, "copy")) {
            jv *l = jv_list(x, self->u.list.n);
            if (self->u.list.n) memcpy(l->u.list.v, self->u.list.v, self->u.list.n * sizeof(jv *));
            return l;
        }
        if (!a0) jx_fail(x, "%s expected 1 argument", name);
        int64_t k = 0;
        for (size_t i = 0; i < self->u.list.n; i++) {
            if (!jv_equal(self->u.list.v[i], a0)) continue;
            if (!strcmp(name, "index")) return jv_int(x, (int64_t)i);
            k++;
        }
        if (!strcmp(name, "index")) jx_fail(x, "the value is not in the list");
        return jv_int(x, k);
    }
    jx_fail(x, "the %s method '%s' is not supported", jv_type_name(self), name);
}

/* ---- global functions ---- */

static const char *const k_globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

bool jinja_is_global(const char *name) { return in_names(name, k_globals); }

enum { MAX_RANGE = 100000 }; /* jinja2's sandbox refuses longer ranges */

jv *jinja_call_global(jctx *c, const char *name, const jargs *a) {
    jx *x = jctx_x(c);
    if (!strcmp(name, "range")) {
        int64_t v[3] = {0, 0, 1};
        if (a->npos < 1 || a->npos > 3 || a->nkw) jx_fail(x, "range expects 1 to 3 integer arguments");
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i]->k != JV_INT && a->pos[i]->k != JV_BOOL)
                jx_fail(x, "'%s' object cannot be interpreted as an integer", jv_type_name(a->pos[i]));
            v[a->npos == 1 ? 1 : i] = a->pos[i]->k == JV_INT ? a->pos[i]->u.i : a->pos[i]->u.b;
        }
        if (!v[2]) jx_fail(x, "range() arg 3 must not be zero");
        int64_t n = 0;
        if (v[2] > 0 && v[1] > v[0]) n = (v[1] - v[0] + v[2] - 1) / v[2];
        if (v[2] < 0 && v[0] > v[1]) n = (v[0] - v[1] - v[2] - 1) / -v[2];
        if (n > MAX_RANGE)
            jx_fail(x, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
        jv *l = jv_list(x, (size_t)n);
        for (int64_t i = 0; i < n; i++) l->u.list.v[i] = jv_int(x, v[0] + i * v[2]);
        return l;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv *d = jv_new(x, name[0] == 'n' ? JV_NS : JV_DICT);
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i]->k != JV_DICT) jx_fail(x, "%s() takes mappings and keyword arguments", name);
            for (size_t k = 0; k < a->pos[i]->u.dict.n; k++)
                jv_dict_set(x, d, a->pos[i]->u.dict.keys[k], a->pos[i]->u.dict.vals[k]);
        }
        for (int i = 0; i < a->nkw; i++) jv_dict_set(x, d, jv_cstr(x, a->kwn[i]), a->kwv[i]);
        return d;
    }
    if (!strcmp(name, "raise_exception")) {
        jv *m = jargs_get(a, 0, "message");
        m = m ? jv_to_str(x, m) : jv_cstr(x, "");
        jx_raise(x, m->u.str.s, m->u.str.n);
    }
    if (!strcmp(name, "strftime_now")) {
        jv *f = jargs_get(a, 0, "format");
        if (!f || f->k != JV_STR) jx_fail(x, "strftime_now needs a format string");
        const time_t now = jctx_now(c);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, jx_strndup(x, f->u.str.s, f->u.str.n), &tm);
        return jv_strn(x, buf, n);
    }
    jx_fail(x, "unknown function '%s'", name);
}

/* ---- "%" formatting ---- */

jv *jinja_percent_format(jctx *c, jv *fmt, jv *args) {
    jx *x = jctx_x(c);
    jbuf b;
    jb_init(&b, x);
    const bool tuple = args->k == JV_LIST && args->u.list.tuple;
    const size_t nargs = tuple ? args->u.list.n : 1;
    size_t used = 0;
    const char *s = fmt->u.str.s;
    const size_t n = fmt->u.str.n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            jb_char(&b, s[i]);
            continue;
        }
        if (++i >= n) jx_fail(x, "incomplete format");
        if (s[i] == '%') {
            jb_char(&b, '%');
            continue;
        }
        jv *v = NULL;
        if (s[i] == '(') { /* %(name)s */
            size_t e = i + 1;
            while (e < n && s[e] != ')') e++;
            if (e >= n || args->k != JV_DICT) jx_fail(x, "format requires a mapping");
            v = jv_dict_get(args, s + i + 1, e - i - 1);
            if (!v) jx_fail(x, "format: key '%.*s' not found", (int)(e - i - 1), s + i + 1);
            i = e + 1;
        }
        char spec[32] = "%";
        size_t k = 1;
        while (i < n && strchr("-+ #0", s[i]) && k < 8) spec[k++] = s[i++];
        while (i < n && s[i] >= '0' && s[i] <= '9' && k < 16) spec[k++] = s[i++];
        if (i < n && s[i] == '.') {
            spec[k++] = s[i++];
            while (i < n && s[i] >= '0' && s[i] <= '9' && k < 24) spec[k++] = s[i++];
        }
        if (i >= n) jx_fail(x, "incomplete format");
        const char conv = s[i];
        if (!v) {
            if (used >= nargs) jx_fail(x, "not enough arguments for format string");
            v = tuple ? args->u.list.v[used] : args;
            used++;
        }
        if (v->k == JV_UNDEF && conv != 's') jv_fail_undef(x, v);
        if (conv == 's' || conv == 'r') {
            jbuf t;
            jb_init(&t, x);
            if (conv == 's') jv_write_str(x, &t, v);
            else jv_write_repr(x, &t, v);
            spec[k++] = 's', spec[k] = 0;
            jb_printf(&b, spec, t.p ? t.p : "");
        } else if (strchr("dixXo", conv)) {
            if (!jv_is_number(v)) jx_fail(x, "%%%c format: a number is required, not %s", conv, jv_type_name(v));
            const int64_t iv = v->k == JV_FLOAT ? (int64_t)v->u.f : v->k == JV_INT ? v->u.i : v->u.b;
            spec[k++] = 'l', spec[k++] = 'l', spec[k++] = conv == 'i' ? 'd' : conv, spec[k] = 0;
            jb_printf(&b, spec, (long long)iv);
        } else if (strchr("feEgG", conv) || conv == 'F') {
            if (!jv_is_number(v)) jx_fail(x, "must be real number, not %s", jv_type_name(v));
            spec[k++] = conv, spec[k] = 0;
            jb_printf(&b, spec, jv_as_double(v));
        } else jx_fail(x, "unsupported format character '%c'", conv);
    }
    if (tuple && used < nargs) jx_fail(x, "not all arguments converted during string formatting");
    if (!tuple && used == 0 && args->k != JV_DICT) jx_fail(x, "not all arguments converted during string formatting");
    return jv_str_own(x, b.p ? b.p : "", b.n);
}
