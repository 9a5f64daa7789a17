/* Files named by a user: opened for reading without blocking on a FIFO or a device, refused as output when they
 * exist and are not regular files, and paths shortened for messages so that the reason always fits. */
#ifndef FM_UTIL_FILE_H
#define FM_UTIL_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "fp8moe.h"

/* Longest path quoted whole in a message; longer paths keep their tail ("...") so the file name stays. */
#define FM_PATH_SHOWN 200

typedef struct fm_path_buf {
    char s[FM_PATH_SHOWN + 8];
} fm_path_buf;

/* path, or "..." and its last FM_PATH_SHOWN bytes when it is longer. */
const char *fm_path_show(fm_path_buf *b, const char *path);

/* What a non-regular file is, for "PATH: not a regular file (a FIFO)": "a directory", "a FIFO", ... */
const char *fm_file_kind(unsigned mode);

/* Opens path for reading when it is a regular file: a FIFO or a device is refused by name, without blocking in
 * open(). what says what the file should be ("config.json", "a safetensors file"). When missing is not NULL, a path
 * that does not exist sets *missing, leaves *fd = -1 and returns FM_OK; else it is an FM_ERR_IO. */
fm_status fm_open_regular(const char *path, const char *what, int *fd, bool *missing, fm_error *err);

/* Reads the whole regular file path (at most max_bytes) into a malloc'ed NUL-terminated buffer. */
fm_status fm_read_regular(const char *path, const char *what, size_t max_bytes, char **data, size_t *len,
                          fm_error *err);

/* An output path must be absent or a regular file: a device, FIFO, socket or directory there is refused (writing
 * through a temporary file and a rename would replace it). */
fm_status fm_check_output_path(const char *path, fm_error *err);

#endif
