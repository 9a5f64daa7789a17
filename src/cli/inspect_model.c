/* fp8moe inspect: what a checkpoint is, without loading its weights: architecture, shapes, dtypes, parameter counts
 * and the bytes it takes in each weight format; for a pre-quantized checkpoint, its linears by family in the formats
 * the load picks (engine/weight_format.h). */
#include <stdio.h>

#include "backend/backend_kind.h"
#include "cli/inspect.h"
#include "engine/weight_format.h"
#include "model/arch.h"

static void print_shape(const fm_wsrc *w, const char *name) {
    if (w->rows == 1 && w->t && w->t->n_dims == 1) printf("  %-28s [%lld]\n", name, (long long)w->cols);
    else printf("  %-28s [%lld, %lld]\n", name, (long long)w->rows, (long long)w->cols);
}

void inspect_print_model(const char *dir, const fm_config *c, const fm_st_set *set, const fm_model_src *src) {
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
                   inspect_mib((double)bytes_dtype[d]));
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
           inspect_mib(4.0 * (double)src->n_params), inspect_mib(2.0 * (double)src->n_params),
           inspect_mib((double)linear * (0.5 + 2.0 / 128.0) + 2.0 * (double)other));

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

void inspect_print_quantization(const fm_config *c, const fm_model_src *src) {
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
    const int row[FM_WF_COUNT] = {[FM_WF_NORM] = -1,   [FM_WF_ATTN] = 0,      [FM_WF_ROUTER] = 1,
                                  [FM_WF_EXPERTS] = 2, [FM_WF_DENSE_MLP] = 3, [FM_WF_LM_HEAD] = 4};
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
                   (long long)fam[f].n, inspect_mib(fam[f].ckpt_bytes), inspect_mib(fam[f].bank_bytes),
                   (long long)fam[f].n_native);
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
