/* fp8moe logits: float32 logits [T, vocab] for every position of a token-id file. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "util/ids.h"
#include "util/file.h"

static const char *HELP =
    "usage: fp8moe logits --model DIR --ids FILE --out FILE [options]\n"
    "\n"
    "Runs the prefill over the ids (little-endian int32, positions 0..T-1) and writes the logits of every\n"
    "position as little-endian float32 [T, vocab], row-major. The output appears only when complete.\n"
    "\n"
    "  --ids FILE         token ids\n"
    "  --out FILE         logits output\n"
    "  --ep N             expert parallelism over N ranks in this process (cpu backend: the ranks exchange\n"
    "                     through host memory), each holding 1/N of the routed experts; the logits are those\n"
    "                     of one model holding every expert, bit for bit\n"
    "  --tp N             tensor parallelism of the attention layers over N ranks (each 1/N of the heads, one\n"
    "                     all-reduce per layer; cpu, or cuda with every rank on the one GPU); with --ep, the\n"
    "                     same N ranks\n" CLI_MODEL_HELP;

enum { OPT_IDS = 2000, OPT_OUT, OPT_EP, OPT_TP };
static const struct option own_options[] = {{"ids", required_argument, 0, OPT_IDS},
                                            {"out", required_argument, 0, OPT_OUT},
                                            {"ep", required_argument, 0, OPT_EP},
                                            {"tp", required_argument, 0, OPT_TP},
                                            {0, 0, 0, 0}};

typedef struct logits_args {
    const char *ids_path, *out_path;
    long ep, tp;
} logits_args;

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    logits_args *a = ctx;
    if (id == OPT_IDS) a->ids_path = arg;
    else if (id == OPT_OUT) a->out_path = arg;
    else if (id == OPT_EP) return cli_parse_int(cmd, "--ep", arg, 1, FM_MAX_RANKS, &a->ep);
    else if (id == OPT_TP) return cli_parse_int(cmd, "--tp", arg, 1, FM_MAX_RANKS, &a->tp);
    return true;
}

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits";
    logits_args a = {0};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    const char *ids_path = a.ids_path, *out_path = a.out_path;
    if (!mo.model_dir || !ids_path || !out_path) return cli_usage(cmd, "--model, --ids and --out are required");
    if (!*ids_path || !*out_path) return cli_usage(cmd, "--ids and --out need a file name, got ''");

    fm_error err = {{0}};
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_model *m = NULL;
    fm_context *ctx = NULL;
    fm_rank_group *group = NULL;
    float *logits = NULL;
    fm_status st = fm_check_output_path(out_path, &err); /* before the run, not after it */
    if (!st) st = fm_ids_read(ids_path, &ids, &n, &err);
    mo.opt.max_tokens = n; /* the memory check plans for this prompt */
    mo.opt.ep_ranks = (int32_t)a.ep, mo.opt.tp_ranks = (int32_t)a.tp;
    if (!st && (a.ep > 1 || a.tp > 1)) st = fm_rank_group_load(mo.model_dir, &mo.opt, &group, &err);
    if (!st && !group) st = fm_model_load(mo.model_dir, &mo.opt, &m, &err);
    if (!st && !group) st = fm_context_create(m, NULL, &ctx, &err);
    const int32_t V = st ? 0 : fm_model_vocab_size(group ? fm_rank_group_model(group, 0) : m);
    if (!st) st = fm_ids_check_vocab(ids_path, ids, n, V, &err);
    if (!st) {
        const size_t count = (size_t)n * (size_t)V;
        logits = malloc(count * sizeof *logits);
        if (!logits) st = FM_ERR_NOMEM, snprintf(err.msg, sizeof err.msg, "out of memory for %zu logits", count);
        if (!st)
            st = group ? fm_rank_group_forward(group, ids, n, false, logits, &err)
                       : fm_context_logits(ctx, ids, n, logits, &err);
        if (!st) st = cli_write_file(out_path, logits, count * sizeof *logits, &err);
        if (!st && mo.opt.verbose) fprintf(stderr, "wrote %lld x %d logits to %s\n", (long long)n, V, out_path);
    }
    free(logits);
    free(ids);
    fm_context_free(ctx);
    fm_model_free(m);
    fm_rank_group_free(group);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
