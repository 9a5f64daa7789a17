/* Constrained decoding in the benchmarks (bench mask, bench decode --json-object): a vocabulary shaped like a real
 * one, and per sequence a json_object matcher whose masks a decode step computes, uploads and samples under, as the
 * scheduler does for a request with a response_format. */
#ifndef FM_CLI_BENCH_CONSTRAIN_H
#define FM_CLI_BENCH_CONSTRAIN_H

#include "engine/engine.h"
#include "text/grammar.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"

/* The tokenizer's byte-level vocabulary grown to n ids by synthetic tokens shaped like Qwen3's: concatenations of
 * 2-4 real tokens, CJK characters (15%), partial UTF-8 characters (3%); or its first n ids when it has more.
 * Deterministic. */
fm_status bench_vocab_grown(const fm_tokenizer *t, int32_t n, fm_token_vocab **out, fm_error *err);

typedef struct bench_constraint {
    fm_tokenizer *tok;
    fm_token_vocab *vocab;
    fm_grammar *g;
    fm_matcher **m;    /* [B] */
    uint32_t *h_mask;  /* the context's host mask rows */
    size_t words;      /* per row */
    double fill_s;     /* the last fill's wall time */
    double fill_cpu_s; /* its rows' CPU time, summed */
    int32_t B, end;
} bench_constraint;

/* A json_object matcher for each of the B sequences seq[] (their sampler slots switched to masked), over the
 * vocabulary of tokenizer_dir grown to the model's size, sharing up to shared_masks masks between them
 * (fm_token_vocab_set_mask_cache; 0: every mask computed); the end id is the last id. */
fm_status bench_constraint_begin(fm_model *m, const char *tokenizer_dir, const int32_t *seq, int32_t B,
                                 int32_t shared_masks, bench_constraint *c, fm_error *err);
/* The next step's masks filled in parallel into the host mask rows (an fm_step_masks fill: user is c); returns B. */
int32_t bench_constraint_fill(void *c);
/* The same, then uploaded to the step's mask rows at once (a step that fills its masks before its forward pass). */
void bench_constraint_masks(fm_model *m, bench_constraint *c);
/* The sampled ids accepted; a finished object starts a new one. */
fm_status bench_constraint_accept(bench_constraint *c, const int32_t *ids, fm_error *err);
void bench_constraint_end(bench_constraint *c);

#endif
