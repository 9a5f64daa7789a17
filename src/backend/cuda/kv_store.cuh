// The paged KV cache's append: token t's k and v heads from the fused qkv buffer to their cache slot; and the e4m3
// cache's row arithmetic (quant/kv_e4m3.h) on the device, shared with the fused store of rope.cu.
#ifndef FM_CUDA_KV_STORE_CUH
#define FM_CUDA_KV_STORE_CUH

#include <cuda_fp8.h>

extern "C" {
#include "backend/backend.h"
#include "quant/kv_e4m3.h"
}
#include "backend/cuda/cuda_common.cuh"

// qkv [T, (nh + 2 nkv) hd] (q heads, k heads, v heads) of elem_bytes-byte activations (2: bf16, 4: fp32);
// k_cache and v_cache [n_slots] rows of fm_kv_e4m3_row_bytes(nkv, hd) bytes for kv = FM_KV_E4M3 (each (token, kv
// head) row quantized as quant/kv_e4m3.h does: the codes of head h at byte h hd, its fp32 scale at nkv hd + 4 h; bf16
// activations only, hd a multiple of 4 up to 128 or of 8 up to 256), else [n_slots][nkv hd] of the activation type
// (the values copied bit for bit); slots int32 [T] in device memory, distinct and valid (the engine's block tables
// make them), or -1 (a padding row: nothing stored). Stream-ordered, no allocation, no synchronisation.
// pdl: launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's routes).
extern "C" void fm_cuda_kv_store(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                                 const int32_t *slots, void *k_cache, void *v_cache, fm_kv_dtype kv, bool pdl,
                                 cudaStream_t s);

// 2^k as an exact fp32 for k in [-126, 127] (a normal power of two: the exponent field alone)
static __device__ __forceinline__ float kv_e4m3_pow2(int k) { return __int_as_float((127 + k) << 23); }

// fm_kv_e4m3_exponent (quant/kv_e4m3.c) from the bits: amax = 1.f 2^(E - 127) = m 2^x with m = 1.f / 2, x = E - 126,
// and m <= 0.875 is f <= 0.75 (the mantissa field <= 0x600000). The clamp takes the other cases: a subnormal amax
// (E = 0: e <= -134, the true one lower still) gives EMIN, inf (E = 255: 120) EMAX. amax is never NaN here: the
// callers' fmaxf skips NaN from 0.
static __device__ __forceinline__ int kv_e4m3_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    const int bits = __float_as_int(amax), E = bits >> 23;
    const int e = (bits & 0x7fffff) <= 0x600000 ? E - 135 : E - 134;
    return e < FM_KV_E4M3_EMIN ? FM_KV_E4M3_EMIN : e > FM_KV_E4M3_EMAX ? FM_KV_E4M3_EMAX : e;
}

// e of the row whose lanes' largest magnitudes are lane_amax (every lane of the warp calls it; max is exact in any
// order, so the shuffle tree gives the CPU loop's amax)
static __device__ __forceinline__ int kv_e4m3_warp_exponent(float lane_amax) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lane_amax = fmaxf(lane_amax, __shfl_xor_sync(0xffffffffu, lane_amax, o));
    return kv_e4m3_exponent(lane_amax);
}

// the codes of (x, y) * down, x in the low byte: RNE, saturating (cvt.rn.satfinite.e4m3x2.f32, which gives
// quant/e4m3.c's fm_f32_to_e4m3 bit for bit); down = 2^-e exact, so the product is the CPU's
static __device__ __forceinline__ uint32_t kv_e4m3_code2(float x, float y, float down) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(x * down, y * down), __NV_SATFINITE, __NV_E4M3);
}

#endif
