/* The logits of one prompt two ways, for tests that compare two models step by step: a prefill of all n ids, then
 * (through the paged KV cache) a fresh prefill of the first p and one decode step per remaining id, launched one by
 * one (no graph). out: [n][V] of the prefill, then [n][V] of the cached steps (rows 0..p from the fresh prefill).
 * Needs a model loaded with max_seqs >= 1 and ctx >= n; any failure fails the test (cmocka). */
#ifndef FM_TESTS_KV_STEPS_H
#define FM_TESTS_KV_STEPS_H

#include "engine/engine.h"

void kv_prefill_and_steps(fm_model *m, const int32_t *ids, int32_t n, int32_t p, float *out);

#endif
