/* The output parsers of the agent API: the reasoning split (text/reasoning.h) and the tool-call parser
 * (text/tool_calls.h), each fed whole and in every split into two pieces and byte by byte: the events must not
 * depend on how the text arrives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/reasoning.h"
#include "text/tool_calls.h"

typedef struct out {
    char reasoning[1024], answer[1024];
    char log[2048]; /* tool events: C(content) B0:name A0:args E0 */
} out;

static void cat(char *dst, size_t cap, const char *s, size_t n) {
    const size_t at = strlen(dst);
    assert_true(at + n < cap);
    memcpy(dst + at, s, n);
    dst[at + n] = 0;
}

static void on_reasoning(void *u, const char *s, size_t n) { cat(((out *)u)->reasoning, 1024, s, n); }
static void on_answer(void *u, const char *s, size_t n) { cat(((out *)u)->answer, 1024, s, n); }

/* splits: 0 whole, 1 byte by byte, k >= 2 two pieces at byte k - 1 */
static void feed(void (*push)(void *, const char *, size_t), void *obj, const char *text, size_t split) {
    const size_t n = strlen(text);
    if (split == 0) push(obj, text, n);
    else if (split == 1)
        for (size_t i = 0; i < n; i++) push(obj, text + i, 1);
    else {
        const size_t k = split - 1 < n ? split - 1 : n;
        push(obj, text, k), push(obj, text + k, n - k);
    }
}

static void r_push(void *r, const char *s, size_t n) { fm_reasoning_push(r, s, n); }

static void check_split(const char *text, bool open, const char *want_r, const char *want_a) {
    for (size_t split = 0; split <= strlen(text) + 1; split++) {
        out o = {0};
        fm_reasoning_split r;
        fm_reasoning_init(&r, FM_REASONING_THINK_TAGS, open, on_reasoning, on_answer, &o);
        feed(r_push, &r, text, split);
        fm_reasoning_finish(&r);
        if (strcmp(o.reasoning, want_r) || strcmp(o.answer, want_a))
            fail_msg("split %zu of \"%s\": reasoning \"%s\" answer \"%s\", want \"%s\" / \"%s\"", split, text,
                     o.reasoning, o.answer, want_r, want_a);
    }
}

static void test_reasoning_split(void **state) {
    (void)state;
    check_split("<think>\nThe user asks.\n</think>\n\nHello!", false, "The user asks.", "Hello!");
    check_split("The user asks.\n</think>\n\nHello!", true, "The user asks.", "Hello!");
    check_split("Hello, no thinking.", false, "", "Hello, no thinking.");
    check_split("<thin", false, "", "<thin");
    check_split("<think>\ncut short", false, "cut short", "");
    check_split("<think>\n\n</think>\n\nx < y", false, "", "x < y");
    check_split("<think>a</thinkb</think>c", false, "a</thinkb", "c");
    /* the format none passes everything as the answer */
    out o = {0};
    fm_reasoning_split r;
    fm_reasoning_init(&r, FM_REASONING_NONE, false, on_reasoning, on_answer, &o);
    fm_reasoning_push(&r, "<think>x</think>y", 17);
    fm_reasoning_finish(&r);
    assert_string_equal(o.answer, "<think>x</think>y");
    assert_true(fm_reasoning_prompt_opens(FM_REASONING_THINK_TAGS, "<|im_start|>assistant\n<think>\n"));
    assert_false(fm_reasoning_prompt_opens(FM_REASONING_THINK_TAGS, "<think>\n\n</think>\n\n"));
    assert_int_equal(fm_reasoning_format_of_template("{{ '<think>\\n' }}"), FM_REASONING_THINK_TAGS);
    assert_int_equal(fm_reasoning_format_of_template("[INST]"), FM_REASONING_NONE);
}

static void t_content(void *u, const char *s, size_t n) {
    out *o = u;
    cat(o->answer, 1024, s, n);
}
static void t_begin(void *u, int32_t i, const char *name) {
    char b[128];
    snprintf(b, sizeof b, "B%d:%s ", i, name);
    cat(((out *)u)->log, 2048, b, strlen(b));
}
static void t_args(void *u, int32_t i, const char *s, size_t n) {
    out *o = u;
    char b[16];
    snprintf(b, sizeof b, "A%d:", i);
    /* consecutive fragments of one call are joined, so the log does not depend on the split */
    const size_t L = strlen(o->log);
    if (L >= 2 && o->log[L - 1] == '|') o->log[L - 1] = 0;
    else cat(o->log, 2048, b, strlen(b));
    cat(o->log, 2048, s, n);
    cat(o->log, 2048, "|", 1);
}
static void t_end(void *u, int32_t i) {
    char b[16];
    snprintf(b, sizeof b, " E%d ", i);
    cat(((out *)u)->log, 2048, b, strlen(b));
}

static void t_push(void *p, const char *s, size_t n) { fm_tool_parser_push(p, s, n); }

static void check_tools(fm_tool_format f, const char *text, const char *want_content, const char *want_log,
                        int32_t want_calls) {
    const size_t n = strlen(text);
    for (size_t split = 0; split <= n + 1; split++) {
        out o = {0};
        const fm_tool_events ev = {&o, t_content, t_begin, t_args, t_end};
        fm_tool_parser *p = fm_tool_parser_create(f, &ev);
        assert_non_null(p);
        feed(t_push, p, text, split);
        fm_tool_parser_finish(p);
        if (strcmp(o.answer, want_content) || strcmp(o.log, want_log) || fm_tool_parser_calls(p) != want_calls)
            fail_msg("split %zu of \"%s\":\n content \"%s\"\n log \"%s\" (%d calls)\nwant \"%s\"\n log \"%s\"", split,
                     text, o.answer, o.log, fm_tool_parser_calls(p), want_content, want_log);
        fm_tool_parser_free(p);
    }
}

static void test_hermes(void **state) {
    (void)state;
    check_tools(FM_TOOLS_HERMES,
                "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                "</tool_call>",
                "Let me check.", "B0:get_weather A0:{\"city\": \"Paris\"}| E0 ", 1);
    check_tools(FM_TOOLS_HERMES,
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>\n"
                "<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>\n",
                "", "B0:a A0:{\"x\": [1, {\"y\": \"}\"}]}| E0 B1:b A1:{}| E1 ", 2);
    /* not a call object: the block is content, whole */
    check_tools(FM_TOOLS_HERMES, "<tool_call>\nnot json\n</tool_call> after",
                "<tool_call>\nnot json\n</tool_call> after", "", 0);
    /* no call: the text unchanged, a partial tag at the end too */
    check_tools(FM_TOOLS_HERMES, "a < b and <tool", "a < b and <tool", "", 0);
    /* a call cut by the end of the output, its arguments complete: still a call */
    check_tools(FM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": 2}}", "",
                "B0:f A0:{\"k\": 2}| E0 ", 1);
    /* no arguments key: an empty object */
    check_tools(FM_TOOLS_HERMES, "<tool_call>{\"name\": \"now\"}</tool_call>", "", "B0:now A0:{}| E0 ", 1);
    /* parameters, as Llama-style models name them */
    check_tools(FM_TOOLS_HERMES, "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": true}}</tool_call>", "",
                "B0:f A0:{\"a\": true}| E0 ", 1);
}

static void test_mistral(void **state) {
    (void)state;
    check_tools(FM_TOOLS_MISTRAL,
                "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", "",
                "B0:a A0:{\"x\": 1}| E0 B1:b A1:{}| E1 ", 2);
    check_tools(FM_TOOLS_MISTRAL, "Plain answer.", "Plain answer.", "", 0);
    check_tools(FM_TOOLS_MISTRAL, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", "", 0);
}

static void test_formats(void **state) {
    (void)state;
    assert_int_equal(fm_tool_format_of_template("{{- '<tool_call>\\n' }}"), FM_TOOLS_HERMES);
    assert_int_equal(fm_tool_format_of_template("[TOOL_CALLS]"), FM_TOOLS_MISTRAL);
    assert_int_equal(fm_tool_format_of_template("{{ messages }}"), FM_TOOLS_NONE);
    fm_tool_format f;
    fm_error err;
    assert_int_equal(fm_tool_format_parse("qwen3", &f, &err), FM_OK);
    assert_int_equal(f, FM_TOOLS_HERMES);
    assert_int_not_equal(fm_tool_format_parse("bogus", &f, &err), FM_OK);
    assert_non_null(strstr(err.msg, "bogus"));
    fm_reasoning_format r;
    assert_int_not_equal(fm_reasoning_format_parse("bogus", &r, &err), FM_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reasoning_split),
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
