/* fp8moe-bench: the benchmarks, a program of their own so that the fp8moe binary carries no yardstick and no bench
 * code. `fp8moe bench WHAT ...` runs this program with WHAT ...; it also runs alone. */
#include <errno.h>
#include <string.h>

#include "bench_common.h"
#include "cli/cli.h"

typedef struct bench_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the name */
    const char *summary;
} bench_command;

static const bench_command COMMANDS[] = {
    {"prefill", cmd_bench_prefill, "prefill latency of a synthetic model at real shapes, per stage against the floors"},
    {"decode", cmd_bench_decode, "decode steps at a context, batch sizes and presets side by side"},
    {"moe", cmd_bench_moe, "one MoE layer's experts at real shapes, every route side by side"},
    {"gemm", cmd_bench_gemm, "every layer's attention projections, every route side by side, CUDA-graph replay"},
    {"tokenize", cmd_bench_tokenize, "encode MB/s of a tokenizer.json on a text file, one thread"},
    {"mask", cmd_bench_mask, "constrained decoding's token mask per step, one thread"},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

static void usage(FILE *f) {
    fprintf(f, "usage: fp8moe bench <what> [options]   (fp8moe bench <what> --help for its options)\n\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  fp8moe bench %-9s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f,
            "\n(the program fp8moe-bench beside fp8moe runs them; it takes the same arguments: fp8moe-bench <what>)\n");
}

int main(int argc, char **argv) {
    const char *what = argc >= 2 ? argv[1] : NULL;
    if (what && (!strcmp(what, "--help") || !strcmp(what, "-h") || !strcmp(what, "help"))) {
        usage(stdout);
        return CLI_OK;
    }
    int rc = -1;
    for (int i = 0; what && i < N_COMMANDS; i++)
        if (!strcmp(what, COMMANDS[i].name)) {
            errno = 0;
            rc = COMMANDS[i].run(argc - 1, argv + 1);
        }
    if (rc < 0) {
        usage(stderr);
        return cli_usage("bench", "the first argument must be one of prefill, decode, moe, gemm, tokenize, mask");
    }
    /* output that never reached its file (a full disk, a closed pipe) is a failure, not a success */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "fp8moe bench %s: error: cannot write the output to stdout: %s\n", what,
                strerror(errno ? errno : EIO));
        return rc ? rc : CLI_BAD_INPUT;
    }
    return rc;
}
