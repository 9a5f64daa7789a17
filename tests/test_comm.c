/* The simulated communicator (src/dist/comm.h): each collective over 1..5 ranks, each rank a thread, against what it
 * must give computed in one thread, on host buffers and staged through each rank's backend (its raw copies); every
 * rank gets the same bits from a reduction; a mismatched call fails on every rank; the bytes a rank sends. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "quant/bf16.h"

#define N_ELEMS 1001 /* odd, not a multiple of anything */

typedef struct rank_job {
    fm_comm *c;
    int n_ranks;
    fm_status st[4];
    float red[N_ELEMS];     /* all_reduce f32 result */
    uint16_t redb[N_ELEMS]; /* all_reduce bf16 result */
    uint8_t *gathered;      /* all_gather result */
    uint8_t *a2a;           /* all_to_all result */
    uint64_t sent;
} rank_job;

static float value(int rank, int64_t i) { /* values whose sum depends on the order of the additions */
    const float scale[3] = {1e8f, 1.0f, 3e-8f};
    return scale[(rank + i) % 3] * (float)((i * 7919 + rank * 104729) % 1000 - 500) / 500.0f;
}

#define GATHER_BYTES 37
#define A2A_BLOCK 53

static void *run_rank(void *arg) {
    rank_job *j = arg;
    const int r = fm_comm_rank(j->c), n = j->n_ranks;
    fm_error err = {{0}};
    for (int64_t i = 0; i < N_ELEMS; i++) j->red[i] = value(r, i), j->redb[i] = fm_f32_to_bf16(value(r, i));
    j->st[0] = fm_comm_all_reduce_sum(j->c, j->red, N_ELEMS, FM_COMM_F32, &err);
    j->st[1] = fm_comm_all_reduce_sum(j->c, j->redb, N_ELEMS, FM_COMM_BF16, &err);
    uint8_t send[GATHER_BYTES];
    for (int i = 0; i < GATHER_BYTES; i++) send[i] = (uint8_t)(r * 31 + i);
    j->gathered = calloc((size_t)n, GATHER_BYTES);
    j->st[2] = fm_comm_all_gather(j->c, send, j->gathered, GATHER_BYTES, &err);
    uint8_t *blocks = malloc((size_t)n * A2A_BLOCK); /* block d goes to rank d */
    for (int d = 0; d < n; d++)
        for (int i = 0; i < A2A_BLOCK; i++) blocks[d * A2A_BLOCK + i] = (uint8_t)(r * 17 + d * 5 + i);
    j->a2a = calloc((size_t)n, A2A_BLOCK);
    j->st[3] = fm_comm_all_to_all(j->c, blocks, j->a2a, A2A_BLOCK, &err);
    free(blocks);
    j->sent = fm_comm_bytes_sent(j->c);
    return NULL;
}

/* staged: every rank's collectives copy through a cpu backend's raw copies (fm_comm_sim_stage_through: the form that
   runs ranks of the cuda backend), which must change nothing */
static void collectives_match(bool staged) {
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_REF, "cpu", &plan);
    for (int n = 1; n <= 5; n++) {
        fm_world *w = NULL;
        fm_error err = {{0}};
        assert_int_equal(fm_world_create_sim(n, &w, &err), FM_OK);
        rank_job *jobs = calloc((size_t)n, sizeof *jobs);
        pthread_t *th = calloc((size_t)n, sizeof *th);
        fm_backend *be[5] = {NULL};
        for (int r = 0; r < n; r++) {
            jobs[r].c = fm_world_comm(w, r), jobs[r].n_ranks = n;
            assert_string_equal(fm_comm_kind(jobs[r].c), "simulated");
            if (staged) {
                assert_int_equal(fm_backend_create("cpu", &plan, 1, NULL, &be[r], &err), FM_OK);
                fm_comm_sim_stage_through(jobs[r].c, be[r]);
            }
            assert_int_equal(fm_comm_size(jobs[r].c), n);
            assert_int_equal(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
        }
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < n; r++)
            for (int k = 0; k < 4; k++) assert_int_equal(jobs[r].st[k], FM_OK);
        for (int64_t i = 0; i < N_ELEMS; i++) {
            float want = 0.0f, wantb = 0.0f; /* rank order, fp32 */
            for (int r = 0; r < n; r++) want += value(r, i), wantb += fm_bf16_to_f32(fm_f32_to_bf16(value(r, i)));
            for (int r = 0; r < n; r++) {
                assert_memory_equal(&jobs[r].red[i], &want, sizeof want); /* the same bits on every rank */
                assert_int_equal(jobs[r].redb[i], fm_f32_to_bf16(wantb));
            }
        }
        for (int r = 0; r < n; r++) {
            for (int src = 0; src < n; src++) {
                for (int i = 0; i < GATHER_BYTES; i++)
                    assert_int_equal(jobs[r].gathered[src * GATHER_BYTES + i], (uint8_t)(src * 31 + i));
                for (int i = 0; i < A2A_BLOCK; i++) /* what rank src put in its block for rank r */
                    assert_int_equal(jobs[r].a2a[src * A2A_BLOCK + i], (uint8_t)(src * 17 + r * 5 + i));
            }
            const uint64_t want_sent = 2 * (uint64_t)(n - 1) * N_ELEMS * 4 / (uint64_t)n +
                                       2 * (uint64_t)(n - 1) * N_ELEMS * 2 / (uint64_t)n +
                                       (uint64_t)(n - 1) * (GATHER_BYTES + A2A_BLOCK);
            assert_int_equal(jobs[r].sent, want_sent);
            free(jobs[r].gathered), free(jobs[r].a2a);
        }
        free(jobs), free(th);
        fm_world_free(w);
        for (int r = 0; r < n; r++)
            if (be[r]) be[r]->ops->destroy(be[r]);
    }
}

static void collectives_match_one_thread(void **s) {
    (void)s;
    collectives_match(false);
}

static void collectives_staged_through_a_backend(void **s) {
    (void)s;
    collectives_match(true);
}

/* Rank 1 asks for a different size: every rank gets FM_ERR_USAGE, nobody hangs, and the world stays usable. */
typedef struct mismatch_job {
    fm_comm *c;
    fm_status st, after;
    char msg[sizeof(((fm_error *)0)->msg)];
} mismatch_job;

static void *run_mismatch(void *arg) {
    mismatch_job *j = arg;
    fm_error err = {{0}};
    uint8_t send[64] = {0}, recv[3 * 64];
    j->st = fm_comm_all_gather(j->c, send, recv, fm_comm_rank(j->c) == 1 ? 32 : 16, &err);
    snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    j->after = fm_comm_all_gather(j->c, send, recv, 16, &err);
    return NULL;
}

static void mismatched_call_fails_everywhere(void **s) {
    (void)s;
    fm_world *w = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_world_create_sim(3, &w, &err), FM_OK);
    mismatch_job jobs[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].c = fm_world_comm(w, r);
        assert_int_equal(pthread_create(&th[r], NULL, run_mismatch, &jobs[r]), 0);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(jobs[r].st, FM_ERR_USAGE);
        assert_non_null(strstr(jobs[r].msg, "collective mismatch"));
        assert_int_equal(jobs[r].after, FM_OK);
    }
    fm_world_free(w);
}

static void world_sizes_are_checked(void **s) {
    (void)s;
    fm_world *w = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_world_create_sim(0, &w, &err), FM_ERR_USAGE);
    assert_null(w);
    assert_int_equal(fm_world_create_sim(FM_COMM_MAX_RANKS + 1, &w, &err), FM_ERR_USAGE);
    assert_int_equal(fm_world_create_sim(2, &w, &err), FM_OK);
    assert_null(fm_world_comm(w, 2));
    assert_int_equal(fm_comm_rank(fm_world_comm(w, 1)), 1);
    fm_world_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collectives_match_one_thread),
        cmocka_unit_test(collectives_staged_through_a_backend),
        cmocka_unit_test(mismatched_call_fails_everywhere),
        cmocka_unit_test(world_sizes_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
