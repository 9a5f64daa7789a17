// The int4 tensor-core layout (FM_W_INT4_G128_TC): how the W4A8 kernels (w4a8_gemm.cu) want an int4 bank.
//
// The codes and scales are those of the row layout (symmetric, groups of 128 along K, bf16 scales; the
// quantizer gives -7..7, never -8). What changes is where they sit and how a nibble is written:
//
// * Sign-magnitude in place of two's complement, and the value read as an e4m3 *subnormal*. An e4m3 byte
//   S0000MMM is (-1)^S * M * 2^-9, so a code q in -7..7 becomes an exact e4m3 value q / 512 with nothing
//   but a mask: the kernel's conversion is one LOP3 for half the codes and a funnel shift and a LOP3 for the
//   other half, no table, no float math. The 512 goes back in with the group scale (exact: a power of two).
// * Fragment order. A byte holds two codes that the mma.sync m16n8k32 A fragment needs together: rows r and
//   r + 8 of a 16-row block at the same k. Byte b of a word: code A (row r) in bits 0-2 (magnitude) and 7
//   (sign), the magnitude of code B (row r + 8) in bits 4-6, and in bit 3 the sign of code B of byte b - 1
//   (mod 4: byte 0 holds byte 3's). Then           A = w & 0x87878787
//                                                  B = rotate_right(w, 4) & 0x87878787
//   (the rotation brings each byte's bits 4-6 down to 0-2 and the next byte's bit 3 up to bit 7). The earlier
//   layout, B in bits 3-5 and 6 of its own byte, took 4 instructions for B (shift, shift, 2 LOP3).
//   For a 16-row block and a 128-group, the 32 lanes of a warp need 32 bytes each; they are stored as
//   [half h][lane][16 bytes], 1024 bytes, so each of a warp's two 16-byte loads reads 512 contiguous bytes.
//   Lane L = 4g + t, word j = 4h + jj (0..7), step s = j / 2 (k offset 32 s), part p = j % 2 (k offset 16 p):
//   byte b of word j = codes of rows (g, g + 8) at k = 32 s + 16 p + 4 t + b.
//   Blocks are ordered [matrix][16-row block][group], so a warp streams its rows' K in one run.
// * Rows padded to 32 (a warp's two 16-row blocks are both present or both absent), K to a multiple of 128,
//   the padding zero. Scales are bf16 [matrix][group][rows_pad] (the rows of one group side by side).
// * gate|up banks are interleaved by 8 rows: in 16-row block b, rows 0-7 are gate channels 8b..8b+7 and rows
//   8-15 the up channels of the same 8, so one thread's accumulators hold gate and up of a channel and the
//   SwiGLU happens in registers. Needs I % 8 == 0.
#ifndef FM_CUDA_W4A8_LAYOUT_CUH
#define FM_CUDA_W4A8_LAYOUT_CUH

#include "backend/cuda/cuda_common.cuh"

#define FM_TC_ROW_PAD 32
#define FM_TC_K_GROUP 128
#define FM_TC_CHUNK 1024 /* bytes per (16-row block, 128-group) */

// The two e4m3 fragment registers held by one packed word: rows r (top) and r + 8 (bottom) of a 16-row block.
static __device__ __forceinline__ uint32_t codes_top(uint32_t w) { return w & 0x87878787u; }
static __device__ __forceinline__ uint32_t codes_bottom(uint32_t w) { return __funnelshift_r(w, w, 4) & 0x87878787u; }

// The three banks in these tiles, as the W4A8 kernels template them (WK): ours (int4-tc, above), a checkpoint's
// unsigned int4 (int4-zp-tc: row r in the low nibble, r + 8 in the high one; u read as an e4m3 byte is u / 512),
// a checkpoint's e4m3 bytes (e4m3-block: 2048-byte chunks, [k step s][lane][16 bytes], word i of step s the A
// register a_i). cuda_bank_prequant.cu packs the last two.
enum { WK_INT4, WK_INT4_ZP, WK_E4M3 };

// Bytes of one (16-row block, 128-group) chunk, and its 16-byte parts per lane (words 4p..4p+3 of part p).
template <int WK> struct wk_shape {
    static constexpr int chunk = WK == WK_E4M3 ? 2 * FM_TC_CHUNK : FM_TC_CHUNK;
    static constexpr int parts = chunk / 512;
    static constexpr int words = 4 * parts;
};

// The mma.sync m16n8k32 A fragment (mma_e4m3.cuh) of k step s from the words of one 16-row block.
template <int WK> static __device__ __forceinline__ void weight_fragment(const uint32_t *words, int s, uint32_t a[4]) {
    if (WK == WK_INT4) {
        a[0] = codes_top(words[2 * s]), a[1] = codes_bottom(words[2 * s]);
        a[2] = codes_top(words[2 * s + 1]), a[3] = codes_bottom(words[2 * s + 1]);
    } else if (WK == WK_INT4_ZP) {
        a[0] = words[2 * s] & 0x0F0F0F0Fu, a[1] = (words[2 * s] >> 4) & 0x0F0F0F0Fu;
        a[2] = words[2 * s + 1] & 0x0F0F0F0Fu, a[3] = (words[2 * s + 1] >> 4) & 0x0F0F0F0Fu;
    } else {
        a[0] = words[4 * s], a[1] = words[4 * s + 1], a[2] = words[4 * s + 2], a[3] = words[4 * s + 3];
    }
}

// Source row of tiled row r of a bank with `rows` rows (interleaved: a gate|up bank of 2I rows).
static inline __host__ __device__ int64_t fm_tc_source_row(int64_t r, int64_t rows, bool interleaved) {
    if (!interleaved) return r;
    const int64_t b = r / 16, w = r % 16, I = rows / 2;
    return w < 8 ? 8 * b + w : I + 8 * b + (w - 8);
}

// Repacks n matrices of the row layout (cuda_internal.cuh: codes [n][rows][ld] two's complement nibbles,
// scales [n][rows][n_groups]) into the tensor-core layout: dst [n][rows_pad / 16][n_groups][1024] bytes and
// dst_scales [n][n_groups][rows_pad]. Sign-magnitude cannot hold -8 (our quantizer never makes one; an imported
// checkpoint might): *bad_codes (a device int the caller zeroes) counts the -8 codes seen, for the caller to refuse.
extern "C" void fm_cuda_repack_int4_tc(const uint8_t *src, const __nv_bfloat16 *src_scales, int32_t n, int64_t rows,
                                       int64_t cols, int64_t ld, int64_t n_groups, bool interleaved, uint8_t *dst,
                                       __nv_bfloat16 *dst_scales, int64_t rows_pad, int *bad_codes, cudaStream_t s);

#endif
