/* A checkpoint written by `fp8moe requantize` binds natively on the CUDA backend (cuda_bank_native_int4.cu): the
 * int4 preset (int4-g128 row banks) and the fp8 preset (int4-g128-tc, repacked for the tensor cores) give logits
 * bit-identical to the bf16 checkpoint's on the GPU, whose banks the device quantizes itself, and the same resident
 * bytes. A checkpoint written with `requantize --scales p2` (int4-p2 scales, quant/int4_p2.h) runs on the same banks
 * and kernels: its int4 and fp8 logits against the CPU's emulation of the GPU plan. Needs a GPU (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/requantize.h"
#include "gpu_test_util.h"
#include "util/metrics.h"

#define TINY "models/tiny-code-moe"
#define T 37
#define NP2 256

static float *run_on(const char *dir, const char *backend, fm_preset preset, const int32_t *ids, int n_ids,
                     size_t *bytes, int32_t *V) {
    fm_options opt;
    fm_options_init(&opt);
    opt.routes = gpu_test_routes();
    opt.backend = backend;
    opt.plan_backend = "cuda"; /* on the cpu: the exact emulation of the GPU's formats */
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s (%s): %s", dir, fm_preset_name(preset), err.msg);
    *V = fm_model_vocab_size(m);
    *bytes = m->weight_bytes;
    float *l = malloc((size_t)n_ids * (size_t)*V * sizeof(float));
    if (fm_context_logits(m->context, ids, n_ids, l, &err)) fail_msg("logits %s: %s", dir, err.msg);
    fm_model_free(m);
    return l;
}

static float *run(const char *dir, fm_preset preset, const int32_t *ids, size_t *bytes, int32_t *V) {
    return run_on(dir, "cuda", preset, ids, T, bytes, V);
}

static void requantized_bit_identical(void **s) {
    (void)s;
    char dir[] = "/tmp/fm_requant_gpu_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[64];
    snprintf(out, sizeof out, "%s/int4", dir);
    fm_requant_opts o = {.in_dir = TINY, .out_dir = out};
    fm_requant_stats st;
    fm_error err = {{0}};
    if (fm_requantize(&o, &st, &err)) fail_msg("requantize: %s", err.msg);
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 131 + 7) % 4096;
    const fm_preset presets[2] = {FM_PRESET_INT4, FM_PRESET_FP8};
    for (int p = 0; p < 2; p++) {
        size_t ba = 0, bb = 0;
        int32_t V = 0;
        float *a = run(out, presets[p], ids, &ba, &V), *b = run(TINY, presets[p], ids, &bb, &V);
        printf("%s on cuda: requantized vs bf16 checkpoint, %s logits, weights %zu vs %zu bytes\n",
               fm_preset_name(presets[p]), memcmp(a, b, (size_t)T * (size_t)V * 4) ? "DIFFERENT" : "identical", ba, bb);
        assert_memory_equal(a, b, (size_t)T * (size_t)V * sizeof(float));
        assert_int_equal(ba, bb);
        free(a), free(b);
    }
    /* int4-p2 scales: the same kernels, against the cpu's emulation, with the bounds of test_cuda_models.c on the
       same kind of input, the model's own eval text (at T = 37 of the ids above one argmax is 2.7%: fp8 measured 33
       of 37, H200, 2026-12-05) */
    int32_t text[NP2];
    FILE *f = fopen(TINY "/eval_ids.i32", "rb");
    assert_non_null(f);
    assert_int_equal(fread(text, sizeof *text, NP2, f), NP2);
    fclose(f);
    char p2[64];
    snprintf(p2, sizeof p2, "%s/int4-p2", dir);
    o.out_dir = p2, o.p2_scales = true;
    if (fm_requantize(&o, &st, &err)) fail_msg("requantize --scales p2: %s", err.msg);
    for (int p = 0; p < 2; p++) {
        size_t ba = 0, bb = 0;
        int32_t V = 0;
        float *gpu = run_on(p2, "cuda", presets[p], text, NP2, &ba, &V),
              *emul = run_on(p2, "cpu", presets[p], text, NP2, &bb, &V);
        fm_compare c;
        fm_logits_compare(emul, gpu, NP2, V, &c);
        printf("%s on cuda, int4-p2 checkpoint: vs the cpu emulation cos %.6f argmax %.1f%% max|err| %.3g\n",
               fm_preset_name(presets[p]), c.cosine, 100 * c.argmax_agree, c.max_abs_err);
        assert_int_equal(c.n_nonfinite, 0);
        assert_true(c.cosine >= 0.999 && c.argmax_agree >= 0.9);
        free(gpu), free(emul);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(requantized_bit_identical)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
