/* The logits comparison behind every parity figure (src/util/metrics.c), on inputs whose answers are known by
 * hand: identical logits, a 2 x 3 case for cosine and KL, a top-5 overlap of exactly 3/5, a last position that
 * differs from the whole, non-finite logits, and the mean / worst over prompts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "util/metrics.h"

#define NEAR(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-12)

static void identical_logits(void **s) {
    (void)s;
    const float x[3 * 7] = {0.5f, -1, 2, 3, 3, 0, -7, 1, 1, 1, 1, 1, 1, 1, 9, 8, 7, 6, 5, 4, 3};
    fm_compare c;
    fm_logits_compare(x, x, 3, 7, &c);
    NEAR(c.cosine, 1.0);
    NEAR(c.cosine_last, 1.0);
    NEAR(c.mean_kl, 0.0);
    NEAR(c.top5_overlap, 1.0); /* the tied row too: ties go to the lower index on both sides */
    NEAR(c.argmax_agree, 1.0);
    NEAR(c.max_abs_err, 0.0);
    NEAR(c.max_abs_ref, 9.0);
    assert_int_equal(c.n_nonfinite, 0);
}

/* ref = [[0,0,0],[1,2,3]], x = [[ln 2,0,0],[1,2,3]].
 * cosine over all 6: dot 14, |ref|^2 14, |x|^2 14 + ln^2 2  ->  sqrt(14 / (14 + ln^2 2)).
 * KL row 0: softmax(ref) = 1/3 each, softmax(x) = (1/2, 1/4, 1/4): (1/3) ln((1/3)^3 / (1/2 * 1/4 * 1/4)) = ln(32/27)/3;
 * row 1: 0; mean ln(32/27)/6. The last rows are equal: cosine_last 1. V = 3 < 5: top-3, all of them: overlap 1. */
static void hand_computed_2x3(void **s) {
    (void)s;
    const float ln2 = (float)log(2.0);
    const float ref[6] = {0, 0, 0, 1, 2, 3}, x[6] = {ln2, 0, 0, 1, 2, 3};
    fm_compare c;
    fm_logits_compare(ref, x, 2, 3, &c);
    const double l = (double)ln2;
    assert_true(fabs(c.cosine - sqrt(14.0 / (14.0 + l * l))) < 1e-12);
    assert_true(fabs(c.mean_kl - log(32.0 / 27.0) / 6.0) < 1e-7); /* ln 2 rounded to float */
    NEAR(c.cosine_last, 1.0);
    NEAR(c.argmax_agree, 1.0); /* row 0: ref ties go to index 0, x's largest is index 0 */
    NEAR(c.top5_overlap, 1.0);
    NEAR(c.max_abs_err, l);
    NEAR(c.max_abs_ref, 3.0);
}

/* top5(ref) = {0,1,2,3,4}; top5(x) = {5,6,0,1,2}: 3 in common. A second row with all 5 in common: mean 0.8. */
static void top5_overlap_three_of_five(void **s) {
    (void)s;
    const float ref[16] = {7, 6, 5, 4, 3, 2, 1, 0, /* row 1 */ 0, 1, 2, 3, 4, 5, 6, 7};
    const float x[16] = {7, 6, 5, 0, 0, 9, 8, 0, /* row 1 */ 0, 0, 0, 30, 40, 50, 60, 70};
    fm_compare c;
    fm_logits_compare(ref, x, 1, 8, &c);
    NEAR(c.top5_overlap, 3.0 / 5.0);
    NEAR(c.argmax_agree, 0.0); /* 0 against 5 */
    fm_logits_compare(ref, x, 2, 8, &c);
    NEAR(c.top5_overlap, (3.0 / 5.0 + 1.0) / 2.0);
    NEAR(c.argmax_agree, 0.5);
}

/* ref = [[1,0],[0,1]], x = [[1,0],[1,1]]: cosine_last = 1/sqrt 2, cosine over all = 2/sqrt 6 */
static void last_position_differs(void **s) {
    (void)s;
    const float ref[4] = {1, 0, 0, 1}, x[4] = {1, 0, 1, 1};
    fm_compare c;
    fm_logits_compare(ref, x, 2, 2, &c);
    NEAR(c.cosine_last, 1.0 / sqrt(2.0));
    NEAR(c.cosine, 2.0 / sqrt(6.0));
    /* and the other way: the last rows equal, an earlier one not */
    const float x2[4] = {0, 1, 0, 1};
    fm_logits_compare(ref, x2, 2, 2, &c);
    NEAR(c.cosine_last, 1.0);
    NEAR(c.cosine, 0.5);
}

static void non_finite_logits(void **s) {
    (void)s;
    const float ref[4] = {1, 0, 0, 1}, x[4] = {1, 0, NAN, 1};
    fm_compare c;
    fm_logits_compare(ref, x, 2, 2, &c);
    assert_int_equal(c.n_nonfinite, 1);
    assert_true(isnan(c.cosine));
    assert_true(isnan(c.cosine_last));
    assert_true(isinf(c.max_abs_err));
    const float y[4] = {1, INFINITY, 0, 1}; /* only the first row broken: the last one is still measured */
    fm_logits_compare(ref, y, 2, 2, &c);
    assert_true(isnan(c.cosine));
    NEAR(c.cosine_last, 1.0);
}

static void summary_over_prompts(void **s) {
    (void)s;
    fm_compare v[3] = {
        {.cosine = 0.99,
         .cosine_last = 0.98,
         .max_abs_err = 1,
         .max_abs_ref = 5,
         .argmax_agree = 0.9,
         .mean_kl = 0.1,
         .top5_overlap = 0.8},
        {.cosine = 0.97,
         .cosine_last = 0.99,
         .max_abs_err = 3,
         .max_abs_ref = 4,
         .argmax_agree = 0.7,
         .mean_kl = 0.3,
         .top5_overlap = 0.9},
        {.cosine = 0.98,
         .cosine_last = 0.97,
         .max_abs_err = 2,
         .max_abs_ref = 6,
         .argmax_agree = 0.8,
         .mean_kl = 0.2,
         .top5_overlap = 0.7},
    };
    fm_compare mean, worst;
    fm_compare_summarize(v, 3, &mean, &worst);
    NEAR(mean.cosine, 0.98);
    NEAR(mean.cosine_last, 0.98);
    NEAR(mean.max_abs_err, 2.0);
    NEAR(mean.argmax_agree, 0.8);
    NEAR(mean.mean_kl, 0.2);
    NEAR(mean.top5_overlap, 0.8);
    NEAR(worst.cosine, 0.97);
    NEAR(worst.cosine_last, 0.97);
    NEAR(worst.max_abs_err, 3.0);
    NEAR(worst.max_abs_ref, 6.0);
    NEAR(worst.argmax_agree, 0.7);
    NEAR(worst.mean_kl, 0.3);
    NEAR(worst.top5_overlap, 0.7);
    /* one prompt: mean = worst = it */
    fm_compare_summarize(v + 1, 1, &mean, &worst);
    NEAR(mean.cosine, 0.97);
    NEAR(worst.mean_kl, 0.3);
    /* a NaN cosine (non-finite logits) is the worst and poisons the mean */
    v[2].cosine = NAN, v[2].n_nonfinite = 4;
    fm_compare_summarize(v, 3, &mean, &worst);
    assert_true(isnan(worst.cosine) && isnan(mean.cosine));
    assert_int_equal(worst.n_nonfinite, 4);
    assert_int_equal(mean.n_nonfinite, 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identical_logits),           cmocka_unit_test(hand_computed_2x3),
        cmocka_unit_test(top5_overlap_three_of_five), cmocka_unit_test(last_position_differs),
        cmocka_unit_test(non_finite_logits),          cmocka_unit_test(summary_over_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
