/* Running the fp8moe binary from tests: its exit code, stdout and stderr, in a temporary directory.
 * The binary is $FP8MOE_BIN (make test sets it), else build/fp8moe. */
#ifndef FM_TESTS_CLI_RUNNER_H
#define FM_TESTS_CLI_RUNNER_H

#include <stddef.h>
#include <stdint.h>

extern char cli_tmp[256]; /* a fresh directory for the test's files */
extern char cli_out[1 << 16], cli_err[1 << 16];
extern int cli_timeout_s; /* > 0: each run is killed after this many seconds (a hang fails the test) */

/* cmocka group setup/teardown: creates / removes cli_tmp */
int cli_runner_setup(void **state);
int cli_runner_teardown(void **state);

/* Runs "fp8moe ARGS" (printf-style); returns the exit code (a signal or a code other than 0/1/2 fails the test). */
int fp8moe(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An ids file (little-endian int32, as generate --out writes and --ids reads): cli_read_ids returns the count
 * (more than cap fails the test); cli_write_ids writes n ids. */
int cli_read_ids(const char *path, int32_t *ids, int cap);
void cli_write_ids(const char *path, const int32_t *ids, int64_t n);

/* Reads a whole small file into buf (NUL-terminated, cut at cap - 1). */
void slurp(const char *path, char *buf, size_t cap);

#endif
