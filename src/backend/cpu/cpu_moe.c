/* Routing and the expert FFN of the CPU reference.
 * Routing per token: Qwen3 takes an fp32 softmax over all experts, the top-k, and renormalises the k when
 * norm_topk_prob; Mixtral takes the top-k logits and a softmax over those k. Ties pick the lower index. Qwen3-Next
 * with its shared expert in the bank (FM_ROUTER_SOFTMAX_TOPK_SHARED): Qwen3's top-(k - 1) of the first E - 1 experts,
 * then the shared expert E - 1 weighted by the sigmoid of its logit (transformers' sigmoid(shared_expert_gate x)).
 * The expert FFN runs one routed (token, expert) pair at a time (the per-token dispatch the GPU baseline
 * does): gate|up projection, SwiGLU, down projection, weighted sum in fp32. */
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/dispatch_row.h"
#include "backend/ep_blocks.h"
#include "backend/routes.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"

/* indices of the k largest values of v[0..n), in descending order (stable: lower index first on ties) */
static void top_k(const float *v, int32_t n, int32_t k, int32_t *idx) {
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[j] = best;
    }
}

void cpu_route(fm_backend *be, const void *logitsv, int64_t T, int32_t E, int32_t k, fm_router_kind kind,
               bool norm_topk, void *idsv, void *weightsv) {
    const float *logits = (const float *)logitsv;
    int32_t *ids = (int32_t *)idsv;
    float *w = (float *)weightsv;
#pragma omp parallel
    {
        float *p = (float *)malloc((size_t)E * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            const float *l = logits + t * E;
            int32_t *id = ids + t * k;
            float *wt = w + t * k;
            float mx = -INFINITY, sum = 0.0f;
            if (kind == FM_ROUTER_SOFTMAX_TOPK || kind == FM_ROUTER_SOFTMAX_TOPK_SHARED) {
                /* with the shared expert in the bank, its logit (the last) is no candidate: its own pair comes last */
                const int32_t shared = kind == FM_ROUTER_SOFTMAX_TOPK_SHARED, En = E - shared, kn = k - shared;
                for (int32_t e = 0; e < En; e++) mx = l[e] > mx ? l[e] : mx;
                for (int32_t e = 0; e < En; e++) sum += (p[e] = expf(l[e] - mx));
                for (int32_t e = 0; e < En; e++) p[e] /= sum;
                top_k(p, En, kn, id);
                float s = 0.0f;
                for (int32_t j = 0; j < kn; j++) s += (wt[j] = p[id[j]]);
                if (norm_topk)
                    for (int32_t j = 0; j < kn; j++) wt[j] /= s;
                if (shared) id[kn] = En, wt[kn] = 1.0f / (1.0f + expf(-l[En]));
            } else {
                top_k(l, E, k, id);
                mx = l[id[0]];
                for (int32_t j = 0; j < k; j++) sum += (wt[j] = expf(l[id[j]] - mx));
                for (int32_t j = 0; j < k; j++) wt[j] /= sum;
            }
        }
        free(p);
    }
    cpu_round_act(be, w, T * k);
}

/* Routes w4a8.kernel=fold and moe.act_scale=token: the row in e4m3 with one scale per token (backend/w4a8_fold.h),
 * held as every 128-group's scale of the row, as the GPU's dispatch writes it for moe.act_scale (the products and
 * their sums are the GEMMs' up to fp32 rounding) */
static void quantize_row_token(const float *x, int64_t K, cpu_qrow *q) {
    uint8_t *codes = (uint8_t *)malloc((size_t)K);
    float s = 0.0f;
    fm_e4m3_quantize_groups(x, K, (int32_t)K, codes, &s);
    for (int64_t k = 0; k < K; k++) q->val[k] = fm_e4m3_to_f32(codes[k]);
    for (int64_t g = 0; g < (K + FM_CPU_GROUP - 1) / FM_CPU_GROUP; g++) q->scale[g] = s;
    free(codes);
}

/* Expert e's FFN on one quantized input row: gate|up, SwiGLU, the down input quantized as a_down (h_token: e4m3
 * with one scale per token, as the fold route's warp-specialised GEMMs take it: fm_routes_fold_ws), down; every
 * product's output rounded to the activation dtype. Scratch: gu [2I], h [I], hq [I + groups]; y [H]. */
static void expert_ffn(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const cpu_qrow *xr, int32_t e,
                       fm_afmt a_down, bool h_token, float *gu, float *h, float *hq, float *y) {
    const int64_t H = gate_up->cols, I = down->cols;
    cpu_linear_row(gate_up, e, xr, gu);
    cpu_round_act(be, gu, 2 * I);
    for (int64_t i = 0; i < I; i++) h[i] = gu[i] / (1.0f + expf(-gu[i])) * gu[I + i];
    cpu_round_act(be, h, I);
    cpu_qrow hr = {hq, hq + I, 1.0f};
    if (h_token) quantize_row_token(h, I, &hr);
    else cpu_quantize_row(h, I, a_down, &hr);
    cpu_linear_row(down, e, &hr, y);
    cpu_round_act(be, y, H);
}

void cpu_moe(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *xv, int64_t T, const void *idsv,
             const void *weightsv, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *outv) {
    const float *x = (const float *)xv;
    const int32_t *ids = (const int32_t *)idsv;
    const float *w = (const float *)weightsv;
    float *out = (float *)outv;
    const int64_t H = gate_up->cols, I = down->cols, G = FM_CPU_GROUP;
    /* NVFP4 dispatch: one fp32 scale for the whole buffer of routed rows, whose amax is x's (every row of x is routed
       to k experts: the buffer holds k copies of each) */
    const float nv_scale = a_dispatch == FM_A_NVFP4 ? fm_nvfp4_tensor_scale(x, T * H) : 1.0f;
    if (a_down == FM_A_NVFP4) abort(); /* the down input is never FP4 (fm_plan_set_dispatch) */
    const bool e4m3 = a_dispatch == FM_A_E4M3_G128;
    const bool per_token = e4m3 && (cpu_fold_tokens(be) ||
                                    fm_routes_moe_token_scales(cpu_routes(be), (uint64_t)(T * k), (uint64_t)gate_up->n,
                                                               (uint64_t)k, gate_up->fmt, down->fmt, true));
    const bool h_token = e4m3 && a_down == FM_A_E4M3_G128 &&
                         fm_routes_fold_ws(cpu_routes(be), (uint64_t)(T * k), (uint64_t)gate_up->n, (uint64_t)k);
#pragma omp parallel
    {
        /* per-thread scratch: quantized input row, gate|up, SwiGLU output (quantized), expert output, sum */
        float *xq = (float *)malloc((size_t)(H + (H + G - 1) / G) * sizeof(float));
        float *gu = (float *)malloc((size_t)(2 * I) * sizeof(float));
        float *h = (float *)malloc((size_t)I * sizeof(float));
        float *hq = (float *)malloc((size_t)(I + (I + G - 1) / G) * sizeof(float));
        float *y = (float *)malloc((size_t)H * sizeof(float));
        float *acc = (float *)malloc((size_t)H * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < T; t++) {
            cpu_qrow xr = {xq, xq + H, 1.0f};
            if (a_dispatch == FM_A_NVFP4) cpu_quantize_row_nvfp4(x + t * H, H, nv_scale, &xr);
            else if (per_token) quantize_row_token(x + t * H, H, &xr);
            else cpu_quantize_row(x + t * H, H, a_dispatch, &xr);
            for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
            for (int32_t j = 0; j < k; j++) {
                expert_ffn(be, gate_up, down, &xr, ids[t * k + j], a_down, h_token, gu, h, hq, y);
                const float wj = w[t * k + j];
                for (int64_t i = 0; i < H; i++) acc[i] += wj * y[i];
            }
            for (int64_t i = 0; i < H; i++) out[t * H + i] = acc[i];
        }
        free(xq), free(gu), free(h), free(hq), free(y), free(acc);
    }
    cpu_round_act(be, out, T * H);
}

/* What a rank received (expert parallelism): each row of the dispatch blocks, decoded as cpu_quantize_row (or
 * _nvfp4) makes it from the values its codes came from, through its expert; the output in the activation format in
 * the row's place of the return blocks (backend/ep_blocks.h). */
void cpu_moe_blocks(fm_backend *be, const fm_ep_layout *L, const fm_bank *gate_up, const fm_bank *down,
                    const void *recvv, const void *amaxes, fm_afmt a_down, void *yretv) {
    const float tensor_scale = fm_ep_nvfp4_scale(L, (const float *)amaxes);
    const uint8_t *recv = (const uint8_t *)recvv;
    uint8_t *yret = (uint8_t *)yretv;
    const int64_t H = gate_up->cols, I = down->cols, G = FM_CPU_GROUP, rows = L->n_ranks * L->cap;
    const bool bf16 = be->plan.act_bf16;
    const fm_afmt fmt = L->fmt;
#pragma omp parallel
    {
        float *xq = (float *)malloc((size_t)(H + (H + G - 1) / G) * sizeof(float));
        float *gu = (float *)malloc((size_t)(2 * I) * sizeof(float));
        float *h = (float *)malloc((size_t)I * sizeof(float));
        float *hq = (float *)malloc((size_t)(I + (I + G - 1) / G) * sizeof(float));
        float *y = (float *)malloc((size_t)H * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t q = 0; q < rows; q++) {
            const uint8_t *b = recv + (size_t)(q / L->cap) * L->dblock;
            const int64_t i = q % L->cap;
            int32_t n, e;
            memcpy(&n, b, 4);
            if (i >= n) continue;
            memcpy(&e, b + L->ids_at + 4 * i, 4);
            const uint8_t *row = b + L->rows_at + (size_t)i * L->row_d;
            cpu_qrow xr = {xq, xq + H, 1.0f};
            if (fmt == FM_A_NATIVE) {
                fm_dispatch_row_decode_native(row, H, bf16, xq);
                xr.scale = NULL;
            } else if (fmt == FM_A_E4M3_G128) {
                for (int64_t c = 0; c < H; c++) xq[c] = fm_e4m3_to_f32(row[c]);
                memcpy(xr.scale, row + H, (size_t)((H + G - 1) / G) * sizeof(float));
            } else {
                cpu_expand_fp4_row(row, row + (H + 1) / 2, H, fmt == FM_A_NVFP4, tensor_scale, &xr);
            }
            expert_ffn(be, gate_up, down, &xr, e, a_down, false, gu, h, hq, y); /* the GPU: the fold GEMM */
            fm_dispatch_row_encode(y, H, FM_A_NATIVE, bf16, 1.0f, yret + (size_t)q * L->row_r);
        }
        free(xq), free(gu), free(h), free(hq), free(y);
    }
}
