// The fold route's prefill GEMM (sm_90a), warp-specialised: the grouped W4A8 GEMM of int4-p2 banks in the fold code
// layout (backend/w4a8_fold.h) on the dispatch's tiles of up to 256 rows, one activation scale per token, all of K
// accumulated by the tensor cores without promotion. Launcher and arguments: w4a8_fold_ws.h. The form is lab/
// w4a8_ws.cu's q256c2l1 (bench/NOTES.md thirty-seventh session; docs/RESULTS.md 2.29), which the engine's other
// kernels cannot reach: there each consumer warp converts int4 codes in its own instruction stream.
//
// Work item: (tile t of the dispatch, 128-column tile c of the bank), columns fastest; a persistent grid of one CTA
// per SM walks the items (the device's tile count: graph safe). Tiles: BM = 256 activation rows x BN = 128 weight
// rows x KG = 128 (one scale group) per stage.
// CTA: 640 threads (registers by setmaxnreg, 96 at entry):
//   warpgroups 0, 1  consumers (184 registers): warpgroup w owns activation rows 128 w .. 128 w + 127 as two m64
//                    blocks; per stage 4 k steps x 2 blocks of wgmma.m64n128k32 e4m3 (both operands in shared
//                    memory) into fp32 accumulators, one stage in flight, a block with none of the tile's rows
//                    skipped (a part-full tile costs its rows' MMAs only); warpgroup 1 runs one stage behind 0 (a
//                    clock spin at its start) so that each one's epilogue runs under the other's wgmmas
//   warpgroups 2, 3  converters (40 registers): thread t converts the 16-byte code pieces t, t + 256, .. of the
//                    stage (w4a8_fold.h: 8 codes by two byte permutes through the row's e4m3 table of exponent j)
//                    into the weight tile's 128-byte swizzled rows, fences them for the async proxy, arrives
//   warpgroup 4      the producer (32 registers; one thread): per stage the activation tile by TMA (a tensor map
//                    over x, 128-byte swizzle, rows past the slots zero; one box of 128 rows for each consumer
//                    warpgroup with rows), the codes by four 1-D bulk copies (each
//                    segment's rows are contiguous in the fold layout) and the exponents by one
// Shared memory: 4 stages of [A 256 x 128 B | W 128 x 128 B | codes 8 KB] (56 KB, 1024-aligned), then the stages'
// exponents (128 B each): 226 KB. Barriers per stage: full (the producer's expect_tx and its copies), ready (the 256
// converter threads), empty (one arrival per consumer warpgroup once the wgmmas that read it completed).
// A partial column tile (rows_pad - c < 128) copies only its rows: the weight tile's other rows hold stale values,
// which reach only output columns that are not stored (column n of the product reads only row n of W).
// Epilogue from the fragments: BF16 out y = acc x (rs[col] x xs[slot]) through the row map; SWIGLU on an interleaved
// bank (8 gate rows, then their 8 up rows: fragment tiles 2b and 2b + 1 of a thread hold the gate and the up of the
// same channels) h = bf16(silu(g) u), g and u rounded to bf16 first.
// Floor (Qwen3-30B-A3B's layer, T = 8192: 619 GFLOP at ~1.3 PFLOP/s dense FP8 = 0.48 ms); lab, H100: both GEMMs 0.350
// / 0.925 ms at T = 2048 / 8192, 0.31 / 0.85 without the conversion (RESULTS 2.29); this kernel on the lab's data,
// H200: 0.324 / 0.950 (RESULTS 2.32).
#include <cuda.h>
#include <cuda_bf16.h>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/tensor_map.cuh"
#include "backend/cuda/w4a8_fold_ws.h"
#include "backend/cuda/warp_specialised.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/wgmma_ss_e4m3.cuh"
extern "C" {
#include "backend/w4a8_fold.h"
}

#define WS_BM 256
#define WS_BN 128
#define WS_KG 128
#define WS_STAGES 4
#define WS_A_BYTES (WS_BM * WS_KG)
#define WS_A_BOX_ROWS 128 /* the activation tile by one or two TMA boxes: a consumer warpgroup's rows each */
#define WS_A_BOX_BYTES (WS_A_BOX_ROWS * WS_KG)
#define WS_W_BYTES (WS_BN * WS_KG)
#define WS_C_BYTES (WS_BN * WS_KG / 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_W_BYTES + WS_C_BYTES)
#define WS_J_OFF (WS_STAGES * WS_STAGE_BYTES)
#define WS_SMEM (WS_J_OFF + WS_STAGES * WS_BN + 1024) /* + the 1024-byte alignment of the base */
#define WS_THREADS 640
#define WS_CONVERTERS 256
#define WS_ENTRY_REGS 96 /* 65536 / 640, rounded down to 8: ptxas's count at entry with setmaxnreg in the kernel */
#define WS_REG_CONSUMER 184
#define WS_REG_CONVERTER 40
#define WS_REG_PRODUCER 32
#define WS_LAG_CYCLES 1000 /* ~one stage of a warpgroup's wgmmas */
static_assert(WS_SMEM <= 227 * 1024 - 128, "the ring and its exponents fit 227 KB beside the static barriers");
static_assert(2 * WS_REG_CONSUMER + 2 * WS_REG_CONVERTER + WS_REG_PRODUCER <= 5 * WS_ENTRY_REGS, "register pool");
static_assert(FM_FOLD_WS_TILE_ROWS == WS_BM, "a dispatch tile is a work item's rows");

typedef struct ws_params {
    const uint8_t *codes;
    const int8_t *fold_j;
    const float *fold_rs;
    int64_t rows_pad;
    int32_t rows, groups, ncols; /* ncols: 128-column tiles */
    const float *xs;
    const fm_fold_tile *tiles;
    const int32_t *n_tiles;
    __nv_bfloat16 *y;
    int64_t ldy;
    const int32_t *row_map;
} ws_params;

// The row and column tile of work item w
static __device__ __forceinline__ void ws_item(const ws_params &p, int w, fm_fold_tile *tile, int *col0, int *ncopy) {
    *tile = p.tiles[w / p.ncols];
    *col0 = (w % p.ncols) * WS_BN;
    const int64_t left = p.rows_pad - *col0;
    *ncopy = left < WS_BN ? (int)left : WS_BN;
}

// A consumer warpgroup's stages of one work item: NB of its two m64 blocks hold rows of the tile (the others'
// wgmmas skipped; NB = 0 only waits and gives the stages back). One stage's wgmmas in flight; a stage goes back (one
// arrival of the warpgroup on empty) once the wgmmas that read it completed.
template <int NB>
static __device__ __forceinline__ void ws_consume_item(float acc[2][16][4], uint8_t *smem, uint64_t *full,
                                                       uint64_t *ready, uint64_t *empty, int groups, int wg,
                                                       int64_t *itp) {
    int64_t it = *itp;
    for (int g = 0; g < groups; g++, it++) {
        const int s = (int)(it % WS_STAGES);
        const uint32_t parity = (uint32_t)((it / WS_STAGES) & 1);
        ws_wait(&full[s], parity);
        ws_wait(&ready[s], parity);
        if constexpr (NB > 0) {
            const uint32_t a = smem_u32(smem + s * WS_STAGE_BYTES), b = a + WS_A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < WS_KG / 32; ks++)
#pragma unroll
                for (int mb = 0; mb < NB; mb++) /* the two accumulators alternate (independent chains) */
                    wgmma_ss<WS_BN>(acc[mb], desc_sw128(a + (wg * 2 + mb) * 64 * WS_KG + 32 * ks),
                                    desc_sw128(b + 32 * ks), 1);
            wgmma_commit();
            wgmma_wait<1>(); /* this stage's wgmmas may still run; the previous stage's are done: it goes back */
            if (g >= 1 && (threadIdx.x & 127) == 0) bulk_barrier_arrive(&empty[(it - 1) % WS_STAGES]);
        } else { /* no rows: the stage is read by the other warpgroup only */
            if ((threadIdx.x & 127) == 0) bulk_barrier_arrive(&empty[s]);
        }
    }
    if constexpr (NB > 0) {
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int nt = 0; nt < 16; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) fence_f(acc[mb][nt][r]);
        if ((threadIdx.x & 127) == 0 && groups >= 1) bulk_barrier_arrive(&empty[(it - 1) % WS_STAGES]);
    }
    *itp = it;
}

template <int SWIGLU>
static __global__ __launch_bounds__(WS_THREADS, 1) void w4a8_fold_ws_kernel(const __grid_constant__ CUtensorMap map_x,
                                                                            const ws_params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[WS_STAGES], ready[WS_STAGES], empty[WS_STAGES];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = p.groups, n_work = *p.n_tiles * p.ncols;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WS_STAGES; s++) {
            bulk_barrier_init(&full[s], 1);
            bulk_barrier_init(&ready[s], WS_CONVERTERS);
            bulk_barrier_init(&empty[s], 2);
        }
        FM_BULK_ASM("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    /* every role walks the same items and groups; the ring's stage and phase follow one running count `it` */
    if (wg == 4) { /* the producer */
        ws_setmaxnreg_dec<WS_REG_PRODUCER>();
        if (threadIdx.x == 512) {
            int64_t it = 0;
            for (int w = blockIdx.x; w < n_work; w += gridDim.x) {
                fm_fold_tile tile;
                int col0, ncopy;
                ws_item(p, w, &tile, &col0, &ncopy);
                const uint8_t *codes = p.codes + (int64_t)tile.expert * p.rows_pad * groups * 64;
                const int8_t *jm = p.fold_j + (int64_t)tile.expert * groups * p.rows_pad + col0;
                const int a_boxes = tile.rows > WS_A_BOX_ROWS ? 2 : 1; /* a consumer warpgroup's rows, if it has any */
                for (int g = 0; g < groups; g++, it++) {
                    const int s = (int)(it % WS_STAGES);
                    if (it >= WS_STAGES) ws_wait(&empty[s], (uint32_t)((it / WS_STAGES - 1) & 1));
                    uint8_t *st = smem + s * WS_STAGE_BYTES;
                    bulk_barrier_expect(&full[s], a_boxes * WS_A_BOX_BYTES + 4 * 16 * ncopy + ncopy);
                    for (int bx = 0; bx < a_boxes; bx++)
                        bulk_tensor_load_2d(st + bx * WS_A_BOX_BYTES, &map_x, g * WS_KG,
                                            tile.slot0 + bx * WS_A_BOX_ROWS, &full[s]);
#pragma unroll
                    for (int sg = 0; sg < 4; sg++) /* w4a8_fold.h: [g][segment][row][16 bytes] */
                        ws_bulk_copy(st + WS_A_BYTES + WS_W_BYTES + sg * WS_BN * 16,
                                     codes + (((int64_t)g * 4 + sg) * p.rows_pad + col0) * 16, (uint32_t)ncopy * 16,
                                     &full[s]);
                    ws_bulk_copy(smem + WS_J_OFF + s * WS_BN, jm + (int64_t)g * p.rows_pad, (uint32_t)ncopy, &full[s]);
                }
            }
        }
        return;
    }

    if (wg >= 2) { /* the converters */
        ws_setmaxnreg_dec<WS_REG_CONVERTER>();
        const int t = threadIdx.x - 256;
        int64_t it = 0;
        for (int w = blockIdx.x; w < n_work; w += gridDim.x)
            for (int g = 0; g < groups; g++, it++) {
                const int s = (int)(it % WS_STAGES);
                ws_wait(&full[s], (uint32_t)((it / WS_STAGES) & 1));
                uint8_t *wt = smem + s * WS_STAGE_BYTES + WS_A_BYTES;
                const uint8_t *codes = wt + WS_W_BYTES;
                const int8_t *jx = (const int8_t *)(smem + WS_J_OFF + s * WS_BN);
#pragma unroll
                for (int i = 0; i < WS_BN * 4 / WS_CONVERTERS; i++) {
                    const int c = i * WS_CONVERTERS + t, n = c & (WS_BN - 1), sg = c / WS_BN;
                    const uint4 q = *(const uint4 *)(codes + (sg * WS_BN + n) * 16);
                    const uint32_t j = (uint32_t)(int32_t)jx[n];
                    const uint32_t tlo = FM_FOLD_TLO0 + j * FM_FOLD_TLO_STEP, thi = FM_FOLD_THI0 + j * FM_FOLD_THI_STEP;
                    const uint2 a0 = ws_fold8(q.x, tlo, thi), a1 = ws_fold8(q.y, tlo, thi);
                    const uint2 a2 = ws_fold8(q.z, tlo, thi), a3 = ws_fold8(q.w, tlo, thi);
                    /* 32 codes = chunks 2 sg, 2 sg + 1 of row n's 128-byte line, in the 128-byte swizzle */
                    *(uint4 *)(wt + n * WS_KG + (((2 * sg) ^ (n & 7)) << 4)) = make_uint4(a0.x, a0.y, a1.x, a1.y);
                    *(uint4 *)(wt + n * WS_KG + (((2 * sg + 1) ^ (n & 7)) << 4)) = make_uint4(a2.x, a2.y, a3.x, a3.y);
                }
                FM_BULK_ASM("fence.proxy.async.shared::cta;" ::: "memory"); /* generic stores -> wgmma's reads */
                bulk_barrier_arrive(&ready[s]);
            }
        return;
    }

    /* the consumers */
    ws_setmaxnreg_inc<WS_REG_CONSUMER>();
    const int g8 = lane >> 2, t4 = lane & 3;
    if (wg == 1) { /* one stage behind warpgroup 0 (the offset persists: both read the same stages) */
        const long long t0 = clock64();
        while (clock64() - t0 < WS_LAG_CYCLES) {}
    }
    int64_t it = 0;
    for (int w = blockIdx.x; w < n_work; w += gridDim.x) {
        fm_fold_tile tile;
        int col0, ncopy;
        ws_item(p, w, &tile, &col0, &ncopy);
        /* the m64 blocks of this warpgroup's rows that hold any of the tile's rows: the others' wgmmas are skipped
           (an expert's last tile is often part full: Qwen3 at T = 2048 has ~128 rows an expert in 256-row tiles) */
        const int left = tile.rows - wg * WS_A_BOX_ROWS, blocks = left > 64 ? 2 : left > 0 ? 1 : 0;
        float acc[2][16][4];
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int nt = 0; nt < 16; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[mb][nt][r] = 0.0f;
        /* the item's stages, the wgmma pipeline whole inside each branch (a branch across a pipeline stage makes
           ptxas serialise the wgmmas: C7520) */
        if (blocks == 2) ws_consume_item<2>(acc, smem, full, ready, empty, groups, wg, &it);
        else if (blocks == 1) ws_consume_item<1>(acc, smem, full, ready, empty, groups, wg, &it);
        else ws_consume_item<0>(acc, smem, full, ready, empty, groups, wg, &it);

        /* epilogue: warp w of the warpgroup holds rows 16 w .. 16 w + 15 of each m64 block; lane (g8, t4) rows g8,
           g8 + 8 (xs4, dst4 [2 mb + h]) and columns 8 nt + 2 t4, + 1 */
        /* the epilogue's loads, all issued before its first store (the compiler cannot tell the row map and the
           scales from y): the rows' scales and output rows, the thread's 16 column-scale pairs. Loaded in the store
           loop, behind its branches, they made one dependent L2 round trip each (~7 us an item, against the lab's
           form: bench/NOTES.md thirty-ninth session) */
        float xs4[4];
        int32_t dst4[4]; /* slots and rows are int32 (fm_fold_tile, the row map) */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int lr = (wg * 2 + (i >> 1)) * 64 + (warp & 3) * 16 + g8 + 8 * (i & 1);
            const int32_t slot = tile.slot0 + lr;
            const bool ok = lr < tile.rows;
            xs4[i] = ok ? __ldg(p.xs + slot) : 0.0f;
            dst4[i] = !ok ? -1 : SWIGLU || !p.row_map ? slot : __ldg(p.row_map + slot);
        }
        const float *rs = p.fold_rs + (int64_t)tile.expert * p.rows_pad + col0;
#pragma unroll
        for (int half = 0; half < 2; half++) { /* 64 columns at a time: 8 scale pairs in registers beside acc */
            float2 rsv[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = (8 * half + j) * 8 + 2 * t4;
                rsv[j] = __ldg((const float2 *)(rs + (c < ncopy ? c : 0)));
            }
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t row = dst4[2 * mb + h];
                    const float xs = xs4[2 * mb + h];
                    if (row < 0) continue;
                    __nv_bfloat16 *yr = p.y + row * p.ldy;
                    if constexpr (SWIGLU) {
#pragma unroll
                        for (int bb = 0; bb < 4; bb++) { /* gate columns 16 b + 2 t4 (+1), up columns + 8 */
                            const int b = 4 * half + bb, c = 16 * b + 2 * t4, ch = col0 / 2 + 8 * b + 2 * t4;
                            if (c >= ncopy || 2 * ch >= p.rows) continue;
                            const float2 rg = rsv[2 * bb], ru = rsv[2 * bb + 1]; /* columns c and c + 8 */
                            float v[2];
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const float gs = e ? rg.y : rg.x, us = e ? ru.y : ru.x;
                                const float gv =
                                    __bfloat162float(__float2bfloat16(acc[mb][2 * b][2 * h + e] * (gs * xs)));
                                const float uv =
                                    __bfloat162float(__float2bfloat16(acc[mb][2 * b + 1][2 * h + e] * (us * xs)));
                                v[e] = __fdividef(gv, 1.0f + __expf(-gv)) * uv; /* the fast SiLU, as elsewhere */
                            }
                            if (2 * ch + 2 < p.rows) *(__nv_bfloat162 *)(yr + ch) = __floats2bfloat162_rn(v[0], v[1]);
                            else yr[ch] = __float2bfloat16(v[0]);
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const int nt = 8 * half + j, c = nt * 8 + 2 * t4;
                            if (c >= ncopy || col0 + c >= p.rows) continue;
                            const float2 r2 = rsv[j];
                            const float v0 = acc[mb][nt][2 * h] * (r2.x * xs),
                                        v1 = acc[mb][nt][2 * h + 1] * (r2.y * xs);
                            if (col0 + c + 1 < p.rows)
                                *(__nv_bfloat162 *)(yr + col0 + c) = __floats2bfloat162_rn(v0, v1);
                            else yr[col0 + c] = __float2bfloat16(v0);
                        }
                    }
                }
            }
        }
    }
#else
    (void)map_x, (void)p;
    __trap();
#endif
}

template <int SWIGLU> static bool ws_instance_fits(void) {
    static int checked = 0; /* 1 fits, -1 not */
    if (!checked) {
        cudaFuncAttributes fa;
        FM_CUDA_CHECK(cudaFuncGetAttributes(&fa, w4a8_fold_ws_kernel<SWIGLU>));
        /* setmaxnreg.inc waits for the CTA's pool: below the budget's entry count the consumers would hang */
        checked = fa.numRegs >= WS_ENTRY_REGS ? 1 : -1;
        if (checked < 0)
            fprintf(stderr,
                    "fp8moe: w4a8_fold_ws: the kernel compiled to %d registers at entry; its setmaxnreg budget needs "
                    "%d\n",
                    fa.numRegs, WS_ENTRY_REGS);
    }
    if (checked > 0) /* every launch: the attribute is the current device's */
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(w4a8_fold_ws_kernel<SWIGLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_SMEM));
    return checked > 0;
}

extern "C" void fm_cuda_w4a8_fold_ws_gemm(const fm_fold_ws_args *a, void *stream) {
    const int64_t K = 128 * a->n_groups;
    const char *bad = !a->codes || !a->fold_j || !a->fold_rs                                          ? "bank"
                      : a->rows_pad % 32 || a->rows > a->rows_pad || a->rows < 1 || a->n_groups < 1   ? "bank shape"
                      : a->rows_pad > (1 << 30)                                                       ? "bank rows"
                      : !a->x || !a->xs || a->ldx < K || a->ldx % 16 || a->slots < 1                  ? "activations"
                      : (uintptr_t)a->x % 16 || (uintptr_t)a->codes % 16 || (uintptr_t)a->fold_j % 16 ? "alignment"
                      : !a->tiles || !a->n_tiles || a->max_tiles < 1                                  ? "tiles"
                      : !a->y || a->ldy % 2 || (a->out == FM_FOLD_WS_OUT_BF16 ? a->ldy < a->rows : a->ldy < a->rows / 2)
                          ? "y"
                      : !fm_cuda_fold_supported() ? "device (sm_90 only)"
                                                  : NULL;
    if (bad) {
        fprintf(stderr, "fp8moe: w4a8_fold_ws_gemm: bad arguments: %s\n", bad);
        abort();
    }
    const bool swiglu = a->out == FM_FOLD_WS_OUT_SWIGLU;
    if (!(swiglu ? ws_instance_fits<1>() : ws_instance_fits<0>())) abort();
    /* x as a 2-D tensor [slots][ldx] of bytes, boxes of 128 rows x 128 bytes; rows past the slots read as zeros */
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)a->slots}, strides[1] = {(cuuint64_t)a->ldx};
    const cuuint32_t box[2] = {WS_KG, WS_A_BOX_ROWS}, elem[2] = {1, 1};
    const CUresult r = fm_tensor_map_encoder("the fold route's prefill GEMM")(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)a->x, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fp8moe: w4a8_fold_ws_gemm: cuTensorMapEncodeTiled failed (%d) for %lld x %lld bytes\n", (int)r,
                (long long)a->slots, (long long)K);
        abort();
    }
    ws_params p;
    p.codes = a->codes, p.fold_j = a->fold_j, p.fold_rs = a->fold_rs, p.rows_pad = a->rows_pad;
    p.rows = (int32_t)a->rows, p.groups = (int32_t)a->n_groups, p.ncols = (int32_t)fm_ceil_div(a->rows_pad, WS_BN);
    p.xs = a->xs, p.tiles = a->tiles, p.n_tiles = a->n_tiles;
    p.y = (__nv_bfloat16 *)a->y, p.ldy = a->ldy, p.row_map = a->row_map;
    const int sms = fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    const int64_t most = a->max_tiles * p.ncols;
    const unsigned grid = (unsigned)(most < sms ? most : sms);
    cudaStream_t s = (cudaStream_t)stream;
    if (swiglu) w4a8_fold_ws_kernel<1><<<grid, WS_THREADS, WS_SMEM, s>>>(map, p);
    else w4a8_fold_ws_kernel<0><<<grid, WS_THREADS, WS_SMEM, s>>>(map, p);
    FM_LAUNCH_CHECK("w4a8 fold GEMM (warp-specialised)");
}
