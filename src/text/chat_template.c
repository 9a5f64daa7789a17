/* Chat templates recognised, not interpreted (chat_template.h).
 *
 * Recognition: the checkpoint's template text is normalised (whitespace between and inside Jinja tags dropped,
 * comments dropped, quoted strings and literal text kept byte for byte) and hashed (FNV-1a 64); the hash must equal
 * that of an official template fp8moe renders (the texts are kept in tests/chat_templates/, and a test checks that
 * each is recognised). An exact match of the normalised text, not a search for distinctive markers, because
 * templates derived from these (fine-tunes that add a default system prompt, Qwen3-2507's without the think logic,
 * a changed separator) share every marker yet render differently: a false match would silently feed the model a
 * prompt format it was not trained on, while a refusal costs one --chat-template flag. The normalisation keeps
 * re-indentation, CRLF line ends and a trailing newline (the same template as a .jinja file or a JSON string) from
 * breaking the match.
 *
 * Rendering reproduces the templates' Jinja logic by hand, including Python's string methods as the templates call
 * them (split, lstrip('\n'), ...); tests/test_chat_template.c compares it with transformers' apply_chat_template. */
#include "text/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/json.h"
#include "util/file.h"
#include "util/status.h"

typedef enum tmpl_kind { TMPL_QWEN3, TMPL_CHATML, TMPL_MISTRAL, TMPL_MISTRAL_LEGACY } tmpl_kind;

typedef struct tmpl_info {
    const char *name; /* --chat-template NAME */
    tmpl_kind kind;
    uint64_t hash; /* of the normalised official text (template_hash) */
} tmpl_info;

/* The hashes of the texts in tests/chat_templates/ (test_chat_template.c checks that each fixture is recognised):
 *   qwen3           Qwen3 (Qwen3-30B-A3B, Qwen3-0.6B, ...): ChatML, thinking on/off, tool turns
 *   chatml          plain ChatML: no default system prompt, no think logic (for models without a template)
 *   mistral         Mixtral-8x7B-Instruct-v0.1 [INST] (2024: a system message joins the first user turn)
 *   mistral-legacy  Mixtral-8x7B-Instruct-v0.1 [INST] as first published (2023: no system message) */
static const tmpl_info k_templates[] = {
    {"qwen3", TMPL_QWEN3, 0xaba2baeb1df45488ull},
    {"chatml", TMPL_CHATML, 0xabcc246a94341a38ull},
    {"mistral", TMPL_MISTRAL, 0x59ff09d0c6676cc3ull},
    {"mistral-legacy", TMPL_MISTRAL_LEGACY, 0xdd39f833422aa4a9ull},
};
enum { N_TEMPLATES = (int)(sizeof k_templates / sizeof k_templates[0]) };

#define NAME_LIST "qwen3, chatml, mistral, mistral-legacy"

struct fm_chat_template {
    const tmpl_info *info;
    char *bos; /* the template's bos_token / eos_token (tokenizer_config.json's, else the family's) */
    char *eos;
};

static const char *const k_stop_chatml[] = {"<|im_end|>", NULL};
static const char *const k_stop_none[] = {NULL}; /* [INST] turns end with eos, the model's own end id */

/* ---- recognition ---- */

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

typedef struct fnv {
    uint64_t h;
} fnv;

static void fnv_byte(fnv *f, char c) {
    f->h ^= (uint8_t)c;
    f->h *= 0x100000001b3ull;
}

/* FNV-1a 64 of the normalised text: inside {{ }} / {% %} whitespace outside quoted strings is dropped; {# #} comments
 * are dropped; literal text between tags is dropped when it is only whitespace, kept byte for byte otherwise. */
static uint64_t template_hash(const char *s, size_t n) {
    fnv f = {0xcbf29ce484222325ull};
    size_t i = 0;
    while (i < n) {
        if (s[i] == '{' && i + 1 < n && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
            const char open = s[i + 1], close = open == '{' ? '}' : open;
            if (open == '#') { /* comment: up to "#}" */
                size_t j = i + 2;
                while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
                i = j + 2;
                continue;
            }
            fnv_byte(&f, '{'), fnv_byte(&f, open);
            size_t j = i + 2;
            while (j < n && !(s[j] == close && j + 1 < n && s[j + 1] == '}')) {
                if (s[j] == '\'' || s[j] == '"') { /* a string literal, escapes and all */
                    const char q = s[j];
                    fnv_byte(&f, s[j++]);
                    while (j < n && s[j] != q) {
                        if (s[j] == '\\' && j + 1 < n) fnv_byte(&f, s[j++]);
                        fnv_byte(&f, s[j++]);
                    }
                    if (j < n) fnv_byte(&f, s[j++]);
                } else if (is_space(s[j])) j++;
                else fnv_byte(&f, s[j++]);
            }
            fnv_byte(&f, close), fnv_byte(&f, '}');
            i = j + 2;
            continue;
        }
        size_t j = i; /* literal text up to the next tag */
        bool blank = true;
        while (j < n && !(s[j] == '{' && j + 1 < n && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#'))) {
            if (!is_space(s[j])) blank = false;
            j++;
        }
        if (!blank)
            for (size_t k = i; k < j; k++) fnv_byte(&f, s[k]);
        i = j;
    }
    return f.h;
}

static const tmpl_info *find_by_name(const char *name) {
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(k_templates[i].name, name) == 0) return &k_templates[i];
    return NULL;
}

static const tmpl_info *find_by_text(const char *text) {
    const uint64_t h = template_hash(text, strlen(text));
    for (int i = 0; i < N_TEMPLATES; i++)
        if (k_templates[i].hash == h) return &k_templates[i];
    return NULL;
}

/* A special token as tokenizer_config.json writes it: a string, or an object with "content" (AddedToken). */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* The template text of dir: chat_template.jinja first (transformers prefers it), else tokenizer_config.json's
 * "chat_template" (a string, or a list of {name, template} of which "default" is the one used). *text is malloc'd,
 * NULL when the checkpoint has none; *where names its file for messages; bos/eos from tokenizer_config.json. */
static fm_status read_template(const char *dir, char **text, char *where, size_t where_cap, char **bos, char **eos,
                               fm_error *err) {
    char path[4096];
    fm_path_buf pb;
    *text = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *root = NULL;
    fm_status st = FM_OK;
    if (access(path, F_OK) == 0) {
        char *buf = NULL;
        size_t n = 0;
        st = fm_read_regular(path, "tokenizer_config.json", 64u << 20, &buf, &n, err);
        if (!st) st = fm_json_parse_object(buf, n, fm_path_show(&pb, path), "tokenizer_config", &root, err);
        free(buf);
        if (st) return st;
        *bos = dup_or_null(token_text(cJSON_GetObjectItemCaseSensitive(root, "bos_token")));
        *eos = dup_or_null(token_text(cJSON_GetObjectItemCaseSensitive(root, "eos_token")));
    }
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    if (access(jpath, F_OK) == 0) {
        size_t n = 0;
        st = fm_read_regular(jpath, "chat_template.jinja", 16u << 20, text, &n, err);
        if (!st && strlen(*text) != n)
            st = fm_fail(err, FM_ERR_FORMAT, "%s: a NUL byte in the template", fm_path_show(&pb, jpath));
        snprintf(where, where_cap, "%s", fm_path_show(&pb, jpath));
    } else if (root) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        snprintf(where, where_cap, "%s", fm_path_show(&pb, path));
        if (cJSON_IsString(ct)) *text = strdup(ct->valuestring);
        else if (cJSON_IsArray(ct)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, ct) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0 && cJSON_IsString(tp))
                    *text = strdup(tp->valuestring);
            }
            if (!*text)
                st = fm_fail(err, FM_ERR_UNSUPPORTED,
                             "%s: chat_template lists named templates but none named 'default'; pass --chat-template "
                             "NAME (" NAME_LIST ")",
                             where);
        } else if (ct && !cJSON_IsNull(ct))
            st = fm_fail(err, FM_ERR_FORMAT, "%s: chat_template is neither a string nor a list of {name, template}",
                         where);
    }
    cJSON_Delete(root);
    return st;
}

void fm_chat_template_free(fm_chat_template *t) {
    if (!t) return;
    free(t->bos), free(t->eos);
    free(t);
}

fm_status fm_chat_template_load(const char *dir, const char *name, fm_chat_template **out, fm_error *err) {
    *out = NULL;
    const tmpl_info *info = NULL;
    if (name) {
        info = find_by_name(name);
        if (!info)
            return fm_fail(err, FM_ERR_USAGE, "--chat-template %s: not a template fp8moe renders; one of " NAME_LIST,
                           name);
    }
    char *text = NULL, *bos = NULL, *eos = NULL;
    char where[FM_PATH_SHOWN + 64] = "";
    fm_status st = dir ? read_template(dir, &text, where, sizeof where, &bos, &eos, err) : FM_OK;
    if (!st && !info) {
        fm_path_buf pb;
        if (!dir) st = fm_fail(err, FM_ERR_USAGE, "no model directory and no --chat-template NAME (" NAME_LIST ")");
        else if (!text)
            st = fm_fail(err, FM_ERR_UNSUPPORTED,
                         "%s: no chat template (neither chat_template.jinja nor a chat_template in "
                         "tokenizer_config.json); pass --chat-template NAME to choose one of " NAME_LIST,
                         fm_path_show(&pb, dir));
        else if (!(info = find_by_text(text)))
            st = fm_fail(err, FM_ERR_UNSUPPORTED,
                         "%s: the chat template is not one fp8moe recognises (it renders " NAME_LIST
                         " exactly as their official templates do); pass --chat-template NAME to use one of them",
                         where);
    }
    free(text);
    fm_chat_template *t = st ? NULL : fm_calloc(1, sizeof *t, err, "chat template");
    if (!st && !t) st = FM_ERR_NOMEM;
    if (!st) {
        const bool mistral = info->kind == TMPL_MISTRAL || info->kind == TMPL_MISTRAL_LEGACY;
        t->info = info;
        t->bos = bos ? bos : strdup(mistral ? "<s>" : "");
        t->eos = eos ? eos : strdup(mistral ? "</s>" : "<|im_end|>");
        bos = eos = NULL;
        if (!t->bos || !t->eos) {
            fm_chat_template_free(t);
            t = NULL;
            st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the chat template");
        }
    }
    free(bos), free(eos);
    *out = t;
    return st;
}

const char *fm_chat_template_name(const fm_chat_template *t) { return t->info->name; }

const char *const *fm_chat_template_stop_tokens(const fm_chat_template *t) {
    return t->info->kind == TMPL_QWEN3 || t->info->kind == TMPL_CHATML ? k_stop_chatml : k_stop_none;
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

/* A piece of a string: Python's slices of message contents. */
typedef struct span {
    const char *p;
    size_t n;
} span;

static span span_of(const char *s) { return (span){s, strlen(s)}; }
static void put_span(sbuf *b, span s) { put_n(b, s.p, s.n); }

static span lstrip_nl(span s) { /* s.lstrip('\n') */
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static span rstrip_nl(span s) { /* s.rstrip('\n') */
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* The first (or last) occurrence of needle in s; NULL when none. */
static const char *find_first(span s, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++)
        if (memcmp(s.p + i, needle, m) == 0) return s.p + i;
    return NULL;
}

static const char *find_last(span s, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = s.n >= m ? s.n - m + 1 : 0; i-- > 0;)
        if (memcmp(s.p + i, needle, m) == 0) return s.p + i;
    return NULL;
}

static span after(span s, const char *at, const char *needle) {
    const size_t skip = (size_t)(at - s.p) + strlen(needle);
    return (span){s.p + skip, s.n - skip};
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static bool is_role(const fm_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

/* Qwen3's official template without tools (fm_chat_msg has no tool schemas or tool_calls). */
static void render_qwen3(sbuf *b, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *o) {
    if (is_role(&msgs[0], "system")) put(b, "<|im_start|>system\n"), put(b, msgs[0].content), put(b, "<|im_end|>\n");
    /* The last user query: the last user message that is not a wrapped tool response. Assistant turns after it
     * keep their reasoning; earlier ones lose it. */
    int32_t last_query = n - 1;
    for (int32_t i = n - 1; i >= 0; i--)
        if (is_role(&msgs[i], "user") &&
            !(starts_with(msgs[i].content, "<tool_response>") && ends_with(msgs[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int32_t i = 0; i < n; i++) {
        const fm_chat_msg *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            put(b, "<|im_start|>"), put(b, m->role), put(b, "\n"), put(b, m->content), put(b, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            const span all = span_of(m->content);
            span content = all, reasoning = {"", 0};
            const char *end_think = find_last(all, "</think>");
            if (end_think) {
                content = lstrip_nl(after(all, end_think, "</think>")); /* split('</think>')[-1].lstrip('\n') */
                span before = rstrip_nl((span){all.p, (size_t)(find_first(all, "</think>") - all.p)});
                const char *open = find_last(before, "<think>"); /* .split('<think>')[-1].lstrip('\n') */
                reasoning = lstrip_nl(open ? after(before, open, "<think>") : before);
            }
            if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
                put(b, "<|im_start|>assistant\n<think>\n");
                put_span(b, rstrip_nl(lstrip_nl(reasoning))); /* .strip('\n') */
                put(b, "\n</think>\n\n");
                put_span(b, lstrip_nl(content));
            } else put(b, "<|im_start|>assistant\n"), put_span(b, content);
            put(b, "<|im_end|>\n");
        } else if (is_role(m, "tool")) { /* consecutive tool results: one user turn */
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) put(b, "<|im_start|>user");
            put(b, "\n<tool_response>\n"), put(b, m->content), put(b, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool")) put(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) {
        put(b, "<|im_start|>assistant\n");
        if (!o->enable_thinking) put(b, "<think>\n\n</think>\n\n");
    }
}

static void render_chatml(sbuf *b, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *o) {
    for (int32_t i = 0; i < n; i++)
        put(b, "<|im_start|>"), put(b, msgs[i].role), put(b, "\n"), put(b, msgs[i].content), put(b, "<|im_end|>\n");
    if (o->add_generation_prompt) put(b, "<|im_start|>assistant\n");
}

static const char *const MISTRAL_ALTERNATE =
    "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...";
static const char *const MISTRAL_ROLES =
    "Only user and assistant roles are supported, with the exception of an initial optional system message!";
static const char *const LEGACY_ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/...";
static const char *const LEGACY_ROLES = "Only user and assistant roles are supported!";

/* Both [INST] templates ignore add_generation_prompt: a conversation ending with a user turn is the prompt.
 * Returns the template's own error text, NULL when it renders. */
static const char *render_mistral(sbuf *b, const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, int32_t *at) {
    const bool legacy = t->info->kind == TMPL_MISTRAL_LEGACY;
    const char *system = !legacy && is_role(&msgs[0], "system") ? msgs[0].content : NULL;
    const int32_t first = system ? 1 : 0;
    put(b, t->bos);
    for (int32_t i = first; i < n; i++) {
        const fm_chat_msg *m = &msgs[i];
        *at = i;
        if (is_role(m, "user") != ((i - first) % 2 == 0)) return legacy ? LEGACY_ALTERNATE : MISTRAL_ALTERNATE;
        if (is_role(m, "user")) {
            put(b, legacy ? "[INST] " : " [INST] ");
            if (system && i == first) put(b, system), put(b, "\n\n");
            put(b, m->content), put(b, " [/INST]");
        } else if (is_role(m, "assistant")) {
            if (!legacy) put(b, " ");
            put(b, m->content), put(b, t->eos);
        } else return legacy ? LEGACY_ROLES : MISTRAL_ROLES;
    }
    return NULL;
}

fm_status fm_chat_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *opts,
                         char **text, fm_error *err) {
    *text = NULL;
    const char *name = t->info->name;
    if (n <= 0) return fm_fail(err, FM_ERR_USAGE, "chat template %s: the conversation has no messages", name);
    for (int32_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return fm_fail(err, FM_ERR_USAGE, "chat template %s: message %d has no %s", name, i,
                           msgs[i].role ? "content" : "role");
        const char *r = msgs[i].role;
        const bool known = !strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") || !strcmp(r, "tool");
        if (!known && (t->info->kind == TMPL_QWEN3 || t->info->kind == TMPL_CHATML))
            return fm_fail(err, FM_ERR_USAGE,
                           "chat template %s: message %d has the role '%s'; the roles are system, user, assistant, "
                           "tool",
                           name, i, r);
    }
    sbuf b = {0};
    const char *refused = NULL;
    int32_t at = 0;
    switch (t->info->kind) {
    case TMPL_QWEN3: render_qwen3(&b, msgs, n, opts); break;
    case TMPL_CHATML: render_chatml(&b, msgs, n, opts); break;
    case TMPL_MISTRAL:
    case TMPL_MISTRAL_LEGACY: refused = render_mistral(&b, t, msgs, n, &at); break;
    }
    put(&b, ""); /* an empty rendering is still a string */
    if (refused) {
        free(b.p);
        return fm_fail(err, FM_ERR_USAGE, "chat template %s: %s (message %d, role '%s')", name, refused, at,
                       msgs[at].role);
    }
    if (b.oom) {
        free(b.p);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory rendering the conversation");
    }
    *text = b.p;
    return FM_OK;
}

/* ---- an adapter to the variables form, until the interpreter lands: messages' role and content only ---- */
const char *fm_chat_template_source(const fm_chat_template *t) {
    return t->info->kind == TMPL_QWEN3 ? "<tool_call> <think> enable_thinking" : "";
}
const char *fm_chat_template_path(const fm_chat_template *t) { return t->info->name; }
fm_status fm_chat_template_apply(const fm_chat_template *t, const cJSON *vars, char **text, fm_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(vars, "messages");
    const int n = cJSON_GetArraySize(msgs);
    fm_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(msgs, i);
        m[i].role = cJSON_GetObjectItemCaseSensitive(v, "role")->valuestring;
        m[i].content = cJSON_GetObjectItemCaseSensitive(v, "content")->valuestring;
    }
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(vars, "enable_thinking");
    const fm_chat_opts co = {.add_generation_prompt = true, .enable_thinking = !cJSON_IsFalse(et)};
    fm_status st = fm_chat_render(t, m, n, &co, text, err);
    free(m);
    return st;
}
