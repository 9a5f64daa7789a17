/* fp8moe inspect --routes: the cuda backend's kernel route table (backend/routes.h) after the overrides, and the
 * kernels it picks at a model's shapes (or Qwen3-30B-A3B's), as on this machine's GPU or an sm_90 one. */
#include <stdio.h>

#include "backend/backend_kind.h"
#include "backend/routes.h"
#include "cli/inspect.h"
#include "model/arch.h"

/* a dense kernel in a table cell */
static const char *kernel_cell(fm_dense_kernel k, const fm_routes *r) {
    switch (k) {
    case FM_DK_CUBLAS: return "cublas";
    case FM_DK_W4A16_GEMV: return "w4a16-gemv";
    case FM_DK_W4A8_GEMV: return "w4a8-gemv";
    case FM_DK_W4A8_GEMM: return fm_routes_w4a8_wgmma(r) ? "w4a8-gemm-wgmma" : "w4a8-gemm-mma";
    case FM_DK_W8A8_GEMV: return "w8a8-gemv";
    case FM_DK_W8A8_CUBLASLT: return "cublaslt-fp8";
    }
    return "?";
}

/* The route table (its values after the overrides), then what it picks at the shapes. */
fm_status inspect_print_routes(const route_shapes *s, const char *overrides, fm_error *err) {
    int sm = 0;
    char gpu[256];
    fm_error qerr = {{0}};
    const fm_backend_kind *gpu_kind = fm_backend_kind_find("cuda"); /* the routes are the cuda backend's */
    const bool have_gpu = gpu_kind->device_query(&sm, gpu, sizeof gpu, &qerr) == FM_OK;
    if (!have_gpu) sm = 9;
    fm_routes r;
    fm_routes_default(&r, sm);
    fm_status st = fm_routes_apply(&r, overrides, err);
    if (st) return st;
    if (have_gpu) printf("kernel routes: the cuda backend on this GPU, %s\n", gpu);
    else
        printf("kernel routes: as the cuda backend would fill them on an sm_90 GPU (Hopper, e.g. H200); no GPU here "
               "(%s)\n",
               qerr.msg);
    printf("overrides (--route, fm_options.routes): %s\n", overrides && *overrides ? overrides : "none");
    fm_routes_print(&r, stdout);

    static const int64_t rows[] = {1, 8, 16, 128, 2048};
    static const struct {
        fm_wformat f;
        const char *where;
    } formats[] = {{FM_W_BF16, "ref"},
                   {FM_W_INT4_G128, "int4"},
                   {FM_W_INT4_G128_TC, "fp8"},
                   {FM_W_E4M3_PT, "--dense w8a8"},
                   {FM_W_INT4_ZP_TC, "fp8, int4 checkpoint"},
                   {FM_W_E4M3_B128, "fp8, block-FP8 checkpoint"}};
    printf(
        "dense projections (%s: q|k|v %lld x %lld, o %lld x %lld; K up to %lld), kernel by weight format and M rows:\n",
        s->what, (long long)s->qkv_n, (long long)s->hidden, (long long)s->hidden, (long long)s->attn,
        (long long)s->widest_k);
    printf("  %-13s %-26s", "format", "preset");
    for (size_t m = 0; m < sizeof rows / sizeof *rows; m++) printf(" M=%-14lld", (long long)rows[m]);
    printf("\n");
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
        printf("  %-13s %-26s", fm_wformat_name(formats[f].f), formats[f].where);
        for (size_t m = 0; m < sizeof rows / sizeof *rows; m++)
            printf(" %-16s", kernel_cell(fm_routes_dense_kernel(&r, formats[f].f, rows[m], s->widest_k), &r));
        printf("\n");
    }
    printf("  (w4a8-gemm: %s; gemv kernels%s)\n", fm_dense_kernel_name(&r, FM_DK_W4A8_GEMM),
           fm_routes_pdl(&r) ? " launched with PDL" : " launched without PDL");
    if (s->n_experts > 0) {
        static const int64_t tokens[] = {1, 2, 16, 64, 256, 512, 2048};
        printf("MoE experts (%d experts, top-%d, fp8 preset) by prompt length or decode batch T; router by T:\n",
               s->n_experts, s->top_k);
        printf("  %-10s %-12s %-46s %s\n", "T", "pairs P", "experts", "router");
        for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++) {
            const uint64_t P = (uint64_t)tokens[t] * (uint64_t)s->top_k;
            char kernel[96];
            if (fm_routes_moe_gemv(&r, P, (uint64_t)s->n_experts, (uint64_t)s->top_k))
                snprintf(kernel, sizeof kernel, "grouped W4A8 GEMVs mma.sync, 16-row tiles");
            else
                snprintf(kernel, sizeof kernel, "grouped W4A8 GEMM %s, %u-row tiles",
                         fm_routes_w4a8_wgmma(&r) ? "wgmma" : "mma.sync",
                         fm_routes_w4a8_tile_rows(&r, P, (uint64_t)s->n_experts));
            printf("  %-10lld %-12llu %-46s %s\n", (long long)tokens[t], (unsigned long long)P, kernel,
                   fm_routes_router_fused(&r, tokens[t]) ? "fused GEMV + top-k" : "cuBLAS GEMM + top-k");
        }
        printf("  (bf16 experts, ref: grouped cuBLAS GEMMs; int4 experts, int4: per-token W4A16 GEMVs)\n");
    }
    return FM_OK;
}

route_shapes inspect_shapes_of(const char *dir, const fm_config *c) {
    route_shapes s = {dir,
                      c->hidden_size,
                      (int64_t)c->n_heads * c->head_dim,
                      0,
                      (int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim,
                      c->n_experts,
                      c->n_experts_per_tok};
    s.widest_k = fm_arch_widest_dense_k(c, c->n_layers);
    return s;
}
