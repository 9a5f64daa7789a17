/* fm_st_copy_finite (io/safetensors_copy.h), the float load's checked copy on every core: the bytes of a range that
 * spans several pieces, copied exactly; a range with non-finite elements in two pieces refused with the very message
 * of fm_st_check_finite over the whole range (the lowest one), whatever the number of threads; a bad range refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors_copy.h"

#define N ((int64_t)3 << 20) /* bf16 elements: six pieces */

static uint16_t *data;
static fm_st_tensor t;

static int setup(void **s) {
    (void)s;
    data = malloc((size_t)N * sizeof *data);
    if (!data) return -1;
    for (int64_t i = 0; i < N; i++) data[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 0x800); /* finite */
    t = (fm_st_tensor){.name = "w",
                       .dtype = FM_DTYPE_BF16,
                       .n_dims = 1,
                       .shape = {N},
                       .n_elements = N,
                       .data = (const uint8_t *)data,
                       .nbytes = (uint64_t)N * 2};
    return 0;
}

static int teardown(void **s) {
    (void)s;
    free(data);
    return 0;
}

static void copies_exactly(void **s) {
    (void)s;
    const int64_t first = 12345, n = N - 2 * first;
    uint16_t *out = malloc((size_t)n * sizeof *out);
    fm_error err = {{0}};
    for (int threads = 1; threads <= 3; threads += 2) {
        omp_set_num_threads(threads);
        memset(out, 0, (size_t)n * sizeof *out);
        assert_int_equal(fm_st_copy_finite(&t, first, n, out, &err), FM_OK);
        assert_memory_equal(out, data + first, (size_t)n * sizeof *out);
    }
    free(out);
}

static void refuses_the_first_nonfinite(void **s) {
    (void)s;
    const int64_t a = (int64_t)4 << 19 | 77, b = (int64_t)1 << 20 | 5; /* pieces 4 and 2: b is the lowest */
    const uint16_t keep_a = data[a], keep_b = data[b];
    data[a] = 0x7f80, data[b] = 0xff81; /* +inf, a NaN */
    uint16_t *out = malloc((size_t)N * sizeof *out);
    fm_error want = {{0}}, got = {{0}};
    assert_int_equal(fm_st_check_finite(&t, 0, N, &want), FM_ERR_FORMAT);
    for (int threads = 1; threads <= 4; threads++) {
        omp_set_num_threads(threads);
        assert_int_equal(fm_st_copy_finite(&t, 0, N, out, &got), FM_ERR_FORMAT);
        assert_string_equal(got.msg, want.msg);
    }
    assert_non_null(strstr(got.msg, "element 1048581 is NaN"));
    data[a] = keep_a, data[b] = keep_b;
    assert_int_equal(fm_st_copy_finite(&t, N - 10, 11, out, &got), FM_ERR_USAGE); /* past the end */
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(copies_exactly), cmocka_unit_test(refuses_the_first_nonfinite)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
