/* CPU reference backend: shared definitions. Everything is fp32 arithmetic; when the plan says
 * act_bf16, every op rounds its output to bf16 (the GPU's activation dtype), which makes this backend an
 * exact emulation of the quantized presets' formats. Parallel over rows with OpenMP; each output element
 * is summed in a fixed order, so results do not depend on the thread count. */
#ifndef FM_CPU_INTERNAL_H
#define FM_CPU_INTERNAL_H

#include "backend/backend.h"

#define FM_CPU_GROUP 128 /* K-group of int4 weight scales and e4m3 activation scales */

struct fm_bank {
    fm_wformat fmt;
    int32_t n; /* matrices */
    int64_t rows, cols;
    int64_t n_groups; /* int4: ceil(cols / 128) */
    float *w;         /* [n][rows][cols]: values (f32, bf16-rounded) or int4 codes as floats */
    float *scales;    /* int4: [n][rows][n_groups] bf16-valued scales; NULL otherwise */
    float *tscale;    /* e4m3-tensor: [n] one scale per matrix (w holds the decoded e4m3 codes); NULL otherwise */
    /* int4-zp (a pre-quantized checkpoint's int4; w is NULL, scales as for int4 but per group of `group`) */
    int32_t group;  /* K-group size (n_groups = ceil(cols / group): the last group may be partial); e4m3-block: 128 */
    uint8_t *codes; /* int4-zp: [n][rows][ceil(cols / 2)] unsigned codes, two per byte (element 2i low), K in bank
                       order; e4m3-block: [n][rows][cols] the checkpoint's e4m3 bytes (scales: the block's
                       weight_scale_inv repeated for each of its rows, [n][rows][ceil(cols / 128)]) */
    uint8_t *zeros; /* [n][rows][n_groups] zero points 0..16 */
    int32_t *perm;  /* [n][cols] input channel at bank position j (act-order), or NULL: the identity */
};

/* Activation row quantized for a linear op: values to multiply (e4m3 or E2M1 codes decoded, or the inputs),
 * and per-group scales (NULL when the values already carry their scale). */
typedef struct cpu_qrow {
    float *val;         /* [K] */
    float *scale;       /* [n_groups] or NULL */
    float tensor_scale; /* e4m3-tensor: the input's one scale, folded in after the whole-K sum; else 1 */
} cpu_qrow;

/* Quantizes one activation row of K elements as afmt into q (val has K floats, scale ceil(K/128)). */
void cpu_quantize_row(const float *x, int64_t K, fm_afmt afmt, cpu_qrow *q);
/* The same as NVFP4 with the whole input's tensor scale (fm_nvfp4_tensor_scale of every row the buffer holds). */
void cpu_quantize_row_nvfp4(const float *x, int64_t K, float tensor_scale, cpu_qrow *q);
/* An FP4 row's codes and block scales (as the dispatch buffer holds them) expanded as the GPU's grouped GEMM reads
 * them: each 128-group to e4m3 codes (decoded into val) with one group scale. */
void cpu_expand_fp4_row(const uint8_t *packed, const uint8_t *scales, int64_t K, bool nv, float tensor_scale,
                        cpu_qrow *q);
/* y[0..N) = row . W[idx]^T for one quantized row (serial; callers parallelise). */
void cpu_linear_row(const fm_bank *w, int32_t idx, const cpu_qrow *x, float *y);
/* Route w4a8.kernel=fold (backend/w4a8_fold.h): the moe op quantizes its gate|up input per token, as the GPU's fold
 * path does, instead of per 1x128 group (set at creation from the routes). */
struct fm_routes;
void cpu_set_routes(fm_backend *be, const struct fm_routes *r);
const struct fm_routes *cpu_routes(const fm_backend *be);
bool cpu_fold_tokens(const fm_backend *be);
/* Rounds n outputs to bf16 when the backend's plan asks for bf16 activations. */
void cpu_round_act(const fm_backend *be, float *x, int64_t n);

void cpu_embed(fm_backend *be, const fm_bank *table, const void *ids, int64_t T, void *out);
void cpu_rmsnorm(fm_backend *be, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps, void *out);
void cpu_linear(fm_backend *be, const fm_bank *w, int32_t idx, const void *x, int64_t M, fm_afmt afmt, void *y);
void cpu_norm_rope_rows(float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t rot_dim,
                        const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0, const int32_t *pos,
                        double theta);
void cpu_qk_norm_rope(fm_backend *be, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const fm_bank *q_norm,
                      const fm_bank *k_norm, float eps, int64_t pos0, const void *pos, double theta);
void cpu_attention(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, void *out);
void cpu_kv_store(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const void *slots,
                  void *k_cache, void *v_cache, fm_kv_dtype kv);
void cpu_qk_norm_rope_store(fm_backend *be, void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            const fm_bank *q_norm, const fm_bank *k_norm, float eps, const void *pos, double theta,
                            const void *slots, void *k_cache, void *v_cache, fm_kv_dtype kv);
void cpu_attention_paged(fm_backend *be, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                         const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                         const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                         int64_t max_len, void *scratch, void *out);
void cpu_route(fm_backend *be, const void *logits, int64_t T, int32_t E, int32_t k, fm_router_kind kind, bool norm_topk,
               void *ids, void *weights);
void cpu_ep_dispatch(fm_backend *be, const struct fm_ep_layout *L, const void *x, int64_t T, const void *ids,
                     const void *amaxes, void *send, void *ret_row);
void cpu_moe_blocks(fm_backend *be, const struct fm_ep_layout *L, const fm_bank *gate_up, const fm_bank *down,
                    const void *recv, const void *amaxes, fm_afmt a_down, void *yret);
void cpu_amax(fm_backend *be, const void *x, int64_t n, void *out);
void cpu_ep_combine(fm_backend *be, const struct fm_ep_layout *L, const void *yrecv, const void *ret_row,
                    const void *weights, int64_t T, void *out);
void cpu_moe(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T, const void *ids,
             const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *out);
void cpu_swiglu(fm_backend *be, const void *gu, int64_t rows, int64_t I, void *out);
void cpu_add(fm_backend *be, void *acc, const void *x, int64_t n);
void cpu_add_rmsnorm(fm_backend *be, void *acc, const void *x, const fm_bank *w, int64_t rows, int64_t dim, float eps,
                     void *out);
void cpu_moe_add_rmsnorm(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                         const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *y,
                         void *acc, const fm_bank *norm, float eps, void *out, void *out_q);
void cpu_linear_add_rmsnorm(fm_backend *be, const fm_bank *w, const void *x, int64_t M, fm_afmt afmt, void *y,
                            void *acc, const fm_bank *norm, float eps, void *out);
bool cpu_attention_paged_o(fm_backend *be, bool runs, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                           const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                           const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                           int64_t max_len, void *scratch, void *att, const fm_bank *o, fm_afmt afmt, void *y,
                           void *acc, const fm_bank *norm, float eps, void *out);
void cpu_gdn_decode_fused(fm_backend *be, const void *qkvz, const void *ba, const fm_bank *ba_w, const void *h,
                          const fm_bank *conv, const fm_bank *a_log, const fm_bank *dt_bias, const fm_bank *norm,
                          int64_t T, fm_gdn_shape g, float eps, void *conv_states, void *rec_states,
                          const void *tok_seq, const void *tok_pos, void *qkv, void *core, void *out, void *out_q);
void cpu_sample(fm_backend *be, const void *logits, int32_t B, int32_t vocab, const void *row_slot, const void *params,
                void *steps, void *counts, void *seen, const void *bias, const void *mask, void *z, void *ids,
                void *info);
/* Qwen3-Next (cpu_gated_attention.c, cpu_gdn.c) */
void cpu_gated_qk_norm_rope(fm_backend *be, const void *qg, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                            int32_t rot_dim, const fm_bank *q_norm, const fm_bank *k_norm, float eps, int64_t pos0,
                            const void *pos, double theta, void *qkv, void *gate);
void cpu_sigmoid_mul(fm_backend *be, void *x, const void *gate, int64_t n);
void cpu_add_sigmoid_scaled(fm_backend *be, void *acc, const void *x, const void *score, int64_t rows, int64_t dim);
void cpu_add_sigmoid_gated(fm_backend *be, void *acc, const void *x, const void *h, const fm_bank *w, int64_t rows,
                           int64_t dim);
void cpu_gdn_conv(fm_backend *be, const void *qkvz, const fm_bank *conv, int64_t T, fm_gdn_shape g, void *states,
                  const void *tok_seq, const void *tok_pos, void *out);
void cpu_gdn_chunked(fm_backend *be, const void *qkv, const void *ba, const fm_bank *a_log, const fm_bank *dt_bias,
                     int64_t T, fm_gdn_shape g, void *states, const void *tok_seq, const void *tok_pos, void *out);
void cpu_gdn_recurrent(fm_backend *be, const void *qkv, const void *ba, const fm_bank *a_log, const fm_bank *dt_bias,
                       int64_t T, fm_gdn_shape g, void *states, const void *tok_seq, const void *tok_pos, void *out);
void cpu_gdn_norm_gate(fm_backend *be, const void *core, const void *qkvz, const fm_bank *w, int64_t T, fm_gdn_shape g,
                       float eps, void *out, void *out_q);

/* int4-zp (cpu_linear_int4zp.c): outputs n0..n1 of matrix idx for one activation row in input order, as stored
 * (x->scale NULL) or e4m3 1x128 (x->scale set: the bank must have no act-order permutation and a group that is a
 * multiple of 128, which the engine checks at load). */
void cpu_int4zp_rows(const fm_bank *w, int32_t idx, const cpu_qrow *x, int64_t n0, int64_t n1, float *y);
/* y = x W[idx]^T for M rows of activations as stored (w4a16), gathered to bank order once per row. */
void cpu_linear_int4zp(fm_backend *be, const fm_bank *w, int32_t idx, const float *x, int64_t M, float *y);
/* e4m3-block (cpu_linear_e4m3b.c): outputs n0..n1 of matrix idx for one activation row (1x128 scales or none). */
void cpu_e4m3b_rows(const fm_bank *w, int32_t idx, const cpu_qrow *x, int64_t n0, int64_t n1, float *y);
/* Builds an e4m3-block bank from block-FP8 sources whose K-block is 128 (cpu_bank_e4m3b.c). */
fm_status cpu_bank_fill_e4m3b(fm_bank *w, const fm_bank_src *src, fm_error *err);
/* Builds an int4-g128 (or -tc) bank (w->fmt, n, rows, cols set) from pre-quantized sources in our own format. */
fm_status cpu_bank_fill_native_int4(fm_bank *w, const fm_bank_src *src, fm_error *err);

/* Experts in host memory (cpu_expert_cache.c; the ops of backend.h): host banks are cpu_bank_create's. */
fm_status cpu_expert_cache_create(fm_backend *be, const fm_expert_cache_desc *d, fm_expert_cache **out,
                                  const fm_bank **pool_gate_up, const fm_bank **pool_down, void **slot_ids,
                                  fm_error *err);
void cpu_expert_fetch(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P);
void cpu_expert_prefetch(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t rows, int32_t k,
                         int32_t m);
void cpu_expert_cache_stats(fm_backend *be, const fm_expert_cache *c, fm_expert_cache_stats *out);
void cpu_expert_cache_free(fm_backend *be, fm_expert_cache *c);

fm_status cpu_bank_create(fm_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err);
void cpu_bank_free(fm_backend *be, fm_bank *w);
size_t cpu_bank_bytes(const fm_bank *w);

#endif
