/* Perplexity over consecutive windows (the protocol of models/README.md). */
#include <math.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "util/status.h"

/* -log softmax(row)[target], in double */
static double token_loss(const float *row, int32_t vocab, int32_t target) {
    double mx = row[0];
    for (int32_t v = 1; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
    return log(sum) + mx - (double)row[target];
}

fm_status fm_context_perplexity(fm_context *ctx, const int32_t *ids, int64_t n_ids, int32_t window, int64_t windows,
                                fm_progress_fn progress, void *user, double *ppl, double *mean_loss, fm_error *err) {
    const fm_model *m = ctx->m;
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
        st = fm_context_logits(ctx, seq, window, logits, err);
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
