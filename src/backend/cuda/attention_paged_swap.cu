// Decode attention over the paged cache with the operands swapped (route paged.swap): the split kernel
// (attention_paged.cu) for a kv head whose query heads number at most 8, with the keys as the mma's M and the query
// heads as its N. The split kernel puts the group's query heads in the 16 M rows of m16n8k16: at GQA 8 (Qwen3-30B-A3B,
// Qwen3-Next) half of every product is zero rows, and o is a [16][HD] fp32 tile in registers (HD / 2 a lane). Here:
//   S^T = K Q^T  per 16-key tile: A = K [16 keys][16 dims] a k step, B = Q^T [16 dims][8 heads] (in registers)
//   O^T += V^T P^T               A = V^T [16 dims][16 keys] (ldmatrix.trans of the V tile), B = P^T [16 keys][8 heads]
// so a tile takes HD / 16 mma for S and HD / 16 for O (the split kernel: HD / 8 each), and o is O^T [HD][8]: HD / 8
// floats a lane. P^T's B fragment is S^T's accumulator transposed: movmatrix.trans of each 8x8 f16/bf16 half, after
// the softmax (per query head: its column's 16 keys are spread over the lanes' g = lane / 4, so the max takes three
// shuffle rounds, xor 4, 8, 16; each lane keeps a partial sum over its own keys, summed over g once at the end).
//
// e4m3 cache: K is never converted into shared memory. The mma reduces over the head dim in any order, so the A
// fragment of k step kk takes lane (g, t)'s word kk of the raw codes of keys g and g + 8 at bytes [t HD / 4, (t + 1)
// HD / 4) of the row (one 16-byte load per 4 k steps, one cvt per two codes, straight into registers), and Q's B
// fragment is permuted to match: head dim t HD / 4 + 4 kk + i stands for k index 2 t + (i & 1) + 8 (i >> 1) of step
// kk, in both operands. Q in f16 (times 2^-qe) as in the split kernel; S's rows (keys) times their scales (times
// 2^qe), P's rows times the value scales over vmax, o over vmax: the split kernel's exact power-of-two arithmetic.
// V is converted into the warp's f16 tile as there (ldmatrix.trans needs 16-bit elements). bf16 cache: K by
// ldmatrix from the stage as the split kernel's, Q's B fragments by ldmatrix in the natural order.
//
// Grid and block as the split kernel's (x token, y kv head, z split; 4 warps, warp w the 16-key tiles w, w + 4, ...
// of the split's slice, ST cp.async stages each), the same scratch, partials, combine (kernel or fused) and bits of
// the merge (apg_merge_warps); the split count from this kernel's own resident CTAs. Registers: o HD / 8, Q's
// fragments HD / 8, the K words of a tile HD / 8 (e4m3): ~100 at HD 128 under a 128 bound, 4 CTAs an SM at 53 KB of
// shared memory (e4m3; bf16 69 KB, 3). Head dims 64, 128 and 256 (the swizzled tiles, HD % 64 == 0).
//
// Floor: the split kernel's (the K and V bytes of every token's context). Measured: bench/NOTES.md.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/attention_paged_split.cuh"
#include "backend/cuda/attention_paged_swap.cuh"
#include "backend/cuda/pdl.cuh"

#define APS_G 8 // query heads a CTA: the mma's N

// Shared memory: Q [16][HD] (rows 0-7 used; the merge's maxima and sums after the loop), then per warp (e4m3: its
// f16 V tile, then) ST stages (bf16: K and V tiles; e4m3: K and V raw tiles, apg_shape's RAW). After the loop the
// warps' regions hold the merge's O [4][16][HD] fp32.
template <int HD, bool E4M3, int TPI> struct aps_shape {
    static constexpr int TILE = 16 * HD * 2;
    static constexpr int ST = TPI == 2 ? 3 : HD <= 128 ? 2 : 1; // TPI 2: two in the math, one in flight
    static constexpr int RAW = 16 * HD + 16 * 4;
    static constexpr int STAGE = E4M3 ? 2 * RAW : 2 * TILE;
    static constexpr int WARP = (E4M3 ? TILE : 0) + ST * STAGE;
    static constexpr int SMEM = TILE + APG_WARPS * WARP;
    static_assert(HD % 64 == 0, "the swizzled tiles of attention_mma.cuh");
    static_assert(TPI == 1 || (TPI == 2 && E4M3 && HD <= 128), "two tiles an iteration: the e4m3 form to HD 128");
    static_assert(APG_WARPS * 16 * HD * 4 <= APG_WARPS * WARP, "the merge's O must fit the warps' regions");
    static_assert(2 * APG_WARPS * 16 * 4 <= TILE, "the merge's max and sum must fit the Q tile");
    static_assert(SMEM <= 99 * 1024, "shared memory above the sm_89 limit");
    static_assert((2 * 16 * FM_ATT_PAGED_MAX_SPLITS + 16) * 4 <= SMEM, "the fused combine's e, l and L must fit");
    static_assert(RAW == apg_shape<HD, true>::RAW, "apg_load_raw's raw tile");
};

// 8x8 16-bit matrix transposed across the warp (lane (g, t) holds row g, columns 2 t and 2 t + 1, before and after)
static __device__ __forceinline__ uint32_t aps_movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

template <int HD, bool E4M3, int TPI>
__global__ void __launch_bounds__(APG_THREADS, E4M3 &&HD <= 128 && TPI == 1 ? 4 : 3) aps_kernel(apg_args a) {
    typedef aps_shape<HD, E4M3, TPI> SH;
    constexpr int KS = HD / 16, MT = HD / 16, ST = SH::ST; // k steps of S; m tiles of O
    extern __shared__ __align__(128) unsigned char aps_smem[];
    __shared__ unsigned qmax, arrived;
    if (!a.early) pdl_wait(); /* else below, after the loads of keys earlier steps stored; every path waits */
    const int64_t T = gridDim.x, t = blockIdx.x;
    const int Y = gridDim.y, y = blockIdx.y, split = blockIdx.z;
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(aps_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int G = a.nh / a.nkv, kvh = y, h0 = kvh * G, nq = G; // G <= APS_G (the launcher)
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
    const uint32_t wbuf = sq + SH::TILE + (uint32_t)(warp * SH::WARP), wst = wbuf + (E4M3 ? SH::TILE : 0);
    // route paged.early_kv: the first tiles of keys earlier steps stored, before the wait (as the split kernel's)
    unsigned issued = 0u;
    if (a.early) {
        issued = apg_early_loads<HD, E4M3, ST, SH::STAGE>(a, wst, T, t, table, kv_ld, kvh, s0, s1, nw, tid);
        pdl_wait();
    }
    // the query rows (8: the N of the products), then the first ST tiles; tile i's loads are group 1 + i
    apg_start_loads<HD, E4M3, APS_G, ST, SH::STAGE>(a, sq, wst, t, h0, nq, table, kv_ld, kvh, s0, s1, nw, tid, issued);
    if (E4M3 && tid == 0) qmax = 0;
    att_cp_wait<ST>();
    __syncthreads(); // Q landed
    const float qup = E4M3 ? att_q_to_f16<HD, APS_G, APG_THREADS>(aps_smem, &qmax, tid) : 1.0f;

    // Q^T's B fragments, qb[kk] = {b0, b1} of k step kk
    uint32_t qb[KS][2];
    if (E4M3) { // permuted: lane (g, t) holds head g's dims [t HD / 4, (t + 1) HD / 4), f16 pairs in order
        uint32_t w[HD / 32][4];
#pragma unroll
        for (int j = 0; j < HD / 32; j++) { // 16-byte chunks c HD / 32 + j of row g (8 f16 each)
            const uint4 v = *(const uint4 *)(aps_smem + att_off<HD>(g, c * (HD / 32) + j));
            w[j][0] = v.x, w[j][1] = v.y, w[j][2] = v.z, w[j][3] = v.w;
        }
#pragma unroll
        for (int kk = 0; kk < KS; kk++) qb[kk][0] = w[kk / 2][2 * (kk & 1)], qb[kk][1] = w[kk / 2][2 * (kk & 1) + 1];
    } else { // natural: ldmatrix.x4 of rows 0-7, chunks 4 j .. 4 j + 3: the b0, b1 of k steps 2 j and 2 j + 1
#pragma unroll
        for (int j = 0; j < KS / 2; j++) {
            uint32_t r[4];
            att_ldsm_x4(r, sq + att_off<HD>(lane & 7, 4 * j + (lane >> 3)));
            qb[2 * j][0] = r[0], qb[2 * j][1] = r[1], qb[2 * j + 1][0] = r[2], qb[2 * j + 1][1] = r[3];
        }
    }

    const att_lane la = att_lane_init<HD>(lane & 15, lane >> 4);                             // K as A (bf16)
    const att_lane lk = att_lane_init<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1); // V^T as A
    float o[MT][4]; // O^T: o[mt] = rows (dims) 16 mt + g, + 8 x columns (heads) 2 c, 2 c + 1
#pragma unroll
    for (int mt = 0; mt < MT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; // heads 2 c + hh: max; this lane's keys' sum
    float vmax = 0.0f; // e4m3: the largest V scale of the warp's tiles so far; o holds O / vmax

    for (int i = 0; i < nw; i += TPI) {
        att_cp_wait<ST - TPI>();
        __syncwarp(); // every lane's rows of tiles i .. i + TPI - 1 landed (and every lane is done with the last V)
        // S^T of the iteration's tiles: tile u is the warp's tile i + u, at stage (i + u) % ST (with TPI 2 and nw odd
        // the last iteration's second tile is past the slice: its keys masked, its stale scales and V not used)
        float s[TPI][4], vsc[TPI][2]; // S^T[key g][heads 2 c, 2 c + 1], S^T[key g + 8][...]; e4m3: keys' V scales
#pragma unroll
        for (int u = 0; u < TPI; u++) {
            const uint32_t stage = wst + ((i + u) % ST) * SH::STAGE;
            const unsigned char *raw = aps_smem + (stage - sq); // e4m3: K codes, K scales, V codes, V scales
            const int j0 = s0 + (warp + APG_WARPS * (i + u)) * 16;
            float ksc[2] = {1.0f, 1.0f}; // e4m3: the scales of keys g and g + 8
            vsc[u][0] = vsc[u][1] = 1.0f;
            if (E4M3) {
                const float *kss = (const float *)(raw + 16 * HD), *vss = (const float *)(raw + SH::RAW + 16 * HD);
                const bool here = TPI == 1 || i + u < nw;
                ksc[0] = kss[g] * qup, ksc[1] = kss[g + 8] * qup;
                vsc[u][0] = here ? vss[g] : 0.0f, vsc[u][1] = here ? vss[g + 8] : 0.0f;
            }
            // two accumulators (even and odd k steps) for two chains of mma, summed
            float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (E4M3) {
                constexpr int KW = HD / 16; // words of a key row's quarter: one a k step
                uint32_t kw[2][KW];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int j = 0; j < KW / 4; j++) {
                        const uint4 v = *(const uint4 *)(raw + (g + 8 * r) * HD + c * (HD / 4) + 16 * j);
                        kw[r][4 * j] = v.x, kw[r][4 * j + 1] = v.y, kw[r][4 * j + 2] = v.z, kw[r][4 * j + 3] = v.w;
                    }
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    const uint32_t ka[4] = {att_e4m3x2_f16x2(kw[0][kk] & 0xffffu),
                                            att_e4m3x2_f16x2(kw[1][kk] & 0xffffu), att_e4m3x2_f16x2(kw[0][kk] >> 16),
                                            att_e4m3x2_f16x2(kw[1][kk] >> 16)};
                    att_mma_f16((kk & 1) ? sb : sa, ka, qb[kk][0], qb[kk][1]);
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    uint32_t ka[4];
                    att_ldsm_x4(ka, stage + att_lane_off<HD>(&la, 0, kk));
                    att_mma((kk & 1) ? sb : sa, ka, qb[kk][0], qb[kk][1]);
                }
            }
#pragma unroll
            for (int r = 0; r < 4; r++) s[u][r] = (sa[r] + sb[r]) * ksc[r >> 1];
            if (j0 + g >= s1) s[u][0] = s[u][1] = -INFINITY; // keys past the slice
            if (j0 + g + 8 >= s1) s[u][2] = s[u][3] = -INFINITY;
        }
        float vfix = 1.0f;
        if (E4M3) { // vmax over the iteration's keys, held by the lanes' g
            float tm = 0.0f;
#pragma unroll
            for (int u = 0; u < TPI; u++) tm = fmaxf(tm, fmaxf(vsc[u][0], vsc[u][1]));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 4));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 8));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 16));
            const float vnew = fmaxf(vmax, tm), inv = att_inv_pow2(vnew); // > 0: the tile has a key below s1
            vfix = vmax * inv, vmax = vnew;
#pragma unroll
            for (int u = 0; u < TPI; u++) vsc[u][0] *= inv, vsc[u][1] *= inv;
        }
        // online softmax per query head 2 c + hh: its keys are keys g and g + 8 of each tile, over the 8 lanes' g
        float ofix[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float mx = mrow[hh];
#pragma unroll
            for (int u = 0; u < TPI; u++) mx = fmaxf(fmaxf(s[u][hh], s[u][2 + hh]), mx);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            const float mb = mx * a.sl2;
            const float alpha = att_exp2(mrow[hh] * a.sl2 - mb); // 0 on the first tile (-inf), 1 if the max stayed
            mrow[hh] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < TPI; u++) {
                s[u][hh] = att_exp2(fmaf(s[u][hh], a.sl2, -mb));
                s[u][2 + hh] = att_exp2(fmaf(s[u][2 + hh], a.sl2, -mb));
                sum += s[u][hh] + s[u][2 + hh];
            }
            lrow[hh] = lrow[hh] * alpha + sum;
            ofix[hh] = alpha * vfix;
        }
        if (__any_sync(0xffffffffu, ofix[0] != 1.0f || ofix[1] != 1.0f)) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                o[mt][0] *= ofix[0], o[mt][1] *= ofix[1], o[mt][2] *= ofix[0], o[mt][3] *= ofix[1];
        }
#pragma unroll
        for (int u = 0; u < TPI; u++) {
            if (TPI > 1 && i + u >= nw) { // past the slice: no V, an empty group for the count
                att_cp_commit();
                continue;
            }
            const uint32_t stage = wst + ((i + u) % ST) * SH::STAGE;
            const int j0 = s0 + (warp + APG_WARPS * (i + u)) * 16;
            // P^T's B fragment: P (keys x heads, rows g and g + 8; e4m3 each key's row times its scale / vmax),
            // transposed
            uint32_t p0, p1;
            if (E4M3) {
                p0 = att_pack_f16(s[u][0] * vsc[u][0], s[u][1] * vsc[u][0]);
                p1 = att_pack_f16(s[u][2] * vsc[u][1], s[u][3] * vsc[u][1]);
            } else {
                p0 = att_pack_bf16(s[u][0], s[u][1]);
                p1 = att_pack_bf16(s[u][2], s[u][3]);
            }
            const uint32_t b0 = aps_movmatrix_t(p0), b1 = aps_movmatrix_t(p1);
            uint32_t sv = stage + SH::TILE; // the V tile the product reads: the stage's (bf16) or the warp's f16 one
            if (E4M3) {
                sv = wbuf;
                if (u > 0) __syncwarp(); // every lane's ldmatrix of the last tile's V is done
                att_e4m3_to_f16<HD, 16, 32, HD <= 64 ? 1 : 4>(aps_smem + (wbuf - sq), aps_smem + (stage - sq) + SH::RAW,
                                                              lane);
                __syncwarp(); // V converted, and the raw stage read: refilled now, under the product
                if (i + u + ST < nw)
                    apg_load_stage<HD, true>(a, stage, table, kv_ld, kvh, j0 + APG_WARPS * ST * 16, s1, lane);
                att_cp_commit();
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t va[4];
                att_ldsm_x4_t(va, sv + att_lane_off<HD>(&lk, 0, mt));
                if (E4M3) att_mma_f16(o[mt], va, b0, b1);
                else att_mma(o[mt], va, b0, b1);
            }
            if (!E4M3) {
                __syncwarp(); // every lane is done with the stage before it is refilled
                if (i + u + ST < nw)
                    apg_load_stage<HD, false>(a, stage, table, kv_ld, kvh, j0 + APG_WARPS * ST * 16, s1, lane);
                att_cp_commit();
            }
        }
    }

    // the warps' O, maxima and sums for the merge (apg_merge_warps' layout: rows are query heads)
    att_cp_wait_all();
    __syncthreads(); // every warp is done with Q and its stages
    float *so = (float *)(aps_smem + SH::TILE);
    float *sm = (float *)aps_smem, *sl = sm + APG_WARPS * 16;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        float l = lrow[hh];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        const int h = 2 * c + hh;
        if (g == 0) sm[warp * 16 + h] = mrow[hh] * a.sl2, sl[warp * 16 + h] = l; // -inf and 0 for a warp without keys
        float *oh = so + (warp * 16 + h) * HD;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { // e4m3: o times vmax (0 for a warp without keys: its o is 0)
            oh[16 * mt + g] = E4M3 ? o[mt][hh] * vmax : o[mt][hh];
            oh[16 * mt + g + 8] = E4M3 ? o[mt][2 + hh] * vmax : o[mt][2 + hh];
        }
    }
    __syncthreads();
    apg_merge_warps<HD, 0>(a, aps_smem, so, T, t, Y, y, split, h0, nq, len, chunk, &arrived);
}

template <int HD, bool E4M3, int TPI> static void aps_set_smem(void) {
    typedef aps_shape<HD, E4M3, TPI> SH;
    if (SH::SMEM > 48 * 1024)
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(aps_kernel<HD, E4M3, TPI>, cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
}

template <int HD, bool E4M3, int TPI> static int aps_ctas_per_sm_of(void) {
    aps_set_smem<HD, E4M3, TPI>();
    int n = 0;
    FM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, aps_kernel<HD, E4M3, TPI>, APG_THREADS,
                                                                aps_shape<HD, E4M3, TPI>::SMEM));
    return n > 0 ? n : 1;
}

template <int HD, bool E4M3, int TPI> static void aps_launch(const apg_args *a, int64_t T, bool pdl, cudaStream_t s) {
    aps_set_smem<HD, E4M3, TPI>();
    pdl_launch(aps_kernel<HD, E4M3, TPI>, dim3((unsigned)T, (unsigned)a->nkv, (unsigned)a->splits), APG_THREADS,
               aps_shape<HD, E4M3, TPI>::SMEM, s, pdl, *a);
    FM_LAUNCH_CHECK(E4M3 ? "attention_paged_swap_e4m3" : "attention_paged_swap");
}

// the form a call takes: (head dim, cache form, tiles an iteration), two tiles for the e4m3 form to HD 128 only
static int aps_form(int32_t hd, bool e4m3, int32_t tiles) {
    const int k = hd == 64 ? 0 : hd == 128 ? 1 : 2;
    return (k * 2 + e4m3) * 2 + (tiles == 2 && e4m3 && hd <= 128);
}

// every form's launch or resident count, by aps_form
template <int HD, bool E4M3, int TPI> static int aps_do(const apg_args *a, int64_t T, bool pdl, cudaStream_t s) {
    if (!a) return aps_ctas_per_sm_of<HD, E4M3, TPI>();
    aps_launch<HD, E4M3, TPI>(a, T, pdl, s);
    return 0;
}
static int aps_dispatch(int form, const apg_args *a, int64_t T, bool pdl, cudaStream_t s) {
    switch (form) {
    case 0: return aps_do<64, false, 1>(a, T, pdl, s);
    case 2: return aps_do<64, true, 1>(a, T, pdl, s);
    case 3: return aps_do<64, true, 2>(a, T, pdl, s);
    case 4: return aps_do<128, false, 1>(a, T, pdl, s);
    case 6: return aps_do<128, true, 1>(a, T, pdl, s);
    case 7: return aps_do<128, true, 2>(a, T, pdl, s);
    case 8: return aps_do<256, false, 1>(a, T, pdl, s);
    case 10: return aps_do<256, true, 1>(a, T, pdl, s);
    }
    return 1; // not a form aps_form makes
}

extern "C" bool fm_cuda_attention_paged_swap_applies(int32_t nh, int32_t nkv, int32_t hd) {
    return nh / nkv <= APS_G && (hd == 64 || hd == 128 || hd == 256);
}

extern "C" int fm_cuda_attention_paged_swap_ctas_per_sm(int32_t hd, bool e4m3, int32_t tiles) {
    static int known[12];
    const int f = aps_form(hd, e4m3, tiles);
    int n = __atomic_load_n(&known[f], __ATOMIC_RELAXED);
    if (n == 0) {
        n = aps_dispatch(f, NULL, 0, false, 0);
        __atomic_store_n(&known[f], n, __ATOMIC_RELAXED);
    }
    return n;
}

extern "C" void fm_cuda_attention_paged_swap_launch(const apg_args *a, int32_t hd, int64_t T, bool e4m3, int32_t tiles,
                                                    bool pdl, cudaStream_t s) {
    aps_dispatch(aps_form(hd, e4m3, tiles), a, T, pdl, s);
}
