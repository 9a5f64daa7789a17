/* safetensors reader, a checkpoint: the shard index (model.safetensors.index.json) and the directory it describes,
 * every shard opened and checked against the weight_map, tensors found by name. See safetensors.h for the rules. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors_shared.h"
#include "util/file.h"
#include "util/status.h"

/* ---- shard index -------------------------------------------------------------------------------- */

typedef struct wm_entry {
    const char *name;
    const char *shard;
    int32_t file;
} wm_entry;

static int cmp_wm(const void *a, const void *b) {
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}

static const char *bad_shard_name(const char *s) {
    size_t n = strlen(s), sfx = strlen(SHARD_SUFFIX);
    if (strchr(s, '/')) return "contains '/' (shard names must be plain file names in the checkpoint directory)";
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return "is not a file name";
    if (n <= sfx || strcmp(s + n - sfx, SHARD_SUFFIX) != 0) return "does not end in " SHARD_SUFFIX;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return "contains a control character";
    return NULL;
}

static void free_names(char **v, int32_t n) {
    if (!v) return;
    for (int32_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* Parses and checks an index; on success *root (caller deletes), *wm (the weight_map, inside root), and the
 * sorted distinct shard names (caller frees). */
static fm_status parse_index(const char *json, uint64_t len, const char *label, cJSON **root_out, const cJSON **wm_out,
                             char ***shards_out, int32_t *n_out, fm_error *err) {
    quoted ql, qn, qs;
    cJSON *root = NULL;
    *root_out = NULL;
    *shards_out = NULL;
    *n_out = 0;
    fm_status st = fm_json_parse_object(json, len, label, "index", &root, err);
    if (st != FM_OK) return st;
    const char *L = q(&ql, label);
    const cJSON *wm = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "weight_map") == 0) {
            if (wm) {
                cJSON_Delete(root);
                return fm_fail(err, FM_ERR_FORMAT, "%s: \"weight_map\" appears twice", L);
            }
            wm = c;
        }
    }
    if (!wm) {
        cJSON_Delete(root);
        return fm_fail(err, FM_ERR_FORMAT, "%s: no \"weight_map\" object", L);
    }
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return fm_fail(err, FM_ERR_FORMAT, "%s: \"weight_map\" is not an object", L);
    }
    int64_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        /* (messages are formatted before the tree holding their strings is deleted) */
        if (!cJSON_IsString(c) || !c->valuestring) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: weight_map entry '%s' is not a string (a shard file name)", L,
                         q(&qn, c->string));
            cJSON_Delete(root);
            return st;
        }
        const char *why = bad_shard_name(c->valuestring);
        if (why) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: weight_map entry '%s': shard name '%s' %s", L, q(&qn, c->string),
                         q(&qs, c->valuestring), why);
            cJSON_Delete(root);
            return st;
        }
        n++;
    }
    if (n == 0) {
        cJSON_Delete(root);
        return fm_fail(err, FM_ERR_FORMAT, "%s: \"weight_map\" is empty", L);
    }
    if (n > INT32_MAX) {
        cJSON_Delete(root);
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: weight_map has %lld entries", L, (long long)n);
    }
    /* duplicate tensor names in the map */
    const char **names = fm_malloc((size_t)n * sizeof *names, err, "weight_map names");
    if (!names) {
        cJSON_Delete(root);
        return FM_ERR_NOMEM;
    }
    int64_t k = 0;
    for (const cJSON *c = wm->child; c; c = c->next) names[k++] = c->string;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int64_t i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: weight_map lists tensor '%s' twice", L, q(&qn, names[i]));
            break;
        }
    }
    if (st != FM_OK) {
        free(names);
        cJSON_Delete(root);
        return st;
    }
    /* distinct shard names, sorted */
    k = 0;
    for (const cJSON *c = wm->child; c; c = c->next) names[k++] = c->valuestring;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    int32_t n_sh = 0;
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i - 1], names[i]) != 0) n_sh++;
    char **sh = fm_calloc((size_t)n_sh, sizeof *sh, err, "shard names");
    if (!sh) {
        free(names);
        cJSON_Delete(root);
        return FM_ERR_NOMEM;
    }
    int32_t j = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(names[i - 1], names[i]) == 0) continue;
        sh[j] = strdup(names[i]);
        if (!sh[j]) {
            free_names(sh, j);
            free(names);
            cJSON_Delete(root);
            return fm_fail(err, FM_ERR_NOMEM, "%s: out of memory for shard names", L);
        }
        j++;
    }
    free(names);
    *root_out = root;
    *wm_out = wm;
    *shards_out = sh;
    *n_out = n_sh;
    return FM_OK;
}

fm_status fm_st_parse_index(const char *json, uint64_t len, const char *label, char ***shards, int32_t *n_shards,
                            fm_error *err) {
    if (!shards || !n_shards) return fm_fail(err, FM_ERR_USAGE, "fm_st_parse_index: output pointers are NULL");
    *shards = NULL;
    *n_shards = 0;
    if (!label) label = "<index>";
    if (!json && len) return fm_fail(err, FM_ERR_USAGE, "fm_st_parse_index: json is NULL");
    cJSON *root = NULL;
    const cJSON *wm = NULL;
    fm_status st = parse_index(json ? json : "", len, label, &root, &wm, shards, n_shards, err);
    cJSON_Delete(root);
    return st;
}

/* ---- checkpoint directory ------------------------------------------------------------------------ */

static char *join(const char *dir, const char *name, fm_error *err) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = fm_malloc(a + b + 2, err, "path");
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* Reads a whole (small) file into *data (caller frees). *exists = false (and FM_OK) when there is no such file. */
static fm_status read_small(const char *path, char **data, uint64_t *len, bool *exists, fm_error *err) {
    quoted qp;
    *data = NULL;
    *len = 0;
    *exists = false;
    int fd = -1;
    bool missing = false;
    fm_status ost = fm_open_regular(path, "a shard index (JSON)", &fd, &missing, err);
    if (ost || missing) return ost;
    *exists = true;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return fm_fail(err, FM_ERR_IO, "%s: not a readable regular file", q(&qp, path));
    }
    if ((uint64_t)sb.st_size > FM_ST_MAX_HEADER) {
        close(fd);
        return fm_fail(err, FM_ERR_FORMAT, "%s: %lld bytes, more than the limit of %u for an index", q(&qp, path),
                       (long long)sb.st_size, (unsigned)FM_ST_MAX_HEADER);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = fm_malloc(n, err, "index file");
    if (!buf) {
        close(fd);
        return FM_ERR_NOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return fm_fail(err, FM_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", q(&qp, path), got, n,
                           r < 0 ? strerror(e) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    *data = buf;
    *len = n;
    return FM_OK;
}

static int cmp_find(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const fm_st_tensor *const *)elem)->name);
}

/* Builds s->by_name from s->files and rejects a tensor name present in two files. */
static fm_status build_by_name(fm_st_set *s, const char *label, fm_error *err) {
    int64_t n = 0;
    for (int32_t i = 0; i < s->n_files; i++) n += s->files[i].n_tensors;
    s->by_name = fm_malloc((size_t)(n ? n : 1) * sizeof *s->by_name, err, "tensor index");
    if (!s->by_name) return FM_ERR_NOMEM;
    int64_t k = 0;
    for (int32_t i = 0; i < s->n_files; i++) {
        for (int64_t j = 0; j < s->files[i].n_tensors; j++) {
            s->files[i].tensors[j].file = i;
            s->by_name[k++] = &s->files[i].tensors[j];
        }
    }
    s->n_tensors = n;
    qsort(s->by_name, (size_t)n, sizeof *s->by_name, cmp_tensor_ptr_name);
    for (int64_t i = 1; i < n; i++) {
        if (strcmp(s->by_name[i - 1]->name, s->by_name[i]->name) == 0) {
            quoted ql, qn, qa, qb;
            return fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s' is in two shards: %s and %s", q(&ql, label),
                           q(&qn, s->by_name[i]->name), q(&qa, s->files[s->by_name[i - 1]->file].path),
                           q(&qb, s->files[s->by_name[i]->file].path));
        }
    }
    return FM_OK;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The weight_map and the shards' own headers must list the same tensors in the same places. */
static fm_status check_weight_map(const fm_st_set *s, const cJSON *wm, char **shards, int32_t n_shards,
                                  const char *label, fm_error *err) {
    quoted ql, qn, qa, qb;
    int64_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) n++;
    wm_entry *w = fm_malloc((size_t)n * sizeof *w, err, "weight_map table");
    if (!w) return FM_ERR_NOMEM;
    int64_t k = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char *key = c->valuestring;
        char **hit = bsearch(&key, shards, (size_t)n_shards, sizeof *shards, cmp_str_ptr);
        w[k].name = c->string;
        w[k].shard = c->valuestring;
        w[k].file = hit ? (int32_t)(hit - shards) : -1; /* always found: shards was built from this map */
        k++;
    }
    qsort(w, (size_t)n, sizeof *w, cmp_wm);
    fm_status st = FM_OK;
    int64_t i = 0, j = 0;
    const char *L = q(&ql, label);
    while (st == FM_OK && (i < n || j < s->n_tensors)) {
        int c = (i >= n) ? 1 : (j >= s->n_tensors) ? -1 : strcmp(w[i].name, s->by_name[j]->name);
        if (c < 0) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: weight_map maps tensor '%s' to shard '%s', which has no such tensor",
                         L, q(&qn, w[i].name), q(&qa, w[i].shard));
        } else if (c > 0) {
            const fm_st_tensor *t = s->by_name[j];
            st = fm_fail(err, FM_ERR_FORMAT, "%s: tensor '%s' of shard '%s' is missing from the weight_map", L,
                         q(&qn, t->name), q(&qa, base_name(s->files[t->file].path)));
        } else {
            const fm_st_tensor *t = s->by_name[j];
            if (t->file != w[i].file)
                st =
                    fm_fail(err, FM_ERR_FORMAT, "%s: weight_map maps tensor '%s' to shard '%s' but it is in shard '%s'",
                            L, q(&qn, t->name), q(&qa, w[i].shard), q(&qb, base_name(s->files[t->file].path)));
            i++;
            j++;
        }
    }
    free(w);
    return st;
}

static fm_status open_sharded(const char *dir, const char *index_path, const char *json, uint64_t len, fm_st_set *s,
                              fm_error *err) {
    quoted qi, qs;
    cJSON *root = NULL;
    const cJSON *wm = NULL;
    char **shards = NULL;
    int32_t n_shards = 0;
    fm_status st = parse_index(json, len, index_path, &root, &wm, &shards, &n_shards, err);
    if (st != FM_OK) return st;
    s->files = fm_calloc((size_t)n_shards, sizeof *s->files, err, "shard table");
    if (!s->files) st = FM_ERR_NOMEM;
    for (int32_t i = 0; st == FM_OK && i < n_shards; i++) {
        char *p = join(dir, shards[i], err);
        if (!p) {
            st = FM_ERR_NOMEM;
            break;
        }
        st = fm_st_open_file(p, &s->files[i], err);
        free(p);
        if (st != FM_OK) {
            fm_error_prefix(err, "%s: shard '%s'", q(&qi, index_path), q(&qs, shards[i]));
            break;
        }
        s->n_files = i + 1;
    }
    if (st == FM_OK) st = build_by_name(s, index_path, err);
    if (st == FM_OK) st = check_weight_map(s, wm, shards, n_shards, index_path, err);
    free_names(shards, n_shards);
    cJSON_Delete(root);
    return st;
}

fm_status fm_st_open_dir(const char *dir, fm_st_set *out, fm_error *err) {
    quoted qd;
    if (!out) return fm_fail(err, FM_ERR_USAGE, "fm_st_open_dir: out is NULL");
    memset(out, 0, sizeof *out);
    if (!dir) return fm_fail(err, FM_ERR_USAGE, "fm_st_open_dir: dir is NULL");
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return fm_fail(err, FM_ERR_IO, "%s: cannot open checkpoint directory: %s", q(&qd, dir), strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return fm_fail(err, FM_ERR_IO, "%s: not a directory (expected a checkpoint directory)", q(&qd, dir));

    fm_status st = FM_OK;
    char *index_path = join(dir, INDEX_NAME, err);
    if (!index_path) return FM_ERR_NOMEM;
    char *json = NULL;
    uint64_t len = 0;
    bool exists = false;
    st = read_small(index_path, &json, &len, &exists, err);
    if (st != FM_OK) {
        free(index_path);
        return st;
    }
    if (exists) {
        st = open_sharded(dir, index_path, json, len, out, err);
        free(json);
    } else {
        char *single = join(dir, SINGLE_NAME, err);
        if (!single) {
            free(index_path);
            return FM_ERR_NOMEM;
        }
        if (access(single, F_OK) != 0 && errno == ENOENT) {
            st = fm_fail(err, FM_ERR_IO, "%s: neither " INDEX_NAME " nor " SINGLE_NAME " exists", q(&qd, dir));
        } else {
            out->files = fm_calloc(1, sizeof *out->files, err, "file table");
            if (!out->files) st = FM_ERR_NOMEM;
            if (st == FM_OK) st = fm_st_open_file(single, &out->files[0], err);
            if (st == FM_OK) {
                out->n_files = 1;
                st = build_by_name(out, single, err);
            }
        }
        free(single);
    }
    free(index_path);
    if (st != FM_OK) fm_st_close(out);
    return st;
}

const fm_st_tensor *fm_st_find(const fm_st_set *s, const char *name) {
    if (!s || !name || !s->by_name || s->n_tensors <= 0) return NULL;
    const fm_st_tensor *const *hit = bsearch(name, s->by_name, (size_t)s->n_tensors, sizeof *s->by_name, cmp_find);
    return hit ? *hit : NULL;
}

void fm_st_close(fm_st_set *s) {
    if (!s) return;
    if (s->files)
        for (int32_t i = 0; i < s->n_files; i++) fm_st_close_file(&s->files[i]);
    free(s->files);
    free(s->by_name);
    memset(s, 0, sizeof *s);
}
