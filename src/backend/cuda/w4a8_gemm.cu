// Grouped W4A8 GEMM, mma.sync version (w4a8_gemm.cuh). Runs on sm_89 (Ada) and sm_90.
//
// Shapes: a CTA is 8 warps and computes 256 weight rows x 64 activation rows (one tile) over all of K.
// Swap-AB: the weights are the MMA's A operand (m16, from registers) and the activations its B operand (n8,
// from shared memory), so a warp owns 32 weight rows (two m16 blocks) x 64 activation rows (eight n8 tiles):
//   * int4 weights go global -> registers with two 16-byte loads per 16-row block and 128-group, in the
//     fragment order of w4a8_layout.cuh, and become e4m3 A fragments with one LOP3 (or four ops) per 4 codes;
//     each weight byte is read once per CTA and converted once;
//   * activations: per 128-group, a 64 x 128-byte e4m3 tile and its 64 scales go global -> shared through a
//     3-stage cp.async pipeline (16-byte chunks XOR-swizzled by row, read conflict-free with ldmatrix);
//   * scales in the accumulator: each 128-group accumulates into a partial, then acc += partial * (weight
//     scale x 512 x activation scale) per element, as the CPU emulation (cpu_linear.c) does.
// The floor it chases: max(int4 bytes of the touched experts / 4.25 TB/s, FLOPs / the mma.sync e4m3 rate).
#include <cuda_fp8.h>

#include "backend/cuda/w4a8_gemm.cuh"
#include "backend/cuda/w4a8_layout.cuh"
#include "backend/w4a8_workspace.h"

#define BM      256
#define BN      FM_W4A8_BN
#define STAGES  3
#define THREADS 256

typedef struct gemm_params {
    const uint8_t       *wq;
    const __nv_bfloat16 *ws;
    int64_t              rows, rows_pad, n_groups;
    bool                 interleaved;
    const uint8_t       *x;
    int64_t              ldx;
    const float         *xs;
    int64_t              lds;
    const fm_w4a8_tile  *tiles;
    const int32_t       *n_tiles;
    int64_t              m_dense;
    int32_t              dense_matrix;
    __nv_bfloat16       *y;
    int64_t              ldy;
    const int32_t       *row_map;
    uint8_t             *h;
    int64_t              ldh;
    float               *hs;
    int64_t              ldhs;
} gemm_params;

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_1(void) { asm volatile("cp.async.wait_group 1;\n" ::); }

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void mma_e4m3(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The two e4m3 fragment registers held by one packed word (w4a8_layout.cuh): rows r and r + 8.
static __device__ __forceinline__ uint32_t codes_top(uint32_t w) { return w & 0x87878787u; }
static __device__ __forceinline__ uint32_t codes_bottom(uint32_t w) {
    return ((w >> 3) & 0x07070707u) | ((w << 1) & 0x80808080u);
}

static __device__ __forceinline__ fm_w4a8_tile tile_of(const gemm_params &p, int64_t i) {
    if (p.tiles) return p.tiles[i];
    const int64_t r0 = i * BN, n = p.m_dense - r0 < BN ? p.m_dense - r0 : BN;
    fm_w4a8_tile t = {p.dense_matrix, (int32_t)r0, (int32_t)n, 0};
    return t;
}

// Activation tile of 128-group grp into one stage: rows past the tile are zero-filled.
static __device__ __forceinline__ void load_stage(const gemm_params &p, const fm_w4a8_tile &tile, int64_t grp,
                                                  uint8_t *xs_smem, float *sc_smem) {
    for (int c = threadIdx.x; c < BN * 8; c += THREADS) {
        const int      n = c >> 3, ch = c & 7;
        const bool     ok = n < tile.rows;
        const uint8_t *src = p.x + (int64_t)(tile.slot0 + (ok ? n : 0)) * p.ldx + grp * 128 + ch * 16;
        cp_async16(smem_u32(xs_smem + n * 128 + ((ch ^ (n & 7)) << 4)), src, ok ? 16 : 0);
    }
    if (threadIdx.x < BN) {
        const int  n = threadIdx.x;
        const bool ok = n < tile.rows;
        cp_async4(smem_u32(sc_smem + n), p.xs + grp * p.lds + tile.slot0 + (ok ? n : 0), ok ? 4 : 0);
    }
}

// Half h of one warp's weights for 128-group grp (words 4h..4h+3 of both 16-row blocks: k steps 2h, 2h + 1).
static __device__ __forceinline__ void load_weight_half(const uint8_t *wblk, int64_t grp, int64_t n_groups, int h,
                                                        uint32_t words[2][8]) {
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const uint4 v = __ldg((const uint4 *)(wblk + ((int64_t)mb * n_groups + grp) * FM_TC_CHUNK + h * 512));
        words[mb][4 * h] = v.x, words[mb][4 * h + 1] = v.y, words[mb][4 * h + 2] = v.z, words[mb][4 * h + 3] = v.w;
    }
}

// The row scales of one warp for 128-group grp (rows g, g + 8 of both blocks), times the 512 of the e4m3 subnormals.
static __device__ __forceinline__ void load_weight_scales(const __nv_bfloat16 *wsc, int64_t grp, int64_t rows_pad,
                                                          float sc[2][2]) {
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const __nv_bfloat16 *s = wsc + grp * rows_pad + mb * 16;
        sc[mb][0] = __bfloat162float(s[0]) * 512.0f;
        sc[mb][1] = __bfloat162float(s[8]) * 512.0f;
    }
}

static __device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <int EPILOGUE>
static __global__ __launch_bounds__(THREADS, 1) void w4a8_gemm_kernel(const gemm_params p) {
    __shared__ __align__(128) uint8_t xs_smem[STAGES][BN * 128];
    __shared__ float sc_smem[STAGES][BN];
    __shared__ float red[THREADS / 32][BN];

    const int64_t tile_idx = blockIdx.y;
    if (p.n_tiles && tile_idx >= *p.n_tiles) return;
    const fm_w4a8_tile tile = tile_of(p, tile_idx);
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t row_base = (int64_t)blockIdx.x * BM + warp * 32; /* first tiled weight row of this warp */
    const bool    active = row_base < p.rows_pad;
    const int64_t KG = p.n_groups;
    const uint8_t *wblk = p.wq + ((int64_t)tile.expert * (p.rows_pad / 16) + row_base / 16) * KG * FM_TC_CHUNK + lane * 16;
    const __nv_bfloat16 *wsc = p.ws + (int64_t)tile.expert * KG * p.rows_pad + row_base + g;

    float    acc[2][8][4];
    uint32_t words[2][8]; /* the current group's codes; each half is reloaded with the next group's once used */
    float    scur[2][2], snext[2][2];
#pragma unroll
    for (int mb = 0; mb < 2; mb++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mb][nt][i] = 0.0f;

    load_stage(p, tile, 0, xs_smem[0], sc_smem[0]);
    cp_async_commit();
    if (KG > 1) load_stage(p, tile, 1, xs_smem[1], sc_smem[1]);
    cp_async_commit();
    if (active) {
        load_weight_half(wblk, 0, KG, 0, words);
        load_weight_half(wblk, 0, KG, 1, words);
        load_weight_scales(wsc, 0, p.rows_pad, scur);
    }

    for (int64_t grp = 0; grp < KG; grp++) {
        const bool more = grp + 1 < KG;
        if (active && more) load_weight_scales(wsc, grp + 1, p.rows_pad, snext);
        cp_async_wait_1();
        __syncthreads(); /* stage grp landed for all threads; stage grp - 1 is free */
        if (grp + 2 < KG) load_stage(p, tile, grp + 2, xs_smem[(grp + 2) % STAGES], sc_smem[(grp + 2) % STAGES]);
        cp_async_commit();
        if (!active) continue;
        const uint8_t *xt = xs_smem[grp % STAGES];
        const float   *sc = sc_smem[grp % STAGES];
        float part[2][8][4];
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mb][nt][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                a[mb][0] = codes_top(words[mb][2 * s]);
                a[mb][1] = codes_bottom(words[mb][2 * s]);
                a[mb][2] = codes_top(words[mb][2 * s + 1]);
                a[mb][3] = codes_bottom(words[mb][2 * s + 1]);
            }
            if (s % 2 == 1 && more) load_weight_half(wblk, grp + 1, KG, s / 2, words); /* a full group ahead */
#pragma unroll
            for (int np = 0; np < 4; np++) {
                /* matrices: n8 tile 2np (k chunks 2s, 2s + 1), then n8 tile 2np + 1 */
                const int n = (2 * np + (lane >> 4)) * 8 + (lane & 7), chunk = 2 * s + ((lane >> 3) & 1);
                uint32_t  b[4];
                ldmatrix_x4(b, smem_u32(xt + n * 128 + ((chunk ^ (n & 7)) << 4)));
#pragma unroll
                for (int mb = 0; mb < 2; mb++) {
                    mma_e4m3(part[mb][2 * np], a[mb], b[0], b[1]);
                    mma_e4m3(part[mb][2 * np + 1], a[mb], b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const float2 xsc = *(const float2 *)(sc + nt * 8 + 2 * t);
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                acc[mb][nt][0] = fmaf(part[mb][nt][0], scur[mb][0] * xsc.x, acc[mb][nt][0]);
                acc[mb][nt][1] = fmaf(part[mb][nt][1], scur[mb][0] * xsc.y, acc[mb][nt][1]);
                acc[mb][nt][2] = fmaf(part[mb][nt][2], scur[mb][1] * xsc.x, acc[mb][nt][2]);
                acc[mb][nt][3] = fmaf(part[mb][nt][3], scur[mb][1] * xsc.y, acc[mb][nt][3]);
            }
        }
#pragma unroll
        for (int mb = 0; mb < 2; mb++) scur[mb][0] = snext[mb][0], scur[mb][1] = snext[mb][1];
    }

    if (EPILOGUE == FM_W4A8_OUT_BF16) {
        if (!active) return;
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int64_t tr = row_base + mb * 16 + g + 8 * half;
                if (tr >= p.rows) continue;
                const int64_t col = fm_tc_source_row(tr, p.rows, p.interleaved);
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int n = nt * 8 + 2 * t + c;
                        if (n >= tile.rows) continue;
                        const int64_t slot = tile.slot0 + n, row = p.row_map ? p.row_map[slot] : slot;
                        p.y[row * p.ldy + col] = __float2bfloat16_rn(acc[mb][nt][2 * half + c]);
                    }
            }
        return;
    }

    /* SwiGLU: this CTA's 256 tiled rows are the gate and up rows of 128 channels = one 128-group of h */
    const int64_t I = p.rows / 2;
    float amax[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) amax[nt][0] = amax[nt][1] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const int64_t ch = (row_base / 16 + mb) * 8 + g;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float gate = round_bf16(acc[mb][nt][c]), up = round_bf16(acc[mb][nt][2 + c]);
                const float hv = (active && ch < I) ? round_bf16(gate / (1.0f + expf(-gate)) * up) : 0.0f;
                acc[mb][nt][c] = hv;
                amax[nt][c] = fmaxf(amax[nt][c], fabsf(hv));
            }
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float m = amax[nt][c];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            if (g == 0) red[warp][nt * 8 + 2 * t + c] = m;
        }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int n = nt * 8 + 2 * t + c;
            float m = 0.0f;
#pragma unroll
            for (int w = 0; w < THREADS / 32; w++) m = fmaxf(m, red[w][n]);
            const float scale = fmaxf(m / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
            if (n >= tile.rows) continue;
            const int64_t slot = tile.slot0 + n;
            if (warp == 0 && g == 0) p.hs[(int64_t)blockIdx.x * p.ldhs + slot] = scale;
            if (!active) continue;
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                const int64_t ch = (row_base / 16 + mb) * 8 + g;
                if (ch < I)
                    p.h[slot * p.ldh + ch] =
                        (uint8_t)__nv_cvt_float_to_fp8(acc[mb][nt][c] / scale, __NV_SATFINITE, __NV_E4M3);
            }
        }
}

void fm_cuda_w4a8_gemm(const fm_w4a8_args *a, cudaStream_t s) {
    const fm_bank *w = a->w;
    if (w->fmt != FM_W_INT4_G128_TC || a->max_tiles <= 0 || (a->tiles == NULL) != (a->n_tiles == NULL) ||
        (a->epilogue == FM_W4A8_OUT_SWIGLU_E4M3 && (!w->interleaved || !a->h || !a->hs)) ||
        (a->epilogue == FM_W4A8_OUT_BF16 && !a->y) || a->max_tiles > 65535) {
        fprintf(stderr, "fp8moe: w4a8_gemm: bad arguments (format %s, epilogue %d, tiles %lld)\n",
                fm_wformat_name(w->fmt), (int)a->epilogue, (long long)a->max_tiles);
        abort();
    }
    const gemm_params p = {(const uint8_t *)w->w, w->scales, w->rows, w->rows_pad, w->n_groups, w->interleaved, a->x,
                           w->ld, a->xs, a->lds, a->tiles, a->n_tiles, a->m_dense, a->dense_matrix, a->y, a->ldy, a->row_map, a->h,
                           a->ldh, a->hs, a->ldhs};
    const dim3 grid((unsigned)fm_ceil_div(w->rows_pad, BM), (unsigned)a->max_tiles);
    if (a->epilogue == FM_W4A8_OUT_BF16) {
        w4a8_gemm_kernel<FM_W4A8_OUT_BF16><<<grid, THREADS, 0, s>>>(p);
        FM_LAUNCH_CHECK("w4a8_gemm (bf16 out)");
    } else {
        w4a8_gemm_kernel<FM_W4A8_OUT_SWIGLU_E4M3><<<grid, THREADS, 0, s>>>(p);
        FM_LAUNCH_CHECK("w4a8_gemm (swiglu e4m3 out)");
    }
}
