#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/file.h"
#include "util/progress.h"
#include "util/status.h"

int cli_fail(const char *cmd, fm_status st, const fm_error *err) {
    fm_progress_end(); /* never glued to a progress line */
    fprintf(stderr, "fp8moe %s: error: %s\n", cmd, err->msg[0] ? err->msg : fm_status_name(st));
    return st == FM_ERR_USAGE ? CLI_USAGE : CLI_BAD_INPUT;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fm_progress_end();
    fprintf(stderr, "fp8moe %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'fp8moe %s --help')\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

bool cli_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || !end || *end || end == text || v < lo || v > hi) {
        cli_usage(cmd, "%s expects an integer in [%ld, %ld], got '%s'", opt, lo, hi, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_step_tokens(const char *cmd, const char *text, int64_t *out) {
    if (!strcmp(text, "off")) {
        *out = -1;
        return true;
    }
    long v;
    if (!cli_parse_int(cmd, "--max-step-tokens", text, 1, 1L << 30, &v)) return false;
    *out = v;
    return true;
}

bool cli_parse_kv_cache(const char *cmd, const char *text, fm_kv_dtype *out) {
    if (!fm_kv_dtype_parse(text, out)) return cli_usage(cmd, "--kv-cache expects auto or e4m3, got '%s'", text), false;
    return true;
}

bool cli_parse_step_budget(const char *cmd, const char *text, fm_step_budget_mode *out) {
    if (!strcmp(text, "fixed")) *out = FM_STEP_BUDGET_FIXED;
    else if (!strcmp(text, "latency")) *out = FM_STEP_BUDGET_LATENCY;
    else return cli_usage(cmd, "--step-budget expects fixed or latency, got '%s'", text), false;
    return true;
}

bool cli_parse_step_ratio(const char *cmd, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    const double v = strtod(text, &end);
    if (errno || !end || *end || end == text || !(v >= 1.0 && v <= 1000.0))
        return cli_usage(cmd, "--max-step-latency-ratio expects a number in [1, 1000], got '%s'", text), false;
    *out = v;
    return true;
}

bool cli_parse_prompt_wait(const char *cmd, const char *text, int32_t *out) {
    if (!strcmp(text, "off")) {
        *out = -1;
        return true;
    }
    char *end = NULL;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (errno || !end || *end || end == text || v < 1 || v > FM_PROMPT_WAIT_STEPS_MAX)
        return cli_usage(cmd, "--max-prompt-wait-steps expects an integer in [1, %d] or off, got '%s'",
                         FM_PROMPT_WAIT_STEPS_MAX, text),
               false;
    *out = (int32_t)v;
    return true;
}

void cli_print_step_tokens(const char *cmd, const fm_context *ctx) {
    const int64_t n = fm_context_max_step_tokens(ctx);
    double ratio = 0.0;
    const bool latency = fm_context_step_budget(ctx, &ratio) == FM_STEP_BUDGET_LATENCY;
    const int32_t wait = fm_context_prompt_wait_steps(ctx);
    char waits[96] = "";
    if (wait > 0)
        snprintf(waits, sizeof waits,
                 ", and enough to finish waiting prompts within %d steps (--max-prompt-wait-steps)", (int)wait);
    if (n > 0 && latency)
        fprintf(stderr,
                "fp8moe %s: mixed steps of up to %lld tokens (--max-step-tokens), the prompt share sized to keep a "
                "step within %g x a decode-only step (--step-budget latency)%s\n",
                cmd, (long long)n, ratio, waits);
    else if (n > 0)
        fprintf(stderr, "fp8moe %s: mixed steps of up to %lld tokens (--max-step-tokens, --step-budget fixed)\n", cmd,
                (long long)n);
    else fprintf(stderr, "fp8moe %s: mixed steps off: prompt chunks and decode steps alternate\n", cmd);
}

bool cli_parse_bytes(const char *cmd, const char *opt, const char *text, int64_t *out) {
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"K", 1000},
                 {"M", 1000000},
                 {"G", 1000000000},
                 {"T", 1000000000000},
                 {"Ki", 1ull << 10},
                 {"Mi", 1ull << 20},
                 {"Gi", 1ull << 30},
                 {"Ti", 1ull << 40}};
    const char *p = text;
    uint64_t whole = 0;
    bool ok = *p >= '0' && *p <= '9';
    for (; ok && *p >= '0' && *p <= '9'; p++)
        ok = whole <= (UINT64_MAX - 9) / 10, whole = whole * 10 + (uint64_t)(*p - '0');
    double frac = 0, place = 0.1;
    const bool has_frac = *p == '.';
    if (has_frac) {
        ok &= p[1] >= '0' && p[1] <= '9';
        for (p++; *p >= '0' && *p <= '9'; p++, place /= 10) frac += place * (*p - '0');
    }
    size_t u = 0;
    while (u < sizeof units / sizeof *units && strcmp(p, units[u].suffix) != 0) u++;
    ok &= u < sizeof units / sizeof *units && !(has_frac && u == 0); /* fractions of a byte make no sense */
    uint64_t v = 0;
    if (ok) {
        const uint64_t m = u < sizeof units / sizeof *units ? units[u].mult : 1;
        ok = whole <= (uint64_t)INT64_MAX / m;
        v = whole * m + (uint64_t)(frac * (double)m + 0.5);
        ok &= v >= 1 && v <= (uint64_t)INT64_MAX;
    }
    if (!ok) {
        cli_usage(cmd,
                  "%s expects a byte count >= 1 such as 8Gi, 7.5G or 8000000000 (suffixes K M G T, Ki Mi Gi Ti), "
                  "got '%s'",
                  opt, text);
        return false;
    }
    *out = (int64_t)v;
    return true;
}

fm_status cli_write_file(const char *path, const void *data, size_t n, fm_error *err) {
    fm_status cst = fm_check_output_path(path, err); /* the rename below would replace a device or FIFO */
    if (cst) return cst;
    fm_path_buf pb;
    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    if (!tmp) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    fm_status st = FM_OK;
    if (!f) st = fm_fail(err, FM_ERR_IO, "%s: cannot create output file: %s", fm_path_show(&pb, path), strerror(errno));
    else {
        bool ok = fwrite(data, 1, n, f) == n;
        ok &= fclose(f) == 0;
        if (!ok || rename(tmp, path) != 0) {
            st = fm_fail(err, FM_ERR_IO, "%s: cannot write output file: %s", fm_path_show(&pb, path), strerror(errno));
            unlink(tmp);
        }
    }
    free(tmp);
    return st;
}

bool cli_expert_stats_since(const fm_context *ctx, const fm_expert_stats *since, fm_expert_stats *out) {
    if (!fm_context_expert_stats(ctx, out)) return false;
    if (since) {
        out->fetches -= since->fetches, out->hits -= since->hits, out->misses -= since->misses;
        out->bytes_copied -= since->bytes_copied;
        out->prefetches -= since->prefetches, out->prefetch_copies -= since->prefetch_copies;
        out->bytes_prefetched -= since->bytes_prefetched;
    }
    return true;
}

void cli_print_expert_stats(const fm_context *ctx, const fm_expert_stats *since) {
    fm_expert_stats s;
    if (!cli_expert_stats_since(ctx, since, &s)) return;
    const int64_t reads = s.hits + s.misses;
    printf("expert cache%s: %d slots of %d experts (%.1f KiB each), %lld layer passes, %lld expert reads, hit rate "
           "%.2f%%, %lld misses, %.1f MiB copied from host memory\n",
           since ? " (the timed runs)" : "", s.slots, s.experts, (double)s.slot_bytes / 1024, (long long)s.fetches,
           (long long)reads, reads ? 100.0 * (double)s.hits / (double)reads : 0.0, (long long)s.misses,
           (double)s.bytes_copied / (1 << 20));
    if (s.prefetches)
        printf("expert prefetch: %lld layer passes, %lld experts copied ahead, %.1f MiB\n", (long long)s.prefetches,
               (long long)s.prefetch_copies, (double)s.bytes_prefetched / (1 << 20));
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_model_opts_init(cli_model_opts *o) {
    o->model_dir = NULL;
    o->routes[0] = '\0';
    o->preset_given = o->dense_given = false;
    fm_options_init(&o->opt);
    o->opt.verbose = isatty(STDERR_FILENO); /* loading progress when a person is watching */
}

bool cli_route_add(const char *cmd, const char *arg, char *routes, size_t cap) {
    fm_error err = {{0}};
    if (fm_routes_check(arg, &err)) {
        cli_usage(cmd, "--route: %s", err.msg);
        return false;
    }
    const size_t used = strlen(routes);
    if (used + strlen(arg) + 2 > cap) {
        cli_usage(cmd, "--route: too many routes (%zu bytes at most)", cap - 1);
        return false;
    }
    snprintf(routes + used, cap - used, "%s%s", used ? "," : "", arg);
    return true;
}

enum {
    OPT_MODEL = 1000,
    OPT_BACKEND,
    OPT_PRESET,
    OPT_LAYERS,
    OPT_THREADS,
    OPT_VRAM_LIMIT,
    OPT_DENSE,
    OPT_DISPATCH,
    OPT_INT4_SCALES,
    OPT_LM_HEAD,
    OPT_ROUTE,
    OPT_CTX,
    OPT_EXPERTS_IN,
    OPT_EXPERT_SLOTS,
    OPT_EXPERT_POLICY
};

static const struct option model_options[] = {
    {"model", required_argument, 0, OPT_MODEL},
    {"backend", required_argument, 0, OPT_BACKEND},
    {"preset", required_argument, 0, OPT_PRESET},
    {"layers", required_argument, 0, OPT_LAYERS},
    {"threads", required_argument, 0, OPT_THREADS},
    {"vram-limit", required_argument, 0, OPT_VRAM_LIMIT},
    {"dense", required_argument, 0, OPT_DENSE},
    {"dispatch", required_argument, 0, OPT_DISPATCH},
    {"int4-scales", required_argument, 0, OPT_INT4_SCALES},
    {"lm-head", required_argument, 0, OPT_LM_HEAD},
    {"ctx", required_argument, 0, OPT_CTX},
    {"route", required_argument, 0, OPT_ROUTE},
    {"experts-in", required_argument, 0, OPT_EXPERTS_IN},
    {"expert-slots", required_argument, 0, OPT_EXPERT_SLOTS},
    {"expert-policy", required_argument, 0, OPT_EXPERT_POLICY},
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
};

/* One of the shared options: true when handled (*bad set on a bad value, message printed). */
static bool model_option(const char *cmd, int c, const char *arg, cli_model_opts *o, bool *bad) {
    long v = 0;
    switch (c) {
    case OPT_MODEL:
        if (!*arg) *bad = true, cli_usage(cmd, "--model needs a checkpoint directory, got ''");
        o->model_dir = arg;
        return true;
    case OPT_BACKEND:
        if (!fm_backend_lookup(arg)) *bad = true, cli_usage(cmd, "--backend must be cpu or cuda, got '%s'", arg);
        o->opt.backend = arg;
        return true;
    case OPT_PRESET:
        o->preset_given = true;
        if (!fm_preset_parse(arg, &o->opt.preset))
            *bad = true, cli_usage(cmd, "--preset must be one of ref, ref32, int4, fp8, fp4, got '%s'", arg);
        return true;
    case OPT_DENSE:
        o->dense_given = true;
        if (!fm_dense_parse(arg, &o->opt.dense))
            *bad = true, cli_usage(cmd, "--dense must be w8a8 or preset, got '%s'", arg);
        return true;
    case OPT_LM_HEAD:
        if (!fm_lm_head_parse(arg, &o->opt.lm_head))
            *bad = true, cli_usage(cmd, "--lm-head must be float or dense, got '%s'", arg);
        return true;
    case OPT_DISPATCH:
        if (!fm_dispatch_parse(arg, &o->opt.dispatch))
            *bad = true, cli_usage(cmd, "--dispatch must be one of bf16, fp8, mxfp4, nvfp4, preset, got '%s'", arg);
        return true;
    case OPT_INT4_SCALES:
        if (!fm_int4_scales_parse(arg, &o->opt.int4_scales))
            *bad = true, cli_usage(cmd, "--int4-scales must be g128 or p2, got '%s'", arg);
        return true;
    case OPT_LAYERS:
        *bad = !cli_parse_int(cmd, "--layers", arg, 1, 100000, &v);
        o->opt.n_layers = (int32_t)v;
        return true;
    case OPT_THREADS:
        *bad = !cli_parse_int(cmd, "--threads", arg, 1, 4096, &v);
        o->opt.n_threads = (int32_t)v;
        return true;
    case OPT_CTX:
        *bad = !cli_parse_int(cmd, "--ctx", arg, 1, 1L << 40, &v);
        o->opt.ctx = v;
        return true;
    case OPT_EXPERTS_IN:
        if (!fm_experts_in_parse(arg, &o->opt.experts_in))
            *bad = true, cli_usage(cmd, "--experts-in must be host, device or auto, got '%s'", arg);
        return true;
    case OPT_EXPERT_SLOTS:
        *bad = !cli_parse_int(cmd, "--expert-slots", arg, 1, 1L << 30, &v);
        o->opt.expert_slots = (int32_t)v;
        return true;
    case OPT_EXPERT_POLICY:
        if (!fm_expert_policy_parse(arg, &o->opt.expert_policy))
            *bad = true, cli_usage(cmd, "--expert-policy must be lru or lfu, got '%s'", arg);
        return true;
    case OPT_VRAM_LIMIT: *bad = !cli_parse_bytes(cmd, "--vram-limit", arg, &o->opt.vram_limit); return true;
    case OPT_ROUTE:
        *bad = !cli_route_add(cmd, arg, o->routes, sizeof o->routes);
        o->opt.routes = o->routes;
        return true;
    case 'v': o->opt.verbose = true; return true;
    }
    return false;
}

int cli_parse(const char *cmd, int argc, char **argv, const struct option *own, const char *help, cli_model_opts *mo,
              cli_option_fn handle, void *ctx) {
    enum { MAX_OPTIONS = 64 };
    struct option all[MAX_OPTIONS];
    size_t n = 0, n_own = 0;
    while (own[n_own].name) n_own++;
    if (n_own + sizeof model_options / sizeof *model_options >= MAX_OPTIONS) { /* a programming error, caught at once */
        fprintf(stderr, "fp8moe %s: %zu options are more than the parser's %d; raise MAX_OPTIONS\n", cmd, n_own,
                MAX_OPTIONS);
        abort();
    }
    for (size_t i = 0; i < sizeof model_options / sizeof *model_options; i++) {
        bool mine = false; /* a command may give a shared option its own meaning (parity: --layers 1,2,4) */
        for (size_t j = 0; own[j].name; j++) mine |= strcmp(own[j].name, model_options[i].name) == 0;
        if (!mine) all[n++] = model_options[i];
    }
    for (size_t i = 0; i < n_own; i++) all[n++] = own[i];
    memset(&all[n], 0, sizeof all[n]);
    int c;
    optind = 1;
    opterr = 0; /* our own message for unknown options */
    while ((c = getopt_long(argc, argv, "vh", all, NULL)) != -1) {
        bool bad = false;
        if (c == 'h') return fputs(help, stdout), CLI_OK;
        if (c == '?' || c == ':') return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
        if (!model_option(cmd, c, optarg, mo, &bad) && !handle(cmd, c, optarg, ctx)) return CLI_USAGE;
        if (bad) return CLI_USAGE;
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    return -1;
}
