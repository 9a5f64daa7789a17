/* Expert parallelism on the cuda backend (dist/ep_moe.h; backend/cuda/moe_dispatch.cu, moe_w4a8.cu): --ep 2 and 4,
 * every rank on this GPU holding its share of the experts, the rows exchanged in the dispatch format (e4m3, MXFP4,
 * NVFP4; ref's bf16 and ref32's fp32 rows) by the simulated world staged through each rank's backend (dist/comm.h).
 * Against one model on the GPU with the same plan (fp8 or fp4 preset: W4A8 experts; ref, ref32: cuBLAS experts), a
 * 23-token prompt:
 *   - the logits: every argmax the same, and the RMS distance to the ref32 oracle within 1.01x one model's (the rows
 *     are quantized as the one model quantizes them and each expert computes a row alone; what may differ is the
 *     tile height the grouped GEMM picks for the received rows, which the test reports as bits equal or not);
 *   - greedy generation of 12 tokens through the paged KV cache (decode steps without graphs): the same ids as one
 *     model running its decode experts on the grouped GEMM (moe.gemv=off), logprobs within 1e-3 (measured: equal).
 * And the ops alone against the CPU backend's (test_ep_ops): amax (NVFP4's tensor scale kept on the device);
 * ep_dispatch's blocks byte for byte (counts, local ids, the rows' codes and scales in each format) and its ret_row;
 * moe_blocks on the same received blocks within the moe op's bound; ep_combine on the same return rows. Runs only where
 * a GPU is present. */
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
#include "backend/dispatch_row.h"
#include "backend/ep_blocks.h"
#include "dist/rank_group.h"
#include "quant/bf16.h"
#include "quant/e2m1.h"
#include "engine/engine.h"
#include "../logits_diff.h"
#include "gpu_test_util.h"

static fm_options options(fm_preset p, const char *backend) {
    fm_options o;
    fm_options_init(&o);
    o.backend = backend, o.preset = p, o.routes = gpu_test_routes();
    o.max_seqs = 1, o.ctx = 64, o.max_tokens = 32;
    return o;
}

static float *logits_of(fm_model *m, fm_rank_group *g, const int32_t *ids, int64_t T) {
    const int32_t V = fm_model_vocab_size(g ? g->models[0] : m);
    float *out = malloc((size_t)T * (size_t)V * sizeof *out);
    fm_error err = {{0}};
    const fm_status st =
        g ? fm_rank_group_forward(g, ids, T, false, out, &err) : fm_forward(m->context, ids, T, false, out, NULL, &err);
    if (st) fail_msg("forward: %s", err.msg);
    return out;
}

static void ep_case(const char *dir, int n_ranks, fm_preset preset, fm_dispatch dispatch) {
    fm_options o = options(preset, "cuda"), ro = options(FM_PRESET_REF32, "cuda");
    o.dispatch = dispatch;
    char plan[48];
    snprintf(plan, sizeof plan, "%s%s%s", fm_preset_name(preset), dispatch ? " --dispatch " : "",
             dispatch ? fm_dispatch_name(dispatch) : "");
    fm_model *one = NULL, *oracle = NULL;
    fm_rank_group *g = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &o, &one, &err)) fail_msg("load %s: %s", dir, err.msg);
    if (fm_model_load(dir, &ro, &oracle, &err)) fail_msg("load %s: %s", dir, err.msg);
    o.ep_ranks = n_ranks;
    if (fm_rank_group_load(dir, &o, &g, &err)) fail_msg("load %s, --ep %d: %s", dir, n_ranks, err.msg);
    const int32_t V = fm_model_vocab_size(one);
    enum { T = 23 };
    int32_t ids[T];
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
    float *a = logits_of(one, NULL, ids, T), *b = logits_of(NULL, g, ids, T), *f = logits_of(oracle, NULL, ids, T);
    const logits_diff d = logits_compare(a, b, T, V);
    const size_t n = (size_t)T * (size_t)V;
    const double e_one = logits_rms_diff(a, f, n), e_ep = logits_rms_diff(b, f, n);
    const bool bits = memcmp(a, b, n * sizeof *a) == 0;
    uint64_t sent = 0;
    for (int r = 0; r < n_ranks; r++) sent += g->models[r]->context->ep_bytes_dispatch;
    printf("  %-32s %s --ep %d on the GPU: %s, max |diff| %.3g (max |logit| %.3g), argmax %lld of %d; RMS to the "
           "oracle %.4g (one model %.4g); %llu dispatch bytes sent\n",
           dir, plan, n_ranks, bits ? "bits equal" : "bits differ", d.max_diff, d.max_abs, (long long)d.same, (int)T,
           e_ep, e_one, (unsigned long long)sent);
    assert_int_equal(d.same, T);
    if (e_ep > 1.01 * e_one + 1e-5) /* + 1e-5: ref32 is the oracle itself */
        fail_msg("%s --ep %d: RMS %g from the oracle, one model %g", dir, n_ranks, e_ep, e_one);
    assert_true(sent > 0);
    /* greedy generation through the paged cache, against one model whose decode steps run the experts' grouped GEMM
       as the ranks do (moe.gemv=off: the default's grouped GEMVs sum in another order, so a near tie may go the
       other way) */
    fm_model *one_gemm = NULL;
    char routes[256];
    snprintf(routes, sizeof routes, "%s%smoe.gemv=off", gpu_test_routes() ? gpu_test_routes() : "",
             gpu_test_routes() ? "," : "");
    fm_options og = options(preset, "cuda");
    og.dispatch = dispatch, og.routes = routes;
    if (fm_model_load(dir, &og, &one_gemm, &err)) fail_msg("load %s: %s", dir, err.msg);
    const int32_t *pp = ids;
    const int64_t np = 9;
    fm_gen_params gp;
    fm_gen_params_init(&gp);
    gp.max_tokens = 12, gp.ignore_eos = true;
    fm_gen_output x, y;
    if (fm_context_generate(one_gemm->context, &pp, &np, &gp, 1, 0, NULL, NULL, &x, NULL, &err))
        fail_msg("%s", err.msg);
    if (fm_rank_group_generate(g, &pp, &np, &gp, 1, 0, NULL, NULL, &y, NULL, &err)) fail_msg("%s", err.msg);
    assert_int_equal(x.n, 12);
    assert_int_equal(y.n, 12);
    const bool same_ids = memcmp(x.ids, y.ids, 12 * sizeof *x.ids) == 0;
    float lp_diff = 0.0f;
    for (int i = 0; i < 12 && x.logprobs && y.logprobs; i++)
        lp_diff = fmaxf(lp_diff, fabsf(x.logprobs[i] - y.logprobs[i]));
    printf("  %-32s %s --ep %d on the GPU: 12 greedy tokens %s one model (moe.gemv=off), logprobs within %.3g\n", dir,
           plan, n_ranks, same_ids ? "as" : "NOT as", lp_diff);
    assert_memory_equal(x.ids, y.ids, 12 * sizeof *x.ids);
    if (lp_diff > 1e-3f) fail_msg("%s --ep %d: logprobs %g apart from one model's", dir, n_ranks, lp_diff);
    free(x.ids), free(x.logprobs), free(y.ids), free(y.logprobs);
    free(a), free(b), free(f);
    fm_rank_group_free(g);
    fm_model_free(one), fm_model_free(oracle), fm_model_free(one_gemm);
}

static uint32_t rng = 2463534242u;
static float frand(void) { /* uniform [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* backend buffers of n bytes, and their bytes back on the host */
static void *raw_up(fm_backend *be, const void *src, size_t n) {
    void *d = be->ops->alloc(be, n);
    assert_non_null(d);
    be->ops->upload_raw(be, src, n, d);
    return d;
}
static uint8_t *raw_down(fm_backend *be, const void *src, size_t n) {
    uint8_t *h = malloc(n);
    be->ops->download_raw(be, src, n, h);
    return h;
}

/* One rank's three ops at N ranks, E experts, top-k, rows of H, T tokens, on both backends (the preset's plan, the
 * rows in dispatch format fmt: the fp8 plan's W4A8 experts with e4m3 or FP4 rows, ref's and ref32's cuBLAS experts
 * with their native rows). */
static void ep_ops_case(fm_preset preset, fm_afmt fmt, int32_t N, int32_t E, int32_t k, int64_t H, int64_t I,
                        int64_t T) {
    fm_plan plan;
    fm_plan_for_backend(preset, "cuda", &plan);
    plan.a_dispatch = fmt;
    fm_backend *cpu = NULL, *gpu = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &gpu, &err)) fail_msg("cuda backend: %s", err.msg);
    fm_ep_layout L;
    assert_int_equal(fm_ep_layout_of(E, N, T, k, H, fmt, plan.act_bf16, &L, &err), FM_OK);
    const int32_t el = E / N;
    float *x = malloc((size_t)(T * H) * sizeof *x), *w = malloc((size_t)(T * k) * sizeof *w);
    int32_t *ids = malloc((size_t)(T * k) * sizeof *ids);
    for (int64_t i = 0; i < T * H; i++) x[i] = fm_round_bf16(frand() * ((i % H) % 37 == 0 ? 6.0f : 1.0f));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) { /* distinct experts, skewed toward rank 0's */
            ids[t * k + j] = (int32_t)(((t % 3 == 0 ? 0 : t * 7) + j * 5) % E);
            w[t * k + j] = fm_round_bf16(0.25f + 0.5f * fabsf(frand()));
        }
    /* NVFP4: every rank's amax (fm_ep_moe gathers them), this rank's x's the largest but at the last place */
    float amaxes[FM_EP_MAX_RANKS];
    for (int32_t r = 0; r < N; r++) amaxes[r] = fm_nvfp4_amax(x, T * H) * (r == N - 1 ? 1.0f : 0.5f / (float)(r + 1));
    const float *am_c = fmt == FM_A_NVFP4 ? amaxes : NULL;
    void *am_g = NULL;
    if (fmt == FM_A_NVFP4) am_g = raw_up(gpu, amaxes, (size_t)N * sizeof *amaxes);
    const size_t sbytes = (size_t)N * (L.dblock > L.rblock ? L.dblock : L.rblock);
    /* ep_dispatch */
    uint8_t *send_c = calloc(1, sbytes);
    int32_t *ret_c = malloc((size_t)(T * k) * sizeof *ret_c);
    cpu->ops->ep_dispatch(cpu, &L, x, T, ids, am_c, send_c, ret_c);
    void *xg = gpu_upload(gpu, x, T * H), *idg = gpu->ops->alloc(gpu, (size_t)(T * k) * 4);
    gpu->ops->upload_ids(gpu, ids, T * k, idg);
    uint8_t *zero = calloc(1, sbytes);
    void *sendg = raw_up(gpu, zero, sbytes), *retg = gpu->ops->alloc(gpu, (size_t)(T * k) * 4);
    gpu->ops->ep_dispatch(gpu, &L, xg, T, idg, am_g, sendg, retg);
    uint8_t *send_g = raw_down(gpu, sendg, sbytes);
    int32_t *ret_g = (int32_t *)raw_down(gpu, retg, (size_t)(T * k) * 4);
    assert_memory_equal(ret_g, ret_c, (size_t)(T * k) * 4);
    int64_t rows = 0;
    for (int32_t d = 0; d < N; d++) {
        const uint8_t *bc = send_c + (size_t)d * L.dblock, *bg = send_g + (size_t)d * L.dblock;
        int32_t n;
        memcpy(&n, bc, 4);
        rows += n;
        assert_memory_equal(bg, bc, FM_EP_HEADER);
        assert_memory_equal(bg + L.ids_at, bc + L.ids_at, (size_t)n * 4);
        assert_memory_equal(bg + L.rows_at, bc + L.rows_at, (size_t)n * L.row_d);
    }
    assert_int_equal(rows, T * k);
    /* moe_blocks: the blocks as one rank receives them (each block's local ids index this rank's el experts) */
    float *gu = malloc((size_t)el * 2 * I * H * sizeof *gu), *dn = malloc((size_t)el * H * I * sizeof *dn);
    for (int64_t i = 0; i < (int64_t)el * 2 * I * H; i++) gu[i] = 0.1f * frand();
    for (int64_t i = 0; i < (int64_t)el * H * I; i++) dn[i] = 0.1f * frand();
    fm_bank *gub[2], *dnb[2];
    fm_backend *be[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++)
        gub[b] = gpu_bank(be[b], gu, el, 2 * I, H, plan.w_expert, true),
        dnb[b] = gpu_bank(be[b], dn, el, H, I, plan.w_expert, false);
    uint8_t *yret_c = calloc(1, sbytes);
    cpu->ops->moe_blocks(cpu, &L, gub[0], dnb[0], send_c, am_c, plan.a_expert, yret_c);
    void *recvg = raw_up(gpu, send_c, sbytes), *yretg = raw_up(gpu, zero, sbytes);
    gpu->ops->moe_blocks(gpu, &L, gub[1], dnb[1], recvg, am_g, plan.a_expert, yretg);
    uint8_t *yret_g = raw_down(gpu, yretg, sbytes);
    float *yc = malloc((size_t)(T * k * H) * sizeof *yc), *yg = malloc((size_t)(T * k * H) * sizeof *yg);
    int64_t r = 0;
    for (int32_t d = 0; d < N; d++) { /* the counted rows of each block, as floats */
        int32_t n;
        memcpy(&n, send_c + (size_t)d * L.dblock, 4);
        for (int32_t i = 0; i < n; i++, r++) {
            const size_t at = (size_t)(d * L.cap + i) * L.row_r;
            fm_dispatch_row_decode_native(yret_c + at, H, L.act_bf16, yc + r * H);
            fm_dispatch_row_decode_native(yret_g + at, H, L.act_bf16, yg + r * H);
        }
    }
    char what[160];
    snprintf(what, sizeof what, "moe_blocks %s %s N=%d E=%d k=%d H=%lld I=%lld T=%lld", fm_preset_name(preset),
             fm_afmt_name(fmt), N, E, k, (long long)H, (long long)I, (long long)T);
    gpu_expect_close(yg, yc, r * H, 3e-2, what);
    /* ep_combine over the same return rows (the CPU's) */
    float *oc = malloc((size_t)(T * H) * sizeof *oc);
    cpu->ops->ep_combine(cpu, &L, yret_c, ret_c, w, T, oc);
    void *yrecvg = raw_up(gpu, yret_c, sbytes), *wg = gpu_upload(gpu, w, T * k), *ogb = NULL;
    void *og = gpu_guarded(gpu, T * H, &ogb);
    gpu->ops->ep_combine(gpu, &L, yrecvg, retg, wg, T, og);
    float *o = gpu_fetch(gpu, ogb, T * H, "ep_combine");
    snprintf(what, sizeof what, "ep_combine N=%d k=%d H=%lld T=%lld", N, k, (long long)H, (long long)T);
    gpu_expect_close(o, oc, T * H, 1e-2, what);
    printf("  ep ops %s N=%d E=%d k=%d H=%lld T=%lld: dispatch blocks byte for byte, %lld rows\n", fm_afmt_name(fmt), N,
           E, k, (long long)H, (long long)T, (long long)rows);
    for (int b = 0; b < 2; b++) be[b]->ops->bank_free(be[b], gub[b]), be[b]->ops->bank_free(be[b], dnb[b]);
    void *gbufs[] = {xg, idg, sendg, retg, recvg, yretg, yrecvg, wg};
    for (size_t i = 0; i < sizeof gbufs / sizeof *gbufs; i++) gpu->ops->free(gpu, gbufs[i]);
    if (am_g) gpu->ops->free(gpu, am_g);
    free(x), free(w), free(ids), free(send_c), free(ret_c), free(zero), free(send_g), free(ret_g), free(gu), free(dn);
    free(yret_c), free(yret_g), free(yc), free(yg), free(oc), free(o);
    cpu->ops->destroy(cpu), gpu->ops->destroy(gpu);
}

/* The amax op (NVFP4's tensor scale on the device) against the CPU backend's: bf16 activations with NaN, +-inf and
 * the largest finite value negative, none at all, and an fp32 plan's. */
static void amax_case(fm_preset preset, int64_t n) {
    fm_plan plan;
    fm_plan_for_backend(preset, "cuda", &plan);
    fm_backend *cpu = NULL, *gpu = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &gpu, &err)) fail_msg("cuda backend: %s", err.msg);
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = fm_round_bf16(3.0f * frand());
    if (n > 100) x[7] = NAN, x[50] = INFINITY, x[99] = -INFINITY, x[n - 1] = -7.5f;
    float want = -1.0f, got = -1.0f;
    cpu->ops->amax(cpu, x, n, &want);
    void *xg = gpu_upload(gpu, x, n > 0 ? n : 1), *og = gpu->ops->alloc(gpu, sizeof(float));
    gpu->ops->amax(gpu, xg, n, og);
    gpu->ops->download_raw(gpu, og, sizeof got, &got);
    printf("  amax %s n=%lld: %g (cpu %g)\n", fm_preset_name(preset), (long long)n, (double)got, (double)want);
    assert_true(memcmp(&got, &want, sizeof got) == 0);
    if (n > 100) assert_true(want == 7.5f);
    gpu->ops->free(gpu, xg), gpu->ops->free(gpu, og);
    free(x);
    cpu->ops->destroy(cpu), gpu->ops->destroy(gpu);
}

static void test_ep_ops(void **s) {
    (void)s;
    amax_case(FM_PRESET_FP8, 300001);
    amax_case(FM_PRESET_FP8, 0);
    amax_case(FM_PRESET_REF32, 4099);
    const fm_afmt fmts[] = {FM_A_E4M3_G128, FM_A_MXFP4, FM_A_NVFP4};
    for (int f = 0; f < 3; f++) {
        ep_ops_case(FM_PRESET_FP8, fmts[f], 2, 8, 2, 96, 64, 23);      /* a test model's widths: H % 128 != 0 */
        ep_ops_case(FM_PRESET_FP8, fmts[f], 4, 16, 4, 256, 128, 300);  /* several chunks of the positions kernel */
        ep_ops_case(FM_PRESET_FP8, fmts[f], 2, 128, 8, 2048, 768, 64); /* Qwen3-30B-A3B widths, a decode batch */
        ep_ops_case(FM_PRESET_FP8, fmts[f], 8, 64, 8, 512, 256, 1);    /* one token */
    }
    ep_ops_case(FM_PRESET_FP8, FM_A_NVFP4, 2, 8, 2, 100, 64, 7); /* a part block of 4 values; rows of 50 + 7 bytes */
    /* the native rows of ref (bf16) and ref32 (fp32) into the cuBLAS experts */
    for (int p = 0; p < 2; p++) {
        const fm_preset pr = p ? FM_PRESET_REF32 : FM_PRESET_REF;
        ep_ops_case(pr, FM_A_NATIVE, 2, 8, 2, 96, 64, 23);
        ep_ops_case(pr, FM_A_NATIVE, 4, 16, 4, 256, 128, 300);
        ep_ops_case(pr, FM_A_NATIVE, 8, 64, 8, 512, 256, 1);
    }
}

static void test_expert_parallel(void **s) {
    (void)s;
    ep_case("tests/models/qwen3-moe-f32", 2, FM_PRESET_FP8, FM_DISPATCH_PRESET);
    ep_case("tests/models/qwen3-moe-f32", 4, FM_PRESET_FP8, FM_DISPATCH_PRESET);
    ep_case("tests/models/mixtral-f32-sharded", 2, FM_PRESET_FP8, FM_DISPATCH_PRESET);
    ep_case("tests/models/qwen3-next-f32", 2, FM_PRESET_FP8, FM_DISPATCH_PRESET);
    ep_case("tests/models/qwen3-moe-bf16", 2, FM_PRESET_FP8, FM_DISPATCH_PRESET);
    /* the FP4 dispatch: the fp4 preset (MXFP4), and NVFP4 with its tensor scale agreed over the ranks */
    ep_case("tests/models/qwen3-moe-f32", 2, FM_PRESET_FP4, FM_DISPATCH_PRESET);
    ep_case("tests/models/qwen3-moe-f32", 4, FM_PRESET_FP8, FM_DISPATCH_NVFP4);
    ep_case("tests/models/mixtral-f32-sharded", 2, FM_PRESET_FP8, FM_DISPATCH_NVFP4);
    /* the activations' own rows into the cuBLAS experts: ref (bf16) and ref32 (fp32) */
    ep_case("tests/models/qwen3-moe-f32", 2, FM_PRESET_REF, FM_DISPATCH_PRESET);
    ep_case("tests/models/qwen3-moe-f32", 4, FM_PRESET_REF32, FM_DISPATCH_PRESET);
    ep_case("tests/models/mixtral-f32-sharded", 2, FM_PRESET_REF, FM_DISPATCH_PRESET);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ep_ops), cmocka_unit_test(test_expert_parallel)};
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
