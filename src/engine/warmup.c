/* Warm-up before serving: the first request after a start should not pay the kernels' first launches (library
 * set-up, module loading, the decode steps' CUDA graph captures). fm_context_warmup (fp8moe.h) runs, on throwaway
 * sequences:
 *   - a prefill of `chunk` tokens from position 0 (the contiguous attention kernel, as a prompt of one chunk runs)
 *     and, when the context has room, a second chunk after it (the paged kernel, as longer prompts and cached
 *     prefixes run), each followed by the sampler;
 *   - two decode steps of every batch bucket the cache can serve (1, 2, 4, .. up to max_seqs padded): the first runs
 *     the step as it is, the second captures the bucket's CUDA graph (generate.c), exactly as serving would.
 * It leaves nothing a request can see: the warm-up's tokens are never named in the prefix cache (no cached blocks
 * come out of it), its sequences end and their blocks return to the pool, a sequence's sampler state is reset when
 * a request opens it, and it never goes through a scheduler (whose counters feed the metrics). */
#include "engine/engine.h"

#include <stdlib.h>
#include <time.h>

#include "engine/kv_state.h"
#include "engine/sampler.h"
#include "util/status.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ids spread over the vocabulary (any id is a valid prompt: the values do not matter, the shapes do) */
static int32_t warm_id(int64_t t, int32_t vocab) { return (int32_t)((t * 7919 + 11) % vocab); }

/* T tokens of seq from position p0, as the scheduler runs a prefill chunk, then its sampler on the last row */
static fm_status prefill(fm_context *ctx, int32_t seq, int64_t p0, int64_t T, const int32_t *ids, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    int32_t *h_seq = malloc((size_t)T * sizeof *h_seq), *h_pos = malloc((size_t)T * sizeof *h_pos);
    fm_status st = h_seq && h_pos ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory for the warm-up");
    for (int64_t t = 0; !st && t < T; t++) h_seq[t] = seq, h_pos[t] = (int32_t)(p0 + t);
    if (!st) st = fm_kv_reserve(ctx, seq, T, err);
    if (!st) st = fm_step_stage(ctx, ids + p0, h_seq, h_pos, T, err);
    if (!st) {
        fm_step_device(ctx, T, true, p0 == 0 ? FM_ATTN_FRESH : FM_ATTN_PAGED);
        fm_backend *be = m->be;
        int32_t id;
        be->ops->upload_ids(be, &seq, 1, kv->row_slot);
        fm_step_sample_device(ctx, 1);
        be->ops->download_raw(be, kv->ids_out, sizeof id, &id);
        st = be->ops->sync(be, err);
    }
    free(h_seq), free(h_pos);
    return st;
}

/* n throwaway sequences of one token each, then two decode steps of all n */
static fm_status decode_bucket(fm_context *ctx, int32_t n, int32_t *seqs, int32_t *ids, int32_t *out, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_sampling sp;
    fm_sampling_init(&sp);
    const int32_t vocab = m->cfg.vocab_size;
    int32_t open = 0;
    fm_status st = FM_OK;
    for (; !st && open < n; open++) {
        ids[open] = warm_id(open, vocab);
        st = fm_kv_seq_begin(ctx, &ids[open], 1, &sp, &seqs[open], err);
        if (st) break;
    }
    for (int step = 0; !st && step < 2; step++) {
        float *logprobs = malloc((size_t)n * sizeof *logprobs);
        st = logprobs ? fm_decode_step(ctx, n, ids, seqs, out, logprobs, err)
                      : fm_fail(err, FM_ERR_NOMEM, "out of memory for the warm-up");
        free(logprobs);
        for (int32_t j = 0; !st && j < n; j++) ids[j] = out[j];
    }
    for (int32_t j = 0; j < open; j++) fm_kv_seq_end(ctx, seqs[j]);
    return st;
}

fm_status fm_context_warmup(fm_context *ctx, int64_t chunk, fm_warmup_report *out, fm_error *err) {
    const fm_model *m = ctx->m;
    *out = (fm_warmup_report){0};
    fm_kv_state *kv = ctx->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "warm-up: the model was loaded without a KV cache (max_seqs 0)");
    const double t0 = now();
    const int64_t n_ctx = ctx->n_ctx; /* the context's limits (fm_context_params), at most the pool's */
    if (chunk > n_ctx) chunk = n_ctx;
    if (chunk > kv->max_rows) chunk = kv->max_rows;
    if (chunk > ctx->n_tokens) chunk = ctx->n_tokens;
    const bool second = 2 * chunk <= n_ctx; /* room for a chunk after the first: the paged prefill */
    const int64_t n_ids = second ? 2 * chunk : chunk;
    int32_t *ids = malloc((size_t)n_ids * sizeof *ids);
    if (!ids) return fm_fail(err, FM_ERR_NOMEM, "out of memory for the warm-up");
    for (int64_t t = 0; t < n_ids; t++) ids[t] = warm_id(t, m->cfg.vocab_size);
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq = -1;
    fm_status st = chunk > 0 ? fm_kv_seq_begin(ctx, ids, n_ids, &sp, &seq, err) : FM_OK;
    if (!st && chunk > 0) st = prefill(ctx, seq, 0, chunk, ids, err);
    if (!st && chunk > 0 && second) st = prefill(ctx, seq, chunk, chunk, ids, err);
    if (seq >= 0) fm_kv_seq_end(ctx, seq);
    free(ids);
    if (!st) out->prefill_tokens = seq >= 0 ? n_ids : 0;
    const int32_t max_seqs = ctx->n_seqs;
    int32_t *seqs = malloc((size_t)max_seqs * 3 * sizeof *seqs);
    if (!st && !seqs) st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the warm-up");
    for (int32_t b = 1; !st && b < 2 * max_seqs; b *= 2) { /* every bucket: the last one holds max_seqs */
        const int32_t n = b < max_seqs ? b : max_seqs;
        st = decode_bucket(ctx, n, seqs, seqs + max_seqs, seqs + 2 * max_seqs, err);
        if (!st) out->buckets++;
    }
    free(seqs);
    out->seconds = now() - t0;
    if (st) fm_error_prefix(err, "warm-up");
    return st;
}
