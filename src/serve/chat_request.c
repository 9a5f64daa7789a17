/* A chat request into the template's variables (chat.h).
 *
 * The template sees the conversation in the shape Hugging Face templates expect, as vLLM hands it over: each
 * message's content a string (text parts joined; null as ""), "developer" as "system", an assistant's tool-call
 * arguments as an object when they are a JSON object (templates write them with tojson), tools as the request
 * gives them, and every chat_template_kwargs key as a variable. Every key of a message is either passed on or
 * refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
#include "serve/serve_internal.h"
#include "text/reasoning.h"
#include "text/token_matcher.h"
#include "text/tool_calls.h"
#include "util/status.h"

static int bad_msg(oa_error *e, int i, const char *fmt, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, what);
    return oa_fail(e, 400, "invalid_request_error", NULL, "messages", "messages[%d]: %s", i, msg);
}

/* content: a string, null, or an array of text parts, joined */
static int content_string(const cJSON *c, int i, sbuf *out, oa_error *e) {
    sb_puts(out, "");
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) {
        sb_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return bad_msg(e, i, "%scontent must be a string, null or an array of text parts", "");
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad_msg(e, i,
                           "content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported%s: this "
                           "model reads text",
                           "");
        sb_puts(out, text->valuestring);
    }
    return 0;
}

/* an assistant's tool_calls, checked, with JSON-object arguments parsed */
static int tool_calls_copy(const cJSON *calls, int i, cJSON *msg, oa_error *e) {
    if (!cJSON_IsArray(calls)) return bad_msg(e, i, "tool_calls must be an array%s", "");
    cJSON *out = cJSON_AddArrayToObject(msg, "tool_calls");
    for (const cJSON *c = calls->child; c; c = c->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name) ||
            (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))))
            return bad_msg(e, i,
                           "each tool call must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                           "\"arguments\"}}%s",
                           "");
        cJSON *call = cJSON_Duplicate(c, true), *f = cJSON_GetObjectItemCaseSensitive(call, "function");
        if (cJSON_IsString(args)) {
            cJSON *parsed = cJSON_Parse(args->valuestring);
            if (cJSON_IsObject(parsed)) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", parsed);
            else cJSON_Delete(parsed);
        } else if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args)) {
            cJSON_Delete(call);
            return bad_msg(e, i, "a tool call's function.arguments must be a JSON string or an object%s", "");
        }
        cJSON_AddItemToArray(out, call);
    }
    return 0;
}

/* one message into the template's shape */
static int message_copy(const cJSON *m, int i, cJSON *out, oa_error *e) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role))
        return bad_msg(e, i, "must be an object with a string 'role'%s", "");
    const char *r = role->valuestring;
    if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant") &&
        strcmp(r, "tool"))
        return bad_msg(e, i, "role '%s' is not one of system, developer, user, assistant, tool", r);
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddItemToArray(out, msg);
    cJSON_AddStringToObject(msg, "role", strcmp(r, "developer") ? r : "system");
    sbuf text = {0};
    int rc = 0;
    if (!strcmp(r, "tool") && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "tool_call_id")))
        rc = bad_msg(e, i, "a tool message needs 'tool_call_id', the id of the call it answers%s", "");
    if (!rc) rc = content_string(cJSON_GetObjectItemCaseSensitive(m, "content"), i, &text, e);
    if (!rc) cJSON_AddStringToObject(msg, "content", text.p);
    sb_free(&text);
    for (const cJSON *f = m->child; !rc && f; f = f->next) {
        const char *k = f->string;
        if (!strcmp(k, "role") || !strcmp(k, "content") || cJSON_IsNull(f)) continue;
        if (!strcmp(k, "tool_calls") && !strcmp(r, "assistant")) rc = tool_calls_copy(f, i, msg, e);
        else if ((!strcmp(k, "tool_call_id") && !strcmp(r, "tool")) || !strcmp(k, "name")) {
            if (!cJSON_IsString(f)) rc = bad_msg(e, i, "'%s' must be a string", k);
            else cJSON_AddStringToObject(msg, k, f->valuestring);
        } else if ((!strcmp(k, "reasoning_content") || !strcmp(k, "reasoning")) && !strcmp(r, "assistant")) {
            if (!cJSON_IsString(f)) rc = bad_msg(e, i, "'%s' must be a string", k);
            else cJSON_AddStringToObject(msg, "reasoning_content", f->valuestring);
        } else rc = bad_msg(e, i, "'%s' is not a field fp8moe reads in this message", k);
    }
    return rc;
}

static int tools_check(const cJSON *tools, oa_error *e) {
    if (!cJSON_IsArray(tools))
        return oa_fail(e, 400, "invalid_request_error", NULL, "tools", "'tools' must be an array of tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn) ||
            !cJSON_IsString(name) || !name->valuestring[0] || (params && !cJSON_IsObject(params)))
            return oa_fail(e, 400, "invalid_request_error", NULL, "tools",
                           "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\", \"description\", "
                           "\"parameters\": {JSON Schema}}}",
                           i);
    }
    return 0;
}

static const cJSON *tool_named(const cJSON *tools, const char *name) {
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return t;
    }
    return NULL;
}

/* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}} */
static int tool_choice_parse(const cJSON *root, const cJSON *tools, chat_req *q, oa_error *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    q->choice = tools ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (cJSON_IsString(tc)) {
        const char *v = tc->valuestring;
        if (!strcmp(v, "none")) q->choice = TOOL_CHOICE_NONE;
        else if (!strcmp(v, "auto")) q->choice = tools ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
        else if (!strcmp(v, "required")) q->choice = TOOL_CHOICE_REQUIRED;
        else
            return oa_fail(e, 400, "invalid_request_error", NULL, "tool_choice",
                           "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}, got \"%s\"",
                           v);
    } else {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(name))
            return oa_fail(e, 400, "invalid_request_error", NULL, "tool_choice",
                           "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!tool_named(tools, name->valuestring))
            return oa_fail(e, 400, "invalid_request_error", NULL, "tool_choice",
                           "'tool_choice' names the function '%s', which is not in 'tools'", name->valuestring);
        q->choice = TOOL_CHOICE_NAMED;
        snprintf(q->named, sizeof q->named, "%s", name->valuestring);
    }
    if (q->choice >= TOOL_CHOICE_REQUIRED && !tools)
        return oa_fail(e, 400, "invalid_request_error", NULL, "tool_choice",
                       "'tool_choice' asks for a tool call but the request has no 'tools'");
    return 0;
}

/* the template's variables beyond messages and tools: the server's default kwargs, then the request's */
static int kwargs_merge(srv *s, const cJSON *root, cJSON *vars, oa_error *e) {
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
        return oa_fail(e, 400, "invalid_request_error", NULL, "chat_template_kwargs",
                       "'chat_template_kwargs' must be an object of the template's variables");
    const cJSON *layers[2] = {s->chat_default_kwargs, cJSON_IsObject(kw) ? kw : NULL};
    for (int l = 0; l < 2; l++)
        for (const cJSON *v = layers[l] ? layers[l]->child : NULL; v; v = v->next) {
            if (!strcmp(v->string, "messages") || !strcmp(v->string, "tools"))
                return oa_fail(e, 400, "invalid_request_error", NULL, "chat_template_kwargs",
                               "'chat_template_kwargs' may not set '%s': send it as the request's own field",
                               v->string);
            cJSON_DeleteItemFromObjectCaseSensitive(vars, v->string);
            cJSON_AddItemToObject(vars, v->string, cJSON_Duplicate(v, true));
        }
    /* enable_thinking at the top level (as some clients send it) is the same variable */
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(root, "enable_thinking");
    if (et && !cJSON_IsNull(et)) {
        if (!cJSON_IsBool(et))
            return oa_fail(e, 400, "invalid_request_error", NULL, "enable_thinking",
                           "'enable_thinking' must be a boolean");
        cJSON_DeleteItemFromObjectCaseSensitive(vars, "enable_thinking");
        cJSON_AddBoolToObject(vars, "enable_thinking", cJSON_IsTrue(et));
    }
    /* reasoning_effort: the template's own variable when it reads one; else, on a template with a thinking
     * switch, none/minimal turn thinking off and low/medium/high on (the template has one level) */
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (re && !cJSON_IsNull(re)) {
        static const char *const levels[] = {"none", "minimal", "low", "medium", "high"};
        int level = -1;
        for (int k = 0; cJSON_IsString(re) && k < 5; k++)
            if (!strcmp(re->valuestring, levels[k])) level = k;
        if (level < 0)
            return oa_fail(e, 400, "invalid_request_error", NULL, "reasoning_effort",
                           "'reasoning_effort' must be one of none, minimal, low, medium, high");
        const char *src = fm_chat_template_source(s->tmpl);
        if (strstr(src, "reasoning_effort")) cJSON_AddStringToObject(vars, "reasoning_effort", levels[level]);
        else if (strstr(src, "enable_thinking")) {
            if (!cJSON_GetObjectItemCaseSensitive(vars, "enable_thinking"))
                cJSON_AddBoolToObject(vars, "enable_thinking", level >= 2);
        } else
            return oa_fail(e, 400, "invalid_request_error", NULL, "reasoning_effort",
                           "this model's chat template has no reasoning control (neither reasoning_effort nor "
                           "enable_thinking): leave 'reasoning_effort' out");
    }
    return 0;
}

/* the conversation of root rendered by the template into *text (malloc'd); q receives the tool settings */
static int render(srv *s, const cJSON *root, bool add_generation_prompt, chat_req *q, char **text, oa_error *e) {
    *text = NULL;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs || cJSON_IsNull(msgs))
        return oa_fail(e, 400, "invalid_request_error", NULL, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return oa_fail(e, 400, "invalid_request_error", NULL, "messages",
                       "'messages' must be a non-empty array of messages");
    if (!s->tmpl)
        return oa_fail(e, 501, "server_error", "chat_template_unavailable", NULL,
                       "this server has no chat template for the model (%s): start it with --chat-template FILE, or "
                       "use /v1/completions",
                       s->tmpl_error);
    cJSON *vars = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(vars, "messages");
    int rc = 0, i = 0;
    for (const cJSON *m = msgs->child; !rc && m; m = m->next, i++) rc = message_copy(m, i, list, e);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (cJSON_IsNull(tools)) tools = NULL;
    if (!rc && tools) rc = tools_check(tools, e);
    if (!rc && tools && cJSON_GetArraySize(tools) == 0) tools = NULL;
    if (!rc) rc = tool_choice_parse(root, tools, q, e);
    q->parallel = true;
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (!rc && ptc && !cJSON_IsNull(ptc)) {
        if (!cJSON_IsBool(ptc))
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "parallel_tool_calls",
                         "'parallel_tool_calls' must be a boolean");
        q->parallel = cJSON_IsTrue(ptc);
    }
    /* tool_choice none: the tools stay out of the prompt and no call is parsed (vLLM's default too) */
    if (!rc && tools && q->choice != TOOL_CHOICE_NONE) {
        if (s->chat_tool_fmt == FM_TOOLS_NONE)
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "tools",
                         "this model's chat template has no tool-call format fp8moe parses (it writes neither "
                         "<tool_call> nor [TOOL_CALLS]): start the server with --tool-parser hermes|mistral, or "
                         "leave 'tools' out");
        else cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, true));
        q->tools = cJSON_Duplicate(tools, true);
    }
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt);
    if (!rc) rc = kwargs_merge(s, root, vars, e);
    if (!rc) {
        fm_error err;
        if (fm_chat_template_apply(s->tmpl, vars, text, &err))
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "messages", "%s", err.msg);
    }
    cJSON_Delete(vars);
    return rc;
}

int serve_chat_prompt(srv *s, const cJSON *root, bool add_generation_prompt, char **text, oa_error *e) {
    chat_req q = {0};
    const int rc = render(s, root, add_generation_prompt, &q, text, e);
    cJSON_Delete(q.tools);
    return rc;
}

int chat_parse(srv *s, const cJSON *root, job *j, oa_error *e) {
    chat_req *q = calloc(1, sizeof *q);
    if (!q) return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    j->chatq = q;
    char *text = NULL;
    int rc = render(s, root, true, q, &text, e);
    if (!rc && !s->tok)
        rc = oa_fail(e, 501, "server_error", "tokenizer_unavailable", NULL,
                     "this server has no tokenizer for the model (%s)", s->tok_error);
    if (!rc) rc = oa_encode(s, text, false, j, e);
    if (!rc) {
        q->tool_fmt = q->tools && q->choice != TOOL_CHOICE_NONE ? s->chat_tool_fmt : FM_TOOLS_NONE;
        q->reasoning_fmt = s->chat_reasoning_fmt;
        q->opened = fm_reasoning_prompt_opens(q->reasoning_fmt, text);
    }
    free(text);
    if (!rc) rc = chat_constraints(s, root, j, e);
    if (!rc) chat_out_begin(j);
    return rc;
}

fm_status chat_setup(srv *s, fm_error *err) {
    const fm_serve_opts *o = &s->o;
    const char *src = s->tmpl ? fm_chat_template_source(s->tmpl) : NULL;
    s->chat_tool_fmt = fm_tool_format_of_template(src);
    s->chat_reasoning_fmt = fm_reasoning_format_of_template(src);
    if (o->tool_parser && fm_tool_format_parse(o->tool_parser, &s->chat_tool_fmt, err)) return FM_ERR_USAGE;
    if (o->reasoning_parser && fm_reasoning_format_parse(o->reasoning_parser, &s->chat_reasoning_fmt, err))
        return FM_ERR_USAGE;
    if (o->default_chat_template_kwargs) {
        s->chat_default_kwargs = cJSON_Parse(o->default_chat_template_kwargs);
        if (!cJSON_IsObject(s->chat_default_kwargs)) {
            cJSON_Delete(s->chat_default_kwargs);
            s->chat_default_kwargs = NULL;
            return fm_fail(err, FM_ERR_USAGE,
                           "--default-chat-template-kwargs '%s' is not a JSON object (such as "
                           "'{\"enable_thinking\": false}')",
                           o->default_chat_template_kwargs);
        }
    }
    s->chat_think_start = s->chat_think_end = -1;
    if (s->tok) {
        s->chat_think_start = fm_tokenizer_token_id(s->tok, "<think>");
        s->chat_think_end = fm_tokenizer_token_id(s->tok, "</think>");
        /* constrained decoding reads every id's bytes: built once (a trie over the vocabulary) */
        if (fm_token_vocab_from_tokenizer(s->tok, s->vocab, &s->chat_vocab, err)) return FM_ERR_FORMAT;
    }
    /* the ends of a reply: the model's eos ids and the template's end-of-turn tokens */
    s->n_end_ids = 0;
    const int32_t *eos;
    const int32_t n_eos = fm_model_eos_ids(fm_context_model(s->context), &eos);
    for (int32_t k = 0; k < n_eos && s->n_end_ids < 16; k++) s->end_ids[s->n_end_ids++] = eos[k];
    const char *const *stops = s->tmpl ? fm_chat_template_stop_tokens(s->tmpl) : NULL;
    for (int k = 0; s->tok && stops && stops[k] && s->n_end_ids < 16; k++) {
        const int32_t id = fm_tokenizer_token_id(s->tok, stops[k]);
        if (id >= 0) s->end_ids[s->n_end_ids++] = id;
    }
    if (s->tmpl)
        fprintf(stderr, "fp8moe serve: chat template %s: tool calls %s, reasoning %s\n", fm_chat_template_path(s->tmpl),
                fm_tool_format_name(s->chat_tool_fmt),
                s->chat_reasoning_fmt == FM_REASONING_THINK_TAGS ? "<think> tags" : "none");
    return FM_OK;
}

void chat_teardown(srv *s) {
    cJSON_Delete(s->chat_default_kwargs);
    s->chat_default_kwargs = NULL;
    fm_token_vocab_free(s->chat_vocab);
    s->chat_vocab = NULL;
}
