/* Grammars for constrained decoding: what a generated text must look like, as rules over bytes that a token matcher
 * (token_matcher.h) walks against the vocabulary to say which tokens may come next.
 *
 * A grammar is built from rules; each builder call returns the id of a new rule (>= 0) or -1 after an error, and a
 * -1 argument makes the call return -1, so calls chain without checks: the first error is kept and reported by
 * fm_grammar_finish. Typical use, a forced tool call around a JSON Schema value:
 *
 *     fm_grammar *g = fm_grammar_new();
 *     int32_t args = fm_grammar_json_schema(g, parameters_schema);
 *     int32_t parts[] = {fm_grammar_literal(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), args,
 *                        fm_grammar_literal(g, "}\n</tool_call>")};
 *     int32_t call = fm_grammar_seq(g, parts, 3);
 *     fm_status st = fm_grammar_finish(g, fm_grammar_repeat(g, call, fm_grammar_literal(g, "\n"), 1, -1), &err);
 *
 * Whitespace between JSON tokens is optional and bounded (FM_GRAMMAR_MAX_WS bytes of space, tab or newline per gap),
 * so a model cannot loop on spaces; strings, numbers and keys are matched by native lexers (json_lexeme.h). */
#ifndef FM_TEXT_GRAMMAR_H
#define FM_TEXT_GRAMMAR_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"

#define FM_GRAMMAR_MAX_WS 12 /* whitespace bytes per gap between JSON tokens */

typedef struct fm_grammar fm_grammar;

/* An empty grammar under construction; NULL when out of memory (the other calls accept NULL and fail). */
fm_grammar *fm_grammar_new(void);
void fm_grammar_free(fm_grammar *g);

/* The bytes of text, exactly. */
int32_t fm_grammar_literal(fm_grammar *g, const char *text);
int32_t fm_grammar_literal_n(fm_grammar *g, const char *text, size_t len);
/* A JSON value valid against a JSON Schema (json_schema.c lists the subset; anything else is an error naming the
 * keyword and its place, e.g. "JSON Schema #/properties/id: 'pattern' is not supported"). */
int32_t fm_grammar_json_schema(fm_grammar *g, const cJSON *schema);
/* Any JSON object (response_format json_object) / any JSON value. */
int32_t fm_grammar_json_any_object(fm_grammar *g);
int32_t fm_grammar_json_any_value(fm_grammar *g);
/* Optional whitespace: 0..FM_GRAMMAR_MAX_WS bytes of space, tab, newline. */
int32_t fm_grammar_ws(fm_grammar *g);
/* parts[0] then parts[1] ... (n >= 1). */
int32_t fm_grammar_seq(fm_grammar *g, const int32_t *parts, int32_t n);
/* One of alts[0..n) (n >= 1). */
int32_t fm_grammar_alt(fm_grammar *g, const int32_t *alts, int32_t n);
/* min..max copies of part (max -1: unbounded), sep between copies (sep -2: none). */
int32_t fm_grammar_repeat(fm_grammar *g, int32_t part, int32_t sep, int32_t min, int32_t max);
#define FM_GRAMMAR_NO_SEP (-2)

/* Makes root the whole text and freezes the grammar (no builder call after); the first builder error otherwise. */
fm_status fm_grammar_finish(fm_grammar *g, int32_t root, fm_error *err);

/* Shortcuts: a new finished grammar of one JSON Schema value / of any JSON object. *out NULL on error. */
fm_status fm_grammar_from_json_schema(const cJSON *schema, fm_grammar **out, fm_error *err);
fm_status fm_grammar_json_object(fm_grammar **out, fm_error *err);

#endif
