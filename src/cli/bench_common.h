/* Pieces the side-by-side benchmarks (bench moe, bench gemm) share: list parsing, synthetic inputs, the
 * statistics of repeated timings, the error against a reference output, and a route's status. */
#ifndef FM_CLI_BENCH_COMMON_H
#define FM_CLI_BENCH_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model_src.h"

/* Ceilings measured on the H200 (bench/NOTES.md; DESIGN.md): device copy 4.25 TB/s, bf16 dense matrix ~0.79
 * PFLOP/s, FP8 dense matrix ~1.3 PFLOP/s. */
#define BENCH_BANDWIDTH_BYTES_PER_S 4.25e12
#define BENCH_BF16_FLOPS_PER_S      0.79e15
#define BENCH_FP8_FLOPS_PER_S       1.3e15
#define BENCH_MAX_REPEAT            2000 /* two marks per run, FM_MARK_SLOTS (4096) in all */

typedef enum { BENCH_NOT_RUN, BENCH_OK, BENCH_UNAVAILABLE, BENCH_FAILED } bench_status;
const char *bench_status_name(bench_status s);

/* A comma-separated list of at most max integers in [lo, hi] into out; false (after a usage message) otherwise. */
bool bench_parse_counts(const char *cmd, const char *opt, const char *list, long lo, long hi, int64_t *out, int max,
                        int *n);
/* A comma-separated list of names, each one of names[0..n_names), none twice, into idx; false after a message. */
bool bench_parse_names(const char *cmd, const char *opt, const char *list, const char *const *names, int n_names,
                       int *idx, int *n);

/* Synthetic weights (model/model_src.h), as synthetic.c makes them: uniform with variance 1 / fan_in; the values
 * depend only on the seed, so every route computes the same function of the same weights. */
fm_wsrc bench_weight_view(uint64_t seed, int64_t rows, int64_t cols);
/* rows x cols values of s on the host (NULL when out of memory) */
float *bench_synth_host(fm_synth s, int64_t rows, int64_t cols);
/* bench inputs: uniform [-1, 1) with every 97th channel x8 (outliers, as the synthetic embeddings) */
float *bench_input_with_outliers(int64_t rows, int64_t cols);

/* median, min and max of n timings (sorts ms) */
void bench_stats(double *ms, long n, double *median, double *min, double *max);
/* ||x - ref|| / ||ref|| over n values */
double bench_nerr(const float *x, const float *ref, int64_t n);

#endif
