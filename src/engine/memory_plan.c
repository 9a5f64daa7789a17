/* The memory plan (memory_plan.h): bank, buffer and scratch sizes computed from shapes alone.
 *
 * Which banks, buffers and scratch a load makes are listed here; what each takes on a backend is its kind's
 * (backend/backend_kind.h: bank bytes, staging, workspace, the expert cache's own memory), which restates the
 * backend's allocations:
 *   which banks     add_weights: the architecture's description (model/arch.h), bank for bank as model.c loads it
 *   their formats   fm_weight_format (engine/weight_format.h), which the load picks with too
 *   activations     fm_forward_buffer_list: the one list, which src/engine/forward.c (alloc_buffers) allocates
 * tests/test_memory_plan.c compares the weights with the CPU backend's bank bytes after a real load;
 * tests/gpu/test_cuda_memory.c with the CUDA backend's and with the device's used memory. */
#include "engine/memory_plan.h"
#include "engine/kv_state.h"
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_kind.h"
#include "backend/size_math.h"
#include "engine/weight_format.h"
#include "util/status.h"

const char *fm_mem_family_name(fm_mem_family f) {
    switch (f) {
    case FM_MEM_EMBED: return "embeddings";
    case FM_MEM_LM_HEAD: return "lm_head";
    case FM_MEM_NORMS: return "norms";
    case FM_MEM_ATTN: return "attention (qkv + o)";
    case FM_MEM_ROUTER: return "router";
    case FM_MEM_EXPERTS: return "experts (gate_up + down)";
    case FM_MEM_DENSE_MLP: return "dense MLP (gate_up + down)";
    case FM_MEM_FAMILY_COUNT: break;
    }
    return "?";
}

/* Checked size arithmetic (backend/size_math.h) */
typedef fm_sz sz;
static uint64_t mul(sz *s, uint64_t a, uint64_t b) { return fm_sz_mul(s, a, b); }
static uint64_t add(sz *s, uint64_t a, uint64_t b) { return fm_sz_add(s, a, b); }
static size_t to_size(const sz *s, uint64_t v) { return fm_sz_size(s, v); }
/* a size the kinds computed: SIZE_MAX is their overflow */
static size_t checked(sz *s, size_t v) {
    if (v == SIZE_MAX) s->ovf = true;
    return v;
}

size_t fm_bank_bytes_int4zp(const char *backend, bool fp8_plan, int32_t n, int64_t rows, int64_t cols, int64_t group,
                            bool act_order) {
    const fm_backend_kind *kind = fm_backend_kind_find(backend);
    return kind ? kind->bank_bytes_int4zp(fp8_plan, n, rows, cols, group, act_order) : 0;
}

/* A pre-quantized bank bound natively (our own int4-g128 in the checkpoint) is the plan's int4 bank, byte for byte,
 * so the plan's format counts it exactly. */
size_t fm_bank_bytes_for(const char *backend, fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    const fm_backend_kind *kind = fm_backend_kind_find(backend);
    return kind ? kind->bank_bytes(fmt, n, rows, cols) : 0;
}

size_t fm_act_size_for(const char *backend, const fm_plan *plan) {
    const fm_backend_kind *kind = fm_backend_kind_find(backend);
    return kind ? kind->act_size(plan) : 4;
}

typedef struct planner {
    fm_memory_plan *p;
    const fm_backend_kind *kind;
    sz s;
    fm_error *err;
    const fm_quant_config *quant; /* the checkpoint's pre-quantization (method NONE: a float checkpoint) */
    const fm_plan *plan;
    const fm_routes *routes; /* cuda: the route table (the W4A8 MoE tile rows) */
} planner;

static size_t bank_bytes(const planner *pl, fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    if (!fm_wformat_is_int4zp(fmt)) return pl->kind->bank_bytes(fmt, n, rows, cols);
    const int64_t group = pl->quant->group_size > 0 ? pl->quant->group_size : cols; /* -1: per output channel */
    /* int4-zp-tc is the fp8 plans' (e4m3 1x128 activations); an act-order checkpoint keeps an order per matrix on the
       int4 preset (fp8 refuses non-identity orders) */
    const bool fp8_plan = fmt == FM_W_INT4_ZP_TC;
    return pl->kind->bank_bytes_int4zp(fp8_plan, n, rows, cols, group, pl->quant->act_order && !fp8_plan);
}

/* A bank of a description's family `wf` (memory family fam): its format as the load will pick it (engine/
 * weight_format.h, from what the configuration says of the checkpoint: the linears its ignore list leaves in float are
 * counted quantized, and act orders that the load refuses under the fp8 plans are not known here), then its bytes. */
static fm_status bank_size(const planner *pl, fm_wfamily wf, int32_t n, int64_t rows, int64_t cols, const char *what,
                           fm_wformat *fmt, size_t *bytes) {
    fm_bank_origin o;
    fm_bank_origin_of_config(pl->quant, cols, &o);
    if (wf == FM_WF_LM_HEAD) o.quantized = o.fp8_block = false; /* quantized checkpoints keep their lm_head float */
    fm_status st = fm_weight_format(pl->plan, pl->kind, wf, &o, what, fmt, NULL, pl->err);
    if (st) return st;
    *bytes = bank_bytes(pl, *fmt, n, rows, cols);
    if (*bytes == 0)
        return fm_fail(pl->err, FM_ERR_UNSUPPORTED, "%s: weight format %s is not available on the %s backend", what,
                       fm_wformat_name(*fmt), pl->kind->name);
    if (*bytes == SIZE_MAX)
        return fm_fail(pl->err, FM_ERR_FORMAT, "%s: [%d][%lld, %lld] is too large to address", what, n, (long long)rows,
                       (long long)cols);
    return FM_OK;
}

static fm_status bank(planner *pl, fm_mem_family fam, fm_wfamily wf, int32_t n, int64_t rows, int64_t cols,
                      const char *what) {
    fm_memory_plan *p = pl->p;
    fm_wformat fmt;
    size_t bytes;
    const fm_status st = bank_size(pl, wf, n, rows, cols, what, &fmt, &bytes);
    if (st) return st;
    p->weights[fam] = to_size(&pl->s, add(&pl->s, p->weights[fam], bytes));
    p->formats[fam] = fmt;
    p->n_banks++;
    p->n_weight_allocs +=
        fm_wformat_is_int4(fmt) || fmt == FM_W_E4M3_PT || fm_wformat_is_int4zp(fmt) || fmt == FM_W_E4M3_B128
            ? 2
            : 1; /* values; scales apart */
    /* transient while the bank is built */
    const size_t staging = checked(&pl->s, pl->kind->bank_staging(fmt, n, rows, cols));
    if (staging > p->load_staging) p->load_staging = staging;
    return FM_OK;
}

/* the memory plan's family of a description's weight family */
static fm_mem_family mem_family(fm_wfamily f) {
    switch (f) {
    case FM_WF_NORM: return FM_MEM_NORMS;
    case FM_WF_ATTN: return FM_MEM_ATTN;
    case FM_WF_ROUTER: return FM_MEM_ROUTER;
    case FM_WF_EXPERTS: return FM_MEM_EXPERTS;
    case FM_WF_LM_HEAD: return FM_MEM_LM_HEAD;
    case FM_WF_DENSE_MLP:
    case FM_WF_COUNT: break;
    }
    return FM_MEM_DENSE_MLP;
}

/* model.c: load_weights + load_layer, bank for bank (the layers' banks from their descriptions) */
static fm_status add_weights(planner *pl, const fm_config *c) {
    const int64_t V = c->vocab_size, H = c->hidden_size;
    fm_status st;
    if ((st = bank(pl, FM_MEM_EMBED, FM_WF_NORM, 1, V, H, "embed_tokens")) ||
        (st = bank(pl, FM_MEM_NORMS, FM_WF_NORM, 1, 1, H, "final norm")))
        return st;
    /* a bank of its own unless tied and kept as the embedding's (--lm-head dense quantizes a copy) */
    if ((!c->tie_word_embeddings || pl->plan->lm_head_dense) &&
        (st = bank(pl, FM_MEM_LM_HEAD, FM_WF_LM_HEAD, 1, V, H, "lm_head")))
        return st;
    const fm_arch_desc *a = fm_arch_of(c);
    int32_t first_moe = -1;
    for (int32_t l = 0; l < pl->p->n_layers; l++) {
        pl->p->n_moe_layers += c->layer_is_moe[l];
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *w = &d->specs[i];
            if (!fm_spec_present(w, c)) continue;
            const int32_t n = fm_spec_count(w, c);
            const int64_t rows = fm_spec_rows(w, c), cols = fm_spec_cols(w, c);
            const fm_mem_family fam = mem_family(w->family);
            const size_t before = pl->p->weights[fam];
            st = bank(pl, fam, w->family, n, rows, cols, w->label);
            /* a slot of the expert cache: one matrix of each expert bank of a layer (bank bytes are n x a matrix's in
               every layout) */
            if (!st && w->family == FM_WF_EXPERTS && n > 0 && (first_moe < 0 || first_moe == l)) {
                first_moe = l;
                pl->p->expert_slot_bytes += (pl->p->weights[fam] - before) / (size_t)n;
                pl->p->n_experts = n;
            }
            if (st) return st;
        }
    }
    return FM_OK;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The one list of the forward pass's activation buffers: forward.c allocates these, in this order */
int32_t fm_forward_buffer_list(const fm_config *c, size_t act, int64_t tokens, fm_mem_item *out, bool *overflow) {
    sz st = {false}, *s = &st;
    const uint64_t a = act, T = (uint64_t)tokens;
    const uint64_t H = (uint64_t)c->hidden_size, hd = (uint64_t)c->head_dim;
    const uint64_t att = (uint64_t)c->n_heads * hd;
    /* Qwen3-Next: gated attention's q_proj (query | gate), a Gated DeltaNet's projections, conv and rule outputs;
       0 where the configuration has none of them */
    bool gdn = false;
    for (int32_t l = 0; l < c->n_layers; l++) gdn |= c->layer_is_gdn[l];
    const fm_gdn_shape g = fm_gdn_shape_of(c);
    const uint64_t gdn_qkvz = gdn ? (uint64_t)fm_gdn_qkvz_width(g) : 0, gdn_c = gdn ? (uint64_t)fm_gdn_channels(g) : 0;
    const uint64_t gdn_v = gdn ? (uint64_t)g.nv * (uint64_t)g.dv : 0;
    const uint64_t qg = c->attn_output_gate ? (uint64_t)(2 * c->n_heads + 2 * c->n_kv_heads) * hd : 0;
    const uint64_t proj = qg > gdn_qkvz ? qg : gdn_qkvz;
    uint64_t gates = c->attn_output_gate ? att : 0;
    gates = gdn && 2 * (uint64_t)g.nv > gates ? 2 * (uint64_t)g.nv : gates;
    const uint64_t qkv0 = (uint64_t)(c->n_heads + 2 * c->n_kv_heads) * hd, qkv = qkv0 > gdn_c ? qkv0 : gdn_c;
    const uint64_t att_out = att > gdn_v ? att : gdn_v;
    const uint64_t I =
        (uint64_t)max64(max64(c->moe_intermediate, c->dense_intermediate), c->shared_expert_intermediate);
    const uint64_t E = c->n_experts > 0 ? (uint64_t)c->n_experts : 1;
    const uint64_t k = c->n_experts_per_tok > 0 ? (uint64_t)c->n_experts_per_tok : 1;
    const struct {
        const char *what;
        uint64_t elems, size;
    } want[FM_FORWARD_N_BUFFERS] = {
        {"ids", T, sizeof(int32_t)},
        {"residual", mul(s, T, H), a},
        {"normed", mul(s, T, H), a},
        {"qkv", mul(s, T, qkv), a},
        {"attention out", mul(s, T, att_out), a},
        {"block out", mul(s, T, H), a},
        {"gate_up", mul(s, T, mul(s, 2, I)), a},
        {"swiglu", mul(s, T, I), a},
        {"router logits", mul(s, T, E), a},
        {"expert ids", mul(s, T, k), sizeof(int32_t)},
        {"expert weights", mul(s, T, k), a},
        {"logits", mul(s, T, (uint64_t)c->vocab_size), a},
        {"input projection", mul(s, T, proj), a},
        {"gates", mul(s, T, gates), a},
        {"shared expert out", mul(s, T, c->shared_expert_intermediate > 0 ? H : 0), a},
        /* router_moe's out_q for the next layer's first projection; a Gated DeltaNet's gated norm's for its out
           projection */
        {"normed, quantized", fm_qrows_bytes(tokens, max64(c->hidden_size, (int64_t)gdn_v)), 1},
    };
    for (int32_t i = 0; i < FM_FORWARD_N_BUFFERS; i++)
        out[i] = (fm_mem_item){want[i].what, to_size(s, mul(s, want[i].elems, want[i].size))};
    *overflow = st.ovf;
    return FM_FORWARD_N_BUFFERS;
}

static void add_activations(planner *pl, const fm_config *c, const fm_plan *plan) {
    fm_memory_plan *p = pl->p;
    bool ovf = false;
    p->n_buffers = fm_forward_buffer_list(c, fm_act_size_for(p->backend, plan), p->tokens, p->buffers, &ovf);
    pl->s.ovf |= ovf;
    for (int32_t i = 0; i < p->n_buffers; i++)
        p->activations = to_size(&pl->s, add(&pl->s, p->activations, p->buffers[i].bytes));
}

static void add_workspace(planner *pl, const fm_config *c, const fm_plan *plan) {
    fm_memory_plan *p = pl->p;
    fm_backend_ws ws;
    pl->kind->workspace(c, plan, pl->routes, p->n_layers, p->tokens, &ws);
    pl->s.ovf |= ws.overflow;
    p->ws_moe = ws.moe, p->ws_side = ws.side, p->ws_libs = ws.libs, p->ws_linear = ws.linear, p->ws_tables = ws.tables;
    sz *s = &pl->s;
    p->workspace =
        to_size(s, add(s, add(s, add(s, add(s, p->ws_moe, p->ws_side), p->ws_libs), p->ws_linear), p->ws_tables));
}

fm_status fm_memory_bank_bytes(const fm_config *cfg, const fm_plan *plan, const char *backend, fm_wfamily wf, int32_t n,
                               int64_t rows, int64_t cols, const char *what, size_t *out, fm_error *err) {
    *out = 0;
    const fm_backend_kind *kind;
    fm_status st = fm_backend_kind_get(backend, "memory plan", &kind, err);
    if (st) return st;
    const planner pl = {NULL, kind, {false}, err, &cfg->quant, plan, NULL};
    fm_wformat fmt;
    return bank_size(&pl, wf, n, rows, cols, what, &fmt, out);
}

fm_status fm_memory_plan_compute(const fm_config *cfg, const fm_plan *plan, const char *backend, int32_t n_layers,
                                 int64_t tokens, fm_memory_plan *out, fm_error *err) {
    return fm_memory_plan_compute_routes(cfg, plan, backend, NULL, n_layers, tokens, out, err);
}

fm_status fm_memory_plan_compute_routes(const fm_config *cfg, const fm_plan *plan, const char *backend,
                                        const fm_routes *routes, int32_t n_layers, int64_t tokens, fm_memory_plan *out,
                                        fm_error *err) {
    memset(out, 0, sizeof *out);
    const fm_backend_kind *kind;
    fm_status kst = fm_backend_kind_get(backend, "memory plan", &kind, err);
    if (kst) return kst;
    if (n_layers < 0 || n_layers > cfg->n_layers)
        return fm_fail(err, FM_ERR_USAGE, "memory plan: %d layers asked of a model with %d", n_layers, cfg->n_layers);
    if (tokens < 1) return fm_fail(err, FM_ERR_USAGE, "memory plan: tokens must be >= 1, got %lld", (long long)tokens);
    out->backend = kind->name;
    out->n_layers = n_layers > 0 ? n_layers : cfg->n_layers;
    out->ep_ranks = out->tp_ranks = 1;
    out->tokens = tokens;
    fm_routes defaults;
    /* Hopper's tile rule: where it takes 32-row tiles other GPUs take 64, whose tile list is shorter, so the plan
       holds for every GPU */
    fm_routes_default(&defaults, 9);
    planner pl = {out, kind, {false}, err, &cfg->quant, plan, routes ? routes : &defaults};
    out->expert_prefetch = fm_routes_expert_prefetch(pl.routes, 1);
    fm_status st = add_weights(&pl, cfg);
    if (st) {
        memset(out, 0, sizeof *out);
        return st;
    }
    for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++)
        out->weight_total = to_size(&pl.s, add(&pl.s, out->weight_total, out->weights[f]));
    add_activations(&pl, cfg, plan);
    add_workspace(&pl, cfg, plan);
    const size_t run = to_size(&pl.s, add(&pl.s, out->activations, out->workspace));
    out->total = to_size(&pl.s, add(&pl.s, out->weight_total, run));
    out->peak = to_size(&pl.s, add(&pl.s, out->weight_total, run > out->load_staging ? run : out->load_staging));
    if (pl.s.ovf) {
        memset(out, 0, sizeof *out);
        return fm_fail(err, FM_ERR_FORMAT, "memory plan: the sizes for %lld tokens overflow 64 bits",
                       (long long)tokens);
    }
    return FM_OK;
}

fm_status fm_memory_plan_add_generation(fm_memory_plan *p, const fm_config *cfg, const fm_plan *plan, int32_t max_seqs,
                                        int64_t ctx, fm_error *err) {
    size_t cache = 0, state = 0;
    const fm_backend_kind *kind = fm_backend_kind_find(p->backend);
    const size_t row = (size_t)fm_kv_row_bytes_as(kind && kind->kv_e4m3_codes, fm_act_size_for(p->backend, plan),
                                                  cfg->n_kv_heads, cfg->head_dim, plan->kv);
    fm_status st = fm_kv_state_plan(cfg, p->n_layers, row, max_seqs, ctx, p->tokens, &cache, &state, err);
    if (st) return st;
    p->kv_seqs = max_seqs, p->kv_ctx = ctx, p->kv_cache = cache, p->kv_state = state;
    const size_t run = p->activations + p->workspace + cache + state + p->ep_exchange;
    p->total = p->weight_total + run;
    p->peak = p->weight_total + (run > p->load_staging ? run : p->load_staging);
    return FM_OK;
}

void fm_memory_plan_add_state_cache(fm_memory_plan *p, size_t bytes) {
    p->kv_state += bytes;
    const size_t run = p->activations + p->workspace + p->kv_cache + p->kv_state + p->ep_exchange;
    p->total = p->weight_total + run;
    p->peak = p->weight_total + (run > p->load_staging ? run : p->load_staging);
}

void fm_expert_prefetch_layout_of(const fm_config *cfg, int64_t tokens, fm_expert_prefetch_layout *out) {
    const size_t R = (size_t)(tokens < FM_EXPERT_PREFETCH_MAX_T ? tokens : FM_EXPERT_PREFETCH_MAX_T);
#define A256(b) (((b) + 255) / 256 * 256)
    out->h = 0;
    out->logits = out->h + A256(R * (size_t)cfg->hidden_size * 4);
    out->ids = out->logits + A256(R * (size_t)cfg->n_experts * 4);
    out->w = out->ids + A256(R * (size_t)cfg->n_experts_per_tok * 4);
    out->total = out->w + A256(R * (size_t)cfg->n_experts_per_tok * 4);
#undef A256
}

fm_status fm_memory_plan_place_experts(fm_memory_plan *p, const fm_config *cfg, fm_experts_in where, int32_t slots,
                                       size_t available, const char *source, fm_error *err) {
    p->experts_in = FM_EXPERTS_DEVICE;
    if (slots < 0) return fm_fail(err, FM_ERR_USAGE, "--expert-slots must be >= 0, got %d", slots);
    if ((unsigned)where > FM_EXPERTS_AUTO) return fm_fail(err, FM_ERR_USAGE, "unknown --experts-in value %d", where);
    if (where == FM_EXPERTS_DEVICE) return FM_OK;
    if (where == FM_EXPERTS_AUTO && (available == 0 || p->peak <= available)) return FM_OK;
    if (p->n_moe_layers == 0 || p->n_experts == 0 || p->expert_slot_bytes == 0)
        return fm_fail(err, FM_ERR_USAGE, "--experts-in host: the model has no routed experts in its %d layers",
                       p->n_layers);
    sz s = {false};
    const fm_backend_kind *kind = fm_backend_kind_find(p->backend);
    if (!kind) return fm_fail(err, FM_ERR_USAGE, "memory plan: unknown backend '%s'", p->backend);
    /* the cache's own memory besides its slots (its table or its slot ids), for every expert as slots at most */
    const int32_t E = p->n_experts, all = p->n_moe_layers * E;
    fm_expert_prefetch_layout pf;
    fm_expert_prefetch_layout_of(cfg, p->tokens, &pf);
    const size_t own = to_size(
        &s, add(&s, checked(&s, kind->expert_cache_bytes(p->n_layers, E, all, p->tokens, cfg->n_experts_per_tok)),
                pf.total));
    /* the prefetch runs on the side stream (forward.c), which the plan may not have made yet */
    if (kind->side_stream_libs && p->expert_prefetch && p->ws_side == 0) {
        p->ws_side = FM_SIDE_WS_MIN;
        p->ws_libs += kind->side_stream_libs;
        p->workspace = to_size(&s, add(&s, p->workspace, FM_SIDE_WS_MIN + kind->side_stream_libs));
    }
    /* everything but the experts: what the cache comes after */
    p->host_experts = p->weights[FM_MEM_EXPERTS];
    p->weight_total -= p->weights[FM_MEM_EXPERTS];
    p->weights[FM_MEM_EXPERTS] = 0;
    /* a backend that builds each expert bank on the device, then moves it to host memory: one layer's banks (both at
       most: a layer's experts, E slots) beside the staging the bank's build takes */
    if (kind->host_experts_built_on_device)
        p->load_staging = to_size(&s, add(&s, p->load_staging, mul(&s, (uint64_t)E, p->expert_slot_bytes)));
    const size_t run = p->activations + p->workspace + p->kv_cache + p->kv_state + p->ep_exchange;
    /* the pool is allocated after the banks are loaded (their staging freed): it shares the run's side of the peak */
    const size_t rest = p->weight_total + run + own;
    const bool staging_fits = p->weight_total + p->load_staging <= available;
    int64_t S = slots;
    if (S == 0 && available == 0) S = all;
    else if (S == 0) S = staging_fits && available > rest ? (int64_t)((available - rest) / p->expert_slot_bytes) : 0;
    if (S > all) S = all;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    if (S < E) {
        if (slots > 0)
            return fm_fail(err, FM_ERR_USAGE,
                           "--expert-slots %d is fewer than one layer's %d experts: a prefill of one layer may route "
                           "to every expert, and the cache must hold them all at once (%d slots of %s = %s)",
                           slots, E, E, fm_mem_format(p->expert_slot_bytes, b1, sizeof b1),
                           fm_mem_format(p->expert_slot_bytes * (size_t)E, b2, sizeof b2));
        return fm_fail(err, FM_ERR_NOMEM,
                       "experts in host memory: the expert cache needs at least %d slots (one layer's experts: a "
                       "prefill may route to all of them) of %s each = %s, but %s (%s) leaves %s after the rest (%s: "
                       "weights without the experts, activations, workspace%s%s); that fits %lld slots",
                       E, fm_mem_format(p->expert_slot_bytes, b1, sizeof b1),
                       fm_mem_format(p->expert_slot_bytes * (size_t)E, b2, sizeof b2),
                       fm_mem_format(available, b3, sizeof b3), source ? source : "the limit",
                       fm_mem_format(staging_fits && available > rest ? available - rest : 0, b4, sizeof b4),
                       fm_mem_format(staging_fits ? rest : p->weight_total + p->load_staging, b5, sizeof b5),
                       p->kv_seqs > 0 ? ", KV cache, decode state" : "", staging_fits ? "" : "; the load staging",
                       (long long)S);
    }
    p->experts_in = FM_EXPERTS_HOST;
    p->expert_slots = (int32_t)S;
    p->expert_pool = to_size(&s, add(&s, mul(&s, (uint64_t)S, p->expert_slot_bytes), own));
    const size_t with_pool = to_size(&s, add(&s, run, p->expert_pool));
    p->total = to_size(&s, add(&s, p->weight_total, with_pool));
    p->peak = to_size(&s, add(&s, p->weight_total, with_pool > p->load_staging ? with_pool : p->load_staging));
    if (s.ovf) return fm_fail(err, FM_ERR_FORMAT, "memory plan: the expert cache's sizes overflow 64 bits");
    return FM_OK;
}

const char *fm_mem_format(size_t bytes, char *buf, size_t cap) {
    const double b = (double)bytes;
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(buf, cap, "%.1f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%zu bytes", bytes);
    return buf;
}

fm_status fm_memory_plan_check(const fm_memory_plan *p, size_t available, const char *source, fm_error *err) {
    if (p->peak <= available) return FM_OK;
    char need[32], avail[32], w[32], a[32], ws[32], stg[32], exact[64] = "";
    fm_mem_format(p->peak, need, sizeof need);
    fm_mem_format(available, avail, sizeof avail);
    if (strcmp(need, avail) == 0) snprintf(exact, sizeof exact, " (%zu > %zu bytes)", p->peak, available);
    fm_mem_format(p->weight_total, w, sizeof w);
    const size_t run = p->activations + p->workspace + p->kv_cache + p->kv_state + p->expert_pool + p->ep_exchange;
    char kv[256] = "";
    if (p->kv_seqs > 0) {
        char c1[32], c2[32];
        snprintf(kv, sizeof kv, ", KV cache %s for %d sequences of %lld tokens (--max-seqs, --ctx), decode state %s",
                 fm_mem_format(p->kv_cache, c1, sizeof c1), p->kv_seqs, (long long)p->kv_ctx,
                 fm_mem_format(p->kv_state, c2, sizeof c2));
    }
    if (p->experts_in == FM_EXPERTS_HOST) {
        char c1[32];
        const size_t used = strlen(kv);
        snprintf(kv + used, sizeof kv - used, ", expert cache %s (%d slots, --expert-slots)",
                 fm_mem_format(p->expert_pool, c1, sizeof c1), p->expert_slots);
    }
    if (run >= p->load_staging)
        return fm_fail(err, FM_ERR_NOMEM,
                       "model needs %s on %s (weights %s, activations %s, workspace %s for %lld tokens%s) but %s is "
                       "available (%s)%s",
                       need, p->backend, w, fm_mem_format(p->activations, a, sizeof a),
                       fm_mem_format(p->workspace, ws, sizeof ws), (long long)p->tokens, kv, avail, source, exact);
    return fm_fail(err, FM_ERR_NOMEM, "model needs %s on %s (weights %s, load staging %s) but %s is available (%s)%s",
                   need, p->backend, w, fm_mem_format(p->load_staging, stg, sizeof stg), avail, source, exact);
}
