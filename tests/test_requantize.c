/* fp8moe requantize and the native binding of our own int4 format:
 *   - the bundled tiny model requantized, then loaded: the int4 and fp8 presets (and fp8 with the GPU's tensor-core
 *     bank layout, emulated on the CPU) give logits bit-identical to the bf16 checkpoint's, with the same banks and
 *     resident bytes; sharded output loads the same;
 *   - the output: our quant_config parser accepts it (compressed-tensors, sym, group 128, routers and lm_head
 *     ignored), every tensor is aligned and __metadata__ is ours; inspect shows the quantization;
 *   - the safetensors writer round-trips through our reader and refuses short or long data;
 *   - native binding: sym g128 bf16 scales -> int4-g128; fp16 scales or zero points -> int4-zp; a -8 code keeps
 *     int4-g128 but not the tensor-core layout;
 *   - an AutoGPTQ quantize_config.json reads as the same GPTQ checkpoint;
 *   - refusals (non-empty --out, quantized input, missing --out) name the problem;
 *   - int4-p2 (--scales p2, --int4-scales p2): the requantized checkpoint and the float one quantized at load give
 *     bit-identical logits with the same banks, whose every row of scales has the p2 form; the option's refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "cli_runner.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/requantize.h"
#include "engine/requantize_dir.h"
#include "quant_fixture.h"
#include "io/config.h"
#include "util/ids.h"
#include "io/safetensors_write.h"
#include "quant/bf16.h"
#include "quant/int4_p2.h"
#include "util/metrics.h"

#define TINY "models/tiny-code-moe"
#define T_TOKENS 24

static char out_dir[300]; /* the requantized tiny model, made once */
static int32_t ids[T_TOKENS];

static void requantize_to(const char *dir, uint64_t shard) {
    fm_requant_opts o = {.in_dir = TINY, .out_dir = dir, .shard_bytes = shard};
    fm_requant_stats s;
    fm_error err = {{0}};
    if (fm_requantize(&o, &s, &err)) fail_msg("requantize -> %s: %s", dir, err.msg);
    assert_int_equal(s.n_quantized, 4 * (4 + 16 * 3)); /* q k v o + 16 experts x 3, 4 layers */
}

static int group_setup(void **state) {
    if (cli_runner_setup(state)) return -1;
    snprintf(out_dir, sizeof out_dir, "%s/int4", cli_tmp);
    requantize_to(out_dir, 0);
    FILE *f = fopen(TINY "/eval_ids.i32", "rb");
    if (!f || fread(ids, sizeof ids, 1, f) != 1) return -1;
    fclose(f);
    return 0;
}

static fm_model *load(const char *dir, fm_preset preset, const char *plan_backend, fm_status want, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    opt.plan_backend = plan_backend;
    fm_model *m = NULL;
    fm_status st = fm_model_load(dir, &opt, &m, err);
    if (st != want) fail_msg("load %s (%s): status %d, want %d: %s", dir, fm_preset_name(preset), st, want, err->msg);
    return m;
}

static float *logits_of(fm_model *m) {
    float *l = malloc((size_t)T_TOKENS * (size_t)fm_model_vocab_size(m) * sizeof(float));
    fm_error err = {{0}};
    if (fm_context_logits(m->context, ids, T_TOKENS, l, &err)) fail_msg("logits: %s", err.msg);
    return l;
}

/* Loads a and b with one plan; their logits must be identical and a's first qkv bank of format fmt_a. */
static void expect_identical(const char *a, const char *b, fm_preset preset, const char *plan_backend, fm_wformat fmt) {
    fm_error err = {{0}};
    fm_model *ma = load(a, preset, plan_backend, FM_OK, &err), *mb = load(b, preset, plan_backend, FM_OK, &err);
    assert_int_equal(ma->layers[0].qkv->fmt, fmt);
    assert_int_equal(ma->layers[0].gate_up->fmt, mb->layers[0].gate_up->fmt);
    assert_int_equal(ma->weight_bytes, mb->weight_bytes); /* the memory plan's int4 formats, byte for byte */
    /* and the memory plan, from the config and the binder's native_layout, counts exactly those bytes */
    fm_memory_plan plan;
    fm_config cfg = ma->cfg;
    cfg.tie_word_embeddings = ma->lm_head == ma->embed;
    assert_int_equal(fm_memory_plan_compute(&cfg, &ma->plan, "cpu", ma->n_layers, 16, &plan, &err), FM_OK);
    assert_true(cfg.quant.native_layout);
    assert_int_equal(plan.weight_total, ma->weight_bytes);
    float *la = logits_of(ma), *lb = logits_of(mb);
    const size_t n = (size_t)T_TOKENS * (size_t)fm_model_vocab_size(ma);
    assert_memory_equal(la, lb, n * sizeof(float));
    printf("  %s %s%s: %zu logits bit-identical to %s, banks %s\n", a, fm_preset_name(preset),
           plan_backend ? " (cuda plan)" : "", n, b, fm_wformat_name(fmt));
    free(la), free(lb);
    fm_model_free(ma), fm_model_free(mb);
}

static void bit_identical(void **s) {
    (void)s;
    expect_identical(out_dir, TINY, FM_PRESET_INT4, NULL, FM_W_INT4_G128);
    expect_identical(out_dir, TINY, FM_PRESET_FP8, NULL, FM_W_INT4_G128);
    expect_identical(out_dir, TINY, FM_PRESET_FP8, "cuda", FM_W_INT4_G128_TC);
}

static void sharded(void **s) {
    (void)s;
    char dir[320], path[400];
    snprintf(dir, sizeof dir, "%s/sharded", cli_tmp);
    requantize_to(dir, 1u << 20);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    fm_st_set a = {0}, b = {0};
    fm_error err = {{0}};
    assert_int_equal(fm_st_open_dir(dir, &a, &err), FM_OK);
    assert_int_equal(fm_st_open_dir(out_dir, &b, &err), FM_OK);
    printf("  sharded: %d files, %lld tensors\n", a.n_files, (long long)a.n_tensors);
    assert_true(a.n_files >= 4);
    assert_int_equal(a.n_tensors, b.n_tensors);
    for (int64_t i = 0; i < a.n_tensors; i++) {
        assert_string_equal(a.by_name[i]->name, b.by_name[i]->name);
        assert_int_equal(a.by_name[i]->nbytes, b.by_name[i]->nbytes);
        assert_memory_equal(a.by_name[i]->data, b.by_name[i]->data, a.by_name[i]->nbytes);
    }
    fm_st_close(&a), fm_st_close(&b);
}

/* ---- the output's format ---------------------------------------------------------------------------------- */

static cJSON *read_header(const char *path, uint64_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t len[8];
    assert_int_equal(fread(len, 1, 8, f), 8);
    *n = 0;
    for (int i = 7; i >= 0; i--) *n = *n << 8 | len[i];
    char *h = malloc(*n + 1);
    assert_int_equal(fread(h, 1, *n, f), *n);
    h[*n] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(h);
    free(h);
    assert_non_null(j);
    return j;
}

static void output_format(void **s) {
    (void)s;
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    assert_int_equal(fm_config_load(out_dir, c, &err), FM_OK);
    assert_int_equal(c->quant.method, FM_QUANT_CT_PACKED);
    assert_true(c->quant.sym);
    assert_false(c->quant.act_order);
    assert_int_equal(c->quant.group_size, 128);
    assert_int_equal(c->quant.n_ignore, 5); /* 4 routers and lm_head */
    assert_true(quant_ignores(&c->quant, "model.layers.3.mlp.gate"));
    assert_true(quant_ignores(&c->quant, "lm_head"));
    assert_false(quant_ignores(&c->quant, "model.layers.3.mlp.experts.0.gate_proj"));
    free(c);

    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    uint64_t hn = 0;
    cJSON *h = read_header(path, &hn);
    assert_int_equal((8 + hn) % 8, 0);
    const cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
    assert_string_equal(cJSON_GetObjectItem(meta, "format")->valuestring, "pt");
    assert_string_equal(cJSON_GetObjectItem(meta, "fp8moe.source")->valuestring, "tiny-code-moe");
    assert_string_equal(cJSON_GetObjectItem(meta, "fp8moe.version")->valuestring, FP8MOE_VERSION);
    assert_non_null(strstr(cJSON_GetObjectItem(meta, "fp8moe.quantizer")->valuestring, "group 128"));
    fm_st_set set = {0};
    assert_int_equal(fm_st_open_dir(out_dir, &set, &err), FM_OK);
    for (int64_t i = 0; i < set.n_tensors; i++) { /* every tensor aligned to its element size in the file */
        const fm_st_tensor *t = set.by_name[i];
        assert_int_equal((uintptr_t)t->data % (uintptr_t)fm_dtype_size(t->dtype), 0);
    }
    const fm_st_tensor *p = fm_st_find(&set, "model.layers.1.self_attn.o_proj.weight_packed"),
                       *sc = fm_st_find(&set, "model.layers.1.self_attn.o_proj.weight_scale"),
                       *sh = fm_st_find(&set, "model.layers.1.self_attn.o_proj.weight_shape"),
                       *e = fm_st_find(&set, "model.embed_tokens.weight");
    assert_non_null(p), assert_non_null(sc), assert_non_null(sh), assert_non_null(e);
    assert_int_equal(p->dtype, FM_DTYPE_I32), assert_int_equal(p->shape[0], 192), assert_int_equal(p->shape[1], 24);
    assert_int_equal(sc->dtype, FM_DTYPE_BF16), assert_int_equal(sc->shape[1], 2); /* K = 192: a partial group */
    int64_t shape[2];
    memcpy(shape, sh->data, sizeof shape);
    assert_int_equal(sh->dtype, FM_DTYPE_I64), assert_int_equal(shape[0], 192), assert_int_equal(shape[1], 192);
    for (int64_t i = 0; i < p->n_elements; i++) { /* codes -7..7: no nibble is 0 (q = -8) */
        uint32_t w;
        memcpy(&w, p->data + 4 * i, 4);
        for (int j = 0; j < 8; j++) assert_int_not_equal((w >> (4 * j)) & 15u, 0);
    }
    fm_st_set in = {0}; /* copied tensors: byte for byte */
    assert_int_equal(fm_st_open_dir(TINY, &in, &err), FM_OK);
    const fm_st_tensor *e0 = fm_st_find(&in, "model.embed_tokens.weight");
    assert_memory_equal(e->data, e0->data, e0->nbytes);
    assert_null(fm_st_find(&set, "model.layers.0.self_attn.q_proj.weight"));
    fm_st_close(&in), fm_st_close(&set);
    cJSON_Delete(h);
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    assert_int_equal(access(path, F_OK), 0);

    assert_int_equal(fp8moe("inspect --model %s", out_dir), 0);
    assert_non_null(strstr(cli_out, "quantization: compressed-tensors pack-quantized, int4, group 128, symmetric"));
    assert_non_null(strstr(cli_out, "192 / 192"));
}

/* ---- the writer ----------------------------------------------------------------------------------------------- */

static void writer_roundtrip(void **s) {
    (void)s;
    char path[320];
    snprintf(path, sizeof path, "%s/w.safetensors", cli_tmp);
    int64_t i64[2] = {-3, 1ll << 40};
    int32_t i32[15];
    uint16_t b16[7];
    uint8_t u8[3] = {1, 2, 255};
    for (int i = 0; i < 15; i++) i32[i] = i * 7919 - 50000;
    for (int i = 0; i < 7; i++) b16[i] = fm_f32_to_bf16(0.5f * (float)i - 1.25f);
    fm_st_entry e[4] = {{"z.bf16", FM_DTYPE_BF16, 1, {7}},
                        {"a.u8", FM_DTYPE_U8, 1, {3}},
                        {"m.i32", FM_DTYPE_I32, 2, {3, 5}},
                        {"b.i64", FM_DTYPE_I64, 1, {2}}};
    fm_st_entries_sort(e, 4);
    assert_string_equal(e[0].name, "b.i64"), assert_string_equal(e[1].name, "m.i32");
    assert_string_equal(e[2].name, "z.bf16"), assert_string_equal(e[3].name, "a.u8");
    const void *data[4] = {i64, i32, b16, u8};
    const char *meta[2] = {"format", "pt"};
    fm_st_writer w;
    fm_error err = {{0}};
    assert_int_equal(fm_st_writer_open(&w, path, e, 4, meta, 1, &err), FM_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(fm_st_writer_write(&w, data[i], fm_st_entry_bytes(&e[i]), &err), FM_OK);
    assert_int_equal(fm_st_writer_close(&w, &err), FM_OK);
    fm_st_file f;
    assert_int_equal(fm_st_open_file(path, &f, &err), FM_OK);
    assert_int_equal(f.n_tensors, 4);
    for (int i = 0; i < 4; i++) {
        const fm_st_tensor *t = NULL;
        for (int j = 0; j < 4; j++)
            if (!strcmp(f.tensors[j].name, e[i].name)) t = &f.tensors[j];
        assert_non_null(t);
        assert_int_equal(t->dtype, e[i].dtype);
        assert_int_equal(t->nbytes, fm_st_entry_bytes(&e[i]));
        assert_memory_equal(t->data, data[i], t->nbytes);
        assert_int_equal((t->data - f.map) % fm_dtype_size(t->dtype), 0);
    }
    assert_int_equal((f.tensors[0].data - f.map) % 8, 0); /* the header padded to 8 */
    fm_st_close_file(&f);
    uint64_t hn = 0;
    cJSON *h = read_header(path, &hn);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "format")->valuestring, "pt");
    cJSON_Delete(h);
    /* too many bytes, too few: refused, and no file is left */
    snprintf(path, sizeof path, "%s/short.safetensors", cli_tmp);
    assert_int_equal(fm_st_writer_open(&w, path, e, 4, NULL, 0, &err), FM_OK);
    assert_int_equal(fm_st_writer_write(&w, i64, 16, &err), FM_OK);
    assert_int_equal(fm_st_writer_write(&w, i32, 4096, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "past the"));
    assert_int_equal(fm_st_writer_close(&w, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "16 data bytes written, the header declares"));
    assert_int_not_equal(access(path, F_OK), 0);
    char partial[340];
    snprintf(partial, sizeof partial, "%s.partial", path);
    assert_int_not_equal(access(partial, F_OK), 0);
}

/* ---- native binding: variants of the requantized model ------------------------------------------------------- */

typedef enum variant { V_F16_SCALES, V_ZERO_POINTS, V_ZERO_POINT_9, V_MINUS8 } variant;

/* dst gets out_dir's checkpoint changed as the variant says, written with our writer (in name order: the reader
 * needs no alignment). */
static void make_variant(const char *dst, variant v) {
    char path[400];
    fm_error err = {{0}};
    fm_st_set set = {0};
    assert_int_equal(fm_st_open_dir(out_dir, &set, &err), FM_OK);
    const int64_t n0 = set.n_tensors;
    fm_st_entry *e = calloc((size_t)n0 * 2, sizeof *e);
    const void **data = calloc((size_t)n0 * 2, sizeof *data);
    void **owned = calloc((size_t)n0 * 2, sizeof *owned);
    char **names = calloc((size_t)n0, sizeof *names);
    int64_t n = 0;
    for (int64_t i = 0; i < n0; i++) {
        const fm_st_tensor *t = set.by_name[i];
        e[n] = (fm_st_entry){t->name, t->dtype, t->n_dims, {0}};
        memcpy(e[n].shape, t->shape, sizeof e[n].shape);
        data[n++] = t->data;
        const size_t len = strlen(t->name);
        const bool scale = len > 12 && !strcmp(t->name + len - 12, "weight_scale");
        if (v == V_F16_SCALES && scale) { /* the same values as F16 (exact: in range, 8 significant bits) */
            uint16_t *h = malloc((size_t)t->n_elements * 2);
            for (int64_t k = 0; k < t->n_elements; k++) {
                uint16_t b;
                memcpy(&b, t->data + 2 * k, 2);
                h[k] = fm_f32_to_f16(fm_bf16_to_f32(b));
                assert_true(fm_f16_to_f32(h[k]) == fm_bf16_to_f32(b));
            }
            e[n - 1].dtype = FM_DTYPE_F16, data[n - 1] = owned[n - 1] = h;
        }
        if ((v == V_ZERO_POINTS || v == V_ZERO_POINT_9) && scale) { /* zero points 8: the same numbers */
            names[i] = malloc(len + 8);
            snprintf(names[i], len + 8, "%.*szero_point", (int)(len - 5), t->name);
            const int64_t rows = (t->shape[0] + 7) / 8, ng = t->shape[1];
            uint32_t *z = malloc((size_t)(rows * ng) * 4);
            for (int64_t k = 0; k < rows * ng; k++) z[k] = 0x88888888u;
            if (v == V_ZERO_POINT_9 && strstr(t->name, "layers.0.self_attn.q_proj")) z[0] = 0x88888889u; /* asym */
            e[n] = (fm_st_entry){names[i], FM_DTYPE_I32, 2, {rows, ng}};
            data[n] = owned[n] = z;
            n++;
        }
        if (v == V_MINUS8 && !strcmp(t->name, "model.layers.0.self_attn.q_proj.weight_packed")) {
            uint32_t *p = malloc(t->nbytes);
            memcpy(p, t->data, t->nbytes);
            p[5] &= ~0xF0u; /* one code u = 0: q = -8 */
            data[n - 1] = owned[n - 1] = p;
        }
    }
    mkdir(dst, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    fm_st_writer w;
    assert_int_equal(fm_st_writer_open(&w, path, e, n, NULL, 0, &err), FM_OK);
    for (int64_t j = 0; j < n; j++)
        assert_int_equal(fm_st_writer_write(&w, data[j], fm_st_entry_bytes(&e[j]), &err), FM_OK);
    assert_int_equal(fm_st_writer_close(&w, &err), FM_OK);
    for (int64_t j = 0; j < n; j++) free(owned[j]);
    for (int64_t i = 0; i < n0; i++) free(names[i]);
    free(e), free(data), free(owned), free(names);
    fm_st_close(&set);
    /* config.json: asymmetric when zero points are stored */
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    char *text = malloc(1 << 16);
    slurp(path, text, 1 << 16);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    cJSON *wts = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "quantization_config"), "config_groups"),
                            "group_0"),
        "weights");
    if (v == V_ZERO_POINTS || v == V_ZERO_POINT_9) cJSON_ReplaceItemInObject(wts, "symmetric", cJSON_CreateFalse());
    assert_int_equal(fm_requant_write_json(dst, "config.json", cfg, &err), FM_OK);
    cJSON_Delete(cfg);
}

/* Loads dir with the int4 preset: its qkv and expert down banks must be of the formats given, its logits within
 * min_cosine of the native binding's (ref). */
static void expect_binding(const char *dir, fm_wformat qkv, fm_wformat down, const float *ref, double min_cosine) {
    fm_error err = {{0}};
    fm_model *m = load(dir, FM_PRESET_INT4, NULL, FM_OK, &err);
    assert_int_equal(m->layers[0].qkv->fmt, qkv);
    assert_int_equal(m->layers[0].down->fmt, down);
    float *l = logits_of(m);
    fm_compare c;
    fm_logits_compare(ref, l, T_TOKENS, fm_model_vocab_size(m), &c);
    printf("  %s: qkv %s, experts down %s, cosine %.9f vs the native binding, max|diff| %.3g\n", dir,
           fm_wformat_name(qkv), fm_wformat_name(down), c.cosine, c.max_abs_err);
    assert_true(c.cosine >= min_cosine);
    if (min_cosine == 1.0) assert_memory_equal(l, ref, (size_t)T_TOKENS * (size_t)fm_model_vocab_size(m) * 4);
    free(l);
    fm_model_free(m);
}

static void native_binding(void **s) {
    (void)s;
    fm_error err = {{0}};
    fm_model *m = load(out_dir, FM_PRESET_INT4, NULL, FM_OK, &err);
    float *ref = logits_of(m);
    fm_model_free(m);
    char dir[320];
    /* fp16 scales: not the bank's scale dtype, so the checkpoint's own format (the same numbers, other sum order) */
    snprintf(dir, sizeof dir, "%s/f16-scales", cli_tmp);
    make_variant(dir, V_F16_SCALES);
    expect_binding(dir, FM_W_INT4_ZP, FM_W_INT4_ZP, ref, 0.99999);
    /* asymmetric by its config, but every zero point 8: exactly our format, bound natively */
    snprintf(dir, sizeof dir, "%s/zero-points", cli_tmp);
    make_variant(dir, V_ZERO_POINTS);
    expect_binding(dir, FM_W_INT4_G128, FM_W_INT4_G128, ref, 1.0);
    /* one zero point 9 in layer 0's q_proj: that bank keeps the checkpoint's format, the others bind natively */
    snprintf(dir, sizeof dir, "%s/zero-point-9", cli_tmp);
    make_variant(dir, V_ZERO_POINT_9);
    expect_binding(dir, FM_W_INT4_ZP, FM_W_INT4_G128, ref, 0.999);
    /* a -8 code: int4-g128 holds it (the int4 preset, fp8 on the cpu plan), the tensor-core layout does not: that
       bank keeps the checkpoint's format under the fp8 plan of the GPU (int4-zp-tc, whose unsigned codes hold any) */
    snprintf(dir, sizeof dir, "%s/minus8", cli_tmp);
    make_variant(dir, V_MINUS8);
    m = load(dir, FM_PRESET_INT4, NULL, FM_OK, &err);
    assert_int_equal(m->layers[0].qkv->fmt, FM_W_INT4_G128);
    fm_model_free(m);
    m = load(dir, FM_PRESET_FP8, NULL, FM_OK, &err);
    assert_int_equal(m->layers[0].qkv->fmt, FM_W_INT4_G128);
    fm_model_free(m);
    m = load(dir, FM_PRESET_FP8, "cuda", FM_OK, &err);
    assert_int_equal(m->layers[0].qkv->fmt, FM_W_INT4_ZP_TC);
    assert_int_equal(m->layers[0].o->fmt, FM_W_INT4_G128_TC);
    fm_model_free(m);
    free(ref);
}

/* ---- AutoGPTQ quantize_config.json -------------------------------------------------------------------------- */

/* dir gets the fixture's config.json without quantization_config, that object (less quant_method when drop_method,
 * else with quant_method set to method) as quantize_config.json, and a link to its model.safetensors. */
static void make_autogptq(const char *dir, const char *fixture, bool drop_method, const char *method) {
    char path[400], target[PATH_MAX];
    fm_error err = {{0}};
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "tests/data/quant/%s/config.json", fixture);
    char *text = malloc(1 << 16);
    slurp(path, text, 1 << 16);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    cJSON *qc = cJSON_DetachItemFromObject(cfg, "quantization_config");
    assert_non_null(qc);
    if (drop_method) cJSON_DeleteItemFromObject(qc, "quant_method");
    else cJSON_ReplaceItemInObject(qc, "quant_method", cJSON_CreateString(method));
    assert_int_equal(fm_requant_write_json(dir, "config.json", cfg, &err), FM_OK);
    assert_int_equal(fm_requant_write_json(dir, "quantize_config.json", qc, &err), FM_OK);
    cJSON_Delete(cfg), cJSON_Delete(qc);
    snprintf(path, sizeof path, "tests/data/quant/%s/model.safetensors", fixture);
    assert_non_null(realpath(path, target));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    assert_int_equal(symlink(target, path), 0);
}

static void autogptq_quantize_config(void **s) {
    (void)s;
    const char *fixtures[2] = {"gptq-v1-sym", "gptq-v1-asym-actorder"};
    for (int f = 0; f < 2; f++) {
        char dir[320], orig[320];
        snprintf(dir, sizeof dir, "%s/autogptq-%d", cli_tmp, f);
        snprintf(orig, sizeof orig, "tests/data/quant/%s", fixtures[f]);
        make_autogptq(dir, fixtures[f], f == 0, "gptq");
        fm_config *c = malloc(sizeof *c), *c0 = malloc(sizeof *c0);
        fm_error err = {{0}};
        assert_int_equal(fm_config_load(dir, c, &err), FM_OK);
        assert_int_equal(fm_config_load(orig, c0, &err), FM_OK);
        assert_memory_equal(&c->quant, &c0->quant, sizeof c->quant);
        free(c), free(c0);
        fm_model *a = load(dir, FM_PRESET_INT4, NULL, FM_OK, &err), *b = load(orig, FM_PRESET_INT4, NULL, FM_OK, &err);
        int32_t small[9];
        for (int i = 0; i < 9; i++) small[i] = (i * 7 + 3) % fm_model_vocab_size(a);
        const size_t n = 9 * (size_t)fm_model_vocab_size(a);
        float *la = malloc(n * sizeof(float)), *lb = malloc(n * sizeof(float));
        assert_int_equal(fm_context_logits(a->context, small, 9, la, &err), FM_OK);
        assert_int_equal(fm_context_logits(b->context, small, 9, lb, &err), FM_OK);
        assert_memory_equal(la, lb, n * sizeof(float));
        printf("  %s with quantize_config.json: %zu logits identical to the quantization_config original\n",
               fixtures[f], n);
        free(la), free(lb);
        fm_model_free(a), fm_model_free(b);
    }
    char dir[320];
    snprintf(dir, sizeof dir, "%s/autogptq-awq", cli_tmp);
    make_autogptq(dir, "gptq-v1-sym", false, "awq");
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    assert_int_equal(fm_config_load(dir, c, &err), FM_ERR_UNSUPPORTED);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "quantize_config.json: quant_method = \"awq\""));
    free(c);
}

/* ---- the command line ----------------------------------------------------------------------------------------- */

static void cli_refusals(void **s) {
    (void)s;
    assert_int_equal(fp8moe("requantize --help"), 0);
    assert_non_null(strstr(cli_out, "pack-quantized"));
    assert_int_equal(fp8moe("--requantize --help"), 0);
    assert_int_equal(fp8moe("--help"), 0);
    assert_non_null(strstr(cli_out, "--requantize"));
    assert_int_equal(fp8moe("requantize --model %s", TINY), 2);
    assert_non_null(strstr(cli_err, "--out OUT_DIR"));
    assert_int_equal(fp8moe("requantize --model %s --out %s", TINY, out_dir), 2);
    assert_non_null(strstr(cli_err, "exists and is not empty"));
    assert_non_null(strstr(cli_err, "--force"));
    assert_int_equal(fp8moe("requantize --model %s --out %s/again", out_dir, cli_tmp), 1);
    assert_non_null(strstr(cli_err, "is already quantized (compressed-tensors pack-quantized"));
    assert_int_equal(fp8moe("requantize --model tests/data/quant/gptq-v1-sym --out %s/again", cli_tmp), 1);
    assert_non_null(strstr(cli_err, "already quantized (gptq"));
    assert_int_equal(fp8moe("requantize --model %s --out %s -q", TINY, TINY), 2);
    assert_non_null(strstr(cli_err, "is the input directory"));
    /* --force into the existing output: the same checkpoint again */
    assert_int_equal(fp8moe("requantize --model %s --out %s --force --quiet", TINY, out_dir), 0);
}

/* Every row of every matrix of an int4 bank has int4-p2 scales. */
static void expect_p2_bank(const fm_bank *w) {
    assert_true(fm_wformat_is_int4(w->fmt) && w->scales);
    for (int64_t r = 0; r < (int64_t)w->n * w->rows; r++)
        if (!fm_int4_p2_split(w->scales + r * w->n_groups, w->n_groups, NULL, NULL))
            fail_msg("%s row %lld: scales without the p2 form", fm_wformat_name(w->fmt), (long long)r);
}

static void int4_p2(void **s) {
    (void)s;
    char p2_dir[320];
    snprintf(p2_dir, sizeof p2_dir, "%s/int4-p2", cli_tmp);
    assert_int_equal(fp8moe("requantize --model %s --out %s --scales p2 -q", TINY, p2_dir), 0);
    const fm_preset presets[2] = {FM_PRESET_INT4, FM_PRESET_FP8};
    const char *plans[2] = {NULL, "cuda"};
    for (int i = 0; i < 3; i++) {
        fm_error err = {{0}};
        fm_options opt;
        fm_options_init(&opt);
        opt.preset = presets[i > 0], opt.plan_backend = plans[i == 2];
        fm_model *ma = load(p2_dir, opt.preset, opt.plan_backend, FM_OK, &err), *mb = NULL;
        opt.int4_scales = FM_INT4_SCALES_P2;
        if (fm_model_load(TINY, &opt, &mb, &err)) fail_msg("load %s with --int4-scales p2: %s", TINY, err.msg);
        for (int l = 0; l < ma->n_layers; l++) {
            expect_p2_bank(ma->layers[l].qkv), expect_p2_bank(ma->layers[l].gate_up),
                expect_p2_bank(ma->layers[l].down);
            expect_p2_bank(mb->layers[l].gate_up), expect_p2_bank(mb->layers[l].down);
        }
        assert_int_equal(ma->layers[0].gate_up->fmt, mb->layers[0].gate_up->fmt);
        assert_int_equal(ma->weight_bytes, mb->weight_bytes);
        float *la = logits_of(ma), *lb = logits_of(mb);
        assert_memory_equal(la, lb, (size_t)T_TOKENS * (size_t)fm_model_vocab_size(ma) * sizeof(float));
        free(la), free(lb);
        fm_model_free(ma), fm_model_free(mb);
    }
    /* refusals: a bad name, a preset without int4 weights, a quantized checkpoint (the cuda backend quantizes to
       int4-p2 on the device: tests/gpu/test_cuda_fold.c) */
    assert_int_equal(fp8moe("requantize --model %s --out %s/p2x --scales p3", TINY, cli_tmp), 2);
    assert_non_null(strstr(cli_err, "expected g128 or p2"));
    assert_int_equal(fp8moe("perplexity --model %s --ids %s/eval_ids.i32 --windows 1 --int4-scales p3", TINY, TINY), 2);
    assert_non_null(strstr(cli_err, "--int4-scales must be g128 or p2"));
    assert_int_equal(fp8moe("perplexity --model %s --ids %s/eval_ids.i32 --windows 1 --int4-scales p2", TINY, TINY), 2);
    assert_non_null(strstr(cli_err, "quantizes no weights to int4"));
    assert_int_equal(
        fp8moe("perplexity --model %s --ids %s/eval_ids.i32 --windows 1 --preset fp8 --int4-scales p2", p2_dir, TINY),
        2);
    assert_non_null(strstr(cli_err, "already quantized"));
    /* and it runs */
    assert_int_equal(fp8moe("perplexity --model %s --ids %s/eval_ids.i32 --windows 1 --window 64 --preset fp8 "
                            "--int4-scales p2",
                            TINY, TINY),
                     0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(writer_roundtrip), cmocka_unit_test(bit_identical),
        cmocka_unit_test(output_format),    cmocka_unit_test(sharded),
        cmocka_unit_test(native_binding),   cmocka_unit_test(autogptq_quantize_config),
        cmocka_unit_test(cli_refusals),     cmocka_unit_test(int4_p2),
    };
    return cmocka_run_group_tests(tests, group_setup, cli_runner_teardown);
}
