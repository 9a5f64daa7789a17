// The decode MoE block for one token in one persistent launch (moe_decode_block.cuh). A grid of at most as many CTAs
// as can be resident at once (2 an SM: 256 threads, <= 128 registers, 25 KB of static shared memory; sized to the
// largest phase: 192 for Qwen3-30B-A3B), phases meeting at grid barriers:
//   0  every CTA stages x (bf16) and quantizes it to e4m3 per 128-group (quantize_group, the dispatch's arithmetic);
//      CTA c < E / 8, warp w computes logit 8 c + w with the fused router's row code (router_device.cuh: its first
//      round of 16-byte weight loads issued before the PDL wait)
//   1  every CTA routes the token from the logits (L2): warp 0 makes the values the router's warp code compares,
//      then each thread ranks its experts among all of them (rank j is round j's pick of the warp argmax); CTA 0
//      writes ids and weights
//   2  gate|up: a "virtual CTA" is the decode GEMV's CTA for one routed expert, 8 / KS row blocks of 16 rows x KS
//      slices of K (KS the GEMV's own: the same fp32 chains and slice sums); the CTAs walk the k x ceil(row blocks /
//      (8 / KS)) of them, 4 groups of codes in flight a warp, mma.sync m16n8k32; h = bf16(silu(bf16 gate) x bf16 up)
//      to the h16 scratch
//   3  down: likewise; each CTA quantizes its expert's h row (from L2) as the quantizer kernel does; y = bf16(acc)
//   4  CTA 0: combine + residual add + RMSNorm (moe_combine_row.cuh, the fused tail's code)
// Floor (Qwen3-30B-A3B, k = 8): 0.5 MB of router rows + 8 x 1.57 MB + 8 x 0.79 MB of codes = 19.4 MB, 4.6 us at
// 4.25 TB/s. Measured (H100, CTA 0's clock at each boundary, lab build -DMDB_TIMES, bench/NOTES.md thirty-third
// session): ~26 us a layer, of which router 2.2, barriers 1.6 / 3.3 / 1.7, top-k 3.3, gate|up 5.3, down 5.8, tail
// 3.3; against ~31 us for the six launches under a graph with PDL. Tried and left: the routing's k rounds of a warp
// argmax (4.7 us for the phase, now ranks), L2 prefetch or cp.async of the down codes during the gate|up phase (the
// gate|up phase slows by what the down phase gains: both draw on the same DRAM), 6-8 groups in flight (spills
// under 128 registers; 6 level), all 8 groups of a warp's slice by cp.async into 64 KB of shared memory a CTA (the
// step level with the six launches: likely one CTA an SM, so two rounds of the gate|up phase's 192 virtual CTAs).
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_combine_row.cuh"
#include "backend/cuda/moe_decode_block.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/router_device.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define MDB_THREADS 256 /* = NORM_THREADS (phase 4) = RF_WARPS x 32 (phase 0) */
#define MDB_WARPS (MDB_THREADS / 32)
#define MDB_U 4        /* 128-groups of codes a warp has in flight (8 spilled under 128 registers) */
#define MDB_MAX_H 4096 /* the norm's row (8 NORM_CHUNKS NORM_THREADS) */
#define MDB_MAX_I 4096 /* h's e4m3 row in shared memory */
static_assert(MDB_THREADS == NORM_THREADS && MDB_WARPS == RF_WARPS, "one block size for every phase");
static_assert(MDB_MAX_H <= RF_X_SMEM, "the router's staged row holds x");

// A sense-reversing grid barrier on two zeroed device words (bar[0] arrivals, bar[1] the generation), as the W8A8
// quantizer's (linear_w8a8.cu): the last CTA to arrive clears the count and advances the generation. Every CTA is
// resident: the grid is sized by the occupancy calculator, and the next kernel launches only once every CTA has
// passed its PDL wait. Thread 0 arrives with acquire-release semantics and polls with acquire loads (no full fence):
// writes before the barrier are visible to reads through L2 (ld.cg) after it.
static __device__ __forceinline__ void grid_barrier(unsigned *bar) {
    __syncthreads(); /* the CTA's writes happen before thread 0's release below (cumulativity) */
    if (threadIdx.x == 0) {
        unsigned gen, old;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
        if (old == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + 1) : "memory");
        } else {
            unsigned now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar + 1) : "memory");
            } while (now == gen);
        }
    }
    __syncthreads();
}

// A row of K bf16 values (L2: from global memory through L2, written by another CTA of this grid; else a row in
// shared memory) into e4m3 codes q [G 128] and scales qs [G] in shared memory, a warp a group, as
// quantize_rows_kernel (and the small dispatch) quantize it. Ends with __syncthreads.
template <bool L2>
static __device__ void quantize_row_smem(const __nv_bfloat16 *x, int64_t K, int64_t G, uint8_t *q, float *qs) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t grp = warp; grp < G; grp += MDB_WARPS) {
        float v[4], scale, sum;
        if (L2) load_group_cg(x, K, grp, v);
        else load_group(x, K, grp, v);
        const uint32_t word = quantize_group<false>(v, K, grp, &scale, &sum);
        *(uint32_t *)(q + grp * 128 + lane * 4) = word;
        if (lane == 0) qs[grp] = scale;
    }
    __syncthreads();
}

// One warp's share of a decode GEMV's CTA for one token (gemv_fp8.cu, w4a8_gemv_kernel at NT = 1, WK_INT4): row
// block blk of a matrix (codes, scales at its start), the groups s, s + KS, ... of K, against the token's e4m3 row q
// and scales qs in shared memory. acc: the C fragment; lanes with t = 0 hold the token's rows g (acc[0]) and g + 8
// (acc[2]). The chain per element is the GEMV's: acc = fma(partial, (weight scale x 512) x activation scale, acc)
// over the slice's groups in order; the activation rows 1..7 of the n8 tile are zeros, as the GEMV's padding rows.
static __device__ __forceinline__ void warp_rows(const uint8_t *codes, const __nv_bfloat16 *scales, int64_t rows_pad,
                                                 int64_t G, int64_t blk, int s, int KS, const uint8_t *q,
                                                 const float *qs, float acc[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    const bool live = blk * 16 < rows_pad;
    const uint8_t *wq = codes + blk * G * FM_TC_CHUNK + 16 * lane;
    const __nv_bfloat16 *ws = scales + blk * 16 + g;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int64_t g0 = s; g0 < G; g0 += (int64_t)KS * MDB_U) {
        uint4 v[MDB_U][2];
        float wsa[MDB_U], wsb[MDB_U];
#pragma unroll
        for (int u = 0; u < MDB_U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            const bool in = live && grp < G;
            v[u][0] = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK)) : zero;
            v[u][1] = in ? __ldcs((const uint4 *)(wq + grp * FM_TC_CHUNK + 512)) : zero;
            wsa[u] = in ? __bfloat162float(ws[grp * rows_pad]) * 512.0f : 0.0f;
            wsb[u] = in ? __bfloat162float(ws[grp * rows_pad + 8]) * 512.0f : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MDB_U; u++) {
            const int64_t grp = g0 + (int64_t)u * KS;
            if (grp >= G) break;
            const uint32_t w[8] = {v[u][0].x, v[u][0].y, v[u][0].z, v[u][0].w,
                                   v[u][1].x, v[u][1].y, v[u][1].z, v[u][1].w};
            const uint8_t *xb = q + grp * 128 + 4 * t;
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s4 = 0; s4 < 4; s4++) {
                uint32_t a[4];
                weight_fragment<WK_INT4>(w, s4, a);
                const uint32_t b0 = g == 0 ? *(const uint32_t *)(xb + 32 * s4) : 0u,
                               b1 = g == 0 ? *(const uint32_t *)(xb + 32 * s4 + 16) : 0u;
                mma_e4m3(part, a, b0, b1);
            }
            const float x0 = t == 0 ? qs[grp] : 0.0f; /* activation row 2t; row 2t + 1 is a zero row */
            acc[0] = fmaf(part[0], wsa[u] * x0, acc[0]);
            acc[1] = fmaf(part[1], wsa[u] * 0.0f, acc[1]);
            acc[2] = fmaf(part[2], wsb[u] * x0, acc[2]);
            acc[3] = fmaf(part[3], wsb[u] * 0.0f, acc[3]);
        }
    }
}

// The KS slices of each row block summed in slice order (the GEMV's reduce_slices); true for the warps that then
// hold their row block's sums (slice 0). Every thread calls it.
static __device__ __forceinline__ bool reduce_slices_smem(float acc[4], int KS, float (*red)[4][32]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (warp % KS) return false;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = red[warp][i][lane];
        for (int j = 1; j < KS; j++) a += red[warp + j][i][lane];
        acc[i] = a;
    }
    return true;
}

typedef struct mdb_smem {
    __nv_bfloat16 xr[MDB_MAX_H]; // x in bf16 for the router rows (rf_stage_rows)
    uint8_t xq[MDB_MAX_H];       // x in e4m3, 128-groups
    float xqs[MDB_MAX_H / 128];
    uint8_t hq[MDB_MAX_I]; // one expert's h in e4m3
    float hqs[MDB_MAX_I / 128];
    float red[MDB_WARPS][4][32];
    __align__(16) float vals[32 * WARP_E_MAX]; // the values the top-k compares (route_warp_values)
    float sel_v[FM_ROUTE_MAX_K];
    int32_t sel_id[FM_ROUTE_MAX_K];
    int32_t ids[FM_ROUTE_MAX_K];
    __nv_bfloat16 w[FM_ROUTE_MAX_K];
} mdb_smem;

// Lab only (-DMDB_TIMES, never in the library's build): CTA 0's clock at each phase boundary, printed at the end
#ifdef MDB_TIMES
#define MDB_STAMP(i) (threadIdx.x == 0 && blockIdx.x == 0 ? (void)(stamp[i] = clock64()) : (void)0)
#else
#define MDB_STAMP(i) ((void)0)
#endif

template <int WE>
static __global__ __launch_bounds__(MDB_THREADS, 2) void moe_decode_block_kernel(const fm_moe_block_args p) {
    __shared__ __align__(16) mdb_smem sm;
#ifdef MDB_TIMES
    long long stamp[10];
#endif
    MDB_STAMP(0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t H = p.H, I = p.I;

    /* phase 0: the router rows (weights before the wait: no kernel writes them), x in e4m3 */
    const int32_t e = blockIdx.x * MDB_WARPS + warp;
    const int64_t chunks = H / 8;
    const uint4 *rw = (const uint4 *)(p.router_w + (int64_t)(e < p.E ? e : 0) * p.router_ld);
    uint4 wv[RF_U];
    rf_first_loads(rw, e < p.E, chunks, lane, wv);
    float nw[NORM_CHUNKS][8];
    if (blockIdx.x == 0) combine_row_norm_weights(p.norm, H, nw);
    pdl_wait();
    MDB_STAMP(1);
    rf_stage_rows(p.x, 1, H, sm.xr, MDB_THREADS); /* H <= MDB_MAX_H: always staged */
    if (e < p.E) {
        float acc[FM_ROUTER_FUSED_MAX_T];
        rf_row_logits(rw, chunks, lane, wv, p.x, sm.xr, true, 1, H, acc);
        if (lane == 0) p.logits[e] = __float2bfloat16_rn(acc[0]);
    }
    quantize_row_smem<false>(sm.xr, H, p.gu_groups, sm.xq, sm.xqs);
    MDB_STAMP(2);
    grid_barrier(p.barrier);
    MDB_STAMP(3);

    /* phase 1: every CTA routes the token from the logits (through L2): warp 0 makes the values route_warp_token
       compares, then each thread ranks its experts among all (descending, ties to the lower index): rank j is what
       the warp argmax picks in round j, so the experts, their order and weights are the router's */
    if (warp == 0) {
        float v[WE];
        route_warp_values<__nv_bfloat16, true, WE>(p.logits, p.E, p.softmax_topk, v);
#pragma unroll
        for (int i = 0; i < WE; i++) /* -inf past E, up to a multiple of 4: never ahead of an expert in the order */
            if (lane + 32 * i < ((p.E + 3) & ~3)) sm.vals[lane + 32 * i] = lane + 32 * i < p.E ? v[i] : -INFINITY;
    }
    __syncthreads();
    for (int32_t ei = threadIdx.x; ei < p.E; ei += MDB_THREADS) {
        const float ve = sm.vals[ei];
        int32_t rank = 0;
        for (int32_t o = 0; o < p.E; o += 4) {
            const float4 q = *(const float4 *)&sm.vals[o];
            rank += (q.x > ve || (q.x == ve && o < ei)) + (q.y > ve || (q.y == ve && o + 1 < ei)) +
                    (q.z > ve || (q.z == ve && o + 2 < ei)) + (q.w > ve || (q.w == ve && o + 3 < ei));
        }
        if (rank < p.k) sm.sel_v[rank] = ve, sm.sel_id[rank] = ei;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float wsel[FM_ROUTE_MAX_K];
        for (int32_t j = 0; j < p.k; j++) wsel[j] = sm.sel_v[j];
        finish_route(wsel, sm.sel_id, 0, p.k, p.softmax_topk, p.norm_topk, -1, 0.0f, sm.ids, sm.w);
    }
    __syncthreads();
    MDB_STAMP(4);
    if (blockIdx.x == 0 && threadIdx.x < p.k)
        p.ids[threadIdx.x] = sm.ids[threadIdx.x], p.weights[threadIdx.x] = sm.w[threadIdx.x];
    /* phase 2: gate|up and the SwiGLU */
    {
        const int KS = p.gu_slices, bpc = MDB_WARPS / KS, s = warp % KS;
        const int64_t nq = (p.gu_rows_pad / 16 + bpc - 1) / bpc, nv = p.k * nq;
        const int64_t mstride = (p.gu_rows_pad / 16) * p.gu_groups * FM_TC_CHUNK, sstride = p.gu_groups * p.gu_rows_pad;
        for (int64_t v = blockIdx.x; v < nv; v += gridDim.x) {
            const int64_t j = v / nq, blk = (v % nq) * bpc + warp / KS, ex = sm.ids[j];
            float acc[4];
            warp_rows(p.gu_codes + ex * mstride, p.gu_scales + ex * sstride, p.gu_rows_pad, p.gu_groups, blk, s, KS,
                      sm.xq, sm.xqs, acc);
            if (reduce_slices_smem(acc, KS, sm.red) && t == 0) {
                const int64_t ch = blk * 8 + g; /* rows g and g + 8 of block blk: gate and up of channel 8 blk + g */
                const float gate = __bfloat162float(__float2bfloat16_rn(acc[0])),
                            up = __bfloat162float(__float2bfloat16_rn(acc[2]));
                if (blk * 16 < p.gu_rows_pad && ch < I)
                    p.h16[j * I + ch] = __float2bfloat16_rn(__fdividef(gate, 1.0f + __expf(-gate)) * up);
            }
            __syncthreads(); /* red is reused */
        }
    }
    MDB_STAMP(5);
    grid_barrier(p.barrier);
    MDB_STAMP(6);

    /* phase 3: down, each CTA quantizing its expert's h row */
    {
        const int KS = p.down_slices, bpc = MDB_WARPS / KS, s = warp % KS;
        const int64_t nq = (p.down_rows_pad / 16 + bpc - 1) / bpc, nv = p.k * nq;
        const int64_t mstride = (p.down_rows_pad / 16) * p.down_groups * FM_TC_CHUNK,
                      sstride = p.down_groups * p.down_rows_pad;
        int64_t have = -1;
        for (int64_t v = blockIdx.x; v < nv; v += gridDim.x) {
            const int64_t j = v / nq, blk = (v % nq) * bpc + warp / KS, ex = sm.ids[j];
            if (j != have) quantize_row_smem<true>(p.h16 + j * I, I, p.down_groups, sm.hq, sm.hqs), have = j;
            float acc[4];
            warp_rows(p.down_codes + ex * mstride, p.down_scales + ex * sstride, p.down_rows_pad, p.down_groups, blk, s,
                      KS, sm.hq, sm.hqs, acc);
            if (reduce_slices_smem(acc, KS, sm.red) && t == 0 && blk * 16 < p.down_rows_pad) {
                const int64_t row = blk * 16 + g;
                if (row < H) p.y[j * H + row] = __float2bfloat16_rn(acc[0]);
                if (row + 8 < H) p.y[j * H + row + 8] = __float2bfloat16_rn(acc[2]);
            }
            __syncthreads(); /* red and hq are reused */
        }
    }
    MDB_STAMP(7);
    grid_barrier(p.barrier);
    MDB_STAMP(8);

    /* phase 4: the token's end by CTA 0 */
    if (blockIdx.x == 0) combine_add_rmsnorm_row(p.y, NULL, p.weights, p.k, H, 0, p.acc, p.eps, nw, p.out);
    MDB_STAMP(9);
#ifdef MDB_TIMES
    if (threadIdx.x == 0 && blockIdx.x == 0)
        printf("mdb %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", stamp[1] - stamp[0], stamp[2] - stamp[1],
               stamp[3] - stamp[2], stamp[4] - stamp[3], stamp[5] - stamp[4], stamp[6] - stamp[5], stamp[7] - stamp[6],
               stamp[8] - stamp[7], stamp[9] - stamp[8]);
#endif
}

extern "C" bool fm_cuda_moe_decode_block_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t I,
                                               int64_t router_ld) {
    return T == 1 && !shared && E >= 1 && E <= 32 * WARP_E_MAX && k >= 1 && k <= E && k <= FM_ROUTE_MAX_K &&
           H % 8 == 0 && H >= 8 && H <= MDB_MAX_H && I >= 8 && I % 8 == 0 && I <= MDB_MAX_I && router_ld % 8 == 0;
}

template <int WE> static void launch(const fm_moe_block_args *a, bool pdl, cudaStream_t s) {
    static int resident = 0; /* CTAs an SM, once */
    if (!resident) {
        FM_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, moe_decode_block_kernel<WE>, MDB_THREADS, 0));
        if (resident < 1) {
            fprintf(stderr, "fp8moe: moe_decode_block: the kernel does not fit an SM\n");
            abort();
        }
    }
    /* as many CTAs as the largest phase has virtual CTAs, at most all resident ones */
    const int64_t gu_q = fm_ceil_div(a->gu_rows_pad / 16, MDB_WARPS / a->gu_slices),
                  d_q = fm_ceil_div(a->down_rows_pad / 16, MDB_WARPS / a->down_slices);
    int64_t want = a->k * (gu_q > d_q ? gu_q : d_q);
    if (want < fm_ceil_div(a->E, MDB_WARPS)) want = fm_ceil_div(a->E, MDB_WARPS);
    const int64_t cap = (int64_t)resident * fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    const unsigned grid = (unsigned)(want < cap ? want : cap);
    pdl_launch(moe_decode_block_kernel<WE>, dim3(grid), dim3(MDB_THREADS), 0, s, pdl, *a);
}

extern "C" void fm_cuda_moe_decode_block(const fm_moe_block_args *a, bool pdl, cudaStream_t s) {
    const bool slices_ok = (a->gu_slices == 1 || a->gu_slices == 2 || a->gu_slices == 4 || a->gu_slices == 8) &&
                           (a->down_slices == 1 || a->down_slices == 2 || a->down_slices == 4 || a->down_slices == 8);
    if (!fm_cuda_moe_decode_block_takes(1, a->E, a->k, false, a->H, a->I, a->router_ld) || !slices_ok ||
        a->gu_groups != fm_ceil_div(a->H, 128) || a->down_groups != fm_ceil_div(a->I, 128) ||
        a->gu_rows_pad < 2 * a->I || a->down_rows_pad < a->H ||
        !fm_combine_row_takes(a->H, a->y, a->acc, a->norm, a->out)) {
        fprintf(stderr, "fp8moe: moe_decode_block: unsupported shape (E %d, k %d, H %lld, I %lld, slices %d / %d)\n",
                a->E, a->k, (long long)a->H, (long long)a->I, a->gu_slices, a->down_slices);
        abort(); /* the caller asks fm_cuda_moe_decode_block_takes */
    }
    const int we = warp_experts(a->E, false); /* the router kernels' variant for E (router_device.cuh) */
    if (we == 8) launch<8>(a, pdl, s);
    else if (we == 16) launch<16>(a, pdl, s);
    else launch<32>(a, pdl, s);
    FM_LAUNCH_CHECK("moe_decode_block");
}
