#include "cli_runner.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

char cli_tmp[256];
char cli_out[1 << 16], cli_err[1 << 16];
int cli_timeout_s;

void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

int fp8moe(const char *fmt, ...) {
    const char *bin = getenv("FP8MOE_BIN");
    if (!bin) bin = "build/fp8moe";
    char args[2048], cmd[4096], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char limit[64] = "";
    if (cli_timeout_s > 0) snprintf(limit, sizeof limit, "timeout -k 5 %d ", cli_timeout_s);
    snprintf(cmd, sizeof cmd, "%s%s %s >%s/stdout 2>%s/stderr", limit, bin, args, cli_tmp, cli_tmp);
    int status = system(cmd);
    snprintf(path, sizeof path, "%s/stdout", cli_tmp);
    slurp(path, cli_out, sizeof cli_out);
    snprintf(path, sizeof path, "%s/stderr", cli_tmp);
    slurp(path, cli_err, sizeof cli_err);
    if (!WIFEXITED(status)) fail_msg("'%s' did not exit normally (status %d)", args, status);
    int code = WEXITSTATUS(status);
    if (code != 0 && code != 1 && code != 2)
        fail_msg("'%s' exited %d%s; stderr: %s", args, code, code == 124 ? " (timed out: blocked?)" : "", cli_err);
    return code;
}

int cli_runner_setup(void **state) {
    (void)state;
    snprintf(cli_tmp, sizeof cli_tmp, "/tmp/fp8moe-test-XXXXXX");
    return mkdtemp(cli_tmp) ? 0 : -1;
}

int cli_runner_teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cli_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int cli_read_ids(const char *path, int32_t *ids, int cap) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: missing", path);
    uint8_t b[4];
    int n = 0;
    while (fread(b, 1, 4, f) == 4) {
        assert_true(n < cap);
        ids[n++] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    }
    fclose(f);
    return n;
}

void cli_write_ids(const char *path, const int32_t *ids, int64_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t v = (uint32_t)ids[i];
        const uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
        assert_int_equal(fwrite(b, 1, 4, f), 4);
    }
    fclose(f);
}
