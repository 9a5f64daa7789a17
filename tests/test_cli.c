/* The command line is a contract: exit 0 on success, 2 on a usage error, 1 on bad input or data with one
 * line on stderr naming the file, field or tensor; never a crash and never a partial output file. These
 * tests run the fp8moe binary (FP8MOE_BIN, default build/fp8moe) on good and broken inputs. */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_runner.h"
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void expect_error(int code, int want, const char *needle) {
    if (code != want || !strstr(cli_err, needle))
        fail_msg("exit %d (want %d); stderr should name '%s': %s", code, want, needle, cli_err);
    /* one line */
    const char *nl = strchr(cli_err, '\n');
    assert_true(nl == NULL || nl[1] == 0);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* a copy of a golden model directory to break */
static void copy_model(const char *src, const char *name, char *dst, size_t n) {
    snprintf(dst, n, "%s/%s", cli_tmp, name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dst, src, dst);
    assert_int_equal(system(cmd), 0);
}

static void replace_in_file(const char *path, const char *from, const char *to) {
    static char buf[1 << 16], out[1 << 16];
    slurp(path, buf, sizeof buf);
    char *p = strstr(buf, from);
    assert_non_null(p);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(p - buf), buf, to, p + strlen(from));
    write_bytes(path, out, strlen(out));
}

/* Replaces `from` by `to` (same length) in the first 64 KiB of a binary file: edits a safetensors header in place. */
static void patch_header(const char *path, const char *from, const char *to) {
    assert_int_equal(strlen(from), strlen(to));
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    char *p = memmem(buf, n, from, strlen(from));
    assert_non_null(p);
    memcpy(p, to, strlen(to));
    fseek(f, 0, SEEK_SET);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

static void usage_errors(void **s) {
    (void)s;
    assert_int_equal(fp8moe("%s", ""), 2);
    assert_int_equal(fp8moe("--help"), 0);
    assert_non_null(strstr(cli_out, "usage: fp8moe"));
    expect_error(fp8moe("frobnicate"), 2, "frobnicate");
    const char *cmds[] = {"logits", "perplexity", "inspect", "parity", "generate"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(fp8moe("%s --help", cmds[i]), 0);
        assert_non_null(strstr(cli_out, "usage: fp8moe"));
        assert_int_equal(fp8moe("%s", cmds[i]), 2);
    }
    const char *m = "--model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32";
    expect_error(fp8moe("logits %s --out %s/x --preset fp16", m, cli_tmp), 2, "--preset");
    expect_error(fp8moe("logits %s --out %s/x --layers abc", m, cli_tmp), 2, "--layers");
    expect_error(fp8moe("logits %s --out %s/x --backend tpu", m, cli_tmp), 2, "--backend");
    expect_error(fp8moe("logits %s --out %s/x stray", m, cli_tmp), 2, "stray");
    expect_error(fp8moe("logits %s --out %s/x --layers 9", m, cli_tmp), 2, "--layers 9");
}

static void logits_writes_every_position(void **s) {
    (void)s;
    char out[512];
    snprintf(out, sizeof out, "%s/logits.f32", cli_tmp);
    assert_int_equal(fp8moe("logits --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                            "--out %s",
                            out),
                     0);
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(sb.st_size, 37 * 320 * 4);
    /* against transformers' logits: the golden tests check the bound; here the file is the contract */
    FILE *a = fopen(out, "rb"), *b = fopen("tests/models/qwen3-moe-f32/golden_logits.f32", "rb");
    float x, y, worst = 0;
    while (fread(&x, 4, 1, a) == 1 && fread(&y, 4, 1, b) == 1) worst = fabsf(x - y) > worst ? fabsf(x - y) : worst;
    fclose(a), fclose(b);
    assert_true(worst < 1e-4f);
    unlink(out);
}

static void bad_ids(void **s) {
    (void)s;
    char ids[512], out[512];
    snprintf(out, sizeof out, "%s/never.f32", cli_tmp);
    const char *m = "--model tests/models/qwen3-moe-f32";
    snprintf(ids, sizeof ids, "%s/empty.i32", cli_tmp);
    write_bytes(ids, "", 0);
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, out), 1, "empty");
    assert_non_null(strstr(cli_err, ids));
    snprintf(ids, sizeof ids, "%s/seven.i32", cli_tmp);
    write_bytes(ids, "1234567", 7);
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, out), 1, "multiple of 4");
    snprintf(ids, sizeof ids, "%s/big.i32", cli_tmp);
    int32_t v[3] = {1, 320, 2};
    write_bytes(ids, v, sizeof v);
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, out), 1, "outside the vocabulary");
    assert_non_null(strstr(cli_err, ids)); /* which file holds the bad id */
    int32_t neg[1] = {-5};
    write_bytes(ids, neg, sizeof neg);
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, out), 1, "-5");
    expect_error(fp8moe("logits %s --ids %s/absent.i32 --out %s", m, cli_tmp, out), 1, "absent.i32");
    assert_false(exists(out)); /* no partial output */
}

static void bad_models(void **s) {
    (void)s;
    char dir[512], path[600], out[512];
    const char *ids = "tests/models/qwen3-moe-f32/golden_ids.i32";
    snprintf(out, sizeof out, "%s/never.f32", cli_tmp);
    expect_error(fp8moe("logits --model %s/nowhere --ids %s --out %s", cli_tmp, ids, out), 1, "config.json");

    copy_model("tests/models/qwen3-moe-f32", "truncated", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(truncate(path, 100000), 0);
    expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1, "model.safetensors");

    copy_model("tests/models/qwen3-moe-f32", "topk", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
    expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1, "num_experts_per_tok");

    copy_model("tests/models/qwen3-moe-f32", "nonnumeric", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"hidden_size\": 96", "\"hidden_size\": \"ninety-six\"");
    expect_error(fp8moe("inspect --model %s", dir), 1, "hidden_size");

    copy_model("tests/models/qwen3-moe-f32", "malformed", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"hidden_size\": 96,", "\"hidden_size\": 96,,");
    expect_error(fp8moe("inspect --model %s", dir), 1, "not valid JSON");

    copy_model("tests/models/qwen3-moe-f32", "morelayers", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4");
    expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1, "model.layers.3.");
    assert_non_null(strstr(cli_err, "missing"));

    copy_model("tests/models/qwen3-moe-f32", "shape", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"head_dim\": 32", "\"head_dim\": 16");
    expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1,
                 "expected shape [64, 96], found [128, 96]");

    /* the same byte length, another dtype: a weight stored as I32 */
    copy_model("tests/models/qwen3-moe-f32", "dtype", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    patch_header(path, "\"model.embed_tokens.weight\":{\"dtype\":\"F32\"",
                 "\"model.embed_tokens.weight\":{\"dtype\":\"I32\"");
    expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1, "model.embed_tokens.weight");
    assert_non_null(strstr(cli_err, "I32"));

    copy_model("tests/models/qwen3-moe-f32", "llama", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"qwen3_moe\"", "\"llama\"");
    expect_error(fp8moe("inspect --model %s", dir), 1, "llama");

    copy_model("tests/models/mixtral-f32-sharded", "lostshard", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-00003-of-00005.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    expect_error(fp8moe("inspect --model %s", dir), 1, "model-00003-of-00005.safetensors");
    assert_false(exists(out));
}

/* Without a GPU (CI) the cuda backend says why and exits 1, leaving no output; with one it runs. */
static void cuda_backend_reports_cleanly(void **s) {
    (void)s;
    char out[512];
    snprintf(out, sizeof out, "%s/cuda.f32", cli_tmp);
    int code = fp8moe("logits --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                      "--out %s --backend cuda",
                      out);
    if (code == 0) {
        struct stat sb;
        assert_int_equal(stat(out, &sb), 0);
        assert_int_equal(sb.st_size, 37 * 320 * 4);
        unlink(out);
        /* fp4 (an MXFP4 dispatch buffer) and --dispatch nvfp4 run; a bf16 dispatch into the W4A8 experts (another
           GEMM) is refused by name */
        assert_int_equal(fp8moe("logits --model tests/models/qwen3-moe-f32 --ids "
                                "tests/models/qwen3-moe-f32/golden_ids.i32 --out %s --backend cuda --preset fp4",
                                out),
                         0);
        assert_int_equal(fp8moe("logits --model tests/models/qwen3-moe-f32 --ids "
                                "tests/models/qwen3-moe-f32/golden_ids.i32 --out %s --backend cuda --dispatch nvfp4 "
                                "--preset fp8",
                                out),
                         0);
        unlink(out);
        expect_error(fp8moe("logits --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                            "--out %s --backend cuda --preset fp8 --dispatch bf16",
                            out),
                     1, "--dispatch fp8, mxfp4 or nvfp4");
    } else {
        expect_error(code, 1, "cuda backend");
    }
    assert_false(exists(out));
}

static void inspect_reports(void **s) {
    (void)s;
    assert_int_equal(fp8moe("inspect --model tests/models/mixtral-f32-sharded --tensors"), 0);
    assert_non_null(strstr(cli_out, "architecture: mixtral"));
    assert_non_null(strstr(cli_out, "in 5 file(s)"));
    assert_non_null(strstr(cli_out, "model.layers.1.block_sparse_moe.experts.7.w2.weight"));
    assert_int_equal(fp8moe("inspect --model tests/models/qwen3-moe-fused-bf16"), 0);
    assert_non_null(strstr(cli_out, "fused gate_up_proj"));
    assert_int_equal(fp8moe("inspect --model tests/models/qwen3-moe-tied-f32"), 0);
    assert_non_null(strstr(cli_out, "3 MoE, 1 dense MLP"));
    assert_non_null(strstr(cli_out, "lm_head (tied)"));
}

static void perplexity_last_line(void **s) {
    (void)s;
    assert_int_equal(
        fp8moe("perplexity --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
               "--window 12 --windows 3 --preset fp8"),
        0);
    const char *last = strstr(cli_out, "perplexity = ");
    assert_non_null(last);
    double ppl = 0;
    assert_int_equal(sscanf(last, "perplexity = %lf", &ppl), 1);
    assert_true(ppl > 1.0);
    assert_string_equal(strchr(last, '\n'), "\n"); /* the last line of stdout */
    expect_error(fp8moe("perplexity --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                        "--window 12 --windows 4"),
                 1, "windows");
    /* --dispatch: an FP4 dispatch buffer changes the perplexity a little; a bad name and the oracle are refused */
    assert_int_equal(
        fp8moe("perplexity --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
               "--window 12 --windows 3 --preset fp8 --dispatch nvfp4"),
        0);
    double ppl4 = 0;
    assert_non_null(strstr(cli_out, "perplexity = "));
    assert_int_equal(sscanf(strstr(cli_out, "perplexity = "), "perplexity = %lf", &ppl4), 1);
    assert_true(ppl4 > 1.0 && ppl4 != ppl && fabs(ppl4 / ppl - 1.0) < 0.2);
    expect_error(fp8moe("perplexity --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                        "--dispatch fp16"),
                 2, "--dispatch must be one of bf16, fp8, mxfp4, nvfp4, preset");
    expect_error(fp8moe("perplexity --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 "
                        "--window 12 --windows 3 --dispatch nvfp4"),
                 2, "the ref preset is the oracle");
}

static void parity_table_and_json(void **s) {
    (void)s;
    char json[512];
    snprintf(json, sizeof json, "%s/parity.json", cli_tmp);
    assert_int_equal(fp8moe("parity --model tests/models/mixtral-f32-sharded --presets int4,fp4 --json %s", json), 0);
    assert_non_null(strstr(cli_out, "| preset | backend | cosine vs fp32"));
    assert_non_null(strstr(cli_out, "| fp4 "));
    slurp(json, cli_out, sizeof cli_out);
    cJSON *root = cJSON_Parse(cli_out);
    assert_non_null(root);
    const cJSON *rows = cJSON_GetObjectItem(root, "presets");
    assert_int_equal(cJSON_GetArraySize(rows), 3); /* oracle + 2 */
    const cJSON *fp4 = cJSON_GetArrayItem(rows, 2);
    assert_string_equal(cJSON_GetObjectItem(fp4, "preset")->valuestring, "fp4");
    const double cos = cJSON_GetObjectItem(fp4, "cosine")->valuedouble;
    assert_true(cos > 0.9 && cos < 1.0);
    /* the report's metrics are there too: the last position, top-5, and the int4 baseline */
    const double top5 = cJSON_GetObjectItem(fp4, "top5_overlap")->valuedouble;
    assert_true(top5 > 0.5 && top5 <= 1.0);
    assert_non_null(cJSON_GetObjectItem(fp4, "cosine_last"));
    const cJSON *vs_int4 = cJSON_GetObjectItem(cJSON_GetObjectItem(fp4, "vs_int4"), "mean");
    assert_true(cJSON_GetObjectItem(vs_int4, "cosine")->valuedouble > 0.9);
    cJSON_Delete(root);
}

/* the gnuplot the binary will use (FP8MOE_GNUPLOT=/nonexistent make test runs the branch without it) */
static bool have_gnuplot(void) {
    const char *gp = getenv("FP8MOE_GNUPLOT");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "command -v '%s' >/dev/null 2>&1", gp && *gp ? gp : "gnuplot");
    return system(cmd) == 0;
}

/* lines of stdout that are table rows for this depth and preset */
static int table_rows(const char *out, int layers, const char *preset) {
    char row[64];
    snprintf(row, sizeof row, "| %6d | %-6s | cpu ", layers, preset);
    int n = 0;
    for (const char *p = out; (p = strstr(p, row)) != NULL; p++) n++;
    return n;
}

static const cJSON *get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!v) fail_msg("JSON: no '%s'", key);
    return v;
}

static double num(const cJSON *o, const char *key) { return get(o, key)->valuedouble; }

/* The depth sweep of the parity report on the CPU: 2 depths x 2 presets x 2 prompts, in the table, the JSON, the
 * CSV and (when gnuplot is installed) the PNG; then the same outputs again from the JSON alone. */
static void parity_depth_sweep(void **s) {
    (void)s;
    char json[512], csv[512], png[512];
    snprintf(json, sizeof json, "%s/sweep.json", cli_tmp);
    snprintf(csv, sizeof csv, "%s/sweep.csv", cli_tmp);
    snprintf(png, sizeof png, "%s/sweep.png", cli_tmp);
    assert_int_equal(fp8moe("parity --synthetic toy-moe --backend cpu --presets int4,fp8 --layers 1,2 --tokens 16 "
                            "--prompts 2 --json %s --csv %s --plot %s",
                            json, csv, png),
                     0);
    assert_non_null(strstr(cli_out, "| layers | preset | backend | cos vs fp32 |"));
    for (int l = 1; l <= 2; l++) {
        assert_int_equal(table_rows(cli_out, l, "int4"), 1);
        assert_int_equal(table_rows(cli_out, l, "fp8"), 1);
        assert_int_equal(table_rows(cli_out, l, "ref"), 0); /* the oracle is not a row unless asked for */
    }

    static char text[1 << 17];
    slurp(json, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_string_equal(get(root, "model")->valuestring, "toy-moe");
    assert_int_equal((int)num(root, "tokens"), 16);
    assert_int_equal((int)num(root, "prompts"), 2);
    assert_true(fabs(num(root, "gate") - 0.997) < 1e-12);
    assert_null(cJSON_GetObjectItem(root, "presets")); /* the classic array belongs to one depth, one prompt */
    const cJSON *depths = get(root, "depths");
    assert_int_equal(cJSON_GetArraySize(depths), 2);
    const char *names[2] = {"int4", "fp8"};
    for (int d = 0; d < 2; d++) {
        const cJSON *depth = cJSON_GetArrayItem(depths, d);
        assert_int_equal((int)num(depth, "layers"), d + 1);
        assert_int_equal(cJSON_GetArraySize(get(get(depth, "oracle"), "logits_hash")), 2);
        const cJSON *rows = get(depth, "presets");
        assert_int_equal(cJSON_GetArraySize(rows), 2);
        for (int p = 0; p < 2; p++) {
            const cJSON *row = cJSON_GetArrayItem(rows, p);
            assert_string_equal(get(row, "preset")->valuestring, names[p]);
            const cJSON *mean = get(get(row, "vs_fp32"), "mean"), *worst = get(get(row, "vs_fp32"), "worst");
            assert_true(num(mean, "cosine") > 0.95 && num(mean, "cosine") < 1.0);
            assert_true(num(worst, "cosine") <= num(mean, "cosine"));
            assert_true(num(worst, "mean_kl") >= num(mean, "mean_kl") && num(mean, "mean_kl") > 0);
            assert_true(num(mean, "top5_overlap") > 0.5 && num(mean, "top5_overlap") <= 1.0);
            const double vs_int4 = num(get(get(row, "vs_int4"), "mean"), "cosine");
            if (p == 0) assert_true(fabs(vs_int4 - 1.0) < 1e-12); /* int4 is the baseline */
            else assert_true(vs_int4 > 0.99 && vs_int4 < 1.0);
            const cJSON *prompts = get(row, "prompts");
            assert_int_equal(cJSON_GetArraySize(prompts), 2);
            double sum = 0;
            for (int k = 0; k < 2; k++) {
                const cJSON *pr = cJSON_GetArrayItem(prompts, k);
                assert_int_equal((int)num(pr, "first_token"), 16 * k);
                const cJSON *c = get(pr, "vs_fp32");
                for (const char *const *key = (const char *const[]){"cosine", "cosine_last", "max_abs_err",
                                                                    "argmax_agree", "mean_kl", "top5_overlap", NULL};
                     *key; key++)
                    assert_true(isfinite(num(c, *key)));
                sum += num(c, "cosine");
            }
            assert_true(fabs(sum / 2 - num(mean, "cosine")) < 1e-12);
        }
    }
    cJSON_Delete(root);

    slurp(csv, text, sizeof text);
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 1 + 2 * 2 * 2);
    assert_non_null(strstr(text, "model,tokens,layers,preset,backend,prompt,cos_fp32,"));
    assert_non_null(strstr(text, "\"toy-moe\",16,2,fp8,cpu,1,"));

    if (have_gnuplot()) {
        slurp(png, text, sizeof text);
        assert_memory_equal(text, "\x89PNG", 4);
    } else {
        print_message("gnuplot is not installed: the PNG is not checked\n");
        assert_non_null(strstr(cli_err, "gnuplot not found"));
    }
    /* nothing left behind: no temporary files */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q '\\.tmp'", cli_tmp);
    assert_int_not_equal(system(cmd), 0);

    /* --from-json: the same table and CSV again from the JSON, running nothing (plots made off the GPU machine) */
    static char table[1 << 16], csv_text[1 << 16];
    snprintf(table, sizeof table, "%s", cli_out);
    slurp(csv, csv_text, sizeof csv_text);
    char csv2[512], png2[512];
    snprintf(csv2, sizeof csv2, "%s/again.csv", cli_tmp);
    snprintf(png2, sizeof png2, "%s/again.png", cli_tmp);
    assert_int_equal(fp8moe("parity --from-json %s --csv %s --plot %s", json, csv2, png2), 0);
    assert_string_equal(cli_out, table);
    assert_null(strstr(cli_err, "running")); /* nothing ran */
    slurp(csv2, text, sizeof text);
    assert_string_equal(text, csv_text);
    assert_true(exists(png2) == have_gnuplot());
    expect_error(fp8moe("parity --from-json %s", csv), 1, csv);
    expect_error(fp8moe("parity --from-json %s --layers 1", json), 2, "--from-json");
    unlink(json), unlink(csv), unlink(png), unlink(csv2), unlink(png2);
}

/* Without gnuplot the plot is skipped with one line and the other files are still written (exit 0). */
static void parity_without_gnuplot(void **s) {
    (void)s;
    char json[512], png[512];
    snprintf(json, sizeof json, "%s/nognuplot.json", cli_tmp);
    snprintf(png, sizeof png, "%s/nognuplot.png", cli_tmp);
    char saved[512] = "";
    if (getenv("FP8MOE_GNUPLOT")) snprintf(saved, sizeof saved, "%s", getenv("FP8MOE_GNUPLOT"));
    setenv("FP8MOE_GNUPLOT", "/nonexistent/gnuplot", 1);
    const int code =
        fp8moe("parity --synthetic toy-moe --presets fp8 --layers 1 --tokens 8 --json %s --plot %s", json, png);
    if (saved[0]) setenv("FP8MOE_GNUPLOT", saved, 1);
    else unsetenv("FP8MOE_GNUPLOT");
    assert_int_equal(code, 0);
    assert_non_null(strstr(cli_err, "gnuplot not found"));
    assert_true(exists(json));
    assert_false(exists(png));
    unlink(json);
}

/* --perplexity: each preset's perplexity at full depth beside the parity table, the same figure `fp8moe
   perplexity` gives for that preset, in the JSON, and again from --from-json */
static void parity_perplexity(void **s) {
    (void)s;
    char json[512], again[sizeof cli_out];
    snprintf(json, sizeof json, "%s/ppl.json", cli_tmp);
    assert_int_equal(
        fp8moe("perplexity --model models/tiny-code-moe --ids models/tiny-code-moe/eval_ids.i32 --windows 2 "
               "--preset int4"),
        0);
    double alone = 0;
    assert_int_equal(sscanf(strstr(cli_out, "perplexity = "), "perplexity = %lf", &alone), 1);
    assert_int_equal(
        fp8moe("parity --model models/tiny-code-moe --presets int4 --tokens 32 --perplexity 2 --json %s", json), 0);
    const char *table = strstr(cli_out, "| preset | backend | perplexity |");
    assert_non_null(table);
    char row[64];
    snprintf(row, sizeof row, "| int4   | cpu     | %10.4f |", alone);
    assert_non_null(strstr(table, row));
    assert_non_null(strstr(cli_out, "transformers fp32: 9.1431")); /* from the model's train_report.json */
    snprintf(again, sizeof again, "%s", cli_out);
    slurp(json, cli_out, sizeof cli_out);
    cJSON *root = cJSON_Parse(cli_out);
    const cJSON *ppl = get(root, "perplexity");
    assert_int_equal((int)num(ppl, "windows"), 2);
    const cJSON *rows = get(ppl, "presets");
    assert_int_equal(cJSON_GetArraySize(rows), 2); /* the oracle and int4 */
    assert_string_equal(get(cJSON_GetArrayItem(rows, 1), "preset")->valuestring, "int4");
    assert_true(fabs(num(cJSON_GetArrayItem(rows, 1), "perplexity") - alone) < 1e-4);
    assert_true(cJSON_IsNull(get(cJSON_GetArrayItem(rows, 1), "cpu_emulation"))); /* a cpu preset is its own */
    cJSON_Delete(root);
    assert_int_equal(fp8moe("parity --from-json %s", json), 0);
    assert_string_equal(cli_out, again);
    expect_error(fp8moe("parity --model models/tiny-code-moe --layers 2 --perplexity 2"), 2, "--layers must include 4");
    expect_error(fp8moe("parity --synthetic toy-moe --perplexity 2"), 2, "--perplexity");
    expect_error(fp8moe("parity --model models/tiny-code-moe --oracle tpu"), 2, "--oracle");
}

static void parity_usage_errors(void **s) {
    (void)s;
    char json[512];
    snprintf(json, sizeof json, "%s/never.json", cli_tmp);
    const char *bad[] = {"1,,2", "abc", "0", "2,", "1,-4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_error(fp8moe("parity --synthetic toy-moe --layers %s --json %s", bad[i], json), 2, "--layers");
    expect_error(fp8moe("parity --synthetic toy-moe --layers 1,3 --json %s", json), 2, "--layers 3");
    assert_non_null(strstr(cli_err, "2 layers"));
    expect_error(fp8moe("parity --model tests/models/qwen3-moe-f32 --layers 4 --json %s", json), 2, "--layers 4");
    expect_error(fp8moe("parity --synthetic toy-moe --prompts 0"), 2, "--prompts");
    expect_error(fp8moe("parity --synthetic toy-moe --model tests/models/qwen3-moe-f32"), 2, "--synthetic");
    expect_error(fp8moe("parity --synthetic toy-moe --preset fp8"), 2, "--presets");
    expect_error(fp8moe("parity --synthetic llama-70b"), 2, "llama-70b");
    assert_false(exists(json));
}

/* --route on every command that loads a model or benchmarks: a bad key or value is a usage error (exit 2) whose one
 * line names it and lists the valid keys or values; a good one runs (the cpu backend only checks it). */
static void route_option(void **s) {
    (void)s;
    const char *m = "--model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32";
    const char *keys =
        "keys: w4a8.kernel, attention.kernel, w4a8.tile, w4a8.fp4, w4a8.codes, dense.gemv, w8a8.gemv_max_m, "
        "moe.gemv, router.fused, router.cluster, moe.persistent, attn.persistent, moe.act_scale, pdl, decode.graphs, "
        "mixed.graphs, gdn.tc";
    expect_error(fp8moe("logits %s --out %s/x --route w4a8.kernels=mma", m, cli_tmp), 2,
                 "unknown route key 'w4a8.kernels'");
    assert_non_null(strstr(cli_err, keys));
    expect_error(fp8moe("logits %s --out %s/x --route pdl=off --route pdl=maybe", m, cli_tmp), 2,
                 "route pdl: 'maybe' is not a value (auto, on or off)");
    expect_error(fp8moe("perplexity %s --route w4a8.tile=48", m), 2, "'48' is not a value (auto, 16, 32 or 64)");
    expect_error(fp8moe("parity --model tests/models/qwen3-moe-f32 --route w8a8.gemv_max_m=17"), 2, "auto or 1..16");
    expect_error(fp8moe("bench prefill --synthetic toy-moe --route dense.gemv"), 2, "'dense.gemv' is not key=value");
    expect_error(fp8moe("bench gemm --shape toy --route w4a8.kernel=tensor"), 2, "auto, wgmma, mma or fold");
    expect_error(fp8moe("bench moe --shape toy --route gemv=off"), 2, "unknown route key 'gemv'");
    expect_error(fp8moe("inspect --routes --route pdl="), 2, "is not key=value");
    expect_error(fp8moe("inspect --model tests/models/qwen3-moe-f32 --route pdl=off"), 2, "--routes");
    for (int i = 0; i < 4; i++) {
        const char *cmds[] = {"logits", "perplexity", "parity", "bench gemm"};
        assert_int_equal(fp8moe("%s --help", cmds[i]), 0);
        assert_non_null(strstr(cli_out, "--route"));
    }
    char out[512];
    snprintf(out, sizeof out, "%s/routed.f32", cli_tmp);
    assert_int_equal(fp8moe("logits %s --out %s --route w4a8.kernel=mma,pdl=off --route w4a8.tile=16", m, out), 0);
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(sb.st_size, 37 * 320 * 4);
    unlink(out);
}

/* inspect --routes: the table (every key, value, default) and the kernels at representative shapes, with or without a
 * GPU (it says which), for a model's shapes or a Qwen3-30B-A3B-like default; the overrides show */
static void inspect_routes(void **s) {
    (void)s;
    assert_int_equal(fp8moe("inspect --routes"), 0);
    const char *want[] = {"kernel routes:",
                          "overrides (--route, fm_options.routes): none",
                          "w4a8.kernel",
                          "attention.kernel",
                          "w4a8.tile",
                          "dense.gemv",
                          "w8a8.gemv_max_m",
                          "pdl",
                          "auto|wgmma|mma",
                          "Qwen3-30B-A3B-like",
                          "M=1",
                          "M=2048",
                          "128 experts, top-8"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(cli_out, want[i])) fail_msg("inspect --routes: no '%s' in:\n%s", want[i], cli_out);
    /* W8A8 at the defaults: the GEMV up to 8 rows, cuBLASLt above (any GPU); Qwen3 T = 256 -> 16-row tiles, 512 -> 64
     */
    assert_non_null(
        strstr(cli_out, "w8a8-gemv        w8a8-gemv        cublaslt-fp8     cublaslt-fp8     cublaslt-fp8"));
    const char *t1 = strstr(cli_out, "\n  1          8            grouped W4A8 GEMVs");
    const char *t256 = strstr(cli_out, "\n  256        2048         grouped W4A8 GEMM");
    const char *t512 = strstr(cli_out, "\n  512        4096         grouped W4A8 GEMM");
    assert_true(t1 && t256 && t512);
    assert_true(strstr(t1, "fused GEMV + top-k") < strchr(t1 + 1, '\n')); /* the decode kernels at T = 1 */
    assert_true(strstr(t256, "16-row tiles") < strchr(t256 + 1, '\n'));
    assert_true(strstr(t512, "64-row tiles") < strchr(t512 + 1, '\n'));
    assert_true(strstr(cli_out, "on this GPU") || strstr(cli_out, "on an sm_90 GPU"));
    /* a model's shapes and overrides */
    assert_int_equal(fp8moe("inspect --model tests/models/qwen3-moe-f32 --routes --route dense.gemv=off "
                            "--route w4a8.tile=64,w4a8.kernel=mma"),
                     0);
    assert_non_null(strstr(cli_out, "architecture: qwen3_moe"));
    assert_non_null(
        strstr(cli_out, "overrides (--route, fm_options.routes): dense.gemv=off,w4a8.tile=64,w4a8.kernel=mma"));
    assert_non_null(
        strstr(cli_out, "cublaslt-fp8     cublaslt-fp8     cublaslt-fp8     cublaslt-fp8     cublaslt-fp8"));
    assert_non_null(strstr(cli_out, "w4a8-gemm-mma    w4a8-gemm-mma"));
    assert_null(strstr(cli_out, "w4a8-gemv"));
    assert_null(strstr(cli_out, " 16        \n")); /* every tile row 64 */
}

/* ---- hostile input ------------------------------------------------------------------------------------ */

/* Writes value over element `element` of tensor `name` in a safetensors file (located through the reader). */
static void poison_tensor(const char *path, const char *name, int64_t element, float value) {
    fm_st_file f;
    fm_error err = {{0}};
    assert_int_equal(fm_st_open_file(path, &f, &err), FM_OK);
    const fm_st_tensor *t = NULL;
    for (int64_t i = 0; i < f.n_tensors; i++)
        if (!strcmp(f.tensors[i].name, name)) t = &f.tensors[i];
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_F32);
    const long at = (long)(t->data - f.map) + 4 * element;
    fm_st_close_file(&f);
    FILE *o = fopen(path, "r+b");
    assert_non_null(o);
    assert_int_equal(fseek(o, at, SEEK_SET), 0);
    assert_int_equal(fwrite(&value, 4, 1, o), 1);
    fclose(o);
}

static bool is_fifo(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode);
}

/* FIFOs and directories where files are expected: refused by name, without blocking (before: open() waited forever
 * for a writer, and --out FIFO was replaced by a regular file through the rename). */
static void special_files_refused(void **s) {
    (void)s;
    cli_timeout_s = 600; /* a hang fails; a loaded CI machine is slow, not hung */
    const char *m = "--model tests/models/qwen3-moe-f32", *ids = "tests/models/qwen3-moe-f32/golden_ids.i32";
    char dir[512], path[600], fifo[512], out[512];
    snprintf(out, sizeof out, "%s/never.f32", cli_tmp);
    snprintf(fifo, sizeof fifo, "%s/out.fifo", cli_tmp);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, fifo), 1, "not a regular file (a FIFO)");
    assert_true(is_fifo(fifo)); /* not replaced */
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, cli_tmp), 1, "is a directory");
    expect_error(fp8moe("logits %s --ids %s --out %s", m, fifo, out), 1, "a FIFO");
    expect_error(fp8moe("logits %s --ids %s --out %s", m, cli_tmp, out), 1, "is a directory");
    expect_error(fp8moe("parity --synthetic toy-moe --presets int4 --layers 1 --tokens 4 --json %s", fifo), 1,
                 "a FIFO");
    assert_true(is_fifo(fifo));

    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        copy_model("tests/models/qwen3-moe-f32", "fifo", dir, sizeof dir);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkfifo(path, 0644), 0);
        expect_error(fp8moe("logits --model %s --ids %s --out %s", dir, ids, out), 1, "not a regular file (a FIFO)");
        assert_non_null(strstr(cli_err, files[i]));
    }
    copy_model("tests/models/mixtral-f32-sharded", "fifoshard", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-00002-of-00005.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    expect_error(fp8moe("inspect --model %s", dir), 1, "a FIFO");
    assert_non_null(strstr(cli_err, "model-00002-of-00005.safetensors"));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    expect_error(fp8moe("inspect --model %s", dir), 1, "a FIFO");
    /* requantize --force into a directory where a file it copies is a FIFO */
    snprintf(dir, sizeof dir, "%s/rq-fifo", cli_tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    assert_int_equal(mkfifo(path, 0644), 0);
    expect_error(fp8moe("requantize --model tests/models/qwen3-moe-f32 --out %s --force -q", dir), 1, "a FIFO");
    assert_true(is_fifo(path));
    assert_false(exists(out));
    cli_timeout_s = 0;
}

/* --model '' is a usage error; a path longer than the message buffer keeps the reason (the path loses its head). */
static void messages_stay_whole(void **s) {
    (void)s;
    expect_error(fp8moe("logits --model '' --ids x --out y"), 2, "--model");
    expect_error(fp8moe("inspect --model ''"), 2, "--model");
    char dir[1400], path[1500];
    size_t k = (size_t)snprintf(dir, sizeof dir, "%s", cli_tmp);
    for (int i = 0; i < 5; i++) {
        k += (size_t)snprintf(dir + k, sizeof dir - k, "/%0200d", i);
        assert_int_equal(mkdir(dir, 0755), 0);
    }
    char cmd[3200];
    snprintf(cmd, sizeof cmd, "cp -r tests/models/qwen3-moe-f32 %s/m", dir);
    assert_int_equal(system(cmd), 0);
    strcat(dir, "/m");
    snprintf(path, sizeof path, "%s/config.json", dir);
    replace_in_file(path, "\"hidden_size\": 96", "\"hidden_size\": \"ninety-six\"");
    expect_error(fp8moe("inspect --model %s", dir), 1, "field 'hidden_size' must be an integer, got a string");
    assert_non_null(strstr(cli_err, "/m/config.json"));
    replace_in_file(path, "\"hidden_size\": \"ninety-six\"", "\"hidden_size\": 96, \"hidden_size\": 64");
    expect_error(fp8moe("inspect --model %s", dir), 1, "key 'hidden_size' appears twice");
}

/* Progress lines go to a terminal only; on a terminal, an error replaces the progress line instead of being glued
 * to it. */
static void progress_on_terminal_only(void **s) {
    (void)s;
    assert_int_equal(
        fp8moe("perplexity --model models/tiny-code-moe --ids models/tiny-code-moe/eval_ids.i32 --window 8 "
               "--windows 2 -v"),
        0);
    assert_null(strchr(cli_err, '\r'));
    assert_null(strstr(cli_err, "window 1/2"));
    assert_null(strstr(cli_err, "loading layer"));

    char dir[512], path[600], out[512];
    copy_model("tests/models/qwen3-moe-f32", "nanlayer", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    poison_tensor(path, "model.layers.2.mlp.experts.5.up_proj.weight", 17, NAN);
    snprintf(out, sizeof out, "%s/never.f32", cli_tmp);
    if (system("command -v script >/dev/null 2>&1") != 0) {
        print_message("script(1) not found: the terminal half of this test is skipped\n");
        return;
    }
    const char *bin = getenv("FP8MOE_BIN") ? getenv("FP8MOE_BIN") : "build/fp8moe";
    char cmd[2048], tty[600];
    snprintf(tty, sizeof tty, "%s/tty.txt", cli_tmp);
    snprintf(cmd, sizeof cmd,
             "script -qec '%s logits --model %s --ids tests/models/qwen3-moe-f32/golden_ids.i32 --out %s "
             "-v' /dev/null > %s 2>&1",
             bin, dir, out, tty);
    assert_int_not_equal(system(cmd), -1);
    static char text[1 << 16];
    slurp(tty, text, sizeof text);
    const char *e = strstr(text, "fp8moe logits: error:");
    if (!e) fail_msg("no error on the terminal: %s", text);
    assert_non_null(strstr(text, "loading layer")); /* there was a progress line on the terminal */
    const bool clean = e == text || e[-1] == '\n' || (e - text >= 4 && !memcmp(e - 4, "\r\033[K", 4));
    if (!clean) fail_msg("the error is glued to a progress line: %s", text);
    assert_non_null(strstr(e, "model.layers.2.mlp.experts.5.up_proj.weight"));
    assert_false(exists(out));
}

/* NaN/Inf weights fail the run naming the tensor (before: ref wrote NaN logits, perplexity printed nan, int4/fp8 and
 * requantize turned NaN into code 0, all with exit 0). */
static void nonfinite_weights_fail(void **s) {
    (void)s;
    char dir[512], path[600], out[512];
    copy_model("tests/models/qwen3-moe-f32", "nan", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    poison_tensor(path, "model.layers.1.self_attn.o_proj.weight", 5, INFINITY);
    snprintf(out, sizeof out, "%s/never.f32", cli_tmp);
    const char *ids = "tests/models/qwen3-moe-f32/golden_ids.i32";
    const char *presets[] = {"ref", "int4", "fp8"};
    for (int p = 0; p < 3; p++) {
        expect_error(fp8moe("logits --model %s --ids %s --out %s --preset %s", dir, ids, out, presets[p]), 1,
                     "model.layers.1.self_attn.o_proj.weight");
        assert_non_null(strstr(cli_err, "element 5 is infinite"));
    }
    expect_error(fp8moe("perplexity --model %s --ids %s --window 8", dir, ids), 1, "model.layers.1.self_attn.o_proj");
    assert_null(strstr(cli_out, "perplexity ="));
    char rq[512];
    snprintf(rq, sizeof rq, "%s/nan-int4", cli_tmp);
    expect_error(fp8moe("requantize --model %s --out %s -q", dir, rq), 1, "model.layers.1.self_attn.o_proj.weight");
    assert_false(exists(out));
}

/* A prompt longer than max_position_embeddings (256 here) is refused with the limit unless --ctx allows it. */
static void context_limit_cli(void **s) {
    (void)s;
    char ids[512], out[512];
    snprintf(ids, sizeof ids, "%s/long.i32", cli_tmp);
    snprintf(out, sizeof out, "%s/long.f32", cli_tmp);
    int32_t v[300];
    for (int i = 0; i < 300; i++) v[i] = (i * 37) % 320;
    write_bytes(ids, v, sizeof v);
    const char *m = "--model tests/models/qwen3-moe-f32";
    expect_error(fp8moe("logits %s --ids %s --out %s", m, ids, out), 1, "context of 256 tokens");
    assert_non_null(strstr(cli_err, "--ctx"));
    assert_false(exists(out));
    expect_error(fp8moe("perplexity %s --ids %s --window 300", m, ids), 1, "--ctx");
    assert_int_equal(fp8moe("logits %s --ids %s --out %s --ctx 300", m, ids, out), 0);
    assert_true(exists(out));
    expect_error(fp8moe("logits %s --ids %s --out %s --ctx 0", m, ids, out), 2, "--ctx");
}

/* ---- generate ---- */

static const char *k_gen_model = "--model tests/models/qwen3-moe-f32";

/* tests/models/qwen3-moe-f32/golden_generate.json: the prompt and transformers' greedy new ids */
static int golden_generate(int32_t *prompt, int *n_prompt, int32_t *want, int cap) {
    static char text[1 << 16];
    slurp("tests/models/qwen3-moe-f32/golden_generate.json", text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *jp = cJSON_GetObjectItem(root, "prompt"), *jw = cJSON_GetObjectItem(root, "new_ids");
    *n_prompt = cJSON_GetArraySize(jp);
    const int nw = cJSON_GetArraySize(jw);
    assert_true(*n_prompt <= cap && nw <= cap);
    for (int i = 0; i < *n_prompt; i++) prompt[i] = cJSON_GetArrayItem(jp, i)->valueint;
    for (int i = 0; i < nw; i++) want[i] = cJSON_GetArrayItem(jw, i)->valueint;
    cJSON_Delete(root);
    return nw;
}

static cJSON *read_json(const char *path) {
    static char text[1 << 18];
    slurp(path, text, sizeof text);
    cJSON *root = cJSON_Parse(text);
    if (!root) fail_msg("%s: not JSON: %.200s", path, text);
    return root;
}

/* Greedy through the command equals transformers' generate(do_sample=False): --out holds exactly N ids, the first N
 * of the golden new ids; --json and --stream say the same; the summary has the speeds. */
static void generate_greedy_equals_transformers(void **s) {
    (void)s;
    int32_t prompt[64], want[64], got[64];
    int np = 0;
    const int nw = golden_generate(prompt, &np, want, 64);
    char ids[512], out[512], json[512];
    snprintf(ids, sizeof ids, "%s/golden_prompt.i32", cli_tmp);
    snprintf(out, sizeof out, "%s/gen.i32", cli_tmp);
    snprintf(json, sizeof json, "%s/gen.json", cli_tmp);
    write_bytes(ids, prompt, (size_t)np * sizeof *prompt);
    const int N[] = {1, 7, nw};
    for (int k = 0; k < 3; k++) {
        const int n = N[k];
        if (fp8moe("generate %s --ids %s --max-tokens %d --ignore-eos --out %s --json %s", k_gen_model, ids, n, out,
                   json))
            fail_msg("generate: %s", cli_err);
        assert_int_equal(cli_read_ids(out, got, 64), n);
        assert_memory_equal(got, want, (size_t)n * sizeof *got);
        assert_non_null(strstr(cli_err, "tokens/s"));
        assert_non_null(strstr(cli_err, "time to first token"));
        assert_non_null(strstr(cli_err, "finish: length 1, eos 0, stop 0"));
        cJSON *root = read_json(json);
        const cJSON *seq = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "sequences"), 0);
        assert_string_equal(cJSON_GetObjectItem(seq, "prompt_file")->valuestring, ids);
        assert_int_equal(cJSON_GetObjectItem(seq, "n_prompt")->valueint, np);
        assert_string_equal(cJSON_GetObjectItem(seq, "finish")->valuestring, "length");
        const cJSON *jids = cJSON_GetObjectItem(seq, "ids"), *lps = cJSON_GetObjectItem(seq, "logprobs");
        assert_int_equal(cJSON_GetArraySize(jids), n);
        assert_int_equal(cJSON_GetArraySize(lps), n);
        for (int t = 0; t < n; t++) {
            assert_int_equal(cJSON_GetArrayItem(jids, t)->valueint, want[t]);
            const double lp = cJSON_GetArrayItem(lps, t)->valuedouble;
            assert_true(cJSON_IsNumber(cJSON_GetArrayItem(lps, t)) && lp <= 0 && lp > -20);
        }
        const cJSON *st = cJSON_GetObjectItem(root, "stats");
        assert_int_equal(cJSON_GetObjectItem(st, "new_tokens")->valueint, n);
        assert_int_equal(cJSON_GetObjectItem(st, "prefill_tokens")->valueint, np);
        assert_int_equal(cJSON_GetObjectItem(st, "decode_tokens")->valueint, n - 1);
        assert_int_equal(cJSON_GetObjectItem(root, "ctx")->valueint, np + n); /* planned: prompt + --max-tokens */
        cJSON_Delete(root);
    }
    /* --stream: the same ids on stdout as they are sampled; a prefill in chunks of 5 changes nothing */
    assert_int_equal(fp8moe("generate %s --ids %s --max-tokens 8 --ignore-eos --out %s --stream --prefill-chunk 5",
                            k_gen_model, ids, out),
                     0);
    char line[256] = "";
    for (int t = 0, k = 0; t < 8; t++) k += snprintf(line + k, sizeof line - (size_t)k, "%s%d", t ? " " : "", want[t]);
    strcat(line, "\n");
    assert_string_equal(cli_out, line);
    /* a stop id ends the sequence at its first occurrence (not written); a stop sequence too */
    int first = 0;
    while (want[first] != want[4]) first++;
    assert_int_equal(fp8moe("generate %s --ids %s --max-tokens 16 --out %s --json %s --stop-id %d", k_gen_model, ids,
                            out, json, want[4]),
                     0);
    assert_int_equal(cli_read_ids(out, got, 64), first);
    assert_memory_equal(got, want, (size_t)first * sizeof *got);
    cJSON *root = read_json(json);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "sequences"), 0), "finish")->valuestring,
        "eos");
    cJSON_Delete(root);
    assert_int_equal(fp8moe("generate %s --ids %s --max-tokens 16 --out %s --json %s --stop-seq %d,%d", k_gen_model,
                            ids, out, json, want[7], want[8]),
                     0);
    int at = 0; /* where the pair first occurs: the output ends before it */
    while (!(want[at] == want[7] && want[at + 1] == want[8])) at++;
    assert_int_equal(cli_read_ids(out, got, 64), at);
    assert_memory_equal(got, want, (size_t)at * sizeof *got);
    assert_non_null(strstr(cli_err, "stop 1"));
}

/* Three prompts of different lengths in a batch file (relative paths from the file's directory): each sequence equals
 * its prompt generated alone with seed + i, with 3 slots or 2; a seed reproduces its tokens at temperature 1. */
static void generate_batch_equals_alone(void **s) {
    (void)s;
    int32_t prompt[64], want[64];
    int np = 0;
    golden_generate(prompt, &np, want, 64);
    char dir[512], path[600], batch[600], out[600], json[600], alone[600];
    snprintf(dir, sizeof dir, "%s/prompts", cli_tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/sub", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    const char *names[3] = {"golden.i32", "sub/short.i32", "long.i32"};
    int32_t longp[30], shortp[3] = {5, 6, 7};
    for (int i = 0; i < 30; i++) longp[i] = (i * 41 + 3) % 320;
    const int32_t *data[3] = {prompt, shortp, longp};
    const int lens[3] = {np, 3, 30};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_bytes(path, data[i], (size_t)lens[i] * sizeof(int32_t));
    }
    snprintf(batch, sizeof batch, "%s/batch.txt", dir);
    const char *list = "golden.i32\nsub/short.i32\n\nlong.i32\n";
    write_bytes(batch, list, strlen(list));
    snprintf(out, sizeof out, "%s/batch.i32", cli_tmp);
    snprintf(json, sizeof json, "%s/batch.json", cli_tmp);
    snprintf(alone, sizeof alone, "%s/alone.i32", cli_tmp);
    enum { NEW = 8 };
    const char *samp = "--max-tokens 8 --ignore-eos --temperature 1 --top-k 50 --seed 11";
    if (fp8moe("generate %s --batch-file %s %s --out %s --json %s", k_gen_model, batch, samp, out, json))
        fail_msg("generate: %s", cli_err);
    int32_t together[3 * NEW], got[3 * NEW];
    assert_int_equal(cli_read_ids(out, together, 3 * NEW), 3 * NEW);
    assert_non_null(strstr(cli_err, "prompts: 3"));
    cJSON *root = read_json(json);
    const cJSON *seqs = cJSON_GetObjectItem(root, "sequences");
    assert_int_equal(cJSON_GetArraySize(seqs), 3);
    assert_int_equal(cJSON_GetObjectItem(root, "max_seqs")->valueint, 3);
    for (int i = 0; i < 3; i++) {
        const cJSON *q = cJSON_GetArrayItem(seqs, i);
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        assert_string_equal(cJSON_GetObjectItem(q, "prompt_file")->valuestring, path);
        assert_int_equal(cJSON_GetObjectItem(q, "n_prompt")->valueint, lens[i]);
        assert_int_equal(cJSON_GetObjectItem(q, "offset")->valueint, i * NEW);
        assert_int_equal(cJSON_GetObjectItem(q, "seed")->valueint, 11 + i);
        /* alone, with the seed the batch gave it */
        if (fp8moe("generate %s --ids %s --max-tokens 8 --ignore-eos --temperature 1 --top-k 50 --seed %d --out %s",
                   k_gen_model, path, 11 + i, alone))
            fail_msg("generate alone: %s", cli_err);
        assert_int_equal(cli_read_ids(alone, got, NEW), NEW);
        if (memcmp(got, together + i * NEW, sizeof got[0] * NEW)) fail_msg("prompt %d: batched differs from alone", i);
    }
    cJSON_Delete(root);
    /* two slots for three prompts, prefill in chunks of 4; then the same run again: the same ids */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(fp8moe("generate %s --batch-file %s %s --out %s --max-seqs 2 --prefill-chunk 4", k_gen_model,
                                batch, samp, out),
                         0);
        assert_int_equal(cli_read_ids(out, got, 3 * NEW), 3 * NEW);
        assert_memory_equal(got, together, sizeof together);
    }
    /* another seed, other tokens */
    assert_int_equal(
        fp8moe("generate %s --batch-file %s --max-tokens 8 --ignore-eos --temperature 1 --top-k 50 --seed 12 "
               "--out %s",
               k_gen_model, batch, out),
        0);
    assert_int_equal(cli_read_ids(out, got, 3 * NEW), 3 * NEW);
    assert_memory_not_equal(got, together, sizeof together);
}

/* Bad options exit 2 with one line, bad files exit 1 naming the file, and nothing is written. */
static void generate_errors(void **s) {
    (void)s;
    cli_timeout_s = 600; /* a hang fails; a loaded CI machine is slow, not hung */
    const char *ids = "tests/models/qwen3-moe-f32/golden_ids.i32"; /* 37 tokens */
    char out[512], fifo[512], batch[512], g[1024];
    snprintf(out, sizeof out, "%s/never.i32", cli_tmp);
    snprintf(g, sizeof g, "generate %s --ids %s --out %s", k_gen_model, ids, out);
    expect_error(fp8moe("%s", g), 2, "--max-tokens");
    expect_error(fp8moe("%s --max-tokens 0", g), 2, "--max-tokens");
    expect_error(fp8moe("%s --max-tokens 4 --top-p 0", g), 2, "--top-p");
    expect_error(fp8moe("%s --max-tokens 4 --temperature -1", g), 2, "--temperature");
    expect_error(fp8moe("%s --max-tokens 4 --temperature nan", g), 2, "--temperature");
    expect_error(fp8moe("%s --max-tokens 4 --min-p 1", g), 2, "--min-p");
    expect_error(fp8moe("%s --max-tokens 4 --presence-penalty 3", g), 2, "--presence-penalty");
    expect_error(fp8moe("%s --max-tokens 4 --repetition-penalty 0", g), 2, "--repetition-penalty");
    expect_error(fp8moe("%s --max-tokens 4 --seed -1", g), 2, "--seed");
    expect_error(fp8moe("%s --max-tokens 4 --stop-id 320", g), 2, "--stop-id 320");
    expect_error(fp8moe("%s --max-tokens 4 --stop-seq 1,x", g), 2, "--stop-seq");
    expect_error(fp8moe("%s --max-tokens 4 --no-such-option", g), 2, "--no-such-option");
    expect_error(fp8moe("%s --max-tokens 4 --json %s", g, out), 2, "same file");
    expect_error(fp8moe("generate %s --max-tokens 4 --out %s", k_gen_model, out), 2, "--ids");
    expect_error(fp8moe("generate %s --ids %s/absent.i32 --max-tokens 4 --out %s", k_gen_model, cli_tmp, out), 1,
                 "absent.i32");
    /* a batch file naming a missing prompt, or none; --stream with several prompts */
    snprintf(batch, sizeof batch, "%s/gen-batch.txt", cli_tmp);
    write_bytes(batch, "gone.i32\n", 9); /* relative to the batch file's directory: cli_tmp/gone.i32 */
    expect_error(fp8moe("generate %s --batch-file %s --max-tokens 4 --out %s", k_gen_model, batch, out), 1, "gone.i32");
    assert_non_null(strstr(cli_err, "line 1"));
    write_bytes(batch, "\n\n", 2);
    expect_error(fp8moe("generate %s --batch-file %s --max-tokens 4 --out %s", k_gen_model, batch, out), 1,
                 "no prompts");
    char cwd[512], lines[1200]; /* absolute paths: the batch file is elsewhere */
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(lines, sizeof lines, "%s/%s\n%s/%s\n", cwd, ids, cwd, ids);
    write_bytes(batch, lines, strlen(lines));
    expect_error(fp8moe("generate %s --batch-file %s --max-tokens 4 --out %s --stream", k_gen_model, batch, out), 2,
                 "--stream");
    expect_error(fp8moe("generate %s --batch-file %s --ids %s --max-tokens 4 --out %s", k_gen_model, batch, ids, out),
                 2, "--batch-file");
    /* the context: 37 + 220 tokens are more than max_position_embeddings (256) unless --ctx allows them */
    snprintf(g, sizeof g, "generate %s --ids %s --out %s", k_gen_model, ids, out);
    expect_error(fp8moe("%s --max-tokens 220", g), 2, "max_position_embeddings");
    assert_non_null(strstr(cli_err, "--ctx 257"));
    expect_error(fp8moe("%s --max-tokens 20 --ctx 50", g), 2, "--ctx 50");
    expect_error(fp8moe("%s --max-tokens 20 --ctx 37", g), 1, "golden_ids.i32");
    assert_false(exists(out));
    assert_int_equal(fp8moe("%s --max-tokens 220 --ctx 257 --ignore-eos", g), 0);
    int32_t got[256];
    assert_int_equal(cli_read_ids(out, got, 256), 220);
    unlink(out);
    /* an output that is a FIFO is refused, not replaced, before the model loads */
    snprintf(fifo, sizeof fifo, "%s/gen.fifo", cli_tmp);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    expect_error(fp8moe("generate %s --ids %s --max-tokens 4 --out %s", k_gen_model, ids, fifo), 1, "a FIFO");
    expect_error(fp8moe("%s --max-tokens 4 --json %s", g, fifo), 1, "a FIFO");
    assert_true(is_fifo(fifo));
    expect_error(fp8moe("generate %s --ids %s --max-tokens 4 --out %s", k_gen_model, fifo, out), 1, "a FIFO");
    assert_false(exists(out));
    cli_timeout_s = 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(usage_errors),
        cmocka_unit_test(logits_writes_every_position),
        cmocka_unit_test(bad_ids),
        cmocka_unit_test(bad_models),
        cmocka_unit_test(cuda_backend_reports_cleanly),
        cmocka_unit_test(inspect_reports),
        cmocka_unit_test(perplexity_last_line),
        cmocka_unit_test(parity_table_and_json),
        cmocka_unit_test(parity_depth_sweep),
        cmocka_unit_test(parity_without_gnuplot),
        cmocka_unit_test(parity_usage_errors),
        cmocka_unit_test(parity_perplexity),
        cmocka_unit_test(route_option),
        cmocka_unit_test(inspect_routes),
        cmocka_unit_test(special_files_refused),
        cmocka_unit_test(messages_stay_whole),
        cmocka_unit_test(progress_on_terminal_only),
        cmocka_unit_test(nonfinite_weights_fail),
        cmocka_unit_test(context_limit_cli),
        cmocka_unit_test(generate_greedy_equals_transformers),
        cmocka_unit_test(generate_batch_equals_alone),
        cmocka_unit_test(generate_errors),
    };
    return cmocka_run_group_tests(tests, cli_runner_setup, cli_runner_teardown);
}
