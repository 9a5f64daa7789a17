/* A simulated world of ranks on threads (sim_world.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>

#include "sim_world.h"

typedef struct rank_thread {
    fm_comm *c;
    fm_status (*fn)(fm_comm *c, void *job);
    void *job;
    fm_status st;
} rank_thread;

static void *run(void *arg) {
    rank_thread *t = arg;
    t->st = t->fn(t->c, t->job);
    return NULL;
}

int sim_world_run(int n_ranks, fm_status (*fn)(fm_comm *c, void *job), void *jobs, size_t job_size) {
    fm_world *w = NULL;
    fm_error err = {{0}};
    if (fm_world_create_sim(n_ranks, &w, &err) != FM_OK) fail_msg("simulated world of %d ranks: %s", n_ranks, err.msg);
    pthread_t th[FM_COMM_MAX_RANKS];
    rank_thread t[FM_COMM_MAX_RANKS];
    for (int r = 0; r < n_ranks; r++) {
        t[r] = (rank_thread){fm_world_comm(w, r), fn, (char *)jobs + (size_t)r * job_size, FM_OK};
        assert_int_equal(pthread_create(&th[r], NULL, run, &t[r]), 0);
    }
    int failed = 0;
    for (int r = 0; r < n_ranks; r++) pthread_join(th[r], NULL), failed += t[r].st != FM_OK;
    fm_world_free(w);
    return failed;
}
