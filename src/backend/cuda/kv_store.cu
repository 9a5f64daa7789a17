// Appends tokens' k and v heads to the paged KV cache (see kv_store.cuh). One block per token; its threads copy
// the token's nkv * hd keys and as many values in the widest unit that the row sizes and the pointers allow (16
// bytes for every head_dim that is a multiple of 8 in bf16). Memory-bound: 4 nkv hd bytes read and written per
// token (bf16), a few hundred bytes per token at decode: the op is one launch's latency, which programmatic dependent
// launch (pdl.cuh, `pdl`) overlaps with the kernel before it: it waits for the earlier ones at its top.
//
// e4m3 cache (FM_KV_E4M3, quant/kv_e4m3.h): one warp per (token, kv head, K or V) row, 8 warps a block; lane l holds
// the row's values [V l, V l + V) (one 8- or 16-byte load: V = 4 up to hd 128, 8 up to 256), the row's amax is a warp
// max, and each lane writes its V codes (4 or 8 bytes), lane 0 the scale. 2 nkv hd bytes read and nkv (hd + 4)
// written per token: the same launch-bound op at decode.
#include "backend/cuda/kv_store.cuh"
#include "backend/cuda/pdl.cuh"

template <typename U>
static __global__ void kv_store_kernel(const unsigned char *qkv, int64_t ld_b, int64_t k_b, int64_t v_b, int64_t row_b,
                                       const int32_t *slots, unsigned char *k_cache, unsigned char *v_cache) {
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int64_t slot = slots[t];
    if (slot < 0) return; /* a padding row (backend.h) */
    const int64_t n = row_b / (int64_t)sizeof(U);
    const U *ks = (const U *)(qkv + t * ld_b + k_b), *vs = (const U *)(qkv + t * ld_b + v_b);
    U *kd = (U *)(k_cache + slot * row_b), *vd = (U *)(v_cache + slot * row_b);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}

template <typename U>
static void kv_store_launch(const void *qkv, int64_t T, int64_t ld_b, int64_t k_b, int64_t v_b, int64_t row_b,
                            const int32_t *slots, void *k_cache, void *v_cache, bool pdl, cudaStream_t s) {
    const int64_t n = row_b / (int64_t)sizeof(U);
    const int threads = (int)(n >= 256 ? 256 : fm_ceil_div(n, 32) * 32);
    pdl_launch(kv_store_kernel<U>, (unsigned)T, threads, 0, s, pdl, (const unsigned char *)qkv, ld_b, k_b, v_b, row_b,
               slots, (unsigned char *)k_cache, (unsigned char *)v_cache);
    FM_LAUNCH_CHECK("kv_store");
}

#define KV_E4M3_WARPS 8

// rows r = 0 .. 2 nkv - 1 of token t: k head r (r < nkv), else v head r - nkv; both at head nh + r of the qkv row
template <int V>
static __global__ __launch_bounds__(KV_E4M3_WARPS *
                                    32) void kv_store_e4m3_kernel(const __nv_bfloat16 *qkv, int64_t T, int nh, int nkv,
                                                                  int hd, int64_t row_b, const int32_t *slots,
                                                                  unsigned char *k_cache, unsigned char *v_cache) {
    pdl_wait();
    const int64_t w = (int64_t)blockIdx.x * KV_E4M3_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= T * 2 * nkv) return;
    const int64_t t = w / (2 * nkv);
    const int r = (int)(w % (2 * nkv)), h = r < nkv ? r : r - nkv;
    const int64_t slot = slots[t];
    if (slot < 0) return; /* a padding row (backend.h); the warp's lanes all leave */
    const __nv_bfloat16 *x = qkv + t * (int64_t)(nh + 2 * nkv) * hd + (int64_t)(nh + r) * hd + lane * V;
    const bool in = lane * V < hd;
    float v[V];
    if (in) {
        if (V == 8) {
            const uint4 u = *(const uint4 *)x;
            const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w4[i]);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            }
        } else {
            const uint2 u = *(const uint2 *)x;
            const uint32_t w2[2] = {u.x, u.y};
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w2[i]);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++) amax = fmaxf(amax, fabsf(v[i])); /* fmaxf skips NaN, as the CPU's loop */
    const int e = kv_e4m3_warp_exponent(amax);
    const float down = kv_e4m3_pow2(-e);
    unsigned char *d = (r < nkv ? k_cache : v_cache) + slot * row_b;
    if (in) {
        uint32_t c[V / 4];
#pragma unroll
        for (int i = 0; i < V / 4; i++)
            c[i] = kv_e4m3_code2(v[4 * i], v[4 * i + 1], down) | kv_e4m3_code2(v[4 * i + 2], v[4 * i + 3], down) << 16;
        if (V == 8) *(uint2 *)(d + (int64_t)h * hd + lane * V) = make_uint2(c[0], c[V / 4 - 1]);
        else *(uint32_t *)(d + (int64_t)h * hd + lane * V) = c[0];
    }
    if (lane == 0) *(float *)(d + (int64_t)nkv * hd + 4 * h) = kv_e4m3_pow2(e);
}

static void kv_store_fail(const char *what, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                          fm_kv_dtype kv) {
    fprintf(stderr, "fp8moe: kv_store(T=%lld, nh=%d, nkv=%d, hd=%d, %d-byte elements, %s cache): %s\n", (long long)T,
            nh, nkv, hd, elem_bytes, kv == FM_KV_E4M3 ? "e4m3" : "activation-dtype", what);
    abort();
}

static void kv_store_e4m3(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                          const int32_t *slots, void *k_cache, void *v_cache, bool pdl, cudaStream_t s) {
    if (elem_bytes != 2)
        kv_store_fail("the e4m3 cache takes bf16 activations only", T, nh, nkv, hd, elem_bytes, FM_KV_E4M3);
    const bool v4 = hd % 4 == 0 && hd <= 128, v8 = hd % 8 == 0 && hd <= 256;
    if (!v4 && !v8)
        kv_store_fail("the e4m3 cache needs hd a multiple of 4 up to 128 or of 8 up to 256", T, nh, nkv, hd, elem_bytes,
                      FM_KV_E4M3);
    if (((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) % 16 != 0)
        kv_store_fail("qkv and the caches must be 16-byte aligned", T, nh, nkv, hd, elem_bytes, FM_KV_E4M3);
    const int64_t rows = T * 2 * nkv, row_b = fm_kv_e4m3_row_bytes(nkv, hd);
    const unsigned blocks = (unsigned)fm_ceil_div(rows, KV_E4M3_WARPS);
    if (v4)
        pdl_launch(kv_store_e4m3_kernel<4>, blocks, KV_E4M3_WARPS * 32, 0, s, pdl, (const __nv_bfloat16 *)qkv, T, nh,
                   nkv, hd, row_b, slots, (unsigned char *)k_cache, (unsigned char *)v_cache);
    else
        pdl_launch(kv_store_e4m3_kernel<8>, blocks, KV_E4M3_WARPS * 32, 0, s, pdl, (const __nv_bfloat16 *)qkv, T, nh,
                   nkv, hd, row_b, slots, (unsigned char *)k_cache, (unsigned char *)v_cache);
    FM_LAUNCH_CHECK("kv_store_e4m3");
}

extern "C" void fm_cuda_kv_store(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                                 const int32_t *slots, void *k_cache, void *v_cache, fm_kv_dtype kv, bool pdl,
                                 cudaStream_t s) {
    if (T == 0) return;
    if (!qkv || !slots || !k_cache || !v_cache || T < 0 || T > INT32_MAX || nh < 1 || nkv < 1 || hd < 1 ||
        (elem_bytes != 2 && elem_bytes != 4) || (kv != FM_KV_ACT && kv != FM_KV_E4M3))
        kv_store_fail("bad arguments (null pointer, sizes out of range or an unknown cache dtype)", T, nh, nkv, hd,
                      elem_bytes, kv);
    if (kv == FM_KV_E4M3) {
        kv_store_e4m3(qkv, T, nh, nkv, hd, elem_bytes, slots, k_cache, v_cache, pdl, s);
        return;
    }
    const int64_t row_b = (int64_t)nkv * hd * elem_bytes, ld_b = (int64_t)(nh + 2 * nkv) * hd * elem_bytes;
    const int64_t k_b = (int64_t)nh * hd * elem_bytes, v_b = k_b + row_b;
    const uint64_t all =
        (uint64_t)row_b | (uint64_t)ld_b | (uint64_t)k_b | (uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache;
    if (all % 16 == 0) kv_store_launch<uint4>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
    else if (all % 4 == 0) kv_store_launch<uint32_t>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
    else kv_store_launch<uint16_t>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
}
