/* safetensors reader, one file: its header parsed and checked, the file mapped, its elements read as floats (the
 * shard index and the checkpoint directory are safetensors_dir.c). See safetensors.h for the rules enforced. Every
 * failure returns a status with one line naming the file (label) and, where there is one, the tensor; nothing stays
 * allocated or mapped. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors_shared.h"
#include "util/file.h"
#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "util/status.h"

#define SUPPORTED_DTYPES "F32 F16 BF16 F8_E4M3 I32 U8 I64"
/* Largest integer a double holds exactly; JSON numbers above it cannot be trusted to be what was written. */
#define EXACT_INT_MAX 9007199254740992.0 /* 2^53 */

static const struct {
    const char *name;
    int size;
} dtype_info[FM_DTYPE_COUNT] = {
    [FM_DTYPE_F32] = {"F32", 4},         [FM_DTYPE_F16] = {"F16", 2}, [FM_DTYPE_BF16] = {"BF16", 2},
    [FM_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [FM_DTYPE_I32] = {"I32", 4}, [FM_DTYPE_U8] = {"U8", 1},
    [FM_DTYPE_I64] = {"I64", 8},
};

/* dtypes of the safetensors format that fp8moe does not read: rejected as unsupported rather than malformed. */
static const char *const other_st_dtypes[] = {
    "BOOL",        "F4",  "F6_E2M3", "F6_E3M2", "I8",  "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ", "I16", "U16",     "U32",     "C64", "F64",     "U64",
};

const char *fm_dtype_name(fm_dtype t) {
    if ((int)t < 0 || t >= FM_DTYPE_COUNT) return "?";
    return dtype_info[t].name;
}

int fm_dtype_size(fm_dtype t) {
    if ((int)t < 0 || t >= FM_DTYPE_COUNT) return 0;
    return dtype_info[t].size;
}

/* A JSON number that is an exact non-negative integer (at most 2^53, so the double is exactly what was
 * written). Returns NULL when fine, else what is wrong. Note: cJSON keeps only the value, so 1.0 and 1e1
 * are read as the integers 1 and 10. */
static const char *json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return "is not a number";
    double d = v->valuedouble;
    if (d != d) return "is not a number";
    if (d < 0) return "is negative";
    if (d != floor(d)) return "is not an integer";
    if (d > EXACT_INT_MAX) return "is too large (above 2^53)";
    *out = (uint64_t)d;
    return NULL;
}

/* ---- one file ----------------------------------------------------------------------------------- */

typedef struct entry {
    uint64_t begin, end;
    int64_t idx;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static void free_tensors(fm_st_tensor *t, int64_t n) {
    if (!t) return;
    for (int64_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static fm_status parse_dtype(const char *label, const char *name, const char *s, fm_dtype *out, fm_error *err) {
    quoted ql, qn, qs;
    for (int d = 0; d < FM_DTYPE_COUNT; d++) {
        if (strcmp(s, dtype_info[d].name) == 0) {
            *out = (fm_dtype)d;
            return FM_OK;
        }
    }
    for (size_t i = 0; i < sizeof other_st_dtypes / sizeof other_st_dtypes[0]; i++) {
        if (strcmp(s, other_st_dtypes[i]) == 0) {
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "%s: tensor '%s': unsupported dtype '%s' (supported: " SUPPORTED_DTYPES ")", q(&ql, label),
                           q(&qn, name), s);
        }
    }
    return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s' (supported: " SUPPORTED_DTYPES ")",
                   q(&ql, label), q(&qn, name), q(&qs, s));
}

/* Fills t (name already set) from the JSON entry v; data pointer and contiguity are checked later. */
static fm_status parse_entry(const char *label, const cJSON *v, uint64_t data_size, fm_st_tensor *t, uint64_t *begin,
                             uint64_t *end, fm_error *err) {
    quoted ql, qn, qk;
    const char *L = q(&ql, label), *N = q(&qn, t->name);
    if (!cJSON_IsObject(v)) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", L, N);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = v->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (c->string && strcmp(c->string, "dtype") == 0) slot = &dtype;
        else if (c->string && strcmp(c->string, "shape") == 0) slot = &shape;
        else if (c->string && strcmp(c->string, "data_offsets") == 0) slot = &offs;
        else
            return fm_fail(err, FM_ERR_FORMAT,
                           "%s: tensor '%s': unexpected key '%s' (expected dtype, shape, data_offsets)", L, N,
                           q(&qk, c->string));
        if (*slot) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': key '%s' appears twice", L, N, c->string);
        *slot = c;
    }
    if (!dtype) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", L, N);
    if (!shape) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", L, N);
    if (!offs) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", L, N);

    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", L, N);
    fm_status st = parse_dtype(label, t->name, dtype->valuestring, &t->dtype, err);
    if (st != FM_OK) return st;

    if (!cJSON_IsArray(shape)) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", L, N);
    int n_dims = cJSON_GetArraySize(shape);
    if (n_dims > FM_ST_MAX_DIMS)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: tensor '%s': shape has %d dimensions, at most %d supported", L, N,
                       n_dims, FM_ST_MAX_DIMS);
    uint64_t n_el = 1;
    int k = 0;
    for (const cJSON *d = shape->child; d; d = d->next, k++) {
        uint64_t dim = 0;
        const char *bad = json_uint(d, &dim);
        if (bad) {
            if (cJSON_IsNumber(d))
                return fm_fail(err, FM_ERR_FORMAT,
                               "%s: tensor '%s': shape[%d] = %.17g %s (expected a non-negative integer)", L, N, k,
                               d->valuedouble, bad);
            return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': shape[%d] %s (expected a non-negative integer)", L, N,
                           k, bad);
        }
        if (!fm_mul_u64(n_el, dim, &n_el) || n_el > (uint64_t)INT64_MAX)
            return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': element count overflows at shape[%d] = %llu", L, N, k,
                           (unsigned long long)dim);
        t->shape[k] = (int64_t)dim;
    }
    t->n_dims = n_dims;
    t->n_elements = (int64_t)n_el;
    uint64_t nbytes;
    if (!fm_mul_u64(n_el, (uint64_t)dtype_info[t->dtype].size, &nbytes))
        return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': byte size overflows (%llu elements of %s)", L, N,
                       (unsigned long long)n_el, dtype_info[t->dtype].name);
    t->nbytes = nbytes;

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]", L, N);
    const char *bad = json_uint(offs->child, begin);
    if (bad) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %s", L, N, bad);
    bad = json_uint(offs->child->next, end);
    if (bad) return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': data_offsets end %s", L, N, bad);
    if (*begin > *end)
        return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu is after end %llu", L, N,
                       (unsigned long long)*begin, (unsigned long long)*end);
    if (*end > data_size)
        return fm_fail(
            err, FM_ERR_FORMAT,
            "%s: tensor '%s': data_offsets [%llu, %llu] extend past the data region (%llu bytes; file truncated?)", L,
            N, (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)data_size);
    if (*end - *begin != nbytes)
        return fm_fail(
            err, FM_ERR_FORMAT,
            "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but shape x %s needs %llu (%llu elements)", L,
            N, (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)(*end - *begin),
            dtype_info[t->dtype].name, (unsigned long long)nbytes, (unsigned long long)n_el);
    return FM_OK;
}

/* The first key that appears twice in object o (cJSON keeps duplicates), or NULL. *dup_st is FM_ERR_NOMEM
 * when the check could not run. */
static const char *duplicate_key(const cJSON *o, fm_status *dup_st, fm_error *err) {
    *dup_st = FM_OK;
    size_t n = 0;
    for (const cJSON *c = o->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    const char **k = fm_malloc(n * sizeof *k, err, "JSON keys");
    if (!k) {
        *dup_st = FM_ERR_NOMEM;
        return NULL;
    }
    size_t i = 0;
    for (const cJSON *c = o->child; c; c = c->next) k[i++] = c->string;
    qsort(k, n, sizeof *k, cmp_str_ptr);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (strcmp(k[i - 1], k[i]) == 0) dup = k[i];
    free(k);
    return dup;
}

static fm_status check_metadata(const char *label, const cJSON *m, fm_error *err) {
    quoted ql, qk;
    if (!cJSON_IsObject(m))
        return fm_fail(err, FM_ERR_FORMAT, "%s: \"__metadata__\" must be an object of strings", q(&ql, label));
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return fm_fail(err, FM_ERR_FORMAT, "%s: \"__metadata__\" value of '%s' is not a string", q(&ql, label),
                           q(&qk, c->string));
    }
    fm_status st;
    const char *dup = duplicate_key(m, &st, err);
    if (st != FM_OK) return st;
    if (dup) return fm_fail(err, FM_ERR_FORMAT, "%s: \"__metadata__\" has key '%s' twice", q(&ql, label), q(&qk, dup));
    return FM_OK;
}

/* Validates the tensor list of one file (already filled) for duplicate names. */
static fm_status check_duplicates(const char *label, fm_st_tensor *t, int64_t n, fm_error *err) {
    if (n < 2) return FM_OK;
    const fm_st_tensor **p = fm_malloc((size_t)n * sizeof *p, err, "tensor name index");
    if (!p) return FM_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) p[i] = &t[i];
    qsort(p, (size_t)n, sizeof *p, cmp_tensor_ptr_name);
    fm_status st = FM_OK;
    for (int64_t i = 1; i < n; i++) {
        if (strcmp(p[i - 1]->name, p[i]->name) == 0) {
            quoted ql, qn;
            st = fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s' is defined twice in the header", q(&ql, label),
                         q(&qn, p[i]->name));
            break;
        }
    }
    free(p);
    return st;
}

static fm_status check_layout(const char *label, const fm_st_tensor *t, entry *e, int64_t n, uint64_t data_size,
                              fm_error *err) {
    quoted ql, qa, qb;
    qsort(e, (size_t)n, sizeof *e, cmp_entry);
    uint64_t prev_end = 0;
    const char *prev = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (e[i].begin != prev_end) {
            const char *N = q(&qa, t[e[i].idx].name);
            if (!prev)
                return fm_fail(err, FM_ERR_FORMAT,
                               "%s: tensor '%s': the first tensor in the data region starts at %llu, expected 0",
                               q(&ql, label), N, (unsigned long long)e[i].begin);
            if (e[i].begin > prev_end)
                return fm_fail(
                    err, FM_ERR_FORMAT,
                    "%s: tensor '%s': starts at %llu but the previous tensor '%s' ends at %llu (a gap of %llu bytes)",
                    q(&ql, label), N, (unsigned long long)e[i].begin, q(&qb, prev), (unsigned long long)prev_end,
                    (unsigned long long)(e[i].begin - prev_end));
            return fm_fail(
                err, FM_ERR_FORMAT,
                "%s: tensor '%s': starts at %llu but the previous tensor '%s' ends at %llu (overlap of %llu bytes)",
                q(&ql, label), N, (unsigned long long)e[i].begin, q(&qb, prev), (unsigned long long)prev_end,
                (unsigned long long)(prev_end - e[i].begin));
        }
        prev_end = e[i].end;
        prev = t[e[i].idx].name;
    }
    if (prev_end != data_size) {
        return fm_fail(err, FM_ERR_FORMAT,
                       "%s: the data region is %llu bytes but the tensors cover %llu (%llu trailing bytes not indexed "
                       "by any tensor)",
                       q(&ql, label), (unsigned long long)data_size, (unsigned long long)prev_end,
                       (unsigned long long)(data_size - prev_end));
    }
    return FM_OK;
}

fm_status fm_st_parse(const uint8_t *buf, uint64_t size, const char *label, fm_st_file *out, fm_error *err) {
    quoted ql;
    if (!out) return fm_fail(err, FM_ERR_USAGE, "fm_st_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!label) label = "<memory>";
    if (!buf && size) return fm_fail(err, FM_ERR_USAGE, "%s: fm_st_parse: buffer is NULL", q(&ql, label));
    if (size < 8)
        return fm_fail(err, FM_ERR_FORMAT,
                       "%s: file is %llu bytes, a safetensors file has at least 8 (the header length)", q(&ql, label),
                       (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > FM_ST_MAX_HEADER)
        return fm_fail(err, FM_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes", q(&ql, label),
                       (unsigned long long)hlen, (unsigned)FM_ST_MAX_HEADER);
    uint64_t data_start;
    if (!fm_add_u64(8, hlen, &data_start) || data_start > size)
        return fm_fail(err, FM_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%llu bytes after the 8-byte prefix)",
                       q(&ql, label), (unsigned long long)hlen, (unsigned long long)(size - 8));
    uint64_t data_size = size - data_start;

    cJSON *root = NULL;
    fm_status st = fm_json_parse_object((const char *)buf + 8, hlen, label, "header", &root, err);
    if (st != FM_OK) return st;

    int64_t n = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (meta) {
                cJSON_Delete(root);
                return fm_fail(err, FM_ERR_FORMAT, "%s: \"__metadata__\" appears twice", q(&ql, label));
            }
            meta = c;
        } else {
            n++;
        }
    }
    if (meta && (st = check_metadata(label, meta, err)) != FM_OK) {
        cJSON_Delete(root);
        return st;
    }

    fm_st_tensor *t = fm_calloc((size_t)n, sizeof *t, err, "tensor table");
    entry *e = fm_calloc((size_t)n, sizeof *e, err, "tensor offsets");
    char *path = strdup(label);
    if (!t || !e || !path) {
        free(t);
        free(e);
        free(path);
        cJSON_Delete(root);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of memory for %lld tensors", q(&ql, label), (long long)n);
    }
    int64_t k = 0;
    for (const cJSON *c = root->child; c && st == FM_OK; c = c->next) {
        if (c == meta) continue;
        t[k].name = strdup(c->string);
        if (!t[k].name) {
            st = fm_fail(err, FM_ERR_NOMEM, "%s: out of memory for tensor names", q(&ql, label));
            break;
        }
        st = parse_entry(label, c, data_size, &t[k], &e[k].begin, &e[k].end, err);
        e[k].idx = k;
        k++;
    }
    cJSON_Delete(root);
    if (st == FM_OK) st = check_duplicates(label, t, n, err);
    if (st == FM_OK) st = check_layout(label, t, e, n, data_size, err);
    if (st != FM_OK) {
        free_tensors(t, k);
        free(e);
        free(path);
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        t[e[i].idx].data = buf + data_start + e[i].begin;
        t[e[i].idx].file = 0;
    }
    free(e);
    out->path = path;
    out->map = NULL;
    out->size = size;
    out->tensors = t;
    out->n_tensors = n;
    return FM_OK;
}

fm_status fm_st_open_file(const char *path, fm_st_file *out, fm_error *err) {
    quoted qp;
    if (!out) return fm_fail(err, FM_ERR_USAGE, "fm_st_open_file: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return fm_fail(err, FM_ERR_USAGE, "fm_st_open_file: path is NULL");
    int fd = -1;
    fm_status ost = fm_open_regular(path, "a safetensors file", &fd, NULL, err); /* a FIFO would block open() */
    if (ost) return ost;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fm_fail(err, FM_ERR_IO, "%s: cannot stat: %s", q(&qp, path), strerror(e));
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size == 0) {
        close(fd);
        return fm_fail(err, FM_ERR_FORMAT, "%s: file is empty (0 bytes), a safetensors file has at least 8",
                       q(&qp, path));
    }
    if (size > SIZE_MAX) {
        close(fd);
        return fm_fail(err, FM_ERR_IO, "%s: file of %llu bytes cannot be mapped", q(&qp, path),
                       (unsigned long long)size);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return fm_fail(err, FM_ERR_IO, "%s: cannot mmap %llu bytes: %s", q(&qp, path), (unsigned long long)size,
                       strerror(e));
    fm_status st = fm_st_parse(m, size, path, out, err);
    if (st != FM_OK) {
        munmap(m, (size_t)size);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->map = m;
    return FM_OK;
}

void fm_st_close_file(fm_st_file *f) {
    if (!f) return;
    free_tensors(f->tensors, f->n_tensors);
    if (f->map) munmap(f->map, (size_t)f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- element access ----------------------------------------------------------------------------- */

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

fm_status fm_st_read_f32(const fm_st_tensor *t, int64_t first, int64_t n, float *out, fm_error *err) {
    quoted qn;
    if (!t) return fm_fail(err, FM_ERR_USAGE, "fm_st_read_f32: tensor is NULL");
    if (first < 0 || n < 0 || first > t->n_elements || n > t->n_elements - first)
        return fm_fail(err, FM_ERR_USAGE,
                       "tensor '%s': read of %lld elements from element %lld is outside its %lld elements",
                       q(&qn, t->name), (long long)n, (long long)first, (long long)t->n_elements);
    if (t->dtype != FM_DTYPE_F32 && t->dtype != FM_DTYPE_F16 && t->dtype != FM_DTYPE_BF16 &&
        t->dtype != FM_DTYPE_F8_E4M3)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "tensor '%s': dtype %s is not a float type (fm_st_read_f32 reads F32 F16 BF16 F8_E4M3)",
                       q(&qn, t->name), fm_dtype_name(t->dtype));
    if (n == 0) return FM_OK;
    if (!out) return fm_fail(err, FM_ERR_USAGE, "tensor '%s': fm_st_read_f32: out is NULL", q(&qn, t->name));
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case FM_DTYPE_F32: p += first * 4;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out, p, (size_t)n * 4);
#else
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                         (uint32_t)p[4 * i + 3] << 24;
            memcpy(&out[i], &u, 4);
        }
#endif
        return FM_OK;
    case FM_DTYPE_BF16:
        p += first * 2;
        for (int64_t i = 0; i < n; i++) out[i] = fm_bf16_to_f32(ld16(p + 2 * i));
        return FM_OK;
    case FM_DTYPE_F16:
        p += first * 2;
        for (int64_t i = 0; i < n; i++) out[i] = fm_f16_to_f32(ld16(p + 2 * i));
        return FM_OK;
    case FM_DTYPE_F8_E4M3:
        p += first;
        for (int64_t i = 0; i < n; i++) out[i] = fm_e4m3_to_f32(p[i]);
        return FM_OK;
    default: break;
    }
    return fm_fail(err, FM_ERR_UNSUPPORTED, "tensor '%s': dtype %s is not a float type", q(&qn, t->name),
                   fm_dtype_name(t->dtype));
}

/* index of the first element whose exponent bits are all ones (NaN or infinity), or -1 */
static int64_t first_nonfinite(const uint8_t *p, int64_t n, int esz, uint32_t exp_mask) {
    int64_t bad = -1;
    if (esz == 4) {
        for (int64_t i = 0; i < n && bad < 0; i += 4096) { /* blocks: a vectorised test, an early exit */
            const int64_t end = i + 4096 < n ? i + 4096 : n;
            uint32_t any = 0;
            for (int64_t j = i; j < end; j++) {
                uint32_t u;
                memcpy(&u, p + 4 * j, 4);
                any |= (u & exp_mask) == exp_mask;
            }
            for (int64_t j = i; any && j < end && bad < 0; j++) {
                uint32_t u;
                memcpy(&u, p + 4 * j, 4);
                if ((u & exp_mask) == exp_mask) bad = j;
            }
        }
    } else if (esz == 2) {
        for (int64_t i = 0; i < n && bad < 0; i += 4096) {
            const int64_t end = i + 4096 < n ? i + 4096 : n;
            uint32_t any = 0;
            for (int64_t j = i; j < end; j++) any |= ((uint32_t)ld16(p + 2 * j) & exp_mask) == exp_mask;
            for (int64_t j = i; any && j < end && bad < 0; j++)
                if (((uint32_t)ld16(p + 2 * j) & exp_mask) == exp_mask) bad = j;
        }
    } else {
        for (int64_t i = 0; i < n && bad < 0; i++)
            if ((p[i] & exp_mask) == exp_mask) bad = i;
    }
    return bad;
}

fm_status fm_st_check_finite(const fm_st_tensor *t, int64_t first, int64_t n, fm_error *err) {
    quoted qn;
    if (!t) return fm_fail(err, FM_ERR_USAGE, "fm_st_check_finite: tensor is NULL");
    if (first < 0 || n < 0 || first > t->n_elements || n > t->n_elements - first)
        return fm_fail(err, FM_ERR_USAGE,
                       "tensor '%s': check of %lld elements from element %lld is outside its %lld elements",
                       q(&qn, t->name), (long long)n, (long long)first, (long long)t->n_elements);
    uint32_t mask;
    switch (t->dtype) {
    case FM_DTYPE_F32: mask = 0x7f800000u; break;
    case FM_DTYPE_BF16: mask = 0x7f80u; break;
    case FM_DTYPE_F16: mask = 0x7c00u; break;
    case FM_DTYPE_F8_E4M3: mask = 0x7fu; break; /* e4m3fn: no infinity, S.1111.111 is NaN */
    default: return FM_OK;
    }
    const int esz = dtype_info[t->dtype].size;
    const int64_t bad = first_nonfinite(t->data + first * esz, n, esz, mask);
    if (bad < 0) return FM_OK;
    float v = 0;
    fm_st_read_f32(t, first + bad, 1, &v, NULL);
    return fm_fail(err, FM_ERR_FORMAT,
                   "tensor '%s': element %lld is %s; every weight and scale must be finite (a "
                   "corrupt checkpoint?)",
                   q(&qn, t->name), (long long)(first + bad), isnan(v) ? "NaN" : "infinite");
}
