/* Shared pieces of the side-by-side benchmarks (bench_common.h). */
#include "bench_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "util/status.h"

const char *bench_status_name(bench_status s) {
    return s == BENCH_OK ? "ok" : s == BENCH_UNAVAILABLE ? "unavailable" : s == BENCH_FAILED ? "failed" : "not run";
}

void bench_opts_init(bench_opts *b, long repeat, long warmup) {
    memset(b, 0, sizeof *b);
    b->repeat = repeat, b->warmup = warmup, b->backend = "cuda";
    b->verbose = isatty(STDERR_FILENO);
}

int bench_common_option(const char *cmd, int o, const char *arg, bench_opts *b) {
    switch (o) {
    case 'v': b->verbose = true; return 1;
    case BENCH_OPT_JSON: b->json_path = arg; return 1;
    case BENCH_OPT_REPEAT: return cli_parse_int(cmd, "--repeat", arg, 1, BENCH_MAX_REPEAT, &b->repeat) ? 1 : -1;
    case BENCH_OPT_WARMUP: return cli_parse_int(cmd, "--warmup", arg, 0, 10000, &b->warmup) ? 1 : -1;
    case BENCH_OPT_THREADS: return cli_parse_int(cmd, "--threads", arg, 1, 4096, &b->threads) ? 1 : -1;
    case BENCH_OPT_ROUTE: return cli_route_add(cmd, arg, b->routes, sizeof b->routes) ? 1 : -1;
    case BENCH_OPT_BACKEND:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda")) {
            cli_usage(cmd, "--backend must be cuda or cpu, got '%s'", arg);
            return -1;
        }
        b->backend = arg;
        return 1;
    }
    return 0;
}

bool bench_routing_check(const char *cmd, const char *arg) {
    double s = 0;
    fm_error err = {{0}};
    if (fm_synthetic_routing_parse(arg, &s, &err) == FM_OK) return true;
    cli_usage(cmd, "%s", err.msg);
    return false;
}

void bench_expert_stats_json(const fm_model *m, const fm_expert_stats *before, int64_t steps, cJSON *o) {
    fm_expert_stats s;
    if (!fm_context_expert_stats(m->context, &s)) return;
    if (before) {
        s.hits -= before->hits, s.misses -= before->misses, s.bytes_copied -= before->bytes_copied;
        s.bytes_prefetched -= before->bytes_prefetched;
    }
    cJSON_AddNumberToObject(o, "expert_slots", s.slots);
    cJSON_AddNumberToObject(o, "expert_hits", (double)s.hits);
    cJSON_AddNumberToObject(o, "expert_misses", (double)s.misses);
    cJSON_AddNumberToObject(o, "expert_hit_rate", s.hits + s.misses ? (double)s.hits / (double)(s.hits + s.misses) : 0);
    cJSON_AddNumberToObject(o, "expert_bytes_copied_per_step",
                            (double)s.bytes_copied / (double)(steps > 0 ? steps : 1));
    cJSON_AddNumberToObject(o, "expert_bytes_prefetched_per_step",
                            (double)s.bytes_prefetched / (double)(steps > 0 ? steps : 1));
}

bool bench_parse_counts(const char *cmd, const char *opt, const char *list, long lo, long hi, int64_t *out, int max,
                        int *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v = 0;
        if (*n == max) {
            cli_usage(cmd, "%s takes at most %d counts", opt, max);
            return false;
        }
        if (!cli_parse_int(cmd, opt, tok, lo, hi, &v)) return false;
        out[(*n)++] = v;
    }
    if (!*n) cli_usage(cmd, "%s expects a comma-separated list such as 512,4096, got '%s'", opt, list);
    return *n > 0;
}

bool bench_parse_names(const char *cmd, const char *opt, const char *list, const char *const *names, int n_names,
                       int *idx, int *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int r = 0;
        while (r < n_names && strcmp(tok, names[r]) != 0) r++;
        if (r == n_names) {
            char known[512] = "";
            for (int i = 0; i < n_names; i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", names[i]);
            cli_usage(cmd, "unknown %s value '%s' (choose %s)", opt, tok, known);
            return false;
        }
        for (int i = 0; i < *n; i++)
            if (idx[i] == r) {
                cli_usage(cmd, "%s: '%s' is listed twice", opt, tok);
                return false;
            }
        idx[(*n)++] = r;
    }
    if (!*n) cli_usage(cmd, "%s expects a comma-separated list, got '%s'", opt, list);
    return *n > 0;
}

fm_wsrc bench_weight_view(uint64_t seed, int64_t rows, int64_t cols) {
    return (fm_wsrc){NULL, 0, rows, cols, {seed * 0x632BE59BD9B4E019ull, sqrtf(3.0f / (float)cols), 0.0f, 0}, {0}};
}

fm_status bench_prequantize(fm_wsrc *v, int64_t n, fm_qsynth_kind kind, fm_qsynth **q, fm_error *err) {
    if (!(*q = calloc((size_t)n, sizeof **q))) return fm_fail(err, FM_ERR_NOMEM, "out of host memory");
    int64_t made = 0;
#pragma omp parallel for schedule(dynamic) reduction(+ : made)
    for (int64_t i = 0; i < n; i++) {
        fm_error e1;
        if (fm_qsynth_make(&v[i], kind, &(*q)[i], &e1) == FM_OK) made++;
    }
    if (made != n) {
        bench_prequant_free(*q, n), *q = NULL;
        return fm_fail(err, FM_ERR_NOMEM, "out of host memory quantizing the weights into a checkpoint's format");
    }
    for (int64_t i = 0; i < n; i++) v[i] = (*q)[i].src;
    return FM_OK;
}

void bench_prequant_free(fm_qsynth *q, int64_t n) {
    for (int64_t i = 0; q && i < n; i++) fm_qsynth_free(&q[i]);
    free(q);
}

float *bench_synth_host(fm_synth s, int64_t rows, int64_t cols) {
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    if (!v) return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * cols; i++) v[i] = fm_synth_value(&s, i, cols);
    return v;
}

float *bench_input_with_outliers(int64_t rows, int64_t cols) {
    return bench_synth_host((fm_synth){0x9E3779B97F4A7C15ull, 1.0f, 0.0f, 97}, rows, cols);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_token_ids(int32_t *ids, int64_t T, int32_t V) {
    uint64_t x = 0x2545F4914F6CDD1Dull; /* xorshift64 */
    for (int64_t t = 0; t < T; t++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[t] = (int32_t)(x % (uint64_t)V);
    }
}

fm_status bench_prefill_sequences(fm_model *m, int32_t B, int64_t context, int64_t chunk, int32_t *seq, int32_t *last,
                                  fm_error *err) {
    const int32_t V = fm_model_vocab_size(m);
    int32_t *pr = malloc((size_t)context * sizeof *pr), *sq = malloc((size_t)chunk * sizeof *sq),
            *ps = malloc((size_t)chunk * sizeof *ps);
    fm_status st = !pr || !sq || !ps ? fm_fail(err, FM_ERR_NOMEM, "bench decode: out of host memory") : FM_OK;
    fm_sampling sp;
    fm_sampling_init(&sp);
    for (int32_t s = 0; s < B; s++) seq[s] = -1;
    for (int32_t s = 0; !st && s < B; s++) {
        for (int64_t t = 0; t < context; t++) pr[t] = (int32_t)((t * 7919 + s * 104729 + 13) % V);
        st = fm_kv_seq_begin(m->context, pr, context, &sp, &seq[s], err);
        for (int64_t p0 = 0; !st && p0 < context; p0 += chunk) {
            const int64_t T = context - p0 < chunk ? context - p0 : chunk;
            for (int64_t t = 0; t < T; t++) sq[t] = seq[s], ps[t] = (int32_t)(p0 + t);
            st = fm_kv_seq_append(&m->context->kv->pool, seq[s], T, err);
            m->context->kv->tables_dirty = true;
            if (!st) st = fm_step_stage(m->context, pr + p0, sq, ps, T, err);
            if (!st) fm_step_device(m->context, T, true, p0 == 0 && T == context ? FM_ATTN_FRESH : FM_ATTN_PAGED);
            if (!st) st = fm_dist_status_take(m->context, err);
        }
        last[s] = pr[context - 1];
    }
    free(pr), free(sq), free(ps);
    return st;
}

void bench_stats(double *ms, long n, double *median, double *min, double *max) {
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    *median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    *min = ms[0], *max = ms[n - 1];
}

double bench_nerr(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++)
        d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), r += (double)ref[i] * ref[i];
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

void bench_row_set(bench_row *r, bench_status st, const char *msg) {
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

void bench_grid_route_failed(void *route_rows, size_t stride, int n_sizes, fm_status st, const char *msg) {
    for (int i = 0; i < n_sizes; i++)
        bench_row_set(bench_grid_row(route_rows, stride, i),
                      st == FM_ERR_UNSUPPORTED ? BENCH_UNAVAILABLE : BENCH_FAILED, msg);
}

int bench_grid_compare(void *rows, size_t stride, int n_routes, int n_sizes, int ref, const int64_t *n_out) {
    int failed = -1;
    for (int i = 0; i < n_routes * n_sizes; i++) {
        bench_row *r = bench_grid_row(rows, stride, i);
        const bench_row *rr = ref >= 0 ? bench_grid_row(rows, stride, ref * n_sizes + i % n_sizes) : NULL;
        r->err = r->status == BENCH_OK && rr && rr->status == BENCH_OK ? bench_nerr(r->out, rr->out, n_out[i % n_sizes])
                                                                       : NAN;
        if (r->status == BENCH_FAILED && failed < 0) failed = i;
    }
    return failed;
}

void bench_grid_free_outs(void *rows, size_t stride, int n) {
    for (int i = 0; rows && i < n; i++) {
        bench_row *r = bench_grid_row(rows, stride, i);
        free(r->out), r->out = NULL;
    }
}

void bench_row_json(const bench_row *r, cJSON *o) {
    cJSON_AddStringToObject(o, "status", bench_status_name(r->status));
    if (r->status != BENCH_OK) {
        cJSON_AddStringToObject(o, "message", r->msg);
        return;
    }
    cJSON_AddNumberToObject(o, "median_ms", r->median_ms);
    cJSON_AddNumberToObject(o, "min_ms", r->min_ms);
    cJSON_AddNumberToObject(o, "max_ms", r->max_ms);
    cJSON_AddNumberToObject(o, "flops", r->flops);
    cJSON_AddNumberToObject(o, "weight_bytes", r->weight_bytes);
    cJSON_AddNumberToObject(o, "floor_ms", r->floor_ms);
    cJSON_AddNumberToObject(o, "x_floor", r->median_ms / r->floor_ms);
    if (isnan(r->err)) cJSON_AddNullToObject(o, "err_vs_bf16");
    else cJSON_AddNumberToObject(o, "err_vs_bf16", r->err);
}

cJSON *bench_json_root(const char *bench, const char *backend, const char *device, long repeat, long warmup) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", bench);
    cJSON_AddStringToObject(root, "backend", backend);
    cJSON_AddStringToObject(root, "device", device);
    cJSON_AddNumberToObject(root, "repeat", (double)repeat);
    cJSON_AddNumberToObject(root, "warmup", (double)warmup);
    cJSON_AddNumberToObject(root, "bandwidth_bytes_per_s", BENCH_BANDWIDTH_BYTES_PER_S);
    cJSON_AddNumberToObject(root, "bf16_flops_per_s", BENCH_BF16_FLOPS_PER_S);
    cJSON_AddNumberToObject(root, "fp8_flops_per_s", BENCH_FP8_FLOPS_PER_S);
    return root;
}

fm_status bench_json_write(cJSON *root, const char *path, fm_error *err) {
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return fm_fail(err, FM_ERR_NOMEM, "out of memory for the JSON");
    const fm_status st = cli_write_file(path, text, strlen(text), err);
    free(text);
    return st;
}

bool bench_host_link(const char *cmd, double *link_gbps, double *dma_gbps) {
    fm_error err = {{0}};
    if (fm_cuda_host_link((size_t)256 << 20, dma_gbps, link_gbps, &err)) {
        fprintf(stderr, "%s: host link not measured: %s\n", cmd, err.msg);
        return false;
    }
    printf("host link, 256 MiB from pinned host memory: %.1f GB/s by the expert cache's copy kernel (mapped reads), "
           "%.1f GB/s by cudaMemcpy\n",
           *link_gbps, *dma_gbps);
    return true;
}
