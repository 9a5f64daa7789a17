/* A request's conversation rendered by the chat template into the prompt text: /tokenize's messages path. The
 * agent side (tools, tool calls, template variables beyond enable_thinking) extends this one function. */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

/* the text of messages[i].content: a string, or an array of {"type": "text", "text": ...} parts */
static int content_text(const cJSON *c, int i, sbuf *out, oa_error *e) {
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) {
        sb_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return oa_fail(e, 400, "invalid_request_error", NULL, "messages",
                       "messages[%d].content must be a string or an array of text parts", i);
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return oa_fail(e, 400, "invalid_request_error", NULL, "messages",
                           "messages[%d].content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                           i);
        sb_puts(out, text->valuestring);
    }
    return 0;
}

/* enable_thinking from chat_template_kwargs or the top-level shorthand; other template variables are refused by
 * name (the templates here take no others) */
static int template_options(const cJSON *root, fm_chat_opts *co, oa_error *e) {
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw))
            return oa_fail(e, 400, "invalid_request_error", NULL, "chat_template_kwargs",
                           "'chat_template_kwargs' must be an object");
        for (const cJSON *v = kw->child; v; v = v->next) {
            if (strcmp(v->string, "enable_thinking"))
                return oa_fail(e, 400, "invalid_request_error", NULL, "chat_template_kwargs",
                               "chat_template_kwargs.%s: the chat templates here take only enable_thinking", v->string);
            if (!cJSON_IsBool(v))
                return oa_fail(e, 400, "invalid_request_error", NULL, "chat_template_kwargs",
                               "chat_template_kwargs.enable_thinking must be a boolean");
            co->enable_thinking = cJSON_IsTrue(v);
        }
    }
    const cJSON *think = cJSON_GetObjectItemCaseSensitive(root, "enable_thinking");
    if (think && !cJSON_IsNull(think)) {
        if (!cJSON_IsBool(think))
            return oa_fail(e, 400, "invalid_request_error", NULL, "enable_thinking",
                           "'enable_thinking' must be a boolean");
        co->enable_thinking = cJSON_IsTrue(think);
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && cJSON_GetArraySize(tools) == 0))
        return oa_fail(e, 400, "invalid_request_error", NULL, "tools",
                       "'tools' cannot be rendered by this server's chat templates yet");
    return 0;
}

int serve_chat_prompt(srv *s, const cJSON *root, bool add_generation_prompt, char **text, oa_error *e) {
    *text = NULL;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return oa_fail(e, 400, "invalid_request_error", NULL, "messages", "'messages' must be a non-empty array");
    if (!s->tmpl)
        return oa_fail(e, 501, "server_error", "chat_template_unavailable", NULL,
                       "this server has no chat template for the model (%s): start it with --chat-template NAME",
                       s->tmpl_error);
    fm_chat_opts co = {.add_generation_prompt = add_generation_prompt, .enable_thinking = true};
    int rc = template_options(root, &co, e);
    if (rc) return rc;
    const int n = cJSON_GetArraySize(msgs);
    fm_chat_msg *m = calloc((size_t)n, sizeof *m);
    sbuf *texts = calloc((size_t)n, sizeof *texts);
    rc = m && texts ? 0 : oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    for (const cJSON *v = msgs->child; !rc && v; v = v->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(v, "role");
        if (!cJSON_IsObject(v) || !cJSON_IsString(role)) {
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "messages",
                         "messages[%d] must be an object with a string 'role'", i);
            break;
        }
        rc = content_text(cJSON_GetObjectItemCaseSensitive(v, "content"), i, &texts[i], e);
        m[i].role = strcmp(role->valuestring, "developer") ? role->valuestring : "system";
        m[i].content = texts[i].p ? texts[i].p : "";
    }
    fm_error err;
    if (!rc && fm_chat_render(s->tmpl, m, n, &co, text, &err))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "messages", "%s", err.msg);
    for (int k = 0; texts && k < n; k++) sb_free(&texts[k]);
    free(texts), free(m);
    return rc;
}
