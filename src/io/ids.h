/* Token-id files: little-endian int32, no header. */
#ifndef FM_IO_IDS_H
#define FM_IO_IDS_H

#include <stdint.h>

#include "fp8moe.h"

/* Reads all ids of path into a malloc'ed array (*ids, *n). An empty file or a size that is not a multiple
 * of 4 is FM_ERR_FORMAT. Range checks against a vocabulary are the model's job (fm_model_logits). */
fm_status fm_ids_read(const char *path, int32_t **ids, int64_t *n, fm_error *err);

#endif
