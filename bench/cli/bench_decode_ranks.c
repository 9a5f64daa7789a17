/* bench decode --ep N: decode steps of B sequences by a group of ranks in this process (dist/rank_group.h) over a
 * synthetic model, and what the ranks send each other per step and layer: the MoE layers' dispatch and combine
 * all-to-alls (the dispatch format's rows, and back in the activation format) and the rest (every rank's share of
 * the experts' outputs gathered to all). Each rank runs on a thread of its own what bench decode runs on one model:
 * the B sequences prefilled to the context, then warm-up and timed decode steps of all B together, every rank in
 * step with the others through their exchanges (fm_rank_group_run). Rank 0's step times are the group's; the bytes are
 * every rank's counters over the timed steps. On the cpu backend the world is simulated in host memory: the time is the
 * CPU's, the bytes are what a world of devices would carry. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cli/cli.h"
#include "dist/rank_group.h"
#include "engine/kv_state.h"
#include "util/progress.h"

typedef struct rank_decode {
    fm_model *m;
    fm_comm *comm;
    int32_t B;
    int64_t context, chunk; /* prefill steps of at most chunk tokens */
    long warmup, steps;
    double *ms;                       /* rank 0: the timed steps' wall times */
    uint64_t sent, dispatch, combine; /* this rank's, over the timed steps */
    fm_status st;
    fm_error err;
} rank_decode;

/* Rank j's prefill of B sequences (bench decode's prompts) and its decode steps. */
static void *run_rank_decode(void *arg) {
    rank_decode *j = arg;
    fm_model *m = j->m;
    const int32_t B = j->B;
    int32_t *seq = malloc((size_t)B * sizeof *seq), *ids = malloc((size_t)B * sizeof *ids);
    float *lp = malloc((size_t)B * sizeof *lp);
    fm_status st = !seq || !ids || !lp ? fm_fail(&j->err, FM_ERR_NOMEM, "out of host memory")
                                       : bench_prefill_sequences(m, B, j->context, j->chunk, seq, ids, &j->err);
    for (long r = 0; !st && r < j->warmup + j->steps; r++) {
        if (r == j->warmup) {
            j->sent = fm_comm_bytes_sent(j->comm), j->dispatch = m->context->ep_bytes_dispatch,
            j->combine = m->context->ep_bytes_combine;
        }
        const double t0 = cli_now();
        st = fm_decode_step(m->context, B, ids, seq, ids, lp, &j->err);
        if (!st && j->ms && r >= j->warmup) j->ms[r - j->warmup] = 1e3 * (cli_now() - t0);
    }
    if (!st) {
        j->sent = fm_comm_bytes_sent(j->comm) - j->sent, j->dispatch = m->context->ep_bytes_dispatch - j->dispatch;
        j->combine = m->context->ep_bytes_combine - j->combine;
    }
    for (int32_t s = 0; seq && s < B; s++)
        if (seq[s] >= 0) fm_kv_seq_end(m->context, seq[s]);
    free(seq), free(ids), free(lp);
    j->st = st;
    return NULL;
}

typedef struct ranks_row {
    int64_t batch;
    double median_ms, min_ms, max_ms, tokens_per_s, dispatch, combine, other; /* bytes per step and layer, all ranks */
} ranks_row;

/* One batch: the ranks' threads, then the row. */
static fm_status run_batch(fm_rank_group *g, int32_t B, int64_t context, int64_t chunk, long warmup, long steps,
                           ranks_row *row, fm_error *err) {
    const int N = g->n_ranks;
    rank_decode job[FM_COMM_MAX_RANKS];
    double *ms = malloc((size_t)steps * sizeof *ms);
    if (!ms) return fm_fail(err, FM_ERR_NOMEM, "bench decode: out of host memory");
    for (int r = 0; r < N; r++) {
        memset(&job[r], 0, sizeof job[r]);
        job[r].m = g->models[r], job[r].comm = fm_world_comm(g->world, r), job[r].B = B, job[r].context = context;
        job[r].chunk = chunk;
        job[r].warmup = warmup, job[r].steps = steps, job[r].ms = r ? NULL : ms;
    }
    fm_rank_group_run(g, run_rank_decode, job, sizeof job[0]);
    fm_status st = FM_OK;
    uint64_t sent = 0, dispatch = 0, combine = 0;
    for (int r = 0; r < N; r++) {
        if (!st && job[r].st) st = job[r].st, *err = job[r].err;
        sent += job[r].sent, dispatch += job[r].dispatch, combine += job[r].combine;
    }
    if (!st) {
        const double per = 1.0 / ((double)steps * g->models[0]->n_layers);
        row->batch = B;
        bench_stats(ms, steps, &row->median_ms, &row->min_ms, &row->max_ms);
        row->tokens_per_s = (double)B / (row->median_ms * 1e-3);
        row->dispatch = (double)dispatch * per, row->combine = (double)combine * per;
        row->other = (double)sent * per - row->dispatch - row->combine;
    }
    free(ms);
    return st;
}

int bench_decode_ranks(const char *cmd, const char *synthetic, struct cli_model_opts *mo, const char *preset,
                       const int64_t *batches, int nb, int64_t context, long steps, long warmup,
                       const char *json_path) {
    fm_error err = {{0}};
    int64_t max_b = 0;
    for (int i = 0; i < nb; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    mo->opt.max_seqs = (int32_t)max_b, mo->opt.ctx = context + warmup + steps + 1;
    mo->opt.max_tokens = context < 2048 ? context : 2048;
    fm_rank_group *g = NULL;
    const double t_load = cli_now();
    fm_status st = fm_rank_group_load_synthetic(synthetic, mo->opt.n_layers, &mo->opt, &g, &err);
    if (st) return cli_fail(cmd, st, &err);
    const double load_s = cli_now() - t_load;
    const fm_model *m0 = g->models[0];
    ranks_row *rows = calloc((size_t)nb, sizeof *rows);
    if (!rows) st = fm_fail(&err, FM_ERR_NOMEM, "bench decode: out of host memory");
    for (int i = 0; !st && i < nb; i++) {
        st = run_batch(g, (int32_t)batches[i], context, mo->opt.max_tokens, warmup, steps, &rows[i], &err);
        if (!st && mo->opt.verbose) fm_progress("B=%lld: %.3f ms a step", (long long)rows[i].batch, rows[i].median_ms);
    }
    fm_progress_end();
    if (!st) {
        const char *dispatch_fmt = fm_afmt_name(m0->plan.a_dispatch);
        printf("bench decode %s: %d layers, context %lld, %ld steps after %ld warm-up, preset %s, dispatch %s, %s "
               "backend; %d ranks (--ep %d, %s world); load %.1f s\n",
               synthetic, m0->n_layers, (long long)context, steps, warmup, preset, dispatch_fmt, m0->be->ops->name,
               g->n_ranks, m0->ep_ranks, fm_comm_kind(fm_world_comm(g->world, 0)), load_s);
        printf("\nper step, the group's wall time; bytes the ranks send each other per step and layer (all ranks):\n\n"
               "| batch | median ms | min | max | tokens/s | MoE dispatch (%s rows) | MoE combine (activation rows) | "
               "other (outputs to every rank) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               dispatch_fmt);
        for (int i = 0; i < nb; i++)
            printf("| %lld | %.3f | %.3f | %.3f | %.1f | %.0f | %.0f | %.0f |\n", (long long)rows[i].batch,
                   rows[i].median_ms, rows[i].min_ms, rows[i].max_ms, rows[i].tokens_per_s, rows[i].dispatch,
                   rows[i].combine, rows[i].other);
        if (json_path) {
            cJSON *root = bench_json_root("decode", m0->be->ops->name, "", steps, warmup);
            cJSON_AddStringToObject(root, "model", synthetic);
            cJSON_AddNumberToObject(root, "layers", m0->n_layers);
            cJSON_AddNumberToObject(root, "context", (double)context);
            cJSON_AddStringToObject(root, "preset", preset);
            cJSON_AddStringToObject(root, "dispatch", dispatch_fmt);
            cJSON_AddNumberToObject(root, "ranks", g->n_ranks);
            cJSON_AddNumberToObject(root, "ep", m0->ep_ranks);
            cJSON *arr = cJSON_AddArrayToObject(root, "rows");
            for (int i = 0; i < nb; i++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "batch", (double)rows[i].batch);
                cJSON_AddNumberToObject(o, "median_ms", rows[i].median_ms);
                cJSON_AddNumberToObject(o, "min_ms", rows[i].min_ms);
                cJSON_AddNumberToObject(o, "max_ms", rows[i].max_ms);
                cJSON_AddNumberToObject(o, "tokens_per_s", rows[i].tokens_per_s);
                cJSON_AddNumberToObject(o, "dispatch_bytes_per_step_layer", rows[i].dispatch);
                cJSON_AddNumberToObject(o, "combine_bytes_per_step_layer", rows[i].combine);
                cJSON_AddNumberToObject(o, "other_bytes_per_step_layer", rows[i].other);
                cJSON_AddItemToArray(arr, o);
            }
            st = bench_json_write(root, json_path, &err);
        }
    }
    free(rows);
    fm_rank_group_free(g);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
