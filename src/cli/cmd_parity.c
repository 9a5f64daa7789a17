/* fp8moe parity: the main job. Runs the fp32 oracle (ref preset on the CPU) and each requested preset over
 * the same tokens, and prints one row per preset: logits cosine vs the oracle, argmax agreement, max abs
 * error, mean KL, and load/forward time. Optionally writes the table as JSON. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "io/ids.h"
#include "util/metrics.h"

static const char *HELP =
    "usage: fp8moe parity --model DIR [--ids FILE] [--tokens N] [--presets LIST] [--json FILE] [options]\n"
    "\n"
    "Logits of each preset against the fp32 oracle (preset ref on the cpu backend) on the same tokens.\n"
    "\n"
    "  --ids FILE         token ids (default: DIR/eval_ids.i32, else DIR/golden_ids.i32)\n"
    "  --tokens N         use the first N ids (default 256)\n"
    "  --presets LIST     comma-separated presets to compare (default ref,int4,fp8,fp4)\n"
    "  --json FILE        also write the table as JSON\n" CLI_MODEL_HELP
    "  (--backend and --preset apply to the compared presets; the oracle always runs ref on the cpu)\n";

typedef struct parity_row {
    fm_preset  preset;
    fm_compare cmp;
    double     load_s, forward_s;
    uint64_t   hash;
} parity_row;

static fm_status run_preset(const cli_model_opts *mo, fm_preset p, const char *backend, const int32_t *ids, int64_t T,
                            float *logits, parity_row *row, fm_error *err) {
    fm_options opt = mo->opt;
    opt.preset  = p;
    opt.backend = backend;
    fm_model *m = NULL;
    double t0 = cli_now();
    fm_status st = fm_model_load(mo->model_dir, &opt, &m, err);
    row->load_s = cli_now() - t0;
    if (st) return st;
    t0 = cli_now();
    st = fm_model_logits(m, ids, T, logits, err);
    row->forward_s = cli_now() - t0;
    row->hash = st ? 0 : fm_hash_f32(logits, T * fm_model_vocab_size(m));
    fm_model_free(m);
    return st;
}

static bool parse_presets(const char *list, fm_preset *out, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == FM_PRESET_COUNT * 2 || !fm_preset_parse(tok, &out[*n])) return false;
        (*n)++;
    }
    return *n > 0;
}

static fm_status write_json(const char *path, const char *model, int64_t T, const parity_row *rows, int n,
                            const char *backend, fm_error *err) {
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "presets");
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddNumberToObject(root, "tokens", (double)T);
    cJSON_AddStringToObject(root, "oracle", "ref preset, cpu backend (fp32)");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        char hash[32];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)rows[i].hash);
        cJSON_AddStringToObject(o, "preset", fm_preset_name(rows[i].preset));
        cJSON_AddStringToObject(o, "backend", i == 0 ? "cpu" : backend);
        cJSON_AddNumberToObject(o, "cosine", rows[i].cmp.cosine);
        cJSON_AddNumberToObject(o, "argmax_agree", rows[i].cmp.argmax_agree);
        cJSON_AddNumberToObject(o, "max_abs_err", rows[i].cmp.max_abs_err);
        cJSON_AddNumberToObject(o, "max_abs_ref", rows[i].cmp.max_abs_ref);
        cJSON_AddNumberToObject(o, "mean_kl", rows[i].cmp.mean_kl);
        cJSON_AddNumberToObject(o, "load_s", rows[i].load_s);
        cJSON_AddNumberToObject(o, "forward_s", rows[i].forward_s);
        cJSON_AddStringToObject(o, "logits_hash", hash);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    fm_status st = text ? cli_write_file(path, text, strlen(text), err) : FM_ERR_NOMEM;
    free(text);
    return st;
}

enum { OPT_IDS = 2000, OPT_TOKENS, OPT_PRESETS, OPT_JSON };
static const struct option own_options[] = {{"ids", required_argument, 0, OPT_IDS},
                                            {"tokens", required_argument, 0, OPT_TOKENS},
                                            {"presets", required_argument, 0, OPT_PRESETS},
                                            {"json", required_argument, 0, OPT_JSON}, {0, 0, 0, 0}};

typedef struct parity_args {
    const char *ids_path, *json_path, *presets;
    long        tokens;
} parity_args;

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    parity_args *a = ctx;
    if (id == OPT_IDS) a->ids_path = arg;
    else if (id == OPT_TOKENS) return cli_parse_int(cmd, "--tokens", arg, 1, 1 << 24, &a->tokens);
    else if (id == OPT_PRESETS) a->presets = arg;
    else if (id == OPT_JSON) a->json_path = arg;
    return true;
}

int cmd_parity(int argc, char **argv) {
    const char *cmd = "parity";
    parity_args a = {NULL, NULL, "ref,int4,fp8,fp4", 256};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    const char *ids_path = a.ids_path, *json_path = a.json_path, *presets = a.presets;
    const long  tokens = a.tokens;
    if (!mo.model_dir) return cli_usage(cmd, "--model is required");
    fm_preset list[FM_PRESET_COUNT * 2];
    int n_list = 0;
    if (!parse_presets(presets, list, &n_list)) return cli_usage(cmd, "--presets must list ref, int4, fp8, fp4: '%s'", presets);

    char default_ids[4096];
    struct stat sb;
    if (!ids_path) {
        snprintf(default_ids, sizeof default_ids, "%s/eval_ids.i32", mo.model_dir);
        if (stat(default_ids, &sb) != 0) snprintf(default_ids, sizeof default_ids, "%s/golden_ids.i32", mo.model_dir);
        ids_path = default_ids;
    }
    fm_error  err = {{0}};
    int32_t  *ids = NULL;
    int64_t   T   = 0;
    fm_status st  = fm_ids_read(ids_path, &ids, &T, &err);
    if (st) return cli_fail(cmd, st, &err);
    if (T > tokens) T = tokens;
    mo.opt.max_tokens = T;

    parity_row rows[1 + FM_PRESET_COUNT * 2];
    memset(rows, 0, sizeof rows);
    float *oracle = NULL, *logits = NULL;
    rows[0].preset = FM_PRESET_REF;
    int32_t V = 0;
    {
        /* the oracle first: it sizes the logits buffers */
        fm_model *m = NULL;
        fm_options opt = mo.opt;
        opt.preset = FM_PRESET_REF, opt.backend = "cpu";
        double t0 = cli_now();
        st = fm_model_load(mo.model_dir, &opt, &m, &err);
        rows[0].load_s = cli_now() - t0;
        if (!st) {
            V = fm_model_vocab_size(m);
            oracle = malloc((size_t)T * (size_t)V * sizeof(float));
            logits = malloc((size_t)T * (size_t)V * sizeof(float));
            if (!oracle || !logits) st = FM_ERR_NOMEM, snprintf(err.msg, sizeof err.msg, "out of memory for logits");
        }
        if (!st) {
            t0 = cli_now();
            st = fm_model_logits(m, ids, T, oracle, &err);
            rows[0].forward_s = cli_now() - t0;
            rows[0].hash = fm_hash_f32(oracle, T * V);
            fm_logits_compare(oracle, oracle, T, V, &rows[0].cmp);
        }
        fm_model_free(m);
    }
    int n_rows = 1;
    for (int i = 0; !st && i < n_list; i++) {
        if (list[i] == FM_PRESET_REF && !strcmp(mo.opt.backend, "cpu")) continue; /* that is the oracle row */
        fprintf(stderr, "running preset %s on %s...\n", fm_preset_name(list[i]), mo.opt.backend);
        parity_row *row = &rows[n_rows++];
        row->preset = list[i];
        st = run_preset(&mo, list[i], mo.opt.backend, ids, T, logits, row, &err);
        if (!st) fm_logits_compare(oracle, logits, T, V, &row->cmp);
    }
    if (!st) {
        printf("model: %s   tokens: %lld   oracle: ref (fp32, cpu)   oracle logits hash: %016llx\n\n", mo.model_dir,
               (long long)T, (unsigned long long)rows[0].hash);
        printf("| preset | backend | cosine vs fp32 | argmax agree | max abs err | max abs logit | mean KL (nats) | load s | forward s |\n");
        printf("|--------|---------|----------------|--------------|-------------|---------------|----------------|--------|-----------|\n");
        for (int i = 0; i < n_rows; i++)
            printf("| %-6s | %-7s | %14.8f | %11.2f%% | %11.4g | %13.4g | %14.3e | %6.2f | %9.3f |\n",
                   fm_preset_name(rows[i].preset), i == 0 ? "cpu" : mo.opt.backend, rows[i].cmp.cosine,
                   100.0 * rows[i].cmp.argmax_agree, rows[i].cmp.max_abs_err, rows[i].cmp.max_abs_ref,
                   rows[i].cmp.mean_kl, rows[i].load_s, rows[i].forward_s);
        if (json_path) st = write_json(json_path, mo.model_dir, T, rows, n_rows, mo.opt.backend, &err);
    }
    free(oracle);
    free(logits);
    free(ids);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
