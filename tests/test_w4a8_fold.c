/* The fold GEMM's arithmetic on the CPU (backend/w4a8_fold.h):
 *   - the code layout and the kernel's conversion: every packed code, converted with the table of the exponent the
 *     kernel derives from the bf16 scales, is the e4m3 byte of q x 2^j; gate|up rows interleaved by 8;
 *   - the emulation equals exact math (double) where the per-token quantization is exact, for every P;
 *   - against plain fp32 math on unquantized activations it is within the e4m3 activations' error;
 *   - promotion intervals change only fp32 rounding; scales without the int4-p2 form are refused;
 *   - the cpu backend under route w4a8.kernel=fold: the moe's gate|up input per token (equal to the 1x128 plan's
 *     where every group of a row has the row's amax, different elsewhere); an FP4 dispatch refused by name. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "moe_fixture.h"
#include "backend/w4a8_fold.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4_p2.h"

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }
static double urand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

typedef struct p2_matrix {
    int64_t rows, K, G;
    int8_t *q;
    float *scales;
} p2_matrix;

/* gaussian rows with a log-normal scale per (row, group), quantized to int4-p2 */
static p2_matrix make_p2(int64_t rows, int64_t K) {
    p2_matrix m = {rows, K, (K + 127) / 128, malloc((size_t)(rows * K)), NULL};
    m.scales = malloc((size_t)(rows * m.G) * sizeof(float));
    float *w = malloc((size_t)(rows * K) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float rscale = expf(0.3f * gauss());
        for (int64_t g = 0; g < m.G; g++) {
            const float gs = rscale * expf(0.35f * gauss());
            for (int64_t i = 128 * g; i < K && i < 128 * (g + 1); i++) w[r * K + i] = 0.02f * gs * gauss();
        }
    }
    fm_int4_p2_quantize(w, rows, K, m.q, m.scales);
    free(w);
    return m;
}
static void free_p2(p2_matrix *m) { free(m->q), free(m->scales); }

static void test_layout_and_conversion(void **state) {
    (void)state;
    seed(1);
    const int64_t rows = 48, K = 300, G = 3, rows_pad = 64; /* a partial last group; rows padded */
    for (int il = 0; il < 2; il++) {
        p2_matrix m = make_p2(rows, K);
        uint8_t *codes = malloc((size_t)(rows_pad * G * 64));
        uint16_t *sc = malloc((size_t)(rows_pad * G) * 2);
        fm_w4a8_fold_pack(m.q, m.scales, rows, K, il == 1, rows_pad, codes, sc);
        int checked = 0;
        for (int64_t r = 0; r < rows_pad; r++) {
            /* the row scale's exponent field as the kernel finds it: the largest bf16 scale of the row */
            uint16_t rs = 0;
            for (int64_t g = 0; g < G; g++) rs = sc[g * rows_pad + r] > rs ? sc[g * rows_pad + r] : rs;
            const int64_t src = r < rows ? fm_w4a8_fold_source_row(r, rows, il == 1) : -1;
            for (int64_t g = 0; g < G; g++) {
                const uint16_t s16 = sc[g * rows_pad + r];
                const int32_t j = ((s16 >> 7) & 0xFF) - ((rs >> 7) & 0xFF) + FM_FOLD_J_BIAS;
                if (src >= 0) assert_true(fm_bf16_to_f32(s16) == m.scales[src * G + g]);
                else assert_int_equal(s16, 0);
                for (int64_t s = 0; s < 4; s++)
                    for (int64_t i = 0; i < 4; i++) {
                        const uint8_t *p = codes + fm_w4a8_fold_code_offset(rows_pad, g, s, r) + 4 * i;
                        const uint32_t w =
                            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                        uint32_t lo, hi;
                        fm_w4a8_fold_convert_word(w, j, &lo, &hi);
                        for (int c = 0; c < 8; c++) {
                            const int64_t k = 128 * g + 32 * s + 8 * i + c;
                            const int q = src >= 0 && k < K ? m.q[src * K + k] : 0;
                            const uint8_t got = (uint8_t)((c < 4 ? lo : hi) >> (8 * (c & 3)));
                            if (q == 0) {
                                assert_int_equal(got, 0);
                                continue;
                            }
                            assert_true(j >= FM_FOLD_J_MIN && j <= FM_FOLD_J_MAX);
                            assert_int_equal(got, fm_f32_to_e4m3(ldexpf((float)q, j)));
                            assert_true(fm_e4m3_to_f32(got) == ldexpf((float)q, j)); /* exact */
                            checked++;
                        }
                    }
            }
        }
        assert_true(checked > rows * K / 2);
        free(codes), free(sc), free_p2(&m);
    }
}

/* every q x 2^j of the range converts exactly, through every table */
static void test_conversion_exhaustive(void **state) {
    (void)state;
    for (int32_t j = FM_FOLD_J_MIN; j <= FM_FOLD_J_MAX; j++)
        for (int q = -7; q <= 7; q++) {
            /* code q at every position c of a word whose other codes are -q */
            for (int c = 0; c < 8; c++) {
                uint32_t w = 0;
                for (int d = 0; d < 8; d++) {
                    const int v = d == c ? q : -q;
                    w |= (uint32_t)(v < 0 ? -v : v) << (4 * d);
                    w |= (uint32_t)(v < 0) << (d < 4 ? 8 * d + 7 : 8 * (d - 4) + 3);
                }
                uint32_t lo, hi;
                fm_w4a8_fold_convert_word(w, j, &lo, &hi);
                const uint8_t got = (uint8_t)((c < 4 ? lo : hi) >> (8 * (c & 3)));
                assert_int_equal(got, q ? fm_f32_to_e4m3(ldexpf((float)q, j)) : 0);
            }
        }
}

static double dot_exact(const p2_matrix *m, int64_t r, const float *x) {
    double s = 0.0;
    for (int64_t i = 0; i < m->K; i++) s += (double)m->q[r * m->K + i] * m->scales[r * m->G + i / 128] * x[i];
    return s;
}

/* activations whose per-token quantization is exact: e4m3 values times 2^e with the row's amax 448 x 2^e */
static void test_emulation_exact(void **state) {
    (void)state;
    seed(2);
    const int64_t rows = 40, K = 1000, N = 9, ldx = 1024;
    p2_matrix m = make_p2(rows, K);
    float *x = malloc((size_t)(N * K) * sizeof(float)), *xs = malloc((size_t)N * sizeof(float));
    uint8_t *x8 = malloc((size_t)(N * ldx));
    float *y = malloc((size_t)(N * rows) * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        const int e = (int)(urand() * 20) - 10;
        for (int64_t i = 0; i < K; i++) x[n * K + i] = ldexpf(fm_e4m3_to_f32(fm_f32_to_e4m3(40.0f * gauss())), e);
        x[n * K + (n * 37) % K] = ldexpf(n % 2 ? -448.0f : 448.0f, e);
    }
    fm_w4a8_fold_quantize_tokens(x, N, K, K, x8, ldx, xs);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t i = 0; i < K; i++) assert_true(fm_e4m3_to_f32(x8[n * ldx + i]) * xs[n] == x[n * K + i]);
        for (int64_t i = K; i < ldx; i++) assert_int_equal(x8[n * ldx + i], 0);
    }
    const int32_t Ps[] = {1, 2, 4, 8, 0};
    for (int pi = 0; pi < 5; pi++) {
        assert_true(fm_w4a8_fold_ref(m.q, m.scales, rows, K, x8, ldx, xs, 0, false, N, Ps[pi], y));
        for (int64_t n = 0; n < N; n++)
            for (int64_t r = 0; r < rows; r++) {
                double mag = 0.0;
                for (int64_t i = 0; i < K; i++)
                    mag += fabs((double)m.q[r * K + i] * m.scales[r * m.G + i / 128] * x[n * K + i]);
                const double want = dot_exact(&m, r, x + n * K);
                assert_true(fabs(y[n * rows + r] - want) <= 4e-7 * mag + 1e-30);
            }
    }
    free(x), free(xs), free(x8), free(y), free_p2(&m);
}

/* against plain fp32 math on the unquantized activations: the e4m3 activations' error, no more; the P intervals
 * agree to fp32 rounding */
static void test_emulation_vs_fp32(void **state) {
    (void)state;
    seed(3);
    const int64_t Ks[] = {768, 2048};
    for (int ki = 0; ki < 2; ki++) {
        const int64_t rows = 32, K = Ks[ki], N = 16, ldx = K;
        p2_matrix m = make_p2(rows, K);
        float *x = malloc((size_t)(N * K) * sizeof(float)), *xs = malloc((size_t)N * sizeof(float));
        uint8_t *x8 = malloc((size_t)(N * ldx));
        float *y = malloc((size_t)(N * rows) * sizeof(float)), *y1 = malloc((size_t)(N * rows) * sizeof(float));
        for (int64_t i = 0; i < N * K; i++) x[i] = gauss();
        fm_w4a8_fold_quantize_tokens(x, N, K, K, x8, ldx, xs);
        assert_true(fm_w4a8_fold_ref(m.q, m.scales, rows, K, x8, ldx, xs, 0, false, N, FM_FOLD_PROMOTE, y));
        double sxy = 0.0, sxx = 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t r = 0; r < rows; r++) {
                float ref = 0.0f;
                for (int64_t i = 0; i < K; i++)
                    ref += (float)m.q[r * K + i] * m.scales[r * m.G + i / 128] * x[n * K + i];
                sxy += (double)ref * y[n * rows + r];
                sxx += (double)ref * ref + (double)y[n * rows + r] * y[n * rows + r];
            }
        const double diff = 1.0 - 2.0 * sxy / sxx; /* DeepGEMM's calc_diff */
        printf("fold emulation vs fp32, K = %lld: diff %.3g\n", (long long)K, diff);
        assert_true(diff < 2e-3);
        const int32_t Ps[] = {1, 2, 8, 0};
        for (int pi = 0; pi < 4; pi++) {
            assert_true(fm_w4a8_fold_ref(m.q, m.scales, rows, K, x8, ldx, xs, 0, false, N, Ps[pi], y1));
            for (int64_t i = 0; i < N * rows; i++) assert_true(fabsf(y1[i] - y[i]) <= 1e-5f * (fabsf(y[i]) + 1.0f));
        }
        free(x), free(xs), free(x8), free(y), free(y1), free_p2(&m);
    }
}

/* activation scales per (token, 128-group), as the dispatch writes them: exact where the groups' quantization is,
 * and within the e4m3 error of fp32 math */
static void test_emulation_per_group(void **state) {
    (void)state;
    seed(5);
    const int64_t rows = 24, K = 640, G = 5, N = 7;
    p2_matrix m = make_p2(rows, K);
    float *x = malloc((size_t)(N * K) * sizeof(float)), *xs = malloc((size_t)(G * N) * sizeof(float));
    uint8_t *x8 = malloc((size_t)(N * K));
    float *y = malloc((size_t)(N * rows) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) { /* each group exact: e4m3 values x 2^e with amax 448 x 2^e */
            const int e = (int)(urand() * 30) - 15;
            for (int64_t i = 128 * g; i < 128 * (g + 1); i++)
                x[n * K + i] = ldexpf(fm_e4m3_to_f32(fm_f32_to_e4m3(50.0f * gauss())), e);
            x[n * K + 128 * g + (n + g) % 128] = ldexpf(448.0f, e);
        }
    for (int64_t n = 0; n < N; n++) {
        float s[5];
        fm_e4m3_quantize_groups(x + n * K, K, 128, x8 + n * K, s);
        for (int64_t g = 0; g < G; g++) xs[g * N + n] = s[g];
    }
    assert_true(fm_w4a8_fold_ref(m.q, m.scales, rows, K, x8, K, xs, N, true, N, 0, y));
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < rows; r++) {
            double mag = 0.0;
            for (int64_t i = 0; i < K; i++)
                mag += fabs((double)m.q[r * K + i] * m.scales[r * m.G + i / 128] * x[n * K + i]);
            assert_true(fabs(y[n * rows + r] - dot_exact(&m, r, x + n * K)) <= 4e-7 * mag + 1e-30);
        }
    free(x), free(xs), free(x8), free(y), free_p2(&m);
}

static void test_refuses_non_p2(void **state) {
    (void)state;
    seed(4);
    p2_matrix m = make_p2(4, 256);
    uint8_t x8[256] = {0};
    float xs = 1.0f, y[4];
    m.scales[2 * m.G + 1] *= 1.5f; /* row 2: one scale off the powers of two */
    assert_false(fm_w4a8_fold_ref(m.q, m.scales, 4, 256, x8, 256, &xs, 0, false, 1, FM_FOLD_PROMOTE, y));
    m.scales[2 * m.G + 1] /= 1.5f;
    assert_true(fm_w4a8_fold_ref(m.q, m.scales, 4, 256, x8, 256, &xs, 0, false, 1, FM_FOLD_PROMOTE, y));
    free_p2(&m);
}

/* The warp-specialised kernel's split of a packed bank's scales: rs 2^-6 x 2^j = each group's scale exactly, j in
 * the table's range, padded rows zero; a row off the int4-p2 form named */
static void test_split_scales(void **state) {
    (void)state;
    seed(5);
    const int64_t rows = 40, K = 520, G = 5, rows_pad = 64;
    const int32_t n = 2;
    uint16_t *sc = malloc((size_t)(n * G * rows_pad) * 2);
    for (int32_t e = 0; e < n; e++) {
        p2_matrix m = make_p2(rows, K);
        uint8_t *codes = malloc((size_t)(rows_pad * G * 64));
        fm_w4a8_fold_pack(m.q, m.scales, rows, K, e == 1, rows_pad, codes, sc + e * G * rows_pad);
        free(codes), free_p2(&m);
    }
    int8_t *j = malloc((size_t)(n * G * rows_pad));
    float *rs = malloc((size_t)(n * rows_pad) * sizeof(float));
    int32_t bm = 7;
    int64_t br = 7;
    assert_true(fm_w4a8_fold_split_scales(sc, n, rows, rows_pad, G, j, rs, &bm, &br));
    for (int32_t e = 0; e < n; e++)
        for (int64_t r = 0; r < rows_pad; r++) {
            const float row = rs[e * rows_pad + r];
            if (r >= rows) assert_true(row == 0.0f);
            for (int64_t g = 0; g < G; g++) {
                const int32_t jj = j[(e * G + g) * rows_pad + r];
                const float s = fm_bf16_to_f32(sc[(e * G + g) * rows_pad + r]);
                assert_true(jj >= FM_FOLD_J_MIN && jj <= FM_FOLD_J_MAX);
                assert_true(ldexpf(row, jj) == s); /* rs 2^-6 x 2^(k + 6) = rs 2^k */
            }
        }
    sc[(1 * G + 3) * rows_pad + 17] = fm_f32_to_bf16(fm_bf16_to_f32(sc[(1 * G + 3) * rows_pad + 17]) * 1.5f);
    assert_false(fm_w4a8_fold_split_scales(sc, n, rows, rows_pad, G, j, rs, &bm, &br));
    assert_int_equal(bm, 1);
    assert_int_equal(br, 17);
    free(sc), free(j), free(rs);
}

static void test_cpu_route(void **state) {
    (void)state;
    seed(6);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan); /* the GPU's formats, emulated */
    plan.int4_p2 = true;                               /* the route's weights (int4-g128 ones are refused, below) */
    fm_backend *be[2] = {NULL, NULL};
    fm_error err = {{0}};
    assert_int_equal(fm_backend_create("cpu", &plan, 1, NULL, &be[0], &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &plan, 1, "w4a8.kernel=fold", &be[1], &err), FM_OK);
    fm_plan p4 = plan;
    fm_backend *bad = NULL;
    assert_int_equal(fm_plan_set_dispatch(&p4, FM_DISPATCH_MXFP4, &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &p4, 1, "w4a8.kernel=fold", &bad, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "w4a8.kernel=fold reads e4m3 activations"));
    assert_null(bad);

    const int32_t E = 2, k = 2;
    const int64_t T = 4, H = 256, I = 128;
    moe_fixture f;
    moe_fixture_init(&f, E, H, I);
    fm_bank *b[2][2];
    moe_fixture_banks(&f, be, plan.w_expert, b);
    /* int4-g128 scales under the route: refused by name, as the cuda backend refuses them */
    fm_plan pg = plan;
    pg.int4_p2 = false;
    fm_backend *g128 = NULL;
    fm_bank *nb = NULL;
    assert_int_equal(fm_backend_create("cpu", &pg, 1, "w4a8.kernel=fold", &g128, &err), FM_OK);
    assert_int_equal(g128->ops->bank_create(g128, &f.gate_up, pg.w_expert, &nb, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "needs int4-p2 scales"));
    assert_null(nb);
    g128->ops->destroy(g128);
    float x[4 * 256], w[8], o[2][4 * 256];
    const int32_t ids[8] = {0, 1, 1, 0, 0, 1, 1, 0};
    for (int64_t t = 0; t < T; t++) {
        const int e = (int)t - 3; /* rows 0, 1: every group's amax 448 x 2^e, values e4m3 x 2^e */
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = t < 2 ? ldexpf(fm_e4m3_to_f32(fm_f32_to_e4m3(60.0f * gauss())), e) : gauss();
        if (t < 2) x[t * H + 5] = ldexpf(448.0f, e), x[t * H + 128 + 77] = ldexpf(-448.0f, e);
        w[2 * t] = 0.625f, w[2 * t + 1] = 0.375f;
    }
    for (int i = 0; i < 2; i++)
        be[i]->ops->moe(be[i], b[i][0], b[i][1], x, T, ids, w, k, plan.a_dispatch, plan.a_expert, o[i]);
    assert_memory_equal(o[0], o[1], (size_t)(2 * H) * sizeof(float)); /* the same codes and scales */
    assert_memory_not_equal(o[0] + 2 * H, o[1] + 2 * H, (size_t)(2 * H) * sizeof(float)); /* per token */
    double d = 0.0, n = 0.0;
    for (int64_t i = 2 * H; i < T * H; i++) d += (o[0][i] - o[1][i]) * (o[0][i] - o[1][i]), n += o[0][i] * o[0][i];
    assert_true(sqrt(d / n) < 0.1); /* two e4m3 roundings of the same activations */
    /* the warp-specialised GEMMs' form (w4a8.fold_ws=on): h with one scale per token, which for I = 128 (one group)
       is the per-128-channel scale: the same output bit for bit (moe.gemv=off: the route skips the GEMVs' pairs) */
    fm_backend *ws = NULL;
    fm_bank *wb[2];
    float ow[4 * 256];
    assert_int_equal(fm_backend_create("cpu", &plan, 1, "w4a8.kernel=fold,w4a8.fold_ws=on,moe.gemv=off", &ws, &err),
                     FM_OK);
    assert_int_equal(ws->ops->bank_create(ws, &f.gate_up, plan.w_expert, &wb[0], &err), FM_OK);
    assert_int_equal(ws->ops->bank_create(ws, &f.down, plan.w_expert, &wb[1], &err), FM_OK);
    ws->ops->moe(ws, wb[0], wb[1], x, T, ids, w, k, plan.a_dispatch, plan.a_expert, ow);
    assert_memory_equal(o[1], ow, sizeof ow);
    ws->ops->bank_free(ws, wb[0]), ws->ops->bank_free(ws, wb[1]), ws->ops->destroy(ws);
    for (int i = 0; i < 2; i++) {
        be[i]->ops->bank_free(be[i], b[i][0]), be[i]->ops->bank_free(be[i], b[i][1]);
        be[i]->ops->destroy(be[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_conversion), cmocka_unit_test(test_conversion_exhaustive),
        cmocka_unit_test(test_emulation_exact),       cmocka_unit_test(test_emulation_vs_fp32),
        cmocka_unit_test(test_emulation_per_group),   cmocka_unit_test(test_refuses_non_p2),
        cmocka_unit_test(test_split_scales),          cmocka_unit_test(test_cpu_route),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
