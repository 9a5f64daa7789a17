/* Helpers shared by the GPU tests: device buffers from host fp32, outputs between NaN guards (no write outside,
 * every element written), weight banks from host matrices, normalised error. Failures go through cmocka. */
#ifndef FM_GPU_TEST_UTIL_H
#define FM_GPU_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

#define GPU_TEST_GUARD 64 /* elements of NaN on each side of an output */

/* Every GPU test program takes `--route KEY=VALUE` arguments (repeatable; src/backend/routes.h), so that a forced
 * kernel route runs through the same override a user has (tools/gpu-check.sh runs the programs once per route set).
 * gpu_test_args parses main's argv (prints the routes; exits 2 on anything else); gpu_test_routes returns them
 * joined "k=v,k=v" for fm_backend_create and fm_options.routes (NULL: none). */
void gpu_test_args(int argc, char **argv);
const char *gpu_test_routes(void);

/* a backend buffer holding x (rounded to the backend's activation dtype) */
void *gpu_upload(fm_backend *be, const float *x, int64_t n);
/* n host floats uniform in (-scale, scale) from the xorshift64 state (advanced; caller frees) */
float *gpu_rand_array(uint64_t *state, int64_t n, float scale);
/* fails the test (what, name and the first element that differs) unless got and want hold the same n floats' bits */
void gpu_expect_same_bits(const float *got, const float *want, int64_t n, const char *what, const char *name);
/* a backend buffer of bytes zero bytes (NULL for 0): a kernel's scratch whose counters start at zero */
void *gpu_zeroed(fm_backend *be, size_t bytes);
/* a backend buffer holding the n int32 of v */
int32_t *gpu_upload_i32(fm_backend *be, const int32_t *v, int64_t n);
/* the cuda backend with the fp8 preset's plan and routes `route` (then the command line's; failures: the test's) */
fm_backend *gpu_fp8_with(const char *route);
/* an output of n elements inside NaN guards; returns the output pointer, *base the allocation */
void *gpu_guarded(fm_backend *be, int64_t n, void **base);
/* downloads a guarded output, checks the guards and that every element was written (finite), frees the
 * allocation and returns the n outputs (caller frees) */
float *gpu_fetch(fm_backend *be, void *base, int64_t n, const char *what);
/* a bank of n host fp32 matrices [rows, cols] in format fmt (one part; gate_up: gate rows then up rows) */
fm_bank *gpu_bank(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt, bool gate_up);
/* the same in host memory (bank_create_host: experts behind an expert cache) */
fm_bank *gpu_bank_host(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt,
                       bool gate_up);
/* The moe op on backend be with the plan's activation formats: x [T, H], routing ids and weights [T, k] from the
 * host; returns the output [T, H] (fetched from between NaN guards; caller frees). */
float *gpu_run_moe(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const float *x, int64_t T, int64_t H,
                   const int32_t *ids, const float *weights, int32_t k);
/* Prints what, n and the normalised error of gpu against ref; fails the test (showing the first and the worst
 * elements) when it is above bound. */
void gpu_expect_close(const float *gpu, const float *ref, int64_t n, double bound, const char *what);
/* ||x - ref|| / ||ref|| (||x - ref|| when ref is zero) */
double gpu_nerr(const float *x, const float *ref, int64_t n);

#endif
