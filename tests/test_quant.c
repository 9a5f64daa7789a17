/* Scalar codec tests: bf16/f16, e4m3, e2m1 (+ MXFP4/NVFP4 blocks), int4 groups (and int4-p2's power-of-two ones).
 * Exact codec behaviour is checked against tables from ml_dtypes/numpy (tests/data/codec, see
 * tools/make_codec_tables.py); the block quantizers are checked for their error bounds and layouts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/bf16.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "quant/int4_p2.h"

#define TABLE_DIR "tests/data/codec/"

/* ---------------------------------------------------------------- helpers */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef struct pair {
    uint32_t a, b;
} pair;

/* Reads "<a> <b>" lines; base_a/base_b are 10 or 16. Returns the number of records (fails the test on error). */
static int64_t load_pairs(const char *name, int base_a, int base_b, pair **out) {
    char path[256];
    snprintf(path, sizeof path, TABLE_DIR "%s", name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (tests run from the repository root)", path);
    int64_t n = 0, cap = 1024;
    pair *p = malloc((size_t)cap * sizeof *p);
    assert_non_null(p);
    char sa[32], sb[32];
    while (fscanf(f, "%31s %31s", sa, sb) == 2) {
        if (n == cap) {
            cap *= 2;
            p = realloc(p, (size_t)cap * sizeof *p);
            assert_non_null(p);
        }
        char *ea, *eb;
        p[n].a = (uint32_t)strtoul(sa, &ea, base_a);
        p[n].b = (uint32_t)strtoul(sb, &eb, base_b);
        if (*ea || *eb) fail_msg("%s: bad record %lld: '%s %s'", path, (long long)n + 1, sa, sb);
        n++;
    }
    fclose(f);
    *out = p;
    return n;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_u64(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; } /* [0, 1) */

static float rng_normal(void) {
    double u1 = rng_unit(), u2 = rng_unit();
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
}

/* Gap between e4m3 values around magnitude v (the binade of v; 2^-9 in the subnormal range). */
static double e4m3_ulp(double v) {
    if (v < 0x1p-6) return 0x1p-9;
    if (v >= 448.0) return 32.0;
    int e;
    frexp(v, &e); /* v in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 3);
}

/* Gap between e2m1 values around magnitude v; values above 6 count as the [4, 8) binade. */
static double e2m1_ulp(double v) {
    if (v < 2.0) return 0.5;
    if (v < 4.0) return 1.0;
    return 2.0;
}

static bool is_e2m1_value(double v) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (int i = 0; i < 8; i++)
        if (fabs(v) == mag[i]) return true;
    return false;
}

/* ---------------------------------------------------------------- e4m3 */

static void test_e4m3_decode_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("e4m3_decode.txt", 10, 16, &t);
    assert_int_equal(n, 256);
    int nans = 0;
    for (int64_t i = 0; i < n; i++) {
        float ref = u2f(t[i].b), got = fm_e4m3_to_f32((uint8_t)t[i].a);
        if (isnan(ref)) {
            assert_true(isnan(got));
            nans++;
        } else if (f2u(got) != t[i].b) {
            fail_msg("e4m3 code %u: got %08x, ml_dtypes %08x", t[i].a, f2u(got), t[i].b);
        }
    }
    assert_int_equal(nans, 2); /* 0x7F and 0xFF */
    assert_true(isnan(fm_e4m3_to_f32(0x7F)) && isnan(fm_e4m3_to_f32(0xFF)));
    free(t);
}

static void test_e4m3_encode_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("e4m3_encode.txt", 16, 10, &t);
    assert_true(n > 7000);
    int nans = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = u2f(t[i].a);
        uint8_t got = fm_f32_to_e4m3(x);
        if (isnan(x)) {
            /* our policy: 0x7F | sign; the table holds ml_dtypes' NaN code, which must also be NaN */
            assert_int_equal(got, 0x7Fu | ((t[i].a >> 24) & 0x80u));
            assert_true(isnan(fm_e4m3_to_f32((uint8_t)t[i].b)));
            nans++;
        } else if (got != t[i].b) {
            fail_msg("e4m3 encode %08x (%a): got %u, ml_dtypes %u", t[i].a, (double)x, got, t[i].b);
        }
    }
    assert_true(nans >= 1);
    free(t);
}

static void test_e4m3_roundtrip_and_saturation(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = fm_e4m3_to_f32((uint8_t)c);
        if (isnan(v)) continue;
        assert_int_equal(fm_f32_to_e4m3(v), c);
        assert_int_equal(f2u(fm_e4m3_to_f32(fm_f32_to_e4m3(v))), f2u(v));
    }
    const float big[] = {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1e6f, 1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(fm_f32_to_e4m3(big[i]), 0x7E);
        assert_int_equal(fm_f32_to_e4m3(-big[i]), 0xFE);
    }
    assert_int_equal(fm_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(fm_f32_to_e4m3(-NAN), 0xFF);
    /* subnormal edges: 2^-10 is the tie between 0 and 2^-9 (to even: 0); just above it rounds up */
    assert_int_equal(fm_f32_to_e4m3(0x1p-10f), 0x00);
    assert_int_equal(fm_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)), 0x01);
    assert_int_equal(fm_f32_to_e4m3(-0x1p-9f), 0x81);
    assert_int_equal(fm_f32_to_e4m3(3 * 0x1p-10f), 0x02); /* 1.5 * 2^-9: tie between 1 and 2 -> 2 */
    assert_int_equal(fm_f32_to_e4m3(15 * 0x1p-10f),
                     0x08); /* 7.5 * 2^-9: tie to even 8 * 2^-9 = 2^-6, the first normal */
    assert_int_equal(fm_f32_to_e4m3(FLT_TRUE_MIN), 0x00);
    assert_int_equal(fm_f32_to_e4m3(-0.0f), 0x80);
}

static void test_e4m3_groups(void **state) {
    (void)state;
    const int32_t G = 128;
    const int64_t K = 3 * G + 44; /* partial last group */
    float *x = malloc(K * sizeof *x);
    uint8_t *codes = malloc(K);
    float scales[4];
    assert_true(x && codes);
    const float mags[4] = {3.0f, 0.0f, 1e-3f, 250.0f}; /* group 1 is all zero */
    for (int64_t i = 0; i < K; i++) x[i] = i / G == 1 ? 0.0f : mags[i / G] * rng_normal();
    x[3 * G + 5] = -mags[3] * 9.0f; /* the partial group's amax is negative */
    fm_e4m3_quantize_groups(x, K, G, codes, scales);
    for (int g = 0; g < 4; g++) {
        int64_t g0 = g * G, g1 = g0 + G < K ? g0 + G : K;
        float amax = 0.0f;
        for (int64_t i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(x[i]));
        assert_true(isfinite(scales[g]) && scales[g] > 0.0f);
        assert_true(f2u(scales[g]) == f2u(fmaxf(amax / 448.0f, FM_ACT_SCALE_FLOOR)));
        bool hit_max = false;
        for (int64_t i = g0; i < g1; i++) {
            double s = scales[g];
            double v = fabs((double)x[i] / s);
            double deq = (double)fm_e4m3_to_f32(codes[i]) * s;
            double err = fabs((double)x[i] - deq);
            double bound = 0.5 * e4m3_ulp(v) * s * (1.0 + 1e-6);
            if (err > bound)
                fail_msg("group %d elem %lld: x=%g deq=%g err=%g > %g", g, (long long)i, x[i], deq, err, bound);
            assert_false(isnan(fm_e4m3_to_f32(codes[i])));
            if (fabsf(x[i]) == amax && amax > 0.0f) {
                assert_int_equal(codes[i] & 0x7F, 0x7E); /* amax maps to +-448 */
                hit_max = true;
            }
            if (g == 1) assert_int_equal(codes[i], 0);
        }
        assert_true(hit_max || g == 1);
    }
    assert_true(scales[1] == FM_ACT_SCALE_FLOOR);
    free(x);
    free(codes);
}

/* ---------------------------------------------------------------- e2m1, e8m0 */

static void test_e2m1_decode_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("e2m1_decode.txt", 10, 16, &t);
    assert_int_equal(n, 16);
    for (int64_t i = 0; i < n; i++) assert_int_equal(f2u(fm_e2m1_to_f32((uint8_t)t[i].a)), t[i].b);
    /* only the low nibble is used */
    assert_int_equal(f2u(fm_e2m1_to_f32(0xF7)), f2u(6.0f));
    free(t);
}

static void test_e2m1_encode_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("e2m1_encode.txt", 16, 10, &t);
    assert_true(n > 6000);
    for (int64_t i = 0; i < n; i++) {
        uint8_t got = fm_f32_to_e2m1(u2f(t[i].a));
        if (got != t[i].b)
            fail_msg("e2m1 encode %08x (%a): got %u, ml_dtypes %u", t[i].a, (double)u2f(t[i].a), got, t[i].b);
    }
    free(t);
}

static void test_e2m1_ties_and_policy(void **state) {
    (void)state;
    /* RNE ties go to the even mantissa */
    const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float want[7] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
    for (int i = 0; i < 7; i++) {
        assert_true(fm_e2m1_to_f32(fm_f32_to_e2m1(tie[i])) == want[i]);
        assert_true(fm_e2m1_to_f32(fm_f32_to_e2m1(-tie[i])) == -want[i]);
        /* either side of the tie goes to the nearer neighbour */
        float lo = fm_e2m1_to_f32(fm_f32_to_e2m1(nextafterf(tie[i], 0.0f)));
        float hi = fm_e2m1_to_f32(fm_f32_to_e2m1(nextafterf(tie[i], 10.0f)));
        assert_true(lo < tie[i] && hi > tie[i]);
    }
    for (int c = 0; c < 16; c++) assert_int_equal(fm_f32_to_e2m1(fm_e2m1_to_f32((uint8_t)c)), c); /* -0 -> 8 included */
    assert_int_equal(fm_f32_to_e2m1(6.5f), 0x7);
    assert_int_equal(fm_f32_to_e2m1(1e30f), 0x7);
    assert_int_equal(fm_f32_to_e2m1(INFINITY), 0x7);
    assert_int_equal(fm_f32_to_e2m1(-INFINITY), 0xF);
    assert_int_equal(fm_f32_to_e2m1(-0.1f), 0x8);
    /* NaN policy: +6 whatever the sign */
    assert_int_equal(fm_f32_to_e2m1(NAN), 0x7);
    assert_int_equal(fm_f32_to_e2m1(-NAN), 0x7);
}

static void test_e8m0_decode_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("e8m0_decode.txt", 10, 16, &t);
    assert_int_equal(n, 256);
    for (int64_t i = 0; i < n; i++) {
        float got = fm_e8m0_to_f32((uint8_t)t[i].a);
        if (isnan(u2f(t[i].b))) assert_true(isnan(got));
        else assert_int_equal(f2u(got), t[i].b);
    }
    assert_true(isnan(fm_e8m0_to_f32(0xFF)));
    assert_true(fm_e8m0_to_f32(127) == 1.0f && fm_e8m0_to_f32(0) == 0x1p-127f);
    free(t);
}

/* ---------------------------------------------------------------- bf16, f16 */

static void test_bf16_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("bf16_encode.txt", 16, 16, &t);
    assert_true(n > 10000);
    for (int64_t i = 0; i < n; i++) {
        uint16_t got = fm_f32_to_bf16(u2f(t[i].a));
        if (got != t[i].b) fail_msg("bf16 encode %08x: got %04x, ml_dtypes %04x", t[i].a, got, t[i].b);
        assert_int_equal(f2u(fm_round_bf16(u2f(t[i].a))), t[i].b << 16);
    }
    free(t);
    /* every non-NaN bf16 survives a round trip; NaN stays NaN (quiet) */
    for (uint32_t h = 0; h < 65536; h++) {
        float v = fm_bf16_to_f32((uint16_t)h);
        assert_int_equal(f2u(v), h << 16);
        if (!isnan(v)) assert_int_equal(fm_f32_to_bf16(v), h);
    }
    uint16_t q = fm_f32_to_bf16(u2f(0x7F800001u)); /* signalling NaN whose payload is all in the low bits */
    assert_true(isnan(fm_bf16_to_f32(q)) && (q & 0x0040u));
    assert_true(fm_f32_to_bf16(u2f(0xFFC00000u)) == 0xFFC0u);
    float arr[3] = {1.00390625f, -3.0e38f, NAN}; /* 1 + 2^-8: tie -> 1; huge stays finite; NaN */
    fm_round_bf16_array(arr, 3);
    assert_true(arr[0] == 1.0f && arr[1] == fm_bf16_to_f32(fm_f32_to_bf16(-3.0e38f)) && isnan(arr[2]));
}

/* Independent decode of an f16 code, for the exhaustive round trip. */
static double f16_value(uint16_t h) {
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_f16_table(void **state) {
    (void)state;
    pair *t;
    int64_t n = load_pairs("f16_encode.txt", 16, 16, &t);
    assert_true(n > 10000);
    for (int64_t i = 0; i < n; i++) {
        uint16_t got = fm_f32_to_f16(u2f(t[i].a));
        if (got != t[i].b)
            fail_msg("f16 encode %08x (%a): got %04x, numpy %04x", t[i].a, (double)u2f(t[i].a), got, t[i].b);
    }
    free(t);
    for (uint32_t h = 0; h < 65536; h++) {
        float v = fm_f16_to_f32((uint16_t)h);
        double ref = f16_value((uint16_t)h);
        if (isnan(ref)) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == ref && !signbit(v) == !signbit(ref));
        assert_int_equal(fm_f32_to_f16(v), h);
        assert_true(f2u(fm_round_f16(v)) == f2u(v));
    }
    /* subnormals, overflow, NaN */
    assert_int_equal(fm_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(fm_f32_to_f16(0x1p-25f), 0x0000); /* tie -> even (0) */
    assert_int_equal(fm_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(fm_f32_to_f16(3 * 0x1p-25f), 0x0002);               /* 1.5 ulp tie -> 2 */
    assert_int_equal(fm_f32_to_f16(nextafterf(0x1p-14f, 0.0f)), 0x0400); /* rounds up to the first normal */
    assert_int_equal(fm_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(fm_f32_to_f16(65519.99f), 0x7BFF);
    assert_int_equal(fm_f32_to_f16(65520.0f), 0x7C00); /* tie to even overflows to inf */
    assert_int_equal(fm_f32_to_f16(-1e10f), 0xFC00);
    uint16_t q = fm_f32_to_f16(u2f(0xFF800001u));
    assert_true((q & 0x8000u) && (q & 0x7C00u) == 0x7C00u && (q & 0x0200u)); /* -NaN, quiet */
}

/* ---------------------------------------------------------------- MXFP4 */

static uint8_t nib(const uint8_t *packed, int64_t i) { return (packed[i / 2] >> (4 * (i % 2))) & 0xF; }

/* Random blocks, each at its own magnitude (2^-20 .. 2^20) so many different scale bytes appear. */
static void fill_blocks(float *x, int64_t n, int block) {
    float mag = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % block == 0) mag = ldexpf(1.0f + (float)rng_unit(), (int)(rng_u64() % 41) - 20);
        x[i] = mag * rng_normal();
    }
}

static void check_mx(const float *x, int64_t n, fm_mx_rule rule) {
    int64_t nb = (n + FM_MX_BLOCK - 1) / FM_MX_BLOCK;
    uint8_t *packed = malloc((size_t)(n + 1) / 2), *sc = malloc((size_t)nb);
    float *deq = malloc((size_t)n * sizeof *deq);
    assert_true(packed && sc && deq);
    memset(packed, 0xAA, (size_t)(n + 1) / 2); /* poison: the quantizer must write every byte */
    fm_mxfp4_quantize(x, n, rule, packed, sc);
    fm_mxfp4_dequantize(packed, sc, n, deq);
    if (n & 1) assert_int_equal(packed[n / 2] >> 4, 0);
    for (int64_t b = 0; b < nb; b++) {
        int64_t b0 = b * FM_MX_BLOCK, b1 = b0 + FM_MX_BLOCK < n ? b0 + FM_MX_BLOCK : n;
        double X = fm_e8m0_to_f32(sc[b]);
        assert_true(sc[b] != 0xFF && X > 0.0);
        double amax = 0.0;
        for (int64_t i = b0; i < b1; i++) amax = fmax(amax, fabs(x[i]));
        if (rule == FM_MX_RCEIL) {
            assert_true(amax / X <= 6.0);      /* nothing clips ... */
            assert_true(amax / (X / 2) > 6.0); /* ... and X is the smallest power of two for which that holds */
        } else {
            assert_true(amax / X >= 4.0 && amax / X < 8.0); /* X = 2^(floor(log2 amax) - 2) */
        }
        for (int64_t i = b0; i < b1; i++) {
            double v = fabs(x[i]) / X;
            double e = fm_e2m1_to_f32(nib(packed, i));
            /* dequantized value is exactly element * X, and element is an E2M1 value */
            assert_true((double)deq[i] == e * X && is_e2m1_value(deq[i] / X));
            double err = fabs((double)x[i] - deq[i]);
            if (v > 6.0) {
                assert_true(rule == FM_MX_FLOOR && fabs((double)deq[i]) == 6.0 * X); /* clipped to +-6X */
                assert_true(!signbit(deq[i]) == !signbit(x[i]));
            } else if (err > 0.5 * e2m1_ulp(v) * X) {
                fail_msg("mx rule %d elem %lld: x=%g deq=%g X=%g", (int)rule, (long long)i, x[i], deq[i], X);
            }
        }
    }
    free(packed);
    free(sc);
    free(deq);
}

static void test_mxfp4_random(void **state) {
    (void)state;
    const int64_t n = 40 * FM_MX_BLOCK + 13; /* odd, partial last block */
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (int rep = 0; rep < 20; rep++) {
        fill_blocks(x, n, FM_MX_BLOCK);
        check_mx(x, n, FM_MX_RCEIL);
        check_mx(x, n, FM_MX_FLOOR);
    }
    free(x);
}

static void test_mxfp4_rules_and_edges(void **state) {
    (void)state;
    float x[FM_MX_BLOCK * 3 + 5];
    uint8_t packed[sizeof x / sizeof x[0] / 2 + 1], sc[4];
    float deq[sizeof x / sizeof x[0]];
    const int64_t n = sizeof x / sizeof x[0];
    /* block 0: amax 7.5. FLOOR: X = 2^(2-2) = 1, 7.5 clips to 6. RCEIL: X = 2^ceil(log2 1.25) = 2, 7.5/2 -> 4 */
    /* block 1: all zero. block 2: amax exactly 6 (both rules: X = 1). block 3 (partial, 5): amax 1e-40 */
    for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
    x[3] = 7.5f;
    x[4] = -1.0f;
    x[2 * FM_MX_BLOCK + 1] = -6.0f;
    x[2 * FM_MX_BLOCK + 2] = 0.75f;
    x[3 * FM_MX_BLOCK + 4] = 1e-40f;

    fm_mxfp4_quantize(x, n, FM_MX_FLOOR, packed, sc);
    fm_mxfp4_dequantize(packed, sc, n, deq);
    assert_int_equal(sc[0], 127);
    assert_true(deq[3] == 6.0f && deq[4] == -1.0f);
    assert_int_equal(sc[1], 0); /* all-zero block: smallest scale */
    for (int i = FM_MX_BLOCK; i < 2 * FM_MX_BLOCK; i++) assert_true(nib(packed, i) == 0 && deq[i] == 0.0f);
    assert_int_equal(sc[2], 127);
    assert_true(deq[2 * FM_MX_BLOCK + 1] == -6.0f && deq[2 * FM_MX_BLOCK + 2] == 1.0f); /* 0.75 ties to 1 */
    assert_int_equal(sc[3], 0); /* exponent clamped at 0, not wrapped */
    assert_true(deq[3 * FM_MX_BLOCK + 4] == 0.0f);
    assert_int_equal(packed[n / 2] >> 4, 0);

    fm_mxfp4_quantize(x, n, FM_MX_RCEIL, packed, sc);
    fm_mxfp4_dequantize(packed, sc, n, deq);
    assert_int_equal(sc[0], 128);
    assert_true(deq[3] == 8.0f && deq[4] == -1.0f);
    assert_int_equal(sc[1], 0);
    assert_int_equal(sc[2], 127);
    assert_int_equal(sc[3], 0);
    for (int64_t i = 0; i < n; i++) assert_false(isnan(deq[i]));

    /* the top of the range: FLOOR never exceeds 252, +-inf clamps to 254 (never the NaN byte) */
    float big[FM_MX_BLOCK] = {0};
    big[0] = FLT_MAX;
    fm_mxfp4_quantize(big, FM_MX_BLOCK, FM_MX_FLOOR, packed, sc);
    assert_int_equal(sc[0], 252);
    big[1] = -INFINITY;
    fm_mxfp4_quantize(big, FM_MX_BLOCK, FM_MX_RCEIL, packed, sc);
    assert_int_equal(sc[0], 254);
    assert_int_equal(nib(packed, 1), 0xF);
}

/* ---------------------------------------------------------------- NVFP4 */

static void test_nvfp4_random(void **state) {
    (void)state;
    const int64_t n = 50 * FM_NV_BLOCK + 7;
    const int64_t nb = (n + FM_NV_BLOCK - 1) / FM_NV_BLOCK;
    float *x = malloc(n * sizeof *x), *deq = malloc(n * sizeof *deq);
    uint8_t *packed = malloc((size_t)(n + 1) / 2), *sc = malloc((size_t)nb);
    assert_true(x && deq && packed && sc);
    for (int rep = 0; rep < 20; rep++) {
        /* block magnitudes within 2^-7 of each other keep every block scale an e4m3 normal */
        float mag = 1.0f;
        for (int64_t i = 0; i < n; i++) {
            if (i % FM_NV_BLOCK == 0) mag = ldexpf(1.0f + (float)rng_unit(), -(int)(rng_u64() % 7)) * 37.0f;
            x[i] = mag * rng_normal();
        }
        float ts = fm_nvfp4_tensor_scale(x, n);
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        assert_true(ts == amax / 2688.0f);
        memset(packed, 0xAA, (size_t)(n + 1) / 2);
        fm_nvfp4_quantize(x, n, ts, packed, sc);
        fm_nvfp4_dequantize(packed, sc, ts, n, deq);
        assert_int_equal(packed[n / 2] >> 4, 0);
        bool saw_448 = false;
        for (int64_t b = 0; b < nb; b++) {
            int64_t b0 = b * FM_NV_BLOCK, b1 = b0 + FM_NV_BLOCK < n ? b0 + FM_NV_BLOCK : n;
            float bamax = 0.0f;
            for (int64_t i = b0; i < b1; i++) bamax = fmaxf(bamax, fabsf(x[i]));
            assert_int_equal(sc[b], fm_f32_to_e4m3(bamax / (6.0f * ts)));
            float bs = fm_e4m3_to_f32(sc[b]);
            assert_true(bs >= 0x1p-6f && bs <= 448.0f);
            saw_448 |= bs == 448.0f;
            double d = (double)(ts * bs);
            for (int64_t i = b0; i < b1; i++) {
                double e = fm_e2m1_to_f32(nib(packed, i));
                /* one rounding: the fp32 nearest to element * bs * ts */
                assert_true(deq[i] == (float)(e * bs * ts));
                double v = fabs(x[i]) / d;
                /* a block scale rounded down by at most 1/16 can push v to 6.375: the clip error
                 * (<= 0.375 d) stays inside the [4, 8) half-ulp */
                assert_true(v < 6.4);
                double err = fabs((double)x[i] - e * d);
                if (err > 0.5 * e2m1_ulp(v) * d * (1.0 + 1e-6))
                    fail_msg("nv elem %lld: x=%g deq=%g d=%g", (long long)i, x[i], deq[i], d);
            }
        }
        assert_true(saw_448); /* the block holding the tensor amax uses the full e4m3 range */
    }
    free(x);
    free(deq);
    free(packed);
    free(sc);
}

static void test_nvfp4_edges(void **state) {
    (void)state;
    enum { N = 3 * FM_NV_BLOCK + 3 };
    float x[N] = {0}, deq[N];
    uint8_t packed[N / 2 + 1], sc[4];
    /* all-zero tensor: the floored tensor scale, zero block scales, zero codes, zero output */
    float ts = fm_nvfp4_tensor_scale(x, N);
    assert_true(ts == FM_NVFP4_TENSOR_SCALE_FLOOR && isfinite(ts) && ts > 0.0f);
    fm_nvfp4_quantize(x, N, ts, packed, sc);
    fm_nvfp4_dequantize(packed, sc, ts, N, deq);
    for (int i = 0; i < 4; i++) assert_int_equal(sc[i], 0);
    for (int i = 0; i < N; i++) assert_true(nib(packed, i) == 0 && deq[i] == 0.0f);

    /* block 0 large; block 1 zero; block 2 so small its e4m3 scale rounds to 0 -> zeros;
     * partial block 3 holds +inf, which the tensor scale ignores and the block saturates */
    for (int i = 0; i < FM_NV_BLOCK; i++) x[i] = (float)(i - 7) * 100.0f;
    x[2 * FM_NV_BLOCK + 3] = 1e-4f;
    x[3 * FM_NV_BLOCK + 1] = INFINITY;
    x[3 * FM_NV_BLOCK + 2] = -50.0f;
    ts = fm_nvfp4_tensor_scale(x, N);
    assert_true(ts == 800.0f / 2688.0f);
    fm_nvfp4_quantize(x, N, ts, packed, sc);
    fm_nvfp4_dequantize(packed, sc, ts, N, deq);
    assert_int_equal(sc[0], 0x7E);
    assert_int_equal(sc[1], 0);
    assert_int_equal(sc[2], 0);
    for (int i = FM_NV_BLOCK; i < 3 * FM_NV_BLOCK; i++) assert_true(nib(packed, i) == 0 && deq[i] == 0.0f);
    assert_int_equal(sc[3], 0x7E); /* inf / (6 ts) saturates to 448 */
    assert_int_equal(nib(packed, 3 * FM_NV_BLOCK + 1), 0x7);
    assert_true(deq[3 * FM_NV_BLOCK + 1] == (float)(6.0 * 448.0 * ts));
    assert_true(fabsf(deq[15] - 800.0f) < 1e-3f && deq[0] == -deq[15]); /* -700 / (448 ts) = -5.25 -> -6 */
    assert_int_equal(packed[N / 2] >> 4, 0);
    for (int i = 0; i < N; i++) assert_false(isnan(deq[i]));
}

/* ---------------------------------------------------------------- FP4 -> e4m3 expansion (the GEMM's) */

/* MXFP4: every code times 2^-d (d = binades below the group's largest block scale) is an e4m3 value for d <= 8, so
 * the expanded codes times the group scale are the dequantized buffer bit for bit; d = 9..12 round into the e4m3
 * subnormals (0.5 x 2^-9 ties to 0), d >= 13 gives 0. NVFP4: each element is within half an e4m3 ulp (2^-4
 * relative, plus the subnormal spacing 2^-10 x S) of its exact value; the largest block is exact. */
static void test_fp4_expand_e4m3(void **state) {
    (void)state;
    enum { N = 128 + 96 }; /* a full group and a partial one (3 MX blocks, 6 NV blocks) */
    float x[N], deq[N];
    uint8_t packed[N / 2], sc[N / 16], e4[128];
    for (int rep = 0; rep < 200; rep++) {
        /* MX: block magnitudes 2^0 .. 2^-(rep % 14) */
        for (int i = 0; i < N; i++) x[i] = ldexpf((float)rng_normal(), -(int)((i / 32) * (rep % 14) / 3));
        fm_mxfp4_quantize(x, N, FM_MX_RCEIL, packed, sc);
        fm_mxfp4_dequantize(packed, sc, N, deq);
        for (int g = 0; g < 2; g++) {
            const int k0 = g * 128, n = N - k0 < 128 ? N - k0 : 128;
            const float S = fm_mxfp4_expand_e4m3(packed + k0 / 2, sc + k0 / 32, n, e4);
            uint8_t smax = 0;
            for (int b = 0; b < (n + 31) / 32; b++) smax = sc[k0 / 32 + b] > smax ? sc[k0 / 32 + b] : smax;
            assert_true(S == fm_e8m0_to_f32(smax));
            for (int i = 0; i < n; i++) {
                const int d = smax - sc[(k0 + i) / 32];
                const float v = fm_e2m1_to_f32(nib(packed, k0 + i));
                const float got = fm_e4m3_to_f32(e4[i]);
                if (d <= 8) assert_true(got * S == deq[k0 + i]);
                else assert_true(got == fm_e4m3_to_f32(fm_f32_to_e4m3(ldexpf(v, -d))));
                if (d >= 13) assert_true(got == 0.0f);
            }
        }
        /* NV */
        for (int i = 0; i < N; i++) x[i] = ldexpf((float)rng_normal(), -(int)((i / 16) % 5)) * 3.0f;
        const float ts = fm_nvfp4_tensor_scale(x, N);
        fm_nvfp4_quantize(x, N, ts, packed, sc);
        fm_nvfp4_dequantize(packed, sc, ts, N, deq);
        for (int g = 0; g < 2; g++) {
            const int k0 = g * 128, n = N - k0 < 128 ? N - k0 : 128;
            const float gs = fm_nvfp4_expand_e4m3(packed + k0 / 2, sc + k0 / 16, ts, n, e4);
            uint8_t smax = 0;
            for (int b = 0; b < (n + 15) / 16; b++) smax = sc[k0 / 16 + b] > smax ? sc[k0 / 16 + b] : smax;
            const float S = fm_e4m3_to_f32(smax);
            assert_true(gs == S * ts);
            for (int i = 0; i < n; i++) {
                const double exact = (double)fm_e2m1_to_f32(nib(packed, k0 + i)) * fm_e4m3_to_f32(sc[(k0 + i) / 16]) /
                                     S; /* in units of the group scale */
                const double got = fm_e4m3_to_f32(e4[i]);
                assert_true(fabs(got - exact) <= fabs(exact) / 16.0 + 0x1p-10);
                if (sc[(k0 + i) / 16] == smax) assert_true(got == exact);
            }
        }
    }
    /* NV: a group whose block scales are all 0 expands to zeros with scale 0 */
    memset(packed, 0x77, sizeof packed), memset(sc, 0, sizeof sc);
    assert_true(fm_nvfp4_expand_e4m3(packed, sc, 1.0f, 128, e4) == 0.0f);
    for (int i = 0; i < 128; i++) assert_int_equal(e4[i], 0);
    /* MX: a block 9 binades down: 6 x 2^-9 = 0.75 x 2^-6 is the subnormal 6 x 2^-9 (exact); 0.5 x 2^-9 = 2^-10 ties
       to 0; 1.5 x 2^-9 rounds to 2 x 2^-9 (tie to even) */
    memset(packed, 0, sizeof packed);
    uint8_t mx[4] = {127, 118, 127, 127};
    packed[16] = 0x7 | (0x1 << 4), packed[17] = 0x3 | (0xB << 4); /* elements 32..35: 6, 0.5, 1.5, -1.5 */
    assert_true(fm_mxfp4_expand_e4m3(packed, mx, 128, e4) == 1.0f);
    assert_true(fm_e4m3_to_f32(e4[32]) == 6.0f * 0x1p-9f && e4[33] == 0);
    assert_true(fm_e4m3_to_f32(e4[34]) == 0x1p-8f && fm_e4m3_to_f32(e4[35]) == -0x1p-8f);
}

/* ---------------------------------------------------------------- int4 */

static float to_dtype(float s, fm_scale_dtype dt) {
    return dt == FM_SCALE_BF16 ? fm_bf16_to_f32(fm_f32_to_bf16(s)) : fm_f16_to_f32(fm_f32_to_f16(s));
}

/* The dtype value just below s (s > 0 representable in dt). */
static float dtype_prev(float s, fm_scale_dtype dt) {
    return dt == FM_SCALE_BF16 ? fm_bf16_to_f32((uint16_t)(fm_f32_to_bf16(s) - 1))
                               : fm_f16_to_f32((uint16_t)(fm_f32_to_f16(s) - 1));
}

static void check_int4(bool sym, int32_t G, fm_scale_dtype dt) {
    enum { ROWS = 6, K = 200 };
    const int64_t ng = fm_int4_n_groups(K, G);
    float *w = malloc(ROWS * K * sizeof *w), *deq = malloc(ROWS * K * sizeof *deq);
    float *scales = malloc(ROWS * ng * sizeof *scales);
    int8_t *q = malloc(ROWS * K), *q2 = malloc(ROWS * K);
    uint8_t *zeros = malloc(ROWS * ng), *packed = malloc(ROWS * K / 2 + 1);
    assert_true(w && deq && scales && q && q2 && zeros && packed);
    const float outlier = 3000.0f;
    for (int r = 0; r < ROWS; r++) {
        float mag = ldexpf(0.02f, r - 2);
        for (int k = 0; k < K; k++) w[r * K + k] = mag * rng_normal() + (r == 2 ? 0.01f : 0.0f); /* row 2 off-centre */
    }
    for (int k = 0; k < K; k++) w[3 * K + k] = 0.0f;                /* an all-zero row */
    w[4 * K + 77] = outlier;                                        /* one huge outlier */
    for (int k = 0; k < K; k++) w[5 * K + k] = fabsf(w[5 * K + k]); /* all positive: asym min widens to 0 */

    memset(zeros, 0xEE, ROWS * ng);
    fm_int4_quantize(w, ROWS, K, &(fm_int4_params){G, sym, dt}, q, scales, sym ? NULL : zeros);
    fm_int4_dequantize(q, scales, sym ? NULL : zeros, ROWS, K, &(fm_int4_params){G, sym, dt}, deq);

    for (int r = 0; r < ROWS; r++) {
        for (int64_t g = 0; g < ng; g++) {
            int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
            float s = scales[r * ng + g];
            float mn = 0.0f, mx = 0.0f;
            for (int64_t k = k0; k < k1; k++) {
                mn = fminf(mn, w[r * K + k]);
                mx = fmaxf(mx, w[r * K + k]);
            }
            float sf = sym ? fmaxf(mx, -mn) / 7.0f : (mx - mn) / 15.0f;
            /* representable in the dtype, and the smallest such value >= the fp32 scale */
            assert_true(f2u(to_dtype(s, dt)) == f2u(s));
            assert_true(s >= sf);
            if (s > 0.0f) assert_true(dtype_prev(s, dt) < sf);
            int z = sym ? 0 : zeros[r * ng + g];
            assert_true(z >= 0 && z <= 15);
            for (int64_t k = k0; k < k1; k++) {
                int qi = q[r * K + k];
                assert_true(sym ? (qi >= -8 && qi <= 7) : (qi >= 0 && qi <= 15));
                double ref = (double)(qi - z) * s;
                assert_true((double)deq[r * K + k] == ref);
                double err = fabs((double)w[r * K + k] - ref);
                if (err > 0.5 * s * (1.0 + 1e-5))
                    fail_msg("int4 sym=%d G=%d dt=%d r=%d k=%lld: w=%g deq=%g s=%g", sym, G, dt, r, (long long)k,
                             w[r * K + k], deq[r * K + k], s);
            }
            if (r == 3) {
                assert_true(s == 0.0f);
                for (int64_t k = k0; k < k1; k++) assert_true(q[r * K + k] == z && deq[r * K + k] == 0.0f);
            }
        }
    }
    /* the outlier takes the top code; its neighbours in other groups keep small scales */
    assert_int_equal(q[4 * K + 77], sym ? 7 : 15);
    assert_true(deq[4 * K + 77] >= outlier * 0.9f);
    for (int64_t g = 0; g < ng; g++)
        if (g != 77 / G) assert_true(scales[4 * ng + g] < 1.0f);
    /* pack / unpack round trip, even and odd lengths */
    for (int64_t len = ROWS * K; len >= ROWS * K - 1; len--) {
        memset(q2, 0x55, ROWS * K);
        fm_int4_pack(q, len, packed);
        fm_int4_unpack(packed, len, sym, q2);
        assert_memory_equal(q, q2, (size_t)len);
    }
    free(w);
    free(deq);
    free(scales);
    free(q);
    free(q2);
    free(zeros);
    free(packed);
}

static void test_int4_groups(void **state) {
    (void)state;
    const int32_t groups[3] = {32, 64, 128};
    for (int sym = 0; sym < 2; sym++)
        for (int gi = 0; gi < 3; gi++)
            for (int dt = 0; dt < 2; dt++) check_int4(sym, groups[gi], dt ? FM_SCALE_F16 : FM_SCALE_BF16);
}

/* int4-p2: every row's scales are one bf16 row scale times 2^k (k in -12..0), codes -7..7, NaN -> 0, zero rows -> 0;
   each group's code is the nearest to w / scale; the squared error within 10 % of int4-g128's on rows whose groups
   spread as real weights do (the study: -2 .. +1.5 % in RMS, lab/w4a8_fold_study.c), and q x 2^k exact in e4m3. */
static void test_int4_p2(void **state) {
    (void)state;
    enum { ROWS = 40, K = 300 }; /* 3 groups, the last one partial */
    const int64_t ng = (K + 127) / 128;
    float *w = malloc(ROWS * K * sizeof *w), *scales = malloc(ROWS * ng * sizeof *scales);
    float *s128 = malloc(ROWS * ng * sizeof *s128);
    int8_t *q = malloc(ROWS * K), *q128 = malloc(ROWS * K);
    assert_true(w && scales && s128 && q && q128);
    for (int r = 0; r < ROWS; r++)
        for (int64_t g = 0; g < ng; g++) {
            const float gs = 0.02f * expf(0.35f * rng_normal()) * (r == 7 && g == 1 ? 1e-5f : 1.0f);
            for (int64_t k = g * 128; k < (g + 1) * 128 && k < K; k++) w[r * K + k] = gs * rng_normal();
        }
    for (int k = 0; k < K; k++) w[3 * K + k] = 0.0f;     /* an all-zero row */
    for (int k = 128; k < 256; k++) w[5 * K + k] = 0.0f; /* an all-zero group */
    w[9 * K + 10] = NAN;
    w[11 * K + 200] = 40.0f; /* an outlier: its group's scale is the row's */
    fm_int4_p2_quantize(w, ROWS, K, q, scales);
    fm_int4_quantize(w, ROWS, K, &(fm_int4_params){128, true, FM_SCALE_BF16}, q128, s128, NULL);
    double e_p2 = 0.0, e_g128 = 0.0;
    for (int r = 0; r < ROWS; r++) {
        float row_scale = -1.0f;
        int8_t k[3];
        assert_true(fm_int4_p2_split(scales + r * ng, ng, &row_scale, k));
        assert_true(f2u(fm_bf16_to_f32(fm_f32_to_bf16(row_scale))) == f2u(row_scale));
        for (int64_t g = 0; g < ng; g++) {
            const float s = scales[r * ng + g];
            assert_true(k[g] >= -FM_INT4_P2_KSPAN && k[g] <= 0);
            assert_true(s == (r == 3 ? 0.0f : ldexpf(row_scale, k[g])));
            for (int64_t i = g * 128; i < (g + 1) * 128 && i < K; i++) {
                const int qi = q[r * K + i];
                assert_true(qi >= -7 && qi <= 7);
                /* q 2^(k + 6) is an e4m3 value: the operand a folding kernel would multiply */
                const float op = ldexpf((float)qi, k[g] + 6);
                assert_true(fm_e4m3_to_f32(fm_f32_to_e4m3(op)) == op);
                if (isnan(w[r * K + i])) {
                    assert_int_equal(qi, 0);
                    continue;
                }
                if (s > 0.0f) {
                    const float c = nearbyintf(w[r * K + i] / s);
                    assert_true(qi == (c < -7.0f ? -7 : c > 7.0f ? 7 : (int)c));
                }
                const double d = (double)qi * s - w[r * K + i],
                             d128 = (double)q128[r * K + i] * s128[r * ng + g] - w[r * K + i];
                e_p2 += d * d, e_g128 += d128 * d128;
            }
        }
        if (r == 3) assert_true(row_scale == 0.0f);
    }
    assert_true(scales[11 * ng + 1] * 7.0f >= 40.0f * 0.5f);
    if (e_p2 > 1.1 * e_g128) fail_msg("int4-p2 squared error %g against int4-g128's %g", e_p2, e_g128);
    /* the form check refuses other scales */
    const float not_p2[3] = {1.0f, 0.75f, 0.5f}, too_far[2] = {1.0f, 0x1p-13f}, neg[2] = {1.0f, -0.5f};
    assert_false(fm_int4_p2_split(not_p2, 3, NULL, NULL));
    assert_false(fm_int4_p2_split(too_far, 2, NULL, NULL));
    assert_false(fm_int4_p2_split(neg, 2, NULL, NULL));
    free(w), free(scales), free(s128), free(q), free(q128);
}

static void test_int4_pack_layout(void **state) {
    (void)state;
    int8_t q[17], back[17];
    uint8_t packed[9];
    for (int i = 0; i < 16; i++) q[i] = (int8_t)(i - 8); /* every symmetric code */
    q[16] = -1;
    fm_int4_pack(q, 17, packed);
    assert_int_equal(packed[0], 0x98); /* -8 low nibble 0x8, -7 high nibble 0x9 */
    assert_int_equal(packed[4], 0x10); /* 0 low, 1 high */
    assert_int_equal(packed[8], 0x0F); /* odd tail: high nibble 0 */
    fm_int4_unpack(packed, 17, true, back);
    assert_memory_equal(q, back, 17);
    for (int i = 0; i < 16; i++) q[i] = (int8_t)i; /* every asymmetric code */
    fm_int4_pack(q, 16, packed);
    fm_int4_unpack(packed, 16, false, back);
    assert_memory_equal(q, back, 16);
    assert_int_equal(packed[7], 0xFE);
}

static void test_int4_saturated_f16_scale(void **state) {
    (void)state;
    /* a group beyond the fp16 range: the scale saturates at 65504 instead of becoming inf (no NaN out) */
    float w[32] = {0}, deq[32], s;
    int8_t q[32];
    w[0] = 1e6f;
    w[1] = -2.0f;
    fm_int4_params p = {32, true, FM_SCALE_F16};
    fm_int4_quantize(w, 1, 32, &p, q, &s, NULL);
    fm_int4_dequantize(q, &s, NULL, 1, 32, &p, deq);
    assert_true(s == 65504.0f);
    assert_int_equal(q[0], 7);
    assert_true(deq[0] == 7.0f * 65504.0f && deq[1] == 0.0f);
}

static void test_parallel_paths_match_serial(void **state) {
    (void)state;
    /* large enough for the OpenMP paths (> 2^18 elements); row-by-row calls stay serial */
    enum { ROWS = 1030, K = 264 };
    const fm_int4_params p = {64, false, FM_SCALE_BF16};
    const int64_t ng = fm_int4_n_groups(K, p.group);
    float *w = malloc(ROWS * K * sizeof *w), *sc = malloc(ROWS * ng * sizeof *sc), *sc1 = malloc(ng * sizeof *sc1);
    float *deq = malloc(ROWS * K * sizeof *deq), *deq1 = malloc(K * sizeof *deq1), *r = malloc(ROWS * K * sizeof *r);
    int8_t *q = malloc(ROWS * K), *q1 = malloc(K);
    uint8_t *z = malloc(ROWS * ng), *z1 = malloc(ng);
    assert_true(w && sc && sc1 && deq && deq1 && r && q && q1 && z && z1);
    for (int64_t i = 0; i < ROWS * K; i++) w[i] = rng_normal() * 0.05f;
    fm_int4_quantize(w, ROWS, K, &p, q, sc, z);
    fm_int4_dequantize(q, sc, z, ROWS, K, &p, deq);
    for (int64_t row = 0; row < ROWS; row++) {
        fm_int4_quantize(w + row * K, 1, K, &p, q1, sc1, z1);
        fm_int4_dequantize(q1, sc1, z1, 1, K, &p, deq1);
        assert_memory_equal(q + row * K, q1, K);
        assert_memory_equal(sc + row * ng, sc1, ng * sizeof *sc1);
        assert_memory_equal(z + row * ng, z1, ng);
        assert_memory_equal(deq + row * K, deq1, K * sizeof *deq1);
    }
    memcpy(r, w, ROWS * K * sizeof *r);
    fm_round_bf16_array(r, ROWS * K);
    for (int64_t i = 0; i < ROWS * K; i++) assert_int_equal(f2u(r[i]), f2u(fm_round_bf16(w[i])));
    free(w);
    free(sc);
    free(sc1);
    free(deq);
    free(deq1);
    free(r);
    free(q);
    free(q1);
    free(z);
    free(z1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_decode_table),
        cmocka_unit_test(test_e4m3_encode_table),
        cmocka_unit_test(test_e4m3_roundtrip_and_saturation),
        cmocka_unit_test(test_e4m3_groups),
        cmocka_unit_test(test_e2m1_decode_table),
        cmocka_unit_test(test_e2m1_encode_table),
        cmocka_unit_test(test_e2m1_ties_and_policy),
        cmocka_unit_test(test_e8m0_decode_table),
        cmocka_unit_test(test_bf16_table),
        cmocka_unit_test(test_f16_table),
        cmocka_unit_test(test_mxfp4_random),
        cmocka_unit_test(test_mxfp4_rules_and_edges),
        cmocka_unit_test(test_nvfp4_random),
        cmocka_unit_test(test_nvfp4_edges),
        cmocka_unit_test(test_fp4_expand_e4m3),
        cmocka_unit_test(test_int4_groups),
        cmocka_unit_test(test_int4_p2),
        cmocka_unit_test(test_int4_pack_layout),
        cmocka_unit_test(test_int4_saturated_f16_scale),
        cmocka_unit_test(test_parallel_paths_match_serial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
