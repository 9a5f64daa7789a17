/* fp8moe parity: the terminal table, the JSON and the CSV of a run. The rows shown are the presets asked for
 * (the int4 baseline runs in any case; it is shown only when asked for), plus the oracle's row in the classic
 * one-depth, one-prompt table, whose layout and JSON "presets" array stay as they were before the sweep. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/parity.h"
#include "util/status.h"

static bool shown(const parity_report *r, const parity_cell *c) {
    return c->listed || (c->is_oracle && !parity_is_sweep(r));
}

static void print_classic(const parity_report *r) {
    const parity_cell *o = parity_at(r, 0, 0);
    printf("model: %s%s   tokens: %lld   oracle: %s (fp32, %s)   oracle logits hash: %016llx", r->model,
           r->synthetic ? " (synthetic)" : "", (long long)r->tokens, fm_preset_name(o->preset), o->backend,
           (unsigned long long)o->hash[0]);
    if (r->depths[0] != r->full_depth) printf("   layers: %d of %d", r->depths[0], r->full_depth);
    if (r->dense != FM_DENSE_PRESET) printf("   dense: %s", fm_dense_name(r->dense));
    if (r->dispatch != FM_DISPATCH_PRESET) printf("   dispatch (fp8, fp4): %s", fm_dispatch_name(r->dispatch));
    if (r->int4_scales != FM_INT4_SCALES_G128) printf("   int4 scales: %s", fm_int4_scales_name(r->int4_scales));
    if (r->lm_head != FM_LM_HEAD_FLOAT) printf("   lm_head: %s", fm_lm_head_name(r->lm_head));
    printf("\n\n");
    printf("| preset | backend | cosine vs fp32 | argmax agree | max abs err | max abs logit | mean KL (nats) | load s "
           "| forward s |\n");
    printf("|--------|---------|----------------|--------------|-------------|---------------|----------------|--------"
           "|-----------|\n");
    for (int i = 0; i < r->n_cells; i++) {
        const parity_cell *c = parity_at(r, 0, i);
        if (!shown(r, c)) continue;
        const fm_compare *m = &c->vs_fp32[0];
        printf("| %-6s | %-7s | %14.8f | %11.2f%% | %11.4g | %13.4g | %14.3e | %6.2f | %9.3f |\n",
               fm_preset_name(c->preset), c->backend, m->cosine, 100.0 * m->argmax_agree, m->max_abs_err,
               m->max_abs_ref, m->mean_kl, c->load_s, c->forward_s[0]);
    }
}

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n > 0 ? s / n : 0;
}

static void print_sweep(const parity_report *r) {
    printf("model: %s%s   tokens: %lld x %d prompt%s   depths:", r->model, r->synthetic ? " (synthetic)" : "",
           (long long)r->tokens, r->prompts, r->prompts > 1 ? "s" : "");
    for (int d = 0; d < r->n_depths; d++) printf("%s%d", d ? "," : " ", r->depths[d]);
    printf(" of %d   oracle: %s (fp32, %s)   baseline: int4 on %s%s%s\n", r->full_depth,
           fm_preset_name(parity_oracle_preset(r->oracle_backend)), r->oracle_backend, r->backend,
           r->dense != FM_DENSE_PRESET ? "   dense: " : "", r->dense != FM_DENSE_PRESET ? fm_dense_name(r->dense) : "");
    if (r->dispatch != FM_DISPATCH_PRESET)
        printf("dispatch of the fp8 and fp4 presets: %s\n", fm_dispatch_name(r->dispatch));
    if (r->int4_scales != FM_INT4_SCALES_G128)
        printf("int4 scales of the presets with int4 weights: %s\n", fm_int4_scales_name(r->int4_scales));
    if (r->lm_head != FM_LM_HEAD_FLOAT)
        printf("lm_head of the presets with quantized dense projections: %s\n", fm_lm_head_name(r->lm_head));
    printf("vs fp32: against the oracle; vs int4: against the baseline; mean and worst over the prompts; cos last: "
           "the last position; KL(oracle || preset) and top-5 overlap averaged over positions\n\n");
    printf("| layers | preset | backend | cos vs fp32 | worst      | cos last   | argmax  | KL (nats) | top-5  | cos "
           "vs int4 | worst      | forward s |\n");
    printf("|-------:|--------|---------|------------:|-----------:|-----------:|--------:|----------:|-------:|-------"
           "-----:|-----------:|----------:|\n");
    for (int d = 0; d < r->n_depths; d++)
        for (int i = 0; i < r->n_cells; i++) {
            const parity_cell *c = parity_at(r, d, i);
            if (!shown(r, c)) continue;
            printf("| %6d | %-6s | %-7s | %11.6f | %10.6f | %10.6f | %6.2f%% | %9.3e | %6.4f | %11.6f | %10.6f | %9.3f "
                   "|\n",
                   r->depths[d], fm_preset_name(c->preset), c->backend, c->fp32_mean.cosine, c->fp32_worst.cosine,
                   c->fp32_mean.cosine_last, 100.0 * c->fp32_mean.argmax_agree, c->fp32_mean.mean_kl,
                   c->fp32_mean.top5_overlap, c->int4_mean.cosine, c->int4_worst.cosine,
                   mean_of(c->forward_s, r->prompts));
        }
}

/* --perplexity: one row per preset at the full depth; every preset that ran (the baseline too) */
static void print_perplexity(const parity_report *r) {
    printf("\nperplexity: %lld windows of %d tokens of %s (loss on positions 1..%d of each window)",
           (long long)r->ppl_windows, r->ppl_window, r->ppl_ids ? r->ppl_ids : "the ids file", r->ppl_window - 1);
    if (!isnan(r->ppl_reference)) printf("; transformers fp32: %.4f", r->ppl_reference);
    printf("\n\n| preset | backend | perplexity | cpu emulation | vs oracle |\n");
    printf("|--------|---------|-----------:|--------------:|----------:|\n");
    const int d = r->n_depths - 1;
    const double oracle = parity_at(r, d, 0)->ppl;
    for (int i = 0; i < r->n_cells; i++) {
        const parity_cell *c = parity_at(r, d, i);
        char emul[32] = "-";
        if (!isnan(c->ppl_emulated)) snprintf(emul, sizeof emul, "%.4f", c->ppl_emulated);
        printf("| %-6s | %-7s | %10.4f | %13s | %+8.2f%% |\n", fm_preset_name(c->preset), c->backend, c->ppl, emul,
               100.0 * (c->ppl / oracle - 1.0));
    }
}

void parity_print_table(const parity_report *r) {
    if (parity_is_sweep(r)) print_sweep(r);
    else print_classic(r);
    if (r->ppl_windows > 0) print_perplexity(r);
}

static cJSON *metrics_json(const fm_compare *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "cosine", m->cosine);
    cJSON_AddNumberToObject(o, "cosine_last", m->cosine_last);
    cJSON_AddNumberToObject(o, "max_abs_err", m->max_abs_err);
    cJSON_AddNumberToObject(o, "max_abs_ref", m->max_abs_ref);
    cJSON_AddNumberToObject(o, "argmax_agree", m->argmax_agree);
    cJSON_AddNumberToObject(o, "mean_kl", m->mean_kl);
    cJSON_AddNumberToObject(o, "top5_overlap", m->top5_overlap);
    cJSON_AddNumberToObject(o, "n_nonfinite", (double)m->n_nonfinite);
    return o;
}

static cJSON *summary_json(const fm_compare *mean, const fm_compare *worst) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "mean", metrics_json(mean));
    cJSON_AddItemToObject(o, "worst", metrics_json(worst));
    return o;
}

static void add_hash(cJSON *o, const char *key, uint64_t h) {
    char text[32];
    snprintf(text, sizeof text, "%016llx", (unsigned long long)h);
    cJSON_AddStringToObject(o, key, text);
}

/* One preset at one depth: the mean figures against fp32 at the top level (the classic JSON's fields), then
 * mean and worst against both references, then every prompt. */
static cJSON *cell_json(const parity_report *r, int d, const parity_cell *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "preset", fm_preset_name(c->preset));
    cJSON_AddStringToObject(o, "backend", c->backend);
    cJSON_AddNumberToObject(o, "layers", r->depths[d]);
    const fm_compare *m = &c->fp32_mean;
    cJSON_AddNumberToObject(o, "cosine", m->cosine);
    cJSON_AddNumberToObject(o, "cosine_last", m->cosine_last);
    cJSON_AddNumberToObject(o, "argmax_agree", m->argmax_agree);
    cJSON_AddNumberToObject(o, "max_abs_err", m->max_abs_err);
    cJSON_AddNumberToObject(o, "max_abs_ref", m->max_abs_ref);
    cJSON_AddNumberToObject(o, "mean_kl", m->mean_kl);
    cJSON_AddNumberToObject(o, "top5_overlap", m->top5_overlap);
    cJSON_AddNumberToObject(o, "load_s", c->load_s);
    cJSON_AddNumberToObject(o, "forward_s", mean_of(c->forward_s, r->prompts));
    add_hash(o, "logits_hash", c->hash[0]);
    cJSON_AddItemToObject(o, "vs_fp32", summary_json(&c->fp32_mean, &c->fp32_worst));
    cJSON_AddItemToObject(o, "vs_int4", summary_json(&c->int4_mean, &c->int4_worst));
    cJSON *prompts = cJSON_AddArrayToObject(o, "prompts");
    for (int k = 0; k < r->prompts; k++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "prompt", k);
        cJSON_AddNumberToObject(p, "first_token", (double)(k * r->tokens)); /* index in the ids file or stream */
        cJSON_AddNumberToObject(p, "forward_s", c->forward_s[k]);
        add_hash(p, "logits_hash", c->hash[k]);
        cJSON_AddItemToObject(p, "vs_fp32", metrics_json(&c->vs_fp32[k]));
        cJSON_AddItemToObject(p, "vs_int4", metrics_json(&c->vs_int4[k]));
        cJSON_AddItemToArray(prompts, p);
    }
    return o;
}

/* the oracle's and the baseline's runs (times and fingerprints), whether or not they are rows */
static cJSON *run_json(const parity_report *r, const parity_cell *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "preset", fm_preset_name(c->preset));
    cJSON_AddStringToObject(o, "backend", c->backend);
    cJSON_AddNumberToObject(o, "load_s", c->load_s);
    cJSON *fw = cJSON_AddArrayToObject(o, "forward_s"), *h = cJSON_AddArrayToObject(o, "logits_hash");
    for (int k = 0; k < r->prompts; k++) {
        char text[32];
        snprintf(text, sizeof text, "%016llx", (unsigned long long)c->hash[k]);
        cJSON_AddItemToArray(fw, cJSON_CreateNumber(c->forward_s[k]));
        cJSON_AddItemToArray(h, cJSON_CreateString(text));
    }
    return o;
}

fm_status parity_write_json(const parity_report *r, const char *path, fm_error *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", r->model);
    cJSON_AddBoolToObject(root, "synthetic", r->synthetic);
    cJSON_AddNumberToObject(root, "tokens", (double)r->tokens);
    cJSON_AddNumberToObject(root, "prompts", r->prompts);
    cJSON_AddNumberToObject(root, "model_layers", r->full_depth);
    cJSON_AddStringToObject(root, "backend", r->backend);
    char oracle[64];
    snprintf(oracle, sizeof oracle, "%s preset, %s backend (fp32)",
             fm_preset_name(parity_oracle_preset(r->oracle_backend)), r->oracle_backend);
    cJSON_AddStringToObject(root, "oracle", oracle);
    cJSON_AddStringToObject(root, "oracle_backend", r->oracle_backend);
    cJSON_AddStringToObject(root, "dense", fm_dense_name(r->dense));
    cJSON_AddStringToObject(root, "int4_scales", fm_int4_scales_name(r->int4_scales));
    cJSON_AddStringToObject(root, "lm_head", fm_lm_head_name(r->lm_head));
    cJSON_AddStringToObject(root, "dispatch", fm_dispatch_name(r->dispatch));
    char baseline[64];
    snprintf(baseline, sizeof baseline, "int4 preset, %s backend", r->backend);
    cJSON_AddStringToObject(root, "baseline", baseline);
    cJSON_AddNumberToObject(root, "gate", PARITY_GATE);
    cJSON *depths = cJSON_AddArrayToObject(root, "depths");
    for (int d = 0; d < r->n_depths; d++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layers", r->depths[d]);
        cJSON_AddItemToObject(o, "oracle", run_json(r, parity_at(r, d, 0)));
        cJSON_AddItemToObject(o, "baseline", run_json(r, parity_at(r, d, r->baseline)));
        cJSON *rows = cJSON_AddArrayToObject(o, "presets");
        for (int i = 0; i < r->n_cells; i++)
            if (shown(r, parity_at(r, d, i))) cJSON_AddItemToArray(rows, cell_json(r, d, parity_at(r, d, i)));
        cJSON_AddItemToArray(depths, o);
    }
    if (r->ppl_windows > 0) {
        cJSON *p = cJSON_AddObjectToObject(root, "perplexity");
        cJSON_AddNumberToObject(p, "window", r->ppl_window);
        cJSON_AddNumberToObject(p, "windows", (double)r->ppl_windows);
        cJSON_AddStringToObject(p, "ids", r->ppl_ids ? r->ppl_ids : "");
        if (isnan(r->ppl_reference)) cJSON_AddNullToObject(p, "transformers_fp32");
        else cJSON_AddNumberToObject(p, "transformers_fp32", r->ppl_reference);
        cJSON *rows = cJSON_AddArrayToObject(p, "presets");
        for (int i = 0; i < r->n_cells; i++) {
            const parity_cell *c = parity_at(r, r->n_depths - 1, i);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "preset", fm_preset_name(c->preset));
            cJSON_AddStringToObject(o, "backend", c->backend);
            cJSON_AddNumberToObject(o, "perplexity", c->ppl);
            if (isnan(c->ppl_emulated)) cJSON_AddNullToObject(o, "cpu_emulation");
            else cJSON_AddNumberToObject(o, "cpu_emulation", c->ppl_emulated);
            cJSON_AddItemToArray(rows, o);
        }
    }
    if (!parity_is_sweep(r)) /* the classic file's array: the rows of the table */
        cJSON_AddItemToObject(root, "presets",
                              cJSON_Duplicate(cJSON_GetObjectItem(cJSON_GetArrayItem(depths, 0), "presets"), true));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    fm_status st = text ? cli_write_file(path, text, strlen(text), err) : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

/* a CSV field: quoted, quotes doubled (a model path may hold commas) */
static void csv_text(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_metrics(FILE *f, const fm_compare *m) {
    fprintf(f, ",%.9g,%.9g,%.9g,%.9g,%.9g,%.9g", m->cosine, m->cosine_last, m->max_abs_err, m->argmax_agree, m->mean_kl,
            m->top5_overlap);
}

fm_status parity_write_csv(const parity_report *r, const char *path, fm_error *err) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    fprintf(f, "model,tokens,layers,preset,backend,prompt,"
               "cos_fp32,cos_last_fp32,max_abs_err_fp32,argmax_fp32,kl_fp32,top5_fp32,"
               "cos_int4,cos_last_int4,max_abs_err_int4,argmax_int4,kl_int4,top5_int4,load_s,forward_s,logits_hash\n");
    for (int d = 0; d < r->n_depths; d++)
        for (int i = 0; i < r->n_cells; i++) {
            const parity_cell *c = parity_at(r, d, i);
            if (!shown(r, c)) continue;
            for (int k = 0; k < r->prompts; k++) {
                csv_text(f, r->model);
                fprintf(f, ",%lld,%d,%s,%s,%d", (long long)r->tokens, r->depths[d], fm_preset_name(c->preset),
                        c->backend, k);
                csv_metrics(f, &c->vs_fp32[k]);
                csv_metrics(f, &c->vs_int4[k]);
                fprintf(f, ",%.6f,%.6f,%016llx\n", c->load_s, c->forward_s[k], (unsigned long long)c->hash[k]);
            }
        }
    fm_status st = fclose(f) == 0 ? cli_write_file(path, text, n, err) : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}
