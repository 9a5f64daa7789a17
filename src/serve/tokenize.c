/* POST /tokenize and /detokenize in vLLM's shapes:
 *   /tokenize   {"prompt": "text", "add_special_tokens": true}
 *            or {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false,
 *                "chat_template_kwargs": {...}, "tools": [...]}      (the chat template renders the messages)
 *            -> {"count": N, "max_model_len": ctx, "tokens": [ids], "token_strs": [strings] or null}
 *               ("return_token_strs": true asks for token_strs)
 *   /detokenize {"tokens": [ids]} -> {"prompt": "text"}
 * Fields beside these are refused by name; "model" must name the served model when given. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

static int check_fields(const cJSON *root, const char *const *known, const char *endpoint, oa_error *e) {
    for (const cJSON *v = root->child; v; v = v->next) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(v->string, known[i]);
        if (!ok)
            return oa_fail(e, 400, "invalid_request_error", "unknown_field", v->string, "'%s' is not a field of %s",
                           v->string, endpoint);
    }
    return 0;
}

static int get_flag(const cJSON *root, const char *name, bool *out, oa_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return oa_fail(e, 400, "invalid_request_error", NULL, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* the body as a JSON object whose "model", when given, is the served model */
static cJSON *parse_body(srv *s, const char *body, size_t len, oa_error *e) {
    if (body_check(body, len, e)) return NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        oa_fail(e, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
        return NULL;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, s->model_name))) {
        oa_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                "The model '%s' does not exist: this server serves '%s'",
                cJSON_IsString(model) ? model->valuestring : "(not a string)", s->model_name);
        cJSON_Delete(root);
        return NULL;
    }
    if (!s->tok) {
        oa_fail(e, 501, "server_error", "tokenizer_unavailable", NULL,
                "this server has no tokenizer for the model (%s)", s->tok_error);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* a JSON string of text that may hold invalid UTF-8 (a token that is part of a character) */
static cJSON *text_json(const char *t) {
    sbuf b = {0};
    utf8_sanitize(&b, t);
    cJSON *v = cJSON_CreateString(b.p);
    sb_free(&b);
    return v;
}

int serve_tokenize(srv *s, const char *body, size_t len, char **out, oa_error *e) {
    static const char *const known[] = {"model",
                                        "prompt",
                                        "messages",
                                        "add_special_tokens",
                                        "add_generation_prompt",
                                        "continue_final_message",
                                        "return_token_strs",
                                        "chat_template_kwargs",
                                        "enable_thinking",
                                        "tools",
                                        NULL};
    cJSON *root = parse_body(s, body, len, e);
    if (!root) return e->status;
    int rc = check_fields(root, known, "/tokenize", e);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const bool chat = msgs && !cJSON_IsNull(msgs);
    bool add_special = !chat, add_gen = true, cont = false, strs = false;
    if (!rc) rc = get_flag(root, "add_special_tokens", &add_special, e);
    if (!rc) rc = get_flag(root, "add_generation_prompt", &add_gen, e);
    if (!rc) rc = get_flag(root, "continue_final_message", &cont, e);
    if (!rc) rc = get_flag(root, "return_token_strs", &strs, e);
    if (!rc && cont)
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "continue_final_message",
                     "'continue_final_message' is not supported");
    if (!rc && chat == (prompt && !cJSON_IsNull(prompt)))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "prompt", "give either 'prompt' (a string) or 'messages'");
    if (!rc && !chat && !cJSON_IsString(prompt))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "prompt", "'prompt' must be a string");
    if (!rc && !chat) {
        const char *bad = cJSON_GetObjectItemCaseSensitive(root, "tools")                  ? "tools"
                          : cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs") ? "chat_template_kwargs"
                          : cJSON_GetObjectItemCaseSensitive(root, "enable_thinking")      ? "enable_thinking"
                                                                                           : NULL;
        if (bad) rc = oa_fail(e, 400, "invalid_request_error", NULL, bad, "'%s' goes with 'messages'", bad);
    }
    char *text = NULL;
    if (!rc && chat) rc = serve_chat_prompt(s, root, add_gen, &text, e);
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err;
    if (!rc) {
        const char *t = chat ? text : prompt->valuestring;
        if (fm_tokenizer_encode(s->tok, t, strlen(t), add_special, true, &ids, &n, &err))
            rc = oa_fail(e, 400, "invalid_request_error", NULL, chat ? "messages" : "prompt",
                         "the text could not be tokenized: %s", err.msg);
    }
    free(text);
    cJSON_Delete(root);
    if (rc) {
        free(ids);
        return rc;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", (double)s->ctx);
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    cJSON *ts = strs ? cJSON_AddArrayToObject(o, "token_strs") : (cJSON_AddNullToObject(o, "token_strs"), NULL);
    for (int64_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        if (!ts) continue;
        char *t = NULL;
        size_t tn = 0;
        if (fm_tokenizer_decode(s->tok, &ids[i], 1, false, &t, &tn, &err)) cJSON_AddItemToArray(ts, cJSON_CreateNull());
        else cJSON_AddItemToArray(ts, text_json(t));
        free(t);
    }
    free(ids);
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return 0;
}

int serve_detokenize(srv *s, const char *body, size_t len, char **out, oa_error *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    cJSON *root = parse_body(s, body, len, e);
    if (!root) return e->status;
    int rc = check_fields(root, known, "/detokenize", e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!rc && !cJSON_IsArray(toks))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "tokens", "'tokens' must be an array of token ids");
    const int n = rc ? 0 : cJSON_GetArraySize(toks);
    int32_t *ids = n ? malloc((size_t)n * sizeof *ids) : NULL;
    if (!rc && n && !ids) rc = oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const int32_t vocab = fm_tokenizer_vocab_size(s->tok);
    int i = 0;
    for (const cJSON *v = rc ? NULL : toks->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= vocab) {
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "tokens", "tokens[%d] is not a token id in [0, %d)", i,
                         vocab);
            break;
        }
        ids[i] = (int32_t)v->valuedouble;
    }
    cJSON_Delete(root);
    char *text = NULL;
    size_t tn = 0;
    fm_error err;
    if (!rc && fm_tokenizer_decode(s->tok, ids, n, false, &text, &tn, &err))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "tokens", "%s", err.msg);
    free(ids);
    if (rc) {
        free(text);
        return rc;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "prompt", text_json(text ? text : ""));
    free(text);
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return 0;
}
