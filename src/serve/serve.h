/* fp8moe serve: an OpenAI-compatible HTTP server over the continuous-batching scheduler (fp8moe_sched.h).
 *
 * Threads: libmicrohttpd runs one thread per connection; one scheduler thread owns the model and steps the
 * scheduler. A handler parses and checks a request, puts a job in the inbox (mutex + condvar) and then reads the
 * job's tokens as the scheduler thread appends them (streamed as server-sent events, or gathered into one JSON
 * reply). A client that goes away has its job cancelled at the next step (its KV blocks freed). */
#ifndef FM_SERVE_SERVE_H
#define FM_SERVE_SERVE_H

#include <stdint.h>

#include "fp8moe.h"

typedef struct fm_serve_opts {
    const char *model_dir;
    const char *model_name;       /* the id in /v1/models and the "model" field requests must name (NULL: the
                                     directory's last component) */
    const char *host;             /* address to bind (default 127.0.0.1) */
    int32_t port;                 /* 0: a free port, printed on stderr */
    const char *api_key;          /* NULL: no key needed */
    const char *chat_template;    /* --chat-template FILE (NULL: the checkpoint's) */
    const char *tool_parser;      /* --tool-parser hermes|mistral|none (NULL: from the template) */
    const char *reasoning_parser; /* --reasoning-parser qwen3|deepseek_r1|none (NULL: from the template) */
    const char *default_chat_template_kwargs; /* JSON object of template variables every request starts from */
    int32_t max_queue;                        /* requests waiting beyond the running ones before 429 */
    int64_t max_body;                         /* request body bytes at most (413 beyond) */
    int64_t prefill_chunk;                    /* prompt tokens per prefill step (0: the load's max_tokens) */
    int64_t default_max_tokens;
    const char *port_file;        /* when set, the bound port is written there once listening (tests) */
    bool strict_fields;           /* unknown request fields: a 400 (otherwise named in the log) */
    const char *cors_origin;      /* --cors-origin: the origin browsers may call from ("*": any); NULL: no CORS */
    double drain_timeout;         /* SIGTERM: seconds the running requests get to finish (default 30) */
    int32_t idle_timeout;         /* seconds a connection may send nothing before it is closed (default 60) */
    int32_t max_conns;            /* open connections at most (default 512) */
    int32_t max_conns_per_client; /* open connections from one IP address at most (default 256) */
    bool no_warmup; /* --no-warmup: listen without running the kernels first (fp8moe.h fm_context_warmup) */
} fm_serve_opts;

void fm_serve_opts_init(fm_serve_opts *o);

/* Serves the context's model (max_seqs > 0) until SIGINT or SIGTERM; then it drains: new requests get 503, the running
 * ones get drain_timeout seconds to finish, the rest end cut (an error event, finish_reason "abort"); the threads
 * end and everything the server allocated is freed (the context and model stay the caller's). A second signal cuts at
 * once. The calling thread waits for the signals (they are blocked in every thread the server starts). */
fm_status fm_serve_run(fm_context *ctx, const fm_serve_opts *o, fm_error *err);

/* The table of request fields (implemented, refused, accepted without effect) as Markdown; malloc'd. */
char *fm_serve_fields_markdown(void);

#endif
