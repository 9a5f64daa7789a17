/* The expert cache's residency bookkeeping: the reference (expert_residency.h). */
#include "backend/expert_residency.h"

#include <stdlib.h>
#include <string.h>

#include "util/status.h"

fm_status fm_residency_init(fm_residency *r, int32_t n_layers, int32_t n_experts, int32_t n_slots,
                            fm_expert_policy policy, fm_error *err) {
    memset(r, 0, sizeof *r);
    if (n_layers < 1 || n_experts < 1)
        return fm_fail(err, FM_ERR_USAGE, "expert cache: %d layers of %d experts", n_layers, n_experts);
    if (n_slots < n_experts)
        return fm_fail(err, FM_ERR_USAGE,
                       "expert cache: %d slots are fewer than one layer's %d experts (a prefill may need them all)",
                       n_slots, n_experts);
    const size_t keys = (size_t)n_layers * (size_t)n_experts;
    r->n_layers = n_layers, r->n_experts = n_experts, r->n_slots = n_slots, r->policy = policy;
    r->slot_of = malloc(keys * sizeof *r->slot_of);
    r->uses = calloc(keys, sizeof *r->uses);
    r->owner = malloc((size_t)n_slots * sizeof *r->owner);
    r->last_use = calloc((size_t)n_slots, sizeof *r->last_use);
    r->seen = calloc((size_t)n_experts, sizeof *r->seen);
    r->miss = malloc((size_t)n_experts * sizeof *r->miss);
    if (!r->slot_of || !r->uses || !r->owner || !r->last_use || !r->seen || !r->miss) {
        fm_residency_free(r);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the expert cache's table (%d slots)", n_slots);
    }
    for (size_t i = 0; i < keys; i++) r->slot_of[i] = -1;
    for (int32_t s = 0; s < n_slots; s++) r->owner[s] = -1;
    return FM_OK;
}

void fm_residency_free(fm_residency *r) {
    free(r->slot_of), free(r->uses), free(r->owner), free(r->last_use), free(r->seen), free(r->miss);
    memset(r, 0, sizeof *r);
}

/* true when slot a is a better victim than slot b */
static bool before(const fm_residency *r, int32_t a, int32_t b) {
    if (r->policy == FM_EXPERT_LFU) {
        const int64_t ua = r->owner[a] < 0 ? -1 : (int64_t)r->uses[r->owner[a]];
        const int64_t ub = r->owner[b] < 0 ? -1 : (int64_t)r->uses[r->owner[b]];
        if (ua != ub) return ua < ub;
        if (r->last_use[a] != r->last_use[b]) return r->last_use[a] > r->last_use[b]; /* ties: most recent first */
        return a < b;
    }
    if (r->last_use[a] != r->last_use[b]) return r->last_use[a] < r->last_use[b];
    return a < b;
}

void fm_residency_fetch(fm_residency *r, int32_t layer, const int32_t *ids, int64_t P, int32_t *slots,
                        int32_t *copy_expert, int32_t *copy_slot, int32_t *n_copies) {
    const int32_t E = r->n_experts;
    int32_t *table = r->slot_of + (size_t)layer * (size_t)E;
    const int32_t key0 = layer * E;
    const uint64_t tick = ++r->tick;
    r->fetches++;
    if (r->policy == FM_EXPERT_LFU && tick % FM_EXPERT_LFU_HALF_LIFE == 0)
        for (size_t i = 0; i < (size_t)r->n_layers * (size_t)E; i++) r->uses[i] >>= 1;
    int32_t n_miss = 0;
    for (int64_t i = 0; i < P; i++) {
        const int32_t e = ids[i];
        if (r->seen[e] == tick) continue;
        r->seen[e] = tick;
        r->uses[key0 + e]++;
        if (table[e] >= 0) r->last_use[table[e]] = tick, r->hits++;
        else r->miss[n_miss++] = e;
    }
    for (int32_t j = 0; j < n_miss; j++) {
        int32_t v = -1;
        for (int32_t s = 0; s < r->n_slots; s++)
            if (r->last_use[s] != tick && (v < 0 || before(r, s, v))) v = s;
        if (r->owner[v] >= 0) r->slot_of[r->owner[v]] = -1;
        const int32_t e = r->miss[j];
        r->owner[v] = key0 + e, table[e] = v, r->last_use[v] = tick;
        copy_expert[j] = e, copy_slot[j] = v;
    }
    r->misses += n_miss;
    *n_copies = n_miss;
    for (int64_t i = 0; i < P; i++) slots[i] = table[ids[i]];
}

void fm_residency_prefetch(fm_residency *r, int32_t layer, const int32_t *ids, int64_t rows, int32_t k, int32_t m,
                           int32_t *copy_expert, int32_t *copy_slot, int32_t *n_copies) {
    const int32_t E = r->n_experts;
    int32_t *table = r->slot_of + (size_t)layer * (size_t)E;
    const int32_t key0 = layer * E;
    r->prefetches++;
    /* distinct experts: seen[] holds fetch ticks, so this pass marks with a value no tick reaches */
    const uint64_t mark = UINT64_MAX - (uint64_t)r->prefetches;
    int32_t n_miss = 0;
    for (int64_t i = 0; i < rows * m; i++) {
        const int32_t e = ids[i / m * k + i % m];
        if (r->seen[e] == mark) continue;
        r->seen[e] = mark;
        if (table[e] < 0) r->miss[n_miss++] = e;
    }
    for (int32_t j = 0; j < n_miss; j++) {
        int32_t v = -1;
        for (int32_t s = 0; s < r->n_slots; s++)
            if ((r->owner[s] < 0 || r->owner[s] / E != layer) && (v < 0 || before(r, s, v))) v = s;
        if (r->owner[v] >= 0) r->slot_of[r->owner[v]] = -1;
        const int32_t e = r->miss[j];
        r->owner[v] = key0 + e, table[e] = v, r->last_use[v] = r->tick;
        copy_expert[j] = e, copy_slot[j] = v;
    }
    r->prefetch_copies += n_miss;
    *n_copies = n_miss;
}
