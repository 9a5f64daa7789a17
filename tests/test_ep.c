/* Expert parallelism on the CPU backend (src/dist/ep_moe.h), over the simulated communicator: one MoE layer split over
 * 1, 2 and 4 ranks (each a thread with its own CPU backend holding only its experts, each routing its own slice of the
 * tokens, the rows travelling in the dispatch format) gives the same bits as one backend computing every expert, for
 * the oracle, the int4 and fp8 presets and the MXFP4 and NVFP4 dispatch (NVFP4's tensor scale from the ranks' amax);
 * the FP4 blocks carry about half the bytes of the e4m3 ones; a split the experts do not allow fails on every rank. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dist/ep_moe.h"
#include "quant/bf16.h"
#include "sim_world.h"

#define E 8
#define K 2
#define H 256
#define I 192
#define T_ALL 37

static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static char g_name[] = "test.weight";

static fm_st_tensor tensor(const float *data, int64_t n, int64_t rows, int64_t cols) {
    fm_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = g_name, t.dtype = FM_DTYPE_F32, t.n_dims = 3;
    t.shape[0] = n, t.shape[1] = rows, t.shape[2] = cols;
    t.n_elements = n * rows * cols;
    t.data = (const uint8_t *)data, t.nbytes = (uint64_t)t.n_elements * sizeof(float);
    return t;
}

/* experts [first, first + n) of a bank of [rows, cols] matrices (two parts, gate then up, when b is not NULL) */
static fm_bank *bank(fm_backend *be, const float *a, const float *b, int32_t first, int32_t n, int64_t ra, int64_t rb,
                     int64_t cols, fm_wformat fmt) {
    fm_st_tensor ta = tensor(a, E, ra, cols), tb = tensor(b ? b : a, E, rb, cols);
    const int parts = b ? 2 : 1;
    fm_wsrc *srcs = calloc((size_t)(parts * n), sizeof *srcs);
    for (int32_t i = 0; i < n; i++) {
        srcs[parts * i] = (fm_wsrc){&ta, (int64_t)(first + i) * ra * cols, ra, cols, {0}, {0}};
        if (b) srcs[parts * i + 1] = (fm_wsrc){&tb, (int64_t)(first + i) * rb * cols, rb, cols, {0}, {0}};
    }
    fm_bank_src src = {srcs, n, parts, b ? "test gate_up" : "test down", b != NULL, true};
    fm_bank *w = NULL;
    fm_error err = {{0}};
    if (be->ops->bank_create(be, &src, fmt, &w, &err) != FM_OK) fail_msg("bank_create: %s", err.msg);
    free(srcs);
    return w;
}

typedef struct layer {
    float *gate, *up, *down; /* [E][I][H], [E][I][H], [E][H][I] */
    float *x, *w;            /* [T_ALL][H], [T_ALL][K] */
    int32_t ids[T_ALL * K];
} layer;

static void make_layer(layer *L) {
    uint32_t s = 12345;
    L->gate = malloc(sizeof(float) * E * I * H), L->up = malloc(sizeof(float) * E * I * H);
    L->down = malloc(sizeof(float) * E * H * I);
    L->x = malloc(sizeof(float) * T_ALL * H), L->w = malloc(sizeof(float) * T_ALL * K);
    for (int64_t i = 0; i < (int64_t)E * I * H; i++)
        L->gate[i] = 0.05f * rnd(&s), L->up[i] = 0.05f * rnd(&s), L->down[i] = 0.05f * rnd(&s);
    for (int64_t i = 0; i < (int64_t)T_ALL * H; i++) L->x[i] = rnd(&s) * ((i % H) % 97 == 0 ? 8.0f : 1.0f);
    for (int t = 0; t < T_ALL; t++) { /* two distinct experts, skewed toward the low ones so ranks get unequal work */
        const int32_t e0 = (int32_t)((rnd(&s) * 0.5f + 0.5f) * (rnd(&s) * 0.5f + 0.5f) * E) % E;
        const int32_t e1 = (e0 + 1 + (int32_t)((rnd(&s) * 0.5f + 0.5f) * (E - 1))) % E;
        L->ids[t * K] = e0, L->ids[t * K + 1] = e1 == e0 ? (e0 + 1) % E : e1;
        const float a = 0.5f + 0.5f * (rnd(&s) * 0.5f + 0.5f);
        L->w[t * K] = a, L->w[t * K + 1] = 1.0f - a;
    }
}

static void free_layer(layer *L) { free(L->gate), free(L->up), free(L->down), free(L->x), free(L->w); }

static int g_extra_tokens; /* the last rank takes this many tokens more than the blocks hold (the error path) */

typedef struct rank_job {
    const layer *L;
    fm_plan plan;
    float *out; /* [T_ALL][H]: this rank writes its slice */
    fm_status st;
    fm_ep_stats stats;
    char msg[sizeof(((fm_error *)0)->msg)];
} rank_job;

static fm_status run_rank(fm_comm *c, void *arg) {
    rank_job *j = arg;
    const int r = fm_comm_rank(c), N = fm_comm_size(c);
    fm_backend *be = NULL;
    fm_error err = {{0}};
    if (fm_cpu_backend_create(&j->plan, 1, &be, &err) != FM_OK) fail_msg("backend: %s", err.msg);
    int32_t first, n;
    fm_ep_expert_range(E, N, r, &first, &n);
    fm_bank *gu = n ? bank(be, j->L->gate, j->L->up, first, n, I, I, H, j->plan.w_expert) : NULL;
    fm_bank *dn = n ? bank(be, j->L->down, NULL, first, n, H, 0, I, j->plan.w_expert) : NULL;
    const int64_t t0 = (int64_t)T_ALL * r / N, t1 = (int64_t)T_ALL * (r + 1) / N;
    const int64_t max_tokens = (T_ALL + N - 1) / N - (r == N - 1 ? g_extra_tokens : 0);
    fm_ep_layout lay;
    fm_ep_buffers bufs = {0};
    j->st = fm_ep_layout_of(E, N, max_tokens, K, H, j->plan.a_dispatch, j->plan.act_bf16, &lay, &err);
    if (j->st == FM_OK && fm_ep_buffers_alloc(be, &lay, &bufs, &err) != FM_OK) fail_msg("buffers: %s", err.msg);
    j->stats.with_rows = true;
    if (j->st == FM_OK)
        j->st = fm_ep_moe(c, be, &lay, &bufs, gu, dn, j->L->x + t0 * H, t1 - t0, j->L->ids + t0 * K, j->L->w + t0 * K,
                          j->out + t0 * H, &j->stats, &err);
    fm_ep_buffers_free(be, &bufs);
    snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    if (gu) be->ops->bank_free(be, gu);
    if (dn) be->ops->bank_free(be, dn);
    be->ops->destroy(be);
    return j->st;
}

/* the single-rank result: one backend, every expert, every token */
static void single_rank(const layer *L, const fm_plan *plan, float *out) {
    fm_backend *be = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_cpu_backend_create(plan, 1, &be, &err), FM_OK);
    fm_bank *gu = bank(be, L->gate, L->up, 0, E, I, I, H, plan->w_expert);
    fm_bank *dn = bank(be, L->down, NULL, 0, E, H, 0, I, plan->w_expert);
    be->ops->moe(be, gu, dn, L->x, T_ALL, L->ids, L->w, K, plan->a_dispatch, plan->a_expert, out);
    be->ops->bank_free(be, gu), be->ops->bank_free(be, dn);
    be->ops->destroy(be);
}

static int run_world(const layer *L, const fm_plan *plan, int N, float *out, rank_job *jobs) {
    for (int r = 0; r < N; r++)
        memset(&jobs[r], 0, sizeof jobs[r]), jobs[r].L = L, jobs[r].plan = *plan, jobs[r].out = out;
    return sim_world_run(N, run_rank, jobs, sizeof *jobs);
}

static void ep_equals_single_rank(void **s) {
    (void)s;
    layer L;
    make_layer(&L);
    const fm_preset presets[] = {FM_PRESET_REF, FM_PRESET_INT4, FM_PRESET_FP8, FM_PRESET_FP8, FM_PRESET_FP8};
    const fm_dispatch dispatch[] = {FM_DISPATCH_PRESET, FM_DISPATCH_PRESET, FM_DISPATCH_PRESET, FM_DISPATCH_MXFP4,
                                    FM_DISPATCH_NVFP4};
    const char *names[] = {"ref", "int4", "fp8", "fp8 + mxfp4 dispatch", "fp8 + nvfp4 dispatch"};
    float *ref = malloc(sizeof(float) * T_ALL * H), *out = malloc(sizeof(float) * T_ALL * H);
    float *x32 = L.x, *x16 = malloc(sizeof(float) * T_ALL * H);
    uint64_t bytes_fmt[5] = {0}; /* dispatch bytes at 4 ranks */
    for (int p = 0; p < 5; p++) {
        fm_plan plan;
        fm_error err = {{0}};
        fm_plan_from_preset(presets[p], &plan);
        if (dispatch[p] != FM_DISPATCH_PRESET) assert_int_equal(fm_plan_set_dispatch(&plan, dispatch[p], &err), FM_OK);
        /* a bf16 plan's activations are bf16 values (the layer before rounded them), which its rows carry as bf16 */
        memcpy(x16, x32, sizeof(float) * T_ALL * H);
        if (plan.act_bf16) fm_round_bf16_array(x16, T_ALL * H);
        L.x = x16;
        single_rank(&L, &plan, ref);
        for (int N = 1; N <= 4; N *= 2) {
            rank_job jobs[4];
            memset(out, 0xFF, sizeof(float) * T_ALL * H);
            assert_int_equal(run_world(&L, &plan, N, out, jobs), 0);
            int64_t rows = 0, sent = 0;
            for (int r = 0; r < N; r++) {
                rows += jobs[r].stats.rows_received;
                for (int d = 0; d < N; d++) sent += jobs[r].stats.rows_sent[d];
                /* bytes on the links: every routed copy sent to another rank, as fp32 rows, there and back */
            }
            assert_int_equal(rows, T_ALL * K);
            assert_int_equal(sent, T_ALL * K);
            if (N == 4) bytes_fmt[p] = jobs[0].stats.bytes_dispatch;
            printf("  %-22s %d ranks: bits equal to one rank; rows per rank", names[p], N);
            for (int r = 0; r < N; r++) printf(" %lld", (long long)jobs[r].stats.rows_received);
            printf("\n");
            assert_memory_equal(out, ref, sizeof(float) * T_ALL * H);
        }
    }
    /* the blocks carry the dispatch format: FP4 rows are about half of e4m3 ones (ids, counts and padding aside) */
    printf("  dispatch bytes rank 0 sent at 4 ranks: fp32 rows %llu, e4m3 %llu, MXFP4 %llu, NVFP4 %llu\n",
           (unsigned long long)bytes_fmt[0], (unsigned long long)bytes_fmt[2], (unsigned long long)bytes_fmt[3],
           (unsigned long long)bytes_fmt[4]);
    assert_true(bytes_fmt[3] * 10 < bytes_fmt[2] * 6 && bytes_fmt[2] * 10 < bytes_fmt[0] * 4);
    L.x = x32;
    free(x16);
    free(ref), free(out);
    free_layer(&L);
}

/* 8 experts over 3 ranks: every rank refuses; then one rank passes more tokens than planned: it fails with its own
 * message and the others fail at the exchange, and no thread hangs */
static void bad_splits_fail_everywhere(void **s) {
    (void)s;
    layer L;
    make_layer(&L);
    fm_plan plan;
    fm_plan_from_preset(FM_PRESET_REF, &plan);
    float *out = malloc(sizeof(float) * T_ALL * H);
    rank_job jobs[3];
    assert_int_equal(run_world(&L, &plan, 3, out, jobs), 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(jobs[r].st, FM_ERR_USAGE);
        assert_non_null(strstr(jobs[r].msg, "do not split over 3 ranks"));
    }
    g_extra_tokens = 1; /* rank 1 takes one token more than the blocks hold */
    assert_int_equal(run_world(&L, &plan, 2, out, jobs), 2);
    g_extra_tokens = 0;
    assert_non_null(strstr(jobs[1].msg, "19 tokens on rank 1, more than the 18 the blocks hold"));
    assert_non_null(strstr(jobs[0].msg, "collective mismatch"));
    free(out);
    free_layer(&L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ep_equals_single_rank),
        cmocka_unit_test(bad_splits_fail_everywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
