/* Synthetic expert banks for the moe op's tests (moe_fixture.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

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

void moe_fixture_banks(const moe_fixture *f, fm_backend *const be[2], fm_wformat fmt, fm_bank *b[2][2]) {
    fm_error err = {{0}};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(be[i]->ops->bank_create(be[i], &f->gate_up, fmt, &b[i][0], &err), FM_OK);
        assert_int_equal(be[i]->ops->bank_create(be[i], &f->down, fmt, &b[i][1], &err), FM_OK);
    }
}
