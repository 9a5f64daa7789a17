/* How the paged attention op (backend.h: attention_paged) splits a token's context, and the scratch that costs:
 * plain C, so that the engine's memory plan counts the scratch before anything is allocated.
 *
 * Flash-decoding: the CUDA op runs one CTA per (token, kv head, split); each split takes a slice of the token's
 * context and leaves a partial result (max, sum, unnormalised accumulator, fp32) in scratch, and a second kernel
 * combines the slices. The number of splits S depends on shapes only (a captured graph replays with other
 * lengths): by default the fewest splits whose CTAs fill the last wave of resident CTAs (route paged.splits=waves,
 * fm_attention_paged_splits_waves), or enough CTAs for 2 per SM (paged.splits=fill, fm_attention_paged_splits); no
 * more than the planned context has chunks of FM_ATT_PAGED_MIN_CHUNK keys. Each CTA then reads its token's length from
 * device memory and takes the slice [s * chunk, (s + 1) * chunk) with chunk = max(FM_ATT_PAGED_MIN_CHUNK, ceil(len / S)
 * rounded up to 16): short sequences use the first few splits, the others exit at once. S = 1 writes the output
 * directly (no scratch). With route paged.combine=fused the split kernel's last CTA of each (token, kv head, query
 * group) merges the splits instead of the second kernel: it is counted on a device counter at the scratch's start. */
#ifndef FM_BACKEND_ATTENTION_PAGED_H
#define FM_BACKEND_ATTENTION_PAGED_H

#include <stddef.h>
#include <stdint.h>

#define FM_ATT_PAGED_MIN_CHUNK 64  /* keys per split at least: one 16-key tile for each of the CTA's 4 warps */
#define FM_ATT_PAGED_MAX_SPLITS 64 /* splits per token at most */
#define FM_ATT_PAGED_MAX_SMS 256   /* multiprocessors assumed at most when the scratch is sized without a device */

/* Splits for the shapes, on a GPU of sms multiprocessors; kv_ctas = T * nkv * ceil((nh / nkv) / 16), the CTAs of
 * one split (a CTA takes up to 16 query heads of one kv head). At most fm_attention_paged_max_splits(T, max_len). */
static inline int32_t fm_attention_paged_max_splits(int64_t T, int64_t max_len) {
    int64_t s = (max_len + FM_ATT_PAGED_MIN_CHUNK - 1) / FM_ATT_PAGED_MIN_CHUNK;
    const int64_t fill = T > 0 ? (2 * FM_ATT_PAGED_MAX_SMS + T - 1) / T : 1;
    if (s > FM_ATT_PAGED_MAX_SPLITS) s = FM_ATT_PAGED_MAX_SPLITS;
    if (s > fill) s = fill;
    return s < 1 ? 1 : (int32_t)s;
}

static inline int32_t fm_attention_paged_splits(int64_t T, int64_t kv_ctas, int64_t max_len, int32_t sms) {
    if (sms > FM_ATT_PAGED_MAX_SMS) sms = FM_ATT_PAGED_MAX_SMS;
    const int64_t want = kv_ctas > 0 ? (2 * (int64_t)sms + kv_ctas - 1) / kv_ctas : 1;
    const int32_t cap = fm_attention_paged_max_splits(T, max_len);
    return want < 1 ? 1 : want > cap ? cap : (int32_t)want;
}

/* Splits by waves (route paged.splits=waves): the split kernel's CTAs run in waves of `slots` (the GPU's
 * multiprocessors times the CTAs one of them holds at once), and a last wave that is mostly empty leaves most of the
 * GPU idle while it runs. Qwen3-30B-A3B at 64 rows: 256 CTAs a split; the rule above takes 2 splits on an H200's 132
 * SMs, 512 CTAs in 396 slots (3 a SM): 1.29 waves, the second one 29 % full. This rule takes the fewest splits whose
 * CTAs fill at least 90 % of the waves they need (there: 3, 768 CTAs in two waves), else the count that fills them
 * best (one token: every split the context allows), at most fm_attention_paged_max_splits (the scratch's bound). */
static inline int32_t fm_attention_paged_splits_waves(int64_t T, int64_t kv_ctas, int64_t max_len, int64_t slots) {
    const int32_t cap = fm_attention_paged_max_splits(T, max_len);
    if (kv_ctas < 1 || slots < 1) return 1;
    int32_t best = 1;
    int64_t best_num = 0, best_den = 1; /* the best fill so far, as ctas / (waves x slots) */
    for (int32_t s = 1; s <= cap; s++) {
        const int64_t ctas = kv_ctas * s, cover = (ctas + slots - 1) / slots * slots;
        if (10 * ctas >= 9 * cover) return s;
        if (ctas * best_den > best_num * cover) best = s, best_num = ctas, best_den = cover;
    }
    return best;
}

/* Bytes of the fused combine's counters, the scratch's first bytes: one uint32 per (token, kv head, query group) of
 * any step that splits (T < 2 FM_ATT_PAGED_MAX_SMS: fm_attention_paged_max_splits is 1 above; nkv * groups <= nh),
 * at a place and size that do not depend on T, so that every call finds them as the last one left them: zero. The
 * owner of the scratch zeroes them once, before the first call (each call leaves them zero: a graph replays). */
static inline size_t fm_attention_paged_counter_bytes(int32_t nh) {
    const size_t b = (size_t)(2 * FM_ATT_PAGED_MAX_SMS) * (size_t)nh * sizeof(uint32_t);
    return (b + 15) / 16 * 16;
}

/* Bytes of scratch attention_paged needs at these shapes: the counters (fm_attention_paged_counter_bytes), then per
 * (token, query head, split) hd + 2 floats (the accumulator, the max and the sum); none when one split suffices. An
 * upper bound for every GPU. */
static inline size_t fm_attention_paged_scratch_bytes(int64_t T, int32_t nh, int32_t hd, int64_t max_len) {
    const int32_t s = fm_attention_paged_max_splits(T, max_len);
    return s <= 1 ? 0
                  : fm_attention_paged_counter_bytes(nh) +
                        (size_t)T * (size_t)nh * (size_t)s * ((size_t)hd + 2) * sizeof(float);
}

#endif
