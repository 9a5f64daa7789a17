/* The forward pass (prefill over positions 0..T-1), written once against the backend op table.
 *
 *   x = embed(ids)                                                  [T, H]
 *   per layer:  h = rmsnorm(x);  qkv = h Wqkv^T;  qk_norm + RoPE;  a = attention(qkv);  x += a Wo^T
 *                 (Qwen3-Next: gated attention, a *= sigmoid(gate), partial RoPE; or a Gated DeltaNet, gated_deltanet)
 *               h = rmsnorm(x);  MoE: route(h Wr^T) -> x += sum_k w_k expert_k(h)
 *                                     (Qwen3-Next: + sigmoid(h Ws^T) shared_expert(h))
 *                                dense: x += down(swiglu(h Wgu^T))
 *   (each residual add and the RMSNorm after it run as one op, add_rmsnorm)
 *   logits = rmsnorm(x) Wlm^T                                       [T, vocab]
 *
 * In three steps (engine.h): the ids staged into their device buffer, the device work (capturable into a CUDA
 * graph: launches only, every buffer from the load-time plan), the collection (sync, logits download).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ep_moe.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_plan.h"
#include "engine/op_bytes.h"
#include "quant/bf16.h"
#include "util/status.h"

/* The activation buffers of a forward pass of up to ctx->buf_tokens tokens: allocated once, at load, from the
 * memory plan's list (fm_forward_buffer_list, in this order), and reused by every call. */
typedef struct fw_buffers {
    void *ids, *x, *h, *qkv, *att, *y, *gu, *act, *rlogits, *eids, *ew, *logits;
    void *proj, *gates, *shared; /* Qwen3-Next (NULL for other models): q_proj or in_proj_qkvz out, the attention
                                    gate or in_proj_ba out, the shared expert's out */
    void *hq; /* h's rows quantized by the MoE block that wrote them (fm_qrows; dense.quant=producer) */
} fw_buffers;

static void free_buffers(fm_backend *be, fw_buffers *b) {
    void **p = (void **)b;
    for (size_t i = 0; i < sizeof *b / sizeof(void *); i++)
        if (p[i]) be->ops->free(be, p[i]);
}

_Static_assert(sizeof(fw_buffers) == FM_FORWARD_N_BUFFERS * sizeof(void *),
               "fw_buffers holds the memory plan's forward buffers (fm_forward_buffer_list), in its order");

static fm_status alloc_buffers(fm_context *ctx, int64_t T, fw_buffers *b, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    fm_mem_item want[FM_FORWARD_N_BUFFERS];
    bool overflow = false; /* a size that overflows is SIZE_MAX: no allocation takes it */
    fm_forward_buffer_list(&m->cfg, be->ops->act_size, T, want, &overflow);
    void **p = (void **)b;
    for (int32_t i = 0; i < FM_FORWARD_N_BUFFERS; i++)
        if (want[i].bytes > 0 && (want[i].bytes == SIZE_MAX || !(p[i] = be->ops->alloc(be, want[i].bytes))))
            return fm_fail(err, FM_ERR_NOMEM, "out of %s memory for the %s buffer (%zu bytes, %lld tokens)",
                           be->ops->name, want[i].what, want[i].bytes, (long long)T);
    return FM_OK;
}

/* FP8MOE_DUMP=1: after each op, a one-line summary of its output (for finding the first op that goes wrong). It
 * downloads, so it synchronises: a debug switch, not for a captured pass. */
static void dump(fm_backend *be, const char *what, int layer, const void *buf, int64_t n) {
    static int enabled = -1;
    if (enabled < 0) enabled = getenv("FP8MOE_DUMP") && strcmp(getenv("FP8MOE_DUMP"), "0") != 0;
    if (!enabled) return;
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return;
    be->ops->download_f32(be, buf, n, h);
    double sum = 0, mx = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(h[i])) {
            bad++;
            continue;
        }
        sum += fabs(h[i]);
        mx = fabs(h[i]) > mx ? fabs(h[i]) : mx;
    }
    fprintf(stderr, "dump layer %2d %-14s n %-9lld mean|x| %-12.5g max|x| %-12.5g nonfinite %lld  x[0..2] %g %g %g\n",
            layer, what, (long long)n, sum / (double)n, mx, (long long)bad, h[0], n > 1 ? h[1] : 0.0f,
            n > 2 ? h[2] : 0.0f);
    free(h);
}

/* Once, at load: the activation buffers and the backend's scratch for T tokens, both from the memory plan. A forward
 * pass then allocates nothing, on any backend. */
/* Expert parallelism's buffers (dist/ep_moe.h), sized once for the most tokens a pass takes: the blocks of both
 * all-to-alls, this rank's share of the layer output and every rank's (gathered). A rank routes share P = ceil(T / N)
 * of the T tokens every rank holds; a pass's blocks are sized for its own P (a decode step's are small), within
 * these. */
typedef struct fm_ep_state {
    fm_ep_buffers b;
    void *share, *all; /* [P][H], [N][P][H] activations */
} fm_ep_state;

static void ep_free(fm_context *ctx) {
    const fm_model *m = ctx->m;
    fm_ep_state *ep = ctx->ep;
    if (!ep) return;
    fm_ep_buffers_free(m->be, &ep->b);
    if (ep->share) m->be->ops->free(m->be, ep->share);
    if (ep->all) m->be->ops->free(m->be, ep->all);
    free(ep);
    ctx->ep = NULL;
}

static fm_status ep_reserve(fm_context *ctx, int64_t T, fm_error *err) {
    const fm_model *m = ctx->m;
    const int32_t N = m->ep_ranks;
    const int64_t P = (T + N - 1) / N, H = m->cfg.hidden_size;
    const size_t as = m->be->ops->act_size;
    fm_ep_state *ep = fm_calloc(1, sizeof *ep, err, "expert-parallel state");
    if (!ep) return FM_ERR_NOMEM;
    ctx->ep = ep;
    fm_ep_layout L;
    fm_status st = fm_ep_layout_of(m->cfg.n_experts, N, P, m->cfg.n_experts_per_tok, H, m->plan.a_dispatch,
                                   m->plan.act_bf16, &L, err);
    if (!st) st = fm_ep_buffers_alloc(m->be, &L, &ep->b, err);
    if (!st && (!(ep->share = m->be->ops->alloc(m->be, (size_t)(P * H) * as)) ||
                !(ep->all = m->be->ops->alloc(m->be, (size_t)(N * P * H) * as))))
        st = fm_fail(err, FM_ERR_NOMEM, "expert parallelism: out of %s memory for the layer output (%d x %lld rows)",
                     m->be->ops->name, N, (long long)P);
    if (st) ep_free(ctx);
    return st;
}

fm_status fm_forward_reserve(fm_context *ctx, int64_t T, fm_error *err) {
    const fm_model *m = ctx->m;
    if (ctx->bufs)
        return fm_fail(err, FM_ERR_USAGE, "the forward buffers are already reserved (%lld tokens)",
                       (long long)ctx->buf_tokens);
    if (T < 1) return fm_fail(err, FM_ERR_USAGE, "max_tokens must be >= 1, got %lld", (long long)T);
    fw_buffers *b = calloc(1, sizeof *b);
    if (!b) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    fm_status st = alloc_buffers(ctx, T, b, err);
    if (st) {
        free_buffers(m->be, b);
        free(b);
        return st;
    }
    ctx->bufs = b, ctx->buf_tokens = T;
    if (m->ep_ranks > 1 && (st = ep_reserve(ctx, T, err))) return st;
    if (!m->be->ops->reserve) return FM_OK;
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = m->lm_head == m->embed; /* as bound */
    fm_memory_plan plan;
    st = fm_memory_plan_compute_routes(&cfg, &m->plan, m->be->ops->name, &m->routes, m->n_layers, T, &plan, err);
    /* a rank of a group: its scratch with the received blocks of expert parallelism */
    if (!st && (m->ep_ranks > 1 || m->tp_ranks > 1))
        st = fm_memory_plan_rank(&plan, &cfg, &m->plan, m->ep_ranks, m->tp_ranks,
                                 m->ep_ranks > 1 ? m->ep_rank : m->tp_rank, err);
    /* experts in host memory: the expert prefetch runs on the side stream (as memory_plan.c places the experts) */
    const size_t side = plan.ws_side ? plan.ws_side : m->experts_host && plan.expert_prefetch ? FM_SIDE_WS_MIN : 0;
    if (!st) st = m->be->ops->reserve(m->be, plan.ws_moe, side, err);
    return st;
}

void fm_forward_buffers_free(fm_context *ctx) {
    const fm_model *m = ctx->m;
    ep_free(ctx);
    if (!ctx->bufs) return;
    free_buffers(m->be, ctx->bufs);
    free(ctx->bufs);
    ctx->bufs = NULL, ctx->buf_tokens = 0;
}

const char *fm_stage_name(fm_stage st) {
    static const char *const names[FM_STAGE_COUNT] = {"attention projections", "attention", "gated deltanet", "routing",
                                                      "expert fetch",          "experts",   "other"};
    return (unsigned)st < FM_STAGE_COUNT ? names[st] : "?";
}

/* Stage timing: a mark after each group of ops; the interval since the previous mark belongs to `stage`. With
 * per_op (the per-op profile) a mark also follows every op inside a group, and each interval is one op: its label,
 * the kind of block it ran in and its bytes (op_bytes below). */
typedef struct fw_timer {
    fm_backend *be;
    bool on, per_op;
    int32_t n;                       /* marks recorded */
    uint8_t stage_of[FM_MARK_SLOTS]; /* stage of the interval ending at mark i */
    const char *kind;                /* the block now issuing ops ("attention", "moe", ...) */
    const char *op_of[FM_MARK_SLOTS], *kind_of[FM_MARK_SLOTS];
    double bytes_of[FM_MARK_SLOTS];
} fw_timer;

static void mark_at(fw_timer *tm, fm_stage stage, const char *op, double bytes) {
    if (!tm->on || tm->n >= FM_MARK_SLOTS) return;
    if (tm->per_op && !op) return; /* an empty interval: the op before closed it */
    tm->stage_of[tm->n] = (uint8_t)stage;
    tm->op_of[tm->n] = op, tm->kind_of[tm->n] = tm->kind, tm->bytes_of[tm->n] = bytes;
    tm->be->ops->mark(tm->be, tm->n++);
}

/* Macros, not functions, so that the bytes expression is evaluated in the per-op profile only: the normal pass
 * (tm NULL) computes nothing. op_mark closes a stage group (op names its last op, its only one in the per-op
 * profile); op_split marks between two ops of a group, in the per-op profile only. */
#define op_mark(tm, stage, op, bytes) ((tm) ? mark_at((tm), (stage), (op), (tm)->per_op ? (bytes) : 0) : (void)0)
#define op_split(tm, stage, op, bytes) ((tm) && (tm)->per_op ? mark_at((tm), (stage), (op), (bytes)) : (void)0)

static void tick(fw_timer *tm, fm_stage stage) { op_mark(tm, stage, "start", 0); }

static void collect(const fw_timer *tm, fm_profile *prof) {
    memset(prof, 0, sizeof *prof);
    for (int32_t i = 1; i < tm->n; i++) prof->stage_ms[tm->stage_of[i]] += tm->be->ops->elapsed_ms(tm->be, i - 1, i);
    if (tm->n > 1) prof->total_ms = tm->be->ops->elapsed_ms(tm->be, 0, tm->n - 1);
}

/* the per-op profile: the intervals summed by (kind, op), in the order they first ran */
static fm_status collect_ops(const fw_timer *tm, fm_op_profile *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    for (int32_t i = 1; i < tm->n; i++) {
        int32_t r = 0;
        while (r < out->n && (strcmp(out->rows[r].op, tm->op_of[i]) || strcmp(out->rows[r].kind, tm->kind_of[i]))) r++;
        if (r == FM_OP_ROWS) return fm_fail(err, FM_ERR_UNSUPPORTED, "per-op profile: more than %d ops", FM_OP_ROWS);
        if (r == out->n) out->rows[out->n++] = (fm_op_row){.kind = tm->kind_of[i], .op = tm->op_of[i]};
        fm_op_row *row = &out->rows[r];
        row->count++, row->bytes += tm->bytes_of[i];
        row->ms += tm->be->ops->elapsed_ms(tm->be, i - 1, i);
        out->step_bytes += tm->bytes_of[i];
    }
    if (tm->n > 1) out->step_ms = tm->be->ops->elapsed_ms(tm->be, 0, tm->n - 1);
    return FM_OK;
}

/* The one refusal of a forward pass: a prompt longer than the load planned for. Growing the buffers here instead would
 * make the device memory depend on the input (the plan that checked the card would no longer hold) and would
 * allocate inside the pass (no CUDA graph could hold it); the caller knows its prompt before loading (the CLI
 * commands set max_tokens to it), so it asks for the right plan there. */
/* a rank of a group runs only with the others (its experts or heads are a share) */
static fm_status check_not_lone_rank(const fm_context *ctx, fm_error *err) {
    const fm_model *m = ctx->m;
    if ((m->ep_ranks > 1 && !ctx->ep_comm) || (m->tp_ranks > 1 && !ctx->tp_comm))
        return fm_fail(err, FM_ERR_USAGE,
                       "the model holds rank %d's share of a group of %d ranks: it runs in its group "
                       "(fm_rank_group_forward)",
                       m->ep_ranks > 1 ? m->ep_rank : m->tp_rank, m->ep_ranks > 1 ? m->ep_ranks : m->tp_ranks);
    return FM_OK;
}

fm_status fm_forward_stage(fm_context *ctx, const int32_t *ids, int64_t T, fm_error *err) {
    const fm_model *m = ctx->m;
    if (T < 1) return fm_fail(err, FM_ERR_USAGE, "forward pass: no tokens to run (%lld)", (long long)T);
    fm_status lone = check_not_lone_rank(ctx, err);
    if (lone) return lone;
    if (!ctx->bufs || T > ctx->buf_tokens)
        return fm_fail(err, FM_ERR_USAGE,
                       "prompt of %lld tokens is longer than the %lld tokens the model was loaded for; load it with "
                       "max_tokens >= %lld (fm_options.max_tokens)",
                       (long long)T, (long long)ctx->buf_tokens, (long long)T);
    if (T > ctx->n_tokens)
        return fm_fail(err, FM_ERR_USAGE,
                       "prompt of %lld tokens is longer than the %lld tokens of the context's passes "
                       "(fm_context_params.max_tokens)",
                       (long long)T, (long long)ctx->n_tokens);
    m->be->ops->upload_ids(m->be, ids, T, ctx->bufs->ids);
    return FM_OK;
}

/* The delta rule over rows [r0, r0 + n) of a pass over the paged cache, as a call's own rows: by the chunked form (one
 * run of a sequence, from its state) or token by token. */
static void gdn_rule_rows(fm_context *ctx, const fm_layer_weights *L, fm_gdn_shape g, float *rec, int64_t r0, int64_t n,
                          bool chunked) {
    fm_backend *be = ctx->m->be;
    const fm_backend_ops *ops = be->ops;
    const fw_buffers b = *ctx->bufs;
    const fm_kv_state *kv = ctx->kv;
    const size_t as = ops->act_size, r = (size_t)r0;
    const void *qkv = (const char *)b.qkv + r * (size_t)fm_gdn_channels(g) * as;
    const void *ba = (const char *)b.gates + r * 2 * (size_t)g.nv * as;
    const void *seq = (const int32_t *)kv->tok_seq + r, *pos = (const int32_t *)kv->tok_pos + r;
    void *out = (char *)b.att + r * (size_t)g.nv * (size_t)g.dv * as;
    if (chunked) ops->gdn_chunked(be, qkv, ba, L->gdn_a_log, L->gdn_dt_bias, n, g, rec, seq, pos, out);
    else ops->gdn_recurrent(be, qkv, ba, L->gdn_a_log, L->gdn_dt_bias, n, g, rec, seq, pos, out);
}

/* The delta rule of a pass over the paged cache (prompt chunks, mixed steps), from the conv's b.qkv to b.att: each
 * prompt chunk of the step (a run of at least two rows of one sequence at consecutive positions, found in the staged
 * host copy h_idx) by the chunked form from its sequence's state, as a whole prompt runs; the other rows (decode
 * rows) token by token; in row order, so a sequence's rows are taken in order whatever the step holds. Token by token,
 * a 512-token chunk is 512 dependent steps per layer (~2.8 us each on an H200: bench/NOTES.md 2026-12-02, "Qwen3-Next
 * speed", 72.5 ms for 3 layers at T = 8192); chunked, 8 chunks of 64 on tensor cores. Returns the runs taken chunked;
 * *states: the matrix states read and written (one per chunk, one per other row). */
static int32_t gdn_rule_paged(fm_context *ctx, const fm_layer_weights *L, int64_t T, fm_gdn_shape g, float *rec,
                              int64_t *states) {
    const int32_t *seq = ctx->kv->h_idx, *pos = ctx->kv->h_idx + T;
    int32_t runs = 0;
    int64_t lone = 0, rows = 0; /* rows [lone, t) go token by token; rows: those taken chunked */
    for (int64_t t = 0; t < T;) {
        int64_t e = t + 1;
        while (e < T && seq[e] == seq[t] && pos[e] == pos[e - 1] + 1) e++;
        if (e - t >= 2) {
            if (t > lone) gdn_rule_rows(ctx, L, g, rec, lone, t - lone, false);
            gdn_rule_rows(ctx, L, g, rec, t, e - t, true);
            lone = e, runs++, rows += e - t;
        }
        t = e;
    }
    if (T > lone) gdn_rule_rows(ctx, L, g, rec, lone, T - lone, false);
    *states = runs + (T - rows);
    return runs;
}

/* A Gated DeltaNet layer's token mixer (Qwen3-Next's linear attention), from the normed b.h to b.y:
 *   qkvz = h Wqkvz^T, ba = h Wba^T;  conv + SiLU over the q | k | v channels (the conv state per sequence);
 *   the gated delta rule (chunked over a whole prompt and over each prompt chunk of a step, from its sequence's
 *   state; token by token for decode rows);
 *   gated RMSNorm with z;  y = out Wout^T
 * gdn: the layer's index among the Gated DeltaNet layers (its slice of the states). h_rows: b.hq holds b.h's rows
 * quantized by the previous layer's MoE block (route dense.quant=producer), for the qkvz projection. */
static void gated_deltanet(fm_context *ctx, const fm_layer_weights *L, int l, int64_t T, fm_attn_mode attn, int32_t gdn,
                           bool h_rows, fw_timer *tm) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    const fw_buffers b = *ctx->bufs;
    const fm_gdn_shape g = fm_gdn_shape_of(c);
    const fm_kv_state *kv = ctx->kv;
    const bool cached = attn != FM_ATTN_NO_CACHE;
    float *conv = cached ? (float *)kv->gdn_conv + (size_t)gdn * kv->pool.max_seqs * fm_gdn_conv_state_elems(g) : NULL;
    float *rec = cached ? (float *)kv->gdn_rec + (size_t)gdn * kv->pool.max_seqs * fm_gdn_rec_state_elems(g) : NULL;
    const int64_t H = c->hidden_size, nvdv = (int64_t)g.nv * g.dv;
    const bool fused = attn == FM_ATTN_DECODE && ops->gdn_decode_fused && fm_routes_fused_gdn(&m->routes);
    /* route gdn.decode_ba: the fused op computes the ba projection itself (b.gates its scratch) */
    const bool ba_in_op = fused && fm_routes_gdn_decode_ba(&m->routes);
    const double ba_bytes = fm_op_bytes_linear(m, L->gdn_ba, T, H, 2 * (int64_t)g.nv);
    if (h_rows) ops->linear_rows(be, L->gdn_qkvz, 0, b.h, b.hq, T, m->plan.a_dense, b.proj);
    else ops->linear(be, L->gdn_qkvz, 0, b.h, T, m->plan.a_dense, b.proj);
    if (!ba_in_op) ops->linear(be, L->gdn_ba, 0, b.h, T, FM_A_NATIVE, b.gates);
    op_mark(tm, FM_STAGE_ATTN_PROJ, ba_in_op ? "in_proj (qkvz)" : "in_proj (qkvz, ba)",
            fm_op_bytes_linear(m, L->gdn_qkvz, T, H, fm_gdn_qkvz_width(g)) + (ba_in_op ? 0.0 : ba_bytes));
    /* route dense.quant=producer: the gated norm's kernel also quantizes its rows for the out projection (b.hq: the
       qkvz projection above has read the rows it held) */
    const bool out_rows = ops->linear_rows && fm_routes_dense_quant_producer(&m->routes) &&
                          m->plan.a_dense == FM_A_E4M3_G128 && ops->act_size == 2;
    void *out_q = out_rows ? b.hq : NULL;
    if (fused) {
        /* route gdn.decode_fused: the conv, the rule and the gated norm of a decode step's rows as one op */
        ops->gdn_decode_fused(be, b.proj, b.gates, ba_in_op ? L->gdn_ba : NULL, b.h, L->gdn_conv, L->gdn_a_log,
                              L->gdn_dt_bias, L->gdn_norm, T, g, c->rms_norm_eps, conv, rec, kv->tok_seq, kv->tok_pos,
                              b.qkv, b.att, b.qkv, out_q);
        dump(be, "gdn_decode", l, b.qkv, T * nvdv);
        op_mark(tm, FM_STAGE_GDN, ba_in_op ? "ba+conv+rule+gated norm" : "conv+rule+gated norm",
                fm_op_bytes_gdn_decode_fused(m, l, T) + (ba_in_op ? ba_bytes : 0.0));
    } else {
        const bool paged = attn == FM_ATTN_PAGED || attn == FM_ATTN_DECODE;
        ops->gdn_conv(be, b.proj, L->gdn_conv, T, g, conv, cached ? kv->tok_seq : NULL, cached ? kv->tok_pos : NULL,
                      b.qkv);
        dump(be, "gdn_conv", l, b.qkv, T * fm_gdn_channels(g));
        op_split(tm, FM_STAGE_GDN, "conv", fm_op_bytes_gdn_conv(m, l, T, cached));
        int32_t chunked = 1;             /* runs taken by the chunked form */
        int64_t states = cached ? 1 : 0; /* matrix states read and written */
        if (attn == FM_ATTN_DECODE) {    /* one row per sequence */
            ops->gdn_recurrent(be, b.qkv, b.gates, L->gdn_a_log, L->gdn_dt_bias, T, g, rec, kv->tok_seq, kv->tok_pos,
                               b.att);
            chunked = 0, states = T;
        } else if (paged) {
            chunked = gdn_rule_paged(ctx, L, T, g, rec, &states);
        } else {
            ops->gdn_chunked(be, b.qkv, b.gates, L->gdn_a_log, L->gdn_dt_bias, T, g, rec, cached ? kv->tok_seq : NULL,
                             cached ? kv->tok_pos : NULL, b.att);
        }
        op_split(tm, FM_STAGE_GDN, chunked ? "delta rule (chunked)" : "delta rule", fm_op_bytes_gdn_rule(m, T, states));
        ops->gdn_norm_gate(be, b.att, b.proj, L->gdn_norm, T, g, c->rms_norm_eps, b.qkv, out_q);
        dump(be, "gdn_rule", l, b.qkv, T * nvdv);
        op_mark(tm, FM_STAGE_GDN, "gated norm", fm_op_bytes_act(m, T, nvdv, 2, 1));
    }
    if (out_rows) ops->linear_rows(be, L->gdn_out, 0, b.qkv, b.hq, T, m->plan.a_dense, b.y);
    else ops->linear(be, L->gdn_out, 0, b.qkv, T, m->plan.a_dense, b.y);
    op_mark(tm, FM_STAGE_ATTN_PROJ, "out_proj", fm_op_bytes_linear(m, L->gdn_out, T, nvdv, H));
}

/* Tensor parallelism (ctx->tp_comm): y [n] holds this rank's partial o projection (its heads' columns); the all-reduce
 * sums the ranks' partials in rank order in fp32 (the same bits on every rank), rounded to the activation dtype as the
 * single-rank projection's output is: bf16 buffers (cuda) by the collective, fp32 ones holding bf16 values (the cpu
 * backend's bf16 plans) after it. A failure is kept as expert_parallel_moe's is. */
static void tensor_parallel_sum(fm_context *ctx, void *y, int64_t n) {
    const fm_model *m = ctx->m;
    if (ctx->dist_status) return;
    fm_error e = {{0}};
    const bool bf16_buffers = m->be->ops->act_size == 2;
    const fm_status st = fm_comm_all_reduce_sum(ctx->tp_comm, y, n, bf16_buffers ? FM_COMM_BF16 : FM_COMM_F32, &e);
    if (st) ctx->dist_status = st, ctx->dist_err = e;
    else if (m->plan.act_bf16 && !bf16_buffers) fm_round_bf16_array((float *)y, n);
}

/* The staged step (h_idx: T sequence ids, then T positions) holds a run: two neighbouring rows of one sequence at
 * consecutive positions, i.e. a prompt chunk (a decode graph's padding rows repeat row 0's position: not a run). A
 * step without one, every decode step among them, keeps attention_paged as it is under route paged.tiled. */
static bool step_has_run(const int32_t *h_idx, int64_t T) {
    const int32_t *seq = h_idx, *pos = h_idx + T;
    for (int64_t t = 0; t + 1 < T; t++)
        if (seq[t + 1] == seq[t] && pos[t + 1] == pos[t] + 1) return true;
    return false;
}

/* Route attn.persistent: a decode step's attention block for one token, through the next norm, as one op where the
 * backend takes it (true: b.x holds the residual and b.h the normed row, as after add_rmsnorm) */
static bool attention_block(fm_context *ctx, const fm_layer_weights *L, int64_t T, fm_attn_mode attn, int32_t n_attn,
                            fw_timer *tm) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    fm_backend *be = m->be;
    if (attn != FM_ATTN_DECODE || T != 1 || c->attn_output_gate || ctx->tp_comm || !be->ops->attention_block ||
        !fm_routes_attn_persistent(&m->routes))
        return false;
    const fw_buffers b = *ctx->bufs;
    const fm_kv_state *kv = ctx->kv;
    const int32_t nh = m->tp_nh, nkv = m->tp_nkv, hd = c->head_dim;
    const int64_t H = c->hidden_size;
    char *kl = (char *)kv->k + (size_t)n_attn * (size_t)kv->layer_bytes;
    char *vl = (char *)kv->v + (size_t)n_attn * (size_t)kv->layer_bytes;
    if (!be->ops->attention_block(be, L->qkv, L->o, b.h, m->plan.a_dense, nh, nkv, hd, L->q_norm, L->k_norm,
                                  c->rms_norm_eps, kv->tok_pos, c->rope_theta, kv->slots, kl, vl, kv->dtype,
                                  kv->tok_seq, kv->tables, kv->pool.max_blocks, kv->pool.block_tokens, kv->pool.ctx,
                                  kv->att_scratch, b.qkv, b.att, b.y, b.x, L->ffn_norm, c->rms_norm_eps, b.h))
        return false;
    op_mark(tm, FM_STAGE_ATTENTION, "attention block (qkv .. add_norm)",
            fm_op_bytes_linear(m, L->qkv, T, H, (nh + 2 * (int64_t)nkv) * hd) +
                fm_op_bytes_attention(m, T, kv->h_idx + T) + fm_op_bytes_linear(m, L->o, T, (int64_t)nh * hd, H) +
                fm_op_bytes_act(m, T, H, 2, 2));
    return true;
}

/* A layer's attention, from the normed b.h to b.y: q|k|v projection, q/k norm + RoPE (Qwen3-Next: the query/gate
 * split and partial RoPE), attention (contiguous, or over the paged KV cache, whose layer slice is n_attn: the
 * layer's index among the attention layers), the output gate (Qwen3-Next), o_proj (fused_o: left to the
 * caller, or run with the residual add and the norm, returning true: route dense.quant=producer). h_rows: b.hq holds
 * b.h's rows quantized by the op that wrote them (route dense.quant=producer), for the q|k|v projection. */
static bool attention_mixer(fm_context *ctx, const fm_layer_weights *L, int l, int64_t T, fm_attn_mode attn,
                            int32_t n_attn, bool fused_o, bool h_rows, fw_timer *tm) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    const fm_plan *p = &m->plan;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    const int64_t H = c->hidden_size;
    const int32_t nh = m->tp_nh, nkv = m->tp_nkv, hd = c->head_dim; /* this rank's heads (--tp), else all */
    const int64_t nqkv = T * (nh + 2 * nkv) * hd;
    const fw_buffers b = *ctx->bufs;
    const fm_kv_state *kv = ctx->kv;
    const bool paged = attn == FM_ATTN_PAGED || attn == FM_ATTN_DECODE;
    if (h_rows) ops->linear_rows(be, L->qkv, 0, b.h, b.hq, T, p->a_dense, c->attn_output_gate ? b.proj : b.qkv);
    else ops->linear(be, L->qkv, 0, b.h, T, p->a_dense, c->attn_output_gate ? b.proj : b.qkv);
    if (c->attn_output_gate) dump(be, "q|gate,k,v", l, b.proj, T * (2 * nh + 2 * nkv) * hd);
    else dump(be, "qkv", l, b.qkv, nqkv);
    const int64_t n_proj = (c->attn_output_gate ? 2 * nh + 2 * nkv : nh + 2 * nkv) * hd; /* q_proj's width */
    op_mark(tm, FM_STAGE_ATTN_PROJ, "qkv_proj", fm_op_bytes_linear(m, L->qkv, T, H, n_proj));
    char *kl = NULL, *vl = NULL; /* the layer's slices of the paged KV cache */
    if (attn != FM_ATTN_NO_CACHE) {
        kl = (char *)kv->k + (size_t)n_attn * (size_t)kv->layer_bytes;
        vl = (char *)kv->v + (size_t)n_attn * (size_t)kv->layer_bytes;
    }
    /* the k and v stored by the RoPE kernel itself (route rope.store), else by kv_store after it */
    const bool store_in_rope =
        kl && !c->attn_output_gate && ops->qk_norm_rope_store && fm_routes_rope_store(&m->routes);
    if (c->attn_output_gate) /* Qwen3-Next: q_proj's rows hold each head's query and gate; partial RoPE */
        ops->gated_qk_norm_rope(be, b.proj, T, nh, nkv, hd, c->rotary_dim, L->q_norm, L->k_norm, c->rms_norm_eps, 0,
                                attn == FM_ATTN_NO_CACHE ? NULL : kv->tok_pos, c->rope_theta, b.qkv, b.gates);
    else if (store_in_rope)
        ops->qk_norm_rope_store(be, b.qkv, T, nh, nkv, hd, L->q_norm, L->k_norm, c->rms_norm_eps, kv->tok_pos,
                                c->rope_theta, kv->slots, kl, vl, kv->dtype);
    else
        ops->qk_norm_rope(be, b.qkv, T, nh, nkv, hd, L->q_norm, L->k_norm, c->rms_norm_eps, 0,
                          attn == FM_ATTN_NO_CACHE ? NULL : kv->tok_pos, c->rope_theta);
    dump(be, "qk_norm_rope", l, b.qkv, nqkv);
    const int64_t kv_w = 2 * (int64_t)nkv * hd; /* a row's k and v */
    if (c->attn_output_gate)                    /* the q|gate rows in, q (with k, v) and the gate out */
        op_split(tm, FM_STAGE_ATTENTION, "qk_norm_rope (gated)",
                 fm_op_bytes_act(m, T, n_proj, 1, 0) + fm_op_bytes_act(m, T, (nh + 2 * nkv + nh) * (int64_t)hd, 0, 1));
    else if (store_in_rope) /* q and k read and written, v read, k and v stored */
        op_split(tm, FM_STAGE_ATTENTION, "qk_norm_rope+kv_store",
                 fm_op_bytes_act(m, T, (nh + nkv) * (int64_t)hd, 1, 1) + fm_op_bytes_act(m, T, kv_w, 0, 1) +
                     fm_op_bytes_act(m, T, nkv * (int64_t)hd, 1, 0));
    else op_split(tm, FM_STAGE_ATTENTION, "qk_norm_rope", fm_op_bytes_act(m, T, (nh + nkv) * (int64_t)hd, 1, 1));
    /* route dense.quant=producer: o_proj ran in the attention's op (with the add and norm if fused_o) */
    bool o_done = false;
    if (kl) {
        if (!store_in_rope) {
            ops->kv_store(be, b.qkv, T, nh, nkv, hd, kv->slots, kl, vl, kv->dtype);
            op_split(tm, FM_STAGE_ATTENTION, "kv_store", fm_op_bytes_act(m, T, kv_w, 1, 1));
        }
        if (paged) {
            const bool runs = attn == FM_ATTN_PAGED && fm_routes_attention_paged_tiled(&m->routes) &&
                              (kv->chunks_on_device || step_has_run(kv->h_idx, T));
            o_done =
                !c->attn_output_gate && !ctx->tp_comm && ops->attention_paged_o &&
                fm_routes_dense_quant_producer(&m->routes) &&
                ops->attention_paged_o(be, runs, b.qkv, T, nh, nkv, hd, kl, vl, kv->dtype, kv->tok_seq, kv->tok_pos,
                                       kv->tables, kv->pool.max_blocks, kv->pool.block_tokens, kv->pool.ctx,
                                       kv->att_scratch, b.att, L->o, p->a_dense, b.y, fused_o ? b.x : NULL,
                                       fused_o ? L->ffn_norm : NULL, c->rms_norm_eps, fused_o ? b.h : NULL);
            if (!o_done)
                (runs ? ops->attention_paged_runs : ops->attention_paged)(
                    be, b.qkv, T, nh, nkv, hd, kl, vl, kv->dtype, kv->tok_seq, kv->tok_pos, kv->tables,
                    kv->pool.max_blocks, kv->pool.block_tokens, kv->pool.ctx, kv->att_scratch, b.att);
        }
    }
    if (!paged) ops->attention(be, b.qkv, T, nh, nkv, hd, b.att);
    /* the K and V read: each row's up to its position in the paged cache, the pass's own rows otherwise */
    const int32_t *pos = paged ? kv->h_idx + T : NULL;
    if (o_done) { /* one op: its time is the attention's, o_proj's bytes with it */
        dump(be, "attention", l, b.att, T * nh * hd);
        dump(be, "o_proj", l, b.y, T * H);
        op_mark(tm, FM_STAGE_ATTENTION, fused_o ? "attention+o_proj+add_norm" : "attention+o_proj",
                fm_op_bytes_attention(m, T, pos) + fm_op_bytes_act(m, T, (int64_t)nh * hd, 0, 1) +
                    fm_op_bytes_linear(m, L->o, T, (int64_t)nh * hd, H) +
                    (fused_o ? fm_op_bytes_act(m, T, H, 1, 2) : 0));
        return fused_o;
    }
    op_split(tm, FM_STAGE_ATTENTION, "attention", fm_op_bytes_attention(m, T, pos));
    if (c->attn_output_gate) ops->sigmoid_mul(be, b.att, b.gates, T * nh * hd);
    dump(be, "attention", l, b.att, T * nh * hd);
    op_mark(tm, FM_STAGE_ATTENTION, c->attn_output_gate ? "output gate" : NULL,
            fm_op_bytes_act(m, T, (int64_t)nh * hd, 2, 1));
    if (fused_o) return false; /* run_device runs o_proj with the residual add and the norm after it (decode.fused) */
    ops->linear(be, L->o, 0, b.att, T, p->a_dense, b.y);
    if (ctx->tp_comm) tensor_parallel_sum(ctx, b.y, T * H); /* each rank's heads' share of o_proj, summed */
    dump(be, "o_proj", l, b.y, T * H);
    op_mark(tm, FM_STAGE_ATTN_PROJ, "o_proj", fm_op_bytes_linear(m, L->o, T, (int64_t)nh * hd, H));
    return false;
}

/* Expert parallelism (ctx->ep_comm). Every rank holds every token; rank r routes its share of the rows, [r P, (r + 1)
 * P) with P = ceil(T / N), through the dispatch and combine all-to-alls (dist/ep_moe.h: the same bits as one rank
 * running every expert), then the ranks gather every share, so each holds the whole layer output. Either every
 * rank's exchanges succeed or every rank's fail (ep_moe.h): the first failure is kept in dist_status, and the later
 * layers skip the exchanges on every rank alike. */
static void expert_parallel_moe(fm_context *ctx, const fm_layer_weights *L, int64_t T, const fw_buffers *b) {
    const fm_model *m = ctx->m;
    if (ctx->dist_status) return;
    fm_backend *be = m->be;
    const fm_ep_state *ep = ctx->ep;
    const int N = fm_comm_size(ctx->ep_comm), r = fm_comm_rank(ctx->ep_comm);
    const int64_t H = m->cfg.hidden_size, P = (T + N - 1) / N, r0 = T < r * P ? T : r * P;
    const int64_t Tr = (T < r0 + P ? T : r0 + P) - r0;
    const int32_t k = m->cfg.n_experts_per_tok;
    const size_t as = be->ops->act_size, row = (size_t)H * as;
    fm_error e = {{0}};
    fm_ep_stats stats = {.with_rows = false};
    fm_ep_layout lay; /* every rank passes the same T: the same blocks */
    fm_status st = fm_ep_layout_of(m->cfg.n_experts, N, P, k, H, m->plan.a_dispatch, m->plan.act_bf16, &lay, &e);
    if (!st)
        st = fm_ep_moe(ctx->ep_comm, be, &lay, &ep->b, L->gate_up, L->down, (const char *)b->h + (size_t)r0 * row, Tr,
                       (const int32_t *)b->eids + r0 * k, (const char *)b->ew + (size_t)(r0 * k) * as, ep->share,
                       &stats, &e);
    if (!st) ctx->ep_bytes_dispatch += stats.bytes_dispatch, ctx->ep_bytes_combine += stats.bytes_combine;
    if (!st) st = fm_comm_all_gather(ctx->ep_comm, ep->share, ep->all, (size_t)P * row, &e);
    if (!st) be->ops->copy(be, ep->all, (size_t)T * row, b->y);
    if (st) ctx->dist_status = st, ctx->dist_err = e;
}

/* Qwen3-Next's shared expert up to its gate: b.shared = down(swiglu(h Wgu^T)) */
static void shared_expert(fm_context *ctx, const fm_layer_weights *L, int64_t T) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    const fw_buffers b = *ctx->bufs;
    be->ops->linear(be, L->shared_gate_up, 0, b.h, T, m->plan.a_dense, b.gu);
    be->ops->swiglu(be, b.gu, T, m->cfg.shared_expert_intermediate, b.act);
    be->ops->linear(be, L->shared_down, 0, b.act, T, m->plan.a_dense, b.shared);
}

/* The device work of a forward pass over the staged ids up to the last layer's residual stream in b.x: launches only,
 * in stream order (tm may be NULL). attn: how attention runs (engine.h, fm_attn_mode); with the KV cache, positions,
 * sequences and slots are the staged ones. */
static void run_layers(fm_context *ctx, int64_t T, fm_attn_mode attn, fw_timer *tm) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    const fm_plan *p = &m->plan;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    const int64_t H = c->hidden_size;
    const fw_buffers b = *ctx->bufs;
    if (tm) tm->kind = "step";
    tick(tm, FM_STAGE_OTHER);
    ops->embed(be, m->embed, b.ids, T, b.x);
    dump(be, "embed", -1, b.x, T * H);
    op_split(tm, FM_STAGE_OTHER, "embed", fm_op_bytes_embed(m, T));
    int32_t n_attn = 0, n_gdn = 0; /* attention and Gated DeltaNet layers so far: their cache and state slices */
    bool h_rows = false;           /* b.hq holds b.h's rows, quantized by the previous layer's MoE block */
    for (int l = 0; l < m->n_layers; l++) {
        const fm_layer_weights *L = &m->layers[l];
        const bool rows_in = h_rows;
        h_rows = false;
        const bool gdn = fm_layer_kind_is_gdn(L->kind);
        if (tm) tm->kind = gdn ? "deltanet" : "attention";
        /* experts in host memory: the layer's experts predicted from the stream entering it, copied on the side
           chain while the token mixer runs */
        const bool prefetch = fm_moe_prefetch_on(ctx, l, T);
        if (prefetch) fm_moe_prefetch(ctx, l, b.x, T);
        if (l == 0) ops->rmsnorm(be, b.x, L->attn_norm, T, H, c->rms_norm_eps, b.h); /* later: fused below */
        dump(be, "attn_norm", l, b.h, T * H);
        /* later layers: the previous layer's add_norm (below) closed the interval */
        op_mark(tm, FM_STAGE_OTHER, l == 0 ? "attn_norm" : NULL, fm_op_bytes_act(m, T, H, 1, 1));
        /* route decode.fused: o_proj, the residual add and the ffn norm in one op */
        const bool fused_o = !fm_layer_kind_is_gdn(L->kind) && !ctx->tp_comm && ops->linear_add_rmsnorm &&
                             fm_routes_fused_o_proj(&m->routes);
        /* route attn.persistent: the attention block through the norm in one op; route dense.quant=producer with
           decode.fused: the attention through o_proj's add and norm */
        bool block = false;
        if (gdn) gated_deltanet(ctx, L, l, T, attn, n_gdn++, rows_in, tm);
        else if (attention_block(ctx, L, T, attn, n_attn, tm)) n_attn++, block = true;
        else block = attention_mixer(ctx, L, l, T, attn, n_attn++, fused_o, rows_in, tm);
        const double add_norm_bytes = fm_op_bytes_act(m, T, H, 2, 2); /* x and y in, x and h out */
        /* route decode.fused: the MoE block's combine, the residual add and the next layer's norm in one op */
        const bool fuse_tail = L->is_moe && !ctx->ep_comm && !L->shared_gate_up && l + 1 < m->n_layers &&
                               ops->moe_add_rmsnorm && fm_routes_fused_moe_tail(&m->routes, T);
        /* route moe.dispatch=fused: the router and the experts in one op (its launch dispatches the rows); route
           moe.persistent at T = 1: the whole block in one launch where the backend takes it; the bank's own ids
           only (no expert parallelism, no experts in host memory) */
        const bool router_moe =
            L->is_moe && ops->router_moe && !ctx->ep_comm && !ctx->experts &&
            (fm_routes_moe_dispatch_fused(&m->routes) || (T == 1 && fuse_tail && fm_routes_moe_persistent(&m->routes)));
        /* route moe.block_norm: at one token the residual add and the norm below are router_moe's first step (the
           persistent block makes its own input) */
        const bool pre_norm =
            !block && !fused_o && router_moe && T == 1 && fuse_tail && fm_routes_moe_block_norm(&m->routes);
        if (block) {
            /* the block ended with the residual add and the norm */
        } else if (fused_o)
            ops->linear_add_rmsnorm(be, L->o, b.att, T, p->a_dense, b.y, b.x, L->ffn_norm, c->rms_norm_eps, b.h);
        else if (!pre_norm) ops->add_rmsnorm(be, b.x, b.y, L->ffn_norm, T, H, c->rms_norm_eps, b.h);
        if (prefetch && ops->side_join) ops->side_join(be);
        if (!block && !pre_norm)
            op_mark(tm, FM_STAGE_OTHER, fused_o ? "o_proj+add_norm" : "add_norm",
                    fused_o ? fm_op_bytes_linear(m, L->o, T, (int64_t)m->tp_nh * c->head_dim, 0) +
                                  fm_op_bytes_act(m, T, H, 1, 2)
                            : add_norm_bytes);
        if (tm) tm->kind = L->is_moe ? "moe" : "dense";
        if (L->is_moe) {
            /* the shared expert beside the router and the routed experts (route shared.stream), else after them */
            const bool beside = L->shared_gate_up && fm_routes_shared_stream(&m->routes, T);
            if (beside) {
                if (ops->side_begin) ops->side_begin(be);
                shared_expert(ctx, L, T);
                if (ops->side_end) ops->side_end(be);
            }
            /* route dense.quant=producer: the block's end (router_moe's or moe_add_rmsnorm's) also quantizes the next
               layer's normed rows for its first projection (an attention layer's q|k|v, a Gated DeltaNet layer's
               qkvz: read by linear_rows) */
            h_rows = fuse_tail && ops->linear_rows && fm_routes_dense_quant_producer(&m->routes) &&
                     p->a_dense == FM_A_E4M3_G128;
            const fm_pre_norm pre = {b.y, L->ffn_norm, c->rms_norm_eps}; /* moe.block_norm's add + norm */
            if (router_moe)
                ops->router_moe(be, L->router, L->gate_up, L->down, b.h, T, c->n_experts_per_tok, c->router,
                                c->norm_topk_prob, b.rlogits, b.eids, b.ew, p->a_dispatch, p->a_expert, b.y,
                                fuse_tail ? b.x : NULL, fuse_tail ? m->layers[l + 1].attn_norm : NULL, c->rms_norm_eps,
                                b.h, h_rows ? b.hq : NULL, pre_norm ? &pre : NULL);
            else
                ops->router(be, L->router, b.h, T, c->n_experts_per_tok, c->router, c->norm_topk_prob, b.rlogits,
                            b.eids, b.ew);
            dump(be, "router", l, b.rlogits, T * c->n_experts);
            dump(be, "route_w", l, b.ew, T * c->n_experts_per_tok);
            const double route_bytes = fm_op_bytes_linear(m, L->router, T, H, c->n_experts) +
                                       fm_op_bytes_act(m, T, c->n_experts_per_tok, 0, 1) +
                                       4.0 * (double)T * c->n_experts_per_tok; /* weights and int32 ids out */
            /* router_moe: the router's interval is the experts' (one op), marked with them below */
            if (router_moe) {
                /* marked below */
            } else if (beside) /* on the side stream, overlapping the router: one interval */
                op_mark(tm, FM_STAGE_ROUTING, "router, shared_expert",
                        route_bytes + fm_op_bytes_shared_expert(m, l, T));
            else op_mark(tm, FM_STAGE_ROUTING, "router", route_bytes);
            if (router_moe) {
                /* done above */
            } else if (ctx->ep_comm) {
                expert_parallel_moe(ctx, L, T, &b);
            } else {
                /* experts in host memory: the pool's slots, the routed experts made resident first */
                const fm_moe_experts e = fm_moe_experts_of(ctx, l, b.eids, T * c->n_experts_per_tok);
                if (ctx->experts) op_mark(tm, FM_STAGE_FETCH, "expert_fetch", 0); /* host link, not device memory */
                if (fuse_tail) /* the residual add and the next norm below, in the moe's last kernel */
                    ops->moe_add_rmsnorm(be, e.gate_up, e.down, b.h, T, e.ids, b.ew, c->n_experts_per_tok,
                                         p->a_dispatch, p->a_expert, b.y, b.x, m->layers[l + 1].attn_norm,
                                         c->rms_norm_eps, b.h, h_rows ? b.hq : NULL);
                else
                    ops->moe(be, e.gate_up, e.down, b.h, T, e.ids, b.ew, c->n_experts_per_tok, p->a_dispatch,
                             p->a_expert, b.y);
            }
            const char *experts = pre_norm     ? "add_norm+router+experts+add_norm"
                                  : router_moe ? (fuse_tail ? "router+experts+add_norm" : "router+experts")
                                  : fuse_tail  ? "experts+add_norm"
                                               : "experts";
            const double experts_bytes =
                fm_op_bytes_experts(m, l, T) + (fuse_tail ? fm_op_bytes_act(m, T, H, 1, 2) : 0) +
                (router_moe ? route_bytes + (beside ? fm_op_bytes_shared_expert(m, l, T) : 0) : 0) +
                (pre_norm ? add_norm_bytes : 0);
            if (L->shared_gate_up) { /* Qwen3-Next: y += sigmoid(h Ws^T) * shared_expert(h), the score in the gate */
                op_split(tm, FM_STAGE_EXPERTS, experts, experts_bytes);
                if (!beside) {
                    shared_expert(ctx, L, T);
                    op_split(tm, FM_STAGE_EXPERTS, "shared_expert", fm_op_bytes_shared_expert(m, l, T));
                } else if (ops->side_join) ops->side_join(be);
                ops->add_sigmoid_gated(be, b.y, b.shared, b.h, L->shared_score, T, H);
                op_mark(tm, FM_STAGE_EXPERTS, "shared gate",
                        fm_op_bytes_linear(m, L->shared_score, T, H, 0) + fm_op_bytes_act(m, T, H, 2, 1));
            } else op_mark(tm, FM_STAGE_EXPERTS, experts, experts_bytes);
        } else {
            const int64_t I = c->dense_intermediate;
            ops->linear(be, L->gate_up, 0, b.h, T, p->a_dense, b.gu);
            op_split(tm, FM_STAGE_EXPERTS, "gate_up", fm_op_bytes_linear(m, L->gate_up, T, H, 2 * I));
            ops->swiglu(be, b.gu, T, c->dense_intermediate, b.act);
            op_split(tm, FM_STAGE_EXPERTS, "swiglu", fm_op_bytes_act(m, T, I, 2, 1));
            ops->linear(be, L->down, 0, b.act, T, p->a_dense, b.y);
            op_mark(tm, FM_STAGE_EXPERTS, "down", fm_op_bytes_linear(m, L->down, T, I, H));
        }
        if (!fuse_tail) dump(be, "ffn", l, b.y, T * H);
        /* the residual add and the next layer's attention norm in one op; the last layer's add stands alone (the
           final norm may take only the last row; fused: moe_add_rmsnorm did both) */
        if (l + 1 == m->n_layers) {
            ops->add(be, b.x, b.y, T * H);
            op_split(tm, FM_STAGE_OTHER, "add", fm_op_bytes_act(m, T, H, 2, 1));
        } else if (!fuse_tail) {
            ops->add_rmsnorm(be, b.x, b.y, m->layers[l + 1].attn_norm, T, H, c->rms_norm_eps, b.h);
            op_split(tm, FM_STAGE_OTHER, "add_norm", add_norm_bytes);
        }
        dump(be, "residual", l, b.x, T * H);
    }
}

/* The final norm and lm_head on the rows asked for: one run is read in place (every position, or the last one);
 * several (a mixed step's sampled rows) are gathered into y first, which the last layer no longer needs. */
static void run_tail(fm_context *ctx, const fm_row_run *out_rows, int32_t n_runs, fw_timer *tm) {
    const fm_model *m = ctx->m;
    const fm_config *c = &m->cfg;
    fm_backend *be = m->be;
    const fm_backend_ops *ops = be->ops;
    const int64_t H = c->hidden_size;
    const fw_buffers b = *ctx->bufs;
    if (tm) tm->kind = "step";
    const size_t row = (size_t)H * ops->act_size;
    int64_t rows = 0;
    for (int32_t r = 0; n_runs > 1 && r < n_runs; r++) {
        ops->copy(be, (const char *)b.x + (size_t)out_rows[r].first * row, (size_t)out_rows[r].n * row,
                  (char *)b.y + (size_t)rows * row);
        rows += out_rows[r].n;
    }
    if (n_runs == 1) rows = out_rows[0].n;
    const char *xs = n_runs > 1 ? (const char *)b.y : (const char *)b.x + (size_t)out_rows[0].first * row;
    ops->rmsnorm(be, xs, m->final_norm, rows, H, c->rms_norm_eps, b.h);
    dump(be, "final_norm", -1, b.h, rows * H);
    /* --lm-head dense: the dense projections' activation format */
    ops->linear(be, m->lm_head, 0, b.h, rows, m->plan.lm_head_dense ? m->plan.a_dense : FM_A_NATIVE, b.logits);
    dump(be, "logits", -1, b.logits, rows * c->vocab_size);
    op_mark(tm, FM_STAGE_OTHER, "final_norm+lm_head",
            fm_op_bytes_act(m, rows, H, n_runs > 1 ? 2 : 1, n_runs > 1 ? 2 : 1) +
                fm_op_bytes_linear(m, m->lm_head, rows, H, c->vocab_size));
}

/* The device work of a forward pass over the staged ids, its logits for the rows of out_rows */
static void run_device(fm_context *ctx, int64_t T, const fm_row_run *out_rows, int32_t n_runs, fm_attn_mode attn,
                       fw_timer *tm) {
    run_layers(ctx, T, attn, tm);
    run_tail(ctx, out_rows, n_runs, tm);
}

/* every row, or only the last one */
static fm_row_run rows_of(int64_t T, bool last_only) { return last_only ? (fm_row_run){T - 1, 1} : (fm_row_run){0, T}; }

void fm_forward_device(fm_context *ctx, int64_t T, bool last_only) {
    const fm_row_run r = rows_of(T, last_only);
    run_device(ctx, T, &r, 1, FM_ATTN_NO_CACHE, NULL);
}

fm_status fm_step_stage(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                        fm_error *err) {
    return fm_step_stage_padded(ctx, ids, seq, pos, T, T, err);
}

fm_status fm_step_stage_padded(fm_context *ctx, const int32_t *ids, const int32_t *seq, const int32_t *pos, int64_t T,
                               int64_t n_real, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    if (!kv) return fm_fail(err, FM_ERR_USAGE, "the model was loaded without a KV cache (fm_options.max_seqs = 0)");
    fm_status lone = check_not_lone_rank(ctx, err);
    if (lone) return lone;
    if (T < 1 || T > kv->max_rows || T > ctx->buf_tokens)
        return fm_fail(err, FM_ERR_USAGE, "a step of %lld tokens; the model was loaded for steps of 1 to %lld",
                       (long long)T, (long long)(kv->max_rows < ctx->buf_tokens ? kv->max_rows : ctx->buf_tokens));
    int32_t *h_seq = kv->h_idx, *h_pos = h_seq + T, *h_slot = h_pos + T;
    for (int64_t t = 0; t < T; t++) {
        const int32_t s = seq[t];
        if (s < 0 || s >= kv->pool.max_seqs || pos[t] < 0 || pos[t] >= fm_kv_seq_tokens(&kv->pool, s))
            return fm_fail(err, FM_ERR_USAGE,
                           "step token %lld: sequence %d position %d is not reserved in the KV cache", (long long)t, s,
                           pos[t]);
        h_seq[t] = s, h_pos[t] = pos[t];
        /* a decode graph's padding row (a copy of row 0's sequence and position, generate.c) stores no k and v
           (slot -1): after a Gated DeltaNet layer, which leaves its output at zero, its k and v are not row 0's, and
           two writers of one slot race; nor does a mixed step's (the rows from n_real, step_graphs.c) */
        const bool padding = t >= n_real || (t > 0 && s == seq[0] && pos[t] == pos[0]);
        h_slot[t] = padding
                        ? -1
                        : fm_kv_block_of(&kv->pool, s, pos[t]) * kv->pool.block_tokens + pos[t] % kv->pool.block_tokens;
    }
    fm_backend *be = m->be;
    be->ops->upload_ids(be, ids, T, ctx->bufs->ids);
    be->ops->upload_ids(be, h_seq, T, kv->tok_seq);
    be->ops->upload_ids(be, h_pos, T, kv->tok_pos);
    be->ops->upload_ids(be, h_slot, T, kv->slots);
    if (kv->tables_dirty) {
        be->ops->upload_ids(be, fm_kv_tables(&kv->pool), (int64_t)kv->pool.max_seqs * kv->pool.max_blocks, kv->tables);
        kv->tables_dirty = false;
    }
    return FM_OK;
}

void fm_step_device(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn) {
    const fm_row_run r = rows_of(T, last_only);
    run_device(ctx, T, &r, 1, attn, NULL);
}

void fm_step_device_rows(fm_context *ctx, int64_t T, const fm_row_run *runs, int32_t n_runs, fm_attn_mode attn) {
    run_device(ctx, T, runs, n_runs, attn, NULL);
}

void fm_step_device_layers(fm_context *ctx, int64_t T, fm_attn_mode attn) { run_layers(ctx, T, attn, NULL); }

void fm_step_device_tail(fm_context *ctx, const fm_row_run *runs, int32_t n_runs) { run_tail(ctx, runs, n_runs, NULL); }

fm_status fm_step_profile(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn, fm_profile *prof,
                          fm_error *err) {
    return fm_step_profile_ops(ctx, T, last_only, attn, prof, NULL, err);
}

/* marks a layer takes at most: 8 stage marks, or 15 with a mark after each op */
enum { MARKS_PER_LAYER = 8, MARKS_PER_LAYER_OPS = 15 };

fm_status fm_step_profile_ops(fm_context *ctx, int64_t T, bool last_only, fm_attn_mode attn, fm_profile *prof,
                              fm_op_profile *ops, fm_error *err) {
    const fm_model *m = ctx->m;
    const int64_t per_layer = ops ? MARKS_PER_LAYER_OPS : MARKS_PER_LAYER;
    if ((int64_t)m->n_layers * per_layer + 8 > FM_MARK_SLOTS)
        return fm_fail(err, FM_ERR_USAGE, "profiling%s supports at most %lld layers", ops ? " per op" : "",
                       (long long)((FM_MARK_SLOTS - 8) / per_layer));
    fw_timer *tm = calloc(1, sizeof *tm);
    if (!tm) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    tm->be = m->be, tm->on = true, tm->per_op = ops != NULL;
    const fm_row_run r = rows_of(T, last_only);
    run_device(ctx, T, &r, 1, attn, tm);
    fm_status st = m->be->ops->sync(m->be, err);
    if (!st) collect(tm, prof);
    if (!st && ops) st = collect_ops(tm, ops, err);
    free(tm);
    return st;
}

void fm_step_sample_device(fm_context *ctx, int32_t B) {
    const fm_model *m = ctx->m;
    fm_kv_state *kv = ctx->kv;
    m->be->ops->sample(m->be, ctx->bufs->logits, B, m->cfg.vocab_size, kv->row_slot, kv->params, kv->steps, kv->counts,
                       kv->seen, kv->bias, kv->mask, kv->z, kv->ids_out, kv->info_out);
}

fm_status fm_dist_status_take(fm_context *ctx, fm_error *err) {
    const fm_status st = ctx->dist_status;
    if (st) {
        ctx->dist_status = FM_OK;
        if (err) *err = ctx->dist_err;
    }
    return st;
}

fm_status fm_step_logits(fm_context *ctx, int64_t rows, float *logits, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    fm_status st = be->ops->sync(be, err);
    if (!st) st = fm_dist_status_take(ctx, err);
    if (!st) be->ops->download_f32(be, ctx->bufs->logits, rows * m->cfg.vocab_size, logits);
    return st;
}

fm_status fm_forward_collect(fm_context *ctx, int64_t T, bool last_only, float *logits, fm_error *err) {
    const fm_model *m = ctx->m;
    fm_backend *be = m->be;
    fm_status st = be->ops->sync(be, err);
    if (!st) be->ops->download_f32(be, ctx->bufs->logits, (last_only ? 1 : T) * m->cfg.vocab_size, logits);
    return st;
}

fm_status fm_forward(fm_context *ctx, const int32_t *ids, int64_t T, bool last_only, float *logits, fm_profile *prof,
                     fm_error *err) {
    const fm_model *m = ctx->m;
    if (prof && (int64_t)m->n_layers * 8 + 8 > FM_MARK_SLOTS)
        return fm_fail(err, FM_ERR_USAGE, "profiling supports at most %d layers", (FM_MARK_SLOTS - 8) / 8);
    fm_status st = fm_forward_stage(ctx, ids, T, err);
    if (st) return st;
    fw_timer *tm = NULL;
    if (prof) {
        if (!(tm = calloc(1, sizeof *tm))) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
        tm->be = m->be, tm->on = true;
    }
    const fm_row_run r = rows_of(T, last_only);
    run_device(ctx, T, &r, 1, FM_ATTN_NO_CACHE, tm);
    st = fm_forward_collect(ctx, T, last_only, logits, err);
    if (!st) st = fm_dist_status_take(ctx, err);
    if (!st && prof) collect(tm, prof);
    free(tm);
    return st;
}
