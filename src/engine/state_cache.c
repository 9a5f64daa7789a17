/* Snapshots of the Gated DeltaNet states for the prefix cache of hybrid models (state_cache.h).
 *
 * Where snapshots are taken, and what they cost (Qwen3-Next-80B-A3B's shape: 36 GDN layers, one snapshot 75.4 MiB):
 *   - prefill: at most two per prompt, at its last block boundary and where its cached KV prefix ended. The chunk
 *     that would cross such a point is cut there (fm_state_cache_chunk), so a prompt may take one more step; the
 *     snapshot itself is one copy of the sequence's states, 75.4 MiB read and written, about 37 us at the H200's
 *     4.25 TB/s copy bandwidth (an estimate from the bytes).
 *   - decode: each time a sequence fills a block, its states are copied into the one slot it owns: a copy every
 *     16 tokens (4.7 MiB a token on average), while the decode step itself reads and writes the whole state at
 *     every token: 1/16 of the state traffic the layers already have.
 *   - a request that finds a snapshot: one copy into its states, instead of the prefill of those tokens.
 * Slots are few (2 x max_seqs by default), so every lookup is a scan of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "engine/state_cache.h"
#include "model/arch.h"
#include "util/status.h"

static int32_t gdn_layers(const fm_config *c, int32_t n_layers) {
    return n_layers - fm_arch_attention_layers(c, n_layers);
}

int32_t fm_state_cache_slots(const fm_config *c, int32_t n_layers, const fm_options *opt) {
    if (gdn_layers(c, n_layers) == 0 || opt->max_seqs <= 0 || !opt->prefix_cache) return 0;
    return opt->state_cache_slots >= 0 ? opt->state_cache_slots : 2 * opt->max_seqs;
}

void fm_state_cache_option_note(const fm_config *c, int32_t n_layers, const fm_options *opt) {
    if (opt->state_cache_slots < 0 || opt->max_seqs <= 0) return;
    if (gdn_layers(c, n_layers) == 0)
        fprintf(stderr,
                "fp8moe: --state-cache-slots %d has no effect: this model has no Gated DeltaNet layers (only hybrid "
                "models keep state snapshots)\n",
                opt->state_cache_slots);
    else if (!opt->prefix_cache)
        fprintf(stderr, "fp8moe: --state-cache-slots %d has no effect with the prefix cache off\n",
                opt->state_cache_slots);
}

size_t fm_state_cache_snapshot_bytes(const fm_config *c, int32_t n_layers) {
    const fm_gdn_shape g = fm_gdn_shape_of(c);
    return (size_t)gdn_layers(c, n_layers) * (size_t)(fm_gdn_conv_state_elems(g) + fm_gdn_rec_state_elems(g)) *
           sizeof(float);
}

size_t fm_state_cache_bytes(const fm_config *c, int32_t n_layers, int32_t slots) {
    return slots > 0 ? (size_t)slots * fm_state_cache_snapshot_bytes(c, n_layers) : 0;
}

void fm_state_cache_free(fm_context *ctx, fm_state_cache *sc) {
    if (!sc) return;
    if (sc->mem) ctx->m->be->ops->free(ctx->m->be, sc->mem);
    free(sc->block), free(sc->gen), free(sc->owner), free(sc->used), free(sc->origin), free(sc->branch);
    free(sc->spent), free(sc->seq_slot), free(sc->seq_anchor), free(sc->turn), free(sc->ended);
    free(sc);
}

fm_status fm_state_cache_create(fm_context *ctx, int32_t slots, fm_state_cache **out, fm_error *err) {
    const fm_model *m = ctx->m;
    *out = NULL;
    if (slots < 1)
        return fm_fail(err, FM_ERR_USAGE, "--state-cache-slots: a pool needs at least 1 slot, got %d", slots);
    if (ctx->kv->pool.block_tokens > FM_KV_BLOCK_TOKENS) /* fm_state_turn.tail holds less than a block */
        return fm_fail(err, FM_ERR_USAGE, "state snapshots: KV blocks of %d tokens, more than %d",
                       ctx->kv->pool.block_tokens, FM_KV_BLOCK_TOKENS);
    fm_state_cache *sc = calloc(1, sizeof *sc);
    if (!sc) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    const fm_gdn_shape g = fm_gdn_shape_of(&m->cfg);
    const size_t S = (size_t)slots, Q = (size_t)ctx->kv->pool.max_seqs;
    sc->n_slots = slots, sc->max_seqs = ctx->kv->pool.max_seqs;
    sc->n_gdn = gdn_layers(&m->cfg, m->n_layers);
    sc->conv_elems = fm_gdn_conv_state_elems(g), sc->rec_elems = fm_gdn_rec_state_elems(g);
    sc->block = malloc(S * sizeof *sc->block), sc->gen = calloc(S, sizeof *sc->gen);
    sc->owner = malloc(S * sizeof *sc->owner), sc->used = calloc(S, sizeof *sc->used);
    sc->origin = calloc(S, sizeof *sc->origin), sc->branch = calloc(S, sizeof *sc->branch);
    sc->spent = calloc(S, sizeof *sc->spent), sc->ended = calloc(S, sizeof *sc->ended);
    sc->seq_slot = malloc(Q * sizeof *sc->seq_slot), sc->seq_anchor = calloc(Q, sizeof *sc->seq_anchor);
    sc->turn = calloc(Q, sizeof *sc->turn);
    const size_t bytes = fm_state_cache_bytes(&m->cfg, m->n_layers, slots);
    if (!sc->block || !sc->gen || !sc->owner || !sc->used || !sc->origin || !sc->branch || !sc->spent || !sc->ended ||
        !sc->seq_slot || !sc->seq_anchor || !sc->turn) {
        fm_state_cache_free(ctx, sc);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    if (!(sc->mem = m->be->ops->alloc(m->be, bytes))) {
        fm_state_cache_free(ctx, sc);
        return fm_fail(err, FM_ERR_NOMEM, "out of %s memory for %d state snapshots (%zu bytes, --state-cache-slots)",
                       m->be->ops->name, slots, bytes);
    }
    for (size_t k = 0; k < S; k++) sc->block[k] = -1, sc->owner[k] = -1;
    for (size_t q = 0; q < Q; q++) sc->seq_slot[q] = -1;
    *out = sc;
    return FM_OK;
}

/* the name of a snapshot at the end of block i of seq: the block in the table with its tokens (a twin's copy names
 * the one in the table) and its generation; false when block i is not named or that block has left the table */
static bool name_at(const fm_kv_pool *p, int32_t seq, int64_t i, int32_t *b, uint32_t *g) {
    if (i < 0 || i >= p->n_named[seq]) return false;
    const int32_t blk = p->tables[(int64_t)seq * p->max_blocks + i], c = p->canon[blk];
    if (!p->in_table[c] || p->gen[c] != p->canon_gen[blk]) return false;
    *b = c, *g = p->canon_gen[blk];
    return true;
}

/* a slot whose snapshot is usable: its block is still the one it was taken after */
static bool live(const fm_kv_pool *p, const fm_state_cache *sc, int32_t k) {
    const int32_t b = sc->block[k];
    return b >= 0 && p->in_table[b] && p->gen[b] == sc->gen[k];
}

static int32_t find(const fm_kv_pool *p, const fm_state_cache *sc, int32_t b, uint32_t g) {
    for (int32_t k = 0; k < sc->n_slots; k++)
        if (sc->block[k] == b && sc->gen[k] == g && live(p, sc, k)) return k;
    return -1;
}

/* A slot for a new snapshot: a free one (or one whose block is gone), else the least recently used spent tail, else
 * the least recently used snapshot, else (every slot owned by a running sequence) the least recently used owned one,
 * whose owner takes another later. */
static int32_t take(const fm_kv_pool *p, fm_state_cache *sc) {
    int32_t best = -1, best_rank = 4;
    for (int32_t k = 0; k < sc->n_slots; k++) {
        const int rank = sc->owner[k] >= 0 ? 3 : !live(p, sc, k) ? 0 : sc->spent[k] ? 1 : 2;
        if (rank < best_rank || (rank == best_rank && sc->used[k] < sc->used[best])) best = k, best_rank = rank;
    }
    if (live(p, sc, best)) sc->evictions++;
    if (sc->owner[best] >= 0) sc->seq_slot[sc->owner[best]] = -1, sc->owner[best] = -1;
    sc->block[best] = -1;
    return best;
}

/* between seq's states and slot k: one strided copy per kind of state, a row per layer (the live states are
 * [layer][sequence][elems], a snapshot [layer][conv elems + rec elems]) */
static void copy_states(fm_context *ctx, int32_t seq, int32_t k, bool save) {
    const fm_model *m = ctx->m;
    const fm_kv_state *kv = ctx->kv;
    const fm_state_cache *sc = kv->snaps;
    const size_t conv = (size_t)sc->conv_elems * sizeof(float), rec = (size_t)sc->rec_elems * sizeof(float);
    const size_t S = (size_t)kv->pool.max_seqs, L = (size_t)sc->n_gdn;
    char *c = (char *)kv->gdn_conv + (size_t)seq * conv, *r = (char *)kv->gdn_rec + (size_t)seq * rec;
    char *snap = (char *)sc->mem + (size_t)k * L * (conv + rec);
    if (save) {
        m->be->ops->copy_rows(m->be, c, S * conv, snap, conv + rec, conv, L);
        m->be->ops->copy_rows(m->be, r, S * rec, snap + conv, conv + rec, rec, L);
    } else {
        m->be->ops->copy_rows(m->be, snap, conv + rec, c, S * conv, conv, L);
        m->be->ops->copy_rows(m->be, snap + conv, conv + rec, r, S * rec, rec, L);
    }
}

/* A snapshot of seq's states, which are at the end of its block i (named): into the slot seq owns when `own` (taken
 * first if it has none), else into a slot of its own, a branch when `branch`, else one of seq's tails. The same name
 * kept already (the same tokens from position 0): that one is refreshed instead (no longer spent; a branch now when
 * `branch`). */
static void save(fm_context *ctx, int32_t seq, int64_t i, bool own, bool branch) {
    const fm_kv_pool *p = &ctx->kv->pool;
    fm_state_cache *sc = ctx->kv->snaps;
    int32_t b, k;
    uint32_t g;
    if (!name_at(p, seq, i, &b, &g)) return;
    if ((k = find(p, sc, b, g)) >= 0) {
        sc->used[k] = ++sc->clock, sc->spent[k] = false;
        if (sc->owner[k] < 0) sc->branch[k] |= branch;
        return;
    }
    if (!own || (k = sc->seq_slot[seq]) < 0) k = take(p, sc);
    if (own) sc->owner[k] = seq, sc->seq_slot[seq] = k;
    copy_states(ctx, seq, k, true);
    sc->block[k] = b, sc->gen[k] = g, sc->used[k] = ++sc->clock;
    sc->origin[k] = sc->turn[seq].serial, sc->branch[k] = branch, sc->spent[k] = false;
    sc->saves++;
}

static bool active(const fm_context *ctx) { return ctx->kv->snaps && ctx->kv->pool.prefix_cache; }

/* whether the prompt of n ids, whose first `mapped` blocks seq maps, begins with ended request t's whole prompt */
static bool continues(const fm_kv_pool *p, int32_t seq, int64_t mapped, const int32_t *ids, int64_t n,
                      const fm_state_turn *t) {
    const int64_t full = t->n / p->block_tokens, rest = t->n % p->block_tokens;
    int32_t b = -1;
    uint32_t g = 0;
    if (t->serial == 0 || t->n >= n || full > mapped) return false;
    if (full > 0 && (t->block < 0 || !name_at(p, seq, full - 1, &b, &g) || b != t->block || g != t->gen)) return false;
    return !memcmp(ids + full * p->block_tokens, t->tail, (size_t)rest * sizeof *ids);
}

/* seq's prompt (n ids, `mapped` blocks of it mapped) is the next turn of the ended requests whose whole prompt begins
 * it: their tails are spent, and their entries go */
static void spend_continued(const fm_kv_pool *p, fm_state_cache *sc, int32_t seq, int64_t mapped, const int32_t *ids,
                            int64_t n) {
    for (int32_t e = 0; e < sc->n_slots; e++) {
        fm_state_turn *t = &sc->ended[e];
        if (!continues(p, seq, mapped, ids, n, t)) continue;
        for (int32_t k = 0; k < sc->n_slots; k++)
            if (sc->owner[k] < 0 && !sc->branch[k] && sc->origin[k] == t->serial && live(p, sc, k)) sc->spent[k] = true;
        t->serial = 0;
    }
}

int64_t fm_state_cache_share(fm_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt) {
    fm_kv_pool *p = &ctx->kv->pool;
    const fm_model *m = ctx->m;
    const int64_t got = fm_kv_prefix_share(p, seq, prompt, n_prompt - 1);
    fm_state_cache *sc = ctx->kv->snaps;
    if (!sc) /* a hybrid model without snapshots cannot continue a prefix (its states would be missing) */
        return gdn_layers(&m->cfg, m->n_layers) ? fm_kv_seq_truncate(p, seq, 0) : got;
    const int32_t bt = p->block_tokens;
    const int64_t i = got / bt;
    int64_t j = i;
    int32_t k = -1;
    for (; j > 0; j--) {
        int32_t b;
        uint32_t g;
        if (name_at(p, seq, j - 1, &b, &g) && (k = find(p, sc, b, g)) >= 0) break;
    }
    /* the request, for the turn after it; the ended ones it continues */
    fm_state_turn *t = &sc->turn[seq];
    const int64_t full = n_prompt / bt;
    t->serial = ++sc->serials, t->n = n_prompt, t->block = -1;
    memcpy(t->tail, prompt + full * bt, (size_t)(n_prompt - full * bt) * sizeof *prompt);
    spend_continued(p, sc, seq, i, prompt, n_prompt);
    /* the blocks past the last snapshot run again; where the cached prefix ended, the prefill takes one */
    sc->seq_anchor[seq] = j < i ? i * bt : 0;
    if (j < i) fm_kv_seq_truncate(p, seq, j * bt);
    if (j > 0) {
        copy_states(ctx, seq, k, false);
        sc->used[k] = ++sc->clock;
        sc->restores++;
        /* a tail read by a prompt other than its next turn: prompts part there; one that ends this prompt's last
           block too: this request's own tail (it takes none further) */
        if (sc->owner[k] < 0 && sc->spent[k] && j == full) sc->spent[k] = false, sc->origin[k] = t->serial;
        else if (sc->owner[k] < 0 && !sc->spent[k]) sc->branch[k] = true;
    }
    return j * bt;
}

int64_t fm_state_cache_chunk(const fm_context *ctx, int32_t seq, int64_t pos, int64_t n_prompt, int64_t T) {
    if (!active(ctx)) return T;
    const int64_t bt = ctx->kv->pool.block_tokens, anchor = ctx->kv->snaps->seq_anchor[seq], last = n_prompt / bt * bt;
    if (anchor > pos && anchor < pos + T) T = anchor - pos;
    if (last > pos && last < pos + T) T = last - pos;
    return T;
}

void fm_state_cache_prefilled(fm_context *ctx, int32_t seq, int64_t pos, int64_t n_prompt) {
    if (!active(ctx)) return;
    fm_state_cache *sc = ctx->kv->snaps;
    const int64_t bt = ctx->kv->pool.block_tokens;
    const bool anchor = pos == sc->seq_anchor[seq], last = pos == n_prompt / bt * bt;
    if (pos == 0 || pos % bt || (!anchor && !last)) return;
    save(ctx, seq, pos / bt - 1, false, anchor);
}

void fm_state_cache_decoded(fm_context *ctx, int32_t seq) {
    if (!active(ctx)) return;
    const int64_t n = fm_kv_seq_tokens(&ctx->kv->pool, seq), bt = ctx->kv->pool.block_tokens;
    if (n > 0 && n % bt == 0) save(ctx, seq, n / bt - 1, true, false);
}

void fm_state_cache_seq_end(fm_context *ctx, int32_t seq) {
    fm_state_cache *sc = ctx->kv->snaps;
    if (!sc || seq < 0 || seq >= sc->max_seqs) return;
    if (sc->seq_slot[seq] >= 0) sc->owner[sc->seq_slot[seq]] = -1;
    sc->seq_slot[seq] = -1, sc->seq_anchor[seq] = 0;
    /* its prompt, named by its last full block if that is still in the table, for its next turn to find (when the
       request left a snapshot) */
    fm_state_turn *t = &sc->turn[seq];
    const fm_kv_pool *p = &ctx->kv->pool;
    bool tails = false;
    for (int32_t k = 0; k < sc->n_slots && t->serial; k++) tails |= sc->origin[k] == t->serial && live(p, sc, k);
    if (!tails) {
        t->serial = 0;
        return;
    }
    if (t->n < p->block_tokens || !name_at(p, seq, t->n / p->block_tokens - 1, &t->block, &t->gen)) t->block = -1;
    sc->ended[sc->ended_next] = *t;
    sc->ended_next = (sc->ended_next + 1) % sc->n_slots;
    t->serial = 0;
}

int32_t fm_state_cache_live(const fm_context *ctx) {
    const fm_state_cache *sc = ctx->kv->snaps;
    int32_t n = 0;
    for (int32_t k = 0; sc && k < sc->n_slots; k++) n += live(&ctx->kv->pool, sc, k);
    return n;
}

bool fm_state_cache_check(const fm_context *ctx, char *msg, size_t len) {
    const fm_state_cache *sc = ctx->kv->snaps;
    const fm_kv_pool *p = &ctx->kv->pool;
    if (len) msg[0] = 0;
    if (!sc) return true;
    for (int32_t k = 0; k < sc->n_slots; k++) {
        const int32_t o = sc->owner[k];
        if (o >= sc->max_seqs || (o >= 0 && sc->seq_slot[o] != k))
            return fm_check_failed(msg, len, "slot %d is owned by sequence %d, which owns slot %d", k, o,
                                   o >= 0 && o < sc->max_seqs ? sc->seq_slot[o] : -1);
        if (o >= 0 && p->n_tokens[o] < 0)
            return fm_check_failed(msg, len, "slot %d is owned by closed sequence %d", k, o);
        if (o >= 0 && (sc->spent[k] || sc->branch[k]))
            return fm_check_failed(msg, len, "slot %d is owned by sequence %d but marked %s", k, o,
                                   sc->spent[k] ? "spent" : "a branch");
        if (sc->branch[k] && sc->spent[k]) return fm_check_failed(msg, len, "slot %d is a branch and spent", k);
        if (sc->used[k] > sc->clock) return fm_check_failed(msg, len, "slot %d was used after the clock", k);
        if (!live(p, sc, k)) continue;
        for (int32_t k2 = k + 1; k2 < sc->n_slots; k2++)
            if (live(p, sc, k2) && sc->block[k2] == sc->block[k])
                return fm_check_failed(msg, len, "slots %d and %d carry the same name (block %d)", k, k2, sc->block[k]);
    }
    for (int32_t q = 0; q < sc->max_seqs; q++) {
        const int32_t k = sc->seq_slot[q];
        if (k >= sc->n_slots || (k >= 0 && sc->owner[k] != q))
            return fm_check_failed(msg, len, "sequence %d owns slot %d, whose owner is %d", q, k,
                                   k >= 0 && k < sc->n_slots ? sc->owner[k] : -1);
        if (sc->seq_anchor[q] % p->block_tokens)
            return fm_check_failed(msg, len, "sequence %d's anchor %lld is not at a block boundary", q,
                                   (long long)sc->seq_anchor[q]);
    }
    return true;
}
