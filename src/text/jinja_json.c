/* JSON in and out: cJSON values become Jinja values (key order kept), and tojson writes what Python's
 * json.dumps(value, ensure_ascii, indent, separators, sort_keys) writes, byte for byte. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/jinja_internal.h"

jv *jv_from_cjson(jx *x, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(x, cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        /* cJSON keeps no trace of "1.0" vs "1": an integral value within 2^53 is an int */
        const double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int(x, (int64_t)d);
        return jv_float(x, d);
    }
    if (cJSON_IsString(j)) return jv_cstr(x, j->valuestring ? j->valuestring : "");
    if (cJSON_IsArray(j)) {
        jv *l = jv_list(x, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        for (const cJSON *e = j->child; e; e = e->next) l->u.list.v[i++] = jv_from_cjson(x, e);
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv *d = jv_dict(x);
        for (const cJSON *e = j->child; e; e = e->next)
            jv_dict_set(x, d, jv_cstr(x, e->string ? e->string : ""), jv_from_cjson(x, e));
        return d;
    }
    return jv_none();
}

static void write_json_str(jbuf *b, const char *s, size_t n, bool ascii) {
    jb_char(b, '"');
    size_t i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            switch (c) {
            case '"': jb_str(b, "\\\""); break;
            case '\\': jb_str(b, "\\\\"); break;
            case '\n': jb_str(b, "\\n"); break;
            case '\r': jb_str(b, "\\r"); break;
            case '\t': jb_str(b, "\\t"); break;
            case '\b': jb_str(b, "\\b"); break;
            case '\f': jb_str(b, "\\f"); break;
            default:
                if (c < 0x20) jb_printf(b, "\\u%04x", c);
                else jb_char(b, (char)c);
            }
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (len <= 0) len = 1, cp = 0xFFFD;
        if (!ascii) jb_put(b, s + i, (size_t)len);
        else if (cp < 0x10000) jb_printf(b, "\\u%04x", (unsigned)cp);
        else {
            const unsigned v = (unsigned)cp - 0x10000;
            jb_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        }
        i += (size_t)len;
    }
    jb_char(b, '"');
}

static void newline_indent(jbuf *b, const jjson_opts *o, int level) {
    jb_char(b, '\n');
    for (int i = 0; i < o->indent * level; i++) jb_char(b, ' ');
}

static void write_number(jbuf *b, const jv *v) {
    if (v->k == JV_BOOL) jb_str(b, v->u.b ? "true" : "false");
    else if (v->k == JV_INT) jb_printf(b, "%lld", (long long)v->u.i);
    else if (isnan(v->u.f)) jb_str(b, "NaN");
    else if (isinf(v->u.f)) jb_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
    else jv_write_float(b, v->u.f);
}

/* json.dumps turns keys that are not strings into strings (True -> "true", 1 -> "1", None -> "null"). */
static void write_key(jx *x, jbuf *b, const jv *k, const jjson_opts *o) {
    if (k->k == JV_STR) {
        write_json_str(b, k->u.str.s, k->u.str.n, o->ensure_ascii);
        return;
    }
    jbuf t;
    jb_init(&t, x);
    if (k->k == JV_NONE) jb_str(&t, "null");
    else if (jv_is_number(k)) write_number(&t, k);
    else jx_fail(x, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    write_json_str(b, t.p, t.n, o->ensure_ascii);
}

static int key_cmp(const void *a, const void *b) {
    const jv *p = *(jv *const *)a, *q = *(jv *const *)b;
    size_t n = p->u.str.n < q->u.str.n ? p->u.str.n : q->u.str.n;
    int c = n ? memcmp(p->u.str.s, q->u.str.s, n) : 0;
    return c ? c : (p->u.str.n > q->u.str.n) - (p->u.str.n < q->u.str.n);
}

void jv_write_json(jx *x, jbuf *b, const jv *v, const jjson_opts *o, int level) {
    if (level > 200) jx_fail(x, "tojson: the value is nested too deeply");
    switch (v->k) {
    case JV_NONE: jb_str(b, "null"); return;
    case JV_BOOL:
    case JV_INT:
    case JV_FLOAT: write_number(b, v); return;
    case JV_STR: write_json_str(b, v->u.str.s, v->u.str.n, o->ensure_ascii); return;
    case JV_LIST:
        if (!v->u.list.n) {
            jb_str(b, "[]");
            return;
        }
        jb_char(b, '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_str(b, o->item_sep);
            if (o->indent >= 0) newline_indent(b, o, level + 1);
            jv_write_json(x, b, v->u.list.v[i], o, level + 1);
        }
        if (o->indent >= 0) newline_indent(b, o, level);
        jb_char(b, ']');
        return;
    case JV_DICT: {
        if (!v->u.dict.n) {
            jb_str(b, "{}");
            return;
        }
        size_t n = v->u.dict.n;
        size_t *order = jx_alloc(x, n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) {
            jv **keys = jx_alloc(x, n * sizeof *keys);
            for (size_t i = 0; i < n; i++) {
                keys[i] = v->u.dict.keys[i];
                if (keys[i]->k != JV_STR) jx_fail(x, "tojson(sort_keys=true) needs string keys");
            }
            qsort(keys, n, sizeof *keys, key_cmp);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++)
                    if (v->u.dict.keys[j] == keys[i]) order[i] = j;
        }
        jb_char(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jb_str(b, o->item_sep);
            if (o->indent >= 0) newline_indent(b, o, level + 1);
            write_key(x, b, v->u.dict.keys[order[i]], o);
            jb_str(b, o->key_sep);
            jv_write_json(x, b, v->u.dict.vals[order[i]], o, level + 1);
        }
        if (o->indent >= 0) newline_indent(b, o, level);
        jb_char(b, '}');
        return;
    }
    default: jx_fail(x, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
