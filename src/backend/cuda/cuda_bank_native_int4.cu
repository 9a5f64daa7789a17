// Native int4 banks from a pre-quantized checkpoint in our own format (see cuda_bank_native_int4.cuh). Each source
// is decoded on the host (codes u, zero points checked to be 8, bf16 scales), written in the row layout (two's
// complement nibbles q = u - 8, element 2i in the low nibble, ld = round_up(cols, 32) / 2 bytes, padding zero;
// scales [n][rows][n_groups] bf16) and copied to the device in stream order; the tensor-core layout is then made by
// the repack that banks quantized on the device go through (which refuses codes of -8: model.c does not ask for it).
#include "backend/cuda/cuda_bank_native_int4.cuh"

extern "C" {
#include "quant/bf16.h"
#include "util/status.h"
}

bool fm_cuda_bank_src_native(const fm_bank_src *src) {
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_wsrc *s = &src->srcs[i];
        if (!fm_wsrc_is_quantized(s) || !fm_qsrc_native_layout(&s->q, s->cols)) return false;
    }
    return true;
}

// One source [prow, cols] into host buffers in the row layout (codes prow x ld bytes, scales prow x ng bf16).
static fm_status fill_part(const fm_wsrc *s, const fm_bank *w, uint8_t *codes, uint16_t *scales, const char *label,
                           fm_error *err) {
    const int64_t K = w->cols, ng = w->n_groups;
    fm_int4_ckpt c;
    fm_status st = fm_int4_ckpt_decode(&s->q, s->rows, K, &c, err);
    if (st) return st;
    if (c.n_groups != ng)
        st = fm_fail(err, FM_ERR_FORMAT, "%s: %s has %lld scale groups per row, the bank %lld", label,
                     s->q.scales->name, (long long)c.n_groups, (long long)ng);
    if (!st) st = fm_int4_ckpt_check_symmetric(&c, label, s->q.packed->name, err);
    for (int64_t n = 0; !st && n < s->rows; n++) {
        uint8_t *row = codes + n * w->ld;
        memset(row, 0, (size_t)w->ld); // the padding past cols reads as zero codes
        for (int64_t k = 0; k < K; k++) row[k >> 1] |= (uint8_t)(((c.codes[n * K + k] ^ 8u) & 15u) << ((k & 1) * 4));
        for (int64_t g = 0; g < ng; g++) scales[n * ng + g] = fm_f32_to_bf16(c.scales[n * ng + g]); // exact: bf16
    }
    fm_int4_ckpt_free(&c);
    return st;
}

fm_status fm_cuda_bank_create_native_int4(cuda_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                          fm_error *err) {
    *out = NULL;
    if (!fm_wformat_is_int4(fmt) || !fm_cuda_bank_src_native(src))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: only int4 symmetric group-128 sources with bf16 scales fill an "
                       "int4 bank directly (asked for %s)",
                       src->label, fm_wformat_name(fmt));
    int64_t rows = 0, max_part = 0;
    for (int32_t j = 0; j < src->n_parts; j++) {
        rows += src->srcs[j].rows;
        max_part = src->srcs[j].rows > max_part ? src->srcs[j].rows : max_part;
    }
    const int64_t cols = src->srcs[0].cols;
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_wsrc *s = &src->srcs[i], *s0 = &src->srcs[i % src->n_parts];
        if (s->cols != cols || s->rows != s0->rows)
            return fm_fail(err, FM_ERR_FORMAT, "%s: source %lld is [%lld, %lld], expected [%lld, %lld]", src->label,
                           (long long)i, (long long)s->rows, (long long)s->cols, (long long)s0->rows, (long long)cols);
    }
    fm_bank *w = (fm_bank *)calloc(1, sizeof *w);
    if (!w) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", src->label);
    w->fmt = FM_W_INT4_G128, w->n = src->n, w->rows = rows, w->cols = cols; // the row layout first
    w->ld = fm_ceil_div(cols, 32) * 16, w->n_groups = fm_ceil_div(cols, FM_CUDA_GROUP);
    w->bytes = (size_t)(w->n * rows * w->ld);
    const size_t scale_bytes = (size_t)(w->n * rows * w->n_groups) * sizeof(__nv_bfloat16);
    uint8_t *codes = (uint8_t *)malloc((size_t)(max_part * w->ld));
    uint16_t *scales = (uint16_t *)malloc((size_t)(max_part * w->n_groups) * sizeof(uint16_t));
    fm_status st = FM_OK;
    if (!codes || !scales) st = fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", src->label);
    else if (cudaMalloc(&w->w, w->bytes) != cudaSuccess ||
             cudaMalloc((void **)&w->scales, scale_bytes) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky allocation error
        st = fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for %zu bytes of weights", src->label,
                     w->bytes + scale_bytes);
    }
    for (int32_t i = 0; !st && i < src->n; i++) {
        int64_t row0 = 0;
        for (int32_t j = 0; !st && j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            if ((st = fill_part(s, w, codes, scales, src->label, err))) break;
            const int64_t r = (int64_t)i * rows + row0;
            FM_CUDA_CHECK(cudaMemcpyAsync((uint8_t *)w->w + r * w->ld, codes, (size_t)(s->rows * w->ld),
                                          cudaMemcpyHostToDevice, be->stream));
            FM_CUDA_CHECK(cudaMemcpyAsync(w->scales + r * w->n_groups, scales,
                                          (size_t)(s->rows * w->n_groups) * sizeof(uint16_t), cudaMemcpyHostToDevice,
                                          be->stream));
            FM_CUDA_CHECK(cudaStreamSynchronize(be->stream)); // the host buffers are refilled for the next part
            row0 += s->rows;
        }
    }
    free(codes), free(scales);
    if (!st) w->bytes += scale_bytes;
    if (!st && fmt == FM_W_INT4_G128_TC) st = fm_cuda_bank_repack_tc(be, src, w, err);
    if (st) {
        fm_cuda_bank_free(&be->base, w);
        return st;
    }
    *out = w;
    return FM_OK;
}
