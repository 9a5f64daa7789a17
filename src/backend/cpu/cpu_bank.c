/* Weight banks on the CPU: decoded to fp32 once, then rounded (bf16) or group-quantized (int4) per format;
 * int4-zp and e4m3-block banks (pre-quantized checkpoints) are built from the checkpoint's codes
 * (backend/int4zp_host.c, cpu_bank_e4m3b.c) and kept as they are; checkpoints in our own int4-g128 format fill int4
 * banks from their codes (cpu_bank_native_int4.c). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/int4zp_host.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4.h"
#include "quant/int4_p2.h"
#include "util/status.h"

/* Matrix i is the row-concatenation of its parts; every matrix must have the shape of matrix 0. */
static fm_status fill_matrix(const fm_bank_src *src, int32_t i, int64_t cols, float *dst, fm_error *err) {
    for (int32_t j = 0; j < src->n_parts; j++) {
        const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j], *s0 = &src->srcs[j];
        if (s->cols != cols || s->rows != s0->rows)
            return fm_fail(err, FM_ERR_FORMAT, "%s: matrix %d part %d is [%lld, %lld], expected [%lld, %lld]",
                           src->label, i, j, (long long)s->rows, (long long)s->cols, (long long)s0->rows,
                           (long long)cols);
        fm_status st = fm_wsrc_read(s, dst, err);
        if (st) return st;
        dst += s->rows * s->cols;
    }
    return FM_OK;
}

static fm_status bank_build(fm_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err) {
    *out = NULL;
    int64_t rows = 0;
    for (int32_t j = 0; j < src->n_parts; j++) rows += src->srcs[j].rows;
    const int64_t cols = src->srcs[0].cols, per = rows * cols;
    fm_bank *w = fm_calloc(1, sizeof *w, err, src->label);
    if (!w) return FM_ERR_NOMEM;
    *w = (fm_bank){.fmt = fmt, .n = src->n, .rows = rows, .cols = cols};
    /* pre-quantized sources in our own int4-g128 format, bound natively (cpu_bank_native_int4.c) */
    if (fm_wformat_is_int4(fmt) && fm_bank_src_any_quantized(src)) {
        fm_status st = cpu_bank_fill_native_int4(w, src, err);
        if (st) {
            cpu_bank_free(be, w);
            return st;
        }
        *out = w;
        return FM_OK;
    }
    if (fm_wformat_is_int4zp(fmt)) { /* a checkpoint's int4, kept as it is */
        fm_int4zp_host h;
        fm_status st = fm_int4zp_host_build(src, fmt == FM_W_INT4_ZP, &h, err);
        if (st) {
            cpu_bank_free(be, w);
            return st;
        }
        w->group = h.group, w->n_groups = h.n_groups;
        w->codes = h.codes, w->zeros = h.zeros, w->scales = h.scales, w->perm = h.perm;
        *out = w;
        return FM_OK;
    }
    if (fmt == FM_W_E4M3_B128) { /* a checkpoint's block-FP8 */
        fm_status st = cpu_bank_fill_e4m3b(w, src, err);
        if (st) {
            cpu_bank_free(be, w);
            return st;
        }
        *out = w;
        return FM_OK;
    }
    w->w = fm_malloc((size_t)(src->n * per) * sizeof(float), err, src->label);
    fm_status st = w->w ? FM_OK : FM_ERR_NOMEM;
    const int threads = omp_get_max_threads(); /* the matrices of a bank on every core, one code buffer each */
    int8_t *q = NULL;
    if (!st && fm_wformat_is_int4(fmt)) {
        w->n_groups = fm_int4_n_groups(cols, FM_CPU_GROUP);
        w->scales = fm_malloc((size_t)(src->n * rows * w->n_groups) * sizeof(float), err, src->label);
        q = fm_malloc((size_t)per * (size_t)threads, err, src->label);
        if (!w->scales || !q) st = FM_ERR_NOMEM;
    }
    if (!st && fmt == FM_W_E4M3_PT && !(w->tscale = fm_malloc((size_t)src->n * sizeof(float), err, src->label)))
        st = FM_ERR_NOMEM;
    const fm_int4_params p4 = {FM_CPU_GROUP, true, FM_SCALE_BF16};
    int32_t bad = src->n; /* the lowest failing matrix reports */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (!st && src->n > 1)
    for (int32_t i = 0; i < src->n; i++) {
        float *m = w->w + (int64_t)i * per;
        fm_error e;
        const fm_status ms = fill_matrix(src, i, cols, m, &e);
        if (ms) {
#pragma omp critical(cpu_bank_create)
            if (i < bad) {
                bad = i, st = ms;
                if (err) *err = e;
            }
            continue;
        }
        if (fmt == FM_W_BF16) fm_round_bf16_array(m, per);
        if (fm_wformat_is_int4(fmt)) {
            int8_t *qt = q + (size_t)per * (size_t)omp_get_thread_num();
            float *sc = w->scales + (int64_t)i * rows * w->n_groups;
            if (be->plan.int4_p2) fm_int4_p2_quantize(m, rows, cols, qt, sc);
            else fm_int4_quantize(m, rows, cols, &p4, qt, sc, NULL);
            for (int64_t e4 = 0; e4 < per; e4++) m[e4] = (float)qt[e4];
        }
        if (fmt == FM_W_E4M3_PT) /* W8A8: one scale for the matrix, the decoded codes in place of the values */
            w->tscale[i] = fm_e4m3_quantize_tensor(m, per, m);
    }
    free(q);
    if (st) {
        cpu_bank_free(be, w);
        return st;
    }
    *out = w;
    return FM_OK;
}

/* Route w4a8.kernel=fold takes what the cuda backend's fold GEMM takes (cuda_bank_fold.cu), so that a model the cpu
   backend runs under it also loads on the GPU: the fp8 preset's int4 experts with int4-p2 scales, refused by name
   otherwise (the cpu backend would run any int4 scales, with the route's per-token activations alone). */
static fm_status fold_check(fm_backend *be, const fm_bank_src *src, const fm_bank *w, fm_error *err) {
    if (!src->experts || !cpu_fold_tokens(be) || be->plan.a_dispatch != FM_A_E4M3_G128) return FM_OK;
    if (!fm_wformat_is_int4(w->fmt))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: route w4a8.kernel=fold takes int4 experts with int4-p2 scales (the fp8 preset on a "
                       "checkpoint made by `fp8moe requantize --scales p2`, or --int4-scales p2); this bank is %s",
                       src->label, fm_wformat_name(w->fmt));
    for (int64_t r = 0; r < (int64_t)w->n * w->rows; r++)
        if (!fm_int4_p2_split(w->scales + r * w->n_groups, w->n_groups, NULL, NULL))
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: route w4a8.kernel=fold needs int4-p2 scales (each row's group scales a power of two "
                           "under its largest, docs/int4_p2.md), and row %lld has others: load with --int4-scales p2 "
                           "or a checkpoint made by `fp8moe requantize --scales p2`",
                           src->label, (long long)r);
    return FM_OK;
}

fm_status cpu_bank_create(fm_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err) {
    fm_status st = bank_build(be, src, fmt, out, err);
    if (st == FM_OK && (st = fold_check(be, src, *out, err)) != FM_OK) {
        cpu_bank_free(be, *out);
        *out = NULL;
    }
    return st;
}

void cpu_bank_free(fm_backend *be, fm_bank *w) {
    (void)be;
    if (!w) return;
    free(w->w);
    free(w->scales);
    free(w->tscale);
    free(w->codes);
    free(w->zeros);
    free(w->perm);
    free(w);
}

size_t cpu_bank_bytes(const fm_bank *w) {
    if (fm_wformat_is_int4zp(w->fmt))
        return (size_t)(w->n * w->rows) * ((size_t)(w->cols + 1) / 2 + (size_t)w->n_groups * (1 + sizeof(float))) +
               (w->perm ? (size_t)(w->n * w->cols) * sizeof(int32_t) : 0);
    if (w->fmt == FM_W_E4M3_B128)
        return (size_t)(w->n * w->rows) * ((size_t)w->cols + (size_t)w->n_groups * sizeof(float));
    size_t n = (size_t)(w->n * w->rows * w->cols) * sizeof(float);
    if (w->scales) n += (size_t)(w->n * w->rows * w->n_groups) * sizeof(float);
    if (w->tscale) n += (size_t)w->n * sizeof(float);
    return n;
}
