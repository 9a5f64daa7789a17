/* The load's int4 repack (quant/int4_repack.h, backend/int4_native_rows.h):
 *   - compressed-tensors words written straight into the row layout (an xor) give the very bytes of decoding them
 *     first, for widths with a partial last word, a partial last group and one group of K < 128, with the padding
 *     past K zeroed whatever the buffer held;
 *   - the scan for codes of -8 (a word-wide test) finds one in the last word and none in the padding;
 *   - a non-finite scale and a source that is not pre-quantized are refused, naming what is wrong;
 *   - a bank filled on several threads is the bank filled on one, source for source;
 *   - the requantized tiny model loads with 1 and with 3 threads to the same bank bytes and the same logits, and its
 *     float source quantized at load (int4, fp8) or kept (ref) to the same banks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/int4_native_rows.h"
#include "cli_runner.h"
#include "engine/engine.h"
#include "engine/requantize.h"
#include "quant/bf16.h"
#include "quant/int4_native.h"
#include "quant/int4_repack.h"

#define TINY "models/tiny-code-moe"

/* One compressed-tensors Linear [N, K] in memory: random codes 1..15 (our quantizer never writes 0), bf16 scales. */
typedef struct ct_linear {
    fm_st_tensor packed, scales;
    uint32_t *words;
    uint16_t *sc;
    fm_qsrc q;
} ct_linear;

static uint32_t rng = 12345;
static uint32_t next(void) { return rng = rng * 1103515245u + 12345u, rng >> 8; }

static void ct_make(ct_linear *c, int64_t N, int64_t K) {
    const int64_t KW = (K + 7) / 8, group = K < 128 ? K : 128, ng = (K + group - 1) / group;
    c->words = calloc((size_t)(N * KW), sizeof *c->words);
    c->sc = malloc((size_t)(N * ng) * sizeof *c->sc);
    assert_non_null(c->words);
    assert_non_null(c->sc);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) /* nibbles past K stay zero, as the writer pads */
            c->words[n * KW + k / 8] |= (1u + next() % 15u) << (4 * (k % 8));
    for (int64_t i = 0; i < N * ng; i++) c->sc[i] = fm_f32_to_bf16((float)(1 + next() % 1000) * 1e-4f);
    c->packed = (fm_st_tensor){.name = "m.weight_packed",
                               .dtype = FM_DTYPE_I32,
                               .n_dims = 2,
                               .shape = {N, KW},
                               .n_elements = N * KW,
                               .data = (const uint8_t *)c->words,
                               .nbytes = (uint64_t)(N * KW) * 4};
    c->scales = (fm_st_tensor){.name = "m.weight_scale",
                               .dtype = FM_DTYPE_BF16,
                               .n_dims = 2,
                               .shape = {N, ng},
                               .n_elements = N * ng,
                               .data = (const uint8_t *)c->sc,
                               .nbytes = (uint64_t)(N * ng) * 2};
    c->q = (fm_qsrc){.method = FM_QUANT_CT_PACKED, .packed = &c->packed, .scales = &c->scales, .group = (int32_t)group};
}

static void ct_free(ct_linear *c) { free(c->words), free(c->sc); }

static void direct_equals_decoded(void **s) {
    (void)s;
    const int64_t Ks[] = {128, 2048, 200, 100, 36, 7};
    for (size_t t = 0; t < sizeof Ks / sizeof Ks[0]; t++) {
        const int64_t N = 5, K = Ks[t], ng = (K + 127) / 128;
        ct_linear c;
        ct_make(&c, N, K);
        const int64_t lds[2] = {(K + 1) / 2, (K + 31) / 32 * 16}; /* the CPU's and the GPU's row layouts */
        for (int l = 0; l < 2; l++) {
            const int64_t ld = lds[l];
            uint8_t *a = malloc((size_t)(N * ld)), *b = malloc((size_t)(N * ld));
            uint16_t *sa = malloc((size_t)(N * ng) * 2), *sb = malloc((size_t)(N * ng) * 2);
            memset(a, 0xa5, (size_t)(N * ld)), memset(b, 0x5a, (size_t)(N * ld)); /* padding must be written */
            fm_error err = {{0}};
            assert_int_equal(fm_int4_native_rows(&c.q, N, K, ng, a, ld, sa, "t", &err), FM_OK);
            assert_int_equal(fm_int4_native_rows_decoded(&c.q, N, K, ng, b, ld, sb, "t", &err), FM_OK);
            assert_memory_equal(a, b, (size_t)(N * ld));
            assert_memory_equal(sa, sb, (size_t)(N * ng) * 2);
            /* and the values: element k of row n is the stored code minus 8 */
            const int64_t KW = (K + 7) / 8;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const int u = (int)(c.words[n * KW + k / 8] >> (4 * (k % 8))) & 15;
                    const int x = (a[n * ld + k / 2] >> (4 * (k % 2))) & 15;
                    assert_int_equal((x ^ 8) - 8, u - 8);
                }
            free(a), free(b), free(sa), free(sb);
        }
        /* the code scan: no code 0 (padding nibbles are zero and do not count), then one in the last word */
        assert_int_equal(fm_qsrc_native_int4(&c.q, N, K), FM_NATIVE_YES);
        const int64_t KW = (K + 7) / 8, last = K - 1;
        c.words[(N - 1) * KW + last / 8] &= ~(15u << (4 * (last % 8)));
        assert_int_equal(fm_qsrc_native_int4(&c.q, N, K), FM_NATIVE_MINUS8);
        printf("  K = %lld: direct rows identical to decoded rows (both row layouts)\n", (long long)K);
        ct_free(&c);
    }
}

static void refusals(void **s) {
    (void)s;
    ct_linear c;
    ct_make(&c, 3, 256);
    c.sc[4] = 0x7fc0; /* a NaN */
    uint8_t codes[3 * 128];
    uint16_t sc[6];
    fm_error err = {{0}};
    assert_int_equal(fm_int4_native_rows(&c.q, 3, 256, 2, codes, 128, sc, "t", &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "m.weight_scale"));
    assert_non_null(strstr(err.msg, "scale 4 is not finite"));
    fm_error err2 = {{0}};
    assert_int_equal(fm_int4_native_rows_decoded(&c.q, 3, 256, 2, codes, 128, sc, "t", &err2), FM_ERR_FORMAT);
    assert_string_equal(err.msg, err2.msg);
    c.sc[4] = 0x3f80;
    assert_int_equal(fm_int4_native_rows(&c.q, 3, 256, 3, codes, 128, sc, "layer 0 q", &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "2 scale groups per row, the bank 3"));
    /* a float source in a bank filled from codes */
    fm_wsrc srcs[2] = {{.rows = 3, .cols = 256, .q = c.q}, {.rows = 3, .cols = 256}};
    const fm_bank_src bank = {srcs, 2, 1, "layer 1 experts", false, true};
    uint8_t codes2[6 * 128];
    uint16_t sc2[12];
    assert_int_equal(fm_int4_native_bank_rows(&bank, 0, 2, 2, 128, codes2, sc2, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "layer 1 experts: source 1 is not pre-quantized"));
    ct_free(&c);
}

/* A bank of 24 sources of different widths filled on 1 and on 4 threads, whole and in two batches (as the GPU's
 * staging fills it): the same bytes. */
static void bank_threads(void **s) {
    (void)s;
    enum { E = 12, P = 2 };
    const int64_t N[P] = {40, 24}, K = 520, ng = 5, ld = (K + 31) / 32 * 16, rows = (N[0] + N[1]) * E;
    ct_linear c[E * P];
    fm_wsrc srcs[E * P];
    for (int i = 0; i < E * P; i++) {
        ct_make(&c[i], N[i % P], K);
        srcs[i] = (fm_wsrc){.rows = N[i % P], .cols = K, .q = c[i].q};
        srcs[i].q.packed = &c[i].packed, srcs[i].q.scales = &c[i].scales;
    }
    const fm_bank_src bank = {srcs, E, P, "experts", true, true};
    uint8_t *a = calloc((size_t)(rows * ld), 1), *b = calloc((size_t)(rows * ld), 1);
    uint16_t *sa = calloc((size_t)(rows * ng), 2), *sb = calloc((size_t)(rows * ng), 2);
    fm_error err = {{0}};
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(fm_int4_native_bank_rows(&bank, 0, E * P, ng, ld, a, sa, &err), FM_OK);
    omp_set_num_threads(4);
    const int64_t half = 7, r = fm_bank_src_rows(&bank, 0, half);
    assert_int_equal(fm_int4_native_bank_rows(&bank, 0, half, ng, ld, b, sb, &err), FM_OK);
    assert_int_equal(fm_int4_native_bank_rows(&bank, half, E * P - half, ng, ld, b + r * ld, sb + r * ng, &err), FM_OK);
    omp_set_num_threads(saved);
    assert_int_equal(fm_bank_src_rows(&bank, 0, E * P), rows);
    assert_memory_equal(a, b, (size_t)(rows * ld));
    assert_memory_equal(sa, sb, (size_t)(rows * ng) * 2);
    /* and each source sits at its rows: source 3 (matrix 1, part 1) starts at row 40 + 24 + 40 */
    uint8_t one[24 * 272];
    uint16_t one_s[24 * 5];
    assert_int_equal(fm_int4_native_rows(&srcs[3].q, 24, K, ng, one, ld, one_s, "x", &err), FM_OK);
    assert_memory_equal(one, a + 104 * ld, sizeof one);
    free(a), free(b), free(sa), free(sb);
    for (int i = 0; i < E * P; i++) ct_free(&c[i]);
}

static fm_model *load_threads(const char *dir, int32_t threads, fm_preset preset) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    opt.n_threads = threads;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s on %d threads: %s", dir, threads, err.msg);
    return m;
}

static void expect_same_bank(const fm_bank *a, const fm_bank *b) {
    assert_int_equal(a->fmt, b->fmt);
    assert_int_equal(a->n * a->rows * a->cols, b->n * b->rows * b->cols);
    assert_int_equal(a->n_groups, b->n_groups);
    const size_t n = (size_t)(a->n * a->rows);
    if (a->w) assert_memory_equal(a->w, b->w, n * (size_t)a->cols * sizeof(float));
    if (a->scales) assert_memory_equal(a->scales, b->scales, n * (size_t)a->n_groups * sizeof(float));
    if (a->tscale) assert_memory_equal(a->tscale, b->tscale, (size_t)a->n * sizeof(float));
}

/* The requantized tiny model on 1 and on 3 threads: every bank byte for byte, and the logits. */
static void model_threads(void **s) {
    (void)s;
    char dir[320];
    snprintf(dir, sizeof dir, "%s/int4", cli_tmp);
    fm_requant_opts o = {.in_dir = TINY, .out_dir = dir};
    fm_requant_stats st;
    fm_error err = {{0}};
    if (fm_requantize(&o, &st, &err)) fail_msg("requantize: %s", err.msg);
    const int saved = omp_get_max_threads();
    fm_model *a = load_threads(dir, 1, FM_PRESET_INT4), *b = load_threads(dir, 3, FM_PRESET_INT4);
    int banks = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int i = 0; i < FM_BANK_COUNT; i++)
            if (a->layers[l].bank[i]) expect_same_bank(a->layers[l].bank[i], b->layers[l].bank[i]), banks++;
    assert_int_equal(a->layers[0].gate_up->fmt, FM_W_INT4_G128); /* filled from the codes */
    enum { T = 9 };
    const int32_t ids[T] = {1, 5, 9, 2, 7, 3, 8, 4, 6};
    const size_t n = (size_t)T * (size_t)fm_model_vocab_size(a);
    float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
    assert_int_equal(fm_context_logits(a->context, ids, T, la, &err), FM_OK);
    assert_int_equal(fm_context_logits(b->context, ids, T, lb, &err), FM_OK);
    assert_memory_equal(la, lb, n * sizeof *la);
    printf("  %d banks and %zu logits identical on 1 and 3 threads\n", banks, n);
    free(la), free(lb);
    fm_model_free(a), fm_model_free(b);
    omp_set_num_threads(saved);
}

/* The float checkpoint quantized at load (int4, and e4m3 per tensor for --dense w8a8's banks: fp8 preset) and kept
 * in float (ref): a bank's matrices on 1 and on 3 threads, byte for byte. */
static void float_threads(void **s) {
    (void)s;
    const fm_preset presets[3] = {FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_REF};
    const int saved = omp_get_max_threads();
    for (int p = 0; p < 3; p++) {
        fm_model *a = load_threads(TINY, 1, presets[p]), *b = load_threads(TINY, 3, presets[p]);
        for (int l = 0; l < a->n_layers; l++)
            for (int i = 0; i < FM_BANK_COUNT; i++)
                if (a->layers[l].bank[i]) expect_same_bank(a->layers[l].bank[i], b->layers[l].bank[i]);
        expect_same_bank(a->embed, b->embed);
        printf("  %s: the float checkpoint's banks identical on 1 and 3 threads\n", fm_preset_name(presets[p]));
        fm_model_free(a), fm_model_free(b);
    }
    omp_set_num_threads(saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(direct_equals_decoded), cmocka_unit_test(refusals),      cmocka_unit_test(bank_threads),
        cmocka_unit_test(model_threads),         cmocka_unit_test(float_threads),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
