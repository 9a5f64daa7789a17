/* Perplexity over consecutive windows (the protocol of models/README.md). */
#include <math.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "util/status.h"

/* -log softmax(row)[target], in double */
static double token_loss(const float *row, int32_t vocab, int32_t target) {
    double mx = row[0];
    for (int32_t v = 1; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
    return log(sum) + mx - (double)row[target];
}

/* One window's logits through the KV cache: its first `chunk` tokens as a fresh prefill (attending to the pass's own
   rows), then chunks of `chunk` tokens over the cached prefix (each reading every earlier position, and its own, from
   the cache as stored: an e4m3 cache's values), as a generation's prompt chunks and decode steps (chunk 1) read it. */
static fm_status cached_window(fm_context *ctx, const int32_t *seq_ids, int32_t window, int32_t chunk, float *logits,
                               fm_error *err) {
    const int64_t V = ctx->m->cfg.vocab_size;
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq;
    fm_status st = fm_kv_seq_begin(ctx, seq_ids, window, &sp, &seq, err);
    if (st) return st;
    int32_t *rows = fm_malloc(2 * (size_t)chunk * sizeof *rows, err, "perplexity rows");
    if (!rows) st = FM_ERR_NOMEM;
    for (int32_t p0 = 0; !st && p0 < window; p0 += chunk) {
        const int32_t T = window - p0 < chunk ? window - p0 : chunk;
        for (int32_t t = 0; t < T; t++) rows[t] = seq, rows[chunk + t] = p0 + t;
        st = fm_kv_seq_append(&ctx->kv->pool, seq, T, err);
        ctx->kv->tables_dirty = true;
        if (!st) st = fm_step_stage(ctx, seq_ids + p0, rows, rows + chunk, T, err);
        if (!st) fm_step_device(ctx, T, false, p0 == 0 ? FM_ATTN_FRESH : FM_ATTN_PAGED);
        if (!st) st = fm_step_logits(ctx, T, logits + (size_t)p0 * (size_t)V, err);
    }
    free(rows);
    fm_kv_seq_end(ctx, seq);
    return st;
}

fm_status fm_context_perplexity(fm_context *ctx, const int32_t *ids, int64_t n_ids, int32_t window, int64_t windows,
                                fm_progress_fn progress, void *user, double *ppl, double *mean_loss, fm_error *err) {
    return fm_context_perplexity_cached(ctx, ids, n_ids, window, windows, 0, progress, user, ppl, mean_loss, err);
}

fm_status fm_context_perplexity_cached(fm_context *ctx, const int32_t *ids, int64_t n_ids, int32_t window,
                                       int64_t windows, int32_t chunk, fm_progress_fn progress, void *user, double *ppl,
                                       double *mean_loss, fm_error *err) {
    const fm_model *m = ctx->m;
    if (chunk < 0) return fm_fail(err, FM_ERR_USAGE, "perplexity through the cache: chunk %d, not >= 1", chunk);
    if (chunk > 0 && !ctx->kv)
        return fm_fail(err, FM_ERR_USAGE, "perplexity through the cache needs one (a load with --max-seqs >= 1)");
    if (window < 2) return fm_fail(err, FM_ERR_USAGE, "perplexity window must be at least 2 tokens, got %d", window);
    if (windows < 1 || windows > n_ids / window)
        return fm_fail(err, FM_ERR_FORMAT, "%lld ids hold %lld windows of %d tokens; %lld requested", (long long)n_ids,
                       (long long)(n_ids / window), window, (long long)windows);
    fm_status cst = fm_context_check_ctx(ctx, window, err); /* before the first window runs */
    if (cst) return cst;
    const int32_t V = m->cfg.vocab_size;
    float *logits = fm_malloc((size_t)window * (size_t)V * sizeof *logits, err, "perplexity logits");
    if (!logits) return FM_ERR_NOMEM;
    double loss = 0.0;
    int64_t scored = 0;
    fm_status st = FM_OK;
    for (int64_t w = 0; !st && w < windows; w++) {
        const int32_t *seq = ids + w * window;
        st = chunk ? cached_window(ctx, seq, window, chunk, logits, err)
                   : fm_context_logits(ctx, seq, window, logits, err);
        for (int32_t t = 0; !st && t + 1 < window; t++, scored++)
            loss += token_loss(logits + (size_t)t * (size_t)V, V, seq[t + 1]);
        if (!st && !isfinite(loss))
            st = fm_fail(err, FM_ERR_FORMAT, "window %lld: the loss is not finite (NaN or infinite logits)",
                         (long long)w);
        if (!st && progress) progress(user, w + 1, windows, exp(loss / (double)scored));
    }
    free(logits);
    if (st) return st;
    *mean_loss = loss / (double)scored;
    *ppl = exp(*mean_loss);
    return FM_OK;
}
