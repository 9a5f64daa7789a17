// The decode MoE block for one token in one persistent launch (moe_decode_block.cuh). A grid of at most as many CTAs
// as can be resident at once (2 an SM: 256 threads, <= 128 registers, 35 KB of static shared memory; sized to the
// largest phase: 192 for Qwen3-30B-A3B), phases meeting at grid barriers:
//   0  every CTA stages x (bf16) and quantizes it to e4m3 per 128-group (quantize_group, the dispatch's arithmetic);
//      CTA c < E / 8, warp w computes logit 8 c + w with the fused router's row code (router_device.cuh: its first
//      round of 16-byte weight loads issued before the PDL wait)
//   1  every CTA routes the token from the logits (L2): its 8 warps make the values the router's warp code compares
//      (a slice a warp, the softmax's sum in the warp code's lane order), then each thread ranks its experts among all
//      of them (rank j is round j's pick of the warp argmax; one 64-bit compare a pair, route_key; above 256
//      candidates each warp ranks its slice first, then the warps' top k among themselves); warp 0's lanes make the
//      k weights (finish_route_warp) and CTA 0 writes ids and weights. A shared expert in the bank (Qwen3-Next under
//      moe.shared=routed) is the last logit and the last pair
//   2  gate|up: a "virtual CTA" is the decode GEMV's CTA for one routed expert, 8 / KS row blocks of 16 rows x KS
//      slices of K (KS the GEMV's own: the same fp32 chains and slice sums); the CTAs walk the k x ceil(row blocks /
//      (8 / KS)) of them, 4 groups of codes in flight a warp, mma.sync m16n8k32; h = bf16(silu(bf16 gate) x bf16 up)
//      to the h16 scratch
//   3  down: likewise; each CTA quantizes its expert's h row (from L2) as the quantizer kernel does; y = bf16(acc)
//   4  CTA 0: combine (MDB_COMBINE_U routed rows' loads at once) + residual add + RMSNorm (moe_combine_row.cuh, the
//      fused tail's code); with QOUT (out_q: route dense.quant=producer) the normed row's 128-groups for the next
//      layer's q|k|v projection, from the registers that stored it (the quantizer's arithmetic on the same bf16
//      values)
// Floor (Qwen3-30B-A3B, k = 8): 0.5 MB of router rows + 8 x 1.57 MB + 8 x 0.79 MB of codes = 19.4 MB, 4.6 us at
// 4.25 TB/s. Measured (H100, CTA 0's clock at each boundary, lab build -DMDB_TIMES, bench/NOTES.md thirty-third
// session): ~26 us a layer, of which router 2.2, barriers 1.6 / 3.3 / 1.7, top-k 3.3, gate|up 5.3, down 5.8, tail
// 3.3 (2.7 since the combine loads four routed rows at once, thirty-fourth session); against ~31 us for the six
// launches under a graph with PDL; today's phases (25 us at Qwen3-30B-A3B, 27 at Qwen3-Next):
// docs/RESULTS.md 2.45-2.46. Tried and left: the routing's k rounds of a warp argmax (4.7 us for the phase, now ranks),
// L2 prefetch or cp.async of the down codes during the gate|up phase (the gate|up phase slows by what the down phase
// gains: both draw on the same DRAM), 6-8 groups in flight (spills under 128 registers; 6 level), all 8 groups of a
// warp's slice by cp.async into 64 KB of shared memory a CTA (the step level with the six launches: likely one CTA an
// SM, so two rounds of the gate|up phase's 192 virtual CTAs), the down phase's first round cp.async'd by each CTA once
// its gate|up work is done, before barrier 2 (level), the tail by the last CTA to arrive instead of CTA 0 after the
// third barrier (level, lab/last_cta_tail.patch).
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_combine_row.cuh"
#include "backend/cuda/moe_decode_block.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/persistent_block.cuh"
#include "backend/cuda/router_device.cuh"
#include "backend/cuda/w4a8_layout.cuh"

#define MDB_THREADS PB_THREADS /* = NORM_THREADS (phase 4) = RF_WARPS x 32 (phase 0) */
#define MDB_WARPS PB_WARPS
#define MDB_MAX_H 4096  /* the norm's row (8 NORM_CHUNKS NORM_THREADS) */
#define MDB_MAX_I 4096  /* h's e4m3 row in shared memory */
#define MDB_COMBINE_U 8 /* the tail's routed rows loaded at once: Qwen3-30B-A3B's k in one L2 round trip */
static_assert(MDB_THREADS == NORM_THREADS && MDB_WARPS == RF_WARPS, "one block size for every phase");
static_assert(MDB_MAX_H <= RF_X_SMEM, "the router's staged row holds x");
static_assert(32 * WARP_E_MAX * 8 <= MDB_MAX_H * 2, "the keys fit where x was staged");

typedef struct mdb_smem {
    union {
        __nv_bfloat16 xr[MDB_MAX_H];              // phase 0: x in bf16 for the router rows (rf_stage_rows)
        unsigned long long keys[32 * WARP_E_MAX]; // phase 1: the values as route_key (read past barrier 1 only)
    };
    uint8_t xq[MDB_MAX_H]; // x in e4m3, 128-groups
    float xqs[MDB_MAX_H / 128];
    __align__(16) __nv_bfloat16 resid[MDB_MAX_H]; // pre_y: CTA 0's summed residual, to acc after barrier 1
    uint8_t hq[MDB_MAX_I];                        // one expert's h in e4m3
    float hqs[MDB_MAX_I / 128];
    float red[MDB_WARPS][4][32];
    float vals[32 * WARP_E_MAX]; // the values the top-k compares (route_warp_values)
    float ex[32 * WARP_E_MAX];   // softmax_topk: each candidate's exponential, for the sum's lanes
    float wmax[MDB_WARPS];       // the warps' maxima of the logits
    float shared_logit;          // the shared expert's (in the bank: the last logit)
    __align__(16) unsigned long long cand[MDB_WARPS * FM_ROUTE_MAX_K]; // above 256 candidates: each warp's top k keys
    float sel_v[FM_ROUTE_MAX_K];
    int32_t sel_id[FM_ROUTE_MAX_K];
    int32_t ids[FM_ROUTE_MAX_K];
    __nv_bfloat16 w[FM_ROUTE_MAX_K];
} mdb_smem;

// Lab only (-DMDB_TIMES, never in the library's build): CTA 0's clock at each phase boundary, printed at the end, then
// the top-k's pieces (values, the ranking(s), the sync before the finish, the finish) and the tail's quantizer
#ifdef MDB_TIMES
#define MDB_STAMP(i) (threadIdx.x == 0 && blockIdx.x == 0 ? (void)(stamp[i] = clock64()) : (void)0)
#else
#define MDB_STAMP(i) ((void)0)
#endif

// The router's order as one unsigned compare: candidate o comes before e (a larger value, or an equal one at a lower
// index) iff route_key(v[o], o) > route_key(v[e], e). Two integer compares an element, not the float pair's four
// instructions and the index's compare.
static __device__ __forceinline__ unsigned long long route_key(float v, int32_t e) {
    return (unsigned long long)route_order_key(v) << 32 | (uint32_t)~e;
}

// The rank of key me among the n keys key[o0, o0 + n) (n even, o0 even): how many come before it
static __device__ __forceinline__ int32_t rank_key(const unsigned long long *key, int32_t o0, int32_t n,
                                                   unsigned long long me) {
    int32_t rank = 0;
#pragma unroll 4
    for (int32_t o = o0; o < o0 + n; o += 2) {
        const ulonglong2 q = *(const ulonglong2 *)&key[o];
        rank += (q.x > me) + (q.y > me);
    }
    return rank;
}

// A warp's top kc of its slice of 32 PW keys (lane's own at lane + 32 i, as block_route_values wrote them) into cand
// in rank order, ranking only the slice's keys at or above T, the kc-th largest of the lanes' maxima: the kc lanes
// with the largest maxima hold kc keys >= T, so no key below T is among the top kc, and every key ahead of one at or
// above T is itself at or above T, so a candidate's rank among the candidates is its rank in the slice. About 2 kc
// candidates rank among themselves, where every key ranked among all 32 PW (64 compares a lane at Qwen3-Next's 512
// experts, before). The slice's keys are overwritten (the lanes' maxima, then the candidates) once each lane holds
// its own in registers.
template <int PW>
static __device__ __forceinline__ void slice_top(unsigned long long *key, int32_t kc, unsigned long long *cand) {
    const int lane = threadIdx.x & 31;
    unsigned long long kv[PW], mk = 0;
#pragma unroll
    for (int i = 0; i < PW; i++) kv[i] = key[lane + 32 * i], mk = kv[i] > mk ? kv[i] : mk;
    __syncwarp();
    key[lane] = mk; /* the lanes' maxima (distinct: the index is in the key) */
    __syncwarp();
    const int32_t r = rank_key(key, 0, 32, mk);
    const unsigned long long T = __shfl_sync(0xffffffffu, mk, __ffs(__ballot_sync(0xffffffffu, r == kc - 1)) - 1);
    __syncwarp();
    int32_t n = 0; /* the candidates, compacted in (i, lane) order */
#pragma unroll
    for (int i = 0; i < PW; i++) {
        const bool c = kv[i] >= T;
        const unsigned b = __ballot_sync(0xffffffffu, c);
        if (c) key[n + __popc(b & ((1u << lane) - 1u))] = kv[i];
        n += __popc(b);
    }
    if (lane == 0 && (n & 1)) key[n] = 0; /* rank_key takes pairs; key 0 is below every value's */
    __syncwarp();
    for (int32_t j = lane; j < n; j += 32) {
        const unsigned long long me = key[j];
        const int32_t rank = rank_key(key, 0, (n + 1) & ~1, me);
        if (rank < kc) cand[rank] = me;
    }
}

// finish_route's weights and pairs by warp 0's lanes, lane j the j-th pick (its division and store in parallel, not
// thread 0's loops): every lane sums the kc picks in finish_route's order (j = 0, 1, ...), so the bits are its
static __device__ __forceinline__ void finish_route_warp(const float *sel_v, const int32_t *sel_id, int32_t kc,
                                                         bool softmax_topk, bool norm_topk, int32_t shared,
                                                         float shared_logit, int32_t *ids, __nv_bfloat16 *w) {
    const int lane = threadIdx.x & 31;
    float wj = lane < kc ? sel_v[lane] : 0.0f;
    if (softmax_topk) {
        if (norm_topk) {
            float s = 0.0f;
            for (int32_t j = 0; j < kc; j++) s += sel_v[j];
            wj /= s;
        }
    } else {
        const float top = sel_v[0];
        float s = 0.0f;
        for (int32_t j = 0; j < kc; j++) s += expf(sel_v[j] - top);
        wj = expf(wj - top) / s;
    }
    if (lane < kc) ids[lane] = sel_id[lane], act_store(&w[lane], wj);
    if (shared >= 0 && lane == kc) ids[kc] = shared, act_store(&w[kc], 1.0f / (1.0f + expf(-shared_logit)));
}

// route moe.block_norm: the norm's weights into the chunks of resid this thread will read them from (and then
// overwrite with the residual's sum: its own chunks only, so no barrier), the add_rmsnorm kernel's chunks of the row
static __device__ __forceinline__ void pre_norm_weights(const __nv_bfloat16 *w, int64_t H, __nv_bfloat16 *resid) {
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c < H) *(uint4 *)(resid + c) = *(const uint4 *)(w + c);
    }
}

// acc + pre_y, then rmsnorm(acc) * pre_norm into xs (the block's staged x), exactly as add_rmsnorm_kernel computes
// them (elementwise.cu: the same chunks a thread, order of summation, block sum and rounding); the weights from resid
// (pre_norm_weights), the sum kept there (CTA 0 writes it to acc after barrier 1: the other CTAs read acc until
// then) and CTA 0 writes x (pre_x). acc and pre_y come through L2 (earlier kernels wrote them). Ends with a
// __syncthreads (xs is read by every warp next).
static __device__ __forceinline__ void pre_add_norm(const fm_moe_block_args &p, __nv_bfloat16 *xs,
                                                    __nv_bfloat16 *resid) {
    /* a thread touches its own chunks of xs and resid only (no barrier but block_sum's); the sum waits in xs while the
       block sums the squares, so that few registers are live beside the router's first loads */
    const int64_t H = p.H;
    uint4 ra[NORM_CHUNKS], ry[NORM_CHUNKS];
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        ra[j] = c < H ? __ldcg((const uint4 *)(p.acc + c)) : make_uint4(0, 0, 0, 0);
        ry[j] = c < H ? __ldcg((const uint4 *)(p.pre_y + c)) : make_uint4(0, 0, 0, 0);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c >= H) continue;
        float v[8], yv[8];
        unpack8(ra[j], v), unpack8(ry[j], yv);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[e] = act_round(v[e] + yv[e], p.acc); /* the sum as stored */
            ss += v[e] * v[e];
        }
        *(uint4 *)(xs + c) = pack8(v);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)H + p.pre_eps);
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) { /* norm_store_chunks' arithmetic: w (v inv), rounded to bf16 */
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        if (c >= H) continue;
        const uint4 sum = *(const uint4 *)(xs + c);
        float v[8], wv[8];
        unpack8(sum, v), unpack8(*(const uint4 *)(resid + c), wv);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = wv[e] * (v[e] * inv);
        *(uint4 *)(resid + c) = sum;
        *(uint4 *)(xs + c) = pack8(v);
    }
    __syncthreads();
    if (blockIdx.x == 0)
        for (int64_t c = threadIdx.x; c < H / 8; c += MDB_THREADS) ((uint4 *)p.pre_x)[c] = ((const uint4 *)xs)[c];
}

// The values the top-k compares (route_warp_values': the probabilities under softmax_topk, else the logits; -inf past
// E) into vals, made by the block's 8 warps rather than one: warp w loads the experts lane + 32 i for its WE / 8 rows
// i, i.e. the slice [4 WE w, 4 WE (w + 1)) (L2: other CTAs wrote the logits). The maximum over the block is the warp
// code's (fmaxf in any order); each exponential goes to ex, and every warp then sums lane l's WE exponentials in the
// warp code's order (i = 0, 1, ...) and shuffle tree, so the sum, the quotients and the picks are the router
// kernels' bits. Warp w's slice of vals (and of keys, route_key) is written by warp w alone (the caller syncs as its
// ranking needs). With shared, thread 0 loads the shared expert's logit (the E-th) beside its own and leaves it in
// *shared_logit (for finish_route_warp, after the ranking's __syncthreads), so that its round trip is the others'.
template <int WE>
static __device__ __forceinline__ void block_route_values(const __nv_bfloat16 *logits, int32_t E, bool softmax_topk,
                                                          bool shared, float *vals, unsigned long long *keys, float *ex,
                                                          float *wmax, float *shared_logit) {
    constexpr int PW = WE / MDB_WARPS; /* rows i of a warp */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float v[PW];
    float mx = -INFINITY;
    const bool own_shared = shared && threadIdx.x == 0;
    const float sl = own_shared ? act_load(__ldcg(logits + E)) : 0.0f;
#pragma unroll
    for (int i = 0; i < PW; i++) {
        const int e = lane + 32 * (warp * PW + i);
        v[i] = e < E ? act_load(__ldcg(logits + e)) : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    if (own_shared) *shared_logit = sl;
    if (softmax_topk) {
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) wmax[warp] = mx;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < MDB_WARPS; w++) mx = fmaxf(mx, wmax[w]);
#pragma unroll
        for (int i = 0; i < PW; i++) {
            const int e = lane + 32 * (warp * PW + i);
            if (e < E) ex[e] = v[i] = expf(v[i] - mx);
        }
        __syncthreads();
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < WE; i++)
            if (lane + 32 * i < E) sum += ex[lane + 32 * i];
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < PW; i++)
            if (lane + 32 * (warp * PW + i) < E) v[i] = v[i] / sum;
    }
#pragma unroll
    for (int i = 0; i < PW; i++) {
        const int e = lane + 32 * (warp * PW + i);
        vals[e] = v[i], keys[e] = route_key(v[i], e);
    }
}

// the phases' barrier: the generation barrier, or with cnt (route moe.block_barrier=count) the counting one
static __device__ __forceinline__ void block_barrier(const fm_moe_block_args &p, unsigned long long *cnt) {
    if (cnt) grid_barrier_count(cnt);
    else grid_barrier(p.barrier);
}

template <int WE, bool QOUT, bool PRE>
static __global__ __launch_bounds__(MDB_THREADS, 2) void moe_decode_block_kernel(const fm_moe_block_args p,
                                                                                 unsigned long long *cnt) {
    __shared__ __align__(16) mdb_smem sm;
#ifdef MDB_TIMES
    long long stamp[14];
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
    uint4 nwr[NORM_CHUNKS]; /* the tail's norm weights, bf16 until used: 8 registers held, not 16 */
#pragma unroll
    for (int j = 0; j < NORM_CHUNKS; j++) {
        const int64_t c = 8 * ((int64_t)threadIdx.x + j * NORM_THREADS);
        nwr[j] = blockIdx.x == 0 && c < H ? *(const uint4 *)(p.norm + c) : make_uint4(0, 0, 0, 0);
    }
    if (PRE) pre_norm_weights(p.pre_norm, H, sm.resid); /* before the wait, into shared memory: no registers */
    pdl_wait();
    MDB_STAMP(1);
    if (PRE) pre_add_norm(p, sm.xr, sm.resid);
    else rf_stage_rows(p.x, 1, H, sm.xr, MDB_THREADS); /* H <= MDB_MAX_H: always staged */
    if (e < p.E) {
        float acc[FM_ROUTER_FUSED_MAX_T];
        rf_row_logits(rw, chunks, lane, wv, p.x, sm.xr, true, 1, H, acc);
        if (lane == 0) p.logits[e] = __float2bfloat16_rn(acc[0]);
    }
    quantize_row_smem<false>(sm.xr, H, p.gu_groups, sm.xq, sm.xqs);
    MDB_STAMP(2);
    block_barrier(p, cnt);
    MDB_STAMP(3);
    if (PRE && blockIdx.x == 0) /* every CTA has read acc: the residual's sum may replace it (phase 4 reads it) */
        for (int64_t c = threadIdx.x; c < H / 8; c += MDB_THREADS) ((uint4 *)p.acc)[c] = ((const uint4 *)sm.resid)[c];

    /* phase 1: every CTA routes the token from the logits (through L2): its warps make the values route_warp_token
       compares (block_route_values: a slice a warp, the router's bits), then the threads rank the candidates
       (descending, ties to the lower index): rank j is what the warp argmax picks in round j, so the experts, their
       order and weights are the router's. With the shared expert in the bank its logit is the last, no candidate, and
       its pair follows the picks (finish_route) */
    const int32_t Ec = p.E - p.shared, kc = p.k - p.shared;
    block_route_values<WE>(p.logits, Ec, p.softmax_topk, p.shared, sm.vals, sm.keys, sm.ex, sm.wmax, &sm.shared_logit);
    if (WE == 8) __syncthreads(); /* every value before any thread ranks among all of them */
    else __syncwarp();            /* a warp's slice of values is its own */
    MDB_STAMP(10);
    if (WE == 8) { /* up to 256 candidates: each thread ranks its experts among all of them */
        for (int32_t ei = threadIdx.x; ei < Ec; ei += MDB_THREADS) {
            const int32_t rank = rank_key(sm.keys, 0, (Ec + 1) & ~1, sm.keys[ei]);
            if (rank < kc) sm.sel_v[rank] = sm.vals[ei], sm.sel_id[rank] = ei;
        }
    } else { /* more: each warp's top kc of its slice, then the 8 kc candidates ranked among themselves (any
                expert ahead of one of the k picks is itself a pick, so a slice's picks are in its top kc) */
        slice_top<WE / MDB_WARPS>(sm.keys + warp * (4 * WE), kc, sm.cand + warp * kc);
        __syncthreads();
        MDB_STAMP(11);
        const int32_t n = MDB_WARPS * kc; /* <= MDB_THREADS: kc <= 32 */
        if ((int32_t)threadIdx.x < n) {   /* n = 8 kc: even */
            const unsigned long long me = sm.cand[threadIdx.x];
            const int32_t rank = rank_key(sm.cand, 0, n, me), ei = (int32_t) ~(uint32_t)me;
            if (rank < kc) sm.sel_v[rank] = sm.vals[ei], sm.sel_id[rank] = ei;
        }
    }
    if (WE == 8) MDB_STAMP(11);
    __syncthreads();
    MDB_STAMP(12);
    if (warp == 0)
        finish_route_warp(sm.sel_v, sm.sel_id, kc, p.softmax_topk, p.norm_topk, p.shared ? Ec : -1, sm.shared_logit,
                          sm.ids, sm.w);
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
    block_barrier(p, cnt);
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
    block_barrier(p, cnt);
    MDB_STAMP(8);

    /* phase 4: the token's end by CTA 0 */
    if (blockIdx.x == 0) {
        float nw[NORM_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < NORM_CHUNKS; j++) unpack8(nwr[j], nw[j]);
        combine_add_rmsnorm_row<MDB_COMBINE_U>(p.y, NULL, sm.w, p.k, H, 0, p.acc, p.eps, nw, p.out,
                                               QOUT ? p.out_q : NULL, p.out_qs, 1);
        MDB_STAMP(13);
    }
    MDB_STAMP(9);
#ifdef MDB_TIMES
    if (threadIdx.x == 0 && blockIdx.x == 0)
        printf("mdb %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", stamp[1] - stamp[0],
               stamp[2] - stamp[1], stamp[3] - stamp[2], stamp[4] - stamp[3], stamp[5] - stamp[4], stamp[6] - stamp[5],
               stamp[7] - stamp[6], stamp[8] - stamp[7], stamp[9] - stamp[8], stamp[10] - stamp[3],
               stamp[11] - stamp[10], stamp[12] - stamp[11], stamp[4] - stamp[12], stamp[9] - stamp[13]);
#endif
}

extern "C" bool fm_cuda_moe_decode_block_takes(int64_t T, int32_t E, int32_t k, bool shared, int64_t H, int64_t I,
                                               int64_t router_ld) {
    const int32_t Ec = E - shared, kc = k - shared; /* the candidates and their picks */
    return T == 1 && Ec >= 1 && Ec <= 32 * WARP_E_MAX && kc >= 1 && kc <= Ec && k <= FM_ROUTE_MAX_K && H % 8 == 0 &&
           H >= 8 && H <= MDB_MAX_H && I >= 8 && I % 8 == 0 && I <= MDB_MAX_I && router_ld % 8 == 0;
}

template <int WE, bool QOUT, bool PRE> static void launch_q(const fm_moe_block_args *a, bool pdl, cudaStream_t s) {
    static int resident = 0; /* CTAs an SM, once */
    if (!resident) {
        FM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, moe_decode_block_kernel<WE, QOUT, PRE>,
                                                                    MDB_THREADS, 0));
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
    /* route moe.block_barrier=count: this grid size's count word, else a free one, else the generation barrier */
    unsigned long long *cnt = NULL;
    for (int i = 0; a->counts && i < FM_MOE_BLOCK_COUNTS && !cnt; i++) {
        if (a->count_grids[i] == 0) a->count_grids[i] = (int32_t)grid;
        if (a->count_grids[i] == (int32_t)grid) cnt = a->counts + i;
    }
    pdl_launch(moe_decode_block_kernel<WE, QOUT, PRE>, dim3(grid), dim3(MDB_THREADS), 0, s, pdl, *a, cnt);
}

template <int WE> static void launch(const fm_moe_block_args *a, bool pdl, cudaStream_t s) {
    if (a->out_q) {
        if (a->pre_y) launch_q<WE, true, true>(a, pdl, s);
        else launch_q<WE, true, false>(a, pdl, s);
    } else if (a->pre_y) launch_q<WE, false, true>(a, pdl, s);
    else launch_q<WE, false, false>(a, pdl, s);
}

extern "C" void fm_cuda_moe_decode_block(const fm_moe_block_args *a, bool pdl, cudaStream_t s) {
    const bool slices_ok = (a->gu_slices == 1 || a->gu_slices == 2 || a->gu_slices == 4 || a->gu_slices == 8) &&
                           (a->down_slices == 1 || a->down_slices == 2 || a->down_slices == 4 || a->down_slices == 8);
    if (!fm_cuda_moe_decode_block_takes(1, a->E, a->k, a->shared, a->H, a->I, a->router_ld) || !slices_ok ||
        a->gu_groups != fm_ceil_div(a->H, 128) || a->down_groups != fm_ceil_div(a->I, 128) ||
        a->gu_rows_pad < 2 * a->I || a->down_rows_pad < a->H ||
        !fm_combine_row_takes(a->H, a->y, a->acc, a->norm, a->out)) {
        fprintf(stderr, "fp8moe: moe_decode_block: unsupported shape (E %d, k %d%s, H %lld, I %lld, slices %d / %d)\n",
                a->E, a->k, a->shared ? " with the shared expert" : "", (long long)a->H, (long long)a->I, a->gu_slices,
                a->down_slices);
        abort(); /* the caller asks fm_cuda_moe_decode_block_takes */
    }
    const int we = warp_experts(a->E, a->shared); /* the router kernels' variant for E (router_device.cuh) */
    if (we == 8) launch<8>(a, pdl, s);
    else if (we == 16) launch<16>(a, pdl, s);
    else launch<32>(a, pdl, s);
    FM_LAUNCH_CHECK("moe_decode_block");
}
