// Attention over the paged KV cache for the rows of a prompt chunk (route paged.tiled): a flash-attention
// over a tile of query rows that share every K and V tile they load, beside the split kernel of attention_paged.cu
// for the step's other rows.
//
// Which rows: a row is a "run row" when its neighbour before or after it in the step belongs to the same sequence
// (a prompt chunk's rows are consecutive in the step: engine/scheduler.c puts each chunk's rows together, then the
// decode rows, one per sequence). The test reads tok_seq on the device, so the launch depends on T only and a captured
// graph replays with any layout. This kernel computes the run rows; the split kernel, launched with skip_runs, exits
// at once for them and computes the others (a decode row keeps the split over its context). The engine calls this
// (backend op attention_paged_runs) only for a step that holds a chunk (route paged.tiled; engine/forward.c).
//
// Tile: a CTA takes the query heads of one kv head for TT consecutive tokens of the step (a window; grid x = window,
// y = (kv head, group of HG of its query heads)): 64 rows = TT tokens x HG heads, HG = min(G, 64), TT = 64 / HG, row
// i = (token i / HG, head i % HG). GQA 4: 16 tokens x 4 heads; GQA 8 (Qwen3-30B-A3B): 8 x 8; GQA 16: 4 x 16; MHA: 64
// tokens x 1 head; a group above 64 heads takes several y. Block: 4 warps, warp w the 16 rows [16 w, 16 w + 16) as
// the M rows of m16n8k16 tiles. A window's run rows of one sequence form a segment (a window may hold the end of one
// chunk and the start of the next, or decode rows, which stay with the split kernel); for each segment the CTA walks
// the keys [0, longest position + 1) once in stages of KT keys, gathered row by row through the sequence's block
// table with 16-byte cp.async (zero-filled past the end) into a ring of 2 stages shared by the 4 warps; each warp
// computes S = Q K^T for its rows (ldmatrix K, mma), masks keys past each row's own position (causal, per row),
// keeps an online softmax per row in fp32 (exp2 of log2e-scaled scores), rounds P to bf16 and adds P V (ldmatrix.trans
// V, mma). A warp skips the math of a stage past all its rows' positions (it still loads its share). Rows outside the
// segment (another sequence, a decode row, an empty row) are masked whole and write nothing; each warp owns its rows
// over every key, so there is no merge: the warp writes O / l in bf16.
//
// No split over the context: a 512-row chunk at GQA 8 is 64 windows x 4 kv heads = 256 CTAs, two per SM on the
// H200's 132 SMs; a short chunk (a few rows) after a long prefix has few CTAs that each walk the whole prefix (the
// split kernel spreads it): route `on` takes it anyway, the measurement decides where `auto` should.
//
// Shared memory (dynamic), bf16 tiles in attention_mma.cuh's layout (swizzled or padded rows):
//   Q [64][HD]                     loaded once; warp w reads rows 16 w.. (held in registers for HD <= 128)
//   2 stages of K [KT][HD] and V [KT][HD]   KT = 64 keys for HD <= 64, else 32
// HD 128: 16 KB + 2 x 16 KB = 48 KB; HD 256: 32 + 64 = 96 KB (under the 99 KB of sm_89); plus 512 bytes of the
// window's sequences and positions.
//
// e4m3 cache (FM_KV_E4M3, template E4M3): the stages hold the raw rows (codes [KT][HD] bytes, then the KT keys'
// fp32 scales, zero-filled past the end); once a stage lands, the CTA converts its K and V codes into one f16 K tile
// and one f16 V tile (after the Q region and the stages; a barrier before the math), and the math runs on f16
// operands with the split kernel's arithmetic (attention_e4m3.cuh: Q in f16 once, S's column j times key j's scale,
// P's column j times value j's scale over vmax, the largest value scale of the warp's stages so far; o = O / vmax).
// HD 128: 16 KB + 2 x 2 x 4.1 KB + 16 KB = 48.5 KB.
//
// Floor: each K and V row of a segment's prefix read once per (window, kv head) instead of once per token: a
// 512-row chunk at context 2048 with GQA 8 reads 64 windows x 2048 x 2 x 4 x 128 x 2 bytes = 256 MiB from L2 per
// layer (against 512 x 4 MiB = 2 GiB for the split kernel), and 4 MiB from device memory.
#include <math.h>

#include "backend/cuda/attention_e4m3.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_paged.cuh"

#define APT_WARPS 4
#define APT_THREADS (APT_WARPS * 32)
#define APT_ROWS (APT_WARPS * 16) // query rows of a CTA
#define APT_STAGES 2

typedef __nv_bfloat16 bf16;

typedef struct apt_args {
    const bf16 *qkv;
    const void *k_cache, *v_cache; // bf16 [n_slots][nkv hd], or e4m3 rows of row_b bytes
    const int32_t *tok_seq, *tok_pos, *tables;
    bf16 *out;
    int T, nh, nkv, hg, tt, qgroups, max_blocks, block_tokens;
    int bt_shift;  // apg_bt_shift(block_tokens)
    float sl2;     // log2(e) / sqrt(hd)
    int64_t row_b; // e4m3: bytes of a slot's row, fm_kv_e4m3_row_bytes(nkv, hd)
} apt_args;

template <int HD, bool E4M3> struct apt_shape {
    static constexpr int RE = ATT_ROW_ELEMS(HD);
    static constexpr int KT = HD <= 64 ? 64 : 32;      // keys per stage
    static constexpr int QBYTES = APT_ROWS * RE * 2;   // Q [64][HD]
    static constexpr int KVBYTES = KT * RE * 2;        // K or V [KT][HD] in 16 bits
    static constexpr int RAW = KT * HD + KT * 4;       // e4m3: K or V codes [KT][HD] bytes, then KT fp32 scales
    static constexpr int STAGE = E4M3 ? RAW : KVBYTES; // K or V of one stage
    // Q, then the stages (K, V, K, V), then (e4m3) the f16 K and V tiles the stage in use is converted into
    static constexpr int SMEM = QBYTES + APT_STAGES * 2 * STAGE + (E4M3 ? 2 * KVBYTES : 0);
    // s_seq, s_pos and the query max: the kernel's static shared memory, with room for what the compiler adds (ptxas
    // reports 640 bytes for the e4m3 form)
    static constexpr int STATIC = 2 * APT_ROWS * 4 + 256;
    static_assert(SMEM + STATIC <= 99 * 1024, "shared memory above the sm_89 limit");
    static_assert(RAW % 16 == 0 && KVBYTES % 128 == 0, "raw stages 16-byte aligned, tiles 128");
};

// cp.async of the K and V rows of keys [j0, j0 + KT) into one stage, rows at or past len zero-filled; the 128
// threads take the KT x HD / 8 chunks in turn.
// e4m3: the codes of the KT rows in 16-byte chunks (rows of HD bytes, unswizzled), then their KT scales (4-byte
// cp.async: zero-filled past len like the codes, so a missing key reads as 0)
template <int HD, bool E4M3>
static __device__ __forceinline__ void apt_load_stage(uint32_t sk, uint32_t sv, const apt_args &a, const int32_t *table,
                                                      int kvh, int j0, int len, int tid) {
    typedef apt_shape<HD, E4M3> SH;
    constexpr int CH = E4M3 ? HD / 16 : HD / 8;
    const int64_t kv_ld = E4M3 ? a.row_b : (int64_t)a.nkv * HD * 2; // bytes from one slot's row to the next
    const unsigned char *kc = (const unsigned char *)a.k_cache, *vc = (const unsigned char *)a.v_cache;
    for (int i = tid; i < SH::KT * CH; i += APT_THREADS) {
        const int r = i / CH, ch = i % CH, j = j0 + r;
        const bool ok = j < len;
        int64_t off = 0;
        if (ok)
            off = apg_slot_of(table, a.block_tokens, a.bt_shift, j) * kv_ld +
                  ((int64_t)kvh * HD + ch * (E4M3 ? 16 : 8)) * (E4M3 ? 1 : 2);
        const uint32_t d = E4M3 ? (uint32_t)(r * HD + ch * 16) : att_off<HD>(r, ch);
        att_cp16(sk + d, kc + off, ok ? 16u : 0u);
        att_cp16(sv + d, vc + off, ok ? 16u : 0u);
    }
    if (E4M3 && tid < 2 * SH::KT) {
        const int r = tid % SH::KT, j = j0 + r;
        const bool ok = j < len;
        int64_t off = 0;
        if (ok) off = apg_slot_of(table, a.block_tokens, a.bt_shift, j) * kv_ld + (int64_t)a.nkv * HD + kvh * 4;
        att_cp4((tid < SH::KT ? sk : sv) + SH::KT * HD + r * 4, (tid < SH::KT ? kc : vc) + off, ok ? 4u : 0u);
    }
}

template <int HD, bool E4M3> __global__ void __launch_bounds__(APT_THREADS) apt_kernel(apt_args a) {
    typedef apt_shape<HD, E4M3> SH;
    constexpr int KS = HD / 16, DT = HD / 8, KT = SH::KT, NT = KT / 8, CH = HD / 8;
    constexpr bool QREG = HD <= 128;
    extern __shared__ __align__(128) unsigned char apt_smem[];
    __shared__ int32_t s_seq[APT_ROWS], s_pos[APT_ROWS]; // the window's tokens: sequence (-1: not a run row), position
    __shared__ unsigned s_qmax;                          // e4m3: the largest |q| of the tile, as bf16 bits
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(apt_smem), skv = sq + SH::QBYTES;
    // e4m3: the f16 K and V tiles after the raw stages
    const uint32_t sk16 = skv + APT_STAGES * 2 * SH::STAGE, sv16 = sk16 + SH::KVBYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int t0 = blockIdx.x * a.tt, ntok = min(a.tt, a.T - t0);
    const int G = a.nh / a.nkv;
    const int kvh = blockIdx.y / a.qgroups, h0 = kvh * G + (blockIdx.y % a.qgroups) * a.hg;
    const int nq = min(a.hg, kvh * G + G - h0); // query heads of this CTA
    const int64_t ld = (int64_t)(a.nh + 2 * a.nkv) * HD;

    if (tid < ntok) {
        const int t = t0 + tid;
        s_seq[tid] = apg_in_run(a.tok_seq, a.T, t) ? a.tok_seq[t] : -1;
        s_pos[tid] = a.tok_pos[t];
    }
    if (E4M3 && tid == 0) s_qmax = 0;
    __syncthreads();
    uint64_t pending = 0; // the window's run rows not computed yet (the same in every thread)
    for (int i = 0; i < ntok; i++)
        if (s_seq[i] >= 0) pending |= 1ull << i;
    if (!pending) return;

    // Q: row r = (token r / hg, head r % hg), zero where there is no such token or head
    for (int i = tid; i < APT_ROWS * CH; i += APT_THREADS) {
        const int r = i / CH, ch = i % CH, tk = r / a.hg, hh = r % a.hg;
        const bool ok = tk < ntok && hh < nq;
        const bf16 *src = a.qkv + (ok ? (int64_t)(t0 + tk) * ld + (int64_t)(h0 + hh) * HD + ch * 8 : 0);
        att_cp16(sq + att_off<HD>(r, ch), src, ok ? 16u : 0u);
    }
    att_cp_commit();
    att_cp_wait_all();
    __syncthreads();
    // e4m3: Q in f16, times 1 / qup (attention_e4m3.cuh)
    const float qup = E4M3 ? att_q_to_f16<HD, APT_ROWS, APT_THREADS>(apt_smem, &s_qmax, tid) : 1.0f;

    const att_lane la = att_lane_init<HD>(lane & 15, lane >> 4);
    const att_lane lk = att_lane_init<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    uint32_t qf[QREG ? KS : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < KS; kk++) att_ldsm_x4(qf[QREG ? kk : 0], sq + att_lane_off<HD>(&la, warp * 16, kk));
    }
    // this thread's rows g and g + 8 of the warp's 16: their token in the window, -1 for an empty row
    int rtok[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = warp * 16 + g + 8 * hf, tk = r / a.hg;
        rtok[hf] = tk < ntok && r % a.hg < nq ? tk : -1;
    }

    while (pending) {
        const int seq = s_seq[__ffsll((long long)pending) - 1];
        uint64_t seg = 0;
        int len = 0; // keys of the segment's longest row
        for (int i = 0; i < ntok; i++)
            if (s_seq[i] == seq) seg |= 1ull << i, len = max(len, s_pos[i] + 1);
        pending &= ~seg;
        int rpos[2]; // each row's own position, -1 outside the segment (every key masked)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) rpos[hf] = rtok[hf] >= 0 && (seg >> rtok[hf]) & 1 ? s_pos[rtok[hf]] : -1;
        int wmax = max(rpos[0], rpos[1]); // the warp's last key
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
        const int rmin = min(rpos[0], rpos[1]);
        const int32_t *table = a.tables + (int64_t)seq * a.max_blocks;
        const int ntiles = (len + KT - 1) / KT;
#pragma unroll
        for (int st = 0; st < APT_STAGES; st++) {
            if (st < ntiles)
                apt_load_stage<HD, E4M3>(skv + st * 2 * SH::STAGE, skv + st * 2 * SH::STAGE + SH::STAGE, a, table, kvh,
                                         st * KT, len, tid);
            att_cp_commit(); // possibly empty: every thread commits APT_STAGES groups here and one per stage below
        }

        float o[DT][4];
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; // raw max, partial sum of the quad's keys
        float vmax = 0.0f; // e4m3: the largest V scale of the warp's stages so far; o holds O / vmax

        for (int it = 0; it < ntiles; it++) {
            const uint32_t rk = skv + (it % APT_STAGES) * 2 * SH::STAGE, rv = rk + SH::STAGE; // the stage
            const uint32_t sk = E4M3 ? sk16 : rk, sv = E4M3 ? sv16 : rv; // the tiles the math reads
            const int j0 = it * KT;
            att_cp_wait<APT_STAGES - 1>();
            __syncthreads(); // every thread's rows of stage it landed
            if (E4M3) {      // the codes to the f16 tiles (every warp is past the last stage's math: the barrier above)
                att_e4m3_to_f16<HD, KT, APT_THREADS, 1>(apt_smem + (sk16 - sq), apt_smem + (rk - sq), tid);
                att_e4m3_to_f16<HD, KT, APT_THREADS, 1>(apt_smem + (sv16 - sq), apt_smem + (rv - sq), tid);
                __syncthreads();
            }
            // e4m3: the scales of key j0 + 8 nt + 2 c + {0, 1} at the raw stage's tail (KT fp32 after the codes)
            const float *kscale = (const float *)(apt_smem + (rk - sq) + KT * HD);
            const float *vscale = (const float *)(apt_smem + (rv - sq) + KT * HD);

            if (j0 <= wmax) { // warp-uniform: some row of the warp sees a key of this stage
                float s[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    uint32_t qa[4];
                    if (QREG) {
#pragma unroll
                        for (int r = 0; r < 4; r++) qa[r] = qf[QREG ? kk : 0][r];
                    } else {
                        att_ldsm_x4(qa, sq + att_lane_off<HD>(&la, warp * 16, kk));
                    }
#pragma unroll
                    for (int kt = 0; kt < KT / 16; kt++) {
                        uint32_t b[4];
                        att_ldsm_x4(b, sk + att_lane_off<HD>(&lk, kt * 16, kk));
                        att_mma_x2<E4M3>(s[2 * kt], s[2 * kt + 1], qa, b);
                    }
                }
                float vfix = 1.0f; // e4m3: vmax's change, applied to o with alpha
                if (E4M3) {        // S times each key's scale (x qup); P's scales over the new vmax (split kernel's)
                    float tm = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const float2 k2 = *(const float2 *)(kscale + nt * 8 + 2 * c);
                        const float2 v2 = *(const float2 *)(vscale + nt * 8 + 2 * c);
                        s[nt][0] *= k2.x * qup, s[nt][1] *= k2.y * qup, s[nt][2] *= k2.x * qup, s[nt][3] *= k2.y * qup;
                        tm = fmaxf(tm, fmaxf(v2.x, v2.y));
                    }
                    tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
                    tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
                    const float vnew = fmaxf(vmax, tm); // > 0: the stage has key j0 < len
                    vfix = vmax * att_inv_pow2(vnew), vmax = vnew;
                }
                if (j0 + KT - 1 > rmin) { // a key of the stage lies past one of this thread's rows
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            if (j0 + nt * 8 + 2 * c + (r & 1) > rpos[r >> 1]) s[nt][r] = -INFINITY;
                }
                // online softmax (the 4 lanes of a quad share a row); a row without a key so far keeps max -inf
                float ofix[2];
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float mx = mrow[hf];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float mb = mx == -INFINITY ? 0.0f : mx * a.sl2; // every score -inf -> every p 0
                    const float alpha = att_exp2(mrow[hf] * a.sl2 - mb);  // 0 from -inf, 1 if the max stayed
                    mrow[hf] = mx;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        s[nt][2 * hf] = att_exp2(fmaf(s[nt][2 * hf], a.sl2, -mb));
                        s[nt][2 * hf + 1] = att_exp2(fmaf(s[nt][2 * hf + 1], a.sl2, -mb));
                        sum += s[nt][2 * hf] + s[nt][2 * hf + 1];
                    }
                    lrow[hf] = lrow[hf] * alpha + sum;
                    ofix[hf] = alpha * vfix;
                }
                // o rescaled only where a factor is not 1 (the split kernel's: x 1 changes no bit)
                if (__any_sync(0xffffffffu, ofix[0] != 1.0f || ofix[1] != 1.0f)) {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++)
#pragma unroll
                        for (int dt = 0; dt < DT; dt++) o[dt][2 * hf] *= ofix[hf], o[dt][2 * hf + 1] *= ofix[hf];
                }
                // O += P V, one k-step per 16 keys: the S accumulators of key n8 tiles 2 kt and 2 kt + 1 are its A
#pragma unroll
                for (int kt = 0; kt < KT / 16; kt++) {
                    uint32_t p[4];
                    if (E4M3) { // f16 P, each key's column times its scale / vmax (<= 1)
                        const float inv = att_inv_pow2(vmax);
                        const float2 v0 = *(const float2 *)(vscale + kt * 16 + 2 * c);
                        const float2 v1 = *(const float2 *)(vscale + kt * 16 + 8 + 2 * c);
                        const float a0 = v0.x * inv, a1 = v0.y * inv, b0 = v1.x * inv, b1 = v1.y * inv;
                        p[0] = att_pack_f16(s[2 * kt][0] * a0, s[2 * kt][1] * a1);
                        p[1] = att_pack_f16(s[2 * kt][2] * a0, s[2 * kt][3] * a1);
                        p[2] = att_pack_f16(s[2 * kt + 1][0] * b0, s[2 * kt + 1][1] * b1);
                        p[3] = att_pack_f16(s[2 * kt + 1][2] * b0, s[2 * kt + 1][3] * b1);
                    } else {
                        p[0] = att_pack_bf16(s[2 * kt][0], s[2 * kt][1]);
                        p[1] = att_pack_bf16(s[2 * kt][2], s[2 * kt][3]);
                        p[2] = att_pack_bf16(s[2 * kt + 1][0], s[2 * kt + 1][1]);
                        p[3] = att_pack_bf16(s[2 * kt + 1][2], s[2 * kt + 1][3]);
                    }
#pragma unroll
                    for (int dp = 0; dp < DT / 2; dp++) {
                        uint32_t b[4];
                        att_ldsm_x4_t(b, sv + att_lane_off<HD>(&la, kt * 16, dp));
                        att_mma_x2<E4M3>(o[2 * dp], o[2 * dp + 1], p, b);
                    }
                }
            }
            __syncthreads(); // every warp is done with the stage before it is refilled
            if (it + APT_STAGES < ntiles)
                apt_load_stage<HD, E4M3>(rk, rv, a, table, kvh, (it + APT_STAGES) * KT, len, tid);
            att_cp_commit();
        }
        att_cp_wait_all(); // only empty groups are left; the next segment starts from a drained ring

        // out = O / l for the segment's rows (l > 0: a row has key 0 at least)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lrow[hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (rpos[hf] < 0) continue;
            const int r = warp * 16 + g + 8 * hf;
            const float inv = (E4M3 ? vmax : 1.0f) / l; // e4m3: o is O / vmax
            bf16 *dst = a.out + ((int64_t)(t0 + rtok[hf]) * a.nh + h0 + r % a.hg) * HD + 2 * c;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(__nv_bfloat162 *)(dst + dt * 8) = __floats2bfloat162_rn(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
        }
    }
}

template <int HD, bool E4M3> static void apt_launch(const apt_args &a, int windows, int ys, cudaStream_t s) {
    typedef apt_shape<HD, E4M3> SH;
    // static and dynamic shared memory together above 48 KiB need the opt-in (bf16 hd 128: 48 KiB + 512 bytes)
    if (SH::SMEM + SH::STATIC > 48 * 1024)
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(apt_kernel<HD, E4M3>, cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
    apt_kernel<HD, E4M3><<<dim3((unsigned)windows, (unsigned)ys), APT_THREADS, SH::SMEM, s>>>(a);
    FM_LAUNCH_CHECK(E4M3 ? "attention_paged_tiled_e4m3" : "attention_paged_tiled");
}

template <bool E4M3> static void apt_launch_hd(const apt_args &a, int hd, int windows, int ys, cudaStream_t s) {
    switch (hd) {
    case 16: apt_launch<16, E4M3>(a, windows, ys, s); break;
    case 32: apt_launch<32, E4M3>(a, windows, ys, s); break;
    case 48: apt_launch<48, E4M3>(a, windows, ys, s); break;
    case 64: apt_launch<64, E4M3>(a, windows, ys, s); break;
    case 80: apt_launch<80, E4M3>(a, windows, ys, s); break;
    case 96: apt_launch<96, E4M3>(a, windows, ys, s); break;
    case 112: apt_launch<112, E4M3>(a, windows, ys, s); break;
    case 128: apt_launch<128, E4M3>(a, windows, ys, s); break;
    case 144: apt_launch<144, E4M3>(a, windows, ys, s); break;
    case 160: apt_launch<160, E4M3>(a, windows, ys, s); break;
    case 176: apt_launch<176, E4M3>(a, windows, ys, s); break;
    case 192: apt_launch<192, E4M3>(a, windows, ys, s); break;
    case 208: apt_launch<208, E4M3>(a, windows, ys, s); break;
    case 224: apt_launch<224, E4M3>(a, windows, ys, s); break;
    case 240: apt_launch<240, E4M3>(a, windows, ys, s); break;
    case 256: apt_launch<256, E4M3>(a, windows, ys, s); break;
    }
}

extern "C" void fm_cuda_attention_paged_tiled(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                              const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                              const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                              int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                              bf16 *out, bool fused_combine, bool split_waves, int32_t swap,
                                              cudaStream_t s) {
    // the split kernel first: it checks the arguments (and stops on a violation) and takes the rows outside runs
    fm_cuda_attention_paged_rows(qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks,
                                 block_tokens, max_len, scratch, out, T >= 2, fused_combine, split_waves, swap, false,
                                 false /* prompt chunks: no PDL */, s);
    if (T < 2) return; // a run needs two rows
    const int G = nh / nkv, hg = G < APT_ROWS ? G : APT_ROWS;
    apt_args a;
    a.qkv = qkv, a.k_cache = k_cache, a.v_cache = v_cache;
    a.tok_seq = tok_seq, a.tok_pos = tok_pos, a.tables = tables, a.out = out;
    a.T = (int)T, a.nh = nh, a.nkv = nkv, a.hg = hg, a.tt = APT_ROWS / hg, a.qgroups = (G + hg - 1) / hg;
    a.max_blocks = max_blocks, a.block_tokens = block_tokens, a.bt_shift = apg_bt_shift(block_tokens);
    a.sl2 = (float)(1.4426950408889634 / sqrt((double)hd));
    a.row_b = kv == FM_KV_E4M3 ? fm_kv_e4m3_row_bytes(nkv, hd) : (int64_t)nkv * hd * 2;
    const int64_t windows = (T + a.tt - 1) / a.tt, ys = (int64_t)nkv * a.qgroups;
    if (ys > 65535) {
        fprintf(stderr, "fp8moe: attention_paged_tiled(nh=%d, nkv=%d): too many kv heads for the grid\n", nh, nkv);
        abort();
    }
    if (kv == FM_KV_E4M3) apt_launch_hd<true>(a, hd, (int)windows, (int)ys, s);
    else apt_launch_hd<false>(a, hd, (int)windows, (int)ys, s);
}
