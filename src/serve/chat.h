/* The chat API's agent side: a /v1/chat/completions request into the template's variables (messages, tools,
 * chat_template_kwargs), the constraints it asks for (response_format, a forced tool call), and the model's text
 * back into the reply's parts (reasoning_content, content, tool_calls), streamed as OpenAI streams them.
 *
 * chat_request.c: the request; chat_output.c: the reply. The server picks the output formats once at start, from
 * the chat template's text or from --tool-parser / --reasoning-parser (chat_setup). */
#ifndef FM_SERVE_CHAT_H
#define FM_SERVE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "fp8moe.h"

typedef struct srv srv;
typedef struct job job;
typedef struct oa_error oa_error;

/* The server's output formats and default template kwargs, from its options and the loaded template. */
fm_status chat_setup(srv *s, fm_error *err);
void chat_teardown(srv *s);

/* Renders the request's conversation into j's prompt and prepares j's reply parsers; 0 or the HTTP status. */
int chat_parse(srv *s, const cJSON *root, job *j, oa_error *e);

/* The constraint of response_format or a forced tool call on j's tokens (chat_constraint.c); 0 or the status. */
int chat_constraints(srv *s, const cJSON *root, job *j, oa_error *e);
struct chat_req;
void chat_constraint_free(struct chat_req *q);

/* The reply: each sampled id (reasoning tokens are counted), then text (after the stop strings), the parts out. */
void chat_out_begin(job *j);
void chat_out_token(job *j, int32_t id);
void chat_out_push(job *j, const char *text, size_t len);
void chat_out_finish(job *j);
/* stream: adds the parts gathered since the last chunk to delta; true when there was any */
bool chat_out_delta(job *j, cJSON *delta);
/* non-stream: fills the message's content, reasoning_content and tool_calls */
void chat_out_message(job *j, cJSON *message);
/* "tool_calls" when the reply called a tool and was not cut; else finish */
const char *chat_out_finish_reason(const job *j, const char *finish);
/* true when the reply is complete before its end (parallel_tool_calls false after one call) */
bool chat_out_stop(const job *j);
int64_t chat_out_reasoning_tokens(const job *j);
void chat_out_free(job *j);

#endif
