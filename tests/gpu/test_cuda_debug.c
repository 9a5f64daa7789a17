/* Debug mode (FP8MOE_SYNC=1, set here before any CUDA call): ops that can check their inputs say what is wrong
 * instead of spreading it silently. The W8A8 activation quantizer counts NaN/Inf inputs on both of its paths (the
 * fused one-block launch and the amax + cast grids) and prints the count; finite inputs print nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gpu_test_util.h"

/* runs the W8A8 linear on x [M, K] with stderr captured into buf */
static void run_captured(int64_t M, int64_t K, const float *x, char *buf, size_t cap) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_plan_set_dense(&plan, FM_DENSE_W8A8);
    fm_backend *be = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &be, &err)) fail_msg("cuda backend: %s", err.msg);
    const int64_t N = 64;
    float *w = malloc((size_t)(N * K) * sizeof *w);
    for (int64_t i = 0; i < N * K; i++) w[i] = (float)((i * 7919) % 201 - 100) / 1000.0f;
    fm_bank *wb = gpu_bank(be, w, 1, N, K, FM_W_E4M3_PT, false);
    void *xd = gpu_upload(be, x, M * K), *yd = be->ops->alloc(be, (size_t)(M * N) * be->ops->act_size);
    FILE *tmp = tmpfile(); /* removed when closed */
    const int fd = tmp ? fileno(tmp) : -1, saved = dup(2);
    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    be->ops->linear(be, wb, 0, xd, M, be->plan.a_dense, yd);
    assert_int_equal(be->ops->sync(be, &err), FM_OK);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    const ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    fclose(tmp);
    be->ops->free(be, xd), be->ops->free(be, yd);
    be->ops->bank_free(be, wb);
    be->ops->destroy(be);
    free(w);
}

static void nonfinite_inputs_are_reported(void **s) {
    (void)s;
    const int64_t shapes[][2] = {{3, 96}, {300, 2048}}; /* the fused path, the two-kernel path */
    for (int i = 0; i < 2; i++) {
        const int64_t M = shapes[i][0], K = shapes[i][1];
        float *x = malloc((size_t)(M * K) * sizeof *x);
        for (int64_t j = 0; j < M * K; j++) x[j] = (float)((j * 31) % 17 - 8) / 8.0f;
        char out[4096];
        run_captured(M, K, x, out, sizeof out);
        printf("  M=%lld K=%lld finite: stderr '%s'\n", (long long)M, (long long)K, out);
        assert_null(strstr(out, "NaN or Inf"));
        x[5] = NAN, x[M * K - 1] = INFINITY, x[M * K / 2] = -INFINITY;
        run_captured(M, K, x, out, sizeof out);
        printf("  M=%lld K=%lld with 3 non-finite: stderr '%s'\n", (long long)M, (long long)K, out);
        assert_non_null(strstr(out, "3 of the"));
        free(x);
    }
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    setenv("FP8MOE_SYNC", "1", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(nonfinite_inputs_are_reported)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
