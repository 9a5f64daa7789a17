/* fp8moe perplexity: the protocol of models/README.md. The ids are cut into consecutive windows of W
 * tokens, each an independent sequence at positions 0..W-1; the loss is the mean next-token cross-entropy
 * over positions 1..W-1 of every window; perplexity = exp(mean loss). Progress on stderr; the last line of
 * stdout is "perplexity = <value>". */
#include <stdlib.h>

#include "cli/cli.h"
#include "util/ids.h"
#include "util/progress.h"

static const char *HELP =
    "usage: fp8moe perplexity --model DIR --ids FILE [--window 512] [--windows N] [options]\n"
    "\n"
    "  --ids FILE         token ids (little-endian int32)\n"
    "  --window W         tokens per window (default 512)\n"
    "  --windows N        number of windows from the start of the file (default: all full windows)\n"
    "  --cache-chunk N    run each window through the KV cache: its first N tokens as a prompt, then chunks of N\n"
    "                     over the cached prefix (1: decode steps), so later positions read keys and values as\n"
    "                     the cache stores them (default: each window in one pass, no cache)\n"
    "  --kv-cache F       with --cache-chunk: the cache's format, auto or e4m3 (docs/kv-cache.md)\n" CLI_MODEL_HELP;

typedef struct progress_state {
    double t0;
} progress_state;

static void show_progress(void *user, int64_t done, int64_t total, double ppl) {
    const progress_state *p = (const progress_state *)user;
    fm_progress("window %lld/%lld  ppl so far %.4f  (%.1f s)", (long long)done, (long long)total, ppl,
                cli_now() - p->t0);
    if (done == total) fm_progress_end();
}

enum { OPT_IDS = 2000, OPT_WINDOW, OPT_WINDOWS, OPT_CACHE_CHUNK, OPT_KV_CACHE };
static const struct option own_options[] = {
    {"ids", required_argument, 0, OPT_IDS},           {"window", required_argument, 0, OPT_WINDOW},
    {"windows", required_argument, 0, OPT_WINDOWS},   {"cache-chunk", required_argument, 0, OPT_CACHE_CHUNK},
    {"kv-cache", required_argument, 0, OPT_KV_CACHE}, {0, 0, 0, 0}};

typedef struct ppl_args {
    const char *ids_path;
    long window, windows;
    long cache_chunk;     /* 0: not given */
    fm_kv_dtype kv_cache; /* --kv-cache */
    bool kv_given;
} ppl_args;

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    ppl_args *a = ctx;
    if (id == OPT_IDS) a->ids_path = arg;
    else if (id == OPT_WINDOW) return cli_parse_int(cmd, "--window", arg, 2, 1 << 20, &a->window);
    else if (id == OPT_WINDOWS) return cli_parse_int(cmd, "--windows", arg, 1, 1 << 30, &a->windows);
    else if (id == OPT_CACHE_CHUNK) return cli_parse_int(cmd, "--cache-chunk", arg, 1, 1 << 20, &a->cache_chunk);
    else if (id == OPT_KV_CACHE) return a->kv_given = true, cli_parse_kv_cache(cmd, arg, &a->kv_cache);
    return true;
}

int cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity";
    ppl_args a = {NULL, 512, 0, 0, FM_KV_ACT, false};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    const char *ids_path = a.ids_path;
    const long window = a.window;
    long windows = a.windows;
    if (!mo.model_dir || !ids_path) return cli_usage(cmd, "--model and --ids are required");
    if (a.kv_given && !a.cache_chunk)
        return cli_usage(cmd, "--kv-cache applies to windows run through the KV cache: give --cache-chunk N");

    fm_error err = {{0}};
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_model *m = NULL;
    fm_status st = fm_ids_read(ids_path, &ids, &n, &err);
    if (!st && n < window)
        st = FM_ERR_FORMAT, snprintf(err.msg, sizeof err.msg, "%s: %lld tokens, fewer than one window of %ld", ids_path,
                                     (long long)n, window);
    if (!st && windows > n / window)
        st = FM_ERR_FORMAT, snprintf(err.msg, sizeof err.msg, "%s: %lld tokens hold %lld windows of %ld, not %ld",
                                     ids_path, (long long)n, (long long)(n / window), window, windows);
    if (!st && windows == 0) windows = n / window;
    mo.opt.max_tokens = window;
    if (a.cache_chunk) { /* one sequence of one window; the steps' activations planned for a chunk */
        mo.opt.max_seqs = 1, mo.opt.kv_cache = a.kv_cache;
        if (mo.opt.ctx <= 0) mo.opt.ctx = window;
        mo.opt.max_tokens = a.cache_chunk < window ? a.cache_chunk : window;
    }
    if (!st) st = fm_model_load(mo.model_dir, &mo.opt, &m, &err);
    fm_context *ctx = NULL;
    if (!st) st = fm_context_create(m, NULL, &ctx, &err);
    if (!st) st = fm_ids_check_vocab(ids_path, ids, (int64_t)windows * window, fm_model_vocab_size(m), &err);
    double ppl = 0, loss = 0;
    progress_state ps = {cli_now()};
    if (!st)
        st = fm_context_perplexity_cached(ctx, ids, n, (int32_t)window, windows, (int32_t)a.cache_chunk, show_progress,
                                          &ps, &ppl, &loss, &err);
    if (!st) {
        printf("model: %s\npreset: %s\nbackend: %s\nwindows: %ld x %ld tokens, %ld scored\nmean loss: %.6f\n",
               mo.model_dir, fm_preset_name(mo.opt.preset), mo.opt.backend, windows, window, windows * (window - 1),
               loss);
        if (a.cache_chunk)
            printf("through the KV cache: chunks of %ld tokens, cache %s\n", a.cache_chunk,
                   fm_kv_dtype_name(a.kv_cache));
        printf("perplexity = %.4f\n", ppl);
        cli_print_expert_stats(ctx, NULL);
    }
    free(ids);
    fm_context_free(ctx);
    fm_model_free(m);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
