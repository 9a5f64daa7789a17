/* fp8moe bench moe: one MoE layer's expert FFN (gate|up GEMM, SwiGLU, down GEMM, weighted combine) at real shapes,
 * every route in the same run on the same inputs, beside its floor: the anchors the grouped FP8 kernel is measured
 * against (DESIGN.md "Measurement"). Each route gets its own backend, alive only while the route runs. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/w4a8_workspace.h"
#include "bench_common.h"
#include "cli/cli.h"
#include "util/status.h"
#ifdef FM_HAVE_CUDA
#include "anchors/moe_cublaslt_fp8.cuh"
#endif

#define MAX_TOKEN_COUNTS 16

static const char *CMD = "bench moe";

static const char *HELP =
    "usage: fp8moe bench moe [--shape qwen3|qwen3-next|mixtral|toy] [--tokens T1,T2,..] [--routes R1,R2,..] [options]\n"
    "\n"
    "Times ONE MoE layer's expert FFN (gate|up GEMM, SwiGLU, down GEMM, weighted combine; routing excluded) at the\n"
    "shapes of a real model, for several routes side by side in the same run, on the same inputs: x [T, H] bf16\n"
    "with outlier channels (every 97th column x8), random router logits (std ~2) routed by the backend's route op\n"
    "(seeded: every run and every route sees the same tokens and experts), synthetic expert weights generated on\n"
    "the device and converted by the normal bank path (as bench prefill does).\n"
    "\n"
    "  --shape S        qwen3: Qwen3-30B-A3B, E 128 experts, top-8, H 2048, I 768 (default)\n"
    "                   mixtral: Mixtral-8x7B, E 8, top-2, H 4096, I 14336\n"
    "                   qwen3-next: Qwen3-Next-80B-A3B's routed experts, E 512, top-10, H 2048, I 512 (its\n"
    "                   shared expert is a dense MLP, not timed here)\n"
    "                   toy: E 8, top-2, H 256, I 128 (checks of the command itself)\n"
    "  --tokens LIST    token counts T (default qwen3, qwen3-next 16,512,2048,8192; mixtral 512,4096; toy 7,300)\n"
    "  --routes LIST    default: all, in this order:\n"
    "                     int4-per-token     int4 preset: W4A16 GEMVs, one dispatch per routed pair (the baseline)\n"
    "                     bf16-cublas        ref preset: bf16 weights, grouped GEMMs (cublasGemmGroupedBatchedEx)\n"
    "                     fp8-cublaslt-loop  e4m3 weights (one scale per expert matrix) and activations (one\n"
    "                                        dynamic scale per tensor), one cublasLtMatmul per expert\n"
    "                     fp8-grouped        fp8 preset: int4 weights computed as e4m3, e4m3 1x128 activations,\n"
    "                                        one grouped GEMM (ours; 'unavailable' until the backend runs it)\n"
    "                     fp8-grouped-zp     the same kernel on a pre-quantized checkpoint's asymmetric int4\n"
    "                                        (GPTQ/AWQ-like: groups of 128, fp16 scales, zero points; made from the\n"
    "                                        same weights on the host; int4-zp-tc banks)\n"
    "                     fp8-grouped-block  the same kernel on a block-FP8 checkpoint (e4m3 weights, 128 x 128\n"
    "                                        scales, made on the host; e4m3-block banks)\n"
    "                     fp4-grouped-mx     fp8-grouped with an MXFP4 dispatch buffer (--dispatch mxfp4, the fp4\n"
    "                                        preset): E2M1 + UE8M0 per 32, expanded to e4m3 in the gate|up GEMM\n"
    "                     fp4-grouped-nv     the same with NVFP4 (--dispatch nvfp4): E2M1 + e4m3 per 16 + one fp32\n"
    "                                        tensor scale computed on the device\n"
    "                     fp8-fold           fp8-grouped's formats on int4-p2 weights (quantized at load as with\n"
    "                                        --int4-scales p2), route w4a8.kernel=fold: the group scale in the\n"
    "                                        e4m3 operand, one activation scale per token, the fold GEMM at every\n"
    "                                        T (w4a8.fold_ws=off; sm_90; the cpu backend emulates the per-token\n"
    "                                        activations)\n"
    "                     fp8-fold-ws        fp8-fold on the warp-specialised GEMMs above the decode GEMVs' pairs\n"
    "                                        (w4a8.fold_ws=on): 256-row tiles, h per token\n"
    "                     fp8-grouped-token  fp8-grouped with route moe.act_scale=token: one activation scale per\n"
    "                                        token into the gate|up GEMM, the promotion by the weight scale alone\n"
    "                                        (sm_90; the cpu backend emulates the per-token activations)\n"
    "  --repeat R       timed runs per route and T (default 20)\n"
    "  --warmup W       untimed runs first (default 3)\n"
    "  --json FILE      also write the results as JSON\n"
    "  --backend B      cuda (default) or cpu (the CPU's exact emulation of each route's formats, wall-clock time:\n"
    "                   for checking the command where there is no GPU; fp8-cublaslt-loop is cuda only)\n"
    "  --threads N      CPU threads (--backend cpu; default all)\n"
    "  --route K=V      cuda: force a kernel route of the ops (repeatable; `fp8moe inspect --routes`)\n"
    "  -v, --verbose    progress on stderr\n"
    "  -h, --help       this help\n"
    "\n"
    "Per route and T: median, min and max of the device time between two events around the moe call (GPU idle\n"
    "time inside the call, such as a host synchronisation, counts); TFLOP/s of FLOPs = 2 T k (2I H + H I);\n"
    "effective GB/s of bytes = the touched experts' weights once, in the route's own format, plus x read and out\n"
    "written; dispatch MB = the grouped routes' dispatch buffer (the routed copies of x in the dispatch format with\n"
    "their scales: what an expert-parallel all-to-all would send), written once and read once per layer; the floor "
    "max(bytes / 4.25 TB/s, FLOPs / rate), rate 1.3 PFLOP/s for the fp8 routes and 0.79\n"
    "PFLOP/s for the others; x floor = median / floor; err = ||out - out_bf16|| / ||out_bf16|| against the\n"
    "bf16-cublas output at the same T (when that route ran). A route the backend cannot run is printed as\n"
    "'unavailable: <reason>' and the others go on.\n"
    "Exit codes: 0 every route ran or was unavailable, 1 a route failed or no backend could be created, 2 usage.\n";

typedef struct moe_shape {
    const char *name, *model;
    int32_t E, k;
    int64_t H, I;
    fm_router_kind router;
    bool norm_topk;
    int64_t tokens[4];
    int n_tokens;
} moe_shape;

/* config.json values of Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1 and Qwen/Qwen3-Next-80B-A3B-Instruct (as
   src/engine/synthetic.c) */
static const moe_shape shapes[] = {
    {"qwen3", "Qwen3-30B-A3B", 128, 8, 2048, 768, FM_ROUTER_SOFTMAX_TOPK, true, {16, 512, 2048, 8192}, 4},
    {"mixtral", "Mixtral-8x7B", 8, 2, 4096, 14336, FM_ROUTER_TOPK_SOFTMAX, false, {512, 4096}, 2},
    {"qwen3-next", "Qwen3-Next-80B-A3B", 512, 10, 2048, 512, FM_ROUTER_SOFTMAX_TOPK, true, {16, 512, 2048, 8192}, 4},
    {"toy", "toy", 8, 2, 256, 128, FM_ROUTER_SOFTMAX_TOPK, true, {7, 300}, 2},
};

enum {
    ROUTE_INT4,
    ROUTE_BF16,
    ROUTE_LT,
    ROUTE_FP8,
    ROUTE_FP8_ZP,
    ROUTE_FP8_BLOCK,
    ROUTE_FP4_MX,
    ROUTE_FP4_NV,
    ROUTE_FP8_FOLD,
    ROUTE_FP8_TOKEN,
    ROUTE_FP8_FOLD_WS,
    ROUTE_COUNT
};

static const char *const route_names[ROUTE_COUNT] = {
    "int4-per-token", "bf16-cublas",    "fp8-cublaslt-loop", "fp8-grouped",       "fp8-grouped-zp", "fp8-grouped-block",
    "fp4-grouped-mx", "fp4-grouped-nv", "fp8-fold",          "fp8-grouped-token", "fp8-fold-ws"};

static const struct {
    fm_preset preset;     /* the plan its backend is created with */
    fm_dispatch dispatch; /* and its --dispatch */
    bool fp8;             /* FLOP rate of the floor */
} routes[ROUTE_COUNT] = {
    {FM_PRESET_INT4, FM_DISPATCH_PRESET, false},
    {FM_PRESET_REF, FM_DISPATCH_PRESET, false},
    {FM_PRESET_REF, FM_DISPATCH_PRESET, true}, /* fp8-cublaslt-loop: bf16 banks, quantized to e4m3 per tensor */
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true},
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true}, /* fp8-grouped-zp: a checkpoint's asymmetric int4 (int4-zp-tc) */
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true}, /* fp8-grouped-block: a block-FP8 checkpoint (e4m3-block) */
    {FM_PRESET_FP8, FM_DISPATCH_MXFP4, true},
    {FM_PRESET_FP8, FM_DISPATCH_NVFP4, true},
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true}, /* fp8-fold: int4-p2 experts on the fold GEMM (w4a8.kernel=fold) */
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true}, /* fp8-grouped-token: moe.act_scale=token */
    {FM_PRESET_FP8, FM_DISPATCH_PRESET, true}, /* fp8-fold-ws: fp8-fold on the warp-specialised GEMMs */
};

typedef struct result {
    bench_row t;
    double act_bytes;
    double dispatch_bytes; /* the grouped routes' dispatch buffer (codes + scales), else 0 */
    int32_t touched;       /* experts with at least one routed pair */
} result;

typedef struct bench_cfg {
    const moe_shape *shape;
    int64_t tokens[MAX_TOKEN_COUNTS];
    int n_tokens;
    int route[ROUTE_COUNT], n_routes;
    bench_opts b;
    float **x, **logits; /* host inputs per token count */
    char device[256];
} bench_cfg;

/* ---- arguments ---- */

enum { OPT_SHAPE = 2000, OPT_TOKENS, OPT_ROUTES };

/* Returns -1 when the benchmark should run, else the exit code (0 after --help, 2 on a usage error). */
static int parse_args(int argc, char **argv, bench_cfg *c) {
    static const struct option opts[] = {{"shape", required_argument, 0, OPT_SHAPE},
                                         {"tokens", required_argument, 0, OPT_TOKENS},
                                         {"routes", required_argument, 0, OPT_ROUTES},
                                         {"help", no_argument, 0, 'h'},
                                         BENCH_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    const char *shape = "qwen3", *tokens = NULL, *route_list = NULL;
    optind = 1;
    opterr = 0; /* our own message for unknown options */
    int o;
    while ((o = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
        switch (o) {
        case 'h': return fputs(HELP, stdout), CLI_OK;
        case OPT_SHAPE: shape = optarg; break;
        case OPT_TOKENS: tokens = optarg; break;
        case OPT_ROUTES: route_list = optarg; break;
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
    if (!c->shape) return cli_usage(CMD, "unknown shape '%s' (choose qwen3, qwen3-next, mixtral or toy)", shape);
    if (tokens && !bench_parse_counts(CMD, "--tokens", tokens, 1, 1 << 20, c->tokens, MAX_TOKEN_COUNTS, &c->n_tokens))
        return CLI_USAGE;
    if (!tokens) {
        c->n_tokens = c->shape->n_tokens;
        memcpy(c->tokens, c->shape->tokens, (size_t)c->n_tokens * sizeof *c->tokens);
    }
    if (route_list && !bench_parse_names(CMD, "--routes", route_list, route_names, ROUTE_COUNT, c->route, &c->n_routes))
        return CLI_USAGE;
    if (!route_list)
        for (int r = 0; r < ROUTE_COUNT; r++) c->route[c->n_routes++] = r;
    return -1;
}

/* ---- inputs ---- */

/* x: uniform [-1, 1) with outlier channels x8 (as the synthetic embeddings); logits: uniform with std 2 */
static fm_status make_inputs(bench_cfg *c, fm_error *err) {
    const moe_shape *s = c->shape;
    c->x = calloc((size_t)c->n_tokens, sizeof *c->x);
    c->logits = calloc((size_t)c->n_tokens, sizeof *c->logits);
    if (!c->x || !c->logits) return fm_fail(err, FM_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < c->n_tokens; i++) {
        c->x[i] = bench_input_with_outliers(c->tokens[i], s->H);
        c->logits[i] =
            bench_synth_host((fm_synth){0xD1B54A32D192ED03ull, 2.0f * sqrtf(3.0f), 0.0f, 0}, c->tokens[i], s->E);
        if (!c->x[i] || !c->logits[i])
            return fm_fail(err, FM_ERR_NOMEM, "out of host memory for %lld tokens", (long long)c->tokens[i]);
    }
    return FM_OK;
}

/* gate_up [E][2I, H] (gate rows, then up rows) and down [E][H, I] banks in format fmt; the pre-quantized routes
   quantize the same synthetic weights on the host first, into a checkpoint's format (qsynth.h) */
static fm_status make_banks(fm_backend *be, const moe_shape *s, int route, fm_wformat fmt, fm_bank **gu, fm_bank **dn,
                            fm_error *err) {
    const bool prequant = route == ROUTE_FP8_ZP || route == ROUTE_FP8_BLOCK;
    fm_wsrc *v = malloc((size_t)(3 * s->E) * sizeof *v);
    fm_qsynth *q = NULL;
    if (!v) return fm_fail(err, FM_ERR_NOMEM, "out of host memory");
    for (int32_t e = 0; e < s->E; e++) {
        v[2 * e] = bench_weight_view(1 + 3 * (uint64_t)e, s->I, s->H);
        v[2 * e + 1] = bench_weight_view(2 + 3 * (uint64_t)e, s->I, s->H);
        v[2 * s->E + e] = bench_weight_view(3 + 3 * (uint64_t)e, s->H, s->I);
    }
    fm_status st = FM_OK;
    if (prequant) {
        fmt = route == ROUTE_FP8_ZP ? FM_W_INT4_ZP_TC : FM_W_E4M3_B128;
        const fm_qsynth_kind kind = route == ROUTE_FP8_ZP ? FM_QSYNTH_INT4_ASYM : FM_QSYNTH_FP8_BLOCK;
        st = bench_prequantize(v, 3 * (int64_t)s->E, kind, &q, err);
    }
    if (st) {
        free(v);
        return st;
    }
    /* gate_up: the backend may interleave the gate and up rows for a fused SwiGLU (the fp8 grouped kernel needs it) */
    const fm_bank_src gsrc = {
        .srcs = v, .n = s->E, .n_parts = 2, .label = "bench experts gate_up", .gate_up = true, .experts = true};
    const fm_bank_src dsrc = {
        .srcs = v + 2 * s->E, .n = s->E, .n_parts = 1, .label = "bench experts down", .experts = true};
    st = be->ops->bank_create(be, &gsrc, fmt, gu, err);
    if (!st) st = be->ops->bank_create(be, &dsrc, fmt, dn, err);
    if (st && *gu) be->ops->bank_free(be, *gu), *gu = NULL;
    bench_prequant_free(q, 3 * (int64_t)s->E);
    free(v);
    return st;
}

/* ---- timing ---- */

static void set_msg(result *r, bench_status st, const char *msg) { bench_row_set(&r->t, st, msg); }
/* The state one route's runs share. */
typedef struct route_ctx {
    fm_backend *be;
    int route;
    fm_bank *gu, *dn;
    void *lt; /* fm_lt_moe for fp8-cublaslt-loop */
    double weight_bytes;
} route_ctx;

static fm_status call_route(route_ctx *rc, const bench_cfg *c, const void *x, int64_t T, const void *ids, const void *w,
                            void *out, fm_error *err) {
#ifdef FM_HAVE_CUDA
    if (rc->route == ROUTE_LT) return fm_lt_moe_run(rc->lt, x, T, ids, w, c->shape->k, out, err);
#else
    (void)err;
#endif
    fm_backend *be = rc->be;
    be->ops->moe(be, rc->gu, rc->dn, x, T, ids, w, c->shape->k, be->plan.a_dispatch, be->plan.a_expert, out);
    return FM_OK;
}

/* One token count: inputs, routing, warm-up, timed runs, the output kept for the comparison. */
static void run_tokens(route_ctx *rc, const bench_cfg *c, int ti, result *res) {
    const moe_shape *s = c->shape;
    fm_backend *be = rc->be;
    const int64_t T = c->tokens[ti], P = T * s->k;
    const size_t act = be->ops->act_size;
    fm_error err = {{0}};
    void *x = be->ops->alloc(be, (size_t)(T * s->H) * act), *lg = be->ops->alloc(be, (size_t)(T * s->E) * act);
    void *ids = be->ops->alloc(be, (size_t)P * sizeof(int32_t)), *w = be->ops->alloc(be, (size_t)P * act);
    void *out = be->ops->alloc(be, (size_t)(T * s->H) * act);
    int32_t *ids_h = malloc((size_t)P * sizeof *ids_h);
    double *ms = malloc((size_t)c->b.repeat * sizeof *ms);
    res->t.out = malloc((size_t)(T * s->H) * sizeof(float)); /* the output [T, H] */
    if (!x || !lg || !ids || !w || !out || !ids_h || !ms || !res->t.out) {
        set_msg(res, BENCH_FAILED, "out of memory for the activations");
        goto done;
    }
    be->ops->upload_f32(be, c->x[ti], T * s->H, x);
    be->ops->upload_f32(be, c->logits[ti], T * s->E, lg);
    be->ops->route(be, lg, T, s->E, s->k, s->router, s->norm_topk, ids, w);
    be->ops->download_raw(be, ids, (size_t)P * sizeof(int32_t), ids_h);
    bool *hit = calloc((size_t)s->E, sizeof *hit);
    res->touched = 0;
    for (int64_t p = 0; hit && p < P; p++)
        if (ids_h[p] >= 0 && ids_h[p] < s->E && !hit[ids_h[p]]) hit[ids_h[p]] = true, res->touched++;
    free(hit);
    fm_status st = FM_OK;
    for (long r = 0; !st && r < c->b.warmup + c->b.repeat; r++) {
        const long i = r - c->b.warmup;
        if (i >= 0) be->ops->mark(be, (int32_t)(2 * i));
        st = call_route(rc, c, x, T, ids, w, out, &err);
        if (i >= 0) be->ops->mark(be, (int32_t)(2 * i + 1));
    }
    if (!st) st = be->ops->sync(be, &err);
    if (st) {
        set_msg(res, BENCH_FAILED, err.msg);
        goto done;
    }
    for (long i = 0; i < c->b.repeat; i++) ms[i] = be->ops->elapsed_ms(be, (int32_t)(2 * i), (int32_t)(2 * i + 1));
    bench_stats(ms, c->b.repeat, &res->t.median_ms, &res->t.min_ms, &res->t.max_ms);
    res->t.flops = 2.0 * (double)P * (double)(2 * s->I * s->H + s->H * s->I);
    res->t.weight_bytes = rc->weight_bytes * res->touched / s->E;
    res->act_bytes = 2.0 * (double)(T * s->H) * (double)act;
    if (be->plan.w_expert == FM_W_INT4_G128_TC) { /* the W4A8 grouped routes: x and xs of their workspace */
        const fm_w4a8_moe_ws L =
            fm_w4a8_moe_layout((uint64_t)T, (uint64_t)s->k, (uint64_t)s->E, (uint64_t)s->H, (uint64_t)s->I, 64,
                               fm_w4a8_dispatch_of(be->plan.a_dispatch), false);
        res->dispatch_bytes = (double)(L.xsum - L.x); /* codes and scales, each 256-byte aligned */
    }
    const double bw_s = (res->t.weight_bytes + res->act_bytes) / BENCH_BANDWIDTH_BYTES_PER_S;
    const double fl_s = res->t.flops / (routes[rc->route].fp8 ? BENCH_FP8_FLOPS_PER_S : BENCH_BF16_FLOPS_PER_S);
    res->t.floor_ms = 1e3 * (bw_s > fl_s ? bw_s : fl_s);
    be->ops->download_f32(be, out, T * s->H, res->t.out);
    res->t.status = BENCH_OK;
    if (c->b.verbose)
        fprintf(stderr, "%s T=%lld: median %.3f ms\n", route_names[rc->route], (long long)T, res->t.median_ms);
done:
    if (res->t.status != BENCH_OK) free(res->t.out), res->t.out = NULL;
    void *bufs[] = {x, lg, ids, w, out};
    for (int i = 0; i < 5; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    free(ids_h), free(ms);
}

/* One route for every token count: its own backend, alive only while it runs. Returns a status only for a
 * failure that stops the benchmark (no backend at all); the route's own failures go into its rows. */
static fm_status run_route(bench_cfg *c, int route, result *res, fm_error *err) {
    const moe_shape *s = c->shape;
    route_ctx rc = {.route = route};
    fm_plan plan;
    /* the GPU's plan on either backend: the CPU then emulates the GPU's formats exactly */
    fm_plan_for_backend(routes[route].preset, "cuda", &plan);
    fm_error e = {{0}};
    fm_status st = fm_plan_set_dispatch(&plan, routes[route].dispatch, &e);
    /* fp8-fold: the synthetic weights quantized at load with int4-p2 scales (on the device on cuda: seconds, where the
       host's quantizer took tens of them at Qwen3's shape) */
    if (!st && (route == ROUTE_FP8_FOLD || route == ROUTE_FP8_FOLD_WS))
        st = fm_plan_set_int4_scales(&plan, FM_INT4_SCALES_P2, &e);
    if (route == ROUTE_LT && strcmp(c->b.backend, "cuda") != 0)
        st = fm_fail(&e, FM_ERR_UNSUPPORTED, "fp8-cublaslt-loop runs on the cuda backend only");
    char fold_routes[sizeof c->b.routes + 48];
    const char *route_spec = bench_routes(&c->b);
    /* after the user's: fp8-fold is the fold GEMM, fp8-fold-ws the warp-specialised one (above the decode GEMVs'
       pairs, both), fp8-grouped-token the per-token activation scales */
    const char *own = route == ROUTE_FP8_FOLD      ? "w4a8.kernel=fold,w4a8.fold_ws=off"
                      : route == ROUTE_FP8_FOLD_WS ? "w4a8.kernel=fold,w4a8.fold_ws=on"
                      : route == ROUTE_FP8_TOKEN   ? "moe.act_scale=token"
                                                   : NULL;
    if (own) {
        snprintf(fold_routes, sizeof fold_routes, "%s%s%s", route_spec ? route_spec : "", route_spec ? "," : "", own);
        route_spec = fold_routes;
    }
#ifndef FM_HAVE_CUDA
    if (route == ROUTE_LT && !st) st = fm_fail(&e, FM_ERR_UNSUPPORTED, "fp8-cublaslt-loop: built without CUDA");
#endif
    if (!st) st = fm_backend_create(c->b.backend, &plan, (int32_t)c->b.threads, route_spec, &rc.be, &e);
    if (st) {
        bench_grid_route_failed(res, sizeof *res, c->n_tokens, st, e.msg);
        if (st == FM_ERR_UNSUPPORTED) return FM_OK;
        return fm_fail(err, st, "%s", e.msg); /* no backend: nothing else can run either */
    }
    if (!c->device[0]) snprintf(c->device, sizeof c->device, "%s", rc.be->ops->device_name(rc.be));
    if (c->b.verbose) fprintf(stderr, "%s: building banks\n", route_names[route]);
    st = make_banks(rc.be, s, route, plan.w_expert, &rc.gu, &rc.dn, &e);
    if (!st) rc.weight_bytes = (double)(rc.be->ops->bank_bytes(rc.gu) + rc.be->ops->bank_bytes(rc.dn));
#ifdef FM_HAVE_CUDA
    if (!st && route == ROUTE_LT) {
        st = fm_lt_moe_create(rc.be, rc.gu, rc.dn, (fm_lt_moe **)&rc.lt, &e);
        if (!st) rc.weight_bytes = (double)fm_lt_moe_weight_bytes(rc.lt);
        rc.be->ops->bank_free(rc.be, rc.gu), rc.be->ops->bank_free(rc.be, rc.dn); /* the route keeps its e4m3 copy */
        rc.gu = rc.dn = NULL;
    }
#endif
    if (st) bench_grid_route_failed(res, sizeof *res, c->n_tokens, st, e.msg);
    for (int i = 0; !st && i < c->n_tokens; i++) run_tokens(&rc, c, i, &res[i]);
#ifdef FM_HAVE_CUDA
    if (rc.lt) fm_lt_moe_free(rc.lt);
#endif
    if (rc.gu) rc.be->ops->bank_free(rc.be, rc.gu);
    if (rc.dn) rc.be->ops->bank_free(rc.be, rc.dn);
    rc.be->ops->destroy(rc.be);
    return FM_OK;
}

/* ---- report ---- */

static double gbps(const result *r) { return (r->t.weight_bytes + r->act_bytes) / (r->t.median_ms * 1e-3) / 1e9; }
static double tflops(const result *r) { return r->t.flops / (r->t.median_ms * 1e-3) / 1e12; }

static void print_table(const bench_cfg *c, result *res) {
    const moe_shape *s = c->shape;
    printf("bench moe %s (%s: E %d, top-%d, H %lld, I %lld): backend %s (%s); %ld runs after %ld warm-up\n", s->name,
           s->model, s->E, s->k, (long long)s->H, (long long)s->I, c->b.backend, c->device[0] ? c->device : "none",
           c->b.repeat, c->b.warmup);
    printf("floor = max(bytes / 4.25 TB/s, FLOPs / 1.3 PFLOP/s fp8 or 0.79 PFLOP/s otherwise); bytes = touched "
           "experts' weights once + x + out; err = ||out - bf16-cublas|| / ||bf16-cublas||\n\n");
    printf("| route | T | median ms | min | max | TFLOP/s | GB/s | floor ms | x floor | experts | dispatch MB | err vs "
           "bf16 |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int ti = 0; ti < c->n_tokens; ti++)
        for (int ri = 0; ri < c->n_routes; ri++) {
            const result *r = &res[ri * c->n_tokens + ti];
            const char *name = route_names[c->route[ri]];
            if (r->t.status != BENCH_OK) {
                printf("| %s | %lld | %s: %s |\n", name, (long long)c->tokens[ti], bench_status_name(r->t.status),
                       r->t.msg);
                continue;
            }
            char e[32] = "-", d[32] = "-";
            if (!isnan(r->t.err)) snprintf(e, sizeof e, "%.2e", r->t.err);
            if (r->dispatch_bytes > 0) snprintf(d, sizeof d, "%.1f", r->dispatch_bytes / 1e6);
            printf("| %s | %lld | %.3f | %.3f | %.3f | %.1f | %.0f | %.3f | %.2f | %d | %s | %s |\n", name,
                   (long long)c->tokens[ti], r->t.median_ms, r->t.min_ms, r->t.max_ms, tflops(r), gbps(r),
                   r->t.floor_ms, r->t.median_ms / r->t.floor_ms, r->touched, d, e);
        }
}

static fm_status write_json(const bench_cfg *c, const result *res, fm_error *err) {
    const moe_shape *s = c->shape;
    cJSON *root = bench_json_root("moe", c->b.backend, c->device[0] ? c->device : "none", c->b.repeat, c->b.warmup);
    cJSON_AddStringToObject(root, "shape", s->name);
    cJSON_AddStringToObject(root, "model", s->model);
    cJSON_AddNumberToObject(root, "experts", s->E);
    cJSON_AddNumberToObject(root, "top_k", s->k);
    cJSON_AddNumberToObject(root, "hidden", (double)s->H);
    cJSON_AddNumberToObject(root, "intermediate", (double)s->I);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int ti = 0; ti < c->n_tokens; ti++)
        for (int ri = 0; ri < c->n_routes; ri++) {
            const result *r = &res[ri * c->n_tokens + ti];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "route", route_names[c->route[ri]]);
            cJSON_AddNumberToObject(o, "tokens", (double)c->tokens[ti]);
            bench_row_json(&r->t, o);
            if (r->t.status == BENCH_OK) {
                cJSON_AddNumberToObject(o, "activation_bytes", r->act_bytes);
                if (r->dispatch_bytes > 0) cJSON_AddNumberToObject(o, "dispatch_bytes", r->dispatch_bytes);
                cJSON_AddNumberToObject(o, "touched_experts", r->touched);
                cJSON_AddNumberToObject(o, "tflops", tflops(r));
                cJSON_AddNumberToObject(o, "gbps", gbps(r));
            }
            cJSON_AddItemToArray(arr, o);
        }
    return bench_json_write(root, c->b.json_path, err);
}

int cmd_bench_moe(int argc, char **argv) {
    bench_cfg c;
    memset(&c, 0, sizeof c);
    bench_opts_init(&c.b, 20, 3);
    int rc = parse_args(argc, argv, &c);
    if (rc >= 0) return rc;

    fm_error err = {{0}};
    result *res = calloc((size_t)(c.n_routes * c.n_tokens), sizeof *res);
    fm_status st = res ? make_inputs(&c, &err) : fm_fail(&err, FM_ERR_NOMEM, "out of host memory");
    for (int ri = 0; !st && ri < c.n_routes; ri++) st = run_route(&c, c.route[ri], res + ri * c.n_tokens, &err);
    int failed = -1; /* first failed row */
    if (!st) {
        int bf = -1;
        int64_t n_out[MAX_TOKEN_COUNTS];
        for (int ri = 0; ri < c.n_routes; ri++)
            if (c.route[ri] == ROUTE_BF16) bf = ri;
        for (int i = 0; i < c.n_tokens; i++) n_out[i] = c.tokens[i] * c.shape->H;
        failed = bench_grid_compare(res, sizeof *res, c.n_routes, c.n_tokens, bf, n_out);
        print_table(&c, res);
        if (c.b.json_path) st = write_json(&c, res, &err);
    }
    bench_grid_free_outs(res, sizeof *res, c.n_routes * c.n_tokens);
    for (int i = 0; i < c.n_tokens; i++) free(c.x ? c.x[i] : NULL), free(c.logits ? c.logits[i] : NULL);
    free(c.x), free(c.logits);
    if (st) {
        free(res);
        return cli_fail(CMD, st, &err);
    }
    if (failed >= 0) {
        fprintf(stderr, "fp8moe %s: error: route %s at T=%lld failed: %s\n", CMD,
                route_names[c.route[failed / c.n_tokens]], (long long)c.tokens[failed % c.n_tokens], res[failed].t.msg);
        free(res);
        return CLI_BAD_INPUT;
    }
    free(res);
    return CLI_OK;
}
