/* The Jinja evaluator: statements write to the output, expressions compute values, with jinja2's scoping
 * (a for loop's body is a fresh scope each iteration, if does not make one, a macro sees the scope it was
 * defined in) and its lookups (obj.name tries the attribute then the item, obj[key] the item then the attribute;
 * a miss is an undefined value that fails only when used). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

struct jscope {
    jscope *parent;
    const char **names;
    jv **vals;
    int n, cap;
};

struct jctx {
    jx *x;
    jbuf *out;
    jv *globals; /* the render's variables */
    jscope *root;
    int64_t iterations, max_iterations;
    int depth, max_depth;
    size_t max_output;
    time_t now;
    int loop_ctl; /* 1: break, 2: continue, pending */
};

jx *jctx_x(jctx *c) { return c->x; }
time_t jctx_now(jctx *c) { return c->now; }

void jctx_tick(jctx *c) {
    if (++c->iterations > c->max_iterations)
        jx_fail(c->x, "the template ran more than the %lld loop iterations it is allowed",
                (long long)c->max_iterations);
}

/* ---- scopes ---- */

static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = jx_alloc(c->x, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jctx *c, jscope *s, const char *name, jv *v) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **names = jx_alloc(c->x, (size_t)cap * sizeof *names);
        jv **vals = jx_alloc(c->x, (size_t)cap * sizeof *vals);
        if (s->n)
            memcpy(names, s->names, (size_t)s->n * sizeof *names), memcpy(vals, s->vals, (size_t)s->n * sizeof *vals);
        s->names = names, s->vals = vals, s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static jv *lookup(jctx *c, jscope *s, const char *name) {
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->names[i], name)) return s->vals[i];
    jv *g = jv_dict_get(c->globals, name, strlen(name));
    if (g) return g;
    if (jinja_is_global(name)) {
        jv *f = jv_new(c->x, JV_FUNC);
        f->u.fn.fk = JF_GLOBAL, f->u.fn.name = name;
        return f;
    }
    jbuf b;
    jb_init(&b, c->x);
    jb_printf(&b, "'%s' is undefined", name);
    return jv_undef(c->x, b.p);
}

/* ---- lookups ---- */

static jv *missing(jctx *c, const jv *obj, const char *what, const char *name, size_t n) {
    jbuf b;
    jb_init(&b, c->x);
    if (obj->k == JV_NONE) jb_str(&b, "'None'");
    else jb_printf(&b, "'%s object'", jv_type_name(obj));
    jb_printf(&b, " has no %s '", what);
    jb_put(&b, name, n);
    jb_char(&b, '\'');
    return jv_undef(c->x, b.p);
}

static jv *bound_method(jctx *c, jv *obj, const char *name, size_t n) {
    jv *f = jv_new(c->x, JV_FUNC);
    f->u.fn.fk = JF_METHOD, f->u.fn.self = obj, f->u.fn.name = jx_strndup(c->x, name, n);
    return f;
}

jv *jctx_getattr(jctx *c, jv *obj, const char *name, size_t n) {
    if (obj->k == JV_UNDEF) jv_fail_undef(c->x, obj);
    char *nm = jx_strndup(c->x, name, n);
    if (obj->k == JV_NS) {
        jv *v = jv_dict_get(obj, name, n);
        return v ? v : missing(c, obj, "attribute", name, n);
    }
    if (jinja_has_method(obj, nm)) return bound_method(c, obj, name, n);
    if (obj->k == JV_DICT) {
        jv *v = jv_dict_get(obj, name, n);
        if (v) return v;
    }
    return missing(c, obj, "attribute", name, n);
}

static bool as_index(const jv *key, int64_t *i) {
    if (key->k == JV_INT) *i = key->u.i;
    else if (key->k == JV_BOOL) *i = key->u.b;
    else return false;
    return true;
}

jv *jctx_getitem(jctx *c, jv *obj, jv *key) {
    if (obj->k == JV_UNDEF) jv_fail_undef(c->x, obj);
    if (key->k == JV_UNDEF) jv_fail_undef(c->x, key);
    int64_t i;
    if (obj->k == JV_DICT || obj->k == JV_NS) {
        jv *v = jv_dict_find(obj, key);
        if (v) return v;
    } else if (obj->k == JV_LIST && as_index(key, &i)) {
        const int64_t n = (int64_t)obj->u.list.n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj->u.list.v[i];
    } else if (obj->k == JV_STR && as_index(key, &i)) {
        const int64_t n = (int64_t)ju_len(obj->u.str.s, obj->u.str.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            size_t a = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
            size_t b = ju_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
            return jv_strn(c->x, obj->u.str.s + a, b - a);
        }
    }
    if (key->k == JV_STR) { /* then the attribute: obj['items'] is the method when there is no such key */
        if (obj->k != JV_NS && jinja_has_method(obj, jx_strndup(c->x, key->u.str.s, key->u.str.n)))
            return bound_method(c, obj, key->u.str.s, key->u.str.n);
        return missing(c, obj, "attribute", key->u.str.s, key->u.str.n);
    }
    jbuf b;
    jb_init(&b, c->x);
    jv_write_repr(c->x, &b, key);
    return missing(c, obj, "element", b.p, b.n);
}

/* Python's slice indices for a sequence of n items. */
static void slice_bounds(jctx *c, jv *sv, jv *ev, jv *stv, int64_t n, int64_t *start, int64_t *step, int64_t *count) {
    int64_t st = 1;
    if (stv && stv->k != JV_NONE) {
        if (!as_index(stv, &st)) jx_fail(c->x, "slice indices must be integers or None");
        if (st == 0) jx_fail(c->x, "slice step cannot be zero");
        if (st < -INT64_MAX) st = -INT64_MAX; /* the same slice, and -st stays defined */
    }
    int64_t lo, hi;
    if (st > 0) lo = 0, hi = n;
    else lo = n - 1, hi = -1;
    if (sv && sv->k != JV_NONE) {
        if (!as_index(sv, &lo)) jx_fail(c->x, "slice indices must be integers or None");
        if (lo < 0) lo += n;
        if (lo < 0) lo = st > 0 ? 0 : -1;
        if (lo >= n) lo = st > 0 ? n : n - 1;
    }
    if (ev && ev->k != JV_NONE) {
        if (!as_index(ev, &hi)) jx_fail(c->x, "slice indices must be integers or None");
        if (hi < 0) hi += n;
        if (hi < 0) hi = st > 0 ? 0 : -1;
        if (hi >= n) hi = st > 0 ? n : n - 1;
    }
    int64_t cnt = 0;
    if (st > 0 && hi > lo) cnt = (hi - lo - 1) / st + 1;
    if (st < 0 && lo > hi) cnt = (lo - hi - 1) / -st + 1;
    *start = lo, *step = st, *count = cnt;
}

static jv *do_slice(jctx *c, jv *obj, jv *sv, jv *ev, jv *stv) {
    if (obj->k == JV_UNDEF) jv_fail_undef(c->x, obj);
    int64_t start, step, cnt;
    if (obj->k == JV_LIST) {
        slice_bounds(c, sv, ev, stv, (int64_t)obj->u.list.n, &start, &step, &cnt);
        jv *l = jv_list(c->x, (size_t)cnt);
        l->u.list.tuple = obj->u.list.tuple;
        for (int64_t k = 0; k < cnt; k++) l->u.list.v[k] = obj->u.list.v[start + k * step];
        return l;
    }
    if (obj->k == JV_STR) {
        const char *s = obj->u.str.s;
        const size_t n = obj->u.str.n, len = ju_len(s, n);
        slice_bounds(c, sv, ev, stv, (int64_t)len, &start, &step, &cnt);
        jbuf b;
        jb_init(&b, c->x);
        if (len == n) {
            for (int64_t k = 0; k < cnt; k++) jb_char(&b, s[start + k * step]);
        } else {
            size_t *off = jx_alloc(c->x, (len + 1) * sizeof *off);
            for (size_t i = 0, p = 0; i <= len; i++) {
                off[i] = p;
                if (p < n) p = p + ju_offset(s + p, n - p, 1);
            }
            for (int64_t k = 0; k < cnt; k++) {
                int64_t i = start + k * step;
                jb_put(&b, s + off[i], off[i + 1] - off[i]);
            }
        }
        return jv_str_own(c->x, b.p ? b.p : "", b.n);
    }
    return missing(c, obj, "attribute", "__getitem__", 11); /* jinja2 turns the TypeError into an undefined */
}

/* ---- iteration ---- */

jv *jv_iterable_list(jctx *c, jv *v) {
    switch (v->k) {
    case JV_UNDEF: return jv_list(c->x, 0);
    case JV_LIST: return v;
    case JV_DICT:
    case JV_NS: {
        if (v->k == JV_NS) jx_fail(c->x, "'Namespace' object is not iterable");
        jv *l = jv_list(c->x, v->u.dict.n);
        for (size_t i = 0; i < v->u.dict.n; i++) l->u.list.v[i] = v->u.dict.keys[i];
        return l;
    }
    case JV_STR: {
        const size_t len = ju_len(v->u.str.s, v->u.str.n);
        jv *l = jv_list(c->x, len);
        size_t p = 0;
        for (size_t i = 0; i < len; i++) {
            size_t q = p + ju_offset(v->u.str.s + p, v->u.str.n - p, 1);
            l->u.list.v[i] = jv_strn(c->x, v->u.str.s + p, q - p);
            p = q;
        }
        return l;
    }
    default: jx_fail(c->x, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- expressions ---- */

static jv *eval(jctx *c, jscope *s, const jnode *n);
static void exec_body(jctx *c, jscope *s, const jnodes *body);

static void eval_args(jctx *c, jscope *s, const jnode *n, jargs *a) {
    a->npos = n->kids.n, a->nkw = n->nstrs;
    a->pos = a->npos ? jx_alloc(c->x, (size_t)a->npos * sizeof *a->pos) : NULL;
    a->kwv = a->nkw ? jx_alloc(c->x, (size_t)a->nkw * sizeof *a->kwv) : NULL;
    a->kwn = n->strs;
    for (int i = 0; i < a->npos; i++) a->pos[i] = eval(c, s, n->kids.v[i]);
    for (int i = 0; i < a->nkw; i++) a->kwv[i] = eval(c, s, n->kids2.v[i]);
}

jv *jargs_get(const jargs *a, int pos, const char *kw) {
    if (pos >= 0 && pos < a->npos) return a->pos[pos];
    for (int i = 0; kw && i < a->nkw; i++)
        if (!strcmp(a->kwn[i], kw)) return a->kwv[i];
    return NULL;
}

void jargs_check(jctx *c, const jargs *a, const char *what, int max_pos, const char *const *kws) {
    if (a->npos > max_pos)
        jx_fail(c->x, "%s takes at most %d positional argument(s), %d given", what, max_pos, a->npos);
    for (int i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (const char *const *k = kws; k && *k; k++) ok |= !strcmp(*k, a->kwn[i]);
        if (!ok) jx_fail(c->x, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]);
    }
}

static jv *call_macro(jctx *c, jv *fn, const jargs *a) {
    const jnode *m = fn->u.fn.macro;
    if (++c->depth > c->max_depth) jx_fail(c->x, "macro calls nested deeper than the %d allowed", c->max_depth);
    if (a->npos > m->nstrs) jx_fail(c->x, "macro '%s' takes not more than %d argument(s)", m->name, m->nstrs);
    jscope *s = scope_new(c, fn->u.fn.closure);
    for (int i = 0; i < m->nstrs; i++) {
        jv *v = i < a->npos ? a->pos[i] : NULL;
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwn[k], m->strs[i])) {
                if (v) jx_fail(c->x, "macro '%s' got multiple values for argument '%s'", m->name, m->strs[i]);
                v = a->kwv[k];
            }
        if (!v) v = m->kids2.v[i] ? eval(c, s, m->kids2.v[i]) : NULL;
        if (!v) {
            jbuf b;
            jb_init(&b, c->x);
            jb_printf(&b, "parameter '%s' was not provided", m->strs[i]);
            v = jv_undef(c->x, b.p);
        }
        scope_set(c, s, m->strs[i], v);
    }
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;
        for (int i = 0; i < m->nstrs; i++) known |= !strcmp(a->kwn[k], m->strs[i]);
        if (!known) jx_fail(c->x, "macro '%s' takes no keyword argument '%s'", m->name, a->kwn[k]);
    }
    jbuf out, *saved = c->out;
    jb_init(&out, c->x);
    out.limit = c->max_output;
    c->out = &out;
    exec_body(c, s, &m->kids);
    c->out = saved;
    c->loop_ctl = 0;
    c->depth--;
    return jv_str_own(c->x, out.p ? out.p : "", out.n);
}

jv *jctx_call(jctx *c, jv *fn, const jargs *a) {
    if (fn->k == JV_UNDEF) jv_fail_undef(c->x, fn);
    if (fn->k != JV_FUNC) jx_fail(c->x, "'%s' object is not callable", jv_type_name(fn));
    switch (fn->u.fn.fk) {
    case JF_MACRO: return call_macro(c, fn, a);
    case JF_METHOD: return jinja_call_method(c, fn->u.fn.self, fn->u.fn.name, a);
    case JF_GLOBAL:
        if (!strcmp(fn->u.fn.name, "loop.cycle")) { /* loop.cycle(a, b, ...): the item of this iteration */
            if (!a->npos) jx_fail(c->x, "no items for cycling given");
            return a->pos[fn->u.fn.self->u.i % a->npos];
        }
        return jinja_call_global(c, fn->u.fn.name, a);
    }
    return jv_none();
}

static int64_t checked(jctx *c, bool overflow, const int64_t *r) {
    if (overflow) jx_fail(c->x, "integer overflow (the interpreter's integers are 64-bit)");
    return *r;
}

static jv *repeat(jctx *c, jv *seq, int64_t times) {
    if (times < 0) times = 0;
    if ((seq->k == JV_STR ? seq->u.str.n : seq->u.list.n) == 0) times = 0; /* nothing to repeat, however often */
    if (seq->k == JV_STR) {
        if (seq->u.str.n && (uint64_t)times > c->max_output / seq->u.str.n)
            jx_fail(c->x, "the repeated string is longer than the %zu bytes allowed", c->max_output);
        jbuf b;
        jb_init(&b, c->x);
        for (int64_t i = 0; i < times; i++) jb_put(&b, seq->u.str.s, seq->u.str.n);
        return jv_str_own(c->x, b.p ? b.p : "", b.n);
    }
    if (seq->u.list.n && (uint64_t)times > (uint64_t)c->max_iterations / seq->u.list.n)
        jx_fail(c->x, "the repeated list is too long");
    jv *l = jv_list(c->x, seq->u.list.n * (size_t)times);
    l->u.list.tuple = seq->u.list.tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq->u.list.n; k++) l->u.list.v[(size_t)i * seq->u.list.n + k] = seq->u.list.v[k];
    return l;
}

static jv *binop(jctx *c, const char *op, jv *a, jv *b) {
    if (a->k == JV_UNDEF) jv_fail_undef(c->x, a);
    if (b->k == JV_UNDEF) jv_fail_undef(c->x, b);
    const bool ints = (a->k == JV_INT || a->k == JV_BOOL) && (b->k == JV_INT || b->k == JV_BOOL);
    const int64_t p = a->k == JV_INT ? a->u.i : a->k == JV_BOOL ? a->u.b : 0;
    const int64_t q = b->k == JV_INT ? b->u.i : b->k == JV_BOOL ? b->u.b : 0;
    const bool nums = jv_is_number(a) && jv_is_number(b);
    const double x = jv_as_double(a), y = jv_as_double(b);
    int64_t r;
    switch (op[0]) {
    case '+':
        if (ints) return jv_int(c->x, checked(c, __builtin_add_overflow(p, q, &r), &r));
        if (nums) return jv_float(c->x, x + y);
        if (a->k == JV_STR && b->k == JV_STR) {
            char *s = jx_alloc(c->x, a->u.str.n + b->u.str.n + 1);
            memcpy(s, a->u.str.s, a->u.str.n), memcpy(s + a->u.str.n, b->u.str.s, b->u.str.n);
            return jv_str_own(c->x, s, a->u.str.n + b->u.str.n);
        }
        if (a->k == JV_LIST && b->k == JV_LIST && a->u.list.tuple == b->u.list.tuple) {
            jv *l = jv_list(c->x, a->u.list.n + b->u.list.n);
            l->u.list.tuple = a->u.list.tuple;
            if (a->u.list.n) memcpy(l->u.list.v, a->u.list.v, a->u.list.n * sizeof(jv *));
            if (b->u.list.n) memcpy(l->u.list.v + a->u.list.n, b->u.list.v, b->u.list.n * sizeof(jv *));
            return l;
        }
        break;
    case '-':
        if (ints) return jv_int(c->x, checked(c, __builtin_sub_overflow(p, q, &r), &r));
        if (nums) return jv_float(c->x, x - y);
        break;
    case '*':
        if (op[1] == '*') {
            if (ints && q >= 0) { /* by squaring, every product checked */
                int64_t base = p, e = q, acc = 1;
                while (e > 0) {
                    if (e & 1) acc = checked(c, __builtin_mul_overflow(acc, base, &r), &r);
                    e >>= 1;
                    if (e) base = checked(c, __builtin_mul_overflow(base, base, &r), &r);
                }
                return jv_int(c->x, acc);
            }
            if (nums) {
                if (x == 0.0 && y < 0) jx_fail(c->x, "0.0 cannot be raised to a negative power");
                return jv_float(c->x, pow(x, y));
            }
            break;
        }
        if (ints) return jv_int(c->x, checked(c, __builtin_mul_overflow(p, q, &r), &r));
        if (nums) return jv_float(c->x, x * y);
        if ((a->k == JV_STR || a->k == JV_LIST) && (b->k == JV_INT || b->k == JV_BOOL)) return repeat(c, a, q);
        if ((b->k == JV_STR || b->k == JV_LIST) && (a->k == JV_INT || a->k == JV_BOOL)) return repeat(c, b, p);
        break;
    case '/':
        if (!nums) break;
        if (y == 0.0) jx_fail(c->x, op[1] == '/' ? "integer division or modulo by zero" : "division by zero");
        if (op[1] == '/') {
            if (ints) {
                if (p == INT64_MIN && q == -1)
                    jx_fail(c->x, "integer overflow (the interpreter's integers are 64-bit)");
                int64_t d = p / q;
                if ((p % q != 0) && ((p < 0) != (q < 0))) d--;
                return jv_int(c->x, d);
            }
            return jv_float(c->x, floor(x / y));
        }
        return jv_float(c->x, x / y);
    case '%':
        if (a->k == JV_STR) return jinja_percent_format(c, a, b);
        if (!nums) break;
        if (y == 0.0) jx_fail(c->x, "integer division or modulo by zero");
        if (ints) {
            if (q == -1) return jv_int(c->x, 0);
            int64_t m = p % q;
            if (m != 0 && ((m < 0) != (q < 0))) m += q;
            return jv_int(c->x, m);
        }
        {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jv_float(c->x, m);
        }
    }
    jx_fail(c->x, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static bool contains(jctx *c, jv *hay, jv *needle) {
    switch (hay->k) {
    case JV_UNDEF: return false;
    case JV_STR:
        if (needle->k == JV_UNDEF) jv_fail_undef(c->x, needle);
        if (needle->k != JV_STR)
            jx_fail(c->x, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (!needle->u.str.n) return true;
        for (size_t i = 0; i + needle->u.str.n <= hay->u.str.n; i++)
            if (!memcmp(hay->u.str.s + i, needle->u.str.s, needle->u.str.n)) return true;
        return false;
    case JV_LIST:
        for (size_t i = 0; i < hay->u.list.n; i++)
            if (jv_equal(hay->u.list.v[i], needle)) return true;
        return false;
    case JV_DICT: return jv_dict_find(hay, needle) != NULL;
    default: jx_fail(c->x, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static bool compare(jctx *c, const char *op, jv *a, jv *b) {
    if (!strcmp(op, "==")) return jv_equal(a, b);
    if (!strcmp(op, "!=")) return !jv_equal(a, b);
    if (!strcmp(op, "in")) return contains(c, b, a);
    if (!strcmp(op, "not in")) return !contains(c, b, a);
    const int r = jv_compare(c->x, a, b, op);
    if (!strcmp(op, "<")) return r < 0;
    if (!strcmp(op, "<=")) return r <= 0;
    if (!strcmp(op, ">")) return r > 0;
    return r >= 0;
}

static jv *eval(jctx *c, jscope *s, const jnode *n) {
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(c, s, n->name);
    case E_ATTR: return jctx_getattr(c, eval(c, s, n->a), n->name, strlen(n->name));
    case E_ITEM: return jctx_getitem(c, eval(c, s, n->a), eval(c, s, n->b));
    case E_SLICE: {
        jv *obj = eval(c, s, n->a);
        jv *a = n->b ? eval(c, s, n->b) : NULL, *b = n->c ? eval(c, s, n->c) : NULL;
        return do_slice(c, obj, a, b, n->d ? eval(c, s, n->d) : NULL);
    }
    case E_CALL: {
        jargs a;
        if (n->a->kind == E_ATTR) { /* obj.method(...) without building the bound method first */
            jv *obj = eval(c, s, n->a->a);
            if (obj->k != JV_UNDEF && obj->k != JV_NS && jinja_has_method(obj, n->a->name)) {
                eval_args(c, s, n, &a);
                return jinja_call_method(c, obj, n->a->name, &a);
            }
            jv *fn = jctx_getattr(c, obj, n->a->name, strlen(n->a->name));
            eval_args(c, s, n, &a);
            return jctx_call(c, fn, &a);
        }
        jv *fn = eval(c, s, n->a);
        eval_args(c, s, n, &a);
        return jctx_call(c, fn, &a);
    }
    case E_FILTER: {
        jv *v = eval(c, s, n->a), *out = NULL;
        jargs a;
        eval_args(c, s, n, &a);
        if (!jinja_filter(c, n->name, v, &a, &out)) jx_fail(c->x, "line %d: unknown filter '%s'", n->line, n->name);
        return out;
    }
    case E_TEST: {
        jv *v = eval(c, s, n->a);
        jargs a;
        eval_args(c, s, n, &a);
        bool r;
        if (!jinja_test(c, n->name, v, &a, &r)) jx_fail(c->x, "line %d: unknown test '%s'", n->line, n->name);
        return jv_bool(c->x, r != n->neg);
    }
    case E_NEG:
    case E_POS: {
        jv *v = eval(c, s, n->a);
        if (v->k == JV_UNDEF) jv_fail_undef(c->x, v);
        if (!jv_is_number(v))
            jx_fail(c->x, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(v));
        if (n->kind == E_POS) return v->k == JV_BOOL ? jv_int(c->x, v->u.b) : v;
        if (v->k == JV_FLOAT) return jv_float(c->x, -v->u.f);
        const int64_t i = v->k == JV_INT ? v->u.i : v->u.b;
        if (i == INT64_MIN) jx_fail(c->x, "integer overflow");
        return jv_int(c->x, -i);
    }
    case E_NOT: return jv_bool(c->x, !jv_truthy(eval(c, s, n->a)));
    case E_AND: {
        jv *a = eval(c, s, n->a);
        return jv_truthy(a) ? eval(c, s, n->b) : a;
    }
    case E_OR: {
        jv *a = eval(c, s, n->a);
        return jv_truthy(a) ? a : eval(c, s, n->b);
    }
    case E_BIN: return binop(c, n->name, eval(c, s, n->a), eval(c, s, n->b));
    case E_CMP: {
        jv *left = eval(c, s, n->a);
        for (int i = 0; i < n->kids.n; i++) {
            jv *right = eval(c, s, n->kids.v[i]);
            if (!compare(c, n->strs[i], left, right)) return jv_bool(c->x, false);
            left = right;
        }
        return jv_bool(c->x, true);
    }
    case E_COND:
        if (jv_truthy(eval(c, s, n->a))) return eval(c, s, n->b);
        if (n->c) return eval(c, s, n->c);
        return jv_undef(c->x, "the conditional expression had no else branch");
    case E_LIST:
    case E_TUPLE: {
        jv *l = jv_list(c->x, (size_t)n->kids.n);
        l->u.list.tuple = n->kind == E_TUPLE;
        for (int i = 0; i < n->kids.n; i++) l->u.list.v[i] = eval(c, s, n->kids.v[i]);
        return l;
    }
    case E_DICT: {
        jv *d = jv_dict(c->x);
        for (int i = 0; i < n->kids.n; i++) jv_dict_set(c->x, d, eval(c, s, n->kids.v[i]), eval(c, s, n->kids2.v[i]));
        return d;
    }
    case E_CONCAT: {
        jbuf b;
        jb_init(&b, c->x);
        for (int i = 0; i < n->kids.n; i++) jv_write_str(c->x, &b, eval(c, s, n->kids.v[i]));
        return jv_str_own(c->x, b.p ? b.p : "", b.n);
    }
    default: jx_fail(c->x, "line %d: not an expression", n->line);
    }
}

/* ---- statements ---- */

static void assign(jctx *c, jscope *s, const jnode *target, jv *v) {
    if (target->kind == E_NAME) {
        scope_set(c, s, target->name, v);
        return;
    }
    if (target->kind == E_ATTR) {
        jv *ns = eval(c, s, target->a);
        if (ns->k != JV_NS) jx_fail(c->x, "line %d: cannot assign attribute on non-namespace object", target->line);
        jv_dict_set(c->x, ns, jv_cstr(c->x, target->name), v);
        return;
    }
    jv *items = jv_iterable_list(c, v); /* a tuple of targets: unpack */
    if ((int)items->u.list.n != target->kids.n)
        jx_fail(c->x, "line %d: %s values to unpack (expected %d, got %zu)", target->line,
                (int)items->u.list.n > target->kids.n ? "too many" : "not enough", target->kids.n, items->u.list.n);
    for (int i = 0; i < target->kids.n; i++) assign(c, s, target->kids.v[i], items->u.list.v[i]);
}

/* loop's attributes: the keys are shared by every iteration of a loop, the values are the iteration's. */
static const char *const k_loop_keys[] = {"index",  "index0",   "revindex", "revindex0", "first",  "last",
                                          "length", "previtem", "nextitem", "depth",     "depth0", "cycle"};
enum { N_LOOP_KEYS = (int)(sizeof k_loop_keys / sizeof k_loop_keys[0]) };

static jv *loop_object(jctx *c, jv **keys, const jv *items, int64_t i) {
    const int64_t len = (int64_t)items->u.list.n;
    jv *loop = jv_dict(c->x);
    jv **vals = jx_alloc(c->x, N_LOOP_KEYS * sizeof *vals);
    jv *cycle = jv_new(c->x, JV_FUNC);
    cycle->u.fn.fk = JF_GLOBAL, cycle->u.fn.name = "loop.cycle", cycle->u.fn.self = jv_int(c->x, i);
    jv *const v[N_LOOP_KEYS] = {
        jv_int(c->x, i + 1),
        cycle->u.fn.self,
        jv_int(c->x, len - i),
        jv_int(c->x, len - i - 1),
        jv_bool(c->x, i == 0),
        jv_bool(c->x, i == len - 1),
        jv_int(c->x, len),
        i > 0 ? items->u.list.v[i - 1] : jv_undef(c->x, "there is no previous item"),
        i < len - 1 ? items->u.list.v[i + 1] : jv_undef(c->x, "there is no next item"),
        jv_int(c->x, 1),
        jv_int(c->x, 0),
        cycle,
    };
    memcpy(vals, v, sizeof v);
    loop->u.dict.keys = keys, loop->u.dict.vals = vals;
    loop->u.dict.n = loop->u.dict.cap = N_LOOP_KEYS;
    return loop;
}

static void exec_for(jctx *c, jscope *s, const jnode *n) {
    jv *iter = eval(c, s, n->b);
    jv *items = jv_iterable_list(c, iter);
    if (n->c) { /* for x in y if cond: filtered first, so loop.length and loop.last count what is kept */
        jv *kept = jv_list(c->x, items->u.list.n);
        size_t k = 0;
        for (size_t i = 0; i < items->u.list.n; i++) {
            jctx_tick(c);
            jscope *t = scope_new(c, s);
            assign(c, t, n->a, items->u.list.v[i]);
            if (jv_truthy(eval(c, t, n->c))) kept->u.list.v[k++] = items->u.list.v[i];
        }
        kept->u.list.n = k;
        items = kept;
    }
    const int64_t len = (int64_t)items->u.list.n;
    jv **keys = jx_alloc(c->x, N_LOOP_KEYS * sizeof *keys);
    for (int k = 0; k < N_LOOP_KEYS; k++) keys[k] = jv_cstr(c->x, k_loop_keys[k]);
    for (int64_t i = 0; i < len; i++) {
        jctx_tick(c);
        jscope *t = scope_new(c, s);
        jv *loop = loop_object(c, keys, items, i);
        scope_set(c, t, "loop", loop);
        assign(c, t, n->a, items->u.list.v[i]);
        exec_body(c, t, &n->kids);
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
    if (len == 0) exec_body(c, s, &n->kids2);
}

static jv *capture(jctx *c, jscope *s, const jnodes *body) {
    jbuf out, *saved = c->out;
    jb_init(&out, c->x);
    out.limit = c->max_output;
    c->out = &out;
    exec_body(c, s, body);
    c->out = saved;
    return jv_str_own(c->x, out.p ? out.p : "", out.n);
}

static void exec_node(jctx *c, jscope *s, const jnode *n) {
    switch (n->kind) {
    case N_TEXT: jb_put(c->out, n->lit->u.str.s, n->lit->u.str.n); return;
    case N_OUTPUT: jv_write_str(c->x, c->out, eval(c, s, n->a)); return;
    case N_IF: exec_body(c, s, jv_truthy(eval(c, s, n->a)) ? &n->kids : &n->kids2); return;
    case N_FOR: exec_for(c, s, n); return;
    case N_SET: assign(c, s, n->a, eval(c, s, n->b)); return;
    case N_SET_BLOCK: scope_set(c, s, n->name, capture(c, s, &n->kids)); return;
    case N_MACRO: {
        jv *f = jv_new(c->x, JV_FUNC);
        f->u.fn.fk = JF_MACRO, f->u.fn.name = n->name, f->u.fn.macro = n, f->u.fn.closure = s;
        scope_set(c, s, n->name, f);
        return;
    }
    case N_BREAK: c->loop_ctl = 1; return;
    case N_CONTINUE: c->loop_ctl = 2; return;
    case N_FILTER_BLOCK: {
        jv *v = capture(c, s, &n->kids);
        const jnode *chain[32];
        int k = 0;
        for (const jnode *f = n->a; f && k < 32; f = f->a) chain[k++] = f;
        while (k-- > 0) {
            jargs a;
            eval_args(c, s, chain[k], &a);
            jv *out = NULL;
            if (!jinja_filter(c, chain[k]->name, v, &a, &out))
                jx_fail(c->x, "line %d: unknown filter '%s'", n->line, chain[k]->name);
            v = out;
        }
        jv_write_str(c->x, c->out, v);
        return;
    }
    case N_WITH: {
        jscope *t = scope_new(c, s);
        for (int i = 0; i < n->nstrs; i++) scope_set(c, t, n->strs[i], eval(c, s, n->kids2.v[i]));
        exec_body(c, t, &n->kids);
        return;
    }
    case N_BODY: exec_body(c, s, &n->kids); return;
    default: jx_fail(c->x, "line %d: not a statement", n->line);
    }
}

static void exec_body(jctx *c, jscope *s, const jnodes *body) {
    for (int i = 0; i < body->n && !c->loop_ctl; i++) exec_node(c, s, body->v[i]);
}

/* ---- the public entry points ---- */

struct jinja_template {
    jx x;
    jnodes body;
};

fm_status jinja_parse(const char *src, size_t n, jinja_template **out, fm_error *err) {
    *out = NULL;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    jmp_buf jump;
    t->x.jump = &jump;
    t->x.cap = 64u << 20;
    if (setjmp(jump)) {
        fm_status st = strstr(t->x.msg, "not supported") ? FM_ERR_UNSUPPORTED : FM_ERR_FORMAT;
        fm_fail(err, st, "%s", t->x.msg);
        jx_release(&t->x);
        free(t);
        return st;
    }
    t->body = jinja_parse_body(&t->x, src, n);
    t->x.jump = NULL;
    *out = t;
    return FM_OK;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    jx_release(&t->x);
    free(t);
}

fm_status jinja_render(const jinja_template *t, const cJSON *vars, const jinja_limits *limits, char **text,
                       jinja_fail *kind, fm_error *err) {
    *text = NULL;
    if (kind) *kind = JINJA_OK;
    const jinja_limits lim = limits ? *limits : (jinja_limits){0};
    jx x = {.cap = lim.max_memory ? lim.max_memory : 256u << 20};
    jmp_buf jump;
    x.jump = &jump;
    if (setjmp(jump)) {
        fm_fail(err, FM_ERR_USAGE, "%s", x.msg);
        if (kind) *kind = x.kind;
        jx_release(&x);
        return FM_ERR_USAGE;
    }
    jctx c = {.x = &x,
              .max_iterations = lim.max_iterations ? lim.max_iterations : 1000000,
              .max_depth = lim.max_depth ? lim.max_depth : 64,
              .max_output = lim.max_output ? lim.max_output : 16u << 20,
              .now = lim.now ? lim.now : time(NULL)};
    c.globals = vars && cJSON_IsObject(vars) ? jv_from_cjson(&x, vars) : jv_dict(&x);
    c.root = scope_new(&c, NULL);
    jbuf out;
    jb_init(&out, &x);
    out.limit = c.max_output;
    c.out = &out;
    exec_body(&c, c.root, &t->body);
    char *s = malloc(out.n + 1);
    if (!s) jx_fail(&x, "out of memory");
    if (out.n) memcpy(s, out.p, out.n);
    s[out.n] = 0;
    jx_release(&x);
    *text = s;
    return FM_OK;
}
