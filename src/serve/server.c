/* The HTTP server (serve.h): libmicrohttpd with a thread per connection, the scheduler thread, the job lifecycle.
 *
 * A job is shared by its connection's thread and the scheduler thread (under srv.mu) and freed by whichever drops
 * the last of its references: the connection (request-completed callback), a streamed response (its free callback),
 * the scheduler (the request's final event). */
#include <arpa/inet.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "serve/serve_internal.h"
#include "util/status.h"

/* The warm-up (fp8moe.h fm_context_warmup) with the server's prefill chunk, its time on stderr. It fails only where
 * requests would (a prefill chunk or a full decode batch that cannot run): the server then does not start. */
static fm_status serve_warmup(fm_context *ctx, const fm_serve_opts *o, fm_error *err) {
    fm_warmup_report r;
    const int64_t chunk = o->prefill_chunk > 0 ? o->prefill_chunk : fm_context_max_tokens(ctx);
    fm_status st = fm_context_warmup(ctx, chunk, &r, err);
    if (!st)
        fprintf(stderr, "fp8moe serve: warmed up in %.2f s (a prefill of %lld tokens, %d decode batch sizes)\n",
                r.seconds, (long long)r.prefill_tokens, r.buckets);
    return st;
}

void fm_serve_opts_init(fm_serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_queue = 256;
    o->max_body = 1 << 20;
    o->drain_timeout = 30;
    o->idle_timeout = 60;
    o->max_conns = 512;
    o->max_conns_per_client = 256; /* half of max_conns: behind a reverse proxy every client shares one address */
}

/* ---- jobs ---- */

static void job_free(job *j) {
    if (!j) return;
    for (int32_t i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->stops), free(j->prompt), free(j->items), free(j->bias);
    sb_free(&j->unknown_fields);
    if (j->detok) fm_detok_free(j->detok);
    sb_free(&j->pending), sb_free(&j->text), sb_free(&j->out);
    cJSON_Delete(j->lp);
    chat_out_free(j);
    pthread_cond_destroy(&j->cv);
    atomic_fetch_sub(&j->s->n_live, 1);
    free(j);
}

static void job_unref(srv *s, job *j) {
    pthread_mutex_lock(&s->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&s->mu);
    if (left == 0) job_free(j);
}

/* the scheduler's events, on the scheduler thread */
static void on_event(void *user, const fm_sched_event *ev) {
    job *j = user;
    srv *s = j->s;
    const double now = serve_now();
    pthread_mutex_lock(&s->mu);
    if (ev->id >= 0) {
        if (j->n_items == j->cap_items) {
            const int64_t cap = j->cap_items ? 2 * j->cap_items : 64;
            tok_item *p = realloc(j->items, (size_t)cap * sizeof *p);
            if (!p) abort(); /* a few KiB per request */
            j->items = p, j->cap_items = cap;
        }
        tok_item *it = &j->items[j->n_items++];
        it->id = ev->id, it->logprob = ev->info->logprob, it->n_top = ev->info->n_top;
        if (it->n_top > 0) memcpy(it->top, ev->info->top, (size_t)it->n_top * sizeof *it->top);
        s->met.generation_tokens++;
        if (j->n_items == 1) j->t_first = now;
        hist_observe(j->n_items == 1 ? &s->met.ttft : &s->met.itl, now - (j->n_items == 1 ? j->t_arrive : j->t_last));
        j->t_last = now;
    }
    int left = 1;
    if (ev->end != FM_SCHED_RUNNING) {
        j->ended = true, j->end = ev->end, j->n_cached = ev->n_cached;
        if (ev->msg) snprintf(j->err_msg, sizeof j->err_msg, "%s", ev->msg);
        s->n_jobs--;
        s->met.cached_tokens += (uint64_t)ev->n_cached;
        s->met.prefix_queries++, s->met.prefix_hits += ev->n_cached > 0;
        hist_observe(&s->met.e2e, now - j->t_arrive);
        if (ev->end == FM_SCHED_CANCELLED) s->met.cancelled++;
        if (ev->end == FM_SCHED_CANCELLED && j->cut) s->met.cut++;
        for (int32_t i = 0; i < s->n_active; i++)
            if (s->active[i] == j) {
                s->active[i] = s->active[--s->n_active];
                break;
            }
        left = --j->refs;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
    if (left == 0) job_free(j);
}

/* ends a job the scheduler never took (shutdown, or a refused submit); under s->mu; returns the refs left */
static int end_unsubmitted(srv *s, job *j, fm_sched_end end, const char *msg) {
    j->ended = true, j->end = end;
    snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
    s->n_jobs--;
    if (end == FM_SCHED_CANCELLED) s->met.cancelled++;
    if (end == FM_SCHED_CANCELLED && j->cut) s->met.cut++;
    pthread_cond_broadcast(&j->cv);
    return --j->refs;
}

static void *scheduler_thread(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        while (s->inbox) {
            job *j = s->inbox;
            s->inbox = j->next;
            if (!s->inbox) s->inbox_tail = NULL;
            fm_sched_request r;
            fm_sched_request_init(&r);
            r.prompt = j->prompt, r.n_prompt = j->n_prompt, r.params = j->params, r.n_logprobs = j->n_logprobs;
            r.on_event = on_event, r.user = j;
            fm_error err;
            if (j->cancel || fm_sched_submit(s->sched, &r, &j->req, &err)) {
                if (end_unsubmitted(s, j, j->cancel ? FM_SCHED_CANCELLED : FM_SCHED_ERROR, j->cancel ? "" : err.msg) ==
                    0)
                    job_free(j);
                continue;
            }
            j->submitted = true;
            if (s->n_active == s->cap_active) {
                const int32_t cap = s->cap_active ? 2 * s->cap_active : 64;
                job **p = realloc(s->active, (size_t)cap * sizeof *p);
                if (!p) abort();
                s->active = p, s->cap_active = cap;
            }
            s->active[s->n_active++] = j;
        }
        for (int32_t i = 0; i < s->n_active; i++)
            if (s->active[i]->cancel) fm_sched_cancel(s->sched, s->active[i]->req);
        pthread_mutex_unlock(&s->mu);
        bool busy = false;
        fm_error err;
        const fm_status st = fm_sched_step(s->sched, &busy, &err);
        pthread_mutex_lock(&s->mu);
        fm_sched_get_stats(s->sched, &s->stats);
        metrics_observe_step(&s->met, &s->stats);
        if (st) { /* the backend failed: nothing more can run; end the server */
            s->fatal = st, s->fatal_err = err;
            fprintf(stderr, "fp8moe serve: error: %s\n", err.msg);
            s->stopping = true;
            kill(getpid(), SIGTERM);
            break;
        }
        if (!busy && !s->inbox && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    fm_sched_free(s->sched); /* every request still there ends cancelled (events: the handlers wake) */
    s->sched = NULL;
    pthread_mutex_lock(&s->mu);
    int32_t total;
    fm_context_kv_blocks(s->context, &s->stats.kv_blocks_used, &total);
    s->stats.running = s->stats.waiting = 0;
    while (s->inbox) {
        job *j = s->inbox;
        s->inbox = j->next;
        if (end_unsubmitted(s, j, FM_SCHED_CANCELLED, "") == 0) job_free(j);
    }
    s->inbox_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The handler's side: takes the job's new tokens (waiting for them when block) and turns them into text; a stop
 * string asks the scheduler to cancel the rest. Returns true when the end has been consumed. */
static bool pull(job *j, bool block, double wait_s) {
    srv *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (block && j->n_items == j->consumed && !j->ended) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + wait_s;
        ts.tv_sec = (time_t)t, ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
        while (j->n_items == j->consumed && !j->ended)
            if (pthread_cond_timedwait(&j->cv, &s->mu, &ts) == ETIMEDOUT) break;
    }
    const int64_t n = j->n_items - j->consumed;
    tok_item *copy = n > 0 ? malloc((size_t)n * sizeof *copy) : NULL;
    if (n > 0 && !copy) abort();
    if (n > 0) memcpy(copy, j->items + j->consumed, (size_t)n * sizeof *copy);
    j->consumed += n;
    const bool ended = j->ended && j->consumed == j->n_items;
    const fm_sched_end end = j->end;
    char msg[sizeof j->err_msg];
    memcpy(msg, j->err_msg, sizeof msg);
    pthread_mutex_unlock(&s->mu);
    const bool stopped = oa_consume(j, copy, n, ended, end, msg);
    free(copy);
    if (stopped) {
        pthread_mutex_lock(&s->mu);
        j->cancel = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return ended;
}

/* ---- HTTP ---- */

typedef struct conn {
    sbuf body;
    bool too_big;
    job *j;
    /* the log line */
    int status;
    double t_start;
    char method[16], path[160];
} conn;

/* headers every reply carries: CORS when --cors-origin is set (the request's Origin echoed when it matches) */
static void add_cors(const srv *s, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!s->o.cors_origin) return;
    if (!strcmp(s->o.cors_origin, "*")) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        return;
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && !strcmp(origin, s->o.cors_origin)) MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

/* queues body (malloc'd, taken) with status; header/value: one more header (NULL: none) */
static enum MHD_Result reply_h(srv *s, conn *cs, struct MHD_Connection *c, int status, char *body, const char *type,
                               const char *header, const char *value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (type) MHD_add_response_header(r, "Content-Type", type);
    if (header) MHD_add_response_header(r, header, value);
    add_cors(s, c, r);
    if (cs) cs->status = status;
    const enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply(srv *s, conn *cs, struct MHD_Connection *c, int status, char *body, const char *type) {
    return reply_h(s, cs, c, status, body, type, NULL, NULL);
}

static void count_status(srv *s, int status) {
    const int k = status < 300 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 404 ? 3 : status == 429 ? 4 : 5;
    pthread_mutex_lock(&s->mu);
    s->met.requests[k]++;
    pthread_mutex_unlock(&s->mu);
}

/* an error reply; a 429 or 503 says when to retry (a queue slot frees within about a second; a drain takes longer) */
static enum MHD_Result reply_error(srv *s, conn *cs, struct MHD_Connection *c, const oa_error *e) {
    count_status(s, e->status);
    const bool retry = e->status == 429 || e->status == 503;
    return reply_h(s, cs, c, e->status, oa_error_json(e), "application/json", retry ? "Retry-After" : NULL,
                   e->status == 429 ? "1" : "5");
}

static enum MHD_Result method_not_allowed(srv *s, conn *cs, struct MHD_Connection *c, const char *method,
                                          const char *url, const char *allow) {
    oa_error e;
    oa_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)",
            method, url, allow);
    count_status(s, 405);
    return reply_h(s, cs, c, 405, oa_error_json(&e), "application/json", "Allow", allow);
}

/* DNS rebinding: a web page on a name its owner then points at 127.0.0.1 can reach a keyless server on this
 * machine from the visitor's browser, with the page's name in Host. A keyless server bound to a loopback address
 * answers only the names of this machine. */
static bool host_allowed(const srv *s, const char *host) {
    if (s->o.api_key || !s->loopback || !host) return true; /* HTTP/1.0 sends no Host */
    char name[256];
    snprintf(name, sizeof name, "%s", host);
    char *end = name[0] == '[' ? strchr(name, ']') : strrchr(name, ':');
    if (end && name[0] == '[') end[1] = 0;
    else if (end) *end = 0;
    static const char *const ok[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcasecmp(name, ok[i])) return true;
    return false;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    for (;;) {
        if (j->out_off < j->out.n) {
            size_t n = j->out.n - j->out_off;
            n = n < max ? n : max;
            memcpy(buf, j->out.p + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out.n) j->out_off = j->out.n = 0;
            return (ssize_t)n;
        }
        if (j->closed) return MHD_CONTENT_READER_END_OF_STREAM;
        const size_t before = j->out.n;
        pull(j, true, 10.0);
        if (j->out.n == before && !j->closed) sb_puts(&j->out, ": keep-alive\n\n"); /* finds a client that left */
    }
}

static void stream_free(void *cls) {
    job *j = cls;
    job_unref(j->s, j);
}

/* the peer closed its end (an orderly close reads as 0 bytes; pipelined data means it is still there) */
static bool client_gone(int fd) {
    char b;
    const ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static enum MHD_Result generate(srv *s, struct MHD_Connection *c, conn *cs, bool chat) {
    oa_error e;
    job *j = calloc(1, sizeof *j);
    if (!j)
        return reply_error(s, cs, c, &(oa_error){.status = 500, .type = "server_error", .message = "out of memory"});
    j->s = s;
    atomic_fetch_add(&s->n_live, 1);
    pthread_cond_init(&j->cv, NULL);
    int rc = oa_parse(s, cs->body.p ? cs->body.p : "", cs->body.n, chat, j, &e);
    fm_error err;
    if (!rc && s->tok && fm_detok_create(s->tok, true, &j->detok, &err))
        rc = oa_fail(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
    if (rc) {
        job_free(j);
        return reply_error(s, cs, c, &e);
    }
    j->created = (int64_t)time(NULL);
    pthread_mutex_lock(&s->mu);
    static uint64_t counter;
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)j->created,
             (unsigned long long)++counter);
    const int32_t limit = fm_context_max_seqs(s->context) + s->o.max_queue;
    if (s->stopping || s->draining)
        rc = oa_fail(&e, 503, "server_error", "server_shutting_down", NULL,
                     "the server is shutting down: it takes no new requests");
    else if (s->n_jobs >= limit)
        rc = oa_fail(&e, 429, "rate_limit_error", "queue_full", NULL,
                     "the server is busy: %d requests are running or queued (--max-seqs + --max-queue); retry later",
                     s->n_jobs);
    if (!rc) {
        s->n_jobs++;
        j->refs = 2 + (j->stream ? 1 : 0);
        j->t_arrive = cs->t_start;
        if (s->inbox_tail) s->inbox_tail->next = j;
        else s->inbox = j;
        s->inbox_tail = j;
        s->met.prompt_tokens += (uint64_t)j->n_prompt;
        s->met.requests[0]++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        job_free(j);
        return reply_error(s, cs, c, &e);
    }
    if (j->unknown_fields.n)
        fprintf(stderr,
                "fp8moe serve: request id=%s: fields %s are unknown here and have no effect "
                "(--strict-fields refuses them)\n",
                j->id, j->unknown_fields.p);
    cs->j = j;
    if (j->stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, j, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        add_cors(s, c, r);
        cs->status = MHD_HTTP_OK;
        const enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
    }
    /* a non-stream reply is written at the end: meanwhile the socket is watched for the client going away */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    while (!pull(j, true, 0.2)) {
        if (ci && client_gone(ci->connect_fd)) {
            pthread_mutex_lock(&s->mu);
            j->cancel = true;
            pthread_cond_signal(&s->cv);
            pthread_mutex_unlock(&s->mu);
            cs->status = 499; /* the client closed the request (nginx's code), for the log */
            return MHD_NO;    /* closes the connection; the completed callback lets go of the job */
        }
    }
    if (j->end == FM_SCHED_ERROR) {
        oa_fail(&e, 500, "server_error", NULL, NULL, "%s", j->err_msg[0] ? j->err_msg : "generation failed");
        return reply(s, cs, c, 500, oa_error_json(&e), "application/json");
    }
    if (j->end == FM_SCHED_CANCELLED && j->cut) {
        oa_fail(&e, 503, "server_error", "server_shutting_down", NULL,
                "the server shut down before the request finished (--drain-timeout)");
        return reply(s, cs, c, 503, oa_error_json(&e), "application/json");
    }
    return reply(s, cs, c, MHD_HTTP_OK, oa_final_json(j), "application/json");
}

static enum MHD_Result models(srv *s, conn *cs, struct MHD_Connection *c, const char *which) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "fp8moe");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->ctx);
    if (which) {
        if (strcmp(which, s->model_name)) {
            cJSON_Delete(m);
            oa_error e;
            oa_fail(&e, 404, "invalid_request_error", "model_not_found", "model", "The model '%s' does not exist",
                    which);
            return reply_error(s, cs, c, &e);
        }
        count_status(s, 200);
        char *out = cJSON_PrintUnformatted(m);
        cJSON_Delete(m);
        return reply(s, cs, c, 200, out, "application/json");
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    count_status(s, 200);
    return reply(s, cs, c, 200, out, "application/json");
}

static bool authorised(const srv *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->o.api_key);
}

/* /tokenize and /detokenize */
static enum MHD_Result tokenize(srv *s, conn *cs, struct MHD_Connection *c, bool detokenize) {
    oa_error e;
    char *out = NULL;
    const char *body = cs->body.p ? cs->body.p : "";
    const int rc =
        detokenize ? serve_detokenize(s, body, cs->body.n, &out, &e) : serve_tokenize(s, body, cs->body.n, &out, &e);
    if (rc) return reply_error(s, cs, c, &e);
    count_status(s, 200);
    return reply(s, cs, c, 200, out, "application/json");
}

static enum MHD_Result preflight(srv *s, conn *cs, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Allow", "GET, HEAD, POST, OPTIONS");
    if (s->o.cors_origin) {
        add_cors(s, c, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    cs->status = 204;
    const enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ret;
}

typedef struct header_scan {
    const char *content_length; /* the first value */
    bool conflict;              /* another Content-Length with a different value */
} header_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    header_scan *h = cls;
    if (strcasecmp(key, "Content-Length")) return MHD_YES;
    if (!h->content_length) h->content_length = value ? value : "";
    else if (strcmp(h->content_length, value ? value : "")) h->conflict = true;
    return MHD_YES;
}

static bool expects_continue(struct MHD_Connection *c) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
    return v && !strcasecmp(v, "100-continue");
}

/* The checks made when a request's headers have arrived, before its body is read (so that an over-limit body with
 * "Expect: 100-continue" gets its 413 without a 100 first). Returns false when a reply was queued. */
static bool headers_ok(srv *s, conn *cs, struct MHD_Connection *c, enum MHD_Result *ret) {
    oa_error e = {0};
    header_scan h = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &h);
    if (h.conflict)
        oa_fail(&e, 400, "invalid_request_error", "invalid_request", NULL,
                "the request has two Content-Length headers with different values");
    else if (h.content_length && strtoull(h.content_length, NULL, 10) > (unsigned long long)s->o.max_body &&
             expects_continue(c)) /* a client that sends its body at once reads the 413 after it (no EPIPE) */
        oa_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                "the request body is larger than %lld bytes (--max-body)", (long long)s->o.max_body);
    else if (!host_allowed(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
        oa_fail(&e, 403, "invalid_request_error", "host_not_allowed", NULL,
                "the Host header does not name this machine: a server without --api-key listening on a loopback "
                "address answers only requests for localhost, 127.0.0.1 or [::1] (a guard against DNS rebinding); "
                "start it with --api-key to serve other names");
    if (!e.status) return true;
    *ret = reply_error(s, cs, c, &e);
    return false;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    conn *cs = *con_cls;
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        cs->t_start = serve_now();
        snprintf(cs->method, sizeof cs->method, "%s", method);
        snprintf(cs->path, sizeof cs->path, "%s", url);
        enum MHD_Result ret = MHD_YES;
        return headers_ok(s, cs, c, &ret) ? MHD_YES : ret;
    }
    if (*upload_size) {
        if (cs->body.n + *upload_size > (size_t)s->o.max_body) cs->too_big = true;
        else sb_put(&cs->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    oa_error e;
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) return preflight(s, cs, c);
    if (!strcmp(url, "/health")) {
        if (!get) return method_not_allowed(s, cs, c, method, url, "GET, HEAD");
        pthread_mutex_lock(&s->mu);
        const bool draining = s->draining || s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (draining)
            return reply_h(s, cs, c, 503, strdup("{\"status\":\"draining\"}"), "application/json", "Retry-After", "5");
        return reply(s, cs, c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    }
    if (!strcmp(url, "/")) {
        if (!get) return method_not_allowed(s, cs, c, method, url, "GET, HEAD");
        return reply(s, cs, c, 200, strdup(fm_serve_page_html), "text/html; charset=utf-8");
    }
    const bool gen = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions");
    const bool tok = !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize");
    const bool keyed = !strncmp(url, "/v1/", 4) || !strcmp(url, "/metrics") || tok;
    if (keyed && !authorised(s, c)) {
        oa_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                "Incorrect or missing API key: send the header 'Authorization: Bearer KEY' with the key the server "
                "was started with (--api-key)");
        return reply_error(s, cs, c, &e);
    }
    if ((gen || tok) && post && cs->too_big) {
        oa_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                "the request body is larger than %lld bytes (--max-body)", (long long)s->o.max_body);
        return reply_error(s, cs, c, &e);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return method_not_allowed(s, cs, c, method, url, "GET, HEAD");
        sbuf o = {0};
        pthread_mutex_lock(&s->mu);
        int32_t queued = 0;
        for (job *j = s->inbox; j; j = j->next) queued++;
        metrics_write(&o, &s->met, &s->stats, queued + s->stats.waiting, s->draining);
        pthread_mutex_unlock(&s->mu);
        return reply(s, cs, c, 200, o.p, "text/plain; version=0.0.4");
    }
    if (gen) {
        if (!post) return method_not_allowed(s, cs, c, method, url, "POST");
        return generate(s, c, cs, !strcmp(url, "/v1/chat/completions"));
    }
    if (tok) {
        if (!post) return method_not_allowed(s, cs, c, method, url, "POST");
        return tokenize(s, cs, c, !strcmp(url, "/detokenize"));
    }
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) {
        if (!get) return method_not_allowed(s, cs, c, method, url, "GET, HEAD");
        return models(s, cs, c, url[10] == '/' ? url + 11 : NULL);
    }
    oa_fail(&e, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %s", method, url);
    return reply_error(s, cs, c, &e);
}

/* the request is over (answered, or the client went away): a job still running is cancelled; the log line */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv *s = cls;
    conn *cs = *con_cls;
    if (!cs) return;
    access_entry a = {.method = cs->method, .path = cs->path, .status = cs->status, .ttft_s = -1};
    a.total_s = serve_now() - cs->t_start;
    if (!a.status) a.status = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? 200 : 499;
    if (cs->j) {
        job *j = cs->j;
        pthread_mutex_lock(&s->mu);
        if (!j->ended) {
            j->cancel = true;
            pthread_cond_signal(&s->cv);
        }
        a.cached_tokens = j->n_cached;
        if (j->t_first > 0) a.ttft_s = j->t_first - j->t_arrive;
        pthread_mutex_unlock(&s->mu);
        a.id = j->id, a.generation = true, a.prompt_tokens = j->n_prompt, a.completion_tokens = j->n_completion;
        a.finish = j->finish ? j->finish : j->closed ? NULL : "cancelled";
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && j->stream) a.status = 499;
        access_log_write(&a);
        job_unref(s, j);
    } else if (strcmp(cs->path, "/health") && strcmp(cs->path, "/metrics"))
        access_log_write(&a); /* probes and scrapes stay out of the log */
    sb_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

static void load_text(srv *s) {
    fm_error err;
    if (!s->o.model_dir) { /* serve --synthetic: token ids only */
        snprintf(s->tok_error, sizeof s->tok_error, "a synthetic model has no tokenizer: send token ids");
        snprintf(s->tmpl_error, sizeof s->tmpl_error, "a synthetic model has no chat template");
        fprintf(stderr, "fp8moe serve: synthetic weights, no tokenizer: prompts must be token ids (/v1/completions)\n");
        return;
    }
    if (fm_tokenizer_load(s->o.model_dir, &s->tok, &err)) {
        s->tok = NULL;
        snprintf(s->tok_error, sizeof s->tok_error, "%s", err.msg);
        fprintf(stderr, "fp8moe serve: no tokenizer (%s): text prompts and chat are refused with 501\n", err.msg);
    }
    if (fm_chat_template_load(s->o.model_dir, s->o.chat_template, &s->tmpl, &err)) {
        s->tmpl = NULL;
        snprintf(s->tmpl_error, sizeof s->tmpl_error, "%s", err.msg);
        fprintf(stderr, "fp8moe serve: no chat template (%s): /v1/chat/completions is refused with 501\n", err.msg);
        return;
    }
    if (chat_setup(s, &err)) {
        snprintf(s->tmpl_error, sizeof s->tmpl_error, "%s", err.msg);
        fm_chat_template_free(s->tmpl);
        s->tmpl = NULL;
        return;
    }
    const char *const *stops = fm_chat_template_stop_tokens(s->tmpl);
    for (int i = 0; s->tok && stops && stops[i] && s->n_tmpl_stop_ids < 8; i++) {
        const int32_t id = fm_tokenizer_token_id(s->tok, stops[i]);
        if (id >= 0) s->tmpl_stop_ids[s->n_tmpl_stop_ids++] = id;
    }
}

static fm_status write_port_file(const char *path, int port, fm_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return fm_fail(err, FM_ERR_IO, "--port-file %s: %s", path, strerror(errno));
    fprintf(f, "%d\n", port);
    if (fclose(f)) return fm_fail(err, FM_ERR_IO, "--port-file %s: %s", path, strerror(errno));
    return FM_OK;
}

/* SIGINT and SIGTERM reach the server through a pipe written by their handler: whichever thread the kernel picks
 * (the OpenMP workers of the load, started before the server, have them unblocked), the process is not killed and
 * the listener reads the signal. One server per process. */
static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    const int saved = errno;
    const unsigned char b = (unsigned char)sig;
    if (write(signal_pipe[1], &b, 1) < 0) { /* the pipe is full: a signal is already waiting */
    }
    errno = saved;
}

/* The next signal's number, or 0 when none came within timeout_ms (-1: wait for one). */
static int next_signal(int timeout_ms) {
    struct pollfd p = {.fd = signal_pipe[0], .events = POLLIN};
    for (;;) {
        const int r = poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        unsigned char b;
        return read(signal_pipe[0], &b, 1) == 1 ? b : 0;
    }
}

/* Waits for SIGINT or SIGTERM, then drains: new requests get 503 (and /health says draining) while the accepted
 * ones have drain_timeout seconds to end; a second signal ends the wait at once. */
static void drain(srv *s) {
    const int sig = next_signal(-1);
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    const int32_t n = s->n_jobs;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr,
            "fp8moe serve: %s: draining: new requests get 503; %d running or queued get %g s to finish "
            "(--drain-timeout; a second signal stops at once)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", n, s->o.drain_timeout);
    const double until = serve_now() + s->o.drain_timeout;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        const bool done = s->n_jobs == 0 || s->stopping;
        pthread_mutex_unlock(&s->mu);
        const double left = until - serve_now();
        if (done || left <= 0) break;
        const double wait = left < 0.05 ? left : 0.05;
        if (next_signal((int)(wait * 1000) + 1) > 0) break;
    }
    pthread_mutex_lock(&s->mu);
    fprintf(stderr, "fp8moe serve: shutting down (%d requests cut)\n", s->n_jobs);
    pthread_mutex_unlock(&s->mu);
}

/* marks every request not yet ended as cut by the shutdown (under s->mu): its stream ends with an error event and
 * finish_reason "abort" */
static void cut_all(srv *s) {
    for (int32_t i = 0; i < s->n_active; i++) s->active[i]->cut = true;
    for (job *j = s->inbox; j; j = j->next) j->cut = true;
}

/* The server's second thread: listens, waits for the signal that drains (or for the scheduler's fatal error, which
 * raises one), then stops the scheduler loop. d stays up for fm_serve_run to quiesce once every request ended. */
typedef struct listener {
    srv *s;
    struct MHD_Daemon *d;
    fm_status st;
    fm_error err;
} listener;

static void *listen_thread(void *arg) {
    listener *l = arg;
    srv *s = l->s;
    const fm_serve_opts *o = &s->o;
    const bool v6 = strchr(o->host, ':') != NULL;
    /* poll() rather than select(), which stops at 1,024 descriptors; idle or half-sent requests are closed after
       idle_timeout; connections are capped in all and per client address */
    l->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                                MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0),
                            (uint16_t)o->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR,
                            v6 ? (struct sockaddr *)&s->addr6 : (struct sockaddr *)&s->addr4,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)o->idle_timeout, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_conns_per_client, MHD_OPTION_END);
    if (!l->d)
        l->st = fm_fail(&l->err, FM_ERR_IO, "cannot listen on %s port %d: %s", o->host, o->port, strerror(errno));
    else {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_BIND_PORT);
        const int port = info ? info->port : o->port;
        fprintf(stderr, "fp8moe serve: %s on http://%s%s%s:%d/ (model '%s', %d sequences of %lld tokens%s)\n",
                FP8MOE_VERSION, v6 ? "[" : "", o->host, v6 ? "]" : "", port, s->model_name,
                fm_context_max_seqs(s->context), (long long)s->ctx,
                fm_context_kv_cache(s->context) == FM_KV_E4M3 ? ", KV cache e4m3" : "");
        if (o->port_file) l->st = write_port_file(o->port_file, port, &l->err);
        if (!l->st) drain(s);
    }
    pthread_mutex_lock(&s->mu);
    cut_all(s);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

fm_status fm_serve_run(fm_context *ctx, const fm_serve_opts *o, fm_error *err) {
    if (fm_context_max_seqs(ctx) < 1)
        return fm_fail(err, FM_ERR_USAGE, "serve: the model was loaded without a KV cache (max_seqs > 0)");
    if (o->api_key && !o->api_key[0]) /* an unset variable in --api-key "$KEY": not an open server by accident */
        return fm_fail(err, FM_ERR_USAGE,
                       "--api-key is empty: give a key, or leave the option out for a server "
                       "without one");
    srv *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    s->context = ctx, s->o = *o, s->ctx = fm_context_ctx(ctx), s->vocab = fm_model_vocab_size(fm_context_model(ctx));
    if (o->model_name) snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name);
    else {
        char dir[512];
        snprintf(dir, sizeof dir, "%s", o->model_dir);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        const char *base = strrchr(dir, '/');
        snprintf(s->model_name, sizeof s->model_name, "%s", base ? base + 1 : dir);
    }
    struct sockaddr_in *a4 = &s->addr4;
    struct sockaddr_in6 *a6 = &s->addr6;
    const bool v6 = strchr(o->host, ':') != NULL;
    if (v6 ? inet_pton(AF_INET6, o->host, &a6->sin6_addr) != 1 : inet_pton(AF_INET, o->host, &a4->sin_addr) != 1) {
        free(s);
        return fm_fail(err, FM_ERR_USAGE, "--host '%s' is not an IPv4 or IPv6 address (such as 127.0.0.1 or ::1)",
                       o->host);
    }
    a4->sin_family = AF_INET, a4->sin_port = htons((uint16_t)o->port);
    a6->sin6_family = AF_INET6, a6->sin6_port = htons((uint16_t)o->port);
    s->loopback = v6 ? IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr) : (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
    load_text(s);
    if ((o->chat_template || o->tool_parser || o->reasoning_parser || o->default_chat_template_kwargs) && !s->tmpl) {
        fm_status st = fm_fail(err, FM_ERR_USAGE, "the chat template: %s", s->tmpl_error);
        if (s->tok) fm_tokenizer_free(s->tok);
        free(s);
        return st;
    }
    /* before listening: /health answers only once the first request runs at the warm speed */
    fm_status st = o->no_warmup ? FM_OK : serve_warmup(ctx, o, err);
    if (!st) st = fm_sched_create(ctx, o->prefill_chunk, &s->sched, err);
    if (st) {
        if (s->tok) fm_tokenizer_free(s->tok);
        if (s->tmpl) fm_chat_template_free(s->tmpl);
        chat_teardown(s);
        chat_teardown(s);
        free(s);
        return st;
    }
    fm_sched_get_stats(s->sched, &s->stats);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    /* SIGINT and SIGTERM drain the server from now on (on_signal), and are back to what they were when it ends */
    if (pipe(signal_pipe)) {
        st = fm_fail(err, FM_ERR_IO, "serve: a pipe for the signals: %s", strerror(errno));
        fm_sched_free(s->sched);
        if (s->tok) fm_tokenizer_free(s->tok);
        if (s->tmpl) fm_chat_template_free(s->tmpl);
        chat_teardown(s);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return st;
    }
    fcntl(signal_pipe[0], F_SETFL, O_NONBLOCK), fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction on = {.sa_handler = on_signal, .sa_flags = SA_RESTART}, old_int, old_term;
    sigemptyset(&on.sa_mask);
    sigaction(SIGINT, &on, &old_int), sigaction(SIGTERM, &on, &old_term);
    signal(SIGPIPE, SIG_IGN);
    /* The passes run on this thread, the one that loaded the model and warmed it up; listening and the signals go
       to a second one. The CPU backend's OpenMP keeps a pool of workers per thread that ever ran a parallel
       region: passes on another thread than the load's would leave two pools on the cores, and libgomp then
       sleeps at every barrier instead of spinning (measured: 300 tokens of the bundled model in 1.3 s instead
       of 0.2 s on two cores). */
    listener l = {.s = s, .st = FM_OK};
    pthread_create(&s->thread, NULL, listen_thread, &l);
    scheduler_thread(s); /* until the listener stops it: every request ends (cancelled) */
    pthread_join(s->thread, NULL);
    struct MHD_Daemon *d = l.d;
    st = l.st;
    if (st) *err = l.err;
    if (d) {
        /* no new connections; the replies under way get their last chunk out (5 s at most), then the daemon stops
           (which closes whatever is still open) */
        const MHD_socket listen = MHD_quiesce_daemon(d);
        for (int i = 0; i < 500 && atomic_load(&s->n_live) > 0; i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
        MHD_stop_daemon(d);
        if (listen != MHD_INVALID_SOCKET) close(listen); /* quiesce hands the listening socket to the caller */
    }
    if (s->fatal && !st) st = s->fatal, *err = s->fatal_err;
    sigaction(SIGINT, &old_int, NULL), sigaction(SIGTERM, &old_term, NULL);
    close(signal_pipe[0]), close(signal_pipe[1]);
    signal_pipe[0] = signal_pipe[1] = -1;
    if (s->tok) fm_tokenizer_free(s->tok);
    if (s->tmpl) fm_chat_template_free(s->tmpl);
    chat_teardown(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->active);
    free(s);
    return st;
}
