/* The inside of a grammar (grammar.h), shared by its builder (grammar.c), the JSON Schema compiler (json_schema.c),
 * the native lexers (json_lexeme.c) and the matcher (token_matcher.c).
 *
 * Rules are alternatives of element sequences, stored flat: every alternative is a run of elements in elems[]
 * ending with G_END; rule r's alternatives start at alt_pos[rule_alt[r] .. rule_alt[r + 1]). An element is a byte
 * set, a reference to a rule, or a native lexer (whitespace, a JSON string body, a JSON number) whose small state
 * travels with the matcher's stack top. A position in the grammar is an index into elems[]. */
#ifndef FM_TEXT_GRAMMAR_INTERNAL_H
#define FM_TEXT_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "text/grammar.h"

typedef enum g_kind {
    G_END,    /* the end of an alternative: return to the caller */
    G_BYTES,  /* one byte of set arg */
    G_REF,    /* rule arg */
    G_WS,     /* 0..FM_GRAMMAR_MAX_WS whitespace bytes */
    G_STRING, /* a JSON string after its opening quote, through the closing one; arg: strings[] */
    G_NUMBER, /* a JSON number; arg: numbers[] */
} g_kind;

typedef struct g_elem {
    uint8_t kind;
    int32_t arg;
} g_elem;

typedef struct g_byteset {
    uint32_t w[8];
} g_byteset;

static inline bool g_byteset_has(const g_byteset *s, uint8_t b) { return (s->w[b >> 5] >> (b & 31)) & 1u; }

/* A JSON string's constraints, in characters (code points). */
typedef struct g_string {
    uint32_t min_len, max_len;  /* max UINT32_MAX: none */
    bool no_escapes;            /* keys of extra properties: raw characters only, so the exclusion below is exact */
    int32_t excl_start, excl_n; /* hashes (json_lexeme_hash) of contents it must not equal: excl[excl_start..) */
} g_string;

/* A JSON number's constraints. Bounded numbers and integers have no exponent. */
typedef struct g_number {
    bool integer;
    bool has_min, min_excl, has_max, max_excl;
    double min, max;
} g_number;

struct fm_grammar {
    g_elem *elems;
    int32_t n_elems, cap_elems;
    /* alternatives as built: (rule, start) pairs in any order; finish groups them by rule */
    int32_t *alt_rule, *alt_start;
    int32_t n_alts, cap_alts;
    int32_t n_rules;
    int32_t *rule_alt; /* after finish: [n_rules + 1] */
    int32_t *alt_pos;  /* after finish: alternative starts grouped by rule */
    g_byteset *sets;
    int32_t n_sets, cap_sets;
    g_string *strings;
    int32_t n_strings, cap_strings;
    g_number *numbers;
    int32_t n_numbers, cap_numbers;
    uint64_t *excl;
    int32_t n_excl, cap_excl;
    int32_t any_value_rule; /* fm_grammar_json_any_value's rule + 1, built once (0: not yet) */
    int32_t root;           /* after finish */
    bool finished;
    fm_status failed; /* the first error */
    fm_error err;
};

/* Builder internals (grammar.c). A rule is created empty; alternatives are added as element arrays. */
int32_t g_rule_new(fm_grammar *g);
/* Appends an alternative (elements without the G_END) to rule r; false after an error. */
bool g_add_alt(fm_grammar *g, int32_t r, const g_elem *e, int32_t n);
int32_t g_set_of_byte(fm_grammar *g, uint8_t b);
int32_t g_set_add(fm_grammar *g, const g_byteset *s);
int32_t g_string_add(fm_grammar *g, const g_string *s);
int32_t g_number_add(fm_grammar *g, const g_number *n);
int32_t g_excl_add(fm_grammar *g, uint64_t h);
/* Records the first error (later ones are dropped); returns -1. */
int32_t g_fail(fm_grammar *g, fm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An element array under construction (grows by doubling; failures recorded in g). */
typedef struct g_seq {
    g_elem *e;
    int32_t n, cap;
} g_seq;
void g_seq_push(fm_grammar *g, g_seq *s, g_kind kind, int32_t arg);
void g_seq_bytes(fm_grammar *g, g_seq *s, const char *text, size_t len);

#endif
