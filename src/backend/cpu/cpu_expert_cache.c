/* Experts in host memory on the CPU backend: the emulation of the expert cache (backend.h, "Experts in host memory").
 * Host and "device" memory are the same here, so the host banks are ordinary banks; the pool is two banks of S
 * matrices, a miss a memcpy of one matrix of each bank (every array of a CPU bank is laid out matrix by matrix). The
 * bookkeeping is backend/expert_residency.c, run as it is. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/expert_residency.h"
#include "util/status.h"

struct fm_expert_cache {
    fm_residency res;
    fm_bank *pool_gu, *pool_dn;
    fm_bank *const *gate_up, *const *down; /* the host banks, per layer */
    int32_t *slot_ids;                     /* [max_ids] */
    int64_t max_ids;
    int32_t *copy_e, *copy_s; /* [E] */
    uint64_t bytes_copied, bytes_prefetched;
};

/* Bytes of one matrix of each array of a CPU bank (0 where the bank has no such array). */
typedef struct bank_slices {
    size_t w, scales, tscale, codes, zeros, perm;
} bank_slices;

static bank_slices slices_of(const fm_bank *b) {
    const size_t rows = (size_t)b->rows, cols = (size_t)b->cols, ng = (size_t)b->n_groups;
    bank_slices s = {0};
    if (b->w) s.w = rows * cols * sizeof(float);
    if (b->scales) s.scales = rows * ng * sizeof(float);
    if (b->tscale) s.tscale = sizeof(float);
    if (b->codes) s.codes = b->fmt == FM_W_E4M3_B128 ? rows * cols : rows * ((cols + 1) / 2);
    if (b->zeros) s.zeros = rows * ng;
    if (b->perm) s.perm = cols * sizeof(int32_t);
    return s;
}

static size_t slice_total(const bank_slices *s) { return s->w + s->scales + s->tscale + s->codes + s->zeros + s->perm; }

static bool same_layout(const fm_bank *a, const fm_bank *b) {
    const bank_slices sa = slices_of(a), sb = slices_of(b);
    return a->fmt == b->fmt && a->n == b->n && a->rows == b->rows && a->cols == b->cols && a->n_groups == b->n_groups &&
           a->group == b->group && memcmp(&sa, &sb, sizeof sa) == 0;
}

/* A bank of n matrices with like's format, shape and arrays (contents undefined until copied into). */
static fm_status pool_bank(const fm_bank *like, int32_t n, const char *what, fm_bank **out, fm_error *err) {
    const bank_slices s = slices_of(like);
    fm_bank *b = fm_calloc(1, sizeof *b, err, what);
    if (!b) return FM_ERR_NOMEM;
    *b = (fm_bank){.fmt = like->fmt,
                   .n = n,
                   .rows = like->rows,
                   .cols = like->cols,
                   .n_groups = like->n_groups,
                   .group = like->group};
    bool ok = true;
    if (s.w) ok &= (b->w = malloc(s.w * (size_t)n)) != NULL;
    if (s.scales) ok &= (b->scales = malloc(s.scales * (size_t)n)) != NULL;
    if (s.tscale) ok &= (b->tscale = malloc(s.tscale * (size_t)n)) != NULL;
    if (s.codes) ok &= (b->codes = malloc(s.codes * (size_t)n)) != NULL;
    if (s.zeros) ok &= (b->zeros = malloc(s.zeros * (size_t)n)) != NULL;
    if (s.perm) ok &= (b->perm = malloc(s.perm * (size_t)n)) != NULL;
    if (!ok) {
        cpu_bank_free(NULL, b);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the expert cache's %s pool (%d slots of %zu bytes)", what,
                       n, slice_total(&s));
    }
    *out = b;
    return FM_OK;
}

/* matrix i of src into matrix j of dst (same layout); returns the bytes copied */
static size_t copy_matrix(const fm_bank *src, int32_t i, fm_bank *dst, int32_t j) {
    const bank_slices s = slices_of(src);
#define COPY(arr, n)                                                                                                   \
    if (n) memcpy((char *)dst->arr + (size_t)j * (n), (const char *)src->arr + (size_t)i * (n), (n))
    COPY(w, s.w);
    COPY(scales, s.scales);
    COPY(tscale, s.tscale);
    COPY(codes, s.codes);
    COPY(zeros, s.zeros);
    COPY(perm, s.perm);
#undef COPY
    return slice_total(&s);
}

static void cache_free(fm_backend *be, fm_expert_cache *c) {
    if (!c) return;
    fm_residency_free(&c->res);
    cpu_bank_free(be, c->pool_gu);
    cpu_bank_free(be, c->pool_dn);
    free(c->slot_ids), free(c->copy_e), free(c->copy_s);
    free(c);
}

fm_status cpu_expert_cache_create(fm_backend *be, const fm_expert_cache_desc *d, fm_expert_cache **out,
                                  const fm_bank **pool_gate_up, const fm_bank **pool_down, void **slot_ids,
                                  fm_error *err) {
    *out = NULL;
    int32_t first = -1;
    for (int32_t l = 0; l < d->n_layers; l++) {
        if (!d->gate_up[l] != !d->down[l])
            return fm_fail(err, FM_ERR_USAGE, "expert cache: layer %d has one expert bank of two", l);
        if (!d->gate_up[l]) continue;
        if (first < 0) first = l;
        if (d->gate_up[l]->n != d->n_experts)
            return fm_fail(err, FM_ERR_USAGE, "expert cache: layer %d has %d experts, the cache %d", l,
                           d->gate_up[l]->n, d->n_experts);
        if (!same_layout(d->gate_up[l], d->gate_up[first]) || !same_layout(d->down[l], d->down[first]))
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "expert cache: layer %d's expert banks (%s) differ in format or shape from layer %d's (%s); "
                           "one pool of slots serves layers of one layout only (--experts-in device runs this model)",
                           l, fm_wformat_name(d->gate_up[l]->fmt), first, fm_wformat_name(d->gate_up[first]->fmt));
    }
    if (first < 0) return fm_fail(err, FM_ERR_USAGE, "expert cache: the model has no MoE layer");
    if (d->max_ids < 1) return fm_fail(err, FM_ERR_USAGE, "expert cache: max_ids %lld", (long long)d->max_ids);
    fm_expert_cache *c = fm_calloc(1, sizeof *c, err, "expert cache");
    if (!c) return FM_ERR_NOMEM;
    c->gate_up = d->gate_up, c->down = d->down, c->max_ids = d->max_ids;
    fm_status st = fm_residency_init(&c->res, d->n_layers, d->n_experts, d->n_slots, d->policy, err);
    if (!st) st = pool_bank(d->gate_up[first], d->n_slots, "gate_up", &c->pool_gu, err);
    if (!st) st = pool_bank(d->down[first], d->n_slots, "down", &c->pool_dn, err);
    if (!st && (!(c->slot_ids = malloc((size_t)d->max_ids * sizeof *c->slot_ids)) ||
                !(c->copy_e = malloc((size_t)d->n_experts * sizeof *c->copy_e)) ||
                !(c->copy_s = malloc((size_t)d->n_experts * sizeof *c->copy_s))))
        st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the expert cache");
    if (st) {
        cache_free(be, c);
        return st;
    }
    *out = c, *pool_gate_up = c->pool_gu, *pool_down = c->pool_dn, *slot_ids = c->slot_ids;
    return FM_OK;
}

void cpu_expert_fetch(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P) {
    (void)be;
    if (P > c->max_ids) abort(); /* the engine sizes max_ids from its largest pass */
    int32_t n = 0;
    fm_residency_fetch(&c->res, layer, (const int32_t *)ids, P, c->slot_ids, c->copy_e, c->copy_s, &n);
    for (int32_t j = 0; j < n; j++) {
        c->bytes_copied += copy_matrix(c->gate_up[layer], c->copy_e[j], c->pool_gu, c->copy_s[j]);
        c->bytes_copied += copy_matrix(c->down[layer], c->copy_e[j], c->pool_dn, c->copy_s[j]);
    }
}

void cpu_expert_prefetch(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t rows, int32_t k,
                         int32_t m) {
    (void)be;
    int32_t n = 0;
    fm_residency_prefetch(&c->res, layer, (const int32_t *)ids, rows, k, m, c->copy_e, c->copy_s, &n);
    for (int32_t j = 0; j < n; j++) {
        c->bytes_prefetched += copy_matrix(c->gate_up[layer], c->copy_e[j], c->pool_gu, c->copy_s[j]);
        c->bytes_prefetched += copy_matrix(c->down[layer], c->copy_e[j], c->pool_dn, c->copy_s[j]);
    }
}

void cpu_expert_cache_stats(fm_backend *be, const fm_expert_cache *c, fm_expert_cache_stats *out) {
    (void)be;
    *out = (fm_expert_cache_stats){c->res.fetches,     c->res.hits,       c->res.misses,
                                   c->bytes_copied,    c->res.prefetches, c->res.prefetch_copies,
                                   c->bytes_prefetched};
}

void cpu_expert_cache_free(fm_backend *be, fm_expert_cache *c) { cache_free(be, c); }
