/* Chat templates: a conversation (messages, tools, kwargs) to the prompt text a model was trained on, by the
 * checkpoint's own Jinja template run by the sandboxed interpreter of jinja.h, in Hugging Face's environment.
 *
 * The template comes from the model directory (chat_template.jinja, chat_template.json, or tokenizer_config.json's
 * "chat_template": a string, or a list of {name, template} of which "default" is used, and "tool_use" for requests
 * with tools), or from a file given by --chat-template FILE. The special tokens of tokenizer_config.json (bos_token,
 * eos_token, ...) are passed to it as transformers passes them. Output equals transformers'
 * apply_chat_template(..., tokenize=False) byte for byte (tests/test_chat_template.c checks it against jinja2). */
#ifndef FM_TEXT_CHAT_TEMPLATE_H
#define FM_TEXT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "fp8moe.h"

typedef struct fm_chat_template fm_chat_template;

/* The template of model_dir, or of template_file when it is not NULL (a .jinja text, or a .json file holding
 * {"chat_template": ...}); model_dir may be NULL with a template_file (then no special tokens). FM_ERR_UNSUPPORTED
 * naming --chat-template when the checkpoint has no template; FM_ERR_FORMAT with the line for a template the
 * interpreter cannot parse; FM_ERR_IO for a file that cannot be read. */
fm_status fm_chat_template_load(const char *model_dir, const char *template_file, fm_chat_template **out,
                                fm_error *err);
void fm_chat_template_free(fm_chat_template *t);

/* vars: a cJSON object the template sees: messages (OpenAI shape, objects passed through as they are: role,
 * content, tool_calls, tool_call_id, name, reasoning_content...), tools (optional), add_generation_prompt, and any
 * chat_template_kwargs (enable_thinking, ...). The special tokens, and tools/documents = None and
 * add_generation_prompt = False as transformers passes them, are added unless vars has them. *text is malloc'd.
 * FM_ERR_USAGE when the template refuses the conversation: raise_exception's message is err's text as the template
 * wrote it; any other failure (an undefined attribute, a type error, a sandbox limit) is prefixed with the path. */
fm_status fm_chat_template_apply(const fm_chat_template *t, const cJSON *vars, char **text, fm_error *err);

/* The variables the template sees for vars (vars plus what apply adds, as above); the caller deletes it. */
cJSON *fm_chat_template_context(const fm_chat_template *t, const cJSON *vars);

const char *fm_chat_template_source(const fm_chat_template *t); /* the Jinja text (parsers sniff the family) */
const char *fm_chat_template_path(const fm_chat_template *t);   /* where it came from, for messages */

/* The strings that end an assistant turn: the eos_token, and the known end-of-turn markers the template's text uses
 * (<|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>, <end_of_turn>, ...); NULL-ended. */
const char *const *fm_chat_template_stop_tokens(const fm_chat_template *t);

/* ---- plain conversations (the CLI): role and content only ---- */

typedef struct fm_chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8 */
} fm_chat_msg;

typedef enum fm_chat_think {
    FM_THINK_DEFAULT = 0, /* enable_thinking not passed: the template's default */
    FM_THINK_ON = 1,      /* enable_thinking=True */
    FM_THINK_OFF = 2,     /* enable_thinking=False */
} fm_chat_think;

typedef struct fm_chat_opts {
    bool add_generation_prompt;    /* end with the assistant's turn opened */
    fm_chat_think enable_thinking; /* the enable_thinking kwarg, or none */
} fm_chat_opts;

/* fm_chat_template_apply on {"messages": [{role, content}...], add_generation_prompt, enable_thinking}. */
fm_status fm_chat_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *opts,
                         char **text, fm_error *err);

#endif
