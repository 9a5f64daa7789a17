/* fp8moe serve: an OpenAI-compatible HTTP server over the continuous-batching scheduler (engine/scheduler.h).
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
    const char *model_name;    /* the id in /v1/models and the "model" field requests must name (NULL: the
                                  directory's last component) */
    const char *host;          /* address to bind (default 127.0.0.1) */
    int32_t port;              /* 0: a free port, printed on stderr */
    const char *api_key;       /* NULL: no key needed */
    const char *chat_template; /* --chat-template FILE (NULL: the checkpoint's) */
    int32_t max_queue;         /* requests waiting beyond the running ones before 429 */
    int64_t max_body;          /* request body bytes at most (413 beyond) */
    int64_t prefill_chunk;     /* prompt tokens per prefill step (0: the load's max_tokens) */
    int64_t default_max_tokens;
    const char *port_file; /* when set, the bound port is written there once listening (tests) */
} fm_serve_opts;

void fm_serve_opts_init(fm_serve_opts *o);

/* Serves m (loaded with max_seqs > 0) until SIGINT or SIGTERM; then every request is cancelled, the threads end and
 * everything the server allocated is freed (the model stays the caller's). The calling thread waits for the
 * signals (they are blocked in every thread the server starts). */
fm_status fm_serve_run(fm_model *m, const fm_serve_opts *o, fm_error *err);

#endif
