/* The route table (src/backend/routes.c): the defaults per GPU, the override strings (every key and value, the
 * errors with the valid keys or values, refusals of kernels a GPU cannot run), the deciders at their thresholds,
 * the printer, and the memory plan following w4a8.tile. No GPU needed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/routes.h"
#include "backend/w4a8_workspace.h"
#include "engine/memory_plan.h"
#include "qwen3_config.h"
#include "io/config.h"

static void assert_contains(const char *text, const char *part) {
    if (!strstr(text, part)) fail_msg("'%s' does not contain '%s'", text, part);
}

static void defaults_follow_the_device(void **s) {
    (void)s;
    fm_routes r;
    fm_routes_default(&r, 9); /* Hopper: the wgmma W4A8 GEMM and PDL */
    assert_true(fm_routes_w4a8_wgmma(&r));
    assert_true(fm_routes_pdl(&r));
    assert_true(fm_routes_gemv(&r));
    assert_int_equal(fm_routes_w8a8_gemv_max_m(&r), 8);
    assert_string_equal(fm_routes_w4a8_kernel_name(&r), "wgmma m64n64k32 e4m3 (sm_90a)");
    fm_routes_default(&r, 8); /* Ada: mma.sync, no PDL */
    assert_false(fm_routes_w4a8_wgmma(&r));
    assert_false(fm_routes_pdl(&r));
    assert_true(fm_routes_gemv(&r));
    assert_string_equal(fm_routes_w4a8_kernel_name(&r), "mma.sync m16n8k32 e4m3 (sm_89+)");
    fm_routes_default(&r, 10); /* a later GPU: PDL, but no sm_90a code for wgmma */
    assert_false(fm_routes_w4a8_wgmma(&r));
    assert_true(fm_routes_pdl(&r));
    fm_routes_default(&r, 0); /* no GPU */
    assert_false(fm_routes_w4a8_wgmma(&r));
    assert_false(fm_routes_pdl(&r));
    /* the fold kernel: asked for only, on sm_90 (the other W4A8 GEMMs then wgmma); refused by name elsewhere */
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_w4a8_fold(&r));
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=fold", &err), FM_OK);
    assert_true(fm_routes_w4a8_fold(&r));
    assert_true(fm_routes_w4a8_wgmma(&r));
    /* its warp-specialised prefill GEMMs: auto from 16 rows an expert (Qwen3-30B-A3B: T = 256), never on the decode
       GEMVs' pairs; forced on above them, off everywhere */
    assert_true(fm_routes_fold_ws(&r, 2048 * 8, 128, 8));
    assert_true(fm_routes_fold_ws(&r, 256 * 8, 128, 8));
    assert_false(fm_routes_fold_ws(&r, 255 * 8, 128, 8));
    assert_false(fm_routes_fold_ws(&r, 128 * 8, 128, 8));
    assert_false(fm_routes_fold_ws(&r, 8, 128, 8));
    assert_int_equal(fm_routes_apply(&r, "w4a8.fold_ws=on", &err), FM_OK);
    assert_true(fm_routes_fold_ws(&r, 64 * 8, 128, 8));
    assert_false(fm_routes_fold_ws(&r, 8, 128, 8)); /* the decode GEMVs */
    assert_int_equal(fm_routes_apply(&r, "w4a8.fold_ws=off", &err), FM_OK);
    assert_false(fm_routes_fold_ws(&r, 8192 * 8, 128, 8));
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.fold_ws=on", &err), FM_OK); /* without fold: nothing */
    assert_false(fm_routes_fold_ws(&r, 8192 * 8, 128, 8));
    fm_routes_default(&r, 8);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=fold", &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "w4a8.kernel=fold needs an sm_90 GPU"));
    assert_false(fm_routes_w4a8_fold(&r));
}

static void every_key_and_value_parses(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, NULL, &err), FM_OK);
    assert_int_equal(fm_routes_apply(&r, "", &err), FM_OK);
    assert_true(fm_routes_w4a8_wgmma(&r));
    assert_int_equal(
        fm_routes_apply(&r, "w4a8.kernel=mma,w4a8.tile=16,dense.gemv=off,w8a8.gemv_max_m=16,pdl=off", &err), FM_OK);
    assert_false(fm_routes_w4a8_wgmma(&r));
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 1 << 20, 1), 16);
    assert_false(fm_routes_gemv(&r));
    assert_int_equal(fm_routes_w8a8_gemv_max_m(&r), 16);
    assert_false(fm_routes_pdl(&r));
    /* auto goes back to the default rule; a later key wins */
    assert_int_equal(
        fm_routes_apply(&r, "w4a8.kernel=auto,w4a8.tile=auto,dense.gemv=auto,w8a8.gemv_max_m=auto,pdl=auto", &err),
        FM_OK);
    assert_true(fm_routes_w4a8_wgmma(&r));
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 1 << 20, 1), 64);
    assert_true(fm_routes_gemv(&r) && fm_routes_pdl(&r));
    assert_int_equal(fm_routes_w8a8_gemv_max_m(&r), 8);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=64,w4a8.tile=16,dense.gemv=on,w8a8.gemv_max_m=1,pdl=on", &err),
                     FM_OK);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 1, 1000), 16);
    assert_true(fm_routes_gemv(&r));
    assert_int_equal(fm_routes_w8a8_gemv_max_m(&r), 1);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=wgmma", &err), FM_OK);
    assert_true(fm_routes_w4a8_wgmma(&r));
    assert_int_equal(fm_routes_check("w4a8.kernel=mma,pdl=off", &err), FM_OK); /* the public check */
}

/* a bad spec: FM_ERR_USAGE, the message naming what is wrong and what is valid, the table unchanged */
static void expect_usage(const char *spec, const char *says, const char *lists) {
    fm_routes r, before;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=16", &err), FM_OK);
    before = r;
    if (fm_routes_apply(&r, spec, &err) != FM_ERR_USAGE) fail_msg("'%s' was accepted", spec);
    assert_contains(err.msg, says);
    assert_contains(err.msg, lists);
    assert_memory_equal(&r, &before, sizeof r);
    assert_int_equal(fm_routes_check(spec, &err), FM_ERR_USAGE);
}

static void bad_keys_and_values_are_usage_errors(void **s) {
    (void)s;
    const char *keys =
        "w4a8.kernel, attention.kernel, w4a8.tile, w4a8.fp4, w4a8.codes, dense.gemv, w8a8.gemv_max_m, "
        "moe.gemv, router.fused, router.cluster, moe.persistent, attn.persistent, moe.act_scale, pdl, decode.graphs, "
        "mixed.graphs, gdn.tc, rope.store, "
        "shared.stream, expert.prefetch, decode.fused";
    expect_usage("w4a8.kernels=mma", "unknown route key 'w4a8.kernels'", keys);
    expect_usage("W4A8.KERNEL=mma", "unknown route key", keys);
    expect_usage("pdl=off,gemv=off", "unknown route key 'gemv'", keys); /* after a good one: nothing applied */
    expect_usage("w4a8.kernel", "is not key=value", keys);
    expect_usage("=mma", "is not key=value", keys);
    expect_usage("pdl=", "is not key=value", keys);
    expect_usage("pdl=off,", "is not key=value", keys);
    expect_usage(",pdl=off", "is not key=value", keys);
    expect_usage("w4a8.kernel=tensorcore", "'tensorcore' is not a value", "auto, wgmma, mma or fold");
    expect_usage("attention.kernel=fa3", "route attention.kernel: 'fa3' is not a value", "auto, wgmma or mma");
    expect_usage("w4a8.tile=48", "'48' is not a value", "auto, 16, 32 or 64");
    expect_usage("w4a8.tile=16x", "'16x' is not a value", "auto, 16, 32 or 64");
    expect_usage("w4a8.fp4=on", "route w4a8.fp4: 'on' is not a value", "auto, producer or inline");
    expect_usage("w4a8.codes=tma", "route w4a8.codes: 'tma' is not a value", "auto, regs or smem");
    expect_usage("dense.gemv=0", "'0' is not a value", "auto, on or off");
    expect_usage("w8a8.gemv_max_m=0", "'0' is not a value", "auto or 1..16");
    expect_usage("w8a8.gemv_max_m=17", "'17' is not a value", "auto or 1..16");
    expect_usage("w8a8.gemv_max_m=-1", "'-1' is not a value", "auto or 1..16");
    expect_usage("pdl=yes", "'yes' is not a value", "auto, on or off");
    expect_usage("moe.gemv=0", "'0' is not a value", "auto, off or 1..64");
    expect_usage("moe.gemv=65", "'65' is not a value", "auto, off or 1..64");
    expect_usage("moe.gemv=on", "'on' is not a value", "auto, off or 1..64");
    expect_usage("router.fused=1", "'1' is not a value", "auto, on or off");
    expect_usage("expert.prefetch=65", "'65' is not a value", "auto, on, off or 1..64");
    expect_usage("expert.prefetch=all", "'all' is not a value", "auto, on, off or 1..64");
    char long_spec[300];
    memset(long_spec, 'a', sizeof long_spec - 1);
    long_spec[sizeof long_spec - 1] = '\0';
    expect_usage(long_spec, "too long", keys);
}

static void kernels_the_gpu_cannot_run_are_refused(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 8);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=wgmma", &err), FM_ERR_UNSUPPORTED);
    assert_contains(err.msg, "w4a8.kernel=wgmma needs an sm_90 GPU");
    assert_contains(err.msg, "sm_80");
    assert_false(fm_routes_w4a8_wgmma(&r));
    assert_int_equal(fm_routes_apply(&r, "pdl=on", &err), FM_ERR_UNSUPPORTED);
    assert_contains(err.msg, "pdl=on needs a GPU of compute capability 9");
    assert_false(fm_routes_pdl(&r));
    assert_int_equal(fm_routes_apply(&r, "attention.kernel=wgmma", &err), FM_ERR_UNSUPPORTED);
    assert_contains(err.msg, "attention.kernel=wgmma needs an sm_90 GPU");
    assert_int_equal(fm_routes_apply(&r, "router.cluster=on", &err), FM_ERR_UNSUPPORTED);
    assert_contains(err.msg, "router.cluster=on needs a GPU of compute capability 9");
    assert_false(fm_routes_router_cluster(&r));
    assert_false(fm_routes_attention_wgmma(&r, 128));
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=mma,pdl=off", &err), FM_OK); /* what it can run */
    fm_routes_default(&r, 10);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=wgmma", &err), FM_ERR_UNSUPPORTED);
    assert_int_equal(fm_routes_apply(&r, "pdl=on", &err), FM_OK);
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=wgmma,pdl=on", &err), FM_OK);
    fm_routes_default(&r, 0); /* no GPU to check against: the syntax only (the backend checks at creation) */
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=wgmma,pdl=on", &err), FM_OK);
}

static void dense_kernels_at_their_thresholds(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    /* W8A8: the GEMV up to 8 rows (bench/NOTES.md), cuBLASLt FP8 above; none at M = 0 */
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 1, 2048), FM_DK_W8A8_GEMV);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 8, 2048), FM_DK_W8A8_GEMV);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 9, 2048), FM_DK_W8A8_CUBLASLT);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 2048, 2048), FM_DK_W8A8_CUBLASLT);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 0, 2048), FM_DK_W8A8_CUBLASLT);
    /* W4A8 (all three bank formats): the GEMV up to 16 rows while they fit its shared memory, the GEMM above (split
       over a cluster, w4a8.splits); without the split, the GEMV to 64 rows (chunks of 16) */
    const fm_wformat w4a8[] = {FM_W_INT4_G128_TC, FM_W_INT4_ZP_TC, FM_W_E4M3_B128};
    fm_routes unsplit;
    fm_routes_default(&unsplit, 9);
    assert_int_equal(fm_routes_apply(&unsplit, "w4a8.splits=1", &err), FM_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 1, 4096), FM_DK_W4A8_GEMV);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 16, 4096), FM_DK_W4A8_GEMV);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 17, 4096), FM_DK_W4A8_GEMM);       /* the split GEMM */
        assert_int_equal(fm_routes_dense_kernel(&unsplit, w4a8[i], 17, 4096), FM_DK_W4A8_GEMV); /* chunks of 16 */
        assert_int_equal(fm_routes_dense_kernel(&unsplit, w4a8[i], 64, 4096), FM_DK_W4A8_GEMV);
        assert_int_equal(fm_routes_dense_kernel(&unsplit, w4a8[i], 65, 4096), FM_DK_W4A8_GEMM);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 65, 4096), FM_DK_W4A8_GEMM);
        /* K 8192: 16 rows stage 16 x 8208 + 2 x 16 x 64 x 4 = 139,520 bytes > 96 KiB; 8 rows 69,760 fit */
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 16, 8192), FM_DK_W4A8_GEMM);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 8, 8192), FM_DK_W4A8_GEMV);
    }
    assert_int_equal(fm_gemv_fp8_smem(16, 8192), 16 * 8208 + 2 * 16 * 64 * 4);
    assert_int_equal(fm_gemv_fp8_smem(3, 128), 8 * 144 + 2 * 8 * 1 * 4);      /* rows round up to 8 */
    assert_int_equal(fm_gemv_fp8_smem(64, 8192), fm_gemv_fp8_smem(16, 8192)); /* past 16: one chunk's */
    /* the formats with one kernel */
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_BF16, 1, 2048), FM_DK_CUBLAS);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_F32, 2048, 2048), FM_DK_CUBLAS);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128, 1, 2048), FM_DK_W4A16_GEMV);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_ZP, 2048, 2048), FM_DK_W4A16_GEMV);
    /* the overrides move the thresholds */
    assert_int_equal(fm_routes_apply(&r, "w8a8.gemv_max_m=16", &err), FM_OK);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 16, 2048), FM_DK_W8A8_GEMV);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 17, 2048), FM_DK_W8A8_CUBLASLT);
    assert_int_equal(fm_routes_apply(&r, "w8a8.gemv_max_m=1", &err), FM_OK);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 1, 2048), FM_DK_W8A8_GEMV);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 2, 2048), FM_DK_W8A8_CUBLASLT);
    /* W4A8 past 16 rows: chunks of 16 up to w4a8.gemv_max_m, each staging 16 rows (K 8192 stays on the GEMM) */
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 16); /* the split GEMM above 16 rows */
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&unsplit), 64);
    assert_int_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=16", &err), FM_OK);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128_TC, 17, 4096), FM_DK_W4A8_GEMM);
    assert_int_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=64", &err), FM_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 17, 4096), FM_DK_W4A8_GEMV);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 64, 4096), FM_DK_W4A8_GEMV);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 65, 4096), FM_DK_W4A8_GEMM);
        assert_int_equal(fm_routes_dense_kernel(&r, w4a8[i], 64, 8192), FM_DK_W4A8_GEMM);
    }
    assert_int_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=8", &err), FM_OK);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128_TC, 9, 4096), FM_DK_W4A8_GEMM);
    assert_int_not_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=65", &err), FM_OK);
    assert_int_equal(fm_routes_apply(&r, "w4a8.gemv_max_m=auto", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 16);
    /* the W8A8 activation quantizer: fused up to 8 blocks by default, 64 under fused, never under kernel */
    assert_int_equal(fm_routes_w8a8_fused_elems(&r), 65536);
    assert_int_equal(fm_routes_apply(&r, "w8a8.quant=fused", &err), FM_OK);
    assert_int_equal(fm_routes_w8a8_fused_elems(&r), 64 * 8192);
    assert_int_equal(fm_routes_apply(&r, "w8a8.quant=kernel", &err), FM_OK);
    assert_int_equal(fm_routes_w8a8_fused_elems(&r), 0);
    assert_int_not_equal(fm_routes_apply(&r, "w8a8.quant=on", &err), FM_OK);
    assert_int_equal(fm_routes_apply(&r, "dense.gemv=off,w8a8.gemv_max_m=16", &err), FM_OK);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_E4M3_PT, 1, 2048), FM_DK_W8A8_CUBLASLT);
    assert_int_equal(fm_routes_dense_kernel(&r, FM_W_INT4_G128_TC, 1, 2048), FM_DK_W4A8_GEMM);
    /* the names say which MMA the GEMM runs and whether the GEMVs use PDL */
    fm_routes_default(&r, 9);
    assert_string_equal(fm_dense_kernel_name(&r, FM_DK_W4A8_GEMM), "W4A8 GEMM wgmma m64n64k32 e4m3");
    assert_string_equal(fm_dense_kernel_name(&r, FM_DK_W8A8_GEMV), "W8A8 GEMV mma.sync m16n8k32 e4m3 + PDL");
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=mma,pdl=off", &err), FM_OK);
    assert_string_equal(fm_dense_kernel_name(&r, FM_DK_W4A8_GEMM), "W4A8 GEMM mma.sync m16n8k32 e4m3");
    assert_string_equal(fm_dense_kernel_name(&r, FM_DK_W4A8_GEMV), "W4A8 GEMV mma.sync m16n8k32 e4m3");
}

/* 16-row tiles while the experts average fewer than 32 rows (P < 32 E), 64 from there; w4a8.tile forces one */
static void moe_tile_rows(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 16 * 8, 128), FM_W4A8_BN_SMALL);       /* Qwen3 T = 16 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 32 * 128 - 1, 128), FM_W4A8_BN_SMALL); /* the boundary */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 32 * 128, 128), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 2048 * 8, 128), FM_W4A8_BN_MID);  /* Qwen3 T = 2048 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 2048 * 10, 512), FM_W4A8_BN_MID); /* Qwen3-Next T = 2048 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 256 * 128 - 1, 128), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 256 * 128, 128), FM_W4A8_BN); /* Qwen3 T = 4096 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 8192 * 8, 128), FM_W4A8_BN);  /* Qwen3 T = 8192 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 2048 * 2, 8), FM_W4A8_BN);    /* Mixtral T = 2048 */
    /* a checkpoint's banks keep 64 where ours take 32, unless forced; so do experts too large for L2 (Mixtral T = 512:
       128 rows per expert of 58.7 MB gate|up codes) */
    const uint64_t qwen3 = (uint64_t)1536 * 2048 / 2, mixtral = (uint64_t)28672 * 4096 / 2;
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_INT4_G128_TC, false, qwen3), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_INT4_G128_TC, true, qwen3), FM_W4A8_BN);
    /* an FP4 dispatch: 32 while the experts average under 64 rows (its producer kernel has no 32-row form) */
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 512 * 8, 128, FM_W_INT4_G128_TC, true, qwen3), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 64 * 128, 128, FM_W_INT4_G128_TC, true, qwen3), FM_W4A8_BN);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_E4M3_B128, false, qwen3), FM_W4A8_BN);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_INT4_ZP_TC, false, qwen3), FM_W4A8_BN);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 16 * 8, 128, FM_W_E4M3_B128, false, qwen3), FM_W4A8_BN_SMALL);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 512 * 2, 8), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 512 * 2, 8, FM_W_INT4_G128_TC, false, mixtral), FM_W4A8_BN);
    assert_int_equal(
        fm_routes_w4a8_moe_tile_rows(&r, 512 * 2, 8, FM_W_INT4_G128_TC, false, FM_W4A8_MID_MAX_EXPERT_BYTES),
        FM_W4A8_BN_MID);
    /* the fold kernel: 64 where int4-tc would take 32 (16 below), unless forced */
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=fold", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_INT4_G128_TC, false, qwen3), FM_W4A8_BN);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 16 * 8, 128, FM_W_INT4_G128_TC, false, qwen3), FM_W4A8_BN_SMALL);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=32", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 2048 * 8, 128, FM_W_INT4_G128_TC, false, qwen3), FM_W4A8_BN_MID);
    fm_routes_default(&r, 8); /* mma.sync: 16 or 64 */
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 2048 * 8, 128), FM_W4A8_BN);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 16 * 8, 128), FM_W4A8_BN_SMALL);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=32", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 16 * 8, 128), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_w4a8_moe_tile_rows(&r, 16 * 8, 128, FM_W_E4M3_B128, true, mixtral), FM_W4A8_BN_MID);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=64", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 16 * 8, 128), FM_W4A8_BN);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=16", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 2048 * 8, 128), FM_W4A8_BN_SMALL);
}

/* Where the wgmma W4A8 GEMM's codes come from: the stage ring while the experts average under 64 rows (P < 64 E, E >
   1), registers otherwise (dense projections, large batches); forced either way; never on the mma.sync kernel. */
static void w4a8_codes_by_rows_per_expert(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_w4a8_codes_staged(&r, 2048 * 10, 512));  /* Qwen3-Next, T = 2048: 40 rows per expert */
    assert_true(fm_routes_w4a8_codes_staged(&r, 512 * 8, 128));    /* Qwen3, T = 512: 32 */
    assert_false(fm_routes_w4a8_codes_staged(&r, 1024 * 8, 128));  /* Qwen3, T = 1024: 64 */
    assert_false(fm_routes_w4a8_codes_staged(&r, 8192 * 10, 512)); /* 160 */
    assert_false(fm_routes_w4a8_codes_staged(&r, 40, 1));          /* a dense projection */
    assert_int_equal(fm_routes_apply(&r, "w4a8.codes=smem", &err), FM_OK);
    assert_true(fm_routes_w4a8_codes_staged(&r, 8192 * 10, 512));
    assert_true(fm_routes_w4a8_codes_staged(&r, 4096, 1));
    assert_int_equal(fm_routes_apply(&r, "w4a8.codes=regs", &err), FM_OK);
    assert_false(fm_routes_w4a8_codes_staged(&r, 2048 * 10, 512));
    assert_int_equal(fm_routes_apply(&r, "w4a8.codes=smem,w4a8.kernel=mma", &err), FM_OK);
    assert_false(fm_routes_w4a8_codes_staged(&r, 2048 * 10, 512)); /* mma.sync: registers only */
    fm_routes_default(&r, 8);
    assert_false(fm_routes_w4a8_codes_staged(&r, 2048 * 10, 512)); /* Ada: mma.sync */
}

/* Where the FP4 gate|up GEMM expands: a producer warpgroup with the wgmma kernel unless w4a8.fp4=inline; the mma.sync
   kernel always inline */
static void fp4_expansion_follows_the_kernel(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN));
    assert_true(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN_SMALL));
    assert_int_equal(fm_routes_apply(&r, "w4a8.fp4=inline", &err), FM_OK);
    assert_false(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN));
    assert_int_equal(fm_routes_apply(&r, "w4a8.fp4=producer,w4a8.kernel=mma", &err), FM_OK);
    assert_false(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN));
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=auto", &err), FM_OK);
    assert_true(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN));
    fm_routes_default(&r, 8);
    assert_false(fm_routes_w4a8_fp4_producer(&r, FM_W4A8_BN));
}

/* The experts' grouped GEMVs up to 8 routed pairs, or one token's top-k when more, by default (moe.gemv: a count or
   off), only with 16-row tiles; the
   fused router at T = 1 by default, up to 8 tokens when on */
static void decode_kernels_at_their_thresholds(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_moe_gemv(&r, 8, 128, 8));   /* Qwen3, one token */
    assert_false(fm_routes_moe_gemv(&r, 16, 128, 8)); /* two */
    assert_false(fm_routes_moe_gemv(&r, 0, 128, 8));
    assert_true(fm_routes_moe_gemv(&r, 10, 512, 10));  /* Qwen3-Next, one token of top-10 */
    assert_false(fm_routes_moe_gemv(&r, 20, 512, 10)); /* two */
    assert_true(fm_routes_moe_gemv(&r, 8, 8, 2));      /* Mixtral: four tokens of top-2 */
    assert_false(fm_routes_moe_gemv(&r, 10, 8, 2));
    assert_true(fm_routes_router_fused(&r, 1));
    assert_false(fm_routes_router_fused(&r, 2));
    assert_int_equal(fm_routes_apply(&r, "moe.gemv=64,router.fused=on", &err), FM_OK);
    assert_true(fm_routes_moe_gemv(&r, 64, 128, 8));
    assert_false(fm_routes_moe_gemv(&r, 65, 128, 8));
    assert_true(fm_routes_router_fused(&r, 8));
    assert_true(fm_routes_router_fused(&r, 2));
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=64", &err), FM_OK); /* tiles the GEMVs cannot take */
    assert_false(fm_routes_moe_gemv(&r, 8, 128, 8));
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=auto,moe.gemv=off,router.fused=off", &err), FM_OK);
    assert_false(fm_routes_moe_gemv(&r, 1, 128, 8));
    assert_false(fm_routes_router_fused(&r, 1));
    assert_int_equal(fm_routes_apply(&r, "moe.gemv=auto,router.fused=auto", &err), FM_OK);
    assert_true(fm_routes_moe_gemv(&r, 8, 128, 8) && fm_routes_router_fused(&r, 1));
}

/* The W4A8 MoE workspace holds the tile list of the tile rows the route picks: at T = 2048 (P = 16384 pairs over 128
 * experts) 64-row tiles make at most 256 + 128 = 384 tiles (6,144 bytes), 16-row tiles 1,024 + 128 = 1,152 (18,432
 * bytes): forcing w4a8.tile=16 grows the plan by exactly the difference, and the plan without routes is the
 * defaults'. */
static void memory_plan_follows_w4a8_tile(void **s) {
    (void)s;
    fm_config cfg;
    fm_error err = {{0}};
    qwen3_30b_config(&cfg);
    fm_plan plan;
    fm_plan_for_backend(FM_PRESET_FP8, "cuda", &plan);
    fm_routes r16, r32, r64, def;
    fm_routes_default(&def, 9);
    fm_routes_default(&r16, 9);
    fm_routes_default(&r32, 9);
    fm_routes_default(&r64, 9);
    assert_int_equal(fm_routes_apply(&r16, "w4a8.tile=16", &err), FM_OK);
    assert_int_equal(fm_routes_apply(&r32, "w4a8.tile=32", &err), FM_OK);
    assert_int_equal(fm_routes_apply(&r64, "w4a8.tile=64", &err), FM_OK);
    fm_memory_plan plain, pdef, p16, p32, p64;
    assert_int_equal(fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 2048, &plain, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &def, 0, 2048, &pdef, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &r16, 0, 2048, &p16, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &r32, 0, 2048, &p32, &err), FM_OK);
    assert_int_equal(fm_memory_plan_compute_routes(&cfg, &plan, "cuda", &r64, 0, 2048, &p64, &err), FM_OK);
    assert_int_equal(plain.ws_moe, pdef.ws_moe);
    assert_int_equal(p32.ws_moe, pdef.ws_moe); /* 32 is the default at T = 2048 (128 rows per expert) */
    /* the tile list: (P / bn + min(E, P)) x 16 bytes, P = 16384, E = 128 */
    assert_int_equal(p16.ws_moe - pdef.ws_moe, 18432 - 10240);
    assert_int_equal(p16.total - pdef.total, 18432 - 10240);
    assert_int_equal(pdef.ws_moe - p64.ws_moe, 10240 - 6144);
    const fm_w4a8_moe_ws L16 = fm_w4a8_moe_layout(2048, 8, 128, 2048, 768, 16, FM_W4A8_DISPATCH_E4M3, false);
    const fm_w4a8_moe_ws L32 = fm_w4a8_moe_layout(2048, 8, 128, 2048, 768, 32, FM_W4A8_DISPATCH_E4M3, false);
    const fm_w4a8_moe_ws L64 = fm_w4a8_moe_layout(2048, 8, 128, 2048, 768, 64, FM_W4A8_DISPATCH_E4M3, false);
    assert_int_equal(p16.ws_moe, L16.total);
    assert_int_equal(pdef.ws_moe, L32.total);
    assert_int_equal(p64.ws_moe, L64.total);
    /* the tile list bounds every routing: ceil(c_e / bn) tiles per expert, at most P / bn + min(E, P) in all
       (skewed routings: half the pairs on expert 0) */
    uint64_t rng = 12345;
    for (int trial = 0; trial < 200; trial++) {
        const uint64_t E = 1 + trial % 130, P = 1 + (uint64_t)trial * 97 % 20000;
        uint64_t counts[130] = {0};
        for (uint64_t p = 0; p < P; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            counts[(rng >> 33) % 2 ? 0 : (rng >> 40) % E]++;
        }
        const fm_routes *tables[] = {&def, &r16, &r32, &r64};
        for (int t = 0; t < 4; t++) {
            const uint64_t bn = fm_routes_w4a8_tile_rows(tables[t], P, E);
            uint64_t tiles = 0;
            for (uint64_t e = 0; e < E; e++) tiles += (counts[e] + bn - 1) / bn;
            assert_true(tiles <= fm_w4a8_max_tiles(P, E, bn));
        }
    }
}

/* attention.kernel: wgmma on sm_90 for hd 128 only (the one head dim the kernel has), mma.sync elsewhere; forced
   wgmma still leaves other head dims on mma.sync; forced mma takes every head dim */
static void attention_kernel_by_device_and_head_dim(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_attention_wgmma(&r, 128));
    assert_false(fm_routes_attention_wgmma(&r, 64));
    assert_false(fm_routes_attention_wgmma(&r, 256));
    assert_int_equal(fm_routes_apply(&r, "attention.kernel=mma", &err), FM_OK);
    assert_false(fm_routes_attention_wgmma(&r, 128));
    assert_int_equal(fm_routes_apply(&r, "attention.kernel=wgmma", &err), FM_OK);
    assert_true(fm_routes_attention_wgmma(&r, 128));
    assert_false(fm_routes_attention_wgmma(&r, 48));
    assert_int_equal(fm_routes_apply(&r, "attention.kernel=auto", &err), FM_OK);
    assert_true(fm_routes_attention_wgmma(&r, 128));
    fm_routes_default(&r, 8); /* Ada */
    assert_false(fm_routes_attention_wgmma(&r, 128));
    assert_int_equal(fm_routes_apply(&r, "attention.kernel=mma", &err), FM_OK);
    assert_false(fm_routes_attention_wgmma(&r, 128));
    fm_routes_default(&r, 10); /* a later GPU: no sm_90a code */
    assert_false(fm_routes_attention_wgmma(&r, 128));
    fm_routes_default(&r, 0); /* no GPU */
    assert_false(fm_routes_attention_wgmma(&r, 128));
}

static void the_printer_shows_every_key(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.tile=16,pdl=off", &err), FM_OK);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    assert_non_null(f);
    fm_routes_print(&r, f);
    fclose(f);
    const char *keys[] = {"w4a8.kernel",     "attention.kernel", "w4a8.tile", "w4a8.fp4",     "w4a8.codes",
                          "dense.gemv",      "w8a8.gemv_max_m",  "moe.gemv",  "router.fused", "pdl",
                          "decode.graphs",   "mixed.graphs",     "gdn.tc",    "rope.store",   "shared.stream",
                          "expert.prefetch", "decode.fused",     "moe.shared"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) assert_contains(text, keys[i]);
    assert_contains(text, "producer warpgroup"); /* w4a8.fp4 now */
    assert_contains(text, "wgmma for hd 128");   /* attention.kernel now */
    assert_contains(text, "16 rows");            /* w4a8.tile now */
    assert_contains(text, "auto|wgmma|mma");     /* the values */
    assert_contains(text, "wgmma on sm_90");     /* a default */
    assert_contains(text, "off    auto|on|off"); /* pdl's value */
    free(text);
}

/* moe.shared: routed by default (auto) from sm_90, separate below and on the cpu (sm 0); each word picks its form */
static void moe_shared_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 0);
    assert_false(fm_routes_moe_shared_routed(&r));
    fm_routes_default(&r, 8);
    assert_false(fm_routes_moe_shared_routed(&r));
    fm_routes_default(&r, 9);
    assert_true(fm_routes_moe_shared_routed(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.shared=routed", &err), FM_OK);
    assert_true(fm_routes_moe_shared_routed(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.shared=separate", &err), FM_OK);
    assert_false(fm_routes_moe_shared_routed(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.shared=auto", &err), FM_OK);
    assert_true(fm_routes_moe_shared_routed(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.shared=on", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.shared"));
}

/* paged.combine: the two-kernel form by default (auto) until the fused one is measured on a GPU; each word picks its
 * form, and a switch word is refused with the key named */
static void paged_combine_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_paged_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.combine=fused", &err), FM_OK);
    assert_true(fm_routes_paged_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.combine=kernel", &err), FM_OK);
    assert_false(fm_routes_paged_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.combine=auto", &err), FM_OK);
    assert_false(fm_routes_paged_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.combine=on", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "paged.combine"));
}

/* paged.swap: on by default (auto) from sm_90, where it was measured, off below; on, x2 and off as written, a word of
 * another route refused with the key named */
static void paged_swap_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 8);
    assert_int_equal(fm_routes_paged_swap(&r), 0);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=on", &err), FM_OK);
    assert_int_equal(fm_routes_paged_swap(&r), 1);
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_paged_swap(&r), 1);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=off", &err), FM_OK);
    assert_int_equal(fm_routes_paged_swap(&r), 0);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=on", &err), FM_OK);
    assert_int_equal(fm_routes_paged_swap(&r), 1);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=x2", &err), FM_OK);
    assert_int_equal(fm_routes_paged_swap(&r), 2);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=off", &err), FM_OK);
    assert_int_equal(fm_routes_paged_swap(&r), 0);
    assert_int_equal(fm_routes_apply(&r, "paged.swap=fused", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "paged.swap"));
}

/* paged.splits: the waves rule by default (auto, measured on the H100); each word picks its rule, a switch word is
 * refused with the key named */
static void paged_splits_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_paged_splits_waves(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.splits=waves", &err), FM_OK);
    assert_true(fm_routes_paged_splits_waves(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.splits=fill", &err), FM_OK);
    assert_false(fm_routes_paged_splits_waves(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.splits=auto", &err), FM_OK);
    assert_true(fm_routes_paged_splits_waves(&r));
    assert_int_equal(fm_routes_apply(&r, "paged.splits=3", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "paged.splits"));
}

/* moe.down_quant: the quantizer launch by default (auto) until the down GEMV's own quantization is measured on a GPU;
 * each word picks its form, a switch word is refused with the key named */
static void moe_down_quant_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.down_quant=fused", &err), FM_OK);
    assert_true(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.down_quant=kernel", &err), FM_OK);
    assert_false(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.down_quant=auto", &err), FM_OK);
    assert_false(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.down_quant=on", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.down_quant"));
    fm_routes_default(&r, 8); /* Ada: the same kernels (mma.sync) */
    assert_int_equal(fm_routes_apply(&r, "moe.down_quant=fused", &err), FM_OK);
    assert_true(fm_routes_moe_down_quant_fused(&r));
}

/* dense.quant: the producers' quantization by default (auto; measured on an H100), the GEMV's own (fused) or the
 * quantizer launch (kernel) when named; each word picks one form, independent of moe.down_quant; a switch word is
 * refused with the key named */
static void dense_quant_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_dense_quant_fused(&r));
    assert_true(fm_routes_dense_quant_producer(&r));
    assert_int_equal(fm_routes_apply(&r, "dense.quant=fused", &err), FM_OK);
    assert_true(fm_routes_dense_quant_fused(&r));
    assert_false(fm_routes_dense_quant_producer(&r));
    assert_false(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "dense.quant=kernel", &err), FM_OK);
    assert_false(fm_routes_dense_quant_fused(&r));
    assert_false(fm_routes_dense_quant_producer(&r));
    assert_int_equal(fm_routes_apply(&r, "dense.quant=producer", &err), FM_OK);
    assert_false(fm_routes_dense_quant_fused(&r));
    assert_true(fm_routes_dense_quant_producer(&r));
    assert_int_equal(fm_routes_apply(&r, "dense.quant=auto", &err), FM_OK);
    assert_false(fm_routes_dense_quant_fused(&r));
    assert_true(fm_routes_dense_quant_producer(&r));
    assert_int_equal(fm_routes_apply(&r, "dense.quant=on", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "dense.quant"));
}

/* gemv.groups: 0 (the wave rule) at auto, else the K groups a warp named; other integers refused */
static void gemv_groups_values(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_gemv_groups(&r), 0);
    const int32_t ok[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "gemv.groups=%d", ok[i]);
        assert_int_equal(fm_routes_apply(&r, spec, &err), FM_OK);
        assert_int_equal(fm_routes_gemv_groups(&r), ok[i]);
    }
    assert_int_equal(fm_routes_apply(&r, "gemv.groups=auto", &err), FM_OK);
    assert_int_equal(fm_routes_gemv_groups(&r), 0);
    assert_int_equal(fm_routes_apply(&r, "gemv.groups=3", &err), FM_ERR_USAGE);
    assert_contains(err.msg, "gemv.groups");
    assert_int_equal(fm_routes_apply(&r, "gemv.groups=16", &err), FM_ERR_USAGE);
}

/* w4a8.splits: fill by default; a value is clamped to the K groups; fill takes the largest of 8, 4, 2 whose CTAs fit
   the SMs with two groups a split at least (Qwen3-30B-A3B at M = 64 on 132 SMs: q|k|v 20 CTAs -> 4, o 8 -> 8). With
   the split GEMM (sm_90, splits other than 1) the dense W4A8 GEMV keeps 16 rows by default, elsewhere 64. */
static void w4a8_splits_values(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_w4a8_splits(&r, 16, 20, 132), 4);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 16);
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=1", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 64);
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=auto,w4a8.kernel=mma", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 64); /* no split on the mma.sync kernel */
    assert_int_equal(fm_routes_apply(&r, "w4a8.kernel=auto,w4a8.gemv_max_m=40", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 40);
    fm_routes_default(&r, 8);
    assert_int_equal(fm_routes_w4a8_gemv_max_m(&r), 64); /* sm_89: the mma.sync kernel */
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=8", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_splits(&r, 16, 20, 132), 8);
    assert_int_equal(fm_routes_w4a8_splits(&r, 4, 20, 132), 4);   /* at most the groups */
    assert_int_equal(fm_routes_w4a8_splits(&r, 16, 400, 132), 8); /* a value is taken as given */
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=fill", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_splits(&r, 16, 20, 132), 4);
    assert_int_equal(fm_routes_w4a8_splits(&r, 32, 8, 132), 8);
    assert_int_equal(fm_routes_w4a8_splits(&r, 4, 8, 132), 2); /* two groups a split */
    assert_int_equal(fm_routes_w4a8_splits(&r, 2, 8, 132), 1);
    assert_int_equal(fm_routes_w4a8_splits(&r, 32, 80, 132), 1); /* prefill-sized grids */
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=auto", &err), FM_OK);
    assert_int_equal(fm_routes_w4a8_splits(&r, 32, 8, 132), 8);
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=3", &err), FM_ERR_USAGE);
    assert_contains(err.msg, "w4a8.splits");
    assert_int_equal(fm_routes_apply(&r, "w4a8.splits=16", &err), FM_ERR_USAGE);
}

/* router.cluster: off by default (measured level), on where asked on sm_90 */
static void router_cluster_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_router_cluster(&r));
    assert_int_equal(fm_routes_apply(&r, "router.cluster=on", &err), FM_OK);
    assert_true(fm_routes_router_cluster(&r));
    assert_int_equal(fm_routes_apply(&r, "router.cluster=off", &err), FM_OK);
    assert_false(fm_routes_router_cluster(&r));
    assert_int_equal(fm_routes_apply(&r, "router.cluster=fused", &err), FM_ERR_USAGE);
}

/* moe.combine: the tail's kernel by default until the down GEMV's last CTAs are measured; independent of
 * moe.down_quant */
static void moe_combine_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_moe_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.combine=fused", &err), FM_OK);
    assert_true(fm_routes_moe_combine_fused(&r));
    assert_false(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.combine=kernel,moe.down_quant=fused", &err), FM_OK);
    assert_false(fm_routes_moe_combine_fused(&r));
    assert_true(fm_routes_moe_down_quant_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.combine=auto", &err), FM_OK);
    assert_false(fm_routes_moe_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.combine=off", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.combine"));
}

/* moe.dispatch: the dispatch's own launch by default until the fused router's dispatch is measured; independent of
 * router.fused (the op asks both) and of the other MoE routes */
static void moe_dispatch_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_moe_dispatch_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.dispatch=fused", &err), FM_OK);
    assert_true(fm_routes_moe_dispatch_fused(&r));
    assert_true(fm_routes_router_fused(&r, 1));
    assert_false(fm_routes_moe_combine_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.dispatch=fused,router.fused=off", &err), FM_OK);
    assert_true(fm_routes_moe_dispatch_fused(&r));
    assert_false(fm_routes_router_fused(&r, 1));
    assert_int_equal(fm_routes_apply(&r, "moe.dispatch=kernel", &err), FM_OK);
    assert_false(fm_routes_moe_dispatch_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.dispatch=auto", &err), FM_OK);
    assert_false(fm_routes_moe_dispatch_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.dispatch=on", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.dispatch"));
}

/* moe.persistent: on from sm_90 (measured on an H100), off below and on the cpu (sm 0); on / off force it; the other
 * MoE routes are independent of it */
static void moe_persistent_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_moe_persistent(&r));
    assert_false(fm_routes_moe_dispatch_fused(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.persistent=off", &err), FM_OK);
    assert_false(fm_routes_moe_persistent(&r));
    fm_routes_default(&r, 8);
    assert_false(fm_routes_moe_persistent(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.persistent=on", &err), FM_OK);
    assert_true(fm_routes_moe_persistent(&r));
    fm_routes_default(&r, 0);
    assert_false(fm_routes_moe_persistent(&r));
    assert_int_equal(fm_routes_apply(&r, "moe.persistent=fused", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "moe.persistent"));
}

/* gdn.decode_fused: auto on from sm_90 unless decode.fused=off, else decode.fused's value; on and off whatever it is */
static void gdn_decode_fused_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_fused_gdn(&r));
    assert_int_equal(fm_routes_apply(&r, "decode.fused=off", &err), FM_OK);
    assert_false(fm_routes_fused_gdn(&r));
    assert_int_equal(fm_routes_apply(&r, "gdn.decode_fused=on", &err), FM_OK);
    assert_true(fm_routes_fused_gdn(&r));
    fm_routes_default(&r, 8);
    assert_false(fm_routes_fused_gdn(&r));
    assert_int_equal(fm_routes_apply(&r, "decode.fused=on", &err), FM_OK);
    assert_true(fm_routes_fused_gdn(&r));
    assert_int_equal(fm_routes_apply(&r, "gdn.decode_fused=off", &err), FM_OK);
    assert_false(fm_routes_fused_gdn(&r));
}

/* gdn.decode_ba and gdn.early_state: off by default (not yet measured on a GPU), on and off as written */
static void gdn_decode_ba_words(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_false(fm_routes_gdn_decode_ba(&r));
    assert_false(fm_routes_gdn_early_state(&r));
    assert_int_equal(fm_routes_apply(&r, "gdn.decode_ba=on,gdn.early_state=on", &err), FM_OK);
    assert_true(fm_routes_gdn_decode_ba(&r));
    assert_true(fm_routes_gdn_early_state(&r));
    assert_int_equal(fm_routes_apply(&r, "gdn.decode_ba=off", &err), FM_OK);
    assert_false(fm_routes_gdn_decode_ba(&r));
    assert_int_equal(fm_routes_apply(&r, "gdn.early_state=fused", &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "gdn.early_state"));
}

/* each key's value prints as it was written: its word, else the integer */
static void values_print_as_written(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_int_equal(fm_routes_apply(&r, "expert.prefetch=on,moe.gemv=off,w4a8.tile=32", &err), FM_OK);
    assert_int_equal(fm_routes_expert_prefetch_top(&r, 8), 8);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    assert_non_null(f);
    fm_routes_print(&r, f);
    fclose(f);
    assert_contains(text, "expert.prefetch  on ");
    assert_contains(text, "moe.gemv         off ");
    assert_contains(text, "w4a8.tile        32 ");
    free(text);
    assert_int_equal(fm_routes_apply(&r, "expert.prefetch=3,w4a8.tile=016", &err), FM_OK); /* strtol's integers */
    assert_int_equal(fm_routes_expert_prefetch_top(&r, 8), 3);
    assert_int_equal(fm_routes_w4a8_tile_rows(&r, 1 << 20, 1), 16);
}

/* docs/routes.md is the generated reference page, committed: it must equal what the table prints now
   (regenerate: ./build/fp8moe inspect --routes --markdown > docs/routes.md) */
static void the_committed_reference_page_is_current(void **s) {
    (void)s;
    char *want = NULL;
    size_t n_want = 0;
    FILE *f = open_memstream(&want, &n_want);
    assert_non_null(f);
    fm_routes_print_markdown(f);
    fclose(f);
    FILE *doc = fopen("docs/routes.md", "rb");
    if (!doc) fail_msg("docs/routes.md is missing (run the tests from the repository root)");
    char *have = malloc(n_want + 2);
    assert_non_null(have);
    const size_t n_have = fread(have, 1, n_want + 1, doc);
    fclose(doc);
    if (n_have != n_want || memcmp(have, want, n_want))
        fail_msg("docs/routes.md differs from the route table: ./build/fp8moe inspect --routes --markdown > "
                 "docs/routes.md");
    const char *keys[] = {"w4a8.kernel",     "attention.kernel", "w4a8.tile", "w4a8.fp4",     "w4a8.codes",
                          "dense.gemv",      "w8a8.gemv_max_m",  "moe.gemv",  "router.fused", "pdl",
                          "decode.graphs",   "mixed.graphs",     "gdn.tc",    "rope.store",   "shared.stream",
                          "expert.prefetch", "decode.fused",     "moe.shared"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char cell[40];
        snprintf(cell, sizeof cell, "| `%s` |", keys[i]);
        assert_contains(want, cell);
    }
    assert_contains(want, "`auto`, `16`, `32`, `64`"); /* w4a8.tile's values, 32 included */
    assert_contains(want, "gate\\|up");                /* a '|' inside a cell is escaped */
    free(have);
    free(want);
}

/* gdn.tc: the Gated DeltaNet's chunked prefill on tensor cores by default (off: token by token), for dk = dv = 128
   over bf16 activations only (the ref32 oracle and other head sizes run token by token) */
static void gdn_tc_by_shape_and_route(void **s) {
    (void)s;
    fm_routes r;
    fm_error err = {{0}};
    fm_routes_default(&r, 9);
    assert_true(fm_routes_gdn_tc(&r, 128, 128, true));
    assert_false(fm_routes_gdn_tc(&r, 128, 128, false));
    assert_int_equal(fm_routes_apply(&r, "gdn.tc=on", &err), FM_OK);
    assert_true(fm_routes_gdn_tc(&r, 128, 128, true));
    assert_false(fm_routes_gdn_tc(&r, 128, 128, false));
    assert_false(fm_routes_gdn_tc(&r, 16, 12, true));
    assert_false(fm_routes_gdn_tc(&r, 128, 64, true));
    assert_int_equal(fm_routes_apply(&r, "gdn.tc=off", &err), FM_OK);
    assert_false(fm_routes_gdn_tc(&r, 128, 128, true));
    expect_usage("gdn.tc=yes", "'yes' is not a value", "auto, on or off");
    /* the state pass has one form: the 4- and 8-warp ones and their key gdn.state are gone (lab/README.md) */
    expect_usage("gdn.state=8", "unknown route key 'gdn.state'", "gdn.tc, rope.store");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_follow_the_device),
        cmocka_unit_test(every_key_and_value_parses),
        cmocka_unit_test(bad_keys_and_values_are_usage_errors),
        cmocka_unit_test(kernels_the_gpu_cannot_run_are_refused),
        cmocka_unit_test(dense_kernels_at_their_thresholds),
        cmocka_unit_test(moe_tile_rows),
        cmocka_unit_test(fp4_expansion_follows_the_kernel),
        cmocka_unit_test(decode_kernels_at_their_thresholds),
        cmocka_unit_test(memory_plan_follows_w4a8_tile),
        cmocka_unit_test(attention_kernel_by_device_and_head_dim),
        cmocka_unit_test(the_printer_shows_every_key),
        cmocka_unit_test(w4a8_codes_by_rows_per_expert),
        cmocka_unit_test(gdn_tc_by_shape_and_route),
        cmocka_unit_test(moe_shared_words),
        cmocka_unit_test(paged_combine_words),
        cmocka_unit_test(paged_swap_words),
        cmocka_unit_test(paged_splits_words),
        cmocka_unit_test(moe_down_quant_words),
        cmocka_unit_test(dense_quant_words),
        cmocka_unit_test(gemv_groups_values),
        cmocka_unit_test(w4a8_splits_values),
        cmocka_unit_test(router_cluster_words),
        cmocka_unit_test(moe_combine_words),
        cmocka_unit_test(moe_dispatch_words),
        cmocka_unit_test(moe_persistent_words),
        cmocka_unit_test(gdn_decode_fused_words),
        cmocka_unit_test(gdn_decode_ba_words),
        cmocka_unit_test(values_print_as_written),
        cmocka_unit_test(the_committed_reference_page_is_current),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
