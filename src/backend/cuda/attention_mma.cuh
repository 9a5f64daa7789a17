// The tensor-core building blocks of the bf16 attention kernels (attention.cu: prefill; attention_paged.cu:
// decode over the paged cache): cp.async of 16-byte chunks, ldmatrix, mma.sync m16n8k16 bf16 -> fp32, exp2, and
// the shared-memory layout of a [rows][HD] bf16 tile: rows of 16-byte chunks, chunk c of row r at c ^ (r & 7) when
// HD % 64 == 0 (XOR swizzle), else rows padded by one chunk, so that every ldmatrix phase of 8 rows hits 8 distinct
// bank groups.
#ifndef FM_CUDA_ATTENTION_MMA_CUH
#define FM_CUDA_ATTENTION_MMA_CUH

#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"

static __device__ __forceinline__ void att_cp16(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 4 bytes (an e4m3 cache row's scale; zero-filled when src_bytes is 0): .ca, the .cg form copies 16 bytes only
static __device__ __forceinline__ void att_cp4(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
static __device__ __forceinline__ void att_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void att_cp_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// waits until at most N of this thread's committed cp.async groups are pending
template <int N> static __device__ __forceinline__ void att_cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void att_ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void att_ldsm_x4_t(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col)
static __device__ __forceinline__ void att_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// the same product on f16 operands (attention_paged.cu's e4m3 form: e4m3 codes are exact in f16, one cvt per pair)
static __device__ __forceinline__ void att_mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two products side by side, the 16x16 A against the two 16x8 halves b[0..1] and b[2..3] of an ldmatrix.x4: bf16
// operands, or (F16) f16 ones
template <bool F16>
static __device__ __forceinline__ void att_mma_x2(float *c0, float *c1, const uint32_t *a, const uint32_t *b) {
    if (F16) {
        att_mma_f16(c0, a, b[0], b[1]);
        att_mma_f16(c1, a, b[2], b[3]);
    } else {
        att_mma(c0, a, b[0], b[1]);
        att_mma(c1, a, b[2], b[3]);
    }
}
static __device__ __forceinline__ float att_exp2(float x) { // 2^x; -inf -> 0 (MUFU.EX2, denormals flushed)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ uint32_t att_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

static __device__ __forceinline__ uint32_t att_pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

// Byte offset of 16-byte chunk ch of row r in a [rows][HD] tile (layout in the header comment).
template <int HD> static __device__ __forceinline__ uint32_t att_off(int r, int ch) {
    if (HD % 64 == 0) return (uint32_t)(r * HD + ((ch ^ (r & 7)) << 3)) * 2u;
    return (uint32_t)(r * (HD + 8) + (ch << 3)) * 2u;
}
#define ATT_ROW_ELEMS(HD) ((HD) % 64 == 0 ? (HD) : (HD) + 8) // elements from one tile row to the next

// ldmatrix addressing without a register per (row, chunk) pair: a lane reads row r0 + lr and chunk 2 kk + lc,
// r0 a multiple of 8 and kk known at compile time. x[j] = ((2 j + lc) ^ (lr & 7)) * 16 holds the lane's
// swizzled chunk for kk % 4 == j; the rest is an immediate offset.
struct att_lane {
    uint32_t row; // lr * row bytes
    uint32_t x[4];
};
template <int HD> static __device__ __forceinline__ att_lane att_lane_init(int lr, int lc) {
    att_lane a;
    a.row = (uint32_t)(lr * ATT_ROW_ELEMS(HD) * 2);
#pragma unroll
    for (int j = 0; j < 4; j++)
        a.x[j] = HD % 64 == 0 ? (uint32_t)(((2 * j + lc) ^ (lr & 7)) << 4) : (uint32_t)((2 * j + lc) << 4);
    return a;
}
template <int HD> static __device__ __forceinline__ uint32_t att_lane_off(const att_lane *a, int r0, int kk) {
    return (uint32_t)(r0 * ATT_ROW_ELEMS(HD) * 2 + (kk >> 2) * 128) + a->row + a->x[kk & 3];
}

#endif
