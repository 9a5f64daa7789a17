// The MoE block's end in one kernel (decode.fused): the routed rows' weighted combine, the residual add and the next
// block's RMSNorm, which ran as moe_combine then add_rmsnorm (two launches, and the combined row written and read
// back once). bf16 activations.
#ifndef FM_CUDA_MOE_COMBINE_NORM_CUH
#define FM_CUDA_MOE_COMBINE_NORM_CUH

#include "backend/cuda/cuda_common.cuh"

// For each token t of T: m = bf16(sum_j w[t, j] y[row(t k + j), :]) (row(p) = slot_of ? slot_of[p] : p, in j order
// in fp32: fm_cuda_moe_combine), acc[t, :] = bf16(acc[t, :] + m), out[t, :] = rmsnorm(acc[t, :]) * norm: bit for bit
// fm_cuda_moe_combine into scratch [T, H] then fm_cuda_add_rmsnorm. One launch (PDL when pdl) for rows of a width
// that is a multiple of 8 up to 4096 on 16-byte aligned buffers; otherwise those two launches, through scratch.
// out_q (NULL: none): out's rows also quantized into out_q, out_qs (backend.h's fm_qrows layout: codes [T][pad128(H)],
// scales [pad128(H) / 128][T]), exactly as fm_cuda_quantize_e4m3_rows(out, T, H, out_q, out_qs, NULL, T) writes them.
extern "C" void fm_cuda_moe_combine_add_rmsnorm(const __nv_bfloat16 *y, const int32_t *slot_of, const __nv_bfloat16 *w,
                                                int64_t T, int32_t k, int64_t H, __nv_bfloat16 *scratch,
                                                __nv_bfloat16 *acc, const __nv_bfloat16 *norm, float eps,
                                                __nv_bfloat16 *out, uint8_t *out_q, float *out_qs, bool pdl,
                                                cudaStream_t s);

// What the moe op does with the combined rows when its caller asks for the fused end (fm_cuda_moe_w4a8): the
// arguments of fm_cuda_moe_combine_add_rmsnorm other than the rows, the weights and the output. out_q, out_qs (NULL:
// none): whichever kernel ends the block also leaves the output's rows quantized there (fm_qrows).
typedef struct fm_moe_norm_tail {
    __nv_bfloat16 *acc;
    const __nv_bfloat16 *norm;
    float eps;
    __nv_bfloat16 *scratch;
    uint8_t *out_q;
    float *out_qs;
} fm_moe_norm_tail;

#endif
