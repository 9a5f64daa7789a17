/* Shared pieces of the side-by-side benchmarks (bench_common.h). */
#include "cli/bench_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

const char *bench_status_name(bench_status s) {
    return s == BENCH_OK ? "ok" : s == BENCH_UNAVAILABLE ? "unavailable" : s == BENCH_FAILED ? "failed" : "not run";
}

bool bench_parse_counts(const char *cmd, const char *opt, const char *list, long lo, long hi, int64_t *out, int max,
                        int *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v = 0;
        if (*n == max) {
            cli_usage(cmd, "%s takes at most %d counts", opt, max);
            return false;
        }
        if (!cli_parse_int(cmd, opt, tok, lo, hi, &v)) return false;
        out[(*n)++] = v;
    }
    if (!*n) cli_usage(cmd, "%s expects a comma-separated list such as 512,4096, got '%s'", opt, list);
    return *n > 0;
}

bool bench_parse_names(const char *cmd, const char *opt, const char *list, const char *const *names, int n_names,
                       int *idx, int *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int r = 0;
        while (r < n_names && strcmp(tok, names[r]) != 0) r++;
        if (r == n_names) {
            char known[512] = "";
            for (int i = 0; i < n_names; i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", names[i]);
            cli_usage(cmd, "unknown %s value '%s' (choose %s)", opt, tok, known);
            return false;
        }
        for (int i = 0; i < *n; i++)
            if (idx[i] == r) {
                cli_usage(cmd, "%s: '%s' is listed twice", opt, tok);
                return false;
            }
        idx[(*n)++] = r;
    }
    if (!*n) cli_usage(cmd, "%s expects a comma-separated list, got '%s'", opt, list);
    return *n > 0;
}

fm_wsrc bench_weight_view(uint64_t seed, int64_t rows, int64_t cols) {
    return (fm_wsrc){NULL, 0, rows, cols, {seed * 0x632BE59BD9B4E019ull, sqrtf(3.0f / (float)cols), 0.0f, 0}};
}

float *bench_synth_host(fm_synth s, int64_t rows, int64_t cols) {
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    if (!v) return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * cols; i++) v[i] = fm_synth_value(&s, i, cols);
    return v;
}

float *bench_input_with_outliers(int64_t rows, int64_t cols) {
    return bench_synth_host((fm_synth){0x9E3779B97F4A7C15ull, 1.0f, 0.0f, 97}, rows, cols);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_stats(double *ms, long n, double *median, double *min, double *max) {
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    *median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    *min = ms[0], *max = ms[n - 1];
}

double bench_nerr(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), r += (double)ref[i] * ref[i];
    return r > 0 ? sqrt(d / r) : sqrt(d);
}
