/* Model load: config -> safetensors -> weight slots -> backend banks in the plan's formats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ep_moe.h"
#include "dist/rank_group.h"
#include "dist/tp_attention.h"
#include "backend/backend_kind.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/load_progress.h"
#include "engine/memory_plan.h"
#include "engine/shared_routing.h"
#include "engine/state_cache.h"
#include "engine/step_budget.h"
#include "engine/weight_format.h"
#include "util/progress.h"
#include "util/status.h"

void fm_options_init(fm_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->backend = "cpu";
    opt->preset = FM_PRESET_REF;
    opt->expert_policy = FM_EXPERT_LFU; /* a prefill's cyclic pass over the layers defeats LRU (docs/RESULTS.md 2.11) */
    opt->prefix_cache = true;
    opt->state_cache_slots = -1;
}

int32_t fm_model_vocab_size(const fm_model *m) { return m->cfg.vocab_size; }

int32_t fm_model_eos_ids(const fm_model *m, const int32_t **ids) {
    *ids = m->cfg.eos_ids;
    return m->cfg.n_eos;
}

/* The mixed step's token budget: the whole decode batch plus a prefill share that is large enough to keep the
 * matrix units busy (512 rows make the dense and expert GEMMs compute-bound on an H200) and small enough that a
 * step with a prompt costs the streams a few ms, never a whole long prefill; at most what the activations hold.
 * Then how the scheduler sizes the prefill share within it: by measured step times unless asked to keep it fixed
 * (src/engine/step_budget.h). */
static fm_status resolve_step_tokens(fm_context *ctx, const fm_options *opt, fm_error *err) {
    const int64_t asked = opt->max_step_tokens;
    const int64_t cap = ctx->buf_tokens < ctx->kv->max_rows ? ctx->buf_tokens : ctx->kv->max_rows;
    if (asked < -1)
        return fm_fail(err, FM_ERR_USAGE, "--max-step-tokens must be >= 1 or off, got %lld", (long long)asked);
    if (asked > cap)
        return fm_fail(err, FM_ERR_USAGE,
                       "--max-step-tokens %lld is more than the %lld tokens of one pass the model was loaded for "
                       "(--prefill-chunk / fm_options.max_tokens)",
                       (long long)asked, (long long)cap);
    const int64_t dflt = (int64_t)ctx->kv->pool.max_seqs + 512;
    ctx->kv->step_tokens = asked == -1 ? 0 : asked > 0 ? asked : dflt < cap ? dflt : cap;
    const fm_step_budget_mode mode = opt->step_budget;
    const double ratio = opt->step_latency_ratio;
    if (mode != FM_STEP_BUDGET_AUTO && mode != FM_STEP_BUDGET_FIXED && mode != FM_STEP_BUDGET_LATENCY)
        return fm_fail(err, FM_ERR_USAGE, "--step-budget: unknown value %d (fixed or latency)", (int)mode);
    if (ratio != 0.0 && !(ratio >= 1.0 && ratio <= 1000.0))
        return fm_fail(
            err, FM_ERR_USAGE,
            "--max-step-latency-ratio must be in [1, 1000] (a step's time over a decode-only step's), got %g", ratio);
    const int32_t wait = opt->prompt_wait_steps;
    if (wait < -1 || wait > FM_PROMPT_WAIT_STEPS_MAX)
        return fm_fail(err, FM_ERR_USAGE,
                       "--max-prompt-wait-steps must be in [1, %d] or off (the steps a waiting prompt may wait before "
                       "it gets the whole step), got %d",
                       FM_PROMPT_WAIT_STEPS_MAX, wait);
    /* the options that only the latency budget reads, by name for the refusals below (a prompt wait turned off asks
       nothing of any budget) */
    const char *latency_opt = ratio != 0.0 ? "--max-step-latency-ratio" : wait > 0 ? "--max-prompt-wait-steps" : NULL;
    if (asked == -1 && (mode != FM_STEP_BUDGET_AUTO || latency_opt))
        return fm_fail(err, FM_ERR_USAGE, "%s needs mixed steps, and --max-step-tokens is off",
                       latency_opt ? latency_opt : "--step-budget");
    if (mode == FM_STEP_BUDGET_FIXED && latency_opt)
        return fm_fail(err, FM_ERR_USAGE, "%s goes with --step-budget latency, not fixed", latency_opt);
    /* each rank of a group runs its own scheduler, in step with the others: shares sized by each rank's own clock
       would differ, and the ranks' passes with them */
    const bool ranks = ctx->m->ep_ranks > 1 || ctx->m->tp_ranks > 1;
    if (ranks && (mode == FM_STEP_BUDGET_LATENCY || latency_opt))
        return fm_fail(err, FM_ERR_USAGE,
                       "%s: the ranks of --ep/--tp would size their steps apart; use --step-budget fixed there",
                       latency_opt ? latency_opt : "--step-budget latency");
    /* auto is latency (measured on an H100: docs/RESULTS.md 2.26, the 64-client load at ~95 % of fixed's output
       rate, the streams' spread while long prompts arrive 1.97x against fixed's 3.0x), fixed on the ranks of a
       group */
    ctx->kv->step_latency = ctx->kv->step_tokens > 0 && !ranks && mode != FM_STEP_BUDGET_FIXED;
    ctx->kv->step_ratio = ratio != 0.0 ? ratio : FM_STEP_LATENCY_RATIO;
    ctx->kv->step_wait = wait == 0 ? FM_STEP_PROMPT_WAIT_STEPS : wait < 0 ? 0 : wait;
    return FM_OK;
}

typedef struct loader {
    fm_model *m;
    fm_error *err;
    int32_t n_native, n_zp; /* pre-quantized banks bound natively as int4-g128(-tc), and as int4-zp */
    fm_load_progress progress;
} loader;

/* The format of a bank of `family` from its sources (engine/weight_format.h), counting the pre-quantized banks bound
 * natively and kept in the checkpoint's own int4 for the verbose line */
static fm_status pick_format(loader *ld, const fm_wsrc *srcs, int64_t count, fm_wfamily family, const char *label,
                             fm_wformat *fmt) {
    fm_bank_origin o;
    fm_bank_origin_of_srcs(ld->m->cfg.quant.method, srcs, count, &o);
    bool native = false;
    const fm_status st =
        fm_weight_format(&ld->m->plan, fm_backend_kind_of(ld->m->be), family, &o, label, fmt, &native, ld->err);
    ld->n_native += native;
    ld->n_zp += !st && fm_wformat_is_int4zp(*fmt);
    return st;
}

static fm_status bank_acts(loader *ld, fm_bank **out, const fm_wsrc *srcs, int32_t n, int32_t n_parts, bool gate_up,
                           fm_wfamily family, const char *label) {
    fm_wformat fmt;
    fm_status pst = pick_format(ld, srcs, (int64_t)n * n_parts, family, label, &fmt);
    if (pst) return pst;
    fm_bank_src src = {srcs, n, n_parts, label, gate_up, family == FM_WF_EXPERTS};
    fm_status st = ld->m->be->ops->bank_create(ld->m->be, &src, fmt, out, ld->err);
    if (st == FM_OK) ld->m->weight_bytes += ld->m->be->ops->bank_bytes(*out);
    if (st == FM_OK) fm_load_progress_add(&ld->progress, srcs, (int64_t)n * n_parts);
    return st;
}

/* An expert bank in host memory (experts in host memory: fm_expert_offload_create checks the backend has the ops) */
static fm_status bank_host(loader *ld, fm_bank **out, const fm_wsrc *srcs, int32_t n, int32_t n_parts, bool gate_up,
                           fm_wfamily family, const char *label) {
    fm_model *m = ld->m;
    if (!m->be->ops->bank_create_host)
        return fm_fail(ld->err, FM_ERR_UNSUPPORTED,
                       "--experts-in host: the %s backend cannot keep experts in host memory yet; --experts-in device "
                       "runs the model with every expert in its memory",
                       m->be->ops->name);
    fm_wformat fmt;
    fm_status pst = pick_format(ld, srcs, (int64_t)n * n_parts, family, label, &fmt);
    if (pst) return pst;
    fm_bank_src src = {srcs, n, n_parts, label, gate_up, family == FM_WF_EXPERTS};
    fm_status st = m->be->ops->bank_create_host(m->be, &src, fmt, out, ld->err);
    if (st == FM_OK) m->expert_host_bytes += m->be->ops->bank_bytes(*out);
    if (st == FM_OK) fm_load_progress_add(&ld->progress, srcs, (int64_t)n * n_parts);
    return st;
}

/* a bank that is not a linear projection: the plan's w_other */
static fm_status bank(loader *ld, fm_bank **out, const fm_wsrc *srcs, int32_t n, int32_t n_parts, const char *label) {
    return bank_acts(ld, out, srcs, n, n_parts, false, FM_WF_NORM, label);
}

/* A zero-centred RMSNorm weight (model/arch.h plus_one_banks): its bank holds 1 + w, built from an fp32 copy. */
static fm_status bank_plus_one(loader *ld, fm_bank **out, const fm_wsrc *src, const char *label) {
    const int64_t n = src->rows * src->cols;
    float *w = fm_malloc((size_t)n * sizeof *w, ld->err, label);
    if (!w) return FM_ERR_NOMEM;
    fm_status st = fm_wsrc_read(src, w, ld->err);
    for (int64_t i = 0; !st && i < n; i++) w[i] += 1.0f;
    char name[96];
    snprintf(name, sizeof name, "%s (1 + w)", label);
    fm_st_tensor t = {.name = name,
                      .dtype = FM_DTYPE_F32,
                      .n_dims = 2,
                      .shape = {src->rows, src->cols},
                      .n_elements = n,
                      .data = (const uint8_t *)w,
                      .nbytes = (uint64_t)n * sizeof *w};
    const fm_wsrc view = {&t, 0, src->rows, src->cols, {0}, {0}};
    if (!st) st = bank(ld, out, &view, 1, 1, label);
    free(w);
    return st;
}

/* --tp: the views of this rank's heads in an attention layer's q|k|v bank (each part's rows of its heads: q_proj's
 * rows per query head, k_proj's and v_proj's per key-value head) or o bank (its heads' columns, as one one-row view
 * per output row: a bank's parts are stacked rows). *srcs is replaced for o (one part per row: *np). */
static fm_status tp_views(loader *ld, fm_bank_slot bank, fm_wsrc **srcs, int32_t *np) {
    const fm_model *m = ld->m;
    for (int32_t j = 0; j < *np; j++)
        if (!(*srcs)[j].t || fm_wsrc_is_quantized(&(*srcs)[j]))
            return fm_fail(ld->err, FM_ERR_UNSUPPORTED,
                           "--tp: the attention projections are split from a checkpoint's float tensors (not "
                           "synthetic or pre-quantized weights)");
    if (bank == FM_BANK_QKV) {
        for (int32_t j = 0; j < *np; j++) { /* parts q, k, v in that order (model/arch.h) */
            fm_wsrc *v = &(*srcs)[j];
            const int32_t heads = j == 0 ? m->cfg.n_heads : m->cfg.n_kv_heads;
            const int32_t h0 = j == 0 ? m->tp_h0 : m->tp_kv0, nh = j == 0 ? m->tp_nh : m->tp_nkv;
            const int64_t per = v->rows / heads;
            v->offset += (int64_t)h0 * per * v->cols, v->rows = (int64_t)nh * per;
        }
        return FM_OK;
    }
    const fm_wsrc o = (*srcs)[0];
    const int64_t hd = o.cols / m->cfg.n_heads;
    fm_wsrc *rows = fm_malloc((size_t)o.rows * sizeof *rows, ld->err, "o_proj shard views");
    if (!rows) return FM_ERR_NOMEM;
    for (int64_t r = 0; r < o.rows; r++) {
        rows[r] = o;
        rows[r].offset = o.offset + r * o.cols + m->tp_h0 * hd, rows[r].rows = 1, rows[r].cols = m->tp_nh * hd;
    }
    free(*srcs);
    *srcs = rows, *np = (int32_t)o.rows;
    return FM_OK;
}

/* Every bank of layer l, as its description lists them: the parts' views (expert by expert in an expert bank)
 * fused into one bank in the format of the spec's family. */
static fm_status load_layer(loader *ld, const fm_layer_src *s, int l, fm_layer_weights *L) {
    const fm_config *c = &ld->m->cfg;
    const fm_layer_desc *d = fm_arch_layer(fm_arch_of(c), c, l);
    L->kind = s->kind;
    L->is_moe = s->is_moe;
    for (int32_t i = 0; i < d->n_specs; i++) {
        const fm_weight_spec *w = &d->specs[i];
        if (!fm_spec_present(w, c)) continue;
        /* the shared expert in the bank (moe.shared): expert E's views are its, the router has its gate's row */
        const int32_t n = fm_spec_count(w, c), np = fm_shared_routing_parts(c, w);
        fm_wsrc *srcs = fm_malloc((size_t)n * (size_t)np * sizeof *srcs, ld->err, "weight views");
        if (!srcs) return FM_ERR_NOMEM;
        fm_shared_routing_views(c, s, w, n, srcs);
        /* expert parallelism: this rank's experts only; tensor parallelism: its heads' rows and columns */
        const bool ep = w->family == FM_WF_EXPERTS && ld->m->ep_ranks > 1;
        int32_t np_load = np;
        if (ld->m->tp_ranks > 1 && (w->bank == FM_BANK_QKV || w->bank == FM_BANK_O)) {
            fm_status tst = tp_views(ld, w->bank, &srcs, &np_load);
            if (tst) {
                free(srcs);
                return tst;
            }
        }
        const fm_wsrc *first = ep ? srcs + (size_t)ld->m->ep_first * (size_t)np : srcs;
        const int32_t n_load = ep ? ld->m->ep_n : n;
        char label[96];
        snprintf(label, sizeof label, "layer %d %s", l, w->label);
        const bool host = ld->m->experts_host && w->family == FM_WF_EXPERTS;
        fm_status st = fm_arch_of(c)->plus_one_banks >> w->bank & 1
                           ? bank_plus_one(ld, &L->bank[w->bank], srcs, label)
                           : (host ? bank_host : bank_acts)(ld, &L->bank[w->bank], first, n_load, np_load,
                                                            w->fusion == FM_FUSE_GATE_UP, w->family, label);
        free(srcs);
        if (st) return st;
    }
    return FM_OK;
}

/* lm_head shares the embedding's bank when the binder pointed both at the same tensor (synthetic views, with no
 * tensor, are the same only with the same seed) */
static bool lm_head_tied(const fm_model_src *src) {
    return src->lm_head.t == src->embed.t && src->lm_head.offset == src->embed.offset &&
           (src->lm_head.t || src->lm_head.synth.seed == src->embed.synth.seed);
}

static fm_status load_weights(fm_model *m, const fm_model_src *src, bool verbose, fm_error *err) {
    loader ld = {m, err, 0, 0, {0}};
    fm_load_progress_start(&ld.progress, verbose);
    fm_status st;
    if ((st = bank(&ld, &m->embed, &src->embed, 1, 1, "embed_tokens")) ||
        (st = fm_arch_of(&m->cfg)->final_norm_plus_one
                  ? bank_plus_one(&ld, &m->final_norm, &src->final_norm, "final norm")
                  : bank(&ld, &m->final_norm, &src->final_norm, 1, 1, "final norm")))
        return st;
    /* tied: the embedding's bank, unless --lm-head dense quantizes a copy of it */
    if (lm_head_tied(src) && !m->plan.lm_head_dense) m->lm_head = m->embed;
    else if ((st = bank_acts(&ld, &m->lm_head, &src->lm_head, 1, 1, false, FM_WF_LM_HEAD, "lm_head"))) return st;
    for (int l = 0; l < m->n_layers; l++) {
        fm_load_progress_layer(&ld.progress, l + 1, m->n_layers);
        if ((st = load_layer(&ld, &src->layers[l], l, &m->layers[l]))) {
            fm_progress_end();
            return st;
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%d layers, %.1f MiB of weights on %s", m->n_layers,
             (double)m->weight_bytes / (1 << 20), m->be->ops->name);
    fm_load_progress_done(&ld.progress, what);
    if (verbose && m->experts_host)
        fprintf(stderr, "experts in host memory: %.1f MiB, an expert cache of %d slots\n",
                (double)m->expert_host_bytes / (1 << 20), m->expert_slots);
    if (verbose && ld.n_native + ld.n_zp > 0) /* say which path the pre-quantized weights run */
        fprintf(stderr,
                "pre-quantized int4 banks: %d bound natively as the plan's int4 banks, %d in the checkpoint's "
                "own format (int4-zp)\n",
                ld.n_native, ld.n_zp);
    return FM_OK;
}

/* cuda: the memory plan of the weights and of a forward pass of max_tokens tokens against the device's free memory
 * (or --vram-limit, when smaller), before the backend exists and before any bank is allocated. */
/* Tokens of one forward pass the load plans for: max_tokens (a prompt, a prefill chunk), and with generation at
 * least the largest decode bucket (a step of max_seqs sequences padded to its CUDA graph's batch). */
static int64_t planned_tokens(const fm_options *opt) {
    const int64_t T = opt->max_tokens > 0 ? opt->max_tokens : FM_DEFAULT_MAX_TOKENS;
    const int64_t B = opt->max_seqs > 0 ? fm_decode_bucket(opt->max_seqs) : 0;
    return T > B ? T : B;
}

/* experts in host memory: the format the backend's expert cache keeps (cuda: int4-tc banks, the fp8 and fp4 presets'
 * experts; expert_cache.cu) */
static fm_status host_experts_format(const fm_model *m, const fm_backend_kind *kind, const fm_options *opt,
                                     fm_error *err) {
    if (kind->host_expert_format == FM_W_F32 || m->plan.w_expert == kind->host_expert_format) return FM_OK;
    return fm_fail(err, FM_ERR_UNSUPPORTED,
                   "--experts-in %s: the %s backend keeps experts in host memory for the fp8 and fp4 presets "
                   "(%s experts); preset %s has %s experts: --preset fp8, or --backend cpu",
                   opt->experts_in == FM_EXPERTS_AUTO ? "auto (the model does not fit)" : "host", kind->name,
                   fm_wformat_name(kind->host_expert_format), fm_preset_name(opt->preset),
                   fm_wformat_name(m->plan.w_expert));
}

/* Where the experts live (--experts-in, --expert-slots), resolved by the memory plan: m->experts_host and
 * m->expert_slots. cpu: host is the emulation of the expert cache, S from --expert-slots or every expert; auto is
 * device (no limit). cuda: host takes the slots that fit beside everything else (or --expert-slots); auto is device
 * when the plan fits, else host; the expert cache keeps int4-tc banks only (the fp8 and fp4 presets). */
static fm_status place_experts(fm_model *m, fm_memory_plan *plan, const fm_config *cfg, const fm_options *opt,
                               size_t available, const char *source, fm_error *err) {
    fm_status st = fm_memory_plan_place_experts(plan, cfg, opt->experts_in, opt->expert_slots, available, source, err);
    if (st) return st;
    if (plan->experts_in == FM_EXPERTS_HOST &&
        (st = host_experts_format(m, fm_backend_kind_find(plan->backend), opt, err)))
        return st;
    m->experts_host = plan->experts_in == FM_EXPERTS_HOST;
    m->expert_slots = plan->expert_slots;
    return FM_OK;
}

static fm_status check_device_memory(fm_model *m, const fm_model_src *src, const fm_options *opt, fm_error *err) {
    fm_status st0;
    if (opt->vram_limit < 0)
        return fm_fail(err, FM_ERR_USAGE, "--vram-limit must be >= 0 bytes, got %lld", (long long)opt->vram_limit);
    if (opt->max_tokens < 0)
        return fm_fail(err, FM_ERR_USAGE, "max_tokens must be >= 0, got %lld", (long long)opt->max_tokens);
    if ((unsigned)opt->experts_in > FM_EXPERTS_AUTO)
        return fm_fail(err, FM_ERR_USAGE, "unknown --experts-in value %d", opt->experts_in);
    if (opt->expert_slots < 0)
        return fm_fail(err, FM_ERR_USAGE, "--expert-slots must be >= 0, got %d", opt->expert_slots);
    if (opt->expert_slots > 0 && opt->experts_in == FM_EXPERTS_DEVICE)
        return fm_fail(err, FM_ERR_USAGE, "--expert-slots sizes the expert cache of --experts-in host (or auto)");
    const fm_backend_kind *kind;
    if ((st0 = fm_backend_kind_get(opt->backend ? opt->backend : "cpu", "--backend", &kind, err))) return st0;
    const bool device = kind->on_device;
    if (opt->experts_in == FM_EXPERTS_HOST && (st0 = host_experts_format(m, kind, opt, err))) return st0;
    if (!device && opt->experts_in != FM_EXPERTS_HOST) return FM_OK; /* host memory: auto is device, no limit */
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = lm_head_tied(src); /* as bound: a tied config may still ship an lm_head tensor */
    const int64_t T = planned_tokens(opt);
    fm_memory_plan plan; /* with the overrides the backend will apply: w4a8.tile sizes the MoE workspace */
    fm_status st = fm_memory_plan_compute_routes(&cfg, &m->plan, kind->name, &m->routes, m->n_layers, T, &plan, err);
    if (!st && opt->max_seqs > 0)
        st = fm_memory_plan_add_generation(&plan, &cfg, &m->plan, opt->max_seqs, m->n_ctx, err);
    if (!st && opt->max_seqs > 0)
        fm_memory_plan_add_state_cache(
            &plan, fm_state_cache_bytes(&cfg, m->n_layers, fm_state_cache_slots(&cfg, m->n_layers, opt)));
    /* a rank of a group: its experts and heads, its exchange buffers and their scratch */
    if (!st && (m->ep_ranks > 1 || m->tp_ranks > 1))
        st = fm_memory_plan_rank(&plan, &cfg, &m->plan, m->ep_ranks, m->tp_ranks,
                                 m->ep_ranks > 1 ? m->ep_rank : m->tp_rank, err);
    if (!st && !device) st = place_experts(m, &plan, &cfg, opt, 0, NULL, err);
    if (st || !device) return st;
    size_t free_bytes = 0, total = 0;
    if (!st) st = kind->free_memory(&free_bytes, &total, err);
    if (st) return st;
    const bool limited = opt->vram_limit > 0 && (uint64_t)opt->vram_limit < (uint64_t)free_bytes;
    const size_t available = limited ? (size_t)opt->vram_limit : free_bytes;
    char source[96], tot[32], w[32], a[32], ws[32], av[32];
    if (limited) snprintf(source, sizeof source, "--vram-limit");
    else snprintf(source, sizeof source, "free on the GPU, of %s", fm_mem_format(total, tot, sizeof tot));
    if ((st = place_experts(m, &plan, &cfg, opt, available, source, err))) return st;
    if (opt->verbose)
        fprintf(stderr,
                "memory plan on %s: weights %s, activations %s, workspace %s for %lld tokens; %s available (%s)\n",
                kind->name, fm_mem_format(plan.weight_total, w, sizeof w), fm_mem_format(plan.activations, a, sizeof a),
                fm_mem_format(plan.workspace, ws, sizeof ws), (long long)T, fm_mem_format(available, av, sizeof av),
                source);
    return fm_memory_plan_check(&plan, available, source, err);
}

fm_status fm_model_check_ctx(const fm_model *m, int64_t T, fm_error *err) {
    if (m->n_ctx <= 0 || T <= m->n_ctx) return FM_OK;
    if (m->n_ctx_explicit)
        return fm_fail(err, FM_ERR_FORMAT,
                       "%lld tokens in one sequence are more than the context of %lld tokens set by "
                       "--ctx",
                       (long long)T, (long long)m->n_ctx);
    return fm_fail(err, FM_ERR_FORMAT,
                   "%lld tokens in one sequence are more than the model's context of %lld tokens "
                   "(max_position_embeddings in config.json); --ctx N allows longer sequences",
                   (long long)T, (long long)m->n_ctx);
}

/* Qwen3-Next's layers (Gated DeltaNet, gated attention, the shared expert) need their ops (backend.h); a backend whose
 * table leaves them NULL refuses the architecture by name, before any weight is loaded. */
static fm_status check_backend_runs_arch(const fm_config *c, const fm_backend *be, fm_error *err) {
    const fm_backend_ops *o = be->ops;
    if (c->arch == FM_ARCH_QWEN3_NEXT && (!o->gated_qk_norm_rope || !o->sigmoid_mul || !o->add_sigmoid_gated ||
                                          !o->gdn_conv || !o->gdn_chunked || !o->gdn_recurrent || !o->gdn_norm_gate))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "model_type qwen3_next (Gated DeltaNet layers, gated attention, shared expert): the %s backend "
                       "has no kernels for it; use --backend cpu",
                       o->name);
    return FM_OK;
}

/* a group of N ranks (--ep or --tp, opt_name) that this rank and backend can be part of */
static fm_status check_group_size(const char *opt_name, int32_t N, int32_t rank, const fm_options *opt, fm_error *err) {
    if (N < 0 || N > FM_COMM_MAX_RANKS)
        return fm_fail(err, FM_ERR_USAGE, "%s must be 1..%d ranks, got %d", opt_name, FM_COMM_MAX_RANKS, N);
    if (N <= 1) return FM_OK;
    if (rank < 0 || rank >= N) return fm_fail(err, FM_ERR_USAGE, "%s: rank %d of %d ranks", opt_name, rank, N);
    if (!fm_backend_kind_find(opt->backend))
        return fm_fail(err, FM_ERR_UNSUPPORTED, "%s %d on the %s backend: the cpu and cuda backends split models",
                       opt_name, N, opt->backend);
    return FM_OK;
}

/* --ep: the plans whose expert ops the backend can exchange rows for (backend_kind.h ep_plan_ok; cuda: the fp8 and
 * fp4 presets' W4A8 experts with an e4m3 or FP4 dispatch, ref and ref32's cuBLAS experts) */
static fm_status ep_plan_check(const fm_model *m, const fm_options *opt, fm_error *err) {
    const fm_backend_kind *kind = fm_backend_kind_find(opt->backend);
    if (m->ep_ranks <= 1 || !kind || !kind->ep_plan_ok || kind->ep_plan_ok(&m->plan)) return FM_OK;
    return fm_fail(err, FM_ERR_UNSUPPORTED,
                   "--ep %d on the %s backend: the fp8 and fp4 presets (--dispatch fp8, mxfp4 or nvfp4), ref and "
                   "ref32; this plan is --preset %s dispatching %s (it splits on the cpu backend)",
                   m->ep_ranks, kind->name, fm_preset_name(opt->preset), fm_afmt_name(m->plan.a_dispatch));
}

/* --ep / --tp: the rank's share of the experts (fm_ep_expert_range) and of the attention heads (fm_tp_head_range), or
 * an error naming what cannot be split. Both run on the cpu and cuda backends (dist/ep_moe.h, dist/tp_attention.h);
 * on cuda, expert parallelism takes the fp8 and fp4 presets' W4A8 experts with the e4m3, MXFP4 or NVFP4 dispatch and
 * the ref and ref32 presets' cuBLAS experts (ep_plan_check). */
static fm_status parallel_ranks(fm_model *m, const fm_options *opt, fm_error *err) {
    const fm_config *c = &m->cfg;
    const int32_t E = c->n_experts, NE = opt->ep_ranks, NT = opt->tp_ranks;
    m->ep_ranks = 1, m->ep_rank = 0, m->ep_first = 0, m->ep_n = E;
    m->tp_ranks = 1, m->tp_rank = 0, m->tp_h0 = 0, m->tp_nh = c->n_heads, m->tp_kv0 = 0, m->tp_nkv = c->n_kv_heads;
    fm_status st = check_group_size("--ep", NE, opt->ep_rank, opt, err);
    if (!st) st = check_group_size("--tp", NT, opt->tp_rank, opt, err);
    if (!st) st = fm_rank_split_check(c, NE, NT, err);
    if (st) return st;
    if (NE > 1 && NT > 1 && opt->ep_rank != opt->tp_rank)
        return fm_fail(err, FM_ERR_USAGE, "--ep rank %d and --tp rank %d: one rank of one group", opt->ep_rank,
                       opt->tp_rank);
    if (NE > 1) {
        if (opt->experts_in == FM_EXPERTS_HOST)
            return fm_fail(err, FM_ERR_USAGE, "--ep with --experts-in host: each rank keeps its experts in its memory");
        m->ep_ranks = NE, m->ep_rank = opt->ep_rank;
        fm_ep_expert_range(E, NE, opt->ep_rank, &m->ep_first, &m->ep_n);
    }
    if (NT > 1) {
        fm_tp_head_range(c->n_heads, c->n_kv_heads, NT, opt->tp_rank, &m->tp_h0, &m->tp_nh, &m->tp_kv0, &m->tp_nkv);
        if (c->quant.method != FM_QUANT_NONE)
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "--tp with a pre-quantized checkpoint: its attention projections are not split yet");
        m->tp_ranks = NT, m->tp_rank = opt->tp_rank;
    }
    return FM_OK;
}

/* Qwen3-Next's shared expert: one more expert of each MoE layer's bank (route moe.shared=routed, where the shapes
 * agree: engine/shared_routing.h), the model's configuration then counting it; else its own banks, as --verbose
 * says with the reason. */
static void place_shared_expert(fm_model *m, const fm_model_src *src, const fm_options *opt) {
    if (src->cfg.shared_expert_intermediate <= 0 || src->cfg.n_experts <= 0) return;
    char why[160] = "";
    const bool asked = fm_routes_moe_shared_routed(&m->routes);
    const bool fits = asked && fm_shared_routing_fits(&src->cfg, &m->plan, m->ep_ranks, why, sizeof why);
    if (fits) fm_shared_routing_apply(&m->cfg);
    if (asked && !fits &&
        m->routes.moe_shared == FM_ROUTE_SHARED_ROUTED) /* asked for by name: said, not only in --verbose */
        fprintf(stderr, "fp8moe: route moe.shared=routed does not apply here (%s): the shared expert runs separately\n",
                why);
    else if (opt->verbose && fits)
        fprintf(stderr, "shared expert: routed, expert %d of each MoE layer's bank (route moe.shared)\n",
                src->cfg.n_experts);
    else if (opt->verbose)
        fprintf(stderr, "shared expert: separate, its own projections and gate (route moe.shared%s%s)\n",
                asked ? ": " : "", why);
}

fm_status fm_model_build(fm_model *m, const fm_model_src *src, const fm_options *opt, fm_error *err) {
    if (opt->ctx < 0) return fm_fail(err, FM_ERR_USAGE, "--ctx must be >= 1 token, got %lld", (long long)opt->ctx);
    m->n_ctx = opt->ctx > 0 ? opt->ctx : m->cfg.max_position_embeddings;
    m->n_ctx_explicit = opt->ctx > 0;
    fm_status cst = fm_model_check_ctx(m, opt->max_tokens, err); /* before a memory plan for a prompt we refuse */
    if (cst) return cst;
    m->n_layers = opt->n_layers > 0 ? opt->n_layers : m->cfg.n_layers;
    if ((cst = parallel_ranks(m, opt, err))) return cst;
    m->n_params = src->n_params;
    m->cfg.quant.native_layout = src->cfg.quant.native_layout; /* found by the binder, for the memory plan */
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (src->layers[l].is_moe) {
            m->expert_layout = src->layers[l].layout;
            break;
        }
    fm_plan_for_backend(opt->preset, opt->plan_backend ? opt->plan_backend : opt->backend, &m->plan);
    fm_plan_set_dense(&m->plan, opt->dense);
    fm_status dst = fm_plan_set_dispatch(&m->plan, opt->dispatch, err);
    if (!dst) dst = fm_plan_set_int4_scales(&m->plan, opt->int4_scales, err);
    if (!dst) dst = fm_plan_set_lm_head(&m->plan, opt->lm_head, err);
    if (!dst) dst = fm_plan_set_kv(&m->plan, opt->kv_cache, err);
    if (!dst && opt->kv_cache == FM_KV_E4M3 && opt->max_seqs <= 0)
        dst = fm_fail(err, FM_ERR_USAGE,
                      "--kv-cache e4m3 without a KV cache: it applies to generation (--max-seqs >= 1)");
    if (!dst && m->plan.int4_p2 && m->cfg.quant.method != FM_QUANT_NONE)
        dst = fm_fail(err, FM_ERR_USAGE,
                      "--int4-scales p2 quantizes float weights at load; this checkpoint is already quantized (%s) "
                      "and is read with its own scales",
                      fm_quant_method_name(m->cfg.quant.method));
    if (!dst) dst = ep_plan_check(m, opt, err);
    if (dst) return dst;
    /* the routes of the GPU the backend will run on: the memory plan sizes the MoE workspace by its tile rule */
    int sm_major = 0;
    fm_error qerr;
    const fm_backend_kind *kind = fm_backend_kind_find(opt->backend);
    if (kind && kind->device_query && kind->device_query(&sm_major, NULL, 0, &qerr)) sm_major = 0;
    if (kind && kind->kv_e4m3_codes && m->plan.kv == FM_KV_E4M3 && m->cfg.head_dim % 16 != 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "--kv-cache e4m3: head dim %d is not a multiple of 16, which the %s backend's e4m3 attention "
                       "kernel needs; use --kv-cache auto",
                       (int)m->cfg.head_dim, kind->name);
    fm_routes_default(&m->routes, sm_major);
    fm_status st = fm_routes_apply(&m->routes, opt->routes, err);
    if (!st) place_shared_expert(m, src, opt);
    if (!st) st = check_device_memory(m, src, opt, err);
    if (!st) st = fm_backend_create(opt->backend, &m->plan, opt->n_threads, opt->routes, &m->be, err);
    if (!st) st = check_backend_runs_arch(&m->cfg, m->be, err);
    if (!st && !(m->layers = fm_calloc((size_t)m->n_layers, sizeof *m->layers, err, "layers"))) st = FM_ERR_NOMEM;
    if (!st) st = load_weights(m, src, opt->verbose, err);
    /* the activations and the backend's scratch of the memory plan, once, for the prompt length the caller planned
       for: a forward pass allocates nothing */
    fm_context *ctx = NULL;
    if (!st && !(ctx = m->context = fm_calloc(1, sizeof *m->context, err, "context"))) st = FM_ERR_NOMEM;
    if (!st) ctx->m = m;
    if (!st) st = fm_forward_reserve(ctx, planned_tokens(opt), err);
    /* generation: the KV cache and the decode state, planned above with the rest */
    if (!st && opt->max_seqs < 0) st = fm_fail(err, FM_ERR_USAGE, "--max-seqs must be >= 0, got %d", opt->max_seqs);
    if (!st && opt->max_seqs > 0) st = fm_kv_state_create(ctx, opt->max_seqs, ctx->buf_tokens, &ctx->kv, err);
    if (!st && ctx->kv && opt->state_cache_slots < -1)
        st = fm_fail(err, FM_ERR_USAGE, "--state-cache-slots must be >= 0, got %d", opt->state_cache_slots);
    if (!st && ctx->kv)
        st = fm_kv_state_prefix_cache(ctx, opt->prefix_cache, fm_state_cache_slots(&m->cfg, m->n_layers, opt), err);
    if (!st && ctx->kv) fm_state_cache_option_note(&m->cfg, m->n_layers, opt);
    if (!st && ctx->kv) st = resolve_step_tokens(ctx, opt, err);
    /* experts in host memory: the expert cache comes after everything else, as the plan placed it */
    if (!st && m->experts_host) st = fm_expert_offload_create(ctx, m->expert_slots, opt->expert_policy, err);
    if (!st) fm_context_limits_reset(ctx);
    return st;
}

fm_status fm_model_load(const char *dir, const fm_options *opt, fm_model **out, fm_error *err) {
    *out = NULL;
    if ((unsigned)opt->preset >= FM_PRESET_COUNT) return fm_fail(err, FM_ERR_USAGE, "unknown preset %d", opt->preset);
    fm_model *m = fm_calloc(1, sizeof *m, err, "model");
    if (!m) return FM_ERR_NOMEM;
    fm_st_set set = {0};
    fm_model_src src = {0};
    fm_status st = fm_config_load(dir, &m->cfg, err);
    if (!st && opt->n_layers < 0) st = fm_fail(err, FM_ERR_USAGE, "--layers must be >= 0, got %d", opt->n_layers);
    if (!st && opt->n_layers > m->cfg.n_layers)
        st = fm_fail(err, FM_ERR_USAGE, "--layers %d is more than the model's %d layers", opt->n_layers,
                     m->cfg.n_layers);
    if (!st) st = fm_st_open_dir(dir, &set, err);
    if (!st) st = fm_model_src_bind(&m->cfg, &set, &src, err);
    if (!st) st = fm_model_build(m, &src, opt, err);
    fm_model_src_free(&src);
    fm_st_close(&set); /* the backend holds its own copy of every weight */
    if (st) {
        fm_model_free(m);
        return st;
    }
    *out = m;
    return FM_OK;
}

void fm_model_free(fm_model *m) {
    if (!m) return;
    fm_backend *be = m->be;
    fm_context *ctx = m->context;
    if (be && ctx) {
        fm_expert_offload_free(ctx);
        fm_kv_state_free(ctx, ctx->kv);
        fm_forward_buffers_free(ctx);
    }
    free(ctx);
    if (be) {
        void (*del)(fm_backend *, fm_bank *) = be->ops->bank_free;
        if (m->lm_head && m->lm_head != m->embed) del(be, m->lm_head);
        if (m->embed) del(be, m->embed);
        if (m->final_norm) del(be, m->final_norm);
        for (int l = 0; m->layers && l < m->n_layers; l++) {
            for (int i = 0; i < FM_BANK_COUNT; i++)
                if (m->layers[l].bank[i]) del(be, m->layers[l].bank[i]);
        }
        be->ops->destroy(be);
    }
    free(m->layers);
    free(m);
}
