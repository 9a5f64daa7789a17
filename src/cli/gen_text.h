/* generate --prompt / --chat: a prompt given as text becomes ids (through the model's chat template with --chat), and
 * the new ids are printed as text while they are generated. */
#ifndef FM_CLI_GEN_TEXT_H
#define FM_CLI_GEN_TEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"
#include "text/tokenizer.h"

typedef struct gen_text_opts {
    const char *prompt;        /* --prompt TEXT */
    const char *system;        /* --system TEXT (with --chat) */
    const char *template_file; /* --chat-template FILE (with --chat); NULL: the checkpoint's */
    bool chat;                 /* --chat: the prompt is one user turn of the chat template */
    bool no_think;             /* --no-think: enable_thinking=false passed to the template */
    bool verbose;              /* print the rendered chat prompt on stderr */
} gen_text_opts;

enum { GEN_TEXT_MAX_STOP = 8 };

typedef struct gen_text {
    fm_tokenizer *tok;
    fm_detok *detok;
    int32_t stop_ids[GEN_TEXT_MAX_STOP]; /* the chat template's end-of-turn ids (<|im_end|>) */
    int32_t n_stop_ids;
    int64_t printed; /* bytes printed so far */
} gen_text;

/* Loads model_dir's tokenizer (and with --chat its template) and encodes the prompt: plain text as `tokenizers`'
 * encode(text, add_special_tokens=True); a chat as the rendered template, whose special tokens are already in the
 * text (add_special_tokens=False, as apply_chat_template(tokenize=True) does). *ids is malloc'd. */
fm_status gen_text_prompt(const char *model_dir, const gen_text_opts *o, gen_text *gt, int32_t **ids, int64_t *n,
                          fm_error *err);

/* fm_token_fn: prints the text of new id (user: gen_text *) on stdout as soon as it is complete UTF-8. */
void gen_text_on_token(void *user, int32_t i, int32_t id);

/* Prints what the detokenizer still holds and a final newline. */
void gen_text_finish(gen_text *gt);

void gen_text_free(gen_text *gt);

#endif
