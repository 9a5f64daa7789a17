/* The scratch of paged attention (backend/attention_paged.h), as the memory plan and the CUDA op size it: the fused
 * combine's counters at its start, enough for every step that splits, at a size that does not depend on the step's
 * rows (each call finds them where the last one left them zero), then the partial results, 16-byte aligned. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backend/attention_paged.h"

/* Every step of T rows that splits (more than one split for its context) has T x (kv heads x query groups) <= T x nh
 * counters, within fm_attention_paged_counter_bytes(nh); a step that does not split needs no scratch at all. */
static void counters_cover_every_splitting_step(void **s) {
    (void)s;
    const int32_t nhs[] = {1, 4, 32, 64, 96};
    const int64_t ctxs[] = {1, 64, 65, 2048, 40000};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++)
            for (int64_t T = 1; T <= 2 * FM_ATT_PAGED_MAX_SMS + 8; T++) {
                const int32_t nh = nhs[i], hd = 128;
                const int32_t splits = fm_attention_paged_max_splits(T, ctxs[j]);
                const size_t cb = fm_attention_paged_counter_bytes(nh),
                             sb = fm_attention_paged_scratch_bytes(T, nh, hd, ctxs[j]);
                if (splits <= 1) {
                    assert_int_equal(sb, 0);
                    continue;
                }
                assert_true((size_t)T * (size_t)nh * sizeof(uint32_t) <= cb);
                assert_int_equal(sb, cb + (size_t)T * (size_t)nh * (size_t)splits * (hd + 2) * sizeof(float));
            }
}

/* The counters' bytes depend on nh only and keep the partials after them 16-byte aligned (the split kernel's float4
 * reads); no step at or above 2 FM_ATT_PAGED_MAX_SMS rows splits (the counters' bound). */
static void counters_have_one_size(void **s) {
    (void)s;
    for (int32_t nh = 1; nh <= 128; nh++) {
        assert_int_equal(fm_attention_paged_counter_bytes(nh) % 16, 0);
        assert_true(fm_attention_paged_counter_bytes(nh) >= (size_t)(2 * FM_ATT_PAGED_MAX_SMS) * (size_t)nh * 4);
    }
    assert_int_equal(fm_attention_paged_max_splits(2 * FM_ATT_PAGED_MAX_SMS, 1 << 20), 1);
    assert_true(fm_attention_paged_max_splits(2 * FM_ATT_PAGED_MAX_SMS - 1, 1 << 20) > 1);
}

/* The waves rule (route paged.splits=waves) never asks for more splits than the scratch holds; where some count fills
 * 90 % of its waves it takes the fewest such; else the count that fills them best. The shapes that motivated it:
 * Qwen3-30B-A3B (4 kv heads, one query group) on 132 SMs holding 3 CTAs each. */
static void waves_rule_fills_the_last_wave(void **s) {
    (void)s;
    const int64_t slots = 132 * 3;
    assert_int_equal(fm_attention_paged_splits_waves(64, 64 * 4, 2048, slots), 3);   /* 768 CTAs: 2 waves, 97 % */
    assert_int_equal(fm_attention_paged_splits(64, 64 * 4, 2048, 132), 2);           /* the fill rule: 1.29 waves */
    assert_int_equal(fm_attention_paged_splits_waves(8, 8 * 4, 2048, slots), 12);    /* 384 CTAs: 97 % of a wave */
    assert_int_equal(fm_attention_paged_splits_waves(1, 4, 2048, slots), 32);        /* every 64-key chunk */
    assert_int_equal(fm_attention_paged_splits_waves(1, 4, 100, slots), 2);          /* a short context */
    assert_int_equal(fm_attention_paged_splits_waves(512, 512 * 4, 2048, slots), 1); /* no split above 2 x 256 rows */
    const int32_t nkvs[] = {1, 2, 4, 8};
    const int64_t ctxs[] = {1, 64, 100, 2048, 40000}, slot_counts[] = {1, 66, 132 * 3, 132 * 2, 256 * 4};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 5; k++)
                for (int64_t T = 1; T <= 2 * FM_ATT_PAGED_MAX_SMS + 8; T += 7) {
                    const int64_t kv = T * nkvs[i], sl = slot_counts[k];
                    const int32_t cap = fm_attention_paged_max_splits(T, ctxs[j]);
                    const int32_t w = fm_attention_paged_splits_waves(T, kv, ctxs[j], sl);
                    assert_true(w >= 1 && w <= cap);
                    const int64_t cover = (kv * w + sl - 1) / sl * sl;
                    if (10 * kv * w >= 9 * cover) {
                        for (int32_t f = 1; f < w; f++) /* none fewer fills 90 % */
                            assert_true(10 * kv * f < 9 * ((kv * f + sl - 1) / sl * sl));
                    } else {
                        for (int32_t f = 1; f <= cap; f++) /* none fills better */
                            assert_true(kv * f * cover <= kv * w * ((kv * f + sl - 1) / sl * sl));
                    }
                }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counters_cover_every_splitting_step),
        cmocka_unit_test(counters_have_one_size),
        cmocka_unit_test(waves_rule_fills_the_last_wave),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
