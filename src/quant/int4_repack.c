/* Native int4 sources -> the int4 row layout (see int4_repack.h). */
#include "quant/int4_repack.h"

#include <string.h>

#include "quant/bf16.h"
#include "quant/int4_native.h"

/* a bf16 with every exponent bit set is an infinity or a NaN */
static bool bf16_finite(uint16_t b) { return (b & 0x7f80u) != 0x7f80u; }

static fm_status check_ng(const fm_qsrc *q, int64_t K, int64_t ng, const char *label, fm_error *err) {
    const int64_t have = (K + q->group - 1) / q->group;
    if (have == ng) return FM_OK;
    return fm_fail(err, FM_ERR_FORMAT, "%s: %s has %lld scale groups per row, the bank %lld", label, q->scales->name,
                   (long long)have, (long long)ng);
}

fm_status fm_int4_native_rows_decoded(const fm_qsrc *q, int64_t N, int64_t K, int64_t ng, uint8_t *codes, int64_t ld,
                                      uint16_t *scales, const char *label, fm_error *err) {
    fm_status st = check_ng(q, K, ng, label, err);
    if (st) return st;
    fm_int4_ckpt c;
    if ((st = fm_int4_ckpt_decode(q, N, K, &c, err))) return st;
    st = fm_int4_ckpt_check_symmetric(&c, label, q->packed->name, err);
    for (int64_t n = 0; !st && n < N; n++) {
        uint8_t *row = codes + n * ld;
        memset(row, 0, (size_t)ld); /* the padding past K reads as zero codes */
        for (int64_t k = 0; k < K; k++) row[k >> 1] |= (uint8_t)(((c.codes[n * K + k] ^ 8u) & 15u) << ((k & 1) * 4));
        for (int64_t g = 0; g < ng; g++) scales[n * ng + g] = fm_f32_to_bf16(c.scales[n * ng + g]); /* exact: bf16 */
    }
    fm_int4_ckpt_free(&c);
    return st;
}

/* compressed-tensors, symmetric, in input order, bf16 scales: the words are the row layout but for the offset */
static bool direct(const fm_qsrc *q) {
    return q->method == FM_QUANT_CT_PACKED && !q->zeros && !q->g_idx && q->scales->dtype == FM_DTYPE_BF16;
}

fm_status fm_int4_native_rows(const fm_qsrc *q, int64_t N, int64_t K, int64_t ng, uint8_t *codes, int64_t ld,
                              uint16_t *scales, const char *label, fm_error *err) {
    if (!fm_qsrc_native_layout(q, K))
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: %s is not int4 symmetric with groups of %d and bf16 scales", label,
                       q->packed->name, FM_NATIVE_GROUP);
    if (!direct(q)) return fm_int4_native_rows_decoded(q, N, K, ng, codes, ld, scales, label, err);
    fm_status st = check_ng(q, K, ng, label, err);
    if (st) return st;
    const int64_t KW = (K + 7) / 8, full = K / 8, tail = K % 8;
    /* the valid nibbles of the last word take the offset; the padding nibbles stay zero */
    const uint32_t tail_xor = tail ? 0x88888888u & ((1u << (4 * tail)) - 1u) : 0;
    const uint8_t *words = q->packed->data;
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *src = words + (size_t)(n * KW) * 4;
        uint8_t *row = codes + n * ld;
        for (int64_t j = 0; j < full; j++) {
            uint32_t w;
            memcpy(&w, src + 4 * j, 4); /* little-endian host, any alignment: byte b holds elements 2b, 2b + 1 */
            w ^= 0x88888888u;
            memcpy(row + 4 * j, &w, 4);
        }
        int64_t done = 4 * full;
        if (tail) {
            uint32_t w;
            memcpy(&w, src + 4 * full, 4);
            w = (w & ((1u << (4 * tail)) - 1u)) ^ tail_xor;
            const int64_t bytes = (tail + 1) / 2;
            memcpy(row + done, &w, (size_t)bytes);
            done += bytes;
        }
        memset(row + done, 0, (size_t)(ld - done));
    }
    const uint8_t *s = q->scales->data;
    memcpy(scales, s, (size_t)(N * ng) * sizeof *scales); /* [N, ng] bf16 both */
    for (int64_t i = 0; i < N * ng; i++)
        if (!bf16_finite(scales[i]))
            return fm_fail(err, FM_ERR_FORMAT, "tensor '%s': scale %lld is not finite", q->scales->name, (long long)i);
    return FM_OK;
}
