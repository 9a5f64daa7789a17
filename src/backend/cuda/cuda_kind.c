/* The cuda backend's kind (backend_kind.h): bf16 activations (fp32 under ref32), device memory, a stream with a side
 * stream beside it. Plain C, built with or without nvcc: the memory plan is asked on any machine. Each figure restates
 * an allocation of this folder; keep them in step (tests/gpu/test_cuda_memory.c compares them with the device):
 *   bank bytes      cuda_bank.cu (fm_cuda_bank_create: ld, n_groups, w->bytes + scale_bytes), cuda_bank_prequant.cu
 *   workspace       moe_per_token.cu, moe_w4a8.cu (w4a8_workspace.h), moe_grouped_cublas.cu
 *                   (moe_grouped_workspace.h), gdn_chunked_tc.cu (gdn_workspace.h), linear_w8a8.cu,
 *                   cuda_backend.cu (cu_reserve: cuBLAS's workspace)
 *   load staging    cuda_bank.cu (STAGING_BYTES) */
#include "backend/backend_kind.h"
#include "backend/expert_residency.h"
#include "backend/gdn_workspace.h"
#include "backend/moe_grouped_workspace.h"
#include "backend/size_math.h"
#include "backend/w4a8_workspace.h"
#include "model/arch.h"

#define GROUP 128                               /* int4 scale group along K (FM_CUDA_GROUP) */
#define STAGING_BYTES ((size_t)64 << 20)        /* cuda_bank.cu: one upload staging buffer per bank */
#define CUBLAS_WS_BYTES ((size_t)32 << 20)      /* cuda_internal.cuh FM_CUDA_CUBLAS_WS: cuBLAS's workspace */
#define LT_WS_BYTES ((size_t)32 << 20)          /* cublaslt_fp8.cu LT_WORKSPACE: cuBLASLt's, with the first W8A8 bank */
#define SIDE_CUBLAS_WS_BYTES ((size_t)32 << 20) /* cuda_internal.cuh FM_CUDA_SIDE_CUBLAS_WS */

static size_t cuda_act_size(const fm_plan *plan) { return plan->act_bf16 ? 2 : 4; }

/* cuda_bank.cu: bf16 ld = round_up(cols, 8) elements, f32 round_up(cols, 4) (the ref32 oracle); int4 ld =
 * round_up(cols, 32) / 2 bytes plus bf16 scales [n][rows][ceil(cols / 128)] in an allocation of their own */
static size_t cuda_bank_bytes(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    if (n < 0 || rows < 0 || cols < 0) return 0;
    fm_sz st = {false}, *s = &st;
    const uint64_t nr = fm_sz_mul(s, (uint64_t)n, (uint64_t)rows), groups = fm_sz_ceil_div((uint64_t)cols, GROUP);
    const uint64_t nrp = fm_sz_mul(s, (uint64_t)n, fm_sz_ceil_div((uint64_t)rows, 32) * 32); /* rows padded to 32 */
    uint64_t bytes = 0;
    if (fmt == FM_W_BF16) bytes = fm_sz_mul(s, fm_sz_mul(s, nr, fm_sz_ceil_div((uint64_t)cols, 8) * 8), 2);
    else if (fmt == FM_W_F32) bytes = fm_sz_mul(s, fm_sz_mul(s, nr, fm_sz_ceil_div((uint64_t)cols, 4) * 4), 4);
    else if (fmt == FM_W_INT4_G128)
        bytes = fm_sz_add(s, fm_sz_mul(s, nr, fm_sz_ceil_div((uint64_t)cols, 32) * 32 / 2),
                          fm_sz_mul(s, fm_sz_mul(s, nr, groups), 2));
    else if (fmt == FM_W_INT4_G128_TC) /* w4a8_layout.cuh: K padded to 128, half a byte each, bf16 scales */
        bytes = fm_sz_add(s, fm_sz_mul(s, nrp, groups * GROUP / 2), fm_sz_mul(s, fm_sz_mul(s, nrp, groups), 2));
    else if (fmt == FM_W_E4M3_PT) /* e4m3 rows padded to 16 bytes, one fp32 scale per matrix in a 16-byte slot */
        bytes = fm_sz_add(s, fm_sz_mul(s, nr, fm_sz_ceil_div((uint64_t)cols, 16) * 16), fm_sz_mul(s, (uint64_t)n, 16));
    else if (fmt == FM_W_E4M3_B128) /* cuda_bank_prequant.cu: the e4m3 bytes, K padded to 128, an fp32 scale per
                                       (padded row, 128-group) */
        bytes = fm_sz_add(s, fm_sz_mul(s, nrp, groups * GROUP), fm_sz_mul(s, fm_sz_mul(s, nrp, groups), 4));
    else return 0;
    return fm_sz_size(s, bytes);
}

/* cuda_bank_prequant.cu:
 *   fp8 plans    int4-zp-tc: codes rows_pad(32) x pad128(K)/2 bytes, two fp32 per (padded row, 128-group): scale * 512
 *                and zero * scale (the W4A8 kernels' form: (u - z) * s folded as u * s - z * s); no order
 *   int4 preset  codes rows x round_up(K, 32) / 2 bytes, a zero byte and an fp32 scale per (row, group), an int32
 *                order per act-order matrix */
static size_t cuda_bank_bytes_int4zp(bool fp8_plan, int32_t n, int64_t rows, int64_t cols, int64_t group,
                                     bool act_order) {
    if (n < 0 || rows < 0 || cols < 0 || group <= 0) return 0;
    fm_sz st = {false}, *s = &st;
    if (fp8_plan) {
        const uint64_t nrp = fm_sz_mul(s, (uint64_t)n, fm_sz_ceil_div((uint64_t)rows, 32) * 32);
        const uint64_t g128 = fm_sz_ceil_div((uint64_t)cols, GROUP);
        return fm_sz_size(s,
                          fm_sz_add(s, fm_sz_mul(s, nrp, g128 * GROUP / 2), fm_sz_mul(s, fm_sz_mul(s, nrp, g128), 8)));
    }
    const uint64_t nr = fm_sz_mul(s, (uint64_t)n, (uint64_t)rows);
    const uint64_t groups = fm_sz_ceil_div((uint64_t)cols, (uint64_t)group);
    const uint64_t order = act_order ? fm_sz_mul(s, fm_sz_mul(s, (uint64_t)n, (uint64_t)cols), 4) : 0;
    const uint64_t codes = fm_sz_mul(s, nr, fm_sz_ceil_div((uint64_t)cols, 32) * 32 / 2);
    return fm_sz_size(s, fm_sz_add(s, fm_sz_add(s, codes, fm_sz_mul(s, fm_sz_mul(s, nr, groups), 5)), order));
}

/* cuda_bank.cu: every bank uploads through one staging buffer; a tensor-core bank is quantized in the row layout
 * first, then repacked (both alive briefly); an e4m3-tensor matrix is first converted whole to fp32 (its amax sets
 * the scale) */
static size_t cuda_bank_staging(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols) {
    fm_sz s = {false};
    uint64_t staging = STAGING_BYTES;
    if (fmt == FM_W_INT4_G128_TC) {
        const size_t row_layout = cuda_bank_bytes(FM_W_INT4_G128, n, rows, cols);
        if (row_layout == SIZE_MAX) s.ovf = true;
        staging = fm_sz_add(&s, staging, row_layout);
    }
    if (fmt == FM_W_E4M3_PT)
        staging = fm_sz_add(&s, staging, fm_sz_mul(&s, fm_sz_mul(&s, (uint64_t)rows, (uint64_t)cols), 4));
    return fm_sz_size(&s, staging);
}

static void cuda_workspace(const fm_config *c, const fm_plan *plan, const fm_routes *routes, int32_t n_layers,
                           int64_t tokens, fm_backend_ws *out) {
    fm_sz st = {false}, *s = &st;
    *out = (fm_backend_ws){0};
    const uint64_t T = (uint64_t)tokens, H = (uint64_t)c->hidden_size;
    bool any_moe = false, gdn = false;
    for (int32_t l = 0; l < n_layers; l++) any_moe |= c->layer_is_moe[l], gdn |= c->layer_is_gdn[l];
    /* the widest input of the dense linears (attention projections, dense MLP) among the layers loaded */
    const uint64_t K_dense = (uint64_t)fm_arch_widest_dense_k(c, n_layers);
    if (plan->w_expert == FM_W_INT4_G128_TC || plan->w_dense == FM_W_INT4_G128_TC) {
        /* moe_w4a8.cu: the moe op and the W4A8 linear share the backend's one scratch buffer (w4a8_workspace.h); the
           widest linear input is the attention output, the hidden state or the dense MLP width */
        uint64_t ws = 0;
        if (any_moe) {
            const uint64_t P = T * (uint64_t)c->n_experts_per_tok, E = (uint64_t)c->n_experts;
            ws = fm_w4a8_moe_layout(T, (uint64_t)c->n_experts_per_tok, E, H, (uint64_t)c->moe_intermediate,
                                    fm_routes_w4a8_tile_rows(routes, P, E), fm_w4a8_dispatch_of(plan->a_dispatch),
                                    fm_routes_fold_ws(routes, P, E, (uint64_t)c->n_experts_per_tok))
                     .total;
        }
        const uint64_t lin = fm_w4a8_linear_ws_bytes(T, K_dense);
        if (T > (1ull << 32)) s->ovf = true; /* the layout's products stay far below 2^64 under this bound */
        out->moe = fm_sz_size(s, ws > lin ? ws : lin);
    } else if (any_moe && fm_wformat_is_int4(plan->w_expert)) {
        /* moe_per_token.cu: P = T * k pairs x (2I gate|up + I swiglu + H down out), bf16 */
        const uint64_t P = fm_sz_mul(s, T, (uint64_t)c->n_experts_per_tok), I = (uint64_t)c->moe_intermediate;
        out->moe = fm_sz_size(s, fm_sz_mul(s, fm_sz_mul(s, P, fm_sz_add(s, fm_sz_mul(s, 3, I), H)), 2));
    } else if (any_moe) {
        /* moe_grouped_cublas.cu (bf16 or f32 banks): moe_grouped_workspace.h's layout, pairs in equal tiles */
        const uint64_t P = fm_sz_mul(s, T, (uint64_t)c->n_experts_per_tok);
        if (T > (1ull << 32)) s->ovf = true; /* the layout's products stay far below 2^64 under this bound */
        out->moe = fm_sz_size(
            s,
            fm_grouped_layout(P, (uint64_t)c->n_experts, H, (uint64_t)c->moe_intermediate, cuda_act_size(plan)).total);
    }
    if (plan->w_dense == FM_W_E4M3_PT) {
        /* linear_w8a8.cu (fm_w8a8_linear_ws_bytes): the scale slot and the e4m3 input, rows padded to 16 bytes, in the
           backend's one scratch buffer (the moe op uses it at other times); plus cuBLASLt's own workspace (cublaslt_
           fp8.cu, allocated with the first W8A8 bank) */
        const size_t lin8 = fm_sz_size(s, fm_sz_add(s, fm_sz_mul(s, T, fm_sz_ceil_div(K_dense, 16) * 16), 256));
        if (lin8 > out->moe) out->moe = lin8;
        out->libs = LT_WS_BYTES;
    }
    /* gdn_chunked_tc.cu: the chunked Gated DeltaNet's scratch of one segment (gdn_workspace.h), in the backend's one
       scratch buffer (no other op uses it at the same time) */
    if (gdn && fm_routes_gdn_tc(routes, c->gdn_k_dim, c->gdn_v_dim, plan->act_bf16)) {
        const size_t g = fm_sz_size(s, fm_gdn_tc_ws_bytes(T, (uint64_t)c->gdn_v_heads));
        if (g > out->moe) out->moe = g;
    }
    /* cuda_backend.cu cu_reserve: cuBLAS's workspace, given to it at load so that no GEMM allocates during a forward
       pass. The logits download needs no device staging (bf16 widened on the host) */
    out->libs += CUBLAS_WS_BYTES;
    /* the side stream (route shared.stream): the shared expert's linears of up to `rows` rows, inputs H and the shared
       width, in scratch of their own (W4A8: w4a8_workspace.h; W8A8: the scale slot and the e4m3 rows; at least the
       256-byte slot), and the stream's cuBLAS workspace */
    const int64_t rows = fm_routes_shared_stream_rows(routes, (int64_t)T);
    if (c->shared_expert_intermediate > 0 && any_moe && rows > 0) {
        const uint64_t R = (uint64_t)rows, I = (uint64_t)c->shared_expert_intermediate, K = H > I ? H : I;
        uint64_t side = fm_sz_add(s, fm_sz_mul(s, R, fm_sz_ceil_div(K, 16) * 16), 256);
        if (plan->w_dense == FM_W_INT4_G128_TC) {
            const uint64_t w4 = fm_w4a8_linear_ws_bytes(R, K);
            side = w4 > side ? w4 : side;
        }
        out->side = fm_sz_size(s, side);
        out->libs += SIDE_CUBLAS_WS_BYTES;
    }
    /* cuda_bank_fold.cu: under w4a8.kernel=fold each int4-tc expert bank keeps an exponent byte per (padded row,
       128-group) and an fp32 row scale per padded row (gate|up: 2I rows over H; down: H rows over I) */
    if (any_moe && fm_routes_w4a8_fold(routes) && plan->w_expert == FM_W_INT4_G128_TC) {
        const uint64_t I = (uint64_t)c->moe_intermediate, E = (uint64_t)c->n_experts;
        const uint64_t gu = fm_sz_mul(s, fm_sz_ceil_div(2 * I, 32) * 32, fm_sz_ceil_div(H, GROUP) + 4);
        const uint64_t dn = fm_sz_mul(s, fm_sz_ceil_div(H, 32) * 32, fm_sz_ceil_div(I, GROUP) + 4);
        int32_t moe_layers = 0;
        for (int32_t l = 0; l < n_layers; l++) moe_layers += c->layer_is_moe[l] ? 1 : 0;
        out->tables = fm_sz_size(s, fm_sz_mul(s, fm_sz_mul(s, fm_sz_add(s, gu, dn), E), (uint64_t)moe_layers));
    }
    out->overflow = st.ovf;
}

/* moe_dispatch.cu with moe_w4a8.cu or moe_grouped_cublas.cu: the blocks a rank receives, in the ops' scratch */
static uint64_t cuda_ep_workspace(const fm_config *c, const fm_plan *plan, int64_t T, int32_t N) {
    const uint64_t k = (uint64_t)c->n_experts_per_tok, E = (uint64_t)c->n_experts;
    const uint64_t H = (uint64_t)c->hidden_size, I = (uint64_t)c->moe_intermediate;
    return plan->a_dispatch == FM_A_NATIVE /* the cuBLAS experts of ref and ref32 */
               ? fm_grouped_ep_ws_bytes((uint64_t)T, k, E, (uint64_t)N, H, I, plan->act_bf16 ? 2 : 4)
               : fm_w4a8_ep_ws_bytes((uint64_t)T, k, E, (uint64_t)N, H, I, fm_w4a8_dispatch_of(plan->a_dispatch));
}

/* expert_cache.cu: the device table (backend/expert_residency.h), as large as it can be (a slot per expert: a few
 * hundred KiB at most) */
static size_t cuda_expert_cache_bytes(int32_t n_layers, int32_t E, int32_t S, int64_t tokens, int32_t top_k) {
    (void)tokens, (void)top_k;
    return fm_expert_device_table_bytes(n_layers, E, S);
}

/* expert parallelism's ops (moe_dispatch.cu, moe_w4a8.cu, moe_grouped_cublas.cu) carry e4m3, MXFP4 or NVFP4 rows
 * into the W4A8 grouped GEMMs (the fp8 and fp4 presets) and the activations' own rows into the cuBLAS grouped GEMMs
 * (ref, ref32); the int4 preset's per-token baseline has none */
static bool cuda_ep_plan_ok(const fm_plan *plan) {
    const fm_afmt d = plan->a_dispatch;
    const bool w4a8 = plan->preset == FM_PRESET_FP8 || plan->preset == FM_PRESET_FP4;
    if (w4a8 && plan->act_bf16 && (d == FM_A_E4M3_G128 || d == FM_A_MXFP4 || d == FM_A_NVFP4)) return true;
    return (plan->preset == FM_PRESET_REF || plan->preset == FM_PRESET_REF32) && d == FM_A_NATIVE;
}

static fm_status cuda_create(const fm_plan *plan, int32_t n_threads, const char *routes, fm_backend **out,
                             fm_error *err) {
    (void)n_threads;
    return fm_cuda_backend_create(plan, routes, out, err);
}

const fm_backend_kind fm_backend_kind_cuda = {
    .name = "cuda",
    .on_device = true,
    .host_ordered = false,
    .host_experts_built_on_device = true,
    .host_expert_format = FM_W_INT4_G128_TC, /* expert_cache.cu: the fp8 and fp4 presets' experts */
    .ep_plan_ok = cuda_ep_plan_ok,
    .act_size = cuda_act_size,
    .kv_e4m3_codes = true,
    .bank_bytes = cuda_bank_bytes,
    .bank_bytes_int4zp = cuda_bank_bytes_int4zp,
    .bank_staging = cuda_bank_staging,
    .workspace = cuda_workspace,
    .ep_workspace = cuda_ep_workspace,
    .expert_cache_bytes = cuda_expert_cache_bytes,
    .side_stream_libs = SIDE_CUBLAS_WS_BYTES,
    .free_memory = fm_cuda_free_memory,
    .device_query = fm_cuda_device_query,
    .create = cuda_create,
};
