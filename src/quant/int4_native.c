/* Is a pre-quantized int4 Linear our native int4-g128? (see int4_native.h) */
#include "quant/int4_native.h"

#include <string.h>

#include "util/status.h"

static inline uint32_t word_at(const fm_st_tensor *t, int64_t i) {
    uint32_t w;
    memcpy(&w, t->data + 4 * i, 4);
    return w;
}

bool fm_qsrc_native_layout(const fm_qsrc *q, int64_t K) {
    if (q->method != FM_QUANT_GPTQ && q->method != FM_QUANT_AWQ && q->method != FM_QUANT_CT_PACKED) return false;
    if (q->g_idx || !q->scales || q->scales->dtype != FM_DTYPE_BF16) return false;
    return q->group == FM_NATIVE_GROUP || (q->group == K && K <= FM_NATIVE_GROUP);
}

/* Whether every stored zero point is 8 (GPTQ v1 stores zero - 1, so 7); nibbles past N are padding. */
static bool zeros_all_eight(const fm_qsrc *q, int64_t N, int64_t ng) {
    if (!q->zeros) return true; /* symmetric: 8 by definition */
    const uint32_t want = q->zero_minus_one ? 7u : 8u;
    const bool ct = q->method == FM_QUANT_CT_PACKED; /* [ceil(N/8), ng] packed along N; else [ng, N/8] */
    const int64_t words = ct ? (N + 7) / 8 * ng : ng * (N / 8);
    for (int64_t i = 0; i < words; i++) {
        const uint32_t w = word_at(q->zeros, i);
        const int64_t n0 = ct ? 8 * (i / ng) : 8 * (i % (N / 8));
        for (int j = 0; j < 8 && n0 + j < N; j++)
            if (((w >> (4 * j)) & 15u) != want) return false;
    }
    return true;
}

/* Whether some stored code is 0 (q = u - 8 = -8); nibbles past K (compressed-tensors' last word) are padding. */
static bool has_code_zero(const fm_qsrc *q, int64_t N, int64_t K) {
    const bool ct = q->method == FM_QUANT_CT_PACKED;
    const int64_t KW = (K + 7) / 8, words = ct ? N * KW : N * K / 8; /* GPTQ [K/8, N], AWQ [K, N/8]: all valid */
    /* a word has a zero nibble when (w - 0x1..1) & ~w & 0x8..8 is not zero (the borrow reaches a nibble's top bit only
       through a zero nibble); the padding nibbles of a partial last word are set first, so they never count */
    const uint32_t pad = ct && K % 8 ? ~((1u << (4 * (K % 8))) - 1u) : 0;
    bool any = false;
    for (int64_t i = 0; i < words; i += 1024) { /* blocks: a vectorised test, an early exit */
        const int64_t end = i + 1024 < words ? i + 1024 : words;
        uint32_t hit = 0;
        for (int64_t j = i; j < end; j++) {
            const uint32_t w = word_at(q->packed, j) | (pad && (j % KW) == KW - 1 ? pad : 0);
            hit |= (w - 0x11111111u) & ~w & 0x88888888u;
        }
        if ((any = hit != 0)) break;
    }
    return any;
}

fm_native_int4 fm_qsrc_native_int4(const fm_qsrc *q, int64_t N, int64_t K) {
    if (!fm_qsrc_native_layout(q, K)) return FM_NATIVE_NO;
    if (!zeros_all_eight(q, N, (K + q->group - 1) / q->group)) return FM_NATIVE_NO;
    return has_code_zero(q, N, K) ? FM_NATIVE_MINUS8 : FM_NATIVE_YES;
}

fm_status fm_int4_ckpt_check_symmetric(const fm_int4_ckpt *c, const char *label, const char *tensor, fm_error *err) {
    for (int64_t e = 0; e < c->N * c->n_groups; e++)
        if (c->zeros[e] != 8)
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: %s has zero point %d at row %lld, group %lld; an int4-g128 "
                           "bank is symmetric (zero 8)",
                           label, tensor, c->zeros[e], (long long)(e / c->n_groups), (long long)(e % c->n_groups));
    return FM_OK;
}
