// A decode step's MoE block for one token in one persistent launch (route moe.persistent): the router GEMV and
// top-k, the gate|up GEMV with its SwiGLU, the down GEMV, the weighted combine, the residual add and the next RMSNorm.
// The unfused chain at B = 1 is six kernels (fused router, small dispatch, gate|up GEMV, the quantizer of h, down GEMV,
// combine + add + RMSNorm), each paying a launch, a ramp and a drain for kilobytes to a few megabytes of work
// (docs/RESULTS.md 2.17: ~45 us a layer under ncu on an H100 against a read floor of ~8 us). Here every CTA of one
// grid takes part in each phase and the phases meet at grid barriers (moe_decode_block.cu has the phases).
#ifndef FM_CUDA_MOE_DECODE_BLOCK_CUH
#define FM_CUDA_MOE_DECODE_BLOCK_CUH

#include "backend/cuda/cuda_common.cuh"

// The banks are int4-tc (FM_W_INT4_G128_TC: w4a8_layout.cuh), gate_up interleaved [E][2I rows][H], down [E][H][I].
typedef struct fm_moe_block_args {
    const __nv_bfloat16 *router_w; // bf16 [E][router_ld], H columns
    int64_t router_ld;
    int32_t E, k;                         // with the shared expert in the bank (shared): E and k count it
    bool softmax_topk, norm_topk, shared; // as fm_cuda_router_fused takes them
    const uint8_t *gu_codes, *down_codes; // the banks' codes
    const __nv_bfloat16 *gu_scales, *down_scales;
    int64_t gu_rows_pad, down_rows_pad; // padded rows of one matrix
    int64_t gu_groups, down_groups;     // 128-groups of K (ceil(H / 128), ceil(I / 128))
    int32_t gu_slices, down_slices;     // K slices of a row block: the decode GEMVs' (fm_cuda_w4a8_moe_gemv_slices)
    const __nv_bfloat16 *x;             // [H], the block's input (the post-attention norm)
    /* route moe.block_norm: pre_y NULL, or the attention's output [H]: the block first makes x itself, acc += pre_y
       and x = rmsnorm(acc) * pre_norm (the add_rmsnorm op's arithmetic: every CTA normalises the row into its shared
       memory; CTA 0 writes it to pre_x, x's buffer, and the summed residual to acc once every CTA has read acc) */
    const __nv_bfloat16 *pre_y, *pre_norm;
    __nv_bfloat16 *pre_x;
    float pre_eps;
    int64_t H, I;
    __nv_bfloat16 *logits;     // [E] out
    int32_t *ids;              // [k] out
    __nv_bfloat16 *weights;    // [k] out
    __nv_bfloat16 *acc;        // [H] the residual, += the block's output
    const __nv_bfloat16 *norm; // [H] the next RMSNorm's weights
    float eps;
    __nv_bfloat16 *out;     // [H] rmsnorm(acc) * norm (may be x)
    uint8_t *out_q;         // NULL, or out quantized for the next dense linear (fm_qrows, M = 1): codes [pad128(H)]
    float *out_qs;          // and their scales [pad128(H) / 128]
    __nv_bfloat16 *h16, *y; // scratch: [k][I], [k][H]
    unsigned *barrier;      // FM_MOE_BLOCK_BARRIER_WORDS device words, zero before the first launch (count, generation)
    /* route moe.block_barrier=count: FM_MOE_BLOCK_COUNTS zeroed 64-bit device words and the host's table of the grid
       size each one serves (0: free), or NULL (the barrier above); the launcher takes its grid's word (or a free one,
       or the barrier above when none is left) */
    unsigned long long *counts;
    int32_t *count_grids;
} fm_moe_block_args;
#define FM_MOE_BLOCK_BARRIER_WORDS 2
#define FM_MOE_BLOCK_COUNTS 16

// The shapes the kernel takes: one token, E <= 1024 candidate experts, 1 <= k <= min(E, 32) picks of them (with a
// shared expert in the bank, shared: E and k count it too, its pair the last: E - 1 candidates, k - 1 picks, k <= 32),
// H a multiple of 8 up to 4096 (the norm's row), I up to 4096, both banks int4-tc with gate_up interleaved.
extern "C" bool fm_cuda_moe_decode_block_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t I,
                                               int64_t router_ld);
// Exactly fm_cuda_router_fused, then the decode GEMVs' chain (moe_w4a8.cu) with the fused MoE tail: the same logits,
// ids, weights, acc and out bit for bit, given the same slices (h16 and y then hold each routed pair's h and y row).
// Every CTA of the grid must be resident at once (the grid barriers): the launcher sizes the grid by the occupancy
// calculator, so a GPU shared with other work at the same time (MPS) could stall it.
extern "C" void fm_cuda_moe_decode_block(const fm_moe_block_args *a, bool pdl, cudaStream_t s);

#endif
