/* When a sequence stops: an end-of-sequence id, a stop sequence of ids, or the token budget. */
#ifndef FM_ENGINE_STOP_H
#define FM_ENGINE_STOP_H

#include <stdint.h>

typedef enum fm_stop_reason {
    FM_STOP_NONE = 0, /* go on */
    FM_STOP_EOS,      /* the last id is one of the eos ids (generation_config.json / config.json) */
    FM_STOP_SEQUENCE, /* the generated ids end with one of the stop sequences */
    FM_STOP_LENGTH,   /* max_tokens ids were generated */
} fm_stop_reason;

typedef struct fm_stop {
    const int32_t *eos; /* n_eos ids */
    int32_t n_eos;
    const int32_t *const *seqs; /* n_seqs stop sequences, seq_lens[i] ids each (>= 1) */
    const int32_t *seq_lens;
    int32_t n_seqs;
    int64_t max_tokens; /* 0: no limit */
} fm_stop;

const char *fm_stop_reason_name(fm_stop_reason r); /* "eos", "stop", "length", "none" */

/* Checks the generated ids gen[0..n) after a step appended gen[n - 1]. Returns why the sequence stops, and in
 * *keep how many of the n ids are its output: an eos id and a stop sequence are not part of it (as the OpenAI
 * API returns text without its stop string); on FM_STOP_NONE and FM_STOP_LENGTH, all n. A sequence that ends at
 * the budget and on an eos id at once reports the eos. */
fm_stop_reason fm_stop_check(const fm_stop *st, const int32_t *gen, int64_t n, int64_t *keep);

#endif
