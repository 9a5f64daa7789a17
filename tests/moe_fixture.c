/* Synthetic expert banks for the moe op's tests (moe_fixture.h). */
#include "moe_fixture.h"

void moe_fixture_init(moe_fixture *f, int32_t E, int64_t H, int64_t I) {
    for (int32_t e = 0; e < E && e < MOE_FIXTURE_MAX_E; e++) {
        f->v[2 * e] = (fm_wsrc){NULL, 0, I, H, {11 + (uint64_t)e, 0.05f, 0.0f, 0}, {0}};
        f->v[2 * e + 1] = (fm_wsrc){NULL, 0, I, H, {21 + (uint64_t)e, 0.05f, 0.0f, 0}, {0}};
        f->v[2 * E + e] = (fm_wsrc){NULL, 0, H, I, {31 + (uint64_t)e, 0.05f, 0.0f, 0}, {0}};
    }
    f->gate_up = (fm_bank_src){f->v, E, 2, "test experts gate_up", true, true};
    f->down = (fm_bank_src){f->v + 2 * E, E, 1, "test experts down", false, true};
}
