/* W4A8 weight formats whose group scale folds into the e4m3 operand: a CPU study, before any kernel.
 *
 *   make -C lab w4a8_fold_study && ./build/lab/w4a8_fold_study [model.safetensors]
 *
 * Part 1, quantization: the relative error of W (and of y = W x) for
 *   g128       today's int4 format: q in -7..7, one bf16 scale per (row, 128-group), rounded up (fm_int4_quantize)
 *   g128-f32   the same with exact fp32 group scales (what the bf16 rounding costs)
 *   p2         q in -7..7 times 2^k (k in 0..12, one per (row, 128-group)) under one fp32 scale per row: q 2^k is
 *              exact in e4m3 (|q| 2^(k-6) is a normal e4m3 value <= 448), so the kernel's operand is exact
 *   p2-search  p2 with the row scale searched over 16 fractional octaves and each group's k lowered by one where
 *              clipping its largest element costs less than the coarser step
 *   e4m3-g     the group scale an e4m3 value under one fp32 scale per row, folded: operand e4m3(q x s_g), which
 *              rounds q x s_g to 4 significant bits
 * on synthetic rows at Qwen3-30B-A3B widths (gaussian, a log-normal spread of row and group scales, 0.1 % outliers)
 * and, when a safetensors file is given, on its expert matrices (bf16).
 *
 * Part 3 compares e4m3 activations with one scale per 1x128 group (today) and one per token (what a fold of both
 * sides needs), on gaussian rows and rows with outlier channels.
 *
 * Part 2, accumulation: y[m][n] = sum_k w[m][k] a[n][k] with e4m3 activations, accumulated as the FP8 wgmma does,
 * with the accumulator promoted to fp32 every P 128-groups; the error against the exact (double) sum of the same
 * quantized operands, at K = 768, 2048, 4096, 14336. The tensor-core model (tc_add): products are exact; per block of
 * TC_BLOCK products the block and the running accumulator are aligned to the largest exponent among them and each
 * term is truncated toward zero to TC_FRAC fraction bits below it, then summed exactly (the accumulator keeps ~14
 * significant bits, as DeepSeek-V3's report says of Hopper's FP8 MMA, and as the seventeenth session's in-place
 * accumulator measured against the CPU emulation; the block size is an assumption, printed with the results).
 *   today (g128)      a 128-group per promotion (P = 1), acc += part x (w scale x 512) x (a scale): 2 fp32 ops
 *   p2, a per group   the weight's 2^k in the operand, the activation's 1x128 scale at each promotion (P = 1, 1 op)
 *   p2, a per token   both scales out of the loop: acc += part every P groups (a plain add), scales in the epilogue
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/bf16.h"
#include "quant/e4m3.h"
#include "quant/int4.h"

#define G 128
#define TC_FRAC 13
#define TC_BLOCK 16

/* ---- random numbers ---------------------------------------------------------------------------------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double nrand(void) { return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()); }

/* rows of K: N(0,1) x row scale (log-normal 0.3) x group scale (log-normal 0.35), 0.1 % outliers x 6 */
static void synth_weights(float *w, int64_t rows, int64_t K) {
    for (int64_t r = 0; r < rows; r++) {
        const double rs = 0.02 * exp(0.3 * nrand());
        for (int64_t g = 0; g * G < K; g++) {
            const double gs = rs * exp(0.35 * nrand());
            for (int64_t k = g * G; k < (g + 1) * G && k < K; k++)
                w[r * K + k] = (float)(gs * nrand() * (urand() < 0.001 ? 6.0 : 1.0));
        }
    }
}

/* activations: N(0,1) per element, a log-normal scale per token, 1 % of channels x 20 (the outlier channels of LLM
   activations) */
static void synth_acts(float *x, int64_t n, int64_t K, const uint8_t *outlier) {
    for (int64_t i = 0; i < n; i++) {
        const double ts = exp(0.5 * nrand());
        for (int64_t k = 0; k < K; k++) x[i * K + k] = (float)(ts * nrand() * (outlier[k] ? 20.0 : 1.0));
    }
}

/* ---- the weight formats: each writes the dequantized row (what the GEMM multiplies) ------------------------- */
static void quant_g128(const float *w, int64_t K, bool f32_scales, float *out) {
    const int64_t ng = (K + G - 1) / G;
    int8_t *q = malloc((size_t)K);
    float *s = malloc((size_t)ng * sizeof *s);
    const fm_int4_params p = {G, true, FM_SCALE_BF16};
    fm_int4_quantize(w, 1, K, &p, q, s, NULL);
    for (int64_t g = 0; g < ng; g++) {
        float amax = 0.0f;
        for (int64_t k = g * G; k < (g + 1) * G && k < K; k++) amax = fmaxf(amax, fabsf(w[k]));
        const float sc = f32_scales ? amax / 7.0f : s[g];
        for (int64_t k = g * G; k < (g + 1) * G && k < K; k++) {
            const float v = sc > 0.0f ? nearbyintf(w[k] / sc) : 0.0f;
            out[k] = (f32_scales ? fmaxf(-7.0f, fminf(7.0f, v)) : (float)q[k]) * sc;
        }
    }
    free(q);
    free(s);
}

#define P2_KMAX 12 /* |q| 2^(k - 6) <= 7 x 2^6 = 448: the largest e4m3 value */

/* squared error of one group quantized with step sc (q in -7..7), the dequantized values into out when given */
static double group_sse(const float *w, int64_t n, double sc, float *out) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = nearbyint(w[i] / sc);
        v = v < -7 ? -7 : v > 7 ? 7 : v;
        const double d = v * sc - w[i];
        e += d * d;
        if (out) out[i] = (float)(v * sc);
    }
    return e;
}

/* p2: step = s_row x 2^k, k in 0..P2_KMAX per group. search: s_row over 16 fractional octaves, k or k - 1. */
static double quant_p2_row(const float *w, int64_t K, bool search, float *out) {
    const int64_t ng = (K + G - 1) / G;
    double amax_row = 0.0;
    for (int64_t k = 0; k < K; k++) amax_row = fmax(amax_row, fabs(w[k]));
    if (amax_row == 0.0) {
        memset(out, 0, (size_t)K * sizeof *out);
        return 0.0;
    }
    double best = INFINITY, best_s = 0.0;
    for (int j = 0; j < (search ? 16 : 1); j++) {
        const double s = amax_row / 7.0 * pow(2.0, -P2_KMAX + j / 16.0); /* the largest group: k = 12 */
        double e = 0.0;
        for (int64_t g = 0; g < ng; g++) {
            const int64_t k0 = g * G, n = K - k0 < G ? K - k0 : G;
            double a = 0.0;
            for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(w[k0 + i]));
            int k = a > 0.0 ? (int)ceil(log2(a / 7.0 / s) - 1e-12) : 0;
            k = k < 0 ? 0 : k > P2_KMAX ? P2_KMAX : k;
            double eg = group_sse(w + k0, n, s * ldexp(1.0, k), NULL);
            if (search && k > 0) eg = fmin(eg, group_sse(w + k0, n, s * ldexp(1.0, k - 1), NULL));
            e += eg;
        }
        if (e < best) best = e, best_s = s;
    }
    for (int64_t g = 0; g < ng; g++) { /* the chosen scale again, writing the values */
        const int64_t k0 = g * G, n = K - k0 < G ? K - k0 : G;
        double a = 0.0;
        for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(w[k0 + i]));
        int k = a > 0.0 ? (int)ceil(log2(a / 7.0 / best_s) - 1e-12) : 0;
        k = k < 0 ? 0 : k > P2_KMAX ? P2_KMAX : k;
        const double e0 = group_sse(w + k0, n, best_s * ldexp(1.0, k), NULL);
        if (search && k > 0 && group_sse(w + k0, n, best_s * ldexp(1.0, k - 1), NULL) < e0) k--;
        group_sse(w + k0, n, best_s * ldexp(1.0, k), out + k0);
    }
    return best_s;
}

/* e4m3-g: s_row = amax_row / 64; s_g = the e4m3 value >= (group amax / 7) / s_row; operand e4m3(q s_g) */
static void quant_e4m3g_row(const float *w, int64_t K, float *out) {
    double amax_row = 0.0;
    for (int64_t k = 0; k < K; k++) amax_row = fmax(amax_row, fabs(w[k]));
    const double s = amax_row / 64.0;
    for (int64_t g0 = 0; g0 < K; g0 += G) {
        const int64_t n = K - g0 < G ? K - g0 : G;
        double a = 0.0;
        for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(w[g0 + i]));
        if (a == 0.0 || s == 0.0) {
            for (int64_t i = 0; i < n; i++) out[g0 + i] = 0.0f;
            continue;
        }
        uint8_t c = fm_f32_to_e4m3((float)(a / 7.0 / s));
        if (fm_e4m3_to_f32(c) < a / 7.0 / s) c++;
        const double sg = fm_e4m3_to_f32(c);
        for (int64_t i = 0; i < n; i++) {
            double v = nearbyint(w[g0 + i] / (s * sg));
            v = v < -7 ? -7 : v > 7 ? 7 : v;
            out[g0 + i] = (float)(s * fm_e4m3_to_f32(fm_f32_to_e4m3((float)(v * sg))));
        }
    }
}

/* g128 with fp32 scales and the same clipping search as p2-search: amax / 7 x (1, 15/16, .. 12/16), least error */
static void quant_g128_search_row(const float *w, int64_t K, float *out) {
    for (int64_t g0 = 0; g0 < K; g0 += G) {
        const int64_t n = K - g0 < G ? K - g0 : G;
        double a = 0.0, best = INFINITY, bs = 0.0;
        for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(w[g0 + i]));
        if (a == 0.0) {
            memset(out + g0, 0, (size_t)n * sizeof *out);
            continue;
        }
        for (int j = 16; j >= 12; j--) {
            const double e = group_sse(w + g0, n, a / 7.0 * j / 16.0, NULL);
            if (e < best) best = e, bs = a / 7.0 * j / 16.0;
        }
        group_sse(w + g0, n, bs, out + g0);
    }
}

enum { F_G128, F_G128_F32, F_G128_SEARCH, F_P2, F_P2_SEARCH, F_E4M3G, F_COUNT };
static const char *fname[F_COUNT] = {"g128 (today)", "g128-f32", "g128-search", "p2", "p2-search", "e4m3-g"};

static void quant_matrix(int f, const float *w, int64_t rows, int64_t K, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * K;
        float *o = out + r * K;
        if (f == F_G128 || f == F_G128_F32) quant_g128(wr, K, f == F_G128_F32, o);
        else if (f == F_G128_SEARCH) quant_g128_search_row(wr, K, o);
        else if (f == F_P2 || f == F_P2_SEARCH) quant_p2_row(wr, K, f == F_P2_SEARCH, o);
        else quant_e4m3g_row(wr, K, o);
    }
}

/* relative errors of W and of y = W x (x: n rows of e4m3 1x128-quantized activations, the same for every format) */
static void weight_errors(const float *w, const float *wq, int64_t rows, int64_t K, const float *x, int64_t n,
                          double *ew, double *ey) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < rows * K; i++) num += (double)(wq[i] - w[i]) * (wq[i] - w[i]), den += (double)w[i] * w[i];
    *ew = sqrt(num / den);
    num = den = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < n; t++) {
            double y = 0.0, yq = 0.0;
            for (int64_t k = 0; k < K; k++)
                y += (double)w[r * K + k] * x[t * K + k], yq += (double)wq[r * K + k] * x[t * K + k];
            num += (yq - y) * (yq - y), den += y * y;
        }
    *ey = sqrt(num / den);
}

static void part1_matrix(const char *what, const float *w, int64_t rows, int64_t K) {
    const int64_t n = 16;
    float *x = malloc((size_t)(n * K) * sizeof *x), *wq = malloc((size_t)(rows * K) * sizeof *wq);
    uint8_t *outl = malloc((size_t)K);
    for (int64_t k = 0; k < K; k++) outl[k] = urand() < 0.01;
    synth_acts(x, n, K, outl);
    printf("| %s | %lld x %lld |", what, (long long)rows, (long long)K);
    for (int f = 0; f < F_COUNT; f++) {
        double ew, ey;
        quant_matrix(f, w, rows, K, wq);
        weight_errors(w, wq, rows, K, x, n, &ew, &ey);
        printf(" %.4f / %.4f |", ew, ey);
    }
    printf("\n");
    free(x), free(wq), free(outl);
}

/* ---- part 1 on a checkpoint's experts (bf16 safetensors; a minimal header scan, enough for the bundled file) - */
static void part1_checkpoint(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return;
    }
    uint64_t hl = 0;
    if (fread(&hl, 8, 1, f) != 1 || hl > (1u << 26)) return;
    char *h = malloc(hl + 1);
    if (fread(h, 1, hl, f) != hl) return;
    h[hl] = 0;
    const char *kinds[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int kind = 0; kind < 3; kind++) {
        /* every expert matrix of this kind, concatenated by rows (they share a shape) */
        float *all = NULL;
        int64_t rows_all = 0, K = 0;
        for (const char *p = h; (p = strstr(p, "mlp.experts.")) != NULL; p++) {
            const char *end = strchr(p, '"');
            if (!end || !strstr(p, kinds[kind]) || strstr(p, kinds[kind]) > end) continue;
            const char *sh = strstr(end, "\"shape\""), *off = strstr(end, "\"data_offsets\"");
            long long r, c, o0, o1;
            if (!sh || !off || sscanf(strchr(sh, '[') + 1, "%lld , %lld", &r, &c) != 2 ||
                sscanf(strchr(off, '[') + 1, "%lld , %lld", &o0, &o1) != 2 || o1 - o0 != r * c * 2)
                continue;
            K = c;
            all = realloc(all, (size_t)((rows_all + r) * c) * sizeof *all);
            uint16_t *raw = malloc((size_t)(o1 - o0));
            fseek(f, (long)(8 + hl + o0), SEEK_SET);
            if (fread(raw, 1, (size_t)(o1 - o0), f) != (size_t)(o1 - o0)) break;
            for (long long i = 0; i < r * c; i++) all[rows_all * c + i] = fm_bf16_to_f32(raw[i]);
            free(raw);
            rows_all += r;
        }
        if (rows_all) {
            char what[64];
            snprintf(what, sizeof what, "checkpoint %s", kinds[kind]);
            part1_matrix(what, all, rows_all, K);
        }
        free(all);
    }
    free(h);
    fclose(f);
}

/* ---- part 2: the tensor core's accumulation -------------------------------------------------------------------- */
static double trunc_to(double v, double ulp) { return trunc(v / ulp) * ulp; }

/* acc + sum of n exact products, as the FP8 MMA adds them (see the top comment) */
static double tc_add(double acc, const double *t, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += TC_BLOCK) {
        const int64_t i1 = i0 + TC_BLOCK < n ? i0 + TC_BLOCK : n;
        double mx = fabs(acc);
        for (int64_t i = i0; i < i1; i++) mx = fmax(mx, fabs(t[i]));
        if (mx == 0.0) continue;
        int e;
        frexp(mx, &e); /* mx in [2^(e-1), 2^e) */
        const double ulp = ldexp(1.0, e - 1 - TC_FRAC);
        double s = trunc_to(acc, ulp);
        for (int64_t i = i0; i < i1; i++) s += trunc_to(t[i], ulp);
        acc = (double)(float)s; /* the accumulator register is fp32 */
    }
    return acc;
}

/* y = sum over K of the operands as the kernels hold them; err against the exact sum of the same operands.
   mode 0: today (codes q / 512, per-group scales of both sides at each group's promotion)
   mode 1: p2 weights, activations per 1x128 group (promotion every group: part x a scale)
   mode 2: p2 weights, activations per token (promotion every P groups: a plain add) */
static double part2_error(int64_t K, int mode, int P) {
    const int64_t M = 64, N = 16, ng = K / G;
    float *w = malloc((size_t)(M * K) * sizeof *w), *x = malloc((size_t)(N * K) * sizeof *x);
    uint8_t *outl = malloc((size_t)K);
    for (int64_t k = 0; k < K; k++) outl[k] = urand() < 0.01;
    synth_weights(w, M, K);
    synth_acts(x, N, K, outl);
    /* weights: operand op[m][k] (what the MMA multiplies) and the scale outside it */
    double *op = malloc((size_t)(M * K) * sizeof *op), *wsc = malloc((size_t)(M * ng) * sizeof *wsc);
    for (int64_t m = 0; m < M; m++) {
        if (mode == 0) {
            int8_t *q = malloc((size_t)K);
            float *s = malloc((size_t)ng * sizeof *s);
            const fm_int4_params p = {G, true, FM_SCALE_BF16};
            fm_int4_quantize(w + m * K, 1, K, &p, q, s, NULL);
            for (int64_t k = 0; k < K; k++) op[m * K + k] = q[k] / 512.0;
            for (int64_t g = 0; g < ng; g++) wsc[m * ng + g] = s[g] * 512.0;
            free(q), free(s);
        } else {
            float *deq = malloc((size_t)K * sizeof *deq);
            const double s = quant_p2_row(w + m * K, K, true, deq);
            /* q 2^(k-6), an e4m3 value: deq / s carries the float rounding of q s 2^k, which the e4m3 rounding undoes
             */
            for (int64_t k = 0; k < K; k++) op[m * K + k] = fm_e4m3_to_f32(fm_f32_to_e4m3((float)(deq[k] / s / 64.0)));
            for (int64_t g = 0; g < ng; g++) wsc[m * ng + g] = s * 64.0;
            free(deq);
        }
    }
    /* activations: e4m3 codes and their scale, per group (modes 0, 1) or per token (mode 2) */
    double *a = malloc((size_t)(N * K) * sizeof *a), *asc = malloc((size_t)(N * ng) * sizeof *asc);
    uint8_t *codes = malloc((size_t)K);
    float *sc = malloc((size_t)ng * sizeof *sc);
    for (int64_t n = 0; n < N; n++) {
        if (mode == 2) {
            float amax = 0.0f;
            for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[n * K + k]));
            const float s = fmaxf(amax / FM_E4M3_MAX, FM_ACT_SCALE_FLOOR);
            for (int64_t k = 0; k < K; k++) a[n * K + k] = fm_e4m3_to_f32(fm_f32_to_e4m3(x[n * K + k] / s));
            for (int64_t g = 0; g < ng; g++) asc[n * ng + g] = s;
        } else {
            fm_e4m3_quantize_groups(x + n * K, K, G, codes, sc);
            for (int64_t k = 0; k < K; k++) a[n * K + k] = fm_e4m3_to_f32(codes[k]);
            for (int64_t g = 0; g < ng; g++) asc[n * ng + g] = sc[g];
        }
    }
    double num = 0.0, den = 0.0, *t = malloc((size_t)K * sizeof *t);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double exact = 0.0;
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                t[k] = op[m * K + k] * a[n * K + k]; /* exact: <= 7 and 4 significant bits */
                exact += t[k] * wsc[m * ng + k / G] * asc[n * ng + k / G];
            }
            for (int64_t g0 = 0; g0 < ng; g0 += P) {
                const int64_t g1 = g0 + P < ng ? g0 + P : ng;
                const float part = (float)tc_add(0.0, t + g0 * G, (g1 - g0) * G);
                if (mode == 0) acc = fmaf(part, (float)(wsc[m * ng + g0] * asc[n * ng + g0]), acc);
                else if (mode == 1) acc = fmaf(part, (float)asc[n * ng + g0], acc);
                else acc += part;
            }
            const double y = mode == 0 ? acc : (double)acc * wsc[m * ng] * (mode == 2 ? asc[n * ng] : 1.0);
            num += (y - exact) * (y - exact), den += exact * exact;
        }
    free(w), free(x), free(outl), free(op), free(wsc), free(a), free(asc), free(codes), free(sc), free(t);
    return sqrt(num / den);
}

/* Part 3: what one scale per token costs the activations: the relative RMS error of e4m3(x / s) s with s per
   1x128 group (today) and per token, on rows with outlier channels (x20 on 1 %) and without */
static void part3(int64_t K, bool outliers, double *e_group, double *e_token) {
    const int64_t N = 64;
    float *x = malloc((size_t)(N * K) * sizeof *x), *sc = malloc((size_t)(K / G) * sizeof *sc);
    uint8_t *outl = malloc((size_t)K), *codes = malloc((size_t)K);
    for (int64_t k = 0; k < K; k++) outl[k] = outliers && urand() < 0.01;
    synth_acts(x, N, K, outl);
    double ng = 0.0, nt = 0.0, den = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * K;
        fm_e4m3_quantize_groups(xr, K, G, codes, sc);
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(xr[k]));
        const float st = fmaxf(amax / FM_E4M3_MAX, FM_ACT_SCALE_FLOOR);
        for (int64_t k = 0; k < K; k++) {
            const double dg = (double)fm_e4m3_to_f32(codes[k]) * sc[k / G] - xr[k];
            const double dt = (double)fm_e4m3_to_f32(fm_f32_to_e4m3(xr[k] / st)) * st - xr[k];
            ng += dg * dg, nt += dt * dt, den += (double)xr[k] * xr[k];
        }
    }
    *e_group = sqrt(ng / den), *e_token = sqrt(nt / den);
    free(x), free(sc), free(outl), free(codes);
}

int main(int argc, char **argv) {
    printf("## Part 1: quantization error, relative RMS of W / of y = W x (x: 16 e4m3-quantized rows)\n\n");
    printf("| matrix | rows x K |");
    for (int f = 0; f < F_COUNT; f++) printf(" %s |", fname[f]);
    printf("\n|---|---|");
    for (int f = 0; f < F_COUNT; f++) printf("---|");
    printf("\n");
    const int64_t Ks[4] = {768, 2048, 4096, 14336};
    for (int i = 0; i < 4; i++) {
        const int64_t rows = 128;
        float *w = malloc((size_t)(rows * Ks[i]) * sizeof *w);
        synth_weights(w, rows, Ks[i]);
        part1_matrix("synthetic", w, rows, Ks[i]);
        free(w);
    }
    if (argc > 1) part1_checkpoint(argv[1]);

    printf("\n## Part 2: accumulation error (relative RMS against the exact sum of the same operands)\n");
    printf("tensor-core model: blocks of %d products aligned with the accumulator, %d fraction bits, truncated\n\n",
           TC_BLOCK, TC_FRAC);
    printf("| K | today (P = 1) | p2, a per group (P = 1) | p2, a per token: P = 1 | 2 | 4 | 8 | all |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 4; i++) {
        const int64_t K = Ks[i];
        printf("| %lld | %.2e | %.2e |", (long long)K, part2_error(K, 0, 1), part2_error(K, 1, 1));
        const int Ps[5] = {1, 2, 4, 8, (int)(K / G)};
        for (int j = 0; j < 5; j++) printf(" %.2e |", part2_error(K, 2, Ps[j]));
        printf("\n");
        fflush(stdout);
    }

    printf("\n## Part 3: e4m3 activations, relative RMS error: one scale per 1x128 group / per token\n\n");
    printf("| K | gaussian rows | rows with 1 %% outlier channels x20 |\n|---:|---:|---:|\n");
    for (int i = 0; i < 4; i++) {
        double g0, t0, g1, t1;
        part3(Ks[i], false, &g0, &t0);
        part3(Ks[i], true, &g1, &t1);
        printf("| %lld | %.4f / %.4f | %.4f / %.4f |\n", (long long)Ks[i], g0, t0, g1, t1);
    }
    return 0;
}
