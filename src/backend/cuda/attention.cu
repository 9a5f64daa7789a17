// Causal GQA prefill attention on tensor cores: flash-attention 2 style, mma.sync m16n8k16 bf16 -> fp32.
//
// Grid: x = query head h (nh), y = query tile, heaviest causal tile first (blockIdx.y = 0 is the last tile),
// so the long rows start early and the short ones fill the tail; the q heads of one kv head are neighbours in
// x, so their K/V tile reads meet in L2. Block: 4 warps (128 threads); warp w owns the 16*MT query rows
// [w*16*MT, (w+1)*16*MT) of the block's BM = 64*MT rows, and every one of its S and O fragments.
//
// Per key tile of BN keys (one K tile and one V tile in shared memory, FA2 order, cp.async, zero-filled
// past T):   wait K_n, barrier  ->  issue V_n  ->  S = Q K_n^T (ldmatrix K, mma)  ->  wait V_n, barrier  ->
// issue K_{n+1}  ->  causal mask (diagonal tiles only), online softmax in fp32 (exp2 of log2e-prescaled
// scores), P rounded to bf16 in registers as the A operand  ->  O += P V_n (ldmatrix.trans V, mma).
// Key tiles above the diagonal are never loaded (a block stops at its last row); a warp whose rows all
// precede a key tile skips its math on that tile. At the end O / l goes through the warp's own rows of the
// Q buffer to 16-byte coalesced stores of out.
//
// Shared memory (dynamic), three row-major bf16 buffers with the same layout:
//   Q [BM][HD]  loaded once; warp w reads (and at the end overwrites) only its own rows
//   K [BN][HD]  the current key tile, read by all warps
//   V [BN][HD]  the current value tile, read by all warps
// Rows of 16-byte chunks: when HD % 64 == 0 chunk c of row r lives at chunk c ^ (r & 7) (XOR swizzle), else
// each row is padded by one chunk (HD + 8 elements; HD/8 + 1 is odd), so every ldmatrix phase of 8 rows hits
// 8 distinct bank groups either way.
//
// Tile shapes (att_launch; lab/attention.cu compares the alternatives):
//   HD <= 64:        BM 128 (MT 2), BN 64, Q fragments held in registers
//   64 < HD <= 128:  BM 128 (MT 2), BN 64, Q re-read from shared memory per key tile (registers go to O and S)
//   HD <= 128, short prompts (nh * ceil(T / 128) < 2 * multiprocessors): BM 64 (MT 1), BN 64 (Q in registers
//                    for HD <= 64), so that the grid has twice the blocks
//   HD > 128:        BM 64 (MT 1), BN 64, Q from shared memory
// Shared memory per block: (BM + 2 BN) * row bytes, at most 96 KB (hd 256), so sm_89 (99 KB) runs them all.
//
// Floor: causal FLOPs = 2 * 2 * hd * nh * T (T + 1) / 2 over the measured bf16 tensor-core rate of the H200
// (~790 TFLOP/s, wgmma); mma.sync reaches well under that on Hopper. Bytes (q, k, v read once, out written
// once) are negligible beyond a few hundred tokens.
//
// Instantiations: 24 kernels per target (sm_90a, sm_89): one per head_dim 16, 32, ..., 256, plus the BM 64
// shape for each head_dim <= 128.
#include <math.h>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_mma.cuh"

#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)

// cp.async of rows [row0, row0 + ROWS) of one head (g points at its first column; ld elements between rows)
// into a tile at s; rows at or past T are zero-filled (they meet only masked scores or zero probabilities,
// and zeros keep 0 * x finite). Thread tid copies chunk tid % CH of rows tid / CH + p * RP (RP = 128 / CH
// rows per pass), so one pointer and one stride serve all its passes.
template <int HD, int ROWS>
static __device__ __forceinline__ void att_load_tile(uint32_t s, const __nv_bfloat16 *g, int64_t ld, int row0, int T,
                                                     int tid) {
    constexpr int CH = HD / 8, RP = ATT_THREADS / CH, PASSES = (ROWS + RP - 1) / RP;
    const int ch = tid % CH, r = tid / CH;
    if (ATT_THREADS % CH != 0 && r >= RP) return;
    const __nv_bfloat16 *src = g + (int64_t)(row0 + r) * ld + ch * 8;
    const int64_t step = (int64_t)RP * ld;
#pragma unroll
    for (int p = 0; p < PASSES; p++) {
        const int rr = r + p * RP;
        if (ROWS % RP != 0 && rr >= ROWS) break;
        const bool ok = row0 + rr < T;
        att_cp16(s + att_off<HD>(rr, ch), ok ? src : g, ok ? 16u : 0u);
        src += step;
    }
}

template <int HD, int MT, int BN, bool QREG>
__global__ void __launch_bounds__(ATT_THREADS)
    att_fwd_kernel(const __nv_bfloat16 *__restrict__ qkv, __nv_bfloat16 *__restrict__ out, int T, int nh, int nkv,
                   float sl2) {
    constexpr int BM = ATT_WARPS * 16 * MT; // query rows per block
    constexpr int KS = HD / 16;             // k-steps of S = Q K^T
    constexpr int NT = BN / 8;              // n8 tiles of S
    constexpr int DT = HD / 8;              // n8 tiles of O
    constexpr int RE = ATT_ROW_ELEMS(HD);
    extern __shared__ __align__(128) unsigned char att_smem[];
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(att_smem);
    const uint32_t sk = sq + BM * RE * 2;
    const uint32_t sv = sk + BN * RE * 2;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3; // fragment row group and column pair
    const int h = blockIdx.x;
    const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const int wr0 = warp * 16 * MT; // warp's first row in the block
    const int64_t ld = (int64_t)(nh + 2 * nkv) * HD;
    const int kvh = h / (nh / nkv);
    const __nv_bfloat16 *gq = qkv + (int64_t)h * HD;
    const __nv_bfloat16 *gk = qkv + (int64_t)(nh + kvh) * HD;
    const __nv_bfloat16 *gv = qkv + (int64_t)(nh + nkv + kvh) * HD;
    const int last_key = min(T - 1, m0 + BM - 1);
    const int ntiles = last_key / BN + 1;

    att_load_tile<HD, BM>(sq, gq, ld, m0, T, tid);
    att_load_tile<HD, BN>(sk, gk, ld, 0, T, tid);
    att_cp_commit();

    float o[MT][DT][4];
    float mrow[MT][2], lrow[MT][2]; // running max (raw score) and this thread's partial sum, rows g and g + 8
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
        mrow[mt][0] = mrow[mt][1] = -INFINITY;
        lrow[mt][0] = lrow[mt][1] = 0.0f;
    }
    uint32_t qf[QREG ? MT : 1][QREG ? KS : 1][4];

    // per-lane ldmatrix rows: A (Q) and V.trans read rows lane & 15, chunk + (lane >> 4); K reads rows
    // (lane & 7) + 8 (lane >> 4), chunk + ((lane >> 3) & 1)
    const att_lane la = att_lane_init<HD>(lane & 15, lane >> 4);
    const att_lane lk = att_lane_init<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    for (int n = 0; n < ntiles; n++) {
        const int n0 = n * BN;
        att_cp_wait_all();
        __syncthreads(); // K_n (and Q) landed; every warp is done with V_{n-1}
        if (QREG && n == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < KS; kk++)
                    att_ldsm_x4(qf[QREG ? mt : 0][QREG ? kk : 0], sq + att_lane_off<HD>(&la, wr0 + mt * 16, kk));
        }
        att_load_tile<HD, BN>(sv, gv, ld, n0, T, tid);
        att_cp_commit();

        const bool active = n0 <= m0 + wr0 + 16 * MT - 1; // some key of the tile is visible to this warp
        float s[MT][NT][4];
        if (active) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (QREG) {
#pragma unroll
                        for (int i = 0; i < 4; i++) a[mt][i] = qf[QREG ? mt : 0][QREG ? kk : 0][i];
                    } else {
                        att_ldsm_x4(a[mt], sq + att_lane_off<HD>(&la, wr0 + mt * 16, kk));
                    }
                }
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b[4];
                    att_ldsm_x4(b, sk + att_lane_off<HD>(&lk, np * 16, kk));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        att_mma(s[mt][2 * np], a[mt], b[0], b[1]);
                        att_mma(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
        }
        att_cp_wait_all();
        __syncthreads(); // V_n landed; every warp is done with K_n
        if (n + 1 < ntiles) {
            att_load_tile<HD, BN>(sk, gk, ld, n0 + BN, T, tid);
            att_cp_commit();
        }
        if (!active) continue;

        if (n0 + BN - 1 > m0 + wr0) { // the tile crosses this warp's diagonal: key > query -> -inf
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int q = m0 + wr0 + mt * 16 + g + ((i >> 1) << 3);
                        const int k = n0 + nt * 8 + 2 * c + (i & 1);
                        if (k > q) s[mt][nt][i] = -INFINITY;
                    }
        }
        // online softmax; the 4 lanes of a quad share a row. Max and sum are pairwise trees (independent
        // instructions instead of a chain of NT dependent ones); O is rescaled only when some row's max moved.
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float alpha[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float t[NT];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) t[nt] = fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]);
#pragma unroll
                for (int w = 1; w < NT; w *= 2)
#pragma unroll
                    for (int i = 0; i + w < NT; i += 2 * w) t[i] = fmaxf(t[i], t[i + w]);
                float mx = fmaxf(mrow[mt][hf], t[0]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mb = mx == -INFINITY ? 0.0f : mx * sl2; // a fully masked row stays 0, never NaN
                alpha[hf] = att_exp2(mrow[mt][hf] * sl2 - mb);      // exactly 1 when the max did not move
                mrow[mt][hf] = mx;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    s[mt][nt][2 * hf] = att_exp2(fmaf(s[mt][nt][2 * hf], sl2, -mb));
                    s[mt][nt][2 * hf + 1] = att_exp2(fmaf(s[mt][nt][2 * hf + 1], sl2, -mb));
                    t[nt] = s[mt][nt][2 * hf] + s[mt][nt][2 * hf + 1];
                }
#pragma unroll
                for (int w = 1; w < NT; w *= 2)
#pragma unroll
                    for (int i = 0; i + w < NT; i += 2 * w) t[i] += t[i + w];
                lrow[mt][hf] = lrow[mt][hf] * alpha[hf] + t[0];
            }
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    o[mt][dt][0] *= alpha[0];
                    o[mt][dt][1] *= alpha[0];
                    o[mt][dt][2] *= alpha[1];
                    o[mt][dt][3] *= alpha[1];
                }
            }
        }
        // O += P V: the S accumulators of key n8 tiles 2j, 2j+1 are the A fragment of key k-step j
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t p[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                p[mt][0] = att_pack_bf16(s[mt][2 * ks][0], s[mt][2 * ks][1]);
                p[mt][1] = att_pack_bf16(s[mt][2 * ks][2], s[mt][2 * ks][3]);
                p[mt][2] = att_pack_bf16(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
                p[mt][3] = att_pack_bf16(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                att_ldsm_x4_t(b, sv + att_lane_off<HD>(&la, ks * 16, dp));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    att_mma(o[mt][2 * dp], p[mt], b[0], b[1]);
                    att_mma(o[mt][2 * dp + 1], p[mt], b[2], b[3]);
                }
            }
        }
    }

    // epilogue: O / l as bf16 into this warp's own Q rows, then 16-byte coalesced stores of rows < T
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lrow[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.0f / l; // l >= 1: the row's max contributes exp2(0)
            const int r = wr0 + mt * 16 + g + hf * 8;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const uint32_t v = att_pack_bf16(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sq + att_off<HD>(r, dt) + 4 * c), "r"(v) : "memory");
            }
        }
    __syncwarp();
    constexpr int CH = HD / 8;
    const int64_t ldo = (int64_t)nh * HD;
#pragma unroll
    for (int j = 0; j < MT * CH / 2; j++) { // 16 MT rows of CH chunks, 32 lanes
        const int i = lane + 32 * j;
        const int r = i / CH, ch = i % CH;
        const int t = m0 + wr0 + r;
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(sq + att_off<HD>(wr0 + r, ch))
                     : "memory");
        if (t < T) *(uint4 *)(out + (int64_t)t * ldo + (int64_t)h * HD + ch * 8) = v;
    }
}

static void att_fail(const char *what, int64_t T, int32_t nh, int32_t nkv, int32_t hd) {
    fprintf(stderr, "fp8moe: fm_cuda_attention(T=%lld, nh=%d, nkv=%d, hd=%d): %s\n", (long long)T, nh, nkv, hd, what);
    abort();
}

// One tile configuration; the lab (lab/attention.cu) calls it with others to compare them.
template <int HD, int MT, int BN, bool QREG>
static void att_launch_cfg(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, __nv_bfloat16 *out,
                           cudaStream_t stream) {
    constexpr int BM = ATT_WARPS * 16 * MT;
    constexpr size_t smem = (size_t)(BM + 2 * BN) * ATT_ROW_ELEMS(HD) * 2;
    static_assert(HD % 16 == 0 && HD >= 16 && HD <= 256 && BN % 16 == 0 && (MT == 1 || MT == 2), "tile shape");
    static_assert(smem <= 99 * 1024, "shared memory above the sm_89 limit");
    const int64_t qtiles = fm_ceil_div(T, BM);
    if (qtiles > 65535) att_fail("T too large for the grid (query tiles > 65535)", T, nh, nkv, HD);
    if (smem > 48 * 1024)
        FM_CUDA_CHECK(cudaFuncSetAttribute(att_fwd_kernel<HD, MT, BN, QREG>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD)); // log2(e) / sqrt(hd)
    att_fwd_kernel<HD, MT, BN, QREG>
        <<<dim3((unsigned)nh, (unsigned)qtiles), ATT_THREADS, smem, stream>>>(qkv, out, (int)T, nh, nkv, sl2);
    FM_LAUNCH_CHECK("attention");
}

// The engine's configuration per head_dim (header comment of this file). small: the BM = 128 grid would not
// fill 2 blocks on every multiprocessor (short prompts), so BM = 64 for twice the blocks (lab/README.md).
template <int HD>
static void att_launch(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, __nv_bfloat16 *out,
                       cudaStream_t stream, int small) {
    if constexpr (HD > 128) att_launch_cfg<HD, 1, 64, false>(qkv, T, nh, nkv, out, stream);
    else if (small) att_launch_cfg<HD, 1, 64, (HD <= 64)>(qkv, T, nh, nkv, out, stream);
    else att_launch_cfg<HD, 2, 64, (HD <= 64)>(qkv, T, nh, nkv, out, stream);
}

extern "C" void fm_cuda_attention(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                  __nv_bfloat16 *out, cudaStream_t stream) {
    if (!qkv || !out) att_fail("null pointer", T, nh, nkv, hd);
    if (T < 1 || T > INT32_MAX) att_fail("T must be in [1, 2^31)", T, nh, nkv, hd);
    if (nh < 1 || nkv < 1 || nh % nkv != 0) att_fail("need nh >= 1, nkv >= 1 and nh % nkv == 0", T, nh, nkv, hd);
    if (hd < 16 || hd > 256 || hd % 16 != 0) att_fail("hd must be a multiple of 16 in [16, 256]", T, nh, nkv, hd);
    if (((uintptr_t)qkv | (uintptr_t)out) % 16 != 0) att_fail("qkv and out must be 16-byte aligned", T, nh, nkv, hd);
    const int sms = fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    const int small = (int64_t)nh * fm_ceil_div(T, 128) < 2 * (int64_t)sms;
    switch (hd) {
    case 16: att_launch<16>(qkv, T, nh, nkv, out, stream, small); break;
    case 32: att_launch<32>(qkv, T, nh, nkv, out, stream, small); break;
    case 48: att_launch<48>(qkv, T, nh, nkv, out, stream, small); break;
    case 64: att_launch<64>(qkv, T, nh, nkv, out, stream, small); break;
    case 80: att_launch<80>(qkv, T, nh, nkv, out, stream, small); break;
    case 96: att_launch<96>(qkv, T, nh, nkv, out, stream, small); break;
    case 112: att_launch<112>(qkv, T, nh, nkv, out, stream, small); break;
    case 128: att_launch<128>(qkv, T, nh, nkv, out, stream, small); break;
    case 144: att_launch<144>(qkv, T, nh, nkv, out, stream, small); break;
    case 160: att_launch<160>(qkv, T, nh, nkv, out, stream, small); break;
    case 176: att_launch<176>(qkv, T, nh, nkv, out, stream, small); break;
    case 192: att_launch<192>(qkv, T, nh, nkv, out, stream, small); break;
    case 208: att_launch<208>(qkv, T, nh, nkv, out, stream, small); break;
    case 224: att_launch<224>(qkv, T, nh, nkv, out, stream, small); break;
    case 240: att_launch<240>(qkv, T, nh, nkv, out, stream, small); break;
    case 256: att_launch<256>(qkv, T, nh, nkv, out, stream, small); break;
    }
}
