/* The CPU reference against transformers itself: tiny checkpoints made and evaluated by Hugging Face
 * transformers 5.17 (tools/make_golden.py, fp32 forward, eager attention) must be reproduced with
 * cosine >= 0.99999 and max |diff| <= 1e-4 x max |logit|. The BF16 checkpoints are held to the same
 * bound: their golden logits are transformers' fp32 forward of the bf16 file, which is what we compute. Qwen3-Next's
 * (tools/make_qwen3_next_golden.py) are held to the same bounds. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8moe.h"
#include "util/ids.h"
#include "util/metrics.h"

static float *read_floats(const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)bytes);
    assert_int_equal(fread(x, 1, (size_t)bytes, f), (size_t)bytes);
    fclose(f);
    *n = bytes / 4;
    return x;
}

static const char *run_routes = NULL; /* fm_options.routes of the loads below */

static float *run(const char *dir, fm_preset preset, int32_t layers, const int32_t *ids, int64_t T, int32_t *V) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    opt.routes = run_routes;
    opt.n_layers = layers;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(dir, &opt, &m, &err);
    if (st) fprintf(stderr, "load %s: %s\n", dir, err.msg);
    assert_int_equal(st, FM_OK);
    fm_context *ctx = NULL;
    assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
    *V = fm_model_vocab_size(m);
    float *logits = malloc((size_t)T * (size_t)*V * sizeof(float));
    st = fm_context_logits(ctx, ids, T, logits, &err);
    if (st) fprintf(stderr, "logits %s: %s\n", dir, err.msg);
    assert_int_equal(st, FM_OK);
    fm_context_free(ctx);
    fm_model_free(m);
    return logits;
}

static void check_golden(const char *dir) {
    char path[512];
    int32_t *ids = NULL;
    int64_t T = 0, n = 0;
    fm_error err = {{0}};
    snprintf(path, sizeof path, "%s/golden_ids.i32", dir);
    assert_int_equal(fm_ids_read(path, &ids, &T, &err), FM_OK);
    assert_true(T % 2 == 1); /* an odd length, so no tile size divides it */
    snprintf(path, sizeof path, "%s/golden_logits.f32", dir);
    float *golden = read_floats(path, &n);
    int32_t V = 0;
    float *logits = run(dir, FM_PRESET_REF, 0, ids, T, &V);
    assert_int_equal(n, T * V);
    fm_compare c;
    fm_logits_compare(golden, logits, T, V, &c);
    printf("%-40s cosine %.9f  max|diff| %.3g  (%.2g x max|logit| %.3g)  argmax %.0f%%\n", dir, c.cosine, c.max_abs_err,
           c.max_abs_err / c.max_abs_ref, c.max_abs_ref, 100 * c.argmax_agree);
    assert_int_equal(c.n_nonfinite, 0);
    assert_true(c.cosine >= 0.99999);
    assert_true(c.max_abs_err <= 1e-4 * c.max_abs_ref);
    assert_true(c.argmax_agree == 1.0);
    free(logits), free(golden), free(ids);
}

static void golden_qwen3_f32(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-moe-f32");
}
static void golden_qwen3_bf16(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-moe-bf16");
}
static void golden_qwen3_fused(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-moe-fused-bf16");
}
static void golden_qwen3_tied(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-moe-tied-f32");
}
static void golden_mixtral_sharded(void **s) {
    (void)s;
    check_golden("tests/models/mixtral-f32-sharded");
}

/* Qwen3-Next (tools/make_qwen3_next_golden.py): Gated DeltaNet and gated attention layers, the shared expert,
 * partial RoPE, zero-centred norms; 77 tokens (past the delta rule's 64-token chunk). */
static void golden_qwen3_next_f32(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-next-f32");
}
static void golden_qwen3_next_bf16(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-next-bf16");
}
static void golden_qwen3_next_tied(void **s) {
    (void)s;
    check_golden("tests/models/qwen3-next-tied-f32");
}

/* The cuda backend has Qwen3-Next's ops: the architecture is no longer refused by name; without a GPU (or a build
 * without CUDA) the load fails for the backend alone, with a GPU it loads (tests/gpu/test_cuda_models.c runs it). */
static void qwen3_next_cuda_not_refused(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda";
    fm_model *m = NULL;
    fm_error err = {{0}};
    const fm_status st = fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err);
    if (st == FM_OK) {
        assert_non_null(m);
        fm_model_free(m);
    } else {
        assert_int_equal(st, FM_ERR_BACKEND);
        assert_null(m);
        assert_null(strstr(err.msg, "qwen3_next"));
    }
}

/* The quantized presets' CPU emulation on Qwen3-Next (int4, fp8, fp4; --dense w8a8 takes in_proj_qkvz, out_proj and
 * the attention and shared-expert projections to e4m3 per tensor, in_proj_ba and the conv stay at w_other): finite,
 * quantized (not the oracle's bits), near the oracle for a random 64-wide model (`fp8moe parity`: cosine 0.961-0.963,
 * 0.980-0.989 with --dense w8a8), the same bits at 1 and 3 threads. The bounds catch a broken path only. */
static void qwen3_next_presets(void **s) {
    (void)s;
    const char *dir = "tests/models/qwen3-next-f32";
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("tests/models/qwen3-next-f32/golden_ids.i32", &ids, &T, &err), FM_OK);
    int32_t V = 0;
    float *ref = run(dir, FM_PRESET_REF, 0, ids, T, &V);
    for (int dense = 0; dense < 2; dense++)
        for (int p = FM_PRESET_INT4; p <= FM_PRESET_FP4; p++) {
            fm_options opt;
            fm_options_init(&opt);
            opt.preset = (fm_preset)p, opt.dense = dense ? FM_DENSE_W8A8 : FM_DENSE_PRESET;
            float *x[2];
            for (int r = 0; r < 2; r++) {
                omp_set_num_threads(r ? 3 : 1);
                fm_model *m = NULL;
                assert_int_equal(fm_model_load(dir, &opt, &m, &err), FM_OK);
                fm_context *ctx = NULL;
                assert_int_equal(fm_context_create(m, NULL, &ctx, &err), FM_OK);
                x[r] = malloc((size_t)T * (size_t)V * sizeof(float));
                assert_int_equal(fm_context_logits(ctx, ids, T, x[r], &err), FM_OK);
                fm_context_free(ctx);
                fm_model_free(m);
            }
            omp_set_num_threads(omp_get_num_procs());
            fm_compare c;
            fm_logits_compare(ref, x[0], T, V, &c);
            printf("qwen3-next preset %-4s%s vs fp32: cosine %.5f argmax %.1f%%\n", fm_preset_name((fm_preset)p),
                   dense ? " --dense w8a8" : "", c.cosine, 100 * c.argmax_agree);
            assert_int_equal(c.n_nonfinite, 0);
            assert_true(c.cosine > 0.9 && c.cosine < 0.99999);
            assert_int_equal(fm_hash_f32(x[0], T * V), fm_hash_f32(x[1], T * V));
            free(x[0]), free(x[1]);
        }
    free(ref), free(ids);
}

/* The fused 3-D expert layout holds the same bf16 weights as the per-expert file: identical logits, bit for bit. */
static void fused_layout_equals_per_expert(void **s) {
    (void)s;
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("tests/models/qwen3-moe-bf16/golden_ids.i32", &ids, &T, &err), FM_OK);
    for (int p = 0; p < FM_PRESET_COUNT; p++) {
        int32_t V = 0;
        float *a = run("tests/models/qwen3-moe-bf16", (fm_preset)p, 0, ids, T, &V);
        float *b = run("tests/models/qwen3-moe-fused-bf16", (fm_preset)p, 0, ids, T, &V);
        assert_memory_equal(a, b, (size_t)T * (size_t)V * sizeof(float));
        free(a), free(b);
    }
    free(ids);
}

/* --route decode.fused=on (the MoE block's end as one op, moe_add_rmsnorm; the o projection with the add and norm,
 * linear_add_rmsnorm) and --route dense.quant=producer (paged attention and the o projection as one op,
 * attention_paged_o; the default, against its quantizer launch, dense.quant=kernel), alone and together, give every
 * preset's logits bit for bit: on the cpu backend each fused op is
 * its chain of reference ops; the Qwen3-MoE and Mixtral models' every MoE layer but the last takes the first */
static void decode_fused_route_same_logits(void **s) {
    (void)s;
    const char *dirs[] = {"tests/models/qwen3-moe-bf16", "tests/models/mixtral-f32-sharded"};
    const char *fused[] = {"decode.fused=on", "dense.quant=kernel", "dense.quant=producer",
                           "decode.fused=on,dense.quant=producer"};
    for (int d = 0; d < 2; d++) {
        char path[256];
        snprintf(path, sizeof path, "%s/golden_ids.i32", dirs[d]);
        int32_t *ids = NULL;
        int64_t T = 0;
        fm_error err = {{0}};
        assert_int_equal(fm_ids_read(path, &ids, &T, &err), FM_OK);
        for (int p = 0; p < FM_PRESET_COUNT; p++) {
            int32_t V = 0;
            run_routes = NULL;
            float *a = run(dirs[d], (fm_preset)p, 0, ids, T, &V);
            for (size_t f = 0; f < sizeof fused / sizeof fused[0]; f++) {
                run_routes = fused[f];
                float *b = run(dirs[d], (fm_preset)p, 0, ids, T, &V);
                assert_memory_equal(a, b, (size_t)T * (size_t)V * sizeof(float));
                free(b);
            }
            run_routes = NULL;
            free(a);
        }
        free(ids);
    }
}

/* Every preset gives the same bits whatever the thread count (each output is summed in a fixed order). */
static void deterministic_across_threads(void **s) {
    (void)s;
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("tests/models/qwen3-moe-tied-f32/golden_ids.i32", &ids, &T, &err), FM_OK);
    for (int p = 0; p < FM_PRESET_COUNT; p++) {
        int32_t V = 0;
        omp_set_num_threads(1);
        float *a = run("tests/models/qwen3-moe-tied-f32", (fm_preset)p, 0, ids, T, &V);
        omp_set_num_threads(3);
        float *b = run("tests/models/qwen3-moe-tied-f32", (fm_preset)p, 0, ids, T, &V);
        assert_int_equal(fm_hash_f32(a, T * V), fm_hash_f32(b, T * V));
        free(a), free(b);
    }
    omp_set_num_threads(omp_get_num_procs());
    free(ids);
}

/* --layers N: N = all is the full model; fewer layers give different, finite logits. */
static void layer_subset(void **s) {
    (void)s;
    const char *dir = "tests/models/qwen3-moe-f32";
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("tests/models/qwen3-moe-f32/golden_ids.i32", &ids, &T, &err), FM_OK);
    int32_t V = 0;
    float *full = run(dir, FM_PRESET_REF, 0, ids, T, &V);
    float *all = run(dir, FM_PRESET_REF, 3, ids, T, &V);
    float *one = run(dir, FM_PRESET_REF, 1, ids, T, &V);
    assert_memory_equal(full, all, (size_t)T * (size_t)V * sizeof(float));
    fm_compare c;
    fm_logits_compare(full, one, T, V, &c);
    assert_int_equal(c.n_nonfinite, 0);
    assert_true(c.max_abs_err > 1e-3);
    free(full), free(all), free(one), free(ids);

    fm_options opt;
    fm_options_init(&opt);
    opt.n_layers = 4;
    fm_model *m = NULL;
    assert_int_equal(fm_model_load(dir, &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
    assert_non_null(strstr(err.msg, "--layers 4"));
}

/* The quantized presets on the trained model stay close to the oracle (figures from `fp8moe parity`, 512 tokens:
 * cosine 0.992-0.994, argmax 88-90%); the bounds here only catch a broken path, not a small regression. */
static void presets_near_oracle(void **s) {
    (void)s;
    const char *dir = "models/tiny-code-moe";
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read("models/tiny-code-moe/eval_ids.i32", &ids, &T, &err), FM_OK);
    T = 129;
    int32_t V = 0;
    float *ref = run(dir, FM_PRESET_REF, 0, ids, T, &V);
    uint64_t hashes[FM_PRESET_COUNT] = {0};
    for (int p = FM_PRESET_INT4; p <= FM_PRESET_FP4; p++) {
        float *x = run(dir, (fm_preset)p, 0, ids, T, &V);
        fm_compare c;
        fm_logits_compare(ref, x, T, V, &c);
        printf("preset %-4s vs fp32: cosine %.5f argmax %.1f%% max|err| %.3g KL %.3g\n", fm_preset_name((fm_preset)p),
               c.cosine, 100 * c.argmax_agree, c.max_abs_err, c.mean_kl);
        assert_int_equal(c.n_nonfinite, 0);
        assert_true(c.cosine > 0.97);
        assert_true(c.argmax_agree > 0.75);
        assert_true(c.mean_kl < 0.2);
        assert_true(c.cosine < 0.99999); /* quantization must actually happen */
        hashes[p] = fm_hash_f32(x, T * V);
        free(x);
    }
    /* ref32 is the ref plan on the cpu: the same logits, bit for bit */
    float *r32 = run(dir, FM_PRESET_REF32, 0, ids, T, &V);
    assert_true(fm_hash_f32(r32, T * V) == fm_hash_f32(ref, T * V));
    free(r32);
    /* three different numerical paths: three different results */
    assert_true(hashes[FM_PRESET_INT4] != hashes[FM_PRESET_FP8]);
    assert_true(hashes[FM_PRESET_FP8] != hashes[FM_PRESET_FP4]);
    free(ref), free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_qwen3_f32),
        cmocka_unit_test(golden_qwen3_bf16),
        cmocka_unit_test(golden_qwen3_fused),
        cmocka_unit_test(golden_qwen3_tied),
        cmocka_unit_test(golden_mixtral_sharded),
        cmocka_unit_test(golden_qwen3_next_f32),
        cmocka_unit_test(golden_qwen3_next_bf16),
        cmocka_unit_test(golden_qwen3_next_tied),
        cmocka_unit_test(qwen3_next_cuda_not_refused),
        cmocka_unit_test(qwen3_next_presets),
        cmocka_unit_test(fused_layout_equals_per_expert),
        cmocka_unit_test(deterministic_across_threads),
        cmocka_unit_test(decode_fused_route_same_logits),
        cmocka_unit_test(layer_subset),
        cmocka_unit_test(presets_near_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
