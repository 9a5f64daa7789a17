/* Mixed steps as CUDA graphs (route mixed.graphs): a pass over the paged cache that holds prompt chunks beside decode
 * rows (scheduler.c's mixed step) launches ~15 kernels a layer; outside a graph the host's launches leave the GPU
 * idle between the short ones (docs/RESULTS.md 2.28: 8 streams and a 64-token chunk, 9.67 -> 9.16 ms on an H100; the
 * arriving prompt's time to first token -17 %, a 64-client load's output +3.7 %). The layers'
 * launches depend on the step's row count alone (the attention finds its prompt chunks from the staged sequences and
 * positions on the device, attention_paged_tiled.cu; the MoE routes on the device), so one graph per row count serves
 * every layout of the rows. Row counts are padded to a bucket (kv_state.h fm_mixed_bucket) so that a few graphs
 * serve every step: padding rows are copies of the first row (its token, sequence and position) that store no K and
 * V, as a decode graph's are. Copies, not cheaper rows: their values equal a real row's in every layer, so a
 * per-tensor activation scale (the W8A8 dense projections' amax over the pass's rows) is the unpadded pass's, and
 * their experts are the first row's. They attend as the first row does (its position + 1 keys); the scheduler fills
 * a step's spare rows with prompt tokens where it can (scheduler.c), so few steps carry padding.
 *
 * What runs outside the graph: the staging (uploads of ids, sequences, positions, slots), the final norm and
 * lm_head of the sampled rows (whose positions in the step vary), the sampler. A bucket's first step runs its launches
 * as they are (libraries set themselves up on first use, workspaces take their size), its second captures them,
 * every later one replays. Declined (the launches as they are, unpadded): a Gated DeltaNet layer (Qwen3-Next: its
 * chunks are found on the host, forward.c gdn_rule_paged), ranks of a group (their exchanges), experts in host
 * memory (their fetches), a pass over a fresh prompt (FM_ATTN_FRESH) or above 4096 rows, the debug switches. Route
 * mixed.graphs=on pads the rows on a backend without graphs too, where the layers then run as they are: the cpu
 * tests check that the padding changes no bit of the real rows. */
#include <stdio.h>
#include <string.h>

#include "backend/routes.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "model/arch.h"
#include "util/status.h"

typedef struct layers_ctx {
    fm_context *ctx;
    int64_t T;
} layers_ctx;

/* The layers of a padded pass: the attention takes the prompt chunks' rows to its tiled kernel whatever the rows staged
 * at capture hold (route paged.tiled; the kernel finds them on the device), so the graph serves any later layout */
static fm_status layers_body(void *user, fm_error *err) {
    (void)err;
    const layers_ctx *d = user;
    d->ctx->kv->chunks_on_device = true;
    fm_step_device_layers(d->ctx, d->T, FM_ATTN_PAGED);
    d->ctx->kv->chunks_on_device = false;
    return FM_OK;
}

/* The bucket a paged pass of T rows is padded to (and replays where the backend has graphs), its rows in *rows; -1
 * where the pass runs as it is. Route mixed.graphs=on pads on a backend without graphs too (the cpu tests'). */
static int32_t graph_bucket(const fm_context *ctx, int64_t T, fm_attn_mode attn, int64_t *rows) {
    const fm_model *m = ctx->m;
    const fm_kv_state *kv = ctx->kv;
    if (attn != FM_ATTN_PAGED || !fm_routes_mixed_graphs(&m->routes)) return -1;
    if (!fm_decode_graphs_on(ctx) && !fm_routes_mixed_pad_always(&m->routes)) return -1;
    if (ctx->ep_comm || ctx->tp_comm || ctx->experts) return -1;
    if (fm_arch_attention_layers(&m->cfg, m->n_layers) != m->n_layers) return -1;
    const int32_t b = fm_mixed_bucket(T, rows);
    if (b < 0 || *rows > kv->max_rows || *rows > ctx->buf_tokens || kv->mixed_graphs_failed) return -1;
    return b;
}

fm_status fm_step_run_rows(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                           const fm_row_run *runs, int32_t n_runs, fm_attn_mode attn, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache (fm_options.max_seqs = 0)");
    int64_t Tb = T;
    const int32_t b = T >= 1 ? graph_bucket(ctx, T, attn, &Tb) : -1;
    if (b < 0) {
        fm_status st = fm_step_stage(ctx, ids, seq, pos, T, err);
        if (!st) fm_step_device_rows(ctx, T, runs, n_runs, attn);
        return st;
    }
    int32_t *p_ids = kv->h_pad, *p_seq = p_ids + kv->max_rows, *p_pos = p_seq + kv->max_rows;
    memcpy(p_ids, ids, (size_t)T * sizeof *ids);
    memcpy(p_seq, seq, (size_t)T * sizeof *seq);
    memcpy(p_pos, pos, (size_t)T * sizeof *pos);
    for (int64_t t = T; t < Tb; t++) p_ids[t] = ids[0], p_seq[t] = seq[0], p_pos[t] = pos[0];
    fm_status st = fm_step_stage_padded(ctx, p_ids, p_seq, p_pos, Tb, T, err);
    if (st) return st;
    layers_ctx d = {ctx, Tb};
    kv->mixed_padded_steps++;
    if (!kv->mixed_warm[b] || !fm_decode_graphs_on(ctx)) {
        layers_body(&d, err);
        kv->mixed_warm[b] = true;
    } else if (!kv->mixed_graphs[b] && m->be->ops->graph_capture(m->be, layers_body, &d, &kv->mixed_graphs[b], err)) {
        /* a capture that fails (a launch the backend cannot capture at this size) recorded the launches into nothing:
           they run as they are, and this context's mixed steps run without graphs from here on (said once) */
        fprintf(stderr, "fp8moe: mixed steps run without CUDA graphs from here on (route mixed.graphs): %s\n",
                err ? err->msg : "the capture failed");
        kv->mixed_graphs_failed = true;
        layers_body(&d, err);
    } else {
        if ((st = m->be->ops->graph_launch(m->be, kv->mixed_graphs[b], err))) return st;
        kv->mixed_graph_steps++;
    }
    fm_step_device_tail(ctx, runs, n_runs);
    return FM_OK;
}

int64_t fm_step_rows_padded(const fm_context *ctx, int64_t T) {
    int64_t rows = T;
    return ctx->kv && T >= 1 && graph_bucket(ctx, T, FM_ATTN_PAGED, &rows) >= 0 ? rows : T;
}

bool fm_mixed_graph_nodes(const fm_context *ctx, int64_t T, fm_graph_nodes *out) {
    const fm_model *m = ctx->m;
    memset(out, 0, sizeof *out);
    int64_t rows = 0;
    if (!ctx->kv || !m->be->ops->graph_nodes) return false;
    const int32_t b = graph_bucket(ctx, T, FM_ATTN_PAGED, &rows);
    if (b < 0 || !ctx->kv->mixed_graphs[b]) return false; /* (none on a backend without graphs) */
    m->be->ops->graph_nodes(m->be, ctx->kv->mixed_graphs[b], out);
    return true;
}
