/* The benchmark's own machinery, checked where CI runs (no GPU): synthetic models are deterministic functions
 * of their seeds, the cost model's floors match a hand count, and `fp8moe bench prefill` produces its table and
 * JSON. (Timing is not asserted: only that the numbers exist and add up.) */
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
#include <sys/wait.h>

#include "backend/dispatch_row.h"
#include "cli_runner.h"
#include "engine/cost.h"
#include "util/metrics.h"

static float *logits_of(const char *name, fm_preset p, int64_t T) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = p;
    fm_model *m = NULL;
    fm_error err;
    fm_status st = fm_model_load_synthetic(name, 0, &opt, &m, &err);
    if (st) fail_msg("%s", err.msg);
    int32_t ids[64];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 37 + 11) % fm_model_vocab_size(m));
    float *x = malloc((size_t)(T * fm_model_vocab_size(m)) * sizeof(float));
    assert_int_equal(fm_context_logits(m->context, ids, T, x, &err), FM_OK);
    fm_model_free(m);
    return x;
}

/* the same seeds give the same model: identical logits twice; finite; and the presets differ from ref */
static void synthetic_is_deterministic(void **s) {
    (void)s;
    const int64_t T = 17, V = 256;
    float *a = logits_of("toy-moe", FM_PRESET_REF, T), *b = logits_of("toy-moe", FM_PRESET_REF, T);
    assert_memory_equal(a, b, (size_t)(T * V) * sizeof(float));
    float *q = logits_of("toy-moe", FM_PRESET_INT4, T);
    fm_compare c;
    fm_logits_compare(a, q, T, (int32_t)V, &c);
    assert_int_equal(c.n_nonfinite, 0);
    assert_true(c.cosine > 0.9 && c.cosine < 1.0);
    free(a), free(b), free(q);
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    fm_error err;
    assert_int_equal(fm_model_load_synthetic("llama-70b", 0, &opt, &m, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "toy-moe"));
    assert_int_equal(fm_model_load_synthetic("toy-moe", 3, &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
}

/* Qwen3-Next's synthetic shapes come from config.json text (the 80B's layer kinds and widths); toy-next runs on the
 * CPU, deterministically, and a prefill benchmark of it runs end to end */
static void synthetic_qwen3_next(void **s) {
    (void)s;
    fm_config c;
    fm_error err;
    assert_int_equal(fm_synthetic_config("qwen3-next-80b-a3b", &c, &err), FM_OK);
    assert_int_equal(c.arch, FM_ARCH_QWEN3_NEXT);
    assert_int_equal(c.n_layers, 48);
    assert_true(c.layer_is_gdn[0] && !c.layer_is_gdn[3]);
    assert_int_equal(c.rotary_dim, 64);
    const int64_t T = 21, V = 256;
    float *a = logits_of("toy-next", FM_PRESET_REF, T), *b = logits_of("toy-next", FM_PRESET_REF, T);
    assert_memory_equal(a, b, (size_t)(T * V) * sizeof(float));
    float *q = logits_of("toy-next", FM_PRESET_FP8, T);
    fm_compare cmp;
    fm_logits_compare(a, q, T, (int32_t)V, &cmp);
    assert_int_equal(cmp.n_nonfinite, 0);
    /* 0.83 (`fp8moe parity --synthetic toy-next`): random q and k make the rule's first outputs q.k-scaled copies
       of v whose sign the gated norm keeps, so a small q.k flips with quantization; the last position is at 0.99 */
    assert_true(cmp.cosine > 0.7 && cmp.cosine < 1.0);
    free(a), free(b), free(q);
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    assert_int_equal(fm_model_load_synthetic("toy-next", 5, &opt, &m, &err), FM_ERR_USAGE);
    assert_null(m);
    assert_int_equal(fp8moe("bench prefill --synthetic toy-next --backend cpu --tokens 33 --repeat 2 --warmup 1"), 0);
}

/* a hand count of one MoE layer of toy-moe at T = 10 (ref on the CPU: fp32 weights and activations) */
static void cost_matches_hand_count(void **s) {
    (void)s;
    fm_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 256, c.hidden_size = 64, c.n_layers = 1, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    c.n_experts = 8, c.n_experts_per_tok = 2, c.moe_intermediate = 32, c.dense_intermediate = 32;
    c.layer_is_moe[0] = true;
    fm_plan p;
    fm_plan_from_preset(FM_PRESET_REF, &p);
    fm_cost k;
    fm_prefill_cost(&c, &p, 1, 10, true, &k);
    const double T = 10, H = 64, nqkv = (4 + 4) * 16, nq = 64;
    /* projections: 2 T H (nqkv) + 2 T nq H FLOPs; weights 4 bytes each, activations in and out */
    assert_true(fabs(k.flops[FM_STAGE_ATTN_PROJ] - (2 * T * H * nqkv + 2 * T * nq * H)) < 1e-6);
    assert_true(fabs(k.bytes[FM_STAGE_ATTN_PROJ] - (4 * (nqkv * H + H * nq) + 4 * T * (H + nqkv + nq + H))) < 1e-6);
    /* causal attention: 2 nh hd T (T + 1) */
    assert_true(fabs(k.flops[FM_STAGE_ATTENTION] - 2.0 * 4 * 16 * T * (T + 1)) < 1e-6);
    /* experts: 2 T k (3 I H) FLOPs; touched experts E (1 - (1 - 1/E)^(T k)) */
    assert_true(fabs(k.flops[FM_STAGE_EXPERTS] - 2 * T * 2 * 3 * 32 * H) < 1e-6);
    const double touched = 8 * (1 - pow(1 - 1.0 / 8, T * 2));
    const double expert_w = 4 * (2 * 32 * H + H * 32);
    assert_true(fabs(k.bytes[FM_STAGE_EXPERTS] - (touched * expert_w + 4 * T * 2 * H + 4 * T * 2 * 96)) < 1e-3);
    /* the per-token design reads an expert for every routed pair */
    assert_true(fabs(k.expert_weight_reads_per_token_design - T * 2 * expert_w) < 1e-6);
    double sum = 0;
    for (int i = 0; i < FM_STAGE_COUNT; i++) sum += k.bytes[i];
    assert_true(fabs(sum - k.total_bytes) < 1e-6);
    /* int4 weights: half a byte each plus a bf16 scale per 128 */
    fm_plan_from_preset(FM_PRESET_INT4, &p);
    fm_cost q;
    fm_prefill_cost(&c, &p, 1, 10, true, &q);
    const double w4 = (nqkv * H / 2 + nqkv * 1 * 2) + (H * nq / 2 + H * 1 * 2);
    assert_true(fabs(q.bytes[FM_STAGE_ATTN_PROJ] - (w4 + 2 * T * (H + nqkv + nq + H))) < 1e-6);
}

static void bench_command_prints_and_writes_json(void **s) {
    (void)s;
    char json[512];
    snprintf(json, sizeof json, "%s/bench.json", cli_tmp);
    assert_int_equal(
        fp8moe("bench prefill --synthetic toy-moe --backend cpu --tokens 33 --repeat 3 --warmup 1 --json %s", json), 0);
    assert_non_null(strstr(cli_out, "| stage | median ms"));
    assert_non_null(strstr(cli_out, "| experts |"));
    char text[1 << 14];
    slurp(json, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const double med = cJSON_GetObjectItem(root, "median_ms")->valuedouble;
    assert_true(med > 0);
    assert_true(cJSON_GetObjectItem(root, "min_ms")->valuedouble <= med);
    assert_true(cJSON_GetObjectItem(root, "max_ms")->valuedouble >= med);
    const cJSON *stages = cJSON_GetObjectItem(root, "stages");
    assert_int_equal(cJSON_GetArraySize(stages), FM_STAGE_COUNT);
    double sum = 0;
    for (int i = 0; i < FM_STAGE_COUNT; i++) {
        const double t = cJSON_GetObjectItem(cJSON_GetArrayItem(stages, i), "median_ms")->valuedouble;
        assert_true(t >= 0);
        sum += t;
    }
    /* the stages partition the run: their medians add up to about the median total (not exactly: medians) */
    assert_true(sum > 0.5 * med && sum < 2.0 * med);
    cJSON_Delete(root);
    assert_int_equal(fp8moe("bench prefill --synthetic nope --backend cpu"), 2);
    assert_non_null(strstr(cli_err, "toy-moe"));
    assert_int_equal(fp8moe("bench decode"), 2);
    assert_int_equal(fp8moe("bench prefill --synthetic toy-moe --backend cpu --tokens 0"), 2);
}

/* The JSON a group-of-ranks bench wrote (the caller deletes it), checked for its rank count. */
static cJSON *group_json(const char *path, int ranks) {
    static char text[1 << 13];
    slurp(path, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_int_equal(cJSON_GetObjectItem(root, "ranks")->valueint, ranks);
    return root;
}

/* o's `key`, after its time and its `other` bytes are checked to be plausible */
static double group_value(const cJSON *o, const char *other, const char *key) {
    assert_true(cJSON_GetObjectItem(o, "median_ms")->valuedouble > 0);
    assert_true(cJSON_GetObjectItem(o, other)->valuedouble >= 0);
    return cJSON_GetObjectItem(o, key)->valuedouble;
}

/* bench prefill --ep N: the group's time and the bytes its ranks send per layer, in each dispatch format. The
   dispatch all-to-all sends fixed-size blocks (dist/ep_moe.h: 16 bytes of header, then an expert id and a row per
   routed copy of the most tokens a rank holds), so its bytes follow from the format's row; MXFP4's rows are half
   e4m3's plus their scales; the combine comes back in the activation format whatever the dispatch. */
static double ranks_json(const char *dispatch, int ranks, const char *key) {
    char json[512];
    snprintf(json, sizeof json, "%s/ranks_%s_%d.json", cli_tmp, dispatch, ranks);
    assert_int_equal(fp8moe("bench prefill --synthetic toy-moe --backend cpu --preset fp8 --dispatch %s --ep %d "
                            "--tokens 64 --repeat 2 --warmup 1 --json %s",
                            dispatch, ranks, json),
                     0);
    assert_non_null(strstr(cli_out, "| MoE dispatch all-to-all"));
    cJSON *root = group_json(json, ranks);
    const double v = group_value(root, "other_bytes_per_layer", key);
    cJSON_Delete(root);
    return v;
}

static void bench_prefill_over_ranks(void **s) {
    (void)s;
    /* toy-moe: H 64, top-2; 64 tokens over N ranks: 64 / N each, blocks of 2 x 64 / N routed copies */
    for (int N = 2; N <= 4; N *= 2) {
        const size_t cap = 2 * 64 / (size_t)N, row = fm_dispatch_row_bytes(FM_A_E4M3_G128, true, 64);
        const size_t block = (16 + cap * 4 + cap * row + 15) / 16 * 16;
        assert_true(fabs(ranks_json("fp8", N, "dispatch_bytes_per_layer") - (double)(N * (N - 1) * block)) < 0.5);
    }
    const double e4m3 = ranks_json("fp8", 2, "dispatch_bytes_per_layer"),
                 mx = ranks_json("mxfp4", 2, "dispatch_bytes_per_layer"),
                 nv = ranks_json("nvfp4", 2, "dispatch_bytes_per_layer");
    assert_true(mx < 0.6 * e4m3 && nv < 0.6 * e4m3 && mx <= nv);
    assert_true(ranks_json("fp8", 2, "combine_bytes_per_layer") == ranks_json("mxfp4", 2, "combine_bytes_per_layer"));
    /* what the group cannot be: ranks that do not split the experts, and --ep on the cuda backend */
    assert_int_equal(fp8moe("bench prefill --synthetic toy-moe --backend cpu --ep 3 --tokens 8"), 2);
    assert_non_null(strstr(cli_err, "do not split evenly"));
}

/* bench decode --ep N, batch B on toy-moe: row r of the JSON's key */
static double decode_ranks_json(const char *dispatch, int ranks, const char *batches, int row, const char *key) {
    char json[512];
    snprintf(json, sizeof json, "%s/decode_ranks_%s_%d.json", cli_tmp, dispatch, ranks);
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --dispatch %s --ep %d --batch %s "
                            "--context 24 --steps 3 --warmup 1 --json %s",
                            dispatch, ranks, batches, json),
                     0);
    assert_non_null(strstr(cli_out, "| MoE dispatch"));
    cJSON *root = group_json(json, ranks);
    const cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "rows"), row);
    assert_non_null(r);
    const double v = group_value(r, "other_bytes_per_step_layer", key);
    cJSON_Delete(root);
    return v;
}

/* A decode step of B sequences over N ranks sends, per layer, N (N - 1) blocks of ceil(B / N) x top-k routed rows
 * (rounded up to 8) in the dispatch format (the prefill's layout at T = B); the decode steps alone are counted (not the
 * prefill). */
static void bench_decode_over_ranks(void **s) {
    (void)s;
    const size_t row = fm_dispatch_row_bytes(FM_A_E4M3_G128, true, 64);
    const int batch[2] = {4, 7};
    for (int N = 2; N <= 4; N *= 2)
        for (int i = 0; i < 2; i++) {
            /* backend/ep_blocks.h: a 16-byte header, the ids padded to 16 bytes, the rows; cap rounded up to 8 */
            const size_t cap = (2 * (size_t)((batch[i] + N - 1) / N) + 7) / 8 * 8;
            const size_t block = (16 + (cap * 4 + 15) / 16 * 16 + cap * row + 15) / 16 * 16;
            assert_true(fabs(decode_ranks_json("fp8", N, "4,7", i, "dispatch_bytes_per_step_layer") -
                             (double)((size_t)N * (size_t)(N - 1) * block)) < 0.5);
        }
    const double e4m3 = decode_ranks_json("fp8", 2, "8", 0, "dispatch_bytes_per_step_layer"),
                 mx = decode_ranks_json("mxfp4", 2, "8", 0, "dispatch_bytes_per_step_layer");
    assert_true(mx < 0.6 * e4m3);
    /* --ep decodes on the cpu backend only; --dispatch belongs to --ep */
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --ep 2"), 2);
    assert_non_null(strstr(cli_err, "--backend cpu"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --dispatch mxfp4"), 2);
    assert_non_null(strstr(cli_err, "--ep"));
}

/* the options every side-by-side benchmark shares (bench_common.c), refused with exit code 2 */
static void common_usage_errors(const char *bench) {
    assert_int_equal(fp8moe("bench %s --repeat 5000", bench), 2);
    assert_int_equal(fp8moe("bench %s --repeat 0", bench), 2);
    assert_int_equal(fp8moe("bench %s --warmup -1", bench), 2);
    assert_int_equal(fp8moe("bench %s --threads 0", bench), 2);
    assert_int_equal(fp8moe("bench %s --backend tpu", bench), 2);
    assert_non_null(strstr(cli_err, "tpu"));
    assert_int_equal(fp8moe("bench %s extra", bench), 2);
}

/* bench moe: help, usage errors, and the whole command on the CPU backend (the routes' formats emulated, toy shape):
 * the table, the JSON rows, the comparison against the bf16 route. The GPU run is checked by hand (bench/NOTES.md). */
static void bench_moe_command(void **s) {
    (void)s;
    assert_int_equal(fp8moe("bench moe --help"), 0);
    assert_non_null(strstr(cli_out, "fp8-cublaslt-loop"));
    assert_non_null(strstr(cli_out, "--shape"));
    assert_int_equal(fp8moe("bench --help"), 0);
    assert_non_null(strstr(cli_out, "bench moe"));
    assert_int_equal(fp8moe("bench moe --shape llama"), 2);
    assert_non_null(strstr(cli_err, "qwen3"));
    assert_int_equal(fp8moe("bench moe --routes bf16-cublas,nope"), 2);
    assert_non_null(strstr(cli_err, "nope"));
    assert_int_equal(fp8moe("bench moe --routes bf16-cublas,bf16-cublas"), 2);
    assert_int_equal(fp8moe("bench moe --tokens 16,0"), 2);
    common_usage_errors("moe");
    assert_int_equal(fp8moe("bench moe --model x"), 2);

    char json[512];
    snprintf(json, sizeof json, "%s/moe.json", cli_tmp);
    assert_int_equal(fp8moe("bench moe --shape toy --backend cpu --tokens 7,20 --repeat 3 --warmup 1 --json %s", json),
                     0);
    assert_non_null(strstr(cli_out, "| route | T | median ms"));
    assert_non_null(strstr(cli_out, "| fp8-cublaslt-loop | 7 | unavailable: "));
    char text[1 << 15];
    slurp(json, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "shape")->valuestring, "toy");
    assert_int_equal(cJSON_GetObjectItem(root, "experts")->valueint, 8);
    const cJSON *rows = cJSON_GetObjectItem(root, "results");
    assert_int_equal(cJSON_GetArraySize(rows), 2 * 11); /* every T x every route */
    double dispatch_mb[2][3] = {{0}};                   /* per T: fp8-grouped, fp4-grouped-mx, fp4-grouped-nv */
    for (int i = 0; i < 22; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const char *route = cJSON_GetObjectItem(r, "route")->valuestring;
        const char *st = cJSON_GetObjectItem(r, "status")->valuestring;
        if (!strcmp(route, "fp8-cublaslt-loop")) {
            assert_string_equal(st, "unavailable");
            continue;
        }
        assert_string_equal(st, "ok");
        const double med = cJSON_GetObjectItem(r, "median_ms")->valuedouble;
        assert_true(med > 0 && cJSON_GetObjectItem(r, "min_ms")->valuedouble <= med);
        assert_true(cJSON_GetObjectItem(r, "max_ms")->valuedouble >= med);
        const double T = cJSON_GetObjectItem(r, "tokens")->valuedouble;
        assert_true(fabs(cJSON_GetObjectItem(r, "flops")->valuedouble - 2 * T * 2 * 3 * 128 * 256) < 1);
        const int touched = cJSON_GetObjectItem(r, "touched_experts")->valueint;
        assert_true(touched >= 2 && touched <= 8);
        assert_true(cJSON_GetObjectItem(r, "floor_ms")->valuedouble > 0);
        /* the same inputs and weights on every route: the quantized routes stay near bf16, which is exactly itself */
        const double e = cJSON_GetObjectItem(r, "err_vs_bf16")->valuedouble;
        /* E2M1 (one mantissa bit) next to the outlier channels (x8) that set a block's scale: up to ~0.3 on this toy */
        const bool fp4 = !strncmp(route, "fp4-", 4);
        if (!strcmp(route, "bf16-cublas")) assert_true(e == 0);
        else assert_true(e > 1e-3 && e < (fp4 ? 0.5 : 0.3));
        const cJSON *db = cJSON_GetObjectItem(r, "dispatch_bytes");
        const int which = !strcmp(route, "fp8-grouped") ? 0 : !strcmp(route, "fp4-grouped-mx") ? 1 : 2;
        if (which < 2 || fp4) dispatch_mb[T > 10][which] = db ? db->valuedouble : -1;
    }
    /* the dispatch buffer in each format (w4a8_workspace.h, 256-byte aligned parts): T = 20, k = 2, H = 256:
       e4m3 40 x 256 + 2 x 40 x 4 -> 10240 + 512; MXFP4 5120 + 512; NVFP4 5120 + 768 */
    assert_true(dispatch_mb[1][0] == 10240 + 512 && dispatch_mb[1][1] == 5120 + 512 && dispatch_mb[1][2] == 5120 + 768);
    cJSON_Delete(root);
    /* the GPU path without a GPU is one line and exit 1; with a GPU, it runs */
    const int rc = fp8moe("bench moe --shape toy --routes bf16-cublas --tokens 7 --repeat 2 --warmup 0");
    assert_true(rc == 0 || rc == 1);
    if (rc == 1) {
        assert_non_null(strstr(cli_err, "cuda"));
        int lines = 0;
        for (const char *c = cli_err; *c; c++) lines += *c == '\n';
        assert_int_equal(lines, 1);
    }
}

/* bench gemm: help, usage errors, and the command on the CPU backend (toy shape: the op routes' formats emulated,
 * the GEMM-only routes unavailable): both tables, the JSON rows and the figures they must satisfy. */
static void bench_gemm_command(void **s) {
    (void)s;
    assert_int_equal(fp8moe("bench gemm --help"), 0);
    assert_non_null(strstr(cli_out, "fp8-cublaslt-row"));
    assert_non_null(strstr(cli_out, "--rows"));
    assert_int_equal(fp8moe("bench --help"), 0);
    assert_non_null(strstr(cli_out, "bench gemm"));
    assert_int_equal(fp8moe("bench gemm --shape llama"), 2);
    assert_non_null(strstr(cli_err, "toy"));
    assert_int_equal(fp8moe("bench gemm --routes w8a8,w9a9"), 2);
    assert_non_null(strstr(cli_err, "w9a9"));
    assert_int_equal(fp8moe("bench gemm --routes w8a8,w8a8"), 2);
    assert_int_equal(fp8moe("bench gemm --rows 16,0"), 2);
    assert_int_equal(fp8moe("bench gemm --shape toy --layers 4"), 2);
    common_usage_errors("gemm");

    char json[512];
    snprintf(json, sizeof json, "%s/gemm.json", cli_tmp);
    assert_int_equal(
        fp8moe("bench gemm --shape toy --backend cpu --rows 1,9 --layers 2 --repeat 3 --warmup 1 --json %s", json), 0);
    assert_non_null(strstr(cli_out, "| route | M=1 | M=9 |"));
    assert_non_null(strstr(cli_out, "| floor, int4 weights |"));
    assert_non_null(strstr(cli_out, "| w8a8-gemm | 1 | unavailable: "));
    char text[1 << 15];
    slurp(json, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "shape")->valuestring, "toy");
    assert_int_equal(cJSON_GetObjectItem(root, "layers")->valueint, 2);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(root, "graph_replay")));
    const cJSON *rows = cJSON_GetObjectItem(root, "results");
    assert_int_equal(cJSON_GetArraySize(rows), 2 * 9); /* every M x every route */
    int ok = 0;
    for (int i = 0; i < 18; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const char *route = cJSON_GetObjectItem(r, "route")->valuestring;
        const char *st = cJSON_GetObjectItem(r, "status")->valuestring;
        if (strstr(route, "gemm") || strstr(route, "cublaslt")) {
            assert_string_equal(st, "unavailable"); /* GEMM-only routes: cuda only */
            continue;
        }
        assert_string_equal(st, "ok");
        ok++;
        const double med = cJSON_GetObjectItem(r, "median_ms")->valuedouble;
        assert_true(med > 0 && cJSON_GetObjectItem(r, "min_ms")->valuedouble <= med);
        assert_true(cJSON_GetObjectItem(r, "max_ms")->valuedouble >= med);
        const double M = cJSON_GetObjectItem(r, "rows")->valuedouble;
        assert_true(fabs(cJSON_GetObjectItem(r, "flops")->valuedouble - 2 * M * (160 * 96 + 96 * 128) * 2) < 1);
        assert_true(cJSON_GetObjectItem(r, "floor_ms")->valuedouble > 0);
        assert_true(cJSON_GetObjectItem(r, "weight_bytes")->valuedouble > 0); /* the CPU's own bank bytes */
        /* the same inputs and weights on every route: the quantized routes stay near bf16, which is exactly itself */
        const double e = cJSON_GetObjectItem(r, "err_vs_bf16")->valuedouble;
        if (!strcmp(route, "bf16-cublas")) assert_true(e == 0);
        else assert_true(e > 1e-3 && e < 0.2);
    }
    assert_int_equal(ok, 2 * 5); /* bf16, w8a8, w4a8 and the two pre-quantized w4a8 */
    cJSON_Delete(root);
    /* the GPU path without a GPU is one line and exit 1; with a GPU, it runs */
    const int rc = fp8moe("bench gemm --shape toy --routes bf16-cublas --rows 3 --repeat 2 --warmup 0");
    assert_true(rc == 0 || rc == 1);
    if (rc == 1) {
        assert_non_null(strstr(cli_err, "cuda"));
        int lines = 0;
        for (const char *c = cli_err; *c; c++) lines += *c == '\n';
        assert_int_equal(lines, 1);
    }
}

/* bench decode --json-object: the masks filled during the pass (default) or before the step, shared or not; the
 * host's fill time per step in the table and in each row of the JSON; the mask options refused without it. */
static void bench_decode_json_object(void **s) {
    (void)s;
    const char *orders[] = {"overlap", "before"};
    for (int i = 0; i < 2; i++) {
        char json[512];
        snprintf(json, sizeof json, "%s/decode_json_object_%s.json", cli_tmp, orders[i]);
        assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --presets fp8 --batch 1,3 --context 8 "
                                "--steps 6 --warmup 2 --json-object --mask-order %s --mask-cache %d --json %s",
                                orders[i], i ? 0 : 4, json),
                         0);
        assert_non_null(strstr(cli_out, "the host's mask fill per step"));
        assert_non_null(strstr(cli_out, i ? "before each step" : "during the pass"));
        assert_null(strstr(cli_out, "launches per decode step")); /* the cpu backend has no graphs to count */
        char text[1 << 14];
        slurp(json, text, sizeof text);
        cJSON *root = cJSON_Parse(text);
        assert_non_null(root);
        assert_string_equal(cJSON_GetObjectItem(root, "mask_order")->valuestring, orders[i]);
        assert_int_equal(cJSON_GetObjectItem(root, "mask_cache")->valueint, i ? 0 : 4);
        const cJSON *rows = cJSON_GetObjectItem(root, "rows");
        assert_int_equal(cJSON_GetArraySize(rows), 2);
        for (int r = 0; r < 2; r++) {
            const cJSON *row = cJSON_GetArrayItem(rows, r);
            assert_string_equal(cJSON_GetObjectItem(row, "status")->valuestring, "ok");
            const double fill = cJSON_GetObjectItem(row, "mask_fill_ms")->valuedouble;
            assert_true(fill > 0 && fill < cJSON_GetObjectItem(row, "max_ms")->valuedouble);
            assert_true(cJSON_GetObjectItem(row, "mask_fill_cpu_ms")->valuedouble > 0);
            assert_null(cJSON_GetObjectItem(row, "graph_kernels"));
        }
        cJSON_Delete(root);
    }
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --mask-order before"), 2);
    assert_non_null(strstr(cli_err, "--mask-order needs --json-object"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --json-object --mask-order late"), 2);
    assert_non_null(strstr(cli_err, "overlap or before"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --mask-cache 8"), 2);
    assert_non_null(strstr(cli_err, "--mask-cache needs --json-object"));
}

/* bench decode --int4-scales p2: the weights quantized at load with int4-p2 scales, on which route w4a8.kernel=fold
 * runs (the cpu backend emulates it; its refusal of other scales: test_w4a8_fold.c), said in the header and the JSON */
static void bench_decode_int4_p2(void **s) {
    (void)s;
    char json[512];
    snprintf(json, sizeof json, "%s/decode_p2.json", cli_tmp);
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --presets fp8 --batch 1 --context 8 "
                            "--steps 2 --warmup 1 --int4-scales p2 --route w4a8.kernel=fold --json %s",
                            json),
                     0);
    assert_non_null(strstr(cli_out, "int4 scales p2"));
    char text[1 << 14];
    slurp(json, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "int4_scales")->valuestring, "p2");
    const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "rows"), 0);
    assert_string_equal(cJSON_GetObjectItem(row, "status")->valuestring, "ok");
    assert_true(cJSON_GetObjectItem(row, "median_ms")->valuedouble > 0);
    cJSON_Delete(root);
    /* presets without int4 weights refuse it (their row fails); a bad name is a usage error */
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --presets ref --batch 1 --context 8 "
                            "--steps 1 --warmup 0 --int4-scales p2"),
                     1);
    assert_non_null(strstr(cli_out, "quantizes no weights to int4"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --int4-scales p3"), 2);
    assert_non_null(strstr(cli_err, "g128 or p2"));
}

/* bench decode --prompt-rows N: mixed steps (B decode rows and a prompt chunk of N rows in one pass, as the
 * scheduler runs them), said in the table's header and in the JSON; a step reads more expert bytes than the decode
 * step of the same batch; refused with --json-object and --ep */
static void bench_decode_prompt_rows(void **s) {
    (void)s;
    char json[2][512];
    double bytes[2];
    for (int i = 0; i < 2; i++) {
        snprintf(json[i], sizeof json[i], "%s/decode_prompt_rows_%d.json", cli_tmp, i);
        assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --presets fp8 --batch 2 --context 8 "
                                "--steps 3 --warmup 1 --per-op %s --json %s",
                                i ? "--prompt-rows 12" : "", json[i]),
                         0);
        assert_true(!strstr(cli_out, "mixed steps: every step also runs a prompt chunk of 12 rows") == !i);
        char text[1 << 15];
        slurp(json[i], text, sizeof text);
        cJSON *root = cJSON_Parse(text);
        assert_non_null(root);
        assert_int_equal(cJSON_GetObjectItem(root, "prompt_rows")->valueint, i ? 12 : 0);
        const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "rows"), 0);
        assert_string_equal(cJSON_GetObjectItem(row, "status")->valuestring, "ok");
        assert_true(cJSON_GetObjectItem(row, "median_ms")->valuedouble > 0);
        const cJSON *b = cJSON_GetObjectItem(row, "bytes_per_step");
        assert_non_null(b);
        bytes[i] = b->valuedouble;
        cJSON_Delete(root);
    }
    assert_true(bytes[1] > bytes[0]); /* 14 rows select more experts than 2 */
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --prompt-rows 4 --json-object"), 2);
    assert_non_null(strstr(cli_err, "--prompt-rows"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --prompt-rows 4 --ep 2"), 2);
    assert_non_null(strstr(cli_err, "--prompt-rows is not supported with --ep"));
    assert_int_equal(fp8moe("bench decode --synthetic toy-moe --backend cpu --prompt-rows 0"), 2);
}

/* The bench commands are the program fp8moe-bench beside fp8moe: `fp8moe bench --help` lists every one of them, and
 * a copy of fp8moe without the program beside it refuses with an error that names the path it looked for. */
static void bench_program_beside_the_binary(void **s) {
    (void)s;
    assert_int_equal(fp8moe("bench --help"), 0);
    const char *names[] = {"bench prefill", "bench decode", "bench moe", "bench gemm", "bench tokenize", "bench mask"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) assert_non_null(strstr(cli_out, names[i]));
    assert_int_equal(fp8moe("bench nope"), 2);
    assert_non_null(strstr(cli_err, "prefill, decode, moe, gemm, tokenize, mask"));

    const char *bin = getenv("FP8MOE_BIN") ? getenv("FP8MOE_BIN") : "build/fp8moe";
    char cmd[1024], out[4096] = {0};
    snprintf(cmd, sizeof cmd, "mkdir -p %s/alone && cp %s %s/alone/fp8moe && %s/alone/fp8moe bench moe --help 2>&1",
             cli_tmp, bin, cli_tmp, cli_tmp);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    const size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    const int status = pclose(p);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    char expect[512];
    snprintf(expect, sizeof expect, "%s/alone/fp8moe-bench, which is missing", cli_tmp);
    assert_non_null(strstr(out, expect));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synthetic_is_deterministic), cmocka_unit_test(synthetic_qwen3_next),
        cmocka_unit_test(cost_matches_hand_count),    cmocka_unit_test(bench_command_prints_and_writes_json),
        cmocka_unit_test(bench_moe_command),          cmocka_unit_test(bench_gemm_command),
        cmocka_unit_test(bench_prefill_over_ranks),   cmocka_unit_test(bench_decode_over_ranks),
        cmocka_unit_test(bench_decode_json_object),   cmocka_unit_test(bench_decode_int4_p2),
        cmocka_unit_test(bench_decode_prompt_rows),   cmocka_unit_test(bench_program_beside_the_binary),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
