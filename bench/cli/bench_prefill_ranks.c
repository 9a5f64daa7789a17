/* bench prefill --ep N: the prefill of T tokens by a group of ranks in this process (dist/rank_group.h) over a
 * synthetic model, timed as the group's wall time (every rank's pass and the exchanges), with what the ranks send each
 * other: the MoE layers' dispatch and combine all-to-alls (in the plan's dispatch format, and back in the activation
 * format) and the rest (the experts' outputs gathered to every rank; attention's all-reduce where a group also has
 * --tp, which splits a checkpoint's attention and so is not offered on synthetic weights), per layer. On the cpu
 * backend the world is simulated in host memory, so the time is the CPU's; the bytes are what a world of devices
 * would carry. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cli/cli.h"
#include "dist/rank_group.h"
#include "util/progress.h"

typedef struct rank_bytes {
    uint64_t sent, dispatch, combine; /* over every rank */
} rank_bytes;

static rank_bytes group_bytes(fm_rank_group *g) {
    rank_bytes b = {0, 0, 0};
    for (int r = 0; r < g->n_ranks; r++) {
        b.sent += fm_comm_bytes_sent(fm_world_comm(g->world, r));
        b.dispatch += g->models[r]->context->ep_bytes_dispatch, b.combine += g->models[r]->context->ep_bytes_combine;
    }
    return b;
}

int bench_prefill_ranks(const char *cmd, const char *synthetic, struct cli_model_opts *mo, int64_t T, long repeat,
                        long warmup, const char *json_path) {
    fm_error err = {{0}};
    fm_rank_group *g = NULL;
    const double t_load = cli_now();
    fm_status st = fm_rank_group_load_synthetic(synthetic, mo->opt.n_layers, &mo->opt, &g, &err);
    if (st) return cli_fail(cmd, st, &err);
    const double load_s = cli_now() - t_load;
    fm_model *m0 = g->models[0];
    const int32_t V = fm_model_vocab_size(m0);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *ms = calloc((size_t)repeat, sizeof *ms);
    if (!ids || !logits || !ms) st = fm_fail(&err, FM_ERR_NOMEM, "bench prefill: out of host memory");
    else bench_token_ids(ids, T, V);
    rank_bytes before = {0, 0, 0}, after = {0, 0, 0};
    for (long r = 0; !st && r < warmup + repeat; r++) {
        if (r == warmup) before = group_bytes(g);
        const double t0 = cli_now();
        st = fm_rank_group_forward(g, ids, T, true, logits, &err);
        if (!st && r >= warmup) ms[r - warmup] = (cli_now() - t0) * 1e3;
        if (!st && mo->opt.verbose && r >= warmup)
            fm_progress("run %ld/%ld: %.3f ms", r - warmup + 1, repeat, ms[r - warmup]);
    }
    fm_progress_end();
    if (!st) {
        after = group_bytes(g);
        double med = 0, mn = 0, mx = 0;
        bench_stats(ms, repeat, &med, &mn, &mx);
        const double per_layer = 1.0 / ((double)repeat * m0->n_layers);
        const double dispatch = (double)(after.dispatch - before.dispatch) * per_layer,
                     combine = (double)(after.combine - before.combine) * per_layer,
                     other = (double)(after.sent - before.sent) * per_layer - dispatch - combine;
        const char *dispatch_fmt = fm_afmt_name(m0->plan.a_dispatch);
        printf("bench prefill %s: %d layers, %lld tokens, preset %s, dispatch %s, %s backend; %d ranks (--ep %d --tp "
               "%d, %s world); %ld runs after %ld warm-up; load %.1f s\n",
               synthetic, m0->n_layers, (long long)T, fm_preset_name(mo->opt.preset), dispatch_fmt, m0->be->ops->name,
               g->n_ranks, m0->ep_ranks, m0->tp_ranks, fm_comm_kind(fm_world_comm(g->world, 0)), repeat, warmup,
               load_s);
        printf("latency (the group, wall time): median %.3f ms, min %.3f, max %.3f; %.0f tokens/s\n", med, mn, mx,
               (double)T / (med * 1e-3));
        printf("\n| sent between ranks, per layer (all ranks) | bytes | per token |\n|---|---:|---:|\n");
        printf("| MoE dispatch all-to-all (%s rows) | %.0f | %.1f |\n", dispatch_fmt, dispatch, dispatch / (double)T);
        printf("| MoE combine all-to-all (activation rows) | %.0f | %.1f |\n", combine, combine / (double)T);
        printf("| other (expert outputs to every rank, attention all-reduce) | %.0f | %.1f |\n", other,
               other / (double)T);
        if (json_path) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddStringToObject(root, "model", synthetic);
            cJSON_AddNumberToObject(root, "layers", m0->n_layers);
            cJSON_AddNumberToObject(root, "tokens", (double)T);
            cJSON_AddStringToObject(root, "preset", fm_preset_name(mo->opt.preset));
            cJSON_AddStringToObject(root, "dispatch", dispatch_fmt);
            cJSON_AddStringToObject(root, "backend", m0->be->ops->name);
            cJSON_AddNumberToObject(root, "ranks", g->n_ranks);
            cJSON_AddNumberToObject(root, "ep", m0->ep_ranks);
            cJSON_AddNumberToObject(root, "tp", m0->tp_ranks);
            cJSON_AddNumberToObject(root, "repeat", (double)repeat);
            cJSON_AddNumberToObject(root, "median_ms", med);
            cJSON_AddNumberToObject(root, "min_ms", mn);
            cJSON_AddNumberToObject(root, "max_ms", mx);
            cJSON_AddNumberToObject(root, "tokens_per_s", (double)T / (med * 1e-3));
            cJSON_AddNumberToObject(root, "dispatch_bytes_per_layer", dispatch);
            cJSON_AddNumberToObject(root, "combine_bytes_per_layer", combine);
            cJSON_AddNumberToObject(root, "other_bytes_per_layer", other);
            char *text = cJSON_Print(root);
            cJSON_Delete(root);
            st = cli_write_file(json_path, text, strlen(text), &err);
            free(text);
        }
    }
    free(ids), free(logits), free(ms);
    fm_rank_group_free(g);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
