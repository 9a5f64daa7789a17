/* The fused ops of a forward pass (backend.h), each defined as the chain of reference ops it replaces, run in that
 * order: the oracle a fused GPU kernel is tested against, and what the cpu backend computes when a route asks for
 * the fused form (the same numbers as the chain, so a model's logits do not depend on the route). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

void cpu_moe_add_rmsnorm(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                         const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *y,
                         void *acc, const fm_bank *norm, float eps, void *out, void *out_q) {
    (void)out_q; /* the cpu has no linear_rows: its dense linears quantize their own input */
    cpu_moe(be, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y);
    cpu_add_rmsnorm(be, acc, y, norm, T, down->rows, eps, out);
}

void cpu_linear_add_rmsnorm(fm_backend *be, const fm_bank *w, const void *x, int64_t M, fm_afmt afmt, void *y,
                            void *acc, const fm_bank *norm, float eps, void *out) {
    cpu_linear(be, w, 0, x, M, afmt, y);
    cpu_add_rmsnorm(be, acc, y, norm, M, w->rows, eps, out);
}

/* one kernel serves attention_paged and attention_paged_runs on the cpu: runs changes nothing */
bool cpu_attention_paged_o(fm_backend *be, bool runs, const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                           const void *k_cache, const void *v_cache, fm_kv_dtype kv, const void *tok_seq,
                           const void *tok_pos, const void *tables, int32_t max_blocks, int32_t block_tokens,
                           int64_t max_len, void *scratch, void *att, const fm_bank *o, fm_afmt afmt, void *y,
                           void *acc, const fm_bank *norm, float eps, void *out) {
    (void)runs;
    cpu_attention_paged(be, qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks,
                        block_tokens, max_len, scratch, att);
    if (norm) cpu_linear_add_rmsnorm(be, o, att, T, afmt, y, acc, norm, eps, out);
    else cpu_linear(be, o, 0, att, T, afmt, y);
    return true;
}

/* The precondition of the decode form: every row a token of its own sequence (the cpu backend replays no graphs, so
 * it never pads a step). The chain below would run any step; a GPU kernel that keeps one row per block would not, so a
 * caller that breaks it stops here, on the reference, and not with wrong states on a GPU. */
static void check_decode_rows(const int32_t *seq, int64_t T) {
    for (int64_t t = 1; t < T; t++)
        for (int64_t u = 0; u < t; u++)
            if (seq[u] == seq[t]) {
                fprintf(stderr,
                        "fp8moe: cpu gdn_decode_fused: rows %lld and %lld are both of sequence %d: a decode step has "
                        "one row per sequence\n",
                        (long long)u, (long long)t, seq[t]);
                abort();
            }
}

void cpu_gdn_decode_fused(fm_backend *be, const void *qkvz, const void *ba, const fm_bank *ba_w, const void *h,
                          const fm_bank *conv, const fm_bank *a_log, const fm_bank *dt_bias, const fm_bank *norm,
                          int64_t T, fm_gdn_shape g, float eps, void *conv_states, void *rec_states,
                          const void *tok_seq, const void *tok_pos, void *qkv, void *core, void *out, void *out_q) {
    check_decode_rows((const int32_t *)tok_seq, T);
    if (ba_w) cpu_linear(be, ba_w, 0, h, T, FM_A_NATIVE, (void *)ba); /* the projection the caller left to the op */
    cpu_gdn_conv(be, qkvz, conv, T, g, conv_states, tok_seq, tok_pos, qkv);
    cpu_gdn_recurrent(be, qkv, ba, a_log, dt_bias, T, g, rec_states, tok_seq, tok_pos, core);
    cpu_gdn_norm_gate(be, core, qkvz, norm, T, g, eps, out, out_q);
}
