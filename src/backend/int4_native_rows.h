/* A bank's pre-quantized sources in our own int4 format (quant/int4_native.h) written into the int4 row layout
 * (quant/int4_repack.h) on every core: the sources of a bank are independent and their rows consecutive (matrix i's
 * parts in turn), so each thread fills whole sources. The CPU backend expands the codes to floats from there; the
 * CUDA backend uploads batches of sources from pinned buffers while the next batch is filled. */
#ifndef FM_BACKEND_INT4_NATIVE_ROWS_H
#define FM_BACKEND_INT4_NATIVE_ROWS_H

#include "backend/backend.h"

/* Rows of the sources [first, first + count) of src (in bank order) into codes (ld bytes a row) and scales (ng bf16
 * a row), starting at the first row of source `first`. On failure err names the lowest failing source's problem,
 * whatever the threads' order. */
fm_status fm_int4_native_bank_rows(const fm_bank_src *src, int64_t first, int64_t count, int64_t ng, int64_t ld,
                                   uint8_t *codes, uint16_t *scales, fm_error *err);

/* Rows of the sources [first, first + count): where the next batch starts. */
int64_t fm_bank_src_rows(const fm_bank_src *src, int64_t first, int64_t count);

#endif
