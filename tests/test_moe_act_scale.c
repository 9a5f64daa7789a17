/* Route moe.act_scale (backend/routes.h, fm_routes_moe_token_scales): the experts' gate|up input with one e4m3 scale
 * per token on the grouped GEMM's steps.
 *   - the route parses on sm_90 and sm_89 (both W4A8 kernels take it); a bad spec changes nothing;
 *   - where it applies: int4 gate|up banks of ours, an e4m3 dispatch, a down bank without zero points, steps above
 *     moe.gemv's pairs (never the decode GEMVs'), not under w4a8.kernel=fold;
 *   - the cpu backend under it: a step of 8 pairs (the GEMVs' step) is bit for bit the default's; a larger step
 *     equals the default on tokens whose every 128-group has the token's amax (the same codes and scales) and differs
 *     elsewhere by the two e4m3 roundings of the same activations. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "moe_fixture.h"
#include "backend/routes.h"
#include "quant/e4m3.h"
#include "util/status.h"

static uint64_t rng = 1;
static float gauss(void) {
    float s = 0.0f;
    for (int i = 0; i < 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)(rng >> 40) / (float)(1u << 24) - 0.5f;
    }
    return s * 1.7f;
}

static void test_route_parse_and_refusals(void **state) {
    (void)state;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=token", &err), FM_OK);
    assert_int_equal(r.moe_act_scale, FM_ROUTE_ACT_SCALE_TOKEN);
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=group", &err), FM_OK);
    assert_int_equal(r.moe_act_scale, FM_ROUTE_ACT_SCALE_GROUP);
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=row", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.act_scale"));
    fm_routes_default(&r, 8); /* Ada: the mma.sync kernel takes it too */
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=token", &err), FM_OK);
    assert_int_equal(r.moe_act_scale, FM_ROUTE_ACT_SCALE_TOKEN);
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=token,w4a8.kernel=sm80", &err), FM_ERR_USAGE);
    assert_int_equal(r.moe_act_scale, FM_ROUTE_ACT_SCALE_AUTO); /* a refused spec changes nothing */
}

static void test_where_it_applies(void **state) {
    (void)state;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    const fm_wformat i4 = FM_W_INT4_G128_TC, zp = FM_W_INT4_ZP_TC;
    /* auto: group */
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, i4, i4, true));
    assert_int_equal(fm_routes_apply(&r, "moe.act_scale=token", &err), FM_OK);
    assert_true(fm_routes_moe_token_scales(&r, 512, 128, 8, i4, i4, true));
    assert_true(fm_routes_moe_token_scales(&r, 16, 128, 8, FM_W_INT4_G128, FM_W_INT4_G128, true)); /* cpu banks */
    assert_false(fm_routes_moe_token_scales(&r, 8, 128, 8, i4, i4, true));    /* the decode GEMVs' step */
    assert_false(fm_routes_moe_token_scales(&r, 10, 512, 10, i4, i4, true));  /* Qwen3-Next's top-10 GEMV step */
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, i4, i4, false)); /* an FP4 dispatch */
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, zp, zp, true));
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, i4, zp, true));
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, FM_W_E4M3_B128, FM_W_E4M3_B128, true));
    assert_int_equal(fm_routes_apply(&r, "moe.gemv=off", &err), FM_OK);
    assert_true(fm_routes_moe_token_scales(&r, 8, 128, 8, i4, i4, true)); /* no GEMVs: the GEMM at any P */
    assert_int_equal(fm_routes_apply(&r, "moe.gemv=auto,w4a8.kernel=fold", &err), FM_OK);
    assert_false(fm_routes_moe_token_scales(&r, 512, 128, 8, i4, i4, true)); /* fold: its own per-token rows */
}

/* the moe op of the cpu backend with and without the route on the same banks and input */
static void test_cpu_moe(void **state) {
    (void)state;
    rng = 7;
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan); /* the GPU's formats, emulated */
    fm_backend *be[2] = {NULL, NULL};
    fm_error err = {{0}};
    assert_int_equal(fm_backend_create("cpu", &plan, 1, NULL, &be[0], &err), FM_OK);
    assert_int_equal(fm_backend_create("cpu", &plan, 1, "moe.act_scale=token", &be[1], &err), FM_OK);
    const int32_t E = 4, k = 2;
    const int64_t T = 8, H = 384, I = 128; /* 16 pairs: the grouped GEMM's step; H: three groups */
    moe_fixture f;
    moe_fixture_init(&f, E, H, I);
    fm_bank *b[2][2];
    moe_fixture_banks(&f, be, plan.w_expert, b);
    float *x = malloc((size_t)(T * H) * sizeof(float)), w[16];
    float *o[2] = {malloc((size_t)(T * H) * sizeof(float)), malloc((size_t)(T * H) * sizeof(float))};
    int32_t ids[16];
    for (int64_t t = 0; t < T; t++) {
        const int e = (int)t - 4; /* tokens 0, 1: every group's amax 448 x 2^e, values e4m3 x 2^e */
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = t < 2 ? ldexpf(fm_e4m3_to_f32(fm_f32_to_e4m3(60.0f * gauss())), e)
                                 : gauss() * (i % 101 == 0 ? 20.0f : 1.0f);
        if (t < 2)
            for (int64_t g = 0; g < H / 128; g++) x[t * H + 128 * g + 9 + g] = ldexpf(g % 2 ? -448.0f : 448.0f, e);
        ids[2 * t] = (int32_t)(t % E), ids[2 * t + 1] = (int32_t)((t + 1 + t / 4) % E);
        w[2 * t] = 0.625f, w[2 * t + 1] = 0.375f;
    }
    for (int i = 0; i < 2; i++)
        be[i]->ops->moe(be[i], b[i][0], b[i][1], x, T, ids, w, k, plan.a_dispatch, plan.a_expert, o[i]);
    assert_memory_equal(o[0], o[1], (size_t)(2 * H) * sizeof(float)); /* the same codes and scales */
    for (int64_t t = 2; t < T; t++)                                   /* per token: another rounding of each token */
        assert_memory_not_equal(o[0] + t * H, o[1] + t * H, (size_t)H * sizeof(float));
    double d = 0.0, n = 0.0;
    for (int64_t i = 2 * H; i < T * H; i++) d += (o[0][i] - o[1][i]) * (o[0][i] - o[1][i]), n += o[0][i] * o[0][i];
    assert_true(sqrt(d / n) < 0.1); /* two e4m3 roundings of the same activations */
    assert_true(d > 0.0);
    /* 4 tokens, 8 pairs: the decode GEMVs' step keeps one scale per group, bit for bit */
    for (int i = 0; i < 2; i++)
        be[i]->ops->moe(be[i], b[i][0], b[i][1], x + 4 * H, 4, ids, w, k, plan.a_dispatch, plan.a_expert, o[i]);
    assert_memory_equal(o[0], o[1], (size_t)(4 * H) * sizeof(float));
    for (int i = 0; i < 2; i++) {
        be[i]->ops->bank_free(be[i], b[i][0]), be[i]->ops->bank_free(be[i], b[i][1]);
        be[i]->ops->destroy(be[i]);
    }
    free(x), free(o[0]), free(o[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_parse_and_refusals),
        cmocka_unit_test(test_where_it_applies),
        cmocka_unit_test(test_cpu_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
