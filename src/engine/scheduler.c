/* Continuous batching (fp8moe_sched.h): requests in submission order, each waiting, prefilling, running (in the decode
 * batch) or kept (finished, its cache held for a later request).
 *
 * Mixed steps (the model's step budget > 0): a step is one forward pass of every running request's next token and,
 * in the budget's remaining tokens, prefill chunks of the prompts begun and of waiting ones, oldest first; attention
 * runs over the paged cache, where each row reads its own sequence up to its own position, so rows of any sequences
 * at any positions share the launch. Rows are ordered so that the rows to sample are nearly contiguous: the chunks
 * that do not complete their prompt, those that do, then the decode rows (each sequence's rows stay consecutive, in
 * order: the Gated DeltaNet layers run a sequence's rows as one run). A step with only decode rows is the decode step
 * (its CUDA graph); a step with only one whole prompt runs it as a fresh prefill (the contiguous attention kernel).
 * Without a budget a step is one prefill chunk of the oldest request that can start, or one decode step of every
 * running request, alternating when both have work.
 *
 * The prefill share of a mixed step (step_budget.h): with the fixed budget, every token the decode rows leave; with
 * the latency budget (--step-budget latency, the default), while sequences are decoding,
 * the share whose predicted time keeps the step within R x a decode-only step at the same batch (R:
 * --max-step-latency-ratio, default 1.5), never below 64 tokens (prompts keep moving) nor above the fixed budget's, and
 * at least the waiting prompts' tokens over the steps left before the one waiting longest has waited W steps
 * (--max-prompt-wait-steps, default 40; the scheduler counts each request's steps waited). The
 * scheduler times every step it runs (its wall time, on the monotonic clock or one a test injects: fm_sched_set_clock)
 * and hands it, with its decode and prefill rows, to the estimates; before they exist (the first steps) and in steps
 * without decode rows the fixed budget applies. The share decides which rows share a step, never what a row computes:
 * the tokens are the same under either budget. */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "engine/state_cache.h"
#include "engine/step_budget.h"
#include "fp8moe_sched.h"
#include "engine/stop.h"
#include "model/arch.h"
#include "util/status.h"

typedef enum rq_state { RQ_WAITING, RQ_PREFILL, RQ_RUNNING, RQ_KEPT, RQ_DONE } rq_state;

typedef struct rq {
    int64_t id;
    rq_state state;
    fm_sched_request r; /* r.prompt and the stop lists point at the copies below */
    int32_t *prompt;    /* [n_prompt + max_tokens]: the prompt, then the sampled ids (gen): the sequence's tokens */
    int32_t *stop_ids;
    int32_t **stop_seqs, *stop_lens;
    int32_t *eos;        /* the model's eos ids (unless ignore_eos) and the request's stop ids */
    fm_logit_bias *bias; /* a copy of params.logit_bias */
    fm_stop stop;
    bool cancel;
    bool claimed;     /* kept, and a later request continues it */
    int32_t slot;     /* KV sequence while prefilling, running or kept; -1 otherwise */
    int64_t pos;      /* prompt tokens in the cache */
    int64_t n_cached; /* prompt tokens mapped from a kept or cached KV cache instead of computed */
    int32_t *gen;     /* [max_tokens] sampled ids, after the prompt */
    int64_t n_gen;
    int32_t *hist;  /* kept: prompt then generated ids; the cache holds the first fm_kv_seq_tokens of them */
    int32_t waited; /* mixed steps it has waited through for (the rest of) its prompt (the step budget's W) */
} rq;

struct fm_sched {
    fm_context *ctx;
    int64_t chunk;
    rq **reqs; /* submission order */
    int32_t n, cap;
    int64_t next_id;
    int64_t budget;                 /* tokens of a mixed step; 0: prefill chunks and decode steps alternate */
    bool last_prefill;              /* the previous unit of work was a prefill chunk: a decode step goes next */
    int64_t rows;                   /* of the arrays below: max(chunk, budget) */
    int32_t *h_ids, *h_seq, *h_pos; /* [rows] the step's rows */
    rq **c_who;                     /* [max_seqs] the prefill chunks of a mixed step */
    int64_t *c_len;
    fm_row_run *runs;                /* [max_seqs + 1] its runs of rows to sample */
    int32_t *d_ids, *d_seqs, *d_out; /* [max_seqs] */
    rq **d_who;
    int64_t prefill_tokens, decode_tokens, decode_steps;
    fm_step_budget sb;     /* mixed steps: the prefill share of each (by measured step times, or fixed) */
    fm_sched_clock_fn now; /* milliseconds */
    void *now_user;
    int64_t prefill_limit; /* the last mixed step's prefill share (tokens it could take) */
    int64_t steps, mixed_steps, mixed_prefill_tokens;
    int32_t last_decode_rows;
    int64_t last_prefill_rows, last_prefill_limit;
    int32_t last_oldest_wait; /* the last mixed step's longest-waiting prompt: its steps waited */
    double last_step_ms;
    int64_t prefix_queries, prefix_hits, prefix_prompt_tokens, prefix_cached_tokens;
};

void fm_sched_request_init(fm_sched_request *r) {
    memset(r, 0, sizeof *r);
    fm_gen_params_init(&r->params);
    r->reuse = -1;
}

static void rq_free(rq *q) {
    if (!q) return;
    for (int32_t i = 0; q->stop_seqs && i < q->r.params.n_stop_seqs; i++) free(q->stop_seqs[i]);
    free(q->prompt), free(q->stop_ids), free(q->stop_seqs), free(q->stop_lens), free(q->eos);
    free(q->bias);
    free(q->hist), free(q);
}

static double monotonic_ms(void *user) {
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void fm_sched_set_clock(fm_sched *s, fm_sched_clock_fn now_ms, void *user) {
    s->now = now_ms ? now_ms : monotonic_ms;
    s->now_user = now_ms ? user : NULL;
}

fm_status fm_sched_create(fm_context *ctx, int64_t prefill_chunk, fm_sched **out, fm_error *err) {
    *out = NULL;
    if (!ctx->kv)
        return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    fm_sched *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    s->ctx = ctx;
    s->chunk = prefill_chunk > 0 && prefill_chunk < ctx->n_tokens ? prefill_chunk : ctx->n_tokens;
    if (s->chunk > ctx->kv->max_rows) s->chunk = ctx->kv->max_rows;
    s->budget = ctx->kv->step_tokens;
    if (s->budget > ctx->n_tokens) s->budget = ctx->n_tokens; /* a context asking for fewer tokens per pass */
    s->rows = s->budget > s->chunk ? s->budget : s->chunk;
    const size_t S = (size_t)ctx->kv->pool.max_seqs;
    fm_sched_set_clock(s, NULL, NULL);
    if (s->budget > 0) {
        fm_status st = fm_step_budget_init(&s->sb, s->budget, ctx->kv->step_latency, ctx->kv->step_ratio,
                                           ctx->kv->step_latency ? ctx->kv->step_wait : 0, (int32_t)S, err);
        if (st) {
            free(s);
            return st;
        }
    }
    s->h_ids = malloc((size_t)s->rows * sizeof *s->h_ids);
    s->h_seq = malloc((size_t)s->rows * sizeof *s->h_seq);
    s->h_pos = malloc((size_t)s->rows * sizeof *s->h_pos);
    s->d_ids = malloc(S * sizeof *s->d_ids), s->d_seqs = malloc(S * sizeof *s->d_seqs);
    s->d_out = malloc(S * sizeof *s->d_out), s->d_who = malloc(S * sizeof *s->d_who);
    s->c_who = malloc(S * sizeof *s->c_who), s->c_len = malloc(S * sizeof *s->c_len);
    s->runs = malloc((S + 1) * sizeof *s->runs);
    if (!s->h_ids || !s->h_seq || !s->h_pos || !s->d_ids || !s->d_seqs || !s->d_out || !s->d_who || !s->c_who ||
        !s->c_len || !s->runs) {
        fm_sched_free(s);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return FM_OK;
}

static rq *find(const fm_sched *s, int64_t id) {
    for (int32_t i = 0; i < s->n; i++)
        if (s->reqs[i]->id == id) return s->reqs[i];
    return NULL;
}

static void emit(rq *q, int32_t id, const fm_sample_info *info, fm_sched_end end, int64_t n_generated,
                 const char *msg) {
    const fm_sched_event ev = {q->id, id, id >= 0 ? info : NULL, end, q->r.n_prompt, q->n_cached, n_generated, msg};
    if (q->r.on_event) q->r.on_event(q->r.user, &ev);
}

/* The request's last event; its slot is freed, or held when it asked to keep its cache and ended normally. */
static void finish(fm_sched *s, rq *q, fm_sched_end end, int32_t id, const fm_sample_info *info, int64_t n_generated,
                   const char *msg) {
    const bool keep =
        q->r.keep && q->slot >= 0 && (end == FM_SCHED_LENGTH || end == FM_SCHED_EOS || end == FM_SCHED_STOP);
    if (keep) {
        q->hist = malloc((size_t)(q->r.n_prompt + q->n_gen) * sizeof *q->hist);
        if (q->hist) {
            memcpy(q->hist, q->prompt, (size_t)q->r.n_prompt * sizeof *q->hist);
            memcpy(q->hist + q->r.n_prompt, q->gen, (size_t)q->n_gen * sizeof *q->hist);
        }
    }
    if (keep && q->hist) q->state = RQ_KEPT;
    else {
        if (q->slot >= 0) fm_kv_seq_end(s->ctx, q->slot);
        q->slot = -1, q->state = RQ_DONE;
    }
    emit(q, id, info, end, n_generated, msg);
}

/* Drops finished requests from the list (not inside a pass over it that calls back) */
static void compact(fm_sched *s) {
    int32_t k = 0;
    for (int32_t i = 0; i < s->n; i++) {
        if (s->reqs[i]->state == RQ_DONE) rq_free(s->reqs[i]);
        else s->reqs[k++] = s->reqs[i];
    }
    s->n = k;
}

void fm_sched_free(fm_sched *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n; i++) {
        rq *q = s->reqs[i];
        if (q->state == RQ_KEPT) {
            fm_kv_seq_end(s->ctx, q->slot);
            q->slot = -1, q->state = RQ_DONE;
        } else if (q->state != RQ_DONE) finish(s, q, FM_SCHED_CANCELLED, -1, NULL, q->n_gen, NULL);
    }
    compact(s);
    free(s->reqs), free(s->h_ids), free(s->h_seq), free(s->h_pos), free(s->d_ids), free(s->d_seqs), free(s->d_out);
    free(s->d_who), free(s->c_who), free(s->c_len), free(s->runs);
    fm_step_budget_free(&s->sb);
    free(s);
}

static fm_sampling sampling_of(const fm_sched_request *r) {
    const fm_gen_params *g = &r->params;
    fm_sampling s;
    fm_sampling_init(&s);
    s.temperature = g->temperature, s.top_k = g->top_k, s.top_p = g->top_p, s.min_p = g->min_p;
    s.repetition_penalty = g->repetition_penalty, s.presence_penalty = g->presence_penalty;
    s.frequency_penalty = g->frequency_penalty, s.seed = g->seed, s.n_logprobs = r->n_logprobs;
    s.n_bias = g->n_logit_bias, s.masked = g->constraint != NULL;
    return s;
}

static fm_status check(const fm_sched *s, const fm_sched_request *r, fm_error *err) {
    const fm_model *m = s->ctx->m;
    const int32_t V = m->cfg.vocab_size;
    const fm_gen_params *g = &r->params;
    if (r->n_prompt < 1 || !r->prompt) return fm_fail(err, FM_ERR_USAGE, "the prompt is empty");
    if (g->max_tokens < 1)
        return fm_fail(err, FM_ERR_USAGE, "max_tokens must be >= 1, got %lld", (long long)g->max_tokens);
    for (int64_t t = 0; t < r->n_prompt; t++)
        if (r->prompt[t] < 0 || r->prompt[t] >= V)
            return fm_fail(err, FM_ERR_FORMAT, "prompt token %lld is id %d, outside the vocabulary of %d", (long long)t,
                           r->prompt[t], V);
    if (r->n_prompt + g->max_tokens > s->ctx->n_ctx)
        return fm_fail(err, FM_ERR_USAGE,
                       "%lld prompt tokens + %lld new ones are more than the %lld tokens per sequence the KV cache "
                       "was planned for (--ctx)",
                       (long long)r->n_prompt, (long long)g->max_tokens, (long long)s->ctx->n_ctx);
    if (g->n_stop_ids < 0 || g->n_stop_ids > 64 || (g->n_stop_ids > 0 && !g->stop_ids))
        return fm_fail(err, FM_ERR_USAGE, "at most 64 stop ids, got %d", g->n_stop_ids);
    if (g->n_stop_seqs < 0 || (g->n_stop_seqs > 0 && (!g->stop_seqs || !g->stop_seq_lens)))
        return fm_fail(err, FM_ERR_USAGE, "stop sequences: %d without their ids", g->n_stop_seqs);
    for (int32_t i = 0; i < g->n_stop_seqs; i++)
        if (g->stop_seq_lens[i] < 1) return fm_fail(err, FM_ERR_USAGE, "stop sequence %d is empty", i);
    if (r->n_logprobs < 0 || r->n_logprobs > FM_MAX_LOGPROBS)
        return fm_fail(err, FM_ERR_USAGE, "n_logprobs must be in [0, %d], got %d", FM_MAX_LOGPROBS, r->n_logprobs);
    fm_status st = fm_logit_bias_check(g->logit_bias, g->n_logit_bias, V, err);
    if (st) return st;
    if (g->constraint && (!g->constraint->mask || !g->constraint->accept))
        return fm_fail(err, FM_ERR_USAGE, "a token constraint needs both its mask and accept functions");
    fm_sampling sp = sampling_of(r);
    st = fm_sampling_check(&sp, err);
    if (st) return st;
    if (r->reuse >= 0) {
        const rq *k = find(s, r->reuse);
        if (!k || k->state != RQ_KEPT || k->claimed)
            return fm_fail(err, FM_ERR_USAGE,
                           "request %lld has no kept cache to continue (or another request "
                           "continues it)",
                           (long long)r->reuse);
    }
    return FM_OK;
}

fm_status fm_sched_submit(fm_sched *s, const fm_sched_request *r, int64_t *req, fm_error *err) {
    fm_status st = check(s, r, err);
    if (st) return st;
    if (s->n == s->cap) {
        const int32_t cap = s->cap ? 2 * s->cap : 16;
        rq **p = realloc(s->reqs, (size_t)cap * sizeof *p);
        if (!p) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
        s->reqs = p, s->cap = cap;
    }
    rq *q = calloc(1, sizeof *q);
    if (!q) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    const fm_gen_params *g = &r->params;
    const fm_model *m = s->ctx->m;
    q->r = *r;
    q->slot = -1;
    q->prompt = malloc((size_t)(r->n_prompt + g->max_tokens) * sizeof *q->prompt);
    q->gen = q->prompt ? q->prompt + r->n_prompt : NULL;
    q->eos = malloc((size_t)(m->cfg.n_eos + g->n_stop_ids + 1) * sizeof *q->eos);
    q->stop_ids = malloc((size_t)(g->n_stop_ids + 1) * sizeof *q->stop_ids);
    q->stop_seqs = calloc((size_t)g->n_stop_seqs + 1, sizeof *q->stop_seqs);
    q->stop_lens = malloc((size_t)(g->n_stop_seqs + 1) * sizeof *q->stop_lens);
    q->bias = malloc((size_t)(g->n_logit_bias + 1) * sizeof *q->bias);
    bool ok = q->prompt && q->gen && q->eos && q->stop_ids && q->stop_seqs && q->stop_lens && q->bias;
    for (int32_t i = 0; ok && i < g->n_stop_seqs; i++) {
        q->stop_lens[i] = g->stop_seq_lens[i];
        ok = (q->stop_seqs[i] = malloc((size_t)g->stop_seq_lens[i] * sizeof **q->stop_seqs)) != NULL;
        if (ok) memcpy(q->stop_seqs[i], g->stop_seqs[i], (size_t)g->stop_seq_lens[i] * sizeof **q->stop_seqs);
    }
    if (!ok) {
        q->r.params.n_stop_seqs = g->n_stop_seqs;
        rq_free(q);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof *q->prompt);
    if (g->n_stop_ids) memcpy(q->stop_ids, g->stop_ids, (size_t)g->n_stop_ids * sizeof *q->stop_ids);
    if (g->n_logit_bias) memcpy(q->bias, g->logit_bias, (size_t)g->n_logit_bias * sizeof *q->bias);
    q->r.params.logit_bias = q->bias;
    q->r.prompt = q->prompt;
    q->r.params.stop_ids = q->stop_ids;
    q->r.params.stop_seqs = (const int32_t *const *)q->stop_seqs;
    q->r.params.stop_seq_lens = q->stop_lens;
    int32_t ne = 0;
    for (int32_t e = 0; !g->ignore_eos && e < m->cfg.n_eos; e++) q->eos[ne++] = m->cfg.eos_ids[e];
    for (int32_t e = 0; e < g->n_stop_ids; e++) q->eos[ne++] = g->stop_ids[e];
    q->stop = (fm_stop){q->eos, ne, (const int32_t *const *)q->stop_seqs, q->stop_lens, g->n_stop_seqs, g->max_tokens};
    if (r->reuse >= 0) find(s, r->reuse)->claimed = true;
    q->id = s->next_id++;
    q->state = RQ_WAITING;
    s->reqs[s->n++] = q;
    *req = q->id;
    return FM_OK;
}

void fm_sched_cancel(fm_sched *s, int64_t req) {
    rq *q = find(s, req);
    if (q && q->state != RQ_DONE && q->state != RQ_KEPT) q->cancel = true;
}

void fm_sched_release(fm_sched *s, int64_t req) {
    rq *q = find(s, req);
    if (!q || q->state != RQ_KEPT) return;
    fm_kv_seq_end(s->ctx, q->slot);
    q->slot = -1, q->state = RQ_DONE; /* dropped from the list at the next step (this may run inside a callback) */
}

/* sequences that may open: fewer than the context's max_seqs are (its pool may hold more slots) */
static int32_t slots_free(const fm_sched *s) {
    const fm_kv_pool *p = &s->ctx->kv->pool;
    int32_t open = 0;
    for (int32_t i = 0; i < p->max_seqs; i++) open += p->n_tokens[i] >= 0;
    return open < s->ctx->n_seqs ? s->ctx->n_seqs - open : 0;
}
static bool slot_free(const fm_sched *s) { return slots_free(s) > 0; }

/* The oldest kept cache no request continues: given up when a new request needs its slot */
static bool evict_kept(fm_sched *s) {
    for (int32_t i = 0; i < s->n; i++) {
        rq *q = s->reqs[i];
        if (q->state == RQ_KEPT && !q->claimed) {
            fm_kv_seq_end(s->ctx, q->slot);
            q->slot = -1, q->state = RQ_DONE;
            return true;
        }
    }
    return false;
}

/* Gives waiting request q its sequence: the kept cache it continues (cut to the common prefix, and at least the
 * last prompt token left to run for its logits) or a free slot. false when no slot is free yet. */
static fm_status start(fm_sched *s, rq *q, bool *started, fm_error *err) {
    *started = false;
    fm_context *ctx = s->ctx;
    const fm_model *m = ctx->m;
    const fm_sampling sp = sampling_of(&q->r);
    rq *k = q->r.reuse >= 0 ? find(s, q->r.reuse) : NULL;
    if (k && k->state == RQ_KEPT) {
        const int64_t held = fm_kv_seq_tokens(&ctx->kv->pool, k->slot);
        int64_t p = 0;
        while (p < held && p < q->r.n_prompt - 1 && k->hist[p] == q->prompt[p]) p++;
        /* Gated DeltaNet states (Qwen3-Next) hold the whole cached sequence and cannot be cut back: a shorter common
           prefix runs again from position 0, which resets them */
        if (p < held && fm_arch_attention_layers(&m->cfg, m->n_layers) < m->n_layers) p = 0;
        fm_status st = fm_kv_seq_sampler_reset(ctx, k->slot, q->prompt, q->r.n_prompt, &sp, err);
        if (st) return st;
        p = fm_kv_seq_cut(ctx, k->slot, p);
        q->slot = k->slot, q->pos = q->n_cached = p;
        k->slot = -1, k->state = RQ_DONE;
    } else {
        if (!slot_free(s) && !evict_kept(s)) return FM_OK;
        fm_status st = fm_kv_seq_begin(ctx, q->prompt, q->r.n_prompt, &sp, &q->slot, err);
        if (st) return st;
        /* the longest cached prefix, all but the last prompt token at most: that one runs for the logits */
        fm_kv_pool *pool = &ctx->kv->pool;
        if (pool->prefix_cache) {
            q->pos = q->n_cached = fm_state_cache_share(ctx, q->slot, q->prompt, q->r.n_prompt);
            if (q->n_cached) ctx->kv->tables_dirty = true;
            s->prefix_queries++, s->prefix_hits += q->n_cached > 0;
            s->prefix_prompt_tokens += q->r.n_prompt, s->prefix_cached_tokens += q->n_cached;
        }
    }
    fm_kv_seq_set_bias(ctx, q->slot, q->bias, q->r.params.n_logit_bias);
    q->state = RQ_PREFILL;
    *started = true;
    return FM_OK;
}

/* A constrained row's allowed ids into the step's host mask row (unconstrained rows are never read). */
static void fill_mask(fm_sched *s, const rq *q, int32_t row) {
    const fm_token_constraint *c = q->r.params.constraint;
    const int32_t V = s->ctx->m->cfg.vocab_size;
    if (c) c->mask(c->user, s->ctx->kv->h_mask + (size_t)row * (size_t)((V + 31) / 32), V);
}

/* Uploads the host mask rows [0, rows) before a step that has a constrained row. */
static void upload_masks(fm_sched *s, int32_t rows) {
    fm_context *ctx = s->ctx;
    const fm_model *m = ctx->m;
    const size_t words = (size_t)((m->cfg.vocab_size + 31) / 32);
    if (rows > 0)
        m->be->ops->upload_raw(m->be, ctx->kv->h_mask, (size_t)rows * words * sizeof(uint32_t), ctx->kv->mask);
}

/* Records sampled id of q; sends its event (the last one when the request stops here). */
static void deliver(fm_sched *s, rq *q, int32_t id, const fm_sample_info *info) {
    const fm_token_constraint *c = q->r.params.constraint;
    if (c && !c->accept(c->user, id)) {
        char msg[96];
        snprintf(msg, sizeof msg, "the token constraint refused id %d (its mask allowed no id?)", id);
        finish(s, q, FM_SCHED_ERROR, -1, NULL, q->n_gen, msg);
        return;
    }
    q->gen[q->n_gen++] = id;
    int64_t keep = q->n_gen;
    const fm_stop_reason r = fm_stop_check(&q->stop, q->gen, q->n_gen, &keep);
    if (r == FM_STOP_NONE) emit(q, id, info, FM_SCHED_RUNNING, q->n_gen, NULL);
    else if (r == FM_STOP_LENGTH) finish(s, q, FM_SCHED_LENGTH, id, info, keep, NULL);
    else finish(s, q, r == FM_STOP_EOS ? FM_SCHED_EOS : FM_SCHED_STOP, -1, NULL, keep, NULL);
}

static fm_status prefill_chunk(fm_sched *s, rq *q, fm_error *err) {
    fm_context *ctx = s->ctx;
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    const int64_t n = q->r.n_prompt, p0 = q->pos;
    const int64_t T = fm_state_cache_chunk(ctx, q->slot, p0, n, n - p0 < s->chunk ? n - p0 : s->chunk);
    const bool last = p0 + T == n;
    fm_error e;
    if (fm_kv_reserve(ctx, q->slot, T, &e)) {
        finish(s, q, FM_SCHED_ERROR, -1, NULL, 0, e.msg);
        return FM_OK;
    }
    for (int64_t t = 0; t < T; t++) s->h_seq[t] = q->slot, s->h_pos[t] = (int32_t)(p0 + t);
    fm_status st = fm_step_stage(ctx, q->prompt + p0, s->h_seq, s->h_pos, T, err);
    if (st) return st;
    /* a whole prompt in one chunk, or its first piece when a state snapshot splits it, runs as a fresh prefill */
    const bool fresh = p0 == 0 && n <= s->chunk && T == fm_state_cache_chunk(ctx, q->slot, 0, n, n);
    fm_step_device(ctx, T, last, fresh ? FM_ATTN_FRESH : FM_ATTN_PAGED);
    q->pos += T;
    s->prefill_tokens += T;
    fm_kv_prefix_name(&kv->pool, q->slot, q->prompt, q->pos); /* its full blocks, for later prompts */
    fm_state_cache_prefilled(ctx, q->slot, q->pos, n);
    if (!last) return m->be->ops->sync(m->be, err);
    fm_backend *be = m->be;
    int32_t id;
    fm_sample_info *info = kv->h_info;
    be->ops->upload_ids(be, &q->slot, 1, kv->row_slot);
    if (q->r.params.constraint) fill_mask(s, q, 0), upload_masks(s, 1);
    fm_step_sample_device(ctx, 1);
    be->ops->download_raw(be, kv->ids_out, sizeof id, &id);
    be->ops->download_raw(be, kv->info_out, sizeof *info, info);
    st = be->ops->sync(be, err);
    if (st) return st;
    q->state = RQ_RUNNING;
    deliver(s, q, id, info);
    return FM_OK;
}

/* The running requests, each with room for its next token, into d_ids / d_seqs / d_who; their count. A full pool
 * ends that request. */
static int32_t decode_rows(fm_sched *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n; i++)
        if (s->reqs[i]->state == RQ_RUNNING) s->d_who[n++] = s->reqs[i];
    int32_t kept = 0;
    for (int32_t j = 0; j < n; j++) {
        rq *q = s->d_who[j];
        fm_error e;
        if (fm_kv_reserve(s->ctx, q->slot, 1, &e)) {
            finish(s, q, FM_SCHED_ERROR, -1, NULL, q->n_gen, e.msg);
            continue;
        }
        s->d_ids[kept] = q->gen[q->n_gen - 1], s->d_seqs[kept] = q->slot, s->d_who[kept] = q;
        kept++;
    }
    return kept;
}

/* Host masks of sampled rows [first, first + n) for requests who[0..n): one thread each (a mask walks the vocabulary
 * trie: ~0.1-0.5 ms per row); the rows up to the last constrained one are uploaded. */
static void masks_of(fm_sched *s, rq *const *who, int32_t first, int32_t n, int32_t *masked) {
    int32_t n_masked = 0;
    for (int32_t j = 0; j < n; j++)
        if (who[j]->r.params.constraint) *masked = first + j + 1, n_masked++;
#pragma omp parallel for schedule(dynamic, 1) if (n_masked > 1)
    for (int32_t j = 0; j < n; j++)
        if (who[j]->r.params.constraint) fill_mask(s, who[j], first + j);
}

/* The decode rows' bookkeeping after their step: the step wrote each input token's K and V, so full blocks of the
 * output are named too (a next chat turn). */
static void name_decoded(fm_sched *s, int32_t n) {
    s->decode_steps++, s->decode_tokens += n;
    for (int32_t j = 0; j < n; j++) {
        rq *q = s->d_who[j];
        fm_kv_prefix_name(&s->ctx->kv->pool, q->slot, q->prompt, q->r.n_prompt + q->n_gen);
        fm_state_cache_decoded(s->ctx, q->slot);
    }
}

/* The masks of a decode step of n rows (fm_step_masks): rows [0, masked) hold every constrained row's mask. */
typedef struct decode_masks {
    fm_sched *s;
    int32_t n;
} decode_masks;

static int32_t fill_decode_masks(void *user) {
    const decode_masks *d = user;
    int32_t masked = 0;
    masks_of(d->s, d->s->d_who, 0, d->n, &masked);
    return masked;
}

/* A decode step of the n rows decode_rows chose: the decode step of fm_decode_run (its CUDA graphs), the masks filled
 * while the device runs the forward pass. */
static fm_status decode_run(fm_sched *s, int32_t n, fm_error *err) {
    fm_context *ctx = s->ctx;
    if (n == 0) return FM_OK;
    decode_masks dm = {s, n};
    const fm_step_masks masks = {fill_decode_masks, &dm};
    bool constrained = false; /* else the step runs as one graph */
    for (int32_t j = 0; j < n && !constrained; j++) constrained = s->d_who[j]->r.params.constraint != NULL;
    fm_sample_info *info = ctx->kv->h_info;
    fm_status st = fm_decode_run_masked(ctx, n, s->d_ids, s->d_seqs, constrained ? &masks : NULL, s->d_out, info, err);
    if (st) return st;
    name_decoded(s, n);
    for (int32_t j = 0; j < n; j++) deliver(s, s->d_who[j], s->d_out[j], &info[j]);
    return FM_OK;
}

static fm_status decode(fm_sched *s, fm_error *err) { return decode_run(s, decode_rows(s), err); }

/* With the prefix cache on, a prompt whose first block is that of a prompt being prefilled waits for it: started
 * now it would compute the shared blocks again; once they are named it maps them (as one prefill at a time did). */
static bool shares_prefill(const fm_sched *s, const rq *q) {
    const fm_kv_pool *p = &s->ctx->kv->pool;
    if (!p->prefix_cache || q->r.reuse >= 0 || q->r.n_prompt <= p->block_tokens) return false;
    for (int32_t i = 0; i < s->n; i++) {
        const rq *o = s->reqs[i];
        if (o->state == RQ_PREFILL && o->r.n_prompt > p->block_tokens &&
            !memcmp(o->prompt, q->prompt, (size_t)p->block_tokens * sizeof *q->prompt))
            return true;
    }
    return false;
}

/* The prefill chunks of a mixed step in `left` tokens: the prompts begun, then waiting requests started, oldest
 * first, each chunk at most the scheduler's chunk; into c_who / c_len (a full pool ends that request). */
static fm_status prefill_rows(fm_sched *s, int64_t left, int32_t *n_chunks, fm_error *err) {
    int32_t n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < s->n && left > 0; i++) {
            rq *q = s->reqs[i];
            if (pass == 0 && q->state != RQ_PREFILL) continue;
            if (pass == 1) {
                if (q->state != RQ_WAITING || q->cancel || shares_prefill(s, q)) continue;
                bool started;
                fm_status st = start(s, q, &started, err);
                if (st) return st;
                if (!started) continue;
            }
            const int64_t rest = q->r.n_prompt - q->pos, cap = left < s->chunk ? left : s->chunk;
            const int64_t T = fm_state_cache_chunk(s->ctx, q->slot, q->pos, q->r.n_prompt, rest < cap ? rest : cap);
            fm_error e;
            if (fm_kv_reserve(s->ctx, q->slot, T, &e)) {
                finish(s, q, FM_SCHED_ERROR, -1, NULL, 0, e.msg);
                continue;
            }
            s->c_who[n] = q, s->c_len[n] = T, n++;
            left -= T;
        }
    *n_chunks = n;
    return FM_OK;
}

/* The requests this step could give prompt rows to (the step budget's fm_step_waiting): those prefilling, and the
 * waiting ones that could start now, oldest first (a free slot each, or the kept cache they continue, or one a new
 * request may evict; not one held back for a prompt it shares blocks with). Each waits this step. A request queued
 * for a slot does not count: no share would serve it, and its wait would later demand the whole budget. */
static void waiting_prompts(fm_sched *s, fm_step_waiting *w) {
    int32_t room = slots_free(s); /* new sequences this step could open */
    for (int32_t i = 0; i < s->n; i++) room += s->reqs[i]->state == RQ_KEPT && !s->reqs[i]->claimed;
    for (int32_t i = 0; i < s->n; i++) {
        rq *q = s->reqs[i];
        if ((q->state != RQ_PREFILL && q->state != RQ_WAITING) || q->cancel) continue;
        if (q->state == RQ_WAITING) {
            if (shares_prefill(s, q)) continue;
            if (q->r.reuse < 0) {
                if (room == 0) continue;
                room--;
            }
        }
        w->n++, w->tokens += q->r.n_prompt - q->pos;
        if (q->waited > w->oldest_steps) w->oldest_steps = q->waited;
        q->waited++;
    }
}

/* A mixed step: the decode rows and prefill chunks in the budget, one pass, then each row to sample sampled with its
 * own sequence's state. */
static fm_status mixed_step(fm_sched *s, bool *busy, fm_error *err) {
    fm_context *ctx = s->ctx;
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    fm_backend *be = m->be;
    /* the decode rows fit: a prompt joins the batch only in a step with room for its last chunk beside them */
    const int32_t n_dec = decode_rows(s);
    int32_t n_chunks;
    fm_step_waiting w = {0, 0, 0};
    waiting_prompts(s, &w);
    s->prefill_limit = fm_step_budget_prefill(&s->sb, n_dec, &w);
    /* a step padded to its graph's row bucket (step_graphs.c) runs the padding rows anyway: prompt tokens take them
       where the budget has room (a share at the latency budget's floor of 64 beside 8 streams: 72 of 80 rows) */
    if (n_dec > 0 && s->prefill_limit > 0) {
        const int64_t rows = fm_step_rows_padded(ctx, n_dec + s->prefill_limit);
        if (rows <= s->sb.tokens) s->prefill_limit = rows - n_dec;
    }
    s->last_oldest_wait = w.oldest_steps;
    fm_status st = prefill_rows(s, s->prefill_limit, &n_chunks, err);
    if (st) return st;
    if (n_dec || n_chunks) *busy = true;
    if (n_chunks == 0) return decode_run(s, n_dec, err);
    /* the chunks that complete their prompt go after the others (stable), so their last rows and the decode rows
       that follow them are the rows to sample, in that order */
    int32_t n_open = 0;
    for (int32_t c = 0; c < n_chunks; c++) {
        rq *q = s->c_who[c];
        const int64_t len = s->c_len[c];
        if (q->pos + len == q->r.n_prompt) continue;
        for (int32_t k = c; k > n_open; k--) s->c_who[k] = s->c_who[k - 1], s->c_len[k] = s->c_len[k - 1];
        s->c_who[n_open] = q, s->c_len[n_open] = len, n_open++;
    }
    const int32_t n_done = n_chunks - n_open, n_sample = n_done + n_dec;
    fm_row_run *runs = s->runs; /* a run per completing prompt, and the decode rows' */
    int32_t n_runs = 0;
    int64_t T = 0;
    for (int32_t c = 0; c < n_chunks; c++) {
        const rq *q = s->c_who[c];
        for (int64_t t = 0; t < s->c_len[c]; t++, T++)
            s->h_ids[T] = q->prompt[q->pos + t], s->h_seq[T] = q->slot, s->h_pos[T] = (int32_t)(q->pos + t);
        if (c >= n_open) { /* its last row is sampled: a run of its own, or the previous run grows */
            if (n_runs && runs[n_runs - 1].first + runs[n_runs - 1].n == T - 1) runs[n_runs - 1].n++;
            else runs[n_runs++] = (fm_row_run){T - 1, 1};
        }
    }
    for (int32_t j = 0; j < n_dec; j++, T++) {
        const rq *q = s->d_who[j];
        s->h_ids[T] = s->d_ids[j], s->h_seq[T] = q->slot;
        s->h_pos[T] = (int32_t)(fm_kv_seq_tokens(&kv->pool, q->slot) - 1);
    }
    if (n_dec) {
        if (n_runs && runs[n_runs - 1].first + runs[n_runs - 1].n == T - n_dec) runs[n_runs - 1].n += n_dec;
        else runs[n_runs++] = (fm_row_run){T - n_dec, n_dec};
    }
    if (!n_runs) runs[n_runs++] = (fm_row_run){T - 1, 1}; /* nothing to sample: the last row's logits, unread */
    const rq *c0 = s->c_who[0];
    const int64_t n0 = c0->r.n_prompt; /* a whole prompt, or its first piece when a state snapshot splits it */
    const bool fresh = n_dec == 0 && n_chunks == 1 && c0->pos == 0 && n0 <= s->chunk && n0 <= s->prefill_limit &&
                       s->c_len[0] == fm_state_cache_chunk(ctx, c0->slot, 0, n0, n0);
    if ((st = fm_step_run_rows(ctx, s->h_ids, s->h_seq, s->h_pos, T, runs, n_runs,
                               fresh ? FM_ATTN_FRESH : FM_ATTN_PAGED, err)))
        return st;
    /* the sampled rows: the completing prompts' last rows, then the decode rows */
    int32_t *slots = kv->h_step, masked = 0;
    for (int32_t c = 0; c < n_done; c++) slots[c] = s->c_who[n_open + c]->slot;
    for (int32_t j = 0; j < n_dec; j++) slots[n_done + j] = s->d_who[j]->slot;
    fm_sample_info *info = kv->h_info;
    if (n_sample) {
        masks_of(s, s->c_who + n_open, 0, n_done, &masked);
        masks_of(s, s->d_who, n_done, n_dec, &masked);
        upload_masks(s, masked);
        be->ops->upload_ids(be, slots, n_sample, kv->row_slot);
        fm_step_sample_device(ctx, n_sample);
        be->ops->download_raw(be, kv->ids_out, (size_t)n_sample * sizeof *s->d_out, s->d_out);
        be->ops->download_raw(be, kv->info_out, (size_t)n_sample * sizeof *info, info);
    }
    if ((st = be->ops->sync(be, err)) || (st = fm_dist_status_take(ctx, err))) return st;
    for (int32_t c = 0; c < n_chunks; c++) {
        rq *q = s->c_who[c];
        q->pos += s->c_len[c];
        s->prefill_tokens += s->c_len[c];
        fm_kv_prefix_name(&kv->pool, q->slot, q->prompt, q->pos); /* its full blocks, for later prompts */
        fm_state_cache_prefilled(ctx, q->slot, q->pos, q->r.n_prompt);
    }
    if (n_dec) name_decoded(s, n_dec);
    for (int32_t j = 0; j < n_dec; j++) deliver(s, s->d_who[j], s->d_out[n_done + j], &info[n_done + j]);
    for (int32_t c = 0; c < n_done; c++) {
        rq *q = s->c_who[n_open + c];
        q->state = RQ_RUNNING;
        deliver(s, q, s->d_out[c], &info[c]);
    }
    return FM_OK;
}

/* A step's rows (from the counters) and wall time, for the step budget and the stats. */
static void record_step(fm_sched *s, int64_t pre0, int64_t dec0, double t0) {
    const int64_t n_pre = s->prefill_tokens - pre0, n_dec = s->decode_tokens - dec0;
    if (n_pre == 0 && n_dec == 0) return;
    s->steps++;
    const double ms = s->now(s->now_user) - t0;
    if (s->budget > 0) fm_step_budget_observe(&s->sb, (int32_t)n_dec, n_pre, ms);
    s->mixed_steps += n_pre > 0 && n_dec > 0;
    s->mixed_prefill_tokens += n_dec > 0 ? n_pre : 0;
    s->last_decode_rows = (int32_t)n_dec, s->last_prefill_rows = n_pre, s->last_step_ms = ms;
    s->last_prefill_limit = s->budget > 0 ? s->prefill_limit : s->chunk;
}

static fm_status sched_step(fm_sched *s, bool *busy, fm_error *err);

fm_status fm_sched_step(fm_sched *s, bool *busy, fm_error *err) {
    const int64_t pre0 = s->prefill_tokens, dec0 = s->decode_tokens;
    const double t0 = s->now(s->now_user);
    const fm_status st = sched_step(s, busy, err);
    if (!st) record_step(s, pre0, dec0, t0);
    return st;
}

static fm_status sched_step(fm_sched *s, bool *busy, fm_error *err) {
    *busy = false;
    for (int32_t i = 0; i < s->n; i++) {
        rq *q = s->reqs[i];
        if (q->cancel && q->state != RQ_DONE && q->state != RQ_KEPT) {
            finish(s, q, FM_SCHED_CANCELLED, -1, NULL, q->n_gen, NULL);
            *busy = true;
        }
    }
    fm_status st = FM_OK;
    if (s->budget > 0) {
        st = mixed_step(s, busy, err);
        compact(s);
        return st;
    }
    /* the request to prefill: the one begun, else the oldest waiting one that can have a sequence */
    rq *pre = NULL;
    bool running = false;
    for (int32_t i = 0; i < s->n; i++) {
        if (s->reqs[i]->state == RQ_PREFILL && !pre) pre = s->reqs[i];
        running |= s->reqs[i]->state == RQ_RUNNING;
    }
    for (int32_t i = 0; !pre && i < s->n; i++) {
        rq *q = s->reqs[i];
        if (q->state != RQ_WAITING) continue;
        bool started;
        if ((st = start(s, q, &started, err))) return st;
        if (started) pre = q;
    }
    if (pre && (!running || !s->last_prefill)) {
        st = prefill_chunk(s, pre, err);
        s->last_prefill = true, *busy = true;
    } else if (running) {
        st = decode(s, err);
        s->last_prefill = false, *busy = true;
    }
    compact(s);
    return st;
}

void fm_sched_get_stats(const fm_sched *s, fm_sched_stats *st) {
    memset(st, 0, sizeof *st);
    for (int32_t i = 0; i < s->n; i++) {
        const rq_state r = s->reqs[i]->state;
        st->waiting += r == RQ_WAITING;
        st->running += r == RQ_PREFILL || r == RQ_RUNNING;
        st->kept += r == RQ_KEPT;
    }
    const fm_kv_pool *p = &s->ctx->kv->pool;
    st->kv_blocks_total = p->n_blocks, st->kv_blocks_used = p->n_blocks - p->n_free;
    st->prefill_tokens = s->prefill_tokens, st->decode_tokens = s->decode_tokens, st->decode_steps = s->decode_steps;
    st->steps = s->steps, st->mixed_steps = s->mixed_steps, st->mixed_prefill_tokens = s->mixed_prefill_tokens;
    st->last_decode_rows = s->last_decode_rows, st->last_prefill_rows = s->last_prefill_rows;
    st->last_prefill_limit = s->last_prefill_limit, st->last_step_ms = s->last_step_ms;
    st->step_latency = s->budget > 0 && s->sb.latency;
    if (s->budget > 0) {
        st->est_decode_ms = fm_step_budget_decode_ms(&s->sb, s->last_decode_rows);
        st->est_prefill_token_ms = s->sb.token_ms > 0.0 ? s->sb.token_ms : 0.0;
        st->prompt_wait_steps = s->sb.latency ? s->sb.wait_steps : 0,
        st->oldest_prompt_wait_steps = s->last_oldest_wait;
    }
    st->prefix_cache = p->prefix_cache, st->kv_blocks_cached = p->n_lru, st->kv_evictions = p->evictions;
    st->prefix_queries = s->prefix_queries, st->prefix_hits = s->prefix_hits;
    st->prefix_prompt_tokens = s->prefix_prompt_tokens, st->prefix_cached_tokens = s->prefix_cached_tokens;
    const fm_state_cache *sc = s->ctx->kv->snaps;
    if (sc) {
        st->state_slots = sc->n_slots, st->state_snapshots = fm_state_cache_live(s->ctx);
        st->state_saves = sc->saves, st->state_restores = sc->restores, st->state_evictions = sc->evictions;
    }
    fm_expert_stats es;
    if ((st->experts_host = fm_context_expert_stats(s->ctx, &es))) {
        st->expert_slots = es.slots, st->expert_hits = es.hits, st->expert_misses = es.misses;
        st->expert_bytes_copied = es.bytes_copied;
    }
}
