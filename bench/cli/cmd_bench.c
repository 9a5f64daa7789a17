/* fp8moe bench prefill: prefill latency of a synthetic model at real shapes, with a per-stage breakdown
 * against the floors (bytes / measured copy bandwidth, FLOPs / measured matrix rate). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cli/cli.h"
#include "dist/comm.h"
#include "engine/cost.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "util/progress.h"

static const char *HELP =
    "usage: fp8moe bench prefill --synthetic NAME [--layers L] [--tokens T] [--preset P] [--repeat R] [options]\n"
    "\n"
    "Times the prefill of T tokens through the first L layers of a synthetic model with the shapes of a real\n"
    "checkpoint (weights generated on the device, then quantized by the normal load path). Prints median, min\n"
    "and max latency over R runs after warm-up, tokens/s, and per stage the time, its bytes and FLOPs, and the\n"
    "floor max(bytes / 4.25 TB/s, FLOPs / 0.79 PFLOP/s).\n"
    "\n"
    "  --synthetic NAME   qwen3-30b-a3b, mixtral-8x7b, qwen3-next-80b-a3b, or\n"
    "                     toy-moe / toy-next (small enough for the CPU)\n"
    "  (bench prefill runs on the cuda backend unless --backend cpu is given)\n"
    "  --tokens T         prompt length (default 2048)\n"
    "  --at P             time a T-token prompt chunk of a sequence already holding P tokens (P >= 0), as the\n"
    "                     server's prompt steps run it: attention and the Gated DeltaNet over the paged cache,\n"
    "                     from the first P tokens' KV and states (the floors printed are a fresh prompt's)\n"
    "  --kv-cache F       with --at: the KV cache's format, auto (default: the activations' dtype) or e4m3\n"
    "                     (docs/kv-cache.md)\n"
    "  --repeat R         timed runs (default 10)\n"
    "  --warmup W         untimed runs first (default 2)\n"
    "  --json FILE        also write the results as JSON\n"
    "  --ep N             the prefill by N ranks in this process, each with 1/N of the routed experts (a\n"
    "                     simulated world exchanging through host memory; on cuda every rank on the one GPU:\n"
    "                     the bytes hold, the time is no multi-GPU one), the routed rows sent\n"
    "                     all-to-all in the --dispatch format; prints the wall time of the whole group and the\n"
    "                     bytes the ranks send each other per layer (--tp splits a checkpoint's float attention\n"
    "                     weights: fp8moe logits/generate --tp, not synthetic ones)\n" BENCH_ROUTING_HELP
        CLI_MODEL_HELP;

enum { OPT_SYNTH = 2000, OPT_TOKENS, OPT_REPEAT, OPT_WARMUP, OPT_JSON, OPT_ROUTING, OPT_EP, OPT_AT, OPT_KV_CACHE };
static const struct option own_options[] = {{"synthetic", required_argument, 0, OPT_SYNTH},
                                            {"tokens", required_argument, 0, OPT_TOKENS},
                                            {"repeat", required_argument, 0, OPT_REPEAT},
                                            {"warmup", required_argument, 0, OPT_WARMUP},
                                            {"json", required_argument, 0, OPT_JSON},
                                            {"synthetic-routing", required_argument, 0, OPT_ROUTING},
                                            {"ep", required_argument, 0, OPT_EP},
                                            {"at", required_argument, 0, OPT_AT},
                                            {"kv-cache", required_argument, 0, OPT_KV_CACHE},
                                            {0, 0, 0, 0}};

typedef struct bench_args {
    const char *synthetic, *json_path, *routing;
    long tokens, repeat, warmup, ep, at; /* at: -1 a whole prompt (no KV cache), else the chunk's first position */
    fm_kv_dtype kv_cache;                /* --kv-cache (with --at) */
    bool kv_given;
} bench_args;

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    bench_args *a = ctx;
    switch (id) {
    case OPT_SYNTH: a->synthetic = arg; return true;
    case OPT_TOKENS: return cli_parse_int(cmd, "--tokens", arg, 1, 1 << 20, &a->tokens);
    case OPT_REPEAT: return cli_parse_int(cmd, "--repeat", arg, 1, 10000, &a->repeat);
    case OPT_WARMUP: return cli_parse_int(cmd, "--warmup", arg, 0, 10000, &a->warmup);
    case OPT_JSON: a->json_path = arg; return true;
    case OPT_ROUTING: a->routing = arg; return bench_routing_check(cmd, arg);
    case OPT_EP: return cli_parse_int(cmd, "--ep", arg, 1, FM_COMM_MAX_RANKS, &a->ep);
    case OPT_AT: return cli_parse_int(cmd, "--at", arg, 0, 1 << 24, &a->at);
    case OPT_KV_CACHE: return a->kv_given = true, cli_parse_kv_cache(cmd, arg, &a->kv_cache);
    }
    return true;
}

static double floor_ms(double bytes, double flops) {
    const double a = bytes / BENCH_BANDWIDTH_BYTES_PER_S,
                 b = flops / BENCH_BF16_FLOPS_PER_S; /* the cost model's floor: bf16 rate */
    return 1e3 * (a > b ? a : b);
}

/* The timed runs: each run's total and per-stage times, the expert cache's counts after the warm-up. */
typedef struct prefill_times {
    int n;
    double *total, *stage[FM_STAGE_COUNT];
    fm_expert_stats cache0; /* the timed runs' own hits and copies start here */
} prefill_times;

/* What the report says: the medians, the floors and (experts in host memory on cuda) the host link's rate. */
typedef struct prefill_summary {
    double med, mn, mx, stage_med[FM_STAGE_COUNT], link_gbps, dma_gbps, copied_per_run;
    fm_cost cost;
    const char *device;
} prefill_summary;

static fm_status time_prefill(fm_model *m, const bench_args *a, bool verbose, prefill_times *t, fm_error *err) {
    const int64_t T = a->tokens;
    const int32_t V = fm_model_vocab_size(m);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    bench_token_ids(ids, T, V);
    memset(&t->cache0, 0, sizeof t->cache0);
    fm_status st = FM_OK;
    for (long r = 0; !st && r < a->warmup + a->repeat; r++) {
        fm_profile prof;
        if (r == a->warmup) fm_context_expert_stats(m->context, &t->cache0);
        st = fm_forward(m->context, ids, T, true, logits, &prof, err);
        if (st || r < a->warmup) continue;
        t->total[r - a->warmup] = prof.total_ms;
        for (int s = 0; s < FM_STAGE_COUNT; s++) t->stage[s][r - a->warmup] = prof.stage_ms[s];
        if (verbose) fm_progress("run %ld/%ld: %.3f ms", r - a->warmup + 1, a->repeat, prof.total_ms);
    }
    fm_progress_end();
    free(ids), free(logits);
    return st;
}

/* --at P: one sequence holding P tokens (prefilled in chunks of T), then each run the T-token chunk after them as a
 * step over the paged cache (fm_step_profile, FM_ATTN_PAGED: the server's prompt step). Every run rewrites the same
 * KV rows and advances the Gated DeltaNet states by the same tokens from the state the previous run left: the same
 * work each time. */
static fm_status time_chunk(fm_model *m, const bench_args *a, bool verbose, prefill_times *t, fm_error *err) {
    fm_context *ctx = m->context;
    const int64_t T = a->tokens, P = a->at;
    const int32_t V = fm_model_vocab_size(m);
    int32_t *ids = malloc((size_t)T * sizeof *ids), *sq = malloc((size_t)T * sizeof *sq),
            *ps = malloc((size_t)T * sizeof *ps);
    int32_t seq = -1, last;
    fm_status st = !ids || !sq || !ps ? fm_fail(err, FM_ERR_NOMEM, "bench prefill: out of host memory") : FM_OK;
    if (!st) bench_token_ids(ids, T, V);
    fm_sampling sp;
    fm_sampling_init(&sp);
    if (!st && P > 0) st = bench_prefill_sequences(m, 1, P, T, &seq, &last, err);
    else if (!st) st = fm_kv_seq_begin(ctx, ids, T, &sp, &seq, err);
    if (!st) st = fm_kv_seq_append(&ctx->kv->pool, seq, T, err);
    ctx->kv->tables_dirty = true;
    for (int64_t i = 0; !st && i < T; i++) sq[i] = seq, ps[i] = (int32_t)(P + i);
    for (long r = 0; !st && r < a->warmup + a->repeat; r++) {
        fm_profile prof;
        st = fm_step_stage(ctx, ids, sq, ps, T, err);
        if (!st) st = fm_step_profile(ctx, T, true, FM_ATTN_PAGED, &prof, err);
        if (!st) st = fm_dist_status_take(ctx, err);
        if (st || r < a->warmup) continue;
        t->total[r - a->warmup] = prof.total_ms;
        for (int s = 0; s < FM_STAGE_COUNT; s++) t->stage[s][r - a->warmup] = prof.stage_ms[s];
        if (verbose) fm_progress("run %ld/%ld: %.3f ms", r - a->warmup + 1, a->repeat, prof.total_ms);
    }
    fm_progress_end();
    if (seq >= 0) fm_kv_seq_end(ctx, seq);
    free(ids), free(sq), free(ps);
    return st;
}

static void print_report(const char *cmd, fm_model *m, const bench_args *a, const cli_model_opts *mo,
                         const prefill_times *t, double load_s, prefill_summary *y) {
    const int64_t T = a->tokens;
    fm_prefill_cost(&m->cfg, &m->plan, m->n_layers, T, true, &y->cost);
    const fm_cost *cost = &y->cost;
    double sorted[4096];
    memcpy(sorted, t->total, (size_t)t->n * sizeof *t->total);
    bench_stats(sorted, t->n, &y->med, &y->mn, &y->mx);
    y->device = m->be->ops->device_name(m->be);
    printf("bench prefill %s: %d layers, %lld tokens, preset %s, %s (%s); %ld runs after %ld warm-up; load %.1f s, "
           "%.2f GiB of weights\n",
           a->synthetic, m->n_layers, (long long)T, fm_preset_name(mo->opt.preset), m->be->ops->name, y->device,
           a->repeat, a->warmup, load_s, (double)m->weight_bytes / (1u << 30));
    if (a->at >= 0)
        printf("a prompt chunk at positions %ld..%lld over the paged cache, KV cache %s (the floors: a fresh prompt of "
               "%lld tokens)\n",
               a->at, (long long)(a->at + T - 1), fm_kv_dtype_name(a->kv_cache), (long long)T);
    printf("latency: median %.3f ms, min %.3f, max %.3f; %.0f tokens/s; floor %.3f ms (%.1f%% of floor reached)\n",
           y->med, y->mn, y->mx, (double)T / (y->med * 1e-3), floor_ms(cost->total_bytes, cost->total_flops),
           100.0 * floor_ms(cost->total_bytes, cost->total_flops) / y->med);
    printf("\n| stage | median ms | share | GB (floor) | GFLOP | floor ms | floor / time |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < FM_STAGE_COUNT; s++) {
        memcpy(sorted, t->stage[s], (size_t)t->n * sizeof(double));
        double lo = 0, hi = 0;
        bench_stats(sorted, t->n, &y->stage_med[s], &lo, &hi);
        const double f = floor_ms(cost->bytes[s], cost->flops[s]);
        printf("| %s | %.3f | %.1f%% | %.3f | %.1f | %.3f | %.2f |\n", fm_stage_name((fm_stage)s), y->stage_med[s],
               100.0 * y->stage_med[s] / y->med, cost->bytes[s] / 1e9, cost->flops[s] / 1e9, f,
               y->stage_med[s] > 0 ? f / y->stage_med[s] : 0);
    }
    printf("\nexpert weight bytes read by the per-token dispatch: %.2f GB (ideal, each touched expert once: "
           "counted in the floor above)\n",
           cost->expert_weight_reads_per_token_design / 1e9);
    printf("routing: %s\n", a->routing ? a->routing : "uniform");
    cli_print_expert_stats(m->context, &t->cache0);
    fm_expert_stats es;
    y->link_gbps = y->dma_gbps = y->copied_per_run = 0;
    if (cli_expert_stats_since(m->context, &t->cache0, &es) && !strcmp(m->be->ops->name, "cuda")) {
        /* the floor of the misses: their bytes at the host link's rate, measured now */
        y->copied_per_run = (double)es.bytes_copied / (double)a->repeat;
        if (bench_host_link(cmd, &y->link_gbps, &y->dma_gbps))
            printf("%.1f MB copied per prefill: link floor %.3f ms (%.0f tokens/s)\n", y->copied_per_run / 1e6,
                   y->copied_per_run / (y->link_gbps * 1e9) * 1e3,
                   (double)T / (y->copied_per_run / (y->link_gbps * 1e9)));
    }
}

static fm_status write_json(fm_model *m, const bench_args *a, const cli_model_opts *mo, const prefill_summary *y,
                            fm_error *err) {
    const int64_t T = a->tokens;
    const fm_cost *cost = &y->cost;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", a->synthetic);
    cJSON_AddNumberToObject(root, "layers", m->n_layers);
    cJSON_AddNumberToObject(root, "tokens", (double)T);
    if (a->at >= 0) cJSON_AddNumberToObject(root, "at", (double)a->at);
    if (a->at >= 0) cJSON_AddStringToObject(root, "kv_cache", fm_kv_dtype_name(a->kv_cache));
    cJSON_AddStringToObject(root, "preset", fm_preset_name(mo->opt.preset));
    cJSON_AddStringToObject(root, "routing", a->routing ? a->routing : "uniform");
    bench_expert_stats_json(m, NULL, 1, root);
    if (y->link_gbps > 0) {
        cJSON_AddNumberToObject(root, "host_link_gbps", y->link_gbps);
        cJSON_AddNumberToObject(root, "host_link_dma_gbps", y->dma_gbps);
        cJSON_AddNumberToObject(root, "copied_bytes_per_run", y->copied_per_run);
    }
    cJSON_AddStringToObject(root, "backend", m->be->ops->name);
    cJSON_AddStringToObject(root, "device", y->device);
    cJSON_AddNumberToObject(root, "repeat", (double)a->repeat);
    cJSON_AddNumberToObject(root, "median_ms", y->med);
    cJSON_AddNumberToObject(root, "min_ms", y->mn);
    cJSON_AddNumberToObject(root, "max_ms", y->mx);
    cJSON_AddNumberToObject(root, "tokens_per_s", (double)T / (y->med * 1e-3));
    cJSON_AddNumberToObject(root, "floor_ms", floor_ms(cost->total_bytes, cost->total_flops));
    cJSON *stages = cJSON_AddArrayToObject(root, "stages");
    for (int s = 0; s < FM_STAGE_COUNT; s++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "stage", fm_stage_name((fm_stage)s));
        cJSON_AddNumberToObject(o, "median_ms", y->stage_med[s]);
        cJSON_AddNumberToObject(o, "bytes", cost->bytes[s]);
        cJSON_AddNumberToObject(o, "flops", cost->flops[s]);
        cJSON_AddNumberToObject(o, "floor_ms", floor_ms(cost->bytes[s], cost->flops[s]));
        cJSON_AddItemToArray(stages, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    const fm_status st = cli_write_file(a->json_path, text, strlen(text), err);
    free(text);
    return st;
}

int cmd_bench_prefill(int argc, char **argv) {
    const char *cmd = "bench prefill";
    bench_args a = {NULL, NULL, NULL, 2048, 10, 2, 0, -1, FM_KV_ACT, false};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.opt.backend = "cuda";
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    if (!a.synthetic) return cli_usage(cmd, "--synthetic NAME is required (%s)", fm_synthetic_names());
    if (mo.model_dir) return cli_usage(cmd, "--model is not used by bench prefill (it runs synthetic weights)");

    fm_error err = {{0}};
    fm_model *m = NULL;
    mo.opt.max_tokens = a.tokens;
    mo.opt.synthetic_routing = a.routing;
    if (a.at >= 0) { /* one sequence of P + T tokens in the KV cache */
        if (a.ep > 1) return cli_usage(cmd, "--at times one rank's step; it does not take --ep");
        mo.opt.max_seqs = 1, mo.opt.ctx = a.at + a.tokens, mo.opt.kv_cache = a.kv_cache;
    } else if (a.kv_given) {
        return cli_usage(cmd, "--kv-cache needs --at: a whole prompt's prefill runs without a KV cache");
    }
    if (a.ep > 1) {
        mo.opt.ep_ranks = (int32_t)a.ep;
        return bench_prefill_ranks(cmd, a.synthetic, &mo, a.tokens, a.repeat, a.warmup, a.json_path);
    }
    const double t_load = cli_now();
    fm_status st = fm_model_load_synthetic(a.synthetic, mo.opt.n_layers, &mo.opt, &m, &err);
    if (st) return cli_fail(cmd, st, &err);
    const double load_s = cli_now() - t_load;
    prefill_times t = {.n = (int)a.repeat};
    t.total = calloc((size_t)t.n, sizeof *t.total);
    for (int s = 0; s < FM_STAGE_COUNT; s++) t.stage[s] = calloc((size_t)t.n, sizeof(double));
    st = a.at >= 0 ? time_chunk(m, &a, mo.opt.verbose, &t, &err) : time_prefill(m, &a, mo.opt.verbose, &t, &err);
    if (!st) {
        prefill_summary y;
        print_report(cmd, m, &a, &mo, &t, load_s, &y);
        if (a.json_path) st = write_json(m, &a, &mo, &y, &err);
    }
    for (int s = 0; s < FM_STAGE_COUNT; s++) free(t.stage[s]);
    free(t.total);
    fm_model_free(m);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
