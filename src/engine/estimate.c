/* The public API's look before a load (fp8moe.h): a checkpoint's description and the memory a load of it takes, from
 * config.json and the options, through the memory plan the load itself checks. */
#include <stdio.h>
#include <string.h>

#include "backend/backend_kind.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_fit.h"
#include "engine/memory_plan.h"
#include "engine/shared_routing.h"
#include "engine/state_cache.h"
#include "io/config.h"
#include "util/status.h"

static void info_of_config(const fm_config *c, fm_checkpoint_info *out) {
    snprintf(out->model_type, sizeof out->model_type, "%s", c->model_type);
    out->n_layers = c->n_layers;
    for (int32_t l = 0; l < c->n_layers; l++) out->n_moe_layers += c->layer_is_moe[l];
    out->n_experts = c->n_experts, out->n_experts_per_tok = c->n_experts_per_tok;
    out->hidden_size = c->hidden_size, out->vocab_size = c->vocab_size;
    out->max_position_embeddings = c->max_position_embeddings > 0 ? c->max_position_embeddings : 0;
    out->prequantized = c->quant.method != FM_QUANT_NONE;
    if (out->prequantized) fm_quant_config_describe(&c->quant, out->quantization, sizeof out->quantization);
}

fm_status fm_checkpoint_probe(const char *dir, fm_checkpoint_info *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    fm_config c;
    const fm_status st = fm_config_load(dir, &c, err);
    if (!st) info_of_config(&c, out);
    return st;
}

fm_status fm_synthetic_probe(const char *name, fm_checkpoint_info *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    fm_config c;
    const fm_status st = fm_synthetic_config(name, &c, err);
    if (!st) info_of_config(&c, out);
    return st;
}

/* the plan the load makes of the options (model.c, fm_model_build) */
static fm_status plan_of_options(const fm_options *opt, fm_plan *plan, fm_error *err) {
    if ((unsigned)opt->preset >= FM_PRESET_COUNT) return fm_fail(err, FM_ERR_USAGE, "unknown preset %d", opt->preset);
    fm_plan_for_backend(opt->preset, opt->plan_backend ? opt->plan_backend : opt->backend, plan);
    fm_plan_set_dense(plan, opt->dense);
    fm_status st = fm_plan_set_dispatch(plan, opt->dispatch, err);
    if (!st) st = fm_plan_set_lm_head(plan, opt->lm_head, err);
    return st ? st : fm_plan_set_kv(plan, opt->kv_cache, err);
}

fm_status fm_memory_estimate_compute(const char *dir, const fm_options *opt, fm_memory_estimate *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    fm_config c;
    fm_plan plan;
    const fm_backend_kind *kind;
    fm_status st = fm_config_load(dir, &c, err);
    if (!st) st = fm_backend_kind_get(opt->backend ? opt->backend : "cpu", "--backend", &kind, err);
    if (!st) st = plan_of_options(opt, &plan, err);
    if (st) return st;
    if (opt->n_layers < 0 || opt->n_layers > c.n_layers)
        return fm_fail(err, FM_ERR_USAGE, "--layers %d of a model with %d layers", opt->n_layers, c.n_layers);
    int sm_major = 0;
    fm_error qerr;
    if (kind->device_query && kind->device_query(&sm_major, NULL, 0, &qerr)) sm_major = 0;
    fm_routes routes;
    fm_routes_default(&routes, sm_major);
    if ((st = fm_routes_apply(&routes, opt->routes, err))) return st;
    char why[160]; /* the shared expert in the bank, as the load will place it (model.c) */
    if (fm_routes_moe_shared_routed(&routes) && fm_shared_routing_fits(&c, &plan, opt->ep_ranks, why, sizeof why))
        fm_shared_routing_apply(&c);
    const int64_t T = opt->max_tokens > 0 ? opt->max_tokens : FM_DEFAULT_MAX_TOKENS;
    const int64_t B = opt->max_seqs > 0 ? fm_decode_bucket(opt->max_seqs) : 0;
    const int64_t ctx = opt->ctx > 0 ? opt->ctx : c.max_position_embeddings;
    fm_memory_plan p;
    st = fm_memory_plan_compute_routes(&c, &plan, kind->name, &routes, opt->n_layers, T > B ? T : B, &p, err);
    if (!st && opt->max_seqs > 0) st = fm_memory_plan_add_generation(&p, &c, &plan, opt->max_seqs, ctx, err);
    if (!st && opt->max_seqs > 0)
        fm_memory_plan_add_state_cache(&p,
                                       fm_state_cache_bytes(&c, p.n_layers, fm_state_cache_slots(&c, p.n_layers, opt)));
    if (!st && (opt->ep_ranks > 1 || opt->tp_ranks > 1))
        st = fm_memory_plan_rank(&p, &c, &plan, opt->ep_ranks, opt->tp_ranks,
                                 opt->ep_ranks > 1 ? opt->ep_rank : opt->tp_rank, err);
    if (st) return st;
    *out = (fm_memory_estimate){p.weight_total, p.activations,  p.workspace, p.kv_cache, p.kv_state,
                                p.ep_exchange,  p.load_staging, p.total,     p.peak};
    return FM_OK;
}

fm_status fm_memory_fit_generation(const char *dir, const fm_options *opt, int64_t chunk, size_t budget, int32_t cap,
                                   int32_t *max_seqs, int64_t *ctx, fm_error *err) {
    fm_config c;
    fm_plan plan;
    fm_status st = fm_config_load(dir, &c, err);
    if (!st) st = plan_of_options(opt, &plan, err);
    if (st) return st;
    const int32_t layers = opt->n_layers > 0 ? opt->n_layers : c.n_layers;
    /* a hybrid model's state snapshots: the slots asked for, or (the default) two per sequence */
    fm_options one = *opt;
    one.max_seqs = 1;
    const size_t snaps = fm_state_cache_bytes(&c, layers, fm_state_cache_slots(&c, layers, &one));
    const bool per_seq = opt->state_cache_slots < 0;
    return fm_memory_fit_sequences_with(&c, &plan, layers, chunk, budget, per_seq ? 0 : snaps, per_seq ? snaps : 0, cap,
                                        max_seqs, ctx, err);
}
