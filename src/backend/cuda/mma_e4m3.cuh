// mma.sync.m16n8k32 with e4m3 operands and fp32 accumulation: the FP8 tensor-core instruction of sm_89 (Ada)
// that sm_90 runs too. Fragments (PTX ISA, "mma.m16n8k32"), lane = 4 g + t:
//   A (16 x 32, row-major): a0 row g, k 4t..4t+3; a1 row g+8, same k; a2 row g, k 16+4t..; a3 row g+8, same k
//   B (32 x 8, "col"):      b0 column g, k 4t..4t+3; b1 column g, k 16+4t..
//   C/D (16 x 8):           d0 d1 row g, columns 2t, 2t+1; d2 d3 row g+8, same columns
#ifndef FM_CUDA_MMA_E4M3_CUH
#define FM_CUDA_MMA_E4M3_CUH

#include <stdint.h>

static __device__ __forceinline__ void mma_e4m3(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
