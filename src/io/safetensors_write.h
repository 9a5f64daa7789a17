/* safetensors writer: the layout the reader (safetensors.h) and the reference library accept.
 *   u64 little-endian N, then N bytes of JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {k: v}},
 *   padded with spaces so that 8 + N is a multiple of 8, then every tensor's bytes back to back in entry order.
 * Entries sorted by fm_st_entries_sort (descending element size, then name, as the reference writer orders them)
 * keep every tensor aligned to its element size inside the file. The file is written as PATH.partial and renamed to
 * PATH by fm_st_writer_close once every declared byte has been written, so a failed run never leaves a file that
 * looks complete. Data is streamed: a caller writes one tensor at a time and never holds the whole file. */
#ifndef FM_IO_SAFETENSORS_WRITE_H
#define FM_IO_SAFETENSORS_WRITE_H

#include <stdio.h>

#include "io/safetensors.h"

typedef struct fm_st_entry {
    const char *name; /* owned by the caller, alive until the header is written */
    fm_dtype dtype;
    int32_t n_dims;
    int64_t shape[FM_ST_MAX_DIMS];
} fm_st_entry;

uint64_t fm_st_entry_bytes(const fm_st_entry *e);
void fm_st_entries_sort(fm_st_entry *e, int64_t n);

/* The length prefix and the padded header of entries e[0..n) in that order, with __metadata__ from meta (n_meta
 * key/value pairs, meta[2i] the key, meta[2i + 1] the value; none when n_meta is 0). *out is malloc'd; *out_len
 * counts the 8 prefix bytes too and is a multiple of 8. */
fm_status fm_st_header_build(const fm_st_entry *e, int64_t n, const char *const *meta, int32_t n_meta, uint8_t **out,
                             uint64_t *out_len, fm_error *err);

typedef struct fm_st_writer {
    FILE *f;
    char *path, *tmp;
    uint64_t data_len; /* bytes the header declares */
    uint64_t written;  /* data bytes written so far */
} fm_st_writer;

/* Creates PATH.partial and writes the header of e[0..n). */
fm_status fm_st_writer_open(fm_st_writer *w, const char *path, const fm_st_entry *e, int64_t n, const char *const *meta,
                            int32_t n_meta, fm_error *err);
/* Appends bytes of the data region (the tensors in entry order; any split of their bytes). */
fm_status fm_st_writer_write(fm_st_writer *w, const void *data, uint64_t n, fm_error *err);
/* Checks that every declared byte was written, flushes, and renames PATH.partial to PATH. On failure the partial
 * file is removed. */
fm_status fm_st_writer_close(fm_st_writer *w, fm_error *err);
/* Removes the partial file (after an error elsewhere); harmless on a closed or zeroed writer. */
void fm_st_writer_abort(fm_st_writer *w);

#endif
