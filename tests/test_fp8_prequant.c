/* The fp8 preset on pre-quantized checkpoints (CPU): int4-zp banks with e4m3 1x128 activations (W4A8 with zero
 * points) and e4m3-block banks (block-FP8, DeepSeek-V3's recipe). The CPU ops are the reference the GPU kernels are
 * tested against, so the numerics contracts of cpu_linear_int4zp.c and cpu_linear_e4m3b.c are checked here against a
 * straightforward computation:
 *   - op, hand-made banks: random codes, zero points (sym: 8; asym: 0..16) and scales, groups of 128 and 256 (a
 *     per-channel G = K = 256), M = 3 rows; the op against sum_k xq[m,k] a[m,k/128] * (u - z) s in double, with xq, a
 *     from the same quantizer (fm_e4m3_quantize_groups). Bound per output: |y - ref| <= K 2^-23 sum_k |xq a w| (fp32
 *     summation of K terms, generous: the partials and the promotion each add one rounding per group);
 *   - op, banks built from the fixtures (tests/data/quant, made by tools/pack_quantized.py): q|k|v (three parts) and
 *     every expert's gate|up and down, against the packer's dequantized fp32 weights (dequant/), the same bound:
 *     int4-zp sym G=128 (desc_act with the identity order), asym G=128 (AWQ), per-channel (GPTQ v2, G = K = 128),
 *     e4m3-block with bn = 128 and bn = 48 (divides no part's rows: partial row blocks in every part);
 *   - model: --preset fp8 on each fixture against ref on the same checkpoint (cosine >= 0.99, values printed) and
 *     against ref on the fp32 twin (the packer's dequantized weights: the same logits bit for bit as ref on the
 *     checkpoint, test_quant_import.c);
 *   - refusals: act-order, groups that are not multiples of 128, block K != 128 under fp8; block-FP8 under int4;
 *     mxfp4 dispatch (fp4) with pre-quantized experts; each message names the bank and the way out;
 *   - mutation: one zero point changed changes exactly the outputs of its row. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_fixture.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "engine/engine.h"
#include "fp8moe.h"
#include "io/config.h"
#include "util/ids.h"
#include "io/safetensors.h"
#include "model/model_src.h"
#include "quant/e4m3.h"
#include "util/metrics.h"

#define DATA "tests/data/quant"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}
static float urand(void) { return (float)rnd() / 2147483648.0f - 1.0f; } /* [-1, 1) */

/* fp32 activations, no bf16 rounding of outputs: the op's arithmetic alone */
static fm_backend *cpu_f32(void) {
    fm_plan plan;
    fm_plan_from_preset(FM_PRESET_REF, &plan);
    fm_backend *be = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);
    return be;
}

/* xd[m, k] = decoded e4m3 code * its group scale, from the quantizer the op uses */
static double *quantized_acts(const float *x, int64_t M, int64_t K) {
    double *xd = malloc((size_t)(M * K) * sizeof *xd);
    uint8_t *codes = malloc((size_t)K);
    float *sc = malloc((size_t)((K + 127) / 128) * sizeof *sc);
    for (int64_t m = 0; m < M; m++) {
        fm_e4m3_quantize_groups(x + m * K, K, 128, codes, sc);
        for (int64_t k = 0; k < K; k++) xd[m * K + k] = (double)fm_e4m3_to_f32(codes[k]) * sc[k / 128];
    }
    free(codes), free(sc);
    return xd;
}

/* y (the op) against the double-precision product of xd and the fp32 weights W [N, K]; returns the largest error in
 * units of the bound K 2^-23 sum |terms| */
static double check_outputs(const char *what, const float *y, const double *xd, const float *W, int64_t M, int64_t N,
                            int64_t K) {
    double worst = 0, num = 0, den = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = xd[m * K + k] * (double)W[n * K + k];
                ref += t, mag += fabs(t);
            }
            const double bound = (double)K * 0x1p-23 * mag + 1e-30, e = fabs((double)y[m * N + n] - ref);
            if (e > bound)
                fail_msg("%s: y[%lld, %lld] = %.9g, reference %.9g, |diff| %.3g > bound %.3g", what, (long long)m,
                         (long long)n, y[m * N + n], ref, e, bound);
            worst = fmax(worst, e / bound);
            num += e * e, den += ref * ref;
        }
    printf("  %-44s rel. error %.2e, worst %.3f of the bound\n", what, sqrt(num / den), worst);
    return worst;
}

/* ---- op: hand-made int4-zp banks --------------------------------------------------------------------------- */

typedef struct zp_bank {
    fm_bank b;
    float *W; /* dequantized [N, K] */
} zp_bank;

static void zp_make(zp_bank *z, int64_t N, int64_t K, int32_t G, bool sym) {
    const int64_t ng = K / G;
    memset(z, 0, sizeof *z);
    z->b = (fm_bank){.fmt = FM_W_INT4_ZP, .n = 1, .rows = N, .cols = K, .n_groups = ng, .group = G};
    z->b.codes = calloc((size_t)(N * K / 2), 1);
    z->b.zeros = malloc((size_t)(N * ng));
    z->b.scales = malloc((size_t)(N * ng) * sizeof(float));
    z->W = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t e = 0; e < N * ng; e++) {
        z->b.zeros[e] = sym ? 8 : (uint8_t)(rnd() % 17);
        z->b.scales[e] = (float)(0.01 + 0.02 * (rnd() % 1000) / 1000.0);
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            const uint8_t u = (uint8_t)(rnd() % 16);
            z->b.codes[(n * K + k) / 2] |= (uint8_t)(u << ((k & 1) * 4));
            z->W[n * K + k] = ((float)u - z->b.zeros[n * ng + k / G]) * z->b.scales[n * ng + k / G];
        }
}

static void zp_free(zp_bank *z) { free(z->b.codes), free(z->b.zeros), free(z->b.scales), free(z->W); }

static float *rand_acts(int64_t M, int64_t K) {
    float *x = malloc((size_t)(M * K) * sizeof *x);
    for (int64_t i = 0; i < M * K; i++) x[i] = 3.0f * urand() * (i % 97 == 0 ? 20.0f : 1.0f); /* some outliers */
    return x;
}

static void op_int4zp_handmade(void **s) {
    (void)s;
    fm_backend *be = cpu_f32();
    const struct {
        int32_t G;
        bool sym;
        const char *what;
    } cases[] = {{128, true, "int4-zp sym G=128"},
                 {128, false, "int4-zp asym G=128"},
                 {256, false, "int4-zp asym per-channel G=K=256"},
                 {256, true, "int4-zp sym per-channel G=K=256"}};
    const int64_t M = 3, N = 37, K = 256;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zp_bank z;
        zp_make(&z, N, K, cases[i].G, cases[i].sym);
        float *x = rand_acts(M, K), *y = malloc((size_t)(M * N) * sizeof *y);
        be->ops->linear(be, &z.b, 0, x, M, FM_A_E4M3_G128, y);
        double *xd = quantized_acts(x, M, K);
        check_outputs(cases[i].what, y, xd, z.W, M, N, K);
        /* the per-row path the moe op takes gives the same numbers as the linear op */
        float *xq = malloc((size_t)(K + K / 128) * sizeof *xq), *y1 = malloc((size_t)N * sizeof *y1);
        cpu_qrow q = {xq, xq + K, 1.0f};
        cpu_quantize_row(x + K, K, FM_A_E4M3_G128, &q);
        cpu_linear_row(&z.b, 0, &q, y1);
        assert_memory_equal(y1, y + N, (size_t)N * sizeof *y1);
        free(xq), free(y1), free(x), free(y), free(xd);
        zp_free(&z);
    }
    be->ops->destroy(be);
}

/* mutation sanity: one zero point moved by one changes the outputs of its row, and only those */
static void mutation_zero_point(void **s) {
    (void)s;
    fm_backend *be = cpu_f32();
    const int64_t M = 2, N = 9, K = 256;
    zp_bank z;
    zp_make(&z, N, K, 128, false);
    float *x = rand_acts(M, K), *y0 = malloc((size_t)(M * N) * sizeof *y0), *y1 = malloc((size_t)(M * N) * sizeof *y1);
    be->ops->linear(be, &z.b, 0, x, M, FM_A_E4M3_G128, y0);
    const int64_t n = 4, g = 1;
    z.b.zeros[n * 2 + g] = (uint8_t)(z.b.zeros[n * 2 + g] == 16 ? 15 : z.b.zeros[n * 2 + g] + 1);
    be->ops->linear(be, &z.b, 0, x, M, FM_A_E4M3_G128, y1);
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < N; j++)
            if (j == n) assert_true(y0[m * N + j] != y1[m * N + j]);
            else assert_true(y0[m * N + j] == y1[m * N + j]);
    printf("  zero point of row %lld group %lld + 1: y[0, %lld] %.6g -> %.6g, other rows unchanged\n", (long long)n,
           (long long)g, (long long)n, y0[n], y1[n]);
    free(x), free(y0), free(y1);
    zp_free(&z);
    be->ops->destroy(be);
}

/* ---- op: banks built from the fixtures ----------------------------------------------------------------------- */

static fm_bank *bank_of(fm_backend *be, const fm_wsrc *srcs, int32_t n, int32_t parts, fm_wformat fmt) {
    fm_bank_src src = {srcs, n, parts, "test bank", parts == 2, false};
    fm_bank *b = NULL;
    fm_error err = {{0}};
    if (be->ops->bank_create(be, &src, fmt, &b, &err)) fail_msg("bank_create: %s", err.msg);
    return b;
}

/* the packer's fp32 weights of matrix i of a bank: its parts read from the twin, concatenated along rows */
static float *twin_matrix(const fm_wsrc *srcs, int32_t i, int32_t parts, int64_t *rows) {
    int64_t R = 0;
    for (int32_t j = 0; j < parts; j++) R += srcs[(int64_t)i * parts + j].rows;
    const int64_t K = srcs[0].cols;
    float *W = malloc((size_t)(R * K) * sizeof *W), *p = W;
    fm_error err = {{0}};
    for (int32_t j = 0; j < parts; j++) {
        const fm_wsrc *w = &srcs[(int64_t)i * parts + j];
        assert_int_equal(fm_wsrc_read(w, p, &err), FM_OK);
        p += w->rows * K;
    }
    *rows = R;
    return W;
}

static void check_bank(fm_backend *be, const char *name, const char *what, const fm_wsrc *q, const fm_wsrc *d,
                       int32_t n, int32_t parts, fm_wformat fmt) {
    fm_bank *b = bank_of(be, q, n, parts, fmt);
    const int64_t M = 5, K = q[0].cols;
    float *x = rand_acts(M, K);
    double *xd = quantized_acts(x, M, K);
    for (int32_t i = 0; i < n; i++) {
        int64_t N = 0;
        float *W = twin_matrix(d, i, parts, &N);
        assert_int_equal(N, b->rows);
        float *y = malloc((size_t)(M * N) * sizeof *y);
        be->ops->linear(be, b, i, x, M, FM_A_E4M3_G128, y);
        char label[160];
        snprintf(label, sizeof label, "%s %s[%d] (%s)", name, what, i, fm_wformat_name(fmt));
        check_outputs(label, y, xd, W, M, N, K);
        free(W), free(y);
    }
    free(x), free(xd);
    be->ops->bank_free(be, b);
}

static void check_fixture_ops(const char *name, fm_wformat fmt) {
    quant_fixture f;
    quant_fixture_open(&f, DATA, name);
    fm_backend *be = cpu_f32();
    const fm_layer_src *ql = &f.qs.layers[0], *dl = &f.ds.layers[0];
    const int32_t E = f.qcfg.n_experts;
    const fm_wsrc qqkv[3] = {ql->q, ql->k, ql->v}, dqkv[3] = {dl->q, dl->k, dl->v};
    check_bank(be, name, "qkv", qqkv, dqkv, 1, 3, fmt);
    check_bank(be, name, "o_proj", &ql->o, &dl->o, 1, 1, fmt);
    fm_wsrc *qgu = malloc((size_t)E * 2 * sizeof *qgu), *dgu = malloc((size_t)E * 2 * sizeof *dgu);
    for (int32_t e = 0; e < E; e++) {
        qgu[2 * e] = ql->expert_gate[e], qgu[2 * e + 1] = ql->expert_up[e];
        dgu[2 * e] = dl->expert_gate[e], dgu[2 * e + 1] = dl->expert_up[e];
    }
    check_bank(be, name, "experts gate_up", qgu, dgu, E, 2, fmt);
    check_bank(be, name, "experts down", ql->expert_down, dl->expert_down, E, 1, fmt);
    free(qgu), free(dgu);
    be->ops->destroy(be);
    quant_fixture_close(&f);
}

static void op_fixtures(void **s) {
    (void)s;
    check_fixture_ops("gptq-v1-sym-g128", FM_W_INT4_ZP_TC);
    check_fixture_ops("awq-g128", FM_W_INT4_ZP_TC);
    check_fixture_ops("gptq-v2-asym-channel-k128", FM_W_INT4_ZP_TC);
    check_fixture_ops("fp8-block-b128", FM_W_E4M3_B128);
    check_fixture_ops("fp8-block-b48", FM_W_E4M3_B128);
}

/* ---- whole model ---------------------------------------------------------------------------------------------- */

static float *run(const char *dir, fm_preset preset, const int32_t *ids, int64_t T, int32_t *V, fm_wformat *qkv_fmt) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s (%s): %s", dir, fm_preset_name(preset), err.msg);
    *V = fm_model_vocab_size(m);
    if (qkv_fmt) {
        *qkv_fmt = m->layers[0].qkv->fmt;
        assert_int_equal(m->layers[0].gate_up->fmt, *qkv_fmt); /* the experts too, not only the dense banks */
        assert_int_equal(m->layers[0].down->fmt, *qkv_fmt);
    }
    float *logits = malloc((size_t)T * (size_t)*V * sizeof(float));
    if (fm_context_logits(m->context, ids, T, logits, &err)) fail_msg("logits %s: %s", dir, err.msg);
    fm_model_free(m);
    return logits;
}

static void check_model(const char *name, fm_wformat want) {
    char dir[256], ddir[256], path[300];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    snprintf(ddir, sizeof ddir, DATA "/%s/dequant", name);
    snprintf(path, sizeof path, "%s/golden_ids.i32", dir);
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read(path, &ids, &T, &err), FM_OK);
    int32_t V = 0, V2 = 0, V3 = 0;
    fm_wformat got;
    float *fp8 = run(dir, FM_PRESET_FP8, ids, T, &V, &got);
    float *ref = run(dir, FM_PRESET_REF, ids, T, &V2, NULL);
    float *twin = run(ddir, FM_PRESET_REF, ids, T, &V3, NULL);
    assert_int_equal(got, want);
    assert_int_equal(V, V2);
    assert_int_equal(V, V3);
    fm_compare c, t;
    fm_logits_compare(ref, fp8, T, V, &c);
    fm_logits_compare(twin, fp8, T, V, &t);
    printf("  %-28s fp8 (%s) vs ref: cosine %.6f, max|diff| %.3g, argmax %.1f%%; vs fp32 twin: cosine %.6f\n", name,
           fm_wformat_name(got), c.cosine, c.max_abs_err, 100 * c.argmax_agree, t.cosine);
    assert_int_equal(c.n_nonfinite, 0);
    assert_true(c.cosine >= 0.99);
    assert_true(t.cosine >= 0.99);
    free(fp8), free(ref), free(twin), free(ids);
}

static void model_fp8(void **s) {
    (void)s;
    check_model("gptq-v1-sym-g128", FM_W_INT4_ZP_TC);
    check_model("awq-g128", FM_W_INT4_ZP_TC);
    check_model("gptq-v2-asym-channel-k128", FM_W_INT4_ZP_TC);
    check_model("fp8-block-b128", FM_W_E4M3_B128);
    check_model("fp8-block-b48", FM_W_E4M3_B128);
}

/* ---- refusals ------------------------------------------------------------------------------------------------ */

static void expect_refused(const char *name, fm_preset preset, const char *bank, const char *s1, const char *s2) {
    char dir[256];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(dir, &opt, &m, &err);
    printf("  %-24s %-5s -> %s\n", name, fm_preset_name(preset), err.msg);
    assert_null(m);
    assert_int_equal(st, FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, bank));
    assert_non_null(strstr(err.msg, s1));
    assert_non_null(strstr(err.msg, s2));
}

static void refusals(void **s) {
    (void)s;
    expect_refused("gptq-v1-asym-actorder", FM_PRESET_FP8, "layer 0 qkv", "act-order int4 (gptq",
                   "--preset int4 handles it");
    expect_refused("ct-asym-actorder-ignore", FM_PRESET_FP8, "layer 0 qkv", "act-order int4 (compressed-tensors",
                   "--preset int4 handles it");
    expect_refused("ct-sym-g32", FM_PRESET_FP8, "layer 0 qkv", "int4 group size 32", "--preset int4 handles it");
    expect_refused("gptq-v1-sym", FM_PRESET_FP8, "layer 0 qkv", "int4 group size 16", "--preset int4 handles it");
    expect_refused("fp8-block", FM_PRESET_FP8, "layer 0 qkv", "blocks of [16, 16]", "128 wide along K");
    expect_refused("fp8-block-b128", FM_PRESET_INT4, "layer 0 qkv", "read by --preset fp8, ref and ref32",
                   "requantize");
    expect_refused("awq-g128", FM_PRESET_FP4, "layer 0 experts gate_up", "with mxfp4 activations", "--preset fp8");
    /* the int4 preset takes what fp8 refuses */
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = FM_PRESET_INT4;
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load(DATA "/ct-sym-g32", &opt, &m, &err), FM_OK);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(op_int4zp_handmade), cmocka_unit_test(mutation_zero_point),
        cmocka_unit_test(op_fixtures),        cmocka_unit_test(model_fp8),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
