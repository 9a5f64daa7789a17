/* GPTQ, AWQ and compressed-tensors int4 Linear tensors: binding checks and decoding (see int4_ckpt.h). */
#include "quant/int4_ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

/* AWQ's GEMM packing: nibble slot i of a word holds column 8c + awq_order[i] */
static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

typedef struct names {
    const char *packed, *zeros, *scales, *g_idx;
} names;

static names format_names(fm_quant_method m) {
    if (m == FM_QUANT_FP8_BLOCK) return (names){"weight", "", "weight_scale_inv", ""};
    if (m == FM_QUANT_CT_PACKED) return (names){"weight_packed", "weight_zero_point", "weight_scale", "weight_g_idx"};
    return (names){"qweight", "qzeros", "scales", "g_idx"};
}

static const fm_st_tensor *lookup(fm_tensor_lookup find, const void *ctx, const char *module, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    return find(ctx, name);
}

bool fm_qsrc_present(const fm_quant_config *qc, const char *module, fm_tensor_lookup find, const void *ctx) {
    if (qc->method == FM_QUANT_FP8_BLOCK) /* its weight keeps the float name: the scale tells them apart */
        return lookup(find, ctx, module, "weight_scale_inv") != NULL;
    return qc->method != FM_QUANT_NONE && lookup(find, ctx, module, format_names(qc->method).packed) != NULL;
}

static fm_status expect(const fm_st_tensor *t, const char *module, const char *suffix, const char *role, bool is_float,
                        int64_t d0, int64_t d1, int n_dims, fm_error *err) {
    if (!t)
        return fm_fail(err, FM_ERR_FORMAT, "tensor '%s.%s' (%s) is missing from the checkpoint", module, suffix, role);
    if (is_float ? (t->dtype != FM_DTYPE_F16 && t->dtype != FM_DTYPE_BF16 && t->dtype != FM_DTYPE_F32)
                 : t->dtype != FM_DTYPE_I32)
        return fm_fail(err, FM_ERR_FORMAT, "tensor '%s' (%s) has dtype %s, expected %s", t->name, role,
                       fm_dtype_name(t->dtype), is_float ? "F16, BF16 or F32" : "I32");
    const bool ok = t->n_dims == n_dims && t->shape[0] == d0 && (n_dims == 1 || t->shape[1] == d1);
    if (!ok) {
        char got[96] = "[";
        for (int i = 0; i < t->n_dims && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s]", t->n_dims > 4 ? ", ..." : "");
        if (n_dims == 1)
            return fm_fail(err, FM_ERR_FORMAT, "tensor '%s' (%s): expected shape [%lld], found %s", t->name, role,
                           (long long)d0, got);
        return fm_fail(err, FM_ERR_FORMAT, "tensor '%s' (%s): expected shape [%lld, %lld], found %s", t->name, role,
                       (long long)d0, (long long)d1, got);
    }
    return FM_OK;
}

fm_status fm_qsrc_bind(const fm_quant_config *qc, const char *module, int64_t N, int64_t K, fm_tensor_lookup find,
                       const void *ctx, fm_qsrc *q, fm_error *err) {
    memset(q, 0, sizeof *q);
    if (qc->method == FM_QUANT_FP8_BLOCK) return fm_fp8_block_bind(qc, module, N, K, find, ctx, q, err);
    const names nm = format_names(qc->method);
    const int64_t G = qc->group_size < 0 ? K : qc->group_size;
    /* compressed-tensors sizes its scales ceil(K / G) (the last group partial, as our own int4 banks); GPTQ and AWQ
       kernels need G to divide K */
    if (K % G != 0 && qc->method != FM_QUANT_CT_PACKED)
        return fm_fail(err, FM_ERR_FORMAT,
                       "%s: group_size %lld does not divide the input width K = %lld of this linear", module,
                       (long long)G, (long long)K);
    const int64_t ng = (K + G - 1) / G;
    const fm_st_tensor *packed = lookup(find, ctx, module, nm.packed), *zeros = lookup(find, ctx, module, nm.zeros),
                       *scales = lookup(find, ctx, module, nm.scales), *g_idx = lookup(find, ctx, module, nm.g_idx);
    fm_status st;
    char role[160];
    if (qc->method == FM_QUANT_CT_PACKED) {
        snprintf(role, sizeof role, "int4 weights of a [%lld, %lld] linear packed along K", (long long)N, (long long)K);
        if ((st = expect(packed, module, nm.packed, role, false, N, (K + 7) / 8, 2, err)) ||
            (st = expect(scales, module, nm.scales, "group scales [N, K/G]", true, N, ng, 2, err)))
            return st;
        if (!qc->sym &&
            (st = expect(zeros, module, nm.zeros, "zero points packed along N", false, (N + 7) / 8, ng, 2, err)))
            return st;
        if (qc->sym) zeros = NULL;
        if (qc->act_order && !g_idx)
            return fm_fail(err, FM_ERR_FORMAT,
                           "tensor '%s.%s' (act-order group index) is missing: the config says "
                           "actorder \"group\"",
                           module, nm.g_idx);
    } else {
        if (N % 8 != 0)
            return fm_fail(err, FM_ERR_FORMAT,
                           "%s: %s packs 8 output channels per word, but N = %lld is not a multiple "
                           "of 8",
                           module, fm_quant_method_name(qc->method), (long long)N);
        const bool gptq = qc->method == FM_QUANT_GPTQ;
        if (gptq && K % 8 != 0)
            return fm_fail(err, FM_ERR_FORMAT,
                           "%s: GPTQ packs 8 input channels per word, but K = %lld is not a multiple "
                           "of 8",
                           module, (long long)K);
        snprintf(role, sizeof role, "int4 weights of a [%lld, %lld] linear packed along %s", (long long)N, (long long)K,
                 gptq ? "K" : "N");
        if ((st = expect(packed, module, nm.packed, role, false, gptq ? K / 8 : K, gptq ? N : N / 8, 2, err)) ||
            (st = expect(scales, module, nm.scales, "group scales [K/G, N]", true, ng, N, 2, err)))
            return st;
        /* GPTQ stores qzeros even when symmetric, and its kernels read them: so do we when they are there */
        if ((zeros || !qc->sym) &&
            (st = expect(zeros, module, nm.zeros, "zero points packed along N", false, ng, N / 8, 2, err)))
            return st;
        if (!gptq || !qc->act_order) g_idx = NULL; /* GPTQ without desc_act: groups are k / G, g_idx unused */
        else if (!g_idx)
            return fm_fail(err, FM_ERR_FORMAT,
                           "tensor '%s.%s' (act-order group index) is missing: the config says "
                           "desc_act",
                           module, nm.g_idx);
    }
    if (g_idx && (st = expect(g_idx, module, nm.g_idx, "group index of each input channel", false, K, 0, 1, err)))
        return st;
    *q = (fm_qsrc){
        qc->method, packed, zeros, scales, g_idx, (int32_t)G, qc->method == FM_QUANT_GPTQ && qc->zero_minus_one, 0};
    return FM_OK;
}

static inline uint32_t word_at(const fm_st_tensor *t, int64_t i) {
    uint32_t w;
    memcpy(&w, t->data + 4 * i, 4); /* little-endian host, any alignment */
    return w;
}

bool fm_qsrc_in_input_order(const fm_qsrc *q, int64_t K) {
    if (!q->g_idx) return true;
    for (int64_t k = 0; k < K; k++)
        if ((int64_t)(int32_t)word_at(q->g_idx, k) != k / q->group) return false;
    return true;
}

void fm_int4_ckpt_free(fm_int4_ckpt *c) {
    free(c->codes);
    free(c->zeros);
    free(c->scales);
    free(c->g_idx);
    memset(c, 0, sizeof *c);
}

static fm_status decode_g_idx(const fm_qsrc *q, fm_int4_ckpt *c, fm_error *err) {
    const int64_t K = c->K, ng = c->n_groups;
    if (!q->g_idx) {
        for (int64_t k = 0; k < K; k++) c->g_idx[k] = (int32_t)(k / c->group);
        return FM_OK;
    }
    int64_t *count = calloc((size_t)ng, sizeof *count);
    if (!count) return fm_fail(err, FM_ERR_NOMEM, "out of memory decoding %s", q->g_idx->name);
    fm_status st = FM_OK;
    for (int64_t k = 0; k < K && !st; k++) {
        const int32_t g = (int32_t)word_at(q->g_idx, k);
        if (g < 0 || g >= ng)
            st = fm_fail(err, FM_ERR_FORMAT, "tensor '%s': g_idx[%lld] = %d is outside the %lld groups [0, %lld)",
                         q->g_idx->name, (long long)k, g, (long long)ng, (long long)ng);
        else count[g]++, c->g_idx[k] = g;
    }
    /* every group holds exactly G channels, as GPTQ's act-order assigns them: sorted by g_idx, the groups are the
       contiguous blocks of G the int4 bank stores */
    for (int64_t g = 0; g < ng && !st; g++) {
        const int64_t want = K - g * c->group < c->group ? K - g * c->group : c->group; /* the last may be partial */
        if (count[g] != want)
            st = fm_fail(err, FM_ERR_FORMAT, "tensor '%s': group %lld has %lld input channels, expected %s%lld",
                         q->g_idx->name, (long long)g, (long long)count[g], want == c->group ? "group_size " : "",
                         (long long)want);
    }
    free(count);
    return st;
}

fm_status fm_int4_ckpt_decode(const fm_qsrc *q, int64_t N, int64_t K, fm_int4_ckpt *c, fm_error *err) {
    memset(c, 0, sizeof *c);
    const int64_t ng = (K + q->group - 1) / q->group;
    *c = (fm_int4_ckpt){.N = N, .K = K, .n_groups = ng, .group = q->group};
    c->codes = malloc((size_t)(N * K));
    c->zeros = malloc((size_t)(N * ng));
    c->scales = malloc((size_t)(N * ng) * sizeof(float));
    c->g_idx = malloc((size_t)K * sizeof(int32_t));
    float *s_raw = malloc((size_t)(N * ng) * sizeof(float));
    fm_status st = FM_OK;
    if (!c->codes || !c->zeros || !c->scales || !c->g_idx || !s_raw)
        st = fm_fail(err, FM_ERR_NOMEM, "out of memory decoding %s", q->packed->name);
    if (!st) st = fm_st_read_f32(q->scales, 0, N * ng, s_raw, err);
    if (!st) st = decode_g_idx(q, c, err);
    if (st) {
        free(s_raw);
        fm_int4_ckpt_free(c);
        return st;
    }
    const bool ct = q->method == FM_QUANT_CT_PACKED;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < ng; g++) c->scales[n * ng + g] = ct ? s_raw[n * ng + g] : s_raw[g * N + n];
    free(s_raw);

    if (q->method == FM_QUANT_GPTQ) {
        for (int64_t r = 0; r < K / 8; r++)
            for (int64_t n = 0; n < N; n++) {
                const uint32_t w = word_at(q->packed, r * N + n);
                for (int i = 0; i < 8; i++) c->codes[n * K + 8 * r + i] = (uint8_t)((w >> (4 * i)) & 15u);
            }
    } else if (q->method == FM_QUANT_AWQ) {
        for (int64_t k = 0; k < K; k++)
            for (int64_t cw = 0; cw < N / 8; cw++) {
                const uint32_t w = word_at(q->packed, k * (N / 8) + cw);
                for (int i = 0; i < 8; i++) c->codes[(8 * cw + awq_order[i]) * K + k] = (uint8_t)((w >> (4 * i)) & 15u);
            }
    } else {
        const int64_t KW = (K + 7) / 8;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < KW; j++) {
                const uint32_t w = word_at(q->packed, n * KW + j);
                for (int i = 0; i < 8 && 8 * j + i < K; i++)
                    c->codes[n * K + 8 * j + i] = (uint8_t)((w >> (4 * i)) & 15u);
            }
    }

    if (!q->zeros) {
        memset(c->zeros, 8, (size_t)(N * ng)); /* symmetric: (u - 8) * s */
    } else if (ct) {                           /* [ceil(N/8), ng], packed along N (dim 0) */
        for (int64_t r = 0; r < (N + 7) / 8; r++)
            for (int64_t g = 0; g < ng; g++) {
                const uint32_t w = word_at(q->zeros, r * ng + g);
                for (int i = 0; i < 8 && 8 * r + i < N; i++)
                    c->zeros[(8 * r + i) * ng + g] = (uint8_t)((w >> (4 * i)) & 15u);
            }
    } else { /* GPTQ / AWQ: [ng, N/8] packed along N */
        const int plus = q->zero_minus_one ? 1 : 0;
        for (int64_t g = 0; g < ng; g++)
            for (int64_t cw = 0; cw < N / 8; cw++) {
                const uint32_t w = word_at(q->zeros, g * (N / 8) + cw);
                for (int i = 0; i < 8; i++) {
                    const int64_t n = 8 * cw + (q->method == FM_QUANT_AWQ ? awq_order[i] : i);
                    c->zeros[n * ng + g] = (uint8_t)(((w >> (4 * i)) & 15u) + plus);
                }
            }
    }
    for (int64_t i = 0; i < N * ng; i++)
        if (!isfinite(c->scales[i])) {
            st = fm_fail(err, FM_ERR_FORMAT, "tensor '%s': scale %lld is not finite", q->scales->name, (long long)i);
            fm_int4_ckpt_free(c);
            return st;
        }
    return FM_OK;
}

void fm_int4_ckpt_dequantize(const fm_int4_ckpt *c, float *w) {
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t k = 0; k < c->K; k++) {
            const int64_t g = n * c->n_groups + c->g_idx[k];
            /* |u - z| <= 16 times an fp16/bf16 scale: exact (an fp32 scale: one fp32 rounding, as anyone computes it)
             */
            w[n * c->K + k] = (float)((int32_t)c->codes[n * c->K + k] - (int32_t)c->zeros[g]) * c->scales[g];
        }
}

fm_status fm_qsrc_expect(const fm_st_tensor *t, const char *module, const char *suffix, const char *role, bool is_float,
                         int64_t d0, int64_t d1, int n_dims, fm_error *err) {
    return expect(t, module, suffix, role, is_float, d0, d1, n_dims, err);
}
