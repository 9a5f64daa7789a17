/* fp8moe parity: the results of a run (depths x presets x prompts) shared by the command (cmd_parity.c), its
 * outputs (parity_output.c: table, JSON, CSV) and its plot (parity_plot.c). */
#ifndef FM_CLI_PARITY_H
#define FM_CLI_PARITY_H

#include "fp8moe.h"
#include "util/metrics.h"

#define PARITY_GATE 0.997 /* the cosine gate of fp8 against int4 (issue 6; tests/gpu/test_cuda_models.c) */

/* One preset at one depth, run on K prompts. */
typedef struct parity_cell {
    fm_preset   preset;
    const char *backend;
    bool        is_oracle; /* ref on the cpu: the fp32 oracle itself */
    bool        listed;    /* asked for with --presets (the int4 baseline may run without being listed) */
    double      load_s;
    double     *forward_s;         /* [K] */
    uint64_t   *hash;              /* [K] logits fingerprints */
    fm_compare *vs_fp32, *vs_int4; /* [K] against the oracle, against the int4 baseline */
    fm_compare  fp32_mean, fp32_worst, int4_mean, int4_worst;
} parity_cell;

typedef struct parity_report {
    const char *model;     /* checkpoint directory or synthetic name */
    bool        synthetic;
    const char *backend;   /* of the compared presets and of the int4 baseline */
    int64_t     tokens;    /* T per prompt */
    int         prompts;   /* K */
    int32_t     full_depth;
    int         n_depths;
    int32_t    *depths;    /* ascending */
    int         n_cells;   /* per depth: [0] the oracle, then the presets in the order asked, then the int4
                              baseline when it was not asked for */
    int         baseline;  /* index of the int4 cell */
    parity_cell *cells;    /* [n_depths][n_cells] */
} parity_report;

static inline parity_cell *parity_at(const parity_report *r, int d, int c) { return &r->cells[d * r->n_cells + c]; }

/* The legacy layout (one depth, one prompt: today's table and JSON) or the sweep. */
static inline bool parity_is_sweep(const parity_report *r) { return r->n_depths > 1 || r->prompts > 1; }

/* Frees the cells and depths of a report (cmd_parity.c). */
void parity_free(parity_report *r);

/* Reads back the JSON of an earlier run (parity_load.c): --from-json. */
fm_status parity_read_json(const char *path, parity_report *r, fm_error *err);

void      parity_print_table(const parity_report *r);
fm_status parity_write_json(const parity_report *r, const char *path, fm_error *err);
fm_status parity_write_csv(const parity_report *r, const char *path, fm_error *err);

/* The PNG of cosine vs depth per preset through gnuplot. *skipped is set (and one line printed) when gnuplot is
 * not installed: the caller still succeeds. */
fm_status parity_write_plot(const parity_report *r, const char *path, bool *skipped, fm_error *err);

#endif
