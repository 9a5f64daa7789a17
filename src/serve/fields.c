/* Every request field of the OpenAI chat and completions APIs (and the vLLM extras clients send), with what this
 * server does with it: implemented, refused with a 400 that names it and says why, or accepted without effect for a
 * stated reason. Nothing else is silent: a field not in the table is refused under --strict-fields and otherwise
 * named in the server's log once per request. docs/serving.md holds this table as `fp8moe serve --fields-markdown`
 * prints it (a test compares them). */
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

enum { ON_CHAT = 1, ON_COMPLETIONS = 2, ON_BOTH = 3 };

typedef struct field_spec {
    const char *name; /* "stream_options.include_usage": a member of an object field */
    int on;           /* ON_CHAT, ON_COMPLETIONS or both */
    field_status status;
    const char *note; /* what it does here, or why it is refused or has no effect */
} field_spec;

static const field_spec k_fields[] = {
    {"model", ON_BOTH, FIELD_IMPLEMENTED, "must name the served model (`--model-name`) when given; 404 otherwise"},
    {"messages", ON_CHAT, FIELD_IMPLEMENTED, "rendered by the model's chat template"},
    {"prompt", ON_COMPLETIONS, FIELD_IMPLEMENTED, "a string, an array of one string, or an array of token ids"},
    {"max_tokens", ON_BOTH, FIELD_IMPLEMENTED,
     "default: the rest of the context (chat), 16 (completions); a prompt that leaves no room is a 400 "
     "`context_length_exceeded`"},
    {"max_completion_tokens", ON_CHAT, FIELD_IMPLEMENTED, "as `max_tokens`"},
    {"temperature", ON_BOTH, FIELD_IMPLEMENTED, "[0, 2]; 0, or below 1e-30, is greedy"},
    {"top_p", ON_BOTH, FIELD_IMPLEMENTED, "(0, 1]; a value too small for fp32 keeps the most likely token"},
    {"top_k", ON_BOTH, FIELD_IMPLEMENTED, "vLLM extra; 0 or -1: off"},
    {"min_p", ON_BOTH, FIELD_IMPLEMENTED, "vLLM extra; [0, 1)"},
    {"repetition_penalty", ON_BOTH, FIELD_IMPLEMENTED, "vLLM extra; 1: off"},
    {"presence_penalty", ON_BOTH, FIELD_IMPLEMENTED, "[-2, 2]"},
    {"frequency_penalty", ON_BOTH, FIELD_IMPLEMENTED, "[-2, 2]"},
    {"logit_bias", ON_BOTH, FIELD_IMPLEMENTED, "token id -> bias in [-100, 100]"},
    {"seed", ON_BOTH, FIELD_IMPLEMENTED, "omitted: a random seed per request"},
    {"stop", ON_BOTH, FIELD_IMPLEMENTED, "up to 16 strings, matched on the text"},
    {"ignore_eos", ON_BOTH, FIELD_IMPLEMENTED, "vLLM extra"},
    {"n", ON_BOTH, FIELD_IMPLEMENTED, "1 only: other values are a 400"},
    {"best_of", ON_COMPLETIONS, FIELD_IMPLEMENTED, "1 only: other values are a 400"},
    {"echo", ON_COMPLETIONS, FIELD_IMPLEMENTED, "false only: `true` is a 400"},
    {"logprobs", ON_BOTH, FIELD_IMPLEMENTED,
     "chat: a boolean; completions: the number of top alternatives, at most 20"},
    {"top_logprobs", ON_CHAT, FIELD_IMPLEMENTED, "at most 20; needs `logprobs: true`"},
    {"stream", ON_BOTH, FIELD_IMPLEMENTED, "server-sent events, `data: [DONE]` last"},
    {"stream_options", ON_BOTH, FIELD_IMPLEMENTED, "an object of the two members below"},
    {"stream_options.include_usage", ON_BOTH, FIELD_IMPLEMENTED, "a last chunk with `usage`"},
    {"stream_options.include_obfuscation", ON_BOTH, FIELD_NO_EFFECT,
     "no obfuscation padding is added to chunks (it hides chunk sizes on OpenAI's network path)"},
    {"tools", ON_CHAT, FIELD_IMPLEMENTED, "function tools, given to the chat template"},
    {"tool_choice", ON_CHAT, FIELD_IMPLEMENTED, "`none`, `auto`, `required` or a named function"},
    {"parallel_tool_calls", ON_CHAT, FIELD_IMPLEMENTED, "false: at most one tool call per reply"},
    {"response_format", ON_CHAT, FIELD_IMPLEMENTED, "`text`, `json_object`, `json_schema` (constrained decoding)"},
    {"reasoning_effort", ON_CHAT, FIELD_IMPLEMENTED,
     "the template's own variable when it reads one; else `none`/`minimal` set `enable_thinking` false, "
     "`low`/`medium`/`high` true"},
    {"chat_template_kwargs", ON_CHAT, FIELD_IMPLEMENTED, "vLLM extra: variables for the chat template"},
    {"enable_thinking", ON_CHAT, FIELD_IMPLEMENTED, "shorthand for `chat_template_kwargs.enable_thinking`"},
    {"user", ON_BOTH, FIELD_NO_EFFECT, "an end-user id for OpenAI's abuse monitoring: this server keeps no users"},
    {"safety_identifier", ON_CHAT, FIELD_NO_EFFECT, "as `user`"},
    {"metadata", ON_CHAT, FIELD_NO_EFFECT, "tags for stored completions: nothing is stored"},
    {"store", ON_CHAT, FIELD_NO_EFFECT, "nothing is stored"},
    {"service_tier", ON_CHAT, FIELD_NO_EFFECT, "one tier: every request is served the same way"},
    {"prompt_cache_key", ON_CHAT, FIELD_NO_EFFECT, "prefix caching needs no key here"},
    {"prompt_cache_retention", ON_CHAT, FIELD_NO_EFFECT, "cached prefixes stay until their memory is needed"},
    {"suffix", ON_COMPLETIONS, FIELD_REFUSED, "fill-in-the-middle is not supported"},
    {"audio", ON_CHAT, FIELD_REFUSED, "text only: no audio output"},
    {"modalities", ON_CHAT, FIELD_REFUSED, "text only: the output is always text"},
    {"prediction", ON_CHAT, FIELD_REFUSED, "predicted outputs are not supported"},
    {"web_search_options", ON_CHAT, FIELD_REFUSED, "no web search"},
    {"verbosity", ON_CHAT, FIELD_REFUSED, "a setting of OpenAI's reasoning models; use `max_tokens`"},
    {"functions", ON_CHAT, FIELD_REFUSED, "deprecated by OpenAI: use `tools`"},
    {"function_call", ON_CHAT, FIELD_REFUSED, "deprecated by OpenAI: use `tool_choice`"},
    {"priority", ON_BOTH, FIELD_REFUSED, "vLLM extra: requests are served first come, first served"},
};
enum { N_FIELDS = sizeof k_fields / sizeof k_fields[0] };

static const field_spec *find(const char *name) {
    for (int i = 0; i < N_FIELDS; i++)
        if (!strcmp(k_fields[i].name, name)) return &k_fields[i];
    return NULL;
}

field_status fields_status(const char *name, bool chat) {
    const field_spec *f = find(name);
    if (!f) return FIELD_UNKNOWN;
    return f->on & (chat ? ON_CHAT : ON_COMPLETIONS) ? f->status : FIELD_OTHER_ENDPOINT;
}

/* one member (name is its full dotted name) */
static int check_one(const char *name, const cJSON *v, bool chat, bool strict, sbuf *unknown, oa_error *e) {
    const char *endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
    const field_spec *f = find(name);
    switch (fields_status(name, chat)) {
    case FIELD_UNKNOWN:
        if (strict)
            return oa_fail(e, 400, "invalid_request_error", "unknown_field", name,
                           "'%s' is not a field of %s that this server knows (--strict-fields refuses unknown fields)",
                           name, endpoint);
        if (unknown) { /* a name for the log: control characters escaped (no forged log lines) */
            if (unknown->n) sb_puts(unknown, ", ");
            sb_puts(unknown, "'");
            for (const unsigned char *p = (const unsigned char *)name; *p; p++)
                if (*p < 0x20 || *p == 0x7F || *p == '\'') sb_printf(unknown, "\\x%02x", *p);
                else sb_put(unknown, (const char *)p, 1);
            sb_puts(unknown, "'");
        }
        return 0;
    case FIELD_OTHER_ENDPOINT:
        return oa_fail(e, 400, "invalid_request_error", "unsupported_field", name, "'%s' is a field of %s, not of %s",
                       name, chat ? "/v1/completions" : "/v1/chat/completions", endpoint);
    case FIELD_REFUSED:
        if (cJSON_IsNull(v)) return 0;
        return oa_fail(e, 400, "invalid_request_error", "unsupported_field", name, "'%s' is not supported: %s", name,
                       f->note);
    default: return 0;
    }
}

int fields_check(const cJSON *root, bool chat, bool strict, sbuf *unknown, oa_error *e) {
    for (const cJSON *v = root->child; v; v = v->next) {
        if (!v->string) continue;
        int rc = check_one(v->string, v, chat, strict, unknown, e);
        if (rc) return rc;
        if (!strcmp(v->string, "stream_options") && cJSON_IsObject(v))
            for (const cJSON *m = v->child; m; m = m->next) {
                char name[128];
                snprintf(name, sizeof name, "stream_options.%s", m->string ? m->string : "");
                if ((rc = check_one(name, m, chat, strict, unknown, e))) return rc;
            }
    }
    return 0;
}

void fields_markdown(sbuf *o) {
    static const char *const status_text[] = {[FIELD_IMPLEMENTED] = "implemented",
                                              [FIELD_REFUSED] = "refused (400)",
                                              [FIELD_NO_EFFECT] = "accepted, no effect"};
    sb_puts(o, "| field | chat | completions | status | notes |\n| --- | :-: | :-: | --- | --- |\n");
    for (int i = 0; i < N_FIELDS; i++) {
        const field_spec *f = &k_fields[i];
        sb_printf(o, "| `%s` | %s | %s | %s | %s |\n", f->name, f->on & ON_CHAT ? "yes" : "",
                  f->on & ON_COMPLETIONS ? "yes" : "", status_text[f->status], f->note);
    }
}

char *fm_serve_fields_markdown(void) {
    sbuf o = {0};
    fields_markdown(&o);
    return o.p;
}
