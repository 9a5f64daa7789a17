/* Lab: the host work of loading a checkpoint in our own int4 format, per byte, outside the engine.
 *
 * For every pre-quantized Linear of DIR (as the binder finds them) it writes the int4 row layout the CUDA backend
 * uploads (quant/int4_repack.h) three ways, checks that the three agree byte for byte, then times each over the
 * whole checkpoint (best of R repeats) and prints GB/s of checkpoint bytes (packed codes + scales):
 *   v0  decoded, one thread: the loader before (codes unpacked to bytes, zero points checked, repacked)
 *   v1  direct, one thread: compressed-tensors words xored into place, scales copied
 *   v2  direct, every thread (OpenMP over the sources): what the loader runs now
 * and the scan for codes of -8 that picks a bank's format (quant/int4_native.h), on one thread and on all.
 * The output is one pre-touched buffer of the whole bank size, as a load writes fresh staging, not a cached one.
 *
 * Build and run (from the repository root, after `make NVCC= BUILD=build/cpu build/cpu/libfp8moe.a`):
 *   cc -std=c11 -D_DEFAULT_SOURCE -O2 -fopenmp -Iinclude -Isrc lab/int4_rows.c build/cpu/libfp8moe.a \
 *      -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -o build/cpu/int4_rows && build/cpu/int4_rows DIR [R]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/config.h"
#include "model/arch.h"
#include "model/model_src.h"
#include "quant/int4_native.h"
#include "quant/int4_repack.h"

typedef struct job {
    const fm_wsrc *w;
    int64_t ng, ld;
    size_t out; /* offset of its rows in the output */
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run(const job *jobs, int64_t n, uint8_t *codes, uint16_t *scales, int version) {
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bad) if (version == 2)
    for (int64_t i = 0; i < n; i++) {
        const job *j = &jobs[i];
        fm_error err;
        uint8_t *c = codes + j->out;
        uint16_t *s = scales + j->out / (size_t)j->ld * (size_t)j->ng;
        fm_status st =
            version == 0
                ? fm_int4_native_rows_decoded(&j->w->q, j->w->rows, j->w->cols, j->ng, c, j->ld, s, "lab", &err)
                : fm_int4_native_rows(&j->w->q, j->w->rows, j->w->cols, j->ng, c, j->ld, s, "lab", &err);
        if (st) fprintf(stderr, "%s\n", err.msg), bad++;
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: int4_rows DIR [repeats]\n"), 2;
    const int R = argc > 2 ? atoi(argv[2]) : 3;
    fm_config cfg;
    fm_st_set set = {0};
    fm_model_src src;
    fm_error err;
    if (fm_config_load(argv[1], &cfg, &err) || fm_st_open_dir(argv[1], &set, &err) ||
        fm_model_src_bind(&cfg, &set, &src, &err))
        return fprintf(stderr, "%s\n", err.msg), 1;
    /* every quantized view of every layer, in load order */
    int64_t n = 0, cap = 1024;
    job *jobs = malloc((size_t)cap * sizeof *jobs);
    size_t out_bytes = 0, ckpt = 0;
    const fm_arch_desc *a = fm_arch_of(&cfg);
    for (int l = 0; l < cfg.n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, &cfg, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *s = &d->specs[i];
            if (!fm_wfamily_is_linear(s->family) || !fm_spec_present(s, &cfg)) continue;
            for (int32_t p = 0; p < s->n_parts; p++) {
                const fm_wsrc *v = fm_layer_src_cviews(&src.layers[l], s->parts[p].slot);
                for (int32_t e = 0; e < fm_spec_count(s, &cfg); e++) {
                    if (!fm_wsrc_is_quantized(&v[e]) || !fm_qsrc_native_layout(&v[e].q, v[e].cols)) continue;
                    if (n == cap) jobs = realloc(jobs, (size_t)(cap *= 2) * sizeof *jobs);
                    const int64_t ld = (v[e].cols + 31) / 32 * 16;
                    jobs[n++] = (job){&v[e], (v[e].cols + 127) / 128, ld, out_bytes};
                    out_bytes += (size_t)(v[e].rows * ld);
                    ckpt += v[e].q.packed->nbytes + v[e].q.scales->nbytes;
                }
            }
        }
    }
    if (!n) return fprintf(stderr, "%s: no int4 linear in our own format\n", argv[1]), 1;
    uint8_t *ref = malloc(out_bytes), *codes = malloc(out_bytes);
    uint16_t *ref_s = calloc(out_bytes / 16 + 1, 2), *scales = calloc(out_bytes / 16 + 1, 2);
    memset(ref, 0, out_bytes), memset(codes, 1, out_bytes); /* touched: no page fault is timed */
    printf("%s: %lld int4 linears, %.3f GB of checkpoint (codes + scales), %d threads\n", argv[1], (long long)n,
           (double)ckpt / 1e9, omp_get_max_threads());
    if (run(jobs, n, ref, ref_s, 0)) return 1;
    const char *names[3] = {"v0 decoded, 1 thread", "v1 direct, 1 thread", "v2 direct, all threads"};
    for (int v = 0; v < 3; v++) {
        double best = 1e30;
        for (int r = 0; r < R; r++) {
            memset(codes, r + 2, out_bytes);
            const double t0 = now();
            if (run(jobs, n, codes, scales, v)) return 1;
            const double t = now() - t0;
            best = t < best ? t : best;
            if (memcmp(codes, ref, out_bytes) || memcmp(scales, ref_s, (out_bytes / 16 + 1) * 2))
                return fprintf(stderr, "%s: rows differ from v0\n", names[v]), 1;
        }
        printf("  %-24s %8.3f s  %7.2f GB/s  (identical to v0)\n", names[v], best, (double)ckpt / 1e9 / best);
    }
    for (int threads = 1; threads <= 2; threads++) { /* the format scan: one thread, then all */
        double best = 1e30;
        for (int r = 0; r < R; r++) {
            const double t0 = now();
            int minus8 = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : minus8) if (threads == 2)
            for (int64_t i = 0; i < n; i++)
                minus8 += fm_qsrc_native_int4(&jobs[i].w->q, jobs[i].w->rows, jobs[i].w->cols) == FM_NATIVE_MINUS8;
            const double t = now() - t0;
            best = t < best ? t : best;
            if (minus8) printf("  (%d linears have a code of -8)\n", minus8);
        }
        printf("  %-24s %8.3f s  %7.2f GB/s\n", threads == 1 ? "scan, 1 thread" : "scan, all threads", best,
               (double)ckpt / 1e9 / best);
    }
    free(ref), free(codes), free(ref_s), free(scales), free(jobs);
    fm_model_src_free(&src);
    fm_st_close(&set);
    return 0;
}
