/* Qwen3-Next's ops on the GPU against the CPU reference given the same plan (backend.h states each op; the GPU's are
 * src/backend/cuda/gated_attention.cu and gdn.cu): ref (bf16 activations and weights) and ref32 (fp32), odd sizes,
 * outputs between NaN guards (test_cuda_ops.c's conventions). Bounds: ||gpu - cpu|| / ||cpu|| <= 1e-6 for the
 * element-wise gates (same formula on the same inputs; a bf16 rounding tie may flip: 1e-2 there too for bf16),
 * 1e-2 for bf16 ops with reductions, 1e-5 for fp32 ones (summation orders). The Gated DeltaNet's rule: the CPU's
 * chunked form (chunks of 64) against the GPU's token-by-token form at T = 1, 63, 64, 65, 1000, then the recurrent
 * step against the chunked result on the GPU alone, then multi-sequence steps with the states carried (conv and
 * recurrent, fp32 states compared too) and with a decode graph's padding rows (copies of row 0), which must change no
 * state: the CPU is given the real rows only. tools/gpu-check.sh runs this program again with --route gdn.tc=on, where
 * the bf16 chunked op at dk = dv = 128 runs the tensor-core form (gdn_chunked_tc.cu). Runs only where a GPU is present
 * (make test-gpu). */
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
#include "gpu_test_util.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform (-1, 1), never exactly zero */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    float v = (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
    return v == 0.0f ? 0.5f : v;
}
static float *rand_array(int64_t n, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

typedef struct both {
    fm_backend *be[2]; /* 0 cpu, 1 cuda */
} both;

static both make(fm_preset p) {
    both b;
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &b.be[0], &err), FM_OK);
    fm_status st = fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &b.be[1], &err);
    if (st) fail_msg("cuda backend: %s", err.msg);
    return b;
}
static void destroy(both *b) {
    for (int i = 0; i < 2; i++) b->be[i]->ops->destroy(b->be[i]);
}
static double bound(const both *b) { return b->be[1]->plan.act_bf16 ? 1e-2 : 1e-5; }
static const char *pname(const both *b) { return b->be[1]->plan.act_bf16 ? "ref" : "ref32"; }
static fm_bank *vec(fm_backend *be, const float *w, int64_t n) {
    return gpu_bank(be, w, 1, 1, n, be->plan.w_other, false);
}
static void *ids(fm_backend *be, const int32_t *v, int64_t n) {
    void *p = be->ops->alloc(be, (size_t)n * sizeof(int32_t));
    assert_non_null(p);
    be->ops->upload_ids(be, v, n, p);
    return p;
}
static float *zero_states(fm_backend *be, int64_t n) {
    float *z = calloc((size_t)n, sizeof *z);
    void *p = be->ops->alloc(be, (size_t)n * sizeof(float));
    assert_non_null(p);
    be->ops->upload_raw(be, z, (size_t)n * sizeof(float), p);
    free(z);
    return p;
}
static float *fetch_states(fm_backend *be, const void *p, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    be->ops->download_raw(be, p, (size_t)n * sizeof(float), h);
    return h;
}

/* ---- gated attention: the split, per-head norms and partial RoPE; the two sigmoid gates ---- */

static void gated_rope_case(fm_preset p, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t rot, bool norms,
                            bool positions) {
    both b = make(p);
    const int64_t ld_in = (int64_t)(2 * nh + 2 * nkv) * hd, ld = (int64_t)(nh + 2 * nkv) * hd;
    float *qg = rand_array(T * ld_in, 2.0f), *qn = rand_array(hd, 1.0f), *kn = rand_array(hd, 1.0f);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)((t * 37 + 5) % 4000);
    float *qkv[2], *gate[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        fm_bank *qb = norms ? vec(be, qn, hd) : NULL, *kb = norms ? vec(be, kn, hd) : NULL;
        void *in = gpu_upload(be, qg, T * ld_in), *pd = positions ? ids(be, pos, T) : NULL, *bq, *bg;
        void *q = gpu_guarded(be, T * ld, &bq), *g = gpu_guarded(be, T * nh * hd, &bg);
        be->ops->gated_qk_norm_rope(be, in, T, nh, nkv, hd, rot, qb, kb, 1e-6f, 3, pd, 10000.0, q, g);
        qkv[i] = gpu_fetch(be, bq, T * ld, "gated_qk_norm_rope qkv");
        gate[i] = gpu_fetch(be, bg, T * nh * hd, "gated_qk_norm_rope gate");
        be->ops->free(be, in);
        if (pd) be->ops->free(be, pd);
        if (qb) be->ops->bank_free(be, qb), be->ops->bank_free(be, kb);
    }
    char what[128];
    snprintf(what, sizeof what, "%s gated_qk_norm_rope T=%lld nh=%d nkv=%d hd=%d rot=%d%s%s", pname(&b), (long long)T,
             nh, nkv, hd, rot, norms ? "" : " no norms", positions ? " positions" : " pos0");
    gpu_expect_close(qkv[1], qkv[0], T * ld, bound(&b), what);
    gpu_expect_close(gate[1], gate[0], T * nh * hd, 1e-6, "  its gate (a copy)");
    for (int i = 0; i < 2; i++) free(qkv[i]), free(gate[i]);
    free(qg), free(qn), free(kn), free(pos);
    destroy(&b);
}

static void test_gated_qk_norm_rope(void **s) {
    (void)s;
    const fm_preset ps[] = {FM_PRESET_REF, FM_PRESET_REF32};
    for (int i = 0; i < 2; i++) {
        gated_rope_case(ps[i], 1, 4, 2, 24, 6, true, true); /* the golden checkpoints' shapes */
        gated_rope_case(ps[i], 17, 2, 1, 16, 8, true, false);
        gated_rope_case(ps[i], 300, 16, 2, 256, 64, true, true); /* Qwen3-Next-80B-A3B's */
        gated_rope_case(ps[i], 5, 3, 3, 40, 40, false, true);    /* full rotation, no norms */
        gated_rope_case(ps[i], 9, 3, 1, 100, 0, true, false);    /* no rotation */
    }
}

static void gates_case(fm_preset p, int64_t rows, int64_t dim) {
    both b = make(p);
    float *x = rand_array(rows * dim, 2.0f), *g = rand_array(rows * dim, 4.0f), *acc = rand_array(rows * dim, 1.0f);
    float *score = rand_array(rows, 6.0f), *h = rand_array(rows * dim, 1.0f), *w = rand_array(dim, 0.2f);
    float *sm[2], *as[2], *ag[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = b.be[i];
        void *xd = gpu_upload(be, x, rows * dim), *gd = gpu_upload(be, g, rows * dim);
        void *sd = gpu_upload(be, score, rows), *hd = gpu_upload(be, h, rows * dim);
        fm_bank *wb = vec(be, w, dim);
        void *base, *ad, *gb;
        void *o = gpu_guarded(be, rows * dim, &base);
        be->ops->upload_f32(be, x, rows * dim, o);
        be->ops->sigmoid_mul(be, o, gd, rows * dim);
        sm[i] = gpu_fetch(be, base, rows * dim, "sigmoid_mul");
        o = gpu_guarded(be, rows * dim, &ad);
        be->ops->upload_f32(be, acc, rows * dim, o);
        be->ops->add_sigmoid_scaled(be, o, xd, sd, rows, dim);
        as[i] = gpu_fetch(be, ad, rows * dim, "add_sigmoid_scaled");
        o = gpu_guarded(be, rows * dim, &gb);
        be->ops->upload_f32(be, acc, rows * dim, o);
        be->ops->add_sigmoid_gated(be, o, xd, hd, wb, rows, dim);
        ag[i] = gpu_fetch(be, gb, rows * dim, "add_sigmoid_gated");
        be->ops->free(be, xd), be->ops->free(be, gd), be->ops->free(be, sd), be->ops->free(be, hd);
        be->ops->bank_free(be, wb);
    }
    char what[96];
    const double e = b.be[1]->plan.act_bf16 ? 1e-2 : 1e-6;
    snprintf(what, sizeof what, "%s sigmoid_mul %lld x %lld", pname(&b), (long long)rows, (long long)dim);
    gpu_expect_close(sm[1], sm[0], rows * dim, e, what);
    snprintf(what, sizeof what, "%s add_sigmoid_scaled %lld x %lld", pname(&b), (long long)rows, (long long)dim);
    gpu_expect_close(as[1], as[0], rows * dim, e, what);
    /* the score is a reduction: the bound of bf16 ops with one (an order-dependent rounding of the score may flip) */
    snprintf(what, sizeof what, "%s add_sigmoid_gated %lld x %lld", pname(&b), (long long)rows, (long long)dim);
    gpu_expect_close(ag[1], ag[0], rows * dim, bound(&b), what);
    for (int i = 0; i < 2; i++) free(sm[i]), free(as[i]), free(ag[i]);
    free(x), free(g), free(acc), free(score), free(h), free(w);
    destroy(&b);
}

static void test_gates(void **s) {
    (void)s;
    gates_case(FM_PRESET_REF, 1, 64), gates_case(FM_PRESET_REF, 300, 2048), gates_case(FM_PRESET_REF, 7, 100);
    gates_case(FM_PRESET_REF, 3, 2048), gates_case(FM_PRESET_REF, 17, 37);
    gates_case(FM_PRESET_REF32, 1, 64), gates_case(FM_PRESET_REF32, 300, 2048), gates_case(FM_PRESET_REF32, 7, 100);
}

/* ---- the Gated DeltaNet ---- */

/* one layer's weights and inputs on both backends */
typedef struct gdn_case {
    both b;
    fm_gdn_shape g;
    int64_t C, Wz;
    float *conv_w, *a_log, *dt_bias, *norm_w;
    fm_bank *conv[2], *al[2], *dt[2], *nw[2];
} gdn_case;

static gdn_case gdn_make(fm_preset p, fm_gdn_shape g) {
    gdn_case c = {.b = make(p), .g = g, .C = fm_gdn_channels(g), .Wz = fm_gdn_qkvz_width(g)};
    c.conv_w = rand_array(c.C * g.kernel, 0.5f), c.norm_w = rand_array(g.dv, 1.0f);
    c.a_log = rand_array(g.nv, 1.0f), c.dt_bias = rand_array(g.nv, 1.0f);
    for (int i = 0; i < 2; i++) {
        fm_backend *be = c.b.be[i];
        c.conv[i] = gpu_bank(be, c.conv_w, 1, c.C, g.kernel, be->plan.w_other, false);
        c.al[i] = vec(be, c.a_log, g.nv), c.dt[i] = vec(be, c.dt_bias, g.nv), c.nw[i] = vec(be, c.norm_w, g.dv);
    }
    return c;
}

static void gdn_free(gdn_case *c) {
    for (int i = 0; i < 2; i++) {
        fm_backend *be = c->b.be[i];
        be->ops->bank_free(be, c->conv[i]), be->ops->bank_free(be, c->al[i]);
        be->ops->bank_free(be, c->dt[i]), be->ops->bank_free(be, c->nw[i]);
    }
    free(c->conv_w), free(c->a_log), free(c->dt_bias), free(c->norm_w);
    destroy(&c->b);
}

static const char *shape_str(const gdn_case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s nk=%d nv=%d dk=%d dv=%d K=%d", pname(&c->b), c->g.nk, c->g.nv, c->g.dk, c->g.dv, c->g.kernel);
    return buf;
}

/* conv (no state), the rule chunked (final state kept), norm_gate, on one fresh sequence of T tokens */
static void fresh_case(fm_preset p, fm_gdn_shape g, int64_t T) {
    gdn_case c = gdn_make(p, g);
    const int64_t V = (int64_t)g.nv * g.dv, per = fm_gdn_rec_state_elems(g);
    float *qkvz = rand_array(T * c.Wz, 1.0f), *ba = rand_array(T * 2 * g.nv, 2.0f), *core = rand_array(T * V, 1.0f);
    const int32_t seq1 = 1;
    float *cv[2], *ru[2], *st[2], *ng[2];
    for (int i = 0; i < 2; i++) {
        fm_backend *be = c.b.be[i];
        void *zd = gpu_upload(be, qkvz, T * c.Wz), *bad = gpu_upload(be, ba, T * 2 * g.nv);
        void *cd = gpu_upload(be, core, T * V);
        void *sq = ids(be, &seq1, 1), *states = zero_states(be, 2 * per), *base, *qkv;
        void *o = gpu_guarded(be, T * c.C, &base);
        be->ops->gdn_conv(be, zd, c.conv[i], T, g, NULL, NULL, NULL, o);
        cv[i] = gpu_fetch(be, base, T * c.C, "gdn_conv");
        qkv = gpu_upload(be, cv[0], T * c.C); /* both rules on the CPU's conv output */
        o = gpu_guarded(be, T * V, &base);
        be->ops->gdn_chunked(be, qkv, bad, c.al[i], c.dt[i], T, g, states, sq, NULL, o);
        ru[i] = gpu_fetch(be, base, T * V, "gdn_chunked");
        st[i] = fetch_states(be, (float *)states + per, per);
        o = gpu_guarded(be, T * V, &base);
        be->ops->gdn_norm_gate(be, cd, zd, c.nw[i], T, g, 1e-6f, o, NULL);
        ng[i] = gpu_fetch(be, base, T * V, "gdn_norm_gate");
        be->ops->free(be, zd), be->ops->free(be, bad), be->ops->free(be, cd), be->ops->free(be, sq);
        be->ops->free(be, states), be->ops->free(be, qkv);
    }
    char sh[96], what[192];
    snprintf(what, sizeof what, "gdn_conv %s T=%lld", shape_str(&c, sh, sizeof sh), (long long)T);
    gpu_expect_close(cv[1], cv[0], T * c.C, bound(&c.b), what);
    snprintf(what, sizeof what, "gdn_chunked %s T=%lld", sh, (long long)T);
    gpu_expect_close(ru[1], ru[0], T * V, bound(&c.b), what);
    gpu_expect_close(st[1], st[0], per, bound(&c.b) > 1e-4 ? 1e-2 : 1e-5, "  its final state (fp32)");
    snprintf(what, sizeof what, "gdn_norm_gate %s T=%lld", sh, (long long)T);
    gpu_expect_close(ng[1], ng[0], T * V, bound(&c.b), what);
    for (int i = 0; i < 2; i++) free(cv[i]), free(ru[i]), free(st[i]), free(ng[i]);
    free(qkvz), free(ba), free(core);
    gdn_free(&c);
}

static const fm_gdn_shape small_shape = {2, 4, 16, 12, 4}; /* qwen3-next-bf16 / -f32 */
static const fm_gdn_shape tied_shape = {2, 2, 8, 10, 3};   /* qwen3-next-tied-f32 */
static const fm_gdn_shape big_shape = {2, 4, 128, 128, 4}; /* Qwen3-Next-80B-A3B's heads (fewer of them) */
/* conv kernels of 6 and 10 taps: the GPU conv's 8-tap window and its per-token form */
static const fm_gdn_shape taps6_shape = {1, 2, 16, 12, 6}, taps10_shape = {1, 1, 8, 8, 10};

static void test_gdn_fresh(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 63, 64, 65, 1000};
    const fm_preset ps[] = {FM_PRESET_REF32, FM_PRESET_REF};
    for (int pi = 0; pi < 2; pi++)
        for (int i = 0; i < 5; i++) {
            fresh_case(ps[pi], small_shape, Ts[i]);
            fresh_case(ps[pi], big_shape, Ts[i]);
        }
    fresh_case(FM_PRESET_REF32, tied_shape, 65);
    fresh_case(FM_PRESET_REF32, taps6_shape, 65), fresh_case(FM_PRESET_REF32, taps10_shape, 65);
    fresh_case(FM_PRESET_REF, big_shape, 2100); /* gdn.tc=on: two segments of the tensor-core form */
}

/* The recurrent step against the chunked result, on the GPU: the chunked rule over T tokens (its outputs and final
   state) equals the first `split` tokens chunked (their state kept) followed by the rest token by token (positions
   split..T-1, the state carried), the first `split` chunked followed by the rest chunked from that state (a prompt
   chunk at position split, as the server's steps run them), and the whole sequence token by token. ref32: the same
   kernel in both forms, only
   the summation order differs; ref with dk = dv = 128: under --route gdn.tc=on the chunked form on tensor cores (TF32
   products) against the token-by-token kernel, over segments of 2048 tokens at T = 2100. */
static void recurrent_vs_chunked(fm_preset p, fm_gdn_shape g, int64_t T, int64_t split) {
    gdn_case c = gdn_make(p, g);
    fm_backend *be = c.b.be[1];
    const int64_t V = (int64_t)g.nv * g.dv, per = fm_gdn_rec_state_elems(g);
    float *qkv = rand_array(T * c.C, 1.0f), *ba = rand_array(T * 2 * g.nv, 2.0f);
    int32_t *seq = malloc((size_t)T * sizeof *seq), *pos = malloc((size_t)T * sizeof *pos);
    for (int64_t t = 0; t < T; t++) seq[t] = 0, pos[t] = (int32_t)t;
    void *qd = gpu_upload(be, qkv, T * c.C), *bad = gpu_upload(be, ba, T * 2 * g.nv);
    void *sd = ids(be, seq, T), *pd = ids(be, pos, T), *base;
    float *states = zero_states(be, per);
    void *o = gpu_guarded(be, T * V, &base);
    be->ops->gdn_chunked(be, qd, bad, c.al[1], c.dt[1], T, g, states, sd, pd, o);
    float *ref = gpu_fetch(be, base, T * V, "gdn_chunked"), *ref_st = fetch_states(be, states, per);
    const double e = bound(&c.b);
    /* the whole sequence token by token */
    o = gpu_guarded(be, T * V, &base);
    be->ops->gdn_recurrent(be, qd, bad, c.al[1], c.dt[1], T, g, states, sd, pd, o);
    float *all = gpu_fetch(be, base, T * V, "gdn_recurrent"), *all_st = fetch_states(be, states, per);
    /* split tokens chunked, the rest recurrent: one output buffer, two launches */
    o = gpu_guarded(be, T * V, &base);
    be->ops->gdn_chunked(be, qd, bad, c.al[1], c.dt[1], split, g, states, sd, pd, o);
    const size_t a = be->ops->act_size;
    be->ops->gdn_recurrent(be, (char *)qd + split * c.C * a, (char *)bad + split * 2 * g.nv * a, c.al[1], c.dt[1],
                           T - split, g, states, (int32_t *)sd + split, (int32_t *)pd + split,
                           (char *)o + split * V * a);
    float *two = gpu_fetch(be, base, T * V, "gdn_chunked + gdn_recurrent"), *two_st = fetch_states(be, states, per);
    /* split tokens chunked, the rest chunked from their state (the state left by the calls above is overwritten:
       position 0 starts from zero) */
    o = gpu_guarded(be, T * V, &base);
    be->ops->gdn_chunked(be, qd, bad, c.al[1], c.dt[1], split, g, states, sd, pd, o);
    be->ops->gdn_chunked(be, (char *)qd + split * c.C * a, (char *)bad + split * 2 * g.nv * a, c.al[1], c.dt[1],
                         T - split, g, states, (int32_t *)sd + split, (int32_t *)pd + split, (char *)o + split * V * a);
    float *cc = gpu_fetch(be, base, T * V, "gdn_chunked twice"), *cc_st = fetch_states(be, states, per);
    char sh[96], what[192];
    snprintf(what, sizeof what, "gdn_recurrent vs chunked %s T=%lld", shape_str(&c, sh, sizeof sh), (long long)T);
    gpu_expect_close(all, ref, T * V, e, what);
    gpu_expect_close(all_st, ref_st, per, e, "  final state");
    snprintf(what, sizeof what, "  chunked to %lld, then recurrent", (long long)split);
    gpu_expect_close(two, ref, T * V, e, what);
    gpu_expect_close(two_st, ref_st, per, e, "  final state");
    snprintf(what, sizeof what, "  chunked to %lld, then chunked from its state", (long long)split);
    gpu_expect_close(cc, ref, T * V, e, what);
    gpu_expect_close(cc_st, ref_st, per, e, "  final state");
    free(ref), free(ref_st), free(all), free(all_st), free(two), free(two_st), free(cc), free(cc_st);
    free(qkv), free(ba), free(seq), free(pos);
    be->ops->free(be, qd), be->ops->free(be, bad), be->ops->free(be, sd), be->ops->free(be, pd);
    be->ops->free(be, states);
    gdn_free(&c);
}

static void test_gdn_recurrent_vs_chunked(void **s) {
    (void)s;
    recurrent_vs_chunked(FM_PRESET_REF32, small_shape, 200, 64);
    recurrent_vs_chunked(FM_PRESET_REF32, big_shape, 130, 65);
    recurrent_vs_chunked(FM_PRESET_REF32, tied_shape, 70, 1);
    recurrent_vs_chunked(FM_PRESET_REF, big_shape, 130, 65);
    recurrent_vs_chunked(FM_PRESET_REF, big_shape, 612, 100); /* a 512-token chunk after 100 tokens */
    recurrent_vs_chunked(FM_PRESET_REF, big_shape, 2100, 2049);
}

/* Multi-sequence steps on both backends, the conv and recurrent states carried: a prompt of sequence 2 (positions
   0..4, as a prefill chunk token by token), then a mixed step (sequence 2 at 5..7, sequence 0 at 0..2, sequence 3 at
   0), then decode steps of one token per sequence (2, 0, 3) with `pad` padding rows (copies of row 0) on the GPU only.
   Outputs of the real rows and the states of all four sequences compared after every step. */
static void multi_seq_case(fm_preset p, fm_gdn_shape g, int32_t pad) {
    gdn_case c = gdn_make(p, g);
    const int64_t V = (int64_t)g.nv * g.dv, pr = fm_gdn_rec_state_elems(g), pc = fm_gdn_conv_state_elems(g);
    const int32_t S = 4;
    float *conv_st[2], *rec_st[2];
    for (int i = 0; i < 2; i++) {
        conv_st[i] = zero_states(c.b.be[i], S * pc), rec_st[i] = zero_states(c.b.be[i], S * pr);
    }
    int32_t next_pos[4] = {0, 0, 0, 0};
    typedef struct step {
        int32_t n, seqs[8];
    } step;
    const step steps[] = {{5, {2, 2, 2, 2, 2}}, {7, {2, 2, 2, 0, 0, 0, 3}}, {3, {2, 0, 3}}, {3, {2, 0, 3}}, {1, {3}},
                          {3, {0, 3, 2}}};
    for (size_t si = 0; si < sizeof steps / sizeof *steps; si++) {
        const int32_t n = steps[si].n, B = n + pad;
        int32_t seq[16], pos[16];
        for (int32_t j = 0; j < n; j++) seq[j] = steps[si].seqs[j], pos[j] = next_pos[seq[j]]++;
        for (int32_t j = n; j < B; j++) seq[j] = seq[0], pos[j] = pos[0];
        float *qkvz = rand_array(B * c.Wz, 1.0f), *ba = rand_array(B * 2 * g.nv, 2.0f), *cv[2], *ru[2], *cs[2], *rs[2];
        for (int i = 0; i < 2; i++) {
            fm_backend *be = c.b.be[i];
            const int32_t rows = i == 0 ? n : B; /* the CPU gets the real rows only */
            void *zd = gpu_upload(be, qkvz, rows * c.Wz), *bad = gpu_upload(be, ba, rows * 2 * g.nv);
            void *sd = ids(be, seq, rows), *pd = ids(be, pos, rows), *base;
            void *o = gpu_guarded(be, rows * c.C, &base);
            be->ops->gdn_conv(be, zd, c.conv[i], rows, g, conv_st[i], sd, pd, o);
            cv[i] = gpu_fetch(be, base, rows * c.C, "gdn_conv (states)");
            void *qd = gpu_upload(be, cv[i], rows * c.C);
            o = gpu_guarded(be, rows * V, &base);
            be->ops->gdn_recurrent(be, qd, bad, c.al[i], c.dt[i], rows, g, rec_st[i], sd, pd, o);
            ru[i] = gpu_fetch(be, base, rows * V, "gdn_recurrent (states)");
            cs[i] = fetch_states(be, conv_st[i], S * pc), rs[i] = fetch_states(be, rec_st[i], S * pr);
            be->ops->free(be, zd), be->ops->free(be, bad), be->ops->free(be, sd), be->ops->free(be, pd);
            be->ops->free(be, qd);
        }
        char sh[96], what[192];
        snprintf(what, sizeof what, "multi-sequence step %zu (%d rows + %d padding) %s: gdn_conv", si, n, pad,
                 shape_str(&c, sh, sizeof sh));
        gpu_expect_close(cv[1], cv[0], n * c.C, bound(&c.b), what);
        gpu_expect_close(cs[1], cs[0], S * pc, 1e-6 + (bound(&c.b) > 1e-4 ? 1e-2 : 0), "  conv states");
        gpu_expect_close(ru[1], ru[0], n * V, bound(&c.b), "  gdn_recurrent");
        gpu_expect_close(rs[1], rs[0], S * pr, bound(&c.b) > 1e-4 ? 1e-2 : 1e-5, "  recurrent states");
        for (int i = 0; i < 2; i++) free(cv[i]), free(ru[i]), free(cs[i]), free(rs[i]);
        free(qkvz), free(ba);
    }
    for (int i = 0; i < 2; i++) {
        c.b.be[i]->ops->free(c.b.be[i], conv_st[i]);
        c.b.be[i]->ops->free(c.b.be[i], rec_st[i]);
    }
    gdn_free(&c);
}

static void test_gdn_multi_sequence(void **s) {
    (void)s;
    const fm_preset ps[] = {FM_PRESET_REF32, FM_PRESET_REF};
    for (int pi = 0; pi < 2; pi++) {
        multi_seq_case(ps[pi], small_shape, 0);
        multi_seq_case(ps[pi], small_shape, 5);
        multi_seq_case(ps[pi], tied_shape, 1);
        multi_seq_case(ps[pi], big_shape, 3);
        multi_seq_case(ps[pi], taps6_shape, 2);
        multi_seq_case(ps[pi], taps10_shape, 1);
    }
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gated_qk_norm_rope), cmocka_unit_test(test_gates),
        cmocka_unit_test(test_gdn_fresh),          cmocka_unit_test(test_gdn_recurrent_vs_chunked),
        cmocka_unit_test(test_gdn_multi_sequence),
    };
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
