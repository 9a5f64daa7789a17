/* int4-zp banks (see int4zp_host.h): a pre-quantized checkpoint's int4 linears (GPTQ, AWQ, compressed-tensors)
 * repacked once at load, on the host, into one layout from the packed codes (never through float weights). The CPU
 * backend keeps it as it is; the CUDA backend uploads it or reorders it for its tensor cores:
 *   codes [n][rows][ceil(K/2)]  unsigned nibbles, bank position 2i in the low nibble
 *   zeros [n][rows][n_groups]   0..16,  scales [n][rows][n_groups] fp32 (the stored fp16/bf16 values, exact)
 *   perm  [n][K]                act-order: bank position j holds input channel perm[j]. Sorting the channels by
 *                               their group (g_idx) makes each group one contiguous run of G positions, so the
 *                               op sums a group at a time and gathers x once per row (what exllama/Marlin do).
 * The parts of a fused bank (q|k|v, gate|up) share the input x and so must share its order: their g_idx must agree
 * (GPTQ's act-order is a function of the input's statistics, the same for every projection of one input). */
#include <stdlib.h>
#include <string.h>

#include "backend/int4zp_host.h"
#include "util/status.h"

static fm_status check_sources(const fm_bank_src *src, int64_t cols, fm_error *err) {
    const int32_t G = src->srcs[0].q.group;
    for (int32_t i = 0; i < src->n; i++)
        for (int32_t j = 0; j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j], *s0 = &src->srcs[j];
            if (!fm_wsrc_is_quantized(s))
                return fm_fail(err, FM_ERR_UNSUPPORTED,
                               "%s: part %d of matrix %d is stored in float while other parts are pre-quantized int4; "
                               "an int4 bank cannot mix them (use --preset ref, or quantize every part)",
                               src->label, j, i);
            if (s->cols != cols || s->rows != s0->rows)
                return fm_fail(err, FM_ERR_FORMAT, "%s: matrix %d part %d is [%lld, %lld], expected [%lld, %lld]",
                               src->label, i, j, (long long)s->rows, (long long)s->cols, (long long)s0->rows,
                               (long long)cols);
            if (s->q.group != G)
                return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: part %d has group size %d, part 0 of matrix 0 has %d",
                               src->label, j, s->q.group, G);
        }
    return FM_OK;
}

/* Counting sort of the channels by group (each group holds exactly G, the last the rest, checked when decoded):
 * stable, O(K). */
static bool order_by_group(const int32_t *g_idx, int64_t K, int32_t G, int32_t *perm) {
    const int64_t ng = (K + G - 1) / G;
    int64_t *next = malloc((size_t)ng * sizeof *next);
    if (!next) return false;
    for (int64_t g = 0; g < ng; g++) next[g] = g * G;
    for (int64_t k = 0; k < K; k++) perm[next[g_idx[k]]++] = (int32_t)k;
    free(next);
    return true;
}

static bool is_identity(const int32_t *perm, int64_t K) {
    for (int64_t k = 0; k < K; k++)
        if (perm[k] != k) return false;
    return true;
}

/* Matrix i's input order from its first part; later parts must agree. With keep (int4-zp: act_order, the sources
 * carry a g_idx) the bank keeps an order for every matrix, even one that is the identity: the memory plan, which sees
 * the config and not the tensors, can then count it exactly (4 bytes per input channel, about 1% of the codes). */
static fm_status matrix_order(fm_int4zp_host *w, const fm_bank_src *src, int32_t i, int32_t part, const fm_int4_ckpt *c,
                              bool keep, int32_t *order, int32_t *g_ref, fm_error *err) {
    const int64_t K = w->cols;
    if (part > 0) {
        if (memcmp(g_ref, c->g_idx, (size_t)K * sizeof *g_ref) != 0)
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: matrix %d: part %d has a different act-order g_idx from part 0; the parts of a fused "
                           "bank share one input order",
                           src->label, i, part);
        return FM_OK;
    }
    memcpy(g_ref, c->g_idx, (size_t)K * sizeof *g_ref);
    if (!order_by_group(c->g_idx, K, w->group, order))
        return fm_fail(err, FM_ERR_NOMEM, "out of memory: %s", src->label);
    if (!keep && is_identity(order, K) && !w->perm) return FM_OK;
    if (!w->perm) { /* the first act-order matrix: the earlier ones keep the identity */
        if (!(w->perm = fm_malloc((size_t)(w->n * K) * sizeof *w->perm, err, src->label))) return FM_ERR_NOMEM;
        for (int64_t e = 0; e < (int64_t)w->n * K; e++) w->perm[e] = (int32_t)(e % K);
    }
    memcpy(w->perm + (int64_t)i * K, order, (size_t)K * sizeof *order);
    return FM_OK;
}

fm_status fm_int4zp_host_build(const fm_bank_src *src, bool keep_identity_orders, fm_int4zp_host *w, fm_error *err) {
    memset(w, 0, sizeof *w);
    w->n = src->n, w->cols = src->srcs[0].cols;
    for (int32_t j = 0; j < src->n_parts; j++) w->rows += src->srcs[j].rows;
    const int64_t K = w->cols, rows = w->rows, KB = (K + 1) / 2;
    fm_status st = check_sources(src, K, err);
    if (st) return st;
    w->group = src->srcs[0].q.group;
    w->n_groups = (K + w->group - 1) / w->group;
    const int64_t ng = w->n_groups;
    w->codes = fm_calloc((size_t)(w->n * rows * KB), 1, err, src->label);
    w->zeros = fm_malloc((size_t)(w->n * rows * ng), err, src->label);
    w->scales = fm_malloc((size_t)(w->n * rows * ng) * sizeof(float), err, src->label);
    int32_t *order = fm_malloc((size_t)K * sizeof *order, err, src->label);
    int32_t *g_ref = fm_malloc((size_t)K * sizeof *g_ref, err, src->label);
    if (!w->codes || !w->zeros || !w->scales || !order || !g_ref) st = FM_ERR_NOMEM;
    for (int32_t i = 0; !st && i < w->n; i++) {
        int64_t row0 = 0;
        for (int32_t j = 0; !st && j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            fm_int4_ckpt c;
            if ((st = fm_int4_ckpt_decode(&s->q, s->rows, K, &c, err))) break;
            st = matrix_order(w, src, i, j, &c, keep_identity_orders && s->q.g_idx != NULL, order, g_ref, err);
            const int32_t *perm = w->perm ? w->perm + (int64_t)i * K : NULL;
            for (int64_t n = 0; !st && n < s->rows; n++) {
                const int64_t r = (int64_t)i * rows + row0 + n;
                uint8_t *cr = w->codes + r * KB;
                for (int64_t p = 0; p < K; p++) {
                    const uint8_t u = c.codes[n * K + (perm ? perm[p] : p)];
                    cr[p >> 1] |= (uint8_t)(u << ((p & 1) * 4));
                }
                /* sorted by group, bank block b holds exactly the channels of checkpoint group b */
                memcpy(w->zeros + r * ng, c.zeros + n * ng, (size_t)ng);
                memcpy(w->scales + r * ng, c.scales + n * ng, (size_t)ng * sizeof(float));
            }
            row0 += s->rows;
            fm_int4_ckpt_free(&c);
        }
    }
    free(order);
    free(g_ref);
    if (st) fm_int4zp_host_free(w);
    return st;
}

void fm_int4zp_host_free(fm_int4zp_host *w) {
    free(w->codes), free(w->zeros), free(w->scales), free(w->perm);
    w->codes = w->zeros = NULL, w->scales = NULL, w->perm = NULL;
}
