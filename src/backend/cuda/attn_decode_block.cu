// The decode attention block for one token in one persistent launch (attn_decode_block.cuh). A grid of at most as
// many CTAs as can be resident at once (PB_THREADS threads, <= 128 registers, the split kernel's 68 KB of dynamic
// shared memory at head dim 128: 2 an SM), phases meeting at grid barriers:
//   0  before the PDL wait each CTA with a QKV "virtual CTA" (one CTA of the decode GEMV: 8 / KS row blocks of 16
//      rows x KS slices of K, the GEMV's own, so every fp32 chain is the GEMV's) cp.asyncs its warps' first round of
//      weights into shared memory; after it, stages x (L2, one round trip), quantizes it to e4m3 per 128-group (the
//      quantizer kernel's arithmetic) and walks its virtual CTAs: qkv = bf16(acc)
//   1  warp w of the grid takes heads w, w + W, ... of the row: q and k normed and rotated in place (the RoPE
//      kernel's code, rope_device.cuh), k and v stored in the token's cache slot
//   2  warps 0-3 of each CTA run CTAs of the split kernel ((kv head group, split) pairs; attention_paged_split.cuh,
//      its barriers named for those 128 threads, Q read from shared memory per tile under the 128-register bound):
//      each split's partial to the scratch, or att itself when there is one split; then each CTA with an o virtual
//      CTA cp.asyncs its first round of o weights into the split's (now free) shared memory
//   3  (splits > 1) CTA c merges query head c, c + grid, ...: the combine kernel's arithmetic (apg_combine_head)
//   4  the o projection as phase 0's GEMV from att (L2): y = bf16(acc)
//   5  CTA 0: acc += y, out = rmsnorm(acc) * norm (the GEMV tail's row code, row_tail.cuh: add_rmsnorm's bits)
// Floor (Qwen3-30B-A3B, context 2048): 5.4 MB of QKV codes and scales + 4.2 MB of o + 4 MB of K and V = 13.6 MB,
// 3.2 us at 4.25 TB/s. Measured (H100, CTA 0's clock at each boundary, lab build -DADB_TIMES, docs/RESULTS.md 2.23):
// QKV 4.1, RoPE 1.9, split 8.4, combine ~3.9, o 4.7, tail 1.5 us and five barriers of 1.7-3.1: ~35 us a layer against
// the chain's ~32.6 under a graph, and the MoE block after it 4 us slower (neither whole-GPU kernel starts under the
// other): a decode step 16 % slower, so route attn.persistent is off. Kept as the attention half of a one-launch
// layer. compute-sanitizer: memcheck and synccheck clean; racecheck misreports after the split phase's partial named
// barrier (lab/racecheck_named_barrier.cu shows the tool doing so on a race-free kernel).
#include <string.h>

#include "backend/cuda/attention_paged_split.cuh"
#include "backend/cuda/attn_decode_block.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/persistent_block.cuh"
#include "backend/cuda/rope_device.cuh"
#include "backend/cuda/row_tail.cuh"

#define ADB_HD 128     /* the head dim the kernel is built for */
#define ADB_MAX_K 4096 /* the GEMVs' K (H, nh hd) staged in e4m3 */
static_assert(PB_THREADS == NORM_THREADS && PB_THREADS >= 2 * APG_THREADS, "one block size for every phase");
static_assert(4 * ADB_MAX_K + PB_WARPS * PB_ROUND_BYTES <= apg_shape<ADB_HD, false>::SMEM,
              "x and the prefetched rounds within the split's shared memory");

// One decode GEMV of the block: its virtual CTAs over the grid, x (bf16, written by an earlier phase or kernel:
// read through L2) quantized into shared memory by each CTA that has one
static __device__ __noinline__ void block_gemv(const uint8_t *codes, const __nv_bfloat16 *scales, int64_t rows_pad,
                                               int64_t N, int KS, const __nv_bfloat16 *x, int64_t K, uint8_t *xq,
                                               float *xqs, __nv_bfloat16 *xs, const uint8_t *pre, float (*red)[4][32],
                                               __nv_bfloat16 *y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int bpc = PB_WARPS / KS, s = warp % KS;
    const int64_t G = (K + 127) / 128, nv = (rows_pad / 16 + bpc - 1) / bpc;
    if ((int64_t)blockIdx.x >= nv) return;              /* the whole CTA */
    stage_row_cg<ADB_MAX_K / 8 / PB_THREADS>(x, K, xs); /* every load in flight, then the groups from shared memory */
    quantize_row_smem<false>(xs, K, G, xq, xqs);
    for (int64_t v = blockIdx.x; v < nv; v += gridDim.x) {
        const int64_t blk = v * bpc + warp / KS;
        float acc[4];
        warp_rows(codes, scales, rows_pad, G, blk, s, KS, xq, xqs, acc, v == blockIdx.x ? pre : NULL);
        if (reduce_slices_smem(acc, KS, red) && t == 0 && blk * 16 < rows_pad) {
            const int64_t row = blk * 16 + g;
            if (row < N) y[row] = __float2bfloat16_rn(acc[0]);
            if (row + 8 < N) y[row + 8] = __float2bfloat16_rn(acc[2]);
        }
        __syncthreads(); /* red is reused */
    }
}

// The first round of this CTA's first virtual CTA of a block GEMV into the warp's pre region (warp_round_prefetch)
static __device__ __forceinline__ void block_gemv_prefetch(const uint8_t *codes, const __nv_bfloat16 *scales,
                                                           int64_t rows_pad, int KS, int64_t K, uint8_t *pre) {
    const int warp = threadIdx.x >> 5, bpc = PB_WARPS / KS;
    const int64_t G = (K + 127) / 128, nv = (rows_pad / 16 + bpc - 1) / bpc;
    if ((int64_t)blockIdx.x < nv)
        warp_round_prefetch(codes, scales, rows_pad, G, (int64_t)blockIdx.x * bpc + warp / KS, warp % KS, KS, pre);
}

// One CTA of the split kernel by warps 0-3 (out of line: its registers are allocated apart from the GEMVs')
static __device__ __noinline__ void split_cta(const apg_args &at, unsigned char *smem, int Y, int y, int split,
                                              unsigned *qmax, unsigned *arrived) {
    apg_split_cta<ADB_HD, false, 0, 1>(at, smem, 1, 0, Y, y, split, qmax, arrived);
}

// Lab only (-DADB_TIMES, never in the library's build): CTA 0's clock at each phase boundary, printed at the end
#ifdef ADB_TIMES
#define ADB_STAMP(i) (threadIdx.x == 0 && blockIdx.x == 0 ? (void)(stamp[i] = clock64()) : (void)0)
#else
#define ADB_STAMP(i) ((void)0)
#endif

static __global__ __launch_bounds__(PB_THREADS, 2) void attn_decode_block_kernel(const fm_attn_block_args p,
                                                                                 const apg_args at) {
    extern __shared__ __align__(128) unsigned char adb_smem[]; /* the split CTA's, or a GEMV's x in e4m3 */
    __shared__ float red[PB_WARPS][4][32];
    __shared__ unsigned qmax, arrived;
    __shared__ float cm[FM_ATT_PAGED_MAX_SPLITS], cl[FM_ATT_PAGED_MAX_SPLITS]; /* the combine's maxima and sums */
    uint8_t *xq = adb_smem;
    float *xqs = (float *)(adb_smem + ADB_MAX_K);
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(adb_smem + 2 * ADB_MAX_K); /* the bf16 row before it is quantized */
    uint8_t *pre = adb_smem + 4 * ADB_MAX_K + (threadIdx.x >> 5) * PB_ROUND_BYTES; /* the warp's prefetched round */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = p.nh, nkv = p.nkv, hd = ADB_HD;
    const int64_t n_qkv = (int64_t)(nh + 2 * nkv) * hd, n_att = (int64_t)nh * hd;
#ifdef ADB_TIMES
    long long stamp[12];
#endif
    ADB_STAMP(0);
    /* the QKV weights of the CTA's first virtual CTA: no kernel writes them, so before the wait */
    block_gemv_prefetch(p.qkv_codes, p.qkv_scales, p.qkv_rows_pad, p.qkv_slices, p.H, pre);
    pdl_wait();
    ADB_STAMP(1);

    /* phase 0: the QKV GEMV */
    block_gemv(p.qkv_codes, p.qkv_scales, p.qkv_rows_pad, n_qkv, p.qkv_slices, p.x, p.H, xq, xqs, xs, pre, red, p.qkv);
    ADB_STAMP(2);
    grid_barrier(p.barrier);
    ADB_STAMP(3);

    /* phase 1: q/k norm + RoPE, k and v to the cache */
    {
        const int heads = nh + 2 * nkv, gw = blockIdx.x * PB_WARPS + warp;
        if (gw < heads) {
            float cs[1][2], sn[1][2];
            rope_angles<1>((float)p.tok_pos[0], p.theta, hd, lane, cs, sn);
            const int64_t slot = p.slot[0];
            for (int h = gw; h < heads; h += gridDim.x * PB_WARPS)
                rope_head<__nv_bfloat16, 1, ROPE_STORE_ACT>(p.qkv, h, nh, nkv, hd, p.q_norm, p.k_norm, p.qk_eps, cs, sn,
                                                            slot, p.k_cache, p.v_cache, 0);
        }
    }
    ADB_STAMP(4);
    grid_barrier(p.barrier);
    ADB_STAMP(5);

    /* phase 2: the split kernel's CTAs, by warps 0-3 */
    {
        const int Y = at.nkv * at.qgroups, n = Y * at.splits;
        for (int v = blockIdx.x; v < n; v += gridDim.x) {
            if (threadIdx.x < APG_THREADS) split_cta(at, adb_smem, Y, v % Y, v / Y, &qmax, &arrived);
            __syncthreads(); /* the split's shared memory is reused */
        }
    }
    /* the o projection's weights, into the split's shared memory: under the combine and the barriers */
    block_gemv_prefetch(p.o_codes, p.o_scales, p.o_rows_pad, p.o_slices, n_att, pre);
    ADB_STAMP(6);
    if (at.splits > 1) {
        grid_barrier(p.barrier);
        /* phase 3: the combine */
        for (int h = blockIdx.x; h < nh; h += gridDim.x)
            apg_combine_head(at.part, at.tok_pos[0] + 1, nh, hd, at.splits, 1, 0, h, at.out, cm, cl);
    }
    ADB_STAMP(7);
    grid_barrier(p.barrier);
    ADB_STAMP(8);

    /* phase 4: the o projection */
    block_gemv(p.o_codes, p.o_scales, p.o_rows_pad, p.H, p.o_slices, p.att, n_att, xq, xqs, xs, pre, red, p.y);
    ADB_STAMP(9);
    grid_barrier(p.barrier);
    ADB_STAMP(10);

    /* phase 5: the residual add and the next norm, by CTA 0 */
    if (blockIdx.x == 0) {
        const fm_row_tail tl = {NULL, p.acc, p.norm, p.eps, p.out};
        tail_rows_add_rmsnorm(tl, p.y, p.H, 1);
    }
    ADB_STAMP(11);
#ifdef ADB_TIMES
    if (threadIdx.x == 0 && blockIdx.x == 0)
        printf("adb %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", stamp[1] - stamp[0], stamp[2] - stamp[1],
               stamp[3] - stamp[2], stamp[4] - stamp[3], stamp[5] - stamp[4], stamp[6] - stamp[5], stamp[7] - stamp[6],
               stamp[8] - stamp[7], stamp[9] - stamp[8], stamp[10] - stamp[9], stamp[11] - stamp[10]);
#endif
}

extern "C" bool fm_cuda_attn_decode_block_takes(int64_t H, int32_t nh, int32_t nkv, int32_t hd) {
    return hd == ADB_HD && nkv >= 1 && nh >= nkv && nh % nkv == 0 && H % 128 == 0 && H >= 128 && H <= ADB_MAX_K &&
           (int64_t)nh * hd <= ADB_MAX_K && H <= 8 * NORM_CHUNKS * NORM_THREADS;
}

extern "C" void fm_cuda_attn_decode_block(const fm_attn_block_args *a, bool pdl, cudaStream_t s) {
    const bool slices_ok = (a->qkv_slices == 1 || a->qkv_slices == 2 || a->qkv_slices == 4 || a->qkv_slices == 8) &&
                           (a->o_slices == 1 || a->o_slices == 2 || a->o_slices == 4 || a->o_slices == 8);
    const int64_t n_qkv = (int64_t)(a->nh + 2 * a->nkv) * a->hd;
    if (!fm_cuda_attn_decode_block_takes(a->H, a->nh, a->nkv, a->hd) || !slices_ok || a->qkv_rows_pad < n_qkv ||
        a->o_rows_pad < a->H || a->splits < 1 || a->splits > FM_ATT_PAGED_MAX_SPLITS ||
        (a->splits > 1 && !a->scratch) || !fm_row_tail_takes(a->H, a->y, a->acc, a->norm, a->out)) {
        fprintf(stderr, "fp8moe: attn_decode_block: unsupported shape (H %lld, nh %d, nkv %d, hd %d, slices %d / %d)\n",
                (long long)a->H, a->nh, a->nkv, a->hd, a->qkv_slices, a->o_slices);
        abort(); /* the caller asks fm_cuda_attn_decode_block_takes */
    }
    typedef apg_shape<ADB_HD, false> SH;
    const int smem = SH::SMEM > 4 * ADB_MAX_K ? SH::SMEM : 4 * ADB_MAX_K; /* x: e4m3 + scales, then bf16 */
    static int resident = 0;                                              /* CTAs an SM, once */
    if (!resident) {
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(attn_decode_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        FM_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, attn_decode_block_kernel, PB_THREADS, smem));
        if (resident < 1) {
            fprintf(stderr, "fp8moe: attn_decode_block: the kernel does not fit an SM\n");
            abort();
        }
    }
    apg_args at;
    memset(&at, 0, sizeof at);
    at.qkv = a->qkv, at.k_cache = a->k_cache, at.v_cache = a->v_cache;
    at.tok_seq = a->tok_seq, at.tok_pos = a->tok_pos, at.tables = a->tables;
    at.part = a->splits > 1 ? (float *)((char *)a->scratch + fm_attention_paged_counter_bytes(a->nh)) : NULL;
    at.counters = NULL, at.out = a->att;
    at.nh = a->nh, at.nkv = a->nkv, at.qgroups = (int)fm_ceil_div(a->nh / a->nkv, 16);
    at.max_blocks = a->max_blocks, at.block_tokens = a->block_tokens, at.splits = a->splits;
    at.bt_shift = apg_bt_shift(a->block_tokens), at.skip_runs = 0;
    at.sl2 = (float)(1.4426950408889634 / sqrt((double)a->hd));
    at.row_b = (int64_t)a->nkv * a->hd;
    /* as many CTAs as the largest phase has virtual CTAs, at most all resident ones */
    const int64_t qkv_v = fm_ceil_div(a->qkv_rows_pad / 16, PB_WARPS / a->qkv_slices),
                  o_v = fm_ceil_div(a->o_rows_pad / 16, PB_WARPS / a->o_slices),
                  att_v = (int64_t)a->nkv * at.qgroups * a->splits, comb_v = a->nh;
    int64_t want = qkv_v > o_v ? qkv_v : o_v;
    if (want < att_v) want = att_v;
    if (want < comb_v) want = comb_v;
    if (want < fm_ceil_div(a->nh + 2 * a->nkv, PB_WARPS)) want = fm_ceil_div(a->nh + 2 * a->nkv, PB_WARPS);
    const int64_t cap = (int64_t)resident * fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    const unsigned grid = (unsigned)(want < cap ? want : cap);
    pdl_launch(attn_decode_block_kernel, dim3(grid), dim3(PB_THREADS), (size_t)smem, s, pdl, *a, at);
    FM_LAUNCH_CHECK("attn_decode_block");
}
