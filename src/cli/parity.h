/* fp8moe parity: the results of a run (depths x presets x prompts) shared by the command (cmd_parity.c), its
 * outputs (parity_output.c: table, JSON, CSV) and its plot (parity_plot.c). */
#ifndef FM_CLI_PARITY_H
#define FM_CLI_PARITY_H

#include "fp8moe.h"
#include "util/metrics.h"

#define PARITY_GATE 0.997 /* the cosine gate of fp8 against int4 (issue 6; tests/gpu/test_cuda_models.c) */

/* One preset at one depth, run on K prompts. */
typedef struct parity_cell {
    fm_preset preset;
    const char *backend;
    bool is_oracle; /* the fp32 oracle itself: ref on the cpu or ref32 on the GPU */
    bool listed;    /* asked for with --presets (the int4 baseline may run without being listed) */
    double load_s;
    double *forward_s;             /* [K] */
    uint64_t *hash;                /* [K] logits fingerprints */
    fm_compare *vs_fp32, *vs_int4; /* [K] against the oracle, against the int4 baseline */
    fm_compare fp32_mean, fp32_worst, int4_mean, int4_worst;
    double ppl, ppl_emulated; /* --perplexity, at the full depth only: on the cell's backend, and the cpu's
                                 exact emulation of the same plan (GPU cells); NAN where not measured */
} parity_cell;

typedef struct parity_report {
    const char *model; /* checkpoint directory or synthetic name */
    bool synthetic;
    const char *backend;        /* of the compared presets and of the int4 baseline */
    const char *oracle_backend; /* "cpu" (preset ref) or "cuda" (preset ref32) */
    fm_dense dense;             /* --dense: applied to every preset but the oracle */
    fm_dispatch dispatch;       /* --dispatch: applied to the fp8 and fp4 presets (the others refuse it) */
    fm_int4_scales int4_scales; /* --int4-scales: applied to the presets with int4 weights, the baseline too */
    fm_lm_head lm_head;         /* --lm-head: applied to the presets with quantized dense projections */
    int64_t tokens;             /* T per prompt */
    int prompts;                /* K */
    int32_t full_depth;
    int n_depths;
    int32_t *depths;     /* ascending */
    int n_cells;         /* per depth: [0] the oracle, then the presets in the order asked, then the int4
                            baseline when it was not asked for */
    int baseline;        /* index of the int4 cell */
    parity_cell *cells;  /* [n_depths][n_cells] */
    int64_t ppl_windows; /* --perplexity N: N windows of ppl_window tokens (0: not measured) */
    int32_t ppl_window;
    const char *ppl_ids;  /* the ids file they came from */
    double ppl_reference; /* transformers' fp32 perplexity by the same protocol (the model's
                             train_report.json, ref_ppl_eval_bf16ckpt_fp32), NAN when unknown */
} parity_report;

/* The fp32 oracle's preset on a backend: ref on the cpu, ref32 on the GPU (where ref is the bf16 reference). */
static inline fm_preset parity_oracle_preset(const char *oracle_backend) {
    return oracle_backend[0] == 'c' && oracle_backend[1] == 'p' ? FM_PRESET_REF : FM_PRESET_REF32;
}
/* A preset asked for on `backend` that computes exactly the oracle (fp32 throughout on the oracle's backend) is
 * the oracle's row, not a second run. */
static inline bool parity_is_oracle(fm_preset p, const char *backend, const char *oracle_backend) {
    const bool same = backend[0] == oracle_backend[0] && backend[1] == oracle_backend[1];
    const bool cpu = backend[0] == 'c' && backend[1] == 'p';
    return same && (p == FM_PRESET_REF32 || (p == FM_PRESET_REF && cpu));
}

static inline parity_cell *parity_at(const parity_report *r, int d, int c) { return &r->cells[d * r->n_cells + c]; }

/* The legacy layout (one depth, one prompt: today's table and JSON) or the sweep. */
static inline bool parity_is_sweep(const parity_report *r) { return r->n_depths > 1 || r->prompts > 1; }

/* The load options of cell c from the command's (cmd_parity.c): its preset and backend; --dense, --lm-head,
 * --int4-scales and --dispatch where they apply to it (never to the oracle). The parity table's runs and the
 * perplexity table's take the same. */
void parity_cell_options(const fm_options *base, const parity_cell *c, fm_options *opt);

/* Frees the cells and depths of a report (cmd_parity.c). */
void parity_free(parity_report *r);

/* Reads back the JSON of an earlier run (parity_load.c): --from-json. */
fm_status parity_read_json(const char *path, parity_report *r, fm_error *err);

/* --perplexity (parity_ppl.c): each cell of the last depth (which must be the model's full depth) scores the
 * first rep->ppl_windows windows of ids; GPU cells also through the cpu's emulation of their plan. */
struct cli_model_opts;
fm_status parity_perplexity(parity_report *rep, const struct cli_model_opts *mo, const int32_t *ids, int64_t n_ids,
                            fm_error *err);

void parity_print_table(const parity_report *r);
fm_status parity_write_json(const parity_report *r, const char *path, fm_error *err);
fm_status parity_write_csv(const parity_report *r, const char *path, fm_error *err);

/* The PNG of cosine vs depth per preset through gnuplot. *skipped is set (and one line printed) when gnuplot is
 * not installed: the caller still succeeds. */
fm_status parity_write_plot(const parity_report *r, const char *path, bool *skipped, fm_error *err);

#endif
