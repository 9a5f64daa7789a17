/* Tensor parallelism for one attention block (prefill, no KV cache): the heads are split over the ranks in contiguous
 * ranges, whole GQA groups to a rank (rank r holds query heads [r nh / N, (r + 1) nh / N) and KV heads
 * [r nkv / N, (r + 1) nkv / N): nkv % N == 0). Every rank holds every token (x replicated), and
 *   column-parallel q|k|v: the rows of its heads (a bank of (nh / N + 2 nkv / N) hd rows: its q rows, then its k
 *                          rows, then its v rows), so q/k norm, RoPE and attention run on its heads alone;
 *   row-parallel o:        the columns of its heads (a bank [H, (nh / N) hd]), giving a partial o projection;
 *   one all-reduce:        the partials summed in rank order (fm_comm_all_reduce_sum: the same bits on every rank).
 * With --dense w8a8 each shard has its own e4m3 scale (its own amax), as the second seed's TP 2 does. Against one rank
 * the results differ only by the o projection's summation order (and, with w8a8, the shards' scales): equal at one
 * rank, within the op tolerance at more (tests/test_tp.c).
 *
 * This is the host form (CPU backend, fp32 activations): the GPU form is the same steps on each rank's stream with an
 * NCCL all-reduce. */
#ifndef FM_DIST_TP_ATTENTION_H
#define FM_DIST_TP_ATTENTION_H

#include "backend/backend.h"
#include "dist/comm.h"

/* Query heads [*h0, *h0 + *nh_r) and KV heads [*kv0, *kv0 + *nkv_r) of rank r out of N; false when the KV heads do
 * not split evenly (nkv % N != 0) or nh is not a multiple of nkv. */
bool fm_tp_head_range(int32_t nh, int32_t nkv, int n_ranks, int rank, int32_t *h0, int32_t *nh_r, int32_t *kv0,
                      int32_t *nkv_r);

/* One attention block on rank fm_comm_rank(c): x [T][H] (every token; fp32 activations of a CPU backend), qkv and o
 * this rank's shards (above: [(nh_r + 2 nkv_r) hd, H] and [H, nh_r hd] from fm_tp_head_range), q_norm / k_norm the
 * per-head-dim norms (NULL: none), a_dense the plan's activation format of dense projections; y [T][H] receives the
 * whole block's output (the all-reduced sum). Every rank of the world calls it together. */
fm_status fm_tp_attention_host(fm_comm *c, fm_backend *be, const fm_bank *qkv, const fm_bank *o, const fm_bank *q_norm,
                               const fm_bank *k_norm, fm_afmt a_dense, const float *x, int64_t T, int64_t H, int32_t nh,
                               int32_t nkv, int32_t hd, float eps, double theta, float *y, fm_error *err);

#endif
