#include "util/ids.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/file.h"
#include "util/status.h"

#define IDS_MAX_BYTES ((size_t)1 << 34) /* 4 Gi ids: far beyond any context */

fm_status fm_ids_read(const char *path, int32_t **ids, int64_t *n, fm_error *err) {
    *ids = NULL;
    *n = 0;
    fm_path_buf pb;
    const char *P = fm_path_show(&pb, path);
    char *raw = NULL;
    size_t len = 0;
    fm_status st = fm_read_regular(path, "an ids file (little-endian int32 token ids)", IDS_MAX_BYTES, &raw, &len, err);
    if (st) return st;
    if (len == 0) st = fm_fail(err, FM_ERR_FORMAT, "%s: ids file is empty (no tokens)", P);
    else if (len % 4 != 0)
        st = fm_fail(err, FM_ERR_FORMAT,
                     "%s: ids file size %zu bytes is not a multiple of 4 (expected little-endian int32 ids)", P, len);
    const int64_t count = (int64_t)(len / 4);
    int32_t *out = st ? NULL : fm_malloc((size_t)count * sizeof *out, err, "token ids");
    if (!st && !out) st = FM_ERR_NOMEM;
    for (int64_t i = 0; !st && i < count; i++) {
        const uint8_t *b = (const uint8_t *)raw + 4 * i;
        out[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    }
    free(raw);
    if (st) {
        free(out);
        return st;
    }
    *ids = out;
    *n = count;
    return FM_OK;
}

fm_status fm_ids_check_vocab(const char *path, const int32_t *ids, int64_t n, int32_t vocab, fm_error *err) {
    fm_path_buf pb;
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= vocab)
            return fm_fail(err, FM_ERR_FORMAT, "%s: token id %d at position %lld is outside the vocabulary [0, %d)",
                           fm_path_show(&pb, path), ids[t], (long long)t, vocab);
    return FM_OK;
}
