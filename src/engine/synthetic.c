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
     " \"linear_conv_kernel_dim\": 4, \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": "
     "512,"
     " \"shared_expert_intermediate_size\": 512, \"intermediate_size\": 5120, \"norm_topk_prob\": true,"
     " \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 1048576}"},
    {"toy-next",
     "{\"model_type\": \"qwen3_next\", \"vocab_size\": 256, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.25,"
     " \"rope_theta\": 10000, \"full_attention_interval\": 2, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": "
     "4,"
     " \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4, \"num_experts\": 8,"
     " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32,"
     " \"intermediate_size\": 64, \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": "
     "1048576}"},
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
            if (a->plus_one_banks >> w->bank & 1) v->synth.bias = 0.0f;          /* zero-centred: loaded as 1 + w */
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

/* ---- routing skew (--synthetic-routing zipf:S) ----
 * Random router rows route uniformly: each token's logits are about independent Gaussians of one scale (its hidden
 * state's norm times the rows'), so every expert is in the top-k with probability k/E. zipf:S skews this by scaling
 * the router row of the expert of rank r by a factor c_r (a trained router is skewed the same way, by its rows'
 * norms and directions), calibrated so that under that Gaussian model the expert of rank r is in the top-k with
 * probability f_r = k p_r, p_r proportional to (r + 1)^-S. A scaled Gaussian is above the others at most half of the
 * time (its negative half loses whatever its scale), so f_r is capped at FM_SYNTH_ZIPF_CAP and the excess spread over
 * the others in proportion to p (water-filling). Each layer ranks its experts in its own seeded order.
 * Why weights and not a selection bias added in the router op (DeepSeek-V3's e_score_correction_bias): a bias would
 * be a new input of the router and route ops on every backend, a semantic variant of the op contract for benchmarks
 * only; scaled rows are just another checkpoint, so every kernel runs as it would on a real skewed router. */
#define FM_SYNTH_ZIPF_CAP 0.45
#define CALIB_SAMPLES 4096
#define CALIB_ROUNDS 80

fm_status fm_synthetic_routing_parse(const char *text, double *zipf_s, fm_error *err) {
    *zipf_s = 0;
    if (!text || strcmp(text, "uniform") == 0) return FM_OK;
    char *end = NULL;
    if (strncmp(text, "zipf:", 5) == 0) {
        const double v = strtod(text + 5, &end);
        if (end != text + 5 && *end == 0 && v > 0 && v <= 8) {
            *zipf_s = v;
            return FM_OK;
        }
    }
    return fm_fail(err, FM_ERR_USAGE,
                   "--synthetic-routing must be uniform or zipf:S with an exponent 0 < S <= 8 (zipf:1.0), got '%s'",
                   text);
}

/* the experts' target frequencies by rank (sum k): k p_r capped, the excess re-spread */
static void zipf_targets(int32_t E, int32_t k, double s, double *f) {
    double sum = 0;
    for (int32_t r = 0; r < E; r++) sum += pow(r + 1.0, -s);
    for (int32_t r = 0; r < E; r++) f[r] = k * pow(r + 1.0, -s) / sum;
    const double cap = FM_SYNTH_ZIPF_CAP > (double)k / E ? FM_SYNTH_ZIPF_CAP : (double)k / E;
    for (int it = 0; it < E; it++) {
        double excess = 0, free_p = 0;
        for (int32_t r = 0; r < E; r++)
            if (f[r] > cap) excess += f[r] - cap, f[r] = cap;
        if (excess <= 0) break;
        for (int32_t r = 0; r < E; r++)
            if (f[r] < cap) free_p += f[r];
        for (int32_t r = 0; r < E; r++)
            if (f[r] < cap) f[r] += excess * f[r] / free_p;
    }
}

/* deterministic standard normals (splitmix64 + Box-Muller) */
static double normal(uint64_t *state) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        u[i] = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* c_r for the targets f_r: fixed Gaussian samples, the top-k of c_r z_r counted, c_r moved by (f / measured)^0.7 */
static fm_status zipf_scales(int32_t E, int32_t k, double s, double *c, fm_error *err) {
    double *f = malloc((size_t)E * sizeof *f), *z = malloc((size_t)CALIB_SAMPLES * (size_t)E * sizeof *z);
    int64_t *hits = malloc((size_t)E * sizeof *hits);
    int32_t *top = malloc((size_t)k * sizeof *top);
    if (!f || !z || !hits || !top) {
        free(f), free(z), free(hits), free(top);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    zipf_targets(E, k, s, f);
    uint64_t state = 0x5EEDull;
    for (int64_t i = 0; i < (int64_t)CALIB_SAMPLES * E; i++) z[i] = normal(&state);
    for (int32_t r = 0; r < E; r++) c[r] = 1.0;
    for (int round = 0; round < CALIB_ROUNDS; round++) {
        memset(hits, 0, (size_t)E * sizeof *hits);
        for (int32_t n = 0; n < CALIB_SAMPLES; n++) {
            const double *zn = z + (int64_t)n * E;
            int32_t m = 0; /* top-k of c_r z_r by insertion: top[0..m) in descending order */
            for (int32_t r = 0; r < E; r++) {
                const double v = c[r] * zn[r];
                if (m == k && v <= c[top[k - 1]] * zn[top[k - 1]]) continue;
                int32_t i = m < k ? m++ : k - 1;
                for (; i > 0 && v > c[top[i - 1]] * zn[top[i - 1]]; i--) top[i] = top[i - 1];
                top[i] = r;
            }
            for (int32_t j = 0; j < k; j++) hits[top[j]]++;
        }
        double logsum = 0;
        for (int32_t r = 0; r < E; r++) {
            const double got = ((double)hits[r] + 0.5) / CALIB_SAMPLES;
            c[r] *= pow(f[r] / got, 0.7);
            c[r] = c[r] < 1e-3 ? 1e-3 : c[r] > 1e3 ? 1e3 : c[r];
            logsum += log(c[r]);
        }
        for (int32_t r = 0; r < E; r++) c[r] /= exp(logsum / E); /* geometric mean 1: the router's usual spread */
    }
    free(f), free(z), free(hits), free(top);
    return FM_OK;
}

/* rank_of[e]: expert e's rank in layer l (a seeded shuffle per layer) */
static void layer_ranks(int32_t E, int32_t l, int32_t *rank_of) {
    int32_t *order = rank_of; /* order[r] = expert of rank r, inverted in place below */
    for (int32_t e = 0; e < E; e++) order[e] = e;
    uint64_t st = 0xC0FFEEull + (uint64_t)l * 0x632BE59BD9B4E019ull;
    for (int32_t i = E - 1; i > 0; i--) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const int32_t j = (int32_t)((st >> 33) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    int32_t *inv = malloc((size_t)E * sizeof *inv);
    if (!inv) return;
    for (int32_t r = 0; r < E; r++) inv[order[r]] = r;
    memcpy(rank_of, inv, (size_t)E * sizeof *inv);
    free(inv);
}

fm_status fm_synthetic_routing_targets(const char *name, const char *routing, int32_t layer, double *freq,
                                       fm_error *err) {
    fm_config c;
    double s = 0;
    fm_status st = fm_synthetic_config(name, &c, err);
    if (!st) st = fm_synthetic_routing_parse(routing, &s, err);
    if (st) return st;
    const int32_t E = c.n_experts, k = c.n_experts_per_tok;
    if (s == 0) {
        for (int32_t e = 0; e < E; e++) freq[e] = (double)k / E;
        return FM_OK;
    }
    double *f = malloc((size_t)E * sizeof *f);
    int32_t *rank = malloc((size_t)E * sizeof *rank);
    if (!f || !rank) {
        free(f), free(rank);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    zipf_targets(E, k, s, f);
    layer_ranks(E, layer, rank);
    for (int32_t e = 0; e < E; e++) freq[e] = f[rank[e]];
    free(f), free(rank);
    return FM_OK;
}

/* The skewed routers: each layer's router view becomes an fp32 tensor of its synthetic values with row e scaled by
 * c of e's rank. The tensors live in *store until the model is built. */
typedef struct routed_store {
    fm_st_tensor *t;
    float **v;
    int32_t n;
} routed_store;

static void routed_store_free(routed_store *rs) {
    for (int32_t i = 0; i < rs->n; i++) free(rs->v[i]);
    free(rs->v), free(rs->t);
    memset(rs, 0, sizeof *rs);
}

static fm_status skew_routers(const fm_config *c, double s, fm_model_src *src, routed_store *rs, fm_error *err) {
    const int32_t E = c->n_experts, k = c->n_experts_per_tok;
    const fm_arch_desc *a = fm_arch_of(c);
    double *scale = malloc((size_t)E * sizeof *scale);
    int32_t *rank = malloc((size_t)E * sizeof *rank);
    rs->t = calloc((size_t)c->n_layers, sizeof *rs->t);
    rs->v = calloc((size_t)c->n_layers, sizeof *rs->v);
    fm_status st = scale && rank && rs->t && rs->v ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    if (!st) st = zipf_scales(E, k, s, scale, err);
    for (int32_t l = 0; !st && l < c->n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; !st && i < d->n_specs; i++) {
            if (d->specs[i].family != FM_WF_ROUTER || !fm_spec_present(&d->specs[i], c)) continue;
            fm_wsrc *v = &src->layers[l].w[d->specs[i].parts[0].slot];
            const int64_t H = v->cols;
            float *w = malloc((size_t)(v->rows * H) * sizeof *w);
            if (!w) {
                st = fm_fail(err, FM_ERR_NOMEM, "out of memory for the synthetic routers");
                break;
            }
            rs->v[rs->n] = w;
            layer_ranks(E, l, rank);
            for (int64_t r = 0; r < v->rows; r++)
                for (int64_t j = 0; j < H; j++)
                    w[r * H + j] = fm_synth_value(&v->synth, r * H + j, H) * (float)scale[rank[r % E]];
            fm_st_tensor *t = &rs->t[rs->n++];
            *t = (fm_st_tensor){.name = "synthetic router (zipf)",
                                .dtype = FM_DTYPE_F32,
                                .n_dims = 2,
                                .shape = {v->rows, H},
                                .n_elements = v->rows * H,
                                .data = (const uint8_t *)w,
                                .nbytes = (uint64_t)(v->rows * H) * 4};
            v->t = t, v->offset = 0;
        }
    }
    free(scale), free(rank);
    return st;
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
    double zipf = 0;
    routed_store rs = {0};
    fm_status st = fm_synthetic_routing_parse(opt->synthetic_routing, &zipf, err);
    if (!st) st = make_src(&m->cfg, &src, err);
    if (!st && zipf > 0) st = skew_routers(&m->cfg, zipf, &src, &rs, err);
    if (!st) st = fm_model_build(m, &src, &o, err);
    fm_model_src_free(&src);
    routed_store_free(&rs);
    if (st) {
        fm_model_free(m);
        return st;
    }
    *out = m;
    return FM_OK;
}
