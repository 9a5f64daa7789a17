/* The blocks of expert parallelism's all-to-alls (ep_blocks.h). */
#include "backend/ep_blocks.h"
#include "backend/dispatch_row.h"
#include "quant/e2m1.h"
#include "util/status.h"

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

fm_status fm_ep_layout_of(int32_t E, int32_t n_ranks, int64_t max_tokens, int32_t k, int64_t H, fm_afmt fmt,
                          bool act_bf16, fm_ep_layout *l, fm_error *err) {
    if (n_ranks < 1 || E % n_ranks)
        return fm_fail(err, FM_ERR_USAGE, "%d experts do not split over %d ranks (--ep must divide them)", E, n_ranks);
    const size_t row_d = fm_dispatch_row_bytes(fmt, act_bf16, H);
    if (!row_d) return fm_fail(err, FM_ERR_USAGE, "expert parallelism: %s is not a dispatch format", fm_afmt_name(fmt));
    l->n_ranks = n_ranks, l->n_experts = E, l->k = k, l->H = H, l->max_tokens = max_tokens,
    l->cap = (max_tokens * k + 7) / 8 * 8;
    l->fmt = fmt, l->act_bf16 = act_bf16;
    l->row_d = row_d, l->row_r = fm_dispatch_row_bytes(FM_A_NATIVE, act_bf16, H);
    l->ids_at = FM_EP_HEADER, l->rows_at = FM_EP_HEADER + round16((size_t)l->cap * 4);
    l->dblock = round16(l->rows_at + (size_t)l->cap * row_d);
    l->rblock = (size_t)l->cap * l->row_r; /* cap % 8 == 0: whole 16-byte units, and the return rows of all blocks
                                              are one array of n_ranks x cap rows */
    return FM_OK;
}

float fm_ep_nvfp4_scale(const fm_ep_layout *L, const float *amaxes) {
    if (L->fmt != FM_A_NVFP4) return 1.0f;
    float amax = 0.0f;
    for (int32_t r = 0; r < L->n_ranks; r++) amax = amaxes[r] > amax ? amaxes[r] : amax;
    return fm_nvfp4_scale_of_amax(amax);
}
