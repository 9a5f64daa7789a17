/* fp8moe parity --from-json: a report read back from the JSON of an earlier run, so that its table, CSV and plot
 * can be made on another machine (the GPU machine has no gnuplot: run there with --json, plot here). Every number
 * the outputs print is in the JSON; cells that were not shown (the oracle in a sweep, an int4 baseline that was
 * not asked for) come back with their times and fingerprints only. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/parity.h"
#include "util/file.h"
#include "util/status.h"

typedef struct reader {
    const char *path;
    fm_error *err;
    bool bad;
} reader;

static const cJSON *field(reader *rd, const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && !rd->bad)
        rd->bad = true, fm_fail(rd->err, FM_ERR_FORMAT, "%s: no field '%s' (not a parity JSON?)", rd->path, key);
    return v;
}

/* a number; null stands for NaN (cJSON writes non-finite numbers as null) */
static double number(reader *rd, const cJSON *o, const char *key) {
    const cJSON *v = field(rd, o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsNull(v)) return NAN;
    if (v && !rd->bad) rd->bad = true, fm_fail(rd->err, FM_ERR_FORMAT, "%s: field '%s' is not a number", rd->path, key);
    return 0;
}

static const char *text(reader *rd, const cJSON *o, const char *key) {
    const cJSON *v = field(rd, o, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (v && !rd->bad) rd->bad = true, fm_fail(rd->err, FM_ERR_FORMAT, "%s: field '%s' is not a string", rd->path, key);
    return "";
}

static const cJSON *array(reader *rd, const cJSON *o, const char *key, int n) {
    const cJSON *v = field(rd, o, key);
    if (v && (!cJSON_IsArray(v) || (n >= 0 && cJSON_GetArraySize(v) != n)) && !rd->bad)
        rd->bad = true, fm_fail(rd->err, FM_ERR_FORMAT, "%s: field '%s' is not an array of %d", rd->path, key, n);
    return rd->bad ? NULL : v;
}

static uint64_t hash_of(const char *s) { return strtoull(s, NULL, 16); }

static void read_metrics(reader *rd, const cJSON *o, fm_compare *m) {
    m->cosine = number(rd, o, "cosine"), m->cosine_last = number(rd, o, "cosine_last");
    m->max_abs_err = number(rd, o, "max_abs_err"), m->max_abs_ref = number(rd, o, "max_abs_ref");
    m->argmax_agree = number(rd, o, "argmax_agree"), m->mean_kl = number(rd, o, "mean_kl");
    m->top5_overlap = number(rd, o, "top5_overlap"), m->n_nonfinite = (int64_t)number(rd, o, "n_nonfinite");
}

/* times and fingerprints of a run ("oracle", "baseline") */
static void read_run(reader *rd, const cJSON *o, int K, parity_cell *c) {
    c->load_s = number(rd, o, "load_s");
    const cJSON *fw = array(rd, o, "forward_s", K), *h = array(rd, o, "logits_hash", K);
    for (int k = 0; !rd->bad && k < K; k++) {
        c->forward_s[k] = cJSON_GetArrayItem(fw, k)->valuedouble;
        c->hash[k] = cJSON_IsString(cJSON_GetArrayItem(h, k)) ? hash_of(cJSON_GetArrayItem(h, k)->valuestring) : 0;
    }
}

static void read_row(reader *rd, const cJSON *o, int K, parity_cell *c) {
    c->load_s = number(rd, o, "load_s");
    const cJSON *prompts = array(rd, o, "prompts", K);
    for (int k = 0; !rd->bad && k < K; k++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, k);
        c->forward_s[k] = number(rd, p, "forward_s");
        c->hash[k] = hash_of(text(rd, p, "logits_hash"));
        read_metrics(rd, field(rd, p, "vs_fp32"), &c->vs_fp32[k]);
        if (!rd->bad) read_metrics(rd, field(rd, p, "vs_int4"), &c->vs_int4[k]);
    }
}

static bool preset_of(reader *rd, const cJSON *o, fm_preset *p) {
    const char *name = text(rd, o, "preset");
    if (!rd->bad && !fm_preset_parse(name, p))
        rd->bad = true, fm_fail(rd->err, FM_ERR_FORMAT, "%s: unknown preset '%s'", rd->path, name);
    return !rd->bad;
}

static const char *backend_of(reader *rd, const cJSON *o) {
    const char *b = text(rd, o, "backend");
    const char *known = fm_backend_lookup(b); /* static strings: the report outlives the JSON */
    return known ? known : "cpu";
}

fm_status parity_read_json(const char *path, parity_report *r, fm_error *err) {
    memset(r, 0, sizeof *r);
    char *buf = NULL;
    size_t size = 0;
    fm_status rst = fm_read_regular(path, "a parity --json report", 64 << 20, &buf, &size, err);
    if (rst) return rst;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    if (!root) return fm_fail(err, FM_ERR_FORMAT, "%s: not valid JSON", path);

    reader rd = {path, err, false};
    static char model[1024]; /* the report outlives the parsed JSON; one report per process */
    snprintf(model, sizeof model, "%s", text(&rd, root, "model"));
    r->model = model;
    r->synthetic = cJSON_IsTrue(field(&rd, root, "synthetic"));
    r->tokens = (int64_t)number(&rd, root, "tokens");
    r->prompts = (int)number(&rd, root, "prompts");
    r->full_depth = (int32_t)number(&rd, root, "model_layers");
    r->backend = backend_of(&rd, root);
    /* runs made before the GPU oracle existed have no oracle_backend: their oracle ran on the cpu */
    const cJSON *ob = cJSON_GetObjectItemCaseSensitive(root, "oracle_backend");
    const char *oracle = cJSON_IsString(ob) ? fm_backend_lookup(ob->valuestring) : NULL;
    r->oracle_backend = oracle ? oracle : "cpu";
    const cJSON *dn = cJSON_GetObjectItemCaseSensitive(root, "dense");
    if (!cJSON_IsString(dn) || !fm_dense_parse(dn->valuestring, &r->dense)) r->dense = FM_DENSE_PRESET;
    const cJSON *i4 = cJSON_GetObjectItemCaseSensitive(root, "int4_scales"); /* absent before int4-p2: g128 */
    if (!cJSON_IsString(i4) || !fm_int4_scales_parse(i4->valuestring, &r->int4_scales))
        r->int4_scales = FM_INT4_SCALES_G128;
    const cJSON *lh = cJSON_GetObjectItemCaseSensitive(root, "lm_head"); /* absent before --lm-head: float */
    if (!cJSON_IsString(lh) || !fm_lm_head_parse(lh->valuestring, &r->lm_head)) r->lm_head = FM_LM_HEAD_FLOAT;
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(root, "dispatch"); /* absent in runs before --dispatch */
    if (!cJSON_IsString(dp) || !fm_dispatch_parse(dp->valuestring, &r->dispatch)) r->dispatch = FM_DISPATCH_PRESET;
    const cJSON *depths = array(&rd, root, "depths", -1);
    r->n_depths = depths ? cJSON_GetArraySize(depths) : 0;
    if (!rd.bad && (r->n_depths < 1 || r->prompts < 1 || r->tokens < 1))
        rd.bad = true, fm_fail(err, FM_ERR_FORMAT, "%s: no depths, prompts or tokens", path);
    /* the cells, as the run made them: the oracle, the rows in order (the oracle's own preset is its row), the
       baseline */
    const cJSON *rows0 = rd.bad ? NULL : array(&rd, cJSON_GetArrayItem(depths, 0), "presets", -1);
    const int n_rows = rows0 ? cJSON_GetArraySize(rows0) : 0;
    if (!rd.bad) {
        r->depths = calloc((size_t)r->n_depths, sizeof *r->depths);
        r->cells = calloc((size_t)r->n_depths * (size_t)(n_rows + 2), sizeof *r->cells);
        if (!r->depths || !r->cells) rd.bad = true, fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    int n_cells = 1, baseline = -1;
    fm_preset kinds[FM_PRESET_COUNT + 2] = {parity_oracle_preset(r->oracle_backend)};
    bool listed[FM_PRESET_COUNT + 2] = {false};
    int row_cell[FM_PRESET_COUNT + 2];
    if (n_rows > FM_PRESET_COUNT + 1)
        rd.bad = true,
        fm_fail(err, FM_ERR_FORMAT, "%s: %d preset rows (at most %d)", path, n_rows, FM_PRESET_COUNT + 1);
    for (int i = 0; !rd.bad && i < n_rows; i++) {
        const cJSON *row = cJSON_GetArrayItem(rows0, i);
        fm_preset p;
        if (!preset_of(&rd, row, &p)) break;
        const bool oracle = parity_is_oracle(p, backend_of(&rd, row), r->oracle_backend);
        row_cell[i] = oracle ? 0 : n_cells;
        if (oracle) listed[0] = true;
        else kinds[n_cells] = p, listed[n_cells++] = true, baseline = p == FM_PRESET_INT4 ? n_cells - 1 : baseline;
    }
    if (baseline < 0) baseline = n_cells, kinds[n_cells] = FM_PRESET_INT4, listed[n_cells++] = false;
    r->n_cells = n_cells, r->baseline = baseline;
    const int K = r->prompts;
    for (int d = 0; !rd.bad && d < r->n_depths; d++) {
        const cJSON *depth = cJSON_GetArrayItem(depths, d);
        r->depths[d] = (int32_t)number(&rd, depth, "layers");
        for (int ci = 0; !rd.bad && ci < n_cells; ci++) {
            parity_cell *c = parity_at(r, d, ci);
            c->preset = kinds[ci], c->listed = listed[ci], c->is_oracle = ci == 0;
            c->backend = ci == 0 ? r->oracle_backend : r->backend;
            c->forward_s = calloc((size_t)K, sizeof *c->forward_s), c->hash = calloc((size_t)K, sizeof *c->hash);
            c->vs_fp32 = calloc((size_t)K, sizeof *c->vs_fp32), c->vs_int4 = calloc((size_t)K, sizeof *c->vs_int4);
            if (!c->forward_s || !c->hash || !c->vs_fp32 || !c->vs_int4)
                rd.bad = true, fm_fail(err, FM_ERR_NOMEM, "out of memory");
        }
        if (!rd.bad) read_run(&rd, field(&rd, depth, "oracle"), K, parity_at(r, d, 0));
        if (!rd.bad) read_run(&rd, field(&rd, depth, "baseline"), K, parity_at(r, d, baseline));
        const cJSON *rows = rd.bad ? NULL : array(&rd, depth, "presets", n_rows);
        for (int i = 0; !rd.bad && i < n_rows; i++)
            read_row(&rd, cJSON_GetArrayItem(rows, i), K, parity_at(r, d, row_cell[i]));
        for (int ci = 0; !rd.bad && ci < n_cells; ci++) {
            parity_cell *c = parity_at(r, d, ci);
            fm_compare_summarize(c->vs_fp32, K, &c->fp32_mean, &c->fp32_worst);
            fm_compare_summarize(c->vs_int4, K, &c->int4_mean, &c->int4_worst);
        }
    }
    /* --perplexity: rows in cell order at the last depth */
    const cJSON *ppl = rd.bad ? NULL : cJSON_GetObjectItemCaseSensitive(root, "perplexity");
    for (int ci = 0; !rd.bad && ci < n_cells; ci++) {
        parity_cell *c = parity_at(r, r->n_depths - 1, ci);
        c->ppl = c->ppl_emulated = NAN;
    }
    r->ppl_reference = NAN;
    if (ppl) {
        static char ids[1024];
        snprintf(ids, sizeof ids, "%s", text(&rd, ppl, "ids"));
        r->ppl_ids = ids;
        r->ppl_window = (int32_t)number(&rd, ppl, "window");
        r->ppl_windows = (int64_t)number(&rd, ppl, "windows");
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(ppl, "transformers_fp32");
        if (cJSON_IsNumber(ref)) r->ppl_reference = ref->valuedouble;
        const cJSON *rows = rd.bad ? NULL : array(&rd, ppl, "presets", n_cells);
        for (int ci = 0; !rd.bad && ci < n_cells; ci++) {
            const cJSON *row = cJSON_GetArrayItem(rows, ci);
            parity_cell *c = parity_at(r, r->n_depths - 1, ci);
            c->ppl = number(&rd, row, "perplexity");
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(row, "cpu_emulation");
            if (cJSON_IsNumber(e)) c->ppl_emulated = e->valuedouble;
        }
    }
    cJSON_Delete(root);
    if (rd.bad) {
        parity_free(r);
        return err->msg[0] ? FM_ERR_FORMAT : fm_fail(err, FM_ERR_FORMAT, "%s: not a parity JSON", path);
    }
    return FM_OK;
}
