/* fp8moe logits: float32 logits [T, vocab] for every position of a token-id file. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "io/ids.h"

static const char *HELP =
    "usage: fp8moe logits --model DIR --ids FILE --out FILE [options]\n"
    "\n"
    "Runs the prefill over the ids (little-endian int32, positions 0..T-1) and writes the logits of every\n"
    "position as little-endian float32 [T, vocab], row-major. The output appears only when complete.\n"
    "\n"
    "  --ids FILE         token ids\n"
    "  --out FILE         logits output\n" CLI_MODEL_HELP;

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits", *ids_path = NULL, *out_path = NULL;
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    enum { OPT_IDS = 2000, OPT_OUT };
    static const struct option longopts[] = {CLI_MODEL_LONG_OPTIONS, {"ids", required_argument, 0, OPT_IDS},
                                             {"out", required_argument, 0, OPT_OUT}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "vh", longopts, NULL)) != -1) {
        int r = cli_model_option(cmd, c, optarg, &mo);
        if (r < 0) return CLI_USAGE;
        if (r > 0) continue;
        if (c == OPT_IDS) ids_path = optarg;
        else if (c == OPT_OUT) out_path = optarg;
        else if (c == 'h') return fputs(HELP, stdout), CLI_OK;
        else return cli_usage(cmd, "unknown option");
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!mo.model_dir || !ids_path || !out_path) return cli_usage(cmd, "--model, --ids and --out are required");

    fm_error  err = {{0}};
    int32_t  *ids = NULL;
    int64_t   n   = 0;
    fm_model *m   = NULL;
    float    *logits = NULL;
    fm_status st  = fm_ids_read(ids_path, &ids, &n, &err);
    if (!st) st = fm_model_load(mo.model_dir, &mo.opt, &m, &err);
    if (!st) {
        const size_t count = (size_t)n * (size_t)fm_model_vocab_size(m);
        logits = malloc(count * sizeof *logits);
        if (!logits) st = FM_ERR_NOMEM, snprintf(err.msg, sizeof err.msg, "out of memory for %zu logits", count);
        if (!st) st = fm_model_logits(m, ids, n, logits, &err);
        if (!st) st = cli_write_file(out_path, logits, count * sizeof *logits, &err);
        if (!st && mo.opt.verbose) fprintf(stderr, "wrote %lld x %d logits to %s\n", (long long)n, fm_model_vocab_size(m), out_path);
    }
    free(logits);
    free(ids);
    fm_model_free(m);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
