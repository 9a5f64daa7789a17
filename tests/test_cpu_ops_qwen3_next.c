/* Qwen3-Next's CPU reference ops (src/backend/cpu/cpu_gdn.c, cpu_gated_attention.c) against naive double-precision
 * references written here, and against each other: the chunked gated delta rule (prefill) equals the recurrent step
 * applied token by token (decode) at T = 1, 63, 64, 65 and 1000 (chunks of 64: below, at, just past a boundary, and
 * many), outputs and final states, to fp32 rounding. Random non-zero inputs, fixed seeds, odd head sizes (dk 16,
 * dv 12, 2 key heads for 4 value heads); outputs poisoned with NaN first. Kept beside tests/test_cpu_ops.c (which is
 * near the size a file should stay under). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }
static double urand(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static float nzrand(float a) {
    for (;;) {
        const float v = (float)((2.0 * urand() - 1.0) * a);
        if (fabsf(v) >= a / 100) return v;
    }
}
static float *rand_array(int64_t n, float a) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = nzrand(a);
    return p;
}
static float *nan_array(int64_t n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n ? n : 1), sizeof *p);
    assert_non_null(p);
    return p;
}
static double rel_err(const float *y, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]), den += ref[i] * ref[i];
    return sqrt(num) / sqrt(den);
}
static double rel_err_ff(const float *y, const float *ref, int64_t n) {
    double *r = dalloc(n);
    for (int64_t i = 0; i < n; i++) r[i] = ref[i];
    const double e = rel_err(y, r, n);
    free(r);
    return e;
}
#define assert_rel_below(err, bound)                                                                                   \
    do {                                                                                                               \
        const double e_ = (err);                                                                                       \
        if (!(e_ < (bound))) fail_msg("%s = %.3g, not below %.3g", #err, e_, (double)(bound));                         \
    } while (0)

static fm_backend *make_backend(void) {
    fm_plan plan;
    fm_plan_from_preset(FM_PRESET_REF, &plan);
    fm_backend *be = NULL;
    fm_error err;
    assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);
    return be;
}

static char g_name[] = "test.weight";

/* an fp32 bank of one [rows, cols] matrix */
static fm_bank *make_bank(fm_backend *be, const float *data, int64_t rows, int64_t cols) {
    fm_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = g_name, t.dtype = FM_DTYPE_F32, t.n_dims = 2, t.shape[0] = rows, t.shape[1] = cols;
    t.n_elements = rows * cols, t.data = (const uint8_t *)data, t.nbytes = (uint64_t)t.n_elements * sizeof(float);
    const fm_wsrc src = {&t, 0, rows, cols, {0}, {0}};
    fm_bank_src bs = {&src, 1, 1, "test bank", false, false};
    fm_bank *b = NULL;
    fm_error err;
    if (be->ops->bank_create(be, &bs, FM_W_F32, &b, &err)) fail_msg("bank_create: %s", err.msg);
    return b;
}

static const fm_gdn_shape k_shape = {2, 4, 16, 12, 4}; /* nk, nv, dk, dv, kernel */

/* The inputs of the rule: the conv's output [T, C], in_proj_ba's [T, 2 nv], A_log and dt_bias (decays per token
 * between ~0.3 and ~0.97, as in the golden models, so that the state carries over many chunks). */
typedef struct rule_in {
    float *qkv, *ba, *a_log, *dt_bias;
    fm_bank *A, *dt;
} rule_in;

static void rule_inputs(fm_backend *be, fm_gdn_shape g, int64_t T, rule_in *in) {
    in->qkv = rand_array(T * fm_gdn_channels(g), 1.0f);
    in->ba = rand_array(T * 2 * g.nv, 1.5f);
    in->a_log = malloc((size_t)g.nv * sizeof(float)), in->dt_bias = rand_array(g.nv, 0.5f);
    for (int32_t h = 0; h < g.nv; h++) in->a_log[h] = logf(0.05f + 0.5f * (float)urand());
    in->A = make_bank(be, in->a_log, 1, g.nv), in->dt = make_bank(be, in->dt_bias, 1, g.nv);
}

static void rule_free(fm_backend *be, rule_in *in) {
    be->ops->bank_free(be, in->A), be->ops->bank_free(be, in->dt);
    free(in->qkv), free(in->ba), free(in->a_log), free(in->dt_bias);
}

/* the recurrence in double, as transformers' torch_recurrent_gated_delta_rule writes it; state [nv][dk][dv] */
static void ref_rule(const rule_in *in, fm_gdn_shape g, int64_t T, double *out, double *S) {
    const int64_t C = fm_gdn_channels(g), key = (int64_t)g.nk * g.dk;
    const int32_t r = g.nv / g.nk;
    memset(S, 0, (size_t)g.nv * g.dk * g.dv * sizeof *S);
    double *q = dalloc(g.dk), *k = dalloc(g.dk), *u = dalloc(g.dv);
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < g.nv; h++) {
            const int32_t kh = h / r;
            const float *row = in->qkv + t * C;
            double qq = 0, kk = 0;
            for (int32_t i = 0; i < g.dk; i++) {
                q[i] = row[kh * g.dk + i], k[i] = row[key + kh * g.dk + i];
                qq += q[i] * q[i], kk += k[i] * k[i];
            }
            for (int32_t i = 0; i < g.dk; i++) q[i] /= sqrt(qq + 1e-6) * sqrt((double)g.dk), k[i] /= sqrt(kk + 1e-6);
            const float *bar = in->ba + t * 2 * g.nv + kh * 2 * r;
            const double beta = 1.0 / (1.0 + exp(-(double)bar[h % r]));
            const double x = (double)bar[r + h % r] + in->dt_bias[h], sp = x > 20 ? x : log1p(exp(x));
            const double decay = exp(-exp((double)in->a_log[h]) * sp);
            double *Sh = S + (int64_t)h * g.dk * g.dv;
            const float *v = row + 2 * key + (int64_t)h * g.dv;
            for (int64_t i = 0; i < (int64_t)g.dk * g.dv; i++) Sh[i] *= decay;
            for (int32_t e = 0; e < g.dv; e++) {
                double m = 0;
                for (int32_t i = 0; i < g.dk; i++) m += Sh[i * g.dv + e] * k[i];
                u[e] = beta * (v[e] - m);
            }
            for (int32_t i = 0; i < g.dk; i++)
                for (int32_t e = 0; e < g.dv; e++) Sh[i * g.dv + e] += k[i] * u[e];
            for (int32_t e = 0; e < g.dv; e++) {
                double o = 0;
                for (int32_t i = 0; i < g.dk; i++) o += Sh[i * g.dv + e] * q[i];
                out[(t * g.nv + h) * g.dv + e] = o;
            }
        }
    free(q), free(k), free(u);
}

/* Both forms of the rule against the double recurrence (37 tokens: fp32 rounding of a few dozen steps, 1e-5). */
static void test_gdn_rule_vs_double(void **state) {
    (void)state;
    seed(31);
    fm_backend *be = make_backend();
    const fm_gdn_shape g = k_shape;
    const int64_t T = 37, n_out = T * g.nv * g.dv, n_state = fm_gdn_rec_state_elems(g);
    rule_in in;
    rule_inputs(be, g, T, &in);
    double *ref = dalloc(n_out), *S = dalloc(n_state);
    ref_rule(&in, g, T, ref, S);
    float *out = nan_array(n_out), *states = nan_array(n_state);
    int32_t seq[37], pos[37];
    for (int t = 0; t < T; t++) seq[t] = 0, pos[t] = t;
    be->ops->gdn_chunked(be, in.qkv, in.ba, in.A, in.dt, T, g, states, seq, pos, out);
    assert_rel_below(rel_err(out, ref, n_out), 1e-5);
    assert_rel_below(rel_err(states, S, n_state), 1e-5);
    float *out2 = nan_array(n_out), *states2 = nan_array(n_state);
    be->ops->gdn_recurrent(be, in.qkv, in.ba, in.A, in.dt, T, g, states2, seq, pos, out2);
    assert_rel_below(rel_err(out2, ref, n_out), 1e-5);
    assert_rel_below(rel_err(states2, S, n_state), 1e-5);
    free(out), free(out2), free(states), free(states2), free(ref), free(S);
    rule_free(be, &in);
    be->ops->destroy(be);
}

/* The chunked rule equals the recurrent step token by token: outputs and final state, at T = 1, 63, 64, 65, 1000.
 * Both are fp32 with different summation orders; the decays bound how far a rounding error travels, so the bound
 * does not grow with T: 2e-6 (3e-7 seen). Without a state to keep, the chunked op gives the same outputs bit for bit.
 */
static void test_gdn_chunked_equals_recurrent(void **state) {
    (void)state;
    const int64_t Ts[] = {1, 63, 64, 65, 1000};
    fm_backend *be = make_backend();
    const fm_gdn_shape g = k_shape;
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        seed(40 + i);
        const int64_t T = Ts[i], n_out = T * g.nv * g.dv, n_state = fm_gdn_rec_state_elems(g);
        rule_in in;
        rule_inputs(be, g, T, &in);
        int32_t *seq = calloc((size_t)T, sizeof *seq), *pos = malloc((size_t)T * sizeof *pos);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
        float *oc = nan_array(n_out), *sc = nan_array(n_state), *orr = nan_array(n_out), *sr = nan_array(n_state);
        be->ops->gdn_chunked(be, in.qkv, in.ba, in.A, in.dt, T, g, sc, seq, pos, oc);
        for (int64_t t = 0; t < T; t++) /* one token per call, as decode steps run */
            be->ops->gdn_recurrent(be, in.qkv + t * fm_gdn_channels(g), in.ba + t * 2 * g.nv, in.A, in.dt, 1, g, sr,
                                   seq + t, pos + t, orr + t * g.nv * g.dv);
        printf("T = %4lld: chunked vs recurrent: out %.3g, state %.3g\n", (long long)T, rel_err_ff(oc, orr, n_out),
               rel_err_ff(sc, sr, n_state));
        assert_rel_below(rel_err_ff(oc, orr, n_out), 2e-6);
        assert_rel_below(rel_err_ff(sc, sr, n_state), 2e-6);
        float *on = nan_array(n_out);
        be->ops->gdn_chunked(be, in.qkv, in.ba, in.A, in.dt, T, g, NULL, NULL, NULL, on);
        assert_memory_equal(on, oc, (size_t)n_out * sizeof *on);
        free(on), free(oc), free(sc), free(orr), free(sr), free(seq), free(pos);
        rule_free(be, &in);
    }
    be->ops->destroy(be);
}

/* A prompt in chunks, as a server's steps run it: the chunked rule over each chunk from the state the previous chunks
 * left (tok_pos > 0), equal to the whole prompt chunked (outputs and final state; chunks that start inside a chunk of
 * 64 and cross one, a one-token chunk), in a slot whose state held garbage before position 0. The same 2e-6 as above:
 * only the chunk boundaries, hence the summation order, differ. */
static void test_gdn_chunked_from_state(void **state) {
    (void)state;
    seed(45);
    fm_backend *be = make_backend();
    const fm_gdn_shape g = k_shape;
    const int64_t T = 300, C = fm_gdn_channels(g), V = (int64_t)g.nv * g.dv, per = fm_gdn_rec_state_elems(g);
    const int64_t cuts[] = {0, 37, 38, 101, 230, 300}; /* chunks of 37, 1, 63, 129, 70 */
    rule_in in;
    rule_inputs(be, g, T, &in);
    int32_t *seq = malloc((size_t)T * sizeof *seq), *pos = malloc((size_t)T * sizeof *pos);
    for (int64_t t = 0; t < T; t++) seq[t] = 1, pos[t] = (int32_t)t; /* slot 1 of 2 */
    float *whole = nan_array(T * V), *sw = nan_array(2 * per), *parts = nan_array(T * V), *sp = nan_array(2 * per);
    be->ops->gdn_chunked(be, in.qkv, in.ba, in.A, in.dt, T, g, sw, seq, pos, whole);
    for (size_t i = 0; i + 1 < sizeof cuts / sizeof *cuts; i++) {
        const int64_t t0 = cuts[i], n = cuts[i + 1] - cuts[i];
        be->ops->gdn_chunked(be, in.qkv + t0 * C, in.ba + t0 * 2 * g.nv, in.A, in.dt, n, g, sp, seq + t0, pos + t0,
                             parts + t0 * V);
    }
    printf("chunks vs whole: out %.3g, state %.3g\n", rel_err_ff(parts, whole, T * V),
           rel_err_ff(sp + per, sw + per, per));
    assert_rel_below(rel_err_ff(parts, whole, T * V), 2e-6);
    assert_rel_below(rel_err_ff(sp + per, sw + per, per), 2e-6);
    assert_true(isnan(sp[0])); /* slot 0 untouched */
    free(whole), free(sw), free(parts), free(sp), free(seq), free(pos);
    rule_free(be, &in);
    be->ops->destroy(be);
}

/* Two sequences interleaved in one recurrent call (a batched decode) equal each run alone; a token at position 0
 * starts its sequence afresh whatever the slot held. */
static void test_gdn_recurrent_batches(void **state) {
    (void)state;
    seed(50);
    fm_backend *be = make_backend();
    const fm_gdn_shape g = k_shape;
    const int64_t T = 10, C = fm_gdn_channels(g), V = (int64_t)g.nv * g.dv, ns = fm_gdn_rec_state_elems(g);
    rule_in in;
    rule_inputs(be, g, T, &in);
    /* tokens 0..4 are sequence 1, tokens 5..9 sequence 0, interleaved: 0 5 1 6 2 7 ... */
    float *qkv = malloc((size_t)(T * C) * sizeof *qkv), *ba = malloc((size_t)(T * 2 * g.nv) * sizeof *ba);
    int32_t seq[10], pos[10];
    for (int64_t j = 0; j < T; j++) {
        const int64_t src = j % 2 ? 5 + j / 2 : j / 2;
        memcpy(qkv + j * C, in.qkv + src * C, (size_t)C * sizeof *qkv);
        memcpy(ba + j * 2 * g.nv, in.ba + src * 2 * g.nv, (size_t)(2 * g.nv) * sizeof *ba);
        seq[j] = j % 2 ? 0 : 1, pos[j] = (int32_t)(j / 2);
    }
    float *states = rand_array(2 * ns, 5.0f); /* stale slots: position 0 must clear them */
    float *mixed = nan_array(T * V), *alone = nan_array(T * V), *s1 = nan_array(ns);
    be->ops->gdn_recurrent(be, qkv, ba, in.A, in.dt, T, g, states, seq, pos, mixed);
    int32_t zero[5] = {0}, p5[5] = {0, 1, 2, 3, 4};
    for (int s = 0; s < 2; s++) {
        be->ops->gdn_recurrent(be, in.qkv + s * 5 * C, in.ba + s * 5 * 2 * g.nv, in.A, in.dt, 5, g, s1, zero, p5,
                               alone + s * 5 * V);
        assert_memory_equal(s1, states + (s ? 0 : ns), (size_t)ns * sizeof *s1);
    }
    for (int64_t j = 0; j < T; j++) {
        const int64_t src = j % 2 ? 5 + j / 2 : j / 2;
        assert_memory_equal(mixed + j * V, alone + src * V, (size_t)V * sizeof *mixed);
    }
    free(qkv), free(ba), free(states), free(mixed), free(alone), free(s1);
    rule_free(be, &in);
    be->ops->destroy(be);
}

/* The conv against double (stateless over 29 tokens), and with its state token by token equal to the stateless op
 * bit for bit (the same sum in the same order; missing history is zero). */
static void test_gdn_conv(void **state) {
    (void)state;
    seed(60);
    fm_backend *be = make_backend();
    const fm_gdn_shape g = {2, 4, 16, 12, 4};
    const int64_t T = 29, C = fm_gdn_channels(g), W = fm_gdn_qkvz_width(g), K = g.kernel, r = g.nv / g.nk;
    float *qkvz = rand_array(T * W, 2.0f), *w = rand_array(C * K, 0.7f);
    fm_bank *cw = make_bank(be, w, C, K);
    float *out = nan_array(T * C);
    be->ops->gdn_conv(be, qkvz, cw, T, g, NULL, NULL, NULL, out);
    double *ref = dalloc(T * C);
    const int64_t Wg = 2 * g.dk + 2 * r * g.dv, key = (int64_t)g.nk * g.dk;
    for (int64_t c = 0; c < C; c++) {
        int64_t col; /* the channel's column in the grouped qkvz row, derived from the layout */
        if (c < key) col = (c / g.dk) * Wg + c % g.dk;
        else if (c < 2 * key) col = ((c - key) / g.dk) * Wg + g.dk + (c - key) % g.dk;
        else {
            const int64_t h = (c - 2 * key) / g.dv;
            col = (h / r) * Wg + 2 * g.dk + (h % r) * g.dv + (c - 2 * key) % g.dv;
        }
        for (int64_t t = 0; t < T; t++) {
            double acc = 0;
            for (int64_t j = 0; j < K; j++)
                if (t - (K - 1) + j >= 0) acc += (double)w[c * K + j] * qkvz[(t - (K - 1) + j) * W + col];
            ref[t * C + c] = acc / (1.0 + exp(-acc));
        }
    }
    assert_rel_below(rel_err(out, ref, T * C), 1e-6);
    float *states = rand_array(2 * fm_gdn_conv_state_elems(g), 3.0f), *step = nan_array(T * C);
    for (int64_t t = 0; t < T; t++) {
        const int32_t s = 1, p = (int32_t)t;
        be->ops->gdn_conv(be, qkvz + t * W, cw, 1, g, states, &s, &p, step + t * C);
    }
    assert_memory_equal(step, out, (size_t)(T * C) * sizeof *out);
    free(qkvz), free(w), free(out), free(ref), free(states), free(step);
    be->ops->bank_free(be, cw);
    be->ops->destroy(be);
}

/* gated RMSNorm: w * x / rms(x) * silu(z), z from qkvz's grouped columns */
static void test_gdn_norm_gate(void **state) {
    (void)state;
    seed(70);
    fm_backend *be = make_backend();
    const fm_gdn_shape g = k_shape;
    const int64_t T = 17, V = (int64_t)g.nv * g.dv, W = fm_gdn_qkvz_width(g), r = g.nv / g.nk;
    const float eps = 1e-6f;
    float *core = rand_array(T * V, 2.0f), *qkvz = rand_array(T * W, 2.0f), *w = rand_array(g.dv, 1.0f);
    fm_bank *wb = make_bank(be, w, 1, g.dv);
    float *out = nan_array(T * V);
    be->ops->gdn_norm_gate(be, core, qkvz, wb, T, g, eps, out, NULL);
    double *ref = dalloc(T * V);
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < g.nv; h++) {
            const float *x = core + t * V + h * g.dv;
            const float *z = qkvz + t * W + (h / r) * (2 * g.dk + 2 * r * g.dv) + 2 * g.dk + r * g.dv + (h % r) * g.dv;
            double ss = 0;
            for (int32_t e = 0; e < g.dv; e++) ss += (double)x[e] * x[e];
            const double inv = 1.0 / sqrt(ss / g.dv + eps);
            for (int32_t e = 0; e < g.dv; e++)
                ref[t * V + h * g.dv + e] = (double)w[e] * x[e] * inv * (double)z[e] / (1.0 + exp(-(double)z[e]));
        }
    assert_rel_below(rel_err(out, ref, T * V), 1e-6);
    free(core), free(qkvz), free(w), free(out), free(ref);
    be->ops->bank_free(be, wb);
    be->ops->destroy(be);
}

/* the query/gate split, q/k RMSNorm and RoPE on the first rot_dim dims (rot_dim 6 of head_dim 24: three pairs
 * (j, j + 3)), at explicit positions; the other 18 dims of each head pass normed but unrotated */
static void test_gated_qk_norm_rope(void **state) {
    (void)state;
    seed(80);
    fm_backend *be = make_backend();
    const int32_t nh = 4, nkv = 2, hd = 24, rd = 6;
    const int64_t T = 9, ld_in = (int64_t)(2 * nh + 2 * nkv) * hd, ld = (int64_t)(nh + 2 * nkv) * hd;
    const float eps = 1e-6f;
    const double theta = 10000.0;
    float *qg = rand_array(T * ld_in, 2.0f), *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
    fm_bank *qb = make_bank(be, qn, 1, hd), *kb = make_bank(be, kn, 1, hd);
    int32_t pos[9];
    for (int t = 0; t < T; t++) pos[t] = 3 * t + 5;
    float *qkv = nan_array(T * ld), *gate = nan_array(T * nh * hd);
    be->ops->gated_qk_norm_rope(be, qg, T, nh, nkv, hd, rd, qb, kb, eps, 0, pos, theta, qkv, gate);
    double *ref = dalloc(T * ld), *rg = dalloc(T * nh * hd), *x = dalloc(hd);
    for (int64_t t = 0; t < T; t++) {
        for (int32_t h = 0; h < nh + 2 * nkv; h++) {
            const float *src = h < nh ? qg + t * ld_in + h * 2 * hd : qg + t * ld_in + 2 * nh * hd + (h - nh) * hd;
            for (int32_t i = 0; i < hd; i++) x[i] = src[i];
            if (h < nh + nkv) {
                const float *w = h < nh ? qn : kn;
                double ss = 0;
                for (int32_t i = 0; i < hd; i++) ss += x[i] * x[i];
                const double inv = 1.0 / sqrt(ss / hd + eps);
                for (int32_t i = 0; i < hd; i++) x[i] *= inv * w[i];
                for (int32_t j = 0; j < rd / 2; j++) {
                    const double f = pos[t] * pow(theta, -2.0 * j / rd), a = x[j], b = x[j + rd / 2];
                    x[j] = a * cos(f) - b * sin(f), x[j + rd / 2] = b * cos(f) + a * sin(f);
                }
            }
            for (int32_t i = 0; i < hd; i++) ref[t * ld + h * hd + i] = x[i];
            if (h < nh)
                for (int32_t i = 0; i < hd; i++) rg[(t * nh + h) * hd + i] = qg[t * ld_in + h * 2 * hd + hd + i];
        }
    }
    assert_rel_below(rel_err(qkv, ref, T * ld), 1e-5);
    assert_rel_below(rel_err(gate, rg, T * nh * hd), 1e-7); /* a copy */
    free(qg), free(qn), free(kn), free(qkv), free(gate), free(ref), free(rg), free(x);
    be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    be->ops->destroy(be);
}

/* x * sigmoid(g) elementwise; acc += sigmoid(s[r]) * x[r, :] per row */
static void test_sigmoid_gates(void **state) {
    (void)state;
    seed(90);
    fm_backend *be = make_backend();
    const int64_t R = 7, D = 33;
    float *x = rand_array(R * D, 3.0f), *g = rand_array(R * D, 4.0f), *acc = rand_array(R * D, 1.0f);
    float *s = rand_array(R, 4.0f), *y = malloc((size_t)(R * D) * sizeof *y);
    memcpy(y, x, (size_t)(R * D) * sizeof *y);
    double *r1 = dalloc(R * D), *r2 = dalloc(R * D);
    for (int64_t i = 0; i < R * D; i++) {
        r1[i] = (double)x[i] / (1.0 + exp(-(double)g[i]));
        r2[i] = (double)acc[i] + (double)x[i] / (1.0 + exp(-(double)s[i / D]));
    }
    be->ops->sigmoid_mul(be, y, g, R * D);
    assert_rel_below(rel_err(y, r1, R * D), 1e-6);
    be->ops->add_sigmoid_scaled(be, acc, x, s, R, D);
    assert_rel_below(rel_err(acc, r2, R * D), 1e-6);
    free(x), free(g), free(acc), free(s), free(y), free(r1), free(r2);
    be->ops->destroy(be);
}

/* acc += sigmoid(h[r, :] . w) * x[r, :] per row, the score computed by the op (Qwen3-Next's shared-expert gate) */
static void test_add_sigmoid_gated(void **state) {
    (void)state;
    seed(91);
    fm_backend *be = make_backend();
    const int64_t R = 5, D = 37;
    float *x = rand_array(R * D, 3.0f), *h = rand_array(R * D, 1.0f), *w = rand_array(D, 1.0f);
    float *acc = rand_array(R * D, 1.0f);
    double *ref = dalloc(R * D);
    for (int64_t r = 0; r < R; r++) {
        double dot = 0.0;
        for (int64_t i = 0; i < D; i++) dot += (double)h[r * D + i] * w[i];
        for (int64_t i = 0; i < D; i++) ref[r * D + i] = (double)acc[r * D + i] + x[r * D + i] / (1.0 + exp(-dot));
    }
    fm_bank *wb = make_bank(be, w, 1, D);
    be->ops->add_sigmoid_gated(be, acc, x, h, wb, R, D);
    assert_rel_below(rel_err(acc, ref, R * D), 1e-6);
    be->ops->bank_free(be, wb);
    free(x), free(h), free(w), free(acc), free(ref);
    be->ops->destroy(be);
}

/* gdn_decode_fused (route decode.fused) is gdn_conv, gdn_recurrent and gdn_norm_gate in that order, bit for bit: the
 * normed rows and both states, B = 1, 3 and 64 rows each of its own sequence (slots shuffled, some at position 0, the
 * others from random states), on the fp32 plan and the bf16-rounding one (the plan the GPU ops are tested against);
 * and given the in_proj_ba matrix (route gdn.decode_ba), linear(ba_w, h) followed by that chain */
static void test_gdn_decode_fused_is_the_chain(void **state) {
    (void)state;
    seed(75);
    const fm_gdn_shape shapes[] = {{2, 4, 16, 12, 4}, {1, 3, 8, 10, 3}};
    const int64_t batches[] = {1, 3, 64};
    const int32_t slots = 70;
    for (int bf = 0; bf < 2; bf++) {
        fm_plan plan;
        fm_plan_for_backend(FM_PRESET_REF, bf ? "cuda" : "cpu", &plan); /* "cuda": bf16 activations, emulated */
        fm_backend *be = NULL;
        fm_error err;
        assert_int_equal(fm_cpu_backend_create(&plan, 0, &be, &err), FM_OK);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
                const fm_gdn_shape g = shapes[si];
                const int64_t B = batches[bi], C = fm_gdn_channels(g), W = fm_gdn_qkvz_width(g);
                const int64_t V = (int64_t)g.nv * g.dv, K = g.kernel;
                const int64_t nconv = slots * fm_gdn_conv_state_elems(g), nrec = slots * fm_gdn_rec_state_elems(g);
                rule_in in;
                rule_inputs(be, g, B, &in);
                float *qkvz = rand_array(B * W, 2.0f), *cw = rand_array(C * K, 0.7f), *nw = rand_array(g.dv, 1.0f);
                fm_bank *cb = make_bank(be, cw, C, K), *nb = make_bank(be, nw, 1, g.dv);
                float *conv1 = rand_array(nconv, 1.0f), *rec1 = rand_array(nrec, 0.5f);
                float *conv2 = malloc((size_t)nconv * sizeof(float)), *rec2 = malloc((size_t)nrec * sizeof(float));
                assert_non_null(conv2), assert_non_null(rec2);
                memcpy(conv2, conv1, (size_t)nconv * sizeof(float)), memcpy(rec2, rec1, (size_t)nrec * sizeof(float));
                int32_t seq[64], pos[64];
                for (int64_t t = 0; t < B; t++) /* distinct slots, every third sequence fresh */
                    seq[t] = (int32_t)((t * 37 + 11) % slots), pos[t] = t % 3 == 1 ? 0 : 1 + (int32_t)(urand() * 50);
                float *qkv1 = nan_array(B * C), *core1 = nan_array(B * V), *out1 = nan_array(B * V);
                float *qkv2 = nan_array(B * C), *core2 = nan_array(B * V);
                be->ops->gdn_conv(be, qkvz, cb, B, g, conv1, seq, pos, qkv1);
                be->ops->gdn_recurrent(be, qkv1, in.ba, in.A, in.dt, B, g, rec1, seq, pos, core1);
                be->ops->gdn_norm_gate(be, core1, qkvz, nb, B, g, 1e-6f, out1, NULL);
                /* the output into the conv's scratch, as forward.c passes it */
                be->ops->gdn_decode_fused(be, qkvz, in.ba, NULL, NULL, cb, in.A, in.dt, nb, B, g, 1e-6f, conv2, rec2,
                                          seq, pos, qkv2, core2, qkv2, NULL);
                assert_memory_equal(qkv2, out1, (size_t)(B * V) * sizeof(float));
                assert_memory_equal(conv2, conv1, (size_t)nconv * sizeof(float));
                assert_memory_equal(rec2, rec1, (size_t)nrec * sizeof(float));
                /* route gdn.decode_ba: given the in_proj_ba matrix, the op's b | a rows are linear(ba_w, h)'s; a second
                   step from the states both forms now hold */
                const int64_t H = 24, nba = 2 * (int64_t)g.nv;
                float *hr = rand_array(B * H, 1.0f), *wba = rand_array(nba * H, 0.5f);
                float *ba1 = nan_array(B * nba), *ba2 = nan_array(B * nba);
                fm_bank *bab = make_bank(be, wba, nba, H);
                be->ops->linear(be, bab, 0, hr, B, FM_A_NATIVE, ba1);
                be->ops->gdn_conv(be, qkvz, cb, B, g, conv1, seq, pos, qkv1);
                be->ops->gdn_recurrent(be, qkv1, ba1, in.A, in.dt, B, g, rec1, seq, pos, core1);
                be->ops->gdn_norm_gate(be, core1, qkvz, nb, B, g, 1e-6f, out1, NULL);
                be->ops->gdn_decode_fused(be, qkvz, ba2, bab, hr, cb, in.A, in.dt, nb, B, g, 1e-6f, conv2, rec2, seq,
                                          pos, qkv2, core2, qkv2, NULL);
                assert_memory_equal(qkv2, out1, (size_t)(B * V) * sizeof(float));
                assert_memory_equal(conv2, conv1, (size_t)nconv * sizeof(float));
                assert_memory_equal(rec2, rec1, (size_t)nrec * sizeof(float));
                be->ops->bank_free(be, bab);
                free(hr), free(wba), free(ba1), free(ba2);
                rule_free(be, &in);
                be->ops->bank_free(be, cb), be->ops->bank_free(be, nb);
                free(qkvz), free(cw), free(nw), free(conv1), free(rec1), free(conv2), free(rec2);
                free(qkv1), free(core1), free(out1), free(qkv2), free(core2);
            }
        be->ops->destroy(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gdn_rule_vs_double),
        cmocka_unit_test(test_gdn_chunked_equals_recurrent),
        cmocka_unit_test(test_gdn_chunked_from_state),
        cmocka_unit_test(test_gdn_recurrent_batches),
        cmocka_unit_test(test_gdn_conv),
        cmocka_unit_test(test_gdn_norm_gate),
        cmocka_unit_test(test_gated_qk_norm_rope),
        cmocka_unit_test(test_sigmoid_gates),
        cmocka_unit_test(test_add_sigmoid_gated),
        cmocka_unit_test(test_gdn_decode_fused_is_the_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
