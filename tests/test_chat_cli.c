/* fp8moe chat: user turns from stdin, answers streamed to stdout, the conversation's KV cache kept between turns.
 *
 * On models/tiny-code-moe (no chat template of its own: --chat-template with the ChatML file), greedy: the second turn
 * reuses the first turn's cache (through the prefix cache: reused tokens > 0) and answers exactly what generating from
 * the whole two-turn conversation, rendered and encoded afresh, gives; --no-reuse (every turn prefilled afresh) gives
 * the same text; /reset starts again with nothing kept (the prefix cache's whole blocks of the same prompt only; with
 * --no-prefix-cache nothing); a full context is said with the way out, and the chat goes on. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_runner.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#define MODEL "models/tiny-code-moe"
#define CHAT "chat --model " MODEL " --chat-template tests/chat_templates/chatml/chat_template.jinja --max-tokens 16"

static const char *U1 = "def add(a, b):", *U2 = "now subtract";

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* The figures chat printed for turn k: prompt tokens and how many came from the cache. */
static void turn_figures(int k, int *n_prompt, int *reused) {
    char key[32];
    snprintf(key, sizeof key, "[turn %d] prompt ", k);
    const char *p = strstr(cli_err, key);
    if (!p || sscanf(p + strlen(key), "%d tokens (reused %d", n_prompt, reused) != 2)
        fail_msg("no figures for turn %d on stderr: %s", k, cli_err);
    assert_non_null(strstr(p, "tokens/s"));
    assert_non_null(strstr(p, "first token"));
}

static void two_turns_continue_the_cache(void **s) {
    (void)s;
    char in1[512], in2[512], ids_path[512], out_path[512];
    snprintf(in1, sizeof in1, "%s/one.txt", cli_tmp);
    snprintf(in2, sizeof in2, "%s/two.txt", cli_tmp);
    snprintf(ids_path, sizeof ids_path, "%s/conv.i32", cli_tmp);
    snprintf(out_path, sizeof out_path, "%s/new.i32", cli_tmp);
    char text[1024];
    snprintf(text, sizeof text, "%s\n", U1);
    write_text(in1, text);
    snprintf(text, sizeof text, "%s\n%s\n", U1, U2);
    write_text(in2, text);

    /* one turn: its answer, then a newline */
    if (fp8moe(CHAT " < %s", in1)) fail_msg("chat: %s", cli_err);
    static char a1[1 << 16];
    snprintf(a1, sizeof a1, "%s", cli_out);
    const size_t l1 = strlen(a1);
    assert_true(l1 > 1);
    assert_int_equal(a1[l1 - 1], '\n');
    a1[l1 - 1] = 0;
    int np1, r1;
    turn_figures(1, &np1, &r1);
    assert_int_equal(r1, 0);

    /* two turns: the first answer again, then the second, which continued the first turn's cache */
    if (fp8moe(CHAT " < %s", in2)) fail_msg("chat: %s", cli_err);
    static char both[1 << 16];
    snprintf(both, sizeof both, "%s", cli_out);
    assert_memory_equal(both, a1, l1 - 1);
    assert_int_equal(both[l1 - 1], '\n');
    const char *a2 = both + l1;
    const size_t l2 = strlen(a2);
    assert_true(l2 > 1);
    assert_int_equal(a2[l2 - 1], '\n');
    int np2, r2;
    turn_figures(2, &np2, &r2);
    assert_true(r2 > 0);
    assert_true(r2 >= np1); /* the whole first prompt at least */
    assert_true(r2 < np2);

    /* the same conversation rendered whole and generated from scratch gives the same second answer */
    fm_error err = {{0}};
    fm_chat_template *t = NULL;
    fm_tokenizer *tok = NULL;
    if (fm_chat_template_load(MODEL, "tests/chat_templates/chatml/chat_template.jinja", &t, &err) ||
        fm_tokenizer_load(MODEL, &tok, &err))
        fail_msg("%s", err.msg);
    const fm_chat_msg msgs[3] = {{"user", U1}, {"assistant", a1}, {"user", U2}};
    const fm_chat_opts co = {.add_generation_prompt = true, .enable_thinking = FM_THINK_ON};
    char *conv = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(fm_chat_render(t, msgs, 3, &co, &conv, &err), FM_OK);
    assert_int_equal(fm_tokenizer_encode(tok, conv, strlen(conv), false, true, &ids, &n, &err), FM_OK);
    assert_int_equal(n, np2);
    cli_write_ids(ids_path, ids, n);
    free(ids), free(conv);
    if (fp8moe("generate --model " MODEL " --ids %s --max-tokens 16 --out %s", ids_path, out_path))
        fail_msg("generate: %s", cli_err);
    int32_t got[64];
    const int ng = cli_read_ids(out_path, got, 64);
    char *want = NULL;
    size_t wl = 0;
    assert_int_equal(fm_tokenizer_decode(tok, got, ng, true, &want, &wl, &err), FM_OK);
    assert_int_equal(l2 - 1, wl);
    assert_memory_equal(a2, want, wl);
    free(want);
    fm_tokenizer_free(tok);
    fm_chat_template_free(t);

    /* every turn prefilled afresh: the same answers, nothing reused */
    if (fp8moe(CHAT " --no-reuse < %s", in2)) fail_msg("chat --no-reuse: %s", cli_err);
    assert_string_equal(cli_out, both);
    int np, r;
    turn_figures(2, &np, &r);
    assert_int_equal(np, np2);
    assert_int_equal(r, 0);
}

static void reset_and_exit(void **s) {
    (void)s;
    char in[512], text[1024];
    snprintf(in, sizeof in, "%s/reset.txt", cli_tmp);
    snprintf(text, sizeof text, "%s\n\n/reset\n%s\n/exit\n%s\n", U1, U1, U2);
    write_text(in, text);
    if (fp8moe(CHAT " < %s", in)) fail_msg("chat: %s", cli_err);
    /* the same answer twice (a new conversation: only the prefix cache's whole 16-token blocks of the same
       prompt are reused), nothing after /exit */
    const size_t n = strlen(cli_out);
    assert_true(n > 2 && n % 2 == 0);
    assert_memory_equal(cli_out, cli_out + n / 2, n / 2);
    assert_non_null(strstr(cli_err, "(a new conversation)"));
    int np1, r1, np2, r2;
    turn_figures(1, &np1, &r1);
    turn_figures(2, &np2, &r2);
    assert_int_equal(np1, np2);
    assert_int_equal(r2, (np2 - 1) / 16 * 16);
    assert_null(strstr(cli_err, "[turn 3]"));
    /* without the prefix cache the new conversation computes everything again */
    if (fp8moe(CHAT " --no-prefix-cache < %s", in)) fail_msg("chat: %s", cli_err);
    assert_memory_equal(cli_out, cli_out + n / 2, n / 2);
    turn_figures(2, &np2, &r2);
    assert_int_equal(r2, 0);
    /* an unknown command is said and skipped */
    snprintf(text, sizeof text, "/help\n");
    write_text(in, text);
    assert_int_equal(fp8moe(CHAT " < %s", in), 0);
    assert_non_null(strstr(cli_err, "unknown command /help"));
    assert_string_equal(cli_out, "");
}

static void context_full_is_said(void **s) {
    (void)s;
    char in[512], text[2048];
    snprintf(in, sizeof in, "%s/long.txt", cli_tmp);
    /* a turn longer than the context, then one that fits */
    snprintf(text, sizeof text, "%s %s %s %s %s %s %s %s\nx\n", U1, U1, U1, U1, U1, U1, U1, U1);
    write_text(in, text);
    assert_int_equal(fp8moe(CHAT " --ctx 48 < %s", in), 0);
    assert_non_null(strstr(cli_err, "the context is full"));
    assert_non_null(strstr(cli_err, "/reset"));
    assert_non_null(strstr(cli_err, "--ctx"));
    int np, r;
    turn_figures(1, &np, &r); /* the long turn was dropped: the short one is turn 1 */
    assert_true(np < 48);
}

static void errors(void **s) {
    (void)s;
    /* no template in the checkpoint: the error names the flag */
    assert_int_equal(fp8moe("chat --model " MODEL " < /dev/null"), 1);
    assert_non_null(strstr(cli_err, "--chat-template"));
    assert_int_equal(fp8moe("chat < /dev/null"), 2);
    assert_non_null(strstr(cli_err, "--model"));
    assert_int_equal(fp8moe(CHAT " --top-p 0 < /dev/null"), 2);
    assert_non_null(strstr(cli_err, "--top-p"));
}

int main(void) {
    cli_timeout_s = 300;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_turns_continue_the_cache),
        cmocka_unit_test(reset_and_exit),
        cmocka_unit_test(context_full_is_said),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
