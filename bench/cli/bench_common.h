/* Pieces the side-by-side benchmarks (bench moe, bench gemm) share: list parsing, synthetic inputs, the
 * statistics of repeated timings, the error against a reference output, and a route's status. */
#ifndef FM_CLI_BENCH_COMMON_H
#define FM_CLI_BENCH_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "qsynth.h"
#include "backend/backend.h"
#include "model/model_src.h"

/* Ceilings measured on the H200 (bench/NOTES.md; DESIGN.md): device copy 4.25 TB/s, bf16 dense matrix ~0.79
 * PFLOP/s, FP8 dense matrix ~1.3 PFLOP/s. */
#define BENCH_BANDWIDTH_BYTES_PER_S 4.25e12
#define BENCH_BF16_FLOPS_PER_S 0.79e15
#define BENCH_FP8_FLOPS_PER_S 1.3e15
#define BENCH_MAX_REPEAT 2000 /* two marks per run, FM_MARK_SLOTS (4096) in all */

/* The bench commands (argv[0] is the command's name: "prefill", "moe", ...); bench/cli/main.c picks one. */
int cmd_bench_prefill(int argc, char **argv);
int cmd_bench_moe(int argc, char **argv);
int cmd_bench_gemm(int argc, char **argv);
int cmd_bench_decode(int argc, char **argv);
int cmd_bench_tokenize(int argc, char **argv);
int cmd_bench_mask(int argc, char **argv);

typedef enum { BENCH_NOT_RUN, BENCH_OK, BENCH_UNAVAILABLE, BENCH_FAILED } bench_status;
const char *bench_status_name(bench_status s);

/* One row of a side-by-side table: a route at one size. err is against the reference route (NAN: none). */
typedef struct bench_row {
    bench_status status;
    char msg[sizeof(((fm_error *)0)->msg)];
    double median_ms, min_ms, max_ms, flops, weight_bytes, floor_ms, err;
    float *out; /* host copy of the route's output at this size, for err (bench_grid_compare) */
} bench_row;

/* The grid of a side-by-side benchmark (bench moe, bench gemm): route ri at size si is row ri * n_sizes + si of an
 * array of the command's result structs, stride bytes apart, each beginning with its bench_row. */
static inline bench_row *bench_grid_row(void *rows, size_t stride, int i) {
    return (bench_row *)((char *)rows + (size_t)i * stride);
}
/* Every size of a route that could not run: unavailable (st FM_ERR_UNSUPPORTED: no such route here) or failed. */
void bench_grid_route_failed(void *route_rows, size_t stride, int n_sizes, fm_status st, const char *msg);
/* After every route ran: each row's err against the reference route's row at the same size over n_out[si] floats of
 * their outputs (NAN without a reference, ref < 0, or when either did not run). Returns the first failed row, or -1. */
int bench_grid_compare(void *rows, size_t stride, int n_routes, int n_sizes, int ref, const int64_t *n_out);
/* The rows' outputs freed (rows may be NULL). */
void bench_grid_free_outs(void *rows, size_t stride, int n);

void bench_row_set(bench_row *r, bench_status st, const char *msg);
/* The row's JSON fields into o: status, and message or the timings, FLOPs, weight bytes, floor, x_floor and
 * err_vs_bf16. */
void bench_row_json(const bench_row *r, cJSON *o);
/* A results document: bench name, backend, device, repeat, warm-up and the ceilings the floors use. */
cJSON *bench_json_root(const char *bench, const char *backend, const char *device, long repeat, long warmup);
/* Writes the document to path (complete or not at all) and frees it. */
fm_status bench_json_write(cJSON *root, const char *path, fm_error *err);

/* The options every side-by-side benchmark takes: --repeat --warmup --json --backend --threads --route -v. */
typedef struct bench_opts {
    long repeat, warmup, threads;
    const char *json_path, *backend;
    bool verbose;
    char routes[512]; /* the --route options joined "k=v,k=v" (empty: the defaults) */
} bench_opts;

/* routes for fm_backend_create: NULL when no --route was given */
static inline const char *bench_routes(const bench_opts *b) { return b->routes[0] ? b->routes : NULL; }

enum {
    BENCH_OPT_REPEAT = 1900,
    BENCH_OPT_WARMUP,
    BENCH_OPT_JSON,
    BENCH_OPT_BACKEND,
    BENCH_OPT_THREADS,
    BENCH_OPT_ROUTE
};
#define BENCH_LONG_OPTIONS                                                                                             \
    {"repeat", required_argument, 0, BENCH_OPT_REPEAT}, {"warmup", required_argument, 0, BENCH_OPT_WARMUP},            \
        {"json", required_argument, 0, BENCH_OPT_JSON}, {"backend", required_argument, 0, BENCH_OPT_BACKEND},          \
        {"threads", required_argument, 0, BENCH_OPT_THREADS}, {"route", required_argument, 0, BENCH_OPT_ROUTE}, {      \
        "verbose", no_argument, 0, 'v'                                                                                 \
    }

/* Defaults: backend cuda, verbose when stderr is a terminal, the given repeat and warm-up. */
void bench_opts_init(bench_opts *b, long repeat, long warmup);
/* Handles getopt's o when it is one of the common options: 1 taken, 0 not a common option, -1 a bad value
 * (the usage message is printed). */
int bench_common_option(const char *cmd, int o, const char *arg, bench_opts *b);

/* A comma-separated list of at most max integers in [lo, hi] into out; false (after a usage message) otherwise. */
bool bench_parse_counts(const char *cmd, const char *opt, const char *list, long lo, long hi, int64_t *out, int max,
                        int *n);
/* A comma-separated list of names, each one of names[0..n_names), none twice, into idx; false after a message. */
bool bench_parse_names(const char *cmd, const char *opt, const char *list, const char *const *names, int n_names,
                       int *idx, int *n);

/* Synthetic weights (model/model_src.h), as synthetic.c makes them: uniform with variance 1 / fan_in; the values
 * depend only on the seed, so every route computes the same function of the same weights. */
fm_wsrc bench_weight_view(uint64_t seed, int64_t rows, int64_t cols);
/* The pre-quantized routes: views v[0..n) quantized on the host into a checkpoint's format (qsynth.h), in
 * parallel; on success v[i] becomes the bound pre-quantized source and *q holds its tensors (bench_prequant_free). */
fm_status bench_prequantize(fm_wsrc *v, int64_t n, fm_qsynth_kind kind, fm_qsynth **q, fm_error *err);
void bench_prequant_free(fm_qsynth *q, int64_t n);
/* rows x cols values of s on the host (NULL when out of memory) */
float *bench_synth_host(fm_synth s, int64_t rows, int64_t cols);
/* bench inputs: uniform [-1, 1) with every 97th channel x8 (outliers, as the synthetic embeddings) */
float *bench_input_with_outliers(int64_t rows, int64_t cols);

/* --synthetic-routing (bench prefill, bench decode): how often each expert is routed to */
#define BENCH_ROUTING_HELP                                                                                             \
    "  --synthetic-routing R  uniform (default: random router rows) or zipf:S (expert of rank r routed to with\n"      \
    "                     probability ~ (r + 1)^-S per layer, at most 45% per expert; router rows scaled to it)\n"
/* checks a --synthetic-routing value; false after a usage message */
bool bench_routing_check(const char *cmd, const char *arg);
/* The expert cache's counters into o (expert_slots, expert_hits, expert_misses, expert_hit_rate, expert_bytes_copied
 * per step over `steps` steps), the difference from *before when given; nothing for a model with device experts. */
void bench_expert_stats_json(const fm_model *m, const fm_expert_stats *before, int64_t steps, cJSON *o);
/* The host link as the CUDA expert cache uses it (fm_cuda_host_link, 256 MiB): prints one line (both rates) and
 * returns true with the rates, or says on stderr why not and returns false. */
bool bench_host_link(const char *cmd, double *link_gbps, double *dma_gbps);

/* T deterministic token ids below V (the same prompt for every bench prefill run) */
void bench_token_ids(int32_t *ids, int64_t T, int32_t V);
/* bench prefill --ep N (bench_prefill_ranks.c): the prefill of T tokens by a group of ranks in this process over the
 * synthetic model `synthetic` (mo: the model options, ep_ranks set), with the bytes the ranks send each other per
 * layer; a CLI exit code */
struct cli_model_opts;
int bench_prefill_ranks(const char *cmd, const char *synthetic, struct cli_model_opts *mo, int64_t T, long repeat,
                        long warmup, const char *json_path);

/* bench decode's prefill: B sequences of its deterministic prompts (sequence s, token t: (7919 t + 104729 s + 13) mod
 * V) opened in m's KV cache and run to `context` tokens in steps of at most `chunk` tokens; seq[s] their ids (-1 where
 * none was opened: the caller ends the others), last[s] each prompt's last token (the first decode step's input).
 * Stops at the first error; a rank of a group fails where the others do (they run the same steps). */
struct fm_model;
fm_status bench_prefill_sequences(struct fm_model *m, int32_t B, int64_t context, int64_t chunk, int32_t *seq,
                                  int32_t *last, fm_error *err);

/* bench decode --ep N (bench_decode_ranks.c): decode steps of each batch of sequences by a group of ranks over the
 * synthetic model `synthetic` (mo: ep_ranks, preset, dispatch set), with the bytes the ranks send each other per step
 * and layer; a CLI exit code */
int bench_decode_ranks(const char *cmd, const char *synthetic, struct cli_model_opts *mo, const char *preset,
                       const int64_t *batches, int nb, int64_t context, long steps, long warmup, const char *json_path);

/* median, min and max of n timings (sorts ms) */
void bench_stats(double *ms, long n, double *median, double *min, double *max);
/* ||x - ref|| / ||ref|| over n values */
double bench_nerr(const float *x, const float *ref, int64_t n);

#endif
