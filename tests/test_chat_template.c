/* Chat templates (src/text/chat_template.c): recognition of the official templates in tests/chat_templates/, the
 * errors that name --chat-template, and rendering byte for byte equal to transformers' apply_chat_template.
 *
 * The golden cases (tests/chat_templates/golden.json, made by tools/make_golden_chat.py with transformers) are the
 * oracle; the hand-written cases below were worked out by reading the templates, one line of Jinja at a time, and
 * keep the suite meaningful where the golden file is absent. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "text/chat_template.h"

#define FIXTURES "tests/chat_templates"
#define QWEN3_DIR FIXTURES "/qwen3-30b-a3b"
#define MIXTRAL_DIR FIXTURES "/mixtral-8x7b-instruct-v0.1"
#define MIXTRAL_2023_DIR FIXTURES "/mixtral-8x7b-instruct-v0.1-2023"
#define CHATML_DIR FIXTURES "/chatml"

static char g_case[512]; /* the golden case being checked, named when it fails */

static fm_chat_template *load(const char *dir, const char *name) {
    fm_chat_template *t = NULL;
    fm_error err = {{0}};
    fm_status st = fm_chat_template_load(dir, name, &t, &err);
    if (st) fprintf(stderr, "load %s: %s\n", dir ? dir : name, err.msg);
    assert_int_equal(st, FM_OK);
    assert_non_null(t);
    return t;
}

/* Renders msgs and compares with want (NULL: expects FM_ERR_USAGE with want_error in its message). */
static void check_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, bool gen, bool think,
                         const char *want, const char *want_error) {
    fm_chat_opts o = {gen, think};
    char *text = NULL;
    fm_error err = {{0}};
    fm_status st = fm_chat_render(t, msgs, n, &o, &text, &err);
    if (want) {
        if (st) fprintf(stderr, "%s\nrender: %s\n", g_case, err.msg);
        assert_int_equal(st, FM_OK);
        if (strcmp(text, want) != 0) fprintf(stderr, "%s\ngot:\n[%s]\nwant:\n[%s]\n", g_case, text, want);
        assert_string_equal(text, want);
    } else {
        assert_int_equal(st, FM_ERR_USAGE);
        assert_null(text);
        if (st != FM_ERR_USAGE || !strstr(err.msg, want_error))
            fprintf(stderr, "%s\ngot %s: %s\nwant the error: %s\n", g_case, fm_status_name(st), err.msg, want_error);
        assert_non_null(strstr(err.msg, want_error));
    }
    free(text);
}

static void test_recognises_the_official_templates(void **state) {
    (void)state;
    const char *dirs[] = {QWEN3_DIR, CHATML_DIR, MIXTRAL_DIR, MIXTRAL_2023_DIR};
    const char *names[] = {"qwen3", "chatml", "mistral", "mistral-legacy"};
    for (int i = 0; i < 4; i++) {
        fm_chat_template *t = load(dirs[i], NULL);
        assert_string_equal(fm_chat_template_name(t), names[i]);
        fm_chat_template_free(t);
    }
}

static char g_dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/fp8moe_chat_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_files(void) {
    char path[256];
    const char *names[] = {"chat_template.jinja", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        unlink(path);
    }
}

static int remove_dir(void **state) {
    (void)state;
    remove_files();
    return rmdir(g_dir);
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

/* The Qwen3 template with CRLF line ends, four more spaces of indentation and a trailing newline: the same
 * template, recognised; one character changed inside a string literal: another template, refused. */
static void test_recognition_survives_reformatting_only(void **state) {
    (void)state;
    char *text = read_all(QWEN3_DIR "/chat_template.jinja");
    const size_t n = strlen(text);
    char *crlf = malloc(n * 7 + 2), *q = crlf;
    assert_non_null(crlf);
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n') q += sprintf(q, "\r\n    ");
        else *q++ = text[i];
    }
    strcpy(q, "\n");
    write_file("chat_template.jinja", crlf);
    fm_chat_template *t = load(g_dir, NULL);
    assert_string_equal(fm_chat_template_name(t), "qwen3");
    fm_chat_template_free(t);

    char *changed = strstr(text, "'<think>\\n\\n</think>\\n\\n'");
    assert_non_null(changed);
    changed[1] = '['; /* '[think>...' */
    write_file("chat_template.jinja", text);
    fm_error err = {{0}};
    t = NULL;
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "--chat-template"));
    assert_non_null(strstr(err.msg, "chat_template.jinja"));
    assert_non_null(strstr(err.msg, "qwen3, chatml, mistral, mistral-legacy"));
    free(text), free(crlf);
    remove_files();
}

/* tokenizer_config.json's chat_template as a list of named templates: "default" is the one used. */
static void test_named_template_list(void **state) {
    (void)state;
    cJSON *cfg = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(cfg, "chat_template");
    cJSON *tool = cJSON_CreateObject(), *def = cJSON_CreateObject();
    cJSON_AddStringToObject(tool, "name", "tool_use");
    cJSON_AddStringToObject(tool, "template", "{{ messages }}");
    char *chatml = read_all(CHATML_DIR "/chat_template.jinja");
    cJSON_AddStringToObject(def, "name", "default");
    cJSON_AddStringToObject(def, "template", chatml);
    cJSON_AddItemToArray(list, tool);
    cJSON_AddItemToArray(list, def);
    char *json = cJSON_Print(cfg);
    write_file("tokenizer_config.json", json);
    fm_chat_template *t = load(g_dir, NULL);
    assert_string_equal(fm_chat_template_name(t), "chatml");
    fm_chat_template_free(t);

    cJSON_DeleteItemFromArray(list, 1); /* no "default" left */
    free(json);
    json = cJSON_Print(cfg);
    write_file("tokenizer_config.json", json);
    fm_error err = {{0}};
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'default'"));
    assert_non_null(strstr(err.msg, "--chat-template"));
    free(json), free(chatml);
    cJSON_Delete(cfg);
    remove_files();
}

static void test_missing_template_and_names(void **state) {
    (void)state;
    fm_chat_template *t = NULL;
    fm_error err = {{0}};
    /* a checkpoint without a template (the bundled model has none) */
    assert_int_equal(fm_chat_template_load("models/tiny-code-moe", NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "no chat template"));
    assert_non_null(strstr(err.msg, "--chat-template"));
    assert_non_null(strstr(err.msg, "qwen3, chatml, mistral, mistral-legacy"));
    /* a template without chat_template in tokenizer_config.json */
    write_file("tokenizer_config.json", "{\"bos_token\": null}");
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--chat-template"));
    remove_files();
    /* --chat-template NAME forces one, with or without a directory */
    t = load("models/tiny-code-moe", "chatml");
    assert_string_equal(fm_chat_template_name(t), "chatml");
    fm_chat_template_free(t);
    t = load(NULL, "mistral");
    assert_string_equal(fm_chat_template_name(t), "mistral");
    fm_chat_template_free(t);
    t = load(QWEN3_DIR, "mistral-legacy"); /* the name wins over the checkpoint's template */
    assert_string_equal(fm_chat_template_name(t), "mistral-legacy");
    fm_chat_template_free(t);
    /* an unknown name lists the names */
    assert_int_equal(fm_chat_template_load(QWEN3_DIR, "llama3", &t, &err), FM_ERR_USAGE);
    assert_null(t);
    assert_non_null(strstr(err.msg, "--chat-template llama3"));
    assert_non_null(strstr(err.msg, "qwen3, chatml, mistral, mistral-legacy"));
}

static void test_stop_tokens(void **state) {
    (void)state;
    fm_chat_template *t = load(QWEN3_DIR, NULL);
    const char *const *stop = fm_chat_template_stop_tokens(t);
    assert_string_equal(stop[0], "<|im_end|>");
    assert_null(stop[1]);
    fm_chat_template_free(t);
    t = load(MIXTRAL_DIR, NULL);
    assert_null(fm_chat_template_stop_tokens(t)[0]); /* its turns end with eos, the model's own end id */
    fm_chat_template_free(t);
}

/* Hand-derived from the Qwen3 template (tests/chat_templates/qwen3-30b-a3b/chat_template.jinja). */
static void test_qwen3_by_hand(void **state) {
    (void)state;
    fm_chat_template *t = load(QWEN3_DIR, NULL);
    const fm_chat_msg hi[] = {{"user", "Hi"}};
    /* the generation prompt; enable_thinking=false adds the empty think block after it */
    check_render(t, hi, 1, true, true, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", NULL);
    check_render(t, hi, 1, true, false,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", NULL);
    /* messages[0] system: its own turn before the loop */
    const fm_chat_msg sys[] = {{"system", "S"}, {"user", "U"}};
    check_render(t, sys, 2, false, true, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n", NULL);
    /* an assistant turn before the last user query loses its reasoning: content.split('</think>')[-1].lstrip('\n') */
    const fm_chat_msg earlier[] = {{"user", "Hi"}, {"assistant", "<think>\nR\n</think>\n\nHello!"}, {"user", "Q"}};
    check_render(t, earlier, 3, true, true,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                 "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
                 NULL);
    /* the last message, after the last query: '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content */
    const fm_chat_msg last[] = {{"user", "Hi"}, {"assistant", "<think>\nR\n</think>\n\nHello!"}};
    check_render(t, last, 2, false, true,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nHello!<|im_end|>\n",
                 NULL);
    /* ... and an empty think block when it has no reasoning */
    const fm_chat_msg plain[] = {{"user", "Hi"}, {"assistant", "Hello!"}};
    check_render(t, plain, 2, false, true,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n",
                 NULL);
    /* consecutive tool messages: one user turn of <tool_response> blocks; the assistant turn between the query and
     * them is neither last nor has reasoning, so it stays as written */
    const fm_chat_msg tools[] = {{"user", "W?"}, {"assistant", "call"}, {"tool", "a"}, {"tool", "b"}};
    check_render(t, tools, 4, true, true,
                 "<|im_start|>user\nW?<|im_end|>\n<|im_start|>assistant\ncall<|im_end|>\n"
                 "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
                 "<|im_end|>\n<|im_start|>assistant\n",
                 NULL);
    /* roles the template has no branch for are refused rather than silently dropped */
    const fm_chat_msg odd[] = {{"developer", "x"}};
    check_render(t, odd, 1, true, true, NULL, "role 'developer'");
    check_render(t, odd, 0, true, true, NULL, "no messages");
    fm_chat_template_free(t);
}

/* Hand-derived from the two Mixtral templates and the plain ChatML one. */
static void test_mistral_and_chatml_by_hand(void **state) {
    (void)state;
    fm_chat_template *t = load(MIXTRAL_DIR, NULL);
    /* the system message joins the first user turn: ' [INST] ' + system + '\n\n' + content + ' [/INST]' */
    const fm_chat_msg conv[] = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}};
    check_render(t, conv, 4, true, true, "<s> [INST] S\n\nU [/INST] A</s> [INST] V [/INST]", NULL);
    check_render(t, conv, 4, false, true, "<s> [INST] S\n\nU [/INST] A</s> [INST] V [/INST]", NULL);
    const fm_chat_msg first_assistant[] = {{"assistant", "A"}, {"user", "U"}};
    check_render(t, first_assistant, 2, true, true, NULL,
                 "After the optional system message, conversation roles must alternate "
                 "user/assistant/user/assistant/...");
    const fm_chat_msg late_system[] = {{"user", "U"}, {"system", "S"}};
    check_render(t, late_system, 2, true, true, NULL,
                 "Only user and assistant roles are supported, with the exception of an initial optional system "
                 "message!");
    fm_chat_template_free(t);

    t = load(MIXTRAL_2023_DIR, NULL); /* no space before [INST] or the answer, no system message */
    check_render(t, conv + 1, 3, true, true, "<s>[INST] U [/INST]A</s>[INST] V [/INST]", NULL);
    check_render(t, conv, 4, true, true, NULL, "Conversation roles must alternate user/assistant/user/assistant/...");
    fm_chat_template_free(t);

    t = load(CHATML_DIR, NULL);
    check_render(t, conv, 2, true, true,
                 "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", NULL);
    fm_chat_template_free(t);
}

/* Every case of golden.json, rendered byte for byte as transformers rendered it. */
static void test_golden(void **state) {
    (void)state;
    const char *path = FIXTURES "/golden.json";
    if (access(path, F_OK) != 0) {
        fprintf(stderr, "note: %s is absent (python3 tools/make_golden_chat.py makes it); golden cases skipped\n",
                path);
        skip();
    }
    char *text = read_all(path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) > 0);
    int n_text = 0, n_error = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        char dir[256];
        snprintf(dir, sizeof dir, FIXTURES "/%s", cJSON_GetObjectItemCaseSensitive(c, "fixture")->valuestring);
        fm_chat_template *t = load(dir, NULL);
        assert_string_equal(fm_chat_template_name(t), cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
        const int32_t n = (int32_t)cJSON_GetArraySize(msgs);
        fm_chat_msg *m = calloc((size_t)n, sizeof *m);
        assert_non_null(m);
        for (int32_t i = 0; i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(msgs, i);
            m[i].role = cJSON_GetObjectItemCaseSensitive(e, "role")->valuestring;
            m[i].content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        }
        const bool gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        const bool think = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "enable_thinking")); /* null: true */
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *want_error = cJSON_GetObjectItemCaseSensitive(c, "error");
        snprintf(g_case, sizeof g_case, "golden case %s: %s (generation prompt %d, thinking %d)", dir + sizeof FIXTURES,
                 cJSON_GetObjectItemCaseSensitive(c, "conversation")->valuestring, gen, think);
        check_render(t, m, n, gen, think, cJSON_IsString(want) ? want->valuestring : NULL,
                     cJSON_IsString(want_error) ? want_error->valuestring : NULL);
        assert_true(cJSON_IsString(want) || cJSON_IsString(want_error));
        n_text += cJSON_IsString(want), n_error += cJSON_IsString(want_error);
        free(m);
        fm_chat_template_free(t);
    }
    g_case[0] = 0;
    fprintf(stderr, "golden: %d renderings and %d refusals equal to transformers'\n", n_text, n_error);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recognises_the_official_templates),
        cmocka_unit_test(test_recognition_survives_reformatting_only),
        cmocka_unit_test(test_named_template_list),
        cmocka_unit_test(test_missing_template_and_names),
        cmocka_unit_test(test_stop_tokens),
        cmocka_unit_test(test_qwen3_by_hand),
        cmocka_unit_test(test_mistral_and_chatml_by_hand),
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
