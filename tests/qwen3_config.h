/* Qwen/Qwen3-30B-A3B's configuration (the config.json fields fp8moe reads), for the tests that plan its memory and
 * routes by hand without its 61 GB of weights. */
#ifndef FM_TESTS_QWEN3_CONFIG_H
#define FM_TESTS_QWEN3_CONFIG_H

#include "io/config.h"

/* Parses the configuration into cfg; a failure fails the test (cmocka). */
void qwen3_30b_config(fm_config *cfg);

#endif
