/* Synthetic expert banks for the moe op's tests on the cpu backend: E experts, gate|up [2I][H] (gate rows then up
 * rows, seeds 11 + e and 21 + e) and down [H][I] (seeds 31 + e), std 0.05, for each backend's own bank path. */
#ifndef FM_TESTS_MOE_FIXTURE_H
#define FM_TESTS_MOE_FIXTURE_H

#include "backend/backend.h"

#define MOE_FIXTURE_MAX_E 8

typedef struct moe_fixture {
    fm_wsrc v[3 * MOE_FIXTURE_MAX_E];
    fm_bank_src gate_up, down;
} moe_fixture;

/* E <= MOE_FIXTURE_MAX_E; f must not move afterwards (the bank sources point into it) */
void moe_fixture_init(moe_fixture *f, int32_t E, int64_t H, int64_t I);

/* The gate|up bank (b[i][0]) and the down bank (b[i][1]) in format fmt on each of the two backends; a failure fails
 * the test (cmocka). */
void moe_fixture_banks(const moe_fixture *f, fm_backend *const be[2], fm_wformat fmt, fm_bank *b[2][2]);

#endif
