// GEMV over a weight bank (see gemv.cuh).
//
// Grid (ceil(P / MR), ceil(N / 64)); 8 warps per block, 8 output elements (for MR input rows) per warp. The block first
// copies its input row to shared memory (bf16, zero-padded to the bank's padded row), then each lane walks the weight
// row in 16-byte loads: 8 bf16 weights, or 32 int4 codes. An int4 chunk of 32 lies inside one 128-group, so the lane
// scales its partial sum once per chunk: acc += scale_g * sum(x * q), the per-group promotion of the CPU reference (a
// checkpoint's int4-zp groups may be as small as 8: once per word, sum(x * (u - z))). Floor: the weight bytes, read
// once per output row p (the baseline re-reads an expert's weights for every token routed to it), at ~4.25 TB/s.
#include "backend/cuda/gemv.cuh"

#define GEMV_WARPS 8
#define GEMV_ROWS_PER_WARP 8 /* outputs per warp: one shared-memory copy of x serves 64 outputs */

// MR input rows per block share each weight load (dense projections: MR = 4; routed pairs, whose rows use
// different experts: MR = 1).
// MODE: BF16, INT4 (symmetric, bf16 scales per 128) or INT4_ZP (a checkpoint's unsigned codes, a zero point and an
// fp32 scale per (row, group of zp.group), x gathered through zp.perm when the bank has an act-order permutation).
enum { GEMV_BF16, GEMV_INT4, GEMV_INT4_ZP };

typedef struct gemv_zp {
    const float *scales;  // [n][rows][n_groups]
    const uint8_t *zeros; // [n][rows][n_groups]
    const int32_t *perm;  // [n][cols] or NULL
    int32_t group;
} gemv_zp;

template <int MODE, int MR>
static __global__ void gemv_kernel(const void *wbase, const __nv_bfloat16 *scales, int64_t rows, int64_t cols,
                                   int64_t ld, int64_t n_groups, int32_t idx, const int32_t *matrix_of_row,
                                   const __nv_bfloat16 *x, int64_t x_row_div, int64_t P, __nv_bfloat16 *y, gemv_zp zp) {
    const bool INT4 = MODE != GEMV_BF16;
    extern __shared__ __nv_bfloat16 xs[];
    /* x rows in shared memory. int4: each lane reads the 32 x values of its 16-byte weight chunk, so chunks
       of 32 are stored 40 apart (80 bytes): the 16-byte reads of 8 lanes then fall in distinct banks */
    const int64_t p0 = blockIdx.x * (int64_t)MR, kpad = INT4 ? ld * 2 : ld;
    const int64_t rowlen = INT4 ? kpad / 32 * 40 : kpad;
    const int64_t e = matrix_of_row ? matrix_of_row[p0] : idx;
    const int32_t *perm = MODE == GEMV_INT4_ZP && zp.perm ? zp.perm + e * cols : NULL;
    for (int r = 0; r < MR; r++) {
        const bool live = p0 + r < P;
        const __nv_bfloat16 *xr = x + ((p0 + r) / x_row_div) * cols;
        for (int64_t k = threadIdx.x; k < kpad; k += blockDim.x)
            xs[r * rowlen + (INT4 ? k / 32 * 40 + k % 32 : k)] =
                live && k < cols ? xr[perm ? perm[k] : k] : __float2bfloat16_rn(0.0f);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int nn = 0; nn < GEMV_ROWS_PER_WARP; nn++) {
        const int64_t n = (blockIdx.y * (int64_t)GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_ROWS_PER_WARP + nn;
        if (n >= rows) return;
        const int64_t row = e * rows + n;
        float acc[MR];
#pragma unroll
        for (int r = 0; r < MR; r++) acc[r] = 0.0f;
        if (INT4) {
            const uint4 *wr = (const uint4 *)((const uint8_t *)wbase + row * ld);
            for (int64_t c = lane; c < ld / 16; c += 32) {
                const uint4 v = wr[c];
                const uint32_t words[4] = {v.x, v.y, v.z, v.w};
                if (MODE == GEMV_INT4_ZP) { /* 8 codes (a word) lie inside one group: group % 8 == 0, or one group */
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int64_t g = n_groups == 1 ? 0 : (c * 32 + 8 * j) / zp.group;
                        g = g < n_groups ? g : n_groups - 1; /* the K padding (zero inputs) */
                        const float z = (float)zp.zeros[row * n_groups + g], sc = zp.scales[row * n_groups + g];
#pragma unroll
                        for (int r = 0; r < MR; r++) {
                            const uint4 xv = ((const uint4 *)(xs + r * rowlen + c * 40))[j];
                            const __nv_bfloat16 *xb = (const __nv_bfloat16 *)&xv;
                            float part = 0.0f;
#pragma unroll
                            for (int i = 0; i < 8; i++)
                                part += __bfloat162float(xb[i]) * ((float)((words[j] >> (i * 4)) & 0xFu) - z);
                            acc[r] += part * sc;
                        }
                    }
                } else {
                    float q[32];
#pragma unroll
                    for (int i = 0; i < 32; i++)
                        q[i] = (float)((int)(((words[i >> 3] >> ((i & 7) * 4)) & 0xFu) ^ 8u) - 8);
                    const float sc = __bfloat162float(scales[row * n_groups + (c * 32) / 128]);
#pragma unroll
                    for (int r = 0; r < MR; r++) {
                        const uint4 *xk = (const uint4 *)(xs + r * rowlen + c * 40);
                        float part = 0.0f;
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const uint4 xv = xk[j];
                            const __nv_bfloat16 *xb = (const __nv_bfloat16 *)&xv;
#pragma unroll
                            for (int i = 0; i < 8; i++) part += __bfloat162float(xb[i]) * q[8 * j + i];
                        }
                        acc[r] += part * sc;
                    }
                }
            }
        } else {
            const uint4 *wr = (const uint4 *)((const __nv_bfloat16 *)wbase + row * ld);
            for (int64_t c = lane; c < ld / 8; c += 32) {
                const uint4 v = wr[c];
                const __nv_bfloat16 *wv = (const __nv_bfloat16 *)&v;
#pragma unroll
                for (int r = 0; r < MR; r++) {
                    const __nv_bfloat16 *xk = xs + r * rowlen + c * 8;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r] += __bfloat162float(xk[i]) * __bfloat162float(wv[i]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MR; r++) {
            float a = acc[r];
            for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0 && p0 + r < P) y[(p0 + r) * rows + n] = __float2bfloat16_rn(a);
        }
    }
}

template <int MODE, int MR>
static void launch(const fm_bank *w, int32_t idx, const int32_t *matrix_of_row, const __nv_bfloat16 *x,
                   int64_t x_row_div, int64_t P, __nv_bfloat16 *y, size_t smem, cudaStream_t s) {
    dim3 grid((unsigned)fm_ceil_div(P, MR), (unsigned)fm_ceil_div(w->rows, GEMV_WARPS * GEMV_ROWS_PER_WARP));
    const gemv_zp zp = {w->fscales, w->zeros, w->perm, w->group};
    gemv_kernel<MODE, MR><<<grid, GEMV_WARPS * 32, smem * MR, s>>>(
        w->w, w->scales, w->rows, w->cols, w->ld, w->n_groups, idx, matrix_of_row, x, x_row_div, P, y, zp);
}

void fm_cuda_gemv(const fm_bank *w, int32_t idx, const int32_t *matrix_of_row, const __nv_bfloat16 *x,
                  int64_t x_row_div, int64_t P, __nv_bfloat16 *y, cudaStream_t s) {
    const bool zp = w->fmt == FM_W_INT4_ZP, int4 = w->fmt == FM_W_INT4_G128 || zp;
    const int64_t kpad = int4 ? w->ld * 2 : w->ld, rowlen = int4 ? kpad / 32 * 40 : kpad;
    const size_t smem = (size_t)rowlen * sizeof(__nv_bfloat16); /* per input row */
    if (smem > 48 * 1024 || fm_ceil_div(w->rows, GEMV_WARPS * GEMV_ROWS_PER_WARP) > 65535 || P > INT32_MAX ||
        (int4 && w->ld % 16) || (!int4 && w->ld % 8) || (zp && w->n_groups > 1 && w->group % 8)) {
        fprintf(stderr, "fp8moe: gemv: unsupported shape (K %lld, rows %lld) or layout\n", (long long)w->cols,
                (long long)P);
        abort();
    }
    if (P == 0) return;
    /* rows sharing one matrix (no per-row matrix) share weight loads, 4 at a time */
    const bool shared = matrix_of_row == NULL && smem * 4 <= 48 * 1024;
    if (zp)
        shared ? launch<GEMV_INT4_ZP, 4>(w, idx, NULL, x, x_row_div, P, y, smem, s)
               : launch<GEMV_INT4_ZP, 1>(w, idx, matrix_of_row, x, x_row_div, P, y, smem, s);
    else if (int4)
        shared ? launch<GEMV_INT4, 4>(w, idx, NULL, x, x_row_div, P, y, smem, s)
               : launch<GEMV_INT4, 1>(w, idx, matrix_of_row, x, x_row_div, P, y, smem, s);
    else
        shared ? launch<GEMV_BF16, 4>(w, idx, NULL, x, x_row_div, P, y, smem, s)
               : launch<GEMV_BF16, 1>(w, idx, matrix_of_row, x, x_row_div, P, y, smem, s);
    FM_LAUNCH_CHECK(zp ? "gemv_int4_zp" : int4 ? "gemv_int4" : "gemv_bf16");
}
