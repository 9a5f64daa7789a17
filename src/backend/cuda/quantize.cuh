// Weight conversion on the device at load time: rows of a checkpoint tensor (F32, F16 or BF16 bytes, uploaded
// as they are in the file) to a bank's bf16, fp32 or int4 layout (cuda_internal.cuh).
#ifndef FM_CUDA_QUANTIZE_CUH
#define FM_CUDA_QUANTIZE_CUH

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "model/model_src.h"
}

// src: rows x cols elements of dtype src_dtype (0 = F32, 1 = F16, 2 = BF16: the fm_dtype values), row-major.
// bf16, f32: dst rows ld elements apart. int4: dst rows ld bytes apart, scales rows n_groups apart; symmetric,
// groups of 128 along the row, scale = amax / 7 rounded UP to bf16, q = clamp(rne(w / scale), -8, 7) — the
// same codec as the CPU's fm_int4_quantize (src/quant/int4.c), bit for bit.
extern "C" void fm_cuda_convert_bf16(const void *src, int src_dtype, int64_t rows, int64_t cols, __nv_bfloat16 *dst,
                                     int64_t ld, cudaStream_t s);
extern "C" void fm_cuda_convert_f32(const void *src, int src_dtype, int64_t rows, int64_t cols, float *dst, int64_t ld,
                                    cudaStream_t s);
extern "C" void fm_cuda_quantize_int4(const void *src, int src_dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                      int64_t ld, __nv_bfloat16 *scales, int64_t n_groups, cudaStream_t s);

// int4 with int4-p2 scales (--int4-scales p2, quantize_int4_p2.cu): the same layouts as fm_cuda_quantize_int4, the
// codes and scales bit for bit the CPU's fm_int4_p2_quantize (src/quant/int4_p2.h).
extern "C" void fm_cuda_quantize_int4_p2(const void *src, int src_dtype, int64_t rows, int64_t cols, uint8_t *dst,
                                         int64_t ld, __nv_bfloat16 *scales, int64_t n_groups, cudaStream_t s);

// dst[j] = synthetic element first + j of a view with rows of `cols` (fm_synth_value, src/model/model_src.h)
extern "C" void fm_cuda_synth_f32(const fm_synth *s, int64_t first, int64_t n, int64_t cols, float *dst,
                                  cudaStream_t stream);

#endif
