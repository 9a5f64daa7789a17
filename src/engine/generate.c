/* Generation: prompts in, new tokens out (fp8moe.h, fm_context_generate), the scheduler (fp8moe_sched.h) run to
 * completion; and the decode step it drives: one token of each active sequence (each at its own position, attention
 * over its own blocks), sampled together on the device. Per step the host reads back only the sampled ids (and
 * their log-probabilities). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "fp8moe_sched.h"
#include "util/status.h"

void fm_gen_params_init(fm_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = 16;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fm_status fm_kv_reserve(fm_context *ctx, int32_t seq, int64_t n, fm_error *err) {
    fm_kv_state *kv = ctx->kv;
    const int32_t free = kv->pool.n_free;
    fm_status st = fm_kv_seq_append(&kv->pool, seq, n, err);
    if (kv->pool.n_free != free) kv->tables_dirty = true;
    return st;
}

/* The device work of a decode step of B rows (staged, row slots uploaded): the pass and the sampler, as one graph; a
 * step with constrained rows runs them as two, and between them the host fills the step's masks, which the device
 * copies after the pass: its host work runs while the device computes the pass instead of before it. */
typedef struct decode_ctx {
    fm_context *ctx;
    int32_t B;
} decode_ctx;

static fm_status forward_body(void *user, fm_error *err) {
    (void)err;
    const decode_ctx *d = user;
    fm_step_device(d->ctx, d->B, false, FM_ATTN_DECODE);
    return FM_OK;
}

static fm_status sample_body(void *user, fm_error *err) {
    (void)err;
    const decode_ctx *d = user;
    fm_step_sample_device(d->ctx, d->B);
    return FM_OK;
}

static fm_status step_body(void *user, fm_error *err) {
    fm_status st = forward_body(user, err);
    return st ? st : sample_body(user, err);
}

/* A part of the step as a CUDA graph of its bucket (*g): the first step of a bucket runs as it is (warm false:
 * libraries set themselves up on first use, outside any capture), the second captures it, every later one replays
 * it. Without graphs: as it is. */
static fm_status run_part(fm_context *ctx, bool graphs, bool warm, fm_graph **g, fm_status (*body)(void *, fm_error *),
                          decode_ctx *d, fm_error *err) {
    const fm_model *m = ctx->m;
    if (!graphs || !warm) return body(d, err);
    if (!*g) {
        fm_status st = m->be->ops->graph_capture(m->be, body, d, g, err);
        if (st) return st;
    }
    return m->be->ops->graph_launch(m->be, *g, err);
}

/* a debug switch is on when set to anything but 0 (as cuda_common.cu and forward.c read them) */
static bool debug_switch(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "0") != 0;
}

bool fm_decode_graphs_on(const fm_context *ctx) {
    const fm_model *m = ctx->m;
    return m->be->ops->graph_capture && fm_routes_decode_graphs(&m->routes) && !debug_switch("FP8MOE_SYNC") &&
           !debug_switch("FP8MOE_DUMP");
}

bool fm_decode_graph_nodes(const fm_context *ctx, int32_t n, fm_graph_nodes *out) {
    const fm_model *m = ctx->m;
    const fm_kv_state *kv = ctx->kv;
    memset(out, 0, sizeof *out);
    if (!kv || n < 1 || !m->be->ops->graph_nodes) return false;
    int32_t b = 0;
    while ((1 << b) < fm_decode_bucket(n)) b++;
    if (b >= FM_DECODE_BUCKETS) return false;
    fm_graph *const gs[] = {kv->graphs[b], kv->pass_graphs[b], kv->sample_graphs[b]};
    bool any = false;
    for (size_t i = 0; i < sizeof gs / sizeof *gs; i++)
        if (gs[i]) m->be->ops->graph_nodes(m->be, gs[i], out), any = true;
    return any;
}

fm_status fm_decode_run_masked(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs,
                               const fm_step_masks *masks, int32_t *out_ids, fm_sample_info *info, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    if (n < 1 || n > kv->pool.max_seqs)
        return fm_fail(err, FM_ERR_USAGE, "a decode step of %d sequences; the cache has %d slots", n,
                       kv->pool.max_seqs);
    const bool graphs = fm_decode_graphs_on(ctx);
    const int32_t B = graphs ? fm_decode_bucket(n) : n; /* padded rows: copies of row 0 that store no K and V
                                                            (fm_step_stage) and change no state, sampled into the
                                                            padding slot and never read */
    int32_t *h_ids = kv->h_step, *h_seq = h_ids + B, *h_pos = h_seq + B, *h_slot = h_pos + B;
    for (int32_t j = 0; j < n; j++) {
        h_ids[j] = ids[j], h_seq[j] = seqs[j], h_slot[j] = seqs[j];
        h_pos[j] = (int32_t)fm_kv_seq_tokens(&kv->pool, seqs[j]) - 1;
    }
    for (int32_t j = n; j < B; j++)
        h_ids[j] = h_ids[0], h_seq[j] = h_seq[0], h_pos[j] = h_pos[0], h_slot[j] = kv->pad_slot;
    fm_status st = fm_step_stage(ctx, h_ids, h_seq, h_pos, B, err);
    if (st) return st;
    m->be->ops->upload_ids(m->be, h_slot, B, kv->row_slot);
    int32_t b = 0;
    while ((1 << b) < B) b++;
    decode_ctx d = {ctx, B};
    const bool warm = graphs && kv->warm[b];
    if (!masks) st = run_part(ctx, graphs, warm, &kv->graphs[b], step_body, &d, err);
    else {
        st = run_part(ctx, graphs, warm, &kv->pass_graphs[b], forward_body, &d, err);
        if (st) return st;
        /* the device runs the pass (a graph launch returns at once); the host fills the masks meanwhile, and the
           device copies them after the pass (pinned host memory: the upload waits for nothing) */
        const int32_t rows = masks->fill(masks->user);
        if (rows > 0)
            m->be->ops->upload_raw(m->be, kv->h_mask,
                                   (size_t)rows * (size_t)((m->cfg.vocab_size + 31) / 32) * sizeof(uint32_t), kv->mask);
        st = run_part(ctx, graphs, warm, &kv->sample_graphs[b], sample_body, &d, err);
    }
    if (st) return st;
    if (graphs) kv->warm[b] = true;
    m->be->ops->download_raw(m->be, kv->ids_out, (size_t)n * sizeof *out_ids, out_ids);
    m->be->ops->download_raw(m->be, kv->info_out, (size_t)n * sizeof *info, info);
    st = m->be->ops->sync(m->be, err);
    return st ? st : fm_dist_status_take(ctx, err);
}

fm_status fm_decode_run(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs, int32_t *out_ids,
                        fm_sample_info *info, fm_error *err) {
    return fm_decode_run_masked(ctx, n, ids, seqs, NULL, out_ids, info, err);
}

fm_status fm_decode_step(fm_context *ctx, int32_t n, const int32_t *ids, const int32_t *seqs, int32_t *out_ids,
                         float *out_logprobs, fm_error *err) {
    fm_kv_state *kv = ctx->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    if (n < 1 || n > kv->pool.max_seqs)
        return fm_fail(err, FM_ERR_USAGE, "a decode step of %d sequences; the cache has %d slots", n,
                       kv->pool.max_seqs);
    fm_status st = FM_OK;
    for (int32_t j = 0; !st && j < n; j++) st = fm_kv_reserve(ctx, seqs[j], 1, err);
    if (!st) st = fm_decode_run(ctx, n, ids, seqs, out_ids, kv->h_info, err);
    for (int32_t j = 0; !st && j < n; j++) out_logprobs[j] = kv->h_info[j].logprob;
    return st;
}

static fm_status check_requests(const fm_context *ctx, const int32_t *const *prompts, const int64_t *n_prompt,
                                const fm_gen_params *params, int32_t n, fm_error *err) {
    const int32_t V = ctx->m->cfg.vocab_size;
    for (int32_t i = 0; i < n; i++) {
        if (n_prompt[i] < 1) return fm_fail(err, FM_ERR_USAGE, "prompt %d is empty", i);
        if (params[i].max_tokens < 1)
            return fm_fail(err, FM_ERR_USAGE, "prompt %d: max_tokens must be >= 1, got %lld", i,
                           (long long)params[i].max_tokens);
        for (int64_t t = 0; t < n_prompt[i]; t++)
            if (prompts[i][t] < 0 || prompts[i][t] >= V)
                return fm_fail(err, FM_ERR_FORMAT, "prompt %d: token %lld is id %d, outside the vocabulary of %d", i,
                               (long long)t, prompts[i][t], V);
        if (n_prompt[i] + params[i].max_tokens > ctx->n_ctx)
            return fm_fail(err, FM_ERR_USAGE,
                           "prompt %d: %lld tokens + %lld new ones are more than the %lld tokens per sequence the KV "
                           "cache was planned for (--ctx)",
                           i, (long long)n_prompt[i], (long long)params[i].max_tokens, (long long)ctx->n_ctx);
        if (params[i].n_stop_ids < 0 || params[i].n_stop_ids > 64 || params[i].n_stop_seqs < 0)
            return fm_fail(err, FM_ERR_USAGE, "prompt %d: at most 64 stop ids", i);
        fm_sampling s;
        fm_sampling_init(&s);
        s.temperature = params[i].temperature, s.top_k = params[i].top_k, s.top_p = params[i].top_p;
        s.min_p = params[i].min_p, s.repetition_penalty = params[i].repetition_penalty;
        s.presence_penalty = params[i].presence_penalty, s.frequency_penalty = params[i].frequency_penalty;
        fm_status st = fm_sampling_check(&s, err);
        if (st) return st;
    }
    return FM_OK;
}

/* fm_context_generate's view of the scheduler's events */
typedef struct gen_run {
    int64_t first_req; /* request ids are consecutive from here, in prompt order */
    fm_gen_output *out;
    fm_token_fn on_token;
    void *user;
    int32_t finished;
    double t_start, ttft_s;
    fm_status st;
    fm_error err;
} gen_run;

static void on_event(void *user, const fm_sched_event *ev) {
    gen_run *g = user;
    const int32_t i = (int32_t)(ev->req - g->first_req);
    fm_gen_output *o = &g->out[i];
    if (ev->id >= 0) {
        o->ids[o->n] = ev->id, o->logprobs[o->n] = ev->info->logprob, o->n++;
        if (g->on_token) g->on_token(g->user, i, ev->id);
        if (i == 0 && o->n == 1) g->ttft_s = now_s() - g->t_start;
    }
    if (ev->end == FM_SCHED_RUNNING) return;
    g->finished++;
    o->n = ev->n_generated; /* a stop sequence's ids are cut from the output */
    o->finish = ev->end == FM_SCHED_EOS ? FM_FINISH_EOS : ev->end == FM_SCHED_STOP ? FM_FINISH_STOP : FM_FINISH_LENGTH;
    if (i == 0 && g->ttft_s == 0.0) g->ttft_s = now_s() - g->t_start;
    if ((ev->end == FM_SCHED_ERROR || ev->end == FM_SCHED_CANCELLED) && !g->st) {
        g->st = ev->end == FM_SCHED_ERROR ? FM_ERR_NOMEM : FM_ERR_USAGE;
        snprintf(g->err.msg, sizeof g->err.msg, "prompt %d: %s", i, ev->msg ? ev->msg : "cancelled");
    }
}

fm_status fm_context_generate(fm_context *ctx, const int32_t *const *prompts, const int64_t *n_prompt,
                              const fm_gen_params *params, int32_t n, int64_t prefill_chunk, fm_token_fn on_token,
                              void *user, fm_gen_output *out, fm_gen_stats *stats, fm_error *err) {
    fm_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    for (int32_t i = 0; i < n; i++) memset(&out[i], 0, sizeof out[i]);
    if (!ctx->kv)
        return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    if (n < 1) return fm_fail(err, FM_ERR_USAGE, "no prompts");
    fm_status st = check_requests(ctx, prompts, n_prompt, params, n, err);
    if (st) return st;
    fm_sched *s;
    if ((st = fm_sched_create(ctx, prefill_chunk, &s, err))) return st;
    gen_run g = {.out = out, .on_token = on_token, .user = user, .t_start = now_s()};
    for (int32_t i = 0; !st && i < n; i++) {
        out[i].ids = malloc((size_t)params[i].max_tokens * sizeof *out[i].ids);
        out[i].logprobs = malloc((size_t)params[i].max_tokens * sizeof *out[i].logprobs);
        if (!out[i].ids || !out[i].logprobs) st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the outputs");
        fm_sched_request r;
        fm_sched_request_init(&r);
        r.prompt = prompts[i], r.n_prompt = n_prompt[i], r.params = params[i];
        r.on_event = on_event, r.user = &g;
        int64_t id;
        if (!st) st = fm_sched_submit(s, &r, &id, err);
        if (!st && i == 0) g.first_req = id;
    }
    fm_sched_stats ss;
    while (!st && g.finished < n) {
        fm_sched_get_stats(s, &ss);
        const int64_t pre = ss.prefill_tokens, dec = ss.decode_tokens;
        const double t0 = now_s();
        bool busy;
        st = fm_sched_step(s, &busy, err);
        fm_sched_get_stats(s, &ss);
        /* a mixed step's time is shared by its prompt and decode tokens, in proportion to their numbers */
        const int64_t n_pre = ss.prefill_tokens - pre, n_dec = ss.decode_tokens - dec;
        const double dt = now_s() - t0, share = n_pre + n_dec ? (double)n_pre / (double)(n_pre + n_dec) : 1.0;
        stats->prefill_s += dt * share, stats->decode_s += dt * (1.0 - share);
        if (!st && !g.st && !busy) st = fm_fail(err, FM_ERR_USAGE, "the scheduler stopped with requests unfinished");
        if (!st && g.st) *err = g.err, st = g.st;
    }
    fm_sched_get_stats(s, &ss);
    stats->prefill_tokens = ss.prefill_tokens, stats->decode_tokens = ss.decode_tokens;
    stats->decode_steps = ss.decode_steps, stats->ttft_s = g.ttft_s;
    fm_sched_free(s);
    if (st)
        for (int32_t i = 0; i < n; i++) free(out[i].ids), free(out[i].logprobs), memset(&out[i], 0, sizeof out[i]);
    return st;
}
