/* fp8moe parity --perplexity N: quality beside parity. At the model's full depth, every preset of the report
 * (the oracle, the rows, the int4 baseline) scores the first N windows of 512 tokens of the ids file by the
 * protocol of models/README.md (independent windows, loss on positions 1..511, perplexity = exp(mean loss)).
 * A preset on the GPU is scored twice: on the GPU, and by the cpu's exact emulation of its plan, so that a gap
 * between the two is the GPU's arithmetic, not the format. Beside them, transformers' fp32 perplexity of the
 * same checkpoint by the same protocol when the model's train_report.json records it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/parity.h"
#include "util/file.h"
#include "util/status.h"

/* transformers' figure: train_report.json "ref_ppl_eval_bf16ckpt_fp32" (models/README.md), NAN when absent */
static double reference_ppl(const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/train_report.json", model_dir);
    char *buf = NULL;
    size_t n = 0;
    fm_error ignored; /* absent, unreadable or not a regular file: no reference figure */
    if (fm_read_regular(path, "train_report.json", 1 << 20, &buf, &n, &ignored)) return NAN;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "ref_ppl_eval_bf16ckpt_fp32");
    const double ppl = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(root);
    return ppl;
}

/* cell c's perplexity on backend (its own, or the cpu emulating plan_backend's formats) */
static fm_status score(const parity_report *rep, const cli_model_opts *mo, const parity_cell *c, const char *backend,
                       const char *plan_backend, const int32_t *ids, int64_t n_ids, double *ppl, fm_error *err) {
    fm_options opt;
    parity_cell_options(&mo->opt, c, &opt);
    opt.backend = backend, opt.plan_backend = plan_backend, opt.n_layers = 0;
    opt.max_tokens = rep->ppl_window;
    fprintf(stderr, "perplexity: preset %s on %s%s, %lld windows of %d...\n", fm_preset_name(c->preset), backend,
            plan_backend ? " (emulating the GPU's formats)" : "", (long long)rep->ppl_windows, rep->ppl_window);
    fm_model *m = NULL;
    double loss = 0;
    fm_context *ctx = NULL;
    fm_status st = fm_model_load(mo->model_dir, &opt, &m, err);
    if (!st) st = fm_context_create(m, NULL, &ctx, err);
    if (!st)
        st = fm_context_perplexity(ctx, ids, n_ids, rep->ppl_window, rep->ppl_windows, NULL, NULL, ppl, &loss, err);
    fm_context_free(ctx);
    fm_model_free(m);
    return st;
}

fm_status parity_perplexity(parity_report *rep, const cli_model_opts *mo, const int32_t *ids, int64_t n_ids,
                            fm_error *err) {
    const int d = rep->n_depths - 1;
    if (rep->depths[d] != rep->full_depth)
        return fm_fail(err, FM_ERR_USAGE, "--perplexity scores the whole model: --layers must include %d",
                       rep->full_depth);
    if (rep->ppl_windows * rep->ppl_window > n_ids)
        return fm_fail(err, FM_ERR_FORMAT, "%s: %lld ids hold %lld windows of %d, not %lld", rep->ppl_ids,
                       (long long)n_ids, (long long)(n_ids / rep->ppl_window), rep->ppl_window,
                       (long long)rep->ppl_windows);
    rep->ppl_reference = reference_ppl(mo->model_dir);
    fm_status st = FM_OK;
    for (int ci = 0; !st && ci < rep->n_cells; ci++) {
        parity_cell *c = parity_at(rep, d, ci);
        st = score(rep, mo, c, c->backend, NULL, ids, n_ids, &c->ppl, err);
        if (!st && fm_backend_on_device(c->backend)) /* the device's run, and its emulation on the cpu */
            st = score(rep, mo, c, "cpu", c->backend, ids, n_ids, &c->ppl_emulated, err);
    }
    return st;
}
