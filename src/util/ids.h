/* Token-id files: little-endian int32, no header. */
#ifndef FM_UTIL_IDS_H
#define FM_UTIL_IDS_H

#include <stdint.h>

#include "fp8moe.h"

/* Reads all ids of path into a malloc'ed array (*ids, *n). An empty file or a size that is not a multiple
 * of 4 is FM_ERR_FORMAT; a FIFO, device or directory is refused (FM_ERR_IO). */
fm_status fm_ids_read(const char *path, int32_t **ids, int64_t *n, fm_error *err);

/* FM_ERR_FORMAT naming path, the position and the id when an id is outside [0, vocab). */
fm_status fm_ids_check_vocab(const char *path, const int32_t *ids, int64_t n, int32_t vocab, fm_error *err);

#endif
