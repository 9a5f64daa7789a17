// Native int4 banks from a pre-quantized checkpoint in our own format (see cuda_bank_native_int4.cuh). The sources
// are written in the row layout (two's complement nibbles q = u - 8, element 2i in the low nibble, ld =
// round_up(cols, 32) / 2 bytes, padding zero; scales [n][rows][n_groups] bf16) on every host core
// (backend/int4_native_rows.h: for `fp8moe requantize`'s files an xor of the checkpoint's words), a batch of whole
// sources at a time into one of two pinned buffers, and copied to the device in stream order while the next batch
// fills the other buffer. The tensor-core layout is then made by the repack that banks quantized on the device go
// through (which refuses codes of -8: model.c does not ask for it).
#include "backend/cuda/cuda_bank_native_int4.cuh"
#include "backend/cuda/load_stage.cuh"

extern "C" {
#include "backend/int4_native_rows.h"
#include "util/status.h"
}

bool fm_cuda_bank_src_native(const fm_bank_src *src) {
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_wsrc *s = &src->srcs[i];
        if (!fm_wsrc_is_quantized(s) || !fm_qsrc_native_layout(&s->q, s->cols)) return false;
    }
    return true;
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
    const int64_t cols = src->srcs[0].cols, total = (int64_t)src->n * src->n_parts;
    for (int64_t i = 0; i < total; i++) {
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
    const int64_t ng = w->n_groups, ld = w->ld;
    const size_t row_bytes = (size_t)ld + (size_t)ng * sizeof(uint16_t); // ld is a multiple of 16: scales aligned
    const size_t scale_bytes = (size_t)(w->n * rows * ng) * sizeof(__nv_bfloat16);
    // a batch: as many whole sources as a staging buffer holds (64 MiB: some 80 expert matrices of Qwen3-30B-A3B,
    // enough to keep every core busy), grown to the largest single source when one is larger
    fm_status st = fm_cuda_load_stage(be, (size_t)max_part * row_bytes, err);
    if (!st &&
        (cudaMalloc(&w->w, w->bytes) != cudaSuccess || cudaMalloc((void **)&w->scales, scale_bytes) != cudaSuccess)) {
        cudaGetLastError(); // clear the sticky allocation error
        st = fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for %zu bytes of weights", src->label,
                     w->bytes + scale_bytes);
    }
    int64_t r = 0; // the bank row of the batch's first source
    for (int64_t s = 0, b = 0; !st && s < total; b ^= 1) {
        int64_t count = 0, batch_rows = 0;
        while (s + count < total &&
               (count == 0 || (size_t)(batch_rows + src->srcs[s + count].rows) * row_bytes <= be->load_stage_bytes))
            batch_rows += src->srcs[s + count++].rows;
        uint8_t *codes = (uint8_t *)fm_cuda_load_stage_take(be, (int)b); // its previous copy has landed
        uint16_t *scales = (uint16_t *)(codes + batch_rows * ld);
        if ((st = fm_int4_native_bank_rows(src, s, count, ng, ld, codes, scales, err))) break;
        FM_CUDA_CHECK(cudaMemcpyAsync((uint8_t *)w->w + r * ld, codes, (size_t)(batch_rows * ld),
                                      cudaMemcpyHostToDevice, be->stream));
        // the scales sit after the batch's codes in the buffer
        fm_cuda_load_stage_send(be, (int)b, (size_t)(batch_rows * ld), w->scales + r * ng,
                                (size_t)(batch_rows * ng) * sizeof(uint16_t));
        s += count, r += batch_rows;
    }
    if (!st) w->bytes += scale_bytes;
    if (!st && fmt == FM_W_INT4_G128_TC) st = fm_cuda_bank_repack_tc(be, src, w, err);
    if (st) {
        FM_CUDA_CHECK(cudaStreamSynchronize(be->stream)); // no copy still reads into the bank
        fm_cuda_bank_free(&be->base, w);
        return st;
    }
    *out = w;
    return FM_OK;
}
