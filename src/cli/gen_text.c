/* generate --prompt / --chat (gen_text.h). */
#include "cli/gen_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "util/status.h"

/* The conversation of --system and --prompt rendered by the template; *text malloc'd. Adds the template's
 * end-of-turn tokens to gt->stop_ids. */
static fm_status render_chat(const char *model_dir, const gen_text_opts *o, gen_text *gt, char **text, fm_error *err) {
    fm_chat_template *t = NULL;
    fm_status st = fm_chat_template_load(model_dir, o->template_file, &t, err);
    if (st) return st;
    fm_chat_msg msgs[2];
    int32_t n = 0;
    if (o->system) msgs[n++] = (fm_chat_msg){"system", o->system};
    msgs[n++] = (fm_chat_msg){"user", o->prompt};
    const fm_chat_opts opts = {.add_generation_prompt = true,
                               .enable_thinking = o->no_think ? FM_THINK_OFF : FM_THINK_DEFAULT};
    st = fm_chat_render(t, msgs, n, &opts, text, err);
    for (const char *const *s = fm_chat_template_stop_tokens(t); !st && *s; s++) {
        const int32_t id = fm_tokenizer_token_id(gt->tok, *s);
        if (id < 0)
            fprintf(stderr,
                    "fp8moe generate: note: the chat template %s ends a turn with %s, which is not a token of "
                    "%s/tokenizer.json; its turn markers are plain text to this model\n",
                    fm_chat_template_path(t), *s, model_dir);
        else if (gt->n_stop_ids < GEN_TEXT_MAX_STOP) gt->stop_ids[gt->n_stop_ids++] = id;
    }
    if (!st && o->verbose)
        fprintf(stderr, "chat template %s, the prompt:\n%s\n-- end of prompt --\n", fm_chat_template_path(t), *text);
    fm_chat_template_free(t);
    return st;
}

fm_status gen_text_prompt(const char *model_dir, const gen_text_opts *o, gen_text *gt, int32_t **ids, int64_t *n,
                          fm_error *err) {
    memset(gt, 0, sizeof *gt);
    *ids = NULL, *n = 0;
    fm_status st = fm_tokenizer_load(model_dir, &gt->tok, err);
    char *chat = NULL;
    if (!st && o->chat) st = render_chat(model_dir, o, gt, &chat, err);
    const char *text = chat ? chat : o->prompt;
    if (!st) st = fm_tokenizer_encode(gt->tok, text, strlen(text), !o->chat, true, ids, n, err);
    free(chat);
    if (!st && *n == 0) st = fm_fail(err, FM_ERR_USAGE, "--prompt '%s' is no tokens at all: give some text", o->prompt);
    if (!st) st = fm_detok_create(gt->tok, true, &gt->detok, err);
    if (st) {
        free(*ids);
        *ids = NULL, *n = 0;
        gen_text_free(gt);
    }
    return st;
}

void gen_text_on_token(void *user, int32_t i, int32_t id) {
    (void)i;
    gen_text *gt = user;
    const char *s = fm_detok_push(gt->detok, id);
    if (*s) {
        fputs(s, stdout);
        fflush(stdout);
        gt->printed += (int64_t)strlen(s);
    }
}

void gen_text_finish(gen_text *gt) {
    const char *s = fm_detok_flush(gt->detok);
    fputs(s, stdout);
    gt->printed += (int64_t)strlen(s);
    fputc('\n', stdout);
    fflush(stdout);
}

void gen_text_free(gen_text *gt) {
    if (gt->detok) fm_detok_free(gt->detok);
    if (gt->tok) fm_tokenizer_free(gt->tok);
    gt->detok = NULL, gt->tok = NULL;
}
