/* fp8moe inspect --tokens: the memory plan of a backend and preset (engine/memory_plan.h), computed before anything is
 * allocated, whether it fits the GPU or a --vram-limit, and with --ep / --tp each rank's share. */
#include <stdio.h>
#include <string.h>

#include "backend/backend_kind.h"
#include "cli/inspect.h"
#include "dist/ep_moe.h"
#include "dist/rank_group.h"
#include "dist/tp_attention.h"
#include "engine/memory_plan.h"
#include "engine/state_cache.h"
#include "util/status.h"

static void plan_row(const char *what, size_t bytes, int indent) {
    printf("  %*s%-*s %12.2f %16zu\n", indent, "", 44 - indent, what, inspect_mib((double)bytes), bytes);
}

/* --ep N: what a MoE layer's two all-to-alls carry at T tokens (the plan's), by dispatch format, with uniform routing:
 * each rank sends its T / N tokens' k routed copies, (N - 1) / N of them to other ranks, and gets as many expert
 * outputs back (bf16 rows). A copy is a row of H values: bf16 2 H bytes; e4m3 H + 4 H / 128 (an fp32 scale per 128);
 * MXFP4 H / 2 + H / 32 (a UE8M0 scale per 32); NVFP4 H / 2 + H / 16 (an e4m3 scale per 16; the buffer's fp32 scale
 * aside). */
static void print_exchange_bytes(const fm_config *cfg, int64_t T, int32_t N) {
    const double H = cfg->hidden_size, copies = (double)T * cfg->n_experts_per_tok * (N - 1) / N;
    const double bf16 = 2 * H, e4m3 = H + 4 * H / 128, mx = H / 2 + H / 32, nv = H / 2 + H / 16;
    printf("  all-to-all per MoE layer at %lld tokens (uniform routing, %.0f%% of the routed copies leave their rank), "
           "all ranks together: dispatch bf16 %.2f MiB, e4m3 %.2f, MXFP4 %.2f (%.2fx e4m3), NVFP4 %.2f (%.2fx); "
           "combine (bf16) %.2f MiB\n",
           (long long)T, 100.0 * (N - 1) / N, inspect_mib(copies * bf16), inspect_mib(copies * e4m3),
           inspect_mib(copies * mx), mx / e4m3, inspect_mib(copies * nv), nv / e4m3, inspect_mib(copies * bf16));
}

/* --ep N / --tp N: what each rank holds, as the load plans it (fm_memory_plan_rank): its share of the routed experts
 * and its exchange buffers (--ep), its heads' share of the attention projections (--tp); every other weight, the
 * activations, the KV cache and the workspace are every rank's (each rank holds every token). The plan above is one
 * model's. */
static fm_status print_partition(const fm_config *cfg, const fm_plan *plan, const fm_memory_plan *p, int32_t ep,
                                 int32_t tp, fm_error *err) {
    const int32_t N = ep > tp ? ep : tp;
    const fm_status st = fm_rank_split_check(cfg, ep, tp, err);
    if (st) return st;
    printf("%s over %d ranks (one process, a rank per device; the cpu and cuda backends run the ranks in one process "
           "today, on cuda all on one GPU):\n",
           ep > 1 && tp > 1 ? "expert and tensor parallelism"
           : ep > 1         ? "expert parallelism"
                            : "tensor parallelism",
           N);
    printf("  %-6s %-16s %-16s %14s %16s %18s %13s %12s\n", "rank", "experts", "heads (q / kv)", "experts MiB",
           "attention MiB", "other weights MiB", "exchange MiB", "peak MiB");
    for (int r = 0; r < N; r++) {
        fm_memory_plan q = *p;
        const fm_status rst = fm_memory_plan_rank(&q, cfg, plan, ep, tp, r, err);
        if (rst) return rst;
        int32_t first = 0, n = cfg->n_experts, h0 = 0, nh = cfg->n_heads, kv0 = 0, nkv = cfg->n_kv_heads;
        if (ep > 1) fm_ep_expert_range(cfg->n_experts, ep, r, &first, &n);
        if (tp > 1) fm_tp_head_range(cfg->n_heads, cfg->n_kv_heads, tp, r, &h0, &nh, &kv0, &nkv);
        char range[32], heads[40];
        snprintf(range, sizeof range, "%d..%d of %d", first, first + n - 1, cfg->n_experts);
        snprintf(heads, sizeof heads, "%d..%d / %d..%d", h0, h0 + nh - 1, kv0, kv0 + nkv - 1);
        const size_t experts = q.weights[FM_MEM_EXPERTS], attn = q.weights[FM_MEM_ATTN];
        printf("  %-6d %-16s %-16s %14.2f %16.2f %18.2f %13.2f %12.2f\n", r, cfg->n_experts > 0 ? range : "-", heads,
               inspect_mib((double)experts), inspect_mib((double)attn),
               inspect_mib((double)(q.weight_total - experts - attn)), inspect_mib((double)q.ep_exchange),
               inspect_mib((double)q.peak));
    }
    if (ep > 1) print_exchange_bytes(cfg, p->tokens, ep);
    return FM_OK;
}

/* The plan the options describe: one model's (for generation too), its experts placed against --vram-limit or the GPU's
 * free memory on a device backend (no limit on the cpu) */
typedef struct planned {
    fm_config cfg;
    fm_plan plan;
    fm_memory_plan p;
    bool cuda, have_gpu, limited; /* a device backend; its device is here; --vram-limit is the smaller */
    size_t free_bytes, total, available;
    fm_error qerr; /* why the device is not here */
} planned;

static fm_status plan_options(const fm_config *cfg_in, const fm_model_src *src, const plan_args *a, planned *q,
                              fm_error *err) {
    fm_config cfg = *cfg_in;
    memset(q, 0, sizeof *q);
    cfg.quant.native_layout = src->cfg.quant.native_layout; /* found by the binder */
    /* lm_head has a bank of its own unless it is the embedding's tensor (a tied config may still ship one) */
    cfg.tie_word_embeddings = src->lm_head.t == src->embed.t && src->lm_head.offset == src->embed.offset;
    fm_plan plan;
    fm_plan_for_backend(a->preset, a->backend, &plan);
    fm_plan_set_dense(&plan, a->dense);
    fm_routes routes;
    fm_routes_default(&routes, 0);
    fm_status st = fm_plan_set_dispatch(&plan, a->dispatch, err);
    if (!st) st = fm_plan_set_lm_head(&plan, a->lm_head, err);
    if (!st) st = fm_plan_set_kv(&plan, a->kv_cache, err);
    if (!st && a->kv_cache == FM_KV_E4M3 && a->max_seqs <= 0)
        st = fm_fail(err, FM_ERR_USAGE, "--kv-cache describes generation's KV cache: give --max-seqs B");
    if (!st) st = fm_routes_apply(&routes, a->routes, err);
    fm_memory_plan p;
    if (!st) st = fm_memory_plan_compute_routes(&cfg, &plan, a->backend, &routes, a->n_layers, a->tokens, &p, err);
    const int64_t ctx = a->ctx > 0 ? a->ctx : cfg.max_position_embeddings;
    if (!st && a->max_seqs > 0 && ctx <= 0)
        st = fm_fail(err, FM_ERR_USAGE, "--max-seqs: the config has no max_position_embeddings; give --ctx N");
    if (!st && a->max_seqs > 0) st = fm_memory_plan_add_generation(&p, &cfg, &plan, a->max_seqs, ctx, err);
    if (st) return st;
    /* a hybrid model's state snapshots of the prefix cache, as many as a load takes by default */
    fm_options load_opt;
    fm_options_init(&load_opt);
    load_opt.max_seqs = a->max_seqs;
    const int32_t snaps = fm_state_cache_slots(&cfg, p.n_layers, &load_opt);
    if (snaps > 0) fm_memory_plan_add_state_cache(&p, fm_state_cache_bytes(&cfg, p.n_layers, snaps));
    /* where the experts go: against --vram-limit or the GPU's free memory on cuda, no limit on the cpu */
    size_t free_bytes = 0, total = 0;
    fm_error qerr = {{0}};
    const fm_backend_kind *kind = fm_backend_kind_find(p.backend);
    const bool cuda = kind->on_device;
    const bool have_gpu = cuda && kind->free_memory(&free_bytes, &total, &qerr) == FM_OK;
    const bool limited = cuda && a->vram_limit > 0 && (!have_gpu || (uint64_t)a->vram_limit < (uint64_t)free_bytes);
    const size_t available = limited ? (size_t)a->vram_limit : have_gpu ? free_bytes : 0;
    const char *source = limited ? "--vram-limit" : "free on the GPU";
    if ((st = fm_memory_plan_place_experts(&p, &cfg, a->experts_in, a->expert_slots, available, source, err)))
        return st;
    *q = (planned){cfg, plan, p, cuda, have_gpu, limited, free_bytes, total, available, qerr};
    return FM_OK;
}

/* the plan's rows: weights by family, buffers, workspace, KV cache, total, staging, peak, the expert cache */
static void print_table(const planned *q, const plan_args *a) {
    const fm_memory_plan p = q->p;
    const fm_plan plan = q->plan;
    const fm_config cfg = q->cfg;
    const bool cuda = q->cuda;
    printf("memory plan: backend %s, preset %s (dense %s, experts %s, other %s), %d layers, %lld tokens\n", p.backend,
           fm_preset_name(a->preset), fm_wformat_name(plan.w_dense), fm_wformat_name(plan.w_expert),
           fm_wformat_name(plan.w_other), p.n_layers, (long long)p.tokens);
    printf("  %-44s %12s %16s\n", "category", "MiB", "bytes");
    char what[96];
    snprintf(what, sizeof what, "weights (%d banks)", p.n_banks);
    plan_row(what, p.weight_total, 0);
    for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++) {
        const char *name = fm_mem_family_name((fm_mem_family)f);
        if (f == FM_MEM_LM_HEAD && cfg.tie_word_embeddings)
            name = plan.lm_head_dense ? "lm_head (the tied embeddings, quantized)" : "lm_head (tied to the embeddings)";
        char row[96]; /* the family's bank format, as the load will pick it (a checkpoint's own where it keeps one) */
        if (p.weights[f]) snprintf(row, sizeof row, "%s: %s", name, fm_wformat_name(p.formats[f]));
        else snprintf(row, sizeof row, "%s", name);
        plan_row(row, p.weights[f], 2);
    }
    snprintf(what, sizeof what, "activations (%d forward buffers)", p.n_buffers);
    plan_row(what, p.activations, 0);
    for (int i = 0; i < p.n_buffers; i++) plan_row(p.buffers[i].what, p.buffers[i].bytes, 2);
    plan_row("workspace", p.workspace, 0);
    if (cuda) {
        char scratch[96] = "ops' scratch (MoE rows, quantized inputs)";
        if (plan.w_expert == FM_W_INT4_G128_TC) /* the dispatch buffer's format sizes it (w4a8_workspace.h) */
            snprintf(scratch, sizeof scratch, "ops' scratch (W4A8 MoE dispatch, %s inputs)",
                     plan.a_dispatch == FM_A_MXFP4 || plan.a_dispatch == FM_A_NVFP4 ? fm_afmt_name(plan.a_dispatch)
                                                                                    : "e4m3");
        plan_row(scratch, p.ws_moe, 2);
        if (p.ws_side) plan_row("side stream's scratch (shared expert)", p.ws_side, 2);
        plan_row("cuBLAS and cuBLASLt workspaces", p.ws_libs, 2);
        if (p.ws_tables) plan_row("fold route's exponents, row scales", p.ws_tables, 2);
    } else {
        plan_row("linear input quantization", p.ws_linear, 2);
    }
    if (p.kv_seqs > 0) {
        snprintf(what, sizeof what, "KV cache (%d seqs x %lld tokens%s)", p.kv_seqs, (long long)p.kv_ctx,
                 plan.kv == FM_KV_E4M3 ? ", e4m3" : "");
        plan_row(what, p.kv_cache, 0);
        fm_options load_opt; /* the state snapshots a load takes by default (plan_options) */
        fm_options_init(&load_opt);
        load_opt.max_seqs = p.kv_seqs;
        const int32_t snaps = fm_state_cache_slots(&cfg, p.n_layers, &load_opt);
        if (snaps > 0) snprintf(what, sizeof what, "decode state (with %d state snapshots)", snaps);
        else snprintf(what, sizeof what, "decode state (indices, scratch, sampler)");
        plan_row(what, p.kv_state, 0);
        plan_row("total (weights + act. + workspace + KV)", p.total, 0);
    } else {
        plan_row("total (weights + activations + workspace)", p.total, 0);
    }
    plan_row(cuda ? "load staging (transient, one bank at a time)" : "load staging (transient)", p.load_staging, 0);
    plan_row("peak (what must fit)", p.peak, 0);
    if (p.experts_in == FM_EXPERTS_HOST) {
        snprintf(what, sizeof what, "expert cache (%d slots, in the peak)", p.expert_slots);
        plan_row(what, p.expert_pool, 0);
        plan_row("one slot (an expert's gate_up + down)", p.expert_slot_bytes, 2);
        snprintf(what, sizeof what, "experts in host memory (%d x %d)", p.n_moe_layers, p.n_experts);
        plan_row(what, p.host_experts, 0);
    }
}

/* where the experts are, and whether the plan fits the device */
static void print_fit(const planned *q, const plan_args *a) {
    const fm_memory_plan p = q->p;
    const bool cuda = q->cuda, have_gpu = q->have_gpu, limited = q->limited;
    const size_t free_bytes = q->free_bytes, total = q->total, available = q->available;
    char b1[32], b2[32];
    printf("experts-in: %s%s", fm_experts_in_name(p.experts_in), a->experts_in == FM_EXPERTS_AUTO ? " (auto)" : "");
    if (p.experts_in == FM_EXPERTS_HOST)
        printf(", %d slots of %s (%d experts in %d layers), %s in host memory%s", p.expert_slots,
               fm_mem_format(p.expert_slot_bytes, b1, sizeof b1), p.n_experts * p.n_moe_layers, p.n_moe_layers,
               fm_mem_format(p.host_experts, b2, sizeof b2),
               cuda && a->preset != FM_PRESET_FP8 && a->preset != FM_PRESET_FP4
                   ? " (the cuda backend keeps experts in host memory for the fp8 and fp4 presets only)"
                   : "");
    printf("\n");
    if (!cuda) {
        if (a->vram_limit > 0) printf("(--vram-limit applies to the cuda backend)\n");
        return;
    }
    if (have_gpu)
        printf("GPU: %s free of %s\n", fm_mem_format(free_bytes, b1, sizeof b1), fm_mem_format(total, b2, sizeof b2));
    else printf("GPU: not available here (%s)\n", q->qerr.msg);
    if (!have_gpu && a->vram_limit <= 0) return;
    fm_error verdict = {{0}};
    if (fm_memory_plan_check(&p, available, limited ? "--vram-limit" : "free on the GPU", &verdict) == FM_OK)
        printf("fits: yes, %s of %s available (%s)\n", fm_mem_format(p.peak, b1, sizeof b1),
               fm_mem_format(available, b2, sizeof b2), limited ? "--vram-limit" : "free on the GPU");
    else printf("fits: no: %s\n", verdict.msg);
}

/* The memory plan section: returns the status of computing it (usage errors: a bad --layers). */
fm_status inspect_print_plan(const fm_config *cfg, const fm_model_src *src, const plan_args *a, fm_error *err) {
    planned q;
    fm_status st = plan_options(cfg, src, a, &q, err);
    if (st) return st;
    print_table(&q, a);
    if ((a->ep > 1 || a->tp > 1) && (st = print_partition(&q.cfg, &q.plan, &q.p, a->ep, a->tp, err))) return st;
    print_fit(&q, a);
    return FM_OK;
}
