#include "io/ids.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/status.h"

fm_status fm_ids_read(const char *path, int32_t **ids, int64_t *n, fm_error *err) {
    *ids = NULL;
    *n   = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return fm_fail(err, FM_ERR_IO, "%s: cannot open ids file", path);
    if (!S_ISREG(sb.st_mode)) return fm_fail(err, FM_ERR_IO, "%s: ids file is not a regular file", path);
    if (sb.st_size == 0) return fm_fail(err, FM_ERR_FORMAT, "%s: ids file is empty (no tokens)", path);
    if (sb.st_size % 4 != 0)
        return fm_fail(err, FM_ERR_FORMAT, "%s: ids file size %lld bytes is not a multiple of 4 (expected little-endian int32 ids)",
                       path, (long long)sb.st_size);
    FILE *f = fopen(path, "rb");
    if (!f) return fm_fail(err, FM_ERR_IO, "%s: cannot open ids file", path);
    const int64_t count = (int64_t)sb.st_size / 4;
    uint8_t *raw = fm_malloc((size_t)sb.st_size, err, path);
    int32_t *out = raw ? fm_malloc((size_t)count * sizeof *out, err, path) : NULL;
    fm_status st = out ? FM_OK : FM_ERR_NOMEM;
    if (!st && fread(raw, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) st = fm_fail(err, FM_ERR_IO, "%s: read failed", path);
    fclose(f);
    for (int64_t i = 0; !st && i < count; i++) {
        const uint8_t *b = raw + 4 * i;
        out[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    }
    free(raw);
    if (st) {
        free(out);
        return st;
    }
    *ids = out;
    *n   = count;
    return FM_OK;
}
