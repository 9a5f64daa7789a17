/* The server's parts (serve.h): the shared state, a job (one generation request), the OpenAI request parser and
 * reply writer (openai.c), the Prometheus metrics (metrics.c), the chat page (page.c). */
#ifndef FM_SERVE_INTERNAL_H
#define FM_SERVE_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "fp8moe_sched.h"
#include "serve/serve.h"
#include "serve/chat.h"
#include "text/chat_template.h"
#include "text/reasoning.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

/* a growable byte string, always NUL-terminated */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;
void sb_put(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(sbuf *b);

/* ---- metrics (all under srv.mu) ---- */
enum { HIST_BUCKETS = 14 };
typedef struct histogram {
    uint64_t counts[HIST_BUCKETS + 1]; /* the last: +Inf */
    double sum;
    uint64_t n;
} histogram;
typedef struct metrics {
    uint64_t requests[6]; /* by status class: [0] 2xx, [1] 400, [2] 401, [3] 404, [4] 429, [5] other */
    uint64_t prompt_tokens, generation_tokens, cached_tokens, cancelled, cut;
    uint64_t prefix_queries, prefix_hits; /* requests that ended; those whose prompt began in the cache */
    histogram ttft, itl, e2e;             /* time to first token, inter-token latency, arrival to the last event */
    /* the scheduler's steps by what they held: decode rows only, decode and prompt rows, prompt rows only */
    histogram decode_step, mixed_step, prefill_step;
    int64_t steps_seen; /* fm_sched_stats.steps at the last metrics_observe_step */
} metrics;
void hist_observe(histogram *h, double seconds);
/* The scheduler's last step into its histogram, once per step (after each fm_sched_get_stats) */
void metrics_observe_step(metrics *m, const fm_sched_stats *st);
/* Prometheus text exposition of m and the scheduler's figures */
void metrics_write(sbuf *out, const metrics *m, const fm_sched_stats *st, int32_t queued, bool draining);

/* ---- the per-request log line (access_log.c) ---- */
typedef struct access_entry {
    const char *id, *method, *path;
    int status;
    bool generation; /* a completion request: the token counts are printed */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    double ttft_s; /* < 0: no token */
    double total_s;
    const char *finish; /* NULL: none */
} access_entry;
void access_log_format(sbuf *out, const access_entry *a);
void access_log_write(const access_entry *a); /* to stderr */

/* one sampled token as the scheduler reported it */
typedef struct tok_item {
    int32_t id;
    float logprob;
    int32_t n_top;
    fm_token_logprob top[FM_MAX_LOGPROBS];
} tok_item;

typedef struct srv srv;

enum { TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_NAMED };

/* a chat request's agent side (chat_request.c, chat_output.c, chat_constraint.c) */
typedef struct chat_req {
    int choice;      /* TOOL_CHOICE_* */
    char named[128]; /* TOOL_CHOICE_NAMED: the function */
    bool parallel;   /* parallel_tool_calls */
    cJSON *tools;    /* the request's tools while they are active (NULL: none, or tool_choice none) */
    fm_tool_format tool_fmt;
    fm_reasoning_format reasoning_fmt;
    bool opened;                        /* the prompt left a think block open */
    struct chat_constraint *constraint; /* response_format / a forced tool call (NULL: none) */
    /* the reply */
    fm_reasoning_split split;
    fm_tool_parser *parser;      /* NULL when no tools are active */
    sbuf d_reasoning, d_content; /* stream: the parts since the last chunk */
    cJSON *d_calls;              /* stream: tool_calls entries since the last chunk */
    sbuf reasoning;              /* non-stream: the whole reasoning (the content goes to job.text) */
    cJSON *calls;                /* non-stream: the message's tool_calls */
    int64_t n_reasoning_tokens;
    bool counting, first_seen; /* reasoning tokens: inside the think block; a token was seen */
    int32_t n_calls;
    bool stop_now; /* parallel_tool_calls false and one call is complete: the rest is dropped */
} chat_req;

typedef struct job {
    srv *s;
    /* the request, set by its handler before it is queued */
    bool chat, stream, include_usage;
    bool want_logprobs; /* a logprobs object in the reply */
    int32_t *prompt;
    int64_t n_prompt;
    fm_gen_params params;
    int32_t n_logprobs;
    int32_t stop_ids[64];
    char **stops; /* text stop strings */
    int32_t n_stops;
    sbuf unknown_fields; /* named in the log (fields.c) */
    char id[48];
    int64_t created;
    /* shared with the scheduler thread, under s->mu */
    tok_item *items;
    int64_t n_items, cap_items;
    bool ended;
    fm_sched_end end;
    char err_msg[768];
    int64_t n_cached;
    bool cancel;    /* the client went away, or a stop string ended the text: cancel at the next step */
    bool cut;       /* the server stopped before the request ended (SIGTERM, past --drain-timeout) */
    bool submitted; /* in the scheduler as request `req` */
    int64_t req;
    int refs; /* the handler's connection, its streamed response, the scheduler */
    pthread_cond_t cv;
    double t_arrive, t_first, t_last; /* t_first: 0 until the first token */
    struct job *next;                 /* the inbox */
    /* the handler's side (the connection's thread only) */
    int64_t consumed;
    fm_detok *detok;
    sbuf pending; /* decoded text not yet sent: it may begin a stop string */
    sbuf text;    /* non-stream: the whole text */
    cJSON *lp;    /* non-stream: the logprobs object being built */
    int64_t text_bytes;
    bool text_done; /* a stop string was found: later tokens are dropped */
    int64_t n_completion;
    const char *finish;
    sbuf out; /* stream bytes not yet handed to the connection */
    size_t out_off;
    bool role_sent, closed;
    chat_req *chatq;                /* chat requests: the agent side (NULL for completions) */
    fm_token_constraint constraint; /* chatq->constraint's engine side */
    fm_logit_bias *bias;            /* logit_bias (n_bias entries) */
    int32_t n_bias;
} job;

struct srv {
    fm_context *context; /* the model's, held for the server's life */
    fm_sched *sched;
    fm_tokenizer *tok;      /* NULL when the model has no tokenizer the server can load */
    fm_chat_template *tmpl; /* NULL when none */
    char tok_error[768], tmpl_error[768];
    int32_t tmpl_stop_ids[8];
    int32_t n_tmpl_stop_ids;
    fm_serve_opts o;
    char model_name[256];
    bool loopback; /* listening on 127.0.0.0/8 or ::1 */
    int64_t ctx;
    int32_t vocab;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the scheduler thread waits here for work */
    job *inbox, *inbox_tail;
    job **active; /* submitted and not ended (the scheduler thread's) */
    int32_t n_active, cap_active;
    int32_t n_jobs;    /* accepted and not ended: the queue bound */
    atomic_int n_live; /* jobs allocated and not yet freed (a reply may still be going out) */
    bool draining;     /* SIGTERM came: new requests get 503 */
    bool stopping;
    metrics met;
    fm_sched_stats stats; /* after the last step */
    /* the chat API's output formats (chat_setup) */
    fm_tool_format chat_tool_fmt;
    fm_reasoning_format chat_reasoning_fmt;
    cJSON *chat_default_kwargs;               /* --default-chat-template-kwargs (NULL: none) */
    int32_t chat_think_start, chat_think_end; /* the ids of <think> and </think> (-1: none) */
    struct fm_token_vocab *chat_vocab;        /* every id's bytes, for constrained decoding (NULL: no tokenizer) */
    int32_t end_ids[16], n_end_ids;           /* the ids that end a reply: the model's eos and the template's */
    struct sockaddr_in addr4;                 /* where it listens (--host, --port) */
    struct sockaddr_in6 addr6;
    pthread_t thread; /* the listener (server.c listen_thread); the passes run on the loading thread */
    fm_status fatal;
    fm_error fatal_err;
};

/* An OpenAI-style error: HTTP status and the fields of {"error": {...}} */
typedef struct oa_error {
    int status;
    const char *type, *code;
    char param[64];
    char message[768];
} oa_error;
int oa_fail(oa_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
char *oa_error_json(const oa_error *e);

/* Encodes text into j's prompt; 0 or the HTTP status. */
int oa_encode(srv *s, const char *text, bool add_special, job *j, oa_error *e);
/* A random 64-bit number (ids, seeds). */
uint64_t serve_random(void);
/* ---- request bodies (body_check.c) ---- */
/* 0 when body is UTF-8 without a \u0000 escape; a 400 in e otherwise */
int body_check(const char *body, size_t len, oa_error *e);
/* appends s with every invalid UTF-8 sequence replaced by U+FFFD (out is always allocated after) */
void utf8_sanitize(sbuf *out, const char *s);

/* ---- the request fields (fields.c) ---- */
typedef enum field_status {
    FIELD_IMPLEMENTED,
    FIELD_REFUSED,        /* a 400 naming the field whenever it is given (not null) */
    FIELD_NO_EFFECT,      /* accepted, changes nothing, for the reason the table states */
    FIELD_UNKNOWN,        /* not in the table */
    FIELD_OTHER_ENDPOINT, /* a field of the other endpoint (messages on /v1/completions): a 400 */
} field_status;
field_status fields_status(const char *name, bool chat);
/* Checks the members of a request object (and of its stream_options) against the table: 0, or a 400 in e. Unknown
 * fields are a 400 when strict, otherwise appended to unknown (quoted, comma-separated) when it is not NULL. */
int fields_check(const cJSON *root, bool chat, bool strict, sbuf *unknown, oa_error *e);
/* the table as Markdown (docs/serving.md holds it) */
void fields_markdown(sbuf *out);

/* ---- /tokenize, /detokenize (tokenize.c) and the chat prompt (chat_prompt.c) ---- */
/* 0 with the reply JSON in *out (malloc'd), or the HTTP status with e filled */
int serve_tokenize(srv *s, const char *body, size_t len, char **out, oa_error *e);
int serve_detokenize(srv *s, const char *body, size_t len, char **out, oa_error *e);
/* root's messages (with chat_template_kwargs, enable_thinking, tools) rendered by the chat template; *text malloc'd */
int serve_chat_prompt(srv *s, const cJSON *root, bool add_generation_prompt, char **text, oa_error *e);

/* Parses a request body into j (prompt ids, parameters); 0, or the HTTP status with e filled. */
int oa_parse(srv *s, const char *body, size_t len, bool chat, job *j, oa_error *e);
/* Consumes items[0..n) of j and, when ended, its end: text through the detokenizer and the stop strings, appended
 * to j->out as server-sent events (stream) or gathered for oa_final_json. Returns true when a stop string ended
 * the text (the scheduler should cancel the rest). */
bool oa_consume(job *j, const tok_item *items, int64_t n, bool ended, fm_sched_end end, const char *err_msg);
/* The non-stream reply (after oa_consume saw the end); malloc'd JSON. */
char *oa_final_json(job *j);

extern const char fm_serve_page_html[];

double serve_now(void);

#endif
