/* The Jinja lexer: template text to tokens, with Hugging Face's whitespace rules (trim_blocks, lstrip_blocks)
 * and the "-"/"+" whitespace controls applied here, so the parser sees only what is printed. */
#ifndef FM_TEXT_JINJA_LEX_H
#define FM_TEXT_JINJA_LEX_H

#include "text/jinja_internal.h"

typedef enum jtok_kind {
    T_EOF,
    T_TEXT,        /* literal text (s, n) */
    T_VAR_BEGIN,   /* {{ */
    T_VAR_END,     /* }} */
    T_BLOCK_BEGIN, /* {% */
    T_BLOCK_END,   /* %} */
    T_NAME,
    T_STRING, /* decoded (s, n) */
    T_INT,
    T_FLOAT,
    T_OP, /* s: the operator, NUL-terminated */
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    int line;
    const char *s;
    size_t n;
    int64_t i;
    double f;
} jtok;

typedef struct jtoks {
    jtok *v;
    int n, cap;
} jtoks;

/* Tokenizes src (newlines normalised to "\n", one trailing newline dropped, as jinja2 does). */
jtoks jinja_lex(jx *x, const char *src, size_t n);

#endif
