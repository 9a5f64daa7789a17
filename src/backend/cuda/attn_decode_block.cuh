// A decode step's attention block for one token in one persistent launch (route attn.persistent): the QKV GEMV with
// its input quantized, q/k norm + RoPE with the k and v rows stored in the paged cache, paged attention's splits and
// their combine, the o projection's GEMV with its input quantized, the residual add and the next RMSNorm. The unfused
// chain at B = 1 is eight kernels (quantizer, QKV GEMV, RoPE + store, split attention, combine, quantizer, o GEMV,
// add + RMSNorm), each a launch, a ramp and a drain for kilobytes to a few megabytes of work; here every CTA of one
// grid takes part in each phase and the phases meet at grid barriers (attn_decode_block.cu has the phases).
#ifndef FM_CUDA_ATTN_DECODE_BLOCK_CUH
#define FM_CUDA_ATTN_DECODE_BLOCK_CUH

#include "backend/cuda/cuda_common.cuh"

// Both projections are int4-tc banks (FM_W_INT4_G128_TC, w4a8_layout.cuh), not interleaved; the cache holds the
// activation type (bf16).
typedef struct fm_attn_block_args {
    const __nv_bfloat16 *x; // [H] the block's input (the attention norm's row; out may be x)
    int64_t H;
    int32_t nh, nkv, hd;
    const uint8_t *qkv_codes, *o_codes; // the banks' codes: q|k|v [(nh + 2 nkv) hd][H], o [H][nh hd]
    const __nv_bfloat16 *qkv_scales, *o_scales;
    int64_t qkv_rows_pad, o_rows_pad;
    int32_t qkv_slices, o_slices;            // K slices of a row block: the decode GEMVs' (fm_cuda_w4a8_gemv_slices)
    __nv_bfloat16 *qkv;                      // [(nh + 2 nkv) hd] out: the projection, q and k then normed and rotated
    const __nv_bfloat16 *q_norm, *k_norm;    // [hd] each, or NULL (no q/k norm)
    float qk_eps, theta;                     // the q/k norms' epsilon, RoPE's base
    const int32_t *tok_seq, *tok_pos, *slot; // the token's sequence, position and cache slot (device words)
    __nv_bfloat16 *k_cache, *v_cache;        // the layer's caches [n_slots][nkv hd]
    const int32_t *tables;
    int32_t max_blocks, block_tokens;
    int32_t splits;            // fm_cuda_attention_paged_split_count's (the split kernel's count at this max_len)
    void *scratch;             // the attention's scratch (fm_attention_paged_scratch_bytes), its counters unused
    __nv_bfloat16 *att;        // [nh hd] out: the attention's output
    __nv_bfloat16 *y;          // [H] out: the o projection
    __nv_bfloat16 *acc;        // [H] the residual, += y
    const __nv_bfloat16 *norm; // [H] the next RMSNorm's weights
    float eps;
    __nv_bfloat16 *out; // [H] rmsnorm(acc) * norm (may be x)
    unsigned *barrier;  // FM_MOE_BLOCK_BARRIER_WORDS device words (moe_decode_block.cuh's: the kernels never overlap)
} fm_attn_block_args;

// The shapes the kernel takes: head dim 128, H a multiple of 128 up to 4096, nh hd a multiple of 128 up to 4096.
extern "C" bool fm_cuda_attn_decode_block_takes(int64_t H, int32_t nh, int32_t nkv, int32_t hd);
// Exactly the chain with the default routes at T = 1 (quantize_e4m3_rows + the W4A8 decode GEMV, qk_norm_rope_store,
// attention_paged's split and combine kernels, quantize + GEMV, add_rmsnorm): qkv, the cache rows, att, y, acc and
// out bit for bit, given the same slices and splits. Every CTA of the grid must be resident at once (the grid
// barriers): the launcher sizes the grid by the occupancy calculator.
extern "C" void fm_cuda_attn_decode_block(const fm_attn_block_args *a, bool pdl, cudaStream_t s);

#endif
