/* Prefix caching for hybrid models (Qwen3-Next): snapshots of the Gated DeltaNet layers' recurrent and conv states.
 *
 * A Gated DeltaNet layer summarizes every token before it in a per-sequence state (kv_state.h gdn_conv, gdn_rec) that
 * cannot be rebuilt from the KV cache, so a cached KV prefix is only usable with the state after exactly those
 * tokens. Saving it at every block boundary would cost ~200x the block's KV (Qwen3-Next-80B: 75 MiB per snapshot), so,
 * as servers with hybrid caches do, snapshots are kept at a few boundaries only, in a bounded pool of slots with its
 * own LRU order:
 *   - a prompt's last block boundary, floor(n / block) * block: the same prompt again, or a longer one (the next turn
 *     before its answer was named), starts there;
 *   - the end of the cached KV prefix a prompt found without a snapshot (the point where it left another prompt, e.g.
 *     the end of a shared system prompt): the next prompt sharing it starts there;
 *   - the last block boundary a sequence crosses while decoding, in one slot the sequence owns and re-points at each
 *     boundary: the next turn of a conversation (its prompt the previous prompt and answer) starts there.
 * A snapshot is named by the KV block whose end it is at (its id and generation, kv_prefix.h), so it is usable only
 * while that block is in the table; a lookup walks a prompt's cached chain, so every block before it is there too.
 *
 * The second kind is a branch (prompts part there: every prompt sharing the prefix starts from it); the others are
 * tails, each the end of one request's prompt or answer, kept for its conversation's next turn: a later prompt that
 * begins with that request's whole prompt. When that turn starts, every tail of the request is spent, whichever the
 * turn starts from: the answer's when it carries the answer as generated, the prompt's when it does not (a client
 * that sends other ids in its place, a template that renders past answers differently). A tail another prompt starts
 * from becomes a branch (e.g. a first prompt's last boundary where a shared system prompt ends). Least recently used
 * alone would keep spent tails: a finished answer's snapshot is newer than the prompt snapshots of conversations
 * whose next turn has not started, and with concurrent conversations each new turn would evict another's
 * (tests/test_state_cache_turns.c: 8 conversations, 16 slots, answers sent back as other ids: 2.4 % of the later
 * turns' prompt tokens mapped, 64.6 % with spent tails, the most their previous prompts allow).
 * A slot goes lazily when its block left the table, else when the pool is full: a spent tail first, then the least
 * recently taken or read snapshot, then one a running sequence owns.
 *
 * Backend memory: fp32 [slots][GDN layers][conv elems + rec elems] (backend.h fm_gdn_conv_state_elems,
 * fm_gdn_rec_state_elems), planned with the generation state; taking and restoring a snapshot is one strided device
 * copy per kind of state (backend copy_rows), stream-ordered with the steps. The host bookkeeping is O(slots) per
 * operation, O(slots^2) when a prompt starts (the ended requests it may continue, each against the slots). */
#ifndef FM_ENGINE_STATE_CACHE_H
#define FM_ENGINE_STATE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv_cache.h"
#include "fp8moe.h"
#include "io/config.h"

typedef struct fm_context fm_context;

/* A request's prompt, kept while its tails may be: a later prompt that begins with all of it is its conversation's
 * next turn */
typedef struct fm_state_turn {
    uint64_t serial; /* the request (its tails' origin); 0: none */
    int64_t n;       /* prompt tokens */
    int32_t block;   /* the block that names its last full block, -1: none (shorter than a block, or not named) */
    uint32_t gen;    /* that block's generation */
    int32_t tail[FM_KV_BLOCK_TOKENS]; /* the n % block_tokens ids after it */
} fm_state_turn;

typedef struct fm_state_cache {
    int32_t n_slots;
    int32_t n_gdn;      /* Gated DeltaNet layers */
    int64_t conv_elems; /* per layer and sequence, fp32 */
    int64_t rec_elems;  /* the same */
    void *mem;          /* backend memory, fp32 [n_slots][n_gdn][conv_elems + rec_elems] */
    int32_t *block;     /* [n_slots] the KV block whose end the snapshot is at; -1: the slot is free */
    uint32_t *gen;      /* [n_slots] that block's generation when the snapshot was taken */
    int32_t *owner;     /* [n_slots] the sequence that re-points it at each boundary it decodes past, -1 */
    uint64_t *used;     /* [n_slots] the clock when last taken or read: least recently used goes first */
    uint64_t *origin;   /* [n_slots] the serial of the request that took it */
    bool *branch; /* [n_slots] taken where a prompt's cached prefix ended, or a tail another prompt started from */
    bool *spent;  /* [n_slots] a tail of a request whose conversation went on (evicted first) */
    uint64_t clock, serials;
    int32_t max_seqs;
    int32_t *seq_slot;    /* [max_seqs] the slot a sequence owns, -1 */
    int64_t *seq_anchor;  /* [max_seqs] tokens at which the sequence's prefill also takes a snapshot, 0: none */
    fm_state_turn *turn;  /* [max_seqs] each open sequence's request (its block named when it ends) */
    fm_state_turn *ended; /* [n_slots] requests ended, the oldest replaced first */
    int32_t ended_next;
    int64_t saves, restores, evictions; /* snapshots taken, restored into a sequence, given up for a new one */
} fm_state_cache;

/* Slots of a load: 0 for a model without Gated DeltaNet layers, without generation (max_seqs 0) or with the prefix
 * cache off; else fm_options.state_cache_slots, or when it is -1 (the default) 2 x max_seqs: one slot each running
 * sequence re-points while it decodes, and as many for prompt boundaries and finished conversations. */
int32_t fm_state_cache_slots(const fm_config *c, int32_t n_layers, const fm_options *opt);
/* A line on stderr when fm_options.state_cache_slots was given (>= 0) but takes no effect: a model without Gated
 * DeltaNet layers, or the prefix cache off. */
void fm_state_cache_option_note(const fm_config *c, int32_t n_layers, const fm_options *opt);
/* Bytes of one snapshot, and of the pool of `slots` (the memory plan's share). */
size_t fm_state_cache_snapshot_bytes(const fm_config *c, int32_t n_layers);
size_t fm_state_cache_bytes(const fm_config *c, int32_t n_layers, int32_t slots);

/* The pool of the context's KV state (ctx->kv must exist), on its backend. */
fm_status fm_state_cache_create(fm_context *ctx, int32_t slots, fm_state_cache **out, fm_error *err);
void fm_state_cache_free(fm_context *ctx, fm_state_cache *sc);

/* A new sequence's cached prefix of its prompt, all but the last token at most (fm_kv_prefix_share of
 * prompt[0..n_prompt - 1)); for a hybrid model only up to the last block of that prefix with a snapshot at its end,
 * which is copied into the sequence's Gated DeltaNet states (the blocks after it are given back: their tokens run
 * again). An ended request whose whole prompt begins this one: its tails are spent. Returns the tokens mapped. */
int64_t fm_state_cache_share(fm_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt);
/* A prefill chunk of T tokens of seq from position pos of its n_prompt-token prompt, shortened to end at the next
 * point where a snapshot is taken (a block boundary: the prompt's last one or where its cached prefix ended). */
int64_t fm_state_cache_chunk(const fm_context *ctx, int32_t seq, int64_t pos, int64_t n_prompt, int64_t T);
/* After a prefill chunk brought seq to pos tokens of its prompt (their blocks named): a snapshot when pos is one of
 * the chunk ends above; at the prompt's last boundary, the tail the sequence started from is spent first. */
void fm_state_cache_prefilled(fm_context *ctx, int32_t seq, int64_t pos, int64_t n_prompt);
/* After a decode step wrote seq's latest token (its blocks named): a snapshot into the sequence's own slot when the
 * sequence has just filled a block. */
void fm_state_cache_decoded(fm_context *ctx, int32_t seq);
/* seq ends: the slot it owned stays as a cached snapshot (a tail), owned by none. */
void fm_state_cache_seq_end(fm_context *ctx, int32_t seq);

/* Snapshots usable now (their block still in the table). */
int32_t fm_state_cache_live(const fm_context *ctx);
/* Every invariant of the pool: owners and their sequences agree, owners are open sequences, an owned slot is neither
 * spent nor a branch, no two usable snapshots carry the same name, a usable snapshot names a full block; false with
 * msg naming the first broken one. Tests. */
bool fm_state_cache_check(const fm_context *ctx, char *msg, size_t len);

#endif
