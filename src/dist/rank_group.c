/* A group of ranks over a whole model (rank_group.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_kind.h"
#include "dist/rank_group.h"
#include "dist/tp_attention.h"
#include "util/status.h"

fm_status fm_rank_split_check(const fm_config *c, int32_t ep, int32_t tp, fm_error *err) {
    if (ep > 1 && tp > 1 && ep != tp)
        return fm_fail(err, FM_ERR_USAGE, "--ep %d with --tp %d: together they take the same ranks (one per device)",
                       ep, tp);
    if (ep > 1 && c->n_experts < 1)
        return fm_fail(err, FM_ERR_USAGE, "--ep %d: the model has no routed experts to split", ep);
    if (ep > 1 && c->n_experts % ep)
        return fm_fail(err, FM_ERR_USAGE, "--ep %d: the model's %d experts do not split evenly over %d ranks", ep,
                       c->n_experts, ep);
    int32_t h0, nh, kv0, nkv;
    if (tp > 1 && !fm_tp_head_range(c->n_heads, c->n_kv_heads, tp, 0, &h0, &nh, &kv0, &nkv))
        return fm_fail(err, FM_ERR_USAGE,
                       "--tp %d: the model's %d key-value heads (%d query heads) do not split evenly over %d ranks", tp,
                       c->n_kv_heads, c->n_heads, tp);
    return FM_OK;
}

/* dir, or the synthetic model `synthetic` of n_layers layers (dir NULL) */
static fm_status group_load(const char *dir, const char *synthetic, int32_t n_layers, const fm_options *opt,
                            fm_rank_group **out, fm_error *err) {
    *out = NULL;
    const int ne = opt->ep_ranks, nt = opt->tp_ranks, n_ranks = ne > nt ? ne : nt;
    if (n_ranks < 2 || n_ranks > FM_COMM_MAX_RANKS)
        return fm_fail(err, FM_ERR_USAGE, "--ep / --tp must be 2..%d ranks for a group, got %d", FM_COMM_MAX_RANKS,
                       n_ranks);
    fm_rank_group *g = fm_calloc(1, sizeof *g, err, "expert-parallel group");
    if (!g) return FM_ERR_NOMEM;
    g->n_ranks = n_ranks;
    fm_status st = fm_world_create_sim(n_ranks, &g->world, err);
    /* ranks of another backend than the cpu (--tp on cuda: every rank on the one GPU the backend takes) exchange
       through host memory, staged by their backends' copies, which synchronise: their decode steps run without
       graphs */
    const fm_backend_kind *kind = fm_backend_kind_find(opt->backend);
    const bool staged = !kind || !kind->host_ordered;
    char routes[512];
    if ((size_t)snprintf(routes, sizeof routes, "%s%sdecode.graphs=off", opt->routes ? opt->routes : "",
                         opt->routes && *opt->routes ? "," : "") >= sizeof routes)
        st = st ? st
                : fm_fail(err, FM_ERR_USAGE, "--route: %zu characters, more than a group of ranks takes (%zu)",
                          strlen(opt->routes), sizeof routes - 20);
    for (int r = 0; !st && r < n_ranks; r++) {
        fm_options o = *opt;
        o.ep_rank = r, o.tp_rank = r;
        if (staged) o.routes = routes;
        st = dir ? fm_model_load(dir, &o, &g->models[r], err)
                 : fm_model_load_synthetic(synthetic, n_layers, &o, &g->models[r], err);
        if (st && err && r > 0) { /* the first rank's message is the model's; a later one's names that rank */
            char pre[48];
            const size_t n = (size_t)snprintf(pre, sizeof pre, "rank %d of the group: ", r), cap = sizeof err->msg;
            memmove(err->msg + n, err->msg, cap - n - 1);
            memcpy(err->msg, pre, n);
            err->msg[cap - 1] = '\0';
        }
        if (!st) st = fm_context_create(g->models[r], NULL, &g->contexts[r], err);
        if (!st && ne > 1) g->contexts[r]->ep_comm = fm_world_comm(g->world, r);
        if (!st && nt > 1) g->contexts[r]->tp_comm = fm_world_comm(g->world, r);
        if (!st && staged) fm_comm_sim_stage_through(fm_world_comm(g->world, r), g->models[r]->be);
    }
    if (st) {
        fm_rank_group_free(g);
        return st;
    }
    *out = g;
    return FM_OK;
}

fm_status fm_rank_group_load(const char *dir, const fm_options *opt, fm_rank_group **out, fm_error *err) {
    return group_load(dir, NULL, 0, opt, out, err);
}

fm_status fm_rank_group_load_synthetic(const char *name, int32_t n_layers, const fm_options *opt, fm_rank_group **out,
                                       fm_error *err) {
    return group_load(NULL, name, n_layers, opt, out, err);
}

void fm_rank_group_free(fm_rank_group *g) {
    if (!g) return;
    for (int r = 0; r < g->n_ranks; r++) fm_context_free(g->contexts[r]), fm_model_free(g->models[r]);
    fm_world_free(g->world);
    free(g);
}

typedef struct rank_pass {
    fm_context *ctx;
    const int32_t *ids;
    int64_t T;
    bool last_only;
    float *logits;
    fm_status st;
    fm_error err;
} rank_pass;

static void *run_rank(void *arg) {
    rank_pass *p = arg;
    p->st = fm_forward(p->ctx, p->ids, p->T, p->last_only, p->logits, NULL, &p->err);
    return NULL;
}

fm_status fm_rank_group_forward(fm_rank_group *g, const int32_t *ids, int64_t T, bool last_only, float *logits,
                                fm_error *err) {
    const int N = g->n_ranks;
    fm_status cst = fm_context_check_ctx(g->contexts[0], T, err);
    if (cst) return cst;
    const int64_t rows = last_only ? 1 : T;
    const size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)g->models[0]->cfg.vocab_size;
    rank_pass pass[FM_COMM_MAX_RANKS];
    pthread_t th[FM_COMM_MAX_RANKS];
    bool started[FM_COMM_MAX_RANKS] = {false};
    fm_status st = FM_OK;
    for (int r = 0; r < N; r++) {
        pass[r] = (rank_pass){g->contexts[r], ids, T, last_only, r ? malloc(n * sizeof(float)) : logits, FM_OK, {{0}}};
        if (!pass[r].logits) pass[r].st = fm_fail(&pass[r].err, FM_ERR_NOMEM, "out of host memory for rank %d", r);
    }
    /* every rank runs, or none: a rank missing from the exchanges would leave the others waiting */
    for (int r = 0; r < N; r++)
        if (pass[r].st) st = pass[r].st, *err = pass[r].err;
    for (int r = 0; !st && r < N; r++) {
        if (pthread_create(&th[r], NULL, run_rank, &pass[r])) {
            fprintf(stderr, "fp8moe: expert parallelism: cannot start the thread of rank %d\n", r);
            abort(); /* the ranks already started wait in their first exchange for this one */
        }
        started[r] = true;
    }
    for (int r = 0; r < N; r++)
        if (started[r]) pthread_join(th[r], NULL);
    for (int r = 0; !st && r < N; r++)
        if (pass[r].st) {
            st = pass[r].st;
            if (err) *err = pass[r].err;
        }
    for (int r = 1; r < N; r++) free(pass[r].logits);
    return st;
}

typedef struct rank_gen {
    fm_context *ctx;
    const int32_t *const *prompts;
    const int64_t *n_prompt;
    const fm_gen_params *params;
    int32_t n;
    int64_t prefill_chunk;
    fm_token_fn on_token;
    void *user;
    fm_gen_output *out;
    fm_gen_stats *stats;
    fm_status st;
    fm_error err;
} rank_gen;

static void *run_rank_gen(void *arg) {
    rank_gen *p = arg;
    p->st = fm_context_generate(p->ctx, p->prompts, p->n_prompt, p->params, p->n, p->prefill_chunk, p->on_token,
                                p->user, p->out, p->stats, &p->err);
    return NULL;
}

fm_status fm_rank_group_generate(fm_rank_group *g, const int32_t *const *prompts, const int64_t *n_prompt,
                                 const fm_gen_params *params, int32_t n, int64_t prefill_chunk, fm_token_fn on_token,
                                 void *user, fm_gen_output *out, fm_gen_stats *stats, fm_error *err) {
    const int N = g->n_ranks;
    rank_gen job[FM_COMM_MAX_RANKS];
    fm_gen_output *others = calloc((size_t)(N - 1) * (size_t)(n > 0 ? n : 1), sizeof *others);
    if (!others) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for the ranks' outputs");
    for (int r = 0; r < N; r++)
        job[r] = (rank_gen){g->contexts[r],
                            prompts,
                            n_prompt,
                            params,
                            n,
                            prefill_chunk,
                            r ? NULL : on_token,
                            r ? NULL : user,
                            r ? others + (size_t)(r - 1) * (size_t)n : out,
                            r ? NULL : stats,
                            FM_OK,
                            {{0}}};
    fm_rank_group_run(g, run_rank_gen, job, sizeof job[0]);
    fm_status st = FM_OK;
    for (int r = 0; !st && r < N; r++)
        if (job[r].st) {
            st = job[r].st;
            if (err) *err = job[r].err;
        }
    for (size_t i = 0; i < (size_t)(N - 1) * (size_t)n; i++) free(others[i].ids), free(others[i].logprobs);
    free(others);
    return st;
}

void fm_rank_group_run(const fm_rank_group *g, void *(*fn)(void *), void *jobs, size_t job_size) {
    pthread_t th[FM_COMM_MAX_RANKS];
    for (int r = 0; r < g->n_ranks; r++)
        if (pthread_create(&th[r], NULL, fn, (char *)jobs + (size_t)r * job_size)) {
            fprintf(stderr, "fp8moe: group of ranks: cannot start the thread of rank %d\n", r);
            abort(); /* the ranks already started wait in their first exchange for this one */
        }
    for (int r = 0; r < g->n_ranks; r++) pthread_join(th[r], NULL);
}

const fm_model *fm_rank_group_model(const fm_rank_group *g, int32_t rank) { return g->models[rank]; }
const fm_context *fm_rank_group_context(const fm_rank_group *g, int32_t rank) { return g->contexts[rank]; }

size_t fm_rank_group_expert_bytes(const fm_rank_group *g, int rank) {
    const fm_model *m = g->models[rank];
    size_t bytes = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe)
            bytes += m->be->ops->bank_bytes(m->layers[l].gate_up) + m->be->ops->bank_bytes(m->layers[l].down);
    return bytes;
}
