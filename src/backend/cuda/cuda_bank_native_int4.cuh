// int4-g128 / int4-g128-tc banks on the GPU from pre-quantized sources in our own format (quant/int4_native.h):
// the codes and bf16 scales are uploaded straight into the int4 row layout of cuda_internal.cuh, then repacked for
// the tensor cores when the plan asks for int4-g128-tc, with no float weights in between.
#ifndef FM_CUDA_BANK_NATIVE_INT4_CUH
#define FM_CUDA_BANK_NATIVE_INT4_CUH

#include "backend/cuda/cuda_internal.cuh"

// Whether every source of the bank is pre-quantized with our own layout (symmetric group 128, bf16 scales).
bool fm_cuda_bank_src_native(const fm_bank_src *src);
// Builds the bank (fmt: FM_W_INT4_G128 or FM_W_INT4_G128_TC) from such sources.
fm_status fm_cuda_bank_create_native_int4(cuda_backend *be, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                          fm_error *err);
// cuda_bank.cu: an int4 bank in the row layout -> the tensor-core layout (w4a8_layout.cuh); frees the row layout.
fm_status fm_cuda_bank_repack_tc(cuda_backend *be, const fm_bank_src *src, fm_bank *w, fm_error *err);

#endif
