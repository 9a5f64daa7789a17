/* JSON Schema -> grammar rules (grammar.h fm_grammar_json_schema).
 *
 * The subset (OpenAI's strict mode and more): type (one or an array), object (properties in their order, required,
 * additionalProperties false / true / absent: any other keys with any values after the declared ones), array
 * (items, minItems, maxItems), string (minLength, maxLength, counted in code points), integer and number (minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum, exact), boolean, null, enum, const, anyOf, $ref to "#", "#/$defs/..."
 * or "#/definitions/..." (recursion included), the boolean schemas, and {} (any value). Annotations (description,
 * title, default, examples, $comment, $schema, $id, deprecated, readOnly, writeOnly) are documentation. Any other
 * keyword is an error naming it and where it is, e.g. "JSON Schema #/properties/id: 'pattern' is not supported". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"
#include "text/json_lexeme.h"

#define MAX_DEPTH 64

typedef struct ref_memo {
    const cJSON *node;
    int32_t rule;
} ref_memo;

typedef struct sc {
    fm_grammar *g;
    const cJSON *root;
    ref_memo *refs;
    int32_t n_refs, cap_refs;
    int depth;
} sc;

static const char *const k_annotations[] = {"description", "title",       "default",    "examples", "$comment",
                                            "$schema",     "$id",         "deprecated", "readOnly", "writeOnly",
                                            "$defs",       "definitions", NULL};
static const char *const k_keywords[] = {"type",
                                         "enum",
                                         "const",
                                         "anyOf",
                                         "$ref",
                                         "properties",
                                         "required",
                                         "additionalProperties",
                                         "items",
                                         "minItems",
                                         "maxItems",
                                         "minLength",
                                         "maxLength",
                                         "minimum",
                                         "maximum",
                                         "exclusiveMinimum",
                                         "exclusiveMaximum",
                                         NULL};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

static int32_t fail(sc *c, const char *path, const char *fmt, const char *what) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, what);
    return g_fail(c->g, FM_ERR_USAGE, "JSON Schema %s: %s", path, msg);
}

static int32_t value(sc *c, const cJSON *s, const char *path);

/* a rule of one alternative */
static int32_t seq_rule(fm_grammar *g, g_seq *s) {
    const int32_t r = g_rule_new(g);
    g_add_alt(g, r, s->e, s->n);
    free(s->e);
    memset(s, 0, sizeof *s);
    return g->failed ? -1 : r;
}

/* whitespace, a byte, whitespace: the separators and the colon */
static void push_punct(fm_grammar *g, g_seq *s, char ch) {
    g_seq_push(g, s, G_WS, 0);
    g_seq_push(g, s, G_BYTES, g_set_of_byte(g, (uint8_t)ch));
    g_seq_push(g, s, G_WS, 0);
}

static int32_t punct_rule(fm_grammar *g, char ch) {
    g_seq s = {0};
    push_punct(g, &s, ch);
    return seq_rule(g, &s);
}

/* The exact text of a JSON value (compact). */
static int32_t json_literal(fm_grammar *g, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return g_fail(g, FM_ERR_NOMEM, "out of memory printing a JSON Schema value");
    const int32_t r = fm_grammar_literal(g, t);
    free(t);
    return r;
}

static int32_t string_rule(fm_grammar *g, const g_string *p) {
    g_seq s = {0};
    g_seq_push(g, &s, G_BYTES, g_set_of_byte(g, '"'));
    g_seq_push(g, &s, G_STRING, g_string_add(g, p));
    return seq_rule(g, &s);
}

static int32_t number_rule(fm_grammar *g, const g_number *p) {
    g_seq s = {0};
    g_seq_push(g, &s, G_NUMBER, g_number_add(g, p));
    return seq_rule(g, &s);
}

int32_t fm_grammar_json_any_value(fm_grammar *g) {
    if (!g || g->failed) return -1;
    if (g->any_value_rule) return g->any_value_rule - 1;
    const int32_t any = g_rule_new(g);
    if (any < 0) return -1;
    g->any_value_rule = any + 1;
    const int32_t comma = punct_rule(g, ',');
    /* "key": value */
    g_seq m = {0};
    g_seq_push(g, &m, G_BYTES, g_set_of_byte(g, '"'));
    g_seq_push(g, &m, G_STRING, g_string_add(g, &(g_string){0, UINT32_MAX, false, 0, 0}));
    push_punct(g, &m, ':');
    g_seq_push(g, &m, G_REF, any);
    const int32_t member = seq_rule(g, &m);
    const int32_t obj_parts[] = {fm_grammar_literal(g, "{"), fm_grammar_ws(g),
                                 fm_grammar_repeat(g, member, comma, 0, -1), fm_grammar_ws(g),
                                 fm_grammar_literal(g, "}")};
    const int32_t arr_parts[] = {fm_grammar_literal(g, "["), fm_grammar_ws(g), fm_grammar_repeat(g, any, comma, 0, -1),
                                 fm_grammar_ws(g), fm_grammar_literal(g, "]")};
    const int32_t alts[] = {fm_grammar_seq(g, obj_parts, 5),
                            fm_grammar_seq(g, arr_parts, 5),
                            string_rule(g, &(g_string){0, UINT32_MAX, false, 0, 0}),
                            number_rule(g, &(g_number){0}),
                            fm_grammar_literal(g, "true"),
                            fm_grammar_literal(g, "false"),
                            fm_grammar_literal(g, "null")};
    for (size_t i = 0; i < sizeof alts / sizeof *alts; i++) g_add_alt(g, any, &(g_elem){G_REF, alts[i]}, 1);
    return g->failed ? -1 : any;
}

int32_t fm_grammar_json_any_object(fm_grammar *g) {
    const int32_t any = fm_grammar_json_any_value(g);
    if (any < 0) return -1;
    for (int32_t a = 0; a < g->n_alts; a++) /* the object is the any-value rule's first alternative */
        if (g->alt_rule[a] == any) return g->elems[g->alt_start[a]].arg;
    return g_fail(g, FM_ERR_USAGE, "the any-value rule has no alternative");
}

/* ---- JSON Schema ---- */

static bool number_of(const cJSON *s, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return false;
    *out = v->valuedouble;
    return true;
}

static int32_t count_of(sc *c, const cJSON *s, const char *key, const char *path, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 1e9)
        return fail(c, path, "'%s' must be a non-negative integer", key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int32_t type_string(sc *c, const cJSON *s, const char *path) {
    int64_t lo = 0, hi = -1;
    if (count_of(c, s, "minLength", path, &lo) < 0 || count_of(c, s, "maxLength", path, &hi) < 0) return -1;
    if (hi >= 0 && hi < lo) return fail(c, path, "%s: maxLength is below minLength", "string");
    return string_rule(c->g, &(g_string){(uint32_t)lo, hi < 0 ? UINT32_MAX : (uint32_t)hi, false, 0, 0});
}

static int32_t type_number(sc *c, const cJSON *s, const char *path, bool integer) {
    g_number n = {.integer = integer};
    double x;
    const char *const bools[] = {"exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, bools[i]);
        if (v && !cJSON_IsNumber(v)) return fail(c, path, "'%s' must be a number (draft 6 and later)", bools[i]);
    }
    const char *const nums[] = {"minimum", "maximum"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, nums[i]);
        if (v && !cJSON_IsNumber(v)) return fail(c, path, "'%s' must be a number", nums[i]);
    }
    if (number_of(s, "minimum", &x)) n.has_min = true, n.min = x;
    if (number_of(s, "exclusiveMinimum", &x) && (!n.has_min || x >= n.min)) n.has_min = n.min_excl = true, n.min = x;
    if (number_of(s, "maximum", &x)) n.has_max = true, n.max = x;
    if (number_of(s, "exclusiveMaximum", &x) && (!n.has_max || x <= n.max)) n.has_max = n.max_excl = true, n.max = x;
    const double big = 1e15;
    /* An integer has at most 15 digits here (json_lexeme.h), so a bound beyond them on the far side excludes nothing
     * and is dropped: zod's int() writes +-(2^53 - 1), the safe integers, which every such integer is. */
    if (integer && n.has_min && n.min <= -big) n.has_min = n.min_excl = false;
    if (integer && n.has_max && n.max >= big) n.has_max = n.max_excl = false;
    if ((n.has_min && fabs(n.min) >= big) || (n.has_max && fabs(n.max) >= big))
        return fail(c, path, "bounds of magnitude %s and more are not supported", "1e15");
    if (integer) { /* integer bounds as closed integer bounds */
        if (n.has_min) n.min = n.min_excl && n.min == floor(n.min) ? n.min + 1 : ceil(n.min), n.min_excl = false;
        if (n.has_max) n.max = n.max_excl && n.max == floor(n.max) ? n.max - 1 : floor(n.max), n.max_excl = false;
    }
    if (n.has_min && n.has_max && (n.min > n.max || (n.min == n.max && (n.min_excl || n.max_excl))))
        return fail(c, path, "no %s lies within its bounds", integer ? "integer" : "number");
    return number_rule(c->g, &n);
}

static int32_t type_array(sc *c, const cJSON *s, const char *path) {
    fm_grammar *g = c->g;
    int64_t lo = 0, hi = -1;
    if (count_of(c, s, "minItems", path, &lo) < 0 || count_of(c, s, "maxItems", path, &hi) < 0) return -1;
    if (hi >= 0 && hi < lo) return fail(c, path, "%s: maxItems is below minItems", "array");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    char sub[256];
    snprintf(sub, sizeof sub, "%s/items", path);
    if (items && cJSON_IsArray(items)) return fail(c, sub, "%s (a tuple) is not supported", "'items' as an array");
    const int32_t item = items ? value(c, items, sub) : fm_grammar_json_any_value(g);
    const int32_t parts[] = {fm_grammar_literal(g, "["), fm_grammar_ws(g),
                             fm_grammar_repeat(g, item, punct_rule(g, ','), (int32_t)lo, (int32_t)hi), fm_grammar_ws(g),
                             fm_grammar_literal(g, "]")};
    return fm_grammar_seq(g, parts, 5);
}

/* The key text "name" as JSON writes it. */
static int32_t key_literal(fm_grammar *g, const char *name) {
    cJSON *k = cJSON_CreateString(name);
    const int32_t r = k ? json_literal(g, k) : g_fail(g, FM_ERR_NOMEM, "out of memory");
    cJSON_Delete(k);
    return r;
}

/* Properties in their order, each optional one skippable, then extra keys when allowed:
 *   first(i) = member(i) rest(i+1) | first(i+1) when optional;  rest(i) = , member(i) rest(i+1) | rest(i+1) */
static int32_t type_object(sc *c, const cJSON *s, const char *path) {
    fm_grammar *g = c->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, path, "'%s' must be an object", "properties");
    if (req && !cJSON_IsArray(req)) return fail(c, path, "'%s' must be an array of names", "required");
    if (add && !cJSON_IsBool(add)) {
        if (!cJSON_IsObject(add) || add->child)
            return fail(c, path, "%s is not supported (only true, false or {})", "a schema for 'additionalProperties'");
    }
    const bool extra = !add || !cJSON_IsFalse(add);
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return fail(c, path, "'%s' must be an array of names", "required");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(c, path, "required '%s' is not among the properties", r->valuestring);
    }
    const int32_t n = cJSON_GetArraySize(props), comma = punct_rule(g, ',');
    /* the extra members: "key" : any, keys other than the declared ones, written without escapes */
    int32_t first = fm_grammar_literal_n(g, "", 0), rest = first;
    if (extra) {
        const int32_t excl0 = g->n_excl;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) g_excl_add(g, json_lexeme_hash(p->string, strlen(p->string)));
        g_seq m = {0};
        g_seq_push(g, &m, G_BYTES, g_set_of_byte(g, '"'));
        g_seq_push(g, &m, G_STRING, g_string_add(g, &(g_string){0, UINT32_MAX, true, excl0, g->n_excl - excl0}));
        push_punct(g, &m, ':');
        g_seq_push(g, &m, G_REF, fm_grammar_json_any_value(g));
        const int32_t member = seq_rule(g, &m);
        const int32_t one[] = {
            member, fm_grammar_repeat(g, fm_grammar_seq(g, (int32_t[]){comma, member}, 2), FM_GRAMMAR_NO_SEP, 0, -1)};
        first = fm_grammar_alt(g, (int32_t[]){fm_grammar_seq(g, one, 2), fm_grammar_literal_n(g, "", 0)}, 2);
        rest = fm_grammar_repeat(g, fm_grammar_seq(g, (int32_t[]){comma, member}, 2), FM_GRAMMAR_NO_SEP, 0, -1);
    }
    for (int32_t i = n - 1; i >= 0 && !g->failed; i--) {
        const cJSON *p = cJSON_GetArrayItem(props, i);
        char sub[256];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        bool required = false;
        cJSON_ArrayForEach(r, req) required |= !strcmp(r->valuestring, p->string);
        g_seq m = {0};
        g_seq_push(g, &m, G_REF, key_literal(g, p->string));
        push_punct(g, &m, ':');
        g_seq_push(g, &m, G_REF, value(c, p, sub));
        const int32_t member = seq_rule(g, &m);
        const int32_t f = g_rule_new(g), rr = g_rule_new(g);
        g_add_alt(g, f, (g_elem[]){{G_REF, member}, {G_REF, rest}}, 2);
        g_add_alt(g, rr, (g_elem[]){{G_REF, comma}, {G_REF, member}, {G_REF, rest}}, 3);
        if (!required) g_add_alt(g, f, &(g_elem){G_REF, first}, 1), g_add_alt(g, rr, &(g_elem){G_REF, rest}, 1);
        first = f, rest = rr;
    }
    const int32_t parts[] = {fm_grammar_literal(g, "{"), fm_grammar_ws(g), first, fm_grammar_ws(g),
                             fm_grammar_literal(g, "}")};
    return fm_grammar_seq(g, parts, 5);
}

/* The node a "$ref" names (JSON pointer into the root document: "#", "#/$defs/x", "#/definitions/x", ...). */
static const cJSON *resolve(sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *node = c->root;
    const char *p = ref + 1;
    while (*p == '/' && node) {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p++;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p++;
            else tok[n++] = *p;
        }
        tok[n] = 0;
        node = cJSON_IsArray(node) ? cJSON_GetArrayItem(node, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(node, tok);
    }
    return *p ? NULL : node;
}

static int32_t ref_rule(sc *c, const cJSON *refv, const char *path) {
    if (!cJSON_IsString(refv)) return fail(c, path, "'%s' must be a string", "$ref");
    const cJSON *t = resolve(c, refv->valuestring);
    if (!t) return fail(c, path, "'$ref' %s names nothing in this document", refv->valuestring);
    for (int32_t i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == t) return c->refs[i].rule;
    if (c->n_refs == c->cap_refs) {
        const int32_t cap = c->cap_refs ? 2 * c->cap_refs : 16;
        ref_memo *q = realloc(c->refs, (size_t)cap * sizeof *q);
        if (!q) return g_fail(c->g, FM_ERR_NOMEM, "out of memory");
        c->refs = q, c->cap_refs = cap;
    }
    const int32_t r = g_rule_new(c->g); /* named before its body: recursion refers to it */
    c->refs[c->n_refs++] = (ref_memo){t, r};
    const int32_t body = value(c, t, refv->valuestring);
    g_add_alt(c->g, r, &(g_elem){G_REF, body}, 1);
    return c->g->failed ? -1 : r;
}

static bool has(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k) != NULL; }

/* The value of one named type, with the keywords of that type. */
static int32_t of_type(sc *c, const cJSON *s, const char *type, const char *path) {
    if (!strcmp(type, "string")) return type_string(c, s, path);
    if (!strcmp(type, "integer")) return type_number(c, s, path, true);
    if (!strcmp(type, "number")) return type_number(c, s, path, false);
    if (!strcmp(type, "boolean"))
        return fm_grammar_alt(c->g, (int32_t[]){fm_grammar_literal(c->g, "true"), fm_grammar_literal(c->g, "false")},
                              2);
    if (!strcmp(type, "null")) return fm_grammar_literal(c->g, "null");
    if (!strcmp(type, "object")) return type_object(c, s, path);
    if (!strcmp(type, "array")) return type_array(c, s, path);
    return fail(c, path, "type '%s' is not a JSON Schema type", type);
}

static bool value_has_type(const cJSON *v, const cJSON *types) {
    if (!types) return true;
    const cJSON *t;
    if (cJSON_IsArray(types)) {
        cJSON_ArrayForEach(t, types) if (value_has_type(v, t)) return true;
        return false;
    }
    if (!cJSON_IsString(types)) return false;
    const char *n = types->valuestring;
    if (!strcmp(n, "string")) return cJSON_IsString(v);
    if (!strcmp(n, "number")) return cJSON_IsNumber(v);
    if (!strcmp(n, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(n, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(n, "null")) return cJSON_IsNull(v);
    if (!strcmp(n, "object")) return cJSON_IsObject(v);
    if (!strcmp(n, "array")) return cJSON_IsArray(v);
    return false;
}

static int32_t value(sc *c, const cJSON *s, const char *path) {
    fm_grammar *g = c->g;
    if (g->failed) return -1;
    if (cJSON_IsTrue(s)) return fm_grammar_json_any_value(g);
    if (cJSON_IsFalse(s)) return fail(c, path, "%s: no value is valid", "the schema false");
    if (!cJSON_IsObject(s)) return fail(c, path, "%s", "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH) return fail(c, path, "nested deeper than %s levels", "64");
    const cJSON *k;
    bool other = false; /* keywords beside $ref / anyOf */
    cJSON_ArrayForEach(k, s) {
        if (!k->string) return fail(c, path, "%s", "a schema member has no name");
        if (in_list(k_annotations, k->string)) continue;
        if (!in_list(k_keywords, k->string)) return fail(c, path, "'%s' is not supported", k->string);
        other |= strcmp(k->string, "$ref") && strcmp(k->string, "anyOf");
    }
    c->depth++;
    int32_t out = -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (has(s, "$ref") || has(s, "anyOf")) {
        if (other || (has(s, "$ref") && has(s, "anyOf")))
            out = fail(c, path, "%s beside other keywords is not supported", has(s, "$ref") ? "'$ref'" : "'anyOf'");
        else if (has(s, "$ref")) out = ref_rule(c, cJSON_GetObjectItemCaseSensitive(s, "$ref"), path);
        else {
            const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
            const int32_t n = cJSON_GetArraySize(any);
            if (!cJSON_IsArray(any) || n < 1) out = fail(c, path, "'%s' must be a non-empty array", "anyOf");
            else {
                out = g_rule_new(g);
                for (int32_t i = 0; i < n; i++) {
                    char sub[256];
                    snprintf(sub, sizeof sub, "%s/anyOf/%d", path, i);
                    g_add_alt(g, out, &(g_elem){G_REF, value(c, cJSON_GetArrayItem(any, i), sub)}, 1);
                }
            }
        }
    } else if (has(s, "const")) out = json_literal(g, cJSON_GetObjectItemCaseSensitive(s, "const"));
    else if (has(s, "enum")) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum"), *v;
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) < 1)
            out = fail(c, path, "'%s' must be a non-empty array", "enum");
        else {
            out = g_rule_new(g);
            int32_t kept = 0;
            cJSON_ArrayForEach(v, e) if (value_has_type(v, type)) {
                g_add_alt(g, out, &(g_elem){G_REF, json_literal(g, v)}, 1);
                kept++;
            }
            if (!kept) out = fail(c, path, "%s", "no 'enum' value has the schema's type");
        }
    } else if (cJSON_IsString(type)) out = of_type(c, s, type->valuestring, path);
    else if (cJSON_IsArray(type)) {
        const int32_t n = cJSON_GetArraySize(type);
        if (n < 1) out = fail(c, path, "'%s' must not be empty", "type");
        else {
            out = g_rule_new(g);
            const cJSON *t;
            cJSON_ArrayForEach(t, type) {
                if (!cJSON_IsString(t)) {
                    out = fail(c, path, "'%s' must hold type names", "type");
                    break;
                }
                g_add_alt(g, out, &(g_elem){G_REF, of_type(c, s, t->valuestring, path)}, 1);
            }
        }
    } else if (type) out = fail(c, path, "'%s' must be a string or an array of strings", "type");
    else if (has(s, "properties") || has(s, "required") || has(s, "additionalProperties"))
        out = type_object(c, s, path);
    else if (has(s, "items") || has(s, "minItems") || has(s, "maxItems")) out = type_array(c, s, path);
    else if (has(s, "minLength") || has(s, "maxLength")) out = type_string(c, s, path);
    else if (has(s, "minimum") || has(s, "maximum") || has(s, "exclusiveMinimum") || has(s, "exclusiveMaximum"))
        out = type_number(c, s, path, false);
    else out = fm_grammar_json_any_value(g);
    c->depth--;
    return g->failed ? -1 : out;
}

int32_t fm_grammar_json_schema(fm_grammar *g, const cJSON *schema) {
    if (!g || g->failed) return -1;
    if (!schema) return g_fail(g, FM_ERR_USAGE, "JSON Schema: no schema");
    sc c = {.g = g, .root = schema};
    const int32_t r = value(&c, schema, "#");
    free(c.refs);
    return r;
}
