/* The prefix cache of the paged KV cache (src/engine/kv_prefix.c), on the pool alone:
 *   - a named prompt is mapped whole blocks at a time by a later sequence, from a running one or a finished one
 *     (refcounted, read-only), and only as far as its tokens match;
 *   - a block whose stored ids differ is never matched, whatever its hash says;
 *   - two sequences that fill identical blocks: the second copy stays private and its chain goes on from the first;
 *   - eviction takes the least recently released cached block, a chain from its end;
 *   - a random sequence of opens, shares, appends with writes, names, truncations (some after a private copy of the
 *     named block they fall in, as fm_kv_seq_cut does) and closes over a small vocabulary
 *     (so that prefixes repeat and eviction runs), checked after every operation: fm_kv_pool_check (references,
 *     free stack, LRU list and hash table agree), a written slot is never in a shared or named block, and every
 *     mapped block holds exactly the tokens of the prompt that mapped it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "engine/kv_prefix.h"

enum { BT = 4 }; /* small blocks: many boundaries in short prompts */

static void check(const fm_kv_pool *p) {
    char msg[256];
    if (!fm_kv_pool_check(p, msg, sizeof msg)) fail_msg("invariant: %s", msg);
}

static fm_kv_pool pool(int32_t max_seqs, int64_t ctx, int64_t n_blocks) {
    fm_kv_pool p;
    fm_error err;
    if (fm_kv_pool_init(&p, max_seqs, ctx, BT, n_blocks, &err)) fail_msg("%s", err.msg);
    p.prefix_cache = true;
    return p;
}

/* a sequence holding ids[0..n), computed and named */
static int32_t filled(fm_kv_pool *p, const int32_t *ids, int64_t n) {
    int32_t s;
    fm_error err;
    if (fm_kv_seq_open(p, &s, &err) || fm_kv_seq_append(p, s, n, &err)) fail_msg("%s", err.msg);
    fm_kv_prefix_name(p, s, ids, n);
    check(p);
    return s;
}

static int32_t shared(fm_kv_pool *p, const int32_t *ids, int64_t n, int64_t expect) {
    int32_t s;
    fm_error err;
    if (fm_kv_seq_open(p, &s, &err)) fail_msg("%s", err.msg);
    assert_int_equal(fm_kv_prefix_share(p, s, ids, n), expect);
    assert_int_equal(fm_kv_seq_tokens(p, s), expect);
    check(p);
    return s;
}

static int32_t block(const fm_kv_pool *p, int32_t s, int32_t i) { return p->tables[(int64_t)s * p->max_blocks + i]; }

static void test_share(void **state) {
    (void)state;
    fm_kv_pool p = pool(4, 32, 0);
    const int32_t ids[11] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int32_t a = filled(&p, ids, 11); /* 2 full blocks named, the third being filled */
    assert_int_equal(p.n_named[a], 2);
    const int32_t b = shared(&p, ids, 10, 8); /* from a running sequence: whole blocks only */
    assert_int_equal(block(&p, b, 0), block(&p, a, 0));
    assert_int_equal(block(&p, b, 1), block(&p, a, 1));
    assert_int_equal(p.ref[block(&p, a, 0)], 2);
    fm_error err;
    assert_int_equal(fm_kv_seq_append(&p, b, 2, &err), FM_OK); /* its own writes: a fresh block */
    assert_true(block(&p, b, 2) != block(&p, a, 2));
    check(&p);
    int32_t other[8];
    memcpy(other, ids, sizeof other);
    other[5] = 99;                                                        /* differs in the second block */
    const int32_t c = shared(&p, other, 8, 4), d = shared(&p, ids, 3, 0); /* fewer ids than a block */
    fm_kv_seq_close(&p, a), fm_kv_seq_close(&p, b), fm_kv_seq_close(&p, c), fm_kv_seq_close(&p, d);
    check(&p);
    assert_int_equal(p.n_lru, 2); /* the two named blocks stay cached, the rest is empty */
    assert_int_equal(p.n_free, p.n_blocks);
    const int32_t e = shared(&p, ids, 11, 8); /* from the cache after everyone ended */
    const int32_t first = block(&p, e, 0);
    fm_kv_seq_close(&p, e);
    /* a stored id that differs (what a hash collision would look like) is never matched */
    p.tokens[(int64_t)first * BT + 1] ^= 1;
    int32_t f;
    assert_int_equal(fm_kv_seq_open(&p, &f, &err), FM_OK);
    assert_int_equal(fm_kv_prefix_share(&p, f, ids, 11), 0);
    fm_kv_seq_close(&p, f);
    p.tokens[(int64_t)first * BT + 1] ^= 1;
    check(&p);
    fm_kv_pool_free(&p);
}

static void test_twins(void **state) {
    (void)state;
    fm_kv_pool p = pool(4, 32, 0);
    const int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    const int32_t a = filled(&p, x, 4);
    const int32_t b = filled(&p, y, 8); /* its first block is a's twin: private, in no table */
    assert_false(p.in_table[block(&p, b, 0)]);
    assert_true(p.in_table[block(&p, b, 1)]);
    fm_kv_seq_close(&p, a), fm_kv_seq_close(&p, b);
    check(&p);
    const int32_t c = shared(&p, y, 8, 8); /* a's first block, then b's second */
    assert_true(p.in_table[block(&p, c, 0)] && p.in_table[block(&p, c, 1)]);
    fm_kv_seq_close(&p, c);
    fm_kv_pool_free(&p);
}

static void test_lru(void **state) {
    (void)state;
    fm_kv_pool p = pool(2, 16, 4); /* 4 blocks of 4 tokens */
    const int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {9, 9, 9, 9, 8, 8, 8, 8};
    const int32_t a = filled(&p, x, 8);
    const int32_t x0 = block(&p, a, 0), x1 = block(&p, a, 1);
    fm_kv_seq_close(&p, a);
    assert_int_equal(p.lru_head, x1);   /* a chain is released from its end: the end goes first */
    const int32_t b = filled(&p, y, 8); /* two empty blocks */
    fm_kv_seq_close(&p, b);
    fm_error err;
    int32_t c;
    assert_int_equal(fm_kv_seq_open(&p, &c, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&p, c, 4, &err), FM_OK); /* evicts x's second block */
    assert_int_equal(block(&p, c, 0), x1);
    assert_int_equal(p.evictions, 1);
    check(&p);
    fm_kv_seq_close(&p, c);
    const int32_t d = shared(&p, x, 8, 4); /* x's first block is still cached */
    assert_int_equal(block(&p, d, 0), x0);
    fm_kv_seq_close(&p, d);
    fm_kv_pool_free(&p);
}

/* the random operations; content[slot] is what was written into each slot of the cache (-1: nothing) */
enum { SEQS = 5, CTX = 40, BLOCKS = 24, VOCAB = 3 };

typedef struct sim {
    fm_kv_pool p;
    int32_t content[BLOCKS * BT];
    int32_t ids[SEQS][CTX]; /* each sequence's tokens */
    int64_t written[SEQS];  /* tokens whose K and V are written */
    uint64_t r;
} sim;

static uint32_t rnd(sim *m, uint32_t n) {
    m->r ^= m->r << 13, m->r ^= m->r >> 7, m->r ^= m->r << 17;
    return (uint32_t)((m->r >> 11) % n);
}

/* the K and V of the sequence's tokens up to n: only into blocks that it alone holds and that are not named */
static void write_to(sim *m, int32_t s, int64_t n) {
    const fm_kv_pool *p = &m->p;
    for (int64_t t = m->written[s]; t < n; t++) {
        const int32_t b = block(p, s, (int32_t)(t / BT));
        assert_int_equal(p->ref[b], 1);
        assert_false(p->in_table[b]);
        assert_false(fm_kv_prefix_named(p, s, (int32_t)(t / BT)));
        m->content[b * BT + t % BT] = m->ids[s][t];
    }
    m->written[s] = n;
}

/* every slot a sequence can read holds its own token */
static void check_content(const sim *m) {
    const fm_kv_pool *p = &m->p;
    for (int32_t s = 0; s < SEQS; s++)
        for (int64_t t = 0; t < m->written[s]; t++)
            assert_int_equal(m->content[block(p, s, (int32_t)(t / BT)) * BT + t % BT], m->ids[s][t]);
}

static void test_random_ops(void **state) {
    (void)state;
    sim *m = calloc(1, sizeof *m);
    m->p = pool(SEQS, CTX, BLOCKS);
    m->r = 0x2545f4914f6cdd1dull;
    for (int32_t i = 0; i < BLOCKS * BT; i++) m->content[i] = -1;
    fm_kv_pool *p = &m->p;
    fm_error err;
    int64_t hits = 0, forks = 0;
    for (int it = 0; it < 20000; it++) {
        const int32_t s = (int32_t)rnd(m, SEQS);
        const bool open = p->n_tokens[s] >= 0;
        const uint32_t op = rnd(m, 10);
        if (!open && op < 4) { /* a new prompt, maybe a cached prefix */
            int32_t got;
            assert_int_equal(fm_kv_seq_open(p, &got, &err), FM_OK);
            const int64_t n = 1 + rnd(m, CTX - 1);
            for (int64_t t = 0; t < n; t++) m->ids[got][t] = (int32_t)rnd(m, VOCAB);
            const int64_t k = fm_kv_prefix_share(p, got, m->ids[got], n - 1);
            assert_true(k % BT == 0 && k <= n - 1);
            hits += k > 0;
            m->written[got] = k;
            check_content(m); /* the mapped blocks hold exactly the prompt's tokens */
            if (fm_kv_seq_append(p, got, n - k, &err) == FM_OK) write_to(m, got, n);
            else fm_kv_seq_close(p, got), m->written[got] = 0;
            if (p->n_tokens[got] >= 0) fm_kv_prefix_name(p, got, m->ids[got], m->written[got]);
        } else if (open && op < 2) {
            fm_kv_seq_close(p, s);
            m->written[s] = 0;
        } else if (open && op < 7) { /* decode steps: new tokens written, then named */
            const int64_t have = fm_kv_seq_tokens(p, s), n = rnd(m, 6);
            if (have + n <= CTX && fm_kv_seq_append(p, s, n, &err) == FM_OK) {
                for (int64_t t = have; t < have + n; t++) m->ids[s][t] = (int32_t)rnd(m, VOCAB);
                write_to(m, s, have + n);
                fm_kv_prefix_name(p, s, m->ids[s], have + n);
            }
        } else if (open && op < 9) { /* a kept cache cut back; inside a named block, maybe a private copy first */
            const int64_t want = rnd(m, (uint32_t)fm_kv_seq_tokens(p, s) + 1);
            const int32_t i = (int32_t)(want / BT);
            bool forked = false;
            if (want % BT && want < fm_kv_seq_tokens(p, s) && fm_kv_prefix_named(p, s, i) && rnd(m, 2)) {
                fm_kv_seq_truncate(p, s, ((int64_t)i + 1) * BT); /* block i last, as fm_kv_seq_cut does */
                if (m->written[s] > ((int64_t)i + 1) * BT) m->written[s] = ((int64_t)i + 1) * BT;
                check(p);
                const int32_t from = fm_kv_seq_fork_block(p, s, i);
                if ((forked = from >= 0)) /* what fm_kv_seq_cut's device copy does */
                    memcpy(&m->content[block(p, s, i) * BT], &m->content[from * BT], BT * sizeof *m->content);
                check(p);
            }
            const int64_t kept = fm_kv_seq_truncate(p, s, want);
            assert_true(kept <= want && kept > want - BT);
            if (forked) assert_int_equal(kept, want), forks++;
            if (m->written[s] > kept) m->written[s] = kept;
        }
        check(p);
        check_content(m);
    }
    assert_true(hits > 100);
    assert_true(p->evictions > 100);
    assert_true(forks > 10);
    for (int32_t s = 0; s < SEQS; s++) fm_kv_seq_close(p, s);
    check(p);
    assert_int_equal(p->n_free, p->n_blocks);
    fm_kv_pool_free(p);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_twins),
        cmocka_unit_test(test_lru),
        cmocka_unit_test(test_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
