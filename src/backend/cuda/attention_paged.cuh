// Attention over the paged KV cache: each token attends causally to its sequence's cached keys and values, read
// through the block table (flash-decoding: the context split across CTAs, the partial results combined).
#ifndef FM_CUDA_ATTENTION_PAGED_CUH
#define FM_CUDA_ATTENTION_PAGED_CUH

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"

// qkv [T, (nh + 2 nkv) hd] bf16 (the query heads of token t in row t); k_cache, v_cache: kv = FM_KV_ACT,
// [n_slots][nkv hd] bf16; FM_KV_E4M3, [n_slots] rows of fm_kv_e4m3_row_bytes(nkv, hd) bytes of e4m3 codes and scales
// (fm_cuda_kv_store's layout), read as their values (attention_e4m3.cuh: the products on the codes in f16, the scales
// on the scores and probabilities, exactly; P rounded to f16 rather than bf16); token t attends to positions
// 0..tok_pos[t] of sequence tok_seq[t], position p at slot tables[tok_seq[t] * max_blocks + p / block_tokens] *
// block_tokens + p % block_tokens; query head h reads kv head h / (nh / nkv). Scores q.k * hd^-0.5, softmax in fp32,
// fp32 accumulation, P rounded to bf16 for the P V product (as the prefill kernel); out [T, nh hd] bf16. tok_seq,
// tok_pos, tables: int32 in device memory, never read by the host (the launch depends on the shapes only: graph-safe).
// max_len (>= every tok_pos[t] + 1 for a balanced split; any value is correct) picks the number of splits; scratch:
// fm_attention_paged_scratch_bytes(T, nh, hd, max_len) bytes of device memory, 16-byte aligned, its first
// fm_attention_paged_counter_bytes(nh) zero before the first call (each call leaves them zero;
// backend/attention_paged.h). fused_combine: the split kernel's last CTA per (token, kv head, query group) merges the
// splits (route paged.combine=fused), else a second kernel. split_waves: the number of splits by
// fm_attention_paged_splits_waves (route paged.splits=waves; the e4m3 form counts its own resident CTAs), else
// fm_attention_paged_splits. swap: 0, or the decode kernel with the query heads as the mma's N where it applies, its
// warps taking swap 16-key tiles an iteration (route paged.swap, attention_paged_swap.cuh). Preconditions (checked; a
// violation stops with a message): hd a multiple of 16 in [16, 256], nh % nkv == 0, nh <= 65535, 16-byte aligned qkv
// and caches. The table entries a token reads are not checked on the device: they must be valid blocks. pdl: its
// kernels launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's route table).
// early_kv (with pdl; the split and the swapped kernels): each CTA of a row that is its sequence's only row of the step
// issues its first tiles of the keys before the row's position before its PDL wait: those earlier steps stored; the key
// at the position is the kernel before this one's to store (route paged.early_kv). The sequences, positions and tables
// must then be the host's (staged before the step), not an earlier kernel's output.
extern "C" void fm_cuda_attention_paged(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                        const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                        const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                        int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                        __nv_bfloat16 *out, bool fused_combine, bool split_waves, int32_t swap,
                                        bool early_kv, bool pdl, cudaStream_t s);
// The same, and out's rows quantized for the o projection (route dense.quant=producer) as
// fm_cuda_quantize_e4m3_rows(out, T, nh hd, x8, xs, NULL, T) would: codes x8 [T][nh hd] (nh hd a multiple of 128),
// scales xs [nh hd / 128][T]; by the kernel that merges the splits where every row splits and hd is a multiple of 128,
// else by that launch after it.
extern "C" void fm_cuda_attention_paged_quant(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                              const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                              const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                              int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                              __nv_bfloat16 *out, uint8_t *x8, float *xs, bool fused_combine,
                                              bool split_waves, int32_t swap, bool early_kv, bool pdl, cudaStream_t s);
// The same, the rows of prompt chunks on the tiled kernel (attention_paged_tiled.cu, route paged.tiled):
// a row whose neighbour in the step is of the same sequence (apg_in_run) goes to a CTA that shares each K and V tile
// among the query rows of several tokens; the other rows to the split kernel. Same arguments, scratch and results
// (either cache form).
extern "C" void fm_cuda_attention_paged_tiled(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                              const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                              const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                              int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                              __nv_bfloat16 *out, bool fused_combine, bool split_waves, int32_t swap,
                                              cudaStream_t s);
// fm_cuda_attention_paged (the tiled kernel calls it for the other rows); with skip_runs, the rows apg_in_run names
// are left to the tiled kernel (not written)
extern "C" void fm_cuda_attention_paged_rows(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                             const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                             const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                             int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                             __nv_bfloat16 *out, bool skip_runs, bool fused_combine, bool split_waves,
                                             int32_t swap, bool early_kv, bool pdl, cudaStream_t s);
// log2(block_tokens) when it is a power of two, else -1: the kernels find a key's slot with shifts then (host)
static inline int apg_bt_shift(int32_t block_tokens) {
    if (block_tokens < 1 || (block_tokens & (block_tokens - 1)) != 0) return -1;
    int s = 0;
    while ((1 << s) < block_tokens) s++;
    return s;
}
// the cache slot of key j of a sequence through its block table: bt_shift = apg_bt_shift(bt) (>= 0: shifts, else a
// division)
static __device__ __forceinline__ int64_t apg_slot_of(const int32_t *table, int bt, int bt_shift, int j) {
    if (bt_shift >= 0) return ((int64_t)table[j >> bt_shift] << bt_shift) + (j & (bt - 1));
    return (int64_t)table[j / bt] * bt + j % bt;
}
// Row t of a step of T rows is in a run (a prompt chunk's rows, two or more of one sequence side by side) when a
// neighbour has its sequence: the tiled kernel's rows.
static __device__ __forceinline__ bool apg_in_run(const int32_t *tok_seq, int64_t T, int64_t t) {
    const int32_t s = tok_seq[t];
    return (t > 0 && tok_seq[t - 1] == s) || (t + 1 < T && tok_seq[t + 1] == s);
}
// the same over fp32 (the ref32 oracle): fp32 arithmetic throughout, no split, no scratch; hd in [1, 256]
extern "C" void fm_cuda_attention_paged_f32(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                            const float *k_cache, const float *v_cache, const int32_t *tok_seq,
                                            const int32_t *tok_pos, const int32_t *tables, int32_t max_blocks,
                                            int32_t block_tokens, int64_t max_len, float *out, bool pdl,
                                            cudaStream_t s);
// the fp32 kernel over bf16 activations and cache (fp32 arithmetic, out rounded once): the bf16 path for a head dim
// that is not a multiple of 16 (the split tensor-core kernel takes multiples of 16 only); no scratch
extern "C" void fm_cuda_attention_paged_plain_bf16(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv,
                                                   int32_t hd, const __nv_bfloat16 *k_cache,
                                                   const __nv_bfloat16 *v_cache, const int32_t *tok_seq,
                                                   const int32_t *tok_pos, const int32_t *tables, int32_t max_blocks,
                                                   int32_t block_tokens, int64_t max_len, __nv_bfloat16 *out, bool pdl,
                                                   cudaStream_t s);

// The splits fm_cuda_attention_paged takes at these shapes on this GPU (split_waves: route paged.splits=waves): the
// persistent decode attention block (attn_decode_block.cuh) takes the same, so its partials are the split kernel's
extern "C" int32_t fm_cuda_attention_paged_split_count(int64_t T, int32_t nh, int32_t nkv, int32_t hd, fm_kv_dtype kv,
                                                       int64_t max_len, bool split_waves);

#endif
