/* Whitespace, JSON strings and JSON numbers as byte machines (json_lexeme.h). */
#include <math.h>
#include <string.h>

#include "text/json_lexeme.h"

uint64_t json_lexeme_hash_step(uint64_t h, uint8_t b) { return (h ^ b) * 0x100000001b3ull; }

uint64_t json_lexeme_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = json_lexeme_hash_step(h, (uint8_t)s[i]);
    return h;
}

/* string escape phases: after '\', then the four hex digits of \uXXXX; U+D800..DFFF (surrogates) are refused so
   that every escape is one character and minLength/maxLength count exactly */
enum { ESC_NONE, ESC_START, ESC_HEX1, ESC_HEX2, ESC_HEX2_D, ESC_HEX3, ESC_HEX4 };

/* number phases */
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

void lex_init(const fm_grammar *g, const g_elem *e, lex_state *st) {
    (void)g;
    memset(st, 0, sizeof *st);
    if (e->kind == G_STRING) st->s.hash = 0xcbf29ce484222325ull, st->s.lo = 0x80, st->s.hi = 0xbf;
}

static bool is_hex(uint8_t b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

static int string_step(const g_string *p, const uint64_t *excl, lex_string *s, uint8_t b) {
    if (s->need) { /* inside a multi-byte character */
        if (b < s->lo || b > s->hi) return LEX_DEAD;
        s->need--, s->lo = 0x80, s->hi = 0xbf;
        s->hash = json_lexeme_hash_step(s->hash, b);
        return LEX_MORE;
    }
    switch (s->esc) {
    case ESC_NONE: break;
    case ESC_START:
        if (b == 'u') s->esc = ESC_HEX1;
        else if (strchr("\"\\/bfnrt", b) && b) s->esc = ESC_NONE;
        else return LEX_DEAD;
        return LEX_MORE;
    case ESC_HEX1:
        if (!is_hex(b)) return LEX_DEAD;
        s->esc = (b == 'd' || b == 'D') ? ESC_HEX2_D : ESC_HEX2;
        return LEX_MORE;
    case ESC_HEX2_D:
        if (!(b >= '0' && b <= '7')) return LEX_DEAD;
        s->esc = ESC_HEX3;
        return LEX_MORE;
    case ESC_HEX2:
    case ESC_HEX3:
    case ESC_HEX4:
        if (!is_hex(b)) return LEX_DEAD;
        s->esc = s->esc == ESC_HEX2 ? ESC_HEX3 : s->esc == ESC_HEX3 ? ESC_HEX4 : ESC_NONE;
        return LEX_MORE;
    default: return LEX_DEAD;
    }
    if (b == '"') {
        if (s->count < p->min_len) return LEX_DEAD;
        for (int32_t i = 0; i < p->excl_n; i++)
            if (excl[p->excl_start + i] == s->hash) return LEX_DEAD;
        return LEX_END;
    }
    if (b < 0x20 || s->count >= p->max_len) return LEX_DEAD;
    if (b == '\\') {
        if (p->no_escapes) return LEX_DEAD;
        s->esc = ESC_START;
    } else if (b >= 0x80) { /* a lead byte: the ranges of well-formed UTF-8 (no overlong forms, no surrogates) */
        if (b >= 0xc2 && b <= 0xdf) s->need = 1;
        else if (b >= 0xe0 && b <= 0xef) s->need = 2, s->lo = b == 0xe0 ? 0xa0 : 0x80, s->hi = b == 0xed ? 0x9f : 0xbf;
        else if (b >= 0xf0 && b <= 0xf4) s->need = 3, s->lo = b == 0xf0 ? 0x90 : 0x80, s->hi = b == 0xf4 ? 0x8f : 0xbf;
        else return LEX_DEAD;
    }
    s->count++;
    s->hash = json_lexeme_hash_step(s->hash, b);
    return LEX_MORE;
}

/* Whether [a, b] (closed ends where the flags say) meets the number's bounds. */
static bool meets(const g_number *p, double a, bool a_in, double b, bool b_in) {
    double lo = a, hi = b;
    bool lo_in = a_in, hi_in = b_in;
    if (p->has_min) {
        if (p->min > lo) lo = p->min, lo_in = !p->min_excl;
        else if (p->min == lo) lo_in = lo_in && !p->min_excl;
    }
    if (p->has_max) {
        if (p->max < hi) hi = p->max, hi_in = !p->max_excl;
        else if (p->max == hi) hi_in = hi_in && !p->max_excl;
    }
    return lo < hi || (lo == hi && lo_in && hi_in);
}

/* Values [a, b) of the magnitude, signed: whether some meets the bounds. */
static bool meets_mag(const g_number *p, bool neg, double a, double b, bool b_in) {
    return neg ? meets(p, -b, b_in, -a, true) : meets(p, a, true, b, b_in);
}

/* Whether some completion of the digits so far is within the bounds (only bounded numbers get here: no exponent). */
static bool reachable(const g_number *p, const lex_number *n) {
    const double f = pow(10.0, n->n_frac);
    switch (n->phase) {
    case N_MINUS: return meets_mag(p, true, 0.0, p->integer ? 1e15 - 1 : 1e15, p->integer);
    case N_ZERO: return meets_mag(p, n->neg, 0.0, p->integer ? 0.0 : 1.0, p->integer);
    case N_DOT: return meets_mag(p, n->neg, n->ival, n->ival + 1.0, false);
    case N_FRAC:
        return meets_mag(p, n->neg, n->ival + n->fval / f, n->ival + (n->fval + 1.0) / f,
                         n->n_frac >= LEX_MAX_FRAC_DIGITS);
    case N_INT: /* v, v0..v9, v00..v99, ...: [v 10^j, (v + 1) 10^j) for each digit count still allowed */
        for (int j = 0; j + n->n_int <= LEX_MAX_INT_DIGITS; j++) {
            const double s = pow(10.0, j);
            if (meets_mag(p, n->neg, n->ival * s, p->integer ? (n->ival + 1.0) * s - 1.0 : (n->ival + 1.0) * s,
                          p->integer))
                return true;
        }
        return false;
    default: return true;
    }
}

static bool in_bounds(const g_number *p, const lex_number *n) {
    double v = n->ival + n->fval / pow(10.0, n->n_frac);
    if (n->neg) v = -v;
    if (p->has_min && (v < p->min || (p->min_excl && v == p->min))) return false;
    if (p->has_max && (v > p->max || (p->max_excl && v == p->max))) return false;
    return true;
}

static int number_step(const g_number *p, lex_number *n, uint8_t b) {
    const bool digit = b >= '0' && b <= '9', bounded = p->has_min || p->has_max;
    const bool frac_ok = !p->integer, exp_ok = !p->integer && !bounded;
    lex_number x = *n;
    switch (n->phase) {
    case N_START:
    case N_MINUS:
        if (b == '-' && n->phase == N_START) x.phase = N_MINUS, x.neg = 1;
        else if (b == '0') x.phase = N_ZERO, x.n_int = 1;
        else if (digit) x.phase = N_INT, x.n_int = 1, x.ival = b - '0';
        else return LEX_DEAD;
        break;
    case N_ZERO:
    case N_INT:
        if (digit && n->phase == N_INT && n->n_int < LEX_MAX_INT_DIGITS) x.n_int++, x.ival = x.ival * 10 + (b - '0');
        else if (b == '.' && frac_ok) x.phase = N_DOT;
        else if ((b == 'e' || b == 'E') && exp_ok) x.phase = N_E;
        else return LEX_DEAD;
        break;
    case N_DOT:
    case N_FRAC:
        if (digit && n->n_frac < LEX_MAX_FRAC_DIGITS) x.phase = N_FRAC, x.n_frac++, x.fval = x.fval * 10 + (b - '0');
        else if ((b == 'e' || b == 'E') && exp_ok && n->phase == N_FRAC) x.phase = N_E;
        else return LEX_DEAD;
        break;
    case N_E:
        if (b == '+' || b == '-') x.phase = N_ESIGN;
        else if (digit) x.phase = N_EXP, x.n_exp = 1;
        else return LEX_DEAD;
        break;
    case N_ESIGN:
    case N_EXP:
        if (digit && n->n_exp < LEX_MAX_EXP_DIGITS) x.phase = N_EXP, x.n_exp++;
        else return LEX_DEAD;
        break;
    default: return LEX_DEAD;
    }
    if (bounded && !reachable(p, &x)) return LEX_DEAD;
    const bool complete = x.phase == N_ZERO || x.phase == N_INT || x.phase == N_FRAC || x.phase == N_EXP;
    int r = LEX_MORE;
    if (complete && (!bounded || in_bounds(p, &x))) r |= LEX_END;
    *n = x;
    return r;
}

int lex_step(const fm_grammar *g, const g_elem *e, lex_state *st, uint8_t b) {
    switch (e->kind) {
    case G_WS:
        if (!(b == ' ' || b == '\n' || b == '\t')) return LEX_DEAD;
        st->ws++;
        return st->ws < FM_GRAMMAR_MAX_WS ? (LEX_MORE | LEX_END) : LEX_END;
    case G_STRING: return string_step(&g->strings[e->arg], g->excl, &st->s, b);
    case G_NUMBER: return number_step(&g->numbers[e->arg], &st->n, b);
    default: return LEX_DEAD;
    }
}

bool lex_string_at_boundary(const lex_state *st) { return st->s.need == 0 && st->s.esc == ESC_NONE; }

uint32_t lex_string_room(const fm_grammar *g, const g_elem *e, const lex_state *st) {
    const g_string *p = &g->strings[e->arg];
    return p->max_len == UINT32_MAX ? UINT32_MAX : p->max_len - st->s.count;
}

bool lex_dead_in_strings(const uint8_t *bytes, size_t n) {
    const g_string any = {0, UINT32_MAX, false, 0, 0};
    lex_string s = {0, 0, 0x80, 0xbf, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (bytes[i] == '"' && s.esc == ESC_NONE && s.need == 0) return false; /* the string may close here */
        if (string_step(&any, NULL, &s, bytes[i]) == LEX_DEAD) return true;
    }
    return false;
}

bool lex_pure_string_chars(const uint8_t *bytes, size_t n, uint32_t *chars) {
    const g_string any = {0, UINT32_MAX, true, 0, 0};
    lex_string s = {0, 0, 0x80, 0xbf, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (bytes[i] == '"' || string_step(&any, NULL, &s, bytes[i]) != LEX_MORE) return false;
    *chars = s.count;
    return n > 0 && s.need == 0 && s.esc == ESC_NONE;
}
