/* CPU reference backend: the op table and its memory (plain host memory). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/routes.h"
#include "quant/bf16.h"
#include "util/status.h"

void cpu_round_act(const fm_backend *be, float *x, int64_t n) {
    if (be->plan.act_bf16) fm_round_bf16_array(x, n);
}

/* the CPU backend: the op table plus wall-clock marks for benchmarks */
typedef struct cpu_backend {
    fm_backend base;
    double marks[FM_MARK_SLOTS];
    /* the routes asked for (fm_routes_default with no GPU, then the overrides): the cpu backend runs one kernel per
       op, but emulates the routes that change the arithmetic (w4a8.kernel=fold, moe.act_scale) */
    fm_routes routes;
} cpu_backend;

void cpu_set_routes(fm_backend *be, const fm_routes *r) { ((cpu_backend *)be)->routes = *r; }
const fm_routes *cpu_routes(const fm_backend *be) { return &((const cpu_backend *)be)->routes; }
bool cpu_fold_tokens(const fm_backend *be) { return fm_routes_w4a8_fold(cpu_routes(be)); }

static void cpu_destroy(fm_backend *be) { free(be); }

static void cpu_mark(fm_backend *be, int32_t slot) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ((cpu_backend *)be)->marks[slot] = 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static double cpu_elapsed_ms(fm_backend *be, int32_t a, int32_t b) {
    return ((cpu_backend *)be)->marks[b] - ((cpu_backend *)be)->marks[a];
}

static const char *cpu_device_name(fm_backend *be) {
    (void)be;
    return "CPU (OpenMP)";
}
static void *cpu_alloc(fm_backend *be, size_t bytes) {
    (void)be;
    return malloc(bytes ? bytes : 1);
}
static void cpu_free(fm_backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_upload_ids(fm_backend *be, const int32_t *ids, int64_t n, void *dst) {
    (void)be;
    memcpy(dst, ids, (size_t)n * sizeof *ids);
}

static void cpu_copy(fm_backend *be, const void *src, size_t bytes, void *dst) {
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_copy_rows(fm_backend *be, const void *src, size_t src_pitch, void *dst, size_t dst_pitch,
                          size_t row_bytes, size_t rows) {
    (void)be;
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

static void cpu_upload_raw(fm_backend *be, const void *src, size_t bytes, void *dst) {
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_download_f32(fm_backend *be, const void *src, int64_t n, float *dst) {
    (void)be;
    memcpy(dst, src, (size_t)n * sizeof *dst);
}

static void cpu_upload_f32(fm_backend *be, const float *src, int64_t n, void *dst) {
    memcpy(dst, src, (size_t)n * sizeof *src);
    cpu_round_act(be, (float *)dst, n);
}

static void cpu_download_raw(fm_backend *be, const void *src, size_t bytes, void *dst) {
    (void)be;
    memcpy(dst, src, bytes);
}

static fm_status cpu_sync(fm_backend *be, fm_error *err) {
    (void)be, (void)err;
    return FM_OK;
}

/* the router: the two ops it is defined as */
static void cpu_router(fm_backend *be, const fm_bank *w, const void *x, int64_t T, int32_t k, fm_router_kind kind,
                       bool norm_topk, void *logits, void *ids, void *weights) {
    cpu_linear(be, w, 0, x, T, FM_A_NATIVE, logits);
    cpu_route(be, logits, T, (int32_t)w->rows, k, kind, norm_topk, ids, weights);
}

static const fm_backend_ops cpu_ops = {
    .name = "cpu",
    .act_size = sizeof(float),
    .kv_e4m3_codes = false, /* an e4m3 cache holds its codes' values in fp32 rows (cpu_attention.c) */
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload_ids = cpu_upload_ids,
    .download_f32 = cpu_download_f32,
    .upload_f32 = cpu_upload_f32,
    .download_raw = cpu_download_raw,
    .upload_raw = cpu_upload_raw,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .sync = cpu_sync,
    .mark = cpu_mark,
    .elapsed_ms = cpu_elapsed_ms,
    .device_name = cpu_device_name,
    .bank_create = cpu_bank_create,
    .bank_free = cpu_bank_free,
    .bank_bytes = cpu_bank_bytes,
    .bank_create_host = cpu_bank_create,
    .expert_cache_create = cpu_expert_cache_create,
    .expert_fetch = cpu_expert_fetch,
    .expert_prefetch = cpu_expert_prefetch,
    .expert_cache_stats = cpu_expert_cache_stats,
    .expert_cache_free = cpu_expert_cache_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .qk_norm_rope = cpu_qk_norm_rope,
    .attention = cpu_attention,
    .kv_store = cpu_kv_store,
    .qk_norm_rope_store = cpu_qk_norm_rope_store,
    .attention_paged = cpu_attention_paged,
    .attention_paged_runs = cpu_attention_paged, /* one kernel for every row: the reference of both */
    .route = cpu_route,
    .router = cpu_router,
    .moe = cpu_moe,
    .ep_dispatch = cpu_ep_dispatch,
    .moe_blocks = cpu_moe_blocks,
    .ep_combine = cpu_ep_combine,
    .amax = cpu_amax,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .add_rmsnorm = cpu_add_rmsnorm,
    .moe_add_rmsnorm = cpu_moe_add_rmsnorm,
    .linear_add_rmsnorm = cpu_linear_add_rmsnorm,
    .attention_paged_o = cpu_attention_paged_o,
    .sample = cpu_sample,
    .gated_qk_norm_rope = cpu_gated_qk_norm_rope,
    .sigmoid_mul = cpu_sigmoid_mul,
    .add_sigmoid_scaled = cpu_add_sigmoid_scaled,
    .add_sigmoid_gated = cpu_add_sigmoid_gated,
    .gdn_conv = cpu_gdn_conv,
    .gdn_chunked = cpu_gdn_chunked,
    .gdn_recurrent = cpu_gdn_recurrent,
    .gdn_norm_gate = cpu_gdn_norm_gate,
    .gdn_decode_fused = cpu_gdn_decode_fused,
};

fm_status fm_cpu_backend_create(const fm_plan *plan, int32_t n_threads, fm_backend **out, fm_error *err) {
    cpu_backend *cb = fm_calloc(1, sizeof *cb, err, "cpu backend");
    if (!cb) return FM_ERR_NOMEM;
    fm_backend *be = &cb->base;
    be->ops = &cpu_ops;
    be->plan = *plan;
    be->n_threads = n_threads;
    if (n_threads > 0) omp_set_num_threads(n_threads);
    *out = be;
    return FM_OK;
}
