/* The chat reply's parts (chat.h): the model's text through the reasoning split, then the tool-call parser.
 *
 * Streamed, the parts gathered between two chunks become one delta: reasoning_content, content, and tool_calls
 * entries as OpenAI streams them (a call's first entry has its index, id, type and name with empty arguments;
 * later entries carry the index and a fragment of the arguments). Not streamed, they become the message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
#include "serve/serve_internal.h"

/* call_<24 random characters>, as OpenAI's ids look */
static void call_id(char *out, size_t cap) {
    static const char k_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char r[25];
    for (int i = 0; i < 24; i++) r[i] = k_alnum[serve_random() % (sizeof k_alnum - 1)];
    r[24] = 0;
    snprintf(out, cap, "call_%s", r);
}

static void on_reasoning(void *u, const char *s, size_t n) {
    job *j = u;
    sb_put(j->stream ? &j->chatq->d_reasoning : &j->chatq->reasoning, s, n);
}

static void on_content(void *u, const char *s, size_t n) {
    job *j = u;
    if (j->chatq->stop_now) return; /* parallel_tool_calls false: nothing after the first call */
    sb_put(j->stream ? &j->chatq->d_content : &j->text, s, n);
}

static void on_answer(void *u, const char *s, size_t n) {
    job *j = u;
    if (j->chatq->parser) fm_tool_parser_push(j->chatq->parser, s, n);
    else on_content(u, s, n);
}

static cJSON *calls_array(job *j) {
    cJSON **a = j->stream ? &j->chatq->d_calls : &j->chatq->calls;
    if (!*a) *a = cJSON_CreateArray();
    return *a;
}

static void on_call_begin(void *u, int32_t index, const char *name) {
    job *j = u;
    chat_req *q = j->chatq;
    if (q->stop_now) return;
    char id[40];
    call_id(id, sizeof id);
    cJSON *c = cJSON_CreateObject();
    if (j->stream) cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", "");
    cJSON_AddItemToArray(calls_array(j), c);
}

/* appends s to the arguments string of the array's last entry when it is call `index`; else a new entry */
static void on_call_arguments(void *u, int32_t index, const char *s, size_t n) {
    job *j = u;
    chat_req *q = j->chatq;
    if (q->stop_now) return;
    cJSON *a = calls_array(j), *last = cJSON_GetArrayItem(a, cJSON_GetArraySize(a) - 1);
    const cJSON *li = last ? cJSON_GetObjectItemCaseSensitive(last, "index") : NULL;
    const bool same = last && (!j->stream || (cJSON_IsNumber(li) && li->valueint == index));
    if (!same) {
        last = cJSON_CreateObject();
        cJSON_AddNumberToObject(last, "index", index);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(last, "function"), "arguments", "");
        cJSON_AddItemToArray(a, last);
    }
    cJSON *args = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(last, "function"), "arguments");
    sbuf b = {0};
    sb_puts(&b, args->valuestring);
    sb_put(&b, s, n);
    cJSON_SetValuestring(args, b.p);
    sb_free(&b);
}

static void on_call_end(void *u, int32_t index) {
    job *j = u;
    (void)index;
    chat_req *q = j->chatq;
    if (q->stop_now) return;
    q->n_calls++;
    if (!q->parallel) q->stop_now = true;
}

void chat_out_begin(job *j) {
    chat_req *q = j->chatq;
    fm_reasoning_init(&q->split, q->reasoning_fmt, q->opened, on_reasoning, on_answer, j);
    q->counting = q->opened;
    if (q->tool_fmt != FM_TOOLS_NONE) {
        const fm_tool_events ev = {j, on_content, on_call_begin, on_call_arguments, on_call_end};
        q->parser = fm_tool_parser_create(q->tool_fmt, &ev);
        if (!q->parser) abort(); /* a small allocation */
    }
}

void chat_out_token(job *j, int32_t id) {
    chat_req *q = j->chatq;
    if (!q || q->reasoning_fmt == FM_REASONING_NONE) return;
    const srv *s = j->s;
    if (!q->first_seen && s->chat_think_start >= 0 && id == s->chat_think_start) q->counting = true;
    q->first_seen = true;
    if (q->counting) {
        q->n_reasoning_tokens++;
        if (s->chat_think_end >= 0 && id == s->chat_think_end) q->counting = false;
    }
}

bool chat_out_stop(const job *j) { return j->chatq && j->chatq->stop_now; }

void chat_out_push(job *j, const char *text, size_t len) { fm_reasoning_push(&j->chatq->split, text, len); }

void chat_out_finish(job *j) {
    chat_req *q = j->chatq;
    fm_reasoning_finish(&q->split);
    if (q->parser) fm_tool_parser_finish(q->parser);
}

bool chat_out_delta(job *j, cJSON *delta) {
    chat_req *q = j->chatq;
    bool any = false;
    if (q->d_reasoning.n) {
        cJSON_AddStringToObject(delta, "reasoning_content", q->d_reasoning.p);
        q->d_reasoning.n = 0, any = true;
    }
    if (q->d_content.n) {
        cJSON_AddStringToObject(delta, "content", q->d_content.p);
        q->d_content.n = 0, any = true;
    }
    if (q->d_calls) {
        cJSON_AddItemToObject(delta, "tool_calls", q->d_calls);
        q->d_calls = NULL, any = true;
    }
    return any;
}

void chat_out_message(job *j, cJSON *m) {
    chat_req *q = j->chatq;
    const char *text = j->text.p ? j->text.p : "";
    if (!text[0] && q->calls) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", text);
    if (q->reasoning.n) cJSON_AddStringToObject(m, "reasoning_content", q->reasoning.p);
    if (q->calls) {
        cJSON_AddItemToObject(m, "tool_calls", q->calls);
        q->calls = NULL;
    }
}

const char *chat_out_finish_reason(const job *j, const char *finish) {
    const chat_req *q = j->chatq;
    if (q && q->n_calls > 0 && (!finish || strcmp(finish, "length"))) return "tool_calls";
    return finish;
}

int64_t chat_out_reasoning_tokens(const job *j) { return j->chatq ? j->chatq->n_reasoning_tokens : 0; }

void chat_out_free(job *j) {
    chat_req *q = j->chatq;
    if (!q) return;
    fm_tool_parser_free(q->parser);
    sb_free(&q->d_reasoning), sb_free(&q->d_content), sb_free(&q->reasoning);
    cJSON_Delete(q->d_calls), cJSON_Delete(q->calls), cJSON_Delete(q->tools);
    chat_constraint_free(q);
    free(q);
    j->chatq = NULL;
}
