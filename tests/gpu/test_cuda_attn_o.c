/* Paged attention and the o projection as one op (route dense.quant=producer: attention_paged_o, the o projection's
 * e4m3 rows written by the kernel that merges the attention's splits) against the chain it replaces on the same GPU,
 * bit for bit: attention_paged, then linear(o) or linear_add_rmsnorm(o). T rows, each a sequence of its own over a
 * paged bf16 cache whose blocks are scattered through the pool, at positions that differ row to row. Compared: the
 * attention's output, the o projection and, with the norm, the residual and the normed rows. Shapes: Qwen3-30B-A3B's (H
 * 2048, 32 query heads, 4 kv heads of 128) at 1, 3 and 16 rows (the GEMV, its add + RMSNorm tail in its last CTA) and
 * 40 rows (the GEMM, the norm a launch of its own), Mixtral's (H 4096, 32 / 8 heads), heads of 64 (two heads a
 * 128-group: the rows quantized by the quantizer's launch), one split (no merge kernel: the launch again); each op call
 * made twice (the tail's counter reused). Where the route is off or the step holds prompt runs, the op declines and
 * runs nothing. Runs only where a GPU is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/attention_paged.h"
#include "backend/backend.h"
#include "gpu_test_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
#define BT 16 /* keys a cache block */

typedef struct o_case {
    int64_t H;
    int32_t nh, nkv, hd, T;
    int32_t pos0;    /* row t's position: pos0 - 37 t (at least 0): it attends to that many keys + 1 */
    int64_t max_len; /* the planned context (picks the splits) */
    bool norm;       /* linear_add_rmsnorm after the attention, else linear */
} o_case;

typedef struct o_in {
    float *qkv, *wo, *fn, *x, *kc, *vc;
    int32_t *table, *pos, *seq, max_blocks, n_slots;
} o_in;

static o_in make_in(const o_case *c) {
    o_in b;
    const int64_t nq = (int64_t)(c->nh + 2 * c->nkv) * c->hd, na = (int64_t)c->nh * c->hd;
    b.max_blocks = (int32_t)((c->max_len + BT - 1) / BT);
    b.n_slots = (c->T * b.max_blocks + 3) * BT; /* blocks no sequence owns stay untouched */
    b.qkv = gpu_rand_array(&rng, c->T * nq, 1.0f), b.wo = gpu_rand_array(&rng, c->H * na, 0.03f),
    b.fn = gpu_rand_array(&rng, c->H, 1.0f);
    b.x = gpu_rand_array(&rng, c->T * c->H, 2.0f);
    b.kc = gpu_rand_array(&rng, (int64_t)b.n_slots * c->nkv * c->hd, 1.0f);
    b.vc = gpu_rand_array(&rng, (int64_t)b.n_slots * c->nkv * c->hd, 1.0f);
    const int32_t pool = b.n_slots / BT, n = c->T * b.max_blocks;
    int32_t step = 7; /* a step prime to the pool's size: distinct blocks, scattered */
    while (pool % step == 0) step += 2;
    b.table = malloc((size_t)n * sizeof *b.table);
    for (int32_t i = 0; i < n; i++) b.table[i] = (int32_t)((step * (int64_t)i + 3) % pool);
    b.pos = malloc((size_t)c->T * sizeof *b.pos), b.seq = malloc((size_t)c->T * sizeof *b.seq);
    for (int32_t t = 0; t < c->T; t++) b.seq[t] = t, b.pos[t] = c->pos0 - 37 * t > 0 ? c->pos0 - 37 * t : 0;
    return b;
}

static void free_in(o_in *b) {
    free(b->qkv), free(b->wo), free(b->fn), free(b->x), free(b->kc), free(b->vc), free(b->table), free(b->pos);
    free(b->seq);
}

enum { OUT_ATT, OUT_Y, OUT_X, OUT_H, N_OUT };
static const char *out_names[N_OUT] = {"attention", "o projection", "residual", "normed rows"};

/* Runs the case on be, by the op (fused) or the chain; out[i] the outputs, fetched (caller frees; the residual and
 * the normed rows only with the norm). Returns whether the op took the call (false: nothing ran). */
static bool run_case(fm_backend *be, const o_case *c, const o_in *b, bool fused, bool runs, float *out[N_OUT]) {
    const fm_backend_ops *ops = be->ops;
    const int64_t nq = (int64_t)(c->nh + 2 * c->nkv) * c->hd, na = (int64_t)c->nh * c->hd, T = c->T;
    const int64_t kvn = (int64_t)b->n_slots * c->nkv * c->hd;
    fm_bank *wo = gpu_bank(be, b->wo, 1, c->H, na, be->plan.w_dense, false),
            *fn = gpu_bank(be, b->fn, 1, 1, c->H, be->plan.w_other, false);
    int32_t *d_seq = gpu_upload_i32(be, b->seq, T), *d_pos = gpu_upload_i32(be, b->pos, T),
            *d_table = gpu_upload_i32(be, b->table, T * b->max_blocks);
    void *scratch = gpu_zeroed(be, fm_attention_paged_scratch_bytes(T, c->nh, c->hd, c->max_len));
    void *kc = ops->alloc(be, (size_t)kvn * ops->act_size), *vc = ops->alloc(be, (size_t)kvn * ops->act_size);
    void *qkv = gpu_upload(be, b->qkv, T * nq);
    ops->upload_f32(be, b->kc, kvn, kc), ops->upload_f32(be, b->vc, kvn, vc);
    void *att_base, *y_base, *x_base, *h_base;
    void *att = gpu_guarded(be, T * na, &att_base), *y = gpu_guarded(be, T * c->H, &y_base),
         *x = gpu_guarded(be, T * c->H, &x_base), *h = gpu_guarded(be, T * c->H, &h_base);
    const fm_afmt af = be->plan.a_dense;
    bool took = true;
    for (int i = 0; i < 2 && took; i++) { /* twice: the GEMV tail's counter left zero by the first call */
        ops->upload_f32(be, b->x, T * c->H, x);
        if (fused)
            took = ops->attention_paged_o(be, runs, qkv, T, c->nh, c->nkv, c->hd, kc, vc, FM_KV_ACT, d_seq, d_pos,
                                          d_table, b->max_blocks, BT, c->max_len, scratch, att, wo, af, y,
                                          c->norm ? x : NULL, c->norm ? fn : NULL, 1e-6f, c->norm ? h : NULL);
        else {
            ops->attention_paged(be, qkv, T, c->nh, c->nkv, c->hd, kc, vc, FM_KV_ACT, d_seq, d_pos, d_table,
                                 b->max_blocks, BT, c->max_len, scratch, att);
            if (c->norm) ops->linear_add_rmsnorm(be, wo, att, T, af, y, x, fn, 1e-6f, h);
            else ops->linear(be, wo, 0, att, T, af, y);
        }
    }
    memset(out, 0, N_OUT * sizeof *out);
    if (took) {
        out[OUT_ATT] = gpu_fetch(be, att_base, T * na, "attention");
        out[OUT_Y] = gpu_fetch(be, y_base, T * c->H, "o projection");
        if (c->norm) {
            out[OUT_X] = gpu_fetch(be, x_base, T * c->H, "residual");
            out[OUT_H] = gpu_fetch(be, h_base, T * c->H, "normed rows");
        } else {
            ops->free(be, x_base), ops->free(be, h_base);
        }
    } else {
        ops->free(be, att_base), ops->free(be, y_base), ops->free(be, x_base), ops->free(be, h_base);
    }
    ops->free(be, kc), ops->free(be, vc), ops->free(be, qkv);
    if (scratch) ops->free(be, scratch);
    ops->free(be, d_seq), ops->free(be, d_pos), ops->free(be, d_table);
    ops->bank_free(be, wo), ops->bank_free(be, fn);
    return took;
}

static void o_case_run(const o_case *c) {
    fm_backend *on = gpu_fp8_with("dense.quant=producer"), *off = gpu_fp8_with("dense.quant=kernel");
    assert_non_null(on->ops->attention_paged_o);
    o_in b = make_in(c);
    float *f[N_OUT], *ch[N_OUT];
    assert_true(run_case(on, c, &b, true, false, f));
    assert_true(run_case(off, c, &b, false, false, ch));
    char what[200];
    snprintf(what, sizeof what, "attention + o H=%lld nh=%d nkv=%d hd=%d T=%d pos0=%d max_len=%lld%s", (long long)c->H,
             c->nh, c->nkv, c->hd, c->T, c->pos0, (long long)c->max_len, c->norm ? " + add_rmsnorm" : "");
    const int64_t n[N_OUT] = {(int64_t)c->T * c->nh * c->hd, c->T * c->H, c->T * c->H, c->T * c->H};
    for (int o = 0; o < N_OUT; o++) {
        if (!f[o]) continue;
        gpu_expect_same_bits(f[o], ch[o], n[o], what, out_names[o]);
        free(f[o]), free(ch[o]);
    }
    printf("  %-100s = the chain, bit for bit\n", what);
    /* the route off, or a step of prompt runs: the op declines and runs nothing */
    float *none[N_OUT];
    assert_false(run_case(off, c, &b, true, false, none));
    assert_false(run_case(on, c, &b, true, true, none));
    free_in(&b);
    on->ops->destroy(on), off->ops->destroy(off);
}

static void test_attention_paged_o(void **s) {
    (void)s;
    const o_case cases[] = {
        {2048, 32, 4, 128, 1, 2047, 4096, true}, /* Qwen3-30B-A3B, B = 1 at context 2048 */
        {2048, 32, 4, 128, 1, 2047, 4096, false},  {2048, 32, 4, 128, 3, 700, 2048, true},
        {2048, 32, 4, 128, 16, 1500, 2048, true}, /* the GEMV's most rows: its tail */
        {2048, 32, 4, 128, 40, 1900, 2048, true}, /* the GEMM: the norm a launch of its own */
        {2048, 32, 4, 128, 40, 1900, 2048, false}, {4096, 32, 8, 128, 2, 1500, 2048, true}, /* Mixtral's attention */
        {512, 16, 4, 64, 3, 300, 1024, true}, /* heads of 64: the quantizer's launch */
        {384, 16, 16, 128, 2, 40, 64, true},  /* one split: no merge kernel, the launch */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) o_case_run(&cases[i]);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attention_paged_o)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
