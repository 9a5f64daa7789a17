/* Warm-up before serving: the first request after a start should not pay the kernels' first launches (library
 * set-up, module loading, the decode steps' CUDA graph captures). fm_warmup runs, on throwaway sequences:
 *   - a prefill of `chunk` tokens from position 0 (the contiguous attention kernel, as a prompt of one chunk runs)
 *     and, when the context has room, a second chunk after it (the paged kernel, as longer prompts and cached
 *     prefixes run), each followed by the sampler;
 *   - two decode steps of every batch bucket the cache can serve (1, 2, 4, .. up to max_seqs padded): the first runs
 *     the step as it is, the second captures the bucket's CUDA graph (generate.c), exactly as serving would.
 * It leaves nothing a request can see: the warm-up's tokens are never named in the prefix cache (no cached blocks
 * come out of it), its sequences end and their blocks return to the pool, a sequence's sampler state is reset when
 * a request opens it, and it never goes through a scheduler (whose counters feed the metrics). */
#ifndef FM_ENGINE_WARMUP_H
#define FM_ENGINE_WARMUP_H

#include "engine/engine.h"

typedef struct fm_warmup_report {
    int64_t prefill_tokens; /* tokens of the prefill chunks run */
    int32_t buckets;        /* decode buckets run (and captured on cuda) */
    double seconds;
} fm_warmup_report;

/* Needs the model's KV state (loaded with max_seqs > 0); chunk is the server's prefill chunk (cut to the context). */
fm_status fm_warmup(fm_model *m, int64_t chunk, fm_warmup_report *out, fm_error *err);

#endif
