/* The decode attention block in one persistent launch (route attn.persistent, attn_decode_block.cu) against the chain
 * of ops it replaces on the same GPU, bit for bit: linear(qkv) -> qk_norm_rope_store -> attention_paged ->
 * linear(o) -> add_rmsnorm, one token over a paged bf16 cache whose blocks are scattered through the pool. Compared:
 * the q|k|v row after RoPE, both whole caches (the token's k and v stored at its slot, nothing else touched), the
 * attention's output, the o projection, the residual and the normed row (the op's output buffer is its input, as the
 * engine calls it). Shapes: Qwen3-30B-A3B's (H 2048, 32 query heads, 4 kv heads of 128) at context 2048 (many
 * splits), Mixtral's attention (H 4096, 32 / 8 heads, no q/k norm), small odd ones (H 384 and 512; 8 / 2 and 16 / 16
 * heads), one split (the attention's output written by the split phase itself, no combine), a context of 6 keys in
 * one split of many; each block call made twice on fresh inputs (the grid barrier reused). Where the route is off
 * or does not apply (another cache format), the op declines and runs nothing. Runs only where a GPU is present. */
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

static uint64_t rng = 0x2545F4914F6CDD1Dull;
#define BT 16 /* keys a cache block */

typedef struct block_case {
    int64_t H;
    int32_t nh, nkv, hd;
    bool qk_norm;
    int32_t pos;     /* the token's position: it attends to pos + 1 keys */
    int64_t max_len; /* the planned context (picks the splits) */
} block_case;

/* the host inputs of a case */
typedef struct block_in {
    float *wqkv, *wo, *qn, *kn, *fn, *h, *x, *kc, *vc;
    int32_t *table, slot, max_blocks, n_slots;
} block_in;

static block_in make_in(const block_case *c) {
    block_in b;
    const int64_t nq = (int64_t)(c->nh + 2 * c->nkv) * c->hd, na = (int64_t)c->nh * c->hd;
    b.max_blocks = (int32_t)((c->max_len + BT - 1) / BT);
    b.n_slots = b.max_blocks * BT + 3 * BT; /* blocks the sequence does not own stay untouched */
    b.wqkv = gpu_rand_array(&rng, nq * c->H, 0.05f), b.wo = gpu_rand_array(&rng, c->H * na, 0.03f);
    b.qn = gpu_rand_array(&rng, c->hd, 1.0f), b.kn = gpu_rand_array(&rng, c->hd, 1.0f),
    b.fn = gpu_rand_array(&rng, c->H, 1.0f);
    b.h = gpu_rand_array(&rng, c->H, 1.0f), b.x = gpu_rand_array(&rng, c->H, 2.0f);
    b.kc = gpu_rand_array(&rng, (int64_t)b.n_slots * c->nkv * c->hd, 1.0f);
    b.vc = gpu_rand_array(&rng, (int64_t)b.n_slots * c->nkv * c->hd, 1.0f);
    b.table = malloc((size_t)b.max_blocks * sizeof *b.table);
    const int32_t pool = b.n_slots / BT;
    for (int32_t i = 0; i < b.max_blocks; i++) b.table[i] = (7 * i + 3) % pool; /* scattered, distinct (7, pool) */
    b.slot = b.table[c->pos / BT] * BT + c->pos % BT;
    return b;
}

static void free_in(block_in *b) {
    free(b->wqkv), free(b->wo), free(b->qn), free(b->kn), free(b->fn), free(b->h), free(b->x), free(b->kc);
    free(b->vc), free(b->table);
}

enum { OUT_QKV, OUT_K, OUT_V, OUT_ATT, OUT_Y, OUT_X, OUT_H, N_OUT };
static const char *out_names[N_OUT] = {"q|k|v after RoPE", "k cache",  "v cache",   "attention",
                                       "o projection",     "residual", "normed row"};

/* Runs the case on be, by the block op (block) or the chain; out[i] the outputs, fetched (caller frees). Returns
 * whether the block op took the call (false: nothing ran). */
static bool run_case(fm_backend *be, const block_case *c, const block_in *b, bool block, int calls, float *out[N_OUT]) {
    const fm_backend_ops *ops = be->ops;
    const int64_t nq = (int64_t)(c->nh + 2 * c->nkv) * c->hd, na = (int64_t)c->nh * c->hd;
    const int64_t kvn = (int64_t)b->n_slots * c->nkv * c->hd;
    fm_bank *wq = gpu_bank(be, b->wqkv, 1, nq, c->H, be->plan.w_dense, false),
            *wo = gpu_bank(be, b->wo, 1, c->H, na, be->plan.w_dense, false),
            *qn = c->qk_norm ? gpu_bank(be, b->qn, 1, 1, c->hd, be->plan.w_other, false) : NULL,
            *kn = c->qk_norm ? gpu_bank(be, b->kn, 1, 1, c->hd, be->plan.w_other, false) : NULL,
            *fn = gpu_bank(be, b->fn, 1, 1, c->H, be->plan.w_other, false);
    const int32_t seq = 0, pos = c->pos;
    int32_t *d_seq = gpu_upload_i32(be, &seq, 1), *d_pos = gpu_upload_i32(be, &pos, 1),
            *d_slot = gpu_upload_i32(be, &b->slot, 1), *d_table = gpu_upload_i32(be, b->table, b->max_blocks);
    void *scratch = gpu_zeroed(be, fm_attention_paged_scratch_bytes(1, c->nh, c->hd, c->max_len));
    void *kc = ops->alloc(be, (size_t)kvn * ops->act_size), *vc = ops->alloc(be, (size_t)kvn * ops->act_size);
    void *qkv_base, *att_base, *y_base, *x_base, *h_base;
    void *qkv = gpu_guarded(be, nq, &qkv_base), *att = gpu_guarded(be, na, &att_base),
         *y = gpu_guarded(be, c->H, &y_base), *x = gpu_guarded(be, c->H, &x_base), *h = gpu_guarded(be, c->H, &h_base);
    bool took = true;
    for (int i = 0; i < calls && took; i++) {
        ops->upload_f32(be, b->kc, kvn, kc), ops->upload_f32(be, b->vc, kvn, vc);
        ops->upload_f32(be, b->x, c->H, x), ops->upload_f32(be, b->h, c->H, h);
        if (block) {
            took = ops->attention_block(be, wq, wo, h, be->plan.a_dense, c->nh, c->nkv, c->hd, qn, kn, 1e-6f, d_pos,
                                        1e6, d_slot, kc, vc, FM_KV_ACT, d_seq, d_table, b->max_blocks, BT, c->max_len,
                                        scratch, qkv, att, y, x, fn, 1e-6f, h);
        } else {
            ops->linear(be, wq, 0, h, 1, be->plan.a_dense, qkv);
            ops->qk_norm_rope_store(be, qkv, 1, c->nh, c->nkv, c->hd, qn, kn, 1e-6f, d_pos, 1e6, d_slot, kc, vc,
                                    FM_KV_ACT);
            ops->attention_paged(be, qkv, 1, c->nh, c->nkv, c->hd, kc, vc, FM_KV_ACT, d_seq, d_pos, d_table,
                                 b->max_blocks, BT, c->max_len, scratch, att);
            ops->linear(be, wo, 0, att, 1, be->plan.a_dense, y);
            ops->add_rmsnorm(be, x, y, fn, 1, c->H, 1e-6f, h);
        }
    }
    if (took) {
        out[OUT_QKV] = gpu_fetch(be, qkv_base, nq, "qkv");
        out[OUT_ATT] = gpu_fetch(be, att_base, na, "attention");
        out[OUT_Y] = gpu_fetch(be, y_base, c->H, "o projection");
        out[OUT_X] = gpu_fetch(be, x_base, c->H, "residual");
        out[OUT_H] = gpu_fetch(be, h_base, c->H, "normed row");
        out[OUT_K] = malloc((size_t)kvn * sizeof(float)), out[OUT_V] = malloc((size_t)kvn * sizeof(float));
        ops->download_f32(be, kc, kvn, out[OUT_K]), ops->download_f32(be, vc, kvn, out[OUT_V]);
    } else {
        ops->free(be, qkv_base), ops->free(be, att_base), ops->free(be, y_base), ops->free(be, x_base);
        ops->free(be, h_base);
    }
    ops->free(be, kc), ops->free(be, vc);
    if (scratch) ops->free(be, scratch);
    ops->free(be, d_seq), ops->free(be, d_pos), ops->free(be, d_slot), ops->free(be, d_table);
    ops->bank_free(be, wq), ops->bank_free(be, wo), ops->bank_free(be, fn);
    if (qn) ops->bank_free(be, qn), ops->bank_free(be, kn);
    return took;
}

static void block_case_run(const block_case *c) {
    /* the block's attention phase is the split kernel's arithmetic: the chain runs that kernel too (paged.swap=off;
       the swapped kernel, the default from sm_90, may differ in the last bits at 4 query heads a kv head) */
    fm_backend *on = gpu_fp8_with("attn.persistent=on,paged.swap=off"),
               *off = gpu_fp8_with("attn.persistent=off,paged.swap=off");
    assert_non_null(on->ops->attention_block);
    block_in b = make_in(c);
    float *f[N_OUT], *ch[N_OUT];
    assert_true(run_case(on, c, &b, true, 2, f));
    assert_true(run_case(off, c, &b, false, 1, ch));
    char what[200];
    snprintf(what, sizeof what, "attention block H=%lld nh=%d nkv=%d hd=%d%s pos=%d max_len=%lld", (long long)c->H,
             c->nh, c->nkv, c->hd, c->qk_norm ? "" : " (no q/k norm)", c->pos, (long long)c->max_len);
    const int64_t kvn = (int64_t)b.n_slots * c->nkv * c->hd;
    const int64_t n[N_OUT] = {
        (int64_t)(c->nh + 2 * c->nkv) * c->hd, kvn, kvn, (int64_t)c->nh * c->hd, c->H, c->H, c->H};
    for (int o = 0; o < N_OUT; o++) {
        gpu_expect_same_bits(f[o], ch[o], n[o], what, out_names[o]);
        free(f[o]), free(ch[o]);
    }
    printf("  %-80s = the chain, bit for bit\n", what);
    /* the route off: the op declines and runs nothing */
    float *none[N_OUT];
    assert_false(run_case(off, c, &b, true, 1, none));
    free_in(&b);
    on->ops->destroy(on), off->ops->destroy(off);
}

static void test_attn_block(void **s) {
    (void)s;
    const block_case cases[] = {
        {2048, 32, 4, 128, true, 2047, 4096},                                    /* Qwen3-30B-A3B at context 2048 */
        {4096, 32, 8, 128, false, 1500, 2048},                                   /* Mixtral's attention */
        {512, 8, 2, 128, true, 100, 256},      {384, 16, 16, 128, true, 40, 64}, /* one split: no combine */
        {512, 8, 2, 128, true, 5, 4096},                                         /* 6 keys: one split of many */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) block_case_run(&cases[i]);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attn_block)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
