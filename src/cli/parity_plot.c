/* fp8moe parity --plot: cosine against the fp32 oracle vs depth, one line per preset, through the gnuplot
 * binary (a script and a data file next to the output, run with system(); the PNG is renamed into place only
 * when gnuplot succeeded). The y axis is 1 - cosine on a log scale, reversed and labelled in cosines, so that
 * 0.99, 0.999 and 0.9999 are evenly spaced and better is up; bars reach down to the worst prompt. Dashed: the
 * same preset against the int4 baseline. FP8MOE_GNUPLOT names another gnuplot binary (tests use it). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/parity.h"
#include "util/file.h"
#include "util/status.h"

/* 1 - cosine where the log scale can draw it; NaN (gnuplot skips the point) for an exact 1 or non-finite logits */
static double distance(double cosine) {
    const double d = 1.0 - cosine;
    return isfinite(d) && d > 0 ? d : NAN;
}

static void shell_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputs("'\\''", f);
        else fputc(*s, f);
    }
    fputc('\'', f);
}

/* gnuplot single-quoted string: no escapes, a quote is doubled */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static bool gnuplot_found(const char *gp) {
    char *cmd = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&cmd, &n);
    if (!f) return false;
    fputs("command -v ", f);
    shell_quote(f, gp);
    fputs(" >/dev/null 2>&1", f);
    fclose(f);
    const bool ok = system(cmd) == 0;
    free(cmd);
    return ok;
}

/* The series: per shown preset (the oracle's own row is 1 and has no point), against fp32 and against int4. */
typedef struct series {
    int cell;
    bool vs_int4;
} series;

static int list_series(const parity_report *r, series *out) {
    int n = 0;
    for (int i = 1; i < r->n_cells; i++) {
        const parity_cell *c0 = parity_at(r, 0, i);
        if (!c0->listed) continue;
        for (int against = 0; against < 2; against++) {
            if (against == 1 && i == r->baseline) continue; /* int4 against itself */
            bool any = false;
            for (int d = 0; d < r->n_depths; d++) {
                const parity_cell *c = parity_at(r, d, i);
                any |= !isnan(distance(against ? c->int4_mean.cosine : c->fp32_mean.cosine));
            }
            if (any) out[n++] = (series){i, against == 1};
        }
    }
    return n;
}

/* last non-empty line of gnuplot's output: where it names the script line and the error */
static void last_line(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    char line[512];
    out[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0]) snprintf(out, cap, "%s", line);
    }
    if (f) fclose(f);
}

static void write_script(FILE *f, const parity_report *r, const series *s, int n_series, const char *png,
                         const char *dat) {
    double lo = 1 - PARITY_GATE, hi = 1 - PARITY_GATE;
    for (int j = 0; j < n_series; j++)
        for (int d = 0; d < r->n_depths; d++) {
            const parity_cell *c = parity_at(r, d, s[j].cell);
            const double m = distance(s[j].vs_int4 ? c->int4_mean.cosine : c->fp32_mean.cosine);
            const double w = distance(s[j].vs_int4 ? c->int4_worst.cosine : c->fp32_worst.cosine);
            if (!isnan(m)) lo = m < lo ? m : lo, hi = m > hi ? m : hi;
            if (!isnan(w)) hi = w > hi ? w : hi;
        }
    lo /= 3, hi = hi * 3 > 1 ? 1 : hi * 3;
    const double x0 = r->depths[0], x1 = r->depths[r->n_depths - 1];
    fputs("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1100,700 noenhanced font ',11' } "
          "else { set terminal png size 1100,700 noenhanced }\n",
          f);
    fputs("set output ", f), gp_quote(f, png), fputc('\n', f);
    char title[1024];
    snprintf(title, sizeof title,
             "fp8moe parity: %s%s, T = %lld tokens x %d prompt%s; presets on %s, oracle fp32 on %s", r->model,
             r->synthetic ? " (synthetic)" : "", (long long)r->tokens, r->prompts, r->prompts > 1 ? "s" : "",
             r->backend, r->oracle_backend);
    fputs("set title ", f), gp_quote(f, title), fputc('\n', f);
    fputs("set xlabel 'decoder layers run (then the final norm and lm_head)'\n", f);
    fprintf(f, "set ylabel 'logits cosine (mean over prompts; bars: worst)'\n");
    fprintf(f, "set logscale x 2\nset xrange [%g:%g]\nset xtics (", x0 / 1.4, x1 * 1.4);
    for (int d = 0; d < r->n_depths; d++) fprintf(f, "%s%d", d ? ", " : "", r->depths[d]);
    fprintf(f, ")\nset logscale y\nset yrange [%g:%g]\nset ytics (", hi, lo); /* reversed: better is up */
    fprintf(f, "'%.3f' %g", PARITY_GATE, 1 - PARITY_GATE);
    for (int e = 0; e <= 9; e++) {
        const double v = pow(10.0, -e);
        if (v >= lo && v <= hi) fprintf(f, ", '%.*f' %g", e, 1.0 - v, v);
    }
    fputs(")\nset grid\nset key bottom left box opaque\nset datafile missing 'NaN'\n", f);
    fprintf(f, "plot %g with lines dt 2 lw 2 lc rgb 'red' title 'gate %.3f'", 1 - PARITY_GATE, PARITY_GATE);
    for (int j = 0; j < n_series; j++) {
        const parity_cell *c = parity_at(r, 0, s[j].cell);
        char t[128];
        snprintf(t, sizeof t, "%s on %s vs %s", fm_preset_name(c->preset), c->backend, s[j].vs_int4 ? "int4" : "fp32");
        fputs(", \\\n     ", f), gp_quote(f, dat);
        fprintf(f, " index %d using 1:2:3:4 with yerrorlines lw 2 pt 7 lc %d dt %d title ", j, s[j].cell,
                s[j].vs_int4 ? 2 : 1);
        gp_quote(f, t);
    }
    fputc('\n', f);
}

static void write_data(FILE *f, const parity_report *r, const series *s, int n_series) {
    for (int j = 0; j < n_series; j++) {
        fprintf(f, "# series %d: layers, 1 - mean cosine, 1 - mean cosine, 1 - worst cosine\n", j);
        for (int d = 0; d < r->n_depths; d++) {
            const parity_cell *c = parity_at(r, d, s[j].cell);
            const double m = distance(s[j].vs_int4 ? c->int4_mean.cosine : c->fp32_mean.cosine);
            const double w = distance(s[j].vs_int4 ? c->int4_worst.cosine : c->fp32_worst.cosine);
            fprintf(f, "%d %.9g %.9g %.9g\n", r->depths[d], m, m, isnan(w) ? m : w);
        }
        fputs("\n\n", f); /* gnuplot's index separator */
    }
}

fm_status parity_write_plot(const parity_report *r, const char *path, bool *skipped, fm_error *err) {
    const char *gp = getenv("FP8MOE_GNUPLOT");
    if (!gp || !*gp) gp = "gnuplot";
    *skipped = false;
    fm_status cst = fm_check_output_path(path, err); /* gnuplot would write into a FIFO or device */
    if (cst) return cst;
    if (!gnuplot_found(gp)) {
        fprintf(stderr, "fp8moe parity: gnuplot not found ('%s'): %s not written (install gnuplot-nox for the plot)\n",
                gp, path);
        *skipped = true;
        return FM_OK;
    }
    const size_t len = strlen(path) + 48;
    char *png = malloc(len), *dat = malloc(len), *gps = malloc(len), *log = malloc(len);
    series *s = malloc((size_t)(r->n_cells * 2 + 1) * sizeof *s);
    fm_status st = png && dat && gps && log && s ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    if (!st) {
        const long pid = (long)getpid();
        snprintf(png, len, "%s.tmp.%ld", path, pid);
        snprintf(dat, len, "%s.tmp.%ld.dat", path, pid);
        snprintf(gps, len, "%s.tmp.%ld.gp", path, pid);
        snprintf(log, len, "%s.tmp.%ld.log", path, pid);
        const int n_series = list_series(r, s);
        FILE *fd = fopen(dat, "w"), *fs = fd ? fopen(gps, "w") : NULL;
        if (fd) write_data(fd, r, s, n_series);
        if (fs) write_script(fs, r, s, n_series, png, dat);
        bool ok = fd && fs;
        if (fd) ok &= fclose(fd) == 0;
        if (fs) ok &= fclose(fs) == 0;
        if (!ok)
            st = fm_fail(err, FM_ERR_IO, "%s: cannot write the plot's files next to it: %s", path, strerror(errno));
    }
    if (!st) {
        char *cmd = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&cmd, &n);
        if (!f) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
        else {
            shell_quote(f, gp), fputc(' ', f), shell_quote(f, gps), fputs(" >", f), shell_quote(f, log),
                fputs(" 2>&1", f);
            fclose(f);
            const int rc = system(cmd);
            free(cmd);
            if (rc != 0 || access(png, F_OK) != 0) {
                char why[512];
                last_line(log, why, sizeof why);
                st = fm_fail(err, FM_ERR_IO, "%s: gnuplot failed (%s)", path, why[0] ? why : "no message");
            } else if (rename(png, path) != 0) {
                st = fm_fail(err, FM_ERR_IO, "%s: cannot write output file: %s", path, strerror(errno));
            }
        }
    }
    if (png && dat && gps && log) unlink(png), unlink(dat), unlink(gps), unlink(log);
    free(png), free(dat), free(gps), free(log), free(s);
    return st;
}
