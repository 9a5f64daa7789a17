/* response_format and forced tool calls as a constraint on the sampled tokens (chat.h).
 *
 * The grammar: response_format json_object -> any JSON object; json_schema -> a value of its schema; tool_choice
 * required (or a named function) -> one or more call blocks in the template's tool-call format, each naming one of
 * the tools (or the named one) with arguments valid against its parameters. A think-tag model reasons first: the
 * constraint lets the reasoning through untouched (vLLM's default too) and starts at the token after </think>;
 * whitespace may separate the two. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
#include "serve/serve_internal.h"
#include "text/grammar.h"
#include "text/token_matcher.h"

typedef struct chat_constraint {
    fm_grammar *g;
    fm_matcher *m;
    bool reasoning; /* inside the think block: nothing is constrained */
    bool may_think; /* the first token may open a think block */
    bool first;     /* no token yet */
    int32_t think_start, think_end;
} chat_constraint;

static void c_mask(void *user, uint32_t *words, int32_t vocab) {
    chat_constraint *c = user;
    const int32_t nw = (vocab + 31) / 32;
    if (c->reasoning) {
        memset(words, 0xff, (size_t)nw * sizeof *words);
        return;
    }
    fm_matcher_fill_mask(c->m, words);
    if (c->first && c->may_think && c->think_start >= 0) words[c->think_start / 32] |= 1u << (c->think_start % 32);
}

static bool c_accept(void *user, int32_t id) {
    chat_constraint *c = user;
    const bool first = c->first;
    c->first = false;
    if (first && c->may_think && id == c->think_start) {
        c->reasoning = true;
        return true;
    }
    if (c->reasoning) {
        if (id == c->think_end) c->reasoning = false;
        return true;
    }
    return fm_matcher_accept(c->m, id);
}

/* the JSON Schema of a tool's arguments (any object when it has none) */
static int32_t tool_arguments(fm_grammar *g, const cJSON *tool) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "parameters");
    return p ? fm_grammar_json_schema(g, p) : fm_grammar_json_any_object(g);
}

static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

/* one call: {"name": "F", "arguments": ARGS} for each allowed tool, in the format's framing */
static int32_t forced_calls(fm_grammar *g, const chat_req *q) {
    int32_t alts[64], n = 0;
    for (const cJSON *t = q->tools->child; t && n < 64; t = t->next) {
        if (q->choice == TOOL_CHOICE_NAMED && strcmp(tool_name(t), q->named)) continue;
        char head[512];
        cJSON *name = cJSON_CreateString(tool_name(t)); /* the name as a JSON string, escaped */
        char *quoted = cJSON_PrintUnformatted(name);
        snprintf(head, sizeof head, "{\"name\": %s, \"arguments\": ", quoted ? quoted : "\"\"");
        free(quoted);
        cJSON_Delete(name);
        const int32_t parts[] = {fm_grammar_literal(g, head), tool_arguments(g, t), fm_grammar_literal(g, "}")};
        alts[n++] = fm_grammar_seq(g, parts, 3);
    }
    const int32_t object = fm_grammar_alt(g, alts, n);
    const int32_t max = q->parallel ? -1 : 1;
    if (q->tool_fmt == FM_TOOLS_MISTRAL) {
        const int32_t list[] = {fm_grammar_literal(g, "[TOOL_CALLS] ["),
                                fm_grammar_repeat(g, object, fm_grammar_literal(g, ", "), 1, max),
                                fm_grammar_literal(g, "]")};
        return fm_grammar_seq(g, list, 3);
    }
    const int32_t block[] = {fm_grammar_literal(g, "<tool_call>\n"), object, fm_grammar_literal(g, "\n</tool_call>")};
    return fm_grammar_repeat(g, fm_grammar_seq(g, block, 3), fm_grammar_literal(g, "\n"), 1, max);
}

/* response_format's grammar part; -2 when it asks for none (text) */
static int32_t response_format(fm_grammar *g, const cJSON *rf, oa_error *e, int *rc) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) {
        *rc = oa_fail(e, 400, "invalid_request_error", NULL, "response_format",
                      "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
        return -1;
    }
    if (!strcmp(type->valuestring, "text")) return -2;
    if (!strcmp(type->valuestring, "json_object")) return fm_grammar_json_any_object(g);
    if (strcmp(type->valuestring, "json_schema")) {
        *rc = oa_fail(e, 400, "invalid_request_error", NULL, "response_format.type",
                      "'response_format' type '%s' is not one of text, json_object, json_schema", type->valuestring);
        return -1;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(js) || !cJSON_IsObject(schema)) {
        *rc = oa_fail(e, 400, "invalid_request_error", NULL, "response_format.json_schema",
                      "'response_format' json_schema must be {\"name\", \"schema\": {JSON Schema}, \"strict\"}");
        return -1;
    }
    return fm_grammar_json_schema(g, schema);
}

int chat_constraints(srv *s, const cJSON *root, job *j, oa_error *e) {
    chat_req *q = j->chatq;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (cJSON_IsNull(rf)) rf = NULL;
    const bool forced = q->choice == TOOL_CHOICE_REQUIRED || q->choice == TOOL_CHOICE_NAMED;
    if (!rf && !forced) return 0;
    fm_grammar *g = fm_grammar_new();
    int rc = 0;
    int32_t body = -2;
    if (forced) {
        if (rf) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text"))
                rc = oa_fail(e, 400, "invalid_request_error", NULL, "response_format",
                             "'response_format' and a forced 'tool_choice' cannot both shape the reply");
        }
        if (!rc) body = forced_calls(g, q);
    } else body = response_format(g, rf, e, &rc);
    if (rc || body == -2) {
        fm_grammar_free(g);
        return rc;
    }
    const int32_t whole[] = {fm_grammar_ws(g), body};
    fm_error err;
    if (fm_grammar_finish(g, fm_grammar_seq(g, whole, 2), &err)) {
        fm_grammar_free(g);
        return oa_fail(e, 400, "invalid_request_error", NULL, forced ? "tools" : "response_format", "%s", err.msg);
    }
    if (!s->chat_vocab) {
        fm_grammar_free(g);
        return oa_fail(e, 501, "server_error", NULL, NULL, "this server has no tokenizer to constrain the tokens with");
    }
    chat_constraint *c = calloc(1, sizeof *c);
    if (!c) {
        fm_grammar_free(g);
        return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    c->g = g, c->first = true;
    c->think_start = s->chat_think_start, c->think_end = s->chat_think_end;
    c->reasoning = q->opened && c->think_end >= 0;
    c->may_think = q->reasoning_fmt == FM_REASONING_THINK_TAGS && !q->opened && c->think_end >= 0;
    q->constraint = c;
    int32_t ends[16], n_end = 0;
    for (int32_t k = 0; k < s->n_end_ids && n_end < 16; k++) ends[n_end++] = s->end_ids[k];
    if (fm_matcher_create(g, s->chat_vocab, ends, n_end, &c->m, &err))
        return oa_fail(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    j->constraint = (fm_token_constraint){.user = c, .mask = c_mask, .accept = c_accept};
    return 0;
}

void chat_constraint_free(struct chat_req *q) {
    chat_constraint *c = q->constraint;
    if (!c) return;
    fm_matcher_free(c->m);
    fm_grammar_free(c->g);
    free(c);
    q->constraint = NULL;
}
