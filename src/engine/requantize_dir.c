/* fm_requantize's output directory (see requantize_dir.h). */
#include "engine/requantize_dir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "util/file.h"
#include "util/status.h"

#define INDEX_NAME "model.safetensors.index.json"

static bool ends_with(const char *s, const char *suffix) {
    const size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A checkpoint file of ours: replaced by a new run, never copied from the input. */
static bool is_checkpoint_file(const char *name) {
    return ends_with(name, ".safetensors") || ends_with(name, ".safetensors.partial") ||
           strcmp(name, INDEX_NAME) == 0 || strcmp(name, "config.json") == 0;
}

fm_status fm_requant_prepare_dir(const fm_requant_opts *o, fm_error *err) {
    struct stat sb;
    if (stat(o->out_dir, &sb) != 0) {
        if (mkdir(o->out_dir, 0755) != 0)
            return fm_fail(err, FM_ERR_IO, "%s: cannot create the output directory: %s", o->out_dir, strerror(errno));
        return FM_OK;
    }
    if (!S_ISDIR(sb.st_mode)) return fm_fail(err, FM_ERR_USAGE, "--out %s exists and is not a directory", o->out_dir);
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(o->in_dir, a) && realpath(o->out_dir, b) && strcmp(a, b) == 0)
        return fm_fail(err, FM_ERR_USAGE, "--out %s is the input directory; write the int4 checkpoint elsewhere",
                       o->out_dir);
    DIR *d = opendir(o->out_dir);
    if (!d) return fm_fail(err, FM_ERR_IO, "%s: cannot read the directory: %s", o->out_dir, strerror(errno));
    fm_status st = FM_OK;
    const struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!o->force) {
            st = fm_fail(err, FM_ERR_USAGE,
                         "--out %s exists and is not empty (it holds '%s'); use --force to write "
                         "into it, replacing its checkpoint files",
                         o->out_dir, e->d_name);
            break;
        }
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", o->out_dir, e->d_name);
        if (is_checkpoint_file(e->d_name) && remove(path) != 0)
            st = fm_fail(err, FM_ERR_IO, "%s: cannot remove the old file: %s", path, strerror(errno));
    }
    closedir(d);
    return st;
}

static fm_status copy_file(const char *from, const char *to, fm_error *err) {
    fm_status st = fm_check_output_path(to, err); /* a FIFO there would block fopen, a device would be written */
    if (st) return st;
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    if (!in) return fm_fail(err, FM_ERR_IO, "%s: cannot open: %s", from, strerror(errno));
    if (!out) st = fm_fail(err, FM_ERR_IO, "%s: cannot create: %s", to, strerror(errno));
    char buf[1 << 16];
    size_t n;
    while (!st && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) st = fm_fail(err, FM_ERR_IO, "%s: write failed: %s", to, strerror(errno));
    if (!st && ferror(in)) st = fm_fail(err, FM_ERR_IO, "%s: read failed", from);
    fclose(in);
    if (out && fclose(out) != 0 && !st) st = fm_fail(err, FM_ERR_IO, "%s: write failed: %s", to, strerror(errno));
    return st;
}

fm_status fm_requant_copy_files(const fm_requant_opts *o, fm_error *err) {
    DIR *d = opendir(o->in_dir);
    if (!d) return fm_fail(err, FM_ERR_IO, "%s: cannot read the directory: %s", o->in_dir, strerror(errno));
    fm_status st = FM_OK;
    const struct dirent *e;
    while (!st && (e = readdir(d))) {
        char from[PATH_MAX + 256], to[PATH_MAX + 256];
        snprintf(from, sizeof from, "%s/%s", o->in_dir, e->d_name);
        struct stat sb;
        if (is_checkpoint_file(e->d_name) || stat(from, &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* dirs too */
        snprintf(to, sizeof to, "%s/%s", o->out_dir, e->d_name);
        st = copy_file(from, to, err);
    }
    closedir(d);
    return st;
}

fm_status fm_requant_write_json(const char *dir, const char *name, const cJSON *root, fm_error *err) {
    char path[PATH_MAX + 256], tmp[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    fm_status cst = fm_check_output_path(path, err); /* the rename below would replace a device or FIFO */
    if (cst) return cst;
    char *text = cJSON_Print(root);
    if (!text) return fm_fail(err, FM_ERR_NOMEM, "out of memory writing %s", path);
    FILE *f = fopen(tmp, "wb");
    fm_status st = FM_OK;
    if (!f) st = fm_fail(err, FM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    else {
        const size_t n = strlen(text);
        const bool ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
        if ((fclose(f) != 0 || !ok)) st = fm_fail(err, FM_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        if (!st && rename(tmp, path) != 0)
            st = fm_fail(err, FM_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (st) remove(tmp);
    }
    cJSON_free(text);
    return st;
}

cJSON *fm_requant_quant_config(const char *const *ignore, int32_t n_ignore) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(qc, "format", "pack-quantized");
    cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    cJSON *group = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON *w = cJSON_AddObjectToObject(group, "weights");
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "int");
    cJSON_AddBoolToObject(w, "symmetric", true);
    cJSON_AddStringToObject(w, "strategy", "group");
    cJSON_AddNumberToObject(w, "group_size", 128);
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddBoolToObject(w, "dynamic", false);
    cJSON_AddNullToObject(group, "input_activations");
    cJSON_AddNullToObject(group, "output_activations");
    const char *targets[1] = {"Linear"};
    cJSON_AddItemToObject(group, "targets", cJSON_CreateStringArray(targets, 1));
    cJSON_AddItemToObject(qc, "ignore", cJSON_CreateStringArray(ignore, n_ignore));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    return qc;
}

fm_status fm_requant_write_config(const fm_requant_opts *o, const fm_model_src *src, fm_error *err) {
    const fm_config *c = &src->cfg;
    /* the linears left in bf16: each router of the description (and lm_head) */
    char **ignore = calloc((size_t)c->n_layers * FM_SRC_N_LAYER + 1, sizeof *ignore);
    int32_t n = 0;
    fm_status st = ignore ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    const fm_arch_desc *a = fm_arch_of(c);
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; !st && i < d->n_specs; i++) {
            const fm_weight_spec *w = &d->specs[i];
            if (w->family != FM_WF_ROUTER || !fm_spec_present(w, c)) continue;
            for (int32_t j = 0; !st && j < w->n_parts; j++) {
                const fm_wsrc *r = fm_layer_src_cviews(&src->layers[l], w->parts[j].slot);
                if (!r->t) continue;
                const size_t len = strlen(r->t->name);
                if (!(ignore[n] = malloc(len + 1))) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                else snprintf(ignore[n++], len + 1, "%.*s", (int)(len - strlen(".weight")), r->t->name);
            }
        }
    }
    if (!st) ignore[n++] = strdup("lm_head");
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", o->in_dir);
    char *text = NULL;
    size_t len = 0;
    if (!st) st = fm_read_regular(path, "config.json", 16 * 1024 * 1024, &text, &len, err);
    cJSON *root = NULL;
    if (!st) st = fm_json_parse_object(text, (uint64_t)len, path, "config", &root, err);
    if (!st) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
        cJSON_AddItemToObject(root, "quantization_config", fm_requant_quant_config((const char *const *)ignore, n));
        st = fm_requant_write_json(o->out_dir, "config.json", root, err);
    }
    cJSON_Delete(root);
    free(text);
    for (int32_t i = 0; ignore && i < n; i++) free(ignore[i]);
    free(ignore);
    return st;
}
