/* The fused ops of a decode step (route decode.fused) on the GPU, each against the chain of ops it replaces:
 *   moe_add_rmsnorm: the CUDA op against the CUDA moe + add_rmsnorm on the same inputs, bit for bit (the fused
 *   kernel combines, rounds, adds and normalises in the two kernels' order: moe_combine_norm.cu), and against the CPU
 *   reference (cpu_fused.c: the CPU chain) with the moe's bound (W4A8 3e-2, bf16 1e-2, fp32 1e-5: test_cuda_ops.c's
 *   top). Outputs between NaN guards; the moe's input buffer is also the norm's output, as the engine calls it.
 *   Shapes: Qwen3-30B-A3B's (E 128, k 8, H 2048, I 768) at decode batches 1, 2, 8, 9 (the grouped GEMVs) and 64 (the
 *   grouped GEMM), test_cuda_ops's small odd ones (E 8, k 2, H 200, I 72; E 13, k 5, H 384, I 200), and the ref /
 *   ref32 experts (cuBLAS: the op runs the two ops). The kernel's two-launch fallback (rows not a multiple of 8, or
 *   unaligned) is the two existing launchers in order; no moe shape here reaches it.
 *   linear_add_rmsnorm: the same two checks (y, the residual and the normed rows), W8A8 (--dense w8a8) at the GEMV's
 *   rows (M 1, 2, 3, 4, 5, 8: the add + norm in its last CTA, every tiling of row_tail.cuh; 9 and 16 also with
 *   w8a8.gemv_max_m=16: two passes) and above (9, 16, 64: cuBLASLt, then add_rmsnorm), the o projection of
 *   Qwen3-30B-A3B (4096 -> 2048), rows of 4096 (two chunks a thread), q|k|v's 5120 rows (above the tail's 4096: the
 *   two ops), K 200 -> N 208; each fused call made twice in a row (the CTA counter left at zero for the next launch,
 *   as a graph replays it); W4A8 (the fp8 preset's int4-tc) likewise at the W4A8 GEMV's rows (M 1..5, 8, 9, 16: the
 *   same tail in its last CTA) and above (64, and dense.gemv=off: the grouped GEMM, then add_rmsnorm); bf16, fp32
 *   and int4 (w4a16) through the two ops at M 1, 2, 8, 16, 64. W8A8 and W4A8 bound vs the CPU: 5e-3
 *   (test_cuda_ops.c's linear), 1e-2 after the norm. (int4-zp-tc and e4m3-block: test_cuda_prequant.c.)
 *   moe.down_quant=fused: the moe op and moe_add_rmsnorm with the down GEMV quantizing h itself against the same ops
 *   with the quantizer launch, bit for bit, and the moe against the CPU within 3e-2: Qwen3's experts at 1, 2 and 8
 *   tokens, the small odd shapes up to 16 rows a tile, MXFP4 and NVFP4 dispatches, and the grouped GEMMs (unchanged).
 *   moe.combine=fused: the same checks with the MoE tail in the down GEMV's last CTA of each token (each fused call
 *   twice: its per-token counters left zero), with and without moe.down_quant=fused; rows of 200 to 4096, and 300
 *   (not a multiple of 8: the tail's kernel after the GEMV).
 *   moe.dispatch=fused: router_moe (the router's last CTA dispatching the rows) against the router op then the moe
 *   op, bit for bit (routing, the moe's rows, the MoE tail), one kernel launch fewer in a captured graph, each fused
 *   call twice (the router's counter), Qwen3's shape at 1, 2, 8 tokens and small odd ones, the three router kinds;
 *   where the route does not apply (NVFP4, 9 tokens, the grouped GEMMs) the same launches as the chain.
 *   moe.persistent: router_moe with the MoE tail in one persistent launch against the router op then
 *   moe_add_rmsnorm on the decode GEMVs, bit for bit (routing, residual, normed rows), one kernel in a captured graph;
 *   Qwen3's shape, small odd ones, the Mixtral router, rows of 4096, E 300; where it does not apply (shared expert,
 *   2 tokens, rows above 4096) the chain's launches.
 *   gdn_decode_fused: the normed rows and both states (conv, recurrent) against the GPU's gdn_conv, gdn_recurrent and
 *   gdn_norm_gate bit for bit (the kernel keeps their rounding points and orders of summation: gdn_decode.cu), and
 *   against the CPU chain on the real rows with test_cuda_qnext's bounds (bf16 1e-2, fp32 1e-5); Qwen3-Next's shape
 *   (16 key heads, 32 value heads of 128, 4 taps) and two small odd ones, B = 1, 4 (3 + 1 padding row), 64, 64 (61 +
 *   3 padding rows); every third sequence fresh; dk 256 (above the kernel's 128: the chain, through the same op);
 *   the fused op twice on one backend (its per key head counters were reset by the first launch); in bf16 both
 *   also with out_q (the rows quantized for the out projection: by the norm's warps at dv = 128, else by the
 *   quantizer's launch) against the CPU's quantizer of the rows they returned. With the in_proj_ba matrix (route
 *   gdn.decode_ba) the kernel's own b | a rows against the chain fed the host's sums in its order, bit for bit, at
 *   hidden sizes 2048 and 40, with and without gdn.early_state; 36 and dk 256 through the linear op first.
 * Runs only where a GPU is present (make test-gpu); tools/gpu-check.sh runs it, and under compute-sanitizer. */
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
#include "quant/bf16.h"
#include "quant/e4m3.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
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

/* One MoE block's inputs on the host. */
typedef struct block_in {
    int64_t T, H, I;
    int32_t E, k;
    float *gu, *dn, *x, *resid, *norm, *w;
    int32_t *ids;
} block_in;

static block_in make_block(int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    block_in b = {T, H, I, E, k, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    b.gu = rand_array(E * 2 * I * H, 0.1f), b.dn = rand_array(E * H * I, 0.1f);
    b.x = rand_array(T * H, 1.0f), b.resid = rand_array(T * H, 2.0f), b.norm = rand_array(H, 1.0f);
    b.w = malloc((size_t)(T * k) * sizeof *b.w), b.ids = malloc((size_t)(T * k) * sizeof *b.ids);
    for (int64_t t = 0; t < T; t++) /* k distinct experts per token, weights in (0.1, 1) */
        for (int32_t j = 0; j < k; j++) {
            b.ids[t * k + j] = (int32_t)((t * 7 + j * (E / k > 0 ? E / k : 1) + (t % 3)) % E);
            b.w[t * k + j] = 0.1f + 0.45f * (frand() + 1.0f);
        }
    return b;
}

static void free_block(block_in *b) {
    free(b->gu), free(b->dn), free(b->x), free(b->resid), free(b->norm), free(b->w), free(b->ids);
}

/* moe_add_rmsnorm's and router_moe's out_q against the CPU's quantizer of the normed rows it returned (each row's
 * 128-groups: codes, zero past K, and scales, bit for bit) */
static void expect_qrows(const uint8_t *q, const float *rows, int64_t T, int64_t H, const char *what) {
    const int64_t Hp = (H + 127) / 128 * 128, G = Hp / 128;
    const float *qs = (const float *)(q + fm_qrows_scales_at(T, H));
    uint8_t *codes = malloc((size_t)H);
    float *sc = malloc((size_t)G * sizeof *sc);
    for (int64_t t = 0; t < T; t++) {
        fm_e4m3_quantize_groups(rows + t * H, H, 128, codes, sc);
        for (int64_t j = 0; j < Hp; j++)
            if (q[t * Hp + j] != (j < H ? codes[j] : 0))
                fail_msg("%s: out_q row %lld code %lld: %u, the cpu's %u", what, (long long)t, (long long)j,
                         q[t * Hp + j], j < H ? codes[j] : 0);
        for (int64_t g = 0; g < G; g++)
            if (memcmp(&qs[g * T + t], &sc[g], sizeof(float)))
                fail_msg("%s: out_q row %lld scale %lld: %.9g, the cpu's %.9g", what, (long long)t, (long long)g,
                         qs[g * T + t], sc[g]);
    }
    free(codes), free(sc);
}

/* The block's end on backend be: fused (moe_add_rmsnorm, x's buffer taking the norm) or the chain (moe, add_rmsnorm).
 * Returns the residual after the add and the normed rows (host, caller frees); q_out (fused; NULL: not asked): the
 * op's out_q (fm_qrows). */
static void run_end(fm_backend *be, const block_in *b, fm_wformat fmt, bool fused, float **acc_out, float **h_out,
                    uint8_t **q_out) {
    const int64_t T = b->T, H = b->H;
    fm_bank *gub = gpu_bank(be, b->gu, b->E, 2 * b->I, H, fmt, true),
            *db = gpu_bank(be, b->dn, b->E, H, b->I, fmt, false);
    fm_bank *nb = gpu_bank(be, b->norm, 1, 1, H, be->plan.w_other, false);
    void *wd = gpu_upload(be, b->w, T * b->k), *idd = be->ops->alloc(be, (size_t)(T * b->k) * sizeof(int32_t));
    be->ops->upload_ids(be, b->ids, T * b->k, idd);
    void *acc_base, *h_base, *y_base;
    void *acc = gpu_guarded(be, T * H, &acc_base), *h = gpu_guarded(be, T * H, &h_base);
    void *y = gpu_guarded(be, T * H, &y_base);
    be->ops->upload_f32(be, b->resid, T * H, acc);
    be->ops->upload_f32(be, b->x, T * H, h);
    void *hq = q_out ? be->ops->alloc(be, fm_qrows_bytes(T, H)) : NULL;
    if (fused) {
        be->ops->moe_add_rmsnorm(be, gub, db, h, T, idd, wd, b->k, be->plan.a_dispatch, be->plan.a_expert, y, acc, nb,
                                 1e-6f, h, hq);
    } else {
        be->ops->moe(be, gub, db, h, T, idd, wd, b->k, be->plan.a_dispatch, be->plan.a_expert, y);
        be->ops->add_rmsnorm(be, acc, y, nb, T, H, 1e-6f, h);
    }
    if (hq) {
        *q_out = malloc(fm_qrows_bytes(T, H));
        be->ops->download_raw(be, hq, fm_qrows_bytes(T, H), *q_out);
        be->ops->free(be, hq);
    }
    *acc_out = gpu_fetch(be, acc_base, T * H, "residual");
    *h_out = gpu_fetch(be, h_base, T * H, "normed rows");
    be->ops->free(be, y_base); /* scratch: unspecified after a fused call */
    be->ops->free(be, wd), be->ops->free(be, idd);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, db), be->ops->bank_free(be, nb);
}

static void end_case(fm_preset p, fm_wformat fmt, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    fm_backend *cpu = NULL, *gpu = NULL;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &gpu, &err)) fail_msg("cuda backend: %s", err.msg);
    assert_non_null(gpu->ops->moe_add_rmsnorm);
    block_in b = make_block(T, E, k, H, I);
    float *fa, *fh, *ca, *ch, *ra, *rh;
    uint8_t *fq = NULL;
    /* out_q asked for where the activations are bf16 (the quantizer's input; the f32 preset's dense linears never
       read such rows) */
    run_end(gpu, &b, fmt, true, &fa, &fh, plan.act_bf16 ? &fq : NULL);
    run_end(gpu, &b, fmt, false, &ca, &ch, NULL);
    run_end(cpu, &b, fmt, true, &ra, &rh, NULL);
    char what[128];
    snprintf(what, sizeof what, "moe_add_rmsnorm %s T=%lld E=%d k=%d H=%lld I=%lld", fm_wformat_name(fmt), (long long)T,
             E, k, (long long)H, (long long)I);
    /* fused = the GPU's own chain, bit for bit */
    for (int64_t i = 0; i < T * H; i++)
        if (memcmp(&fa[i], &ca[i], sizeof *fa) || memcmp(&fh[i], &ch[i], sizeof *fh))
            fail_msg("%s: element %lld: fused residual %.9g norm %.9g, chain %.9g %.9g", what, (long long)i, fa[i],
                     fh[i], ca[i], ch[i]);
    if (fq) expect_qrows(fq, fh, T, H, what);
    free(fq);
    printf("  %-60s fused = chain bit for bit%s\n", what, plan.act_bf16 ? ", out_q = the quantizer's" : "");
    const double bound = fmt == FM_W_INT4_G128_TC ? 3e-2 : plan.act_bf16 ? 1e-2 : 1e-5;
    char w2[160];
    snprintf(w2, sizeof w2, "%s residual vs cpu", what);
    gpu_expect_close(fa, ra, T * H, bound, w2);
    snprintf(w2, sizeof w2, "%s norm vs cpu", what);
    gpu_expect_close(fh, rh, T * H, bound, w2);
    free(fa), free(fh), free(ca), free(ch), free(ra), free(rh);
    free_block(&b);
    gpu->ops->destroy(gpu), cpu->ops->destroy(cpu);
}

static void test_moe_add_rmsnorm_w4a8(void **s) {
    (void)s;
    const int64_t Td[] = {1, 2, 8, 9, 64}; /* decode batches: grouped GEMVs up to 64 pairs, then the GEMM */
    for (int i = 0; i < 5; i++) end_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, Td[i], 128, 8, 2048, 768);
    const int64_t Ts[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) {
        end_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ts[i], 8, 2, 200, 72);   /* one kernel */
        end_case(FM_PRESET_FP8, FM_W_INT4_G128_TC, Ts[i], 13, 5, 384, 200); /* test_cuda_ops's odd expert shape */
    }
}

static void test_moe_add_rmsnorm_reference_experts(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 5, 33};
    for (int i = 0; i < 3; i++) {
        end_case(FM_PRESET_REF, FM_W_BF16, Ts[i], 8, 2, 200, 72);
        end_case(FM_PRESET_REF32, FM_W_F32, Ts[i], 8, 2, 200, 72);
    }
}

/* ---- moe.down_quant: the decode GEMVs' h quantized by the down GEMV itself, against the quantizer launch ---- */

/* a cuda backend for plan under route (after the command line's routes, so that the case's route wins) */
static fm_backend *gpu_with_route(const fm_plan *plan, const char *route) {
    char routes[640];
    const char *cl = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%s%s", cl ? cl : "", cl ? "," : "", route);
    fm_backend *gpu = NULL;
    fm_error err;
    if (fm_backend_create("cuda", plan, 0, routes, &gpu, &err)) fail_msg("cuda backend (%s): %s", routes, err.msg);
    return gpu;
}

/* The moe op's output [T, H] on be (no tail), for down_quant_case */
static float *run_moe_only(fm_backend *be, const block_in *b, fm_wformat fmt) {
    fm_bank *gub = gpu_bank(be, b->gu, b->E, 2 * b->I, b->H, fmt, true),
            *db = gpu_bank(be, b->dn, b->E, b->H, b->I, fmt, false);
    float *o = gpu_run_moe(be, gub, db, b->x, b->T, b->H, b->ids, b->w, b->k);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, db);
    return o;
}

static void expect_same_bits(const float *a, const float *b, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a))
            fail_msg("%s: element %lld: fused %.9g, quantizer launch %.9g", what, (long long)i, a[i], b[i]);
}

/* route: the experts' routes of the case (moe.gemv=64: the GEMVs above one token); dispatch: the plan's. The chain
 * (base: routes after `route`) against the fused form (fused: likewise): the moe op's output, and moe_add_rmsnorm's
 * residual and normed rows (the fused backend's op called twice: counters it uses were left zero), bit for bit; the
 * moe against the CPU within the W4A8 moe's bound (test_cuda_ops.c) */
static void same_bits_case(fm_preset p, fm_dispatch dispatch, const char *route, const char *base, const char *fused,
                           int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    if (fm_plan_set_dispatch(&plan, dispatch, &err)) fail_msg("dispatch: %s", err.msg);
    char r_base[200], r_fused[200];
    snprintf(r_base, sizeof r_base, "%s%s%s", route ? route : "", route ? "," : "", base);
    snprintf(r_fused, sizeof r_fused, "%s%s%s", route ? route : "", route ? "," : "", fused);
    fm_backend *cpu = NULL, *gk = gpu_with_route(&plan, r_base), *gf = gpu_with_route(&plan, r_fused);
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    const fm_wformat fmt = FM_W_INT4_G128_TC;
    block_in b = make_block(T, E, k, H, I);
    char what[240];
    snprintf(what, sizeof what, "%s %s %s T=%lld E=%d k=%d H=%lld I=%lld%s%s", fused, fm_afmt_name(plan.a_dispatch),
             fm_wformat_name(fmt), (long long)T, E, k, (long long)H, (long long)I, route ? " " : "",
             route ? route : "");
    float *of = run_moe_only(gf, &b, fmt), *ok = run_moe_only(gk, &b, fmt), *oc = run_moe_only(cpu, &b, fmt);
    expect_same_bits(of, ok, T * H, what);
    float *fa, *fh, *ka, *kh; /* and inside moe_add_rmsnorm (the decode step's form) */
    run_end(gk, &b, fmt, true, &ka, &kh, NULL);
    for (int c = 0; c < 2; c++) {
        run_end(gf, &b, fmt, true, &fa, &fh, NULL);
        expect_same_bits(fa, ka, T * H, what), expect_same_bits(fh, kh, T * H, what);
        free(fa), free(fh);
    }
    printf("  %-60s = %s, bit for bit\n", what, base);
    char w2[300];
    snprintf(w2, sizeof w2, "%s vs cpu", what);
    gpu_expect_close(of, oc, T * H, 3e-2, w2);
    free(of), free(ok), free(oc), free(ka), free(kh);
    free_block(&b);
    gk->ops->destroy(gk), gf->ops->destroy(gf), cpu->ops->destroy(cpu);
}

static void down_quant_case(fm_preset p, fm_dispatch dispatch, const char *route, int64_t T, int32_t E, int32_t k,
                            int64_t H, int64_t I) {
    same_bits_case(p, dispatch, route, "moe.down_quant=kernel", "moe.down_quant=fused", T, E, k, H, I);
}

/* Qwen3-30B-A3B's experts at one token (the default GEMV route) and, with moe.gemv=64, 2 and 8 tokens (tiles of 1-2
 * rows); the small odd shapes (I = 72: one partial group; I = 200: a full and a partial one) up to 16 rows a tile
 * (the GEMV's two n8 tiles: T = 16, top-2 of 8 experts); the FP4 dispatches (h is e4m3 either way); moe.gemv=off (the
 * grouped GEMMs: the route changes nothing there) */
static void test_moe_down_quant_fused(void **s) {
    (void)s;
    down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, NULL, 1, 128, 8, 2048, 768);
    down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", 2, 128, 8, 2048, 768);
    down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", 8, 128, 8, 2048, 768);
    const int64_t Ts[] = {1, 7, 16};
    for (int i = 0; i < 3; i++) {
        down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", Ts[i], 8, 2, 200, 72);
        down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", Ts[i] < 12 ? Ts[i] : 12, 13, 5, 384, 200);
        down_quant_case(FM_PRESET_FP8, FM_DISPATCH_NVFP4, "moe.gemv=64", Ts[i], 8, 2, 256, 72);
    }
    down_quant_case(FM_PRESET_FP4, FM_DISPATCH_PRESET, NULL, 1, 128, 8, 2048, 768); /* MXFP4 */
    down_quant_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=off", 9, 128, 8, 2048, 768);
}

/* moe.combine=fused: the MoE tail (combine, residual add, norm) in the down GEMV's last CTA of each token, with and
 * without moe.down_quant=fused, against the tail's kernel: Qwen3's experts at 1 and 8 tokens (each CTA the last of
 * at most one token), the small shapes up to 16 rows a tile (a CTA the last of several tokens), rows of 200 and 384
 * (multiples of 8) and of 4096 (two chunks a thread), and 300 (not a multiple of 8: the kernel after the GEMV) */
static void test_moe_combine_fused(void **s) {
    (void)s;
    const char *base = "moe.combine=kernel,moe.down_quant=kernel";
    const char *both = "moe.combine=fused,moe.down_quant=fused", *alone = "moe.combine=fused,moe.down_quant=kernel";
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, NULL, base, both, 1, 128, 8, 2048, 768);
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, NULL, base, alone, 1, 128, 8, 2048, 768);
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", base, both, 8, 128, 8, 2048, 768);
    const int64_t Ts[] = {1, 7, 16};
    for (int i = 0; i < 3; i++) {
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", base, both, Ts[i], 8, 2, 200, 72);
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", base, alone, Ts[i] < 12 ? Ts[i] : 12, 13, 5,
                       384, 200);
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", base, both, Ts[i], 8, 2, 4096, 128);
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, "moe.gemv=64", base, both, Ts[i], 8, 2, 300, 72);
    }
    same_bits_case(FM_PRESET_FP4, FM_DISPATCH_PRESET, NULL, base, both, 1, 128, 8, 2048, 768);
}

/* ---- moe.dispatch: the router's launch dispatching the rows, against the router op and then the moe op ---- */

/* One router_moe call's arguments on a backend (device buffers), for run_routed and its graph */
typedef struct routed_call {
    fm_backend *be;
    const fm_bank *rb, *gub, *db, *nb;
    void *h, *logits, *ids, *w, *y, *acc;
    int64_t T;
    int32_t k;
    fm_router_kind kind;
    bool one_op, tail;
    void *hq; /* NULL, or router_moe's out_q (one_op with the tail) */
    /* NULL, or (route moe.block_norm) the rows added to acc before the norm with pnb that makes h: router_moe's pre
       step, or the add_rmsnorm op before the chain */
    void *py;
    const fm_bank *pnb;
    int64_t H;
} routed_call;

static fm_status routed_body(void *ctx, fm_error *err) {
    (void)err;
    const routed_call *c = ctx;
    fm_backend *be = c->be;
    const fm_backend_ops *o = be->ops;
    const fm_afmt ad = be->plan.a_dispatch, ae = be->plan.a_expert;
    const fm_pre_norm pre = {c->py, c->pnb, 1e-5f};
    if (c->one_op) {
        o->router_moe(be, c->rb, c->gub, c->db, c->h, c->T, c->k, c->kind, true, c->logits, c->ids, c->w, ad, ae, c->y,
                      c->tail ? c->acc : NULL, c->tail ? c->nb : NULL, 1e-6f, c->h, c->hq, c->py ? &pre : NULL);
        return FM_OK;
    }
    if (c->py) o->add_rmsnorm(be, c->acc, c->py, c->pnb, c->T, c->H, pre.eps, c->h);
    o->router(be, c->rb, c->h, c->T, c->k, c->kind, true, c->logits, c->ids, c->w);
    if (c->tail)
        o->moe_add_rmsnorm(be, c->gub, c->db, c->h, c->T, c->ids, c->w, c->k, ad, ae, c->y, c->acc, c->nb, 1e-6f, c->h,
                           NULL);
    else o->moe(be, c->gub, c->db, c->h, c->T, c->ids, c->w, c->k, ad, ae, c->y);
    return FM_OK;
}

/* What run_routed returns (host, caller frees): the routing, and the moe's rows (no tail) or the residual and the
 * normed rows (tail) */
typedef struct routed_out {
    int32_t *ids;
    float *w, *logits, *rows, *acc;
    int64_t kernels; /* kernel launches of the call in a captured graph */
    uint8_t *q;      /* with quant: the normed rows' out_q (fm_qrows) */
} routed_out;

static void free_routed(routed_out *r) {
    free(r->ids), free(r->w), free(r->logits), free(r->rows), free(r->acc), free(r->q);
}

/* The router (bf16 weights rw [E][H]) and the experts of block b on the cuda backend be: router_moe (one_op, `calls`
 * times on the same inputs) or the router op, then moe or (tail) moe_add_rmsnorm with x's buffer taking the norm;
 * then the same call captured in a graph, its kernel nodes counted */
static routed_out run_routed(fm_backend *be, const block_in *b, const float *rw, fm_router_kind kind, bool one_op,
                             bool tail, bool quant, int calls, bool pre) {
    const int64_t T = b->T, H = b->H, P = T * b->k;
    routed_call c = {be,   NULL, NULL, NULL, NULL,   NULL, NULL, NULL, NULL, NULL,
                     NULL, T,    b->k, kind, one_op, tail, NULL, NULL, NULL, H};
    if (quant) c.hq = be->ops->alloc(be, fm_qrows_bytes(T, H));
    fm_bank *pnb = NULL;
    void *py_base = NULL;
    if (pre) { /* the attention's rows (x's values) and a norm of their own; h then made by the pre step */
        float *pn = malloc((size_t)H * sizeof *pn);
        for (int64_t i = 0; i < H; i++) pn[i] = 0.5f + 0.25f * (float)((i * 7) % 5);
        pnb = gpu_bank(be, pn, 1, 1, H, be->plan.w_other, false);
        free(pn);
        c.py = gpu_guarded(be, T * H, &py_base), c.pnb = pnb;
        be->ops->upload_f32(be, b->x, T * H, c.py);
    }
    fm_bank *gub = gpu_bank(be, b->gu, b->E, 2 * b->I, H, FM_W_INT4_G128_TC, true);
    fm_bank *db = gpu_bank(be, b->dn, b->E, H, b->I, FM_W_INT4_G128_TC, false);
    fm_bank *rb = gpu_bank(be, rw, 1, b->E, H, be->plan.w_other, false);
    fm_bank *nb = gpu_bank(be, b->norm, 1, 1, H, be->plan.w_other, false);
    c.gub = gub, c.db = db, c.rb = rb, c.nb = nb;
    void *lg_base, *w_base, *acc_base, *h_base, *y_base;
    c.logits = gpu_guarded(be, T * b->E, &lg_base), c.w = gpu_guarded(be, P, &w_base);
    c.acc = gpu_guarded(be, T * H, &acc_base), c.h = gpu_guarded(be, T * H, &h_base);
    c.y = gpu_guarded(be, T * H, &y_base);
    c.ids = be->ops->alloc(be, (size_t)P * sizeof(int32_t));
    routed_out r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < calls; i++) { /* the same inputs each time: the rows and the residual uploaded again */
        be->ops->upload_f32(be, b->resid, T * H, c.acc);
        be->ops->upload_f32(be, pre ? b->resid : b->x, T * H, c.h); /* pre: h's values are never read */
        routed_body(&c, NULL);
    }
    /* the call captured (recorded, not run) while its buffers live; gpu_fetch below frees the buffers it reads */
    fm_graph *g = NULL;
    fm_error err;
    if (be->ops->sync(be, &err)) fail_msg("sync: %s", err.msg);
    if (be->ops->graph_capture(be, routed_body, &c, &g, &err)) fail_msg("graph capture: %s", err.msg);
    fm_graph_nodes n = {0, 0, 0};
    be->ops->graph_nodes(be, g, &n);
    r.kernels = n.kernels;
    be->ops->graph_free(be, g);
    r.ids = malloc((size_t)P * sizeof *r.ids);
    be->ops->download_raw(be, c.ids, (size_t)P * sizeof *r.ids, r.ids);
    if (quant) {
        r.q = malloc(fm_qrows_bytes(T, H));
        be->ops->download_raw(be, c.hq, fm_qrows_bytes(T, H), r.q);
        be->ops->free(be, c.hq);
    }
    r.w = gpu_fetch(be, w_base, P, "route weights"), r.logits = gpu_fetch(be, lg_base, T * b->E, "router logits");
    if (tail) {
        r.rows = gpu_fetch(be, h_base, T * H, "normed rows"), r.acc = gpu_fetch(be, acc_base, T * H, "residual");
        be->ops->free(be, y_base);
    } else {
        r.rows = gpu_fetch(be, y_base, T * H, "moe rows"), r.acc = NULL;
        be->ops->free(be, acc_base), be->ops->free(be, h_base);
    }
    be->ops->free(be, c.ids);
    be->ops->bank_free(be, gub), be->ops->bank_free(be, db), be->ops->bank_free(be, rb), be->ops->bank_free(be, nb);
    if (pre) be->ops->free(be, py_base), be->ops->bank_free(be, pnb);
    return r;
}

static void expect_same_routed(const routed_out *f, const routed_out *k, const block_in *b, bool tail,
                               const char *what) {
    const int64_t P = b->T * b->k, n = b->T * b->H;
    for (int64_t p = 0; p < P; p++)
        if (f->ids[p] != k->ids[p])
            fail_msg("%s: pair %lld: fused id %d, chain %d", what, (long long)p, f->ids[p], k->ids[p]);
    expect_same_bits(f->w, k->w, P, what), expect_same_bits(f->logits, k->logits, b->T * b->E, what);
    expect_same_bits(f->rows, k->rows, n, what);
    if (tail) expect_same_bits(f->acc, k->acc, n, what);
}

/* route: the case's routes (router.fused=on and moe.gemv=64 above one token); the router of kind over E experts
 * (with the shared expert: E and k count it, as the router op takes them). The router op then the moe op
 * (moe.dispatch=kernel) against router_moe with moe.dispatch=fused: the routing (ids, weights, logits) and the moe's
 * rows, then with the MoE tail (moe_add_rmsnorm) the residual and the normed rows, bit for bit, each fused call made
 * twice (the router's counter left zero by the first); the fused call captured has one kernel launch fewer than the
 * chain (fused_launch: the route applies; else the same count, the chain inside the op), its out_q (dense.quant=
 * producer) asked for with the tail and equal to the CPU's quantizer of its rows. The moe's rows against the CPU's
 * router then moe within the W4A8 moe's bound. */
static void router_dispatch_case(fm_dispatch dispatch, const char *route, fm_router_kind kind, bool fused_launch,
                                 int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_error err;
    if (fm_plan_set_dispatch(&plan, dispatch, &err)) fail_msg("dispatch: %s", err.msg);
    char r_base[200], r_fused[200];
    snprintf(r_base, sizeof r_base, "%s,moe.dispatch=kernel,moe.persistent=off", route);
    snprintf(r_fused, sizeof r_fused, "%s,moe.dispatch=fused,moe.persistent=off", route);
    fm_backend *cpu = NULL, *gk = gpu_with_route(&plan, r_base), *gf = gpu_with_route(&plan, r_fused);
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    assert_non_null(gf->ops->router_moe);
    assert_non_null(gf->ops->graph_capture);
    block_in b = make_block(T, E, k, H, I);
    float *rw = rand_array(E * H, 0.05f);
    char what[240];
    snprintf(what, sizeof what, "router_moe %s kind %d T=%lld E=%d k=%d H=%lld I=%lld %s",
             fm_afmt_name(plan.a_dispatch), (int)kind, (long long)T, E, k, (long long)H, (long long)I, route);
    for (int tail = 0; tail < 2; tail++) {
        /* with the tail, out_q asked for too: the kernel ending the block quantizes the rows, no launch of its own */
        routed_out f = run_routed(gf, &b, rw, kind, true, tail, tail, 2, false),
                   c = run_routed(gk, &b, rw, kind, false, tail, false, 1, false);
        expect_same_routed(&f, &c, &b, tail, what);
        if (tail) expect_qrows(f.q, f.rows, T, H, what);
        if (f.kernels != c.kernels - (fused_launch ? 1 : 0))
            fail_msg("%s%s: %lld kernel launches, the chain %lld", what, tail ? " (tail)" : "", (long long)f.kernels,
                     (long long)c.kernels);
        if (!tail) { /* the CPU's experts on the fused op's routing (bf16 logits may order near ties unlike fp32) */
            block_in routed = b;
            routed.ids = f.ids, routed.w = f.w;
            float *o = run_moe_only(cpu, &routed, FM_W_INT4_G128_TC);
            char w2[300];
            snprintf(w2, sizeof w2, "%s vs cpu", what);
            gpu_expect_close(f.rows, o, T * H, 3e-2, w2);
            free(o);
        }
        free_routed(&f), free_routed(&c);
    }
    printf("  %-60s = the chain, bit for bit\n", what);
    free(rw);
    free_block(&b);
    gk->ops->destroy(gk), gf->ops->destroy(gf), cpu->ops->destroy(cpu);
}

/* Qwen3-30B-A3B's router and experts at one token (router.fused's default) and at 2 and 8 tokens (router.fused=on,
 * moe.gemv=64); the small odd shapes (E 8, k 2, H 200, I 72; E 13, k 5, H 384, I 200) at 1, 3 and 8 tokens; the
 * Mixtral router (top-k of the logits) and the shared expert in the bank (E 9, k 3: top-2 of 8 and the shared pair);
 * an NVFP4 dispatch, 9 tokens (above the fused router's 8) and moe.gemv=off: the chain inside the op */
static void test_router_dispatch_fused(void **s) {
    (void)s;
    const fm_dispatch pre = FM_DISPATCH_PRESET;
    const char *on = "router.fused=on,moe.gemv=64";
    router_dispatch_case(pre, "router.fused=auto", FM_ROUTER_SOFTMAX_TOPK, true, 1, 128, 8, 2048, 768);
    router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK, true, 2, 128, 8, 2048, 768);
    router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK, true, 8, 128, 8, 2048, 768);
    const int64_t Ts[] = {1, 3, 8};
    for (int i = 0; i < 3; i++) {
        router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK, true, Ts[i], 8, 2, 200, 72);
        router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK, true, Ts[i], 13, 5, 384, 200);
    }
    router_dispatch_case(pre, on, FM_ROUTER_TOPK_SOFTMAX, true, 3, 8, 2, 256, 72);
    router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK_SHARED, true, 3, 9, 3, 256, 72);
    router_dispatch_case(FM_DISPATCH_NVFP4, on, FM_ROUTER_SOFTMAX_TOPK, false, 1, 8, 2, 256, 72);
    router_dispatch_case(pre, on, FM_ROUTER_SOFTMAX_TOPK, false, 9, 8, 2, 200, 72);
    router_dispatch_case(pre, "router.fused=on,moe.gemv=off", FM_ROUTER_SOFTMAX_TOPK, false, 2, 128, 8, 2048, 768);
}

/* route moe.persistent: the router and the experts of one token with the MoE tail in one persistent launch, against
 * the router op then moe_add_rmsnorm (moe.dispatch=kernel, the decode GEMVs): the routing (ids, weights, logits), the
 * residual and the normed rows bit for bit, each persistent call made twice (its grid barrier left zero for the
 * next), one kernel in a captured graph where the route applies (persistent); without the tail, or where the route
 * does not apply, the chain's own launches (the chain itself is held against the CPU above). pre: also with
 * router_moe's pre step (route moe.block_norm: the residual add and the norm that make x, in the block) against
 * add_rmsnorm before the chain. */
static void persistent_check(fm_backend *gk, fm_backend *gp, const char *label, fm_router_kind kind, bool persistent,
                             bool pre, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    block_in b = make_block(T, E, k, H, I);
    float *rw = rand_array(E * H, 0.05f);
    char what[240];
    snprintf(what, sizeof what, "%s kind %d T=%lld E=%d k=%d H=%lld I=%lld", label, (int)kind, (long long)T, E, k,
             (long long)H, (long long)I);
    for (int run = 0; run < 2 + pre; run++) { /* no tail, the tail, (pre) the tail after the add + norm */
        const bool tail = run > 0, with_pre = run == 2;
        routed_out f = run_routed(gp, &b, rw, kind, true, tail, tail, 2, with_pre),
                   c = run_routed(gk, &b, rw, kind, false, tail, false, 1, with_pre);
        expect_same_routed(&f, &c, &b, tail, what);
        /* with the tail, out_q asked for: in the persistent launch, else by the combine + norm kernel that ends the
           chain; rows it does not take (above 4096 or not a multiple of 8) end in two launches and the quantizer's.
           The pre step: in the persistent launch, else the add_rmsnorm launch of the chain (c's too) */
        const bool in_combine = H % 8 == 0 && H <= 4096;
        const int64_t want = tail && persistent ? 1 : c.kernels + (tail && !in_combine);
        if (f.kernels != want)
            fail_msg("%s%s: %lld kernel launches, expected %lld (the chain %lld)", what, tail ? " (tail)" : "",
                     (long long)f.kernels, (long long)want, (long long)c.kernels);
        if (tail) expect_qrows(f.q, f.rows, T, H, what);
        free_routed(&f), free_routed(&c);
    }
    printf("  %-60s = the chain, bit for bit%s\n", what, persistent ? ", one launch" : " (the chain's launches)");
    free(rw);
    free_block(&b);
}

static void persistent_case(fm_router_kind kind, bool persistent, int64_t T, int32_t E, int32_t k, int64_t H,
                            int64_t I) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *gk = gpu_with_route(&plan, "moe.gemv=64,moe.dispatch=kernel,moe.persistent=off"),
               *gp = gpu_with_route(&plan, "moe.gemv=64,moe.dispatch=kernel,moe.persistent=on");
    persistent_check(gk, gp, "moe.persistent", kind, persistent, true, T, E, k, H, I);
    gk->ops->destroy(gk), gp->ops->destroy(gp);
}

/* Qwen3-30B-A3B's block (E 128, k 8, H 2048, I 768: gate|up in 2 K slices, down in 1); the small odd shapes (E 8,
 * k 2, H 200, I 72; E 13, k 5, H 384, I 200: a last 128-group part zero); the Mixtral router (top-k of the logits);
 * rows of 4096 (the norm's two chunks a thread) over 16 K groups; E 300 (the router's 16 experts a lane: the warps'
 * slices ranked first), E 1000 with k 32 (32 a lane, 256 candidates); the shared expert in the bank (E 9, k 3: top-2
 * of 8 and its pair) and Qwen3-Next's routing (512 experts + the shared one, top-10 + 1; rows of 256 and 128, not its
 * 2048 and 512: 6 GB of fp32 weights on the host); and where the
 * route does not apply: 2 tokens, rows of 4104 (above the norm's 4096) */
static void test_moe_persistent(void **s) {
    (void)s;
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 128, 8, 2048, 768);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 8, 2, 200, 72);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 13, 5, 384, 200);
    persistent_case(FM_ROUTER_TOPK_SOFTMAX, true, 1, 8, 2, 256, 72);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 8, 2, 4096, 128);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 300, 4, 256, 64);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, true, 1, 1000, 32, 256, 64);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK_SHARED, true, 1, 9, 3, 256, 72);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK_SHARED, true, 1, 513, 11, 256, 128);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, false, 2, 8, 2, 200, 72);
    persistent_case(FM_ROUTER_SOFTMAX_TOPK, false, 1, 8, 2, 4104, 72);
}

/* route moe.block_barrier: the persistent block on the counting barrier (the default), the chain's bits (each call
 * made twice), grids of several sizes on one backend in turn (each on its own count word, the first shape again after
 * the others: its word must still be a whole number of its grids); then on the generation barrier */
static void test_moe_block_barriers(void **s) {
    (void)s;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_backend *gk = gpu_with_route(&plan, "moe.gemv=64,moe.dispatch=kernel,moe.persistent=off"),
               *gp = gpu_with_route(&plan, "moe.gemv=64,moe.dispatch=kernel,moe.persistent=on,moe.block_barrier=count"),
               *gg = gpu_with_route(&plan,
                                    "moe.gemv=64,moe.dispatch=kernel,moe.persistent=on,moe.block_barrier=generation");
    const char *l = "moe.block_barrier=count", *lg = "moe.block_barrier=generation";
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 128, 8, 2048, 768);
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 8, 2, 200, 72);
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 13, 5, 384, 200);
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 128, 8, 2048, 768);
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 300, 4, 256, 64);
    persistent_check(gk, gp, l, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 8, 2, 200, 72);
    persistent_check(gk, gg, lg, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 128, 8, 2048, 768);
    persistent_check(gk, gg, lg, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 13, 5, 384, 200);
    persistent_check(gk, gg, lg, FM_ROUTER_SOFTMAX_TOPK, true, false, 1, 128, 8, 2048, 768);
    gk->ops->destroy(gk), gp->ops->destroy(gp), gg->ops->destroy(gg);
}

/* route router.cluster: the fused router as one thread-block cluster (logits met in distributed shared memory)
 * against the default fused kernel (counter, fence, reload through L2), bit for bit: logits, ids, weights, and the
 * moe op's rows after them; the same number of kernels captured. On a GPU below sm_90 the route is refused, and the
 * case says so. */
static void router_cluster_case(fm_router_kind kind, int64_t T, int32_t E, int32_t k, int64_t H, int64_t I) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    const char *base = "router.fused=on,moe.gemv=64,moe.dispatch=kernel";
    char r_on[800], what[200];
    const char *cl = gpu_test_routes(); /* as gpu_with_route composes them, to see the refusal here */
    snprintf(r_on, sizeof r_on, "%s%s%s,router.cluster=on", cl ? cl : "", cl ? "," : "", base);
    snprintf(what, sizeof what, "router.cluster=on kind %d T=%lld E=%d k=%d H=%lld", (int)kind, (long long)T, E, k,
             (long long)H);
    fm_backend *gc = NULL;
    fm_error err;
    if (fm_backend_create("cuda", &plan, 0, r_on, &gc, &err) == FM_ERR_UNSUPPORTED) {
        printf("  %-60s skipped: %s\n", what, err.msg);
        return;
    }
    if (!gc) fail_msg("cuda backend (%s): %s", r_on, err.msg);
    fm_backend *gk = gpu_with_route(&plan, base);
    block_in b = make_block(T, E, k, H, I);
    float *rw = rand_array(E * H, 0.05f);
    routed_out c = run_routed(gc, &b, rw, kind, false, false, false, 2, false),
               d = run_routed(gk, &b, rw, kind, false, false, false, 1, false);
    expect_same_routed(&c, &d, &b, false, what);
    if (c.kernels != d.kernels)
        fail_msg("%s: %lld kernel launches, the default kernel's chain %lld", what, (long long)c.kernels,
                 (long long)d.kernels);
    printf("  %-60s = router.cluster=off, bit for bit\n", what);
    free_routed(&c), free_routed(&d);
    free(rw);
    free_block(&b);
    gk->ops->destroy(gk), gc->ops->destroy(gc);
}

/* Qwen3-30B-A3B's router (E 128: 8 CTAs of 16 warps) at 1, 2 and 8 tokens; the small odd shapes (E 8, k 2, H 200: one
 * CTA; E 13, k 5, H 384), the Mixtral kind and the shared expert in the bank (E 9, k 3) */
static void test_router_cluster(void **s) {
    (void)s;
    const int64_t Ts[] = {1, 2, 8};
    for (int i = 0; i < 3; i++) router_cluster_case(FM_ROUTER_SOFTMAX_TOPK, Ts[i], 128, 8, 2048, 768);
    router_cluster_case(FM_ROUTER_SOFTMAX_TOPK, 3, 8, 2, 200, 72);
    router_cluster_case(FM_ROUTER_SOFTMAX_TOPK, 8, 13, 5, 384, 200);
    router_cluster_case(FM_ROUTER_TOPK_SOFTMAX, 3, 8, 2, 256, 72);
    router_cluster_case(FM_ROUTER_SOFTMAX_TOPK_SHARED, 3, 9, 3, 256, 72);
}

/* y = x W^T, then the residual add and the norm, on backend be: fused (linear_add_rmsnorm, `calls` times on the same
 * inputs) or the chain; returns y, the residual and the normed rows (host, caller frees) */
static void run_proj(fm_backend *be, const float *w, const float *x, const float *resid, const float *norm, int64_t M,
                     int64_t K, int64_t N, bool fused, int calls, float **y_out, float **acc_out, float **h_out) {
    fm_bank *wb = gpu_bank(be, w, 1, N, K, be->plan.w_dense, false),
            *nb = gpu_bank(be, norm, 1, 1, N, be->plan.w_other, false);
    void *xd = gpu_upload(be, x, M * K), *y_base, *acc_base, *h_base;
    void *y = gpu_guarded(be, M * N, &y_base), *acc = gpu_guarded(be, M * N, &acc_base),
         *h = gpu_guarded(be, M * N, &h_base);
    for (int c = 0; c < (fused ? calls : 1); c++) {
        be->ops->upload_f32(be, resid, M * N, acc);
        if (fused) be->ops->linear_add_rmsnorm(be, wb, xd, M, be->plan.a_dense, y, acc, nb, 1e-6f, h);
        else {
            be->ops->linear(be, wb, 0, xd, M, be->plan.a_dense, y);
            be->ops->add_rmsnorm(be, acc, y, nb, M, N, 1e-6f, h);
        }
    }
    *y_out = gpu_fetch(be, y_base, M * N, "projection");
    *acc_out = gpu_fetch(be, acc_base, M * N, "residual");
    *h_out = gpu_fetch(be, h_base, M * N, "normed rows");
    be->ops->free(be, xd);
    be->ops->bank_free(be, wb), be->ops->bank_free(be, nb);
}

/* route: NULL, or a route the case runs under (the command line's --route after it, so that they win) */
static void proj_case(fm_preset p, fm_dense dense, const char *route, int64_t M, int64_t K, int64_t N) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_plan_set_dense(&plan, dense);
    fm_error err;
    fm_backend *cpu = NULL, *gpu = NULL;
    char routes[640];
    snprintf(routes, sizeof routes, "%s%s%s", route ? route : "", route && gpu_test_routes() ? "," : "",
             gpu_test_routes() ? gpu_test_routes() : "");
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, routes[0] ? routes : NULL, &gpu, &err))
        fail_msg("cuda backend: %s", err.msg);
    assert_non_null(gpu->ops->linear_add_rmsnorm);
    float *w = rand_array(N * K, 0.1f), *x = rand_array(M * K, 1.0f), *r0 = rand_array(M * N, 2.0f),
          *nw = rand_array(N, 1.0f);
    float *f[3], *c[3], *r[3]; /* y, residual, normed rows: fused GPU, chain GPU, CPU reference */
    run_proj(gpu, w, x, r0, nw, M, K, N, true, 2, &f[0], &f[1], &f[2]);
    run_proj(gpu, w, x, r0, nw, M, K, N, false, 1, &c[0], &c[1], &c[2]);
    run_proj(cpu, w, x, r0, nw, M, K, N, true, 1, &r[0], &r[1], &r[2]);
    char what[160];
    snprintf(what, sizeof what, "linear_add_rmsnorm %s M=%lld K=%lld N=%lld%s%s", fm_wformat_name(plan.w_dense),
             (long long)M, (long long)K, (long long)N, route ? " " : "", route ? route : "");
    for (int o = 0; o < 3; o++)
        for (int64_t i = 0; i < M * N; i++)
            if (memcmp(&f[o][i], &c[o][i], sizeof(float)))
                fail_msg("%s: output %d element %lld: fused %.9g, chain %.9g", what, o, (long long)i, f[o][i], c[o][i]);
    printf("  %-60s fused = chain bit for bit\n", what);
    const bool fp8 = plan.w_dense == FM_W_E4M3_PT || plan.w_dense == FM_W_INT4_G128_TC; /* W8A8, W4A8 */
    const double bound = fp8 ? 5e-3 : plan.act_bf16 ? 1e-2 : 1e-5, after = fp8 ? 1e-2 : bound;
    const char *names[3] = {"projection", "residual", "norm"};
    for (int o = 0; o < 3; o++) {
        char w2[200];
        snprintf(w2, sizeof w2, "%s %s vs cpu", what, names[o]);
        gpu_expect_close(f[o], r[o], M * N, o == 0 ? bound : after, w2);
        free(f[o]), free(c[o]), free(r[o]);
    }
    free(w), free(x), free(r0), free(nw);
    gpu->ops->destroy(gpu), cpu->ops->destroy(cpu);
}

/* The tail's tiles (row_tail.cuh): P = 8, 4, 2, 2, 1 warps a row at M = 1, 2, 3, 4, 5..8 (one pass), two passes at
 * 9..16 rows (w8a8.gemv_max_m=16: the GEMV's two n8 tiles), rows of 2048 (one chunk a lane's thread) and of 4096
 * (two: at least 2 warps a row, so 8 rows are two passes); M = 9, 16, 64 at the default route: cuBLASLt, then
 * add_rmsnorm */
static void test_linear_add_rmsnorm_w8a8(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 2, 3, 4, 5, 8, 9, 16, 64};
    for (int i = 0; i < 9; i++) {
        proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, NULL, Ms[i], 4096, 2048); /* Qwen3-30B-A3B o_proj */
        proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, NULL, Ms[i], 200, 208);
    }
    const int64_t Mw[] = {1, 3, 8};
    for (int i = 0; i < 3; i++) proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, NULL, Mw[i], 4096, 4096); /* 4096 wide */
    const int64_t M16[] = {9, 16};
    for (int i = 0; i < 2; i++) {
        proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, "w8a8.gemv_max_m=16", M16[i], 4096, 2048);
        proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, "w8a8.gemv_max_m=16", M16[i], 4096, 4096);
    }
    proj_case(FM_PRESET_FP8, FM_DENSE_W8A8, NULL, 1, 2048, 5120); /* rows above the tail's: the two ops */
}

/* The fp8 preset's dense projections (int4-tc, W4A8): the GEMV up to 16 rows with the same tail (M = 1..5, 8: every
 * tiling of row_tail.cuh in one pass; 9, 16: the GEMV's two n8 tiles, two passes), 64 rows on the grouped GEMM (then
 * add_rmsnorm); the o projection of Qwen3-30B-A3B (4096 -> 2048), rows of 4096, K 200 -> N 208; q|k|v's 5120 rows
 * (above the tail's 4096: the two ops) */
static void test_linear_add_rmsnorm_w4a8(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 2, 3, 4, 5, 8, 9, 16, 64};
    for (int i = 0; i < 9; i++) {
        proj_case(FM_PRESET_FP8, FM_DENSE_PRESET, NULL, Ms[i], 4096, 2048);
        proj_case(FM_PRESET_FP8, FM_DENSE_PRESET, NULL, Ms[i], 200, 208);
    }
    const int64_t Mw[] = {1, 3, 8, 16};
    for (int i = 0; i < 4; i++) proj_case(FM_PRESET_FP8, FM_DENSE_PRESET, NULL, Mw[i], 4096, 4096);
    proj_case(FM_PRESET_FP8, FM_DENSE_PRESET, NULL, 1, 2048, 5120);
    proj_case(FM_PRESET_FP8, FM_DENSE_PRESET, "dense.gemv=off", 2, 4096, 2048); /* the GEMM: the two ops */
}

/* dense.quant=fused: the fp8 preset's dense decode GEMV quantizing its bf16 rows itself, against the quantizer's
 * launch before it, bit for bit: linear, and linear_add_rmsnorm with the o projection's tail (decode.fused=on), at
 * M = 1, 2, 5, 8 (one n8 tile), 9, 16 (two), on Qwen3-30B-A3B's q|k|v (2048 -> 5120) and o (4096 -> 2048) shapes,
 * a K that is not a multiple of 128 (200 -> 208: the last group padded with zeros), and M = 64 (the GEMM: the
 * route leaves it to the quantizer's launch) */
/* The fp8 preset's dense projection of M rows (K -> N) under route rk against route rf, bit for bit: linear and
 * linear_add_rmsnorm (the decode step's o projection with its tail), each run twice */
static void dense_routes_case(const char *rk, const char *rf, int64_t M, int64_t K, int64_t N) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_plan_set_dense(&plan, FM_DENSE_PRESET);
    fm_backend *kb = gpu_with_route(&plan, rk), *fb = gpu_with_route(&plan, rf);
    float *w = rand_array(N * K, 0.1f), *x = rand_array(M * K, 1.0f), *r0 = rand_array(M * N, 2.0f),
          *nw = rand_array(N, 1.0f);
    for (int tail = 0; tail < 2; tail++) {
        float *a[3], *b[3];
        run_proj(kb, w, x, r0, nw, M, K, N, tail, 2, &a[0], &a[1], &a[2]);
        run_proj(fb, w, x, r0, nw, M, K, N, tail, 2, &b[0], &b[1], &b[2]);
        for (int o = 0; o < 3; o++) {
            for (int64_t i = 0; i < M * N; i++)
                if (memcmp(&a[o][i], &b[o][i], sizeof(float)))
                    fail_msg("%s M=%lld K=%lld N=%lld%s: output %d element %lld: %.9g, %s %.9g", rf, (long long)M,
                             (long long)K, (long long)N, tail ? " (with the tail)" : "", o, (long long)i, b[o][i], rk,
                             a[o][i]);
            free(a[o]), free(b[o]);
        }
    }
    printf("  %s M=%-3lld K=%-5lld N=%-5lld = %s bit for bit (linear, linear_add_rmsnorm)\n", rf, (long long)M,
           (long long)K, (long long)N, rk);
    free(w), free(x), free(r0), free(nw);
    kb->ops->destroy(kb), fb->ops->destroy(fb);
}

static void dense_quant_case(int64_t M, int64_t K, int64_t N) {
    dense_routes_case("dense.quant=kernel,decode.fused=on", "dense.quant=fused,decode.fused=on", M, K, N);
}

/* route moe.plan_slots: the grouped dispatch's slots assigned by the plan kernel's block (up to 4096 routed rows; the
 * slot kernel above) with the results of the two launches, bit for bit: Qwen3-30B-A3B's experts at 8, 64, 300 and
 * 2048 tokens (the last 16,384 rows: the slot kernel's fallback), an expert width that is not a multiple of 128 (the
 * slots' rows of h zeroed past it), a row count past 1024 in one block (600 x 2 = 1200 rows), and an NVFP4 dispatch */
static void test_moe_plan_slots(void **s) {
    (void)s;
    const char *off = "moe.plan_slots=off", *on = "moe.plan_slots=on", *grouped = "moe.gemv=off";
    const int64_t Tq[] = {8, 64, 300, 2048};
    for (int i = 0; i < 4; i++)
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, Tq[i], 128, 8, 2048, 768);
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, 40, 8, 2, 200, 72);
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, 600, 13, 2, 384, 200);
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_NVFP4, grouped, off, on, 8, 8, 2, 256, 72);
}

/* w4a8.early_codes: the W4A8 GEMM's first codes issued before its PDL wait where its tile is known, against after
 * it, bit for bit. The experts' grouped down GEMM: Qwen3-30B-A3B's experts on 16-row tiles (8 tokens), 64 and 300
 * tokens (64-row tiles, codes through the ring) and 2048 (codes in registers); the odd shapes, whose down GEMM has one
 * (I = 72) or two (I = 200) 128-groups, fewer than the three stages issued early; an NVFP4 dispatch (its gate|up GEMM
 * expands FP4, the down GEMM reads e4m3 h). Each run twice (run_end), so a CTA that read a stale tile would show.
 * The dense projections on the GEMM (from 17 rows), its K split over a cluster and not: q|k|v and o of Qwen3-30B-A3B
 * and projections of two and of one and a part K groups. */
static void test_w4a8_early_codes(void **s) {
    (void)s;
    const char *off = "w4a8.early_codes=off", *on = "w4a8.early_codes=on", *grouped = "moe.gemv=off";
    const int64_t Tq[] = {8, 64, 300, 2048};
    for (int i = 0; i < 4; i++)
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, Tq[i], 128, 8, 2048, 768);
    const int64_t Ts[] = {3, 40};
    for (int i = 0; i < 2; i++) {
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, Ts[i], 8, 2, 200, 72);
        same_bits_case(FM_PRESET_FP8, FM_DISPATCH_PRESET, grouped, off, on, Ts[i], 13, 5, 384, 200);
    }
    same_bits_case(FM_PRESET_FP8, FM_DISPATCH_NVFP4, grouped, off, on, 8, 8, 2, 256, 72);
    const char *splits[] = {"fill", "1"};
    const int64_t Ms[] = {17, 64, 300};
    for (int sp = 0; sp < 2; sp++) {
        char r_off[200], r_on[200];
        snprintf(r_off, sizeof r_off, "w4a8.gemv_max_m=16,w4a8.splits=%s,%s", splits[sp], off);
        snprintf(r_on, sizeof r_on, "w4a8.gemv_max_m=16,w4a8.splits=%s,%s", splits[sp], on);
        for (int i = 0; i < 3; i++) {
            dense_routes_case(r_off, r_on, Ms[i], 2048, 5120);
            dense_routes_case(r_off, r_on, Ms[i], 4096, 2048);
        }
        dense_routes_case(r_off, r_on, 40, 256, 384);
        dense_routes_case(r_off, r_on, 40, 200, 208);
    }
}

static void test_linear_dense_quant_fused(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 2, 5, 8, 9, 16};
    for (int i = 0; i < 6; i++) {
        dense_quant_case(Ms[i], 2048, 5120);
        dense_quant_case(Ms[i], 4096, 2048);
        dense_quant_case(Ms[i], 200, 208);
    }
    dense_quant_case(64, 2048, 512);
}

/* the other dense formats: the op runs the two ops (bf16, fp32, int4 w4a16) */
static void test_linear_add_rmsnorm_other_formats(void **s) {
    (void)s;
    const int64_t Ms[] = {1, 2, 8, 16, 64};
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_REF32, FM_PRESET_INT4};
    for (int i = 0; i < 5; i++)
        for (int p = 0; p < 3; p++) proj_case(presets[p], FM_DENSE_PRESET, NULL, Ms[i], 200, 208);
}

/* ---- gdn_decode_fused: a decode step's Gated DeltaNet (conv update, delta rule, gated norm) as one op ---- */

/* One decode step's inputs: B rows, the first n real (distinct sequences of a pool of `slots`, every third at position
 * 0, the others from random states at positions >= kernel: the GPU's conv reads zeros before position 0 where the
 * CPU reads the state, which a real state holds there anyway, zeroed at position 0; a random one does not), the rest
 * padding rows (copies of row 0's sequence, position and inputs, as
 * generate.c pads a graph's bucket). */
typedef struct gdn_step {
    fm_gdn_shape g;
    int64_t B, n, slots, C, W, V, H;
    float *qkvz, *ba, *conv_w, *a_log, *dt, *norm, *conv_st, *rec_st;
    float *h, *wba; /* the normed rows [B][H] and the in_proj_ba matrix [2 nv][H] (route gdn.decode_ba) */
    int32_t seq[72], pos[72];
} gdn_step;

static gdn_step make_step(fm_gdn_shape g, int64_t n, int64_t pad, int64_t H) {
    gdn_step d = {.g = g, .B = n + pad, .n = n, .slots = n + 3, .H = H};
    d.C = fm_gdn_channels(g), d.W = fm_gdn_qkvz_width(g), d.V = (int64_t)g.nv * g.dv;
    d.qkvz = rand_array(d.B * d.W, 1.0f), d.ba = rand_array(d.B * 2 * g.nv, 2.0f);
    /* b and a of a spread like ba's above (the sum of H products of a weight within 6 / sqrt(H): ~2) */
    d.h = rand_array(d.B * H, 1.0f), d.wba = rand_array(2 * (int64_t)g.nv * H, 6.0f / sqrtf((float)H));
    d.conv_w = rand_array(d.C * g.kernel, 0.5f), d.norm = rand_array(g.dv, 1.0f);
    d.a_log = rand_array(g.nv, 1.0f), d.dt = rand_array(g.nv, 1.0f);
    d.conv_st = rand_array(d.slots * fm_gdn_conv_state_elems(g), 1.0f);
    d.rec_st = rand_array(d.slots * fm_gdn_rec_state_elems(g), 0.3f);
    for (int64_t t = 0; t < n; t++)
        d.seq[t] = (int32_t)((t * 5 + 2) % d.slots),
        d.pos[t] = t % 3 == 1 ? 0 : g.kernel + (int32_t)((frand() + 1.0f) * 60);
    for (int64_t t = n; t < d.B; t++) {
        d.seq[t] = d.seq[0], d.pos[t] = d.pos[0];
        memcpy(d.qkvz + t * d.W, d.qkvz, (size_t)d.W * sizeof(float));
        memcpy(d.ba + t * 2 * g.nv, d.ba, (size_t)(2 * g.nv) * sizeof(float));
        memcpy(d.h + t * H, d.h, (size_t)H * sizeof(float));
    }
    return d;
}

static void free_step(gdn_step *d) {
    free(d->qkvz), free(d->ba), free(d->conv_w), free(d->norm), free(d->a_log), free(d->dt);
    free(d->conv_st), free(d->rec_st), free(d->h), free(d->wba);
}

/* The fused kernel's b | a rows (gdn_decode.cu's ba_dots, route gdn.decode_ba) on the host, in its order: of the
 * kernel's 128 threads (DEC_THREADS), thread tid sums the elements c * 1024 + 8 tid + i (c = 0, 1, ..., i = 0..7) by
 * fmaf from 0; each warp's 32 sums are added by the xor butterfly over lane distances 16, 8, 4, 2, 1; the 4 warps'
 * in order from 0. h and the weights as the GPU holds them (bf16-rounded on a bf16 plan); the sums are rounded to the
 * activation type on upload, as the kernel rounds them. */
static float *host_ba(const gdn_step *d, bool bf16) {
    const int64_t H = d->H, nba = 2 * (int64_t)d->g.nv;
    float *h = malloc((size_t)(d->B * H) * sizeof *h), *w = malloc((size_t)(nba * H) * sizeof *w);
    float *ba = malloc((size_t)(d->B * nba) * sizeof *ba);
    memcpy(h, d->h, (size_t)(d->B * H) * sizeof *h), memcpy(w, d->wba, (size_t)(nba * H) * sizeof *w);
    if (bf16) fm_round_bf16_array(h, d->B * H), fm_round_bf16_array(w, nba * H);
    for (int64_t t = 0; t < d->B; t++)
        for (int64_t k = 0; k < nba; k++) {
            float total = 0.0f;
            for (int warp = 0; warp < 4; warp++) {
                float v[32], nv[32];
                for (int lane = 0; lane < 32; lane++) {
                    const int64_t tid = warp * 32 + lane;
                    float acc = 0.0f;
                    for (int64_t e = 8 * tid; e < H; e += 8 * 128)
                        for (int i = 0; i < 8; i++) acc = fmaf(w[k * H + e + i], h[t * H + e + i], acc);
                    v[lane] = acc;
                }
                for (int o = 16; o > 0; o >>= 1) {
                    for (int lane = 0; lane < 32; lane++) nv[lane] = v[lane] + v[lane ^ o];
                    memcpy(v, nv, sizeof v);
                }
                total += v[0];
            }
            ba[t * nba + k] = total;
        }
    free(h), free(w);
    return ba;
}

static void *upload_states(fm_backend *be, const float *x, int64_t n) {
    void *p = be->ops->alloc(be, (size_t)n * sizeof(float));
    assert_non_null(p);
    be->ops->upload_raw(be, x, (size_t)n * sizeof(float), p);
    return p;
}

static float *fetch_states(fm_backend *be, void *p, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    be->ops->download_raw(be, p, (size_t)n * sizeof(float), h);
    be->ops->free(be, p);
    return h;
}

/* where a run's b | a rows come from: the given ones (ba_rows), the op's own projection of h (fused only, route
   gdn.decode_ba), or the linear op on the backend before the op or chain */
typedef enum { BA_GIVEN, BA_IN_OP, BA_LINEAR } ba_source;

/* The step's first `rows` rows on backend be, fused or as the chain; returns the normed rows and both states, and
   with q_out the rows' out_q (fm_qrows, for the out projection: dense.quant=producer) */
static void run_gdn_ba(fm_backend *be, const gdn_step *d, int64_t rows, bool fused, ba_source src, const float *ba_rows,
                       float **out, float **conv_st, float **rec_st, uint8_t **q_out) {
    const fm_gdn_shape g = d->g;
    const int64_t nc = d->slots * fm_gdn_conv_state_elems(g), nr = d->slots * fm_gdn_rec_state_elems(g);
    fm_bank *cb = gpu_bank(be, d->conv_w, 1, d->C, g.kernel, be->plan.w_other, false);
    fm_bank *al = gpu_bank(be, d->a_log, 1, 1, g.nv, be->plan.w_other, false);
    fm_bank *dt = gpu_bank(be, d->dt, 1, 1, g.nv, be->plan.w_other, false);
    fm_bank *nb = gpu_bank(be, d->norm, 1, 1, g.dv, be->plan.w_other, false);
    void *zd = gpu_upload(be, d->qkvz, rows * d->W), *bad = gpu_upload(be, ba_rows, rows * 2 * g.nv);
    fm_bank *bab = src != BA_GIVEN ? gpu_bank(be, d->wba, 1, 2 * (int64_t)g.nv, d->H, be->plan.w_other, false) : NULL;
    void *hd = src != BA_GIVEN ? gpu_upload(be, d->h, rows * d->H) : NULL;
    if (src == BA_LINEAR) be->ops->linear(be, bab, 0, hd, rows, FM_A_NATIVE, bad);
    void *cs = upload_states(be, d->conv_st, nc), *rs = upload_states(be, d->rec_st, nr);
    void *sd = be->ops->alloc(be, (size_t)rows * sizeof(int32_t)), *pd = be->ops->alloc(be, (size_t)rows * 4);
    be->ops->upload_ids(be, d->seq, rows, sd), be->ops->upload_ids(be, d->pos, rows, pd);
    void *qkv = be->ops->alloc(be, (size_t)(rows * d->C) * be->ops->act_size);
    void *core = be->ops->alloc(be, (size_t)(rows * d->V) * be->ops->act_size), *base;
    void *o = gpu_guarded(be, rows * d->V, &base);
    const size_t qbytes = fm_qrows_bytes(rows, d->V);
    void *hq = q_out ? be->ops->alloc(be, qbytes) : NULL;
    if (fused) {
        be->ops->gdn_decode_fused(be, zd, bad, src == BA_IN_OP ? bab : NULL, hd, cb, al, dt, nb, rows, g, 1e-6f, cs, rs,
                                  sd, pd, qkv, core, o, hq);
    } else {
        be->ops->gdn_conv(be, zd, cb, rows, g, cs, sd, pd, qkv);
        be->ops->gdn_recurrent(be, qkv, bad, al, dt, rows, g, rs, sd, pd, core);
        be->ops->gdn_norm_gate(be, core, zd, nb, rows, g, 1e-6f, o, hq);
    }
    *out = gpu_fetch(be, base, rows * d->V, "gdn output");
    if (q_out) {
        *q_out = malloc(qbytes);
        be->ops->download_raw(be, hq, qbytes, *q_out);
        be->ops->free(be, hq);
    }
    *conv_st = fetch_states(be, cs, nc), *rec_st = fetch_states(be, rs, nr);
    be->ops->free(be, zd), be->ops->free(be, bad), be->ops->free(be, sd), be->ops->free(be, pd);
    be->ops->free(be, qkv), be->ops->free(be, core);
    if (bab) be->ops->bank_free(be, bab), be->ops->free(be, hd);
    be->ops->bank_free(be, cb), be->ops->bank_free(be, al), be->ops->bank_free(be, dt), be->ops->bank_free(be, nb);
}

static void run_gdn(fm_backend *be, const gdn_step *d, int64_t rows, bool fused, float **out, float **conv_st,
                    float **rec_st, uint8_t **q_out) {
    run_gdn_ba(be, d, rows, fused, BA_GIVEN, d->ba, out, conv_st, rec_st, q_out);
}

static const char *gdn_names[3] = {"output", "conv states", "recurrent states"};

/* the fused op's two calls (f, f2: output, conv states, recurrent states) equal to the chain's (c), bit for bit */
static void expect_gdn_bits(float *const f[3], float *const f2[3], float *const c[3], const int64_t len[3],
                            const char *what) {
    for (int o = 0; o < 3; o++)
        for (int64_t i = 0; i < len[o]; i++) {
            if (memcmp(&f[o][i], &c[o][i], sizeof(float)))
                fail_msg("%s: %s element %lld: fused %.9g, chain %.9g", what, gdn_names[o], (long long)i, f[o][i],
                         c[o][i]);
            if (memcmp(&f2[o][i], &c[o][i], sizeof(float)))
                fail_msg("%s: %s element %lld: fused (second call) %.9g, chain %.9g", what, gdn_names[o], (long long)i,
                         f2[o][i], c[o][i]);
        }
}

/* the fused GPU results (f) against the CPU chain's (r) on the real rows, test_cuda_qnext's bounds of the chain's
   ops against the CPU; frees every array */
static void expect_gdn_cpu(float *f[3], float *f2[3], float *c[3], float *r[3], const int64_t ref_len[3], bool bf16,
                           const char *what) {
    const double bound = bf16 ? 1e-2 : 1e-5;
    for (int o = 0; o < 3; o++) {
        char w2[260];
        snprintf(w2, sizeof w2, "%s %s vs cpu", what, gdn_names[o]);
        gpu_expect_close(f[o], r[o], ref_len[o], o == 1 ? 1e-6 + (bf16 ? 1e-2 : 0) : bound, w2);
        free(f[o]), free(f2[o]), free(c[o]), free(r[o]);
    }
}

static void gdn_decode_case(fm_preset p, fm_gdn_shape g, int64_t n, int64_t pad) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    fm_backend *cpu = NULL, *gpu = NULL;
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, gpu_test_routes(), &gpu, &err)) fail_msg("cuda backend: %s", err.msg);
    assert_non_null(gpu->ops->gdn_decode_fused);
    gdn_step d = make_step(g, n, pad, 8);
    const int64_t nc = d.slots * fm_gdn_conv_state_elems(g), nr = d.slots * fm_gdn_rec_state_elems(g);
    float *f[3], *c[3], *r[3];      /* output, conv states, recurrent states: fused GPU, chain GPU, CPU reference */
    float *f2[3];                   /* the fused op again on the same backend: its arrival counters were left zero */
    uint8_t *fq = NULL, *cq = NULL; /* bf16: out_q asked of both (the quantizer's input is bf16) */
    run_gdn(gpu, &d, d.B, true, &f[0], &f[1], &f[2], plan.act_bf16 ? &fq : NULL);
    run_gdn(gpu, &d, d.B, true, &f2[0], &f2[1], &f2[2], NULL);
    run_gdn(gpu, &d, d.B, false, &c[0], &c[1], &c[2], plan.act_bf16 ? &cq : NULL);
    run_gdn(cpu, &d, d.n, true, &r[0], &r[1], &r[2], NULL); /* the real rows: the cpu backend pads no step */
    char what[160];
    snprintf(what, sizeof what, "gdn_decode_fused %s nk=%d nv=%d dk=%d dv=%d K=%d B=%lld (%lld padding)",
             plan.act_bf16 ? "bf16" : "fp32", g.nk, g.nv, g.dk, g.dv, g.kernel, (long long)d.B, (long long)pad);
    const int64_t len[3] = {d.B * d.V, nc, nr};
    expect_gdn_bits(f, f2, c, len, what);
    if (fq) { /* the norm's warps (dv = 128) or the quantizer's launch after it: the quantizer's codes either way */
        char wq[200];
        snprintf(wq, sizeof wq, "%s fused", what);
        expect_qrows(fq, f[0], d.B, d.V, wq);
        snprintf(wq, sizeof wq, "%s chain", what);
        expect_qrows(cq, c[0], d.B, d.V, wq);
        free(fq), free(cq);
    }
    printf("  %-60s fused = chain bit for bit%s\n", what, plan.act_bf16 ? ", out_q = the quantizer's" : "");
    const int64_t ref_len[3] = {d.n * d.V, nc, nr};
    expect_gdn_cpu(f, f2, c, r, ref_len, plan.act_bf16, what);
    free_step(&d);
    gpu->ops->destroy(gpu), cpu->ops->destroy(cpu);
}

/* Route gdn.decode_ba: the fused op given the in_proj_ba matrix and the normed rows h [B][H]. Where the kernel takes
 * the projection (H a multiple of 8: fm_cuda_gdn_ba_fits) against the chain fed host_ba's rows (the kernel's order),
 * else (the linear op, then the kernel) against the chain after the same linear op; bit for bit either way, the
 * fused op twice. With early (route gdn.early_state) the state loads before the PDL wait. Against the CPU (the
 * linear, then the chain) with the bounds above. */
static void gdn_decode_ba_case(fm_preset p, fm_gdn_shape g, int64_t n, int64_t pad, int64_t H, bool early) {
    fm_plan plan;
    fm_plan_for_backend(p, "cuda", &plan);
    fm_error err;
    fm_backend *cpu = NULL, *gpu = NULL;
    char routes[512];
    const char *base = gpu_test_routes();
    snprintf(routes, sizeof routes, "%s%sgdn.early_state=%s", base ? base : "", base ? "," : "", early ? "on" : "off");
    assert_int_equal(fm_backend_create("cpu", &plan, 0, NULL, &cpu, &err), FM_OK);
    if (fm_backend_create("cuda", &plan, 0, routes, &gpu, &err)) fail_msg("cuda backend: %s", err.msg);
    gdn_step d = make_step(g, n, pad, H);
    const bool in_kernel = H % 8 == 0 && g.dk <= 128; /* the kernel takes the projection and the shape */
    float *ref_ba = in_kernel ? host_ba(&d, plan.act_bf16) : NULL;
    const int64_t nc = d.slots * fm_gdn_conv_state_elems(g), nr = d.slots * fm_gdn_rec_state_elems(g);
    float *f[3], *f2[3], *c[3], *r[3];
    run_gdn_ba(gpu, &d, d.B, true, BA_IN_OP, d.ba, &f[0], &f[1], &f[2], NULL);
    run_gdn_ba(gpu, &d, d.B, true, BA_IN_OP, d.ba, &f2[0], &f2[1], &f2[2], NULL);
    run_gdn_ba(gpu, &d, d.B, false, in_kernel ? BA_GIVEN : BA_LINEAR, in_kernel ? ref_ba : d.ba, &c[0], &c[1], &c[2],
               NULL);
    run_gdn_ba(cpu, &d, d.n, true, BA_IN_OP, d.ba, &r[0], &r[1], &r[2], NULL);
    char what[200];
    snprintf(what, sizeof what, "gdn_decode_fused + ba (%s) %s nk=%d nv=%d H=%lld B=%lld (%lld padding)%s",
             in_kernel ? "in the kernel" : "the linear op", plan.act_bf16 ? "bf16" : "fp32", g.nk, g.nv, (long long)H,
             (long long)d.B, (long long)pad, early ? ", early state" : "");
    const int64_t len[3] = {d.B * d.V, nc, nr}, ref_len[3] = {d.n * d.V, nc, nr};
    expect_gdn_bits(f, f2, c, len, what);
    printf("  %-60s fused = chain bit for bit\n", what);
    expect_gdn_cpu(f, f2, c, r, ref_len, plan.act_bf16, what);
    free(ref_ba);
    free_step(&d);
    gpu->ops->destroy(gpu), cpu->ops->destroy(cpu);
}

static void test_gdn_decode_fused(void **s) {
    (void)s;
    const fm_gdn_shape qnext = {16, 32, 128, 128, 4}, small = {2, 4, 16, 12, 4}, tied = {1, 3, 8, 10, 3};
    const int64_t rows[][2] = {{1, 0}, {3, 1}, {64, 0}, {61, 3}}; /* real rows, padding rows */
    for (int i = 0; i < 4; i++) {
        gdn_decode_case(FM_PRESET_REF, qnext, rows[i][0], rows[i][1]); /* bf16: the norm's 4-column map */
        gdn_decode_case(FM_PRESET_REF32, qnext, rows[i][0], rows[i][1]);
        gdn_decode_case(FM_PRESET_REF, small, rows[i][0], rows[i][1]);
        gdn_decode_case(FM_PRESET_REF, tied, rows[i][0], rows[i][1]); /* a conv of 3 taps: the window's zero tap */
    }
    const fm_gdn_shape wide = {2, 4, 256, 128, 4}; /* dk above the fused kernel's: the chain, through the same op */
    gdn_decode_case(FM_PRESET_REF, wide, 3, 1);
    /* route gdn.decode_ba: Qwen3-Next's hidden size 2048 (two 8-element chunks a thread), 40 (threads past the row
       add nothing), 36 (the linear op first); with and without the early state loads */
    for (int i = 0; i < 4; i++)
        for (int early = 0; early < 2; early++) {
            gdn_decode_ba_case(FM_PRESET_REF, qnext, rows[i][0], rows[i][1], 2048, early);
            gdn_decode_ba_case(FM_PRESET_REF32, qnext, rows[i][0], rows[i][1], 2048, early);
            gdn_decode_ba_case(FM_PRESET_REF, small, rows[i][0], rows[i][1], 40, early);
        }
    gdn_decode_ba_case(FM_PRESET_REF, small, 3, 1, 36, false);
    gdn_decode_ba_case(FM_PRESET_REF, wide, 3, 1, 2048, true); /* the chain: the linear op, then the three ops */
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_add_rmsnorm_w4a8),
        cmocka_unit_test(test_moe_add_rmsnorm_reference_experts),
        cmocka_unit_test(test_moe_down_quant_fused),
        cmocka_unit_test(test_moe_combine_fused),
        cmocka_unit_test(test_w4a8_early_codes),
        cmocka_unit_test(test_moe_plan_slots),
        cmocka_unit_test(test_router_dispatch_fused),
        cmocka_unit_test(test_router_cluster),
        cmocka_unit_test(test_moe_persistent),
        cmocka_unit_test(test_moe_block_barriers),
        cmocka_unit_test(test_linear_add_rmsnorm_w8a8),
        cmocka_unit_test(test_linear_add_rmsnorm_w4a8),
        cmocka_unit_test(test_linear_add_rmsnorm_other_formats),
        cmocka_unit_test(test_gdn_decode_fused),
        cmocka_unit_test(test_linear_dense_quant_fused),
    };
    /* FM_TEST_FILTER='test_linear_add_rmsnorm*' runs the matching tests only (racecheck of one kernel) */
    if (getenv("FM_TEST_FILTER")) cmocka_set_test_filter(getenv("FM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
