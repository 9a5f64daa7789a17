// A decode step's Gated DeltaNet in one kernel (backend.h gdn_decode_fused, route decode.fused): the conv update +
// SiLU, the q/k L2 norms, the recurrent delta rule with its readout, and the gated RMSNorm, for rows that are each a
// token of their own sequence (or padding rows, gdn.cuh). The chain it replaces is gdn.cu's conv (+ its state kernel
// when T > 1), rule and norm_gate kernels: 3 launches at T = 1, 4 above.
//
// Grid (dv / 32, value heads, rows), the rule kernel's: a block of 4 warps owns 32 state columns of value head h at
// row t, as gdn_rule_kernel does (128 blocks at B = 1 for Qwen3-Next; a block per key head, the first version, ran
// 16 and lost to the chain: bench/NOTES.md 2026-12-05). Each block repeats the conv of its key head's q and k channels
// (2 dk channels of K taps, from L2 after the first block) and computes its own 32 v channels, so nothing but the
// state's columns is split. Thread (w, lane) holds state rows w, w + 4, ... of column lane in registers (32 floats at
// dk = 128): the rule's map, so the two sums over rows are its partial sums added in its order.
//
// Two things need the whole key head, and are left to its last block to arrive (a counter per (row, key head) in
// `arrivals`, counted up by every block once it is done, reset to zero by the last one: graph safe, no memset):
// - the q and k conv states: every block of the key head reads them, so none may rewrite them before all have; the
//   last block writes the new ones (kept in shared memory by every block). Each v conv state element has one reader
//   and writer, its block, which rewrites it at once.
// - the gated RMSNorm of a value head's row, which sums over all dv columns: each block stores its rounded outputs
//   to `core` (the chain's rule output buffer, as the chain stores them), and the last block of the key head reads
//   its r heads' rows back from L2 and normalises them, a warp a head, with the chain's norm code and order (the bf16
//   x4 map at dv = 128, the lane-strided one otherwise). The other choice, the norm as a second kernel, costs a
//   dependent launch (~2 us under a graph, measured in the fourteenth session) plus that kernel's own round trip to
//   memory; the tail costs the fence, one atomic and one L2 round trip in one block per key head (~1-1.5 us), so it
//   is the shorter path at B = 1, where latency is all there is.
// Every value is rounded where the chain stores it, so the outputs and both states are the chain's bit for bit.
//
// Floor: the recurrent state, read and written once (2 x 64 KB per value head and sequence, fp32): 4 MB a layer per
// sequence at Qwen3-Next, ~1 us at B = 1 and 62 us at B = 64 over 4.25 TB/s.
//
// Programmatic dependent launch (pdl.cuh, `pdl`): the kernel lets the next one start and waits for the earlier ones
// at its top. Its small weights (conv taps, a_log, dt_bias, the norm's) are read inside the conv and the rule, next
// to activations. Before the wait it may (routes gdn.decode_ba, gdn.early_state):
// - compute its value head's two in_proj_ba rows (b, a) of the normed row h, where a cuBLAS GEMM ran between the
//   qkvz projection and this kernel: the weights are constant and h was written two launches back (the launch in
//   between, the qkvz projection, released this one only after its own wait), so both load through L2 while the qkvz
//   projection ends. Each block of the head repeats the two dot products (8 KB of weights from L2 after the first);
//   the order of summation is ba_dots' below, which the op test repeats on the host;
// - issue its recurrent state loads: a decode step's state was written by this layer's kernel in an earlier step.
#include "backend/cuda/gdn.cuh"
#include "backend/cuda/gdn_device.cuh"
#include "backend/cuda/pdl.cuh"

#define DEC_MAX_DK 128   /* state rows per thread: DEC_MAX_DK / GDN_RULE_PARTS registers */
#define DEC_MAX_KERNEL 8 /* the conv's taps (the window kernel's largest) */
#define DEC_COLS 32      /* state columns a block: a lane each */
#define DEC_THREADS (32 * GDN_RULE_PARTS)
#define DEC_ROWS (DEC_MAX_DK / GDN_RULE_PARTS)
/* blocks an SM holds: bf16, 6 (80 registers, no spill; 116 without the bound, 4 blocks), so that at B = 64 more
   blocks' state loads are in flight; fp32 (the ref32 oracle) spills under that bound, and keeps the compiler's */
#define DEC_MIN_BLOCKS(A) (sizeof(A) == 2 ? 6 : 1)

typedef __nv_bfloat16 bf16;

/* eight consecutive values as floats, 16-byte loads: weights through the read-only path, an earlier kernel's row
   through L2 (pdl.cuh: never ld.global.nc for those) */
static __device__ __forceinline__ void load8(const bf16 *p, bool l2, float (&v)[8]) {
    const uint4 u = l2 ? __ldcg((const uint4 *)p) : __ldg((const uint4 *)p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void load8(const float *p, bool l2, float (&v)[8]) {
    const float4 a = l2 ? __ldcg((const float4 *)p) : __ldg((const float4 *)p);
    const float4 b = l2 ? __ldcg((const float4 *)p + 1) : __ldg((const float4 *)p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* The block's b and a sums of one row (route gdn.decode_ba): wb, wa the two in_proj_ba rows, x the normed row, H a
   multiple of 8. The order (test_cuda_ops_fused.c's host_ba repeats it): thread tid sums the
   elements c * 8 DEC_THREADS + 8 tid + i (c = 0, 1, ..., i = 0..7) by fmaf in that order from 0; each warp's 32 sums
   are added by the xor butterfly over lane distances 16, 8, 4, 2, 1; lane 0 of warp w leaves them in red[.][w]. */
template <typename A>
static __device__ __forceinline__ void ba_dots(const A *wb, const A *wa, const A *x, int64_t H,
                                               float (&red)[2][GDN_RULE_PARTS]) {
    float b = 0.0f, a = 0.0f;
    for (int64_t e = 8 * (int64_t)threadIdx.x; e < H; e += 8 * DEC_THREADS) {
        float xv[8], wv[8];
        load8(x + e, true, xv);
        load8(wb + e, false, wv);
#pragma unroll
        for (int i = 0; i < 8; i++) b = fmaf(wv[i], xv[i], b);
        load8(wa + e, false, wv);
#pragma unroll
        for (int i = 0; i < 8; i++) a = fmaf(wv[i], xv[i], a);
    }
    for (int o = 16; o > 0; o >>= 1) b += __shfl_xor_sync(0xffffffffu, b, o), a += __shfl_xor_sync(0xffffffffu, a, o);
    if ((threadIdx.x & 31) == 0) red[0][threadIdx.x >> 5] = b, red[1][threadIdx.x >> 5] = a;
}

/* v rounded as a store of the activation type rounds it (the chain's intermediate buffers) */
template <typename A> static __device__ __forceinline__ float act_rounded(float v) {
    A x;
    act_store(&x, v);
    return act_load(x);
}

/* a value another block wrote in this launch: through L2 (no stale L1 line) */
static __device__ __forceinline__ float act_load_l2(const float *p) { return __ldcg(p); }
static __device__ __forceinline__ float act_load_l2(const bf16 *p) { return __bfloat162float(__ldcg(p)); }

/* the state rows w, w + 4, ... of one column (Sg: its row 0), zero for a fresh sequence or off the head; l2: through
   L2 (before the PDL wait: an earlier kernel wrote them) */
static __device__ __forceinline__ void load_state(float (&S)[DEC_ROWS], const float *Sg, int dk, int dv, int w, bool on,
                                                  bool l2) {
#pragma unroll
    for (int q = 0; q < DEC_ROWS; q++) {
        const int i = w + GDN_RULE_PARTS * q;
        /* 32-bit offsets: no 64-bit address per row kept */
        S[q] = on && i < dk ? (l2 ? __ldcg(Sg + i * dv) : Sg[i * dv]) : 0.0f;
    }
}

/* the gated RMSNorm of one head's row x (rounded rule outputs in core) by one warp, as gdn.cu's norm kernels compute
   it: norm_x4, gdn_norm_gate_bf16x4_kernel's map (lane's 4 adjacent columns, dv = 128), else the lane-strided one */
template <typename A>
static __device__ __forceinline__ void norm_row(const A *x, const A *z, const A *norm_w, int dv, float eps,
                                                bool norm_x4, A *y, uint8_t *q8, float *qs, int64_t t, int h, int64_t M,
                                                int64_t K) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    if (norm_x4) {
        const float x0 = act_load_l2(x + 4 * lane), x1 = act_load_l2(x + 4 * lane + 1);
        const float x2 = act_load_l2(x + 4 * lane + 2), x3 = act_load_l2(x + 4 * lane + 3);
        ss = x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3;
    } else {
        for (int e = lane; e < dv; e += 32) {
            const float v = act_load_l2(x + e);
            ss += v * v;
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(norm_x4 ? ss / 128.0f + eps : ss / (float)dv + eps);
    if (!norm_x4) {
        for (int e = lane; e < dv; e += 32)
            act_store(y + e, act_load(norm_w[e]) * (act_load_l2(x + e) * inv) * silu_(act_load(z[e])));
        return;
    }
    float o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int e = 4 * lane + i;
        o[i] = act_load(norm_w[e]) * (act_load_l2(x + e) * inv) * silu_(act_load(z[e]));
        act_store(y + e, o[i]);
    }
    if constexpr (sizeof(A) == 2) /* bf16 rows at dv = 128: the head is a 128-group of the out projection's row */
        if (q8)
            gdn_quantize_head(__floats2bfloat162_rn(o[0], o[1]), __floats2bfloat162_rn(o[2], o[3]), t, h, M, K, q8, qs);
}

/* the key head kh's r value heads' rows of row t normalised, a warp a head (the last block's tail), with q8 (route
   dense.quant=producer) each head quantized for the out projection. Out of line, so that the rule keeps its
   registers under the bound: inline, the quantizer's code made the bf16 4-tap kernel spill 184 bytes; the call costs
   12 bytes of saved registers there (ptxas, nvcc 13.0) */
template <typename A>
static __device__ __noinline__ void norm_heads(const A *core, const A *grp, const A *norm_w, fm_gdn_shape g, float eps,
                                               bool norm_x4, A *out, uint8_t *q8, int64_t t, int kh) {
    const int r = g.nv / g.nk, dk = g.dk, dv = g.dv;
    const int64_t M = gridDim.z, K = (int64_t)g.nv * dv;
    float *qs = q8 ? (float *)(q8 + M * K) : NULL; /* fm_qrows: the scales after the codes (K a multiple of 128) */
    for (int jj = threadIdx.x >> 5; jj < r; jj += GDN_RULE_PARTS) {
        const int64_t row = (t * g.nv + (int64_t)kh * r + jj) * dv;
        norm_row<A>(core + row, grp + 2 * dk + r * dv + jj * dv, norm_w, dv, eps, norm_x4, out + row, q8, qs, t,
                    kh * r + jj, M, K);
    }
}

/* KW: the chain's conv window (4 or 8 taps: gdn_conv_window_kernel); norm_x4: the chain's norm runs
   gdn_norm_gate_bf16x4_kernel's order of summation; arrivals [T][nk], zero before the launch and after it. ba_w (NULL:
   ba holds the rows' b | a): the in_proj_ba matrix [2 nv][ba_ld], then b and a come from the normed rows h [T][H]
   (ba_dots); early_state: the state loads before the PDL wait */
template <typename A, int KW>
static __global__ __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS(A)) void gdn_decode_kernel(
    const A *qkvz, const A *ba, const A *ba_w, int64_t ba_ld, const A *h_rows, int64_t H, bool early_state,
    const A *conv_w, int64_t conv_ld, const A *a_log, const A *dt_bias, const A *norm_w, fm_gdn_shape g, float eps,
    float *conv_states, float *rec_states, const int32_t *seq, const int32_t *pos, bool norm_x4, unsigned *arrivals,
    A *core, A *out, uint8_t *q8) {
    __shared__ float xs[2 * DEC_MAX_DK + DEC_COLS];    /* conv outputs as rounded: q | k | the block's v columns */
    __shared__ float qk_state[KW - 1][2 * DEC_MAX_DK]; /* q and k's new conv states (the last block writes them) */
    __shared__ float part[GDN_RULE_PARTS][DEC_COLS];   /* the row groups' partial sums */
    __shared__ float red[2][GDN_RULE_PARTS];
    __shared__ float ba_red[2][GDN_RULE_PARTS]; /* the warps' b and a sums (ba_w) */
    __shared__ bool last;
    const int dk = g.dk, dv = g.dv, r = g.nv / g.nk, K = g.kernel;
    const int h = blockIdx.y, kh = h / r, j = h % r, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int col0 = blockIdx.x * DEC_COLS, col = col0 + lane;
    const bool has_col = col < dv;
    const int64_t t = blockIdx.z, C = gdn_channels(g), key = (int64_t)g.nk * dk;
    const int64_t Wg = 2 * (int64_t)dk + 2 * (int64_t)r * dv; /* a key head's group of qkvz columns */
    const A *grp = qkvz + t * gdn_qkvz_width(g) + kh * Wg;    /* q | k | v (r heads) | z (r heads) */
    /* the sequences and positions are the host's (staged before the step), read before the wait */
    const bool pad = is_padding(seq, pos, t); /* changes no state; its output is the chain's */
    const int64_t p = pos[t];
    float *Sg = rec_states + ((int64_t)seq[t] * g.nv + h) * dk * dv + col; /* column col of the head's [dk][dv] */
    float *hist = conv_states + (int64_t)seq[t] * (K - 1) * C;
    const bool state_on = !pad && p != 0 && has_col;

    /* before the wait: the b and a sums (gdn.decode_ba), the state's loads (gdn.early_state) */
    if (ba_w) {
        const A *wb = ba_w + (int64_t)(kh * 2 * r + j) * ba_ld;
        ba_dots<A>(wb, wb + (int64_t)r * ba_ld, h_rows + t * H, H, ba_red);
    }
    float S[DEC_ROWS];
    if (early_state) load_state(S, Sg, dk, dv, w, state_on, true);
    pdl_wait();
    /* else the state's loads in flight while the conv runs */
    if (!early_state) load_state(S, Sg, dk, dv, w, state_on, false);

    /* the conv + SiLU of q, k (channels ch < 2 dk) and the block's v columns (the chain's gdn_conv at a row that
       starts its run: the taps before the token from the sequence's state, zero before position 0) */
    for (int ch = tid; ch < 2 * dk + DEC_COLS; ch += DEC_THREADS) {
        const bool is_v = ch >= 2 * dk;
        const int e = is_v ? col0 + ch - 2 * dk : 0; /* a v channel's column in the head */
        if (pad || e >= dv) {                        /* a finite input for the discarded rule below */
            xs[ch] = 0.0f;
            continue;
        }
        const int64_t c = !is_v ? (ch < dk ? kh * dk + ch : key + kh * dk + (ch - dk)) : 2 * key + (int64_t)h * dv + e;
        const A *wc = conv_w + c * conv_ld;
        /* gdn_conv_window_kernel's registers and sum, written as it writes them (so that the compiler fuses the same
           products into the same FMAs): index KW - 1 - d holds the tap at distance d, zero taps past the kernel */
        float wr[KW], a[KW];
#pragma unroll
        for (int d = 0; d < KW; d++) wr[KW - 1 - d] = d < K ? act_load(wc[K - 1 - d]) : 0.0f;
        a[KW - 1] = act_load(grp[is_v ? 2 * dk + j * dv + e : ch]);
#pragma unroll
        for (int d = 1; d < KW; d++) a[KW - 1 - d] = d >= K || p - d < 0 ? 0.0f : hist[(int64_t)(K - 1 - d) * C + c];
        float acc = wr[KW - 1] * a[KW - 1];
#pragma unroll
        for (int i = 0; i + 1 < KW; i++) acc += wr[i] * a[i];
        xs[ch] = act_rounded<A>(silu_(acc));
        /* the new state: the last K - 1 inputs, oldest first (distance K - 2 - i at i); v's now (this thread alone
           reads it), q's and k's when every block of the key head has read them */
#pragma unroll
        for (int d = 0; d + 1 < KW; d++) {
            if (d + 1 >= K) continue;
            if (is_v) hist[(int64_t)(K - 2 - d) * C + c] = a[KW - 1 - d];
            else qk_state[K - 2 - d][ch] = a[KW - 1 - d];
        }
    }
    __syncthreads();

    /* the q and k sums of squares of the key head, as gdn_rule_kernel's 4 warps form them (its thread i: element i) */
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < dk; i += DEC_THREADS) {
        const float q = xs[i], k = xs[dk + i];
        sq += q * q, sk += k * k;
    }
    for (int o = 16; o > 0; o >>= 1)
        sq += __shfl_xor_sync(0xffffffffu, sq, o), sk += __shfl_xor_sync(0xffffffffu, sk, o);
    if (lane == 0) red[0][w] = sq, red[1][w] = sk;
    __syncthreads();
    sq = 0.0f, sk = 0.0f;
    for (int i = 0; i < GDN_RULE_PARTS; i++) sq += red[0][i], sk += red[1][i];
    const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f), qscale = 1.0f / sqrtf((float)dk);

    /* the rule of gdn_rule_kernel for one token */
    float bv, av; /* the row's b and a of head h, as the linear stores them */
    if (ba_w) {   /* ba_red written before the conv loop's barrier */
        bv = 0.0f, av = 0.0f;
        for (int i = 0; i < GDN_RULE_PARTS; i++) bv += ba_red[0][i], av += ba_red[1][i];
        bv = act_rounded<A>(bv), av = act_rounded<A>(av);
    } else {
        const A *bar = ba + t * 2 * (int64_t)g.nv + (int64_t)kh * 2 * r;
        bv = act_load(bar[j]), av = act_load(bar[r + j]);
    }
    const float a_exp = expf(act_load(a_log[h])), dtb = act_load(dt_bias[h]);
    const float beta = 1.0f / (1.0f + expf(-bv));
    const float decay = expf(-a_exp * softplus_(av + dtb));
    const float v = has_col ? xs[2 * dk + lane] : 0.0f;
    float u = 0.0f;
#pragma unroll
    for (int q = 0; q < DEC_ROWS; q++) {
        const int i = w + GDN_RULE_PARTS * q;
        if (i < dk) {
            const float s = S[q] * decay;
            S[q] = s;
            u += s * (xs[dk + i] * ik);
        }
    }
    part[w][lane] = u;
    __syncthreads();
    u = 0.0f;
    for (int i = 0; i < GDN_RULE_PARTS; i++) u += part[i][lane];
    u = beta * (v - u);
    float o = 0.0f;
#pragma unroll
    for (int q = 0; q < DEC_ROWS; q++) {
        const int i = w + GDN_RULE_PARTS * q;
        if (i < dk) {
            const float s = S[q] + (xs[dk + i] * ik) * u;
            S[q] = s;
            o += s * (xs[i] * iq * qscale);
        }
    }
    __syncthreads(); /* every warp has read part */
    part[w][lane] = o;
    __syncthreads();
    if (w == 0 && has_col) {
        o = 0.0f;
        for (int i = 0; i < GDN_RULE_PARTS; i++) o += part[i][lane];
        act_store(core + (t * g.nv + h) * dv + col, pad ? 0.0f : o); /* the rule writes 0 for a padding row */
    }
    if (!pad && has_col) {
#pragma unroll
        for (int q = 0; q < DEC_ROWS; q++) {
            const int i = w + GDN_RULE_PARTS * q;
            if (i < dk) Sg[i * dv] = S[q];
        }
    }

    /* arrival: this block's outputs visible, its reads of the q/k conv states done (their values are in xs) */
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned *n = arrivals + t * g.nk + kh;
        const bool l = atomicAdd(n, 1u) == (unsigned)(r * gridDim.x) - 1;
        if (l) *n = 0; /* every block of the key head has counted: zero for the next launch */
        last = l;
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); /* the other blocks' outputs, seen after their arrivals */
    if (!pad)
        for (int i = tid; i < (K - 1) * 2 * dk; i += DEC_THREADS) {
            const int d = i / (2 * dk), ch = i % (2 * dk);
            const int64_t c = ch < dk ? kh * dk + ch : key + kh * dk + (ch - dk);
            hist[(int64_t)d * C + c] = qk_state[d][ch];
        }
    norm_heads<A>(core, grp, norm_w, g, eps, norm_x4, out, q8, t, kh);
}

/* the kernel for the activation type A and the conv's taps (4 or 8), the pointers typed */
template <typename A>
static void dec_launch(dim3 grid, const void *qkvz, const void *ba, const fm_gdn_ba *in_ba, bool early_state,
                       const void *conv_w, int64_t conv_ld, const void *a_log, const void *dt_bias, const void *norm_w,
                       fm_gdn_shape g, float eps, float *conv_states, float *rec_states, const int32_t *tok_seq,
                       const int32_t *tok_pos, bool norm_x4, unsigned *arrivals, void *core, void *out, uint8_t *q8,
                       bool pdl, cudaStream_t s) {
    const A *z = (const A *)qkvz, *b = (const A *)ba, *cw = (const A *)conv_w;
    const A *al = (const A *)a_log, *dt = (const A *)dt_bias, *nw = (const A *)norm_w;
    const A *bw = in_ba ? (const A *)in_ba->w : NULL, *hr = in_ba ? (const A *)in_ba->h : NULL;
    const int64_t ld = in_ba ? in_ba->ld : 0, H = in_ba ? in_ba->H : 0;
    if (g.kernel <= 4)
        pdl_launch(gdn_decode_kernel<A, 4>, grid, DEC_THREADS, 0, s, pdl, z, b, bw, ld, hr, H, early_state, cw, conv_ld,
                   al, dt, nw, g, eps, conv_states, rec_states, tok_seq, tok_pos, norm_x4, arrivals, (A *)core,
                   (A *)out, q8);
    else
        pdl_launch(gdn_decode_kernel<A, 8>, grid, DEC_THREADS, 0, s, pdl, z, b, bw, ld, hr, H, early_state, cw, conv_ld,
                   al, dt, nw, g, eps, conv_states, rec_states, tok_seq, tok_pos, norm_x4, arrivals, (A *)core,
                   (A *)out, q8);
}

extern "C" bool fm_cuda_gdn_ba_fits(bool f32, const fm_gdn_ba *in_ba) {
    const size_t as = f32 ? sizeof(float) : sizeof(bf16);
    return in_ba->H > 0 && in_ba->H % 8 == 0 && in_ba->ld >= in_ba->H && (in_ba->ld * as) % 16 == 0 &&
           ((uintptr_t)in_ba->w | (uintptr_t)in_ba->h) % 16 == 0;
}

extern "C" bool fm_cuda_gdn_decode_fused(bool f32, const void *qkvz, const void *ba, const fm_gdn_ba *in_ba,
                                         bool early_state, const void *conv_w, int64_t conv_ld, const void *a_log,
                                         const void *dt_bias, const void *norm_w, int64_t T, fm_gdn_shape g, float eps,
                                         float *conv_states, float *rec_states, const int32_t *tok_seq,
                                         const int32_t *tok_pos, const void *qkv, void *core, unsigned *arrivals,
                                         int64_t arrival_words, void *out, uint8_t *q8, float *qs, bool pdl,
                                         cudaStream_t s) {
    if (g.nk < 1 || g.nv % g.nk != 0 || g.dk < 1 || g.dk > DEC_MAX_DK || g.dv < 1 || g.kernel < 1 ||
        g.kernel > DEC_MAX_KERNEL || T > 65535 || !arrivals || T * g.nk > arrival_words ||
        (in_ba && !fm_cuda_gdn_ba_fits(f32, in_ba)))
        return false;
    if (T <= 0) return true;
    /* the chain's own choices, from the same predicates (gdn.cu: conv and fm_cuda_gdn_norm_gate), on the buffers the
       chain would have used (qkv: the conv's output, core: the rule's); its conv must be the window kernel, whose
       sums this kernel repeats */
    const size_t as = f32 ? sizeof(float) : sizeof(bf16);
    const bool pairs = g.dk % 2 == 0 && g.dv % 2 == 0 && ((uintptr_t)qkvz | (uintptr_t)qkv) % (2 * as) == 0;
    if (!pairs) return false;
    const bool aligned = ((uintptr_t)core | (uintptr_t)qkvz | (uintptr_t)norm_w | (uintptr_t)out) % 8 == 0;
    const bool norm_x4 = !f32 && g.dv == 128 && g.dk % 4 == 0 && gdn_qkvz_width(g) % 4 == 0 && aligned;
    const dim3 grid((unsigned)fm_ceil_div(g.dv, DEC_COLS), (unsigned)g.nv, (unsigned)T);
    if (f32)
        dec_launch<float>(grid, qkvz, ba, in_ba, early_state, conv_w, conv_ld, a_log, dt_bias, norm_w, g, eps,
                          conv_states, rec_states, tok_seq, tok_pos, false, arrivals, core, out, NULL, pdl, s);
    else
        dec_launch<bf16>(grid, qkvz, ba, in_ba, early_state, conv_w, conv_ld, a_log, dt_bias, norm_w, g, eps,
                         conv_states, rec_states, tok_seq, tok_pos, norm_x4, arrivals, core, out, norm_x4 ? q8 : NULL,
                         pdl, s);
    FM_LAUNCH_CHECK("gdn_decode_fused");
    /* the out projection's rows where the norm's warps do not make them (heads other than 128 wide) */
    if (q8 && !f32 && !norm_x4)
        fm_cuda_quantize_e4m3_rows((const bf16 *)out, T, (int64_t)g.nv * g.dv, q8, qs, NULL, T, pdl, s);
    return true;
}
