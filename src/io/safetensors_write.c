/* safetensors writer (see safetensors_write.h). */
#include "io/safetensors_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/file.h"
#include "util/status.h"

uint64_t fm_st_entry_bytes(const fm_st_entry *e) {
    uint64_t n = (uint64_t)fm_dtype_size(e->dtype);
    for (int32_t i = 0; i < e->n_dims; i++) n *= (uint64_t)e->shape[i];
    return n;
}

static int cmp_entry(const void *a, const void *b) {
    const fm_st_entry *x = a, *y = b;
    const int sx = fm_dtype_size(x->dtype), sy = fm_dtype_size(y->dtype);
    if (sx != sy) return sy - sx; /* larger elements first: every tensor then starts at a multiple of its size */
    return strcmp(x->name, y->name);
}

void fm_st_entries_sort(fm_st_entry *e, int64_t n) { qsort(e, (size_t)n, sizeof *e, cmp_entry); }

static cJSON *entry_json(const fm_st_entry *e, uint64_t begin, uint64_t end) {
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *off = cJSON_CreateArray();
    if (!o || !shape || !off) {
        cJSON_Delete(o), cJSON_Delete(shape), cJSON_Delete(off);
        return NULL;
    }
    cJSON_AddItemToObject(o, "dtype", cJSON_CreateString(fm_dtype_name(e->dtype)));
    for (int32_t i = 0; i < e->n_dims; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[i]));
    cJSON_AddItemToObject(o, "shape", shape);
    /* offsets are exact as doubles up to 2^53 bytes, which no file reaches */
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)begin));
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)end));
    cJSON_AddItemToObject(o, "data_offsets", off);
    return o;
}

fm_status fm_st_header_build(const fm_st_entry *e, int64_t n, const char *const *meta, int32_t n_meta, uint8_t **out,
                             uint64_t *out_len, fm_error *err) {
    *out = NULL, *out_len = 0;
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int32_t i = 0; ok && i < n_meta; i++) ok = m && cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]);
    }
    uint64_t off = 0;
    for (int64_t i = 0; ok && i < n; i++) {
        if (e[i].n_dims < 0 || e[i].n_dims > FM_ST_MAX_DIMS || !fm_dtype_size(e[i].dtype)) {
            cJSON_Delete(root);
            return fm_fail(err, FM_ERR_USAGE, "safetensors writer: tensor '%s' has a bad dtype or rank", e[i].name);
        }
        if (cJSON_GetObjectItemCaseSensitive(root, e[i].name)) {
            cJSON_Delete(root);
            return fm_fail(err, FM_ERR_USAGE, "safetensors writer: tensor '%s' is listed twice", e[i].name);
        }
        const uint64_t bytes = fm_st_entry_bytes(&e[i]);
        cJSON *t = entry_json(&e[i], off, off + bytes);
        ok = t != NULL;
        if (ok) cJSON_AddItemToObject(root, e[i].name, t);
        off += bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return fm_fail(err, FM_ERR_NOMEM, "out of memory building a safetensors header");
    const uint64_t len = strlen(text), padded = (len + 7) / 8 * 8; /* 8 + padded: the data starts 8-aligned */
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        cJSON_free(text);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory building a safetensors header");
    }
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(padded >> (8 * i)); /* little-endian */
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len); /* the spec allows trailing spaces, not NULs */
    cJSON_free(text);
    *out = buf, *out_len = 8 + padded;
    return FM_OK;
}

fm_status fm_st_writer_open(fm_st_writer *w, const char *path, const fm_st_entry *e, int64_t n, const char *const *meta,
                            int32_t n_meta, fm_error *err) {
    memset(w, 0, sizeof *w);
    uint8_t *head = NULL;
    uint64_t head_len = 0;
    fm_status st = fm_check_output_path(path, err); /* the final rename would replace a device or FIFO */
    if (st) return st;
    st = fm_st_header_build(e, n, meta, n_meta, &head, &head_len, err);
    if (st) return st;
    for (int64_t i = 0; i < n; i++) w->data_len += fm_st_entry_bytes(&e[i]);
    const size_t plen = strlen(path);
    w->path = malloc(plen + 1), w->tmp = malloc(plen + 16);
    if (!w->path || !w->tmp) {
        free(head);
        fm_st_writer_abort(w);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    memcpy(w->path, path, plen + 1);
    snprintf(w->tmp, plen + 16, "%s.partial", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) st = fm_fail(err, FM_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    else if (fwrite(head, 1, head_len, w->f) != head_len)
        st = fm_fail(err, FM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    free(head);
    if (st) fm_st_writer_abort(w);
    return st;
}

fm_status fm_st_writer_write(fm_st_writer *w, const void *data, uint64_t n, fm_error *err) {
    if (w->written + n > w->data_len)
        return fm_fail(err, FM_ERR_USAGE, "%s: %llu bytes written past the %llu the header declares", w->tmp,
                       (unsigned long long)(w->written + n), (unsigned long long)w->data_len);
    if (n && fwrite(data, 1, n, w->f) != n)
        return fm_fail(err, FM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    w->written += n;
    return FM_OK;
}

fm_status fm_st_writer_close(fm_st_writer *w, fm_error *err) {
    fm_status st = FM_OK;
    if (w->written != w->data_len)
        st = fm_fail(err, FM_ERR_USAGE, "%s: %llu data bytes written, the header declares %llu", w->tmp,
                     (unsigned long long)w->written, (unsigned long long)w->data_len);
    const int rc = fclose(w->f);
    w->f = NULL;
    if (!st && rc != 0) st = fm_fail(err, FM_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    if (!st && rename(w->tmp, w->path) != 0)
        st = fm_fail(err, FM_ERR_IO, "cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
    if (st) {
        fm_st_writer_abort(w);
        return st;
    }
    free(w->path), free(w->tmp);
    memset(w, 0, sizeof *w);
    return FM_OK;
}

void fm_st_writer_abort(fm_st_writer *w) {
    if (w->f) fclose(w->f);
    if (w->tmp) remove(w->tmp);
    free(w->path), free(w->tmp);
    memset(w, 0, sizeof *w);
}
