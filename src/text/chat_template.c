/* Chat templates by the checkpoint's own Jinja text (chat_template.h): finding the text and the special tokens,
 * the variables transformers passes, and the end-of-turn strings. */
#include "text/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"
#include "text/jinja.h"
#include "util/file.h"
#include "util/status.h"

enum { MAX_STOPS = 8, MAX_TEMPLATE_BYTES = 16u << 20 };

/* The special tokens transformers' special_tokens_map holds and apply_chat_template passes to the template. */
static const char *const k_special[] = {"bos_token", "eos_token", "unk_token",  "sep_token",
                                        "pad_token", "cls_token", "mask_token", NULL};

/* End-of-turn markers of known template families; one is a stop string when the template's text writes it. */
static const char *const k_turn_ends[] = {"<|im_end|>",
                                          "<|eot_id|>",
                                          "<|eom_id|>",
                                          "<|end|>",
                                          "<end_of_turn>",
                                          "<|END_OF_TURN_TOKEN|>",
                                          "<｜end▁of▁sentence｜>",
                                          NULL};

struct fm_chat_template {
    char *path;        /* where the text came from */
    char *source;      /* the default template */
    char *tool_source; /* tokenizer_config.json's "tool_use" template, or NULL */
    jinja_template *jt, *tool_jt;
    cJSON *special; /* {bos_token: "...", ...}: the strings of tokenizer_config.json */
    const char *stops[MAX_STOPS + 1];
};

/* A special token as tokenizer_config.json writes it: a string, or an object with "content" (AddedToken). */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static fm_status read_json(const char *path, const char *what, cJSON **root, fm_error *err) {
    char *buf = NULL;
    size_t n = 0;
    fm_path_buf pb;
    fm_status st = fm_read_regular(path, what, 64u << 20, &buf, &n, err);
    if (!st) st = fm_json_parse_object(buf, n, fm_path_show(&pb, path), what, root, err);
    free(buf);
    return st;
}

/* "chat_template" of a JSON file: a string, or a list of {name, template} ("default", and "tool_use"). */
static fm_status templates_of(fm_chat_template *t, const cJSON *ct, const char *where, fm_error *err) {
    if (cJSON_IsString(ct)) {
        t->source = strdup(ct->valuestring);
        return t->source ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    if (!cJSON_IsArray(ct))
        return fm_fail(err, FM_ERR_FORMAT, "%s: chat_template is neither a string nor a list of {name, template}",
                       where);
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(nm) || !cJSON_IsString(tp))
            return fm_fail(err, FM_ERR_FORMAT, "%s: a chat_template entry is not {name, template}", where);
        if (!strcmp(nm->valuestring, "default") && !t->source) t->source = strdup(tp->valuestring);
        if (!strcmp(nm->valuestring, "tool_use") && !t->tool_source) t->tool_source = strdup(tp->valuestring);
    }
    if (!t->source)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: chat_template lists named templates but none named 'default'; pass --chat-template FILE",
                       where);
    return FM_OK;
}

static fm_status set_path(fm_chat_template *t, const char *path, fm_error *err) {
    fm_path_buf pb;
    free(t->path);
    t->path = strdup(fm_path_show(&pb, path));
    return t->path ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
}

/* A file given by --chat-template: JSON with "chat_template" when it ends in .json, else the Jinja text. */
static fm_status read_template_file(fm_chat_template *t, const char *file, fm_error *err) {
    fm_status st = set_path(t, file, err);
    const size_t n = strlen(file);
    if (!st && n > 5 && !strcmp(file + n - 5, ".json")) {
        cJSON *root = NULL;
        st = read_json(file, "chat template JSON", &root, err);
        const cJSON *ct = root ? cJSON_GetObjectItemCaseSensitive(root, "chat_template") : NULL;
        if (!st && !ct) st = fm_fail(err, FM_ERR_FORMAT, "%s: no \"chat_template\" in this JSON file", t->path);
        if (!st) st = templates_of(t, ct, t->path, err);
        cJSON_Delete(root);
        return st;
    }
    size_t len = 0;
    if (!st) st = fm_read_regular(file, "a chat template", MAX_TEMPLATE_BYTES, &t->source, &len, err);
    if (!st && strlen(t->source) != len) st = fm_fail(err, FM_ERR_FORMAT, "%s: a NUL byte in the template", t->path);
    return st;
}

/* The checkpoint's template: chat_template.jinja, chat_template.json, then tokenizer_config.json (transformers'
 * order); cfg is tokenizer_config.json (NULL when absent). */
static fm_status read_model_template(fm_chat_template *t, const char *dir, const cJSON *cfg, fm_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (access(path, F_OK) == 0) return read_template_file(t, path, err);
    snprintf(path, sizeof path, "%s/chat_template.json", dir);
    if (access(path, F_OK) == 0) return read_template_file(t, path, err);
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    fm_path_buf pb;
    if (ct && !cJSON_IsNull(ct)) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        fm_status st = set_path(t, path, err);
        return st ? st : templates_of(t, ct, t->path, err);
    }
    return fm_fail(err, FM_ERR_UNSUPPORTED,
                   "%s has no chat template (no chat_template.jinja, chat_template.json, or chat_template in "
                   "tokenizer_config.json): pass --chat-template FILE (e.g. tests/chat_templates/chatml/"
                   "chat_template.jinja for plain ChatML)",
                   fm_path_show(&pb, dir));
}

static fm_status parse(const fm_chat_template *t, const char *src, jinja_template **out, fm_error *err) {
    fm_status st = jinja_parse(src, strlen(src), out, err);
    if (st) fm_error_prefix(err, "chat template %s", t->path);
    return st;
}

static void find_stops(fm_chat_template *t) {
    int n = 0;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(t->special, "eos_token");
    if (cJSON_IsString(eos) && eos->valuestring[0]) t->stops[n++] = eos->valuestring;
    for (const char *const *m = k_turn_ends; *m && n < MAX_STOPS; m++) {
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= !strcmp(t->stops[i], *m);
        if (!dup && (strstr(t->source, *m) || (t->tool_source && strstr(t->tool_source, *m)))) t->stops[n++] = *m;
    }
    t->stops[n] = NULL;
}

fm_status fm_chat_template_load(const char *model_dir, const char *template_file, fm_chat_template **out,
                                fm_error *err) {
    *out = NULL;
    if (!model_dir && !template_file) return fm_fail(err, FM_ERR_USAGE, "a chat template needs a model or a file");
    fm_chat_template *t = calloc(1, sizeof *t);
    if (!t) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    cJSON *cfg = NULL;
    fm_status st = FM_OK;
    char path[4096];
    if (model_dir) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
        if (access(path, F_OK) == 0) st = read_json(path, "tokenizer_config.json", &cfg, err);
    }
    t->special = cJSON_CreateObject();
    if (!st && !t->special) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (const char *const *k = k_special; !st && cfg && *k; k++) {
        const char *s = token_text(cJSON_GetObjectItemCaseSensitive(cfg, *k));
        if (s && !cJSON_AddStringToObject(t->special, *k, s)) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    const cJSON *extra = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens") : NULL;
    if (!st && cJSON_IsArray(extra)) {
        cJSON *list = cJSON_AddArrayToObject(t->special, "additional_special_tokens");
        const cJSON *e;
        cJSON_ArrayForEach(e, extra) {
            const char *s = token_text(e);
            if (s && list) cJSON_AddItemToArray(list, cJSON_CreateString(s));
        }
    }
    if (!st)
        st = template_file ? read_template_file(t, template_file, err) : read_model_template(t, model_dir, cfg, err);
    cJSON_Delete(cfg);
    if (!st) st = parse(t, t->source, &t->jt, err);
    if (!st && t->tool_source) st = parse(t, t->tool_source, &t->tool_jt, err);
    if (st) {
        fm_chat_template_free(t);
        return st;
    }
    find_stops(t);
    *out = t;
    return FM_OK;
}

void fm_chat_template_free(fm_chat_template *t) {
    if (!t) return;
    jinja_free(t->jt), jinja_free(t->tool_jt);
    cJSON_Delete(t->special);
    free(t->path), free(t->source), free(t->tool_source);
    free(t);
}

const char *fm_chat_template_source(const fm_chat_template *t) { return t->source; }
const char *fm_chat_template_path(const fm_chat_template *t) { return t->path; }
const char *const *fm_chat_template_stop_tokens(const fm_chat_template *t) { return t->stops; }

static bool has(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key) != NULL; }

cJSON *fm_chat_template_context(const fm_chat_template *t, const cJSON *vars) {
    cJSON *ctx = vars && cJSON_IsObject(vars) ? cJSON_Duplicate(vars, true) : cJSON_CreateObject();
    if (!ctx) return NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, t->special) {
        if (!has(ctx, e->string)) cJSON_AddItemToObject(ctx, e->string, cJSON_Duplicate(e, true));
    }
    /* apply_chat_template renders with tools=None, documents=None and add_generation_prompt=False by default */
    if (!has(ctx, "tools")) cJSON_AddNullToObject(ctx, "tools");
    if (!has(ctx, "documents")) cJSON_AddNullToObject(ctx, "documents");
    if (!has(ctx, "add_generation_prompt")) cJSON_AddFalseToObject(ctx, "add_generation_prompt");
    return ctx;
}

fm_status fm_chat_template_apply(const fm_chat_template *t, const cJSON *vars, char **text, fm_error *err) {
    *text = NULL;
    cJSON *ctx = fm_chat_template_context(t, vars);
    if (!ctx) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(ctx, "tools");
    const jinja_template *jt = t->tool_jt && tools && !cJSON_IsNull(tools) ? t->tool_jt : t->jt;
    jinja_fail kind = JINJA_OK;
    fm_status st = jinja_render(jt, ctx, NULL, text, &kind, err);
    if (st && kind != JINJA_RAISED) fm_error_prefix(err, "chat template %s", t->path);
    cJSON_Delete(ctx);
    return st;
}

fm_status fm_chat_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *opts,
                         char **text, fm_error *err) {
    *text = NULL;
    cJSON *vars = cJSON_CreateObject();
    cJSON *list = vars ? cJSON_AddArrayToObject(vars, "messages") : NULL;
    bool ok = list != NULL;
    for (int32_t i = 0; ok && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddStringToObject(m, "role", msgs[i].role) &&
             cJSON_AddStringToObject(m, "content", msgs[i].content ? msgs[i].content : "");
        if (m) cJSON_AddItemToArray(list, m);
    }
    if (ok) ok = cJSON_AddBoolToObject(vars, "add_generation_prompt", opts && opts->add_generation_prompt) != NULL;
    if (ok && opts && opts->enable_thinking != FM_THINK_DEFAULT)
        ok = cJSON_AddBoolToObject(vars, "enable_thinking", opts->enable_thinking == FM_THINK_ON) != NULL;
    fm_status st = ok ? fm_chat_template_apply(t, vars, text, err) : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    cJSON_Delete(vars);
    return st;
}
