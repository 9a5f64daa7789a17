/* Generation: prompts in, new tokens out (fp8moe.h, fm_model_generate).
 *
 * The scheduler is the simplest continuous batching: a waiting prompt takes a free sequence slot and is prefilled at
 * once, in chunks (one sequence per prefill step; its first token sampled from the last chunk's last row), then
 * joins the decode batch; every decode step runs one token of each active sequence (each at its own position,
 * attention over its own blocks) and samples them together on the device; a sequence that stops leaves the batch
 * and its blocks return to the pool for the next prompt. Per step the host reads back only the sampled ids (and
 * their log-probabilities). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "backend/cuda/cuda_graph.h"
#include "engine/stop.h"
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

/* one request's progress */
typedef struct gen_seq {
    int32_t slot; /* KV slot while running, -1 otherwise */
    int64_t len;  /* tokens in its cache */
    int32_t last; /* the last sampled id: the next step's input */
    bool done;
    fm_stop stop;
    int32_t eos[FM_MAX_EOS + 64];
} gen_seq;

static fm_sampling sampling_of(const fm_gen_params *g) {
    fm_sampling s;
    fm_sampling_init(&s);
    s.temperature = g->temperature, s.top_k = g->top_k, s.top_p = g->top_p, s.min_p = g->min_p;
    s.repetition_penalty = g->repetition_penalty, s.presence_penalty = g->presence_penalty;
    s.frequency_penalty = g->frequency_penalty, s.seed = g->seed;
    return s;
}

/* Appends n tokens of room to a sequence's cache; the block tables are re-uploaded when a block was taken. */
static fm_status reserve(fm_model *m, int32_t slot, int64_t n, fm_error *err) {
    fm_kv_state *kv = m->kv;
    const int32_t free = kv->pool.n_free;
    fm_status st = fm_kv_seq_append(&kv->pool, slot, n, err);
    if (kv->pool.n_free != free) kv->tables_dirty = true;
    return st;
}

/* Records sampled id `id` (log-probability lp) of request i; true when the request has finished. */
static bool record(gen_seq *q, fm_gen_output *o, int32_t i, int32_t id, float lp, fm_token_fn on_token, void *user) {
    o->ids[o->n] = id, o->logprobs[o->n] = lp, o->n++;
    int64_t keep = o->n;
    const fm_stop_reason r = fm_stop_check(&q->stop, o->ids, o->n, &keep);
    if (r == FM_STOP_NONE || r == FM_STOP_LENGTH) {
        if (on_token) on_token(user, i, id);
    }
    if (r == FM_STOP_NONE) return false;
    o->n = keep;
    o->finish = r == FM_STOP_EOS ? FM_FINISH_EOS : r == FM_STOP_SEQUENCE ? FM_FINISH_STOP : FM_FINISH_LENGTH;
    return true;
}

/* Samples the B rows of the last step's logits, rows belonging to slots[0..B), into ids/lps (waits). */
static void sample_rows(fm_model *m, const int32_t *slots, int32_t B, int32_t *ids, float *lps, fm_sample_info *info) {
    fm_kv_state *kv = m->kv;
    fm_backend *be = m->be;
    be->ops->upload_ids(be, slots, B, kv->row_slot);
    fm_step_sample_device(m, B);
    be->ops->download_raw(be, kv->ids_out, (size_t)B * sizeof *ids, ids);
    be->ops->download_raw(be, kv->info_out, (size_t)B * sizeof *info, info);
    for (int32_t r = 0; r < B; r++) lps[r] = info[r].logprob;
}

/* The device work of a decode step of B rows (staged, row slots uploaded): the pass, then the sampler. */
typedef struct decode_ctx {
    fm_model *m;
    int32_t B;
} decode_ctx;

static fm_status decode_body(void *ctx, fm_error *err) {
    (void)err;
    const decode_ctx *d = ctx;
    fm_step_device(d->m, d->B, false, FM_ATTN_PAGED);
    fm_step_sample_device(d->m, d->B);
    return FM_OK;
}

/* The step as a CUDA graph of its bucket: the first step of a bucket runs as it is (libraries set themselves up on
 * first use, outside any capture), the second captures it, every later one replays it. */
static fm_status decode_graph(fm_model *m, int32_t B, fm_error *err) {
    fm_kv_state *kv = m->kv;
    int32_t b = 0;
    while ((1 << b) < B) b++;
    decode_ctx d = {m, B};
    if (!kv->warm[b]) {
        kv->warm[b] = true;
        return decode_body(&d, err);
    }
    if (!kv->graphs[b]) {
        fm_status st = fm_cuda_graph_capture(m->be, decode_body, &d, &kv->graphs[b], err);
        if (st) return st;
    }
    return fm_cuda_graph_launch(kv->graphs[b], err);
}

/* a debug switch is on when set to anything but 0 (as cuda_common.cu and forward.c read them) */
static bool debug_switch(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "0") != 0;
}

/* Decode steps replay as CUDA graphs on the cuda backend (route decode.graphs), except under the debug switches,
 * which synchronise inside the pass. */
static bool use_graphs(const fm_model *m) {
    return fm_cuda_backend_stream(m->be) && fm_routes_decode_graphs(&m->routes) && !debug_switch("FP8MOE_SYNC") &&
           !debug_switch("FP8MOE_DUMP");
}

fm_status fm_decode_step(fm_model *m, int32_t n, const int32_t *ids, const int32_t *seqs, int32_t *out_ids,
                         float *out_logprobs, fm_error *err) {
    fm_kv_state *kv = m->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    if (n < 1 || n > kv->pool.max_seqs)
        return fm_fail(err, FM_ERR_USAGE, "a decode step of %d sequences; the cache has %d slots", n,
                       kv->pool.max_seqs);
    const bool graphs = use_graphs(m);
    const int32_t B = graphs ? fm_decode_bucket(n) : n; /* padded rows: copies of row 0 (the same K and V
                                                            written to the same slot again), sampled into the
                                                            padding slot and never read */
    int32_t *h_ids = kv->h_step, *h_seq = h_ids + B, *h_pos = h_seq + B, *h_slot = h_pos + B;
    fm_sample_info *info = kv->h_info;
    fm_status st = FM_OK;
    for (int32_t j = 0; !st && j < n; j++) {
        h_ids[j] = ids[j], h_seq[j] = seqs[j], h_slot[j] = seqs[j];
        h_pos[j] = (int32_t)fm_kv_seq_tokens(&kv->pool, seqs[j]);
        st = reserve(m, seqs[j], 1, err);
    }
    for (int32_t j = n; j < B; j++)
        h_ids[j] = h_ids[0], h_seq[j] = h_seq[0], h_pos[j] = h_pos[0], h_slot[j] = kv->pad_slot;
    if (!st) st = fm_step_stage(m, h_ids, h_seq, h_pos, B, err);
    if (st) return st;
    m->be->ops->upload_ids(m->be, h_slot, B, kv->row_slot);
    decode_ctx d = {m, B};
    st = graphs ? decode_graph(m, B, err) : decode_body(&d, err);
    if (st) return st;
    m->be->ops->download_raw(m->be, kv->ids_out, (size_t)n * sizeof *out_ids, out_ids);
    m->be->ops->download_raw(m->be, kv->info_out, (size_t)n * sizeof *info, info);
    for (int32_t j = 0; j < n; j++) out_logprobs[j] = info[j].logprob;
    return m->be->ops->sync(m->be, err);
}

static fm_status check_requests(const fm_model *m, const int32_t *const *prompts, const int64_t *n_prompt,
                                const fm_gen_params *params, int32_t n, fm_error *err) {
    const int32_t V = m->cfg.vocab_size;
    for (int32_t i = 0; i < n; i++) {
        if (n_prompt[i] < 1) return fm_fail(err, FM_ERR_USAGE, "prompt %d is empty", i);
        if (params[i].max_tokens < 1)
            return fm_fail(err, FM_ERR_USAGE, "prompt %d: max_tokens must be >= 1, got %lld", i,
                           (long long)params[i].max_tokens);
        for (int64_t t = 0; t < n_prompt[i]; t++)
            if (prompts[i][t] < 0 || prompts[i][t] >= V)
                return fm_fail(err, FM_ERR_FORMAT, "prompt %d: token %lld is id %d, outside the vocabulary of %d", i,
                               (long long)t, prompts[i][t], V);
        if (n_prompt[i] + params[i].max_tokens > m->kv->pool.ctx)
            return fm_fail(err, FM_ERR_USAGE,
                           "prompt %d: %lld tokens + %lld new ones are more than the %lld tokens per sequence the KV "
                           "cache was planned for (--ctx)",
                           i, (long long)n_prompt[i], (long long)params[i].max_tokens, (long long)m->kv->pool.ctx);
        if (params[i].n_stop_ids < 0 || params[i].n_stop_ids > 64 || params[i].n_stop_seqs < 0)
            return fm_fail(err, FM_ERR_USAGE, "prompt %d: at most 64 stop ids", i);
        fm_sampling s = sampling_of(&params[i]);
        fm_status st = fm_sampling_check(&s, err);
        if (st) return st;
    }
    return FM_OK;
}

fm_status fm_model_generate(fm_model *m, const int32_t *const *prompts, const int64_t *n_prompt,
                            const fm_gen_params *params, int32_t n, int64_t prefill_chunk, fm_token_fn on_token,
                            void *user, fm_gen_output *out, fm_gen_stats *stats, fm_error *err) {
    fm_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    for (int32_t i = 0; i < n; i++) memset(&out[i], 0, sizeof out[i]);
    if (!m->kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache: load it with max_seqs > 0");
    if (n < 1) return fm_fail(err, FM_ERR_USAGE, "no prompts");
    fm_status st = check_requests(m, prompts, n_prompt, params, n, err);
    if (st) return st;
    fm_kv_state *kv = m->kv;
    const int64_t chunk = prefill_chunk > 0 && prefill_chunk < m->buf_tokens ? prefill_chunk : m->buf_tokens;
    const int32_t S = kv->pool.max_seqs;
    gen_seq *q = calloc((size_t)n, sizeof *q);
    const int32_t R = fm_decode_bucket(S); /* rows of a padded decode step */
    const int64_t W = chunk > R ? chunk : R;
    int32_t *idx = malloc((size_t)(3 * W) * sizeof *idx);
    int32_t *act = malloc((size_t)S * sizeof *act); /* the requests in the decode batch */
    float *lps = malloc((size_t)R * sizeof *lps);
    fm_sample_info *info = malloc((size_t)R * sizeof *info);
    if (!q || !idx || !act || !lps || !info) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !st && i < n; i++) {
        out[i].ids = malloc((size_t)params[i].max_tokens * sizeof *out[i].ids);
        out[i].logprobs = malloc((size_t)params[i].max_tokens * sizeof *out[i].logprobs);
        if (!out[i].ids || !out[i].logprobs) st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the outputs");
        q[i].slot = -1;
        int32_t ne = 0;
        for (int32_t e = 0; !params[i].ignore_eos && e < m->cfg.n_eos; e++) q[i].eos[ne++] = m->cfg.eos_ids[e];
        for (int32_t e = 0; e < params[i].n_stop_ids; e++) q[i].eos[ne++] = params[i].stop_ids[e];
        q[i].stop = (fm_stop){
            q[i].eos, ne, params[i].stop_seqs, params[i].stop_seq_lens, params[i].n_stop_seqs, params[i].max_tokens};
    }
    int32_t *h_ids = idx, *h_seq = idx + W, *h_pos = h_seq + W;
    const double t_start = now_s();
    int32_t next = 0, n_act = 0, finished = 0;
    while (!st && finished < n) {
        /* admit waiting prompts into free slots: prefill each, sample its first token */
        while (!st && next < n && n_act < S) {
            const int32_t i = next++;
            const double t0 = now_s();
            fm_sampling sp = sampling_of(&params[i]);
            st = fm_kv_seq_begin(m, prompts[i], n_prompt[i], &sp, &q[i].slot, err);
            for (int64_t p0 = 0; !st && p0 < n_prompt[i]; p0 += chunk) {
                const int64_t T = n_prompt[i] - p0 < chunk ? n_prompt[i] - p0 : chunk;
                const bool last = p0 + T == n_prompt[i];
                st = reserve(m, q[i].slot, T, err);
                for (int64_t t = 0; !st && t < T; t++) h_seq[t] = q[i].slot, h_pos[t] = (int32_t)(p0 + t);
                if (!st) st = fm_step_stage(m, prompts[i] + p0, h_seq, h_pos, T, err);
                if (!st) fm_step_device(m, T, last, p0 == 0 && last ? FM_ATTN_FRESH : FM_ATTN_PAGED);
            }
            if (st) break;
            q[i].len = n_prompt[i];
            int32_t id;
            float lp;
            sample_rows(m, &q[i].slot, 1, &id, &lp, info);
            st = m->be->ops->sync(m->be, err);
            if (st) break;
            if (i == 0) stats->ttft_s = now_s() - t_start;
            stats->prefill_s += now_s() - t0;
            stats->prefill_tokens += n_prompt[i];
            if (record(&q[i], &out[i], i, id, lp, on_token, user)) {
                fm_kv_seq_end(m, q[i].slot);
                q[i].slot = -1, q[i].done = true, finished++;
            } else {
                q[i].last = id;
                act[n_act++] = i;
            }
        }
        if (st || n_act == 0) continue;
        /* one decode step of every active sequence */
        const double t0 = now_s();
        for (int32_t j = 0; j < n_act; j++) h_ids[j] = q[act[j]].last, h_seq[j] = q[act[j]].slot;
        int32_t *ids = h_pos; /* the step's inputs are staged before its outputs come back */
        st = fm_decode_step(m, n_act, h_ids, h_seq, ids, lps, err);
        if (st) break;
        stats->decode_s += now_s() - t0;
        stats->decode_steps++;
        stats->decode_tokens += n_act;
        int32_t kept = 0;
        for (int32_t j = 0; j < n_act; j++) {
            const int32_t i = act[j];
            q[i].len++;
            if (record(&q[i], &out[i], i, ids[j], lps[j], on_token, user)) {
                fm_kv_seq_end(m, q[i].slot);
                q[i].slot = -1, q[i].done = true, finished++;
            } else {
                q[i].last = ids[j];
                act[kept++] = i;
            }
        }
        n_act = kept;
    }
    for (int32_t i = 0; q && i < n; i++)
        if (q[i].slot >= 0) fm_kv_seq_end(m, q[i].slot);
    if (st)
        for (int32_t i = 0; i < n; i++) free(out[i].ids), free(out[i].logprobs), memset(&out[i], 0, sizeof out[i]);
    free(q), free(idx), free(act), free(lps), free(info);
    return st;
}
