/* fp8moe inspect: what a checkpoint is, without loading its weights: architecture, shapes, dtypes,
 * parameter counts and the bytes it takes in each weight format; with --tokens, the memory plan of a backend
 * and preset (engine/memory_plan.h) and whether it fits the GPU or a --vram-limit; with --routes, the kernel route
 * table (backend/routes.h) and the kernels it picks at the model's shapes. */
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_kind.h"
#include "backend/routes.h"
#include "cli/cli.h"
#include "engine/memory_plan.h"
#include "engine/weight_format.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model_src.h"
#include "dist/ep_moe.h"
#include "dist/rank_group.h"
#include "dist/tp_attention.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe inspect --model DIR [--tensors] [--tokens T [--backend B] [--preset P] [--dense w8a8] [--layers N]\n"
    "                      [--max-seqs B [--ctx N]] [--vram-limit BYTES] [--experts-in W [--expert-slots N]]\n"
    "                      [--ep N] [--tp N]]\n"
    "                      [--routes] [--route KEY=VALUE]...\n"
    "       fp8moe inspect --routes [--route KEY=VALUE]...\n"
    "       fp8moe inspect --routes --markdown\n"
    "\n"
    "  --model DIR        Hugging Face checkpoint directory\n"
    "  --tensors          also list every tensor with its dtype and shape\n"
    "  --tokens T         also print the memory plan for a prompt of T tokens: weights by family, activation\n"
    "                     buffers, workspace, total, computed before anything is allocated\n"
    "  --backend B        the plan's backend: cpu (default) or cuda\n"
    "  --preset P         the plan's preset: ref (default), ref32, int4, fp8, fp4\n"
    "  --dense w8a8       the plan with e4m3 per-tensor dense projections (W8A8)\n"
    "  --dispatch D       the plan with the experts' dispatch buffer in D: bf16, fp8, mxfp4, nvfp4 (as run, generate)\n"
    "  --layers N         plan only the first N decoder layers\n"
    "  --max-seqs B       the plan for generation too: the paged KV cache of B sequences and the decode state\n"
    "  --ctx N            tokens per sequence of that KV cache (default: max_position_embeddings)\n"
    "  --vram-limit BYTES cuda: say whether the plan fits in this much memory (8Gi, 7.5G, bytes) instead of\n"
    "                     the GPU's free memory\n"
    "  --experts-in W     the plan with the routed experts on the device (default), in host memory (host: an\n"
    "                     expert cache of slots on the device, sized by --expert-slots or what --vram-limit or\n"
    "                     the free memory leaves), or auto (host only when the plan does not fit otherwise)\n"
    "  --expert-slots N   experts in host memory: the slots of the expert cache\n"
    "  --ep N             the plan per rank of expert parallelism over N ranks: each rank's experts and bytes\n"
    "  --tp N             the same for tensor parallelism of attention (each rank's heads); with --ep, one group\n"
    "  --routes           print the cuda backend's kernel route table: each key, its value, default and what it\n"
    "                     decides, then the kernel of each dense weight format at M = 1, 8, 16, 128, 2048 rows and\n"
    "                     the W4A8 MoE tile rows at several prompt lengths, for the model's shapes (without\n"
    "                     --model: a Qwen3-30B-A3B-like shape), as on this machine's GPU (on sm_90 when there is\n"
    "                     none; it says which)\n"
    "  --markdown         with --routes alone: the keys' reference page instead (docs/routes.md is its output)\n"
    "  --route KEY=VALUE  an override (repeatable), as the model-running commands take it: the table and the memory\n"
    "                     plan (w4a8.tile sizes the MoE workspace) follow it. The keys and their values: --routes,\n"
    "                     or docs/routes.md\n"
    "  -h, --help         this help\n";

typedef struct plan_args {
    int64_t tokens, vram_limit;
    const char *backend;
    fm_preset preset;
    int32_t n_layers;
    fm_dense dense;
    int32_t max_seqs; /* --max-seqs: generation's KV cache in the plan */
    int64_t ctx;
    char routes[512]; /* --route options, "k=v,k=v" */
    fm_experts_in experts_in;
    int32_t expert_slots;
    fm_dispatch dispatch; /* --dispatch: the experts' dispatch buffer format (sizes the W4A8 MoE scratch) */
    int32_t ep, tp;       /* --ep, --tp: the partition over that many ranks (0: none) */
} plan_args;

/* The shapes the route table is shown at: a model's, or Qwen3-30B-A3B's. */
typedef struct route_shapes {
    const char *what;
    int64_t hidden, attn, widest_k; /* hidden size, attention width (heads x head dim), the widest linear input */
    int64_t qkv_n;                  /* fused q|k|v rows */
    int32_t n_experts, top_k;       /* 0 experts: no MoE layer */
} route_shapes;

/* a dense kernel in a table cell */
static const char *kernel_cell(fm_dense_kernel k, const fm_routes *r) {
    switch (k) {
    case FM_DK_CUBLAS: return "cublas";
    case FM_DK_W4A16_GEMV: return "w4a16-gemv";
    case FM_DK_W4A8_GEMV: return "w4a8-gemv";
    case FM_DK_W4A8_GEMM: return fm_routes_w4a8_wgmma(r) ? "w4a8-gemm-wgmma" : "w4a8-gemm-mma";
    case FM_DK_W8A8_GEMV: return "w8a8-gemv";
    case FM_DK_W8A8_CUBLASLT: return "cublaslt-fp8";
    }
    return "?";
}

/* The route table (its values after the overrides), then what it picks at the shapes. */
static fm_status print_routes(const route_shapes *s, const char *overrides, fm_error *err) {
    int sm = 0;
    char gpu[256];
    fm_error qerr = {{0}};
    const fm_backend_kind *gpu_kind = fm_backend_kind_find("cuda"); /* the routes are the cuda backend's */
    const bool have_gpu = gpu_kind->device_query(&sm, gpu, sizeof gpu, &qerr) == FM_OK;
    if (!have_gpu) sm = 9;
    fm_routes r;
    fm_routes_default(&r, sm);
    fm_status st = fm_routes_apply(&r, overrides, err);
    if (st) return st;
    if (have_gpu) printf("kernel routes: the cuda backend on this GPU, %s\n", gpu);
    else
        printf("kernel routes: as the cuda backend would fill them on an sm_90 GPU (Hopper, e.g. H200); no GPU here "
               "(%s)\n",
               qerr.msg);
    printf("overrides (--route, fm_options.routes): %s\n", overrides && *overrides ? overrides : "none");
    fm_routes_print(&r, stdout);

    static const int64_t rows[] = {1, 8, 16, 128, 2048};
    static const struct {
        fm_wformat f;
        const char *where;
    } formats[] = {{FM_W_BF16, "ref"},
                   {FM_W_INT4_G128, "int4"},
                   {FM_W_INT4_G128_TC, "fp8"},
                   {FM_W_E4M3_PT, "--dense w8a8"},
                   {FM_W_INT4_ZP_TC, "fp8, int4 checkpoint"},
                   {FM_W_E4M3_B128, "fp8, block-FP8 checkpoint"}};
    printf(
        "dense projections (%s: q|k|v %lld x %lld, o %lld x %lld; K up to %lld), kernel by weight format and M rows:\n",
        s->what, (long long)s->qkv_n, (long long)s->hidden, (long long)s->hidden, (long long)s->attn,
        (long long)s->widest_k);
    printf("  %-13s %-26s", "format", "preset");
    for (size_t m = 0; m < sizeof rows / sizeof *rows; m++) printf(" M=%-14lld", (long long)rows[m]);
    printf("\n");
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
        printf("  %-13s %-26s", fm_wformat_name(formats[f].f), formats[f].where);
        for (size_t m = 0; m < sizeof rows / sizeof *rows; m++)
            printf(" %-16s", kernel_cell(fm_routes_dense_kernel(&r, formats[f].f, rows[m], s->widest_k), &r));
        printf("\n");
    }
    printf("  (w4a8-gemm: %s; gemv kernels%s)\n", fm_dense_kernel_name(&r, FM_DK_W4A8_GEMM),
           fm_routes_pdl(&r) ? " launched with PDL" : " launched without PDL");
    if (s->n_experts > 0) {
        static const int64_t tokens[] = {1, 2, 16, 64, 256, 512, 2048};
        printf("MoE experts (%d experts, top-%d, fp8 preset) by prompt length or decode batch T; router by T:\n",
               s->n_experts, s->top_k);
        printf("  %-10s %-12s %-46s %s\n", "T", "pairs P", "experts", "router");
        for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++) {
            const uint64_t P = (uint64_t)tokens[t] * (uint64_t)s->top_k;
            char kernel[96];
            if (fm_routes_moe_gemv(&r, P, (uint64_t)s->n_experts, (uint64_t)s->top_k))
                snprintf(kernel, sizeof kernel, "grouped W4A8 GEMVs mma.sync, 16-row tiles");
            else
                snprintf(kernel, sizeof kernel, "grouped W4A8 GEMM %s, %u-row tiles",
                         fm_routes_w4a8_wgmma(&r) ? "wgmma" : "mma.sync",
                         fm_routes_w4a8_tile_rows(&r, P, (uint64_t)s->n_experts));
            printf("  %-10lld %-12llu %-46s %s\n", (long long)tokens[t], (unsigned long long)P, kernel,
                   fm_routes_router_fused(&r, tokens[t]) ? "fused GEMV + top-k" : "cuBLAS GEMM + top-k");
        }
        printf("  (bf16 experts, ref: grouped cuBLAS GEMMs; int4 experts, int4: per-token W4A16 GEMVs)\n");
    }
    return FM_OK;
}

static route_shapes shapes_of(const char *dir, const fm_config *c) {
    route_shapes s = {dir,
                      c->hidden_size,
                      (int64_t)c->n_heads * c->head_dim,
                      0,
                      (int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim,
                      c->n_experts,
                      c->n_experts_per_tok};
    s.widest_k = fm_arch_widest_dense_k(c, c->n_layers);
    return s;
}

static void print_shape(const fm_wsrc *w, const char *name) {
    if (w->rows == 1 && w->t && w->t->n_dims == 1) printf("  %-28s [%lld]\n", name, (long long)w->cols);
    else printf("  %-28s [%lld, %lld]\n", name, (long long)w->rows, (long long)w->cols);
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

static void print_model(const char *dir, const fm_config *c, const fm_st_set *set, const fm_model_src *src) {
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += c->layer_is_moe[l];
    printf("model: %s\n", dir);
    printf("architecture: %s, %d layers (%d MoE, %d dense MLP)\n", c->model_type, c->n_layers, n_moe,
           c->n_layers - n_moe);
    printf("hidden %d, vocab %d, attention: %d query / %d key-value heads of %d (GQA group %d)%s\n", c->hidden_size,
           c->vocab_size, c->n_heads, c->n_kv_heads, c->head_dim, c->n_heads / c->n_kv_heads,
           c->qk_norm ? ", q/k RMSNorm" : "");
    if (c->n_experts > 0)
        printf("experts: %d, top-%d, width %d, router %s%s, stored as %s\n", c->n_experts, c->n_experts_per_tok,
               c->moe_intermediate, c->router == FM_ROUTER_SOFTMAX_TOPK ? "softmax -> top-k" : "top-k -> softmax",
               c->router == FM_ROUTER_SOFTMAX_TOPK ? (c->norm_topk_prob ? " -> renormalise" : " (no renormalisation)")
                                                   : "",
               n_moe ? fm_expert_layout_name(src->layers[c->n_layers - 1].is_moe ? src->layers[c->n_layers - 1].layout
                                                                                 : src->layers[0].layout)
                     : "-");
    if (c->shared_expert_intermediate > 0)
        printf("shared expert: width %d, output scaled by sigmoid(shared_expert_gate)\n",
               c->shared_expert_intermediate);
    if (n_moe < c->n_layers) printf("dense MLP width: %d\n", c->dense_intermediate);
    int n_gdn = 0;
    for (int l = 0; l < c->n_layers; l++) n_gdn += c->layer_is_gdn[l];
    if (n_gdn > 0 || c->attn_output_gate) {
        printf(
            "token mixers: %d Gated DeltaNet (linear attention: %d key / %d value heads of %d / %d, conv kernel %d), "
            "%d %sfull attention\nlayer kinds:",
            n_gdn, c->gdn_k_heads, c->gdn_v_heads, c->gdn_k_dim, c->gdn_v_dim, c->gdn_conv_kernel, c->n_layers - n_gdn,
            c->attn_output_gate ? "gated " : "");
        for (int l = 0; l < c->n_layers; l++) printf("%s%c", l % 8 ? "" : " ", c->layer_is_gdn[l] ? 'L' : 'F');
        printf("  (L linear attention, F full attention)\n");
    }
    printf("rope theta %g", c->rope_theta);
    if (c->rotary_dim != c->head_dim) printf(" on %d of %d dims per head", c->rotary_dim, c->head_dim);
    printf(", rms_norm_eps %g, tie_word_embeddings %s\n", (double)c->rms_norm_eps,
           c->tie_word_embeddings ? "true" : "false");
    if (fm_arch_of(c)->plus_one_banks) printf("RMSNorm weights: zero-centred (scale 1 + w)\n");
    if (fm_arch_of(c)->ignored) printf("ignored: %s\n", fm_arch_of(c)->ignored);

    int64_t by_dtype[FM_DTYPE_COUNT] = {0}, bytes_dtype[FM_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < set->n_tensors; i++) {
        by_dtype[set->by_name[i]->dtype]++;
        bytes_dtype[set->by_name[i]->dtype] += (int64_t)set->by_name[i]->nbytes;
    }
    printf("tensors: %lld in %d file(s):", (long long)set->n_tensors, set->n_files);
    for (int d = 0; d < FM_DTYPE_COUNT; d++)
        if (by_dtype[d])
            printf(" %s x%lld (%.2f MiB)", fm_dtype_name((fm_dtype)d), (long long)by_dtype[d],
                   mib((double)bytes_dtype[d]));
    printf("\nunused tensors: %lld\n", (long long)src->n_unused);

    /* parameters: total, and active per token (the linears of the description: attention, k of the experts, dense
       layers; the router; embeddings/head and norms in `other`) */
    const fm_arch_desc *arch = fm_arch_of(c);
    int64_t linear = 0, active = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(arch, c, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *w = &d->specs[i];
            if (w->family == FM_WF_NORM || !fm_spec_present(w, c)) continue;
            const int64_t one = fm_spec_rows(w, c) * fm_spec_cols(w, c);
            if (w->family == FM_WF_EXPERTS) linear += c->n_experts * one, active += c->n_experts_per_tok * one;
            else if (w->family == FM_WF_ROUTER) active += one;
            else linear += one, active += one;
        }
    }
    const int64_t other = src->n_params - linear;
    printf("parameters: %.3f M total, %.3f M active per token; %.3f M in linear projections\n",
           (double)src->n_params / 1e6, (double)(active + other) / 1e6, (double)linear / 1e6);
    /* int4 g128 with one bf16 scale per 128 weights: 0.5 + 2/128 bytes per weight */
    printf("weight bytes: fp32 %.2f MiB | bf16 %.2f MiB | int4 g128 linear + bf16 rest %.2f MiB\n",
           mib(4.0 * (double)src->n_params), mib(2.0 * (double)src->n_params),
           mib((double)linear * (0.5 + 2.0 / 128.0) + 2.0 * (double)other));

    /* layer 0's shapes, and those of the first layer of another token mixer (Qwen3-Next) */
    for (int l = 0; l < c->n_layers; l++) {
        if (l > 0 && c->layer_is_gdn[l] == c->layer_is_gdn[0]) continue;
        if (l > 0) printf("shapes (layer %d, %s):\n", l, c->layer_is_gdn[l] ? "linear attention" : "full attention");
        else printf("shapes (layer 0):\n");
        if (l == 0) print_shape(&src->embed, "embed_tokens");
        const fm_layer_src *L = &src->layers[l];
        const fm_layer_desc *d0 = fm_arch_layer(arch, c, l);
        for (int32_t i = 0; i < d0->n_specs; i++)
            for (int32_t j = 0; j < d0->specs[i].n_parts; j++) {
                const fm_part_spec *p = &d0->specs[i].parts[j];
                if (p->inspect && fm_spec_present(&d0->specs[i], c))
                    print_shape(fm_layer_src_cviews(L, p->slot), p->inspect);
            }
        if (l == 0) print_shape(&src->lm_head, c->tie_word_embeddings ? "lm_head (tied)" : "lm_head");
        if (l > 0) break;
    }
}

/* Pre-quantized checkpoints: per weight family, how many linears are stored quantized and the bytes they take in the
 * checkpoint and resident on the cpu backend under the preset that keeps the checkpoint's numbers (int4 for int4
 * checkpoints, fp8 for block-FP8), each linear in the format the load picks (engine/weight_format.h) and the bytes the
 * backend's kind gives it (backend/backend_kind.h). */
typedef struct quant_family {
    const char *name;
    int64_t n, n_quant, n_native;
    double ckpt_bytes, bank_bytes;
} quant_family;

/* the plan whose resident bytes the table counts, and the first linear it refuses (counted dequantized to fp32) */
typedef struct quant_view {
    fm_plan plan;
    const fm_backend_kind *kind;
    fm_quant_method method;
    bool refused;
    fm_error refusal;
} quant_view;

static void quant_add(quant_family *f, quant_view *v, const fm_wsrc *w, bool shares_order, fm_wfamily family,
                      const char *label) {
    f->n++;
    const fm_qsrc *q = &w->q;
    const fm_st_tensor *parts[4] = {q->packed, q->zeros, q->scales, q->g_idx};
    for (int i = 0; i < 4; i++) f->ckpt_bytes += parts[i] ? (double)parts[i]->nbytes : 0;
    if (!fm_wsrc_is_quantized(w) && w->t)
        f->ckpt_bytes += (double)w->rows * (double)w->cols * fm_dtype_size(w->t->dtype);
    f->n_quant += fm_wsrc_is_quantized(w);
    fm_bank_origin o;
    fm_bank_origin_of_srcs(v->method, w, 1, &o);
    fm_wformat fmt;
    bool native = false;
    fm_error e = {{0}};
    if (fm_weight_format(&v->plan, v->kind, family, &o, label, &fmt, &native, &e)) {
        if (!v->refused) v->refused = true, v->refusal = e;
        fmt = FM_W_F32; /* as the ref preset reads it */
    }
    f->n_native += native;
    /* an act-order matrix keeps its input order, which the later parts of a fused bank share */
    f->bank_bytes +=
        (double)(fm_wformat_is_int4zp(fmt) ? v->kind->bank_bytes_int4zp(fmt == FM_W_INT4_ZP_TC, 1, w->rows, w->cols,
                                                                        q->group, q->g_idx && !shares_order)
                                           : v->kind->bank_bytes(fmt, 1, w->rows, w->cols));
}

static void print_quantization(const fm_config *c, const fm_model_src *src) {
    char d[128];
    fm_quant_config_describe(&c->quant, d, sizeof d);
    printf("quantization: %s", d);
    if (c->quant.n_ignore) printf(", %d ignore entries", c->quant.n_ignore);
    printf("\n");
    const bool fp8 = c->quant.method == FM_QUANT_FP8_BLOCK;
    quant_view v = {.kind = fm_backend_kind_find("cpu"), .method = c->quant.method};
    fm_plan_for_backend(fp8 ? FM_PRESET_FP8 : FM_PRESET_INT4, "cpu", &v.plan);
    quant_family fam[5] = {{"attention (qkv + o)", 0, 0, 0, 0, 0},
                           {"router", 0, 0, 0, 0, 0},
                           {"experts (gate_up + down)", 0, 0, 0, 0, 0},
                           {"dense MLP (gate_up + down)", 0, 0, 0, 0, 0},
                           {"lm_head", 0, 0, 0, 0, 0}};
    /* the quantization row of each family of the description; a part after the first of a fused bank (k, v; up)
       shares the first's input order */
    const int row[FM_WF_COUNT] = {
        [FM_WF_NORM] = -1, [FM_WF_ATTN] = 0, [FM_WF_ROUTER] = 1, [FM_WF_EXPERTS] = 2, [FM_WF_DENSE_MLP] = 3};
    const fm_arch_desc *arch = fm_arch_of(c);
    for (int l = 0; l < c->n_layers; l++) {
        const fm_layer_src *L = &src->layers[l];
        const fm_layer_desc *d = fm_arch_layer(arch, c, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *w = &d->specs[i];
            if (row[w->family] < 0 || !fm_spec_present(w, c)) continue;
            const int32_t n = fm_spec_count(w, c);
            char label[96];
            snprintf(label, sizeof label, "layer %d %s", l, w->label);
            for (int32_t e = 0; e < n; e++)
                for (int32_t j = 0; j < w->n_parts; j++)
                    quant_add(&fam[row[w->family]], &v, &fm_layer_src_cviews(L, w->parts[j].slot)[e], j > 0, w->family,
                              label);
        }
    }
    if (src->lm_head.t != src->embed.t || fm_wsrc_is_quantized(&src->lm_head))
        quant_add(&fam[4], &v, &src->lm_head, false, FM_WF_NORM, "lm_head");
    printf("  %-28s %16s %16s %18s %10s\n", "family", fp8 ? "fp8 / linears" : "int4 / linears", "checkpoint MiB",
           "resident MiB", "native");
    for (int f = 0; f < 5; f++)
        if (fam[f].n)
            printf("  %-28s %7lld / %-6lld %16.3f %18.3f %10lld\n", fam[f].name, (long long)fam[f].n_quant,
                   (long long)fam[f].n, mib(fam[f].ckpt_bytes), mib(fam[f].bank_bytes), (long long)fam[f].n_native);
    if (fp8)
        printf("  (resident: the fp8 preset on the cpu backend, which keeps the e4m3 bytes (e4m3-block); ref and ref32 "
               "dequantize them, the int4 preset refuses block-FP8; float linears and router/lm_head are fp32 on the "
               "cpu. `--tokens T --backend cuda --preset P` gives the bytes on the GPU)\n");
    else
        printf(
            "  (resident: the int4 preset on the cpu backend; native: linears in our own int4 format (symmetric, group "
            "128, bf16 scales), bound as int4-g128 banks on every backend and preset; the other int4 linears keep "
            "the checkpoint's own int4 (int4-zp; int4-zp-tc with e4m3 1x128 activations under --preset fp8); float "
            "ones and router/lm_head are bf16 banks (fp32 values on the cpu). `--tokens T --backend cuda --preset P` "
            "gives the bytes on the GPU)\n");
    if (v.refused)
        printf("  (the %s preset refuses this checkpoint, counted dequantized to fp32 instead: %s)\n",
               fm_preset_name(v.plan.preset), v.refusal.msg);
}

static void plan_row(const char *what, size_t bytes, int indent) {
    printf("  %*s%-*s %12.2f %16zu\n", indent, "", 44 - indent, what, mib((double)bytes), bytes);
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
           (long long)T, 100.0 * (N - 1) / N, mib(copies * bf16), mib(copies * e4m3), mib(copies * mx), mx / e4m3,
           mib(copies * nv), nv / e4m3, mib(copies * bf16));
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
               mib((double)experts), mib((double)attn), mib((double)(q.weight_total - experts - attn)),
               mib((double)q.ep_exchange), mib((double)q.peak));
    }
    if (ep > 1) print_exchange_bytes(cfg, p->tokens, ep);
    return FM_OK;
}

/* The memory plan section: returns the status of computing it (usage errors: a bad --layers). */
static fm_status print_plan(const fm_config *cfg_in, const fm_model_src *src, const plan_args *a, fm_error *err) {
    fm_config cfg = *cfg_in;
    cfg.quant.native_layout = src->cfg.quant.native_layout; /* found by the binder */
    /* lm_head has a bank of its own unless it is the embedding's tensor (a tied config may still ship one) */
    cfg.tie_word_embeddings = src->lm_head.t == src->embed.t && src->lm_head.offset == src->embed.offset;
    fm_plan plan;
    fm_plan_for_backend(a->preset, a->backend, &plan);
    fm_plan_set_dense(&plan, a->dense);
    fm_routes routes;
    fm_routes_default(&routes, 0);
    fm_status st = fm_plan_set_dispatch(&plan, a->dispatch, err);
    if (!st) st = fm_routes_apply(&routes, a->routes, err);
    fm_memory_plan p;
    if (!st) st = fm_memory_plan_compute_routes(&cfg, &plan, a->backend, &routes, a->n_layers, a->tokens, &p, err);
    const int64_t ctx = a->ctx > 0 ? a->ctx : cfg.max_position_embeddings;
    if (!st && a->max_seqs > 0 && ctx <= 0)
        st = fm_fail(err, FM_ERR_USAGE, "--max-seqs: the config has no max_position_embeddings; give --ctx N");
    if (!st && a->max_seqs > 0) st = fm_memory_plan_add_generation(&p, &cfg, &plan, a->max_seqs, ctx, err);
    if (st) return st;
    /* where the experts go: against --vram-limit or the GPU's free memory on cuda, no limit on the cpu */
    char b1[32], b2[32];
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
    printf("memory plan: backend %s, preset %s (dense %s, experts %s, other %s), %d layers, %lld tokens\n", p.backend,
           fm_preset_name(a->preset), fm_wformat_name(plan.w_dense), fm_wformat_name(plan.w_expert),
           fm_wformat_name(plan.w_other), p.n_layers, (long long)p.tokens);
    printf("  %-44s %12s %16s\n", "category", "MiB", "bytes");
    char what[96];
    snprintf(what, sizeof what, "weights (%d banks)", p.n_banks);
    plan_row(what, p.weight_total, 0);
    for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++) {
        const char *name = fm_mem_family_name((fm_mem_family)f);
        if (f == FM_MEM_LM_HEAD && cfg.tie_word_embeddings) name = "lm_head (tied to the embeddings)";
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
    } else {
        plan_row("linear input quantization", p.ws_linear, 2);
    }
    if (p.kv_seqs > 0) {
        snprintf(what, sizeof what, "KV cache (%d seqs x %lld tokens)", p.kv_seqs, (long long)p.kv_ctx);
        plan_row(what, p.kv_cache, 0);
        plan_row("decode state (indices, scratch, sampler)", p.kv_state, 0);
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
    if ((a->ep > 1 || a->tp > 1) && (st = print_partition(&cfg, &plan, &p, a->ep, a->tp, err))) return st;
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
        return FM_OK;
    }
    if (have_gpu)
        printf("GPU: %s free of %s\n", fm_mem_format(free_bytes, b1, sizeof b1), fm_mem_format(total, b2, sizeof b2));
    else printf("GPU: not available here (%s)\n", qerr.msg);
    if (!have_gpu && a->vram_limit <= 0) return FM_OK;
    fm_error verdict = {{0}};
    if (fm_memory_plan_check(&p, available, limited ? "--vram-limit" : "free on the GPU", &verdict) == FM_OK)
        printf("fits: yes, %s of %s available (%s)\n", fm_mem_format(p.peak, b1, sizeof b1),
               fm_mem_format(available, b2, sizeof b2), limited ? "--vram-limit" : "free on the GPU");
    else printf("fits: no: %s\n", verdict.msg);
    return FM_OK;
}

int cmd_inspect(int argc, char **argv) {
    const char *cmd = "inspect", *dir = NULL, *plan_only = NULL;
    bool list = false, routes = false, markdown = false;
    plan_args pa = {0, 0, "cpu", FM_PRESET_REF, 0, FM_DENSE_PRESET, 0, 0, "", FM_EXPERTS_DEVICE, 0, FM_DISPATCH_PRESET,
                    0, 0};
    enum {
        OPT_MODEL_I = 2000,
        OPT_TENSORS,
        OPT_TOKENS,
        OPT_BACKEND_I,
        OPT_PRESET_I,
        OPT_LAYERS_I,
        OPT_VRAM_I,
        OPT_DENSE_I,
        OPT_ROUTES_I,
        OPT_MARKDOWN_I,
        OPT_ROUTE_I,
        OPT_MAX_SEQS_I,
        OPT_CTX_I,
        OPT_EXPERTS_IN_I,
        OPT_EXPERT_SLOTS_I,
        OPT_DISPATCH_I,
        OPT_EP_I,
        OPT_TP_I
    };
    static const struct option longopts[] = {{"model", required_argument, 0, OPT_MODEL_I},
                                             {"tensors", no_argument, 0, OPT_TENSORS},
                                             {"tokens", required_argument, 0, OPT_TOKENS},
                                             {"backend", required_argument, 0, OPT_BACKEND_I},
                                             {"preset", required_argument, 0, OPT_PRESET_I},
                                             {"layers", required_argument, 0, OPT_LAYERS_I},
                                             {"vram-limit", required_argument, 0, OPT_VRAM_I},
                                             {"dense", required_argument, 0, OPT_DENSE_I},
                                             {"routes", no_argument, 0, OPT_ROUTES_I},
                                             {"markdown", no_argument, 0, OPT_MARKDOWN_I},
                                             {"route", required_argument, 0, OPT_ROUTE_I},
                                             {"max-seqs", required_argument, 0, OPT_MAX_SEQS_I},
                                             {"ctx", required_argument, 0, OPT_CTX_I},
                                             {"experts-in", required_argument, 0, OPT_EXPERTS_IN_I},
                                             {"expert-slots", required_argument, 0, OPT_EXPERT_SLOTS_I},
                                             {"dispatch", required_argument, 0, OPT_DISPATCH_I},
                                             {"ep", required_argument, 0, OPT_EP_I},
                                             {"tp", required_argument, 0, OPT_TP_I},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    long v = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == OPT_MODEL_I) {
            if (!*optarg) return cli_usage(cmd, "--model needs a checkpoint directory, got ''");
            dir = optarg;
        } else if (c == OPT_TENSORS) list = true;
        else if (c == OPT_TOKENS) {
            if (!cli_parse_int(cmd, "--tokens", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            pa.tokens = v;
        } else if (c == OPT_BACKEND_I) {
            if (!fm_backend_kind_find(optarg)) return cli_usage(cmd, "--backend must be cpu or cuda, got '%s'", optarg);
            pa.backend = optarg, plan_only = "--backend";
        } else if (c == OPT_PRESET_I) {
            if (!fm_preset_parse(optarg, &pa.preset))
                return cli_usage(cmd, "--preset must be one of ref, ref32, int4, fp8, fp4, got '%s'", optarg);
            plan_only = "--preset";
        } else if (c == OPT_DENSE_I) {
            if (!fm_dense_parse(optarg, &pa.dense))
                return cli_usage(cmd, "--dense must be w8a8 or preset, got '%s'", optarg);
            plan_only = "--dense";
        } else if (c == OPT_DISPATCH_I) {
            if (!fm_dispatch_parse(optarg, &pa.dispatch))
                return cli_usage(cmd, "--dispatch must be one of bf16, fp8, mxfp4, nvfp4, preset, got '%s'", optarg);
            plan_only = "--dispatch";
        } else if (c == OPT_LAYERS_I) {
            if (!cli_parse_int(cmd, "--layers", optarg, 1, 100000, &v)) return CLI_USAGE;
            pa.n_layers = (int32_t)v, plan_only = "--layers";
        } else if (c == OPT_VRAM_I) {
            if (!cli_parse_bytes(cmd, "--vram-limit", optarg, &pa.vram_limit)) return CLI_USAGE;
            plan_only = "--vram-limit";
        } else if (c == OPT_MAX_SEQS_I) {
            if (!cli_parse_int(cmd, "--max-seqs", optarg, 1, 4096, &v)) return CLI_USAGE;
            pa.max_seqs = (int32_t)v, plan_only = "--max-seqs";
        } else if (c == OPT_CTX_I) {
            if (!cli_parse_int(cmd, "--ctx", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            pa.ctx = v, plan_only = "--ctx";
        } else if (c == OPT_EXPERTS_IN_I) {
            if (!fm_experts_in_parse(optarg, &pa.experts_in))
                return cli_usage(cmd, "--experts-in must be host, device or auto, got '%s'", optarg);
            plan_only = "--experts-in";
        } else if (c == OPT_EXPERT_SLOTS_I) {
            if (!cli_parse_int(cmd, "--expert-slots", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            pa.expert_slots = (int32_t)v, plan_only = "--expert-slots";
        } else if (c == OPT_EP_I) {
            if (!cli_parse_int(cmd, "--ep", optarg, 1, FM_COMM_MAX_RANKS, &v)) return CLI_USAGE;
            pa.ep = (int32_t)v, plan_only = "--ep";
        } else if (c == OPT_TP_I) {
            if (!cli_parse_int(cmd, "--tp", optarg, 1, FM_COMM_MAX_RANKS, &v)) return CLI_USAGE;
            pa.tp = (int32_t)v, plan_only = "--tp";
        } else if (c == OPT_ROUTES_I) {
            routes = true;
        } else if (c == OPT_MARKDOWN_I) {
            markdown = true;
        } else if (c == OPT_ROUTE_I) {
            if (!cli_route_add(cmd, optarg, pa.routes, sizeof pa.routes)) return CLI_USAGE;
        } else if (c == 'h') return fputs(HELP, stdout), CLI_OK;
        else return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (plan_only && !pa.tokens)
        return cli_usage(cmd, "%s describes the memory plan, which needs --tokens T", plan_only);
    if (markdown && (!routes || dir || pa.routes[0] || pa.tokens || list))
        return cli_usage(cmd, "--markdown prints the route keys' reference page: --routes --markdown alone");
    if (markdown) return fm_routes_print_markdown(stdout), CLI_OK;
    fm_error err = {{0}};
    if (!dir && routes) { /* the table alone, at Qwen3-30B-A3B's shapes */
        const route_shapes qwen3 = {"Qwen3-30B-A3B-like, no --model", 2048, 4096, 4096, 5120, 128, 8};
        const fm_status st = print_routes(&qwen3, pa.routes, &err);
        return st ? cli_fail(cmd, st, &err) : CLI_OK;
    }
    if (!dir) return cli_usage(cmd, "--model is required (or --routes alone for the route table)");
    if (pa.routes[0] && !routes && !pa.tokens)
        return cli_usage(cmd, "--route changes the route table (--routes) or the memory plan (--tokens T)");
    fm_config cfg;
    fm_st_set set = {0};
    fm_model_src src = {0};
    fm_status st = fm_config_load(dir, &cfg, &err);
    if (!st) st = fm_st_open_dir(dir, &set, &err);
    if (!st) st = fm_model_src_bind(&cfg, &set, &src, &err);
    if (!st) {
        print_model(dir, &cfg, &set, &src);
        if (cfg.quant.method != FM_QUANT_NONE) print_quantization(&cfg, &src);
        if (list)
            for (int64_t i = 0; i < set.n_tensors; i++) {
                const fm_st_tensor *t = set.by_name[i];
                printf("  %-64s %-8s [", t->name, fm_dtype_name(t->dtype));
                for (int d = 0; d < t->n_dims; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
                printf("]\n");
            }
        if (pa.tokens) st = print_plan(&cfg, &src, &pa, &err);
        if (!st && routes) {
            const route_shapes s = shapes_of(dir, &cfg);
            st = print_routes(&s, pa.routes, &err);
        }
    }
    fm_model_src_free(&src);
    fm_st_close(&set);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
