/* The arena every parse and render allocates from, the error jump, and the arena's growable strings. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

struct jchunk {
    jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_MIN = 64 * 1024 };

void *jx_alloc(jx *x, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jchunk *c = x->chunks;
    if (!c || c->size - c->used < n) {
        size_t size = n > CHUNK_MIN ? n : CHUNK_MIN;
        if (x->cap && x->used + size > x->cap)
            jx_fail(x, "the template used more than the %zu bytes of working memory it is allowed", x->cap);
        c = malloc(sizeof *c + size);
        if (!c) jx_fail(x, "out of memory");
        c->size = size, c->used = 0;
        c->next = x->chunks, x->chunks = c;
        x->used += size;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void jx_release(jx *x) {
    for (jchunk *c = x->chunks, *next; c; c = next) next = c->next, free(c);
    x->chunks = NULL, x->used = 0;
}

void jx_fail(jx *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->msg, sizeof x->msg, fmt, ap);
    va_end(ap);
    x->kind = JINJA_ERROR;
    longjmp(*x->jump, 1);
}

void jx_raise(jx *x, const char *msg, size_t n) {
    if (n >= sizeof x->msg) n = sizeof x->msg - 1;
    memcpy(x->msg, msg, n);
    x->msg[n] = 0;
    x->kind = JINJA_RAISED;
    longjmp(*x->jump, 1);
}

char *jx_strndup(jx *x, const char *s, size_t n) {
    char *p = jx_alloc(x, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

void jb_init(jbuf *b, jx *x) { *b = (jbuf){.x = x}; }

void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->limit && b->n + n > b->limit)
        jx_fail(b->x, "the rendered text is longer than the %zu bytes allowed", b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = jx_alloc(b->x, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_str(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_char(jbuf *b, char c) { jb_put(b, &c, 1); }

void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = jx_alloc(b->x, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jb_put(b, big, (size_t)n);
}

void jnodes_push(jx *x, jnodes *l, jnode *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jnode **v = jx_alloc(x, (size_t)cap * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = n;
}
