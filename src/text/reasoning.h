/* Reasoning split: a model's output text into its reasoning and its answer, as the text streams.
 *
 * Think-tag models (Qwen3, Qwen3-Next, DeepSeek-R1, QwQ) write `<think>reasoning</think>answer`. The opening tag
 * is either generated (Qwen3 with enable_thinking) or already in the prompt (Qwen3-2507 thinking models and
 * DeepSeek-R1 end the generation prompt with `<think>\n`): `open` says the second case. Output that does not begin
 * with `<think>` and was not opened by the prompt is all answer (Qwen3 with enable_thinking=false: the template
 * wrote the empty think block itself).
 *
 * The split trims what only separates the parts: one newline after `<think>`, the newlines before `</think>`, and
 * the newlines that begin the answer after `</think>` (the template drops the same ones when it renders the turn
 * back into a prompt). A tail of the text that may begin a tag is held back until the next piece decides it. */
#ifndef FM_TEXT_REASONING_H
#define FM_TEXT_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "fp8moe.h"

typedef enum fm_reasoning_format {
    FM_REASONING_NONE = 0,   /* all output is the answer */
    FM_REASONING_THINK_TAGS, /* <think>...</think> (--reasoning-parser qwen3, deepseek_r1) */
} fm_reasoning_format;

/* The format a chat template implies: think tags when its text writes `<think>`, else none. */
fm_reasoning_format fm_reasoning_format_of_template(const char *template_source);
/* --reasoning-parser NAME: qwen3 | deepseek_r1 | none; FM_ERR_USAGE naming the choices otherwise. */
fm_status fm_reasoning_format_parse(const char *name, fm_reasoning_format *out, fm_error *err);
/* True when a rendered prompt leaves a think block open (ends with `<think>` and optional newlines). */
bool fm_reasoning_prompt_opens(fm_reasoning_format f, const char *prompt);

typedef void (*fm_text_sink)(void *user, const char *s, size_t n);

typedef struct fm_reasoning_split {
    fm_reasoning_format fmt;
    int state;         /* private: start, reasoning, answer */
    bool answer_begun; /* a non-newline byte of the answer went out */
    bool skip_newline; /* the newline right after a generated <think> */
    char hold[32];     /* a tail that may begin a tag (with the newlines before it) */
    size_t n_hold;
    fm_text_sink on_reasoning, on_answer;
    void *user;
} fm_reasoning_split;

void fm_reasoning_init(fm_reasoning_split *r, fm_reasoning_format f, bool open, fm_text_sink on_reasoning,
                       fm_text_sink on_answer, void *user);
/* Feeds n bytes of output; calls the sinks with whatever is decided. */
void fm_reasoning_push(fm_reasoning_split *r, const char *s, size_t n);
/* The output ended: what is held back goes out as the part it was in. */
void fm_reasoning_finish(fm_reasoning_split *r);

#endif
