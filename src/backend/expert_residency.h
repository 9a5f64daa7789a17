/* The expert cache's residency bookkeeping (backend.h, "Experts in host memory"): which slot of the pool holds which
 * (layer, expert), and which slot a miss evicts. Host code: the CPU backend runs it as it is; a device backend runs
 * the same steps in a kernel (one block, no host synchronisation) and must make the same choices, so its counters and
 * slot ids equal this reference on the same sequence of fetches (the results never depend on the choice: a slot
 * holds the expert's bytes as they are).
 *
 * One fetch of layer l with routed ids[0..P):
 *   1. tick += 1; with the LFU policy, every FM_EXPERT_LFU_HALF_LIFE ticks all use counts are halved first.
 *   2. The distinct experts of ids, in order of first appearance: uses[l, e] += 1; a resident one is a hit and its
 *      slot's last_use becomes tick (pinned for this fetch); the others are misses, kept in that order.
 *   3. Each miss in order takes a victim among the slots not pinned (last_use != tick): the smallest key
 *        LRU  (last_use, slot)                          empty slots have last_use 0: taken first, lowest first
 *        LFU  (uses of its owner, -last_use, slot)      an empty slot counts -1 uses; among equal counts the
 *                                                       most recently used goes first: when every expert is
 *                                                       needed equally (a prefill cycling through the layers),
 *                                                       the slots outside the last layer's stay resident, where
 *                                                       the oldest-first order would evict what comes next
 *      the victim's old owner becomes a miss in the table, the slot gets (l, e), last_use = tick, and (e, slot) is
 *      a copy to make. A victim always exists: S >= E and a fetch pins at most E slots.
 *   4. slots[i] = the slot of (l, ids[i]).
 * Counters: a hit or a miss per distinct (layer, expert) of a fetch.
 *
 * One prefetch of layer l with the predicted experts of `rows` tokens, the first m of each row of k ids (the router of
 * layer l on the residual stream before the layer's token mixer, ids in order of score: the engine's expert.prefetch
 * route, m its count), made resident ahead of the layer's fetch:
 *   no tick, no use counted, no slot pinned (a prediction is not a use: counted as one, LFU would keep wrong guesses);
 *   the distinct experts of ids in order of first appearance that are not resident each take, in order, the victim
 *   of step 3's key among the slots that do not hold an expert of layer l (the ones this prefetch filled included:
 *   the layer's own slots are what its fetch is about to read); the slot gets (l, e) with last_use = the current
 *   tick, and (e, slot) is a copy to make. A victim always exists: S >= E and layer l holds at most E - 1 slots while
 *   one of its experts is missing.
 * Counters: prefetches, and the copies they made. */
#ifndef FM_BACKEND_EXPERT_RESIDENCY_H
#define FM_BACKEND_EXPERT_RESIDENCY_H

#include "backend/backend.h"

typedef struct fm_residency {
    int32_t n_layers, n_experts, n_slots;
    fm_expert_policy policy;
    int32_t *slot_of;   /* [n_layers * E]: the slot holding (layer, expert), or -1 */
    int32_t *owner;     /* [S]: layer * E + expert held by the slot, or -1 (empty) */
    uint64_t *last_use; /* [S]: the tick of the last fetch that needed the slot's expert; 0 = never */
    uint32_t *uses;     /* [n_layers * E]: fetches that needed (layer, expert), halved every half-life (LFU) */
    uint64_t *seen;     /* [E]: scratch, the tick at which a fetch last met expert e (distinct experts) */
    int32_t *miss;      /* [E]: scratch, this fetch's missing experts in order */
    uint64_t tick;
    int64_t fetches, hits, misses;
    int64_t prefetches, prefetch_copies;
} fm_residency;

/* An empty table (every slot free). FM_ERR_USAGE when S < E or a size is not positive; FM_ERR_NOMEM. */
fm_status fm_residency_init(fm_residency *r, int32_t n_layers, int32_t n_experts, int32_t n_slots,
                            fm_expert_policy policy, fm_error *err);
void fm_residency_free(fm_residency *r);

/* One fetch (the steps above): slots[0..P) out; the copies to make are (copy_expert[j], copy_slot[j]) for
 * j < *n_copies (at most E; arrays of E entries). ids must lie in [0, E). */
void fm_residency_fetch(fm_residency *r, int32_t layer, const int32_t *ids, int64_t P, int32_t *slots,
                        int32_t *copy_expert, int32_t *copy_slot, int32_t *n_copies);

/* One prefetch (above): ids [rows][k], the first m (1..k) of each row taken; the copies to make, as
 * fm_residency_fetch's. ids must lie in [0, E). */
void fm_residency_prefetch(fm_residency *r, int32_t layer, const int32_t *ids, int64_t rows, int32_t k, int32_t m,
                           int32_t *copy_expert, int32_t *copy_slot, int32_t *n_copies);

/* Bytes of a device backend's table (cuda: backend/cuda/expert_cache.cu, one allocation; the memory plan counts it
 * in the expert pool): slot_of and uses [L * E] 4 bytes each, owner [S] 4 and last_use [S] 8 bytes, the copy list
 * and the layer's slot table [E] x 3 of 4 bytes, 6 counters of 8 bytes and the copy count, each part 256-byte
 * aligned. */
static inline size_t fm_expert_device_table_bytes(int32_t n_layers, int32_t n_experts, int32_t n_slots) {
    const size_t keys = (size_t)n_layers * (size_t)n_experts, S = (size_t)n_slots, E = (size_t)n_experts;
#define FM_A256(b) (((b) + 255) / 256 * 256)
    const size_t bytes =
        FM_A256(keys * 4) * 2 + FM_A256(S * 4) + FM_A256(S * 8) + FM_A256(E * 4) * 3 + FM_A256(48) + FM_A256(4);
#undef FM_A256
    return bytes;
}

#endif
