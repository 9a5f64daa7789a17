/* The memory plan against the GPU (src/engine/memory_plan.h). For each bundled model, a synthetic
 * Qwen3-30B-A3B at full size, and the presets the CUDA backend runs (ref = bf16, int4, fp8 = int4-tc):
 *   - the bytes the CUDA backend reports for its banks (m->weight_bytes, and bank by bank per family) equal the
 *     plan's weights exactly: fm_bank_bytes_for and cuda_bank.cu agree;
 *   - the device's used memory (cudaMemGetInfo, through fm_cuda_free_memory) grows across the load by the
 *     plan's weights, activations and workspace (all allocated at load: a forward pass allocates nothing), within
 *     allocator rounding: at most 2 MiB per device allocation (bank values, int4 scales, buffers, scratch) plus
 *     what a bare backend takes (stream, cuBLAS handle: measured here), and at least the plan less a few 2 MiB
 *     pages the driver keeps mapped after cudaFree of small allocations and reuses;
 *   - a --vram-limit one byte below the plan's peak fails with FM_ERR_NOMEM naming --vram-limit, before
 *     anything is allocated: used memory is exactly what it was; a limit equal to the peak loads;
 *   - a rank of --ep 2 holds the rank's plan (fm_memory_plan_rank) and is checked against the rank's peak.
 * Runs only where a GPU is present (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "gpu_test_util.h"

#define MiB ((size_t)1 << 20)
#define ROUNDING (2 * MiB)     /* the driver maps device memory in 2 MiB pages: at most this much per allocation */
#define REUSED_SMALL (8 * MiB) /* pages of freed small allocations the driver may keep mapped and hand out again */

static size_t used_now(void) {
    size_t free_bytes = 0, total = 0;
    fm_error err = {{0}};
    if (fm_cuda_free_memory(&free_bytes, &total, &err)) fail_msg("%s", err.msg);
    return total - free_bytes;
}

typedef struct source {
    const char *dir;       /* a checkpoint, or */
    const char *synthetic; /* a synthetic model's name */
} source;

static fm_status load(const source *src, const fm_options *opt, fm_model **m, fm_error *err) {
    return src->dir ? fm_model_load(src->dir, opt, m, err) : fm_model_load_synthetic(src->synthetic, 0, opt, m, err);
}

static const char *name_of(const source *src) { return src->dir ? src->dir : src->synthetic; }

/* the plan model.c checks: the loaded layers, lm_head as bound, FM_DEFAULT_MAX_TOKENS tokens */
static void plan_of(const fm_model *m, fm_memory_plan *p) {
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = m->lm_head == m->embed;
    fm_error err = {{0}};
    if (fm_memory_plan_compute(&cfg, &m->plan, "cuda", m->n_layers, FM_DEFAULT_MAX_TOKENS, p, &err))
        fail_msg("plan: %s", err.msg);
}

static void add(const fm_model *m, const fm_bank *b, fm_mem_family f, size_t *bytes) {
    if (b) bytes[f] += m->be->ops->bank_bytes(b);
}

/* the CUDA backend's bytes per family, bank by bank */
static void loaded_bytes(const fm_model *m, size_t bytes[FM_MEM_FAMILY_COUNT]) {
    memset(bytes, 0, FM_MEM_FAMILY_COUNT * sizeof *bytes);
    add(m, m->embed, FM_MEM_EMBED, bytes);
    if (m->lm_head != m->embed) add(m, m->lm_head, FM_MEM_LM_HEAD, bytes);
    add(m, m->final_norm, FM_MEM_NORMS, bytes);
    for (int l = 0; l < m->n_layers; l++) {
        const fm_layer_weights *L = &m->layers[l];
        add(m, L->attn_norm, FM_MEM_NORMS, bytes), add(m, L->ffn_norm, FM_MEM_NORMS, bytes);
        add(m, L->q_norm, FM_MEM_NORMS, bytes), add(m, L->k_norm, FM_MEM_NORMS, bytes);
        add(m, L->qkv, FM_MEM_ATTN, bytes), add(m, L->o, FM_MEM_ATTN, bytes);
        add(m, L->router, FM_MEM_ROUTER, bytes);
        add(m, L->gate_up, L->is_moe ? FM_MEM_EXPERTS : FM_MEM_DENSE_MLP, bytes);
        add(m, L->down, L->is_moe ? FM_MEM_EXPERTS : FM_MEM_DENSE_MLP, bytes);
    }
}

/* device memory a bare backend of this plan takes (stream, cuBLAS handle and its workspace) */
static size_t backend_overhead(fm_preset p) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    const size_t before = used_now();
    fm_backend *be = NULL;
    fm_error err = {{0}};
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &be, &err)) fail_msg("backend: %s", err.msg);
    const size_t after = used_now();
    be->ops->destroy(be);
    return after > before ? after - before : 0;
}

/* presets[i] with dense[i], for each of n plans */
static void check_plans(const source *src, bool warm_up, const fm_preset *presets, const fm_dense *dense, int n) {
    for (int i = 0; i < n; i++) {
        fm_options opt;
        fm_options_init(&opt);
        opt.routes = gpu_test_routes();
        opt.backend = "cuda", opt.preset = presets[i];
        opt.dense = dense[i];
        fm_model *m = NULL;
        fm_error err = {{0}};
        if (warm_up) { /* CUDA context, cuBLAS, the conversion kernels' modules: not the model's memory */
            if (load(src, &opt, &m, &err)) fail_msg("load %s: %s", name_of(src), err.msg);
            fm_model_free(m);
        }
        const size_t overhead = backend_overhead(presets[i]);
        const size_t before = used_now();
        const fm_status st = load(src, &opt, &m, &err);
        if (st == FM_ERR_NOMEM && !src->dir) { /* a full-size model on a smaller card (ref32: 114 GiB, an H200's) */
            printf("%s %s: skipped on this GPU: %s\n", name_of(src), fm_preset_name(presets[i]), err.msg);
            continue;
        }
        if (st) fail_msg("load %s: %s", name_of(src), err.msg);
        const size_t after = used_now();
        fm_memory_plan plan;
        plan_of(m, &plan);
        size_t got[FM_MEM_FAMILY_COUNT];
        loaded_bytes(m, got);
        for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++)
            if (got[f] != plan.weights[f])
                fail_msg("%s %s: the cuda backend holds %zu bytes of %s, the plan says %zu", name_of(src),
                         fm_preset_name(presets[i]), got[f], fm_mem_family_name((fm_mem_family)f), plan.weights[f]);
        assert_int_equal(m->weight_bytes, plan.weight_total);

        /* the load allocates the weights and, once, the forward pass's activations for max_tokens (12 buffers) and
           the whole workspace: the ops' scratch and cuBLAS's workspace (2 allocations, reserved after the banks) and,
           with --dense w8a8, cuBLASLt's (with the first e4m3-tensor bank) */
        const size_t resident = plan.weight_total + plan.activations + plan.workspace;
        const long long delta = (long long)after - (long long)before;
        const size_t slack = (size_t)(plan.n_weight_allocs + 12 + 3) * ROUNDING + overhead + ROUNDING;
        printf("%-32s %-4s weights + activations + workspace %12zu (plan) | device used +%lld (%+.2f MiB vs plan; bare "
               "backend "
               "%.2f MiB, %d allocations, slack %.1f MiB)\n",
               name_of(src), fm_preset_name(presets[i]), resident, delta,
               ((double)delta - (double)resident) / (double)MiB, (double)overhead / (double)MiB,
               plan.n_weight_allocs + 15, (double)slack / (double)MiB);
        if (delta + (long long)REUSED_SMALL < (long long)resident)
            fail_msg("%s %s: device memory grew by %lld bytes, less than the plan's %zu bytes of weights, activations "
                     "and workspace",
                     name_of(src), fm_preset_name(presets[i]), delta, resident);
        if (delta > (long long)(resident + slack))
            fail_msg("%s %s: device memory grew by %lld bytes, more than the plan's %zu bytes of weights, activations "
                     "and workspace "
                     "+ %zu of rounding and backend",
                     name_of(src), fm_preset_name(presets[i]), delta, resident, slack);
        fm_model_free(m);

        /* a limit one byte short: refused before anything is allocated */
        opt.vram_limit = (int64_t)plan.peak - 1;
        const size_t before_2 = used_now();
        const fm_status st2 = load(src, &opt, &m, &err);
        const size_t after_2 = used_now();
        if (st2 != FM_ERR_NOMEM)
            fail_msg("%s: --vram-limit %lld gave %s: %s", name_of(src), (long long)opt.vram_limit, fm_status_name(st2),
                     err.msg);
        assert_null(m);
        assert_non_null(strstr(err.msg, "--vram-limit"));
        if (after_2 != before_2)
            fail_msg("%s: a refused load changed device memory by %lld bytes", name_of(src),
                     (long long)after_2 - (long long)before_2);
        /* exactly enough: loads */
        opt.vram_limit = (int64_t)plan.peak;
        if (load(src, &opt, &m, &err))
            fail_msg("%s: --vram-limit = the plan's peak %zu: %s", name_of(src), plan.peak, err.msg);
        fm_model_free(m);
    }
}

/* --ep 2 on cuda: each rank's banks are the rank's plan (fm_memory_plan_rank: its experts only), and the load checks
 * the rank's peak (its experts, exchange buffers and received-block scratch), not the whole model's: a limit one byte
 * short of it is refused before anything is allocated, a limit equal to it loads */
static void ep_ranks_on_cuda(void **s) {
    (void)s;
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_FP8};
    for (int i = 0; i < 2; i++)
        for (int32_t r = 0; r < 2; r++) {
            fm_options opt;
            fm_options_init(&opt);
            opt.routes = gpu_test_routes();
            opt.backend = "cuda", opt.preset = presets[i], opt.ep_ranks = 2, opt.ep_rank = r;
            fm_model *m = NULL;
            fm_error err = {{0}};
            if (fm_model_load("models/tiny-code-moe", &opt, &m, &err)) fail_msg("load rank %d: %s", r, err.msg);
            fm_memory_plan plan, whole;
            plan_of(m, &plan);
            whole = plan;
            fm_config cfg = m->cfg;
            cfg.tie_word_embeddings = m->lm_head == m->embed;
            if (fm_memory_plan_rank(&plan, &cfg, &m->plan, 2, 1, r, &err)) fail_msg("rank plan: %s", err.msg);
            size_t got[FM_MEM_FAMILY_COUNT];
            loaded_bytes(m, got);
            for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++)
                if (got[f] != plan.weights[f])
                    fail_msg("--ep 2 rank %d %s: the cuda backend holds %zu bytes of %s, the rank's plan says %zu", r,
                             fm_preset_name(presets[i]), got[f], fm_mem_family_name((fm_mem_family)f), plan.weights[f]);
            assert_int_equal(plan.weights[FM_MEM_EXPERTS] * 2, whole.weights[FM_MEM_EXPERTS]);
            fm_model_free(m);
            opt.vram_limit = (int64_t)plan.peak - 1;
            const size_t before = used_now();
            const fm_status st = fm_model_load("models/tiny-code-moe", &opt, &m, &err);
            if (st != FM_ERR_NOMEM)
                fail_msg("--ep 2 rank %d: --vram-limit %lld gave %s: %s", r, (long long)opt.vram_limit,
                         fm_status_name(st), err.msg);
            assert_null(m);
            assert_int_equal(used_now(), before);
            opt.vram_limit = (int64_t)plan.peak;
            if (fm_model_load("models/tiny-code-moe", &opt, &m, &err))
                fail_msg("--ep 2 rank %d: --vram-limit = the rank's peak %zu: %s", r, plan.peak, err.msg);
            fm_model_free(m);
        }
}

static void check_source(const source *src, bool warm_up) {
    const fm_preset presets[] = {FM_PRESET_REF32, FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP8};
    const fm_dense dense[] = {FM_DENSE_PRESET, FM_DENSE_PRESET, FM_DENSE_PRESET, FM_DENSE_PRESET, FM_DENSE_W8A8};
    check_plans(src, warm_up, presets, dense, 5);
}

/* pre-quantized checkpoints: int4-zp (int4), int4-zp-tc (fp8), e4m3-block (fp8), act-order (int4 keeps an order) */
static void prequantized(void **s) {
    (void)s;
    const source awq = {"tests/data/quant/awq-g128", NULL}, blk = {"tests/data/quant/fp8-block-b48", NULL};
    const source act = {"tests/data/quant/gptq-v1-asym-actorder", NULL};
    check_source(&awq, true);
    const fm_preset fp8_only[] = {FM_PRESET_REF, FM_PRESET_FP8}, int4_only[] = {FM_PRESET_INT4};
    const fm_dense plain[] = {FM_DENSE_PRESET, FM_DENSE_PRESET};
    check_plans(&blk, false, fp8_only, plain, 2);
    check_plans(&act, false, int4_only, plain, 1);
}

/* fp4: the fp8 plan with the MXFP4 dispatch buffer (half the e4m3 one, w4a8_workspace.h) */
static void check_fp4(const source *src) {
    const fm_preset fp4[] = {FM_PRESET_FP4};
    const fm_dense plain[] = {FM_DENSE_PRESET};
    check_plans(src, false, fp4, plain, 1);
}

static void tiny_code_moe(void **s) {
    (void)s;
    const source src = {"models/tiny-code-moe", NULL};
    check_source(&src, true);
    check_fp4(&src);
}

static void qwen3_f32(void **s) {
    (void)s;
    const source src = {"tests/models/qwen3-moe-f32", NULL};
    check_source(&src, true);
    check_fp4(&src);
}

static void qwen3_tied_dense(void **s) { /* tied lm_head, a dense MLP layer */
    (void)s;
    const source src = {"tests/models/qwen3-moe-tied-f32", NULL};
    check_source(&src, true);
}

static void mixtral_sharded(void **s) {
    (void)s;
    const source src = {"tests/models/mixtral-f32-sharded", NULL};
    check_source(&src, true);
}

/* all 48 layers at real shapes: 61.1 GB in bf16, 16.7 GB in int4 (tests/test_memory_plan.c derives them by hand);
 * no warm-up load: the kernels are loaded by the tests above */
static void qwen3_30b_a3b_full(void **s) {
    (void)s;
    const source src = {NULL, "qwen3-30b-a3b"};
    check_source(&src, false);
}

/* the plan of the whole model against an 8 GiB card: refused by fm_model_load, nothing allocated */
static void qwen3_30b_a3b_on_8gib(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    opt.routes = gpu_test_routes();
    opt.backend = "cuda", opt.vram_limit = (int64_t)8 << 30;
    fm_model *m = NULL;
    fm_error err = {{0}};
    const size_t before = used_now();
    assert_int_equal(fm_model_load_synthetic("qwen3-30b-a3b", 0, &opt, &m, &err), FM_ERR_NOMEM);
    assert_int_equal(used_now(), before);
    assert_null(m);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "model needs"));
    assert_non_null(strstr(err.msg, "8.0 GiB is available (--vram-limit)"));
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_code_moe),      cmocka_unit_test(qwen3_f32),
        cmocka_unit_test(qwen3_tied_dense),   cmocka_unit_test(mixtral_sharded),
        cmocka_unit_test(qwen3_30b_a3b_full), cmocka_unit_test(qwen3_30b_a3b_on_8gib),
        cmocka_unit_test(prequantized),       cmocka_unit_test(ep_ranks_on_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
