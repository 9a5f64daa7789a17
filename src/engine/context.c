/* The context (fp8moe.h fm_context): the run state apart from the weights, handed out over what the load reserved.
 *
 * Why the load reserves it and fm_context_create only hands it out: the memory plan counts the forward buffers, the
 * KV cache and the expert cache with the weights, and the check before the load promises that nothing fails for
 * memory afterwards; allocating at create would let a context fail where the check said it fits. So a context may ask
 * for less than the load planned (fewer sequences, a shorter context, fewer tokens per pass: the limits are enforced
 * here and in the passes) and is refused, naming the option, when it asks for more. The backend's scratch is one per
 * model, hence one context at a time. */
#include <stdio.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "util/status.h"

/* what the load planned: fm_options.max_seqs, the KV cache's (or the model's) context, max_tokens */
static int32_t planned_seqs(const fm_context *ctx) { return ctx->kv ? ctx->kv->pool.max_seqs : 0; }
static int64_t planned_ctx(const fm_context *ctx) { return ctx->kv ? ctx->kv->pool.ctx : ctx->m->n_ctx; }

void fm_context_limits_reset(fm_context *ctx) {
    ctx->n_seqs = planned_seqs(ctx), ctx->n_ctx = planned_ctx(ctx), ctx->n_tokens = ctx->buf_tokens;
}

static fm_status above_plan(fm_error *err, const char *field, long long asked, long long planned, const char *option) {
    return fm_fail(err, FM_ERR_USAGE,
                   "fm_context_params.%s %lld is more than the %lld the model was loaded for; load it with %s >= %lld",
                   field, asked, planned, option, asked);
}

fm_status fm_context_create(fm_model *m, const fm_context_params *params, fm_context **out, fm_error *err) {
    *out = NULL;
    fm_context *ctx = m->context;
    if (ctx->held)
        return fm_fail(err, FM_ERR_USAGE,
                       "the model already has a context (one at a time: the backend's scratch is one); "
                       "fm_context_free it first");
    const fm_context_params p = params ? *params : (fm_context_params){0};
    if (p.max_seqs < 0 || p.ctx < 0 || p.max_tokens < 0)
        return fm_fail(err, FM_ERR_USAGE,
                       "fm_context_params: max_seqs, ctx and max_tokens must be >= 0 (0: the load's)");
    const int32_t seqs = planned_seqs(ctx);
    const int64_t n_ctx = planned_ctx(ctx);
    if (p.max_seqs > seqs) return above_plan(err, "max_seqs", p.max_seqs, seqs, "--max-seqs (fm_options.max_seqs)");
    if (p.ctx > 0 && n_ctx > 0 && p.ctx > n_ctx) return above_plan(err, "ctx", p.ctx, n_ctx, "--ctx (fm_options.ctx)");
    if (p.max_tokens > ctx->buf_tokens)
        return above_plan(err, "max_tokens", p.max_tokens, ctx->buf_tokens, "fm_options.max_tokens");
    fm_context_limits_reset(ctx);
    if (p.max_seqs > 0) ctx->n_seqs = p.max_seqs;
    if (p.ctx > 0) ctx->n_ctx = p.ctx;
    if (p.max_tokens > 0) ctx->n_tokens = p.max_tokens;
    ctx->held = true;
    *out = ctx;
    return FM_OK;
}

void fm_context_free(fm_context *ctx) {
    if (!ctx) return;
    for (int32_t s = 0; ctx->kv && s < ctx->kv->pool.max_seqs; s++)
        if (ctx->kv->pool.n_tokens[s] >= 0) fm_kv_seq_end(ctx, s);
    fm_context_limits_reset(ctx);
    ctx->held = false;
}

const fm_model *fm_context_model(const fm_context *ctx) { return ctx->m; }
int32_t fm_context_max_seqs(const fm_context *ctx) { return ctx->n_seqs; }
int64_t fm_context_ctx(const fm_context *ctx) { return ctx->n_ctx > 0 ? ctx->n_ctx : 0; }
int64_t fm_context_max_tokens(const fm_context *ctx) { return ctx->n_tokens; }
fm_kv_dtype fm_context_kv_cache(const fm_context *ctx) { return ctx->kv ? ctx->kv->dtype : FM_KV_ACT; }

bool fm_context_prefix_cache(const fm_context *ctx) { return ctx->kv && ctx->kv->pool.prefix_cache; }
int64_t fm_context_max_step_tokens(const fm_context *ctx) {
    const int64_t t = ctx->kv ? ctx->kv->step_tokens : 0;
    return t < ctx->n_tokens ? t : ctx->n_tokens; /* the scheduler's cap when the context asked for fewer tokens */
}

fm_step_budget_mode fm_context_step_budget(const fm_context *ctx, double *ratio) {
    const bool latency = fm_context_max_step_tokens(ctx) > 0 && ctx->kv->step_latency;
    if (ratio) *ratio = latency ? ctx->kv->step_ratio : 0.0;
    return latency ? FM_STEP_BUDGET_LATENCY : FM_STEP_BUDGET_FIXED;
}

int32_t fm_context_prompt_wait_steps(const fm_context *ctx) {
    return fm_context_step_budget(ctx, NULL) == FM_STEP_BUDGET_LATENCY ? ctx->kv->step_wait : 0;
}

void fm_context_kv_blocks(const fm_context *ctx, int32_t *used, int32_t *total) {
    const fm_kv_pool *p = ctx->kv ? &ctx->kv->pool : NULL;
    *used = p ? p->n_blocks - p->n_free : 0, *total = p ? p->n_blocks : 0;
}

fm_status fm_context_check_ctx(const fm_context *ctx, int64_t T, fm_error *err) {
    fm_status st = fm_model_check_ctx(ctx->m, T, err);
    if (!st && ctx->n_ctx > 0 && T > ctx->n_ctx)
        st = fm_fail(err, FM_ERR_USAGE,
                     "%lld tokens in one sequence are more than the context's %lld (fm_context_params.ctx)",
                     (long long)T, (long long)ctx->n_ctx);
    return st;
}

fm_status fm_context_logits(fm_context *ctx, const int32_t *ids, int64_t n_tokens, float *logits, fm_error *err) {
    const fm_model *m = ctx->m;
    if (n_tokens <= 0) return fm_fail(err, FM_ERR_FORMAT, "no tokens to run (empty ids)");
    fm_status st = fm_context_check_ctx(ctx, n_tokens, err);
    if (st) return st;
    for (int64_t t = 0; t < n_tokens; t++)
        if (ids[t] < 0 || ids[t] >= m->cfg.vocab_size)
            return fm_fail(err, FM_ERR_FORMAT, "token id %d at position %lld is outside the vocabulary [0, %d)", ids[t],
                           (long long)t, m->cfg.vocab_size);
    return fm_forward(ctx, ids, n_tokens, false, logits, NULL, err);
}
