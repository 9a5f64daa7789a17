/* The OpenAI API's shapes: request bodies of /v1/completions and /v1/chat/completions into a job, and the job's
 * tokens into replies (one JSON object, or server-sent event chunks), with text-level stop strings. */
#include <sys/random.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>

#include "serve/serve_internal.h"

void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) abort(); /* a reply's text: small; running out here leaves nothing sensible to send */
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) abort();
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int oa_fail(oa_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status, e->type = type, e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

char *oa_error_json(const oa_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    sbuf msg = {0}, param = {0}; /* a message may quote what the client sent: never its invalid UTF-8 raw */
    utf8_sanitize(&msg, e->message), utf8_sanitize(&param, e->param);
    cJSON_AddStringToObject(o, "message", msg.p);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (param.n) cJSON_AddStringToObject(o, "param", param.p);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    sb_free(&msg), sb_free(&param);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static int bad(oa_error *e, const char *param, const char *fmt, const char *what) {
    return oa_fail(e, 400, "invalid_request_error", NULL, param, fmt, param, what);
}

/* optional fields: absent or null leaves *out as it is; a wrong type is a 400 naming the field */
static int get_number(const cJSON *root, const char *name, double lo, double hi, double *out, oa_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad(e, name, "'%s' must be a number%s", "");
    if (v->valuedouble < lo || v->valuedouble > hi)
        return oa_fail(e, 400, "invalid_request_error", NULL, name, "'%s' must be in [%g, %g], got %g", name, lo, hi,
                       v->valuedouble);
    *out = v->valuedouble;
    return 0;
}

static int get_int(const cJSON *root, const char *name, double lo, double hi, int64_t *out, oa_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return bad(e, name, "'%s' must be an integer%s", "");
    if (v->valuedouble < lo || v->valuedouble > hi)
        return oa_fail(e, 400, "invalid_request_error", NULL, name, "'%s' must be in [%.0f, %.0f], got %.0f", name, lo,
                       hi, v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *root, const char *name, bool *out, oa_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be a boolean%s", "");
    *out = cJSON_IsTrue(v);
    return 0;
}

int oa_encode(srv *s, const char *text, bool add_special, job *j, oa_error *e) {
    if (!s->tok)
        return oa_fail(e, 501, "server_error", "tokenizer_unavailable", NULL,
                       "this server has no tokenizer for the model (%s): send /v1/completions with prompt as an array "
                       "of token ids",
                       s->tok_error);
    fm_error err;
    if (fm_tokenizer_encode(s->tok, text, strlen(text), add_special, true, &j->prompt, &j->n_prompt, &err))
        return oa_fail(e, 400, "invalid_request_error", NULL, "prompt", "the prompt could not be tokenized: %s",
                       err.msg);
    return 0;
}

static int parse_prompt(srv *s, const cJSON *root, job *j, oa_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p)) return bad(e, "prompt", "'%s' is required%s", "");
    if (cJSON_IsString(p)) return oa_encode(s, p->valuestring, true, j, e);
    if (!cJSON_IsArray(p)) return bad(e, "prompt", "'%s' must be a string or an array of token ids%s", "");
    const int n = cJSON_GetArraySize(p);
    if (n == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        return oa_encode(s, cJSON_GetArrayItem(p, 0)->valuestring, true, j, e);
    if (n == 0) return bad(e, "prompt", "'%s' is empty%s", "");
    if (!cJSON_IsNumber(cJSON_GetArrayItem(p, 0)))
        return bad(e, "prompt", "'%s': one prompt per request (a string or an array of token ids; n = 1)%s", "");
    j->prompt = malloc((size_t)n * sizeof *j->prompt);
    if (!j->prompt) return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    j->n_prompt = n;
    int i = 0;
    for (const cJSON *v = p->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= s->vocab)
            return oa_fail(e, 400, "invalid_request_error", NULL, "prompt",
                           "'prompt' item %d is not a token id in [0, %d)", i, s->vocab);
        j->prompt[i] = (int32_t)v->valuedouble;
    }
    return 0;
}

static int parse_stop(const cJSON *root, job *j, oa_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    const int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > 16) return bad(e, "stop", "'%s' must be a string or an array of at most 16 strings%s", "");
    j->stops = calloc((size_t)n + 1, sizeof *j->stops);
    if (!j->stops) return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s) || !s->valuestring[0]) return bad(e, "stop", "'%s' must hold non-empty strings%s", "");
        if (!(j->stops[j->n_stops++] = strdup(s->valuestring)))
            return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* a seed for a request that names none: two such requests must not sample the same text */
static int64_t random_seed(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return (int64_t)(v >> 1);
}

/* logit_bias: {"<token id>": bias in [-100, 100]} (OpenAI's shape: ids as the object's keys) */
static int parse_logit_bias(srv *s, const cJSON *root, job *j, oa_error *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return bad(e, "logit_bias", "'%s' must be an object of token ids (as strings) to biases in [-100, 100]%s", "");
    const int n = cJSON_GetArraySize(lb);
    if (n > FM_MAX_LOGIT_BIAS)
        return oa_fail(e, 400, "invalid_request_error", NULL, "logit_bias", "'logit_bias' has %d entries, at most %d",
                       n, FM_MAX_LOGIT_BIAS);
    j->bias = calloc((size_t)n + 1, sizeof *j->bias);
    if (!j->bias) return oa_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (const cJSON *v = lb->child; v; v = v->next) {
        char *end = NULL;
        const long id = strtol(v->string, &end, 10);
        if (!v->string[0] || *end || id < 0 || id >= s->vocab)
            return oa_fail(e, 400, "invalid_request_error", NULL, "logit_bias",
                           "'logit_bias' key '%.40s' is not a token id in [0, %d)", v->string, s->vocab);
        if (!cJSON_IsNumber(v) || v->valuedouble < -100 || v->valuedouble > 100)
            return oa_fail(e, 400, "invalid_request_error", NULL, "logit_bias",
                           "'logit_bias' of token %ld must be a number in [-100, 100]", id);
        j->bias[j->n_bias++] = (fm_logit_bias){(int32_t)id, (float)v->valuedouble};
    }
    return 0;
}

int oa_parse(srv *s, const char *body, size_t len, bool chat, job *j, oa_error *e) {
    if (body_check(body, len, e)) return e->status;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return oa_fail(e, 400, "invalid_request_error", NULL, NULL, "the body is not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(root))
        rc = oa_fail(e, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
    if (!rc) rc = fields_check(root, chat, s->o.strict_fields, &j->unknown_fields, e);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!rc && model && !cJSON_IsNull(model) && !cJSON_IsString(model))
        rc = bad(e, "model", "'%s' must be a string%s", "");
    if (!rc && cJSON_IsString(model) && strcmp(model->valuestring, s->model_name))
        rc = oa_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%s' does not exist: this server serves '%s'", model->valuestring, s->model_name);
    j->chat = chat;
    fm_gen_params *g = &j->params;
    fm_gen_params_init(g);
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, presence = 0.0, frequency = 0.0, repetition = 1.0;
    int64_t top_k = 0, seed = random_seed(), n = 1, max_tokens = -1, logprobs = -1, top_logprobs = -1;
    bool ignore_eos = false, want_lp = false, echo = false;
    if (!rc) rc = get_number(root, "temperature", 0, 2, &temperature, e);
    if (!rc) rc = get_number(root, "top_p", 0, 1, &top_p, e);
    if (!rc && top_p <= 0) rc = oa_fail(e, 400, "invalid_request_error", NULL, "top_p", "'top_p' must be in (0, 1]");
    if (!rc) rc = get_int(root, "top_k", -1, 1e9, &top_k, e);
    if (!rc) rc = get_number(root, "min_p", 0, 0.999999, &min_p, e);
    if (!rc) rc = get_number(root, "presence_penalty", -2, 2, &presence, e);
    if (!rc) rc = get_number(root, "frequency_penalty", -2, 2, &frequency, e);
    if (!rc) rc = get_number(root, "repetition_penalty", 1e-6, 1e6, &repetition, e);
    if (!rc) rc = get_int(root, "seed", -9.2e18, 9.2e18, &seed, e);
    if (!rc) rc = get_int(root, "n", 1, 1e9, &n, e);
    if (!rc && n != 1)
        rc = oa_fail(e, 400, "invalid_request_error", NULL, "n", "only n = 1 is supported, got %lld", (long long)n);
    if (!rc) rc = get_int(root, "max_tokens", 1, 1e9, &max_tokens, e);
    if (!rc && chat) rc = get_int(root, "max_completion_tokens", 1, 1e9, &max_tokens, e);
    if (!rc) rc = get_bool(root, "stream", &j->stream, e);
    if (!rc) rc = get_bool(root, "ignore_eos", &ignore_eos, e);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!rc && so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) rc = bad(e, "stream_options", "'%s' must be an object%s", "");
        if (!rc) rc = get_bool(so, "include_usage", &j->include_usage, e);
    }
    if (chat) {
        if (!rc) rc = get_bool(root, "logprobs", &want_lp, e);
        if (!rc) rc = get_int(root, "top_logprobs", 0, FM_MAX_LOGPROBS, &top_logprobs, e);
        if (!rc && top_logprobs >= 0 && !want_lp)
            rc =
                oa_fail(e, 400, "invalid_request_error", NULL, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        j->n_logprobs = top_logprobs > 0 ? (int32_t)top_logprobs : 0;
    } else {
        if (!rc) rc = get_int(root, "logprobs", 0, FM_MAX_LOGPROBS, &logprobs, e);
        want_lp = logprobs >= 0, j->n_logprobs = logprobs > 0 ? (int32_t)logprobs : 0;
        if (!rc) rc = get_bool(root, "echo", &echo, e);
        if (!rc && echo) rc = oa_fail(e, 400, "invalid_request_error", NULL, "echo", "'echo' is not supported");
        int64_t best_of = 1;
        if (!rc) rc = get_int(root, "best_of", 1, 1, &best_of, e);
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (!rc && suffix && !cJSON_IsNull(suffix))
            rc = oa_fail(e, 400, "invalid_request_error", NULL, "suffix", "'suffix' is not supported");
    }
    j->want_logprobs = want_lp;
    if (!rc) rc = parse_stop(root, j, e);
    if (!rc) rc = parse_logit_bias(s, root, j, e);
    if (!rc) rc = chat ? chat_parse(s, root, j, e) : parse_prompt(s, root, j, e);
    if (!rc && j->n_prompt < 1)
        rc = oa_fail(e, 400, "invalid_request_error", NULL, chat ? "messages" : "prompt", "the prompt is empty");
    if (!rc) {
        const int64_t room = s->ctx - j->n_prompt;
        if (max_tokens < 0) max_tokens = chat ? room : (room < 16 ? room : 16);
        if (max_tokens < 1 || j->n_prompt + max_tokens > s->ctx) /* the prompt alone fills the context */
            rc = oa_fail(e, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                         "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                         "(%lld in the prompt, %lld for the completion). Please reduce the prompt or max_tokens.",
                         (long long)s->ctx, (long long)(j->n_prompt + (max_tokens > 0 ? max_tokens : 1)),
                         (long long)j->n_prompt, (long long)(max_tokens > 0 ? max_tokens : 1));
    }
    cJSON_Delete(root);
    if (rc) return rc;
    g->max_tokens = max_tokens, g->temperature = fm_sampler_temperature(temperature),
    g->top_p = fm_sampler_top_p(top_p);
    g->top_k = (int32_t)(top_k < 0 ? 0 : top_k), g->min_p = (float)min_p, g->presence_penalty = (float)presence;
    g->frequency_penalty = (float)frequency, g->repetition_penalty = (float)repetition, g->seed = (uint64_t)seed;
    g->ignore_eos = ignore_eos;
    g->logit_bias = j->bias, g->n_logit_bias = j->n_bias;
    if (j->chatq && j->chatq->constraint) g->constraint = &j->constraint;
    if (chat && s->n_tmpl_stop_ids) {
        memcpy(j->stop_ids, s->tmpl_stop_ids, (size_t)s->n_tmpl_stop_ids * sizeof *j->stop_ids);
        g->stop_ids = j->stop_ids, g->n_stop_ids = s->n_tmpl_stop_ids;
    }
    return 0;
}

/* ---- replies ---- */

static cJSON *chunk_base(const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object",
                            j->chat ? (j->stream ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static cJSON *usage_json(const job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->n_prompt + j->n_completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)j->n_cached);
    if (j->chat) {
        cJSON *c = cJSON_AddObjectToObject(u, "completion_tokens_details");
        cJSON_AddNumberToObject(c, "reasoning_tokens", (double)chat_out_reasoning_tokens(j));
    }
    return u;
}

static void send_event(job *j, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    sb_puts(&j->out, "data: ");
    sb_puts(&j->out, s);
    sb_puts(&j->out, "\n\n");
    free(s);
    cJSON_Delete(o);
}

/* The text of one token alone, for logprobs (special tokens as written) */
static char *token_text(const job *j, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    fm_error err;
    if (j->s->tok && !fm_tokenizer_decode(j->s->tok, &id, 1, false, &t, &n, &err)) return t;
    free(t);
    char buf[32];
    snprintf(buf, sizeof buf, "<%d>", id);
    return strdup(buf);
}

static cJSON *bytes_json(const char *t) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Adds the log-probabilities of the tokens items[0..n) to lp (created when NULL), in the endpoint's shape:
 *   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
 *   completions: {"tokens": [], "token_logprobs": [], "top_logprobs": [{token: logprob}], "text_offset": []} */
static cJSON *add_logprobs(job *j, cJSON *lp, const tok_item *items, int64_t n) {
    if (!lp) {
        lp = cJSON_CreateObject();
        if (j->chat) cJSON_AddArrayToObject(lp, "content");
        else {
            cJSON_AddArrayToObject(lp, "tokens"), cJSON_AddArrayToObject(lp, "token_logprobs");
            cJSON_AddArrayToObject(lp, "top_logprobs"), cJSON_AddArrayToObject(lp, "text_offset");
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const tok_item *it = &items[i];
        char *t = token_text(j, it->id);
        if (j->chat) {
            cJSON *c = cJSON_CreateObject(), *top = cJSON_CreateArray();
            cJSON_AddStringToObject(c, "token", t);
            cJSON_AddNumberToObject(c, "logprob", it->logprob);
            cJSON_AddItemToObject(c, "bytes", bytes_json(t));
            for (int32_t k = 0; k < it->n_top; k++) {
                char *tt = token_text(j, it->top[k].id);
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "token", tt);
                cJSON_AddNumberToObject(e, "logprob", it->top[k].logprob);
                cJSON_AddItemToObject(e, "bytes", bytes_json(tt));
                cJSON_AddItemToArray(top, e);
                free(tt);
            }
            cJSON_AddItemToObject(c, "top_logprobs", top);
            cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "content"), c);
        } else {
            cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(t));
            cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(it->logprob));
            cJSON *top = cJSON_CreateObject();
            for (int32_t k = 0; k < it->n_top; k++) {
                char *tt = token_text(j, it->top[k].id);
                if (!cJSON_GetObjectItemCaseSensitive(top, tt)) cJSON_AddNumberToObject(top, tt, it->top[k].logprob);
                free(tt);
            }
            cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
            cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)j->text_bytes));
        }
        free(t);
    }
    return lp;
}

/* one stream chunk: text (may be ""), the tokens' logprobs, the finish reason (NULL while running) */
static void send_chunk(job *j, const char *text, size_t len, const tok_item *items, int64_t n, const char *finish) {
    cJSON *o = chunk_base(j), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (!j->role_sent) cJSON_AddStringToObject(d, "role", "assistant"), j->role_sent = true;
        if (!chat_out_delta(j, d) && !finish) cJSON_AddStringToObject(d, "content", "");
    } else {
        char *t = strndup(text, len);
        cJSON_AddStringToObject(c, "text", t);
        free(t);
    }
    if (j->want_logprobs && n > 0) cJSON_AddItemToObject(c, "logprobs", add_logprobs(j, NULL, items, n));
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", j->chat ? chat_out_finish_reason(j, finish) : finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    send_event(j, o);
}

/* text that is ready to go out (the stop strings checked) */
static void emit_text(job *j, const char *text, size_t len, const tok_item *items, int64_t n, const char *finish) {
    if (j->chatq) chat_out_push(j, text, len); /* the parts wait in the job until the chunk takes them */
    if (j->stream) {
        if (len || n || finish || (j->chat && !j->role_sent)) send_chunk(j, text, len, items, n, finish);
    } else {
        if (!j->chatq) sb_put(&j->text, text, len);
        if (j->want_logprobs && n) j->lp = add_logprobs(j, j->lp, items, n);
    }
    j->text_bytes += (int64_t)len;
}

/* where the first stop string begins in s (-1: none); *slen its length */
static int64_t find_stop(const job *j, const char *s, size_t n, size_t *slen) {
    int64_t best = -1;
    for (int32_t k = 0; k < j->n_stops; k++) {
        const size_t L = strlen(j->stops[k]);
        for (size_t i = 0; i + L <= n; i++)
            if (!memcmp(s + i, j->stops[k], L)) {
                if (best < 0 || (int64_t)i < best) best = (int64_t)i, *slen = L;
                break;
            }
    }
    return best;
}

/* the longest tail of s that begins some stop string: held back until the next token decides */
static size_t held_tail(const job *j, const char *s, size_t n) {
    size_t hold = 0;
    for (int32_t k = 0; k < j->n_stops; k++) {
        const size_t L = strlen(j->stops[k]);
        for (size_t h = L - 1 < n ? L - 1 : n; h > hold; h--)
            if (!memcmp(s + n - h, j->stops[k], h)) {
                hold = h;
                break;
            }
    }
    return hold;
}

static const char *finish_name(fm_sched_end end) { return end == FM_SCHED_LENGTH ? "length" : "stop"; }

bool oa_consume(job *j, const tok_item *items, int64_t n, bool ended, fm_sched_end end, const char *err_msg) {
    bool stopped = false;
    for (int64_t i = 0; i < n && !j->text_done; i++) {
        j->n_completion++;
        if (j->chatq) chat_out_token(j, items[i].id);
        const char *piece = j->detok ? fm_detok_push(j->detok, items[i].id) : "";
        sb_puts(&j->pending, piece);
        size_t slen = 0;
        const int64_t at = find_stop(j, j->pending.p ? j->pending.p : "", j->pending.n, &slen);
        if (at >= 0) {
            emit_text(j, j->pending.p, (size_t)at, &items[i], 1, NULL);
            j->text_done = stopped = true, j->finish = "stop";
            break;
        }
        const size_t hold = held_tail(j, j->pending.p ? j->pending.p : "", j->pending.n);
        const size_t go = j->pending.n - hold;
        emit_text(j, j->pending.p ? j->pending.p : "", go, &items[i], 1, NULL);
        if (j->pending.p) memmove(j->pending.p, j->pending.p + go, hold + 1);
        j->pending.n = hold;
        if (chat_out_stop(j)) { /* one tool call was all the request allowed */
            j->text_done = stopped = true, j->finish = "stop";
            break;
        }
    }
    if (!ended || j->closed) return stopped;
    j->closed = true;
    if (end == FM_SCHED_ERROR) {
        if (j->stream) {
            oa_error e;
            oa_fail(&e, 500, "server_error", NULL, NULL, "%s", err_msg && err_msg[0] ? err_msg : "generation failed");
            char *s = oa_error_json(&e);
            sb_puts(&j->out, "data: ");
            sb_puts(&j->out, s);
            sb_puts(&j->out, "\n\ndata: [DONE]\n\n");
            free(s);
        }
        return stopped;
    }
    const bool cut = end == FM_SCHED_CANCELLED && j->cut; /* the server stopped before the request ended */
    if (cut && j->stream) {
        oa_error e;
        oa_fail(&e, 503, "server_error", "server_shutting_down", NULL,
                "the server shut down before the request finished (--drain-timeout): the text is cut short");
        char *s = oa_error_json(&e);
        sb_puts(&j->out, "data: ");
        sb_puts(&j->out, s);
        sb_puts(&j->out, "\n\n");
        free(s);
    }
    if (!j->text_done) {
        if (j->detok) sb_puts(&j->pending, fm_detok_flush(j->detok));
        size_t slen = 0;
        const int64_t at = find_stop(j, j->pending.p ? j->pending.p : "", j->pending.n, &slen);
        emit_text(j, j->pending.p ? j->pending.p : "", at >= 0 ? (size_t)at : j->pending.n, NULL, 0, NULL);
        j->finish = at >= 0 ? "stop" : cut ? "abort" : finish_name(end);
        j->text_done = true;
    }
    if (j->chatq) chat_out_finish(j);
    if (j->stream) {
        send_chunk(j, "", 0, NULL, 0, j->finish);
        if (j->include_usage) {
            cJSON *o = chunk_base(j);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            send_event(j, o);
        }
        sb_puts(&j->out, "data: [DONE]\n\n");
    }
    return stopped;
}

char *oa_final_json(job *j) {
    cJSON *o = chunk_base(j), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    const char *text = j->text.p ? j->text.p : "";
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        chat_out_message(j, m);
    } else cJSON_AddStringToObject(c, "text", text);
    if (j->want_logprobs) {
        if (!j->lp) j->lp = add_logprobs(j, NULL, NULL, 0);
        cJSON_AddItemToObject(c, "logprobs", j->lp);
        j->lp = NULL;
    } else cJSON_AddNullToObject(c, "logprobs");
    const char *finish = j->finish ? j->finish : "stop";
    cJSON_AddStringToObject(c, "finish_reason", j->chat ? chat_out_finish_reason(j, finish) : finish);
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

uint64_t serve_random(void) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy source: the clock, mixed */
        r = (uint64_t)(serve_now() * 1e9) ^ (uint64_t)(uintptr_t)&r;
        r ^= r >> 33, r *= 0xff51afd7ed558ccdull, r ^= r >> 33;
    }
    return r;
}

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
