/* fp8moe inspect: what a checkpoint is, without loading its weights: architecture, shapes, dtypes,
 * parameter counts and the bytes it takes in each weight format. */
#include <string.h>

#include "cli/cli.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model_src.h"

static const char *HELP =
    "usage: fp8moe inspect --model DIR [--tensors]\n"
    "\n"
    "  --model DIR        Hugging Face checkpoint directory\n"
    "  --tensors          also list every tensor with its dtype and shape\n"
    "  -h, --help         this help\n";

static void print_shape(const fm_wsrc *w, const char *name) {
    if (w->rows == 1) printf("  %-28s [%lld]\n", name, (long long)w->cols);
    else printf("  %-28s [%lld, %lld]\n", name, (long long)w->rows, (long long)w->cols);
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

static void print_model(const char *dir, const fm_config *c, const fm_st_set *set, const fm_model_src *src) {
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += c->layer_is_moe[l];
    printf("model: %s\n", dir);
    printf("architecture: %s, %d layers (%d MoE, %d dense MLP)\n", c->model_type, c->n_layers, n_moe, c->n_layers - n_moe);
    printf("hidden %d, vocab %d, attention: %d query / %d key-value heads of %d (GQA group %d)%s\n", c->hidden_size,
           c->vocab_size, c->n_heads, c->n_kv_heads, c->head_dim, c->n_heads / c->n_kv_heads,
           c->qk_norm ? ", q/k RMSNorm" : "");
    if (c->n_experts > 0)
        printf("experts: %d, top-%d, width %d, router %s%s, stored as %s\n", c->n_experts, c->n_experts_per_tok,
               c->moe_intermediate,
               c->router == FM_ROUTER_SOFTMAX_TOPK ? "softmax -> top-k" : "top-k -> softmax",
               c->router == FM_ROUTER_SOFTMAX_TOPK ? (c->norm_topk_prob ? " -> renormalise" : " (no renormalisation)") : "",
               n_moe ? fm_expert_layout_name(src->layers[c->n_layers - 1].is_moe ? src->layers[c->n_layers - 1].layout
                                                                                  : src->layers[0].layout)
                     : "-");
    if (n_moe < c->n_layers) printf("dense MLP width: %d\n", c->dense_intermediate);
    printf("rope theta %g, rms_norm_eps %g, tie_word_embeddings %s\n", c->rope_theta, (double)c->rms_norm_eps,
           c->tie_word_embeddings ? "true" : "false");

    int64_t by_dtype[FM_DTYPE_COUNT] = {0}, bytes_dtype[FM_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < set->n_tensors; i++) {
        by_dtype[set->by_name[i]->dtype]++;
        bytes_dtype[set->by_name[i]->dtype] += (int64_t)set->by_name[i]->nbytes;
    }
    printf("tensors: %lld in %d file(s):", (long long)set->n_tensors, set->n_files);
    for (int d = 0; d < FM_DTYPE_COUNT; d++)
        if (by_dtype[d]) printf(" %s x%lld (%.2f MiB)", fm_dtype_name((fm_dtype)d), (long long)by_dtype[d], mib((double)bytes_dtype[d]));
    printf("\nunused tensors: %lld\n", (long long)src->n_unused);

    /* parameters: total, and active per token (attention + k experts + dense layers + embeddings/head) */
    const int64_t H = c->hidden_size, hd = c->head_dim;
    const int64_t attn = H * (int64_t)(c->n_heads + 2 * c->n_kv_heads) * hd + (int64_t)c->n_heads * hd * H;
    const int64_t expert = 3 * (int64_t)c->moe_intermediate * H, dense = 3 * (int64_t)c->dense_intermediate * H;
    int64_t linear = 0, active = 0;
    for (int l = 0; l < c->n_layers; l++) {
        linear += attn + (c->layer_is_moe[l] ? (int64_t)c->n_experts * expert : dense);
        active += attn + (c->layer_is_moe[l] ? (int64_t)c->n_experts_per_tok * expert + (int64_t)c->n_experts * H : dense);
    }
    const int64_t other = src->n_params - linear;
    printf("parameters: %.3f M total, %.3f M active per token; %.3f M in linear projections\n",
           (double)src->n_params / 1e6, (double)(active + other) / 1e6, (double)linear / 1e6);
    /* int4 g128 with one bf16 scale per 128 weights: 0.5 + 2/128 bytes per weight */
    printf("weight bytes: fp32 %.2f MiB | bf16 %.2f MiB | int4 g128 linear + bf16 rest %.2f MiB\n",
           mib(4.0 * (double)src->n_params), mib(2.0 * (double)src->n_params),
           mib((double)linear * (0.5 + 2.0 / 128.0) + 2.0 * (double)other));

    printf("shapes (layer 0):\n");
    print_shape(&src->embed, "embed_tokens");
    const fm_layer_src *L = &src->layers[0];
    print_shape(&L->q, "q_proj");
    print_shape(&L->k, "k_proj");
    print_shape(&L->v, "v_proj");
    print_shape(&L->o, "o_proj");
    if (c->qk_norm) print_shape(&L->q_norm, "q_norm / k_norm");
    if (L->is_moe) {
        print_shape(&L->router, "router");
        print_shape(&L->expert_gate[0], "expert gate / up (each)");
        print_shape(&L->expert_down[0], "expert down (each)");
    } else {
        print_shape(&L->mlp_gate, "mlp gate / up");
        print_shape(&L->mlp_down, "mlp down");
    }
    print_shape(&src->lm_head, c->tie_word_embeddings ? "lm_head (tied)" : "lm_head");
}

int cmd_inspect(int argc, char **argv) {
    const char *cmd = "inspect", *dir = NULL;
    bool list = false;
    enum { OPT_MODEL_I = 2000, OPT_TENSORS };
    static const struct option longopts[] = {{"model", required_argument, 0, OPT_MODEL_I},
                                             {"tensors", no_argument, 0, OPT_TENSORS},
                                             {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == OPT_MODEL_I) dir = optarg;
        else if (c == OPT_TENSORS) list = true;
        else if (c == 'h') return fputs(HELP, stdout), CLI_OK;
        else return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!dir) return cli_usage(cmd, "--model is required");
    fm_error     err = {{0}};
    fm_config    cfg;
    fm_st_set    set = {0};
    fm_model_src src = {0};
    fm_status st = fm_config_load(dir, &cfg, &err);
    if (!st) st = fm_st_open_dir(dir, &set, &err);
    if (!st) st = fm_model_src_bind(&cfg, &set, &src, &err);
    if (!st) {
        print_model(dir, &cfg, &set, &src);
        if (list)
            for (int64_t i = 0; i < set.n_tensors; i++) {
                const fm_st_tensor *t = set.by_name[i];
                printf("  %-64s %-8s [", t->name, fm_dtype_name(t->dtype));
                for (int d = 0; d < t->n_dims; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
                printf("]\n");
            }
    }
    fm_model_src_free(&src);
    fm_st_close(&set);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
