/* Chat templates: a conversation (system, user, assistant, tool turns) to the prompt text a model was trained on.
 *
 * Templates are recognised, not interpreted: the checkpoint's template (tokenizer_config.json "chat_template" or
 * chat_template.jinja) is matched against the families fp8moe renders natively (Qwen3 ChatML with thinking on/off,
 * Mistral/Mixtral [INST]); an unknown template is an error that names --chat-template. Output equals transformers'
 * apply_chat_template(..., tokenize=False) on the same conversation (golden strings in tests/). */
#ifndef FM_TEXT_CHAT_TEMPLATE_H
#define FM_TEXT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"

typedef struct fm_chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8 */
} fm_chat_msg;

typedef struct fm_chat_template fm_chat_template;

/* The template of model directory dir; name (may be NULL) forces one by name ("qwen3", "chatml", "mistral", ...).
 * FM_ERR_UNSUPPORTED naming --chat-template when the checkpoint has no template or an unknown one. */
fm_status fm_chat_template_load(const char *dir, const char *name, fm_chat_template **out, fm_error *err);
void fm_chat_template_free(fm_chat_template *t);
const char *fm_chat_template_name(const fm_chat_template *t);

typedef struct fm_chat_opts {
    bool add_generation_prompt; /* end with the assistant's turn opened */
    bool enable_thinking;       /* Qwen3: true is the template's default; false adds the empty think block */
} fm_chat_opts;

/* Renders n messages; *text is malloc'd, NUL-terminated. FM_ERR_USAGE for a conversation the template rejects
 * (an unknown role, roles out of the order the template requires), with the template's own words. */
fm_status fm_chat_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *opts,
                         char **text, fm_error *err);

/* Extra ids that end an assistant turn beside the model's eos ids (e.g. <|im_end|>), as token strings; NULL-ended. */
const char *const *fm_chat_template_stop_tokens(const fm_chat_template *t);

#endif
#include <cjson/cJSON.h>
const char *fm_chat_template_source(const fm_chat_template *t);
const char *fm_chat_template_path(const fm_chat_template *t);
fm_status fm_chat_template_apply(const fm_chat_template *t, const cJSON *vars, char **text, fm_error *err);
