/* Tool calls: the function calls a model writes in its answer, parsed out as the text streams.
 *
 * Formats, by template family (fm_tool_format_of_template picks one from the chat template's text):
 *   hermes   Qwen3, Qwen3-Next, Qwen2.5, Hermes: each call is `<tool_call>\n{"name": F, "arguments": {...}}\n
 *            </tool_call>`; the text before the first call is the answer's content.
 *   mistral  Mistral, Mixtral: `[TOOL_CALLS] [{"name": F, "arguments": {...}}, ...]` after the content.
 * A call's JSON object may also name its arguments "parameters" (Llama-style models fine-tuned on these formats).
 *
 * Events, in stream order: content text; a call's start once its name is complete (index, name); fragments of its
 * arguments' JSON text as they arrive (their concatenation is the arguments exactly as the model wrote them); its
 * end. A call whose text is not such an object (broken JSON, no name) is given back as content, as vLLM does, when
 * that is known: at the call's end tag, or at the end of the output. */
#ifndef FM_TEXT_TOOL_CALLS_H
#define FM_TEXT_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"

typedef enum fm_tool_format { FM_TOOLS_NONE = 0, FM_TOOLS_HERMES, FM_TOOLS_MISTRAL } fm_tool_format;

/* The format of a chat template's tool calls: hermes when it writes <tool_call>, mistral for [TOOL_CALLS]. */
fm_tool_format fm_tool_format_of_template(const char *template_source);
/* --tool-parser NAME: hermes (alias qwen3) | mistral | none. */
fm_status fm_tool_format_parse(const char *name, fm_tool_format *out, fm_error *err);
const char *fm_tool_format_name(fm_tool_format f);
/* The text that opens a call block in this format ("<tool_call>", "[TOOL_CALLS]"); NULL for none. */
const char *fm_tool_format_open_tag(fm_tool_format f);

typedef struct fm_tool_events {
    void *user;
    void (*content)(void *user, const char *s, size_t n);
    void (*call_begin)(void *user, int32_t index, const char *name);
    void (*call_arguments)(void *user, int32_t index, const char *s, size_t n);
    void (*call_end)(void *user, int32_t index);
} fm_tool_events;

typedef struct fm_tool_parser fm_tool_parser;

fm_tool_parser *fm_tool_parser_create(fm_tool_format f, const fm_tool_events *ev);
void fm_tool_parser_free(fm_tool_parser *p);
/* Feeds n bytes of the answer's text. */
void fm_tool_parser_push(fm_tool_parser *p, const char *s, size_t n);
/* The answer ended: an unfinished call becomes content (or, when its arguments are complete JSON, a call). */
void fm_tool_parser_finish(fm_tool_parser *p);
/* Calls completed so far. */
int32_t fm_tool_parser_calls(const fm_tool_parser *p);

#endif
