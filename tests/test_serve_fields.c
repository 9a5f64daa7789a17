/* The server's request checks without a server: the table of request fields (and docs/serving.md, which must hold
 * it as generated), the body checks (UTF-8, \u0000), error replies that never echo invalid UTF-8, the log line. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

static cJSON *parse(const char *json) {
    cJSON *v = cJSON_Parse(json);
    assert_non_null(v);
    return v;
}

/* docs/serving.md holds the table between its markers exactly as fields_markdown writes it */
static void test_doc_table_is_generated(void **state) {
    (void)state;
    FILE *f = fopen("docs/serving.md", "rb");
    assert_non_null(f);
    static char doc[1 << 17];
    const size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    const char *begin = strstr(doc, "<!-- fields:begin");
    const char *end = strstr(doc, "<!-- fields:end -->");
    assert_non_null(begin);
    assert_non_null(end);
    begin = strchr(begin, '\n') + 1;
    sbuf md = {0};
    fields_markdown(&md);
    if ((size_t)(end - begin) != md.n || memcmp(begin, md.p, md.n))
        fail_msg("docs/serving.md's table of fields differs from the code's: regenerate it with "
                 "`fp8moe serve --fields-markdown`");
    sb_free(&md);
}

static void test_statuses(void **state) {
    (void)state;
    static const char *const lead[] = {"tools",           "tool_choice",          "parallel_tool_calls",
                                       "response_format", "chat_template_kwargs", "reasoning_effort",
                                       "logit_bias",      "enable_thinking"};
    for (size_t i = 0; i < sizeof lead / sizeof lead[0]; i++)
        assert_int_equal(fields_status(lead[i], true), FIELD_IMPLEMENTED);
    assert_int_equal(fields_status("user", true), FIELD_NO_EFFECT);
    assert_int_equal(fields_status("user", false), FIELD_NO_EFFECT);
    assert_int_equal(fields_status("metadata", true), FIELD_NO_EFFECT);
    assert_int_equal(fields_status("store", true), FIELD_NO_EFFECT);
    assert_int_equal(fields_status("suffix", false), FIELD_REFUSED);
    assert_int_equal(fields_status("priority", true), FIELD_REFUSED);
    assert_int_equal(fields_status("messages", false), FIELD_OTHER_ENDPOINT);
    assert_int_equal(fields_status("prompt", true), FIELD_OTHER_ENDPOINT);
    assert_int_equal(fields_status("max_completion_tokens", false), FIELD_OTHER_ENDPOINT);
    assert_int_equal(fields_status("no_such_field", true), FIELD_UNKNOWN);
    for (const char *const *f =
             (const char *const[]){"top_k", "min_p", "repetition_penalty", "ignore_eos", "seed", NULL};
         *f; f++) {
        assert_int_equal(fields_status(*f, true), FIELD_IMPLEMENTED);
        assert_int_equal(fields_status(*f, false), FIELD_IMPLEMENTED);
    }
}

static void test_check(void **state) {
    (void)state;
    oa_error e;
    sbuf unknown = {0};
    cJSON *r = parse("{\"prompt\":\"x\",\"suffix\":\"y\"}");
    assert_int_equal(fields_check(r, false, false, &unknown, &e), 400);
    assert_string_equal(e.param, "suffix");
    assert_non_null(strstr(e.message, "fill-in-the-middle"));
    cJSON_Delete(r);
    r = parse("{\"prompt\":\"x\",\"suffix\":null,\"user\":\"u\",\"stream_options\":{\"include_obfuscation\":true}}");
    assert_int_equal(fields_check(r, false, false, &unknown, &e), 0);
    assert_int_equal(unknown.n, 0);
    cJSON_Delete(r);
    r = parse("{\"messages\":[],\"foo\":1,\"stream_options\":{\"bar\":2},\"x\\ny\":3}");
    assert_int_equal(fields_check(r, true, false, &unknown, &e), 0);
    assert_string_equal(unknown.p, "'foo', 'stream_options.bar', 'x\\x0ay'");
    assert_int_equal(fields_check(r, true, true, NULL, &e), 400);
    assert_string_equal(e.param, "foo");
    assert_non_null(strstr(e.message, "--strict-fields"));
    assert_int_equal(fields_check(r, false, false, NULL, &e), 400); /* messages on /v1/completions */
    assert_string_equal(e.param, "messages");
    cJSON_Delete(r);
    sb_free(&unknown);
}

static void test_body_check(void **state) {
    (void)state;
    oa_error e;
    static const char *const good[] = {"{\"prompt\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}", "{\"prompt\":\"a\\\\u0000b\"}",
                                       "{\"prompt\":\"\\u0001\\u00e9\\\"\"}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(body_check(good[i], strlen(good[i]), &e), 0);
    static const char *const bad[] = {"{\"prompt\":\"a\\u0000b\"}", "{\"prompt\":\"\xff\"}",
                                      "{\"prompt\":\"\xc0\xaf\"}", "{\"prompt\":\"\xed\xa0\x80\"}",
                                      "{\"prompt\":\"\xe2\x82\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(body_check(bad[i], strlen(bad[i]), &e), 400);
        assert_string_equal(e.code, "invalid_body");
    }
    assert_int_equal(body_check("{\"a\":\"\0\"}", 9, &e), 400); /* a raw NUL byte */
}

static void test_error_json_is_utf8(void **state) {
    (void)state;
    oa_error e;
    oa_fail(&e, 404, "invalid_request_error", "model_not_found", "mod\xfe", "The model '%s' does not exist",
            "\xff\xfex");
    char *s = oa_error_json(&e);
    assert_int_equal(body_check(s, strlen(s), &e), 0);
    assert_non_null(strstr(s, "\xef\xbf\xbd\xef\xbf\xbdx"));
    free(s);
}

static void test_log_line(void **state) {
    (void)state;
    sbuf o = {0};
    const access_entry a = {.id = "chatcmpl-1",
                            .method = "POST",
                            .path = "/v1/chat/completions\n\xff%",
                            .status = 200,
                            .generation = true,
                            .prompt_tokens = 12,
                            .cached_tokens = 4,
                            .completion_tokens = 10,
                            .ttft_s = 0.0123,
                            .total_s = 0.5,
                            .finish = "length"};
    access_log_format(&o, &a);
    assert_string_equal(o.p, "fp8moe serve: request id=chatcmpl-1 POST /v1/chat/completions%0A%FF%25 status=200 "
                             "prompt_tokens=12 cached_tokens=4 completion_tokens=10 ttft_ms=12.3 total_ms=500.0 "
                             "finish=length\n");
    sb_free(&o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_table_is_generated),
        cmocka_unit_test(test_statuses),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_body_check),
        cmocka_unit_test(test_error_json_is_utf8),
        cmocka_unit_test(test_log_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
