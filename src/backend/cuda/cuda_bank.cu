// Weight banks on the GPU: each matrix's source rows are uploaded in their checkpoint dtype, in chunks through
// one staging buffer, and converted on the device into the bank's layout (cuda_internal.cuh). A checkpoint's chunk
// is copied out of the mapping into one of the load's two pinned buffers on every core (checked finite on the way)
// while the other one's transfer runs (load_stage.cuh). The formats that keep
// a pre-quantized checkpoint's numbers are built in cuda_bank_prequant.cu. Nothing of the
// source stays alive on the device: the staging buffer is freed before the bank is returned.
#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/cuda_bank_native_int4.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/linear_w8a8.cuh"
#include "backend/cuda/load_stage.cuh"
#include "backend/cuda/quantize.cuh"
#include "backend/cuda/w4a8_layout.cuh"

extern "C" {
#include "io/safetensors_copy.h"
#include "util/status.h"
}

#define STAGING_BYTES (64u << 20)

extern "C" void fm_cuda_bank_free(fm_backend *be, fm_bank *w);
extern "C" fm_status fm_cuda_bank_create_prequant(const fm_bank_src *src, fm_wformat fmt, fm_bank *w, fm_error *err);

static int64_t round_up(int64_t a, int64_t b) { return fm_ceil_div(a, b) * b; }

/* int4-tc: the bank was quantized (or filled from a checkpoint's codes) in the row layout; repack it (w4a8_layout.cuh)
 * and free the row layout */
fm_status fm_cuda_bank_repack_tc(cuda_backend *be, const fm_bank_src *src, fm_bank *w, fm_error *err) {
    const bool interleaved = src->gate_up && w->rows % 16 == 0;
    const int64_t rows_pad = round_up(w->rows, FM_TC_ROW_PAD);
    const size_t code_bytes = (size_t)(w->n * rows_pad * w->n_groups * FM_TC_K_GROUP / 2);
    const size_t scale_bytes = (size_t)(w->n * rows_pad * w->n_groups) * sizeof(__nv_bfloat16);
    uint8_t *codes = NULL;
    __nv_bfloat16 *scales = NULL;
    int *bad = NULL, bad_host = 0;
    if (cudaMalloc((void **)&codes, code_bytes) != cudaSuccess ||
        cudaMalloc((void **)&scales, scale_bytes) != cudaSuccess ||
        cudaMalloc((void **)&bad, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(codes), cudaFree(scales), cudaFree(bad);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory repacking %zu bytes of int4 weights", src->label,
                       code_bytes + scale_bytes);
    }
    FM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), be->stream));
    fm_cuda_repack_int4_tc((const uint8_t *)w->w, w->scales, w->n, w->rows, w->cols, w->ld, w->n_groups, interleaved,
                           codes, scales, rows_pad, bad, be->stream);
    FM_CUDA_CHECK(cudaMemcpyAsync(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost, be->stream));
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    FM_CUDA_CHECK(cudaFree(bad));
    FM_CUDA_CHECK(cudaFree(w->w));
    FM_CUDA_CHECK(cudaFree(w->scales));
    w->w = codes, w->scales = scales;
    w->fmt = FM_W_INT4_G128_TC, w->rows_pad = rows_pad, w->interleaved = interleaved;
    w->ld = w->n_groups * FM_TC_K_GROUP, w->bytes = code_bytes + scale_bytes;
    if (bad_host)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: %d int4 codes are -8, which the tensor-core layout cannot hold",
                       src->label, bad_host);
    return FM_OK;
}

static fm_status bank_create_layout(fm_backend *bb, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                    fm_error *err) {
    cuda_backend *be = cuda_be(bb);
    *out = NULL;
    /* pre-quantized: our own int4-g128 binds natively (cuda_bank_native_int4.cu), any other checkpoint format keeps
       its numbers (cuda_bank_prequant.cu); float formats dequantize them below */
    if (fm_wformat_is_int4(fmt) && fm_bank_src_any_quantized(src) && fm_cuda_bank_src_native(src))
        return fm_cuda_bank_create_native_int4(be, src, fmt, out, err);
    /* the engine's weight-format policy (engine/weight_format.h) asks for a checkpoint's own formats with e4m3
       1x128 activations only: never under an FP4 dispatch, which the W4A8 GEMM expands for int4-tc experts only */
    if (fmt == FM_W_INT4_ZP || fmt == FM_W_INT4_ZP_TC || fmt == FM_W_E4M3_B128) { /* cuda_bank_prequant.cu */
        fm_bank *w = (fm_bank *)calloc(1, sizeof *w);
        if (!w) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", src->label);
        w->fmt = fmt, w->n = src->n, w->cols = src->srcs[0].cols;
        for (int32_t j = 0; j < src->n_parts; j++) w->rows += src->srcs[j].rows;
        fm_status st = fm_cuda_bank_create_prequant(src, fmt, w, err);
        if (st) fm_cuda_bank_free(bb, w);
        else *out = w;
        return st;
    }
    if (fmt != FM_W_F32 && fmt != FM_W_BF16 && fmt != FM_W_INT4_G128 && fmt != FM_W_INT4_G128_TC && fmt != FM_W_E4M3_PT)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: weight format %s is not available on the cuda backend", src->label,
                       fm_wformat_name(fmt));
    int64_t rows = 0;
    for (int32_t j = 0; j < src->n_parts; j++) rows += src->srcs[j].rows;
    const int64_t cols = src->srcs[0].cols;
    for (int32_t i = 0; i < src->n; i++)
        for (int32_t j = 0; j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j], *s0 = &src->srcs[j];
            if (s->cols != cols || s->rows != s0->rows)
                return fm_fail(err, FM_ERR_FORMAT, "%s: matrix %d part %d is [%lld, %lld], expected [%lld, %lld]",
                               src->label, i, j, (long long)s->rows, (long long)s->cols, (long long)s0->rows,
                               (long long)cols);
            if (s->t && s->t->dtype != FM_DTYPE_F32 && s->t->dtype != FM_DTYPE_F16 && s->t->dtype != FM_DTYPE_BF16)
                return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (F32, F16 or BF16 expected)",
                               src->label, s->t->name, fm_dtype_name(s->t->dtype));
        }
    if (fmt == FM_W_E4M3_PT && rows % 16)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: --dense w8a8 runs through cuBLASLt FP8, which needs widths that are "
                       "multiples of 16; this projection has %lld rows",
                       src->label, (long long)rows);
    fm_bank *w = (fm_bank *)calloc(1, sizeof *w);
    if (!w) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", src->label);
    w->fmt = fmt, w->n = src->n, w->rows = rows, w->cols = cols;
    if (fmt == FM_W_F32 || fmt == FM_W_BF16) {
        w->ld = round_up(cols, fmt == FM_W_F32 ? 4 : 8); /* 16-byte rows */
        w->bytes = (size_t)(w->n * rows * w->ld) * bank_elem_size(w);
    } else if (fmt == FM_W_E4M3_PT) {
        w->ld = round_up(cols, 16);
        w->bytes = (size_t)(w->n * rows * w->ld);
    } else {
        w->ld = round_up(cols, 32) / 2;
        w->n_groups = fm_ceil_div(cols, FM_CUDA_GROUP);
        w->bytes = (size_t)(w->n * rows * w->ld);
    }
    const size_t scale_bytes = (size_t)(w->n * rows * w->n_groups) * sizeof(__nv_bfloat16);
    void *staging = NULL;
    /* e4m3-tensor: each matrix whole in fp32 first (its amax sets the scale), a scale slot per matrix */
    const bool w8a8 = fmt == FM_W_E4M3_PT;
    float *t32 = NULL;
    unsigned *amax32 = NULL;
    fm_status st = FM_OK;
    if (cudaMalloc(&w->w, w->bytes) != cudaSuccess ||
        (scale_bytes && cudaMalloc((void **)&w->scales, scale_bytes) != cudaSuccess) ||
        cudaMalloc(&staging, STAGING_BYTES) != cudaSuccess ||
        (w8a8 && (cudaMalloc((void **)&w->tscale, (size_t)w->n * FM_LT_SCALE_SLOT * sizeof(float)) != cudaSuccess ||
                  cudaMalloc((void **)&t32, (size_t)(rows * cols) * sizeof(float)) != cudaSuccess ||
                  cudaMalloc((void **)&amax32, sizeof(unsigned)) != cudaSuccess))) {
        cudaGetLastError(); /* clear the sticky allocation error */
        st = fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for %zu bytes of weights", src->label,
                     w->bytes + scale_bytes);
    }
    if (!st && w8a8) {
        w->lt_gemm = (fm_lt_gemm *)calloc(1, sizeof *w->lt_gemm);
        if (!be->lt && (be->lt = (fm_lt *)calloc(1, sizeof *be->lt)) && (st = fm_lt_init(be->lt, err))) {
            fm_lt_destroy(be->lt);
            free(be->lt), be->lt = NULL;
        }
        if (!st && (!w->lt_gemm || !be->lt)) st = fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", src->label);
        if (!st) st = fm_lt_gemm_init(w->lt_gemm, rows, w->ld, err);
    }
    if (!st) FM_CUDA_CHECK(cudaMemsetAsync(w->w, 0, w->bytes, be->stream)); /* the row padding reads as zeros */
    if (!st) st = fm_cuda_load_stage(be, STAGING_BYTES, err);
    int pinned = 0; /* the pinned buffer the next checkpoint chunk goes through */
    for (int32_t i = 0; !st && i < src->n; i++) {
        int64_t row0 = 0; /* first row of this part inside matrix i */
        for (int32_t j = 0; j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            /* a pre-quantized view read into a float format (ref, ref32, w8a8): dequantized on the host with the
               checkpoint's own formula, then converted like an F32 tensor */
            float *deq = NULL;
            if (fm_wsrc_is_quantized(s)) {
                if (!(deq = (float *)malloc((size_t)(s->rows * cols) * sizeof(float)))) {
                    st = fm_fail(err, FM_ERR_NOMEM, "out of host memory dequantizing %s", src->label);
                    break;
                }
                if ((st = fm_wsrc_read(s, deq, err))) {
                    free(deq);
                    break;
                }
            }
            const int dtype = s->t ? (int)s->t->dtype : (int)FM_DTYPE_F32; /* synthetic, dequantized: F32 */
            const int esz = fm_dtype_size((fm_dtype)dtype);
            const int64_t step = STAGING_BYTES / ((int64_t)esz * cols) > 0 ? STAGING_BYTES / ((int64_t)esz * cols) : 1;
            if (step * esz * cols > (int64_t)STAGING_BYTES) {
                st = fm_fail(err, FM_ERR_UNSUPPORTED, "%s: a row of %lld elements exceeds the staging buffer",
                             src->label, (long long)cols);
                free(deq);
                break;
            }
            for (int64_t r = 0; r < s->rows; r += step) {
                const int64_t n_rows = s->rows - r < step ? s->rows - r : step;
                if (s->t && !deq) { /* checked while copied to pinned memory on every core, then sent */
                    void *pin = fm_cuda_load_stage_take(be, pinned);
                    if ((st = fm_st_copy_finite(s->t, s->offset + r * cols, n_rows * cols, pin, err))) break;
                    fm_cuda_load_stage_send(be, pinned, 0, staging, (size_t)(n_rows * cols * esz));
                    pinned ^= 1;
                } else if (deq) {
                    const uint8_t *host = (const uint8_t *)(deq + r * cols);
                    /* in stream order: the conversion kernel below reads the staging buffer only after this copy
                       lands, and the next chunk's copy waits for the kernel (a plain cudaMemcpy from pageable memory
                       can return before its DMA completes, and it is not ordered with our non-blocking stream) */
                    FM_CUDA_CHECK(cudaMemcpyAsync(staging, host, (size_t)(n_rows * cols * esz), cudaMemcpyHostToDevice,
                                                  be->stream));
                } else {
                    /* rows r.. of the view: the same values the whole view has (and the CPU generates) */
                    fm_cuda_synth_f32(&s->synth, r * cols, n_rows * cols, cols, (float *)staging, be->stream);
                }
                const int64_t dst_row = (int64_t)i * rows + row0 + r;
                if (w8a8) fm_cuda_convert_f32(staging, dtype, n_rows, cols, t32 + (row0 + r) * cols, cols, be->stream);
                else if (fmt == FM_W_F32)
                    fm_cuda_convert_f32(staging, dtype, n_rows, cols, (float *)w->w + dst_row * w->ld, w->ld,
                                        be->stream);
                else if (fmt == FM_W_BF16)
                    fm_cuda_convert_bf16(staging, dtype, n_rows, cols, (__nv_bfloat16 *)w->w + dst_row * w->ld, w->ld,
                                         be->stream);
                else if (be->base.plan.int4_p2) /* --int4-scales p2 */
                    fm_cuda_quantize_int4_p2(staging, dtype, n_rows, cols, (uint8_t *)w->w + dst_row * w->ld, w->ld,
                                             w->scales + dst_row * w->n_groups, w->n_groups, be->stream);
                else
                    fm_cuda_quantize_int4(staging, dtype, n_rows, cols, (uint8_t *)w->w + dst_row * w->ld, w->ld,
                                          w->scales + dst_row * w->n_groups, w->n_groups, be->stream);
            }
            if (deq) { /* the copies above read it */
                FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
                free(deq);
            }
            if (st) break; /* a non-finite weight */
            row0 += s->rows;
        }
        if (!st && w8a8)
            fm_cuda_w8a8_quantize_matrix(t32, rows, cols, (uint8_t *)w->w + (int64_t)i * rows * w->ld, w->ld,
                                         w->tscale + (int64_t)i * FM_LT_SCALE_SLOT, amax32, be->stream);
    }
    if (staging) {
        FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
        FM_CUDA_CHECK(cudaFree(staging));
    }
    cudaFree(t32), cudaFree(amax32);
    if (st) {
        fm_cuda_bank_free(bb, w);
        return st;
    }
    w->bytes += scale_bytes + (w8a8 ? (size_t)w->n * FM_LT_SCALE_SLOT * sizeof(float) : 0);
    if (fmt == FM_W_INT4_G128_TC && (st = fm_cuda_bank_repack_tc(be, src, w, err))) {
        fm_cuda_bank_free(bb, w);
        return st;
    }
    *out = w;
    return FM_OK;
}

/* the bank in its format's layout, then (route w4a8.kernel=fold) an int4-p2 expert bank's codes in the fold layout */
extern "C" fm_status fm_cuda_bank_create(fm_backend *bb, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                         fm_error *err) {
    fm_status st = bank_create_layout(bb, src, fmt, out, err);
    if (!st && (st = fm_cuda_bank_fold(cuda_be(bb), src, *out, err))) {
        fm_cuda_bank_free(bb, *out);
        *out = NULL;
    }
    return st;
}

extern "C" void fm_cuda_bank_free(fm_backend *be, fm_bank *w) {
    (void)be;
    if (!w) return;
    if (w->host) { /* expert_cache.cu: only w and scales, pinned */
        if (w->w) FM_CUDA_CHECK(cudaFreeHost(w->w));
        if (w->scales) FM_CUDA_CHECK(cudaFreeHost(w->scales));
        free(w);
        return;
    }
    if (w->w) FM_CUDA_CHECK(cudaFree(w->w));
    if (w->scales) FM_CUDA_CHECK(cudaFree(w->scales));
    if (w->tscale) FM_CUDA_CHECK(cudaFree(w->tscale));
    if (w->zeros) FM_CUDA_CHECK(cudaFree(w->zeros));
    if (w->fscales) FM_CUDA_CHECK(cudaFree(w->fscales));
    if (w->zscales) FM_CUDA_CHECK(cudaFree(w->zscales));
    if (w->perm) FM_CUDA_CHECK(cudaFree(w->perm));
    if (w->fold_j) FM_CUDA_CHECK(cudaFree(w->fold_j));
    if (w->fold_rs) FM_CUDA_CHECK(cudaFree(w->fold_rs));
    if (w->lt_gemm) fm_lt_gemm_destroy(w->lt_gemm);
    free(w->lt_gemm);
    free(w);
}

extern "C" size_t fm_cuda_bank_bytes(const fm_bank *w) { return w->bytes; }
