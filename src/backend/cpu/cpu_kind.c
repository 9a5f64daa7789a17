/* The cpu backend's kind (backend_kind.h): fp32 everywhere, host memory, ops in issue order. Each figure restates an
 * allocation of this folder: keep them in step (tests/test_memory_plan.c loads models and compares). */
#include "backend/backend_kind.h"
#include "backend/size_math.h"
#include "model/arch.h"

#define GROUP 128 /* int4 scale group along K (FM_CPU_GROUP) */

static size_t cpu_act_size(const fm_plan *plan) {
    (void)plan;
    return sizeof(float);
}

/* cpu_bank.c (cpu_bank_bytes): values are fp32 whatever the format (bf16-rounded or int4 codes as floats); int4 adds
 * fp32 scales per (row, 128-group), e4m3-tensor one fp32 per matrix; cpu_bank_e4m3b.c: e4m3-block keeps the e4m3
 * bytes and an fp32 scale per (row, 128-group) */
static size_t cpu_bank_bytes(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    if (n < 0 || rows < 0 || cols < 0) return 0;
    fm_sz s = {false};
    const uint64_t nr = fm_sz_mul(&s, (uint64_t)n, (uint64_t)rows), groups = fm_sz_ceil_div((uint64_t)cols, GROUP);
    uint64_t bytes = fm_sz_mul(&s, fm_sz_mul(&s, nr, (uint64_t)cols), 4);
    if (fm_wformat_is_int4(fmt)) bytes = fm_sz_add(&s, bytes, fm_sz_mul(&s, fm_sz_mul(&s, nr, groups), 4));
    else if (fmt == FM_W_E4M3_PT) bytes = fm_sz_add(&s, bytes, fm_sz_mul(&s, (uint64_t)n, 4));
    else if (fmt == FM_W_E4M3_B128) bytes = fm_sz_mul(&s, nr, fm_sz_add(&s, (uint64_t)cols, fm_sz_mul(&s, groups, 4)));
    else if (fmt != FM_W_F32 && fmt != FM_W_BF16) return 0;
    return fm_sz_size(&s, bytes);
}

/* backend/int4zp_host.c: codes ceil(K/2) bytes a row, a zero byte and an fp32 scale per (row, group), an int32 input
 * order per act-order matrix */
static size_t cpu_bank_bytes_int4zp(bool fp8_plan, int32_t n, int64_t rows, int64_t cols, int64_t group,
                                    bool act_order) {
    (void)fp8_plan;
    if (n < 0 || rows < 0 || cols < 0 || group <= 0) return 0;
    fm_sz s = {false};
    const uint64_t nr = fm_sz_mul(&s, (uint64_t)n, (uint64_t)rows);
    const uint64_t groups = fm_sz_ceil_div((uint64_t)cols, (uint64_t)group);
    const uint64_t order = act_order ? fm_sz_mul(&s, fm_sz_mul(&s, (uint64_t)n, (uint64_t)cols), 4) : 0;
    const uint64_t codes = fm_sz_mul(&s, nr, fm_sz_ceil_div((uint64_t)cols, 2));
    return fm_sz_size(&s, fm_sz_add(&s, fm_sz_add(&s, codes, fm_sz_mul(&s, fm_sz_mul(&s, nr, groups), 5)), order));
}

/* cpu_bank.c quantizes an int4 bank a matrix at a time through int8 codes */
static size_t cpu_bank_staging(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    (void)n;
    fm_sz s = {false};
    return fm_wformat_is_int4(fmt) ? fm_sz_size(&s, fm_sz_mul(&s, (uint64_t)rows, (uint64_t)cols)) : 0;
}

/* cpu_linear.c: qv [M, K] + qs [M, ceil(K/128)] fp32 per call; the widest K among the projections run */
static void cpu_workspace(const fm_config *c, const fm_plan *plan, const fm_routes *routes, int32_t n_layers,
                          int64_t tokens, fm_backend_ws *out) {
    (void)plan, (void)routes;
    fm_sz s = {false};
    const uint64_t T = (uint64_t)tokens, K = (uint64_t)fm_arch_widest_dense_k(c, n_layers);
    *out = (fm_backend_ws){0};
    out->linear =
        fm_sz_size(&s, fm_sz_mul(&s, fm_sz_mul(&s, T, fm_sz_add(&s, K, fm_sz_ceil_div(K, GROUP))), sizeof(float)));
    out->overflow = s.ovf;
}

static uint64_t cpu_ep_workspace(const fm_config *c, const fm_plan *plan, int64_t T, int32_t N) {
    (void)c, (void)plan, (void)T, (void)N;
    return 0;
}

/* cpu_expert_cache.c: the slot ids of the largest pass, tokens x top-k int32 */
static size_t cpu_expert_cache_bytes(int32_t n_layers, int32_t E, int32_t S, int64_t tokens, int32_t top_k) {
    (void)n_layers, (void)E, (void)S;
    fm_sz s = {false};
    return fm_sz_size(&s, fm_sz_mul(&s, fm_sz_mul(&s, (uint64_t)tokens, (uint64_t)top_k), 4));
}

/* cpu_backend.c (declared in cpu_internal.h too, whose cpu_bank_bytes is not this file's) */
void cpu_set_routes(fm_backend *be, const fm_routes *r);

static fm_status cpu_create(const fm_plan *plan, int32_t n_threads, const char *routes, fm_backend **out,
                            fm_error *err) {
    /* one kernel per op: the routes are only checked, but for w4a8.kernel=fold and moe.act_scale=token, whose
       per-token activations into the experts' gate|up GEMM change the arithmetic: the cpu backend emulates them
       (cpu_moe.c) where the experts take e4m3 rows; fold with an FP4 dispatch refused, as the GPU refuses it */
    fm_routes r;
    fm_routes_default(&r, 0);
    fm_status st = fm_routes_apply(&r, routes, err);
    if (!st && fm_routes_w4a8_fold(&r) && (plan->a_dispatch == FM_A_MXFP4 || plan->a_dispatch == FM_A_NVFP4))
        st = fm_fail(err, FM_ERR_UNSUPPORTED,
                     "route w4a8.kernel=fold reads e4m3 activations; --dispatch %s is not built for it: use --dispatch "
                     "fp8",
                     fm_afmt_name(plan->a_dispatch));
    if (!st) st = fm_cpu_backend_create(plan, n_threads, out, err);
    if (!st) cpu_set_routes(*out, &r);
    return st;
}

const fm_backend_kind fm_backend_kind_cpu = {
    .name = "cpu",
    .on_device = false,
    .host_ordered = true,
    .host_experts_built_on_device = false,
    .host_expert_format = FM_W_F32,
    .ep_plan_ok = NULL,
    .act_size = cpu_act_size,
    .kv_e4m3_codes = false,
    .bank_bytes = cpu_bank_bytes,
    .bank_bytes_int4zp = cpu_bank_bytes_int4zp,
    .bank_staging = cpu_bank_staging,
    .workspace = cpu_workspace,
    .ep_workspace = cpu_ep_workspace,
    .expert_cache_bytes = cpu_expert_cache_bytes,
    .side_stream_libs = 0,
    .free_memory = NULL,
    .device_query = NULL,
    .create = cpu_create,
};
