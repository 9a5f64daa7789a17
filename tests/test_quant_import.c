/* Pre-quantized int4 checkpoints (GPTQ v1/v2, AWQ GEMM, compressed-tensors pack-quantized; block-FP8 for the ref
 * presets) against an independent packer: tools/pack_quantized.py (numpy, written from the published formats) made
 * tests/data/quant/<name>/ and, beside each, dequant/ with every quantized linear replaced by the format's dequantized
 * fp32 weight.
 *   - import: our decoding of every quantized linear equals the packer's fp32 weight bit for bit;
 *   - op: the int4-zp bank (packed codes, zero points, act-order permutation) in linear and moe equals an fp32 bank
 *     of the dequantized weights up to fp32 summation order (relative 1e-5);
 *   - model, ref: the imported checkpoint dequantized by the ref preset gives the same logits, bit for bit, as the
 *     packer's dequantized checkpoint;
 *   - model, int4: the int4 preset runs the packed codes (w4a16) and is held to cosine >= 0.99998 and
 *     max |diff| <= 1e-2 x max |logit| against the ref (fp32) run of the dequantized weights. The weights are the
 *     same numbers; what differs is that the int4 preset rounds every activation to bf16 at op boundaries and keeps
 *     embeddings, norms, router and lm_head in bf16 (2^-9 relative per rounding, which compounds through the layer:
 *     measured cosine 0.999994-0.999996, max |diff| <= 0.0045 x max |logit| on these fixtures);
 *   - malformed tensors and configs give clear errors naming the tensor or field. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant_fixture.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "fp8moe.h"
#include "io/config.h"
#include "util/ids.h"
#include "io/safetensors.h"
#include "model/model_src.h"
#include "util/metrics.h"

#define DATA "tests/data/quant"

static const char *const fixtures[] = {"gptq-v1-sym", "gptq-v1-asym-actorder",  "gptq-v2-asym-channel", "awq-gemm",
                                       "ct-sym",      "ct-asym-actorder-ignore"};
#define N_FIXTURES (int)(sizeof fixtures / sizeof *fixtures)

static const fm_st_tensor *find_in(const void *set, const char *name) { return fm_st_find(set, name); }

/* ---- import: decoded weights == the packer's -------------------------------------------------------------- */

static void check_import(const char *name) {
    char dir[256], ddir[256];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    snprintf(ddir, sizeof ddir, DATA "/%s/dequant", name);
    fm_error err = {{0}};
    fm_config cfg;
    fm_st_set qset = {0}, dset = {0};
    assert_int_equal(fm_config_load(dir, &cfg, &err), FM_OK);
    assert_int_not_equal(cfg.quant.method, FM_QUANT_NONE);
    assert_int_equal(fm_st_open_dir(dir, &qset, &err), FM_OK);
    assert_int_equal(fm_st_open_dir(ddir, &dset, &err), FM_OK);
    int n_checked = 0;
    for (int64_t i = 0; i < dset.n_tensors; i++) {
        const fm_st_tensor *t = dset.by_name[i];
        if (t->dtype != FM_DTYPE_F32) continue; /* the packer wrote exactly the quantized linears in F32 */
        char module[512];
        snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        fm_wsrc src = {.rows = t->shape[0], .cols = t->shape[1]};
        fm_status st = fm_qsrc_bind(&cfg.quant, module, t->shape[0], t->shape[1], find_in, &qset, &src.q, &err);
        if (st) fail_msg("%s: %s", module, err.msg);
        float *w = malloc((size_t)t->n_elements * sizeof(float));
        st = fm_wsrc_read(&src, w, &err); /* what the ref presets and bank_create read */
        if (st) fail_msg("%s: %s", module, err.msg);
        if (memcmp(w, t->data, t->nbytes) != 0) {
            int64_t k = 0;
            while (memcmp(&w[k], t->data + 4 * k, 4) == 0) k++;
            float ref;
            memcpy(&ref, t->data + 4 * k, 4);
            fail_msg("%s: element %lld: ours %.9g, packer's %.9g", module, (long long)k, w[k], ref);
        }
        free(w);
        n_checked++;
    }
    printf("%-28s %d quantized linears reproduced bit for bit\n", name, n_checked);
    assert_true(n_checked >= 15);
    fm_st_close(&qset);
    fm_st_close(&dset);
}

static void import_all(void **s) {
    (void)s;
    for (int i = 0; i < N_FIXTURES; i++) check_import(fixtures[i]);
    check_import("fp8-block");
}

/* ---- ops: int4-zp bank vs an fp32 bank of the dequantized weights ------------------------------------------- */

static double rel_err(const float *x, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++)
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), den += (double)ref[i] * ref[i];
    return sqrt(num / (den > 0 ? den : 1));
}

static fm_bank *bank_of(fm_backend *be, const fm_wsrc *srcs, int32_t n, int32_t parts, fm_wformat fmt) {
    fm_bank_src src = {srcs, n, parts, "test bank", parts == 2, false};
    fm_bank *b = NULL;
    fm_error err = {{0}};
    if (be->ops->bank_create(be, &src, fmt, &b, &err)) fail_msg("bank_create: %s", err.msg);
    return b;
}

static void check_ops(const char *name) {
    quant_fixture f;
    quant_fixture_open(&f, DATA, name);
    const fm_model_src *qs = &f.qs, *ds = &f.ds;
    const fm_config *qcfg = &f.qcfg;
    fm_error err = {{0}};
    assert_int_equal(qs->n_unused, 0); /* every tensor of the checkpoint found its slot */
    fm_plan plan;
    fm_plan_from_preset(FM_PRESET_REF, &plan); /* fp32 activations: only the summation order differs */
    fm_backend *be = NULL;
    assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);

    const fm_layer_src *ql = &qs->layers[0], *dl = &ds->layers[0];
    const int32_t E = qcfg->n_experts, H = qcfg->hidden_size, I = qcfg->moe_intermediate;
    /* q|k|v (three parts sharing the input order) */
    const fm_wsrc qqkv[3] = {ql->q, ql->k, ql->v}, dqkv[3] = {dl->q, dl->k, dl->v};
    assert_true(fm_wsrc_is_quantized(&ql->q));
    fm_bank *zq = bank_of(be, qqkv, 1, 3, FM_W_INT4_ZP), *fq = bank_of(be, dqkv, 1, 3, FM_W_F32);
    const int64_t M = 3, N = zq->rows;
    float *x = malloc((size_t)(M * H) * sizeof(float)), *y = malloc((size_t)(M * N) * sizeof(float)),
          *r = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M * H; i++) x[i] = sinf(0.7f * (float)i + 0.3f) + 0.1f * (float)(i % 5);
    be->ops->linear(be, zq, 0, x, M, FM_A_NATIVE, y);
    be->ops->linear(be, fq, 0, x, M, FM_A_NATIVE, r);
    const double e_lin = rel_err(y, r, M * N);
    /* experts through the moe op: gate|up and down of every expert, two experts per token */
    fm_wsrc *qgu = malloc((size_t)E * 2 * sizeof *qgu), *dgu = malloc((size_t)E * 2 * sizeof *dgu);
    for (int32_t e = 0; e < E; e++) {
        qgu[2 * e] = ql->expert_gate[e], qgu[2 * e + 1] = ql->expert_up[e];
        dgu[2 * e] = dl->expert_gate[e], dgu[2 * e + 1] = dl->expert_up[e];
    }
    fm_bank *zgu = bank_of(be, qgu, E, 2, FM_W_INT4_ZP), *fgu = bank_of(be, dgu, E, 2, FM_W_F32);
    fm_bank *zd = bank_of(be, ql->expert_down, E, 1, FM_W_INT4_ZP), *fd = bank_of(be, dl->expert_down, E, 1, FM_W_F32);
    int32_t ids[6] = {0, 3, 2, 1, 3, 2};
    float wts[6] = {0.6f, 0.4f, 0.75f, 0.25f, 0.5f, 0.5f};
    float *mo = malloc((size_t)(M * H) * sizeof(float)), *mr = malloc((size_t)(M * H) * sizeof(float));
    be->ops->moe(be, zgu, zd, x, M, ids, wts, 2, FM_A_NATIVE, FM_A_NATIVE, mo);
    be->ops->moe(be, fgu, fd, x, M, ids, wts, 2, FM_A_NATIVE, FM_A_NATIVE, mr);
    const double e_moe = rel_err(mo, mr, M * H);
    printf("%-28s linear qkv rel err %.2e, moe rel err %.2e (int4-zp %zu bytes vs fp32 %zu)\n", name, e_lin, e_moe,
           be->ops->bank_bytes(zgu) + be->ops->bank_bytes(zd), be->ops->bank_bytes(fgu) + be->ops->bank_bytes(fd));
    assert_true(e_lin < 1e-5);
    assert_true(e_moe < 1e-5);
    assert_true(be->ops->bank_bytes(zgu) < be->ops->bank_bytes(fgu) / 4); /* codes stay packed */
    (void)I;
    fm_bank *banks[] = {zq, fq, zgu, fgu, zd, fd};
    for (size_t i = 0; i < sizeof banks / sizeof *banks; i++) be->ops->bank_free(be, banks[i]);
    be->ops->destroy(be);
    free(x), free(y), free(r), free(qgu), free(dgu), free(mo), free(mr);
    quant_fixture_close(&f);
}

static void ops_all(void **s) {
    (void)s;
    for (int i = 0; i < N_FIXTURES; i++) check_ops(fixtures[i]);
}

/* ---- whole model -------------------------------------------------------------------------------------------- */

static float *run(const char *dir, fm_preset preset, const int32_t *ids, int64_t T, int32_t *V) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(dir, &opt, &m, &err);
    if (st) fail_msg("load %s (%s): %s", dir, fm_preset_name(preset), err.msg);
    fm_context *ctx = NULL;
    if (fm_context_create(m, NULL, &ctx, &err)) fail_msg("context %s: %s", dir, err.msg);
    *V = fm_model_vocab_size(m);
    float *logits = malloc((size_t)T * (size_t)*V * sizeof(float));
    st = fm_context_logits(ctx, ids, T, logits, &err);
    if (st) fail_msg("logits %s: %s", dir, err.msg);
    fm_context_free(ctx);
    fm_model_free(m);
    return logits;
}

static void check_model(const char *name) {
    char dir[256], ddir[256], path[300];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    snprintf(ddir, sizeof ddir, DATA "/%s/dequant", name);
    snprintf(path, sizeof path, "%s/golden_ids.i32", dir);
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read(path, &ids, &T, &err), FM_OK);
    int32_t V = 0, V2 = 0;
    float *oracle = run(ddir, FM_PRESET_REF, ids, T, &V);
    float *ref_q = run(dir, FM_PRESET_REF, ids, T, &V2);
    assert_int_equal(V, V2);
    assert_memory_equal(ref_q, oracle, (size_t)(T * V) * sizeof(float));
    float *int4 = run(dir, FM_PRESET_INT4, ids, T, &V2);
    fm_compare c;
    fm_logits_compare(oracle, int4, T, V, &c);
    printf("%-28s ref bit-identical; int4 (packed codes) vs oracle: cosine %.8f, max|diff| %.3g (%.2g x max|logit|), "
           "argmax %.1f%%\n",
           name, c.cosine, c.max_abs_err, c.max_abs_err / c.max_abs_ref, 100 * c.argmax_agree);
    assert_int_equal(c.n_nonfinite, 0);
    assert_true(c.cosine >= 0.99998);
    assert_true(c.max_abs_err <= 1e-2 * c.max_abs_ref);
    free(oracle), free(ref_q), free(int4), free(ids);
}

static void model_all(void **s) {
    (void)s;
    for (int i = 0; i < N_FIXTURES; i++) check_model(fixtures[i]);
}

/* Block-FP8: the ref presets dequantize it exactly (the same logits as the packer's fp32 weights); the int4 preset
 * refuses it by name rather than requantize it (the fp8 preset: tests/test_fp8_prequant.c). */
static void fp8_block_model(void **s) {
    (void)s;
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    assert_int_equal(fm_ids_read(DATA "/fp8-block/golden_ids.i32", &ids, &T, &err), FM_OK);
    int32_t V = 0, V2 = 0;
    float *oracle = run(DATA "/fp8-block/dequant", FM_PRESET_REF, ids, T, &V);
    float *ref_q = run(DATA "/fp8-block", FM_PRESET_REF, ids, T, &V2);
    assert_memory_equal(ref_q, oracle, (size_t)(T * V) * sizeof(float));
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = FM_PRESET_INT4;
    fm_model *m = NULL;
    assert_int_equal(fm_model_load(DATA "/fp8-block", &opt, &m, &err), FM_ERR_UNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err.msg, "block-FP8 weights are read by --preset fp8, ref and ref32"));
    free(oracle), free(ref_q), free(ids);
}

/* ---- malformed checkpoints: variants of a fixture written to a temporary directory -------------------------- */

static char g_dir[96];

static int make_dir(void **s) {
    (void)s;
    snprintf(g_dir, sizeof g_dir, "/tmp/fm_quant_test_");
    const size_t n = strlen(g_dir);
    memset(g_dir + n, 'X', 6); /* mkdtemp's template suffix */
    g_dir[n + 6] = '\0';
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **s) {
    (void)s;
    char path[256];
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, files[i]);
        unlink(path);
    }
    return rmdir(g_dir);
}

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)*len + 1);
    assert_int_equal(fread(b, 1, (size_t)*len, f), (size_t)*len);
    b[*len] = '\0';
    fclose(f);
    return b;
}

static void spit(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(a, 1, na, f), na);
    if (nb) assert_int_equal(fwrite(b, 1, nb, f), nb);
    fclose(f);
}

/* One change to a tensor of the fixture's safetensors: a new shape (same bytes), a new name, or element `idx` (an
 * I32) set to value, or flipped between groups 0 and 1 when flip (and element idx2 too, when > 0). */
typedef struct edit {
    const char *tensor;
    const char *shape;  /* JSON array or NULL */
    const char *rename; /* or NULL */
    int64_t idx;        /* -1: no patch */
    int32_t value;
    bool flip;
    int64_t idx2;
} edit;

/* g_dir gets the fixture's config.json with `from` replaced by `to` (when given) and its model.safetensors edited. */
static void make_variant(const char *fixture, const char *from, const char *to, const edit *e) {
    char src[256], dst[256];
    long len = 0;
    snprintf(src, sizeof src, DATA "/%s/config.json", fixture);
    char *cfg = slurp(src, &len);
    snprintf(dst, sizeof dst, "%s/config.json", g_dir);
    if (from) {
        char *at = strstr(cfg, from);
        assert_non_null(at);
        spit(dst, cfg, (size_t)(at - cfg), NULL, 0);
        FILE *f = fopen(dst, "ab");
        fprintf(f, "%s%s", to, at + strlen(from));
        fclose(f);
    } else {
        spit(dst, cfg, (size_t)len, NULL, 0);
    }
    free(cfg);
    snprintf(src, sizeof src, DATA "/%s/model.safetensors", fixture);
    char *st = slurp(src, &len);
    uint64_t hn = 0;
    memcpy(&hn, st, 8);
    cJSON *hdr = cJSON_ParseWithLength(st + 8, (size_t)hn);
    assert_non_null(hdr);
    char *data = st + 8 + hn;
    if (e) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(hdr, e->tensor);
        assert_non_null(t);
        if (e->shape) cJSON_ReplaceItemInObjectCaseSensitive(t, "shape", cJSON_Parse(e->shape));
        if (e->idx >= 0) {
            const int64_t begin = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(t, "data_offsets"), 0)->valuedouble;
            int32_t v = e->value;
            if (e->flip) {
                memcpy(&v, data + begin + 4 * e->idx, 4);
                v = 1 - v;
            }
            memcpy(data + begin + 4 * e->idx, &v, 4);
            if (e->flip && e->idx2 > 0) {
                memcpy(&v, data + begin + 4 * e->idx2, 4);
                v = 1 - v;
                memcpy(data + begin + 4 * e->idx2, &v, 4);
            }
        }
        if (e->rename) {
            cJSON_AddItemToObject(hdr, e->rename, cJSON_Duplicate(t, 1));
            cJSON_DeleteItemFromObjectCaseSensitive(hdr, e->tensor);
        }
    }
    char *h = cJSON_PrintUnformatted(hdr);
    size_t hl = strlen(h), padded = (hl + 7) / 8 * 8;
    char *head = malloc(8 + padded);
    uint64_t pl = padded;
    memcpy(head, &pl, 8);
    memcpy(head + 8, h, hl);
    memset(head + 8 + hl, ' ', padded - hl);
    snprintf(dst, sizeof dst, "%s/model.safetensors", g_dir);
    spit(dst, head, 8 + padded, data, (size_t)(len - 8 - (long)hn));
    free(head), cJSON_free(h), cJSON_Delete(hdr), free(st);
}

static void expect_load_fail(fm_preset preset, fm_status want, const char *s1, const char *s2) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset;
    fm_model *m = NULL;
    fm_error err = {{0}};
    fm_status st = fm_model_load(g_dir, &opt, &m, &err);
    printf("  %-5s -> %s\n", fm_preset_name(preset), err.msg);
    assert_null(m);
    assert_int_equal(st, want);
    assert_non_null(strstr(err.msg, s1));
    if (s2) assert_non_null(strstr(err.msg, s2));
}

static void malformed_packed_shape(void **s) {
    (void)s;
    edit e = {"model.layers.0.self_attn.q_proj.qweight", "[8, 16]", NULL, -1, 0, false, 0};
    make_variant("gptq-v1-sym", NULL, NULL, &e);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_FORMAT, "q_proj.qweight", "expected shape [4, 32], found [8, 16]");
}

static void malformed_group_not_dividing(void **s) {
    (void)s;
    make_variant("gptq-v1-sym", "\"group_size\": 16", "\"group_size\": 12", NULL);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_FORMAT, "group_size 12 does not divide", "K = 32");
}

static void malformed_g_idx_range(void **s) {
    (void)s;
    edit e = {"model.layers.0.self_attn.k_proj.g_idx", NULL, NULL, 5, 99, false, 0};
    make_variant("gptq-v1-asym-actorder", NULL, NULL, &e);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_FORMAT, "k_proj.g_idx", "g_idx[5] = 99 is outside the 2 groups");
    expect_load_fail(FM_PRESET_REF, FM_ERR_FORMAT, "k_proj.g_idx", "g_idx[5] = 99");
}

static void malformed_g_idx_group_sizes(void **s) {
    (void)s;
    edit e = {"model.layers.0.mlp.experts.2.gate_proj.weight_g_idx", NULL, NULL, 3, 0, true, 0};
    make_variant("ct-asym-actorder-ignore", NULL, NULL, &e);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_FORMAT, "gate_proj.weight_g_idx", "input channels, expected group_size 16");
}

/* k_proj's act-order differs from q_proj's (two channels swap groups, so each group still holds 16): q|k|v share
 * one input, and the int4 bank one input order */
static void fused_parts_disagree(void **s) {
    (void)s;
    edit e = {"model.layers.0.self_attn.k_proj.g_idx", NULL, NULL, 0, 0, true, 2};
    make_variant("gptq-v1-asym-actorder", NULL, NULL, &e);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_UNSUPPORTED, "layer 0 qkv", "different act-order g_idx");
    fm_options opt;
    fm_options_init(&opt); /* the ref preset dequantizes each part on its own: it loads */
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load(g_dir, &opt, &m, &err), FM_OK);
    fm_model_free(m);
}

static void malformed_missing_zeros(void **s) {
    (void)s;
    edit e = {"model.layers.0.mlp.experts.1.up_proj.qzeros",
              NULL,
              "model.layers.0.mlp.experts.1.up_proj.zeros",
              -1,
              0,
              false,
              0};
    make_variant("awq-gemm", NULL, NULL, &e);
    expect_load_fail(FM_PRESET_INT4, FM_ERR_FORMAT, "up_proj.qzeros", "is missing");
}

static void malformed_ct_not_ignored(void **s) {
    (void)s;
    make_variant("ct-asym-actorder-ignore", "\"model.layers.0.self_attn.o_proj\"",
                 "\"model.layers.7.self_attn.o_proj\"", NULL);
    expect_load_fail(FM_PRESET_REF, FM_ERR_FORMAT, "o_proj.weight_packed", "not in quantization_config.ignore");
}

static void refused_fp8_preset(void **s) {
    (void)s;
    make_variant("gptq-v1-sym", NULL, NULL, NULL);
    /* groups of 16: an e4m3 1x128 activation group would span 8 weight groups (tests/test_fp8_prequant.c) */
    expect_load_fail(FM_PRESET_FP8, FM_ERR_UNSUPPORTED, "int4 group size 16 (gptq)", "--preset int4 handles it");
}

/* ---- quantization_config parsing ---------------------------------------------------------------------------- */

static fm_status parse_quant(const char *qc, fm_config *c, fm_error *err) {
    char json[4096];
    snprintf(json, sizeof json,
             "{\"model_type\":\"qwen3_moe\",\"vocab_size\":64,\"hidden_size\":32,\"num_hidden_layers\":1,"
             "\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,"
             "\"quantization_config\":%s}",
             qc);
    return fm_config_parse(json, strlen(json), "config.json", c, err);
}

static void expect_parse(const char *qc, fm_status want, const char *s1) {
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    fm_status st = parse_quant(qc, c, &err);
    if (st != want) fail_msg("%s: status %d, want %d (%s)", qc, st, want, err.msg);
    if (want != FM_OK) {
        printf("  %s\n", err.msg);
        assert_non_null(strstr(err.msg, "config.json"));
        assert_non_null(strstr(err.msg, s1));
    }
    free(c);
}

#define CT_GROUP(w)                                                                                                    \
    "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":"           \
    "{\"targets\":[\"Linear\"],\"weights\":" w "}}"
#define CT_W4 "{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":128}"

static void config_accepts(void **s) {
    (void)s;
    fm_config *c = malloc(sizeof *c);
    fm_error err = {{0}};
    char d[128];
    assert_int_equal(
        parse_quant("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":64,\"desc_act\":true,\"sym\":false,"
                    "\"checkpoint_format\":\"gptq_v2\"}",
                    c, &err),
        FM_OK);
    fm_quant_config_describe(&c->quant, d, sizeof d);
    assert_string_equal(d, "gptq v2, int4, group 64, asymmetric, act-order");
    assert_int_equal(parse_quant("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":-1}", c, &err), FM_OK);
    fm_quant_config_describe(&c->quant, d, sizeof d);
    assert_string_equal(d, "gptq v1, int4, per channel, symmetric");
    assert_int_equal(parse_quant("{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,\"zero_point\":true,"
                                 "\"version\":\"GEMM\"}",
                                 c, &err),
                     FM_OK);
    fm_quant_config_describe(&c->quant, d, sizeof d);
    assert_string_equal(d, "awq, int4, group 128, asymmetric");
    assert_int_equal(parse_quant(CT_GROUP(CT_W4) ",\"ignore\":[\"lm_head\",\"re:.*mlp\\\\.gate$\"]}", c, &err), FM_OK);
    assert_int_equal(c->quant.method, FM_QUANT_CT_PACKED);
    assert_true(c->quant.sym);
    assert_int_equal(c->quant.n_ignore, 2);
    assert_true(quant_ignores(&c->quant, "lm_head"));
    assert_true(quant_ignores(&c->quant, "model.layers.11.mlp.gate"));
    assert_false(quant_ignores(&c->quant, "model.layers.11.mlp.gate_proj"));
    assert_false(quant_ignores(&c->quant, "model.layers.11.mlp.experts.0.up_proj"));
    assert_int_equal(parse_quant("{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
                                 "\"weight_block_size\":[128,128]}",
                                 c, &err),
                     FM_OK);
    fm_quant_config_describe(&c->quant, d, sizeof d);
    assert_string_equal(d, "fp8 e4m3, blocks of 128 x 128, dynamic activations");
    assert_int_equal(parse_quant("null", c, &err), FM_OK);
    assert_int_equal(c->quant.method, FM_QUANT_NONE);
    free(c);
}

static void config_rejects(void **s) {
    (void)s;
    expect_parse("{\"quant_method\":\"bitsandbytes\"}", FM_ERR_UNSUPPORTED, "quant_method = \"bitsandbytes\"");
    expect_parse("{\"bits\":4}", FM_ERR_FORMAT, "quant_method is missing");
    expect_parse("[1]", FM_ERR_FORMAT, "must be an object");
    expect_parse("{\"quant_method\":\"gptq\",\"bits\":8}", FM_ERR_UNSUPPORTED, "bits = 8: only 4-bit");
    expect_parse("{\"quant_method\":\"gptq\",\"bits\":3}", FM_ERR_UNSUPPORTED, "bits = 3");
    expect_parse("{\"quant_method\":\"gptq\",\"group_size\":0}", FM_ERR_FORMAT, "group_size = 0");
    expect_parse("{\"quant_method\":\"gptq\",\"desc_act\":\"yes\"}", FM_ERR_FORMAT, "desc_act must be true or false");
    expect_parse("{\"quant_method\":\"gptq\",\"checkpoint_format\":\"marlin\"}", FM_ERR_UNSUPPORTED,
                 "checkpoint_format = \"marlin\"");
    expect_parse("{\"quant_method\":\"awq\",\"version\":\"gemv\"}", FM_ERR_UNSUPPORTED, "version = \"gemv\"");
    expect_parse("{\"quant_method\":\"awq\",\"zero_point\":false}", FM_ERR_UNSUPPORTED, "zero_point = false");
    expect_parse("{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\"}", FM_ERR_UNSUPPORTED,
                 "format = \"float-quantized\"");
    expect_parse(CT_GROUP("{\"num_bits\":8,\"type\":\"int\"}") "}", FM_ERR_UNSUPPORTED, "num_bits = 8");
    expect_parse("{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\"}", FM_ERR_UNSUPPORTED,
                 "weight_block_size is missing");
    expect_parse("{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}", FM_ERR_UNSUPPORTED,
                 "fmt = \"e5m2\"");
    expect_parse("{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\",\"weight_block_size\":[128,128]}",
                 FM_ERR_UNSUPPORTED, "activation_scheme = \"static\"");
    expect_parse("{\"quant_method\":\"fp8\",\"weight_block_size\":[128]}", FM_ERR_FORMAT, "two integers");
    expect_parse(CT_GROUP("{\"num_bits\":4,\"type\":\"float\"}") "}", FM_ERR_UNSUPPORTED, "type = \"float\"");
    expect_parse(CT_GROUP("{\"num_bits\":4,\"strategy\":\"tensor\"}") "}", FM_ERR_UNSUPPORTED, "strategy = \"tensor\"");
    expect_parse(CT_GROUP("{\"num_bits\":4,\"strategy\":\"group\"}") "}", FM_ERR_FORMAT, "group_size must be");
    expect_parse(CT_GROUP(CT_W4) ",\"ignore\":[\"re:([\"]}", FM_ERR_UNSUPPORTED, "not a valid regular expression");
    expect_parse(CT_GROUP(CT_W4) ",\"ignore\":[3]}", FM_ERR_FORMAT, "ignore entries must be strings");
    expect_parse("{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{"
                 "\"a\":{\"targets\":[\"Linear\"],\"weights\":" CT_W4
                 "},\"b\":{\"targets\":[\"Linear\"],\"weights\":" CT_W4 "}}}",
                 FM_ERR_UNSUPPORTED, "has 2 groups");
    expect_parse("{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"g\":{"
                 "\"targets\":[\"Linear\"],\"weights\":" CT_W4 ",\"input_activations\":{\"num_bits\":8}}}}",
                 FM_ERR_UNSUPPORTED, "quantizes activations");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_accepts),
        cmocka_unit_test(config_rejects),
        cmocka_unit_test(import_all),
        cmocka_unit_test(ops_all),
        cmocka_unit_test(model_all),
        cmocka_unit_test(fp8_block_model),
        cmocka_unit_test_setup_teardown(malformed_packed_shape, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(malformed_group_not_dividing, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(malformed_g_idx_range, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(malformed_g_idx_group_sizes, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(malformed_missing_zeros, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(fused_parts_disagree, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(malformed_ct_not_ignored, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(refused_fp8_preset, make_dir, remove_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
