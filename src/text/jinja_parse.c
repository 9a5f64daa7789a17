/* The Jinja parser: tokens to a syntax tree, with jinja2's grammar and operator precedence
 * (loosest first): "x if c else y", or, and, not, comparisons and in, + -, ~, * / // %, **, unary - +,
 * then postfix .attr [item] (call) and the filters "|f" and tests "is t" that bind to the operand before them. */
#include <string.h>

#include "text/jinja_lex.h"

typedef struct parser {
    jx *x;
    jtoks t;
    int pos;
    int depth; /* expression nesting, bounded so hostile input cannot exhaust the stack */
} parser;

enum { MAX_NESTING = 200 };

static jtok *cur(parser *P) { return &P->t.v[P->pos]; }
static jtok *peek(parser *P, int k) { return &P->t.v[P->pos + k < P->t.n ? P->pos + k : P->t.n - 1]; }
static void next(parser *P) {
    if (P->pos < P->t.n - 1) P->pos++;
}
static bool is_op(parser *P, const char *op) { return cur(P)->kind == T_OP && strcmp(cur(P)->s, op) == 0; }
static bool is_name(parser *P, const char *name) { return cur(P)->kind == T_NAME && strcmp(cur(P)->s, name) == 0; }

static const char *tok_desc(jtok *t) {
    switch (t->kind) {
    case T_EOF: return "the end of the template";
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME:
    case T_OP: return t->s;
    case T_STRING: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    }
    return "?";
}

_Noreturn static void fail_at(parser *P, const char *expected) {
    jx_fail(P->x, "line %d: expected %s, found %s", cur(P)->line, expected, tok_desc(cur(P)));
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char what[16] = "'";
        strncat(what, op, 8);
        strcat(what, "'");
        fail_at(P, what);
    }
    next(P);
}

static const char *expect_name(parser *P) {
    if (cur(P)->kind != T_NAME) fail_at(P, "a name");
    const char *s = cur(P)->s;
    next(P);
    return s;
}

static void expect_block_end(parser *P) {
    if (cur(P)->kind != T_BLOCK_END) fail_at(P, "'%}'");
    next(P);
}

static jnode *mk(parser *P, jnode_kind k) {
    jnode *n = jx_alloc(P->x, sizeof *n);
    n->kind = k;
    n->line = cur(P)->line;
    return n;
}

static void push_str(parser *P, jnode *n, const char *s) {
    const char **v = jx_alloc(P->x, (size_t)(n->nstrs + 1) * sizeof *v);
    if (n->nstrs) memcpy(v, n->strs, (size_t)n->nstrs * sizeof *v);
    v[n->nstrs++] = s;
    n->strs = v;
}

static jnode *parse_expression(parser *P, bool with_condexpr);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_or(parser *P);

/* (a, b=c, ...) after the "(": positional into kids, keywords into strs/kids2. */
static void parse_call_args(parser *P, jnode *n) {
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (n->kids.n || n->nstrs) expect_op(P, ",");
        if (is_op(P, ")")) break;
        if (is_op(P, "*") || is_op(P, "**"))
            jx_fail(P->x, "line %d: *args and **kwargs in calls are not supported", cur(P)->line);
        if (cur(P)->kind == T_NAME && peek(P, 1)->kind == T_OP && strcmp(peek(P, 1)->s, "=") == 0) {
            push_str(P, n, cur(P)->s);
            next(P), next(P);
            jnodes_push(P->x, &n->kids2, parse_expression(P, true));
        } else {
            if (n->nstrs) jx_fail(P->x, "line %d: a positional argument follows a keyword argument", cur(P)->line);
            jnodes_push(P->x, &n->kids, parse_expression(P, true));
        }
    }
    next(P);
}

static jnode *lit(parser *P, jv *v) {
    jnode *n = mk(P, E_LIT);
    n->lit = v;
    return n;
}

static jnode *parse_primary(parser *P) {
    jtok *t = cur(P);
    switch (t->kind) {
    case T_NAME: {
        next(P);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) return lit(P, jv_bool(P->x, true));
        if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) return lit(P, jv_bool(P->x, false));
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) return lit(P, jv_none());
        jnode *n = mk(P, E_NAME);
        n->line = t->line;
        n->name = t->s;
        return n;
    }
    case T_STRING: {
        jbuf b;
        jb_init(&b, P->x);
        while (cur(P)->kind == T_STRING) jb_put(&b, cur(P)->s, cur(P)->n), next(P);
        return lit(P, jv_str_own(P->x, b.p ? b.p : "", b.n));
    }
    case T_INT: next(P); return lit(P, jv_int(P->x, t->i));
    case T_FLOAT: next(P); return lit(P, jv_float(P->x, t->f));
    case T_OP:
        if (is_op(P, "(")) {
            next(P);
            if (is_op(P, ")")) {
                next(P);
                jnode *n = mk(P, E_TUPLE);
                return n;
            }
            jnode *e = parse_expression(P, true);
            if (is_op(P, ",")) {
                jnode *n = mk(P, E_TUPLE);
                jnodes_push(P->x, &n->kids, e);
                while (is_op(P, ",")) {
                    next(P);
                    if (is_op(P, ")")) break;
                    jnodes_push(P->x, &n->kids, parse_expression(P, true));
                }
                e = n;
            }
            expect_op(P, ")");
            return e;
        }
        if (is_op(P, "[")) {
            jnode *n = mk(P, E_LIST);
            next(P);
            while (!is_op(P, "]")) {
                if (n->kids.n) expect_op(P, ",");
                if (is_op(P, "]")) break;
                jnodes_push(P->x, &n->kids, parse_expression(P, true));
            }
            next(P);
            return n;
        }
        if (is_op(P, "{")) {
            jnode *n = mk(P, E_DICT);
            next(P);
            while (!is_op(P, "}")) {
                if (n->kids.n) expect_op(P, ",");
                if (is_op(P, "}")) break;
                jnodes_push(P->x, &n->kids, parse_expression(P, true));
                expect_op(P, ":");
                jnodes_push(P->x, &n->kids2, parse_expression(P, true));
            }
            next(P);
            return n;
        }
        break;
    default: break;
    }
    fail_at(P, "an expression");
}

static jnode *parse_subscript(parser *P, jnode *obj) {
    const int line = cur(P)->line;
    next(P); /* [ */
    jnode *start = NULL;
    if (!is_op(P, ":")) {
        start = parse_expression(P, true);
        if (is_op(P, "]")) {
            next(P);
            jnode *n = mk(P, E_ITEM);
            n->line = line, n->a = obj, n->b = start;
            return n;
        }
    }
    jnode *n = mk(P, E_SLICE);
    n->line = line, n->a = obj, n->b = start;
    expect_op(P, ":");
    if (!is_op(P, "]") && !is_op(P, ":")) n->c = parse_expression(P, true);
    if (is_op(P, ":")) {
        next(P);
        if (!is_op(P, "]")) n->d = parse_expression(P, true);
    }
    expect_op(P, "]");
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        if (is_op(P, ".")) {
            next(P);
            jnode *a;
            if (cur(P)->kind == T_INT) {
                a = mk(P, E_ITEM);
                a->b = lit(P, jv_int(P->x, cur(P)->i));
                next(P);
            } else {
                a = mk(P, E_ATTR);
                a->name = expect_name(P);
            }
            a->a = n;
            n = a;
        } else if (is_op(P, "[")) {
            n = parse_subscript(P, n);
        } else if (is_op(P, "(")) {
            jnode *c = mk(P, E_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else return n;
    }
}

static jnode *parse_filter(parser *P, jnode *obj) {
    jnode *f = mk(P, E_FILTER);
    f->a = obj;
    f->name = expect_name(P);
    while (is_op(P, ".")) { /* dotted filter names */
        next(P);
        jbuf b;
        jb_init(&b, P->x);
        jb_str(&b, f->name), jb_char(&b, '.'), jb_str(&b, expect_name(P));
        f->name = b.p;
    }
    if (is_op(P, "(")) parse_call_args(P, f);
    return f;
}

static jnode *parse_filter_expr(parser *P, jnode *n) {
    for (;;) {
        if (is_op(P, "|")) {
            next(P);
            n = parse_filter(P, n);
        } else if (is_name(P, "is")) {
            next(P);
            jnode *t = mk(P, E_TEST);
            t->a = n;
            if (is_name(P, "not")) t->neg = true, next(P);
            t->name = expect_name(P);
            while (is_op(P, ".")) { /* dotted test names, as for filters */
                next(P);
                jbuf b;
                jb_init(&b, P->x);
                jb_str(&b, t->name), jb_char(&b, '.'), jb_str(&b, expect_name(P));
                t->name = b.p;
            }
            if (is_op(P, "(")) parse_call_args(P, t);
            else if ((cur(P)->kind == T_NAME || cur(P)->kind == T_STRING || cur(P)->kind == T_INT ||
                      cur(P)->kind == T_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
                     !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) jx_fail(P->x, "line %d: you cannot chain multiple tests with is", t->line);
                jnodes_push(P->x, &t->kids, parse_postfix(P, parse_primary(P)));
            }
            n = t;
        } else if (is_op(P, "(")) {
            jnode *c = mk(P, E_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else return n;
    }
}

static jnode *parse_unary(parser *P, bool with_filter) {
    if (++P->depth > MAX_NESTING) jx_fail(P->x, "line %d: expressions nested too deeply", cur(P)->line);
    jnode *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        n = mk(P, is_op(P, "-") ? E_NEG : E_POS);
        next(P);
        n->a = parse_unary(P, false);
    } else n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *bin(parser *P, const char *op, jnode *a, jnode *b) {
    jnode *n = mk(P, E_BIN);
    n->name = op, n->a = a, n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, true);
    while (is_op(P, "**")) next(P), n = bin(P, "**", n, parse_unary(P, true));
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    while (is_op(P, "*") || is_op(P, "/") || is_op(P, "//") || is_op(P, "%")) {
        const char *op = cur(P)->s;
        next(P);
        n = bin(P, op, n, parse_pow(P));
    }
    return n;
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    if (!is_op(P, "~")) return n;
    jnode *c = mk(P, E_CONCAT);
    jnodes_push(P->x, &c->kids, n);
    while (is_op(P, "~")) next(P), jnodes_push(P->x, &c->kids, parse_math2(P));
    return c;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    while (is_op(P, "+") || is_op(P, "-")) {
        const char *op = cur(P)->s;
        next(P);
        n = bin(P, op, n, parse_concat(P));
    }
    return n;
}

static jnode *parse_compare(parser *P) {
    jnode *first = parse_math1(P), *cmp = NULL;
    for (;;) {
        const char *op = NULL;
        if (cur(P)->kind == T_OP &&
            (is_op(P, "==") || is_op(P, "!=") || is_op(P, "<") || is_op(P, "<=") || is_op(P, ">") || is_op(P, ">=")))
            op = cur(P)->s, next(P);
        else if (is_name(P, "in")) op = "in", next(P);
        else if (is_name(P, "not") && peek(P, 1)->kind == T_NAME && strcmp(peek(P, 1)->s, "in") == 0)
            op = "not in", next(P), next(P);
        if (!op) break;
        if (!cmp) {
            cmp = mk(P, E_CMP);
            cmp->a = first;
        }
        push_str(P, cmp, op);
        jnodes_push(P->x, &cmp->kids, parse_math1(P));
    }
    return cmp ? cmp : first;
}

static jnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        jnode *n = mk(P, E_NOT);
        next(P);
        if (++P->depth > MAX_NESTING) jx_fail(P->x, "line %d: expressions nested too deeply", n->line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (is_name(P, "and")) {
        jnode *a = mk(P, E_AND);
        next(P);
        a->a = n, a->b = parse_not(P);
        n = a;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (is_name(P, "or")) {
        jnode *o = mk(P, E_OR);
        next(P);
        o->a = n, o->b = parse_and(P);
        n = o;
    }
    return n;
}

static jnode *parse_expression(parser *P, bool with_condexpr) {
    if (++P->depth > MAX_NESTING) jx_fail(P->x, "line %d: expressions nested too deeply", cur(P)->line);
    jnode *n = parse_or(P);
    while (with_condexpr && is_name(P, "if")) {
        jnode *c = mk(P, E_COND);
        next(P);
        c->b = n;
        c->a = parse_or(P);
        if (is_name(P, "else")) next(P), c->c = parse_expression(P, true);
        n = c;
    }
    P->depth--;
    return n;
}

/* An expression, or several separated by commas: a tuple. */
static jnode *parse_tuple(parser *P, bool with_condexpr) {
    jnode *e = parse_expression(P, with_condexpr);
    if (!is_op(P, ",")) return e;
    jnode *t = mk(P, E_TUPLE);
    jnodes_push(P->x, &t->kids, e);
    while (is_op(P, ",")) {
        next(P);
        if (cur(P)->kind == T_BLOCK_END || cur(P)->kind == T_VAR_END || is_op(P, "=") || is_name(P, "in")) break;
        jnodes_push(P->x, &t->kids, parse_expression(P, with_condexpr));
    }
    return t;
}

/* An assignment target: a name, ns.attr, or names separated by commas. */
static jnode *parse_target(parser *P, bool allow_attr) {
    jnode *t = NULL;
    bool paren = is_op(P, "(");
    if (paren) next(P);
    for (;;) {
        jnode *n = mk(P, E_NAME);
        n->name = expect_name(P);
        if (allow_attr && is_op(P, ".")) {
            next(P);
            jnode *a = mk(P, E_ATTR);
            a->a = n, a->name = expect_name(P);
            n = a;
        }
        if (!t && !is_op(P, ",")) {
            t = n;
            break;
        }
        if (!t) t = mk(P, E_TUPLE);
        jnodes_push(P->x, &t->kids, n);
        if (!is_op(P, ",")) break;
        next(P);
        if (paren && is_op(P, ")")) break;
    }
    if (paren) expect_op(P, ")");
    return t;
}

/* ---- statements ---- */

static jnodes parse_body(parser *P, const char *const *ends, const char **found);

static bool in_list(const char *s, const char *const *l) {
    for (; l && *l; l++)
        if (!strcmp(s, *l)) return true;
    return false;
}

static jnode *parse_statement(parser *P) {
    const int line = cur(P)->line;
    const char *kw = expect_name(P);
    const char *found = NULL;
    if (!strcmp(kw, "if")) {
        jnode *n = mk(P, N_IF), *top = n;
        n->line = line;
        n->a = parse_tuple(P, true);
        expect_block_end(P);
        for (;;) {
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            n->kids = parse_body(P, ends, &found);
            if (!strcmp(found, "elif")) {
                jnode *e = mk(P, N_IF);
                e->a = parse_tuple(P, true);
                expect_block_end(P);
                jnodes_push(P->x, &n->kids2, e);
                n = e;
                continue;
            }
            if (!strcmp(found, "else")) {
                static const char *const ends2[] = {"endif", NULL};
                expect_block_end(P);
                n->kids2 = parse_body(P, ends2, &found);
            }
            expect_block_end(P);
            return top;
        }
    }
    if (!strcmp(kw, "for")) {
        jnode *n = mk(P, N_FOR);
        n->line = line;
        n->a = parse_target(P, false);
        if (!is_name(P, "in")) fail_at(P, "'in'");
        next(P);
        n->b = parse_tuple(P, false);
        if (is_name(P, "if")) next(P), n->c = parse_expression(P, true);
        if (is_name(P, "recursive")) jx_fail(P->x, "line %d: recursive for loops are not supported", line);
        expect_block_end(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        n->kids = parse_body(P, ends, &found);
        if (!strcmp(found, "else")) {
            static const char *const ends2[] = {"endfor", NULL};
            expect_block_end(P);
            n->kids2 = parse_body(P, ends2, &found);
        }
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "set")) {
        jnode *target = parse_target(P, true);
        if (is_op(P, "=")) {
            next(P);
            jnode *n = mk(P, N_SET);
            n->line = line;
            n->a = target, n->b = parse_tuple(P, true);
            expect_block_end(P);
            return n;
        }
        if (target->kind != E_NAME) fail_at(P, "'='");
        if (is_op(P, "|")) jx_fail(P->x, "line %d: filters on a block set are not supported", line);
        expect_block_end(P);
        jnode *n = mk(P, N_SET_BLOCK);
        n->line = line;
        n->name = target->name;
        static const char *const ends[] = {"endset", NULL};
        n->kids = parse_body(P, ends, &found);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "macro")) {
        jnode *n = mk(P, N_MACRO);
        n->line = line;
        n->name = expect_name(P);
        expect_op(P, "(");
        while (!is_op(P, ")")) {
            if (n->nstrs) expect_op(P, ",");
            push_str(P, n, expect_name(P));
            jnode *def = NULL;
            if (is_op(P, "=")) next(P), def = parse_expression(P, true);
            jnodes_push(P->x, &n->kids2, def);
        }
        next(P);
        expect_block_end(P);
        static const char *const ends[] = {"endmacro", NULL};
        n->kids = parse_body(P, ends, &found);
        if (cur(P)->kind == T_NAME) next(P); /* {% endmacro name %} */
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        jnode *n = mk(P, kw[0] == 'b' ? N_BREAK : N_CONTINUE);
        n->line = line;
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "filter")) {
        jnode *n = mk(P, N_FILTER_BLOCK);
        n->line = line;
        jnode *f = NULL;
        do {
            if (f) next(P);
            f = parse_filter(P, f);
        } while (is_op(P, "|"));
        n->a = f;
        expect_block_end(P);
        static const char *const ends[] = {"endfilter", NULL};
        n->kids = parse_body(P, ends, &found);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "with")) {
        jnode *n = mk(P, N_WITH);
        n->line = line;
        while (cur(P)->kind != T_BLOCK_END) {
            if (n->nstrs) expect_op(P, ",");
            push_str(P, n, expect_name(P));
            expect_op(P, "=");
            jnodes_push(P->x, &n->kids2, parse_expression(P, true));
        }
        expect_block_end(P);
        static const char *const ends[] = {"endwith", NULL};
        n->kids = parse_body(P, ends, &found);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' AssistantTracker: renders its body as it is */
        jnode *n = mk(P, N_BODY);
        expect_block_end(P);
        static const char *const ends[] = {"endgeneration", NULL};
        n->kids = parse_body(P, ends, &found);
        expect_block_end(P);
        return n;
    }
    jx_fail(P->x, "line %d: the '%s' tag is not supported in chat templates", line, kw);
}

static jnodes parse_body(parser *P, const char *const *ends, const char **found) {
    jnodes body = {0};
    for (;;) {
        jtok *t = cur(P);
        if (t->kind == T_EOF) {
            if (ends) { /* name the closing tag: the last of ends ("elif", "else", "endif") */
                const char *const *e = ends;
                while (e[1]) e++;
                jx_fail(P->x, "line %d: the template ends before '{%% %s %%}'", t->line, *e);
            }
            return body;
        }
        if (t->kind == T_TEXT) {
            jnode *n = mk(P, N_TEXT);
            n->lit = jv_str_own(P->x, t->s, t->n);
            jnodes_push(P->x, &body, n);
            next(P);
        } else if (t->kind == T_VAR_BEGIN) {
            next(P);
            jnode *n = mk(P, N_OUTPUT);
            n->a = parse_tuple(P, true);
            if (cur(P)->kind != T_VAR_END) fail_at(P, "'}}'");
            next(P);
            jnodes_push(P->x, &body, n);
        } else if (t->kind == T_BLOCK_BEGIN) {
            jtok *name = peek(P, 1);
            if (name->kind != T_NAME) {
                next(P);
                fail_at(P, "a statement name");
            }
            if (in_list(name->s, ends)) {
                *found = name->s;
                next(P), next(P);
                return body;
            }
            static const char *const closers[] = {"endif",   "endfor",        "endset", "endmacro", "endfilter",
                                                  "endwith", "endgeneration", "elif",   "else",     "endraw",
                                                  NULL};
            if (in_list(name->s, closers))
                jx_fail(P->x, "line %d: unexpected '{%% %s %%}'%s%s", name->line, name->s, ends ? ", expected " : "",
                        ends ? ends[0] : "");
            next(P);
            jnodes_push(P->x, &body, parse_statement(P));
        } else fail_at(P, "text or a tag");
    }
}

/* Unknown filters and tests are errors of the template, as jinja2's compiler makes them, except where jinja2 defers
 * them to when they run: inside an if (its tests and bodies) or a conditional expression, unless a for loop, macro,
 * block set or filter block in between starts a frame of its own. */
static void check_names(jx *x, const jnode *n, bool soft);

static void check_list(jx *x, const jnodes *l, bool soft) {
    for (int i = 0; i < l->n; i++) check_names(x, l->v[i], soft);
}

static void check_names(jx *x, const jnode *n, bool soft) {
    if (!n) return;
    switch (n->kind) {
    case N_IF:
    case E_COND: soft = true; break;
    case N_FOR:
        check_names(x, n->a, soft), check_names(x, n->b, soft);
        check_names(x, n->c, false), check_list(x, &n->kids, false), check_list(x, &n->kids2, false);
        return;
    case N_MACRO:
    case N_SET_BLOCK:
    case N_FILTER_BLOCK:
    case N_BODY: soft = false; break;
    case N_WITH: check_list(x, &n->kids2, soft), check_list(x, &n->kids, false); return;
    case E_FILTER:
        if (!soft && !jinja_filter_known(n->name)) jx_fail(x, "line %d: unknown filter '%s'", n->line, n->name);
        break;
    case E_TEST:
        if (!soft && !jinja_test_known(n->name)) jx_fail(x, "line %d: unknown test '%s'", n->line, n->name);
        break;
    default: break;
    }
    check_names(x, n->a, soft), check_names(x, n->b, soft), check_names(x, n->c, soft), check_names(x, n->d, soft);
    check_list(x, &n->kids, soft), check_list(x, &n->kids2, soft);
}

jnodes jinja_parse_body(jx *x, const char *src, size_t n) {
    parser P = {.x = x, .t = jinja_lex(x, src, n)};
    jnodes body = parse_body(&P, NULL, NULL);
    check_list(x, &body, false);
    return body;
}
