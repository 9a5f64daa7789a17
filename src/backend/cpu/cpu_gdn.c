/* The Gated DeltaNet (Qwen3-Next's linear attention) on the CPU reference: the causal depthwise conv with its state,
 * the gated delta rule in chunks (prompts and prompt chunks) and token by token (decode), and the gated RMSNorm
 * (backend.h states each op). All fp32; outputs rounded to bf16 when the plan says act_bf16. The recurrent states stay
 * fp32.
 *
 * Chunked form of the rule, per value head, over a chunk of L tokens starting from state S0 [dk, dv], with
 * G_i = g_1 + ... + g_i (log decays summed inside the chunk):
 *   u_j = beta_j (v_j - e^{G_j} S0^T k_j) - beta_j sum_{m<j} e^{G_j - G_m} (k_j . k_m) u_m     (forward substitution)
 *   o_i = e^{G_i} S0^T q_i + sum_{m<=i} e^{G_i - G_m} (q_i . k_m) u_m
 *   S_L = e^{G_L} S0 + sum_m e^{G_L - G_m} k_m u_m^T
 * which is the recurrence S_t = e^{g_t} S_{t-1} + k_t u_t^T unrolled (u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t));
 * every exponent is <= 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#define GDN_CHUNK 64

static void *xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "fp8moe: cpu %s: out of host memory (%zu bytes)\n", what, bytes);
        abort();
    }
    return p;
}

/* column of channel c (q | k | v order) inside a qkvz row (grouped by key head) */
static int64_t qkvz_column(fm_gdn_shape g, int64_t c) {
    const int64_t r = g.nv / g.nk, W = 2 * (int64_t)g.dk + 2 * r * g.dv, key = (int64_t)g.nk * g.dk;
    if (c < key) return (c / g.dk) * W + c % g.dk;
    if (c < 2 * key) return ((c - key) / g.dk) * W + g.dk + (c - key) % g.dk;
    const int64_t h = (c - 2 * key) / g.dv, e = (c - 2 * key) % g.dv;
    return (h / r) * W + 2 * (int64_t)g.dk + (h % r) * g.dv + e;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

void cpu_gdn_conv(fm_backend *be, const void *qkvzv, const fm_bank *conv, int64_t T, fm_gdn_shape g, void *statesv,
                  const void *tok_seqv, const void *tok_posv, void *outv) {
    const float *qkvz = (const float *)qkvzv, *w = conv->w;
    const int32_t *tok_seq = (const int32_t *)tok_seqv, *tok_pos = (const int32_t *)tok_posv;
    float *states = (float *)statesv, *out = (float *)outv;
    const int64_t C = fm_gdn_channels(g), Wz = fm_gdn_qkvz_width(g), K = g.kernel;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        const int64_t col = qkvz_column(g, c);
        const float *wc = w + c * K;
        for (int64_t t = 0; t < T; t++) {
            const float x = qkvz[t * Wz + col];
            float acc = wc[K - 1] * x;
            if (!states) {
                for (int64_t j = 0; j < K - 1; j++) {
                    const int64_t src = t - (K - 1) + j;
                    if (src >= 0) acc += wc[j] * qkvz[src * Wz + col];
                }
            } else {
                /* the sequence's last K - 1 inputs, oldest first, at [j][c] */
                float *hist = states + (int64_t)tok_seq[t] * (K - 1) * C;
                if (tok_pos[t] == 0)
                    for (int64_t j = 0; j < K - 1; j++) hist[j * C + c] = 0.0f;
                for (int64_t j = 0; j < K - 1; j++) acc += wc[j] * hist[j * C + c];
                for (int64_t j = 0; j + 1 < K - 1; j++) hist[j * C + c] = hist[(j + 1) * C + c];
                if (K > 1) hist[(K - 2) * C + c] = x;
            }
            out[t * C + c] = silu(acc);
        }
    }
    cpu_round_act(be, out, T * C);
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* One token's q, k (normalised, q scaled), v, log decay and beta for value head h. */
typedef struct gdn_tok {
    float *q, *k; /* [dk] each, written */
    const float *v;
    float g, beta;
} gdn_tok;

static void l2norm(const float *x, int32_t n, float scale, float *y) {
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int32_t i = 0; i < n; i++) y[i] = x[i] * inv * scale;
}

static void load_tok(const float *qkv, const float *ba, const float *a_log, const float *dt_bias, fm_gdn_shape g,
                     int64_t t, int32_t h, gdn_tok *x) {
    const int64_t C = fm_gdn_channels(g), key = (int64_t)g.nk * g.dk;
    const int32_t r = g.nv / g.nk, kh = h / r;
    const float *row = qkv + t * C;
    l2norm(row + (int64_t)kh * g.dk, g.dk, 1.0f / sqrtf((float)g.dk), x->q);
    l2norm(row + key + (int64_t)kh * g.dk, g.dk, 1.0f, x->k);
    x->v = row + 2 * key + (int64_t)h * g.dv;
    const float *bar = ba + t * 2 * (int64_t)g.nv + (int64_t)kh * 2 * r;
    const float b = bar[h % r], a = bar[r + h % r];
    x->beta = 1.0f / (1.0f + expf(-b));
    x->g = -expf(a_log[h]) * softplus(a + dt_bias[h]);
}

/* S = e^g S + k (beta (v - e^g S^T k))^T; o = S^T q */
static void recurrent_step(float *S, const gdn_tok *x, int32_t dk, int32_t dv, float *u, float *o) {
    const float decay = expf(x->g);
    for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= decay;
    for (int32_t e = 0; e < dv; e++) u[e] = 0.0f;
    for (int32_t i = 0; i < dk; i++)
        for (int32_t e = 0; e < dv; e++) u[e] += S[(int64_t)i * dv + e] * x->k[i];
    for (int32_t e = 0; e < dv; e++) u[e] = x->beta * (x->v[e] - u[e]);
    for (int32_t i = 0; i < dk; i++)
        for (int32_t e = 0; e < dv; e++) S[(int64_t)i * dv + e] += x->k[i] * u[e];
    for (int32_t e = 0; e < dv; e++) o[e] = 0.0f;
    for (int32_t i = 0; i < dk; i++)
        for (int32_t e = 0; e < dv; e++) o[e] += S[(int64_t)i * dv + e] * x->q[i];
}

void cpu_gdn_recurrent(fm_backend *be, const void *qkvv, const void *bav, const fm_bank *a_log, const fm_bank *dt_bias,
                       int64_t T, fm_gdn_shape g, void *statesv, const void *tok_seqv, const void *tok_posv,
                       void *outv) {
    const int32_t *tok_seq = (const int32_t *)tok_seqv, *tok_pos = (const int32_t *)tok_posv;
    float *states = (float *)statesv, *out = (float *)outv;
    const int64_t per = fm_gdn_rec_state_elems(g), head = (int64_t)g.dk * g.dv;
#pragma omp parallel
    {
        float *buf = (float *)xmalloc((size_t)(2 * g.dk + g.dv) * sizeof(float), "gdn_recurrent");
#pragma omp for schedule(static)
        for (int32_t h = 0; h < g.nv; h++)
            for (int64_t t = 0; t < T; t++) { /* a head's tokens in order: a sequence's steps follow each other */
                float *S = states + (int64_t)tok_seq[t] * per + h * head;
                if (tok_pos[t] == 0) memset(S, 0, (size_t)head * sizeof(float));
                gdn_tok x = {buf, buf + g.dk, NULL, 0, 0};
                load_tok((const float *)qkvv, (const float *)bav, a_log->w, dt_bias->w, g, t, h, &x);
                recurrent_step(S, &x, g.dk, g.dv, buf + 2 * g.dk, out + t * (int64_t)g.nv * g.dv + (int64_t)h * g.dv);
            }
        free(buf);
    }
    cpu_round_act(be, out, T * (int64_t)g.nv * g.dv);
}

static float dotf(const float *a, const float *b, int32_t n) {
    float s = 0.0f;
    for (int32_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One value head over the run, chunk by chunk, from the state S (zeroed first when fresh); S ends as the final
 * state. */
static void chunked_head(const float *qkv, const float *ba, const fm_bank *a_log, const fm_bank *dt_bias, int64_t T,
                         fm_gdn_shape g, int32_t h, bool fresh, float *S, float *scratch, float *out) {
    const int32_t dk = g.dk, dv = g.dv, L = GDN_CHUNK;
    float *q = scratch, *k = q + (int64_t)L * dk, *u = k + (int64_t)L * dk, *G = u + (int64_t)L * dv;
    float *beta = G + L, *kk = beta + L, *qk = kk + (int64_t)L * L, *s0q = qk + (int64_t)L * L;
    const float *v[GDN_CHUNK];
    if (fresh) memset(S, 0, (size_t)dk * dv * sizeof(float));
    const int64_t ld_out = (int64_t)g.nv * dv;
    for (int64_t c0 = 0; c0 < T; c0 += L) {
        const int32_t n = (int32_t)(T - c0 < L ? T - c0 : L);
        float cum = 0.0f;
        for (int32_t j = 0; j < n; j++) {
            gdn_tok x = {q + (int64_t)j * dk, k + (int64_t)j * dk, NULL, 0, 0};
            load_tok(qkv, ba, a_log->w, dt_bias->w, g, c0 + j, h, &x);
            v[j] = x.v, cum += x.g, G[j] = cum, beta[j] = x.beta;
        }
        for (int32_t j = 0; j < n; j++)
            for (int32_t m = 0; m <= j; m++) {
                kk[j * L + m] = dotf(k + (int64_t)j * dk, k + (int64_t)m * dk, dk);
                qk[j * L + m] = dotf(q + (int64_t)j * dk, k + (int64_t)m * dk, dk);
            }
        /* u_j = beta_j (v_j - e^{G_j} S0^T k_j - sum_{m<j} e^{G_j - G_m} (k_j . k_m) u_m) */
        for (int32_t j = 0; j < n; j++) {
            float *uj = u + (int64_t)j * dv;
            const float eg = expf(G[j]);
            for (int32_t e = 0; e < dv; e++) uj[e] = 0.0f;
            for (int32_t i = 0; i < dk; i++) {
                const float kv = k[(int64_t)j * dk + i] * eg;
                for (int32_t e = 0; e < dv; e++) uj[e] += S[(int64_t)i * dv + e] * kv;
            }
            for (int32_t m = 0; m < j; m++) {
                const float a = expf(G[j] - G[m]) * kk[j * L + m];
                for (int32_t e = 0; e < dv; e++) uj[e] += a * u[(int64_t)m * dv + e];
            }
            for (int32_t e = 0; e < dv; e++) uj[e] = beta[j] * (v[j][e] - uj[e]);
        }
        /* o_i = e^{G_i} S0^T q_i + sum_{m<=i} e^{G_i - G_m} (q_i . k_m) u_m */
        for (int32_t i = 0; i < n; i++) {
            float *o = out + (c0 + i) * ld_out + (int64_t)h * dv;
            const float eg = expf(G[i]);
            for (int32_t e = 0; e < dv; e++) s0q[e] = 0.0f;
            for (int32_t a = 0; a < dk; a++) {
                const float qa = q[(int64_t)i * dk + a];
                for (int32_t e = 0; e < dv; e++) s0q[e] += S[(int64_t)a * dv + e] * qa;
            }
            for (int32_t e = 0; e < dv; e++) o[e] = eg * s0q[e];
            for (int32_t m = 0; m <= i; m++) {
                const float a = expf(G[i] - G[m]) * qk[i * L + m];
                for (int32_t e = 0; e < dv; e++) o[e] += a * u[(int64_t)m * dv + e];
            }
        }
        /* S = e^{G_n} S0 + sum_m e^{G_n - G_m} k_m u_m^T */
        const float eg = expf(G[n - 1]);
        for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= eg;
        for (int32_t m = 0; m < n; m++) {
            const float a = expf(G[n - 1] - G[m]);
            for (int32_t i = 0; i < dk; i++) {
                const float km = a * k[(int64_t)m * dk + i];
                for (int32_t e = 0; e < dv; e++) S[(int64_t)i * dv + e] += km * u[(int64_t)m * dv + e];
            }
        }
    }
}

void cpu_gdn_chunked(fm_backend *be, const void *qkvv, const void *bav, const fm_bank *a_log, const fm_bank *dt_bias,
                     int64_t T, fm_gdn_shape g, void *statesv, const void *tok_seqv, const void *tok_posv, void *outv) {
    const int32_t *tok_seq = (const int32_t *)tok_seqv, *tok_pos = (const int32_t *)tok_posv;
    float *out = (float *)outv;
    const int64_t head = (int64_t)g.dk * g.dv, L = GDN_CHUNK;
    /* the sequence's state: where the run starts (a prompt chunk after others) and where it ends */
    float *final = statesv ? (float *)statesv + (int64_t)tok_seq[0] * fm_gdn_rec_state_elems(g) : NULL;
    const bool fresh = !final || !tok_pos || tok_pos[0] == 0;
    const size_t scratch = (size_t)(2 * L * g.dk + L * g.dv + 2 * L + 2 * L * L + g.dv) * sizeof(float);
#pragma omp parallel
    {
        float *buf = (float *)xmalloc(scratch, "gdn_chunked");
        float *S = final ? NULL : (float *)xmalloc((size_t)head * sizeof(float), "gdn_chunked");
#pragma omp for schedule(static)
        for (int32_t h = 0; h < g.nv; h++)
            chunked_head((const float *)qkvv, (const float *)bav, a_log, dt_bias, T, g, h, fresh,
                         final ? final + h * head : S, buf, out);
        free(S), free(buf);
    }
    cpu_round_act(be, out, T * (int64_t)g.nv * g.dv);
}

void cpu_gdn_norm_gate(fm_backend *be, const void *corev, const void *qkvzv, const fm_bank *w, int64_t T,
                       fm_gdn_shape g, float eps, void *outv, void *out_q) {
    (void)out_q; /* the cpu has no linear_rows: its dense linears quantize their own input */
    const float *core = (const float *)corev, *qkvz = (const float *)qkvzv;
    float *out = (float *)outv;
    const int32_t r = g.nv / g.nk;
    const int64_t Wz = fm_gdn_qkvz_width(g), Wg = 2 * (int64_t)g.dk + 2 * (int64_t)r * g.dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int32_t h = 0; h < g.nv; h++) {
            const float *x = core + (t * g.nv + h) * g.dv;
            const float *z = qkvz + t * Wz + (h / r) * Wg + 2 * (int64_t)g.dk + (int64_t)r * g.dv + (h % r) * g.dv;
            float ss = 0.0f;
            for (int32_t e = 0; e < g.dv; e++) ss += x[e] * x[e];
            const float inv = 1.0f / sqrtf(ss / (float)g.dv + eps);
            float *o = out + (t * g.nv + h) * g.dv;
            for (int32_t e = 0; e < g.dv; e++) o[e] = w->w[e] * (x[e] * inv) * silu(z[e]);
        }
    cpu_round_act(be, out, T * (int64_t)g.nv * g.dv);
}
