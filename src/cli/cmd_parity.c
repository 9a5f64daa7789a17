/* fp8moe parity: the main job, and the depth sweep of the parity report (issue 6). At each depth it runs the
 * fp32 oracle (ref on the CPU or ref32 on the GPU), the int4 baseline (on the compared presets' backend) and each
 * requested preset over the same K prompts of T tokens, and compares every preset's logits with the oracle's and the
 * baseline's. parity_output.c prints the table and writes JSON / CSV; parity_plot.c draws the PNG. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/parity.h"
#include "util/ids.h"
#include "util/file.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe parity (--model DIR | --synthetic NAME) [--presets LIST] [--layers L1,L2,..] [--tokens T]\n"
    "                     [--prompts K] [--backend cpu|cuda] [--oracle cpu|cuda] [--json FILE] [--csv FILE]\n"
    "                     [--plot FILE.png]\n"
    "\n"
    "Logits of each preset against the fp32 oracle and against the int4 baseline (preset int4 on --backend), on\n"
    "the same tokens, at one or more depths: the first L decoder layers, then the final norm and lm_head.\n"
    "\n"
    "  --model DIR        Hugging Face checkpoint directory (config.json + safetensors)\n"
    "  --synthetic NAME   synthetic weights at real shapes instead (qwen3-30b-a3b, mixtral-8x7b, toy-moe;\n"
    "                     qwen3-next-80b-a3b and toy-next on the cpu backend)\n"
    "  --oracle B         where the fp32 oracle runs (default: --backend): cpu is preset ref (the reference\n"
    "                     implementation; at qwen3 shapes 2.4 GB of fp32 weights per layer and, on one thread,\n"
    "                     ~10 s per layer per 256-token prompt plus ~25 s for embed and lm_head); cuda is preset\n"
    "                     ref32 (fp32 weights, activations and arithmetic on the GPU, checked against the cpu's\n"
    "                     on the bundled models; 122 GB at the full qwen3 depth, which one H200 holds). Each\n"
    "                     preset is loaded alone, its weights freed before the next\n"
    "  --ids FILE         with --model: token ids (default DIR/eval_ids.i32, else DIR/golden_ids.i32)\n"
    "  --tokens T         tokens per prompt (default 256; with --model at most the ids file's length / K)\n"
    "  --prompts K        K prompts (default 1): consecutive windows of T ids from the ids file, or with\n"
    "                     --synthetic deterministic pseudo-random ids (xorshift; the first prompt is bench\n"
    "                     prefill's); every figure is then reported as the mean and the worst over K\n"
    "  --presets LIST     comma-separated presets to compare (default ref,int4,fp8,fp4; ref32 is the oracle)\n"
    "  --layers LIST      comma-separated depths, e.g. 1,2,4,8 (default: the model's full depth)\n"
    "  --backend B        cpu (default) or cuda: where the compared presets and the int4 baseline run\n"
    "  --json FILE        every number as JSON, per prompt too\n"
    "  --csv FILE         one row per depth x preset x prompt\n"
    "  --plot FILE        PNG through gnuplot: cosine against the oracle vs depth per preset (dashed: against\n"
    "                     int4), with the 0.997 gate; without gnuplot installed, one line says so and the\n"
    "                     other outputs are still written\n"
    "  --from-json FILE   run nothing: the table, --csv and --plot again from an earlier run's --json (make\n"
    "                     the plot where gnuplot is, of a run made where it is not)\n"
    "  --perplexity N     with --model: quality beside parity: at the full depth (the last of --layers), each\n"
    "                     preset's perplexity on the first N windows of 512 tokens of the ids file (the protocol\n"
    "                     of models/README.md; N = 256 is the published one), on its backend and, for a GPU\n"
    "                     preset, by the cpu's exact emulation of its formats; beside them transformers' fp32\n"
    "                     figure from the model's train_report.json when it has one\n"
    "  --dense w8a8       the compared presets with e4m3 dense projections (never the oracle)\n"
    "  --lm-head L        float (default) or dense: the lm_head of the presets whose dense projections are\n"
    "                     quantized, in their format (never the oracle; ref and ref32 only with --dense w8a8)\n"
    "  --dispatch D       the expert dispatch format of the fp8 and fp4 presets: bf16, fp8, mxfp4, nvfp4 (run\n"
    "                     once per format to sweep them; the oracle and int4 keep their own)\n"
    "  --int4-scales S    g128 (default) or p2: the int4 group scales of the presets with int4 weights, the int4\n"
    "                     baseline too (never the oracle); cpu backend, float checkpoints (docs/int4_p2.md)\n"
    "  --threads N        CPU threads (default: all)\n"
    "  --vram-limit BYTES cuda: as if the GPU had this much free memory (8Gi, 7.5G, bytes)\n" CLI_ROUTE_HELP
    "  -v, --verbose      progress on stderr\n"
    "  -h, --help         this help\n"
    "\n"
    "Metrics, per prompt: cosine of the logits over all positions and at the last position, max abs error,\n"
    "argmax agreement, KL(reference || preset) in nats averaged over positions, and top-5 overlap (the mean over\n"
    "positions of |top5(reference) & top5(preset)| / 5). One depth and one prompt print the classic table (one\n"
    "row per preset, the oracle first); a sweep prints one row per depth x preset: against fp32 the cosine\n"
    "(mean, worst), cosine at the last position, argmax, KL and top-5 (means), against int4 the cosine (mean,\n"
    "worst). Output files appear only when complete. Exit codes: 0 ok, 1 bad input or a failed run, 2 usage.\n"
    "\n"
    "The report of issue 6 on the GPU, e.g.:\n"
    "  fp8moe parity --synthetic qwen3-30b-a3b --backend cuda --presets ref,int4,fp8 --layers 1,2,4,8,16,32,48 \\\n"
    "                --tokens 256 --prompts 4 --json parity.json --csv parity.csv --plot parity.png\n"
    "  fp8moe parity --from-json parity.json --plot parity.png     (elsewhere, when that machine has no gnuplot)\n";

typedef struct parity_args {
    const char *ids_path, *json_path, *csv_path, *plot_path, *presets, *layers, *synthetic, *from_json, *oracle;
    long tokens, prompts, ppl_windows;
    bool run_option; /* an option that only a run takes (not --from-json) */
} parity_args;

enum {
    OPT_IDS = 2000,
    OPT_TOKENS,
    OPT_PRESETS,
    OPT_JSON,
    OPT_CSV,
    OPT_PLOT,
    OPT_LAYERS,
    OPT_PROMPTS,
    OPT_SYNTH,
    OPT_PRESET,
    OPT_FROM_JSON,
    OPT_ORACLE,
    OPT_PPL
};
static const struct option own_options[] = {{"ids", required_argument, 0, OPT_IDS},
                                            {"tokens", required_argument, 0, OPT_TOKENS},
                                            {"presets", required_argument, 0, OPT_PRESETS},
                                            {"json", required_argument, 0, OPT_JSON},
                                            {"csv", required_argument, 0, OPT_CSV},
                                            {"plot", required_argument, 0, OPT_PLOT},
                                            {"layers", required_argument, 0, OPT_LAYERS},
                                            {"prompts", required_argument, 0, OPT_PROMPTS},
                                            {"synthetic", required_argument, 0, OPT_SYNTH},
                                            {"preset", required_argument, 0, OPT_PRESET},
                                            {"from-json", required_argument, 0, OPT_FROM_JSON},
                                            {"oracle", required_argument, 0, OPT_ORACLE},
                                            {"perplexity", required_argument, 0, OPT_PPL},
                                            {0, 0, 0, 0}};

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    parity_args *a = ctx;
    a->run_option |= id == OPT_IDS || id == OPT_TOKENS || id == OPT_PROMPTS || id == OPT_PRESETS || id == OPT_LAYERS ||
                     id == OPT_ORACLE || id == OPT_PPL;
    switch (id) {
    case OPT_IDS: a->ids_path = arg; return true;
    case OPT_TOKENS: return cli_parse_int(cmd, "--tokens", arg, 1, 1 << 24, &a->tokens);
    case OPT_PROMPTS: return cli_parse_int(cmd, "--prompts", arg, 1, 100000, &a->prompts);
    case OPT_PRESETS: a->presets = arg; return true;
    case OPT_LAYERS: a->layers = arg; return true;
    case OPT_JSON: a->json_path = arg; return true;
    case OPT_CSV: a->csv_path = arg; return true;
    case OPT_PLOT: a->plot_path = arg; return true;
    case OPT_SYNTH: a->synthetic = arg; return true;
    case OPT_FROM_JSON: a->from_json = arg; return true;
    case OPT_PPL: return cli_parse_int(cmd, "--perplexity", arg, 1, 1 << 24, &a->ppl_windows);
    case OPT_ORACLE:
        if (!fm_backend_lookup(arg)) {
            cli_usage(cmd, "--oracle is cpu or cuda, got '%s'", arg);
            return false;
        }
        a->oracle = arg;
        return true;
    case OPT_PRESET: cli_usage(cmd, "parity compares a list of presets: use --presets %s", arg); return false;
    }
    return true;
}

/* "ref,int4,fp8": each preset once, in the order given */
static bool parse_presets(const char *list, fm_preset *out, int *n) {
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return false;
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        fm_preset p;
        if (!fm_preset_parse(tok, &p)) return false;
        bool seen = false;
        for (int i = 0; i < *n; i++) seen |= out[i] == p;
        if (!seen) out[(*n)++] = p;
    }
    return *n > 0;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* "1,2,4,8": depths >= 1, sorted, each once; false on anything else (empty items, signs, words) */
static bool parse_layers(const char *list, int32_t **out, int *n) {
    size_t cap = 1;
    for (const char *p = list; *p; p++) cap += *p == ',';
    int32_t *d = calloc(cap, sizeof *d);
    if (!d) return false;
    *n = 0;
    for (const char *p = list;;) {
        if (*p < '0' || *p > '9') break;
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (v < 1 || v > 100000) break;
        d[(*n)++] = (int32_t)v;
        if (*end == 0) {
            qsort(d, (size_t)*n, sizeof *d, cmp_i32);
            int u = 0;
            for (int i = 0; i < *n; i++)
                if (u == 0 || d[i] != d[u - 1]) d[u++] = d[i];
            *n = u, *out = d;
            return true;
        }
        if (*end != ',') break;
        p = end + 1;
    }
    free(d);
    return false;
}

/* What every cell of the run shares. */
typedef struct parity_run {
    const cli_model_opts *mo;
    const char *synthetic;
    const int32_t *ids; /* K prompts of T ids, back to back */
    int64_t T;
    int K;
    int32_t V;
    float *oracle, *baseline, *scratch; /* [K][T][V], [K][T][V], [T][V] */
    bool oracle_ready, baseline_ready;
} parity_run;

/* Loads preset c at this depth and runs the K prompts; compares each with the oracle and the baseline when they
 * have run. keep (K x T x V) receives the logits of the oracle and the baseline. */
void parity_cell_options(const fm_options *base, const parity_cell *c, fm_options *opt) {
    *opt = *base;
    opt->preset = c->preset, opt->backend = c->backend;
    if (c->is_oracle) opt->dense = FM_DENSE_PRESET; /* --dense refines the compared presets, never the oracle */
    /* --lm-head: the presets whose dense projections are quantized (ref and ref32 only under --dense w8a8) */
    const bool ref = c->preset == FM_PRESET_REF || c->preset == FM_PRESET_REF32;
    if (c->is_oracle || (ref && opt->dense == FM_DENSE_PRESET)) opt->lm_head = FM_LM_HEAD_FLOAT;
    /* --int4-scales: the presets with int4 weights (the int4 baseline too), never the fp32 ones */
    if (ref) opt->int4_scales = FM_INT4_SCALES_G128;
    /* --dispatch: the expert dispatch format of the e4m3 presets; the oracle and int4 keep theirs */
    if (c->preset != FM_PRESET_FP8 && c->preset != FM_PRESET_FP4) opt->dispatch = FM_DISPATCH_PRESET;
}

static fm_status run_cell(const parity_run *r, int32_t depth, parity_cell *c, float *keep, fm_error *err) {
    fm_options opt;
    parity_cell_options(&r->mo->opt, c, &opt);
    opt.n_layers = depth;
    fm_model *m = NULL;
    double t0 = cli_now();
    fm_status st = r->synthetic ? fm_model_load_synthetic(r->synthetic, depth, &opt, &m, err)
                                : fm_model_load(r->mo->model_dir, &opt, &m, err);
    fm_context *ctx = NULL;
    if (!st) st = fm_context_create(m, NULL, &ctx, err);
    c->load_s = cli_now() - t0;
    const size_t TV = (size_t)r->T * (size_t)r->V;
    for (int k = 0; !st && k < r->K; k++) {
        float *out = keep ? keep + k * TV : r->scratch;
        t0 = cli_now();
        st = fm_context_logits(ctx, r->ids + k * r->T, r->T, out, err);
        c->forward_s[k] = cli_now() - t0;
        if (st) break;
        if (opt.verbose && r->K > 1) fprintf(stderr, "  prompt %d/%d: %.3f s\n", k + 1, r->K, c->forward_s[k]);
        c->hash[k] = fm_hash_f32(out, (int64_t)TV);
        if (r->oracle_ready) fm_logits_compare(r->oracle + k * TV, out, r->T, r->V, &c->vs_fp32[k]);
        if (r->baseline_ready) fm_logits_compare(r->baseline + k * TV, out, r->T, r->V, &c->vs_int4[k]);
    }
    fm_context_free(ctx);
    fm_model_free(m);
    return st;
}

/* All cells of one depth. The int4 baseline runs first (on the compared presets' backend, so that a backend
 * that cannot run says so before a slow CPU oracle), then the oracle, then the others against both. Each runs
 * alone: its weights are freed before the next one loads (the GPU oracle at full Qwen3 depth needs 122 GB). */
static fm_status run_depth(parity_run *r, const parity_report *rep, int d, fm_error *err) {
    const int32_t depth = rep->depths[d];
    const size_t TV = (size_t)r->T * (size_t)r->V;
    parity_cell *o = parity_at(rep, d, 0), *b = parity_at(rep, d, rep->baseline);
    r->oracle_ready = r->baseline_ready = false;
    fm_status st = FM_OK;
    for (int i = 0; !st && i < rep->n_cells + 1; i++) {
        const int ci = i == 0 ? rep->baseline : i == 1 ? 0 : i - 1;
        if (i >= 2 && (ci == 0 || ci == rep->baseline)) continue;
        parity_cell *c = parity_at(rep, d, ci);
        fprintf(stderr, "layers %d/%d: running preset %s on %s%s...\n", depth, rep->full_depth,
                fm_preset_name(c->preset), c->backend,
                ci == 0 ? " (the oracle)" : (!c->listed ? " (the int4 baseline)" : ""));
        st = run_cell(r, depth, c, ci == 0 ? r->oracle : ci == rep->baseline ? r->baseline : NULL, err);
        if (st || i != 1) {
            r->baseline_ready = !st;
            continue;
        }
        /* both references exist now: each against itself and against the other */
        r->oracle_ready = true;
        for (int k = 0; k < r->K; k++) {
            const float *ok = r->oracle + k * TV, *bk = r->baseline + k * TV;
            fm_logits_compare(ok, ok, r->T, r->V, &o->vs_fp32[k]);
            fm_logits_compare(bk, ok, r->T, r->V, &o->vs_int4[k]);
            fm_logits_compare(ok, bk, r->T, r->V, &b->vs_fp32[k]);
            fm_logits_compare(bk, bk, r->T, r->V, &b->vs_int4[k]);
        }
    }
    for (int ci = 0; !st && ci < rep->n_cells; ci++) {
        parity_cell *c = parity_at(rep, d, ci);
        fm_compare_summarize(c->vs_fp32, r->K, &c->fp32_mean, &c->fp32_worst);
        fm_compare_summarize(c->vs_int4, r->K, &c->int4_mean, &c->int4_worst);
    }
    return st;
}

/* The cells of every depth: [0] the oracle, the presets asked for (the oracle's own preset is its row), then the
 * int4 baseline when it was not asked for. */
static fm_status make_cells(parity_report *rep, const fm_preset *list, int n_list, fm_error *err) {
    fm_preset cells[FM_PRESET_COUNT + 2];
    bool listed[FM_PRESET_COUNT + 2];
    int n = 1;
    cells[0] = parity_oracle_preset(rep->oracle_backend), listed[0] = false, rep->baseline = -1;
    for (int i = 0; i < n_list; i++) {
        if (parity_is_oracle(list[i], rep->backend, rep->oracle_backend)) {
            listed[0] = true;
            continue;
        }
        if (list[i] == FM_PRESET_INT4) rep->baseline = n;
        cells[n] = list[i], listed[n++] = true;
    }
    if (rep->baseline < 0) rep->baseline = n, cells[n] = FM_PRESET_INT4, listed[n++] = false;
    rep->n_cells = n;
    const size_t total = (size_t)rep->n_depths * (size_t)n, K = (size_t)rep->prompts;
    rep->cells = calloc(total, sizeof *rep->cells);
    if (!rep->cells) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < total; i++) {
        parity_cell *c = &rep->cells[i];
        const int ci = (int)(i % (size_t)n);
        c->preset = cells[ci], c->listed = listed[ci], c->is_oracle = ci == 0;
        c->ppl = c->ppl_emulated = NAN;
        c->backend = ci == 0 ? rep->oracle_backend : rep->backend;
        c->forward_s = calloc(K, sizeof *c->forward_s);
        c->hash = calloc(K, sizeof *c->hash);
        c->vs_fp32 = calloc(K, sizeof *c->vs_fp32);
        c->vs_int4 = calloc(K, sizeof *c->vs_int4);
        if (!c->forward_s || !c->hash || !c->vs_fp32 || !c->vs_int4) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    return FM_OK;
}

void parity_free(parity_report *rep) {
    for (int i = 0; rep->cells && i < rep->n_depths * rep->n_cells; i++) {
        parity_cell *c = &rep->cells[i];
        free(c->forward_s), free(c->hash), free(c->vs_fp32), free(c->vs_int4);
    }
    free(rep->cells), free(rep->depths);
    rep->cells = NULL, rep->depths = NULL;
}

/* --synthetic prompts: the xorshift stream of bench prefill, K x T ids */
static int32_t *synthetic_ids(int64_t n, int32_t V) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int64_t t = 0; ids && t < n; t++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[t] = (int32_t)(x % (uint64_t)V);
    }
    return ids;
}

/* The table on stdout, then the files asked for; the plot last (the one output that needs another program). */
static fm_status outputs(const parity_report *rep, const parity_args *a, fm_error *err) {
    bool skipped = false;
    parity_print_table(rep);
    fm_status st = FM_OK;
    if (!st && a->json_path) st = parity_write_json(rep, a->json_path, err);
    if (!st && a->csv_path) st = parity_write_csv(rep, a->csv_path, err);
    if (!st && a->plot_path) st = parity_write_plot(rep, a->plot_path, &skipped, err);
    return st;
}

/* --from-json: the outputs of an earlier run, made again without running anything */
static int from_json(const char *cmd, const parity_args *a, const cli_model_opts *mo) {
    if (mo->model_dir || a->synthetic || a->run_option)
        return cli_usage(
            cmd, "--from-json makes the outputs of an earlier run again: it takes only --json, --csv and --plot");
    fm_error err = {{0}};
    parity_report rep;
    fm_status st = parity_read_json(a->from_json, &rep, &err);
    if (!st) st = outputs(&rep, a, &err);
    parity_free(&rep);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}

int cmd_parity(int argc, char **argv) {
    const char *cmd = "parity";
    parity_args a = {.presets = "ref,int4,fp8,fp4", .tokens = 256, .prompts = 1};
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    if (a.from_json) return from_json(cmd, &a, &mo);
    if (!mo.model_dir == !a.synthetic) return cli_usage(cmd, "give one of --model DIR or --synthetic NAME");
    if (a.synthetic && a.ids_path) return cli_usage(cmd, "--ids goes with --model (--synthetic makes its own ids)");
    if (a.synthetic && a.ppl_windows)
        return cli_usage(cmd, "--perplexity needs a trained model and its ids (--model), not synthetic weights");
    fm_preset list[FM_PRESET_COUNT];
    int n_list = 0;
    if (!parse_presets(a.presets, list, &n_list))
        return cli_usage(cmd, "--presets must list ref, ref32, int4, fp8, fp4: '%s'", a.presets);

    fm_error err = {{0}};
    fm_checkpoint_info cfg;                                      /* the depth and the vocabulary, before any load */
    const char *outs[] = {a.json_path, a.csv_path, a.plot_path}; /* a FIFO or device there: refused before the run */
    for (int i = 0; i < 3; i++)
        if (outs[i] && fm_check_output_path(outs[i], &err)) return cli_fail(cmd, FM_ERR_IO, &err);
    fm_status st =
        a.synthetic ? fm_synthetic_probe(a.synthetic, &cfg, &err) : fm_checkpoint_probe(mo.model_dir, &cfg, &err);
    if (st) return cli_fail(cmd, st, &err);
    /* the oracle runs where the compared presets run unless told otherwise: ref32 on the GPU, ref on the cpu */
    parity_report rep = {.model = a.synthetic ? a.synthetic : mo.model_dir,
                         .synthetic = a.synthetic != NULL,
                         .backend = mo.opt.backend,
                         .oracle_backend = a.oracle ? a.oracle : mo.opt.backend,
                         .dense = mo.opt.dense,
                         .dispatch = mo.opt.dispatch,
                         .int4_scales = mo.opt.int4_scales,
                         .lm_head = mo.opt.lm_head,
                         .prompts = (int)a.prompts,
                         .full_depth = cfg.n_layers};
    if (a.layers) {
        if (!parse_layers(a.layers, &rep.depths, &rep.n_depths))
            return cli_usage(cmd, "--layers expects a comma-separated list of depths >= 1 such as 1,2,4,8, got '%s'",
                             a.layers);
        if (rep.depths[rep.n_depths - 1] > cfg.n_layers) {
            const int32_t over = rep.depths[rep.n_depths - 1];
            free(rep.depths);
            return cli_usage(cmd, "--layers %d is more than the %d layers of %s", over, cfg.n_layers, rep.model);
        }
    } else {
        rep.depths = malloc(sizeof *rep.depths);
        if (!rep.depths) return cli_fail(cmd, FM_ERR_NOMEM, &err);
        rep.depths[0] = cfg.n_layers, rep.n_depths = 1;
    }

    if (a.ppl_windows && rep.depths[rep.n_depths - 1] != cfg.n_layers) {
        free(rep.depths);
        return cli_usage(cmd, "--perplexity scores the whole model: --layers must include %d", cfg.n_layers);
    }

    /* the prompts: K consecutive windows of the ids file (T capped by its length), or synthetic ids */
    const int32_t V = cfg.vocab_size;
    int32_t *ids = NULL;
    int64_t T = a.tokens, n_ids = 0;
    if (a.synthetic) {
        if (!(ids = synthetic_ids(T * a.prompts, V))) st = fm_fail(&err, FM_ERR_NOMEM, "out of memory for the ids");
    } else {
        char default_ids[4096];
        struct stat sb;
        const char *ids_path = a.ids_path;
        if (!ids_path) {
            snprintf(default_ids, sizeof default_ids, "%s/eval_ids.i32", mo.model_dir);
            if (stat(default_ids, &sb) != 0)
                snprintf(default_ids, sizeof default_ids, "%s/golden_ids.i32", mo.model_dir);
            ids_path = default_ids;
        }
        st = fm_ids_read(ids_path, &ids, &n_ids, &err);
        if (!st) st = fm_ids_check_vocab(ids_path, ids, n_ids, V, &err);
        rep.ppl_ids = ids_path == a.ids_path ? a.ids_path : strdup(ids_path);
        if (!rep.ppl_ids) st = fm_fail(&err, FM_ERR_NOMEM, "out of memory");
        if (!st && n_ids < a.prompts)
            st = fm_fail(&err, FM_ERR_FORMAT, "%s: %lld ids are too few for --prompts %ld", ids_path, (long long)n_ids,
                         a.prompts);
        if (!st && T * a.prompts > n_ids) {
            T = n_ids / a.prompts;
            if (a.prompts > 1)
                fprintf(stderr, "parity: %s holds %lld ids: %ld prompts of %lld tokens\n", ids_path, (long long)n_ids,
                        a.prompts, (long long)T);
        }
    }
    rep.tokens = T;
    mo.opt.max_tokens = T;
    if (!st) st = make_cells(&rep, list, n_list, &err);

    parity_run run = {.mo = &mo, .synthetic = a.synthetic, .ids = ids, .T = T, .K = rep.prompts, .V = V};
    const size_t TV = (size_t)T * (size_t)V;
    if (!st) {
        run.oracle = malloc((size_t)rep.prompts * TV * sizeof(float));
        run.baseline = malloc((size_t)rep.prompts * TV * sizeof(float));
        run.scratch = malloc(TV * sizeof(float));
        if (!run.oracle || !run.baseline || !run.scratch)
            st = fm_fail(&err, FM_ERR_NOMEM,
                         "out of memory for the logits: 2 x %d prompts x %lld tokens x %d vocab floats", rep.prompts,
                         (long long)T, V);
    }
    for (int d = 0; !st && d < rep.n_depths; d++) st = run_depth(&run, &rep, d, &err);
    free(run.oracle), free(run.baseline), free(run.scratch);
    rep.ppl_window = 512, rep.ppl_windows = a.ppl_windows, rep.ppl_reference = NAN;
    if (!st && a.ppl_windows) st = parity_perplexity(&rep, &mo, ids, n_ids, &err);
    free(ids);

    if (!st) st = outputs(&rep, &a, &err);
    if (rep.ppl_ids != a.ids_path) free((char *)rep.ppl_ids);
    parity_free(&rep);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
