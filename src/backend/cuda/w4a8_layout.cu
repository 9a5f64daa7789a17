// Repack of an int4 bank from the row layout to the tensor-core layout (w4a8_layout.cuh). Runs once per bank at
// load: one thread per output 32-bit word (4 bytes = 4 k positions x rows (r, r + 8)), reading the row layout
// through L2. Not on any hot path.
#include "backend/cuda/w4a8_layout.cuh"

static __device__ int code_at(const uint8_t *src, int64_t ld, int64_t row, int64_t k) {
    const uint8_t byte = src[row * ld + k / 2];
    const int nib = (k & 1) ? byte >> 4 : byte & 0xF;
    return nib >= 8 ? nib - 16 : nib; /* two's complement nibble */
}

static __global__ void repack_kernel(const uint8_t *src, const __nv_bfloat16 *src_scales, int32_t n, int64_t rows,
                                     int64_t cols, int64_t ld, int64_t n_groups, bool interleaved, uint32_t *dst,
                                     __nv_bfloat16 *dst_scales, int64_t rows_pad, int *bad_codes) {
    const int64_t n_blocks = rows_pad / 16, words = (int64_t)n * n_blocks * n_groups * (FM_TC_CHUNK / 4);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        const int in_chunk = (int)(i % (FM_TC_CHUNK / 4)); /* [half][lane][4 words] */
        const int64_t chunk = i / (FM_TC_CHUNK / 4);
        const int64_t grp = chunk % n_groups, blk = (chunk / n_groups) % n_blocks, mat = chunk / (n_groups * n_blocks);
        const int half = in_chunk / 128, lane = (in_chunk / 4) % 32, j = half * 4 + in_chunk % 4;
        const int s = j / 2, p = j % 2, g = lane / 4, t = lane % 4;
        const int64_t r_top = blk * 16 + g, r_bot = r_top + 8;
        const int64_t src_top = fm_tc_source_row(r_top, rows, interleaved),
                      src_bot = fm_tc_source_row(r_bot, rows, interleaved);
        const uint8_t *m = src + (int64_t)mat * rows * ld;
        uint32_t word = 0, sign_b = 0; /* sign_b: bit b = the sign of code B of byte b */
        for (int b = 0; b < 4; b++) {
            const int64_t k = grp * FM_TC_K_GROUP + 32 * s + 16 * p + 4 * t + b;
            const int a = (r_top < rows && k < cols) ? code_at(m, ld, src_top, k) : 0;
            const int c = (r_bot < rows && k < cols) ? code_at(m, ld, src_bot, k) : 0;
            if (a == -8 || c == -8) atomicAdd(bad_codes, 1);
            const uint32_t byte = (uint32_t)(a < 0 ? 0x80 | -a : a) | (uint32_t)((c < 0 ? -c : c) << 4);
            word |= (byte & 0xFFu) << (8 * b);
            sign_b |= (uint32_t)(c < 0) << b;
        }
        for (int b = 0; b < 4; b++) /* B's sign of byte b sits in bit 3 of byte b + 1 (mod 4) */
            word |= ((sign_b >> b) & 1u) << (8 * ((b + 1) & 3) + 3);
        dst[i] = word;
    }
    /* scales: [mat][grp][rows_pad], padded rows 0 */
    const int64_t n_scales = (int64_t)n * n_groups * rows_pad;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_scales;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i % rows_pad, grp = (i / rows_pad) % n_groups, mat = i / (rows_pad * n_groups);
        dst_scales[i] =
            r < rows ? src_scales[((int64_t)mat * rows + fm_tc_source_row(r, rows, interleaved)) * n_groups + grp]
                     : __float2bfloat16_rn(0.0f);
    }
}

extern "C" void fm_cuda_repack_int4_tc(const uint8_t *src, const __nv_bfloat16 *src_scales, int32_t n, int64_t rows,
                                       int64_t cols, int64_t ld, int64_t n_groups, bool interleaved, uint8_t *dst,
                                       __nv_bfloat16 *dst_scales, int64_t rows_pad, int *bad_codes, cudaStream_t s) {
    if (rows_pad % FM_TC_ROW_PAD || rows_pad < rows || (interleaved && rows % 16)) {
        fprintf(stderr, "fp8moe: repack_int4_tc: bad shape rows %lld rows_pad %lld interleaved %d\n", (long long)rows,
                (long long)rows_pad, (int)interleaved);
        abort();
    }
    const int64_t words = (int64_t)n * (rows_pad / 16) * n_groups * (FM_TC_CHUNK / 4);
    const int64_t blocks = fm_ceil_div(words, 256);
    if (blocks == 0) return;
    repack_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(
        src, src_scales, n, rows, cols, ld, n_groups, interleaved, (uint32_t *)dst, dst_scales, rows_pad, bad_codes);
    FM_LAUNCH_CHECK("repack_int4_tc");
}
