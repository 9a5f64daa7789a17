/* How many sequences of how many tokens fit in a budget of device memory beside the model (memory_fit.h). */
#include "engine/memory_fit.h"
#include "engine/memory_plan.h"
#include "util/status.h"

fm_status fm_memory_fit_sequences(const fm_config *cfg, const fm_plan *plan, int32_t n_layers, int64_t chunk,
                                  size_t budget, int32_t cap, int32_t *max_seqs, int64_t *ctx, fm_error *err) {
    return fm_memory_fit_sequences_with(cfg, plan, n_layers, chunk, budget, 0, 0, cap, max_seqs, ctx, err);
}

fm_status fm_memory_fit_sequences_with(const fm_config *cfg, const fm_plan *plan, int32_t n_layers, int64_t chunk,
                                       size_t budget, size_t fixed, size_t seq_extra, int32_t cap, int32_t *max_seqs,
                                       int64_t *ctx, fm_error *err) {
    fm_memory_plan base, one;
    fm_status st = fm_memory_plan_compute(cfg, plan, "cuda", n_layers, chunk, &base, err);
    if (st) return st;
    if (base.peak + fixed >= budget)
        return fm_fail(err, FM_ERR_NOMEM, "the model needs %.2f GiB before any KV cache, over the %.2f GiB budget",
                       (base.peak + fixed) / 1073741824.0, budget / 1073741824.0);
    int64_t c = *ctx > 0 ? *ctx : cfg->max_position_embeddings > 0 ? cfg->max_position_embeddings : 4096;
    one = base;
    if ((st = fm_memory_plan_add_generation(&one, cfg, plan, 1, c, err))) return st;
    const size_t kv_seq = one.peak > base.peak ? one.peak - base.peak : 1, per_seq = kv_seq + seq_extra;
    const size_t room = budget - base.peak - fixed;
    if (*max_seqs <= 0) {
        const size_t fit = room / per_seq;
        *max_seqs = fit < 1 ? 1 : fit > (size_t)cap ? cap : (int32_t)fit;
    }
    if (*ctx <= 0 && (size_t)*max_seqs * per_seq > room) { /* the whole context does not fit: shorten it */
        const size_t per_token = kv_seq / (size_t)c ? kv_seq / (size_t)c : 1, extra = (size_t)*max_seqs * seq_extra;
        int64_t fit = extra < room ? (int64_t)((room - extra) / ((size_t)*max_seqs * per_token)) / 16 * 16 : 0;
        if (fit < 16) return fm_fail(err, FM_ERR_NOMEM, "not even 16 tokens of KV cache fit beside the model");
        c = fit;
    }
    *ctx = c;
    return FM_OK;
}
