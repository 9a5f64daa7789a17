/* The memory plan (src/engine/memory_plan.h), without a GPU: its weight bytes equal what the CPU backend holds
 * after a real load (bank for bank, family by family); its figures for a Qwen3-30B-A3B-shaped config on cuda
 * equal the ones derived by hand below; an 8 GiB card is refused with a clear message before anything is
 * allocated; `fp8moe inspect --tokens` prints the plan and every command parses --vram-limit (exit 2 on a bad
 * value). The CUDA backend's side (bank bytes, device memory) is tests/gpu/test_cuda_memory.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/routes.h"
#include "backend/w4a8_workspace.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "qwen3_config.h"
#include "io/config.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static const char *const models[] = {
    "models/tiny-code-moe",
    "tests/models/qwen3-moe-f32",
    "tests/models/qwen3-moe-bf16",
    "tests/models/qwen3-moe-tied-f32",
    "tests/models/qwen3-moe-fused-bf16",
    "tests/models/mixtral-f32-sharded",
};

/* ---- bank bytes per format ------------------------------------------------------------------------------ */

static void bank_bytes_formulas(void **s) {
    (void)s;
    /* cuda bf16: rows padded to 8 elements */
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_BF16, 1, 3, 10), 3 * 16 * 2);
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_BF16, 4, 5, 64), 4 * 5 * 64 * 2);
    /* cuda int4: rows padded to 32 elements = 16 bytes, plus bf16 scales per 128 columns (the last partial) */
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_INT4_G128, 2, 3, 130), 2 * 3 * 80 + 2 * 3 * 2 * 2);
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_INT4_G128, 1, 1, 1), 16 + 2);
    /* cuda int4-tc: rows padded to 32, K to 128 (half a byte each), bf16 scales [n][groups][rows_pad] */
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_INT4_G128_TC, 2, 3, 130), 2 * 32 * 256 / 2 + 2 * 2 * 32 * 2);
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_INT4_G128_TC, 128, 1536, 2048),
                     128 * 1536 * 1024 + 128 * 16 * 1536 * 2);
    /* cuda f32 (the ref32 oracle): rows padded to 4 elements */
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_F32, 2, 3, 130), 2 * 3 * 132 * 4);
    /* cpu: fp32 values whatever the format, int4 adds fp32 scales */
    assert_int_equal(fm_bank_bytes_for("cpu", FM_W_F32, 2, 3, 130), 2 * 3 * 130 * 4);
    assert_int_equal(fm_bank_bytes_for("cpu", FM_W_BF16, 2, 3, 130), 2 * 3 * 130 * 4);
    assert_int_equal(fm_bank_bytes_for("cpu", FM_W_INT4_G128, 2, 3, 130), 2 * 3 * 130 * 4 + 2 * 3 * 2 * 4);
    assert_int_equal(fm_bank_bytes_for("cpu", FM_W_INT4_G128_TC, 2, 3, 130), 2 * 3 * 130 * 4 + 2 * 3 * 2 * 4);
    assert_int_equal(fm_bank_bytes_for("tpu", FM_W_BF16, 1, 1, 1), 0);
    /* e4m3-block: cpu bytes + fp32 scale per (row, 128-group); cuda rows padded to 32, K to 128 */
    assert_int_equal(fm_bank_bytes_for("cpu", FM_W_E4M3_B128, 2, 3, 130), 2 * 3 * (130 + 2 * 4));
    assert_int_equal(fm_bank_bytes_for("cuda", FM_W_E4M3_B128, 2, 3, 130), 2 * 32 * 256 + 2 * 32 * 2 * 4);
    /* int4-zp: cpu codes K/2, zero byte + fp32 scale per (row, group), int32 order per act-order matrix */
    assert_int_equal(fm_bank_bytes_int4zp("cpu", false, 2, 3, 256, 64, true), 2 * 3 * (128 + 4 * 5) + 2 * 256 * 4);
    assert_int_equal(fm_bank_bytes_int4zp("cpu", true, 2, 3, 256, 256, false), 2 * 3 * (128 + 1 * 5));
    /* cuda, fp8 plans: rows padded to 32, two fp32 per (row, 128-group) whatever the checkpoint's group */
    assert_int_equal(fm_bank_bytes_int4zp("cuda", true, 2, 3, 256, 256, false), 2 * 32 * 128 + 2 * 32 * 2 * 8);
    /* cuda, int4 preset: K padded to 32, zero byte + fp32 scale per (row, group), order when act-order */
    assert_int_equal(fm_bank_bytes_int4zp("cuda", false, 1, 3, 48, 16, true), 3 * 64 / 2 + 3 * 3 * 5 + 48 * 4);
    assert_int_equal(fm_bank_bytes_int4zp("tpu", false, 1, 3, 48, 16, false), 0);
    assert_true(fm_bank_bytes_for("cuda", FM_W_BF16, 65536, INT64_C(1) << 40, INT64_C(1) << 30) == SIZE_MAX);
}

/* ---- the CPU backend holds what the plan says ------------------------------------------------------------ */

typedef struct fam_bytes {
    size_t bytes[FM_MEM_FAMILY_COUNT];
    int32_t n_banks;
} fam_bytes;

static void count(const fm_model *m, const fm_bank *b, fm_mem_family f, fam_bytes *out) {
    if (!b) return;
    out->bytes[f] += m->be->ops->bank_bytes(b);
    out->n_banks++;
}

/* the loaded model's banks, sorted into the plan's families */
static void loaded_bytes(const fm_model *m, fam_bytes *out) {
    memset(out, 0, sizeof *out);
    count(m, m->embed, FM_MEM_EMBED, out);
    if (m->lm_head != m->embed) count(m, m->lm_head, FM_MEM_LM_HEAD, out);
    count(m, m->final_norm, FM_MEM_NORMS, out);
    for (int l = 0; l < m->n_layers; l++) {
        const fm_layer_weights *L = &m->layers[l];
        count(m, L->attn_norm, FM_MEM_NORMS, out), count(m, L->ffn_norm, FM_MEM_NORMS, out);
        count(m, L->q_norm, FM_MEM_NORMS, out), count(m, L->k_norm, FM_MEM_NORMS, out);
        count(m, L->qkv, FM_MEM_ATTN, out), count(m, L->o, FM_MEM_ATTN, out);
        count(m, L->router, FM_MEM_ROUTER, out);
        count(m, L->gate_up, L->is_moe ? FM_MEM_EXPERTS : FM_MEM_DENSE_MLP, out);
        count(m, L->down, L->is_moe ? FM_MEM_EXPERTS : FM_MEM_DENSE_MLP, out);
    }
}

static void plan_of(const fm_model *m, const char *backend, int64_t T, fm_memory_plan *p) {
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = m->lm_head == m->embed;
    fm_error err = {{0}};
    fm_status st = fm_memory_plan_compute(&cfg, &m->plan, backend, m->n_layers, T, p, &err);
    if (st) fail_msg("plan: %s", err.msg);
}

/* m's plan on the cpu at T tokens (*plan) holds, family by family and in total, the bytes m's banks hold; *got: those
   banks (what: the case, for the message) */
static void expect_plan_holds(const fm_model *m, int64_t T, const char *what, fm_memory_plan *plan, fam_bytes *got) {
    plan_of(m, "cpu", T, plan);
    loaded_bytes(m, got);
    for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++)
        if (got->bytes[f] != plan->weights[f])
            fail_msg("%s: %s holds %zu bytes, the plan says %zu", what, fm_mem_family_name((fm_mem_family)f),
                     got->bytes[f], plan->weights[f]);
    assert_int_equal(m->weight_bytes, plan->weight_total);
}

static void cpu_weights_equal_plan(void **s) {
    (void)s;
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4};
    const char *plan_backends[] = {"cpu", "cuda"}; /* cuda: the CPU emulating the GPU's formats (bf16, int4) */
    const int32_t layers[] = {0, 1};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        for (int p = 0; p < 2; p++)
            for (int b = 0; b < 2; b++)
                for (int l = 0; l < 2; l++) {
                    fm_options opt;
                    fm_options_init(&opt);
                    opt.preset = presets[p], opt.plan_backend = plan_backends[b], opt.n_layers = layers[l];
                    fm_model *m = NULL;
                    fm_error err = {{0}};
                    if (fm_model_load(models[i], &opt, &m, &err)) fail_msg("load %s: %s", models[i], err.msg);
                    char what[200];
                    snprintf(what, sizeof what, "%s %s/%s layers %d", models[i], fm_preset_name(presets[p]),
                             plan_backends[b], layers[l]);
                    fm_memory_plan plan;
                    fam_bytes got;
                    expect_plan_holds(m, 37, what, &plan, &got);
                    assert_int_equal(got.n_banks, plan.n_banks);
                    assert_int_equal(plan.n_layers, m->n_layers);
                    assert_true(plan.activations > 0 &&
                                plan.total == plan.weight_total + plan.activations + plan.workspace);
                    fm_model_free(m);
                }
}

/* --lm-head dense: the lm_head a bank of the dense projections' format (a quantized copy where tied to the
 * embeddings), the plan counting what the load holds, on the cpu and emulating the GPU's formats; a pre-quantized
 * checkpoint's float lm_head quantized as well; refused by the ref preset, whose dense projections are float */
static void lm_head_dense_equals_plan(void **s) {
    (void)s;
    static const struct {
        const char *dir;
        fm_preset preset;
        const char *plan_backend;
        fm_dense dense;
    } cases[] = {{"models/tiny-code-moe", FM_PRESET_FP8, "cpu", FM_DENSE_PRESET},
                 {"models/tiny-code-moe", FM_PRESET_FP8, "cuda", FM_DENSE_W8A8},
                 {"tests/models/qwen3-moe-tied-f32", FM_PRESET_INT4, "cuda", FM_DENSE_PRESET},
                 {"tests/models/qwen3-moe-tied-f32", FM_PRESET_REF, "cpu", FM_DENSE_W8A8},
                 {"tests/data/quant/awq-g128", FM_PRESET_FP8, "cpu", FM_DENSE_PRESET}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fm_options opt;
        fm_options_init(&opt);
        opt.preset = cases[i].preset, opt.plan_backend = cases[i].plan_backend, opt.dense = cases[i].dense;
        opt.lm_head = FM_LM_HEAD_DENSE;
        fm_model *m = NULL;
        fm_error err = {{0}};
        if (fm_model_load(cases[i].dir, &opt, &m, &err)) fail_msg("load %s: %s", cases[i].dir, err.msg);
        assert_true(m->lm_head != m->embed);
        assert_int_equal(m->lm_head->fmt, m->plan.w_dense);
        assert_int_not_equal(m->lm_head->fmt, m->plan.w_other);
        char what[200];
        snprintf(what, sizeof what, "%s --lm-head dense", cases[i].dir);
        fm_memory_plan plan;
        fam_bytes got;
        expect_plan_holds(m, 31, what, &plan, &got);
        assert_int_equal(plan.formats[FM_MEM_LM_HEAD], m->lm_head->fmt);
        fm_model_free(m);
    }
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = FM_PRESET_REF, opt.lm_head = FM_LM_HEAD_DENSE;
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
    assert_non_null(strstr(err.msg, "--lm-head dense"));
    fm_lm_head h = FM_LM_HEAD_FLOAT;
    assert_true(fm_lm_head_parse("dense", &h) && h == FM_LM_HEAD_DENSE);
    assert_true(fm_lm_head_parse("float", &h) && h == FM_LM_HEAD_FLOAT);
    assert_false(fm_lm_head_parse("int4", &h));
    assert_string_equal(fm_lm_head_name(FM_LM_HEAD_DENSE), "dense");
}

/* Pre-quantized checkpoints (tests/data/quant): the plan counts the int4-zp and e4m3-block banks the CPU holds, under
 * the fp8 preset (both) and the int4 preset (int4 only; block-FP8 is refused there). Their cuda layouts are checked
 * by formula in bank_bytes_formulas, and against the device in tests/gpu/test_cuda_memory.c. */
static void prequant_weights_equal_plan(void **s) {
    (void)s;
    static const struct {
        const char *dir;
        fm_preset preset;
    } cases[] = {
        {"tests/data/quant/gptq-v1-sym-g128", FM_PRESET_FP8},
        {"tests/data/quant/awq-g128", FM_PRESET_FP8},
        {"tests/data/quant/awq-g128", FM_PRESET_INT4},
        {"tests/data/quant/gptq-v2-asym-channel-k128", FM_PRESET_FP8},
        {"tests/data/quant/fp8-block-b128", FM_PRESET_FP8},
        {"tests/data/quant/fp8-block-b48", FM_PRESET_FP8},
        {"tests/data/quant/gptq-v1-sym", FM_PRESET_INT4},
        {"tests/data/quant/gptq-v1-asym-actorder", FM_PRESET_INT4},
        {"tests/data/quant/gptq-v1-sym-g128", FM_PRESET_INT4}}; /* act-order: an order per matrix, identity or not */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fm_options opt;
        fm_options_init(&opt);
        opt.preset = cases[i].preset;
        fm_model *m = NULL;
        fm_error err = {{0}};
        if (fm_model_load(cases[i].dir, &opt, &m, &err)) fail_msg("load %s: %s", cases[i].dir, err.msg);
        char what[200];
        snprintf(what, sizeof what, "%s %s", cases[i].dir, fm_preset_name(cases[i].preset));
        fm_memory_plan plan;
        fam_bytes got;
        expect_plan_holds(m, 29, what, &plan, &got);
        /* the formats the plan reports (inspect prints them) are the ones the load picked */
        assert_int_equal(plan.formats[FM_MEM_ATTN], m->layers[0].qkv->fmt);
        assert_int_equal(plan.formats[FM_MEM_EXPERTS], m->layers[0].gate_up->fmt);
        fm_model_free(m);
    }
}

/* tiny-code-moe on cuda at 2048 tokens, by hand: H 192, vocab 4096, 4 + 2x2 heads of 48, 16 experts top-4 of width
 * 128 (intermediate_size 512 sizes the dense gate_up buffer), 4 layers, untied */
static void tiny_code_moe_cuda_by_hand(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    assert_int_equal(fm_config_load("models/tiny-code-moe", &cfg, &err), FM_OK);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cuda", &plan);
    fm_memory_plan p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 2048, &p, &err), FM_OK);
    assert_int_equal(p.weights[FM_MEM_EMBED], 4096 * 192 * 2);
    assert_int_equal(p.weights[FM_MEM_LM_HEAD], 4096 * 192 * 2);
    assert_int_equal(p.weights[FM_MEM_NORMS], 192 * 2 + 4 * (2 * 192 + 2 * 48) * 2);
    assert_int_equal(p.weights[FM_MEM_ATTN], 4 * (384 * 192 + 192 * 192) * 2);
    assert_int_equal(p.weights[FM_MEM_ROUTER], 4 * 16 * 192 * 2);
    assert_int_equal(p.weights[FM_MEM_EXPERTS], 4 * 16 * (256 * 192 + 192 * 128) * 2);
    assert_int_equal(p.weights[FM_MEM_DENSE_MLP], 0);
    assert_int_equal(p.weight_total, 13496448); /* = the bf16 checkpoint's bytes: every width is a multiple of 8 */
    const size_t act = 2048 * 4 + 3 * 2048 * 192 * 2 + 2048 * 384 * 2 + 2048 * 192 * 2 + 2048 * 1024 * 2 +
                       2048 * 512 * 2 + 2048 * 16 * 2 + 2048 * 4 * 4 + 2048 * 4 * 2 + 2048 * 4096 * 2 + 2048 * 256 +
                       2 * 2048 * 4; /* the normed rows quantized (fm_qrows: 256 columns, 2 groups) */
    assert_int_equal(p.activations, act);
    /* the grouped cuBLAS MoE (moe_grouped_workspace.h): 8192 pairs over 16 experts average 512 rows, so 128-row
       tiles, at most 8192 / 128 + 16 = 80 of them (10,240 rows); int32 counts|fill|segment rows 3 x 16 + slot_of
       8192 (-> 256-byte multiple 33,024), 6 x 80 pointers (-> 3,840), then xs, gu, h, y: 10,240 rows x
       (2 x 192 + 3 x 128) bf16; cuBLAS's 32 MiB workspace; no logits staging */
    assert_int_equal(p.ws_moe, 33024 + 3840 + 10240 * (2 * 192 + 3 * 128) * 2);
    assert_int_equal(p.ws_libs, 32 << 20);
    assert_int_equal(p.total, 13496448 + act + p.ws_moe + p.ws_libs);
    assert_int_equal(p.load_staging, 64 << 20);
    assert_int_equal(p.peak, p.total);
    printf("tiny-code-moe cuda ref T=2048: weights %zu, activations %zu, workspace %zu, total %zu bytes\n",
           p.weight_total, p.activations, p.workspace, p.total);
}

/* ---- Qwen3-30B-A3B on cuda ------------------------------------------------------------------------------- */

static void qwen3_30b_plan(fm_preset preset, int64_t T, fm_memory_plan *p) {
    fm_config cfg;
    fm_error err = {{0}};
    qwen3_30b_config(&cfg);
    fm_plan plan;
    fm_plan_for_backend(preset, "cuda", &plan);
    if (fm_memory_plan_compute(&cfg, &plan, "cuda", 0, T, p, &err)) fail_msg("%s", err.msg);
}

/* By hand (H 2048, V 151936, L 48, q|k|v rows (32 + 2 x 4) x 128 = 5120, o [2048, 4096], E 128, I 768; every
 * width a multiple of 32, so no padding; int4 = K/2 bytes + 2 bytes per 128 of K per row):
 *   bf16  embed = lm_head   151936 x 2048 x 2                    =    622,329,856 each
 *         norms             48 x (2 x 2048 + 2 x 128) x 2 + 4096 =        421,888
 *         attention         48 x (5120 x 2048 + 2048 x 4096) x 2 =  1,811,939,328
 *         router            48 x 128 x 2048 x 2                  =     25,165,824
 *         experts           48 x 128 x (1536 x 2048 + 2048 x 768) x 2 = 57,982,058,496
 *         total                                                  = 61,064,245,248  (61.1 GB, 56.9 GiB)
 *   int4  attention         48 x (5120 x (1024 + 32) + 2048 x (2048 + 64))   =    467,140,608
 *         experts           48 x 128 x (1536 x (1024 + 32) + 2048 x (384 + 12)) = 14,948,499,456
 *         + embed, lm_head, norms, router in bf16 as above       -> total 16,685,887,488  (16.7 GB, 15.5 GiB)
 *   activations at T = 2048 (bf16; gate_up/swiglu sized by intermediate_size 6144, as forward.c does):
 *         ids 8,192 + 3 x [T, H] 25,165,824 + qkv 20,971,520 + attention out 16,777,216 + gate_up 50,331,648
 *         + swiglu 25,165,824 + router logits 524,288 + expert ids 65,536 + weights 32,768 + logits 622,329,856
 *         = 761,372,672
 *   workspace: MoE scratch, int4 (per token) 2048 x 8 x (3 x 768 + 2048) x 2 = 142,606,336, bf16 (grouped
 *         cuBLAS: 16384 pairs over 128 experts, 128-row tiles, at most 128 + 128 = 256 tiles, 32,768 rows)
 *         67,072 ints + 12,288 pointers + 32768 x (2 x 2048 + 3 x 768) x 2 = 419,509,760; cuBLAS's workspace
 *         33,554,432; no logits staging (widened on the host)
 *   ref32 (the fp32 oracle): every weight twice the bf16 bytes (122 GB), activations fp32 but for the int32 ids
 *         and expert ids (2 x 761,372,672 - 8,192 - 65,536 = 1,522,671,616), MoE scratch 67,072 + 12,288 +
 *         32768 x 6400 x 4 = 838,940,160
 * So the bf16 plan is about 61 GB of weights (62.3 GB with T = 2048), int4 16-17 GB (17.6 GB with T = 2048). */
static void qwen3_30b_a3b_on_cuda(void **s) {
    (void)s;
    fm_memory_plan bf, i4;
    qwen3_30b_plan(FM_PRESET_REF, 2048, &bf);
    qwen3_30b_plan(FM_PRESET_INT4, 2048, &i4);
    assert_int_equal(bf.n_layers, 48);
    assert_int_equal(bf.weights[FM_MEM_EMBED], 622329856);
    assert_int_equal(bf.weights[FM_MEM_LM_HEAD], 622329856);
    assert_int_equal(bf.weights[FM_MEM_NORMS], 421888);
    assert_int_equal(bf.weights[FM_MEM_ATTN], 1811939328);
    assert_int_equal(bf.weights[FM_MEM_ROUTER], 25165824);
    assert_int_equal(bf.weights[FM_MEM_EXPERTS], INT64_C(57982058496));
    assert_int_equal(bf.weights[FM_MEM_DENSE_MLP], 0);
    assert_int_equal(bf.weight_total, INT64_C(61064245248));
    assert_true(bf.weight_total > 60e9 && bf.weight_total < 62e9);
    assert_int_equal(i4.weights[FM_MEM_ATTN], 467140608);
    assert_int_equal(i4.weights[FM_MEM_EXPERTS], INT64_C(14948499456));
    assert_int_equal(
        i4.weights[FM_MEM_EMBED] + i4.weights[FM_MEM_LM_HEAD] + i4.weights[FM_MEM_NORMS] + i4.weights[FM_MEM_ROUTER],
        bf.weights[FM_MEM_EMBED] + bf.weights[FM_MEM_LM_HEAD] + bf.weights[FM_MEM_NORMS] + bf.weights[FM_MEM_ROUTER]);
    assert_int_equal(i4.weight_total, INT64_C(16685887488));
    assert_true(i4.weight_total > 16e9 && i4.weight_total < 17e9);
    for (int i = 0; i < 2; i++) {
        const fm_memory_plan *p = i ? &i4 : &bf;
        const int64_t ws_moe = i ? 142606336 : 419509760;
        assert_int_equal(p->activations, 761372672 + 2048 * 2048 + 16 * 2048 * 4); /* + the normed rows quantized */
        assert_int_equal(p->ws_moe, ws_moe);
        assert_int_equal(p->ws_libs, 33554432);
        assert_int_equal(p->workspace, 33554432 + ws_moe);
        assert_int_equal(p->total,
                         p->weight_total + INT64_C(761372672) + 2048 * 2048 + 16 * 2048 * 4 + 33554432 + ws_moe);
        assert_int_equal(p->peak, p->total);
        printf("qwen3-30b-a3b cuda %s T=2048: weights %zu (%.2f GiB), activations %zu, workspace %zu, total %zu (%.2f "
               "GiB)\n",
               i ? "int4" : "ref(bf16)", p->weight_total, (double)p->weight_total / GiB, p->activations, p->workspace,
               p->total, (double)p->total / GiB);
    }
    fm_memory_plan r32;
    qwen3_30b_plan(FM_PRESET_REF32, 2048, &r32);
    assert_int_equal(r32.weight_total, 2 * bf.weight_total);
    assert_int_equal(r32.activations, INT64_C(1522671616) + 2048 * 2048 + 16 * 2048 * 4);
    assert_int_equal(r32.ws_moe, 838940160);
    assert_int_equal(r32.ws_libs, 33554432);
    printf("qwen3-30b-a3b cuda ref32 T=2048: weights %zu (%.2f GiB), total %zu (%.2f GiB)\n", r32.weight_total,
           (double)r32.weight_total / GiB, r32.total, (double)r32.total / GiB);
    /* the activations grow linearly with T; the weights and the libraries' workspaces do not */
    fm_memory_plan bf1;
    qwen3_30b_plan(FM_PRESET_REF, 1, &bf1);
    assert_int_equal(bf1.weight_total, bf.weight_total);
    assert_int_equal(bf.activations, 2048 * bf1.activations);
    assert_int_equal(bf.ws_libs, bf1.ws_libs);
    /* T = 1 (a decode step): 8 pairs, 16-row tiles, never more tiles than pairs: 8 tiles, 128 rows */
    assert_int_equal(bf1.ws_moe,
                     1792 /* 3 x 512 + 32 ints, 256-aligned */ + 512 /* 6 x 8 pointers, aligned */ + 128 * 6400 * 2);
}

/* The fp8 preset by hand: the same int4 codes in the tensor-core layout (every width here is a multiple of 32 rows
 * and 128 columns, so no padding: the weights equal int4's), and the W4A8 scratch of w4a8_workspace.h at T = 2048,
 * P = 16384 routed pairs: counts, cursor, segment starts 3 x 512 + tile count 256 + tiles (16384 / 32 + 128) x 16
 * = 10,240 (32-row tiles: 128 rows per expert) + pair of slot and slot of pair 2 x 65,536 + e4m3 input 16384 x 2048 =
 * 33,554,432 + its scales and group sums (the int4-zp banks' term) 2 x 16 x 16384 x 4 = 2,097,152 + SwiGLU output 16384
 * x 768 = 12,582,912 + its scales and group sums 2 x 6 x 16384 x 4 = 786,432 + expert rows 16384 x 2048 x 2 =
 * 67,108,864 + the decode GEMVs' bf16 SwiGLU output for 64 pairs at most, 64 x 768 x 2 = 98,304: 116,371,200, more than
 * the dense W4A8 scratch (2048 x 4096
 * + 2 x 32 x 2048 x 4 = 8,912,896). */
static void qwen3_30b_a3b_fp8_on_cuda(void **s) {
    (void)s;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    assert_int_equal(plan.w_dense, FM_W_INT4_G128_TC);
    assert_int_equal(plan.w_expert, FM_W_INT4_G128_TC);
    assert_int_equal(plan.a_dispatch, FM_A_E4M3_G128);
    fm_memory_plan f8, i4;
    qwen3_30b_plan(FM_PRESET_FP8, 2048, &f8);
    qwen3_30b_plan(FM_PRESET_INT4, 2048, &i4);
    assert_int_equal(f8.weights[FM_MEM_ATTN], 467140608);
    assert_int_equal(f8.weights[FM_MEM_EXPERTS], INT64_C(14948499456));
    assert_int_equal(f8.weight_total, i4.weight_total);
    assert_int_equal(f8.ws_moe, 116371200);
    assert_int_equal(f8.workspace, 116371200 + 33554432); /* and cuBLAS's workspace (the router, lm_head) */
}

/* Route w4a8.kernel=fold: the expert banks' exponents and row scales beside their codes (cuda_bank_fold.cu: a byte
 * per padded row and 128-group, 4 bytes per padded row): 48 x 128 x (1536 x (16 + 4) + 2048 x (6 + 4)) =
 * 314,572,800; and at T = 2048 (P = 128 E: the warp-specialised GEMMs, w4a8.fold_ws) h in bf16 for every pair */
static void qwen3_30b_a3b_fold_on_cuda(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    qwen3_30b_config(&cfg);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_routes r;
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=fold", &err), FM_OK);
    fm_memory_plan f8, fold;
    qwen3_30b_plan(FM_PRESET_FP8, 2048, &f8);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &r, 0, 2048, &fold, &err), FM_OK);
    assert_int_equal(f8.ws_tables, 0);
    assert_int_equal(fold.ws_tables, INT64_C(314572800));
    const uint64_t bn = fm_routes_w4a8_tile_rows(&r, 16384, 128);
    assert_int_equal(fold.ws_moe, fm_w4a8_moe_layout(2048, 8, 128, 2048, 768, bn, FM_W4A8_DISPATCH_E4M3, true).total);
    assert_true(fold.ws_moe > f8.ws_moe); /* h16 for 16,384 pairs: 25,165,824 bytes */
    assert_int_equal(fold.workspace, fold.ws_moe + fold.ws_libs + fold.ws_tables);
    assert_int_equal(fold.weight_total, f8.weight_total); /* the codes: the same bytes */
    /* at T = 128 (P = 8 E) the fold GEMM: h16 only for the GEMVs' pairs, as the default route's */
    fm_memory_plan f8s, folds;
    qwen3_30b_plan(FM_PRESET_FP8, 128, &f8s);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &r, 0, 128, &folds, &err), FM_OK);
    assert_int_equal(folds.ws_moe, f8s.ws_moe);
}

/* An 8 GiB card: the bf16 and the int4 plan are both refused, before anything is allocated, by one line that says
 * how much is needed, of what, and what is available. */
static void vram_limit_refuses_8gib(void **s) {
    (void)s;
    const size_t limit = (size_t)8 << 30;
    fm_memory_plan bf, i4;
    qwen3_30b_plan(FM_PRESET_REF, 2048, &bf);
    qwen3_30b_plan(FM_PRESET_INT4, 2048, &i4);
    fm_error err = {{0}};
    assert_int_equal(fm_memory_plan_check(&bf, limit, "--vram-limit", &err), FM_ERR_NOMEM);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "model needs 58.0 GiB on cuda (weights 56.9 GiB"));
    assert_non_null(strstr(err.msg, "for 2048 tokens) but 8.0 GiB is available (--vram-limit)"));
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(fm_memory_plan_check(&i4, limit, "--vram-limit", &err), FM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "model needs 16.4 GiB"));
    /* a 24 GiB card takes the int4 model, not the bf16 one; the boundary is exact */
    assert_int_equal(fm_memory_plan_check(&i4, (size_t)24 << 30, "free on the GPU", &err), FM_OK);
    assert_int_equal(fm_memory_plan_check(&bf, (size_t)24 << 30, "free on the GPU", &err), FM_ERR_NOMEM);
    assert_int_equal(fm_memory_plan_check(&bf, bf.peak, "x", &err), FM_OK);
    assert_int_equal(fm_memory_plan_check(&bf, bf.peak - 1, "x", &err), FM_ERR_NOMEM);
    /* two figures that print alike get their exact bytes */
    assert_non_null(strstr(err.msg, "bytes)"));
}

/* fm_model_load on cuda with a tiny --vram-limit: refused by the plan (GPU here) or by the missing GPU (CI);
 * either way nothing is returned. A negative limit is a usage error on any backend. */
static void load_refuses_before_allocating(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda";
    opt.vram_limit = 1 << 20;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load("models/tiny-code-moe", &opt, &m, &err);
    assert_null(m);
    if (st == FM_ERR_NOMEM) assert_non_null(strstr(err.msg, "--vram-limit"));
    else {
        assert_int_equal(st, FM_ERR_BACKEND);
        assert_non_null(strstr(err.msg, "cuda backend"));
    }
    fm_options_init(&opt);
    opt.vram_limit = -1;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--vram-limit"));
    fm_options_init(&opt);
    opt.max_tokens = -5;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
}

static void plan_argument_errors(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    assert_int_equal(fm_config_load("tests/models/qwen3-moe-f32", &cfg, &err), FM_OK);
    fm_plan ref_cpu, ref_cuda;
    fm_plan_for_backend(FM_PRESET_REF, "cpu", &ref_cpu);
    fm_plan_for_backend(FM_PRESET_REF, "cuda", &ref_cuda);
    fm_memory_plan p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 0, 0, &p, &err), FM_ERR_USAGE);
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "tpu", 0, 1, &p, &err), FM_ERR_USAGE);
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 4, 1, &p, &err), FM_ERR_USAGE);
    /* a format no backend stores */
    fm_plan bad = ref_cuda;
    bad.w_expert = (fm_wformat)99;
    assert_int_equal(fm_memory_plan_compute(&cfg, &bad, "cuda", 0, 1, &p, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "not available"));
    /* the fp32 plan on the GPU is the ref32 oracle's: twice the bf16 weights (these widths need no padding) */
    fm_memory_plan f32, b16;
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cpu, "cuda", 0, 1, &f32, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 0, 1, &b16, &err), FM_OK);
    assert_int_equal(f32.weight_total, 2 * b16.weight_total);
    /* tokens so many that the sizes overflow */
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 0, INT64_MAX / 4, &p, &err), FM_ERR_FORMAT);
    /* fewer layers: fewer weights, the same activations */
    fm_memory_plan all, one;
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 0, 16, &all, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute(&cfg, &ref_cuda, "cuda", 1, 16, &one, &err), FM_OK);
    assert_true(one.weight_total < all.weight_total);
    assert_int_equal(one.activations, all.activations);
}

/* ---- the command line ------------------------------------------------------------------------------------ */

/* Generation's terms: the KV cache by hand for Qwen3-30B-A3B (48 layers, 4 KV heads of 128, bf16 on cuda):
 * 64 sequences of 2048 tokens = 128 blocks of 16 each, 2 x 48 x 64 x 2048 x 4 x 128 x 2 = 12,884,901,888 bytes;
 * a context of 2050 rounds up to 129 blocks. The plan refuses an 8 GiB card with the KV cache named. */
static void generation_in_the_plan(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    qwen3_30b_config(&cfg);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_memory_plan p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 2048, &p, &err), FM_OK);
    const size_t before = p.total;
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 64, 2048, &err), FM_OK);
    assert_int_equal(p.kv_cache, 12884901888ull);
    assert_true(p.kv_state > (size_t)64 * 151936 * 9); /* the sampler state alone: counts, seen, z */
    assert_int_equal(p.total, before + p.kv_cache + p.kv_state);
    assert_int_equal(fm_memory_plan_check(&p, 8ull << 30, "--vram-limit", &err), FM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "KV cache 12.0 GiB for 64 sequences of 2048 tokens"));
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 2048, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 64, 2050, &err), FM_OK);
    assert_int_equal(p.kv_cache, 12884901888ull / 128 * 129);
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --tokens 64 --backend cuda --preset fp8 --max-seqs 4 "
                            "--ctx 100"),
                     0);
    assert_non_null(strstr(cli_out, "KV cache (4 seqs x 100 tokens)"));
    /* --kv-cache e4m3: a token's row of one layer is 512 codes and 4 fp32 scales (528 bytes) against 1024 */
    assert_int_equal(fm_plan_set_kv(&plan, FM_KV_E4M3, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 2048, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 64, 2048, &err), FM_OK);
    assert_int_equal(p.kv_cache, 12884901888ull / 1024 * 528);
    /* the cpu backend emulates it in fp32 rows: its cache keeps their size */
    fm_plan_for_backend(FM_PRESET_FP8, "cpu", &plan);
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cpu", 0, 2048, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 2, 2048, &err), FM_OK);
    const size_t cpu_rows = p.kv_cache;
    assert_int_equal(fm_plan_set_kv(&plan, FM_KV_E4M3, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cpu", 0, 2048, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 2, 2048, &err), FM_OK);
    assert_int_equal(p.kv_cache, cpu_rows);
    /* fp32 activations (the oracle) keep their cache */
    fm_plan_for_backend(FM_PRESET_REF32, "cuda", &plan);
    assert_int_equal(fm_plan_set_kv(&plan, FM_KV_E4M3, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "--kv-cache e4m3"));
}

/* Qwen3-Next keeps K and V for its attention layers only, and per Gated DeltaNet layer and sequence the conv's last
 * kernel - 1 inputs and the delta rule's matrices, fp32. tests/models/qwen3-next-f32 (layers L F L L; 2 KV heads of
 * 24; GDN: C = 2*2*16 + 4*12 = 112 channels, 4 taps, 4 value heads of 16 x 12), 2 sequences of 64 tokens = 8 blocks
 * of 16 slots: K, V 2 x 1 x 128 x 48 x 4 = 49,152 bytes; states 3 x 2 x (3 x 112 + 4 x 16 x 12) x 4 = 26,496. */
static void generation_counts_the_gdn_state(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    assert_int_equal(fm_config_load("tests/models/qwen3-next-f32", &cfg, &err), FM_OK);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cpu", &plan);
    fm_memory_plan p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cpu", 0, 64, &p, &err), FM_OK);
    assert_int_equal(fm_memory_plan_add_generation(&p, &cfg, &plan, 2, 64, &err), FM_OK);
    assert_int_equal(p.kv_cache, 49152 + 26496);
}

static void expect_usage(int code, const char *needle) {
    if (code != 2 || !strstr(cli_err, needle))
        fail_msg("exit %d (want 2); stderr should name '%s': %s", code, needle, cli_err);
}

static void inspect_prints_the_plan(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    assert_int_equal(fm_config_load("models/tiny-code-moe", &cfg, &err), FM_OK);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_INT4, "cuda", &plan);
    fm_memory_plan p;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 512, &p, &err), FM_OK);

    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --backend cuda --preset int4 --tokens 512"), 0);
    assert_non_null(strstr(cli_out, "architecture: qwen3_moe")); /* the checkpoint report is still there */
    assert_non_null(strstr(cli_out, "memory plan: backend cuda, preset int4"));
    const char *rows[] = {"weights",
                          "embeddings",
                          "lm_head",
                          "norms",
                          "attention (qkv + o)",
                          "router",
                          "experts",
                          "dense MLP",
                          "activations",
                          "logits",
                          "workspace",
                          "ops' scratch",
                          "cuBLAS and cuBLASLt workspaces",
                          "total",
                          "peak"};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (!strstr(cli_out, rows[i])) fail_msg("inspect --tokens: no '%s' row in:\n%s", rows[i], cli_out);
    char num[64];
    const size_t figures[] = {p.weight_total, p.activations, p.workspace, p.total, p.weights[FM_MEM_EXPERTS]};
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++) {
        snprintf(num, sizeof num, " %zu\n", figures[i]);
        if (!strstr(cli_out, num)) fail_msg("inspect --tokens: %zu bytes not printed:\n%s", figures[i], cli_out);
    }
    /* a limit decides "fits", with or without a GPU here */
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --backend cuda --tokens 512 --vram-limit 1Mi"), 0);
    assert_non_null(strstr(cli_out, "fits: no: model needs"));
    assert_non_null(strstr(cli_out, "(--vram-limit)"));
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --backend cuda --tokens 512 --vram-limit 0.5Gi"), 0);
    assert_non_null(strstr(cli_out, "fits: yes"));
    /* cpu plan: fp32 banks, no GPU section */
    assert_int_equal(fp8moe("inspect --model tests/models/qwen3-moe-tied-f32 --tokens 8"), 0);
    assert_non_null(strstr(cli_out, "memory plan: backend cpu, preset ref"));
    assert_non_null(strstr(cli_out, "lm_head (tied to the embeddings)"));
    assert_null(strstr(cli_out, "GPU:"));
    /* --lm-head dense: the lm_head in the dense format (a quantized copy of tied embeddings); a bad value or a preset
       whose dense projections are float: usage errors naming the option */
    assert_int_equal(fp8moe("inspect --model tests/models/qwen3-moe-tied-f32 --tokens 8 --backend cuda --preset fp8 "
                            "--dense w8a8 --lm-head dense"),
                     0);
    assert_non_null(strstr(cli_out, "lm_head (the tied embeddings, quantized): e4m3-tensor"));
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe --tokens 8 --backend cuda --preset fp8 --lm-head "
                            "dense"),
                     0);
    assert_non_null(strstr(cli_out, "lm_head: int4-g128-tc"));
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --tokens 8 --lm-head int4"), "--lm-head must be");
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --tokens 8 --lm-head dense"), "--lm-head dense: the ref");
    /* without --tokens, no plan */
    assert_int_equal(fp8moe("inspect --model models/tiny-code-moe"), 0);
    assert_null(strstr(cli_out, "memory plan"));
}

static void vram_limit_parsing(void **s) {
    (void)s;
    const char *m = "inspect --model models/tiny-code-moe --tokens 16 --backend cuda";
    const char *bad[] = {"abc",          "0", "-5", "8Q", "8gb", "1.5", ".5G", "8.G", "G", "99999999999999999999",
                         "9000000000Ti", "''"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_usage(fp8moe("%s --vram-limit %s", m, bad[i]), "--vram-limit");
    const char *good[] = {"123456789", "8G", "8Gi", "7.5Gi", "512M", "512Mi", "64K", "64Ki", "1T", "1Ti"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (fp8moe("%s --vram-limit %s", m, good[i]) != 0) fail_msg("--vram-limit %s refused: %s", good[i], cli_err);
    /* 7.5Gi is 7.5 x 2^30 bytes exactly */
    assert_int_equal(fp8moe("%s --vram-limit 7.5Gi", m), 0);
    assert_non_null(strstr(cli_out, "7.5 GiB"));
    /* inspect's plan options need --tokens */
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --vram-limit 8Gi"), "--tokens");
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --backend cuda"), "--tokens");
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --tokens 0"), "--tokens");
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --tokens 8 --layers 9"), "layers");
    expect_usage(fp8moe("inspect --model models/tiny-code-moe --tokens 8 --backend tpu"), "--backend");
    /* the model commands share the option */
    const char *ids = "--model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32";
    expect_usage(fp8moe("logits %s --out %s/x --vram-limit 12X", ids, cli_tmp), "--vram-limit");
    expect_usage(fp8moe("perplexity %s --window 8 --vram-limit -1", ids), "--vram-limit");
    expect_usage(fp8moe("parity %s --vram-limit lots", ids), "--vram-limit");
    expect_usage(fp8moe("logits %s --out %s/x --vram-limit", ids, cli_tmp), "--vram-limit"); /* missing value */
    for (int i = 0; i < 3; i++) {
        static const char *const cmds[] = {"logits", "perplexity", "parity"};
        assert_int_equal(fp8moe("%s --help", cmds[i]), 0);
        assert_non_null(strstr(cli_out, "--vram-limit BYTES"));
    }
    /* on the cpu the limit is accepted and does not apply */
    char out[512];
    snprintf(out, sizeof out, "%s/logits.f32", cli_tmp);
    assert_int_equal(fp8moe("logits %s --out %s --vram-limit 1K", ids, out), 0);
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    unlink(out);
    /* on cuda a limit too small is a clear error (or, without a GPU, the missing GPU is), and no output file */
    int code = fp8moe("logits %s --out %s --backend cuda --vram-limit 1M", ids, out);
    assert_int_equal(code, 1);
    if (!strstr(cli_err, "--vram-limit") && !strstr(cli_err, "cuda backend")) fail_msg("stderr: %s", cli_err);
    assert_true(stat(out, &sb) != 0);
}

/* The forward pass runs on the buffers the load planned: a prompt longer than max_tokens is refused with both numbers
 * and what to pass (nothing grows, on any backend: forward.c, fm_forward_stage); the planned length runs, and so
 * does a shorter one on the same buffers, with the same logits as a model planned for exactly that length. */
static void longer_prompt_refused(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cpu", opt.max_tokens = 4;
    fm_model *m = NULL, *m3 = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m, &err), FM_OK);
    assert_int_equal(m->context->buf_tokens, 4);
    const int32_t ids[5] = {11, 7, 300, 42, 5};
    const int32_t V = m->cfg.vocab_size;
    float *logits = malloc((size_t)(5 * V) * sizeof *logits), *l3 = malloc((size_t)(3 * V) * sizeof *l3);
    assert_true(logits && l3);
    assert_int_equal(fm_context_logits(m->context, ids, 5, logits, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "prompt of 5 tokens is longer than the 4 tokens the model was loaded for"));
    assert_non_null(strstr(err.msg, "max_tokens >= 5"));
    assert_int_equal(m->context->buf_tokens, 4); /* nothing grew */
    assert_int_equal(fm_context_logits(m->context, ids, 4, logits, &err), FM_OK);
    assert_int_equal(fm_context_logits(m->context, ids, 3, logits, &err), FM_OK);
    opt.max_tokens = 3;
    assert_int_equal(fm_model_load("models/tiny-code-moe", &opt, &m3, &err), FM_OK);
    assert_int_equal(fm_context_logits(m3->context, ids, 3, l3, &err), FM_OK);
    assert_memory_equal(logits, l3, (size_t)(3 * V) * sizeof *l3);
    free(logits), free(l3);
    fm_model_free(m3);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bank_bytes_formulas),         cmocka_unit_test(cpu_weights_equal_plan),
        cmocka_unit_test(prequant_weights_equal_plan), cmocka_unit_test(lm_head_dense_equals_plan),
        cmocka_unit_test(tiny_code_moe_cuda_by_hand),  cmocka_unit_test(qwen3_30b_a3b_on_cuda),
        cmocka_unit_test(qwen3_30b_a3b_fp8_on_cuda),   cmocka_unit_test(qwen3_30b_a3b_fold_on_cuda),
        cmocka_unit_test(vram_limit_refuses_8gib),     cmocka_unit_test(load_refuses_before_allocating),
        cmocka_unit_test(longer_prompt_refused),       cmocka_unit_test(plan_argument_errors),
        cmocka_unit_test(inspect_prints_the_plan),     cmocka_unit_test(vram_limit_parsing),
        cmocka_unit_test(generation_in_the_plan),      cmocka_unit_test(generation_counts_the_gdn_state),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
