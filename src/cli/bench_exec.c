/* fp8moe bench: the benchmarks are a program of their own (fp8moe-bench, built beside fp8moe from bench/cli) so that
 * this binary carries neither their code nor the yardsticks they link; `fp8moe bench WHAT ...` runs it. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#define BENCH_PROGRAM "fp8moe-bench"

/* The path of fp8moe-bench in the directory of the running binary; false (after printing) when it cannot be named. */
static bool bench_program_path(char *path, size_t cap) {
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "fp8moe bench: error: cannot find the running binary (/proc/self/exe): %s\n", strerror(errno));
        return false;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    if (snprintf(path, cap, "%s/%s", slash ? self : ".", BENCH_PROGRAM) >= (int)cap) {
        fprintf(stderr, "fp8moe bench: error: the path of %s is too long\n", BENCH_PROGRAM);
        return false;
    }
    return true;
}

int cmd_bench(int argc, char **argv) {
    char path[PATH_MAX + sizeof BENCH_PROGRAM + 1];
    if (!bench_program_path(path, sizeof path)) return CLI_BAD_INPUT;
    if (access(path, X_OK) != 0) {
        fprintf(stderr,
                "fp8moe bench: error: the bench commands are the program %s, which is %s (build it: make, or "
                "make %s)\n",
                path, errno == ENOENT ? "missing" : "not executable", BENCH_PROGRAM);
        return CLI_BAD_INPUT;
    }
    /* argv[0] is "bench": the program gets its own path there and the rest as it is */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "fp8moe bench: error: out of memory\n");
        return CLI_BAD_INPUT;
    }
    args[0] = path;
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    fflush(stdout);
    fflush(stderr);
    execv(path, args);
    fprintf(stderr, "fp8moe bench: error: cannot run %s: %s\n", path, strerror(errno));
    free(args);
    return CLI_BAD_INPUT;
}
