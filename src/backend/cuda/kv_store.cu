// Appends tokens' k and v heads to the paged KV cache (see kv_store.cuh). One block per token; its threads copy
// the token's nkv * hd keys and as many values in the widest unit that the row sizes and the pointers allow (16
// bytes for every head_dim that is a multiple of 8 in bf16). Memory-bound: 4 nkv hd bytes read and written per
// token (bf16), a few hundred bytes per token at decode: the op is one launch's latency, which programmatic dependent
// launch (pdl.cuh, `pdl`) overlaps with the kernel before it: it waits for the earlier ones at its top.
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

extern "C" void fm_cuda_kv_store(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, int32_t elem_bytes,
                                 const int32_t *slots, void *k_cache, void *v_cache, bool pdl, cudaStream_t s) {
    if (T == 0) return;
    if (!qkv || !slots || !k_cache || !v_cache || T < 0 || T > INT32_MAX || nh < 1 || nkv < 1 || hd < 1 ||
        (elem_bytes != 2 && elem_bytes != 4)) {
        fprintf(stderr,
                "fp8moe: kv_store(T=%lld, nh=%d, nkv=%d, hd=%d, %d-byte elements): bad arguments (null pointer "
                "or sizes out of range)\n",
                (long long)T, nh, nkv, hd, elem_bytes);
        abort();
    }
    const int64_t row_b = (int64_t)nkv * hd * elem_bytes, ld_b = (int64_t)(nh + 2 * nkv) * hd * elem_bytes;
    const int64_t k_b = (int64_t)nh * hd * elem_bytes, v_b = k_b + row_b;
    const uint64_t all =
        (uint64_t)row_b | (uint64_t)ld_b | (uint64_t)k_b | (uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache;
    if (all % 16 == 0) kv_store_launch<uint4>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
    else if (all % 4 == 0) kv_store_launch<uint32_t>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
    else kv_store_launch<uint16_t>(qkv, T, ld_b, k_b, v_b, row_b, slots, k_cache, v_cache, pdl, s);
}
