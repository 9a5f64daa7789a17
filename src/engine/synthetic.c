/* Synthetic models at the shapes of real checkpoints, for benchmarks: every weight slot the architecture's
 * description lists (model/arch.h) is a synthetic view (fm_synth in model/model_src.h) with its own seed, so the
 * backend generates the values where it runs and then converts them through the same path as checkpoint weights.
 * Scales keep activations at a realistic size: linear weights uniform with variance 1/fan_in, norms 1 +- 0.1, router
 * logits of std ~2 (decisive routing), and embeddings with outlier channels (every 97th column x8). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "io/config.h"
#include "util/status.h"

typedef struct synth_shape {
    const char *name;
    fm_arch arch;
    int32_t vocab, hidden, layers, heads, kv_heads, head_dim, experts, top_k, moe_inter;
    float eps;
    double theta;
} synth_shape;

/* Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1 config.json values; toy-moe is a Qwen3-MoE small enough
 * for the CPU (tests and demonstrations of the benchmark itself) */
static const synth_shape shapes[] = {
    {"qwen3-30b-a3b", FM_ARCH_QWEN3_MOE, 151936, 2048, 48, 32, 4, 128, 128, 8, 768, 1e-6f, 1e6},
    {"mixtral-8x7b", FM_ARCH_MIXTRAL, 32000, 4096, 32, 32, 8, 128, 8, 2, 14336, 1e-5f, 1e6},
    {"toy-moe", FM_ARCH_QWEN3_MOE, 256, 64, 2, 4, 2, 16, 8, 2, 32, 1e-6f, 1e4},
};

/* Shapes given as their config.json, read by io/config.c like a checkpoint's: Qwen/Qwen3-Next-80B-A3B-Instruct's
 * (every 4th layer full attention, the rest Gated DeltaNets; 512 experts top-10 and a shared expert), and toy-next,
 * the same architecture small enough for the CPU. */
typedef struct json_shape {
    const char *name, *json;
} json_shape;

static const json_shape json_shapes[] = {
    {"qwen3-next-80b-a3b",
     "{\"model_type\": \"qwen3_next\", \"vocab_size\": 151936, \"hidden_size\": 2048, \"num_hidden_layers\": 48,"
     " \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256, \"partial_rotary_factor\": 0.25,"
     " \"rope_theta\": 10000000, \"full_attention_interval\": 4, \"linear_num_key_heads\": 16,"
     " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
     " \"linear_conv_kernel_dim\": 4, \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512,"
     " \"shared_expert_intermediate_size\": 512, \"intermediate_size\": 5120, \"norm_topk_prob\": true,"
     " \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 1048576}"},
    {"toy-next",
     "{\"model_type\": \"qwen3_next\", \"vocab_size\": 256, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.25,"
     " \"rope_theta\": 10000, \"full_attention_interval\": 2, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
     " \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4, \"num_experts\": 8,"
     " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32,"
     " \"intermediate_size\": 64, \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 1048576}"},
};

const char *fm_synthetic_names(void) { return "qwen3-30b-a3b, mixtral-8x7b, toy-moe, qwen3-next-80b-a3b, toy-next"; }

static void make_config(const synth_shape *s, fm_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = s->arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", fm_arch_of(c)->model_type);
    c->vocab_size = s->vocab, c->hidden_size = s->hidden, c->n_layers = s->layers;
    c->n_heads = s->heads, c->n_kv_heads = s->kv_heads, c->head_dim = s->head_dim;
    c->n_experts = s->experts, c->n_experts_per_tok = s->top_k, c->moe_intermediate = s->moe_inter;
    c->dense_intermediate = s->moe_inter, c->decoder_sparse_step = 1, c->norm_topk_prob = true;
    c->qk_norm = s->arch == FM_ARCH_QWEN3_MOE;
    c->router = s->arch == FM_ARCH_MIXTRAL ? FM_ROUTER_TOPK_SOFTMAX : FM_ROUTER_SOFTMAX_TOPK;
    c->rms_norm_eps = s->eps, c->rope_theta = s->theta, c->max_position_embeddings = 1 << 20;
    for (int l = 0; l < s->layers; l++) c->layer_is_moe[l] = true;
}

typedef struct seeder {
    uint64_t next;
} seeder;

static fm_wsrc linear_view(seeder *sd, int64_t rows, int64_t cols) {
    return (fm_wsrc){NULL, 0, rows, cols, {sd->next++ * 0x632BE59BD9B4E019ull, sqrtf(3.0f / (float)cols), 0.0f, 0},
                     {0}};
}

static fm_wsrc norm_view(seeder *sd, int64_t cols) {
    return (fm_wsrc){NULL, 0, 1, cols, {sd->next++ * 0x632BE59BD9B4E019ull, 0.1f, 1.0f, 0}, {0}};
}

/* One synthetic view per part of every bank the layer's description lists, in spec order (the experts expert by
 * expert at the first expert bank): the seeds follow that order. */
static fm_status make_layer(const fm_config *c, int32_t l, seeder *sd, fm_layer_src *L, int64_t *n_params,
                            fm_error *err) {
    const fm_arch_desc *a = fm_arch_of(c);
    const fm_layer_desc *d = fm_arch_layer(a, c, l);
    const int64_t E = c->n_experts;
    L->kind = a->layer_kind(c, l);
    L->layout = FM_EXPERTS_PER_EXPERT;
    for (int32_t i = 0; i < d->n_specs; i++)
        for (int32_t j = 0; j < d->specs[i].n_parts; j++) {
            const fm_part_spec *p = &d->specs[i].parts[j];
            if (d->specs[i].family != FM_WF_EXPERTS || !fm_spec_present(&d->specs[i], c)) continue;
            L->is_moe = true;
            if (!(L->ew[p->slot - FM_SRC_N_LAYER] = calloc((size_t)E, sizeof(fm_wsrc))))
                return fm_fail(err, FM_ERR_NOMEM, "out of memory");
        }
    bool experts_done = false;
    for (int32_t i = 0; i < d->n_specs; i++) {
        const fm_weight_spec *w = &d->specs[i];
        if (!fm_spec_present(w, c)) continue;
        for (int32_t j = 0; w->family != FM_WF_EXPERTS && j < w->n_parts; j++) {
            const fm_part_spec *p = &w->parts[j];
            fm_wsrc *v = &L->w[p->slot];
            *v = w->family == FM_WF_NORM ? norm_view(sd, p->cols(c)) : linear_view(sd, p->rows(c), p->cols(c));
            if (w->bank == FM_BANK_ROUTER) v->synth.scale *= 2.0f * sqrtf(3.0f); /* logits of std ~2 */
            if (a->plus_one_banks >> w->bank & 1) v->synth.bias = 0.0f; /* zero-centred: loaded as 1 + w */
            *n_params += v->rows * v->cols;
        }
        if (w->family != FM_WF_EXPERTS || experts_done) continue;
        experts_done = true;
        for (int64_t e = 0; e < E; e++)
            for (int32_t k = i; k < d->n_specs; k++) {
                const fm_weight_spec *x = &d->specs[k];
                if (x->family != FM_WF_EXPERTS || !fm_spec_present(x, c)) continue;
                for (int32_t j = 0; j < x->n_parts; j++) {
                    const fm_part_spec *p = &x->parts[j];
                    fm_wsrc *v = &L->ew[p->slot - FM_SRC_N_LAYER][e];
                    *v = linear_view(sd, p->rows(c), p->cols(c));
                    *n_params += v->rows * v->cols;
                }
            }
    }
    return FM_OK;
}

static fm_status make_src(const fm_config *c, fm_model_src *src, fm_error *err) {
    memset(src, 0, sizeof *src);
    src->cfg = *c;
    seeder sd = {1};
    const int64_t H = c->hidden_size, V = c->vocab_size;
    src->embed = (fm_wsrc){NULL, 0, V, H, {sd.next++ * 0x632BE59BD9B4E019ull, 1.0f, 0.0f, 97}, {0}};
    src->final_norm = norm_view(&sd, H);
    src->lm_head = linear_view(&sd, V, H);
    src->layers = calloc((size_t)c->n_layers, sizeof *src->layers);
    if (!src->layers) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    src->n_params = 2 * V * H + H;
    for (int l = 0; l < c->n_layers; l++) {
        fm_status st = make_layer(c, l, &sd, &src->layers[l], &src->n_params, err);
        if (st) return st;
    }
    return FM_OK;
}

static const synth_shape *find_shape(const char *name) {
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
    return NULL;
}

fm_status fm_synthetic_config(const char *name, fm_config *out, fm_error *err) {
    const synth_shape *s = find_shape(name);
    if (s) {
        make_config(s, out);
        return FM_OK;
    }
    for (size_t i = 0; i < sizeof json_shapes / sizeof *json_shapes; i++)
        if (!strcmp(json_shapes[i].name, name))
            return fm_config_parse(json_shapes[i].json, strlen(json_shapes[i].json), name, out, err);
    return fm_fail(err, FM_ERR_USAGE, "unknown synthetic model '%s' (choose %s)", name, fm_synthetic_names());
}

fm_status fm_model_load_synthetic(const char *name, int32_t n_layers, const fm_options *opt, fm_model **out,
                                  fm_error *err) {
    *out = NULL;
    fm_model *m = fm_calloc(1, sizeof *m, err, "model");
    if (!m) return FM_ERR_NOMEM;
    fm_status cst = fm_synthetic_config(name, &m->cfg, err);
    if (!cst && (n_layers < 0 || n_layers > m->cfg.n_layers))
        cst = fm_fail(err, FM_ERR_USAGE, "%s has %d layers; --layers %d is out of range", name, m->cfg.n_layers,
                      n_layers);
    if (cst) {
        free(m);
        return cst;
    }
    if (n_layers > 0) m->cfg.n_layers = n_layers; /* build only the layers that run */
    fm_model_src src;
    fm_options o = *opt;
    o.n_layers = 0;
    fm_status st = make_src(&m->cfg, &src, err);
    if (!st) st = fm_model_build(m, &src, &o, err);
    fm_model_src_free(&src);
    if (st) {
        fm_model_free(m);
        return st;
    }
    *out = m;
    return FM_OK;
}
