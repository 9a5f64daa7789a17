/* Helpers shared by the GPU tests (gpu_test_util.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test_util.h"

static char routes[512];

void gpu_test_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--route") && i + 1 < argc) v = argv[++i];
        else if (!strncmp(argv[i], "--route=", 8)) v = argv[i] + 8;
        fm_error err;
        if (!v || strlen(routes) + strlen(v) + 2 > sizeof routes || fm_routes_check(v, &err)) {
            fprintf(stderr, "%s: %s (usage: %s [--route KEY=VALUE]...)\n", argv[0],
                    v && strlen(routes) + strlen(v) + 2 <= sizeof routes ? err.msg : "bad argument", argv[0]);
            exit(2);
        }
        if (routes[0]) strcat(routes, ",");
        strcat(routes, v);
    }
    fprintf(stderr, "routes: %s\n", routes[0] ? routes : "defaults");
}

const char *gpu_test_routes(void) { return routes[0] ? routes : NULL; }

void *gpu_upload(fm_backend *be, const float *x, int64_t n) {
    void *p = be->ops->alloc(be, (size_t)n * be->ops->act_size);
    assert_non_null(p);
    be->ops->upload_f32(be, x, n, p);
    return p;
}

float *gpu_rand_array(uint64_t *state, int64_t n, float scale) {
    float *a = malloc((size_t)n * sizeof *a);
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        a[i] = scale * (float)((double)(*state >> 11) / (double)(1ull << 52) - 1.0);
    }
    return a;
}

void gpu_expect_same_bits(const float *got, const float *want, int64_t n, const char *what, const char *name) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)))
            fail_msg("%s: %s element %lld: %.9g, the chain %.9g", what, name, (long long)i, got[i], want[i]);
}

void *gpu_zeroed(fm_backend *be, size_t bytes) {
    if (!bytes) return NULL;
    void *d = be->ops->alloc(be, bytes), *zero = calloc(1, bytes);
    assert_non_null(d), assert_non_null(zero);
    be->ops->upload_raw(be, zero, bytes, d);
    assert_int_equal(be->ops->sync(be, &(fm_error){{0}}), FM_OK);
    free(zero);
    return d;
}

int32_t *gpu_upload_i32(fm_backend *be, const int32_t *v, int64_t n) {
    int32_t *d = be->ops->alloc(be, (size_t)n * sizeof *d);
    assert_non_null(d);
    be->ops->upload_ids(be, v, n, d);
    return d;
}

fm_backend *gpu_fp8_with(const char *route) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    char routes[640];
    const char *cl = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%s%s", route, cl ? "," : "", cl ? cl : "");
    fm_backend *gpu = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, routes, &gpu, &err)) fail_msg("cuda backend (%s): %s", routes, err.msg);
    return gpu;
}

void *gpu_guarded(fm_backend *be, int64_t n, void **base) {
    const int64_t total = n + 2 * GPU_TEST_GUARD;
    float *nan = malloc((size_t)total * sizeof(float));
    for (int64_t i = 0; i < total; i++) nan[i] = NAN;
    *base = gpu_upload(be, nan, total);
    free(nan);
    return (char *)*base + GPU_TEST_GUARD * be->ops->act_size;
}

float *gpu_fetch(fm_backend *be, void *base, int64_t n, const char *what) {
    const int64_t G = GPU_TEST_GUARD;
    float *all = malloc((size_t)(n + 2 * G) * sizeof(float));
    be->ops->download_f32(be, base, n + 2 * G, all);
    fm_error err;
    assert_int_equal(be->ops->sync(be, &err), FM_OK);
    for (int64_t i = 0; i < G; i++)
        if (!isnan(all[i]) || !isnan(all[n + G + i]))
            fail_msg("%s (%s): write outside the output", what, be->ops->name);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(all[G + i]))
            fail_msg("%s (%s): output %lld not written or not finite", what, be->ops->name, (long long)i);
    float *out = malloc((size_t)n * sizeof(float));
    memcpy(out, all + G, (size_t)n * sizeof(float));
    free(all);
    be->ops->free(be, base);
    return out;
}

/* a bank through bank_create, or bank_create_host (host) */
static fm_bank *bank_from(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt,
                          bool gate_up, bool host) {
    /* the tensor and views only need to live through bank_create, which copies (and converts) synchronously */
    fm_st_tensor t = {.name = "test.weight",
                      .dtype = FM_DTYPE_F32,
                      .n_dims = 1,
                      .n_elements = n * rows * cols,
                      .data = (const uint8_t *)w,
                      .nbytes = (uint64_t)(n * rows * cols) * 4};
    t.shape[0] = n * rows * cols;
    fm_wsrc *views = malloc((size_t)n * sizeof *views);
    for (int32_t i = 0; i < n; i++) views[i] = (fm_wsrc){&t, (int64_t)i * rows * cols, rows, cols, {0}, {0}};
    fm_bank_src src = {views, n, 1, host ? "test host bank" : "test bank", gate_up, false};
    fm_bank *b = NULL;
    fm_error err;
    if ((host ? be->ops->bank_create_host : be->ops->bank_create)(be, &src, fmt, &b, &err))
        fail_msg("bank_create%s on %s: %s", host ? "_host" : "", be->ops->name, err.msg);
    free(views);
    return b;
}

fm_bank *gpu_bank(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt, bool gate_up) {
    return bank_from(be, w, n, rows, cols, fmt, gate_up, false);
}

fm_bank *gpu_bank_host(fm_backend *be, const float *w, int32_t n, int64_t rows, int64_t cols, fm_wformat fmt,
                       bool gate_up) {
    return bank_from(be, w, n, rows, cols, fmt, gate_up, true);
}

double gpu_nerr(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++)
        d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), r += (double)ref[i] * ref[i];
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

float *gpu_run_moe(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const float *x, int64_t T, int64_t H,
                   const int32_t *ids, const float *weights, int32_t k) {
    void *xd = gpu_upload(be, x, T * H), *wd = gpu_upload(be, weights, T * k), *base;
    void *idd = be->ops->alloc(be, (size_t)(T * k) * sizeof(int32_t));
    be->ops->upload_ids(be, ids, T * k, idd);
    void *od = gpu_guarded(be, T * H, &base);
    be->ops->moe(be, gate_up, down, xd, T, idd, wd, k, be->plan.a_dispatch, be->plan.a_expert, od);
    float *o = gpu_fetch(be, base, T * H, "moe");
    be->ops->free(be, xd), be->ops->free(be, wd), be->ops->free(be, idd);
    return o;
}

void gpu_expect_close(const float *gpu, const float *cpu, int64_t n, double bound, const char *what) {
    const double e = gpu_nerr(gpu, cpu, n);
    printf("  %-60s n %-8lld err %.3g\n", what, (long long)n, e);
    if (!(e <= bound)) {
        int64_t worst = 0;
        for (int64_t i = 0; i < n; i++)
            if (fabsf(gpu[i] - cpu[i]) > fabsf(gpu[worst] - cpu[worst])) worst = i;
        for (int64_t i = 0; i < n && i < 6; i++) printf("    [%lld] gpu %g cpu %g\n", (long long)i, gpu[i], cpu[i]);
        printf("    worst [%lld] gpu %g cpu %g\n", (long long)worst, gpu[worst], cpu[worst]);
        fail_msg("%s: normalised error %.3g > %.3g", what, e, bound);
    }
}
