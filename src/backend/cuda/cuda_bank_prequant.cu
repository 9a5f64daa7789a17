// Banks of pre-quantized checkpoints on the GPU (layouts in cuda_internal.cuh), built on the host from the packed
// tensors and uploaded once; the codes are moved, never expanded to floats:
//   int4-zp     (int4 plans: the W4A16 GEMV)         the host int4-zp arrays (backend/int4zp_host.h), rows padded
//   int4-zp-tc  (fp8 plans: the W4A8 kernels)        the same codes in w4a8_layout.cuh's tiles, unsigned nibbles;
//                                                    an unsigned code u read as an e4m3 byte is exactly u / 512
//                                                    (subnormal for u < 8, normal above), so the kernels need no
//                                                    conversion; the zero point is applied per 128-group as
//                                                    zero x scale x (the group's activation sum)
//   e4m3-block  (fp8 plans, block-FP8 checkpoints)   the checkpoint's e4m3 bytes in the same tiles, 8 bits each
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/w4a8_layout.cuh"

extern "C" {
#include "backend/int4zp_host.h"
#include "util/status.h"
}

static int64_t round_up(int64_t a, int64_t b) { return fm_ceil_div(a, b) * b; }

// cudaMalloc + a synchronous copy (the host buffers are freed right after)
static fm_status upload(void **dst, const void *src, size_t bytes, const char *label, fm_error *err) {
    if (cudaMalloc(dst, bytes) != cudaSuccess) {
        cudaGetLastError();
        *dst = NULL;
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for %zu bytes of weights", label, bytes);
    }
    FM_CUDA_CHECK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return FM_OK;
}

static fm_status device_alloc(void **dst, size_t bytes, const char *label, fm_error *err) {
    if (cudaMalloc(dst, bytes) != cudaSuccess) {
        cudaGetLastError();
        *dst = NULL;
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of GPU memory for %zu bytes of weights", label, bytes);
    }
    return FM_OK;
}

// int4-zp for the GEMV: rows padded to 16 bytes (32 codes), the padding code 0 meets zero activations
static fm_status build_zp_rows(const fm_int4zp_host *h, fm_bank *w, const char *label, fm_error *err) {
    const int64_t KB = (h->cols + 1) / 2, nr = (int64_t)h->n * h->rows, ng = h->n_groups;
    w->ld = round_up(h->cols, 32) / 2;
    if (ng > 1 && h->group % 8)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: int4 groups of %d along K: the GPU GEMV needs a multiple of 8",
                       label, h->group);
    uint8_t *codes = (uint8_t *)calloc((size_t)(nr * w->ld), 1);
    if (!codes) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", label);
    for (int64_t r = 0; r < nr; r++) memcpy(codes + r * w->ld, h->codes + r * KB, (size_t)KB);
    fm_status st = upload(&w->w, codes, (size_t)(nr * w->ld), label, err);
    free(codes);
    if (!st) st = upload((void **)&w->zeros, h->zeros, (size_t)(nr * ng), label, err);
    if (!st) st = upload((void **)&w->fscales, h->scales, (size_t)(nr * ng) * sizeof(float), label, err);
    if (!st && h->perm) st = upload((void **)&w->perm, h->perm, (size_t)(h->n * h->cols) * sizeof(int32_t), label, err);
    w->group = h->group, w->n_groups = ng;
    w->bytes = (size_t)(nr * w->ld) + (size_t)(nr * ng) * (1 + sizeof(float)) +
               (h->perm ? (size_t)(h->n * h->cols) * sizeof(int32_t) : 0);
    return st;
}

// One matrix of row-major 8-bit values vals [rows][Kp] (int4 codes 0..15 or e4m3 bytes) into w4a8_layout.cuh's
// tiles: [rows_pad / 16][Kp / 128][chunk]. Nibbles: the int4 chunk of 1024 bytes, [half h][lane][16 bytes], byte
// b of word 4h + jj holding rows (g, g + 8) at k = 32 s + 16 p + 4 t + b (s = (4h + jj) / 2, p = jj % 2), row g in
// the low nibble. Bytes: a chunk of 2048, [k step s][lane][16 bytes], word i of step s the mma A register a_i:
// row g + 8 (i & 1) at k = 32 s + 16 (i >> 1) + 4 t + b. Rows past `rows` are zero.
static void pack_tiles(const uint8_t *vals, int64_t rows, int64_t Kp, int64_t rows_pad, bool interleaved, bool nibbles,
                       uint8_t *dst) {
    const int64_t ng = Kp / 128, chunk = nibbles ? FM_TC_CHUNK : 2 * FM_TC_CHUNK;
    for (int64_t blk = 0; blk < rows_pad / 16; blk++)
        for (int64_t grp = 0; grp < ng; grp++) {
            uint8_t *c = dst + (blk * ng + grp) * chunk;
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                const int64_t tr[2] = {blk * 16 + g, blk * 16 + g + 8};
                const uint8_t *src[2];
                for (int i = 0; i < 2; i++)
                    src[i] = tr[i] < rows ? vals + fm_tc_source_row(tr[i], rows, interleaved) * Kp + grp * 128 : NULL;
                for (int word = 0; word < (nibbles ? 8 : 16); word++)
                    for (int b = 0; b < 4; b++) {
                        uint8_t byte;
                        if (nibbles) {
                            const int64_t k = 32 * (word / 2) + 16 * (word % 2) + 4 * t + b;
                            byte = (uint8_t)((src[0] ? src[0][k] : 0) | (src[1] ? src[1][k] : 0) << 4);
                        } else {
                            const int s = word / 4, i = word % 4;
                            const int64_t k = 32 * s + 16 * (i >> 1) + 4 * t + b;
                            byte = src[i & 1] ? src[i & 1][k] : 0;
                        }
                        c[(word / 4) * 512 + lane * 16 + (word % 4) * 4 + b] = byte;
                    }
            }
        }
}

// Device arrays of a tile-layout bank (w, fscales, zscales when zp), sized from w->rows_pad and n_groups.
static fm_status alloc_tiles(fm_bank *w, bool nibbles, bool zp, const char *label, fm_error *err) {
    const size_t chunk = nibbles ? FM_TC_CHUNK : 2 * FM_TC_CHUNK;
    const size_t tiles = (size_t)(w->n * (w->rows_pad / 16) * w->n_groups) * chunk;
    const size_t sc = (size_t)(w->n * w->n_groups * w->rows_pad) * sizeof(float);
    w->bytes = tiles + sc * (zp ? 2 : 1);
    fm_status st = device_alloc(&w->w, tiles, label, err);
    if (!st) st = device_alloc((void **)&w->fscales, sc, label, err);
    if (!st && zp) st = device_alloc((void **)&w->zscales, sc, label, err);
    return st;
}

// int4-zp-tc: needs groups of whole 128-blocks (or one group) and no act-order (the kernels' activations are in
// checkpoint order, quantized once for every matrix that reads them)
static fm_status build_zp_tiles(const fm_int4zp_host *h, fm_bank *w, bool gate_up, const char *label, fm_error *err) {
    if (h->perm) /* only an order that is not the identity is kept for int4-zp-tc (model.c refuses it first) */
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: act-order (desc_act) int4 weights run under --preset int4, not "
                       "under the fp8 presets",
                       label);
    if (h->n_groups > 1 && h->group % 128)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: int4 groups of %d along K: the fp8 presets need a multiple of 128 "
                       "(--preset int4 runs any group size)",
                       label, h->group);
    const int64_t rows = h->rows, K = h->cols, Kp = round_up(K, 128), KB = (K + 1) / 2, ng = h->n_groups;
    w->interleaved = gate_up && rows % 16 == 0;
    w->rows_pad = round_up(rows, FM_TC_ROW_PAD), w->n_groups = Kp / 128, w->ld = Kp;
    fm_status st = alloc_tiles(w, true, true, label, err);
    const size_t tile_bytes = (size_t)(w->rows_pad / 16 * w->n_groups) * FM_TC_CHUNK;
    const size_t sc_n = (size_t)(w->n_groups * w->rows_pad);
    uint8_t *vals = (uint8_t *)calloc((size_t)(rows * Kp), 1), *tiles = (uint8_t *)malloc(tile_bytes);
    float *fs = (float *)calloc(sc_n, sizeof(float)), *zs = (float *)calloc(sc_n, sizeof(float));
    if (!st && (!vals || !tiles || !fs || !zs)) st = fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", label);
    for (int32_t i = 0; !st && i < h->n; i++) {
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *cr = h->codes + ((int64_t)i * rows + r) * KB;
            for (int64_t k = 0; k < K; k++) vals[r * Kp + k] = (uint8_t)((cr[k >> 1] >> ((k & 1) * 4)) & 15);
        }
        pack_tiles(vals, rows, Kp, w->rows_pad, w->interleaved, true, tiles);
        for (int64_t grp = 0; grp < w->n_groups; grp++)
            for (int64_t tr = 0; tr < rows; tr++) {
                const int64_t src = ((int64_t)i * rows + fm_tc_source_row(tr, rows, w->interleaved)) * ng +
                                    (ng == 1 ? 0 : grp * 128 / h->group);
                fs[grp * w->rows_pad + tr] = h->scales[src] * 512.0f; /* exact: a power of two */
                zs[grp * w->rows_pad + tr] = (float)h->zeros[src] * h->scales[src];
            }
        FM_CUDA_CHECK(cudaMemcpy((uint8_t *)w->w + i * tile_bytes, tiles, tile_bytes, cudaMemcpyHostToDevice));
        FM_CUDA_CHECK(cudaMemcpy(w->fscales + i * sc_n, fs, sc_n * sizeof(float), cudaMemcpyHostToDevice));
        FM_CUDA_CHECK(cudaMemcpy(w->zscales + i * sc_n, zs, sc_n * sizeof(float), cudaMemcpyHostToDevice));
    }
    free(vals), free(tiles), free(fs), free(zs);
    return st;
}

// e4m3-block: each part's e4m3 bytes and its per-(bn x 128) block scale, stacked along rows
static fm_status build_e4m3_tiles(const fm_bank_src *src, fm_bank *w, const char *label, fm_error *err) {
    const int64_t rows = w->rows, K = w->cols, Kp = round_up(K, 128);
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_qsrc *q = &src->srcs[i].q;
        if (q->method != FM_QUANT_FP8_BLOCK)
            return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: an e4m3-block bank needs block-FP8 sources in every part",
                           label);
        if (q->group != 128)
            return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: block-FP8 blocks %d wide along K: the fp8 presets need 128",
                           label, q->group);
    }
    w->interleaved = src->gate_up && rows % 16 == 0;
    w->rows_pad = round_up(rows, FM_TC_ROW_PAD), w->n_groups = Kp / 128, w->ld = Kp;
    fm_status st = alloc_tiles(w, false, false, label, err);
    const size_t tile_bytes = (size_t)(w->rows_pad / 16 * w->n_groups) * 2 * FM_TC_CHUNK;
    const size_t sc_n = (size_t)(w->n_groups * w->rows_pad);
    uint8_t *vals = (uint8_t *)calloc((size_t)(rows * Kp), 1), *tiles = (uint8_t *)malloc(tile_bytes);
    float *fs = (float *)calloc(sc_n, sizeof(float)),
          *row_sc = (float *)malloc((size_t)(rows * w->n_groups) * sizeof(float));
    float *blk = NULL;
    if (!st && (!vals || !tiles || !fs || !row_sc)) st = fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", label);
    for (int32_t i = 0; !st && i < src->n; i++) {
        int64_t row0 = 0;
        for (int32_t j = 0; !st && j < src->n_parts; j++) {
            const fm_wsrc *s = &src->srcs[(int64_t)i * src->n_parts + j];
            const int64_t bn = s->q.block_n, nb = fm_ceil_div(s->rows, bn), n_sc = nb * w->n_groups;
            if (!(blk = (float *)realloc(blk, (size_t)n_sc * sizeof(float)))) {
                st = fm_fail(err, FM_ERR_NOMEM, "out of host memory for %s", label);
                break;
            }
            if ((st = fm_st_check_finite(s->q.packed, 0, s->rows * K, err)) ||
                (st = fm_st_check_finite(s->q.scales, 0, n_sc, err)) ||
                (st = fm_st_read_f32(s->q.scales, 0, n_sc, blk, err)))
                break;
            for (int64_t r = 0; r < s->rows; r++) {
                memcpy(vals + (row0 + r) * Kp, s->q.packed->data + r * K, (size_t)K);
                for (int64_t g = 0; g < w->n_groups; g++)
                    row_sc[(row0 + r) * w->n_groups + g] = blk[(r / bn) * w->n_groups + g];
            }
            row0 += s->rows;
        }
        if (st) break;
        pack_tiles(vals, rows, Kp, w->rows_pad, w->interleaved, false, tiles);
        for (int64_t g = 0; g < w->n_groups; g++)
            for (int64_t tr = 0; tr < rows; tr++)
                fs[g * w->rows_pad + tr] = row_sc[fm_tc_source_row(tr, rows, w->interleaved) * w->n_groups + g];
        FM_CUDA_CHECK(cudaMemcpy((uint8_t *)w->w + i * tile_bytes, tiles, tile_bytes, cudaMemcpyHostToDevice));
        FM_CUDA_CHECK(cudaMemcpy(w->fscales + i * sc_n, fs, sc_n * sizeof(float), cudaMemcpyHostToDevice));
    }
    free(vals), free(tiles), free(fs), free(row_sc), free(blk);
    return st;
}

extern "C" fm_status fm_cuda_bank_create_prequant(const fm_bank_src *src, fm_wformat fmt, fm_bank *w, fm_error *err) {
    if (fmt == FM_W_E4M3_B128) return build_e4m3_tiles(src, w, src->label, err);
    if (fmt != FM_W_INT4_ZP && fmt != FM_W_INT4_ZP_TC)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: weight format %s is not one of a pre-quantized checkpoint's",
                       src->label, fm_wformat_name(fmt));
    fm_int4zp_host h;
    fm_status st = fm_int4zp_host_build(src, fmt == FM_W_INT4_ZP, &h, err);
    if (st) return st;
    st = fmt == FM_W_INT4_ZP ? build_zp_rows(&h, w, src->label, err)
                             : build_zp_tiles(&h, w, src->gate_up, src->label, err);
    fm_int4zp_host_free(&h);
    return st;
}
