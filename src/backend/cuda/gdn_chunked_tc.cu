// The gated delta rule's chunked form on tensor cores for Qwen3-Next's heads (dk = dv = 128) over bf16 activations:
// the form of transformers' torch_chunk_gated_delta_rule and FLA's chunk kernels, lab/gdn.cu's kernels with their
// products moved to tensor cores. Per chunk of C = 64 tokens and value head, with G the decays' cumulative sums
// inside the chunk (cpu_gdn.c states the algebra):
//   intra  (every chunk at once; grid (chunks, heads), 8 warps, two blocks per SM): q, k l2-normalised; K K^T and
//          Q K^T; the strictly lower A = -(beta_r k_r.k_c) e^(G_r - G_c) and the causal Aq = (q_r.k_c) e^(G_r -
//          G_c); T = (I - A)^-1 by 16 x 16 blocks (fp32: the diagonal ones by substitution in a warp each, then the
//          rest by block products); W = T diag(beta e^G) K and U = T diag(beta) V; Q e^G, K e^(G_last - G),
//          e^(G_last) -> scratch (gdn_workspace.h); multiplied on bf16 mma.sync (gdn_tc_intra16), W, K, Q and Aq
//          left as bf16
//   state  sequential over the chunks: v' = U - W S; S = e^(G_last) S + (K e^(G_last - G))^T v', the recurrence
//          alone on bf16 mma.sync (gdn_tc_hpass, grid (4 column blocks of 32, heads)), keeping v' and the state
//          before each chunk; then o = (Q e^G) S + Aq v' of every chunk in a parallel pass (gdn_tc_out).
// (The 4- and 8-warp TF32 forms with the output inside the state pass, route gdn.state=4|8, measured 22.1 against
// 12.5 ms for this one and were removed: lab/README.md.)
// A prompt runs in segments of FM_GDN_TC_SEG_CHUNKS chunks (the scratch of one segment), the state carried in the
// op's state buffer or the scratch's; a prompt chunk after others (tok_pos[0] > 0) starts from the sequence's state,
// which the state pass reads as it reads a later segment's. bf16 rounds the products' inputs to 8-bit mantissas: the
// outputs differ from the fp32 token-by-token form by ~3.3e-3 relative (test_cuda_qnext, T = 2100), against the bf16
// rounding of the result (the ref32 oracle, fp32 activations, keeps the token-by-token kernel of gdn.cu).
#include "backend/cuda/attention_mma.cuh" /* cp.async */
#include "backend/cuda/gdn.cuh"
extern "C" {
#include "backend/gdn_workspace.h"
#include "backend/routes.h"
}

#define CH 64
#define D FM_GDN_TC_DIM
#define LDA (CH + 4) /* of the [64][64] ones */
#define LDS 36       /* of the state's column block and the [64][32] tiles */

typedef __nv_bfloat16 bf16;

typedef struct tc_scratch {
    float *W, *U, *Qg, *Kg, *Aq, *eg, *Sc, *S; /* Sc: the split form's slot per chunk (its state before, v') */
} tc_scratch;

static __device__ __forceinline__ float softplus_tc(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* segment chunk cl of head h: scratch index */
static __device__ __forceinline__ int64_t unit(int cl, int h, int nv) { return (int64_t)cl * nv + h; }

/* The chunk's gates by a block of >= 64 threads: beta = sigmoid(b) into bs, and the inclusive cumulative sum G of
   the decays g = -e^(A_log) softplus(a + dt_bias) into gc; zeros past T. The cumulative sum is warp 0's, after a
   barrier: the caller's next barrier publishes it */
template <typename A>
static __device__ __forceinline__ void chunk_gates(const A *ba, const A *a_log, const A *dt_bias, int64_t t0, int64_t T,
                                                   fm_gdn_shape g, int h, float *gc, float *bs) {
    const int tid = threadIdx.x, r = g.nv / g.nk, kh = h / r;
    if (tid < CH) {
        const int64_t t = t0 + tid;
        float gv = 0.0f, bv = 0.0f;
        if (t < T) {
            const A *bar = ba + t * 2 * (int64_t)g.nv + (int64_t)kh * 2 * r;
            bv = 1.0f / (1.0f + expf(-act_load(bar[h % r])));
            gv = -expf(act_load(a_log[h])) * softplus_tc(act_load(bar[r + h % r]) + act_load(dt_bias[h]));
        }
        gc[tid] = gv, bs[tid] = bv;
    }
    __syncthreads();
    if (tid < 32) { /* two per lane */
        float a = gc[2 * tid], b = a + gc[2 * tid + 1];
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, b, o);
            if (tid >= o) a += n, b += n;
        }
        gc[2 * tid] = a, gc[2 * tid + 1] = b;
    }
}

/* T = (I - A)^-1 by 16 x 16 blocks (FLA's solve_tril), by a block of 256 threads, A's strictly lower part in Am
   ([64][LDA] fp32, complete: the caller's barrier), T into Tm (upper part zero): first each diagonal block's inverse,
   I + X with X = A + A X by right-looking substitution inside one warp (warps 0-3, 14 steps: step m adds A[i][m]
   X[m][c] to every X[i][c] with i > m, c < m; it reads column m below the diagonal, still A's, and row m, final), in
   place in Am; then the blocks below the diagonal by their distance from it, T_ij = T_ii sum_{k=j}^{i-1} A_ik T_kj
   (fp32, two block products a round, 6 barriers; Pb holds 768 floats). Ends with a barrier. The whole-matrix
   substitution before it (62 barriers, a division per element) held 45% of the TF32 intra kernel's samples. */
static __device__ __forceinline__ void tril_solve(float *Am, float *Tm, float *Pb) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (warp < 4) {
        float *X = Am + 16 * warp * LDA + 16 * warp;
        for (int m = 1; m < 15; m++) {
#pragma unroll
            for (int e = lane; e < 256; e += 32) {
                const int i = e >> 4, c = e & 15;
                if (i > m && c < m) X[i * LDA + c] = fmaf(X[i * LDA + m], X[m * LDA + c], X[i * LDA + c]);
            }
            __syncwarp();
        }
    }
    __syncthreads();
    for (int i = tid; i < CH * CH; i += 256) {
        const int rr = i / CH, cc = i % CH;
        Tm[rr * LDA + cc] = rr == cc ? 1.0f : (rr >> 4) == (cc >> 4) && cc < rr ? Am[rr * LDA + cc] : 0.0f;
    }
    __syncthreads();
    for (int d = 1; d < 4; d++) { /* the blocks (b + d, b), b < 4 - d */
        for (int e = tid; e < (4 - d) * 256; e += 256) {
            const int i = (e >> 8) + d, j = e >> 8, r = (e >> 4) & 15, c = e & 15;
            float acc = 0.0f;
            for (int k = j; k < i; k++)
#pragma unroll
                for (int l = 0; l < 16; l++)
                    acc = fmaf(Am[(16 * i + r) * LDA + 16 * k + l], Tm[(16 * k + l) * LDA + 16 * j + c], acc);
            Pb[e] = acc;
        }
        __syncthreads();
        for (int e = tid; e < (4 - d) * 256; e += 256) {
            const int i = (e >> 8) + d, j = e >> 8, r = (e >> 4) & 15, c = e & 15;
            float acc = 0.0f;
            for (int l = 0; l <= r; l++)
                acc = fmaf(Tm[(16 * i + r) * LDA + 16 * i + l], Pb[(j << 8) + l * 16 + c], acc);
            Tm[(16 * i + r) * LDA + 16 * j + c] = acc;
        }
        __syncthreads();
    }
}

/* acc (rows 16 ti .. 16 ti + 15, all D columns: D / 8 n8 tiles) += A [64][64] x B [64][D], bf16 tiles in
   attention_mma.cuh's layout (A by ldmatrix, B row-major [k][n] by ldmatrix.trans), A lower triangular by 16 x 16
   blocks: the k-steps up to the diagonal block only (T diag(..) K or V in the intra kernel, Aq v' in the output pass)
 */
static __device__ __forceinline__ void tril_rows_mma(uint32_t sA, uint32_t sB, int ti, const att_lane &l64,
                                                     const att_lane &l128, float acc[D / 8][4]) {
#pragma unroll
    for (int ks = 0; ks < CH / 16; ks++) {
        if (ks > ti) break;
        uint32_t a[4];
        att_ldsm_x4(a, sA + att_lane_off<CH>(&l64, 16 * ti, ks));
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            att_ldsm_x4_t(b, sB + att_lane_off<D>(&l128, 16 * ks, dp));
            att_mma(acc[2 * dp], a, b[0], b[1]);
            att_mma(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

/* st.shared of 4 or 8 bytes at a shared-window address */
static __device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
static __device__ __forceinline__ void sts64(uint32_t addr, uint32_t a, uint32_t b) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(a), "r"(b) : "memory");
}

/* The split form's intra kernel on bf16 mma.sync m16n8k16 with fp32 accumulators (FLA's chunk kernels multiply bf16
 * too): grid (chunks, heads), 8 warps, two blocks per SM (102 KB of shared memory). Per (chunk, value head):
 *   rows   warp w: rows w, w + 8, ..., a lane 4 adjacent columns (8-byte loads, issued before the gates' loads); q, k
 *          l2-normalised (q times dk^-1/2) into bf16 [64][128] tiles beside v (attention_mma.cuh's swizzled
 *          layout); Q e^G and K e^(G_last - G) to the scratch from registers
 *   K K^T and Q K^T  warp w: row tile w / 2, n8 tiles 4 (w % 2) .. + 3, those wholly above the diagonal skipped, 8
 *          k-steps, B = K^T from K's rows by plain ldmatrix; the decays and beta applied in registers: A (fp32, for
 *          the solve) and the causal Aq (bf16, to the scratch)
 *   T = (I - A)^-1  tril_solve, fp32
 *   W, U   T diag(beta e^G) and T diag(beta) as bf16 [64][64]; warps 0-3 W = (..) K, warps 4-7 U = (..) V, row tile
 *          w % 4 over all 128 columns, k-steps up to the diagonal, K and V by ldmatrix.trans
 * Per (chunk, head) 48 KB read (q and k once per value head), 104 KB written (U fp32: the state pass's v' = U - W S
 * stays fp32); at T = 2048, 32 heads, 156 MB: ~50 us at the copy rate. The TF32 WMMA form before it took 233 us (ncu,
 * bench/NOTES.md 2026-12-02 "the Gated DeltaNet's state pass split"). */
#define INTRA16_SMEM (3 * CH * D * 2 + 2 * CH * CH * 2 + (2 * CH * LDA + 3 * CH + 768) * 4)

static __global__ __launch_bounds__(256, 2) void gdn_tc_intra16(const bf16 *qkv, const bf16 *ba, const bf16 *a_log,
                                                                const bf16 *dt_bias, int64_t T, int64_t c_first,
                                                                fm_gdn_shape g, tc_scratch out) {
    extern __shared__ __align__(128) unsigned char ism[];
    const uint32_t sQ = (uint32_t)__cvta_generic_to_shared(ism), sK = sQ + CH * D * 2, sV = sK + CH * D * 2,
                   sT1 = sV + CH * D * 2, sT2 = sT1 + CH * CH * 2;
    float *Am = (float *)(ism + 3 * CH * D * 2 + 2 * CH * CH * 2), *Tm = Am + CH * LDA;
    float *gc = Tm + CH * LDA, *bs = gc + CH, *ebg = bs + CH, *Pb = ebg + CH;
    const int cl = blockIdx.x, h = blockIdx.y, kh = h / (g.nv / g.nk);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t t0 = (c_first + cl) * CH, C = 2 * (int64_t)g.nk * D + (int64_t)g.nv * D, key = (int64_t)g.nk * D;
    const int64_t u = unit(cl, h, g.nv);
    uint2 qr[CH / 8], kr[CH / 8], vr[CH / 8];
#pragma unroll
    for (int rw = 0; rw < CH / 8; rw++) {
        const int64_t t = t0 + warp + 8 * rw;
        const uint2 z = make_uint2(0u, 0u);
        const bf16 *row = qkv + t * C + 4 * lane;
        qr[rw] = t < T ? *(const uint2 *)(row + (int64_t)kh * D) : z;
        kr[rw] = t < T ? *(const uint2 *)(row + key + (int64_t)kh * D) : z;
        vr[rw] = t < T ? *(const uint2 *)(row + 2 * key + (int64_t)h * D) : z;
    }
    chunk_gates(ba, a_log, dt_bias, t0, T, g, h, gc, bs);
    __syncthreads();
    const float glast = gc[CH - 1], scale = 1.0f / sqrtf((float)D);
    bf16 *Qg = (bf16 *)(out.Qg + u * CH * D) + 4 * lane, *Kg = (bf16 *)(out.Kg + u * CH * D) + 4 * lane;
#pragma unroll
    for (int rw = 0; rw < CH / 8; rw++) {
        const int row = warp + 8 * rw;
        const float2 q01 = __bfloat1622float2(*(const __nv_bfloat162 *)&qr[rw].x),
                     q23 = __bfloat1622float2(*(const __nv_bfloat162 *)&qr[rw].y),
                     k01 = __bfloat1622float2(*(const __nv_bfloat162 *)&kr[rw].x),
                     k23 = __bfloat1622float2(*(const __nv_bfloat162 *)&kr[rw].y);
        float sq = q01.x * q01.x + q01.y * q01.y + q23.x * q23.x + q23.y * q23.y;
        float sk = k01.x * k01.x + k01.y * k01.y + k23.x * k23.x + k23.y * k23.y;
        for (int o = 16; o > 0; o >>= 1)
            sq += __shfl_xor_sync(0xffffffffu, sq, o), sk += __shfl_xor_sync(0xffffffffu, sk, o);
        const float iq = scale / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        const float q[4] = {q01.x * iq, q01.y * iq, q23.x * iq, q23.y * iq};
        const float k[4] = {k01.x * ik, k01.y * ik, k23.x * ik, k23.y * ik};
        const uint32_t off = att_off<D>(row, lane >> 1) + (lane & 1) * 8;
        sts64(sQ + off, att_pack_bf16(q[0], q[1]), att_pack_bf16(q[2], q[3]));
        sts64(sK + off, att_pack_bf16(k[0], k[1]), att_pack_bf16(k[2], k[3]));
        sts64(sV + off, vr[rw].x, vr[rw].y);
        const float eq = expf(gc[row]), ek = expf(glast - gc[row]);
        *(uint2 *)(Qg + row * D) = make_uint2(att_pack_bf16(q[0] * eq, q[1] * eq), att_pack_bf16(q[2] * eq, q[3] * eq));
        *(uint2 *)(Kg + row * D) = make_uint2(att_pack_bf16(k[0] * ek, k[1] * ek), att_pack_bf16(k[2] * ek, k[3] * ek));
    }
    if (tid < CH) ebg[tid] = bs[tid] * expf(gc[tid]);
    __syncthreads();
    const int gr = lane >> 2, gc2 = 2 * (lane & 3); /* accumulator rows gr, gr + 8, columns gc2, gc2 + 1 */
    const att_lane l128 = att_lane_init<D>(lane & 15, lane >> 4), l64 = att_lane_init<CH>(lane & 15, lane >> 4);
    { /* K K^T and Q K^T: n8 tiles 2p, 2p + 1 of pair p = 2 (w % 2) + pp, computed when p <= ti (on or below the
         diagonal); B by plain ldmatrix of K's rows 16 p + (lane & 7) + 8 (lane / 16), chunk 2 kk + (lane / 8) % 2 */
        const int ti = warp >> 1, p0 = 2 * (warp & 1), br = (lane & 7) + ((lane >> 4) << 3), bc = (lane >> 3) & 1;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) kk[n][e] = qk[n][e] = 0.0f;
        if (p0 <= ti) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) {
                uint32_t ak[4], aq[4];
                att_ldsm_x4(ak, sK + att_lane_off<D>(&l128, 16 * ti, ks));
                att_ldsm_x4(aq, sQ + att_lane_off<D>(&l128, 16 * ti, ks));
#pragma unroll
                for (int pp = 0; pp < 2; pp++) {
                    if (p0 + pp > ti) break;
                    uint32_t b[4];
                    att_ldsm_x4(b, sK + att_off<D>(16 * (p0 + pp) + br, 2 * ks + bc));
                    att_mma(kk[2 * pp], ak, b[0], b[1]), att_mma(kk[2 * pp + 1], ak, b[2], b[3]);
                    att_mma(qk[2 * pp], aq, b[0], b[1]), att_mma(qk[2 * pp + 1], aq, b[2], b[3]);
                }
            }
        }
        /* A = -beta_r (k_r.k_c) e^(G_r - G_c) below the diagonal, Aq = (q_r.k_c) e^(G_r - G_c) on and below it;
           zeros above (the tiles skipped too: the output pass reads all of Aq) */
        bf16 *Aqg = (bf16 *)(out.Aq + u * CH * CH);
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = 16 * ti + gr + 8 * hf, c = 8 * (2 * p0 + n) + gc2;
                float a[2] = {0.0f, 0.0f}, q[2] = {0.0f, 0.0f};
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (c + e <= r) {
                        const float dec = expf(gc[r] - gc[c + e]);
                        q[e] = qk[n][2 * hf + e] * dec;
                        if (c + e < r) a[e] = -bs[r] * kk[n][2 * hf + e] * dec;
                    }
                Am[r * LDA + c] = a[0], Am[r * LDA + c + 1] = a[1];
                act_store_pair(Aqg + r * CH + c, q[0], q[1]);
            }
    }
    __syncthreads();
    tril_solve(Am, Tm, Pb);
    for (int i = tid; i < CH * CH / 2; i += 256) { /* T diag(beta e^G), T diag(beta) as bf16 */
        const int rr = i / (CH / 2), cc = 2 * (i % (CH / 2));
        const float a = Tm[rr * LDA + cc], b = Tm[rr * LDA + cc + 1];
        const uint32_t off = att_off<CH>(rr, cc >> 3) + 2 * (cc & 7);
        sts32(sT1 + off, att_pack_bf16(a * ebg[cc], b * ebg[cc + 1]));
        sts32(sT2 + off, att_pack_bf16(a * bs[cc], b * bs[cc + 1]));
    }
    __syncthreads();
    { /* W (warps 0-3) and U (4-7): row tile w % 4, k-steps 0 .. w % 4 (T lower triangular) */
        const int ti = warp & 3;
        const bool is_u = warp >= 4;
        const uint32_t sA = is_u ? sT2 : sT1, sB = is_u ? sV : sK;
        float acc[D / 8][4];
#pragma unroll
        for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        tril_rows_mma(sA, sB, ti, l64, l128, acc);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = 16 * ti + gr + 8 * hf;
            if (is_u) {
                float *o = out.U + u * CH * D + r * D + gc2;
#pragma unroll
                for (int n = 0; n < D / 8; n++)
                    *(float2 *)(o + 8 * n) = make_float2(acc[n][2 * hf], acc[n][2 * hf + 1]);
            } else {
                bf16 *o = (bf16 *)(out.W + u * CH * D) + r * D + gc2;
#pragma unroll
                for (int n = 0; n < D / 8; n++) act_store_pair(o + 8 * n, acc[n][2 * hf], acc[n][2 * hf + 1]);
            }
        }
    }
    if (tid == 0) out.eg[u] = expf(glast);
}

/* the block's 32 columns of a [64][128] tile into rows of LDS */
static __device__ __forceinline__ void stage_cols_async(float *dst, const float *src, int col0) {
    for (int i = threadIdx.x; i < CH * 8; i += blockDim.x)
        att_cp16((uint32_t)__cvta_generic_to_shared(dst + (i / 8) * LDS + 4 * (i % 8)),
                 src + (i / 8) * D + col0 + 4 * (i % 8), 16);
}
static __device__ __forceinline__ void state_pass_end(const float *S, int col0, float *Sg) {
    for (int i = threadIdx.x; i < D * 32; i += blockDim.x)
        Sg[(int64_t)(i / 32) * D + col0 + i % 32] = S[(i / 32) * LDS + i % 32];
}

/* The state pass, FLA's form: the sequence of chunks carries only the state, W S ->
 * v' -> S' (8 warps, a 12-k-step chain per warp and chunk on bf16 mma.sync), and leaves the state before each chunk
 * and v' in the chunk's Sc slot as bf16 ([128][128], then [64][128]); gdn_tc_out then computes every chunk's o = (Q
 * e^G) S + Aq v' at once. With this form the intra kernel leaves W, K e^(G_last - G), Q e^G and Aq as bf16. The tiles
 * of chunk c + 1 (W, K, U's columns) load into the second of two buffers while chunk c computes. */
#define OPASS_SMEM ((2 * CH * D + CH * CH + D * D) * 2) /* bf16 Q e^G, v', Aq, S */

/* chunk u's W and K e^(G_last - G) (bf16 [64][128], the XOR-swizzled layout of attention_mma.cuh) and U's 32
   columns (fp32, rows of LDS), requested */
static __device__ __forceinline__ void hpass_stage(const tc_scratch &in, int64_t u, int col0, uint32_t sW, uint32_t sK,
                                                   float *Us) {
    const bf16 *W = (const bf16 *)(in.W + u * CH * D), *K = (const bf16 *)(in.Kg + u * CH * D);
    for (int i = threadIdx.x; i < CH * D / 8; i += blockDim.x) {
        att_cp16(sW + att_off<D>(i / 16, i % 16), W + 8 * i, 16);
        att_cp16(sK + att_off<D>(i / 16, i % 16), K + 8 * i, 16);
    }
    stage_cols_async(Us, in.U + u * CH * D, col0);
    att_cp_commit();
}

#define HB 32 /* the state block's columns */
/* the split form's bf16 tiles in the fp32 scratch slots (gdn_workspace.h): the state before the chunk and v' in the
   [128][128] Sc slot, W, K e^(G_last - G) and Q e^G in their [64][128] ones, Aq in its [64][64] one */
static_assert(D * D * 2 + CH * D * 2 <= D * D * 4 && CH * D * 2 <= CH * D * 4 && CH * CH * 2 <= CH * CH * 4,
              "bf16 tiles fit their fp32 slots");
#define HPASS_SMEM (4 * CH * D * 2 + (2 * CH * LDS + D * LDS) * 4 + (D + CH) * ATT_ROW_ELEMS(HB) * 2)

/* bf16 pair at row r, column j (even) of a [rows][32] tile (attention_mma.cuh's layout for HD = 32: rows of 40) */
static __device__ __forceinline__ void st_pair32(uint32_t base, int r, int j, float a, float b) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + att_off<HB>(r, j / 8) + 2 * (j % 8)), "r"(att_pack_bf16(a, b))
                 : "memory");
}

/* On bf16 mma.sync m16n8k16 (fp32 accumulators; FLA's kernels multiply bf16 too): per chunk, W S (64 x 32: warp w the
 * rows 16 (w / 2), columns 16 (w % 2), 8 k-steps), v' = U - W S in fp32, then S' = e^(G_last) S + (K e^(G_last -
 * G))^T v' (128 x 32: warp w rows 16 w, 4 k-steps over the chunk's 64 tokens, K^T by ldmatrix.trans of K's rows).
 * The state stays fp32 in shared memory (each warp updates its own fragment positions) beside a bf16 copy, the W S
 * operand, which is also what the output pass reads as the state before the chunk. One block per (32 columns,
 * head): 128 blocks, a dependent chain of 32 chunks; ncu 85 us per segment of 32 chunks (2.7 us a chunk) against 484
 * for the TF32 8-warp form with the output inside. */
static __global__ __launch_bounds__(256) void gdn_tc_hpass(tc_scratch in, int n_chunks, fm_gdn_shape g, float *states,
                                                           const int32_t *seq, const int32_t *pos, bool first) {
    extern __shared__ __align__(128) unsigned char hsm[];
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(hsm); /* buffer b: W at s0 + 2 b CH D 2, K after it */
    float *Ub = (float *)(hsm + 4 * CH * D * 2), *S = Ub + 2 * CH * LDS;
    const uint32_t sSb = (uint32_t)__cvta_generic_to_shared(S + D * LDS), sVb = sSb + D * ATT_ROW_ELEMS(HB) * 2;
    const int h = blockIdx.y, col0 = blockIdx.x * HB, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gr = lane >> 2, gc2 = 2 * (lane & 3); /* accumulator rows gr, gr + 8, columns gc2, gc2 + 1 */
    float *Sg = (states ? states + (int64_t)seq[0] * g.nv * D * D : in.S) + (int64_t)h * D * D;
    /* the first segment starts from zero at position 0, else (a prompt chunk after others) from the sequence's state;
       a later segment from the state the previous one left */
    const bool fresh = first && (!states || !pos || pos[0] == 0);
    for (int i = tid; i < D * HB / 2; i += blockDim.x) {
        const int r = i / (HB / 2), j = 2 * (i % (HB / 2));
        const float a = fresh ? 0.0f : Sg[(int64_t)r * D + col0 + j],
                    b = fresh ? 0.0f : Sg[(int64_t)r * D + col0 + j + 1];
        S[r * LDS + j] = a, S[r * LDS + j + 1] = b;
        st_pair32(sSb, r, j, a, b);
    }
    /* ldmatrix rows: A and the .trans B operands read row lane & 15, chunk + lane / 16; K^T (A by .trans) reads rows
       (lane & 7) + 8 (lane / 16), chunk + (lane / 8) % 2 (attention_mma.cuh's two lane patterns) */
    const att_lane la128 = att_lane_init<D>(lane & 15, lane >> 4);
    const int lr = lane & 15, lc = lane >> 4, kr = (lane & 7) + ((lane >> 4) << 3), kc = (lane >> 3) & 1;
    hpass_stage(in, unit(0, h, g.nv), col0, s0, s0 + CH * D * 2, Ub);
    for (int cl = 0; cl < n_chunks; cl++) {
        const int b = cl & 1;
        const int64_t u = unit(cl, h, g.nv);
        const uint32_t sW = s0 + 2 * b * CH * D * 2, sK = sW + CH * D * 2;
        const float *Us = Ub + b * CH * LDS;
        if (cl + 1 < n_chunks) { /* buffer b ^ 1 was chunk cl - 1's: every warp passed the barrier after its use */
            const uint32_t sn = s0 + 2 * (b ^ 1) * CH * D * 2;
            hpass_stage(in, unit(cl + 1, h, g.nv), col0, sn, sn + CH * D * 2, Ub + (b ^ 1) * CH * LDS);
            att_cp_wait<1>();
        } else {
            att_cp_wait_all();
        }
        __syncthreads(); /* chunk cl's tiles and the state after chunk cl - 1 */
        bf16 *Sc = (bf16 *)(in.Sc + u * D * D), *Vc = Sc + D * D; /* bf16 [128][128], then v' [64][128] */
        for (int i = tid; i < D * HB / 8; i += blockDim.x) {      /* the state before chunk cl, for gdn_tc_out */
            const int r = i / (HB / 8), ch = i % (HB / 8);
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(sSb + att_off<HB>(r, ch))
                         : "memory");
            *(uint4 *)(Sc + (int64_t)r * D + col0 + 8 * ch) = v;
        }
        { /* W S, then v' */
            const int mt = warp >> 1, dp = warp & 1;
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4], bq[4];
                att_ldsm_x4(a, sW + att_lane_off<D>(&la128, 16 * mt, kk));
                att_ldsm_x4_t(bq, sSb + att_off<HB>(16 * kk + lr, 2 * dp + lc));
                att_mma(acc[0], a, bq[0], bq[1]);
                att_mma(acc[1], a, bq[2], bq[3]);
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = 16 * mt + gr + 8 * hf, j = 16 * dp + 8 * n + gc2;
                    const float v0 = Us[r * LDS + j] - acc[n][2 * hf], v1 = Us[r * LDS + j + 1] - acc[n][2 * hf + 1];
                    st_pair32(sVb, r, j, v0, v1);
                    act_store_pair(Vc + (int64_t)r * D + col0 + j, v0, v1);
                }
        }
        __syncthreads(); /* v' complete; the bf16 state read */
        {                /* S' = e^(G_last) S + K^T v' on rows 16 w .. 16 w + 15 */
            const float eg = in.eg[u];
            float acc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = 16 * warp + gr + 8 * hf, j = 8 * n + gc2;
                    acc[n][2 * hf] = eg * S[r * LDS + j], acc[n][2 * hf + 1] = eg * S[r * LDS + j + 1];
                }
#pragma unroll
            for (int ks = 0; ks < CH / 16; ks++) {
                uint32_t a[4];
                att_ldsm_x4_t(a, sK + att_off<D>(16 * ks + kr, 2 * warp + kc));
#pragma unroll
                for (int dp = 0; dp < 2; dp++) {
                    uint32_t bq[4];
                    att_ldsm_x4_t(bq, sVb + att_off<HB>(16 * ks + lr, 2 * dp + lc));
                    att_mma(acc[2 * dp], a, bq[0], bq[1]);
                    att_mma(acc[2 * dp + 1], a, bq[2], bq[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = 16 * warp + gr + 8 * hf, j = 8 * n + gc2;
                    S[r * LDS + j] = acc[n][2 * hf], S[r * LDS + j + 1] = acc[n][2 * hf + 1];
                    st_pair32(sSb, r, j, acc[n][2 * hf], acc[n][2 * hf + 1]);
                }
        }
        __syncthreads(); /* the new state; W, K, U of buffer b and v' read */
    }
    state_pass_end(S, col0, Sg);
}

/* The split pass's outputs, on bf16 mma.sync m16n8k16: grid (chunks, heads), 4 warps; block (c, h) stages Q e^G
 * [64][128], Aq [64][64], the state before chunk c [128][128] and v' [64][128] (bf16, written so by the intra kernel
 * and the state pass; 72 KB, 3 blocks per SM) and warp w writes rows 16 w .. 16 w + 15 of o = (Q e^G) S + Aq v' over
 * all 128 columns (Aq lower triangular: w + 1 k-steps), fp32 accumulators (16 n8 tiles). A from row-major tiles by
 * ldmatrix, B from the row-major [k][n] tiles by ldmatrix.trans, the XOR-swizzled layout of attention_mma.cuh. bf16
 * products as FLA's kernels. Floor at T = 2048 (32 heads): 74 MB staged, ~17 us; ncu 32 us (the TF32 WMMA form
 * with its fragments from L2: 151 us, issue-bound on scalar fragment loads). */
template <typename A>
static __global__ __launch_bounds__(128) void gdn_tc_out(tc_scratch in, int64_t T, int64_t c_first, fm_gdn_shape g,
                                                         A *out) {
    extern __shared__ __align__(128) unsigned char osm[];
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(osm), sa = sq + CH * D * 2, ss = sa + CH * CH * 2,
                   sv = ss + D * D * 2;
    const int cl = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t u = unit(cl, h, g.nv);
    const bf16 *Qg = (const bf16 *)(in.Qg + u * CH * D), *Aqg = (const bf16 *)(in.Aq + u * CH * CH);
    const bf16 *Sc = (const bf16 *)(in.Sc + u * D * D), *Vc = Sc + D * D;
    for (int i = tid; i < CH * D / 8; i += 128) { /* 16-byte chunks: Q e^G and v' (16 a row), Aq (8), S (16) */
        att_cp16(sq + att_off<D>(i / 16, i % 16), Qg + 8 * i, 16);
        att_cp16(sv + att_off<D>(i / 16, i % 16), Vc + 8 * i, 16);
    }
    for (int i = tid; i < CH * CH / 8; i += 128) att_cp16(sa + att_off<CH>(i / 8, i % 8), Aqg + 8 * i, 16);
    for (int i = tid; i < D * D / 8; i += 128) att_cp16(ss + att_off<D>(i / 16, i % 16), Sc + 8 * i, 16);
    att_cp_commit();
    att_cp_wait_all();
    __syncthreads();
    const att_lane l128 = att_lane_init<D>(lane & 15, lane >> 4), l64 = att_lane_init<CH>(lane & 15, lane >> 4);
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        att_ldsm_x4(a, sq + att_lane_off<D>(&l128, 16 * warp, kk));
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            att_ldsm_x4_t(b, ss + att_lane_off<D>(&l128, 16 * kk, dp));
            att_mma(acc[2 * dp], a, b[0], b[1]);
            att_mma(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
    tril_rows_mma(sa, sv, warp, l64, l128, acc);
    const int64_t t0 = (c_first + cl) * CH + 16 * warp + (lane >> 2), ld_out = (int64_t)g.nv * D;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int64_t t = t0 + 8 * hf;
        if (t >= T) continue;
        A *o = out + t * ld_out + (int64_t)h * D + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < D / 8; n++) act_store_pair(o + 8 * n, acc[n][2 * hf], acc[n][2 * hf + 1]);
    }
}

extern "C" void fm_cuda_gdn_chunked_tc(const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                       int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                       const int32_t *tok_pos, void *ws, void *out, cudaStream_t s) {
    if (!fm_gdn_tc_takes(g.dk, g.dv, true) || g.nk < 1 || g.nv % g.nk != 0) {
        fprintf(stderr, "fp8moe: cuda gdn_chunked (tensor cores): shape dk %d dv %d is not dk = dv = %d\n", g.dk, g.dv,
                FM_GDN_TC_DIM);
        abort();
    }
    if (T <= 0) return;
    static bool attributes_set = false; /* once per process: the kernels' shared memory above 48 KB */
    if (!attributes_set) {
        const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
        FM_CUDA_CHECK(cudaFuncSetAttribute(gdn_tc_intra16, smem, INTRA16_SMEM));
        FM_CUDA_CHECK(cudaFuncSetAttribute(gdn_tc_hpass, smem, HPASS_SMEM));
        FM_CUDA_CHECK(cudaFuncSetAttribute(gdn_tc_out<bf16>, smem, OPASS_SMEM));
        attributes_set = true;
    }
    const uint64_t n = fm_gdn_tc_seg_units((uint64_t)T, (uint64_t)g.nv);
    float *base = (float *)ws;
    tc_scratch sc;
    sc.W = base, sc.U = sc.W + n * CH * D, sc.Qg = sc.U + n * CH * D, sc.Kg = sc.Qg + n * CH * D;
    sc.Aq = sc.Kg + n * CH * D, sc.eg = sc.Aq + n * CH * CH, sc.Sc = sc.eg + (n + 63) / 64 * 64;
    sc.S = sc.Sc + n * D * D;
    const int64_t chunks = fm_ceil_div(T, CH);
    for (int64_t c0 = 0; c0 < chunks; c0 += FM_GDN_TC_SEG_CHUNKS) {
        const int nc = (int)(chunks - c0 < FM_GDN_TC_SEG_CHUNKS ? chunks - c0 : FM_GDN_TC_SEG_CHUNKS);
        const dim3 grid((unsigned)nc, (unsigned)g.nv);
        const bf16 *q = (const bf16 *)qkv, *b = (const bf16 *)ba, *al = (const bf16 *)a_log,
                   *dt = (const bf16 *)dt_bias;
        gdn_tc_intra16<<<grid, 256, INTRA16_SMEM, s>>>(q, b, al, dt, T, c0, g, sc);
        FM_LAUNCH_CHECK("gdn_chunked_tc intra");
        gdn_tc_hpass<<<dim3(D / 32, (unsigned)g.nv), 256, HPASS_SMEM, s>>>(sc, nc, g, states, tok_seq, tok_pos,
                                                                           c0 == 0);
        FM_LAUNCH_CHECK("gdn_chunked_tc states");
        gdn_tc_out<bf16><<<dim3((unsigned)nc, (unsigned)g.nv), 128, OPASS_SMEM, s>>>(sc, T, c0, g, (bf16 *)out);
        FM_LAUNCH_CHECK("gdn_chunked_tc outputs");
    }
}
