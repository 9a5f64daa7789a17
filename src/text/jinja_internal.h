/* The Jinja interpreter's shared types: values, the syntax tree, the arena and the error jump (jinja.h).
 *
 * Every allocation of a parse or a render comes from one arena that is freed whole at the end, so errors unwind
 * with longjmp and nothing is reference counted: values are immutable once built (the sandbox forbids mutating
 * methods), except a namespace's attributes. */
#ifndef FM_TEXT_JINJA_INTERNAL_H
#define FM_TEXT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"
#include "util/status.h"

/* ---- arena and failure ---- */

typedef struct jchunk jchunk;

typedef struct jx {
    jchunk *chunks;
    size_t used, cap; /* bytes taken from the system, the limit (0: none) */
    jmp_buf *jump;    /* where jx_fail lands */
    jinja_fail kind;
    char msg[700];
} jx;

void *jx_alloc(jx *x, size_t n); /* zeroed, 16-byte aligned; fails with "memory limit" past cap */
void jx_release(jx *x);
_Noreturn void jx_fail(jx *x, const char *fmt, ...) FM_PRINTF(2, 3);
_Noreturn void jx_raise(jx *x, const char *msg, size_t n); /* raise_exception: the message as given */
char *jx_strndup(jx *x, const char *s, size_t n);

/* A growable byte string in the arena (old buffers stay until the arena goes). limit 0: unbounded. */
typedef struct jbuf {
    jx *x;
    char *p;
    size_t n, cap, limit;
} jbuf;

void jb_init(jbuf *b, jx *x);
void jb_put(jbuf *b, const char *s, size_t n);
void jb_str(jbuf *b, const char *s);
void jb_char(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) FM_PRINTF(2, 3);

/* ---- values ---- */

typedef enum jv_kind {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* also a tuple (tuple flag: printed with parentheses) */
    JV_DICT,
    JV_NS,   /* namespace(): a dict whose attributes can be set */
    JV_FUNC, /* a global function, a bound method, a macro or loop.cycle */
} jv_kind;

typedef struct jv jv;
typedef struct jnode jnode;
typedef struct jscope jscope;

typedef enum jfunc_kind { JF_GLOBAL, JF_METHOD, JF_MACRO } jfunc_kind;

struct jv {
    jv_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } str;
        struct {
            jv **v;
            size_t n;
            bool tuple;
        } list;
        struct { /* JV_DICT and JV_NS: insertion order kept */
            jv **keys, **vals;
            size_t n, cap;
        } dict;
        struct {
            jfunc_kind fk;
            const char *name;   /* the global's or method's name */
            jv *self;           /* JF_METHOD: the object */
            const jnode *macro; /* JF_MACRO: the definition */
            jscope *closure;    /* JF_MACRO: the scope it was defined in */
        } fn;
        struct {
            const char *what; /* the message an access to it fails with */
        } undef;
    } u;
};

jv *jv_new(jx *x, jv_kind k);
jv *jv_int(jx *x, int64_t i);
jv *jv_float(jx *x, double f);
jv *jv_bool(jx *x, bool b);
jv *jv_none(void);
jv *jv_undef(jx *x, const char *what);          /* what: the error an access to it reports ("'x' is undefined") */
jv *jv_strn(jx *x, const char *s, size_t n);    /* copies s */
jv *jv_str_own(jx *x, const char *s, size_t n); /* s already lives in the arena */
jv *jv_cstr(jx *x, const char *s);
jv *jv_list(jx *x, size_t n); /* n items, to fill */
jv *jv_dict(jx *x);
void jv_dict_set(jx *x, jv *d, jv *key, jv *val);        /* replaces an equal key in place, else appends */
jv *jv_dict_get(const jv *d, const char *key, size_t n); /* string keys; NULL when absent */
jv *jv_dict_find(const jv *d, const jv *key);

bool jv_truthy(const jv *v);
bool jv_equal(const jv *a, const jv *b);
int jv_compare(jx *x, const jv *a, const jv *b, const char *op); /* <0, 0, >0; a TypeError as Python raises it */
const char *jv_type_name(const jv *v);                           /* Python's: 'str', 'int', 'dict', ... */
bool jv_is_number(const jv *v);                                  /* int, float or bool */
double jv_as_double(const jv *v);

void jv_write_str(jx *x, jbuf *b, const jv *v);  /* Python str(v); an undefined writes "" */
void jv_write_repr(jx *x, jbuf *b, const jv *v); /* Python repr(v) */
void jv_write_float(jbuf *b, double f);          /* Python repr of a float: shortest round-trip */
jv *jv_to_str(jx *x, const jv *v);               /* a JV_STR of str(v) (v itself when it is one) */
_Noreturn void jv_fail_undef(jx *x, const jv *v);

/* UTF-8 code points: count and the byte offset of code point i (clamped to n). */
size_t ju_len(const char *s, size_t n);
size_t ju_offset(const char *s, size_t n, size_t i);

/* JSON: cJSON in, json.dumps out. */
jv *jv_from_cjson(jx *x, const cJSON *j);
typedef struct jjson_opts {
    bool ensure_ascii, sort_keys;
    int indent; /* < 0: none */
    const char *item_sep, *key_sep;
} jjson_opts;
void jv_write_json(jx *x, jbuf *b, const jv *v, const jjson_opts *o, int level);

/* ---- syntax tree ---- */

typedef enum jnode_kind {
    /* statements */
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SET_BLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    N_FILTER_BLOCK,
    N_WITH,
    N_BODY, /* a plain body (generation blocks) */
    /* expressions */
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_BIN,
    E_CMP,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_CONCAT,
} jnode_kind;

typedef struct jnodes {
    jnode **v;
    int n, cap;
} jnodes;

struct jnode {
    jnode_kind kind;
    int line;
    const char *name; /* E_NAME/E_ATTR/E_FILTER/E_TEST/N_MACRO/N_SET_BLOCK: the name; E_BIN: the operator */
    jv *lit;          /* E_LIT */
    jnode *a, *b, *c, *d;
    jnodes kids;       /* bodies, arguments, items, compare operands */
    jnodes kids2;      /* else bodies, keyword argument values, dict values, macro defaults */
    const char **strs; /* keyword argument names, macro parameters, compare operators */
    int nstrs;
    bool neg; /* E_TEST: "is not" */
};

void jnodes_push(jx *x, jnodes *l, jnode *n);

/* The parser's output: the template body. */
jnodes jinja_parse_body(jx *x, const char *src, size_t n);

/* ---- evaluation ---- */

typedef struct jctx jctx;

/* A call's arguments after evaluation. */
typedef struct jargs {
    jv **pos;
    int npos;
    const char **kwn;
    jv **kwv;
    int nkw;
} jargs;

/* Filters and tests (jinja_filters.c): false when name is not one. */
bool jinja_filter(jctx *c, const char *name, jv *v, const jargs *a, jv **out);
bool jinja_test(jctx *c, const char *name, jv *v, const jargs *a, bool *out);
/* Methods of str, dict and list, and the global functions (jinja_methods.c). */
bool jinja_has_method(const jv *obj, const char *name);
jv *jinja_call_method(jctx *c, jv *self, const char *name, const jargs *a);
jv *jinja_call_global(jctx *c, const char *name, const jargs *a);
bool jinja_is_global(const char *name);
jv *jinja_percent_format(jctx *c, jv *fmt, jv *args); /* Python's "fmt % args" */
bool jinja_filter_known(const char *name);
bool jinja_test_known(const char *name);

/* Shared with the filters: */
jx *jctx_x(jctx *c);
jv *jctx_getattr(jctx *c, jv *obj, const char *name, size_t n); /* jinja2's getattr: attribute, then item */
jv *jctx_getitem(jctx *c, jv *obj, jv *key);                    /* jinja2's getitem: item, then attribute */
jv *jctx_call(jctx *c, jv *fn, const jargs *a);
void jctx_tick(jctx *c); /* one loop iteration against the limit */
time_t jctx_now(jctx *c);
jv *jargs_get(const jargs *a, int pos, const char *kw); /* positional pos or keyword kw; NULL when neither */
void jargs_check(jctx *c, const jargs *a, const char *what, int max_pos, const char *const *kws);
jv *jv_iterable_list(jctx *c, jv *v); /* a list of the items iteration yields (dict: keys; str: characters) */

#endif
