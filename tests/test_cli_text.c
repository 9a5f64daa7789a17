/* fp8moe generate --prompt TEXT / --chat: text in through the tokenizer (and the chat template), text out streamed.
 *
 * On models/tiny-code-moe (a trained model with its own tokenizer.json, no chat template): the printed text is the
 * decoding of the ids written to --out, the prompt is the tokenizer's encoding of the text (or of the rendered chat),
 * and generating from those ids with --ids gives the same ids; a chat needs a template or --chat-template FILE. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli_runner.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#define MODEL "models/tiny-code-moe"

static void expect_error(int code, int want, const char *needle) {
    if (code != want || !strstr(cli_err, needle))
        fail_msg("exit %d (want %d); stderr should name '%s': %s", code, want, needle, cli_err);
}

/* The prompt length generate reported in --json. */
static int json_n_prompt(const char *path) {
    static char text[1 << 16];
    slurp(path, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *seq = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "sequences"), 0);
    const int n = cJSON_GetObjectItem(seq, "n_prompt")->valueint;
    cJSON_Delete(root);
    return n;
}

static fm_tokenizer *tokenizer(void) {
    fm_tokenizer *t = NULL;
    fm_error err = {{0}};
    if (fm_tokenizer_load(MODEL, &t, &err)) fail_msg("%s", err.msg);
    return t;
}

static void prompt_text_streams_the_completion(void **s) {
    (void)s;
    const char *prompt = "def add(a, b):\n    ";
    char out[512], json[512], ids_path[512];
    snprintf(out, sizeof out, "%s/new.i32", cli_tmp);
    snprintf(json, sizeof json, "%s/new.json", cli_tmp);
    snprintf(ids_path, sizeof ids_path, "%s/prompt.i32", cli_tmp);
    if (fp8moe("generate --model " MODEL " --prompt '%s' --max-tokens 12 --ignore-eos --out %s --json %s", prompt, out,
               json))
        fail_msg("generate --prompt: %s", cli_err);
    assert_non_null(strstr(cli_err, "tokens/s"));
    int32_t got[64];
    const int n = cli_read_ids(out, got, 64);
    assert_int_equal(n, 12);

    /* stdout is the text of the new ids, then a newline */
    fm_tokenizer *t = tokenizer();
    fm_error err = {{0}};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(fm_tokenizer_decode(t, got, n, true, &text, &len, &err), FM_OK);
    assert_true(len > 0);
    assert_int_equal(strlen(cli_out), len + 1);
    assert_memory_equal(cli_out, text, len);
    assert_int_equal(cli_out[len], '\n');
    free(text);

    /* the prompt was the tokenizer's encoding of the text: the same ids through --ids generate the same tokens */
    int32_t *ids = NULL;
    int64_t np = 0;
    assert_int_equal(fm_tokenizer_encode(t, prompt, strlen(prompt), true, true, &ids, &np, &err), FM_OK);
    assert_int_equal(json_n_prompt(json), (int)np);
    cli_write_ids(ids_path, ids, np);
    free(ids);
    fm_tokenizer_free(t);
    if (fp8moe("generate --model " MODEL " --ids %s --max-tokens 12 --ignore-eos --out %s", ids_path, out))
        fail_msg("generate --ids: %s", cli_err);
    int32_t again[64];
    assert_int_equal(cli_read_ids(out, again, 64), 12);
    assert_memory_equal(again, got, sizeof *got * 12);

    /* without --out, only the text */
    assert_int_equal(fp8moe("generate --model " MODEL " --prompt '%s' --max-tokens 12 --ignore-eos", prompt), 0);
    assert_int_equal(strlen(cli_out), len + 1);
    assert_null(strstr(cli_err, "wrote"));
}

/* A model directory: tiny-code-moe's files linked, with the Qwen3 template beside them. */
static void qwen3_chat_model(char *dir, size_t cap) {
    snprintf(dir, cap, "%s/chatmodel", cli_tmp);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && for f in config.json generation_config.json model.safetensors tokenizer.json; do "
             "ln -sf \"$PWD/" MODEL "/$f\" %s/$f; done && "
             "cp tests/chat_templates/qwen3-30b-a3b/chat_template.jinja %s/",
             dir, dir, dir);
    assert_int_equal(system(cmd), 0);
}

static void chat_renders_through_the_template(void **s) {
    (void)s;
    char dir[512], json[512];
    qwen3_chat_model(dir, sizeof dir);
    snprintf(json, sizeof json, "%s/chat.json", cli_tmp);
    if (fp8moe("generate --model %s --prompt 'Write add(a, b).' --chat --system 'You write Python.' --no-think "
               "--max-tokens 4 --ignore-eos --json %s -v",
               dir, json))
        fail_msg("generate --chat: %s", cli_err);
    const char *want = "<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\nWrite add(a, b)."
                       "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    if (!strstr(cli_err, want)) fail_msg("-v should print the rendered prompt: %s", cli_err);
    assert_non_null(strstr(cli_err, "chat template ")); /* and its path */
    assert_non_null(strstr(cli_err, "chat_template.jinja"));
    /* the bundled tokenizer has no <|im_end|>: said, not hidden */
    assert_non_null(strstr(cli_err, "<|im_end|>, which is not a token"));
    /* the prompt is the encoding of the rendered text, without the post-processor's specials */
    fm_tokenizer *t = tokenizer();
    int32_t *ids = NULL;
    int64_t np = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_tokenizer_encode(t, want, strlen(want), false, true, &ids, &np, &err), FM_OK);
    assert_int_equal(json_n_prompt(json), (int)np);
    free(ids);
    fm_tokenizer_free(t);

    /* --chat-template FILE forces another one */
    if (fp8moe("generate --model %s --prompt hi --chat --chat-template tests/chat_templates/chatml/chat_template.jinja "
               "--max-tokens 2 -v",
               dir))
        fail_msg("generate --chat-template FILE: %s", cli_err);
    assert_non_null(strstr(cli_err, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n\n-- end of prompt"));
}

static void chat_errors(void **s) {
    (void)s;
    /* no template in the checkpoint: the error names the flag */
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --chat"), 1, "--chat-template FILE");
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --chat --chat-template llama9.jinja"), 1,
                 "llama9.jinja");
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --system x"), 2, "apply to --chat");
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --no-think"), 2, "apply to --chat");
    expect_error(fp8moe("generate --model " MODEL " --chat"), 2, "need --prompt");
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --ids x.i32"), 2, "excludes --ids");
    expect_error(fp8moe("generate --model " MODEL " --prompt hi --stream"), 2, "--stream");
    expect_error(fp8moe("generate --model " MODEL " --prompt ''"), 2, "no tokens");
    /* a checkpoint without tokenizer.json */
    expect_error(fp8moe("generate --model tests/models/mixtral-f32-sharded --prompt hi --max-tokens 1"), 1,
                 "tokenizer.json");
}

int main(void) {
    cli_timeout_s = 300;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prompt_text_streams_the_completion),
        cmocka_unit_test(chat_renders_through_the_template),
        cmocka_unit_test(chat_errors),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
