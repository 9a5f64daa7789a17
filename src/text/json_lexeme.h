/* The native lexers of a grammar (grammar_internal.h G_WS, G_STRING, G_NUMBER): byte-at-a-time machines whose state
 * is a few bytes that travel with a matcher stack's top, so string lengths and number bounds are checked exactly
 * without one grammar rule per length or digit.
 *
 * A step returns LEX_DEAD (the byte cannot come here), or a set of LEX_MORE (the lexeme goes on: keep the new state)
 * and LEX_END (the lexeme may end after this byte: the grammar goes on after it). */
#ifndef FM_TEXT_JSON_LEXEME_H
#define FM_TEXT_JSON_LEXEME_H

#include <stdbool.h>
#include <stdint.h>

#include "text/grammar_internal.h"

enum { LEX_DEAD = 0, LEX_MORE = 1, LEX_END = 2 };

/* Caps that keep numbers exact in a double and generation finite. */
#define LEX_MAX_INT_DIGITS 15
#define LEX_MAX_FRAC_DIGITS 15
#define LEX_MAX_EXP_DIGITS 3

typedef struct lex_string {
    uint32_t count; /* characters so far (an escape counts one) */
    uint8_t need;   /* continuation bytes still due in the current character */
    uint8_t lo, hi; /* the range of the next continuation byte */
    uint8_t esc;    /* 0, or inside an escape (lexeme.c names the phases) */
    uint64_t hash;  /* json_lexeme_hash of the raw bytes so far */
} lex_string;

typedef struct lex_number {
    uint8_t phase, neg, n_int, n_frac, n_exp;
    double ival, fval; /* the integer digits, and the fraction digits as an integer */
} lex_number;

typedef union lex_state {
    uint32_t ws; /* whitespace bytes so far */
    lex_string s;
    lex_number n;
} lex_state;

/* The hash of a string's content that key exclusion compares (FNV-1a style over the raw bytes). */
uint64_t json_lexeme_hash_step(uint64_t h, uint8_t b);
uint64_t json_lexeme_hash(const char *s, size_t n);

/* The state a lexeme starts in. */
void lex_init(const fm_grammar *g, const g_elem *e, lex_state *st);
/* One byte into st (updated in place when the result has LEX_MORE). */
int lex_step(const fm_grammar *g, const g_elem *e, lex_state *st, uint8_t b);
/* Whether bytes[0..n) could sit inside any JSON string without ending it or escaping (no '"', no '\\', no control
 * byte, whole well-formed UTF-8 characters): a token the matcher's fast path allows by its character count. */
bool lex_pure_string_chars(const uint8_t *bytes, size_t n, uint32_t *chars);
/* Whether bytes[0..n) can never follow a character boundary inside any JSON string: a byte no string takes (a raw
 * control byte, a bad escape, ill-formed UTF-8) comes before any closing quote. */
bool lex_dead_in_strings(const uint8_t *bytes, size_t n);
/* A string at a character boundary, outside any escape: what the matcher's fast path needs. Its characters left
 * (UINT32_MAX: unbounded). */
bool lex_string_at_boundary(const lex_state *st);
uint32_t lex_string_room(const fm_grammar *g, const g_elem *e, const lex_state *st);

#endif
