/* The paged KV cache's bookkeeping (src/engine/kv_cache.c): block boundaries, reuse of freed blocks, a full cache
 * and a sequence past its context as errors that change nothing, and a random sequence of opens, appends and closes
 * checked against a model of the token counts with the pool's invariant after every step: every block is owned by
 * exactly one sequence or is free, and a sequence of n tokens owns exactly ceil(n / block) blocks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "engine/kv_prefix.h"

static int32_t blocks_of(const fm_kv_pool *p, int32_t s) {
    int32_t n = 0;
    while (n < p->max_blocks && p->tables[(int64_t)s * p->max_blocks + n] >= 0) n++;
    return n;
}

static void check_invariant(const fm_kv_pool *p) {
    int32_t *owner = malloc((size_t)p->n_blocks * sizeof *owner);
    assert_non_null(owner);
    for (int32_t b = 0; b < p->n_blocks; b++) owner[b] = -2;
    assert_int_equal(p->n_free, p->n_empty); /* the prefix cache is off here: no block stays cached */
    for (int32_t i = 0; i < p->n_empty; i++) {
        const int32_t b = p->free_stack[i];
        assert_true(b >= 0 && b < p->n_blocks);
        assert_int_equal(owner[b], -2);
        owner[b] = -1;
    }
    for (int32_t s = 0; s < p->max_seqs; s++) {
        const int64_t n = p->n_tokens[s];
        const int32_t nb = blocks_of(p, s);
        assert_int_equal(nb, n < 0 ? 0 : (n + p->block_tokens - 1) / p->block_tokens);
        for (int32_t j = nb; j < p->max_blocks; j++) assert_int_equal(p->tables[(int64_t)s * p->max_blocks + j], -1);
        for (int32_t j = 0; j < nb; j++) {
            const int32_t b = p->tables[(int64_t)s * p->max_blocks + j];
            assert_true(b >= 0 && b < p->n_blocks);
            assert_int_equal(owner[b], -2);
            owner[b] = s;
        }
    }
    for (int32_t b = 0; b < p->n_blocks; b++) assert_int_not_equal(owner[b], -2);
    free(owner);
    char msg[256];
    if (!fm_kv_pool_check(p, msg, sizeof msg)) fail_msg("%s", msg);
}

static void test_block_bytes(void **state) {
    (void)state; /* Qwen3-30B-A3B: 48 layers, 4 KV heads of 128, bf16: 16 KiB for K (or V) of a layer, 1.5 MiB */
    assert_int_equal(fm_kv_block_bytes(48, 4 * 128 * 2, 16), 1572864);
    /* an e4m3 row: 512 codes, 4 fp32 scales (backend.h fm_kv_e4m3_row_bytes) */
    assert_int_equal(fm_kv_block_bytes(48, 528, 16), 811008);
}

static void test_boundaries(void **state) {
    (void)state;
    fm_kv_pool p;
    fm_error err;
    assert_int_equal(fm_kv_pool_init(&p, 2, 40, 16, 0, &err), FM_OK);
    assert_int_equal(p.max_blocks, 3);
    assert_int_equal(p.n_blocks, 6);
    int32_t s;
    assert_int_equal(fm_kv_seq_open(&p, &s, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&p, s, 16, &err), FM_OK); /* exactly one block */
    assert_int_equal(blocks_of(&p, s), 1);
    assert_int_equal(fm_kv_seq_append(&p, s, 0, &err), FM_OK);
    assert_int_equal(blocks_of(&p, s), 1);
    assert_int_equal(fm_kv_seq_append(&p, s, 1, &err), FM_OK); /* token 17 opens the second */
    assert_int_equal(blocks_of(&p, s), 2);
    assert_int_equal(fm_kv_seq_append(&p, s, 15, &err), FM_OK); /* 32: still two */
    assert_int_equal(blocks_of(&p, s), 2);
    assert_int_equal(fm_kv_block_of(&p, s, 31), p.tables[1]);
    assert_int_equal(fm_kv_seq_append(&p, s, 8, &err), FM_OK);        /* 40 = ctx */
    assert_int_equal(fm_kv_seq_append(&p, s, 1, &err), FM_ERR_USAGE); /* past ctx: refused, unchanged */
    assert_non_null(strstr(err.msg, "--ctx"));
    assert_int_equal(fm_kv_seq_tokens(&p, s), 40);
    check_invariant(&p);
    fm_kv_pool_free(&p);
}

static void test_reuse_and_full(void **state) {
    (void)state;
    fm_kv_pool p;
    fm_error err;
    assert_int_equal(fm_kv_pool_init(&p, 3, 64, 16, 5, &err), FM_OK); /* overcommitted: 5 blocks for 3 x 4 */
    int32_t a, b, c;
    assert_int_equal(fm_kv_seq_open(&p, &a, &err), FM_OK);
    assert_int_equal(fm_kv_seq_open(&p, &b, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&p, a, 48, &err), FM_OK); /* 3 blocks */
    assert_int_equal(fm_kv_seq_append(&p, b, 17, &err), FM_OK); /* 2 blocks: the pool is empty */
    assert_int_equal(p.n_free, 0);
    assert_int_equal(fm_kv_seq_append(&p, b, 16, &err), FM_ERR_NOMEM); /* full: a clear error, nothing changed */
    assert_non_null(strstr(err.msg, "KV cache full"));
    assert_int_equal(fm_kv_seq_tokens(&p, b), 17);
    assert_int_equal(fm_kv_seq_append(&p, b, 15, &err), FM_OK); /* fits in its last block */
    check_invariant(&p);
    int32_t a_blocks[3];
    memcpy(a_blocks, p.tables + (int64_t)a * p.max_blocks, sizeof a_blocks);
    fm_kv_seq_close(&p, a);
    assert_int_equal(p.n_free, 3);
    assert_int_equal(fm_kv_seq_open(&p, &c, &err), FM_OK);
    assert_int_equal(c, a);                                            /* the slot is reused */
    assert_int_equal(fm_kv_seq_append(&p, c, 64, &err), FM_ERR_NOMEM); /* 4 blocks wanted, 3 free */
    assert_int_equal(fm_kv_seq_append(&p, c, 48, &err), FM_OK);
    int found = 0; /* the freed blocks, all of them */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) found += p.tables[(int64_t)c * p.max_blocks + i] == a_blocks[j];
    assert_int_equal(found, 3);
    int32_t d, e;
    assert_int_equal(fm_kv_seq_open(&p, &d, &err), FM_OK);
    assert_int_equal(fm_kv_seq_open(&p, &e, &err), FM_ERR_NOMEM); /* three slots */
    assert_non_null(strstr(err.msg, "--max-seqs"));
    check_invariant(&p);
    fm_kv_pool_free(&p);
}

static void test_truncate(void **state) {
    (void)state;
    fm_kv_pool p;
    fm_error err;
    assert_int_equal(fm_kv_pool_init(&p, 2, 64, 16, 0, &err), FM_OK);
    int32_t s;
    assert_int_equal(fm_kv_seq_open(&p, &s, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&p, s, 50, &err), FM_OK); /* 4 blocks */
    const int32_t first = p.tables[0], second = p.tables[1];
    fm_kv_seq_truncate(&p, s, 17); /* tokens 0..16: blocks 0 and 1 stay, 2 and 3 return */
    assert_int_equal(fm_kv_seq_tokens(&p, s), 17);
    assert_int_equal(blocks_of(&p, s), 2);
    assert_int_equal(p.tables[0], first);
    assert_int_equal(p.tables[1], second);
    assert_int_equal(p.n_free, p.n_blocks - 2);
    check_invariant(&p);
    fm_kv_seq_truncate(&p, s, 17); /* not shorter: nothing */
    fm_kv_seq_truncate(&p, s, 40); /* longer: nothing */
    assert_int_equal(fm_kv_seq_tokens(&p, s), 17);
    fm_kv_seq_truncate(&p, s, 16); /* exactly one block */
    assert_int_equal(blocks_of(&p, s), 1);
    assert_int_equal(fm_kv_seq_append(&p, s, 1, &err), FM_OK); /* grows again from there */
    assert_int_equal(blocks_of(&p, s), 2);
    fm_kv_seq_truncate(&p, s, 0);
    assert_int_equal(blocks_of(&p, s), 0);
    assert_int_equal(fm_kv_seq_tokens(&p, s), 0); /* still open */
    assert_int_equal(p.n_free, p.n_blocks);
    check_invariant(&p);
    fm_kv_pool_free(&p);
}
static void test_random_ops(void **state) {
    (void)state;
    fm_kv_pool p;
    fm_error err;
    assert_int_equal(fm_kv_pool_init(&p, 8, 100, 16, 30, &err), FM_OK);
    int64_t model[8];
    uint64_t r = 12345;
    for (int s = 0; s < 8; s++) model[s] = -1;
    for (int it = 0; it < 5000; it++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const int op = (int)(r % 10), s = (int)((r >> 8) % 8);
        if (op == 0 && model[s] >= 0) {
            fm_kv_seq_close(&p, s);
            model[s] = -1;
        } else if (op == 1) {
            int32_t got;
            if (fm_kv_seq_open(&p, &got, &err) == FM_OK) {
                assert_int_equal(model[got], -1);
                model[got] = 0;
            } else {
                for (int q = 0; q < 8; q++) assert_true(model[q] >= 0);
            }
        } else if (model[s] >= 0) {
            const int64_t n = (int64_t)((r >> 16) % 20);
            const fm_status st = fm_kv_seq_append(&p, s, n, &err);
            if (st == FM_OK) model[s] += n;
            else assert_true(st == FM_ERR_NOMEM || (st == FM_ERR_USAGE && model[s] + n > 100));
        }
        for (int q = 0; q < 8; q++) assert_int_equal(fm_kv_seq_tokens(&p, q), model[q]);
        check_invariant(&p);
    }
    fm_kv_pool_free(&p);
}

static void test_bad_init(void **state) {
    (void)state;
    fm_kv_pool p;
    fm_error err;
    assert_int_equal(fm_kv_pool_init(&p, 0, 10, 16, 0, &err), FM_ERR_USAGE);
    assert_int_equal(fm_kv_pool_init(&p, 1, 0, 16, 0, &err), FM_ERR_USAGE);
    assert_int_equal(fm_kv_pool_init(&p, 1 << 20, 1 << 20, 16, 0, &err), FM_ERR_USAGE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_bytes), cmocka_unit_test(test_boundaries), cmocka_unit_test(test_reuse_and_full),
        cmocka_unit_test(test_random_ops),  cmocka_unit_test(test_bad_init),   cmocka_unit_test(test_truncate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
