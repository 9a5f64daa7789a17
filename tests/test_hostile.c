/* Hostile and degenerate input at the library level (the CLI side is in test_cli.c):
 *   - a config, index, shard or ids file that is a FIFO is refused by name without blocking in open();
 *   - a key repeated in any JSON object we read (config.json, quantization_config, a safetensors header, an index)
 *     is refused by name;
 *   - compressed-tensors "re:" ignore patterns: re.match semantics (anchored at the start only), and patterns that
 *     are too long, do not compile or backtrack past PCRE2's limits are refused quickly;
 *   - NaN/Inf weights or scales are refused at load naming the tensor and the element, on every preset;
 *   - a sequence longer than max_position_embeddings is refused unless fm_options.ctx allows it;
 *   - a tokenizer.json whose normalizers each multiply the text (16 stacked Replace "a" -> 32 x "a") fails to encode
 *     at once, with a message, instead of growing one character to 2^80 bytes;
 *   - degenerate but valid shapes load and run: one expert (equal to the dense MLP with the same weights), a
 *     vocabulary of one token, a residual width of one.
 * Tiny checkpoints are written here with the library's safetensors writer: random F32 weights from a fixed seed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "fp8moe.h"
#include "io/config.h"
#include "util/ids.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "text/tokenizer.h"

static char tmp[256];

static int setup(void **s) {
    (void)s;
    snprintf(tmp, sizeof tmp, "/tmp/fp8moe-hostile-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **s) {
    (void)s;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void expect_msg(const fm_error *err, const char *a, const char *b) {
    if (!strstr(err->msg, a) || (b && !strstr(err->msg, b)))
        fail_msg("message should name '%s' and '%s': %s", a, b ? b : "", err->msg);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    fclose(f);
}

/* ---- a tiny Qwen3-MoE checkpoint ------------------------------------------------------------------------ */

typedef struct tiny_spec {
    int V, H, heads, kv, hd, E, k, I, L;
    bool dense;         /* every layer a dense SwiGLU of width I (mlp_only_layers), the weights of expert 0 */
    const char *poison; /* tensor whose element 3 (or 0 when smaller) is set to poison_value */
    float poison_value;
    int max_pos;
} tiny_spec;

#define MAX_T 64
typedef struct tiny_tensor {
    char name[160];
    int n_dims;
    int64_t shape[2];
    int64_t seed; /* expert tensors of a dense twin take the seed of the expert's, so both hold the same numbers */
    bool norm;    /* 1 + small noise */
} tiny_tensor;

static float rnd_value(uint64_t seed, int64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull + 1;
    z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int add(tiny_tensor *t, int n, const char *name, int n_dims, int64_t d0, int64_t d1, int64_t seed, bool norm) {
    assert_true(n < MAX_T);
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].n_dims = n_dims, t[n].shape[0] = d0, t[n].shape[1] = d1, t[n].seed = seed, t[n].norm = norm;
    return n + 1;
}

static void write_tiny(const char *dir, const tiny_spec *s) {
    mkdir(dir, 0755);
    char path[512], name[160];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[2048], mlp_only[256] = "[]";
    if (s->dense) {
        size_t k = (size_t)snprintf(mlp_only, sizeof mlp_only, "[");
        for (int l = 0; l < s->L; l++)
            k += (size_t)snprintf(mlp_only + k, sizeof mlp_only - k, "%s%d", l ? "," : "", l);
        snprintf(mlp_only + k, sizeof mlp_only - k, "]");
    }
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"qwen3_moe\",\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"num_experts\":%d,"
             "\"num_experts_per_tok\":%d,\"moe_intermediate_size\":%d,\"intermediate_size\":%d,\"norm_topk_prob\":true,"
             "\"mlp_only_layers\":%s,\"max_position_embeddings\":%d,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,"
             "\"tie_word_embeddings\":false}",
             s->V, s->H, s->L, s->heads, s->kv, s->hd, s->E, s->k, s->I, s->I, mlp_only, s->max_pos ? s->max_pos : 256);
    write_text(path, cfg);

    tiny_tensor t[MAX_T];
    int n = 0;
    n = add(t, n, "model.embed_tokens.weight", 2, s->V, s->H, 1, false);
    n = add(t, n, "model.norm.weight", 1, s->H, 0, 2, true);
    n = add(t, n, "lm_head.weight", 2, s->V, s->H, 3, false);
    for (int l = 0; l < s->L; l++) {
        const int64_t b = 100 * (l + 1);
#define P(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
        n = add(t, n, P("input_layernorm.weight"), 1, s->H, 0, b + 1, true);
        n = add(t, n, P("post_attention_layernorm.weight"), 1, s->H, 0, b + 2, true);
        n = add(t, n, P("self_attn.q_proj.weight"), 2, s->heads * s->hd, s->H, b + 3, false);
        n = add(t, n, P("self_attn.k_proj.weight"), 2, s->kv * s->hd, s->H, b + 4, false);
        n = add(t, n, P("self_attn.v_proj.weight"), 2, s->kv * s->hd, s->H, b + 5, false);
        n = add(t, n, P("self_attn.o_proj.weight"), 2, s->H, s->heads * s->hd, b + 6, false);
        n = add(t, n, P("self_attn.q_norm.weight"), 1, s->hd, 0, b + 7, true);
        n = add(t, n, P("self_attn.k_norm.weight"), 1, s->hd, 0, b + 8, true);
        if (s->dense) {
            n = add(t, n, P("mlp.gate_proj.weight"), 2, s->I, s->H, b + 10, false);
            n = add(t, n, P("mlp.up_proj.weight"), 2, s->I, s->H, b + 11, false);
            n = add(t, n, P("mlp.down_proj.weight"), 2, s->H, s->I, b + 12, false);
            continue;
        }
        n = add(t, n, P("mlp.gate.weight"), 2, s->E, s->H, b + 9, false);
        for (int e = 0; e < s->E; e++) {
            char en[64];
            snprintf(en, sizeof en, "mlp.experts.%d.gate_proj.weight", e);
            n = add(t, n, P(en), 2, s->I, s->H, b + 10 + 3 * e, false);
            snprintf(en, sizeof en, "mlp.experts.%d.up_proj.weight", e);
            n = add(t, n, P(en), 2, s->I, s->H, b + 11 + 3 * e, false);
            snprintf(en, sizeof en, "mlp.experts.%d.down_proj.weight", e);
            n = add(t, n, P(en), 2, s->H, s->I, b + 12 + 3 * e, false);
        }
#undef P
    }
    fm_st_entry e[MAX_T];
    for (int i = 0; i < n; i++) {
        e[i] = (fm_st_entry){.name = t[i].name, .dtype = FM_DTYPE_F32, .n_dims = t[i].n_dims};
        e[i].shape[0] = t[i].shape[0], e[i].shape[1] = t[i].shape[1];
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fm_st_writer w;
    fm_error err = {{0}};
    assert_int_equal(fm_st_writer_open(&w, path, e, n, NULL, 0, &err), FM_OK);
    for (int i = 0; i < n; i++) {
        const int64_t count = t[i].n_dims == 1 ? t[i].shape[0] : t[i].shape[0] * t[i].shape[1];
        float *v = malloc((size_t)count * sizeof *v);
        const float scale = t[i].norm ? 0.1f : 1.0f / sqrtf((float)(t[i].n_dims == 2 ? t[i].shape[1] : 1));
        for (int64_t j = 0; j < count; j++)
            v[j] = (t[i].norm ? 1.0f : 0.0f) + scale * rnd_value((uint64_t)t[i].seed, j);
        if (s->poison && strcmp(s->poison, t[i].name) == 0) v[count > 3 ? 3 : 0] = s->poison_value;
        assert_int_equal(fm_st_writer_write(&w, v, (uint64_t)count * 4, &err), FM_OK);
        free(v);
    }
    assert_int_equal(fm_st_writer_close(&w, &err), FM_OK);
}

static fm_status load_on(const char *dir, const char *backend, fm_preset p, fm_model **m, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = backend;
    opt.preset = p;
    return fm_model_load(dir, &opt, m, err);
}

static fm_status load(const char *dir, fm_preset p, fm_model **m, fm_error *err) {
    return load_on(dir, "cpu", p, m, err);
}

/* logits of ids 0, 1, 2, ... (mod V) at T positions, every one finite */
static float *run(fm_model *m, int T) {
    const int V = fm_model_vocab_size(m);
    int32_t ids[64];
    for (int t = 0; t < T; t++) ids[t] = (t * 7 + 1) % V;
    float *lg = malloc((size_t)T * (size_t)V * sizeof *lg);
    fm_error err = {{0}};
    if (fm_context_logits(m->context, ids, T, lg, &err)) fail_msg("logits: %s", err.msg);
    for (int64_t i = 0; i < (int64_t)T * V; i++)
        if (!isfinite(lg[i])) fail_msg("logit %lld is not finite", (long long)i);
    return lg;
}

/* ---- degenerate shapes ------------------------------------------------------------------------------- */

/* One expert, top-1: the MoE layer is its expert with routing weight 1, so the model equals the dense twin (every
 * layer a SwiGLU MLP with the expert's weights) to the last bit but for the order of additions. Before the fix, the
 * router [1, H] was expected as a vector [H]. */
static void one_expert_equals_dense(void **s) {
    (void)s;
    char moe[300], dense[300];
    snprintf(moe, sizeof moe, "%s/e1", tmp);
    snprintf(dense, sizeof dense, "%s/e1-dense", tmp);
    tiny_spec spec = {.V = 40, .H = 64, .heads = 2, .kv = 1, .hd = 16, .E = 1, .k = 1, .I = 32, .L = 2};
    write_tiny(moe, &spec);
    spec.dense = true;
    write_tiny(dense, &spec);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
    for (int p = 0; p < 3; p++) {
        fm_model *a = NULL, *b = NULL;
        fm_error err = {{0}};
        if (load(moe, presets[p], &a, &err)) fail_msg("%s: %s", fm_preset_name(presets[p]), err.msg);
        if (load(dense, presets[p], &b, &err)) fail_msg("%s dense: %s", fm_preset_name(presets[p]), err.msg);
        const int T = 5;
        float *x = run(a, T), *y = run(b, T);
        double worst = 0;
        for (int i = 0; i < T * 40; i++) worst = fmax(worst, fabs((double)x[i] - y[i]));
        print_message("one expert vs dense, %s: max |diff| %.3g\n", fm_preset_name(presets[p]), worst);
        assert_true(worst < 1e-4);
        free(x), free(y);
        fm_model_free(a), fm_model_free(b);
    }
}

/* A vocabulary of one token ([1, H] embedding and lm_head) and a residual width of one ([1] norms, [q, 1]
 * projections; head_dim 2 is the smallest RoPE allows) load and give finite logits of the right shape. */
static void vocab_one_and_width_one(void **s) {
    (void)s;
    char v1[300], h1[300];
    snprintf(v1, sizeof v1, "%s/v1", tmp);
    snprintf(h1, sizeof h1, "%s/h1", tmp);
    const tiny_spec vs = {.V = 1, .H = 32, .heads = 2, .kv = 2, .hd = 16, .E = 4, .k = 2, .I = 16, .L = 1};
    const tiny_spec hs = {.V = 7, .H = 1, .heads = 1, .kv = 1, .hd = 2, .E = 2, .k = 1, .I = 1, .L = 2};
    write_tiny(v1, &vs);
    write_tiny(h1, &hs);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP4};
    for (int p = 0; p < 4; p++) {
        fm_model *m = NULL;
        fm_error err = {{0}};
        if (load(v1, presets[p], &m, &err)) fail_msg("vocab 1, %s: %s", fm_preset_name(presets[p]), err.msg);
        assert_int_equal(fm_model_vocab_size(m), 1);
        free(run(m, 4));
        fm_model_free(m);
        if (load(h1, presets[p], &m, &err)) fail_msg("width 1, %s: %s", fm_preset_name(presets[p]), err.msg);
        free(run(m, 6));
        fm_model_free(m);
    }
}

/* ---- NaN / Inf weights ------------------------------------------------------------------------------- */

static void nonfinite_weights_refused(void **s) {
    (void)s;
    const struct {
        const char *tensor;
        float value;
        const char *what;
    } cases[] = {
        {"model.layers.1.mlp.experts.2.down_proj.weight", NAN, "NaN"},
        {"model.layers.0.self_attn.q_proj.weight", INFINITY, "infinite"},
        {"model.embed_tokens.weight", -INFINITY, "infinite"},
        {"model.layers.0.input_layernorm.weight", NAN, "NaN"},
    };
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/nan%zu", tmp, c);
        tiny_spec spec = {.V = 20,
                          .H = 32,
                          .heads = 2,
                          .kv = 1,
                          .hd = 16,
                          .E = 4,
                          .k = 2,
                          .I = 16,
                          .L = 2,
                          .poison = cases[c].tensor,
                          .poison_value = cases[c].value};
        write_tiny(dir, &spec);
        for (int p = 0; p < 3; p++) {
            fm_model *m = NULL;
            fm_error err = {{0}};
            assert_int_equal(load(dir, presets[p], &m, &err), FM_ERR_FORMAT);
            assert_null(m);
            expect_msg(&err, cases[c].tensor, cases[c].what);
            expect_msg(&err, "element 3", NULL);
            /* the GPU's load reads the stored bits itself: the same refusal where a GPU is present */
            const fm_status st = load_on(dir, "cuda", presets[p], &m, &err);
            assert_null(m);
            if (st == FM_ERR_BACKEND) continue; /* no GPU here */
            assert_int_equal(st, FM_ERR_FORMAT);
            expect_msg(&err, cases[c].tensor, cases[c].what);
        }
    }
}

/* ---- context limit ----------------------------------------------------------------------------------- */

static void context_limit(void **s) {
    (void)s;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ctx", tmp);
    tiny_spec spec = {.V = 20, .H = 32, .heads = 2, .kv = 1, .hd = 16, .E = 2, .k = 1, .I = 16, .L = 1, .max_pos = 8};
    write_tiny(dir, &spec);
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(load(dir, FM_PRESET_REF, &m, &err), FM_OK);
    int32_t ids[32] = {0};
    float *lg = malloc(32 * 20 * sizeof *lg);
    assert_int_equal(fm_context_logits(m->context, ids, 8, lg, &err), FM_OK); /* exactly the limit */
    assert_int_equal(fm_context_logits(m->context, ids, 9, lg, &err), FM_ERR_FORMAT);
    expect_msg(&err, "max_position_embeddings", "--ctx");
    expect_msg(&err, "of 8 tokens", NULL);
    double ppl = 0, loss = 0;
    assert_int_equal(fm_context_perplexity(m->context, ids, 32, 16, 2, NULL, NULL, &ppl, &loss, &err), FM_ERR_FORMAT);
    expect_msg(&err, "16 tokens", "--ctx");
    fm_model_free(m);

    /* an explicit context allows more; the load-time plan (max_tokens) is checked against it too */
    fm_options opt;
    fm_options_init(&opt);
    opt.ctx = 32;
    assert_int_equal(fm_model_load(dir, &opt, &m, &err), FM_OK);
    assert_int_equal(fm_context_logits(m->context, ids, 32, lg, &err), FM_OK);
    fm_model_free(m);
    opt.ctx = 0, opt.max_tokens = 9;
    assert_int_equal(fm_model_load(dir, &opt, &m, &err), FM_ERR_FORMAT);
    assert_null(m);
    expect_msg(&err, "9 tokens", "--ctx");
    opt.ctx = 4, opt.max_tokens = 0; /* smaller than the model's: allowed, and enforced */
    assert_int_equal(fm_model_load(dir, &opt, &m, &err), FM_OK);
    assert_int_equal(fm_context_logits(m->context, ids, 5, lg, &err), FM_ERR_FORMAT);
    expect_msg(&err, "set by --ctx", NULL);
    fm_model_free(m);
    free(lg);
}

/* ---- duplicate JSON keys ----------------------------------------------------------------------------- */

static const char BASE[] = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":20,\"hidden_size\":32,\"num_hidden_layers\":1,"
                           "\"num_attention_heads\":2,\"num_experts\":2,\"num_experts_per_tok\":1,"
                           "\"moe_intermediate_size\":16%s}";

static void duplicate_keys_refused(void **s) {
    (void)s;
    char json[1024];
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    snprintf(json, sizeof json, BASE, "");
    assert_int_equal(fm_config_parse(json, strlen(json), "config.json", c, &err), FM_OK);
    /* Python would read hidden_size = 64, cJSON 32: refused */
    snprintf(json, sizeof json, BASE, ",\"hidden_size\":64");
    assert_int_equal(fm_config_parse(json, strlen(json), "config.json", c, &err), FM_ERR_FORMAT);
    expect_msg(&err, "'hidden_size'", "twice");
    /* nested: inside quantization_config, named by its path */
    snprintf(json, sizeof json, BASE,
             ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"group_size\":64}");
    assert_int_equal(fm_config_parse(json, strlen(json), "config.json", c, &err), FM_ERR_FORMAT);
    expect_msg(&err, "'group_size' appears twice", "'quantization_config'");
    /* inside an array of objects */
    snprintf(json, sizeof json, BASE, ",\"x\":[{\"a\":1},{\"b\":1,\"b\":2}]");
    assert_int_equal(fm_config_parse(json, strlen(json), "config.json", c, &err), FM_ERR_FORMAT);
    expect_msg(&err, "'b' appears twice", "x[1]");
    /* the same key in different objects is fine */
    snprintf(json, sizeof json, BASE, ",\"y\":{\"a\":1},\"z\":{\"a\":2}");
    assert_int_equal(fm_config_parse(json, strlen(json), "config.json", c, &err), FM_OK);
    free(c);
    /* a shard index: a top-level key twice */
    const char *idx = "{\"metadata\":{},\"metadata\":{},\"weight_map\":{\"a\":\"m-1.safetensors\"}}";
    char **shards = NULL;
    int32_t n_shards = 0;
    assert_int_equal(fm_st_parse_index(idx, strlen(idx), "index.json", &shards, &n_shards, &err), FM_ERR_FORMAT);
    expect_msg(&err, "'metadata'", "twice");
}

/* ---- checkpoint regexes ------------------------------------------------------------------------------ */

static fm_status parse_ignore(const char *ignore_json, fm_config *c, fm_error *err) {
    char json[4096];
    char extra[3000];
    snprintf(extra, sizeof extra,
             ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\","
             "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\","
             "\"symmetric\":true,\"strategy\":\"group\",\"group_size\":128}}},\"ignore\":%s}",
             ignore_json);
    snprintf(json, sizeof json, BASE, extra);
    return fm_config_parse(json, strlen(json), "config.json", c, err);
}

static bool ignored(const fm_config *c, const char *module) {
    bool hit = false;
    fm_error err = {{0}};
    if (fm_quant_config_ignores(&c->quant, module, &hit, &err)) fail_msg("%s: %s", module, err.msg);
    return hit;
}

static void checkpoint_regexes(void **s) {
    (void)s;
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    /* re.match semantics: anchored at the start, not at the end */
    assert_int_equal(
        parse_ignore("[\"re:.*mlp\\\\.gate$\",\"re:model\\\\.layers\\\\.0\\\\.\",\"re:(?:lm_head|x)\"]", c, &err),
        FM_OK);
    assert_true(ignored(c, "model.layers.3.mlp.gate"));
    assert_false(ignored(c, "model.layers.3.mlp.gate_proj"));
    assert_true(ignored(c, "model.layers.0.self_attn.q_proj")); /* a prefix match is enough */
    assert_false(ignored(c, "model.layers.1.self_attn.q_proj"));
    assert_true(ignored(c, "lm_head"));
    assert_false(ignored(c, "my.lm_head")); /* not searched: anchored at the start */

    /* glibc regcomp took minutes and GBs on this; PCRE2 refuses it at once (Python: "multiple repeat") */
    char big[600] = "[\"re:a";
    for (int i = 0; i < 200; i++) strcat(big, "+");
    strcat(big, "\"]");
    assert_int_equal(parse_ignore(big, c, &err), FM_ERR_UNSUPPORTED);
    expect_msg(&err, "quantization_config.ignore", "not a valid regular expression");
    /* too long */
    char longp[2200] = "[\"re:";
    for (int i = 0; i < 1100; i++) strcat(longp, "a");
    strcat(longp, "\"]");
    assert_int_equal(parse_ignore(longp, c, &err), FM_ERR_UNSUPPORTED);
    expect_msg(&err, "quantization_config.ignore", "more than the limit of 1024");
    /* catastrophic backtracking: compiles, and the match stops at the limit with a message naming the pattern */
    assert_int_equal(parse_ignore("[\"re:(a|a)+$\"]", c, &err), FM_OK);
    bool hit = true;
    assert_int_equal(fm_quant_config_ignores(&c->quant, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", &hit, &err),
                     FM_ERR_UNSUPPORTED);
    expect_msg(&err, "(a|a)+$", "limit");
    free(c);
}

/* ---- FIFOs ------------------------------------------------------------------------------------------- */

/* Before the fix each of these blocked forever in open(); the alarm turns a hang into a failure. */
static void fifos_refused(void **s) {
    (void)s;
    alarm(60);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/fifo", tmp);
    tiny_spec spec = {.V = 20, .H = 32, .heads = 2, .kv = 1, .hd = 16, .E = 2, .k = 1, .I = 16, .L = 1};
    write_tiny(dir, &spec);
    const char *names[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char saved[420];
        snprintf(saved, sizeof saved, "%s.saved", path);
        rename(path, saved);
        assert_int_equal(mkfifo(path, 0644), 0);
        fm_model *m = NULL;
        fm_error err = {{0}};
        assert_int_equal(load(dir, FM_PRESET_REF, &m, &err), FM_ERR_IO);
        expect_msg(&err, names[i], "not a regular file (a FIFO)");
        unlink(path);
        rename(saved, path);
    }
    snprintf(path, sizeof path, "%s/ids.fifo", tmp);
    assert_int_equal(mkfifo(path, 0644), 0);
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read(path, &ids, &n, &err), FM_ERR_IO);
    expect_msg(&err, "ids.fifo", "a FIFO");
    assert_int_equal(fm_ids_read(tmp, &ids, &n, &err), FM_ERR_IO);
    expect_msg(&err, tmp, "is a directory");
    alarm(0);
}

/* 16 Replace normalizers "a" -> 32 x "a" on the llama-spm tokenizer: one "a" would become 2^80 bytes */
static void stacked_replace_normalizers(void **state) {
    (void)state;
    FILE *f = fopen("tests/tokenizers/llama-spm/tokenizer.json", "rb");
    assert_non_null(f);
    static char text[1 << 20];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "normalizers");
    cJSON_AddStringToObject(seq, "type", "Sequence");
    for (int i = 0; i < 16; i++) { /* the loader's most */
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "type", "Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", "a");
        cJSON_AddStringToObject(r, "content", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        cJSON_AddItemToArray(list, r);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(root, "normalizer", seq);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/stacked-replace", tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *json = cJSON_PrintUnformatted(root);
    write_text(path, json);
    free(json);
    cJSON_Delete(root);
    fm_tokenizer *tok = NULL;
    fm_error err;
    if (fm_tokenizer_load(dir, &tok, &err)) fail_msg("%s", err.msg);
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    assert_int_equal(fm_tokenizer_encode(tok, "a", 1, false, false, &ids, &n_ids, &err), FM_ERR_FORMAT);
    expect_msg(&err, "normalizers", "grow");
    free(ids);
    /* text the normalizers leave alone still encodes */
    assert_int_equal(fm_tokenizer_encode(tok, "hello", 5, false, false, &ids, &n_ids, &err), FM_OK);
    assert_true(n_ids > 0);
    free(ids);
    fm_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_expert_equals_dense),
        cmocka_unit_test(vocab_one_and_width_one),
        cmocka_unit_test(nonfinite_weights_refused),
        cmocka_unit_test(context_limit),
        cmocka_unit_test(duplicate_keys_refused),
        cmocka_unit_test(checkpoint_regexes),
        cmocka_unit_test(fifos_refused),
        cmocka_unit_test(stacked_replace_normalizers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
