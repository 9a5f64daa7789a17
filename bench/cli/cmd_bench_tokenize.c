/* fp8moe bench tokenize: the encode throughput of a tokenizer.json on one thread. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cli/cli.h"
#include "text/tokenizer.h"
#include "util/file.h"
#include "util/status.h"

#define TEXT_MAX_BYTES ((size_t)1 << 32)

static const char *HELP =
    "usage: fp8moe bench tokenize --model DIR --file F [--repeat R] [--warmup W] [--json FILE]\n"
    "\n"
    "Encode throughput of DIR/tokenizer.json on the text of F, one thread, the whole file per encode call (as\n"
    "tools/make_golden_tokenizer.py times `tokenizers`' encode on the same file): MB/s of the median run, min and "
    "max,\n"
    "tokens per second.\n"
    "\n"
    "  --model DIR   directory with tokenizer.json\n"
    "  --file F      the text (1 MB is typical)\n"
    "  --repeat R    timed runs (default 10)\n"
    "  --warmup W    untimed runs first (default 1)\n"
    "  --json FILE   also write the results as JSON\n"
    "  -h, --help    this help\n";

enum { OPT_MODEL = 2000, OPT_FILE, OPT_REPEAT, OPT_WARMUP, OPT_JSON };

typedef struct tok_bench_args {
    const char *model, *file, *json;
    long repeat, warmup;
} tok_bench_args;

/* -1 when the bench should run, else the exit code. */
static int parse(const char *cmd, int argc, char **argv, tok_bench_args *a) {
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                         {"file", required_argument, 0, OPT_FILE},
                                         {"repeat", required_argument, 0, OPT_REPEAT},
                                         {"warmup", required_argument, 0, OPT_WARMUP},
                                         {"json", required_argument, 0, OPT_JSON},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': return fputs(HELP, stdout), CLI_OK;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_FILE: a->file = optarg; break;
        case OPT_JSON: a->json = optarg; break;
        case OPT_REPEAT:
            if (!cli_parse_int(cmd, "--repeat", optarg, 1, 10000, &a->repeat)) return CLI_USAGE;
            break;
        case OPT_WARMUP:
            if (!cli_parse_int(cmd, "--warmup", optarg, 0, 10000, &a->warmup)) return CLI_USAGE;
            break;
        default: return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!a->model || !a->model[0]) return cli_usage(cmd, "--model DIR is required (the directory of tokenizer.json)");
    if (!a->file) return cli_usage(cmd, "--file F is required (the text to encode)");
    return -1;
}

static fm_status write_json(const tok_bench_args *a, size_t len, int64_t n, double med, double mn, double mx,
                            fm_error *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "tokenize");
    cJSON_AddStringToObject(root, "model", a->model);
    cJSON_AddStringToObject(root, "file", a->file);
    cJSON_AddNumberToObject(root, "bytes", (double)len);
    cJSON_AddNumberToObject(root, "tokens", (double)n);
    cJSON_AddNumberToObject(root, "threads", 1);
    cJSON_AddNumberToObject(root, "repeat", (double)a->repeat);
    cJSON_AddNumberToObject(root, "median_ms", 1e3 * med);
    cJSON_AddNumberToObject(root, "min_ms", 1e3 * mn);
    cJSON_AddNumberToObject(root, "max_ms", 1e3 * mx);
    cJSON_AddNumberToObject(root, "mb_per_s", (double)len / 1e6 / med);
    return bench_json_write(root, a->json, err);
}

int cmd_bench_tokenize(int argc, char **argv) {
    const char *cmd = "bench tokenize";
    tok_bench_args a = {.repeat = 10, .warmup = 1};
    int rc = parse(cmd, argc, argv, &a);
    if (rc >= 0) return rc;
    fm_error err = {{0}};
    fm_tokenizer *t = NULL;
    char *text = NULL;
    size_t len = 0;
    int64_t n = 0;
    double *secs = calloc((size_t)a.repeat, sizeof *secs);
    fm_status st = secs ? fm_tokenizer_load(a.model, &t, &err) : fm_fail(&err, FM_ERR_NOMEM, "out of memory");
    if (!st) st = fm_read_regular(a.file, "a text file", TEXT_MAX_BYTES, &text, &len, &err);
    for (long r = 0; !st && r < a.warmup + a.repeat; r++) {
        int32_t *ids = NULL;
        const double t0 = cli_now();
        st = fm_tokenizer_encode(t, text, len, true, true, &ids, &n, &err);
        if (r >= a.warmup) secs[r - a.warmup] = cli_now() - t0;
        free(ids);
    }
    if (!st) {
        double med = 0, mn = 0, mx = 0;
        bench_stats(secs, (int)a.repeat, &med, &mn, &mx);
        const double mb = (double)len / 1e6;
        printf("bench tokenize: %s, %zu bytes -> %lld tokens, 1 thread, %ld runs after %ld warm-up\n", a.file, len,
               (long long)n, a.repeat, a.warmup);
        printf("encode: median %.2f MB/s (%.3f ms), min %.3f ms, max %.3f ms; %.0f tokens/s\n", mb / med, 1e3 * med,
               1e3 * mn, 1e3 * mx, (double)n / med);
        if (a.json) st = write_json(&a, len, n, med, mn, mx, &err);
    }
    free(secs), free(text);
    fm_tokenizer_free(t);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
