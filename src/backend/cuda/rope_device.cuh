// The q/k norm + RoPE of one head by one warp (rope.cu has the design), shared by the RoPE kernel and the
// persistent decode attention block (attn_decode_block.cu).
#ifndef FM_CUDA_ROPE_DEVICE_CUH
#define FM_CUDA_ROPE_DEVICE_CUH

#include "backend/cuda/kv_store.cuh"

/* the kernel's STORE: none (qk_norm_rope), copies of the rows (a cache of the activation type), e4m3 codes and
   scales */
#define ROPE_STORE_NONE 0
#define ROPE_STORE_ACT 1
#define ROPE_STORE_E4M3 2

static __device__ __forceinline__ float2 act_load2(const float *p) { return *(const float2 *)p; }
static __device__ __forceinline__ float2 act_load2(const __nv_bfloat16 *p) {
    return __bfloat1622float2(*(const __nv_bfloat162 *)p);
}
static __device__ __forceinline__ void act_store2(float *p, float2 v) { *(float2 *)p = v; }
static __device__ __forceinline__ void act_store2(__nv_bfloat16 *p, float2 v) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v.x, v.y);
}
// v as act_store2 stores it (the e4m3 store quantizes the values the qkv row holds)
static __device__ __forceinline__ float2 act_round2(const float *, float2 v) { return v; }
static __device__ __forceinline__ float2 act_round2(const __nv_bfloat16 *, float2 v) {
    return __bfloat1622float2(__floats2bfloat162_rn(v.x, v.y));
}

// The e4m3 store of one head's row (a warp, every lane; e4m3 cache rows of row_b bytes): lane l's values are the
// pairs a[r] at j = 64 r + 2 l and b[r] at j + half (those with j < half)
template <int R>
static __device__ __forceinline__ void rope_store_e4m3(const float2 *a, const float2 *b, int lane, int half, int hd,
                                                       int nkv, int kvh, unsigned char *row) {
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (64 * r + 2 * lane < half)
            amax = fmaxf(fmaxf(amax, fmaxf(fabsf(a[r].x), fabsf(a[r].y))), fmaxf(fabsf(b[r].x), fabsf(b[r].y)));
    const int e = kv_e4m3_warp_exponent(amax);
    const float down = kv_e4m3_pow2(-e);
    unsigned char *codes = row + (int64_t)kvh * hd;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int j = 64 * r + 2 * lane;
        if (j >= half) continue;
        *(uint16_t *)(codes + j) = (uint16_t)kv_e4m3_code2(a[r].x, a[r].y, down);
        *(uint16_t *)(codes + j + half) = (uint16_t)kv_e4m3_code2(b[r].x, b[r].y, down);
    }
    if (lane == 0) *(float *)(row + (int64_t)nkv * hd + 4 * kvh) = kv_e4m3_pow2(e);
}

// The angles of a token at position p: lane l's pairs j = 64 r + 2 l + c (c in {0, 1}, j < hd / 2)
template <int R>
static __device__ __forceinline__ void rope_angles(float p, float theta, int hd, int lane, float cs[R][2],
                                                   float sn[R][2]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int j = 64 * r + 2 * lane + c;
            const float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
            sincosf(p * inv_freq, &sn[r][c], &cs[r][c]);
        }
}

// Head h of a token's qkv row (a warp, every lane; rope_angles' cs and sn): a q or k head normed and rotated in
// place (and a k head stored to the token's cache slot under STORE), a v head (h >= nh + nkv, STORE only) stored.
// slot < 0: a padding row, nothing stored.
template <typename A, int R, int STORE>
static __device__ __forceinline__ void
rope_head(A *qkv_row, int h, int32_t nh, int32_t nkv, int32_t hd, const A *q_norm, const A *k_norm, float eps,
          const float cs[R][2], const float sn[R][2], int64_t slot, void *k_cache, void *v_cache, int64_t row_b) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    A *x = qkv_row + (int64_t)h * hd;
    if (STORE && h >= nh + nkv) { /* a v head: copied to the cache as it is */
        if (slot < 0) return;
        if (STORE == ROPE_STORE_E4M3) {
            float2 a[R], b[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int j = 64 * r + 2 * lane;
                const bool in = j < half;
                a[r] = in ? act_load2(x + j) : make_float2(0.0f, 0.0f);
                b[r] = in ? act_load2(x + j + half) : make_float2(0.0f, 0.0f);
            }
            rope_store_e4m3<R>(a, b, lane, half, hd, nkv, h - nh - nkv, (unsigned char *)v_cache + slot * row_b);
            return;
        }
        A *d = (A *)v_cache + slot * nkv * hd + (int64_t)(h - nh - nkv) * hd;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = 64 * r + 2 * lane;
            if (j >= half) continue;
            act_store2(d + j, act_load2(x + j));
            act_store2(d + j + half, act_load2(x + j + half));
        }
        return;
    }
    float2 a[R], b[R];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int j = 64 * r + 2 * lane;
        const bool in = j < half;
        a[r] = in ? act_load2(x + j) : make_float2(0.0f, 0.0f);
        b[r] = in ? act_load2(x + j + half) : make_float2(0.0f, 0.0f);
        ss += a[r].x * a[r].x + a[r].y * a[r].y + b[r].x * b[r].x + b[r].y * b[r].y;
    }
    const A *w = h < nh ? q_norm : k_norm;
    if (w) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = 64 * r + 2 * lane;
            if (j >= half) continue;
            const float2 wa = act_load2(w + j), wb = act_load2(w + j + half);
            a[r] = make_float2(wa.x * (a[r].x * inv), wa.y * (a[r].y * inv));
            b[r] = make_float2(wb.x * (b[r].x * inv), wb.y * (b[r].y * inv));
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int j = 64 * r + 2 * lane;
        if (j >= half) continue;
        const float2 lo = make_float2(a[r].x * cs[r][0] - b[r].x * sn[r][0], a[r].y * cs[r][1] - b[r].y * sn[r][1]);
        const float2 hi = make_float2(b[r].x * cs[r][0] + a[r].x * sn[r][0], b[r].y * cs[r][1] + a[r].y * sn[r][1]);
        act_store2(x + j, lo);
        act_store2(x + j + half, hi);
        if (STORE == ROPE_STORE_ACT && h >= nh && slot >= 0) { /* a k head: the same rounded values in the cache */
            A *d = (A *)k_cache + slot * nkv * hd + (int64_t)(h - nh) * hd;
            act_store2(d + j, lo);
            act_store2(d + j + half, hi);
        }
        if (STORE == ROPE_STORE_E4M3) /* the values as the row holds them */
            a[r] = act_round2(x, lo), b[r] = act_round2(x, hi);
    }
    if (STORE == ROPE_STORE_E4M3 && h >= nh && slot >= 0) /* a k head (warp-uniform: h and the token's slot) */
        rope_store_e4m3<R>(a, b, lane, half, hd, nkv, h - nh, (unsigned char *)k_cache + slot * row_b);
}

#endif
