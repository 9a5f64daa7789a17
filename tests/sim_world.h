/* Several ranks in one test: a simulated world (src/dist/comm.h) of N ranks, one thread each. */
#ifndef FM_TESTS_SIM_WORLD_H
#define FM_TESTS_SIM_WORLD_H

#include <stddef.h>

#include "dist/comm.h"

/* Runs fn(the comm of rank r, jobs + r * job_size) for r < n_ranks, each on its own thread, and waits for all;
 * returns how many returned something other than FM_OK. World creation failing fails the test (cmocka). */
int sim_world_run(int n_ranks, fm_status (*fn)(fm_comm *c, void *job), void *jobs, size_t job_size);

#endif
