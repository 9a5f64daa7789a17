/* fp8moe bench decode: decode steps of a synthetic model at real shapes, B sequences at a given context, the presets
 * side by side, against the floor of the bytes a step must read. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_constrain.h"
#include "cli/cli.h"
#include "dist/comm.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_plan.h"
#include "util/progress.h"

static const char *HELP =
    "usage: fp8moe bench decode --synthetic NAME [--batch 1,8,64] [--context 2048] [--presets LIST] [options]\n"
    "\n"
    "Decode steps of a synthetic model with the shapes of a real checkpoint: for each preset and batch size B, B\n"
    "sequences are prefilled to the context, then every timed step decodes one token of each (sampling greedy on\n"
    "the device, decode steps replayed as CUDA graphs per batch bucket unless --route decode.graphs=off). Prints\n"
    "per step the median, min and max wall time (staging, the step, the sampled ids back on the host), tokens/s,\n"
    "the bytes a step must read (the weights it touches: attention projections, router, the experts its tokens\n"
    "select (expected count under uniform routing), lm_head; and the KV cache of every sequence) against the floor\n"
    "at 4.25 TB/s, and the per-stage times of one step run without a graph. With graphs, a table gives the launches\n"
    "of one step: the kernel nodes of the batch bucket's graph (memory copies and sets, other nodes apart).\n"
    "\n"
    "  --synthetic NAME   qwen3-30b-a3b, mixtral-8x7b, qwen3-next-80b-a3b, or\n"
    "                     toy-moe / toy-next (small enough for the CPU)\n"
    "  --batch LIST       sequences decoded together (default 1,8,64)\n"
    "  --context N        tokens in each sequence's cache when the timing starts (default 2048)\n"
    "  --presets LIST     presets side by side (default ref,int4,fp8,fp8+w8a8; cpu: ref,fp8); fp8+w8a8 is fp8 with\n"
    "                     --dense w8a8\n"
    "  --steps N          timed decode steps (default 64; on cuda each an NVTX range \"decode step\": ncu --nvtx\n"
    "                     --nvtx-include \"decode step/\" profiles their kernels alone)\n"
    "  --warmup W         untimed steps first (default 8; the first steps of a batch bucket capture its graph)\n"
    "  --layers L         only the first L layers\n"
    "  --lm-head L        float (default) or dense: the lm_head in the dense projections' format, for the presets\n"
    "                     that quantize them (int4, fp8, fp8+w8a8; ref keeps its float lm_head)\n"
    "  --int4-scales S    g128 (default) or p2: the group scales of the weights quantized to int4 at load\n"
    "                     (docs/int4_p2.md; the presets with int4 weights only). Route w4a8.kernel=fold needs p2\n"
    "  --json FILE        also write the results as JSON\n"
    "  --backend B        cuda (default) or cpu\n"
    "  --route KEY=VALUE  force a kernel route (repeatable; `fp8moe inspect --routes`)\n" BENCH_ROUTING_HELP
    "  --experts-in W     device (default), host (experts in host memory behind an expert cache; on cuda the\n"
    "                     fp8 and fp4 presets) or auto (host when the model does not fit); then each row also\n"
    "                     gives the cache's hit rate over the timed steps, the bytes copied from host memory\n"
    "                     per step and their floor at the host link's bandwidth, measured in the same run\n"
    "  --expert-slots N   slots of the expert cache (default: from the memory plan)\n"
    "  --vram-limit BYTES plan as if the GPU had this much memory (8G, 12Gi, bytes): with --experts-in host or\n"
    "                     auto, the expert cache gets what the rest leaves\n"
    "  --decode-input I   sampled (default: each step decodes the token the last one sampled) or random (a\n"
    "                     random token per sequence and step: routing as independent as the model makes it, the\n"
    "                     expert cache's hard case; a synthetic model's sampled tokens tend to repeat)\n"
    "  --expert-policy P  lfu (default) or lru\n"
    "  --kv-cache F       auto (default: the activations' dtype) or e4m3 (docs/kv-cache.md)\n"
    "  --json-object      every sequence constrained to JSON objects (response_format json_object): each step\n"
    "                     also computes the sequences' allowed-token masks on the host (one thread per sequence),\n"
    "                     copies them to the device and samples under them; the vocabulary is\n"
    "                     models/tiny-code-moe's tokenizer grown to the model's size (bench mask says how); a\n"
    "                     table gives the host's fill time per step (wall; the rows' CPU time summed)\n"
    "  --mask-cache N     with --json-object: masks shared between the sequences' matchers, N at most (default\n"
    "                     128; 0: every mask computed: the walk's full cost)\n"
    "  --mask-order O     with --json-object: overlap (default: the masks are filled while the device runs the\n"
    "                     forward pass, as the scheduler does) or before (filled and copied before the step: the\n"
    "                     cost the overlap hides)\n"
    "  --ep N             decode by N ranks in this process, each with 1/N of the routed experts (cpu backend: a\n"
    "                     simulated world exchanging through host memory; one preset, default fp8), the routed\n"
    "                     rows sent all-to-all in the --dispatch format: per batch the group's wall time per step\n"
    "                     and the bytes the ranks send each other per step and layer\n"
    "  --dispatch F       the expert dispatch format with --ep: bf16, fp8, mxfp4, nvfp4 or preset (default)\n"
    "  --per-op           the profiled step with a mark after every op: per preset and batch, a table of each op\n"
    "                     of the step (per layer kind, summed over the layers) with its time, the bytes it must\n"
    "                     move (weights read, activations, KV cache), the achieved GB/s and the floor at the\n"
    "                     bandwidth (also in the JSON, rows[].ops)\n"
    "  --bandwidth GBPS   the device bandwidth of the floors in GB/s (default 4250 on cuda: the device copy rate\n"
    "                     measured on the H200; on the cpu --per-op's floor columns only with this option)\n"
    "  --prompt-rows N    mixed steps, as the scheduler runs them while a prompt arrives: each timed step also runs\n"
    "                     N rows of a prompt chunk (one more sequence, its first N positions) in the same pass\n"
    "                     (its layers the graph of its row bucket: route mixed.graphs), the decode rows and the\n"
    "                     chunk's last row sampled; the profiled step (stages, --per-op) is the same mixed\n"
    "                     step without a graph, with the last row's logits only. The\n"
    "                     decode steps' rows for the same batches are the comparison: run both (the load\n"
    "                     differs by one sequence and a pass of at least B + N rows)\n"
    "  -v, --verbose      progress on stderr\n";

enum {
    OPT_SYNTH = 2000,
    OPT_BATCH,
    OPT_CONTEXT,
    OPT_PRESETS,
    OPT_STEPS,
    OPT_LAYERS,
    OPT_ROUTING,
    OPT_EXPERTS_IN,
    OPT_EXPERT_SLOTS,
    OPT_EXPERT_POLICY,
    OPT_KV_CACHE,
    OPT_VRAM_LIMIT,
    OPT_DECODE_INPUT,
    OPT_EP,
    OPT_DISPATCH,
    OPT_JSON_OBJECT,
    OPT_MASK_ORDER,
    OPT_MASK_CACHE,
    OPT_PER_OP,
    OPT_BANDWIDTH,
    OPT_INT4_SCALES,
    OPT_LM_HEAD,
    OPT_PROMPT_ROWS
};
static const struct option own_options[] = {{"synthetic", required_argument, 0, OPT_SYNTH},
                                            {"batch", required_argument, 0, OPT_BATCH},
                                            {"context", required_argument, 0, OPT_CONTEXT},
                                            {"presets", required_argument, 0, OPT_PRESETS},
                                            {"steps", required_argument, 0, OPT_STEPS},
                                            {"layers", required_argument, 0, OPT_LAYERS},
                                            {"synthetic-routing", required_argument, 0, OPT_ROUTING},
                                            {"experts-in", required_argument, 0, OPT_EXPERTS_IN},
                                            {"expert-slots", required_argument, 0, OPT_EXPERT_SLOTS},
                                            {"expert-policy", required_argument, 0, OPT_EXPERT_POLICY},
                                            {"kv-cache", required_argument, 0, OPT_KV_CACHE},
                                            {"vram-limit", required_argument, 0, OPT_VRAM_LIMIT},
                                            {"decode-input", required_argument, 0, OPT_DECODE_INPUT},
                                            {"ep", required_argument, 0, OPT_EP},
                                            {"dispatch", required_argument, 0, OPT_DISPATCH},
                                            {"json-object", no_argument, 0, OPT_JSON_OBJECT},
                                            {"mask-order", required_argument, 0, OPT_MASK_ORDER},
                                            {"mask-cache", required_argument, 0, OPT_MASK_CACHE},
                                            {"per-op", no_argument, 0, OPT_PER_OP},
                                            {"bandwidth", required_argument, 0, OPT_BANDWIDTH},
                                            {"int4-scales", required_argument, 0, OPT_INT4_SCALES},
                                            {"lm-head", required_argument, 0, OPT_LM_HEAD},
                                            {"prompt-rows", required_argument, 0, OPT_PROMPT_ROWS},
                                            {"help", no_argument, 0, 'h'},
                                            BENCH_LONG_OPTIONS,
                                            {0, 0, 0, 0}};

#define MAX_BATCHES 8
static const char *const k_presets[] = {"ref", "int4", "fp8", "fp8+w8a8"};
enum { N_PRESETS = 4 };

typedef struct decode_row {
    const char *preset;
    int64_t batch;
    double median_ms, min_ms, max_ms, tokens_per_s, bytes, floor_ms;
    fm_profile prof;   /* one step without a graph */
    fm_op_profile ops; /* --per-op: the same step's ops */
    bool host;         /* experts in host memory: the cache's counters over the timed steps */
    double hit_rate, copied_per_step, prefetched_per_step;
    int32_t slots;
    double mask_fill_ms;     /* --json-object: the host's median fill time per step */
    double mask_fill_cpu_ms; /* the rows' CPU time of a step's fills, summed (median) */
    bool graph;              /* the step replayed a captured graph (cuda): its nodes by kind */
    fm_graph_nodes nodes;
    bench_status status;
    char msg[sizeof(((fm_error *)0)->msg)];
} decode_row;

/* Bytes one decode step of B tokens at context ctx, and N prompt rows at positions 0..N-1 beside them, must read:
 * every dense weight once, the experts the B + N tokens select (E (1 - (1 - k/E)^(B + N)) of each layer's E under
 * uniform routing), the lm_head, and the K and V of every sequence's context. */
static double step_bytes(const fm_model *m, const fm_memory_plan *p, int64_t B, int64_t N, int64_t ctx) {
    const fm_config *c = &m->cfg;
    double b = (double)(p->weights[FM_MEM_ATTN] + p->weights[FM_MEM_ROUTER] + p->weights[FM_MEM_NORMS] +
                        p->weights[FM_MEM_DENSE_MLP] + p->weights[FM_MEM_LM_HEAD]);
    if (!p->weights[FM_MEM_LM_HEAD]) b += (double)p->weights[FM_MEM_EMBED]; /* tied: the embedding is the lm_head */
    if (c->n_experts > 0) { /* a shared expert in the bank (moe.shared) is read by every step: s of the E */
        const double s = c->shared_in_bank ? 1.0 : 0.0, E = c->n_experts, k = c->n_experts_per_tok;
        b += (double)p->weights[FM_MEM_EXPERTS] / E *
             (s + (E - s) * (1.0 - pow(1.0 - (k - s) / (E - s), (double)(B + N))));
    }
    /* the cache's rows as stored (bf16, or e4m3 codes and scales), in the attention layers (not Qwen3-Next's GDN) */
    const double row = m->context && m->context->kv
                           ? (double)m->context->kv->row_bytes
                           : (double)c->n_kv_heads * c->head_dim * (double)m->be->ops->act_size;
    b += ((double)B * (double)ctx + (double)N * (double)(N + 1) / 2.0) * 2.0 *
         fm_arch_attention_layers(c, m->n_layers) * row; /* a prompt chunk's row t reads t + 1 positions */
    return b;
}

/* What the command line asks for. */
typedef struct decode_args {
    bench_opts b;
    const char *synth, *routing;
    int64_t batches[MAX_BATCHES];
    int nb, np, pidx[N_PRESETS];
    long context, layers, slots, ep;
    long prompt_rows; /* --prompt-rows: a prompt chunk's rows in every timed step (mixed steps); 0: decode steps */
    bool presets_given, random_ids, json_object, per_op;
    bool mask_before, mask_order_given; /* --mask-order before: masks filled and copied before the step */
    long mask_cache;                    /* --mask-cache: shared masks; -1: not given (the default) */
    double bandwidth;                   /* bytes/s of the floors; 0: none (the cpu without --bandwidth) */
    fm_experts_in experts_in;
    fm_expert_policy policy;
    fm_kv_dtype kv_cache;
    int64_t vram_limit;
    fm_dispatch dispatch;
    fm_int4_scales int4_scales;
    fm_lm_head lm_head;
} decode_args;

/* --prompt-rows: the rows of a mixed step as the scheduler stages them (the prompt chunk's rows, then the decode
 * rows), at fixed positions: every timed step recomputes the same positions (the same work; the caches keep their
 * size). The chunk is the first N positions of one more sequence; each decode row is its sequence's next position. */
typedef struct mixed_rows {
    int32_t n_prompt, n_dec, pseq;
    int32_t *ids, *seq, *pos; /* [n_prompt + n_dec] */
    int32_t *slots, *out; /* [1 + n_dec]: the sampled rows' sequences (the chunk's last row, then the decode rows) */
} mixed_rows;

static void mixed_free(fm_model *m, mixed_rows *x) {
    if (x->pseq >= 0) fm_kv_seq_end(m->context, x->pseq);
    free(x->ids), free(x->seq), free(x->pos), free(x->slots), free(x->out);
    memset(x, 0, sizeof *x), x->pseq = -1;
}

static fm_status mixed_begin(fm_model *m, int32_t B, int32_t N, const int32_t *seq, const int32_t *last, mixed_rows *x,
                             fm_error *err) {
    fm_kv_pool *pool = &m->context->kv->pool;
    const int32_t T = N + B, V = fm_model_vocab_size(m);
    *x = (mixed_rows){N,
                      B,
                      -1,
                      malloc((size_t)T * sizeof(int32_t)),
                      malloc((size_t)T * sizeof(int32_t)),
                      malloc((size_t)T * sizeof(int32_t)),
                      malloc((size_t)(B + 1) * sizeof(int32_t)),
                      malloc((size_t)(B + 1) * sizeof(int32_t))};
    if (!x->ids || !x->seq || !x->pos || !x->slots || !x->out)
        return fm_fail(err, FM_ERR_NOMEM, "bench decode: out of host memory");
    for (int32_t t = 0; t < N; t++) x->ids[t] = (int32_t)((t * 6007 + 17) % V);
    fm_sampling sp;
    fm_sampling_init(&sp);
    fm_status st = fm_kv_seq_begin(m->context, x->ids, N, &sp, &x->pseq, err);
    if (!st) st = fm_kv_seq_append(pool, x->pseq, N, err);
    for (int32_t t = 0; t < N; t++) x->seq[t] = x->pseq, x->pos[t] = t;
    x->slots[0] = x->pseq;
    for (int32_t s = 0; !st && s < B; s++) {
        st = fm_kv_seq_append(pool, seq[s], 1, err);
        x->ids[N + s] = last[s], x->seq[N + s] = seq[s], x->slots[1 + s] = seq[s];
        x->pos[N + s] = (int32_t)(fm_kv_seq_tokens(pool, seq[s]) - 1);
    }
    m->context->kv->tables_dirty = true;
    return st;
}

/* One mixed step as the scheduler runs it: the rows staged, one pass with the logits of the sampled rows (its layers
 * the graph of the rows' bucket where route mixed.graphs takes the step), sampled on the device, the ids back */
static fm_status mixed_step(fm_model *m, mixed_rows *x, fm_error *err) {
    fm_context *ctx = m->context;
    fm_backend *be = m->be;
    const int64_t T = (int64_t)x->n_prompt + x->n_dec;
    const fm_row_run run = {x->n_prompt - 1, x->n_dec + 1};
    fm_status st = fm_step_run_rows(ctx, x->ids, x->seq, x->pos, T, &run, 1, FM_ATTN_PAGED, err);
    if (st) return st;
    be->ops->upload_ids(be, x->slots, x->n_dec + 1, ctx->kv->row_slot);
    fm_step_sample_device(ctx, x->n_dec + 1);
    be->ops->download_raw(be, ctx->kv->ids_out, (size_t)(x->n_dec + 1) * sizeof *x->out, x->out);
    if ((st = be->ops->sync(be, err))) return st;
    return fm_dist_status_take(ctx, err);
}

/* One batch size of one loaded preset: B sequences prefilled to the context, warm-up and timed steps, the expert
 * cache's counts over the timed ones, then one step with stage marks; the sequences are ended. A failure is the row's
 * (its status and message) and is returned: the preset's larger batches are not run after it. */
static fm_status time_batch(fm_model *m, const fm_memory_plan *plan, const decode_args *a, int64_t max_tokens,
                            decode_row *row) {
    const int32_t B = (int32_t)row->batch;
    const int32_t V = fm_model_vocab_size(m);
    const long steps = a->b.repeat, warmup = a->b.warmup;
    fm_error err = {{0}};
    fm_status st = FM_OK;
    int32_t *seq = malloc((size_t)B * sizeof *seq), *ids = malloc((size_t)B * sizeof *ids);
    float *lp = malloc((size_t)B * sizeof *lp);
    double *ms = malloc((size_t)steps * sizeof *ms), *fill_ms = calloc((size_t)steps, sizeof *fill_ms),
           *fill_cpu = calloc((size_t)steps, sizeof *fill_cpu);
    /* B sequences prefilled to the context (each its own prompt, in chunks of max_tokens) */
    if (!seq || !ids || !lp || !ms || !fill_ms || !fill_cpu)
        st = fm_fail(&err, FM_ERR_NOMEM, "bench decode: out of host memory");
    else st = bench_prefill_sequences(m, B, a->context, max_tokens, seq, ids, &err);
    if (!st) st = m->be->ops->sync(m->be, &err);
    mixed_rows mx = {0};
    mx.pseq = -1;
    if (!st && a->prompt_rows) st = mixed_begin(m, B, (int32_t)a->prompt_rows, seq, ids, &mx, &err);
    if (a->b.verbose && !st)
        fm_progress("%s B=%d: prefilled %d x %lld tokens", row->preset, B, B, (long long)a->context);
    /* one profiled step without a graph: the stage breakdown */
    memset(&row->prof, 0, sizeof row->prof);
    fm_expert_stats es0 = {0}, es1 = {0};
    bench_constraint bc = {0};
    if (!st && a->json_object)
        st = bench_constraint_begin(m, "models/tiny-code-moe", seq, B,
                                    a->mask_cache < 0 ? FM_MASK_CACHE_DEFAULT : (int32_t)a->mask_cache, &bc, &err);
    uint32_t x = 2463534242u; /* --decode-input random: a fresh token per sequence and step (xorshift) */
    for (long r = 0; !st && r < warmup + steps; r++) {
        if (r == warmup) fm_context_expert_stats(m->context, &es0); /* the timed steps' own hits and misses */
        for (int32_t s = 0; a->random_ids && s < B; s++)
            x ^= x << 13, x ^= x >> 17, x ^= x << 5, ids[s] = (int32_t)(x % (uint32_t)V);
        const bool timed = r >= warmup; /* a timed step is an NVTX range "decode step" on cuda (ncu --nvtx) */
        if (timed && m->be->ops->range) m->be->ops->range(m->be, "decode step");
        const double t0 = cli_now();
        if (a->prompt_rows) { /* the decode rows' input: the token each sampled last step, or the random one */
            for (int32_t s = 0; s < B; s++) mx.ids[mx.n_prompt + s] = a->random_ids || r == 0 ? ids[s] : mx.out[1 + s];
            st = mixed_step(m, &mx, &err);
        } else if (!a->json_object) st = fm_decode_step(m->context, B, ids, seq, ids, lp, &err);
        else { /* the scheduler's constrained step: the masks filled while the forward pass runs, or before it */
            if (a->mask_before) bench_constraint_masks(m, &bc);
            for (int32_t s = 0; !st && s < B; s++) st = fm_kv_reserve(m->context, seq[s], 1, &err);
            const fm_step_masks masks = {bench_constraint_fill, &bc};
            if (!st)
                st = fm_decode_run_masked(m->context, B, ids, seq, a->mask_before ? NULL : &masks, ids,
                                          m->context->kv->h_info, &err);
            if (!st) st = bench_constraint_accept(&bc, ids, &err);
        }
        if (!st && timed)
            ms[r - warmup] = 1e3 * (cli_now() - t0), fill_ms[r - warmup] = 1e3 * bc.fill_s,
                   fill_cpu[r - warmup] = 1e3 * bc.fill_cpu_s;
        if (timed && m->be->ops->range) m->be->ops->range(m->be, NULL);
    }
    bench_constraint_end(&bc);
    if (!st)
        row->graph = a->prompt_rows ? fm_mixed_graph_nodes(m->context, (int64_t)mx.n_prompt + B, &row->nodes)
                                    : fm_decode_graph_nodes(m->context, B, &row->nodes);
    if (!st && (row->host = fm_context_expert_stats(m->context, &es1))) {
        const int64_t h = es1.hits - es0.hits, mi = es1.misses - es0.misses;
        row->hit_rate = h + mi ? (double)h / (double)(h + mi) : 0;
        row->copied_per_step = (double)(es1.bytes_copied - es0.bytes_copied) / (double)steps;
        row->prefetched_per_step = (double)(es1.bytes_prefetched - es0.bytes_prefetched) / (double)steps;
        row->slots = es1.slots;
    }
    if (!st && a->prompt_rows) { /* the breakdown: the mixed step once more with stage marks */
        st = fm_step_stage(m->context, mx.ids, mx.seq, mx.pos, (int64_t)mx.n_prompt + B, &err);
        if (!st)
            st = fm_step_profile_ops(m->context, (int64_t)mx.n_prompt + B, true, FM_ATTN_PAGED, &row->prof,
                                     a->per_op ? &row->ops : NULL, &err);
    } else if (!st) { /* the breakdown: one more step's device work with stage marks, its K/V at the next position */
        int32_t *pos = malloc((size_t)B * sizeof *pos);
        for (int32_t s = 0; s < B && !st; s++) {
            pos[s] = (int32_t)fm_kv_seq_tokens(&m->context->kv->pool, seq[s]);
            st = fm_kv_seq_append(&m->context->kv->pool, seq[s], 1, &err);
        }
        m->context->kv->tables_dirty = true;
        if (!st) st = fm_step_stage(m->context, ids, seq, pos, B, &err);
        if (!st)
            st = fm_step_profile_ops(m->context, B, false, FM_ATTN_DECODE, &row->prof, a->per_op ? &row->ops : NULL,
                                     &err);
        free(pos);
    }
    mixed_free(m, &mx);
    for (int32_t s = 0; seq && s < B; s++)
        if (seq[s] >= 0 && fm_kv_seq_tokens(&m->context->kv->pool, seq[s]) >= 0) fm_kv_seq_end(m->context, seq[s]);
    if (!st) {
        double med, mn, mx;
        bench_stats(ms, steps, &med, &mn, &mx);
        row->median_ms = med, row->min_ms = mn, row->max_ms = mx;
        bench_stats(fill_ms, steps, &row->mask_fill_ms, &mn, &mx);
        bench_stats(fill_cpu, steps, &row->mask_fill_cpu_ms, &mn, &mx);
        row->tokens_per_s = B / (med * 1e-3);
        row->bytes =
            step_bytes(m, plan, B, a->prompt_rows, a->prompt_rows ? a->context : a->context + warmup + steps / 2);
        row->floor_ms = 1e3 * row->bytes / (a->bandwidth > 0 ? a->bandwidth : BENCH_BANDWIDTH_BYTES_PER_S);
        row->status = BENCH_OK;
    } else {
        row->status = BENCH_FAILED;
        snprintf(row->msg, sizeof row->msg, "%s", err.msg);
    }
    free(seq), free(ids), free(lp), free(ms), free(fill_ms), free(fill_cpu);
    return st;
}

/* One preset: the model loaded once with room for the largest batch, then each batch size timed (rows[0..nb)). */
static void run_preset(const decode_args *a, const char *preset, const cli_model_opts *base, decode_row *rows) {
    fm_options opt = base->opt;
    fm_preset p = FM_PRESET_REF;
    const bool w8a8 = !strcmp(preset, "fp8+w8a8");
    fm_preset_parse(w8a8 ? "fp8" : preset, &p);
    int64_t max_b = 0;
    for (int i = 0; i < a->nb; i++) max_b = a->batches[i] > max_b ? a->batches[i] : max_b;
    opt.preset = p, opt.dense = w8a8 ? FM_DENSE_W8A8 : FM_DENSE_PRESET;
    /* --lm-head dense: the presets whose dense projections are quantized (the header says so); ref keeps its own */
    if (p == FM_PRESET_REF || p == FM_PRESET_REF32) opt.lm_head = FM_LM_HEAD_FLOAT;
    opt.max_seqs = (int32_t)(max_b + (a->prompt_rows > 0)), opt.ctx = a->context + a->b.warmup + a->b.repeat + 1;
    if (opt.ctx < max_b + a->prompt_rows) opt.ctx = max_b + a->prompt_rows; /* a pass's rows are checked against it */
    opt.max_tokens = a->context < 2048 ? a->context : 2048;
    if (opt.max_tokens < max_b + a->prompt_rows) opt.max_tokens = max_b + a->prompt_rows; /* a mixed step's rows */
    fm_error err = {{0}};
    fm_model *m = NULL;
    for (int i = 0; i < a->nb; i++) rows[i].preset = preset, rows[i].batch = a->batches[i];
    fm_status st = fm_model_load_synthetic(a->synth, opt.n_layers, &opt, &m, &err);
    if (st) {
        for (int i = 0; i < a->nb; i++) {
            rows[i].status = st == FM_ERR_UNSUPPORTED ? BENCH_UNAVAILABLE : BENCH_FAILED;
            snprintf(rows[i].msg, sizeof rows[i].msg, "%s", err.msg);
        }
        return;
    }
    fm_memory_plan plan;
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = m->lm_head == m->embed;
    st = fm_memory_plan_compute(&cfg, &m->plan, m->be->ops->name, m->n_layers, 1, &plan, &err);
    for (int bi = 0; !st && bi < a->nb; bi++) st = time_batch(m, &plan, a, opt.max_tokens, &rows[bi]);
    fm_progress_end();
    fm_model_free(m);
}

/* -1 when the bench should run, else the exit code (help printed, or a usage error). */
static int parse_args(const char *cmd, int argc, char **argv, decode_args *a) {
    bench_opts_init(&a->b, 64, 8);
    a->batches[0] = 1, a->batches[1] = 8, a->batches[2] = 64, a->nb = 3;
    a->context = 2048, a->ep = 1, a->mask_cache = -1;
    a->experts_in = FM_EXPERTS_DEVICE, a->policy = FM_EXPERT_LFU, a->dispatch = FM_DISPATCH_PRESET;
    optind = 1;
    for (int o; (o = getopt_long(argc, argv, "hv", own_options, NULL)) != -1;) {
        const int c = bench_common_option(cmd, o, optarg, &a->b);
        if (c < 0) return CLI_USAGE;
        if (c > 0) continue;
        switch (o) {
        case 'h': fputs(HELP, stdout); return CLI_OK;
        case OPT_SYNTH: a->synth = optarg; break;
        case OPT_BATCH:
            if (!bench_parse_counts(cmd, "--batch", optarg, 1, 128, a->batches, MAX_BATCHES, &a->nb)) return CLI_USAGE;
            break;
        case OPT_CONTEXT:
            if (!cli_parse_int(cmd, "--context", optarg, 1, 1 << 20, &a->context)) return CLI_USAGE;
            break;
        case OPT_PRESETS:
            if (!bench_parse_names(cmd, "--presets", optarg, k_presets, N_PRESETS, a->pidx, &a->np)) return CLI_USAGE;
            a->presets_given = true;
            break;
        case OPT_STEPS:
            if (!cli_parse_int(cmd, "--steps", optarg, 1, BENCH_MAX_REPEAT, &a->b.repeat)) return CLI_USAGE;
            break;
        case OPT_LAYERS:
            if (!cli_parse_int(cmd, "--layers", optarg, 1, 1 << 10, &a->layers)) return CLI_USAGE;
            break;
        case OPT_ROUTING:
            if (!bench_routing_check(cmd, optarg)) return CLI_USAGE;
            a->routing = optarg;
            break;
        case OPT_EXPERTS_IN:
            if (!fm_experts_in_parse(optarg, &a->experts_in))
                return cli_usage(cmd, "--experts-in must be host, device or auto, got '%s'", optarg);
            break;
        case OPT_EXPERT_SLOTS:
            if (!cli_parse_int(cmd, "--expert-slots", optarg, 1, 1L << 30, &a->slots)) return CLI_USAGE;
            break;
        case OPT_EXPERT_POLICY:
            if (!fm_expert_policy_parse(optarg, &a->policy))
                return cli_usage(cmd, "--expert-policy must be lru or lfu, got '%s'", optarg);
            break;
        case OPT_KV_CACHE:
            if (!cli_parse_kv_cache(cmd, optarg, &a->kv_cache)) return CLI_USAGE;
            break;
        case OPT_VRAM_LIMIT:
            if (!cli_parse_bytes(cmd, "--vram-limit", optarg, &a->vram_limit)) return CLI_USAGE;
            break;
        case OPT_DECODE_INPUT:
            if (strcmp(optarg, "sampled") && strcmp(optarg, "random"))
                return cli_usage(cmd, "--decode-input must be sampled or random, got '%s'", optarg);
            a->random_ids = !strcmp(optarg, "random");
            break;
        case OPT_EP:
            if (!cli_parse_int(cmd, "--ep", optarg, 1, FM_COMM_MAX_RANKS, &a->ep)) return CLI_USAGE;
            break;
        case OPT_JSON_OBJECT: a->json_object = true; break;
        case OPT_MASK_ORDER:
            if (strcmp(optarg, "overlap") && strcmp(optarg, "before"))
                return cli_usage(cmd, "--mask-order must be overlap or before, got '%s'", optarg);
            a->mask_before = !strcmp(optarg, "before"), a->mask_order_given = true;
            break;
        case OPT_MASK_CACHE:
            if (!cli_parse_int(cmd, "--mask-cache", optarg, 0, 65536, &a->mask_cache)) return CLI_USAGE;
            break;
        case OPT_PER_OP: a->per_op = true; break;
        case OPT_PROMPT_ROWS:
            if (!cli_parse_int(cmd, "--prompt-rows", optarg, 1, 8192, &a->prompt_rows)) return CLI_USAGE;
            break;
        case OPT_BANDWIDTH: {
            long gbps = 0;
            if (!cli_parse_int(cmd, "--bandwidth", optarg, 1, 1000000, &gbps)) return CLI_USAGE;
            a->bandwidth = (double)gbps * 1e9;
            break;
        }
        case OPT_INT4_SCALES:
            if (!fm_int4_scales_parse(optarg, &a->int4_scales))
                return cli_usage(cmd, "--int4-scales must be g128 or p2, got '%s'", optarg);
            break;
        case OPT_LM_HEAD:
            if (!fm_lm_head_parse(optarg, &a->lm_head))
                return cli_usage(cmd, "--lm-head must be float or dense, got '%s'", optarg);
            break;
        case OPT_DISPATCH:
            if (!fm_dispatch_parse(optarg, &a->dispatch))
                return cli_usage(cmd, "--dispatch must be one of bf16, fp8, mxfp4, nvfp4, preset, got '%s'", optarg);
            break;
        default: return cli_usage(cmd, "unknown option");
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!a->synth) return cli_usage(cmd, "--synthetic NAME is required (%s)", fm_synthetic_names());
    if (a->mask_order_given && !a->json_object) return cli_usage(cmd, "--mask-order needs --json-object");
    if (a->mask_cache >= 0 && !a->json_object) return cli_usage(cmd, "--mask-cache needs --json-object");
    if (a->prompt_rows && a->json_object)
        return cli_usage(cmd, "--prompt-rows times mixed steps without constraints: not with --json-object");
    return -1;
}

/* The presets (given, else the backend's list) and the load options every preset starts from. */
static void plan_run(decode_args *a, cli_model_opts *mo) {
    const bool cuda = !strcmp(a->b.backend, "cuda");
    if (cuda && a->bandwidth <= 0) a->bandwidth = BENCH_BANDWIDTH_BYTES_PER_S;
    if (!a->presets_given) {
        a->np = 0;
        if (cuda) a->pidx[a->np++] = 0, a->pidx[a->np++] = 1, a->pidx[a->np++] = 2, a->pidx[a->np++] = 3;
        else a->pidx[a->np++] = 0, a->pidx[a->np++] = 2;
    }
    cli_model_opts_init(mo);
    mo->opt.experts_in = a->experts_in, mo->opt.expert_slots = (int32_t)a->slots, mo->opt.expert_policy = a->policy;
    mo->opt.vram_limit = a->vram_limit, mo->opt.int4_scales = a->int4_scales, mo->opt.kv_cache = a->kv_cache;
    mo->opt.lm_head = a->lm_head;
    mo->opt.synthetic_routing = a->routing;
    mo->opt.backend = a->b.backend, mo->opt.n_layers = (int32_t)a->layers, mo->opt.routes = bench_routes(&a->b);
    mo->opt.n_threads = (int32_t)a->b.threads;
    if (cuda) mo->opt.plan_backend = NULL;
    else mo->opt.plan_backend = "cuda"; /* the CPU emulates the GPU's formats */
}

/* --ep N: a group of ranks in this process, one preset (the first given; fp8 by default). */
static int run_ranks(const char *cmd, const decode_args *a, cli_model_opts *mo) {
    if (a->json_object) return cli_usage(cmd, "--json-object is not supported with --ep");
    if (a->per_op) return cli_usage(cmd, "--per-op is not supported with --ep");
    if (a->prompt_rows) return cli_usage(cmd, "--prompt-rows is not supported with --ep");
    if (!strcmp(a->b.backend, "cuda"))
        return cli_usage(cmd, "--ep runs on the cpu backend (--backend cpu): on cuda every rank would share "
                              "the one GPU, whose steps time no multi-GPU decode");
    const char *preset = a->presets_given ? k_presets[a->pidx[0]] : "fp8";
    fm_preset pr = FM_PRESET_REF;
    fm_preset_parse(!strcmp(preset, "fp8+w8a8") ? "fp8" : preset, &pr);
    mo->opt.preset = pr, mo->opt.dense = !strcmp(preset, "fp8+w8a8") ? FM_DENSE_W8A8 : FM_DENSE_PRESET;
    mo->opt.dispatch = a->dispatch, mo->opt.ep_ranks = (int32_t)a->ep, mo->opt.verbose = a->b.verbose;
    return bench_decode_ranks(cmd, a->synth, mo, preset, a->batches, a->nb, a->context, a->b.repeat, a->b.warmup,
                              a->b.json_path);
}

/* --per-op: one table per row, each op of the profiled step (per layer kind, summed over its layers) with its time,
 * its bytes, the rate they moved at, and their floor at the bandwidth (when there is one) */
static void print_ops(const decode_args *a, const decode_row *r) {
    const fm_op_profile *o = &r->ops;
    const double bw = a->bandwidth;
    printf("\nper op, %s batch %lld, one step without a graph (time between marks after each op, ms; MB the op must "
           "move: weights read, activations, KV cache%s):\n\n| kind | op | count | ms | MB | GB/s |%s\n"
           "|---|---|---:|---:|---:|---:|%s\n",
           r->preset, (long long)r->batch, bw > 0 ? "; floor at the bandwidth" : "",
           bw > 0 ? " floor ms | floor / time |" : "", bw > 0 ? "---:|---:|" : "");
    for (int32_t i = 0; i <= o->n; i++) {
        const bool total = i == o->n;
        const double ms = total ? o->step_ms : o->rows[i].ms, bytes = total ? o->step_bytes : o->rows[i].bytes;
        if (total) printf("| step | total | | %.3f | %.3f | %.1f |", ms, bytes / 1e6, ms > 0 ? bytes / (ms * 1e6) : 0);
        else
            printf("| %s | %s | %d | %.3f | %.3f | %.1f |", o->rows[i].kind, o->rows[i].op, o->rows[i].count, ms,
                   bytes / 1e6, ms > 0 ? bytes / (ms * 1e6) : 0);
        if (bw > 0) printf(" %.4f | %.2f |", 1e3 * bytes / bw, ms > 0 ? 1e3 * bytes / bw / ms : 0);
        printf("\n");
    }
}

/* The step times, then (experts in host memory) the expert cache's table, then the stages of one step; the host
 * link's rate is measured here when a row needs it (link_gbps, dma_gbps: 0 when not). */
static void print_tables(const char *cmd, const decode_args *a, const decode_row *rows, double *link_gbps,
                         double *dma_gbps) {
    const int n = a->np * a->nb;
    if (a->prompt_rows)
        printf("mixed steps: every step also runs a prompt chunk of %ld rows (positions 0..%ld of one more sequence) "
               "as the scheduler does while a prompt arrives (route mixed.graphs: the layers as a graph of the row "
               "bucket); tokens/s counts the decode rows\n",
               a->prompt_rows, a->prompt_rows - 1);
    printf("bench decode %s: context %ld, %ld steps after %ld warm-up, backend %s%s%s, int4 scales %s, lm_head %s, "
           "KV cache %s, routing %s, experts in %s, input %s%s\n",
           a->synth, a->context, a->b.repeat, a->b.warmup, a->b.backend, a->b.routes[0] ? ", routes " : "", a->b.routes,
           fm_int4_scales_name(a->int4_scales),
           a->lm_head == FM_LM_HEAD_DENSE ? "dense (ref: float)" : fm_lm_head_name(a->lm_head),
           fm_kv_dtype_name(a->kv_cache), a->routing ? a->routing : "uniform", fm_experts_in_name(a->experts_in),
           a->random_ids ? "random" : "sampled",
           !a->json_object  ? ""
           : a->mask_before ? ", every sequence constrained to JSON objects (masks on the host, before each step)"
                            : ", every sequence constrained to JSON objects (masks on the host, during the pass)");
    printf("\n| preset | batch | median ms | min | max | tokens/s | MB read / step | floor ms | floor / time |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const decode_row *r = &rows[i];
        if (r->status != BENCH_OK) {
            printf("| %s | %lld | %s: %s | | | | | | |\n", r->preset, (long long)r->batch, bench_status_name(r->status),
                   r->msg);
            continue;
        }
        printf("| %s | %lld | %.3f | %.3f | %.3f | %.0f | %.3f | %.3f | %.2f |\n", r->preset, (long long)r->batch,
               r->median_ms, r->min_ms, r->max_ms, r->tokens_per_s, r->bytes / 1e6, r->floor_ms,
               r->floor_ms / r->median_ms);
    }
    if (a->json_object) {
        printf("\nthe host's mask fill per step (every sequence's mask, in parallel; medians: the wall time, and the "
               "rows' CPU time summed):\n\n| preset | batch | fill ms | fill / step | fill CPU ms |\n"
               "|---|---:|---:|---:|---:|\n");
        for (int i = 0; i < n; i++)
            if (rows[i].status == BENCH_OK)
                printf("| %s | %lld | %.3f | %.2f | %.3f |\n", rows[i].preset, (long long)rows[i].batch,
                       rows[i].mask_fill_ms, rows[i].mask_fill_ms / rows[i].median_ms, rows[i].mask_fill_cpu_ms);
    }
    bool any_graph = false;
    for (int i = 0; i < n; i++) any_graph |= rows[i].status == BENCH_OK && rows[i].graph;
    if (any_graph) {
        printf("\nlaunches per decode step (the nodes of the batch bucket's captured graph: kernels, memory copies and "
               "sets, the rest):\n\n| preset | batch | kernels | copies | other |\n|---|---:|---:|---:|---:|\n");
        for (int i = 0; i < n; i++)
            if (rows[i].status == BENCH_OK && rows[i].graph)
                printf("| %s | %lld | %lld | %lld | %lld |\n", rows[i].preset, (long long)rows[i].batch,
                       (long long)rows[i].nodes.kernels, (long long)rows[i].nodes.copies,
                       (long long)rows[i].nodes.other);
    }
    bool any_host = false;
    for (int i = 0; i < n; i++) any_host |= rows[i].status == BENCH_OK && rows[i].host;
    if (any_host && !strcmp(a->b.backend, "cuda")) { /* the floor of the misses: their bytes at the host link's rate */
        printf("\n");
        bench_host_link(cmd, link_gbps, dma_gbps);
    }
    if (any_host) {
        char lim[64] = "";
        if (a->vram_limit > 0) snprintf(lim, sizeof lim, ", --vram-limit %.2f GiB", (double)a->vram_limit / (1 << 30));
        printf("\nexpert cache over the timed steps (%s%s; the hit rate and MB copied are the layers' own fetches, "
               "MB prefetched what the expert prefetch copied ahead of them, route expert.prefetch):\n\n| preset | "
               "batch | slots | hit rate | MB copied / step | MB prefetched / step | link floor ms / step | expert "
               "fetch ms (stage) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
               fm_expert_policy_name(a->policy), lim);
        for (int i = 0; i < n; i++) {
            const decode_row *r = &rows[i];
            if (r->status == BENCH_OK && r->host)
                printf("| %s | %lld | %d | %.2f%% | %.3f | %.3f | %.3f | %.3f |\n", r->preset, (long long)r->batch,
                       r->slots, 100.0 * r->hit_rate, r->copied_per_step / 1e6, r->prefetched_per_step / 1e6,
                       *link_gbps > 0 ? (r->copied_per_step + r->prefetched_per_step) / (*link_gbps * 1e9) * 1e3 : 0.0,
                       r->prof.stage_ms[FM_STAGE_FETCH]);
        }
    }
    printf("\nper stage, one step without a graph (device time between stage marks, ms):\n\n| preset | batch |");
    for (int s = 0; s < FM_STAGE_COUNT; s++) printf(" %s |", fm_stage_name((fm_stage)s));
    printf(" total |\n|---|---:|");
    for (int s = 0; s <= FM_STAGE_COUNT; s++) printf("---:|");
    printf("\n");
    for (int i = 0; i < n; i++) {
        const decode_row *r = &rows[i];
        if (r->status != BENCH_OK) continue;
        printf("| %s | %lld |", r->preset, (long long)r->batch);
        for (int s = 0; s < FM_STAGE_COUNT; s++) printf(" %.3f |", r->prof.stage_ms[s]);
        printf(" %.3f |\n", r->prof.total_ms);
    }
    for (int i = 0; a->per_op && i < n; i++)
        if (rows[i].status == BENCH_OK) print_ops(a, &rows[i]);
}

static void add_ops_json(cJSON *o, const decode_args *a, const fm_op_profile *p) {
    cJSON *arr = cJSON_AddArrayToObject(o, "ops");
    for (int32_t i = 0; i < p->n; i++) {
        const fm_op_row *r = &p->rows[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "kind", r->kind);
        cJSON_AddStringToObject(j, "op", r->op);
        cJSON_AddNumberToObject(j, "count", r->count);
        cJSON_AddNumberToObject(j, "ms", r->ms);
        cJSON_AddNumberToObject(j, "bytes", r->bytes);
        if (a->bandwidth > 0) cJSON_AddNumberToObject(j, "floor_ms", 1e3 * r->bytes / a->bandwidth);
        cJSON_AddItemToArray(arr, j);
    }
    cJSON_AddNumberToObject(o, "ops_step_ms", p->step_ms);
    cJSON_AddNumberToObject(o, "ops_step_bytes", p->step_bytes);
}

static fm_status write_json(const decode_args *a, const decode_row *rows, double link_gbps, double dma_gbps,
                            fm_error *err) {
    cJSON *root = bench_json_root("decode", a->b.backend, "", a->b.repeat, a->b.warmup);
    cJSON_AddStringToObject(root, "model", a->synth);
    /* the floors' bandwidth: --bandwidth, else the H200's */
    cJSON_ReplaceItemInObject(root, "bandwidth_bytes_per_s",
                              cJSON_CreateNumber(a->bandwidth > 0 ? a->bandwidth : BENCH_BANDWIDTH_BYTES_PER_S));
    cJSON_AddBoolToObject(root, "per_op", a->per_op);
    cJSON_AddNumberToObject(root, "prompt_rows", (double)a->prompt_rows);
    cJSON_AddNumberToObject(root, "context", (double)a->context);
    cJSON_AddStringToObject(root, "routes", a->b.routes);
    cJSON_AddStringToObject(root, "int4_scales", fm_int4_scales_name(a->int4_scales));
    cJSON_AddStringToObject(root, "lm_head", fm_lm_head_name(a->lm_head));
    cJSON_AddStringToObject(root, "routing", a->routing ? a->routing : "uniform");
    cJSON_AddStringToObject(root, "experts_in", fm_experts_in_name(a->experts_in));
    cJSON_AddNumberToObject(root, "vram_limit", (double)a->vram_limit);
    cJSON_AddStringToObject(root, "decode_input", a->random_ids ? "random" : "sampled");
    cJSON_AddBoolToObject(root, "json_object", a->json_object);
    if (a->json_object) {
        cJSON_AddStringToObject(root, "mask_order", a->mask_before ? "before" : "overlap");
        cJSON_AddNumberToObject(root, "mask_cache", a->mask_cache < 0 ? FM_MASK_CACHE_DEFAULT : a->mask_cache);
    }
    if (link_gbps > 0) {
        cJSON_AddNumberToObject(root, "host_link_gbps", link_gbps);
        cJSON_AddNumberToObject(root, "host_link_dma_gbps", dma_gbps);
    }
    cJSON_AddStringToObject(root, "expert_policy", fm_expert_policy_name(a->policy));
    cJSON_AddStringToObject(root, "kv_cache", fm_kv_dtype_name(a->kv_cache));
    cJSON *arr = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; i < a->np * a->nb; i++) {
        const decode_row *r = &rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "preset", r->preset);
        cJSON_AddNumberToObject(o, "batch", (double)r->batch);
        cJSON_AddStringToObject(o, "status", bench_status_name(r->status));
        if (r->status == BENCH_OK) {
            cJSON_AddNumberToObject(o, "median_ms", r->median_ms);
            cJSON_AddNumberToObject(o, "min_ms", r->min_ms);
            cJSON_AddNumberToObject(o, "max_ms", r->max_ms);
            cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
            cJSON_AddNumberToObject(o, "bytes_per_step", r->bytes);
            cJSON_AddNumberToObject(o, "floor_ms", r->floor_ms);
            if (a->json_object) {
                cJSON_AddNumberToObject(o, "mask_fill_ms", r->mask_fill_ms);
                cJSON_AddNumberToObject(o, "mask_fill_cpu_ms", r->mask_fill_cpu_ms);
            }
            if (r->graph) {
                cJSON_AddNumberToObject(o, "graph_kernels", (double)r->nodes.kernels);
                cJSON_AddNumberToObject(o, "graph_copies", (double)r->nodes.copies);
                cJSON_AddNumberToObject(o, "graph_other_nodes", (double)r->nodes.other);
            }
            if (r->host) {
                cJSON_AddNumberToObject(o, "expert_slots", r->slots);
                cJSON_AddNumberToObject(o, "expert_hit_rate", r->hit_rate);
                cJSON_AddNumberToObject(o, "expert_bytes_copied_per_step", r->copied_per_step);
                cJSON_AddNumberToObject(o, "expert_bytes_prefetched_per_step", r->prefetched_per_step);
            }
            cJSON *stg = cJSON_AddObjectToObject(o, "stage_ms_no_graph");
            for (int s = 0; s < FM_STAGE_COUNT; s++)
                cJSON_AddNumberToObject(stg, fm_stage_name((fm_stage)s), r->prof.stage_ms[s]);
            if (a->per_op) add_ops_json(o, a, &r->ops);
        } else {
            cJSON_AddStringToObject(o, "message", r->msg);
        }
        cJSON_AddItemToArray(arr, o);
    }
    return bench_json_write(root, a->b.json_path, err);
}

int cmd_bench_decode(int argc, char **argv) {
    const char *cmd = "bench decode";
    decode_args a;
    memset(&a, 0, sizeof a);
    const int rc = parse_args(cmd, argc, argv, &a);
    if (rc >= 0) return rc;
    cli_model_opts mo;
    plan_run(&a, &mo);
    if (a.ep > 1) return run_ranks(cmd, &a, &mo);
    if (a.dispatch != FM_DISPATCH_PRESET) return cli_usage(cmd, "--dispatch is for --ep (the presets set the format)");
    decode_row *rows = calloc((size_t)(a.np * a.nb), sizeof *rows);
    if (!rows) return CLI_BAD_INPUT;
    for (int i = 0; i < a.np; i++) run_preset(&a, k_presets[a.pidx[i]], &mo, rows + i * a.nb);
    double link_gbps = 0, dma_gbps = 0;
    print_tables(cmd, &a, rows, &link_gbps, &dma_gbps);
    fm_status st = FM_OK;
    fm_error err = {{0}};
    if (a.b.json_path) st = write_json(&a, rows, link_gbps, dma_gbps, &err);
    int failed = 0;
    for (int i = 0; i < a.np * a.nb; i++) failed += rows[i].status == BENCH_FAILED;
    free(rows);
    if (st) return cli_fail(cmd, st, &err);
    return failed ? CLI_BAD_INPUT : CLI_OK;
}
