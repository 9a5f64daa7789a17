/* The CUDA backend has no kernel for pre-quantized int4 (int4-zp) banks yet: loading a GPTQ, AWQ or
 * compressed-tensors checkpoint on it must fail at once with a message that names the format and says to use the
 * CPU backend, under the int4 and the float presets (a float preset would need a device-side dequantization that
 * does not exist either), and leave nothing allocated. Needs a GPU (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fp8moe.h"

static void refuses(const char *dir, fm_preset preset, const char *method) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda";
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(dir, &opt, &m, &err);
    printf("%s (%s): %s\n", dir, fm_preset_name(preset), err.msg);
    assert_null(m);
    assert_int_equal(st, FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "not yet supported on the CUDA backend; use --backend cpu"));
    assert_non_null(strstr(err.msg, method));
}

static void cuda_refuses_prequantized(void **s) {
    (void)s;
    refuses("tests/data/quant/gptq-v1-sym", FM_PRESET_INT4, "gptq");
    refuses("tests/data/quant/gptq-v1-asym-actorder", FM_PRESET_REF, "gptq");
    refuses("tests/data/quant/awq-gemm", FM_PRESET_REF32, "awq");
    refuses("tests/data/quant/ct-sym", FM_PRESET_INT4, "compressed-tensors");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(cuda_refuses_prequantized)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
