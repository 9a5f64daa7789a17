/* The grammar builder (grammar.h): rules as flat element runs, with the first error kept (grammar_internal.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"
#include "util/status.h"

/* Rules, elements or repetitions beyond these are refused: a schema that big is a mistake or an attack. */
#define G_MAX_ELEMS (1 << 22)
#define G_MAX_REPEAT 4096

int32_t g_fail(fm_grammar *g, fm_status st, const char *fmt, ...) {
    if (!g || g->failed) return -1;
    g->failed = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err.msg, sizeof g->err.msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* Grows *p (elements of size sz) to hold n + 1; false (error recorded) when out of memory or over the cap. */
static bool grow(fm_grammar *g, void **p, int32_t *cap, int32_t n, size_t sz) {
    if (n < *cap) return true;
    if (n >= G_MAX_ELEMS)
        return g_fail(g, FM_ERR_USAGE, "the grammar is too large (over %d elements)", G_MAX_ELEMS), false;
    const int32_t c = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q) return g_fail(g, FM_ERR_NOMEM, "out of memory building a grammar"), false;
    *p = q, *cap = c;
    return true;
}

fm_grammar *fm_grammar_new(void) { return calloc(1, sizeof(fm_grammar)); }

void fm_grammar_free(fm_grammar *g) {
    if (!g) return;
    free(g->elems), free(g->alt_rule), free(g->alt_start), free(g->rule_alt), free(g->alt_pos), free(g->sets);
    free(g->strings), free(g->numbers), free(g->excl), free(g);
}

static bool usable(fm_grammar *g) {
    if (!g || g->failed) return false;
    if (g->finished) return g_fail(g, FM_ERR_USAGE, "the grammar is finished: no rule can be added"), false;
    return true;
}

int32_t g_rule_new(fm_grammar *g) { return usable(g) ? g->n_rules++ : -1; }

bool g_add_alt(fm_grammar *g, int32_t r, const g_elem *e, int32_t n) {
    if (!usable(g) || r < 0) return false;
    if (!grow(g, (void **)&g->alt_rule, &g->cap_alts, g->n_alts, sizeof *g->alt_rule)) return false;
    void *q = realloc(g->alt_start, (size_t)g->cap_alts * sizeof *g->alt_start); /* alt_rule's capacity */
    if (!q) return g_fail(g, FM_ERR_NOMEM, "out of memory building a grammar"), false;
    g->alt_start = q;
    for (int32_t i = 0; i <= n; i++)
        if (!grow(g, (void **)&g->elems, &g->cap_elems, g->n_elems + i, sizeof *g->elems)) return false;
    g->alt_rule[g->n_alts] = r, g->alt_start[g->n_alts] = g->n_elems, g->n_alts++;
    if (n) memcpy(g->elems + g->n_elems, e, (size_t)n * sizeof *e);
    g->n_elems += n;
    g->elems[g->n_elems++] = (g_elem){G_END, 0};
    return true;
}

int32_t g_set_add(fm_grammar *g, const g_byteset *s) {
    if (!g || g->failed) return -1;
    for (int32_t i = 0; i < g->n_sets; i++)
        if (!memcmp(&g->sets[i], s, sizeof *s)) return i;
    if (!grow(g, (void **)&g->sets, &g->cap_sets, g->n_sets, sizeof *g->sets)) return -1;
    g->sets[g->n_sets] = *s;
    return g->n_sets++;
}

int32_t g_set_of_byte(fm_grammar *g, uint8_t b) {
    g_byteset s = {{0}};
    s.w[b >> 5] = 1u << (b & 31);
    return g_set_add(g, &s);
}

int32_t g_string_add(fm_grammar *g, const g_string *s) {
    if (!g || g->failed || !grow(g, (void **)&g->strings, &g->cap_strings, g->n_strings, sizeof *s)) return -1;
    g->strings[g->n_strings] = *s;
    return g->n_strings++;
}

int32_t g_number_add(fm_grammar *g, const g_number *n) {
    if (!g || g->failed || !grow(g, (void **)&g->numbers, &g->cap_numbers, g->n_numbers, sizeof *n)) return -1;
    g->numbers[g->n_numbers] = *n;
    return g->n_numbers++;
}

int32_t g_excl_add(fm_grammar *g, uint64_t h) {
    if (!g || g->failed || !grow(g, (void **)&g->excl, &g->cap_excl, g->n_excl, sizeof h)) return -1;
    g->excl[g->n_excl] = h;
    return g->n_excl++;
}

void g_seq_push(fm_grammar *g, g_seq *s, g_kind kind, int32_t arg) {
    if (arg < 0 && kind != G_END) g_fail(g, FM_ERR_USAGE, "a grammar part is missing (an earlier error)");
    if (!g || g->failed || !grow(g, (void **)&s->e, &s->cap, s->n, sizeof *s->e)) return;
    s->e[s->n++] = (g_elem){(uint8_t)kind, arg};
}

void g_seq_bytes(fm_grammar *g, g_seq *s, const char *text, size_t len) {
    for (size_t i = 0; i < len; i++) g_seq_push(g, s, G_BYTES, g_set_of_byte(g, (uint8_t)text[i]));
}

/* A rule of one alternative made of seq (freed). */
static int32_t rule_of(fm_grammar *g, g_seq *s) {
    const int32_t r = g_rule_new(g);
    const bool ok = r >= 0 && g_add_alt(g, r, s->e, s->n);
    free(s->e);
    memset(s, 0, sizeof *s);
    return ok ? r : -1;
}

int32_t fm_grammar_literal_n(fm_grammar *g, const char *text, size_t len) {
    if (!usable(g)) return -1;
    g_seq s = {0};
    g_seq_bytes(g, &s, text, len);
    return rule_of(g, &s);
}

int32_t fm_grammar_literal(fm_grammar *g, const char *text) { return fm_grammar_literal_n(g, text, strlen(text)); }

int32_t fm_grammar_ws(fm_grammar *g) {
    if (!usable(g)) return -1;
    g_seq s = {0};
    g_seq_push(g, &s, G_WS, 0);
    return rule_of(g, &s);
}

int32_t fm_grammar_seq(fm_grammar *g, const int32_t *parts, int32_t n) {
    if (!usable(g)) return -1;
    if (n < 1) return g_fail(g, FM_ERR_USAGE, "fm_grammar_seq needs at least one part");
    g_seq s = {0};
    for (int32_t i = 0; i < n; i++) g_seq_push(g, &s, G_REF, parts[i]);
    return rule_of(g, &s);
}

int32_t fm_grammar_alt(fm_grammar *g, const int32_t *alts, int32_t n) {
    if (!usable(g)) return -1;
    if (n < 1) return g_fail(g, FM_ERR_USAGE, "fm_grammar_alt needs at least one alternative");
    for (int32_t i = 0; i < n; i++)
        if (alts[i] < 0) return g_fail(g, FM_ERR_USAGE, "a grammar part is missing (an earlier error)");
    const int32_t r = g_rule_new(g);
    for (int32_t i = 0; i < n; i++) g_add_alt(g, r, &(g_elem){G_REF, alts[i]}, 1);
    return g->failed ? -1 : r;
}

int32_t fm_grammar_repeat(fm_grammar *g, int32_t part, int32_t sep, int32_t min, int32_t max) {
    if (!usable(g)) return -1;
    if (part < 0 || sep == -1) return g_fail(g, FM_ERR_USAGE, "a grammar part is missing (an earlier error)");
    if (min < 0 || (max >= 0 && max < min) || max < -1)
        return g_fail(g, FM_ERR_USAGE, "a repetition of %d..%d copies", min, max);
    if (min > G_MAX_REPEAT || max > G_MAX_REPEAT)
        return g_fail(g, FM_ERR_USAGE, "a repetition bound over %d (minItems/maxItems too large)", G_MAX_REPEAT);
    if (max == 0) return fm_grammar_literal_n(g, "", 0);
    /* tail(k): up to k more copies, each after a separator (k -1: any number); built from the innermost out so
       that each references the next; the unbounded tail references itself at its end (no stack growth) */
    int32_t tail;
    const g_elem sep_e = {G_REF, sep};
    if (max < 0) {
        tail = g_rule_new(g);
        g_elem e[3];
        int32_t n = 0;
        if (sep >= 0) e[n++] = sep_e;
        e[n++] = (g_elem){G_REF, part}, e[n++] = (g_elem){G_REF, tail};
        g_add_alt(g, tail, e, n);
        g_add_alt(g, tail, NULL, 0);
    } else {
        tail = g_rule_new(g);
        g_add_alt(g, tail, NULL, 0);
        for (int32_t k = 1; k <= max - (min > 0 ? min : 1); k++) {
            const int32_t t = g_rule_new(g);
            g_elem e[3];
            int32_t n = 0;
            if (sep >= 0) e[n++] = sep_e;
            e[n++] = (g_elem){G_REF, part}, e[n++] = (g_elem){G_REF, tail};
            g_add_alt(g, t, e, n);
            g_add_alt(g, t, NULL, 0);
            tail = t;
        }
    }
    /* body: the first copy, min - 1 more with separators, then the tail */
    g_seq s = {0};
    g_seq_push(g, &s, G_REF, part);
    for (int32_t i = 1; i < min; i++) {
        if (sep >= 0) g_seq_push(g, &s, G_REF, sep);
        g_seq_push(g, &s, G_REF, part);
    }
    g_seq_push(g, &s, G_REF, tail);
    const int32_t body = rule_of(g, &s);
    if (min > 0) return body;
    const int32_t r = g_rule_new(g);
    g_add_alt(g, r, &(g_elem){G_REF, body}, 1);
    g_add_alt(g, r, NULL, 0);
    return g->failed ? -1 : r;
}

fm_status fm_grammar_finish(fm_grammar *g, int32_t root, fm_error *err) {
    if (!g) return fm_fail(err, FM_ERR_NOMEM, "out of memory building a grammar");
    if (!g->failed && g->finished) g_fail(g, FM_ERR_USAGE, "the grammar is finished already");
    if (!g->failed && (root < 0 || root >= g->n_rules)) g_fail(g, FM_ERR_USAGE, "the grammar has no root rule");
    if (g->failed) {
        if (err) *err = g->err;
        return g->failed;
    }
    g->rule_alt = calloc((size_t)g->n_rules + 1, sizeof *g->rule_alt);
    g->alt_pos = malloc(((size_t)g->n_alts + 1) * sizeof *g->alt_pos);
    if (!g->rule_alt || !g->alt_pos) return fm_fail(err, FM_ERR_NOMEM, "out of memory building a grammar");
    /* counting sort of the alternatives by rule, stable (alternatives keep their order) */
    for (int32_t a = 0; a < g->n_alts; a++) g->rule_alt[g->alt_rule[a] + 1]++;
    for (int32_t r = 0; r < g->n_rules; r++) g->rule_alt[r + 1] += g->rule_alt[r];
    int32_t *fill = malloc(((size_t)g->n_rules + 1) * sizeof *fill);
    if (!fill) return fm_fail(err, FM_ERR_NOMEM, "out of memory building a grammar");
    memcpy(fill, g->rule_alt, (size_t)g->n_rules * sizeof *fill);
    for (int32_t a = 0; a < g->n_alts; a++) g->alt_pos[fill[g->alt_rule[a]]++] = g->alt_start[a];
    free(fill);
    for (int32_t r = 0; r < g->n_rules; r++)
        if (g->rule_alt[r] == g->rule_alt[r + 1])
            return fm_fail(err, FM_ERR_USAGE, "grammar rule %d has no alternative (nothing can match it)", r);
    g->root = root;
    g->finished = true;
    return FM_OK;
}

fm_status fm_grammar_from_json_schema(const cJSON *schema, fm_grammar **out, fm_error *err) {
    fm_grammar *g = fm_grammar_new();
    fm_status st = fm_grammar_finish(g, fm_grammar_json_schema(g, schema), err);
    if (st) fm_grammar_free(g), g = NULL;
    *out = g;
    return st;
}

fm_status fm_grammar_json_object(fm_grammar **out, fm_error *err) {
    fm_grammar *g = fm_grammar_new();
    fm_status st = fm_grammar_finish(g, fm_grammar_json_any_object(g), err);
    if (st) fm_grammar_free(g), g = NULL;
    *out = g;
    return st;
}
