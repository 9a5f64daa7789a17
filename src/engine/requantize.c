/* fm_requantize: the tensors of a float checkpoint -> int4 compressed-tensors safetensors files (see requantize.h).
 * The output is planned first (every tensor's name, dtype and shape are known from the bound model), split into files
 * of about shard_bytes in layer order, then each file is written tensor by tensor. */
#include "engine/requantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/requantize_dir.h"
#include "io/config.h"
#include "io/safetensors_write.h"
#include "model/model_src.h"
#include "quant/bf16.h"
#include "quant/int4.h"
#include "quant/int4_p2.h"
#include "quant/int4_native.h"
#include "util/progress.h"
#include "util/status.h"

/* One unit of the output: a tensor copied as it is, or a linear written as its three compressed-tensors tensors. */
typedef struct item {
    const fm_st_tensor *copy; /* a copied tensor, or NULL */
    const fm_wsrc *w;         /* a quantized linear's float source */
    char *names[3];           /* quantized: module.weight_packed, .weight_scale, .weight_shape */
    int32_t layer;            /* -1: outside the decoder layers */
    uint64_t bytes;
    int32_t file;
    uint16_t *scales; /* quantized: the bf16 scales between writing packed and scale */
} item;

typedef struct plan {
    item *items;
    int64_t n, cap;
    int32_t n_files;
    const fm_model_src *src;
} plan;

static uint64_t packed_bytes(const fm_wsrc *w) { return (uint64_t)w->rows * (uint64_t)((w->cols + 7) / 8) * 4; }
static uint64_t scale_bytes(const fm_wsrc *w) {
    return (uint64_t)w->rows * (uint64_t)fm_int4_n_groups(w->cols, FM_NATIVE_GROUP) * 2;
}

static fm_status push(plan *p, item it, fm_error *err) {
    if (p->n == p->cap) {
        const int64_t cap = p->cap ? 2 * p->cap : 256;
        item *a = realloc(p->items, (size_t)cap * sizeof *a);
        if (!a) return fm_fail(err, FM_ERR_NOMEM, "out of memory planning the output");
        p->items = a, p->cap = cap;
    }
    p->items[p->n++] = it;
    return FM_OK;
}

/* The module name of a linear: its tensor's name without ".weight", or, for a view into a 3-D expert bank,
 * "<moe prefix>.experts.<e>.<part>" (the per-expert names compressed-tensors readers look up). */
static fm_status module_name(const fm_wsrc *w, int32_t expert, const char *part, char *out, size_t n, fm_error *err) {
    const char *name = w->t->name;
    const size_t len = strlen(name);
    if (w->t->n_dims == 2 && w->offset == 0 && len > 7 && strcmp(name + len - 7, ".weight") == 0) {
        snprintf(out, n, "%.*s", (int)(len - 7), name);
        return FM_OK;
    }
    const char *at = strstr(name, ".experts.");
    if (expert < 0 || !at)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "tensor '%s': cannot name the linear it holds for the output", name);
    snprintf(out, n, "%.*s.experts.%d.%s", (int)(at - name), name, expert, part);
    return FM_OK;
}

static fm_status add_linear(plan *p, const fm_wsrc *w, int32_t layer, int32_t expert, const char *part, fm_error *err) {
    char module[512];
    fm_status st = module_name(w, expert, part, module, sizeof module, err);
    if (st) return st;
    item it = {.w = w, .layer = layer};
    const char *suffix[3] = {"weight_packed", "weight_scale", "weight_shape"};
    for (int i = 0; i < 3; i++) {
        const size_t len = strlen(module) + strlen(suffix[i]) + 2;
        if (!(it.names[i] = malloc(len))) {
            for (int j = 0; j < i; j++) free(it.names[j]);
            return fm_fail(err, FM_ERR_NOMEM, "out of memory planning the output");
        }
        snprintf(it.names[i], len, "%s.%s", module, suffix[i]);
    }
    it.bytes = packed_bytes(w) + scale_bytes(w) + 16;
    if ((st = push(p, it, err)))
        for (int i = 0; i < 3; i++) free(it.names[i]);
    return st;
}

/* Every linear the int4 preset quantizes (the description's attention, expert and dense MLP parts; the router
 * stays bf16), in layer order; the experts expert by expert. */
static fm_status add_linears(plan *p, fm_error *err) {
    const fm_config *c = &p->src->cfg;
    const fm_arch_desc *a = fm_arch_of(c);
    fm_status st = FM_OK;
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        const fm_layer_src *L = &p->src->layers[l];
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        bool experts_done = false;
        for (int32_t i = 0; !st && i < d->n_specs; i++) {
            const fm_weight_spec *s = &d->specs[i];
            if (!fm_wfamily_is_linear(s->family) || !fm_spec_present(s, c)) continue;
            if (s->family != FM_WF_EXPERTS) {
                for (int32_t j = 0; !st && j < s->n_parts; j++)
                    st = add_linear(p, fm_layer_src_cviews(L, s->parts[j].slot), l, -1, s->parts[j].name, err);
                continue;
            }
            if (experts_done) continue;
            experts_done = true;
            for (int32_t e = 0; !st && e < c->n_experts; e++)
                for (int32_t k = i; !st && k < d->n_specs; k++) {
                    const fm_weight_spec *x = &d->specs[k];
                    if (x->family != FM_WF_EXPERTS || !fm_spec_present(x, c)) continue;
                    for (int32_t j = 0; !st && j < x->n_parts; j++)
                        st = add_linear(p, &fm_layer_src_cviews(L, x->parts[j].slot)[e], l, e, x->parts[j].name, err);
                }
        }
    }
    return st;
}

static int cmp_ptr(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return (x > y) - (x < y);
}

/* Every tensor no quantized linear reads (embeddings, norms, router, lm_head, tensors the model does not use) */
static fm_status add_copies(plan *p, const fm_st_set *set, fm_error *err) {
    const int64_t nq = p->n;
    const fm_st_tensor **used = malloc((size_t)(nq ? nq : 1) * sizeof *used);
    if (!used) return fm_fail(err, FM_ERR_NOMEM, "out of memory planning the output");
    for (int64_t i = 0; i < nq; i++) used[i] = p->items[i].w->t;
    qsort(used, (size_t)nq, sizeof *used, cmp_ptr);
    fm_status st = FM_OK;
    for (int64_t i = 0; !st && i < set->n_tensors; i++) {
        const fm_st_tensor *t = set->by_name[i];
        if (bsearch(&t, used, (size_t)nq, sizeof *used, cmp_ptr)) continue;
        int32_t layer = -1;
        if (sscanf(t->name, "model.layers.%d.", &layer) != 1) layer = -1;
        st = push(p, (item){.copy = t, .layer = layer, .bytes = t->nbytes}, err);
    }
    free(used);
    return st;
}

static const char *item_name(const item *it) { return it->copy ? it->copy->name : it->names[0]; }

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(item_name(x), item_name(y));
}

/* Files of about `limit` bytes, in layer order; a tensor larger than the limit gets a file of its own. */
static void assign_files(plan *p, uint64_t limit) {
    qsort(p->items, (size_t)p->n, sizeof *p->items, cmp_item);
    uint64_t used = 0;
    p->n_files = 1;
    for (int64_t i = 0; i < p->n; i++) {
        if (used > 0 && used + p->items[i].bytes > limit) p->n_files++, used = 0;
        p->items[i].file = p->n_files - 1;
        used += p->items[i].bytes;
    }
}

static void file_name(const plan *p, int32_t f, char *out, size_t n) {
    if (p->n_files == 1) snprintf(out, n, "model.safetensors");
    else snprintf(out, n, "model-%05d-of-%05d.safetensors", f + 1, p->n_files);
}

/* An entry of the output: item index and which of its tensors (0 packed, 1 scale, 2 shape; 0 for a copy). */
typedef struct slot {
    const char *name;
    int64_t item;
    int32_t part;
} slot;

static int cmp_slot(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)((const slot *)a)->name, y = (uintptr_t)((const slot *)b)->name;
    return (x > y) - (x < y);
}

typedef struct writer_ctx {
    plan *p;
    fm_requant_stats *stats;
    const fm_requant_opts *o;
    float *wf;       /* [rows * cols] the linear in fp32 */
    int8_t *q;       /* [rows * cols] */
    float *sf;       /* [rows * groups] */
    uint32_t *words; /* [rows * ceil(cols / 8)] */
    int64_t cap_elems, cap_groups;
    int32_t layer_done;
} writer_ctx;

static fm_status grow(writer_ctx *c, const fm_wsrc *w, fm_error *err) {
    const int64_t elems = w->rows * w->cols, groups = w->rows * fm_int4_n_groups(w->cols, FM_NATIVE_GROUP);
    if (elems > c->cap_elems) {
        free(c->wf), free(c->q), free(c->words);
        c->wf = malloc((size_t)elems * sizeof *c->wf), c->q = malloc((size_t)elems);
        c->words = malloc((size_t)(w->rows * ((w->cols + 7) / 8)) * sizeof *c->words + 4 * (size_t)w->rows);
        c->cap_elems = elems;
    }
    if (groups > c->cap_groups) {
        free(c->sf);
        c->sf = malloc((size_t)groups * sizeof *c->sf);
        c->cap_groups = groups;
    }
    if (!c->wf || !c->q || !c->words || !c->sf) {
        c->cap_elems = c->cap_groups = 0;
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for a [%lld, %lld] linear", (long long)w->rows,
                       (long long)w->cols);
    }
    return FM_OK;
}

/* Quantizes a linear as the int4 preset does at load, writes its packed codes and keeps its bf16 scales. */
static fm_status write_packed(writer_ctx *c, fm_st_writer *sw, item *it, fm_error *err) {
    const fm_wsrc *w = it->w;
    const int64_t N = w->rows, K = w->cols, KW = (K + 7) / 8, ng = fm_int4_n_groups(K, FM_NATIVE_GROUP);
    fm_status st = grow(c, w, err);
    if (!st) st = fm_wsrc_read(w, c->wf, err);
    if (st) return st;
    const fm_int4_params p4 = {FM_NATIVE_GROUP, true, FM_SCALE_BF16}; /* cpu_bank.c's parameters */
    if (c->o->p2_scales) fm_int4_p2_quantize(c->wf, N, K, c->q, c->sf);
    else fm_int4_quantize(c->wf, N, K, &p4, c->q, c->sf, NULL);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < KW; j++) {
            uint32_t word = 0; /* nibbles past K stay 0, as compressed-tensors pads */
            for (int64_t i = 0; i < 8 && 8 * j + i < K; i++)
                word |= (uint32_t)((c->q[n * K + 8 * j + i] + 8) & 15) << (4 * i);
            c->words[n * KW + j] = word; /* little-endian host, as the reader assumes */
        }
    if (!(it->scales = malloc((size_t)(N * ng) * sizeof *it->scales)))
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the scales of %s", it->names[0]);
    for (int64_t g = 0; g < N * ng; g++) it->scales[g] = fm_f32_to_bf16(c->sf[g]); /* exact: bf16 values */
    return fm_st_writer_write(sw, c->words, (uint64_t)(N * KW) * 4, err);
}

static fm_status write_slot(writer_ctx *c, fm_st_writer *sw, const slot *s, fm_error *err) {
    item *it = &c->p->items[s->item];
    if (it->copy) { /* copied as it is, so checked here: a NaN would pass into the new checkpoint */
        fm_status st = fm_st_check_finite(it->copy, 0, it->copy->n_elements, err);
        return st ? st : fm_st_writer_write(sw, it->copy->data, it->copy->nbytes, err);
    }
    if (s->part == 2) {
        const int64_t shape[2] = {it->w->rows, it->w->cols};
        return fm_st_writer_write(sw, shape, sizeof shape, err);
    }
    if (s->part == 0) {
        fm_status st = write_packed(c, sw, it, err);
        c->stats->n_quantized++;
        if (!st && c->o->progress && it->layer + 1 > c->layer_done) {
            c->layer_done = it->layer + 1;
            fm_progress("requantize: layer %d/%d, %.1f MiB written", c->layer_done, c->p->src->cfg.n_layers,
                        (double)(c->stats->bytes + sw->written) / (1 << 20));
        }
        return st;
    }
    if (!it->scales) return fm_fail(err, FM_ERR_USAGE, "%s: scales written before the packed codes", it->names[1]);
    fm_status st = fm_st_writer_write(sw, it->scales, scale_bytes(it->w), err);
    free(it->scales), it->scales = NULL;
    return st;
}

static fm_status write_file(writer_ctx *c, int32_t f, const char *path, const char *const *meta, fm_error *err) {
    plan *p = c->p;
    size_t count = 0; /* unsigned: what calloc takes */
    for (int64_t i = 0; i < p->n; i++)
        if (p->items[i].file == f) count += p->items[i].copy ? 1 : 3;
    if (count > ((size_t)1 << 40)) /* a bound the compiler can see: every size below is then an object size */
        return fm_fail(err, FM_ERR_FORMAT, "%s: %zu tensors in one file", path, count);
    const int64_t n = (int64_t)count;
    fm_st_entry *e = calloc(count, sizeof *e);
    slot *slots = calloc(count, sizeof *slots);
    if (!e || !slots) {
        free(e), free(slots);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory planning %s", path);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < p->n; i++) {
        const item *it = &p->items[i];
        if (it->file != f) continue;
        if (it->copy) {
            e[k] = (fm_st_entry){it->copy->name, it->copy->dtype, it->copy->n_dims, {0}};
            memcpy(e[k].shape, it->copy->shape, sizeof e[k].shape);
            slots[k++] = (slot){.item = i, .part = 0};
            continue;
        }
        for (int32_t part = 0; part < 3; part++) slots[k + part] = (slot){.item = i, .part = part};
        const int64_t N = it->w->rows, K = it->w->cols;
        e[k++] = (fm_st_entry){it->names[0], FM_DTYPE_I32, 2, {N, (K + 7) / 8}};
        e[k++] = (fm_st_entry){it->names[1], FM_DTYPE_BF16, 2, {N, fm_int4_n_groups(K, FM_NATIVE_GROUP)}};
        e[k++] = (fm_st_entry){it->names[2], FM_DTYPE_I64, 1, {2}};
    }
    /* the reference writer's order (larger elements first, then by name) keeps every tensor aligned; packed codes
       (4 bytes) come before their bf16 scales (2). Each entry finds its item again through its name's pointer. */
    for (int64_t j = 0; j < n; j++) slots[j].name = e[j].name;
    qsort(slots, (size_t)n, sizeof *slots, cmp_slot);
    fm_st_entries_sort(e, n);
    slot *order = calloc(count, sizeof *order);
    if (!order) {
        free(e), free(slots);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory planning %s", path);
    }
    for (int64_t j = 0; j < n; j++) {
        const slot key = {.name = e[j].name};
        order[j] = *(const slot *)bsearch(&key, slots, (size_t)n, sizeof *slots, cmp_slot);
    }
    free(slots);
    slots = order;
    fm_st_writer sw;
    fm_status st = fm_st_writer_open(&sw, path, e, n, meta, 4, err);
    for (int64_t j = 0; !st && j < n; j++) st = write_slot(c, &sw, &slots[j], err);
    const uint64_t bytes = sw.written;
    if (!st) st = fm_st_writer_close(&sw, err);
    else fm_st_writer_abort(&sw);
    if (!st) c->stats->bytes += bytes, c->stats->n_files++;
    free(e), free(slots);
    return st;
}

static void plan_free(plan *p) {
    for (int64_t i = 0; i < p->n; i++) {
        for (int j = 0; j < 3; j++) free(p->items[i].names[j]);
        free(p->items[i].scales);
    }
    free(p->items);
}

/* model.safetensors.index.json of a sharded output */
static fm_status write_index(const plan *p, const char *out_dir, uint64_t total, fm_error *err) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata"),
          *map = cJSON_AddObjectToObject(root, "weight_map");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    char file[64];
    for (int64_t i = 0; i < p->n; i++) {
        const item *it = &p->items[i];
        file_name(p, it->file, file, sizeof file);
        for (int32_t part = 0; part < (it->copy ? 1 : 3); part++)
            cJSON_AddStringToObject(map, it->copy ? it->copy->name : it->names[part], file);
    }
    fm_status st = fm_requant_write_json(out_dir, "model.safetensors.index.json", root, err);
    cJSON_Delete(root);
    return st;
}

static fm_status write_tensors(const fm_requant_opts *o, const fm_model_src *src, const fm_st_set *set,
                               fm_requant_stats *stats, fm_error *err) {
    plan p = {.src = src};
    fm_status st = add_linears(&p, err);
    if (!st) st = add_copies(&p, set, err);
    if (st) {
        plan_free(&p);
        return st;
    }
    assign_files(&p, o->shard_bytes ? o->shard_bytes : FM_REQUANT_SHARD_BYTES);
    const char *base = strrchr(o->in_dir, '/');
    char source[256];
    snprintf(source, sizeof source, "%s", base && base[1] ? base + 1 : o->in_dir);
    const char *meta[8] = {
        "format",        "pt",   "fp8moe.quantizer", "int4 symmetric group 128, bf16 scales rounded up",
        "fp8moe.source", source, "fp8moe.version",   FP8MOE_VERSION};
    writer_ctx c = {.p = &p, .stats = stats, .o = o};
    for (int32_t f = 0; !st && f < p.n_files; f++) {
        char name[64], path[4200];
        file_name(&p, f, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", o->out_dir, name);
        st = write_file(&c, f, path, meta, err);
    }
    uint64_t tensor_bytes = 0;
    for (int64_t i = 0; i < p.n; i++) tensor_bytes += p.items[i].bytes;
    stats->n_copied = 0;
    for (int64_t i = 0; i < p.n; i++) stats->n_copied += p.items[i].copy != NULL;
    if (!st && p.n_files > 1) st = write_index(&p, o->out_dir, tensor_bytes, err);
    fm_progress_end();
    free(c.wf), free(c.q), free(c.sf), free(c.words);
    plan_free(&p);
    return st;
}

fm_status fm_requantize(const fm_requant_opts *o, fm_requant_stats *stats, fm_error *err) {
    memset(stats, 0, sizeof *stats);
    fm_config *cfg = fm_malloc(sizeof *cfg, err, "config");
    if (!cfg) return FM_ERR_NOMEM;
    fm_st_set set = {0};
    fm_model_src src = {0};
    fm_status st = fm_config_load(o->in_dir, cfg, err);
    if (!st && cfg->quant.method != FM_QUANT_NONE) {
        char d[128];
        fm_quant_config_describe(&cfg->quant, d, sizeof d);
        st = fm_fail(err, FM_ERR_UNSUPPORTED,
                     "%s is already quantized (%s); requantize reads float checkpoints (BF16, F16 or F32 weights)",
                     o->in_dir, d);
    }
    if (!st) st = fm_st_open_dir(o->in_dir, &set, err);
    if (!st) st = fm_model_src_bind(cfg, &set, &src, err);
    if (!st) st = fm_requant_prepare_dir(o, err);
    if (!st) st = write_tensors(o, &src, &set, stats, err);
    if (!st) st = fm_requant_copy_files(o, err);
    if (!st) st = fm_requant_write_config(o, &src, err);
    fm_model_src_free(&src);
    fm_st_close(&set);
    free(cfg);
    return st;
}
