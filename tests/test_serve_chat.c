/* The chat reply of the agent API without a model: a scripted output (reasoning, content, tool calls) is
 * tokenized by the bundled tokenizer and fed to the reply writer token by token, as the scheduler would; the
 * streamed events and the non-streamed message must carry the parts in OpenAI's shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/serve_internal.h"

static fm_tokenizer *g_tok;

static int setup(void **state) {
    (void)state;
    fm_error err;
    return fm_tokenizer_load("models/tiny-code-moe", &g_tok, &err) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    fm_tokenizer_free(g_tok);
    return 0;
}

/* runs text through a job as generated tokens; returns the job (the caller frees) */
static job *run(srv *s, const char *text, bool stream, bool tools, bool parallel, bool opened) {
    job *j = calloc(1, sizeof *j);
    j->s = s, j->chat = true, j->stream = stream, j->include_usage = true;
    snprintf(j->id, sizeof j->id, "chatcmpl-test");
    fm_error err;
    assert_int_equal(fm_detok_create(g_tok, true, &j->detok, &err), FM_OK);
    j->chatq = calloc(1, sizeof *j->chatq);
    j->chatq->tool_fmt = tools ? FM_TOOLS_HERMES : FM_TOOLS_NONE;
    j->chatq->reasoning_fmt = FM_REASONING_THINK_TAGS;
    j->chatq->parallel = parallel, j->chatq->opened = opened;
    chat_out_begin(j);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(fm_tokenizer_encode(g_tok, text, strlen(text), false, false, &ids, &n, &err), FM_OK);
    bool stopped = false;
    for (int64_t i = 0; i < n && !stopped; i++) {
        const tok_item it = {.id = ids[i]};
        stopped = oa_consume(j, &it, 1, false, FM_SCHED_EOS, NULL);
    }
    oa_consume(j, NULL, 0, true, FM_SCHED_EOS, NULL);
    free(ids);
    return j;
}

static void free_job(job *j) {
    fm_detok_free(j->detok);
    sb_free(&j->pending), sb_free(&j->text), sb_free(&j->out);
    chat_out_free(j);
    free(j);
}

static srv *server(void) {
    srv *s = calloc(1, sizeof *s);
    s->tok = g_tok, s->chat_think_start = s->chat_think_end = -1;
    snprintf(s->model_name, sizeof s->model_name, "test");
    return s;
}

static const char k_agent_text[] =
    "<think>\nThe user wants the weather in Paris.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

static void non_stream_message(void **state) {
    (void)state;
    srv *s = server();
    job *j = run(s, k_agent_text, false, true, true, false);
    char *json = oa_final_json(j);
    cJSON *o = cJSON_Parse(json);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    const cJSON *m = cJSON_GetObjectItem(c, "message");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "tool_calls");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
    assert_string_equal(cJSON_GetObjectItem(m, "reasoning_content")->valuestring,
                        "The user wants the weather in Paris.");
    const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
    assert_int_equal(cJSON_GetArraySize(calls), 2);
    const cJSON *c0 = cJSON_GetArrayItem(calls, 0), *f0 = cJSON_GetObjectItem(c0, "function");
    assert_string_equal(cJSON_GetObjectItem(c0, "type")->valuestring, "function");
    assert_int_equal(strncmp(cJSON_GetObjectItem(c0, "id")->valuestring, "call_", 5), 0);
    assert_null(cJSON_GetObjectItem(c0, "index")); /* the message's calls carry no index */
    assert_string_equal(cJSON_GetObjectItem(f0, "name")->valuestring, "get_weather");
    assert_string_equal(cJSON_GetObjectItem(f0, "arguments")->valuestring, "{\"city\": \"Paris\"}");
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function"), "name")->valuestring,
        "get_time");
    cJSON_Delete(o);
    free(json);
    free_job(j);
    /* without tools the same text is reasoning and content */
    j = run(s, k_agent_text, false, false, true, false);
    json = oa_final_json(j);
    o = cJSON_Parse(json);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    m = cJSON_GetObjectItem(c, "message");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    assert_non_null(strstr(cJSON_GetObjectItem(m, "content")->valuestring, "<tool_call>"));
    assert_null(cJSON_GetObjectItem(m, "tool_calls"));
    cJSON_Delete(o);
    free(json);
    free_job(j);
    free(s);
}

/* the stream's events, joined per field as a client does */
static void stream_deltas(void **state) {
    (void)state;
    srv *s = server();
    job *j = run(s, k_agent_text, true, true, true, false);
    char reasoning[512] = "", content[512] = "", name0[64] = "", args0[256] = "", id0[64] = "", finish[32] = "";
    int n_calls = 0, n_events = 0;
    bool done = false;
    for (char *line = strtok(j->out.p, "\n"); line; line = strtok(NULL, "\n")) {
        assert_int_equal(strncmp(line, "data: ", 6), 0);
        if (!strcmp(line + 6, "[DONE]")) {
            done = true;
            continue;
        }
        cJSON *o = cJSON_Parse(line + 6);
        assert_non_null(o);
        n_events++;
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItem(ch, "delta");
        const cJSON *fr = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(fr)) snprintf(finish, sizeof finish, "%s", fr->valuestring);
        const cJSON *r = cJSON_GetObjectItem(d, "reasoning_content"), *t = cJSON_GetObjectItem(d, "content");
        if (cJSON_IsString(r)) strcat(reasoning, r->valuestring);
        if (cJSON_IsString(t)) strcat(content, t->valuestring);
        for (const cJSON *tc = cJSON_GetObjectItem(d, "tool_calls") ? cJSON_GetObjectItem(d, "tool_calls")->child
                                                                    : NULL;
             tc; tc = tc->next) {
            const int idx = cJSON_GetObjectItem(tc, "index")->valueint;
            const cJSON *f = cJSON_GetObjectItem(tc, "function");
            const cJSON *id = cJSON_GetObjectItem(tc, "id");
            if (id) { /* a call's first entry: id, type, name */
                n_calls++;
                assert_string_equal(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
                assert_non_null(cJSON_GetObjectItem(f, "name"));
                if (idx == 0) {
                    snprintf(id0, sizeof id0, "%s", id->valuestring);
                    snprintf(name0, sizeof name0, "%s", cJSON_GetObjectItem(f, "name")->valuestring);
                }
            }
            if (idx == 0 && cJSON_GetObjectItem(f, "arguments"))
                strcat(args0, cJSON_GetObjectItem(f, "arguments")->valuestring);
        }
        cJSON_Delete(o);
    }
    assert_true(done);
    assert_true(n_events > 4); /* streamed, not in one piece */
    assert_string_equal(reasoning, "The user wants the weather in Paris.");
    assert_string_equal(content, "");
    assert_string_equal(name0, "get_weather");
    assert_string_equal(args0, "{\"city\": \"Paris\"}");
    assert_int_equal(strncmp(id0, "call_", 5), 0);
    assert_int_equal(n_calls, 2);
    assert_string_equal(finish, "tool_calls");
    free_job(j);
    free(s);
}

/* parallel_tool_calls false: the reply ends after the first call */
static void one_call_only(void **state) {
    (void)state;
    srv *s = server();
    job *j = run(s, k_agent_text, false, true, false, false);
    char *json = oa_final_json(j);
    cJSON *o = cJSON_Parse(json);
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tool_calls")), 1);
    cJSON_Delete(o);
    free(json);
    free_job(j);
    /* a prompt that opened the think block: the output starts inside it */
    j = run(s, "Thinking here.\n</think>\n\nThe answer.", false, false, true, true);
    json = oa_final_json(j);
    o = cJSON_Parse(json);
    m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    assert_string_equal(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "Thinking here.");
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "The answer.");
    cJSON_Delete(o);
    free(json);
    free_job(j);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(non_stream_message),
        cmocka_unit_test(stream_deltas),
        cmocka_unit_test(one_call_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
