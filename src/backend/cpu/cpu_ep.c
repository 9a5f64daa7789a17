/* Expert parallelism's dispatch, combine and amax on the CPU backend (backend.h: ep_dispatch, ep_combine, amax; the
 * blocks: backend/ep_blocks.h). The reference the GPU's kernels are tested against. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/dispatch_row.h"
#include "backend/ep_blocks.h"
#include "quant/e2m1.h"

void cpu_amax(fm_backend *be, const void *x, int64_t n, void *out) {
    (void)be;
    *(float *)out = fm_nvfp4_amax((const float *)x, n);
}

void cpu_ep_dispatch(fm_backend *be, const fm_ep_layout *L, const void *xv, int64_t T, const void *idsv,
                     const void *amaxes, void *sendv, void *ret_rowv) {
    (void)be;
    const float tensor_scale = fm_ep_nvfp4_scale(L, (const float *)amaxes);
    const float *x = (const float *)xv;
    const int32_t *ids = (const int32_t *)idsv;
    uint8_t *send = (uint8_t *)sendv;
    int32_t *ret_row = (int32_t *)ret_rowv;
    const int32_t el = L->n_experts / L->n_ranks, k = L->k;
    int32_t rows[FM_EP_MAX_RANKS] = {0};
    /* each routed copy, in (token, j) order, to the block of its expert's rank */
    for (int64_t p = 0; p < T * k; p++) {
        const int32_t e = ids[p], d = e / el, i = rows[d]++, local = e - d * el;
        uint8_t *b = send + (size_t)d * L->dblock;
        memcpy(b + L->ids_at + 4 * (size_t)i, &local, 4);
        fm_dispatch_row_encode(x + (p / k) * L->H, L->H, L->fmt, L->act_bf16, tensor_scale,
                               b + L->rows_at + (size_t)i * L->row_d);
        ret_row[p] = (int32_t)(d * L->cap + i);
    }
    for (int32_t d = 0; d < L->n_ranks; d++) {
        uint8_t *b = send + (size_t)d * L->dblock;
        memcpy(b, &rows[d], 4);
        memset(b + 4, 0, FM_EP_HEADER - 4);
    }
}

/* as cpu_moe combines: acc += w y in routing order, then the activation rounding of the plan */
void cpu_ep_combine(fm_backend *be, const fm_ep_layout *L, const void *yrecvv, const void *ret_rowv,
                    const void *weightsv, int64_t T, void *outv) {
    const uint8_t *yrecv = (const uint8_t *)yrecvv;
    const int32_t *ret_row = (const int32_t *)ret_rowv;
    const float *w = (const float *)weightsv;
    float *out = (float *)outv;
    const int64_t H = L->H;
    const int32_t k = L->k;
#pragma omp parallel
    {
        float *y = (float *)malloc((size_t)H * sizeof *y);
        if (!y) abort();
#pragma omp for
        for (int64_t t = 0; t < T; t++) {
            float *acc = out + t * H;
            for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
            for (int32_t j = 0; j < k; j++) {
                const int64_t p = t * k + j;
                fm_dispatch_row_decode_native(yrecv + (size_t)ret_row[p] * L->row_r, H, L->act_bf16, y);
                for (int64_t i = 0; i < H; i++) acc[i] += w[p] * y[i];
            }
        }
        free(y);
    }
    cpu_round_act(be, out, T * H);
}
