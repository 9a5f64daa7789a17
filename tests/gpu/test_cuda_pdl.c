/* Programmatic dependent launch (route pdl) changes when a decode step's kernels start, never what they compute:
 * every kernel of a step waits for the earlier ones before it reads their outputs or writes anything they read
 * (src/backend/cuda/pdl.cuh). So decode steps replayed as CUDA graphs give, under the default routes (pdl on from
 * sm_90) and under pdl=off, the same logits bit for bit, the same sampled ids and the same log-probabilities.
 *
 * For each bundled model (Qwen3-MoE and Qwen3-Next golden checkpoints, the trained tiny-code-moe), each preset the
 * sibling graph tests cover (ref, int4, fp8, fp8 with --dense w8a8, ref32) and each route set of a decode step's
 * alternative kernels (the defaults; paged.combine=fused; decode.fused=on), one model loaded with pdl on and one with
 * pdl=off run the same batches: B = 1, 4 and 24 sequences (the last padded to the 32-row bucket: padding rows, the
 * GEMM paths above the decode GEMVs' rows), prompts of unequal lengths prefilled one by one, then STEPS decode steps
 * through fm_decode_step (the first step of a bucket launched kernel by kernel, the second captured into the
 * bucket's graph, the rest replays of it), half the rows greedy and half sampled. A mismatch names the model, preset,
 * routes, B, step, row and logit. Where the GPU has no PDL (below sm_90) both runs launch normally and the test says
 * so.
 *
 * The moe op alone (the MoE dispatch's kernels: the one-block decode dispatch, the grouped one's plan, slot, amax and
 * gather kernels, none of which may need a buffer zeroed by a memset) is compared the same way on one backend per
 * route: LAYERS calls in a row, each on the previous one's output with its own routing, at T = 1, 8, 64 and 300, for
 * the e4m3, MXFP4 and NVFP4 dispatch on int4-tc banks (a width I that is a multiple of 128 and one that is not: the
 * pad columns of h the dispatch zeroes) and for fold banks (w4a8.kernel=fold: per-token rows).
 *
 * Likewise, with the same decode batches at the fp8 preset, the routes whose values promise the same bits
 * (SAME_BITS: each pair's two sides, pdl as the device's default). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/routes.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "fold_test_util.h"
#include "gpu_test_util.h"

#define STEPS 6
#define MAX_B 24

static const int32_t BATCHES[] = {1, 4, MAX_B};
#define N_BATCHES ((int)(sizeof BATCHES / sizeof *BATCHES))

typedef struct preset_case {
    fm_preset preset;
    bool w8a8;
    const char *name;
} preset_case;

static const preset_case PRESETS[] = {
    {FM_PRESET_REF, false, "ref"},       {FM_PRESET_INT4, false, "int4"},   {FM_PRESET_FP8, false, "fp8"},
    {FM_PRESET_FP8, true, "fp8 + w8a8"}, {FM_PRESET_REF32, false, "ref32"},
};

/* the alternative kernels of a decode step that PDL must also leave bit for bit */
static const char *const ROUTE_SETS[] = {"", "paged.combine=fused", "decode.fused=on"};

/* what one model's decode steps produced, per batch: [STEPS][B] ids and log-probabilities, [STEPS][B][V] logits */
typedef struct decode_run {
    int32_t ids[N_BATCHES][STEPS][MAX_B];
    float lps[N_BATCHES][STEPS][MAX_B];
    float *logits[N_BATCHES];
    int32_t V;                  /* the vocabulary */
    bool pdl;                   /* the loaded model's route pdl */
    int64_t kernels[N_BATCHES]; /* kernel nodes of the batch's decode graph */
} decode_run;

static fm_model *load(const char *dir, const preset_case *p, const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = p->preset, opt.dense = p->w8a8 ? FM_DENSE_W8A8 : FM_DENSE_PRESET;
    opt.max_seqs = MAX_B, opt.ctx = 128, opt.max_tokens = 64, opt.routes = routes;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s (%s, routes %s): %s", dir, p->name, routes, err.msg);
    return m;
}

/* B sequences prefilled one by one (prompt i: 9 + 3 (i % 4) tokens), then STEPS decode steps of all B */
static void decode_batch(fm_model *m, int32_t B, int bi, decode_run *r) {
    const int32_t V = fm_model_vocab_size(m);
    int32_t seq[MAX_B], in[MAX_B];
    fm_error err = {{0}};
    for (int32_t i = 0; i < B; i++) {
        const int32_t P = 9 + 3 * (i % 4);
        int32_t prompt[24], seqs[24], pos[24];
        for (int32_t t = 0; t < P + 1; t++) prompt[t] = (t * 13 + i * 101 + 5) % V;
        fm_sampling sp;
        fm_sampling_init(&sp);
        if (i % 2) sp.temperature = 0.8f, sp.seed = 9 + (uint64_t)i, sp.top_k = i % 4 == 3 ? 20 : 0;
        if (fm_kv_seq_begin(m->context, prompt, P, &sp, &seq[i], &err)) fail_msg("seq_begin: %s", err.msg);
        if (fm_kv_seq_append(&m->context->kv->pool, seq[i], P, &err)) fail_msg("seq_append: %s", err.msg);
        m->context->kv->tables_dirty = true;
        for (int32_t t = 0; t < P; t++) seqs[t] = seq[i], pos[t] = t;
        if (fm_step_stage(m->context, prompt, seqs, pos, P, &err)) fail_msg("stage: %s", err.msg);
        fm_step_device(m->context, P, true, FM_ATTN_FRESH);
        in[i] = prompt[P];
    }
    for (int s = 0; s < STEPS; s++) {
        if (fm_decode_step(m->context, B, in, seq, r->ids[bi][s], r->lps[bi][s], &err))
            fail_msg("decode step %d of %d rows: %s", s, B, err.msg);
        if (fm_step_logits(m->context, B, r->logits[bi] + (size_t)s * B * V, &err)) fail_msg("logits: %s", err.msg);
        memcpy(in, r->ids[bi][s], (size_t)B * sizeof *in);
    }
    fm_graph_nodes nodes;
    r->kernels[bi] = fm_decode_graph_nodes(m->context, B, &nodes) ? nodes.kernels : -1;
    for (int32_t i = 0; i < B; i++) fm_kv_seq_end(m->context, seq[i]);
}

static void run_model(const char *dir, const preset_case *p, const char *routes, decode_run *r) {
    fm_model *m = load(dir, p, routes);
    const int32_t V = r->V = fm_model_vocab_size(m);
    r->pdl = fm_routes_pdl(&m->routes);
    for (int bi = 0; bi < N_BATCHES; bi++) {
        r->logits[bi] = malloc((size_t)STEPS * BATCHES[bi] * V * sizeof(float));
        assert_non_null(r->logits[bi]);
        decode_batch(m, BATCHES[bi], bi, r);
    }
    fm_model_free(m);
}

/* "extra,pdl=..." and then the command line's routes (later keys win) */
static void routes_of(char *buf, size_t n, const char *extra, const char *pdl) {
    const char *cl = gpu_test_routes();
    snprintf(buf, n, "%s%s%s%s%s", extra, extra[0] && pdl[0] ? "," : "", pdl, cl && (extra[0] || pdl[0]) ? "," : "",
             cl ? cl : "");
}

/* fails naming the first difference, if any, between run on (routes a) and run off (routes b) */
static void expect_same(const char *dir, const preset_case *p, const char *a_routes, const char *b_routes, int32_t V,
                        const decode_run *on, const decode_run *off) {
    for (int bi = 0; bi < N_BATCHES; bi++) {
        const int32_t B = BATCHES[bi];
        for (int s = 0; s < STEPS; s++)
            for (int32_t i = 0; i < B; i++) {
                const float *a = on->logits[bi] + ((size_t)s * B + i) * V,
                            *b = off->logits[bi] + ((size_t)s * B + i) * V;
                for (int32_t v = 0; v < V; v++)
                    if (memcmp(&a[v], &b[v], sizeof *a))
                        fail_msg("%s %s B=%d step %d row %d: logit %d differs with routes '%s' (%.9g) and '%s' "
                                 "(%.9g)",
                                 dir, p->name, B, s, i, v, a_routes, (double)a[v], b_routes, (double)b[v]);
                if (on->ids[bi][s][i] != off->ids[bi][s][i] || memcmp(&on->lps[bi][s][i], &off->lps[bi][s][i], 4))
                    fail_msg("%s %s B=%d step %d row %d: sampled %d (%.9g) with routes '%s', %d (%.9g) with '%s'", dir,
                             p->name, B, s, i, on->ids[bi][s][i], (double)on->lps[bi][s][i], a_routes,
                             off->ids[bi][s][i], (double)off->lps[bi][s][i], b_routes);
            }
    }
}

static void pdl_same_logits(const char *dir, const preset_case *presets, int n_presets) {
    static decode_run on, off; /* large: not on the stack */
    int pdl_runs = 0;
    for (int pi = 0; pi < n_presets; pi++)
        for (size_t ri = 0; ri < sizeof ROUTE_SETS / sizeof *ROUTE_SETS; ri++) {
            const preset_case *p = &presets[pi];
            const char *extra = ROUTE_SETS[ri];
            char r_on[300], r_off[300];
            routes_of(r_on, sizeof r_on, extra, "");
            routes_of(r_off, sizeof r_off, extra, "pdl=off");
            run_model(dir, p, r_on[0] ? r_on : NULL, &on);
            run_model(dir, p, r_off, &off);
            assert_false(off.pdl);
            assert_int_equal(on.V, off.V);
            for (int bi = 0; bi < N_BATCHES; bi++) /* the steps compared were graph replays */
                assert_true(on.kernels[bi] > 0 && off.kernels[bi] > 0);
            expect_same(dir, p, r_on, r_off, on.V, &on, &off);
            pdl_runs += on.pdl;
            printf(
                "  %-30s %-10s routes '%s': pdl %s vs off, B = 1 / 4 / %d, %d steps: logits, ids and log-probabilities "
                "bit for bit (graph kernels %lld / %lld / %lld)\n",
                dir, p->name, extra, on.pdl ? "on" : "unavailable (both launched normally)", MAX_B, STEPS,
                (long long)on.kernels[0], (long long)on.kernels[1], (long long)on.kernels[2]);
            for (int bi = 0; bi < N_BATCHES; bi++) free(on.logits[bi]), free(off.logits[bi]);
        }
    if (!pdl_runs) printf("  %s: this GPU has no PDL (sm_90 and later): pdl on was never exercised\n", dir);
}

static void test_qwen3_moe(void **state) {
    (void)state;
    pdl_same_logits("tests/models/qwen3-moe-bf16", PRESETS, (int)(sizeof PRESETS / sizeof *PRESETS));
}

static void test_qwen3_next(void **state) {
    (void)state;
    pdl_same_logits("tests/models/qwen3-next-bf16", PRESETS, (int)(sizeof PRESETS / sizeof *PRESETS));
}

static void test_tiny_code_moe(void **state) {
    (void)state;
    pdl_same_logits("models/tiny-code-moe", &PRESETS[2], 2); /* fp8, fp8 + w8a8 */
}

/* ---- routes whose two values promise the same bits ------------------------------------------------------------ */

/* Routes documented as choosing where a value is computed, never its bits (docs/routes.md), each pair's two sides
 * loaded as two models of the fp8 preset and compared as above: the dense projections' input quantized by its
 * producer or by a launch of its own (Qwen3-Next: the Gated DeltaNet's qkvz too), the Gated DeltaNet in one kernel
 * or three, the add + norm before the one-token MoE block inside the persistent block or before it, the block's two
 * grid barriers. */
static const char *const SAME_BITS[][2] = {
    {"dense.quant=producer", "dense.quant=kernel"},
    {"gdn.decode_fused=on", "gdn.decode_fused=off"},
    {"moe.block_norm=on", "moe.block_norm=off"},
    {"moe.block_barrier=count", "moe.block_barrier=generation"},
};

static void routes_same_logits(const char *dir) {
    static decode_run a, b; /* large: not on the stack */
    const preset_case *p = &PRESETS[2];
    for (size_t i = 0; i < sizeof SAME_BITS / sizeof *SAME_BITS; i++) {
        char ra[300], rb[300];
        routes_of(ra, sizeof ra, SAME_BITS[i][0], "");
        routes_of(rb, sizeof rb, SAME_BITS[i][1], "");
        run_model(dir, p, ra, &a);
        run_model(dir, p, rb, &b);
        assert_int_equal(a.V, b.V);
        for (int bi = 0; bi < N_BATCHES; bi++) assert_true(a.kernels[bi] > 0 && b.kernels[bi] > 0);
        expect_same(dir, p, ra, rb, a.V, &a, &b);
        printf("  %-30s %-10s routes '%s' vs '%s', B = 1 / 4 / %d, %d steps: bit for bit (graph kernels %lld / %lld "
               "at B = 1)\n",
               dir, p->name, SAME_BITS[i][0], SAME_BITS[i][1], MAX_B, STEPS, (long long)a.kernels[0],
               (long long)b.kernels[0]);
        for (int bi = 0; bi < N_BATCHES; bi++) free(a.logits[bi]), free(b.logits[bi]);
    }
}

static void test_same_bits_routes(void **state) {
    (void)state;
    routes_same_logits("tests/models/qwen3-next-bf16");
    routes_same_logits("tests/models/qwen3-moe-bf16");
}

/* ---- the moe op alone ---------------------------------------------------------------------------------------- */

#define MOE_LAYERS 3
static const int64_t MOE_TOKENS[] = {1, 8, 64, 300};
#define N_MOE_TOKENS ((int)(sizeof MOE_TOKENS / sizeof *MOE_TOKENS))

/* a cuda backend of the fp8 preset with dispatch d and routes "extra,pdl" (and the command line's); *pdl_on: whether
   its route table (the device's defaults, then those routes, as the backend fills it) has pdl on */
static fm_backend *moe_backend(fm_dispatch d, const char *extra, const char *pdl, bool *pdl_on) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_error err = {{0}};
    if (fm_plan_set_dispatch(&plan, d, &err)) fail_msg("dispatch %s: %s", fm_dispatch_name(d), err.msg);
    char routes[300];
    routes_of(routes, sizeof routes, extra, pdl);
    fm_backend *be = NULL;
    if (fm_backend_create("cuda", &plan, 0, routes[0] ? routes : NULL, &be, &err))
        fail_msg("cuda backend (routes '%s'): %s", routes, err.msg);
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    fm_routes r;
    fm_routes_default(&r, major);
    if (routes[0] && fm_routes_apply(&r, routes, &err)) fail_msg("routes '%s': %s", routes, err.msg);
    *pdl_on = fm_routes_pdl(&r);
    return be;
}

/* MOE_LAYERS moe calls on be, layer l on the RMS-normalised output of layer l - 1 (as a model's next layer reads
   it: the SwiGLU is quadratic, so raw outputs fed on shrink towards zero or grow without bound within a few layers)
   with the routing ids + l T k; the last output */
static float *moe_chain(fm_backend *be, const fm_bank *gu, const fm_bank *dn, const float *x, int64_t T, int64_t H,
                        const int32_t *ids, const float *w, int32_t k) {
    void *buf[2] = {gpu_upload(be, x, T * H), gpu_upload(be, x, T * H)}, *base, *idd[MOE_LAYERS];
    void *wd = gpu_upload(be, w, T * k), *out = gpu_guarded(be, T * H, &base), *y = gpu_upload(be, x, T * H);
    float *ones = malloc((size_t)H * sizeof *ones);
    for (int64_t i = 0; i < H; i++) ones[i] = 1.0f;
    fm_bank *norm = gpu_bank(be, ones, 1, 1, H, be->plan.w_other, false);
    for (int l = 0; l < MOE_LAYERS; l++) {
        idd[l] = be->ops->alloc(be, (size_t)(T * k) * sizeof(int32_t));
        be->ops->upload_ids(be, ids + l * T * k, T * k, idd[l]);
    }
    for (int l = 0; l < MOE_LAYERS; l++) {
        be->ops->moe(be, gu, dn, buf[l % 2], T, idd[l], wd, k, be->plan.a_dispatch, be->plan.a_expert,
                     l == MOE_LAYERS - 1 ? out : y);
        if (l < MOE_LAYERS - 1) be->ops->rmsnorm(be, y, norm, T, H, 1e-6f, buf[(l + 1) % 2]);
    }
    float *o = gpu_fetch(be, base, T * H, "moe chain");
    for (int l = 0; l < MOE_LAYERS; l++) be->ops->free(be, idd[l]);
    be->ops->free(be, buf[0]), be->ops->free(be, buf[1]), be->ops->free(be, wd), be->ops->free(be, y);
    be->ops->bank_free(be, norm);
    free(ones);
    return o;
}

/* x [T][H], weights, and MOE_LAYERS routings of T tokens to k distinct experts of E (k <= E, 3 coprime with E) */
static void moe_input(int64_t T, int64_t H, int32_t E, int32_t k, float *x, int32_t *ids, float *w) {
    for (int64_t i = 0; i < T * H; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    for (int64_t i = 0; i < T * k; i++) w[i] = 0.25f + (float)(i % 5) / 8.0f;
    for (int l = 0; l < MOE_LAYERS; l++)
        for (int64_t t = 0; t < T; t++)
            for (int32_t j = 0; j < k; j++) ids[(l * T + t) * k + j] = (int32_t)((5 * t + 3 * j + 7 * l) % E);
}

/* the chain on both backends (pdl on, off) with their own banks (bank[0] on on, bank[1] on off): bit for bit */
static void moe_compare(fm_backend *const be[2], fm_bank *const gu[2], fm_bank *const dn[2], int32_t E, int32_t k,
                        int64_t H, bool pdl_on, const char *what) {
    for (int ti = 0; ti < N_MOE_TOKENS; ti++) {
        const int64_t T = MOE_TOKENS[ti];
        float *x = malloc((size_t)(T * H) * sizeof(float)), *w = malloc((size_t)(T * k) * sizeof(float));
        int32_t *ids = malloc((size_t)(MOE_LAYERS * T * k) * sizeof(int32_t));
        moe_input(T, H, E, k, x, ids, w);
        float *o[2];
        for (int i = 0; i < 2; i++) o[i] = moe_chain(be[i], gu[i], dn[i], x, T, H, ids, w, k);
        float amax = 0.0f;
        for (int64_t i = 0; i < T * H; i++) {
            if (memcmp(&o[0][i], &o[1][i], sizeof(float)))
                fail_msg("moe %s T=%lld: output %lld (token %lld) %.9g with pdl on, %.9g off", what, (long long)T,
                         (long long)i, (long long)(i / H), (double)o[0][i], (double)o[1][i]);
            amax = fabsf(o[0][i]) > amax ? fabsf(o[0][i]) : amax;
        }
        if (!(amax > 0.0f)) fail_msg("moe %s T=%lld: the output is all zeros (nothing compared)", what, (long long)T);
        printf("  moe %-44s T = %3lld, %d layers: pdl %s vs off bit for bit (max |out| %.3g)\n", what, (long long)T,
               MOE_LAYERS, pdl_on ? "on" : "unavailable", (double)amax);
        free(o[0]), free(o[1]), free(x), free(w), free(ids);
    }
}

static void moe_case_tc(fm_dispatch d, int32_t E, int32_t k, int64_t H, int64_t I) {
    float *gw = malloc((size_t)((int64_t)E * 2 * I * H) * sizeof(float)), *dw = malloc((size_t)(E * H * I) * 4);
    for (int64_t i = 0; i < (int64_t)E * 2 * I * H; i++) gw[i] = (float)((i * 2654435761u) % 2001 - 1000) / 2e4f;
    for (int64_t i = 0; i < (int64_t)E * H * I; i++) dw[i] = (float)((i * 40503u) % 2001 - 1000) / 2e4f;
    bool on[2];
    fm_backend *be[2] = {moe_backend(d, "", "", &on[0]), moe_backend(d, "", "pdl=off", &on[1])};
    assert_false(on[1]);
    fm_bank *gu[2], *dn[2];
    for (int i = 0; i < 2; i++)
        gu[i] = gpu_bank(be[i], gw, E, 2 * I, H, FM_W_INT4_G128_TC, true),
        dn[i] = gpu_bank(be[i], dw, E, H, I, FM_W_INT4_G128_TC, false);
    char what[96];
    snprintf(what, sizeof what, "int4-tc dispatch %s E=%d k=%d H=%lld I=%lld", fm_dispatch_name(d), E, k, (long long)H,
             (long long)I);
    moe_compare(be, gu, dn, E, k, H, on[0], what);
    for (int i = 0; i < 2; i++)
        be[i]->ops->bank_free(be[i], gu[i]), be[i]->ops->bank_free(be[i], dn[i]), be[i]->ops->destroy(be[i]);
    free(gw), free(dw);
}

static void test_moe_op(void **state) {
    (void)state;
    const fm_dispatch ds[] = {FM_DISPATCH_PRESET, FM_DISPATCH_MXFP4, FM_DISPATCH_NVFP4};
    for (int di = 0; di < 3; di++) {
        moe_case_tc(ds[di], 32, 8, 1024, 384); /* widths of multiples of 128 */
        moe_case_tc(ds[di], 13, 5, 384, 200);  /* I % 128 = 72: the pad of h */
    }
    if (!fold_have_sm90()) return;
    fold_seed(61);
    const int32_t E = 16, k = 8;
    const int64_t H = 1024, I = 384;
    p2_bank gu = fold_make_bank_random(E, 2 * I, H, false), dn = fold_make_bank_random(E, H, I, false);
    fold_experts *src = fold_experts_make(&gu, &dn);
    bool on[2];
    fm_backend *be[2] = {moe_backend(FM_DISPATCH_PRESET, "w4a8.kernel=fold", "", &on[0]),
                         moe_backend(FM_DISPATCH_PRESET, "w4a8.kernel=fold", "pdl=off", &on[1])};
    assert_false(on[1]);
    fm_bank *gb[2], *db[2];
    for (int i = 0; i < 2; i++) fold_experts_banks(be[i], src, &gb[i], &db[i]);
    moe_compare(be, gb, db, E, k, H, on[0], "fold E=16 k=8 H=1024 I=384");
    for (int i = 0; i < 2; i++)
        be[i]->ops->bank_free(be[i], gb[i]), be[i]->ops->bank_free(be[i], db[i]), be[i]->ops->destroy(be[i]);
    fold_experts_free(src);
    fold_free_bank(&gu), fold_free_bank(&dn);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_qwen3_next),       cmocka_unit_test(test_tiny_code_moe),
        cmocka_unit_test(test_moe_op),    cmocka_unit_test(test_same_bits_routes),
    };
    /* FM_TEST_FILTER=test_moe_op runs the moe op's case alone (e.g. under compute-sanitizer) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
