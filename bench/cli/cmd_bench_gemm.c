/* fp8moe bench gemm: the attention projections of every layer of a model (fused qkv and o), every route side by
 * side in the same run on the same inputs, replayed as one CUDA graph per route and row count (the launch gaps a
 * decode step sees), beside the floor. Each route gets its own backend, alive only while the route runs. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "bench_common.h"
#include "cli/cli.h"
#include "util/status.h"
#ifdef FM_HAVE_CUDA
#include "anchors/gemm_anchor.cuh"
#include "backend/cuda/cuda_graph.h"
#endif

#define MAX_ROW_COUNTS 16

static const char *CMD = "bench gemm";

static const char *HELP =
    "usage: fp8moe bench gemm [--shape qwen3|toy] [--rows M1,M2,..] [--routes R1,R2,..] [options]\n"
    "\n"
    "Times the attention projections of ALL layers of a model, one after the other (per layer: the fused q|k|v\n"
    "projection, then o; each layer has its own weights, so together they exceed the L2 cache and every weight\n"
    "byte comes from memory), for several routes side by side in the same run, on the same inputs: x [M, K] bf16\n"
    "with outlier channels (every 97th column x8), synthetic weights generated on the device and converted by the\n"
    "normal bank path (as bench prefill does). On the GPU the whole sequence is captured once as a CUDA graph and\n"
    "replayed (so launch gaps are those of graph replay, as in a decode step).\n"
    "\n"
    "  --shape S        qwen3: Qwen3-30B-A3B, 48 layers, q|k|v 5120 x 2048 and o 2048 x 4096 (default)\n"
    "                   toy: 3 layers, q|k|v 160 x 96 and o 96 x 128 (checks of the command itself)\n"
    "  --rows LIST      activation rows M (tokens; default qwen3 1,8,16,128,2048; toy 1,9,40)\n"
    "  --layers L       the first L layers only (default: all)\n"
    "  --routes LIST    default: all, in this order:\n"
    "                     bf16-cublas          ref preset's projection: bf16 weights, cuBLAS (the op)\n"
    "                     fp8-cublaslt-tensor  cuBLASLt FP8, e4m3 weights with one scale per matrix, activations\n"
    "                                          quantized once before timing (one scale per tensor): GEMM only\n"
    "                     fp8-cublaslt-row     the same with row-wise scales (one per weight row and per token;\n"
    "                                          timed on the per-tensor codes and scales): GEMM only\n"
    "                     w8a8                 ours, the --dense w8a8 op: dynamic per-tensor activation\n"
    "                                          quantization on the device, then its GEMM\n"
    "                     w8a8-gemm            the same GEMM alone, on activations quantized once before timing\n"
    "                                          (mma.sync GEMV up to 16 rows, cuBLASLt FP8 above)\n"
    "                     w4a8                 ours, the fp8 preset's op: int4 weights as e4m3 on chip, dynamic\n"
    "                                          1x128 activation quantization, then its GEMM\n"
    "                     w4a8-gemm            the same GEMM alone (mma.sync GEMV up to 16 rows, the grouped\n"
    "                                          W4A8 kernel above)\n"
    "                     w4a8-zp              the w4a8 op on the same weights as a pre-quantized checkpoint's\n"
    "                                          asymmetric int4 (groups of 128, fp16 scales, zero points;\n"
    "                                          quantized on the host): int4-zp-tc banks\n"
    "                     w4a8-block           the w4a8 op on the same weights as block-FP8 (e4m3, 128 x 128\n"
    "                                          scales): e4m3-block banks\n"
    "  --repeat R       timed replays per route and M (default 50)\n"
    "  --warmup W       untimed runs first (default 5; on the GPU at least 1, before the graph is captured)\n"
    "  --json FILE      also write the results as JSON\n"
    "  --backend B      cuda (default) or cpu (the CPU's exact emulation of the op routes' formats, wall-clock\n"
    "                   time, no graphs: for checking the command where there is no GPU; GEMM-only routes are\n"
    "                   cuda only)\n"
    "  --threads N      CPU threads (--backend cpu; default all)\n"
    "  --route K=V      cuda: force a kernel route of the ops (repeatable; `fp8moe inspect --routes`)\n"
    "  -v, --verbose    progress on stderr\n"
    "  -h, --help       this help\n"
    "\n"
    "Per route and M: median, min and max of the device time of one replay of all layers; the floor\n"
    "max(weight bytes / 4.25 TB/s, FLOPs / rate), weight bytes = the route's resident weights (codes and scales),\n"
    "rate 1.3 PFLOP/s for fp8 routes and 0.79 PFLOP/s for bf16; x floor = median / floor; err = ||y - y_bf16|| /\n"
    "||y_bf16|| over the last layer's two outputs, against bf16-cublas at the same M (when that route ran). A\n"
    "route the backend cannot run is printed as 'unavailable: <reason>' and the others go on.\n"
    "Exit codes: 0 every route ran or was unavailable, 1 a route failed or no backend could be created, 2 usage.\n";

typedef struct gemm_shape {
    const char *name, *model;
    int32_t layers;
    int64_t qkv_n, qkv_k, o_n, o_k;
    int64_t rows[5];
    int n_rows;
} gemm_shape;

/* config.json of Qwen/Qwen3-30B-A3B: 32 query and 4 key/value heads of 128, hidden 2048 */
static const gemm_shape shapes[] = {
    {"qwen3", "Qwen3-30B-A3B", 48, (32 + 2 * 4) * 128, 2048, 2048, 32 * 128, {1, 8, 16, 128, 2048}, 5},
    {"toy", "toy", 3, 160, 96, 96, 128, {1, 9, 40}, 3},
};

enum { R_BF16, R_LT_TENSOR, R_LT_ROW, R_W8A8, R_W8A8_GEMM, R_W4A8, R_W4A8_GEMM, R_W4A8_ZP, R_W4A8_BLOCK, ROUTE_COUNT };

static const char *const route_names[ROUTE_COUNT] = {
    "bf16-cublas", "fp8-cublaslt-tensor", "fp8-cublaslt-row", "w8a8",      "w8a8-gemm",
    "w4a8",        "w4a8-gemm",           "w4a8-zp",          "w4a8-block"};

static const struct {
    fm_preset preset;
    fm_dense dense;
    int gemm_only; /* -1: the backend's linear op; else the fm_gemm_only_kind of gemm_anchor.cuh */
    int prequant;  /* -1: the synthetic weights as they are; else the fm_qsynth_kind of a checkpoint's format */
} routes[ROUTE_COUNT] = {
    {FM_PRESET_REF, FM_DENSE_PRESET, -1, -1},
    {FM_PRESET_FP8, FM_DENSE_W8A8, 0, -1},
    {FM_PRESET_FP8, FM_DENSE_W8A8, 1, -1},
    {FM_PRESET_FP8, FM_DENSE_W8A8, -1, -1},
    {FM_PRESET_FP8, FM_DENSE_W8A8, 2, -1},
    {FM_PRESET_FP8, FM_DENSE_PRESET, -1, -1},
    {FM_PRESET_FP8, FM_DENSE_PRESET, 3, -1},
    {FM_PRESET_FP8, FM_DENSE_PRESET, -1, FM_QSYNTH_INT4_ASYM},
    {FM_PRESET_FP8, FM_DENSE_PRESET, -1, FM_QSYNTH_FP8_BLOCK},
};

typedef struct result {
    bench_row t; /* t.out: the last layer's outputs, qkv then o */
} result;

typedef struct bench_cfg {
    const gemm_shape *shape;
    int32_t layers;
    int64_t rows[MAX_ROW_COUNTS];
    int n_rows;
    int route[ROUTE_COUNT], n_routes;
    bench_opts b;
    float *x_qkv, *x_o; /* host inputs for the largest M */
    char device[256];
} bench_cfg;

static bool is_fp8(int route) { return route != R_BF16; }

/* ---- arguments ---- */

enum { OPT_SHAPE = 2000, OPT_ROWS, OPT_LAYERS, OPT_ROUTES };

/* Returns -1 when the benchmark should run, else the exit code (0 after --help, 2 on a usage error). */
static int parse_args(int argc, char **argv, bench_cfg *c) {
    static const struct option opts[] = {{"shape", required_argument, 0, OPT_SHAPE},
                                         {"rows", required_argument, 0, OPT_ROWS},
                                         {"layers", required_argument, 0, OPT_LAYERS},
                                         {"routes", required_argument, 0, OPT_ROUTES},
                                         {"help", no_argument, 0, 'h'},
                                         BENCH_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    const char *shape = "qwen3", *rows = NULL, *route_list = NULL;
    long layers = 0;
    optind = 1;
    opterr = 0; /* our own message for unknown options */
    int o;
    while ((o = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
        switch (o) {
        case 'h': return fputs(HELP, stdout), CLI_OK;
        case OPT_SHAPE: shape = optarg; break;
        case OPT_ROWS: rows = optarg; break;
        case OPT_ROUTES: route_list = optarg; break;
        case OPT_LAYERS:
            if (!cli_parse_int(CMD, "--layers", optarg, 1, 1000, &layers)) return CLI_USAGE;
            break;
        default: {
            const int taken = bench_common_option(CMD, o, optarg, &c->b);
            if (taken < 0) return CLI_USAGE;
            if (!taken) return cli_usage(CMD, "unknown option or missing value: '%s'", argv[optind - 1]);
        }
        }
    }
    if (optind < argc) return cli_usage(CMD, "unexpected argument '%s'", argv[optind]);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!strcmp(shape, shapes[i].name)) c->shape = &shapes[i];
    if (!c->shape) return cli_usage(CMD, "unknown shape '%s' (choose qwen3 or toy)", shape);
    if (layers > c->shape->layers)
        return cli_usage(CMD, "--layers %ld: %s has %d layers", layers, c->shape->name, c->shape->layers);
    c->layers = layers ? (int32_t)layers : c->shape->layers;
    if (rows && !bench_parse_counts(CMD, "--rows", rows, 1, 1 << 16, c->rows, MAX_ROW_COUNTS, &c->n_rows))
        return CLI_USAGE;
    if (!rows) {
        c->n_rows = c->shape->n_rows;
        memcpy(c->rows, c->shape->rows, (size_t)c->n_rows * sizeof *c->rows);
    }
    if (route_list && !bench_parse_names(CMD, "--routes", route_list, route_names, ROUTE_COUNT, c->route, &c->n_routes))
        return CLI_USAGE;
    if (!route_list)
        for (int r = 0; r < ROUTE_COUNT; r++) c->route[c->n_routes++] = r;
    return -1;
}

/* ---- one route ---- */

static void set_msg(result *r, bench_status st, const char *msg) { bench_row_set(&r->t, st, msg); }
/* What one route's runs share: its backend, the two banks (one matrix per layer), and for the current M the
 * device buffers and, for a GEMM-only route, the activations it quantized. */
typedef struct route_ctx {
    const bench_cfg *c;
    fm_backend *be;
    int route;
    fm_bank *qkv, *o;
    int64_t M;
    void *x_qkv, *x_o, *y_qkv, *y_o;
#ifdef FM_HAVE_CUDA
    fm_gemm_only *g_qkv, *g_o;
#endif
} route_ctx;

/* all layers, in order: q|k|v then o */
static fm_status run_layers(void *ctx, fm_error *err) {
    route_ctx *rc = ctx;
    fm_backend *be = rc->be;
    for (int32_t l = 0; l < rc->c->layers; l++) {
#ifdef FM_HAVE_CUDA
        if (rc->g_qkv) {
            fm_status st = fm_gemm_only_run(rc->g_qkv, l, rc->y_qkv, err);
            if (!st) st = fm_gemm_only_run(rc->g_o, l, rc->y_o, err);
            if (st) return st;
            continue;
        }
#else
        (void)err;
#endif
        be->ops->linear(be, rc->qkv, l, rc->x_qkv, rc->M, be->plan.a_dense, rc->y_qkv);
        be->ops->linear(be, rc->o, l, rc->x_o, rc->M, be->plan.a_dense, rc->y_o);
    }
    return FM_OK;
}

static fm_status make_banks(route_ctx *rc, fm_error *err) {
    const gemm_shape *s = rc->c->shape;
    const int32_t L = rc->c->layers;
    fm_wsrc *v = malloc((size_t)(2 * L) * sizeof *v);
    if (!v) return fm_fail(err, FM_ERR_NOMEM, "out of host memory");
    for (int32_t l = 0; l < L; l++) {
        v[l] = bench_weight_view(101 + 2 * (uint64_t)l, s->qkv_n, s->qkv_k);
        v[L + l] = bench_weight_view(102 + 2 * (uint64_t)l, s->o_n, s->o_k);
    }
    /* the pre-quantized routes: the same weights as a checkpoint's asymmetric int4 or block-FP8, quantized here */
    const int kind = routes[rc->route].prequant;
    fm_qsynth *q = NULL;
    fm_wformat fmt = rc->be->plan.w_dense;
    fm_status st = kind < 0 ? FM_OK : bench_prequantize(v, 2 * (int64_t)L, (fm_qsynth_kind)kind, &q, err);
    if (kind >= 0) fmt = kind == FM_QSYNTH_INT4_ASYM ? FM_W_INT4_ZP_TC : FM_W_E4M3_B128;
    const fm_bank_src qsrc = {.srcs = v, .n = L, .n_parts = 1, .label = "bench layers q|k|v"};
    const fm_bank_src osrc = {.srcs = v + L, .n = L, .n_parts = 1, .label = "bench layers o"};
    fm_backend *be = rc->be;
    if (!st) st = be->ops->bank_create(be, &qsrc, fmt, &rc->qkv, err);
    if (!st) st = be->ops->bank_create(be, &osrc, fmt, &rc->o, err);
    bench_prequant_free(q, 2 * (int64_t)L);
    free(v);
    return st;
}

/* Creates the GEMM-only state for this M (the activations quantized once), or does nothing for an op route. */
static fm_status prepare_rows(route_ctx *rc, fm_error *err) {
    const int kind = routes[rc->route].gemm_only;
    if (kind < 0) return FM_OK;
#ifdef FM_HAVE_CUDA
    fm_status st = fm_gemm_only_create(rc->be, (fm_gemm_only_kind)kind, rc->qkv, rc->x_qkv, rc->M, &rc->g_qkv, err);
    if (!st) st = fm_gemm_only_create(rc->be, (fm_gemm_only_kind)kind, rc->o, rc->x_o, rc->M, &rc->g_o, err);
    return st;
#else
    return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: built without CUDA", route_names[rc->route]);
#endif
}

static void release_rows(route_ctx *rc) {
#ifdef FM_HAVE_CUDA
    fm_gemm_only_free(rc->g_qkv), fm_gemm_only_free(rc->g_o);
    rc->g_qkv = rc->g_o = NULL;
#endif
    void *bufs[] = {rc->x_qkv, rc->x_o, rc->y_qkv, rc->y_o};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) rc->be->ops->free(rc->be, bufs[i]);
    rc->x_qkv = rc->x_o = rc->y_qkv = rc->y_o = NULL;
}

/* Warm-up, then the timed runs: replays of one captured graph on the GPU, plain calls on the CPU. */
static fm_status time_runs(route_ctx *rc, double *ms, fm_error *err) {
    const bench_cfg *c = rc->c;
    fm_backend *be = rc->be;
    const bool gpu = strcmp(c->b.backend, "cuda") == 0;
    const long warmup = gpu && c->b.warmup < 1 ? 1 : c->b.warmup; /* sizes the workspaces before the capture */
    fm_status st = FM_OK;
    for (long r = 0; !st && r < warmup; r++) st = run_layers(rc, err);
    if (!st) st = be->ops->sync(be, err);
    if (st) return st;
#ifdef FM_HAVE_CUDA
    fm_cuda_graph *graph = NULL;
    if (gpu && (st = fm_cuda_graph_capture(be, run_layers, rc, &graph, err))) return st;
#endif
    for (long i = 0; !st && i < c->b.repeat; i++) {
        be->ops->mark(be, (int32_t)(2 * i));
#ifdef FM_HAVE_CUDA
        if (graph) st = fm_cuda_graph_launch(graph, err);
        else st = run_layers(rc, err);
#else
        st = run_layers(rc, err);
#endif
        be->ops->mark(be, (int32_t)(2 * i + 1));
    }
    if (!st) st = be->ops->sync(be, err);
#ifdef FM_HAVE_CUDA
    fm_cuda_graph_free(graph);
#endif
    for (long i = 0; !st && i < c->b.repeat; i++)
        ms[i] = be->ops->elapsed_ms(be, (int32_t)(2 * i), (int32_t)(2 * i + 1));
    return st;
}

static void run_rows(route_ctx *rc, int mi, result *res) {
    const bench_cfg *c = rc->c;
    const gemm_shape *s = c->shape;
    fm_backend *be = rc->be;
    const int64_t M = c->rows[mi];
    const size_t act = be->ops->act_size;
    fm_error err = {{0}};
    double *ms = malloc((size_t)c->b.repeat * sizeof *ms);
    rc->M = M;
    rc->x_qkv = be->ops->alloc(be, (size_t)(M * s->qkv_k) * act);
    rc->x_o = be->ops->alloc(be, (size_t)(M * s->o_k) * act);
    rc->y_qkv = be->ops->alloc(be, (size_t)(M * s->qkv_n) * act);
    rc->y_o = be->ops->alloc(be, (size_t)(M * s->o_n) * act);
    res->t.out = malloc((size_t)(M * (s->qkv_n + s->o_n)) * sizeof(float));
    if (!ms || !rc->x_qkv || !rc->x_o || !rc->y_qkv || !rc->y_o || !res->t.out) {
        set_msg(res, BENCH_FAILED, "out of memory for the activations");
        goto done;
    }
    be->ops->upload_f32(be, c->x_qkv, M * s->qkv_k, rc->x_qkv);
    be->ops->upload_f32(be, c->x_o, M * s->o_k, rc->x_o);
    fm_status st = prepare_rows(rc, &err);
    if (!st) st = time_runs(rc, ms, &err);
    if (st) {
        set_msg(res, st == FM_ERR_UNSUPPORTED ? BENCH_UNAVAILABLE : BENCH_FAILED, err.msg);
        goto done;
    }
    bench_stats(ms, c->b.repeat, &res->t.median_ms, &res->t.min_ms, &res->t.max_ms);
    res->t.flops = 2.0 * (double)M * (double)(s->qkv_n * s->qkv_k + s->o_n * s->o_k) * c->layers;
    res->t.weight_bytes = (double)(be->ops->bank_bytes(rc->qkv) + be->ops->bank_bytes(rc->o));
    const double bw_s = res->t.weight_bytes / BENCH_BANDWIDTH_BYTES_PER_S;
    const double fl_s = res->t.flops / (is_fp8(rc->route) ? BENCH_FP8_FLOPS_PER_S : BENCH_BF16_FLOPS_PER_S);
    res->t.floor_ms = 1e3 * (bw_s > fl_s ? bw_s : fl_s);
    be->ops->download_f32(be, rc->y_qkv, M * s->qkv_n, res->t.out);
    be->ops->download_f32(be, rc->y_o, M * s->o_n, res->t.out + M * s->qkv_n);
    res->t.status = BENCH_OK;
    if (c->b.verbose)
        fprintf(stderr, "%s M=%lld: median %.3f ms\n", route_names[rc->route], (long long)M, res->t.median_ms);
done:
    if (res->t.status != BENCH_OK) free(res->t.out), res->t.out = NULL;
    release_rows(rc);
    free(ms);
}

/* One route for every M: its own backend, alive only while it runs. Returns a status only for a failure that
 * stops the benchmark (no backend at all); the route's own failures go into its rows. */
static fm_status run_route(bench_cfg *c, int route, result *res, fm_error *err) {
    route_ctx rc = {.c = c, .route = route};
    fm_plan plan;
    /* the GPU's plan on either backend: the CPU then emulates the GPU's formats exactly */
    fm_plan_for_backend(routes[route].preset, "cuda", &plan);
    fm_plan_set_dense(&plan, routes[route].dense);
    fm_error e = {{0}};
    fm_status st = FM_OK;
    if (routes[route].gemm_only >= 0 && strcmp(c->b.backend, "cuda") != 0)
        st = fm_fail(&e, FM_ERR_UNSUPPORTED, "%s (GEMM only) runs on the cuda backend only", route_names[route]);
    if (!st) st = fm_backend_create(c->b.backend, &plan, (int32_t)c->b.threads, bench_routes(&c->b), &rc.be, &e);
    if (st) {
        bench_grid_route_failed(res, sizeof *res, c->n_rows, st, e.msg);
        if (st == FM_ERR_UNSUPPORTED) return FM_OK;
        return fm_fail(err, st, "%s", e.msg); /* no backend: nothing else can run either */
    }
    if (!c->device[0]) snprintf(c->device, sizeof c->device, "%s", rc.be->ops->device_name(rc.be));
    if (c->b.verbose) fprintf(stderr, "%s: building %d layers of weights\n", route_names[route], c->layers);
    st = make_banks(&rc, &e);
    if (st) bench_grid_route_failed(res, sizeof *res, c->n_rows, st, e.msg);
    for (int i = 0; !st && i < c->n_rows; i++) run_rows(&rc, i, &res[i]);
    if (rc.qkv) rc.be->ops->bank_free(rc.be, rc.qkv);
    if (rc.o) rc.be->ops->bank_free(rc.be, rc.o);
    rc.be->ops->destroy(rc.be);
    return FM_OK;
}

/* ---- report ---- */

static const result *at(const bench_cfg *c, const result *res, int ri, int mi) { return &res[ri * c->n_rows + mi]; }

static void print_tables(const bench_cfg *c, const result *res) {
    const gemm_shape *s = c->shape;
    printf("bench gemm %s (%s attention projections: q|k|v %lld x %lld, o %lld x %lld, %d layers): backend %s (%s); "
           "%ld %s after %ld warm-up\n\n",
           s->name, s->model, (long long)s->qkv_n, (long long)s->qkv_k, (long long)s->o_n, (long long)s->o_k, c->layers,
           c->b.backend, c->device[0] ? c->device : "none", c->b.repeat,
           strcmp(c->b.backend, "cuda") ? "runs" : "graph replays", c->b.warmup);
    printf("median ms for all %d layers:\n\n| route |", c->layers);
    for (int mi = 0; mi < c->n_rows; mi++) printf(" M=%lld |", (long long)c->rows[mi]);
    printf("\n|---|");
    for (int mi = 0; mi < c->n_rows; mi++) printf("---:|");
    printf("\n");
    for (int ri = 0; ri < c->n_routes; ri++) {
        printf("| %s |", route_names[c->route[ri]]);
        for (int mi = 0; mi < c->n_rows; mi++) {
            const result *r = at(c, res, ri, mi);
            if (r->t.status == BENCH_OK) printf(" %.3f |", r->t.median_ms);
            else printf(" %s |", bench_status_name(r->t.status));
        }
        printf("\n");
    }
    /* the floor of each weight format that ran: its bytes at the copy bandwidth (FLOPs are below it up to M ~ 300) */
    const struct {
        const char *label;
        int route[3];
    } floors[] = {
        {"floor, bf16 weights", {R_BF16, -1, -1}},
        {"floor, e4m3 weights", {R_LT_TENSOR, R_W8A8, R_W8A8_GEMM}},
        {"floor, int4 weights", {R_W4A8, R_W4A8_GEMM, -1}},
    };
    for (size_t f = 0; f < sizeof floors / sizeof *floors; f++) {
        int from = -1;
        for (int ri = 0; ri < c->n_routes && from < 0; ri++)
            for (int j = 0; j < 3; j++)
                if (c->route[ri] == floors[f].route[j] && at(c, res, ri, 0)->t.status == BENCH_OK) from = ri;
        if (from < 0) continue;
        printf("| %s |", floors[f].label);
        for (int mi = 0; mi < c->n_rows; mi++) {
            const result *r = at(c, res, from, mi);
            if (r->t.status == BENCH_OK) printf(" %.3f |", r->t.floor_ms);
            else printf(" - |");
        }
        printf("\n");
    }
    printf("\nfloor = max(weight bytes / 4.25 TB/s, FLOPs / 1.3 PFLOP/s fp8 or 0.79 PFLOP/s bf16); err = ||y - "
           "bf16-cublas|| / ||bf16-cublas|| (last layer)\n\n");
    printf("| route | M | median ms | min | max | TFLOP/s | GB/s weights | floor ms | x floor | err vs bf16 |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int mi = 0; mi < c->n_rows; mi++)
        for (int ri = 0; ri < c->n_routes; ri++) {
            const result *r = at(c, res, ri, mi);
            const char *name = route_names[c->route[ri]];
            if (r->t.status != BENCH_OK) {
                printf("| %s | %lld | %s: %s |\n", name, (long long)c->rows[mi], bench_status_name(r->t.status),
                       r->t.msg);
                continue;
            }
            char e[32] = "-";
            if (!isnan(r->t.err)) snprintf(e, sizeof e, "%.2e", r->t.err);
            printf("| %s | %lld | %.3f | %.3f | %.3f | %.1f | %.0f | %.3f | %.2f | %s |\n", name,
                   (long long)c->rows[mi], r->t.median_ms, r->t.min_ms, r->t.max_ms,
                   r->t.flops / (r->t.median_ms * 1e-3) / 1e12, r->t.weight_bytes / (r->t.median_ms * 1e-3) / 1e9,
                   r->t.floor_ms, r->t.median_ms / r->t.floor_ms, e);
        }
}

static fm_status write_json(const bench_cfg *c, const result *res, fm_error *err) {
    const gemm_shape *s = c->shape;
    cJSON *root = bench_json_root("gemm", c->b.backend, c->device[0] ? c->device : "none", c->b.repeat, c->b.warmup);
    cJSON_AddStringToObject(root, "shape", s->name);
    cJSON_AddStringToObject(root, "model", s->model);
    cJSON_AddNumberToObject(root, "layers", c->layers);
    cJSON_AddNumberToObject(root, "qkv_n", (double)s->qkv_n);
    cJSON_AddNumberToObject(root, "qkv_k", (double)s->qkv_k);
    cJSON_AddNumberToObject(root, "o_n", (double)s->o_n);
    cJSON_AddNumberToObject(root, "o_k", (double)s->o_k);
    cJSON_AddBoolToObject(root, "graph_replay", strcmp(c->b.backend, "cuda") == 0);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int mi = 0; mi < c->n_rows; mi++)
        for (int ri = 0; ri < c->n_routes; ri++) {
            const result *r = at(c, res, ri, mi);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "route", route_names[c->route[ri]]);
            cJSON_AddNumberToObject(o, "rows", (double)c->rows[mi]);
            bench_row_json(&r->t, o);
            cJSON_AddItemToArray(arr, o);
        }
    return bench_json_write(root, c->b.json_path, err);
}

int cmd_bench_gemm(int argc, char **argv) {
    bench_cfg c;
    memset(&c, 0, sizeof c);
    bench_opts_init(&c.b, 50, 5);
    int rc = parse_args(argc, argv, &c);
    if (rc >= 0) return rc;

    fm_error err = {{0}};
    int64_t max_m = 0;
    for (int i = 0; i < c.n_rows; i++) max_m = c.rows[i] > max_m ? c.rows[i] : max_m;
    c.x_qkv = bench_input_with_outliers(max_m, c.shape->qkv_k);
    c.x_o = bench_input_with_outliers(max_m, c.shape->o_k);
    result *res = calloc((size_t)(c.n_routes * c.n_rows), sizeof *res);
    fm_status st = res && c.x_qkv && c.x_o ? FM_OK : fm_fail(&err, FM_ERR_NOMEM, "out of host memory");
    for (int ri = 0; !st && ri < c.n_routes; ri++) st = run_route(&c, c.route[ri], res + ri * c.n_rows, &err);
    int failed = -1; /* first failed row */
    if (!st) {
        int bf = -1;
        for (int ri = 0; ri < c.n_routes; ri++)
            if (c.route[ri] == R_BF16) bf = ri;
        int64_t n_out[MAX_ROW_COUNTS];
        for (int i = 0; i < c.n_rows; i++) n_out[i] = c.rows[i] * (c.shape->qkv_n + c.shape->o_n);
        failed = bench_grid_compare(res, sizeof *res, c.n_routes, c.n_rows, bf, n_out);
        print_tables(&c, res);
        if (c.b.json_path) st = write_json(&c, res, &err);
    }
    bench_grid_free_outs(res, sizeof *res, c.n_routes * c.n_rows);
    free(c.x_qkv), free(c.x_o);
    if (st) {
        free(res);
        return cli_fail(CMD, st, &err);
    }
    if (failed >= 0) {
        fprintf(stderr, "fp8moe %s: error: route %s at M=%lld failed: %s\n", CMD,
                route_names[c.route[failed / c.n_rows]], (long long)c.rows[failed % c.n_rows], res[failed].t.msg);
        free(res);
        return CLI_BAD_INPUT;
    }
    free(res);
    return CLI_OK;
}
