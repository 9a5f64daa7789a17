// The split kernel of paged attention as device code (attention_paged.cu has the design): one CTA's work, the
// fused combine and the combine's arithmetic, shared by the split and combine kernels and by the persistent decode
// attention block (attn_decode_block.cu), which runs them as phases of one launch.
#ifndef FM_CUDA_ATTENTION_PAGED_SPLIT_CUH
#define FM_CUDA_ATTENTION_PAGED_SPLIT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "backend/attention_paged.h"
#include "backend/cuda/attention_e4m3.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/pdl.cuh"

#define APG_WARPS 4
#define APG_THREADS (APG_WARPS * 32)

typedef __nv_bfloat16 bf16;

static_assert(FM_ATT_PAGED_MIN_CHUNK % 16 == 0, "a split's slice starts on a 16-key tile (apg_tile_slots)");

// keys per split for a token of len keys and S splits (attention_paged.h); ceil(len / chunk) <= S
static __device__ __forceinline__ int apg_chunk(int len, int splits) {
    int c = (len + splits - 1) / splits;
    c = (c + 15) & ~15;
    return c > FM_ATT_PAGED_MIN_CHUNK ? c : FM_ATT_PAGED_MIN_CHUNK;
}

typedef struct apg_args {
    const bf16 *qkv;
    const void *k_cache, *v_cache; // bf16 [n_slots][nkv hd], or e4m3 rows of row_b bytes
    const int32_t *tok_seq, *tok_pos, *tables;
    float *part;        // scratch after the counters (S > 1)
    unsigned *counters; // the scratch's start (S > 1 and paged.combine=fused), else NULL: the combine kernel merges
    bf16 *out;
    int nh, nkv, qgroups, max_blocks, block_tokens, splits;
    int bt_shift;  // log2(block_tokens) for a power of two, else -1 (apg_slot_of)
    int skip_runs; // the rows in runs belong to the tiled kernel (attention_paged_tiled.cu): exit at once
    int early;     // the kernel has not waited (PDL) yet: apg_split_cta (the swapped kernel likewise) waits, having
                   // issued the loads of the keys earlier steps stored (route paged.early_kv)
    float sl2;     // log2(e) / sqrt(hd)
    int64_t row_b; // e4m3: bytes of a slot's row, fm_kv_e4m3_row_bytes(nkv, hd) (the bf16 form: nkv hd elements)
} apg_args;

// The slots of the 16 keys [j0, j0 + 16) of a tile (j0 % 16 == 0), through the sequence's block table. Blocks of a
// power of two of at least 16 keys (the engine's 16) hold the tile whole: one table load and shifts a tile, key j0 +
// rr at slot0 + rr (one = true). Other sizes: a table load per key (apg_slot_of, attention_paged.cuh). The per-key
// division by a runtime block size it replaces was ~40 instructions a row, 5 rows a lane a tile; removing it gained
// 0.9 % (e4m3) and 2.2 % (bf16) of the attention at B = 64 on an H100 (RESULTS 2.21). A tile starts at a multiple of
// 16 keys: a split's slice at a multiple of its chunk, itself a multiple of 16 (apg_chunk, the assert below).
typedef struct apg_slots {
    bool one;
    int64_t slot0;
} apg_slots;
static __device__ __forceinline__ apg_slots apg_tile_slots(const int32_t *table, int bt, int bt_shift, int j0) {
    apg_slots s;
    s.one = bt_shift >= 4;
    s.slot0 = s.one ? apg_slot_of(table, bt, bt_shift, j0) : 0;
    return s;
}
static __device__ __forceinline__ int64_t apg_key_slot(const apg_slots &s, const int32_t *table, int bt, int bt_shift,
                                                       int j0, int rr) {
    return s.one ? s.slot0 + rr : apg_slot_of(table, bt, bt_shift, j0 + rr);
}

// cp.async of the 16 K and V rows of keys [j0, j0 + 16) of kv head kvh into one stage (rows at or past s1 zero-
// filled). Lane l copies chunk l % CH of rows l / CH + p * RP (RP = 32 / CH rows per pass).
template <int HD>
static __device__ __forceinline__ void apg_load_tile(uint32_t sk, uint32_t sv, const bf16 *k_cache, const bf16 *v_cache,
                                                     const int32_t *table, int block_tokens, int bt_shift,
                                                     int64_t kv_ld, int kvh, int j0, int s1, int lane) {
    constexpr int CH = HD / 8, RP = 32 / CH, PASSES = (16 + RP - 1) / RP;
    const int ch = lane % CH, r = lane / CH;
    if (32 % CH != 0 && r >= RP) return;
    const apg_slots sl = apg_tile_slots(table, block_tokens, bt_shift, j0); // j0 < s1: a key of the tile exists
#pragma unroll
    for (int p = 0; p < PASSES; p++) {
        const int rr = r + p * RP;
        if (16 % RP != 0 && rr >= 16) break;
        const int j = j0 + rr;
        const bool ok = j < s1;
        int64_t off = 0;
        if (ok) off = apg_key_slot(sl, table, block_tokens, bt_shift, j0, rr) * kv_ld + (int64_t)kvh * HD + ch * 8;
        att_cp16(sk + att_off<HD>(rr, ch), k_cache + off, ok ? 16u : 0u);
        att_cp16(sv + att_off<HD>(rr, ch), v_cache + off, ok ? 16u : 0u);
    }
}

// e4m3 form: cp.async of the codes of keys [j0, j0 + 16) of kv head kvh and their scales into one raw stage: K's
// codes [16][HD] bytes (rows of HD bytes, unswizzled) then its 16 fp32 scales at rk, V's at rv; rows at or past s1
// zero-filled (codes 0 and scale 0: the value 0, as the bf16 form's zero rows). Lane l copies 16-byte code chunk
// l % CH of rows l / CH + p * RP (RP = 32 / CH rows per pass), and the scale of row l % 16 (K's below lane 16, V's
// above).
template <int HD>
static __device__ __forceinline__ void
apg_load_raw(uint32_t rk, uint32_t rv, const unsigned char *k_cache, const unsigned char *v_cache, const int32_t *table,
             int block_tokens, int bt_shift, int64_t row_b, int nkv, int kvh, int j0, int s1, int lane) {
    constexpr int CH = HD / 16, RP = 32 / CH, PASSES = (16 + RP - 1) / RP;
    const apg_slots sl = apg_tile_slots(table, block_tokens, bt_shift, j0); // j0 < s1: a key of the tile exists
    {
        const int rr = lane & 15, j = j0 + rr;
        const bool ok = j < s1;
        int64_t off = 0;
        if (ok) off = apg_key_slot(sl, table, block_tokens, bt_shift, j0, rr) * row_b + (int64_t)nkv * HD + kvh * 4;
        att_cp4((lane < 16 ? rk : rv) + 16 * HD + rr * 4, (lane < 16 ? k_cache : v_cache) + off, ok ? 4u : 0u);
    }
    const int ch = lane % CH, r = lane / CH;
    if (32 % CH != 0 && r >= RP) return;
#pragma unroll
    for (int p = 0; p < PASSES; p++) {
        const int rr = r + p * RP;
        if (16 % RP != 0 && rr >= 16) break;
        const int j = j0 + rr;
        const bool ok = j < s1;
        int64_t off = 0;
        if (ok) off = apg_key_slot(sl, table, block_tokens, bt_shift, j0, rr) * row_b + (int64_t)kvh * HD + ch * 16;
        att_cp16(rk + rr * HD + ch * 16, k_cache + off, ok ? 16u : 0u);
        att_cp16(rv + rr * HD + ch * 16, v_cache + off, ok ? 16u : 0u);
    }
}

// Shared memory of the split kernel (the header's table): Q, then per warp (e4m3: its bf16 tile, then) ST stages of
// K and V
template <int HD, bool E4M3> struct apg_shape {
    static constexpr int RE = ATT_ROW_ELEMS(HD);
    static constexpr int TILE = 16 * RE * 2; // bytes of one [16][HD] bf16 tile
    // K/V stages per warp (the e4m3 form with 3 lost 2.5 % at B = 64: bench/NOTES.md, thirty-second session)
    static constexpr int ST = HD <= 128 ? 2 : 1;
    static constexpr int RAW = 16 * HD + 16 * 4;                // e4m3: one raw tile, codes then fp32 scales
    static constexpr int STAGE = E4M3 ? 2 * RAW : 2 * TILE;     // one stage: K, then V
    static constexpr int WARP = (E4M3 ? TILE : 0) + ST * STAGE; // one warp's region
    static constexpr int SMEM = TILE + APG_WARPS * WARP;        // Q, then the warps' regions
    static_assert(APG_WARPS * 16 * HD * 4 <= APG_WARPS * WARP, "the merge's O must fit the warps' regions");
    static_assert(2 * APG_WARPS * 16 * 4 <= TILE, "the merge's max and sum must fit the Q tile");
    static_assert(SMEM <= 99 * 1024, "shared memory above the sm_89 limit");
    static_assert((2 * 16 * FM_ATT_PAGED_MAX_SPLITS + 16) * 4 <= SMEM, "the fused combine's e, l and L must fit");
    static_assert(TILE % 128 == 0 && RAW % 16 == 0 && WARP % 128 == 0, "tiles 128-byte aligned, raw rows 16");
};

// The fused combine (paged.combine=fused), run by the CTA that counted itself last for (token t, kv head group) with
// the nq query heads from h0: each output out[t, h, d] gets the combine kernel's arithmetic in its order (below:
// M = the max of the splits' maxima; per split s in order, e = exp2(m_s - M), acc += o_s[d] e, L += l_s e; acc / L),
// laid out for one CTA instead of nh CTAs. The maxima and sums of the nq heads go to shared memory first (smem: m
// then e [16][S], l [16][S], L [16]; over the dead stages); M per head by a warp's max reduction (max is exact in any
// order), e and L once per head rather than once per (head, d). Each thread owns up to KC float4 chunks of the
// outputs and walks the splits outermost, U splits' loads in flight together before their FMAs (the combine
// kernel's thread owns one output and walks the splits too: the same sums in the same order). Reads bypass L1
// (__ldcg): the other CTAs' partials reached L2 through their fences, and this SM's L1 may hold older lines.
template <int HD, int SYNC>
static __device__ __forceinline__ void apg_fused_combine(const apg_args &a, float *smem, int64_t T, int64_t t, int h0,
                                                         int nq, int n) {
    constexpr int S = FM_ATT_PAGED_MAX_SPLITS, C4 = HD / 4;       // a row of e; float4 chunks of a head's output
    constexpr int KC = (16 * C4 + APG_THREADS - 1) / APG_THREADS; // chunks per thread at most
    // float4 loads in flight per thread: HD / 8, at most 16 (the registers of the main loop's O scale with HD too)
    constexpr int LOADS = HD / 8 < 16 ? HD / 8 : 16, U = LOADS / KC > 1 ? LOADS / KC : 1; // U splits a batch
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t n_part = T * a.nh * a.splits, th0 = t * a.nh + h0;
    const float *pm = a.part + n_part * HD, *pl = pm + n_part;
    float *se = smem, *sl = smem + 16 * S, *sL = sl + 16 * S;
    for (int i = tid; i < nq * n; i += APG_THREADS) {
        const int r = i / n, sp = i % n;
        se[r * S + sp] = __ldcg(pm + (th0 + r) * a.splits + sp);
        sl[r * S + sp] = __ldcg(pl + (th0 + r) * a.splits + sp);
    }
    att_sync<SYNC, APG_THREADS>();
    for (int r = warp; r < nq; r += APG_WARPS) { // warp w: heads w, w + 4, ...: M, then e in place of m, then L
        float M = -INFINITY;
        for (int sp = lane; sp < n; sp += 32) M = fmaxf(M, se[r * S + sp]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        for (int sp = lane; sp < n; sp += 32) se[r * S + sp] = exp2f(se[r * S + sp] - M);
        __syncwarp();
        if (lane == 0) {
            float L = 0.0f;
            for (int sp = 0; sp < n; sp++) L += sl[r * S + sp] * se[r * S + sp];
            sL[r] = L;
        }
    }
    att_sync<SYNC, APG_THREADS>();
    float4 acc[KC];
#pragma unroll
    for (int k = 0; k < KC; k++) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < n; s0 += U) {
        float4 v[U][KC];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int k = 0; k < KC; k++) {
                const int c = tid + k * APG_THREADS, r = c / C4;
                const bool ok = s0 + u < n && c < nq * C4;
                v[u][k] = ok ? __ldcg((const float4 *)(a.part + ((th0 + r) * a.splits + s0 + u) * HD) + c % C4)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int k = 0; k < KC; k++) {
                const int c = tid + k * APG_THREADS, r = c / C4;
                if (s0 + u < n && c < nq * C4) {
                    const float e = se[r * S + s0 + u];
                    acc[k].x += v[u][k].x * e, acc[k].y += v[u][k].y * e;
                    acc[k].z += v[u][k].z * e, acc[k].w += v[u][k].w * e;
                }
            }
    }
#pragma unroll
    for (int k = 0; k < KC; k++) {
        const int c = tid + k * APG_THREADS, r = c / C4;
        if (c >= nq * C4) continue;
        const float L = sL[r];
        bf16 *o = a.out + (th0 + r) * HD + (c % C4) * 4;
        o[0] = __float2bfloat16_rn(acc[k].x / L), o[1] = __float2bfloat16_rn(acc[k].y / L);
        o[2] = __float2bfloat16_rn(acc[k].z / L), o[3] = __float2bfloat16_rn(acc[k].w / L);
    }
}

// the loads of one stage: K and V of keys [j0, j0 + 16) (bf16 tiles, or e4m3 raw tiles)
template <int HD, bool E4M3>
static __device__ __forceinline__ void apg_load_stage(const apg_args &a, uint32_t stage, const int32_t *table,
                                                      int64_t kv_ld, int kvh, int j0, int s1, int lane) {
    typedef apg_shape<HD, E4M3> SH;
    if (E4M3)
        apg_load_raw<HD>(stage, stage + SH::RAW, (const unsigned char *)a.k_cache, (const unsigned char *)a.v_cache,
                         table, a.block_tokens, a.bt_shift, a.row_b, a.nkv, kvh, j0, s1, lane);
    else
        apg_load_tile<HD>(stage, stage + SH::TILE, (const bf16 *)a.k_cache, (const bf16 *)a.v_cache, table,
                          a.block_tokens, a.bt_shift, kv_ld, kvh, j0, s1, lane);
}

// The end of a split CTA (the split kernel's and the swapped one's, attention_paged_swap.cu): the APG_WARPS warps'
// O at so ([APG_WARPS][16][HD] fp32, each row over its warp's sum), their maxima in log2 units and sums at apg_smem
// ([APG_WARPS][16] floats each), written before a barrier, merged per (query head r < nq, d): out (one split) or the
// split's partial to the scratch; then, with the fused combine, the last of the (token, group)'s split CTAs merges
// them.
template <int HD, int SYNC>
static __device__ __forceinline__ void apg_merge_warps(const apg_args &a, unsigned char *apg_smem, const float *so,
                                                       int64_t T, int64_t t, int Y, int y, int split, int h0, int nq,
                                                       int len, int chunk, unsigned *arrived) {
    const int tid = threadIdx.x;
    const float *sm = (const float *)apg_smem, *sl = sm + APG_WARPS * 16;
    for (int i = tid; i < nq * HD; i += APG_THREADS) {
        const int r = i / HD, d = i % HD;
        float M = sm[r];
#pragma unroll
        for (int w = 1; w < APG_WARPS; w++) M = fmaxf(M, sm[w * 16 + r]); // finite: warp 0 had a tile
        float acc = 0.0f, L = 0.0f;
#pragma unroll
        for (int w = 0; w < APG_WARPS; w++) {
            const float e = exp2f(sm[w * 16 + r] - M);
            acc += so[(w * 16 + r) * HD + d] * e;
            L += sl[w * 16 + r] * e;
        }
        const int64_t th = t * a.nh + h0 + r; // (token, query head)
        if (a.splits == 1) {
            a.out[th * HD + d] = __float2bfloat16_rn(acc / L);
        } else {
            const int64_t pi = th * a.splits + split;
            const int64_t n_part = T * a.nh * a.splits;
            a.part[pi * HD + d] = acc;
            if (d == 0) a.part[n_part * HD + pi] = M, a.part[n_part * (HD + 1) + pi] = L;
        }
    }
    if (a.splits == 1 || !a.counters) return;

    // fused combine: the last of the group's n split CTAs (those with s0 < len) to arrive merges the n partials
    const unsigned n = (unsigned)((len + chunk - 1) / chunk);
    __threadfence(); // this CTA's partial is visible device-wide before the CTA is counted
    att_sync<SYNC, APG_THREADS>();
    if (tid == 0) *arrived = atomicInc(a.counters + t * Y + y, n - 1); // the last leaves 0
    att_sync<SYNC, APG_THREADS>();
    if (*arrived != n - 1) return;
    __threadfence(); // the others' partials, counted before this CTA, are read after the count
    apg_fused_combine<HD, SYNC>(a, (float *)apg_smem, T, t, h0, nq,
                                (int)n); // over Q and the stages: every warp is past them
}

// The first loads of a split CTA (the split kernel's and the swapped one's, attention_paged_swap.cu): the CTA's nq
// query rows of token t from head h0 into the first ROWS rows of the Q tile at sq (zero rows after them), one cp.async
// group; then the warp's first ST tiles of the slice [s0, s1) (nw tiles the warp's) into its stages at wst, STAGE
// bytes apart, a group each (possibly empty: every thread commits ST groups here and one per tile after). issued: bit
// st set where apg_early_loads already issued stage st (uncommitted: the Q group takes it in).
template <int HD, bool E4M3, int ROWS, int ST, int STAGE>
static __device__ __forceinline__ void apg_start_loads(const apg_args &a, uint32_t sq, uint32_t wst, int64_t t, int h0,
                                                       int nq, const int32_t *table, int64_t kv_ld, int kvh, int s0,
                                                       int s1, int nw, int tid, unsigned issued) {
    const int warp = tid >> 5, lane = tid & 31;
    {
        constexpr int CH = HD / 8;
        const bf16 *gq = a.qkv + t * (int64_t)(a.nh + 2 * a.nkv) * HD + (int64_t)h0 * HD;
        for (int i = tid; i < ROWS * CH; i += APG_THREADS) {
            const int r = i / CH, ch = i % CH;
            const bool ok = r < nq;
            att_cp16(sq + att_off<HD>(r, ch), ok ? gq + r * HD + ch * 8 : gq, ok ? 16u : 0u);
        }
        att_cp_commit();
    }
#pragma unroll
    for (int st = 0; st < ST; st++) {
        if (st < nw && !((issued >> st) & 1u))
            apg_load_stage<HD, E4M3>(a, wst + st * STAGE, table, kv_ld, kvh, s0 + (warp + APG_WARPS * st) * 16, s1,
                                     lane);
        att_cp_commit();
    }
}

// Route paged.early_kv, before the PDL wait: those of the warp's first ST tiles of the slice [s0, s1) whose keys all
// lie before the row's own position pos (a tile loads keys [j0, min(j0 + 16, s1)): every tile of a split that ends
// before pos, the last split's but the one with pos), issued into their stages (uncommitted); returns them as bits.
// Only for a row that is its sequence's one row of the step (not in a run): its keys before pos were stored by
// earlier steps, the key at pos by the kernel before this one (qk_norm_rope_store), which this one has not waited
// for. The slots come from the block table, the sequence and the position, which the host staged before the step.
template <int HD, bool E4M3, int ST, int STAGE>
static __device__ __forceinline__ unsigned apg_early_loads(const apg_args &a, uint32_t wst, int64_t T, int64_t t,
                                                           const int32_t *table, int64_t kv_ld, int kvh, int s0, int s1,
                                                           int nw, int tid) {
    if (apg_in_run(a.tok_seq, T, t)) return 0u;
    const int warp = tid >> 5, lane = tid & 31, pos = a.tok_pos[t];
    unsigned issued = 0u;
#pragma unroll
    for (int st = 0; st < ST; st++) {
        const int j0 = s0 + (warp + APG_WARPS * st) * 16;
        if (st < nw && min(j0 + 16, s1) <= pos) {
            apg_load_stage<HD, E4M3>(a, wst + st * STAGE, table, kv_ld, kvh, j0, s1, lane);
            issued |= 1u << st;
        }
    }
    return issued;
}

// One CTA of the split kernel: token t of T, kv head group y of Y (kv head y / qgroups), split `split`, run by the
// APG_THREADS threads 0.. of a CTA (tid = threadIdx.x) with the split kernel's shared memory at apg_smem and two
// shared words (qmax, arrived). SYNC: att_sync's (0: the kernel's __syncthreads; the persistent decode block runs it
// in its warps 0-3 with a named barrier). QREG_MAX: the largest head dim whose Q fragments stay in registers (128
// in the kernel; 0 under a 128-register bound, Q read from shared memory per tile: the same products).
template <int HD, bool E4M3, int QREG_MAX, int SYNC>
static __device__ __forceinline__ void apg_split_cta(const apg_args &a, unsigned char *apg_smem, int64_t T, int64_t t,
                                                     int Y, int y, int split, unsigned *qmax, unsigned *arrived) {
    typedef apg_shape<HD, E4M3> SH;
    constexpr int KS = HD / 16, DT = HD / 8, ST = SH::ST;
    constexpr bool QREG = HD <= QREG_MAX;
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(apg_smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int G = a.nh / a.nkv;
    const int kvh = y / a.qgroups, h0 = kvh * G + (y % a.qgroups) * 16;
    const int nq = min(16, kvh * G + G - h0); // query heads of this CTA
    /* a.early: the kernel has not waited yet (PDL): every path waits below before it reads an earlier kernel's data */
    if (a.skip_runs && apg_in_run(a.tok_seq, T, t)) {
        if (a.early) pdl_wait();
        return;
    }
    const int len = a.tok_pos[t] + 1;
    const int chunk = apg_chunk(len, a.splits);
    const int s0 = split * chunk;
    if (s0 >= len) { // a split past this token's context (the combine knows: it counts the same way)
        if (a.early) pdl_wait();
        return;
    }
    const int s1 = min(len, s0 + chunk);
    const int32_t *table = a.tables + (int64_t)a.tok_seq[t] * a.max_blocks;
    const int64_t kv_ld = (int64_t)a.nkv * HD;
    const int ntiles = (s1 - s0 + 15) / 16;
    const int nw = ntiles > warp ? (ntiles - warp + APG_WARPS - 1) / APG_WARPS : 0; // this warp's tiles
    // the warp's region: (e4m3: its bf16 tile at wbuf, then) its stages from wst
    const uint32_t wbuf = sq + SH::TILE + (uint32_t)(warp * SH::WARP), wst = wbuf + (E4M3 ? SH::TILE : 0);
    unsigned issued = 0u;
    if (a.early) {
        issued = apg_early_loads<HD, E4M3, ST, SH::STAGE>(a, wst, T, t, table, kv_ld, kvh, s0, s1, nw, tid);
        pdl_wait();
    }
    apg_start_loads<HD, E4M3, 16, ST, SH::STAGE>(a, sq, wst, t, h0, nq, table, kv_ld, kvh, s0, s1, nw, tid, issued);
    if (E4M3 && tid == 0) *qmax = 0; // e4m3: the largest |q| of the tile, as bf16 bits
    att_cp_wait<ST>();
    att_sync<SYNC, APG_THREADS>(); // Q landed
    const float qup =
        E4M3 ? att_q_to_f16<HD, 16, APG_THREADS, SYNC>(apg_smem, qmax, tid) : 1.0f; // e4m3: Q in f16, times 1 / qup

    const att_lane la = att_lane_init<HD>(lane & 15, lane >> 4);
    const att_lane lk = att_lane_init<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    uint32_t qf[QREG ? KS : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < KS; kk++) att_ldsm_x4(qf[QREG ? kk : 0], sq + att_lane_off<HD>(&la, 0, kk));
    }
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; // rows g and g + 8: raw max, partial sum
    float vmax = 0.0f; // e4m3: the largest V scale of the warp's tiles so far; o holds O / vmax (the header)

    for (int i = 0; i < nw; i++) {
        const int st = ST == 1 ? 0 : i % ST;
        const uint32_t stage = wst + st * SH::STAGE;
        // the tiles the math reads: the stage's (bf16), or the warp's bf16 tile that K, then V, is converted into
        const uint32_t sk = E4M3 ? wbuf : stage, sv = E4M3 ? wbuf : stage + SH::TILE;
        const int j0 = s0 + (warp + APG_WARPS * i) * 16;
        att_cp_wait<ST - 1>();
        __syncwarp(); // every lane's rows of tile i landed (and, e4m3, every lane is done with the last tile's V)
        float ksc[2][2], vsc[2][2]; // e4m3: the scales of the lane's keys 8 nt + 2 c + {0, 1}
        if (E4M3) {
            const unsigned char *raw = apg_smem + (stage - sq);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const float2 k2 = *(const float2 *)(raw + 16 * HD + (nt * 8 + 2 * c) * 4);
                const float2 v2 = *(const float2 *)(raw + SH::RAW + 16 * HD + (nt * 8 + 2 * c) * 4);
                ksc[nt][0] = k2.x * qup, ksc[nt][1] = k2.y * qup, vsc[nt][0] = v2.x, vsc[nt][1] = v2.y;
            }
            att_e4m3_to_f16<HD, 16, 32, HD <= 64 ? 1 : 4>(apg_smem + (wbuf - sq), raw, lane);
            __syncwarp(); // K converted
        }

        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t qa[4], b[4];
            if (QREG) {
#pragma unroll
                for (int r = 0; r < 4; r++) qa[r] = qf[QREG ? kk : 0][r];
            } else {
                att_ldsm_x4(qa, sq + att_lane_off<HD>(&la, 0, kk));
            }
            att_ldsm_x4(b, sk + att_lane_off<HD>(&lk, 0, kk));
            att_mma_x2<E4M3>(s[0], s[1], qa, b);
        }
        if (E4M3) { // S = (Q / qup) codes^T x (the key's scale x qup): exact, powers of two
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) s[nt][r] *= ksc[nt][r & 1];
        }
        if (j0 + 16 > s1) { // the slice ends in this tile
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    if (j0 + nt * 8 + 2 * c + (r & 1) >= s1) s[nt][r] = -INFINITY;
        }
        // e4m3: P V = (P x the key's scale / vmax) codes x vmax, vmax the largest V scale so far (exact: powers of
        // two); a larger one rescales o with alpha, as a larger score does. The quad's lanes hold the tile's 16 keys.
        float vfix = 1.0f;
        if (E4M3) {
            float tm = fmaxf(fmaxf(vsc[0][0], vsc[0][1]), fmaxf(vsc[1][0], vsc[1][1]));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
            const float vnew = fmaxf(vmax, tm), inv = att_inv_pow2(vnew); // > 0: the tile has a key below s1
            vfix = vmax * inv, vmax = vnew;                               // 0 on the first tile, as alpha
#pragma unroll
            for (int nt = 0; nt < 2; nt++) vsc[nt][0] *= inv, vsc[nt][1] *= inv;
        }
        // online softmax (the 4 lanes of a quad share a row); the tile has a key below s1, so the max is finite
        float ofix[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1]));
            mx = fmaxf(mx, mrow[hf]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mb = mx * a.sl2;
            const float alpha = att_exp2(mrow[hf] * a.sl2 - mb); // 0 on the first tile (-inf), 1 if the max stayed
            mrow[hf] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                s[nt][2 * hf] = att_exp2(fmaf(s[nt][2 * hf], a.sl2, -mb));
                s[nt][2 * hf + 1] = att_exp2(fmaf(s[nt][2 * hf + 1], a.sl2, -mb));
                sum += s[nt][2 * hf] + s[nt][2 * hf + 1];
            }
            lrow[hf] = lrow[hf] * alpha + sum;
            ofix[hf] = alpha * vfix; // e4m3: o is kept over vmax (exact: a power of two)
        }
        // o rescaled only where a row's factor is not 1 (a new max, or vmax): x 1 is the identity, so skipping it
        // changes no bit, and after the first tiles the maxima rarely move (64 multiplies a lane a tile saved)
        if (__any_sync(0xffffffffu, ofix[0] != 1.0f || ofix[1] != 1.0f)) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int dt = 0; dt < DT; dt++) o[dt][2 * hf] *= ofix[hf], o[dt][2 * hf + 1] *= ofix[hf];
        }
        // O += P V: the S accumulators of key n8 tiles 0 and 1 are the A fragment of the tile's one k-step
        uint32_t p[4];
        if (E4M3) { // f16 P, each key's column times its scale / vmax (<= 1)
            p[0] = att_pack_f16(s[0][0] * vsc[0][0], s[0][1] * vsc[0][1]);
            p[1] = att_pack_f16(s[0][2] * vsc[0][0], s[0][3] * vsc[0][1]);
            p[2] = att_pack_f16(s[1][0] * vsc[1][0], s[1][1] * vsc[1][1]);
            p[3] = att_pack_f16(s[1][2] * vsc[1][0], s[1][3] * vsc[1][1]);
        } else {
            p[0] = att_pack_bf16(s[0][0], s[0][1]);
            p[1] = att_pack_bf16(s[0][2], s[0][3]);
            p[2] = att_pack_bf16(s[1][0], s[1][1]);
            p[3] = att_pack_bf16(s[1][2], s[1][3]);
        }
        if (E4M3) {
            __syncwarp(); // every lane's ldmatrix of K is done
            att_e4m3_to_f16<HD, 16, 32, HD <= 64 ? 1 : 4>(apg_smem + (wbuf - sq), apg_smem + (stage + SH::RAW - sq),
                                                          lane);
            __syncwarp(); // V converted, and the raw stage read: refilled now, under the P V product
            if (i + ST < nw) apg_load_stage<HD, true>(a, stage, table, kv_ld, kvh, j0 + APG_WARPS * ST * 16, s1, lane);
            att_cp_commit();
        }
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
            uint32_t b[4];
            att_ldsm_x4_t(b, sv + att_lane_off<HD>(&la, 0, dp));
            att_mma_x2<E4M3>(o[2 * dp], o[2 * dp + 1], p, b);
        }
        if (!E4M3) {
            __syncwarp(); // every lane is done with the stage before it is refilled
            if (i + ST < nw)
                apg_load_tile<HD>(sk, sv, (const bf16 *)a.k_cache, (const bf16 *)a.v_cache, table, a.block_tokens,
                                  a.bt_shift, kv_ld, kvh, j0 + APG_WARPS * ST * 16, s1, lane);
            att_cp_commit();
        }
    }

    // merge the warps: O [4][16][HD] fp32 over the stages, max (log2 units) and sum [4][16] each over Q
    att_cp_wait_all();
    att_sync<SYNC, APG_THREADS>(); // every warp is done with Q and its stages
    float *so = (float *)(apg_smem + SH::TILE);
    float *sm = (float *)apg_smem, *sl = sm + APG_WARPS * 16;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = lrow[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int r = g + 8 * hf;
        if (c == 0) sm[warp * 16 + r] = mrow[hf] * a.sl2, sl[warp * 16 + r] = l; // -inf and 0 for a warp without keys
#pragma unroll
        for (int dt = 0; dt < DT; dt++) // e4m3: o times vmax (0 for a warp without keys: its o is 0)
            *(float2 *)&so[(warp * 16 + r) * HD + dt * 8 + 2 * c] =
                E4M3 ? make_float2(o[dt][2 * hf] * vmax, o[dt][2 * hf + 1] * vmax)
                     : make_float2(o[dt][2 * hf], o[dt][2 * hf + 1]);
    }
    att_sync<SYNC, APG_THREADS>();
    apg_merge_warps<HD, SYNC>(a, apg_smem, so, T, t, Y, y, split, h0, nq, len, chunk, arrived);
}

// Merges the splits of (token t of T, query head h) into out[t, h, 0..hd), the combine kernel's arithmetic: M the
// largest of the splits' maxima, then per split s in order e = exp2(m_s - M), acc += o_s[d] e, L += l_s e; acc / L.
// Every thread of the CTA calls it (blockDim.x >= hd, a multiple of 32); thread d < hd owns output d; len: token t's
// context (its position + 1). The splits' maxima and sums go to shared memory first (sm, sl: FM_ATT_PAGED_MAX_SPLITS
// floats each), loaded by all threads at once, and the first APG_COMBINE_PRE splits' o_s[d] into registers in the same
// round (they depend on nothing but len), so that the walk over the splits waits one L2 round trip, not one per
// batch of the loop's loads (the loop that read m_s and l_s from L2 in it waited a round trip a split: ~5 us for 32
// splits). The same sums in the same order. Reads bypass L1 (ld.cg): in the persistent decode block other CTAs of the
// same launch wrote the partials.
#define APG_COMBINE_PRE 32 /* splits whose o_s[d] a thread loads before the maxima land */
static __device__ __forceinline__ void apg_combine_head(const float *part, int len, int nh, int hd, int splits,
                                                        int64_t T, int64_t t, int h, bf16 *out, float *sm, float *sl) {
    const int64_t th = t * nh + h;
    const int chunk = apg_chunk(len, splits), n = (len + chunk - 1) / chunk; // the splits that ran
    const int64_t n_part = T * nh * splits;
    const float *pm = part + n_part * hd + th * splits, *pl = pm + n_part, *po = part + th * splits * hd;
    const int d = threadIdx.x;
    float pre[APG_COMBINE_PRE];
#pragma unroll
    for (int s = 0; s < APG_COMBINE_PRE; s++) { /* n loads, not APG_COMBINE_PRE predicated ones (3 splits at B = 64) */
        if (s >= n) break;
        pre[s] = d < hd ? __ldcg(po + (int64_t)s * hd + d) : 0.0f;
    }
    for (int s = threadIdx.x; s < n; s += blockDim.x) sm[s] = __ldcg(pm + s), sl[s] = __ldcg(pl + s);
    __syncthreads();
    if (d < hd) {
        float M = -INFINITY;
        for (int s = 0; s < n; s++) M = fmaxf(M, sm[s]);
        float acc = 0.0f, L = 0.0f;
#pragma unroll
        for (int s = 0; s < APG_COMBINE_PRE; s++) {
            if (s >= n) break;
            const float e = exp2f(sm[s] - M);
            acc += pre[s] * e;
            L += sl[s] * e;
        }
#pragma unroll 8
        for (int s = APG_COMBINE_PRE; s < n; s++) {
            const float e = exp2f(sm[s] - M);
            acc += __ldcg(po + (int64_t)s * hd + d) * e;
            L += sl[s] * e;
        }
        out[th * hd + d] = __float2bfloat16_rn(acc / L);
    }
    __syncthreads(); /* sm and sl are read by every thread before the next head's */
}

#endif
