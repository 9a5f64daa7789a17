/* Binds a checkpoint's tensors to the canonical weight slots, checking every dtype and shape first. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_src.h"
#include "quant/int4_native.h"
#include "util/status.h"

typedef struct binder {
    const fm_config *cfg;
    const fm_st_set *set;
    fm_error *err;
    const fm_st_tensor **used; /* every tensor bound, with repeats */
    int64_t n_used, cap_used;
    int64_t n_params;
} binder;

const char *fm_expert_layout_name(fm_expert_layout l) {
    switch (l) {
    case FM_EXPERTS_PER_EXPERT: return "per-expert tensors";
    case FM_EXPERTS_FUSED_V5: return "fused gate_up_proj/down_proj banks (transformers v5)";
    case FM_EXPERTS_SPLIT_3D: return "3-D gate/up/down banks";
    }
    return "?";
}

fm_status fm_wsrc_read(const fm_wsrc *w, float *out, fm_error *err) {
    if (w->q.method == FM_QUANT_FP8_BLOCK) return fm_fp8_block_dequantize(&w->q, w->rows, w->cols, out, err);
    if (fm_wsrc_is_quantized(w)) {
        fm_int4_ckpt c;
        fm_status st = fm_int4_ckpt_decode(&w->q, w->rows, w->cols, &c, err);
        if (st) return st;
        fm_int4_ckpt_dequantize(&c, out);
        fm_int4_ckpt_free(&c);
        return FM_OK;
    }
    if (w->t) {
        fm_status st = fm_st_check_finite(w->t, w->offset, w->rows * w->cols, err);
        return st ? st : fm_st_read_f32(w->t, w->offset, w->rows * w->cols, out, err);
    }
    for (int64_t i = 0; i < w->rows * w->cols; i++) out[i] = fm_synth_value(&w->synth, i, w->cols);
    return FM_OK;
}

static void shape_str(char *buf, size_t n, int n_dims, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static fm_status mark_used(binder *b, const fm_st_tensor *t) {
    if (b->n_used == b->cap_used) {
        int64_t cap = b->cap_used ? 2 * b->cap_used : 256;
        const fm_st_tensor **p = realloc(b->used, (size_t)cap * sizeof *p);
        if (!p) return fm_fail(b->err, FM_ERR_NOMEM, "out of memory binding tensors");
        b->used = p, b->cap_used = cap;
    }
    b->used[b->n_used++] = t;
    return FM_OK;
}

/* Looks up name; on success checks it is a float tensor of exactly the given shape. */
static fm_status need(binder *b, const char *name, int n_dims, const int64_t *shape, const char *role,
                      const fm_st_tensor **out) {
    const fm_st_tensor *t = fm_st_find(b->set, name);
    if (!t) return fm_fail(b->err, FM_ERR_FORMAT, "tensor '%s' (%s) is missing from the checkpoint", name, role);
    if (t->dtype == FM_DTYPE_F8_E4M3)
        return fm_fail(
            b->err, FM_ERR_UNSUPPORTED,
            "tensor '%s' is F8_E4M3: pre-quantized FP8 checkpoints (with their scales) are not supported yet", name);
    if (t->dtype != FM_DTYPE_F32 && t->dtype != FM_DTYPE_F16 && t->dtype != FM_DTYPE_BF16)
        return fm_fail(b->err, FM_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; weights must be F32, F16 or BF16", name,
                       fm_dtype_name(t->dtype));
    bool same = t->n_dims == n_dims;
    for (int i = 0; same && i < n_dims; i++) same = t->shape[i] == shape[i];
    /* a depthwise conv1d weight [C, 1, K] is the matrix [C, K] */
    if (!same && n_dims == 2 && t->n_dims == 3 && t->shape[1] == 1)
        same = t->shape[0] == shape[0] && t->shape[2] == shape[1];
    if (!same) {
        char want[128], got[128];
        shape_str(want, sizeof want, n_dims, shape);
        shape_str(got, sizeof got, t->n_dims, t->shape);
        return fm_fail(b->err, FM_ERR_FORMAT, "tensor '%s' (%s): expected shape %s, found %s", name, role, want, got);
    }
    *out = t;
    return mark_used(b, t);
}

/* A whole tensor of n_dims (1: a vector [cols], viewed as one row; 2: a matrix [rows, cols]) as a view. The rank
 * comes from the slot, never from the sizes: a [1, H] router of one expert is a matrix, not a vector. */
static fm_status need_view(binder *b, fm_wsrc *w, const char *role, int n_dims, int64_t rows, int64_t cols,
                           const char *name) {
    int64_t shape[2] = {rows, cols};
    const fm_st_tensor *t = NULL;
    fm_status st = n_dims == 1 ? need(b, name, 1, &shape[1], role, &t) : need(b, name, 2, shape, role, &t);
    if (st != FM_OK) return st;
    *w = (fm_wsrc){t, 0, rows, cols, {0}, {0}};
    b->n_params += rows * cols;
    return FM_OK;
}

static fm_status need_matrix(binder *b, fm_wsrc *w, const char *role, int64_t rows, int64_t cols, const char *fmt, ...)
    FM_PRINTF(6, 7);
static fm_status need_matrix(binder *b, fm_wsrc *w, const char *role, int64_t rows, int64_t cols, const char *fmt,
                             ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return need_view(b, w, role, 2, rows, cols, name);
}

static fm_status need_vector(binder *b, fm_wsrc *w, const char *role, int64_t n, const char *fmt, ...) FM_PRINTF(5, 6);
static fm_status need_vector(binder *b, fm_wsrc *w, const char *role, int64_t n, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return need_view(b, w, role, 1, 1, n, name);
}

static const fm_st_tensor *find_in_set(const void *set, const char *name) { return fm_st_find(set, name); }

/* CT weight_shape, when present: [N, K] as I32 or I64 (the compressor's metadata and its saved tensors differ) */
static fm_status check_weight_shape(binder *b, const char *module, int64_t N, int64_t K) {
    char name[560];
    snprintf(name, sizeof name, "%s.weight_shape", module);
    const fm_st_tensor *t = fm_st_find(b->set, name);
    if (!t) return FM_OK;
    int64_t v[2] = {0, 0};
    if (t->n_dims == 1 && t->shape[0] == 2 && t->dtype == FM_DTYPE_I64) memcpy(v, t->data, 16);
    else if (t->n_dims == 1 && t->shape[0] == 2 && t->dtype == FM_DTYPE_I32) {
        int32_t v32[2];
        memcpy(v32, t->data, 8);
        v[0] = v32[0], v[1] = v32[1];
    } else return fm_fail(b->err, FM_ERR_FORMAT, "tensor '%s' must be an I32 or I64 vector of 2 elements", name);
    if (v[0] != N || v[1] != K)
        return fm_fail(b->err, FM_ERR_FORMAT, "tensor '%s' says [%lld, %lld]; the model config needs [%lld, %lld]",
                       name, (long long)v[0], (long long)v[1], (long long)N, (long long)K);
    return mark_used(b, t);
}

/* A Linear weight [rows = N, cols = K] named "<module>.weight" in a float checkpoint. In a pre-quantized one:
 * the module's packed tensors when it has them (GPTQ, AWQ), or when it is not in the ignore list
 * (compressed-tensors, which must then have them); else the float weight. */
static fm_status need_linear(binder *b, fm_wsrc *w, const char *role, int64_t rows, int64_t cols, const char *fmt, ...)
    FM_PRINTF(6, 7);
static fm_status need_linear(binder *b, fm_wsrc *w, const char *role, int64_t rows, int64_t cols, const char *fmt,
                             ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const fm_quant_config *qc = &b->cfg->quant;
    char module[512];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
    bool quantized = fm_qsrc_present(qc, module, find_in_set, b->set);
    if (qc->method == FM_QUANT_CT_PACKED) {
        bool ignored = false;
        fm_status ist = fm_quant_config_ignores(qc, module, &ignored, b->err);
        if (ist) return ist;
        if (ignored && quantized)
            return fm_fail(b->err, FM_ERR_FORMAT, "'%s' is in quantization_config.ignore but stored quantized", module);
        if (!ignored && !quantized)
            return fm_fail(b->err, FM_ERR_FORMAT,
                           "tensor '%s.weight_packed' (%s) is missing: the module is not in "
                           "quantization_config.ignore, so it must be stored quantized",
                           module, role);
    }
    if (!quantized) return need_matrix(b, w, role, rows, cols, "%s", name);
    *w = (fm_wsrc){.rows = rows, .cols = cols};
    fm_status st = fm_qsrc_bind(qc, module, rows, cols, find_in_set, b->set, &w->q, b->err);
    if (st) return st;
    const fm_st_tensor *parts[4] = {w->q.packed, w->q.zeros, w->q.scales, w->q.g_idx};
    for (int i = 0; i < 4 && !st; i++)
        if (parts[i]) st = mark_used(b, parts[i]);
    /* GPTQ's g_idx when desc_act is false: part of the module, not read */
    char gname[560];
    snprintf(gname, sizeof gname, "%s.g_idx", module);
    const fm_st_tensor *g = qc->method == FM_QUANT_GPTQ && !w->q.g_idx ? fm_st_find(b->set, gname) : NULL;
    if (!st && g) st = mark_used(b, g);
    if (!st && qc->method == FM_QUANT_CT_PACKED) st = check_weight_shape(b, module, rows, cols);
    b->n_params += rows * cols;
    return st;
}

/* Whether "<module>.weight" exists, or the module's packed weight in a pre-quantized checkpoint. */
static bool has_linear(const binder *b, const char *module) {
    char name[560];
    snprintf(name, sizeof name, "%s.weight", module);
    return fm_st_find(b->set, name) || fm_qsrc_present(&b->cfg->quant, module, find_in_set, b->set);
}

/* Views [E] of [rows, cols] into a 3-D bank [E, rows_total, cols], starting at row `row0` of each expert. */
static void bank_views(fm_wsrc *views, const fm_st_tensor *t, int64_t E, int64_t rows_total, int64_t row0, int64_t rows,
                       int64_t cols) {
    for (int64_t e = 0; e < E; e++) views[e] = (fm_wsrc){t, (e * rows_total + row0) * cols, rows, cols, {0}, {0}};
}

/* The expert parts of a layer kind, in spec order (gate, up, down), with the bank each belongs to and its first
 * row inside that bank. */
typedef struct expert_parts {
    const fm_part_spec *part[FM_SRC_N_EXPERT];
    const fm_weight_spec *bank[FM_SRC_N_EXPERT];
    int64_t row0[FM_SRC_N_EXPERT];
    int n;
} expert_parts;

static void find_expert_parts(const fm_layer_desc *d, const fm_config *c, expert_parts *x) {
    x->n = 0;
    for (int32_t i = 0; i < d->n_specs; i++) {
        const fm_weight_spec *s = &d->specs[i];
        if (s->family != FM_WF_EXPERTS || !fm_spec_present(s, c)) continue;
        int64_t row0 = 0;
        for (int32_t p = 0; p < s->n_parts && x->n < FM_SRC_N_EXPERT; p++) {
            x->part[x->n] = &s->parts[p], x->bank[x->n] = s, x->row0[x->n] = row0;
            row0 += fm_part_rows(&s->parts[p], c);
            x->n++;
        }
    }
}

/* "fused expert gate_up bank" from the bank's tensor name "gate_up_proj" */
static void fused_role(char *out, size_t n, const char *fused_name) {
    const size_t len = strlen(fused_name), cut = len > 5 && !strcmp(fused_name + len - 5, "_proj") ? len - 5 : len;
    snprintf(out, n, "fused expert %.*s bank", (int)cut, fused_name);
}

/* The experts of layer l under the MoE block prefix pre, in whichever layout the checkpoint has them. */
static fm_status bind_experts(binder *b, int l, const char *pre, const expert_parts *x, fm_layer_src *L) {
    const fm_config *c = b->cfg;
    const int64_t E = c->n_experts;
    fm_status st;
    for (int i = 0; i < x->n; i++) {
        fm_wsrc **views = &L->ew[x->part[i]->slot - FM_SRC_N_LAYER];
        if (!(*views = calloc((size_t)E, sizeof(fm_wsrc))))
            return fm_fail(b->err, FM_ERR_NOMEM, "out of memory binding layer %d experts", l);
    }
    char name[512];
    snprintf(name, sizeof name, "%s.experts.0.%s", pre, x->part[0]->name);
    if (has_linear(b, name)) {
        L->layout = FM_EXPERTS_PER_EXPERT;
        for (int64_t e = 0; e < E; e++)
            for (int i = 0; i < x->n; i++) {
                const fm_part_spec *p = x->part[i];
                if ((st = need_linear(b, &L->ew[p->slot - FM_SRC_N_LAYER][e], p->role, p->rows(c), p->cols(c),
                                      "%s.experts.%lld.%s.weight", pre, (long long)e, p->name)))
                    return st;
            }
        return FM_OK;
    }
    /* 3-D banks: the name with or without a ".weight" suffix */
    const char *suffixes[2] = {"", ".weight"};
    for (int s = 0; s < 2; s++) {
        if (x->bank[0]->fused_name)
            snprintf(name, sizeof name, "%s.experts.%s%s", pre, x->bank[0]->fused_name, suffixes[s]);
        if (x->bank[0]->fused_name && fm_st_find(b->set, name)) {
            const fm_st_tensor *t[FM_SRC_N_EXPERT] = {NULL};
            for (int i = 0; i < x->n; i++) { /* one tensor per bank: [E, the bank's rows, cols] */
                const fm_weight_spec *w = x->bank[i];
                if (i > 0 && w == x->bank[i - 1]) {
                    t[i] = t[i - 1];
                    continue;
                }
                int64_t shape[3] = {E, fm_spec_rows(w, c), fm_spec_cols(w, c)};
                char tname[512], role[96];
                snprintf(tname, sizeof tname, "%s.experts.%s%s", pre, w->fused_name, suffixes[s]);
                fused_role(role, sizeof role, w->fused_name);
                if ((st = need(b, tname, 3, shape, role, &t[i]))) return st;
            }
            L->layout = FM_EXPERTS_FUSED_V5;
            /* the parts' rows of each expert in turn (concatenated, not interleaved) */
            for (int i = 0; i < x->n; i++) {
                const fm_part_spec *p = x->part[i];
                bank_views(L->ew[p->slot - FM_SRC_N_LAYER], t[i], E, fm_spec_rows(x->bank[i], c), x->row0[i],
                           p->rows(c), p->cols(c));
                b->n_params += E * p->rows(c) * p->cols(c);
            }
            return FM_OK;
        }
        snprintf(name, sizeof name, "%s.experts.%s%s", pre, x->part[0]->name, suffixes[s]);
        if (fm_st_find(b->set, name)) {
            const fm_st_tensor *t[FM_SRC_N_EXPERT] = {NULL};
            for (int i = 0; i < x->n; i++) {
                const fm_part_spec *p = x->part[i];
                int64_t shape[3] = {E, p->rows(c), p->cols(c)};
                char tname[512], role[96];
                snprintf(tname, sizeof tname, "%s.experts.%s%s", pre, p->name, suffixes[s]);
                snprintf(role, sizeof role, "%s bank", p->role);
                if ((st = need(b, tname, 3, shape, role, &t[i]))) return st;
            }
            L->layout = FM_EXPERTS_SPLIT_3D;
            for (int i = 0; i < x->n; i++) {
                const fm_part_spec *p = x->part[i];
                bank_views(L->ew[p->slot - FM_SRC_N_LAYER], t[i], E, p->rows(c), 0, p->rows(c), p->cols(c));
                b->n_params += E * p->rows(c) * p->cols(c);
            }
            return FM_OK;
        }
    }
    return fm_fail(b->err, FM_ERR_FORMAT,
                   "layer %d: no expert weights found (looked for %s.experts.0.%s.weight, %s.experts.%s, "
                   "%s.experts.%s)",
                   l, pre, x->part[0]->name, pre, x->bank[0]->fused_name ? x->bank[0]->fused_name : "-", pre,
                   x->part[0]->name);
}

/* The MoE block prefix of layer l: the first of the description's under which the router exists (the first when
 * none has it: the router's own binding then names what is missing). */
static void find_moe_prefix(const binder *b, const fm_arch_desc *a, const fm_layer_desc *d, int l, char *pre,
                            size_t n) {
    const fm_part_spec *router = NULL;
    for (int32_t i = 0; i < d->n_specs && !router; i++)
        if (d->specs[i].family == FM_WF_ROUTER) router = &d->specs[i].parts[0];
    fm_arch_name(pre, n, a->moe_prefixes[0], l, NULL);
    for (int i = 0; router && i < FM_MAX_MOE_PREFIXES && a->moe_prefixes[i]; i++) {
        char p[256], module[512];
        fm_arch_name(p, sizeof p, a->moe_prefixes[i], l, NULL);
        fm_arch_name(module, sizeof module, router->name, l, p);
        const size_t len = strlen(module);
        if (len > 7 && !strcmp(module + len - 7, ".weight")) module[len - 7] = '\0';
        if (has_linear(b, module)) {
            snprintf(pre, n, "%s", p);
            return;
        }
    }
}

/* Every weight of layer l as its description lists it; the experts at the first expert bank. */
static fm_status bind_layer(binder *b, int l, const fm_arch_desc *a, fm_layer_src *L) {
    const fm_config *c = b->cfg;
    const fm_layer_desc *d = fm_arch_layer(a, c, l);
    expert_parts x;
    find_expert_parts(d, c, &x);
    L->kind = a->layer_kind(c, l);
    L->is_moe = x.n > 0;
    char pre[256];
    find_moe_prefix(b, a, d, l, pre, sizeof pre);
    bool experts_done = false;
    fm_status st;
    for (int32_t i = 0; i < d->n_specs; i++) {
        const fm_weight_spec *s = &d->specs[i];
        if (!fm_spec_present(s, c)) continue;
        if (s->family == FM_WF_EXPERTS) {
            if (!experts_done && (st = bind_experts(b, l, pre, &x, L))) return st;
            experts_done = true;
            continue;
        }
        for (int32_t j = 0; j < s->n_parts; j++) {
            const fm_part_spec *p = &s->parts[j];
            char name[512];
            fm_arch_name(name, sizeof name, p->name, l, pre);
            st = p->rows ? need_linear(b, &L->w[p->slot], p->role, p->rows(c), p->cols(c), "%s", name)
                         : need_view(b, &L->w[p->slot], p->role, 1, 1, p->cols(c), name);
            if (st) return st;
        }
    }
    return FM_OK;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return (x > y) - (x < y);
}

/* Whether every pre-quantized int4 projection (attention, experts, dense MLP; router and lm_head stay bf16) has our
 * own int4-g128 layout: the memory plan then counts the plan's int4 banks (a code of -8 under a tensor-core plan
 * still sends a bank to int4-zp-tc at load, which the plan cannot see without reading every code). */
static bool native_one(const fm_wsrc *w, int *n) {
    if (!fm_wsrc_is_quantized(w)) return true;
    (*n)++;
    return fm_qsrc_native_layout(&w->q, w->cols);
}

static bool all_native_layout(const fm_model_src *m) {
    const fm_config *c = &m->cfg;
    const fm_arch_desc *a = fm_arch_of(c);
    int n = 0;
    bool ok = true;
    for (int l = 0; ok && l < c->n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; ok && i < d->n_specs; i++) {
            const fm_weight_spec *s = &d->specs[i];
            if (!fm_wfamily_is_linear(s->family) || !fm_spec_present(s, c)) continue;
            const int32_t count = fm_spec_count(s, c);
            for (int32_t j = 0; ok && j < s->n_parts; j++) {
                const fm_wsrc *v = fm_layer_src_cviews(&m->layers[l], s->parts[j].slot);
                for (int32_t e = 0; ok && e < count; e++) ok = native_one(&v[e], &n);
            }
        }
    }
    return ok && n > 0;
}

fm_status fm_model_src_bind(const fm_config *cfg, const fm_st_set *set, fm_model_src *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    out->cfg = *cfg;
    binder b = {.cfg = cfg, .set = set, .err = err};
    const fm_arch_desc *arch = fm_arch_of(cfg);
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    fm_status st = FM_OK;
    out->layers = calloc((size_t)cfg->n_layers, sizeof *out->layers);
    if (!out->layers) st = fm_fail(err, FM_ERR_NOMEM, "out of memory binding layers");
    if (!st) st = need_matrix(&b, &out->embed, "embed_tokens", V, H, "model.embed_tokens.weight");
    if (!st) st = need_vector(&b, &out->final_norm, "final norm", H, "model.norm.weight");
    if (!st) {
        if (cfg->tie_word_embeddings) {
            out->lm_head = out->embed;
            if (has_linear(&b, "lm_head")) st = need_linear(&b, &out->lm_head, "lm_head", V, H, "lm_head.weight");
        } else {
            st = need_linear(&b, &out->lm_head, "lm_head (tie_word_embeddings is false)", V, H, "lm_head.weight");
        }
    }
    for (int l = 0; !st && l < cfg->n_layers; l++) st = bind_layer(&b, l, arch, &out->layers[l]);
    if (!st) out->cfg.quant.native_layout = all_native_layout(out);
    if (!st) {
        qsort(b.used, (size_t)b.n_used, sizeof *b.used, cmp_ptr);
        int64_t distinct = 0;
        for (int64_t i = 0; i < b.n_used; i++) distinct += i == 0 || b.used[i] != b.used[i - 1];
        out->n_unused = set->n_tensors - distinct;
        out->n_params = b.n_params;
    }
    free(b.used);
    if (st) fm_model_src_free(out);
    return st;
}

void fm_model_src_free(fm_model_src *m) {
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            for (int i = 0; i < FM_SRC_N_EXPERT; i++) free(m->layers[l].ew[i]);
        }
    free(m->layers);
    memset(m, 0, sizeof *m);
}
