/* Tensor-parallel attention, host form (tp_attention.h). */
#include <stdlib.h>
#include <string.h>

#include "dist/tp_attention.h"
#include "util/status.h"

bool fm_tp_head_range(int32_t nh, int32_t nkv, int n_ranks, int rank, int32_t *h0, int32_t *nh_r, int32_t *kv0,
                      int32_t *nkv_r) {
    *h0 = *nh_r = *kv0 = *nkv_r = 0;
    if (n_ranks < 1 || nkv < 1 || nh % nkv || nkv % n_ranks) return false;
    *nkv_r = nkv / n_ranks, *kv0 = rank * *nkv_r;
    *nh_r = nh / n_ranks, *h0 = rank * *nh_r; /* whole GQA groups: nh / nkv query heads per KV head */
    return true;
}

fm_status fm_tp_attention_host(fm_comm *c, fm_backend *be, const fm_bank *qkv, const fm_bank *o, const fm_bank *q_norm,
                               const fm_bank *k_norm, fm_afmt a_dense, const float *x, int64_t T, int64_t H, int32_t nh,
                               int32_t nkv, int32_t hd, float eps, double theta, float *y, fm_error *err) {
    const int N = fm_comm_size(c), me = fm_comm_rank(c);
    int32_t h0, nh_r, kv0, nkv_r;
    /* shared by every rank: fails on all of them before any exchange */
    if (!fm_tp_head_range(nh, nkv, N, me, &h0, &nh_r, &kv0, &nkv_r))
        return fm_fail(err, FM_ERR_USAGE,
                       "%d query heads in groups over %d KV heads do not split over %d ranks (--tp must divide the "
                       "KV heads)",
                       nh, nkv, N);
    const fm_backend_ops *ops = be->ops;
    const int64_t w_qkv = (int64_t)(nh_r + 2 * nkv_r) * hd, w_att = (int64_t)nh_r * hd;
    float *buf = malloc((size_t)(T * w_qkv) * sizeof(float)), *att = malloc((size_t)(T * w_att) * sizeof(float));
    fm_status st = FM_OK;
    if (!buf || !att) st = fm_fail(err, FM_ERR_NOMEM, "tensor parallelism: out of host memory on rank %d", me);
    if (st == FM_OK) {
        ops->linear(be, qkv, 0, x, T, a_dense, buf);                                         /* column-parallel */
        ops->qk_norm_rope(be, buf, T, nh_r, nkv_r, hd, q_norm, k_norm, eps, 0, NULL, theta); /* this rank's heads */
        ops->attention(be, buf, T, nh_r, nkv_r, hd, att);
        ops->linear(be, o, 0, att, T, a_dense, y); /* row-parallel: this rank's share of every output */
    }
    /* a rank that failed still takes part, with nothing to add: the sizes then disagree, and every rank fails at this
       exchange (none waits forever) */
    fm_error cerr = {{0}}; /* the exchange's own error, which must not hide this rank's */
    const fm_status cst = fm_comm_all_reduce_sum(c, y, st == FM_OK ? T * H : 0, FM_COMM_F32, &cerr);
    if (st == FM_OK && cst != FM_OK) {
        st = cst;
        if (err) *err = cerr;
    }
    free(buf), free(att);
    return st;
}
