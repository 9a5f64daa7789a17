// A decode step's Gated DeltaNet in one kernel (backend.h gdn_decode_fused, route decode.fused): the conv update +
// SiLU, the q/k L2 norms, the recurrent delta rule with its readout, and the gated RMSNorm, for rows that are each a
// token of their own sequence (or padding rows, gdn.cuh). The chain it replaces is gdn.cu's conv (+ its state kernel
// when T > 1), rule and norm_gate kernels: 3 launches at T = 1, 4 above.
//
// Grid (key heads, rows); a block owns key head kh of row t: the conv channels of its q and k (2 dk) and of its r =
// nv / nk value heads' v (r dv), and those r heads' states. The key head, not the value head, is the unit because its
// q and k conv states are read and rewritten by the step: two blocks sharing them would race (no order between
// blocks). Data dependencies inside the block, each a barrier: conv outputs -> q/k norms -> S^T k (summed over the
// state rows) -> S^T q -> the head's output row -> its RMSNorm. Nothing between them leaves the chip: the chain's conv
// output and rule output (T x 8 KB + T x 8 KB at Qwen3-Next) are neither written nor read back.
//
// Threads: per value head 4 x dvp (dvp = dv rounded up to 32): thread (w, col) holds state rows w, w + 4, ... of
// column col in registers (32 floats at dk = 128), the rule's map of gdn.cu (a warp per 4th row there, a lane per
// column), so the two sums over rows are the same partial sums added in the same order; hpar value heads side by side
// (two at Qwen3-Next: 1024 threads). Every value is rounded where the chain stores it (the conv output and the rule's
// output to the activation type), and the norm takes the chain's order of summation (the bf16 x4 map at dv = 128, the
// lane-strided one otherwise), so the outputs and both states are the chain's bit for bit.
//
// Floor: the recurrent state, read and written once (2 x 64 KB per value head and sequence, fp32): 4 MB a layer per
// sequence at Qwen3-Next, ~1 us at B = 1 and 62 us at B = 64 over 4.25 TB/s; at B = 1 only nk = 16 blocks run, so it
// is their latency, not the bandwidth (bench/NOTES.md 2026-12-05, "Qwen3-Next's decode step, fused").
#include "backend/cuda/gdn.cuh"
#include "backend/cuda/gdn_device.cuh"

#define DEC_MAX_DK 128 /* state rows per thread: DEC_MAX_DK / GDN_RULE_PARTS registers */
#define DEC_MAX_DV 128
#define DEC_MAX_KERNEL 8    /* the conv's taps (its new state held in registers) */
#define DEC_MAX_THREADS 512 /* 128 registers a thread: a head's state and the next one's in flight */
#define DEC_ROWS (DEC_MAX_DK / GDN_RULE_PARTS)
#define DEC_SMEM_MAX (48 * 1024)

typedef __nv_bfloat16 bf16;

/* v rounded as a store of the activation type rounds it (the chain's intermediate buffers) */
template <typename A> static __device__ __forceinline__ float act_rounded(float v) {
    A x;
    act_store(&x, v);
    return act_load(x);
}

/* the state rows w, w + 4, ... of column col of one value head (zero for a fresh sequence, or off the head) */
static __device__ __forceinline__ void load_state(float (&S)[DEC_ROWS], const float *Sg, int dk, int dv, int w, int col,
                                                  bool on) {
#pragma unroll
    for (int q = 0; q < DEC_ROWS; q++) {
        const int i = w + GDN_RULE_PARTS * q;
        S[q] = on && i < dk ? Sg[i * dv + col] : 0.0f; /* 32-bit offsets: no 64-bit address per row kept */
    }
}

/* dynamic shared memory: xs [2 dk + r dv] (the conv outputs of the block's channels, q | k | v of its r heads, as
   rounded), part [hpar][4][dvp] (the row groups' partial sums), core [hpar][dvp] (the heads' outputs, as rounded) */
static size_t dec_smem_bytes(fm_gdn_shape g, int dvp, int hpar) {
    const int r = g.nv / g.nk;
    return (size_t)(2 * g.dk + r * g.dv + hpar * GDN_RULE_PARTS * dvp + hpar * dvp) * sizeof(float);
}

/* KW: the chain's conv window (4 or 8 taps: gdn_conv_window_kernel); norm_x4: the chain's norm runs
   gdn_norm_gate_bf16x4_kernel's order of summation */
template <typename A, int KW>
static __global__ __launch_bounds__(DEC_MAX_THREADS) void gdn_decode_kernel(
    const A *qkvz, const A *ba, const A *conv_w, int64_t conv_ld, const A *a_log, const A *dt_bias, const A *norm_w,
    fm_gdn_shape g, float eps, float *conv_states, float *rec_states, const int32_t *seq, const int32_t *pos,
    bool norm_x4, A *out) {
    extern __shared__ float sm[];
    __shared__ float red[2][GDN_RULE_PARTS];
    const int dk = g.dk, dv = g.dv, r = g.nv / g.nk, K = g.kernel;
    const int dvp = (dv + 31) & ~31, per_head = GDN_RULE_PARTS * dvp, hpar = (int)blockDim.x / per_head;
    const int kh = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const int hs = tid / per_head, w = (tid % per_head) / dvp, col = tid % dvp;
    const bool has_col = col < dv;
    const int64_t t = blockIdx.y, C = gdn_channels(g), key = (int64_t)g.nk * dk;
    const int64_t Wg = 2 * (int64_t)dk + 2 * (int64_t)r * dv; /* a key head's group of qkvz columns */
    const int nch = 2 * dk + r * dv;
    float *xs = sm, *part = xs + nch, *core = part + hpar * GDN_RULE_PARTS * dvp;
    const A *grp = qkvz + t * gdn_qkvz_width(g) + kh * Wg; /* q | k | v (r heads) | z (r heads) */
    const bool pad = is_padding(seq, pos, t);              /* changes no state; its output is the chain's */
    const int64_t p = pos[t];
    const bool fresh = p == 0;
    float *rec = rec_states + (int64_t)seq[t] * g.nv * dk * dv; /* the sequence's [nv][dk][dv] */

    /* the first heads' states in flight while the conv runs; later, the next heads' while these compute */
    float S[DEC_ROWS], next[DEC_ROWS];
    load_state(next, rec + (int64_t)(kh * r + hs) * dk * dv + col, dk, dv, w, 0, !pad && !fresh && hs < r && has_col);

    /* the conv + SiLU of the block's channels (the chain's gdn_conv at a row that starts its run: the taps before the
       token from the sequence's state, zero before position 0), and their new state: the last K - 1 inputs */
    float *hist = conv_states + (int64_t)seq[t] * (K - 1) * C;
    for (int ch = tid; ch < nch; ch += blockDim.x) {
        if (pad) { /* a finite input for the discarded rule below */
            xs[ch] = 0.0f;
            continue;
        }
        const int64_t c = ch < dk       ? kh * dk + ch
                          : ch < 2 * dk ? key + kh * dk + (ch - dk)
                                        : 2 * key + (int64_t)kh * r * dv + (ch - 2 * dk);
        const A *wc = conv_w + c * conv_ld;
        /* gdn_conv_window_kernel's registers and sum, written as it writes them (so that the compiler fuses the same
           products into the same FMAs): index KW - 1 - d holds the tap at distance d, zero taps past the kernel */
        float wr[KW], a[KW];
#pragma unroll
        for (int d = 0; d < KW; d++) wr[KW - 1 - d] = d < K ? act_load(wc[K - 1 - d]) : 0.0f;
        a[KW - 1] = act_load(grp[ch]);
#pragma unroll
        for (int d = 1; d < KW; d++) a[KW - 1 - d] = d >= K || p - d < 0 ? 0.0f : hist[(int64_t)(K - 1 - d) * C + c];
        float acc = wr[KW - 1] * a[KW - 1];
#pragma unroll
        for (int j = 0; j + 1 < KW; j++) acc += wr[j] * a[j];
        xs[ch] = act_rounded<A>(silu_(acc));
        /* the new state: the last K - 1 inputs, oldest first (distance K - 2 - j at j) */
#pragma unroll
        for (int d = 0; d + 1 < KW; d++)
            if (d + 1 < K) hist[(int64_t)(K - 2 - d) * C + c] = a[KW - 1 - d];
    }
    __syncthreads();

    /* the q and k sums of squares of the key head, as gdn_rule_kernel's 4 warps form them (its thread i: element i) */
    if (tid < 32 * GDN_RULE_PARTS) {
        float sq = 0.0f, sk = 0.0f;
        for (int i = tid; i < dk; i += 32 * GDN_RULE_PARTS) {
            const float q = xs[i], k = xs[dk + i];
            sq += q * q, sk += k * k;
        }
        for (int o = 16; o > 0; o >>= 1)
            sq += __shfl_xor_sync(0xffffffffu, sq, o), sk += __shfl_xor_sync(0xffffffffu, sk, o);
        if (lane == 0) red[0][tid >> 5] = sq, red[1][tid >> 5] = sk;
    }
    __syncthreads();
    float sq = 0.0f, sk = 0.0f;
    for (int i = 0; i < GDN_RULE_PARTS; i++) sq += red[0][i], sk += red[1][i];
    const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f), qscale = 1.0f / sqrtf((float)dk);

    const A *bar = ba + t * 2 * (int64_t)g.nv + (int64_t)kh * 2 * r;
    for (int j0 = 0; j0 < r; j0 += hpar) {
        const int j = j0 + hs, h = kh * r + j;
        const bool head = j < r, run = head && !pad && has_col;
        float *Sg = rec + (int64_t)h * dk * dv + col;
#pragma unroll
        for (int q = 0; q < DEC_ROWS; q++) S[q] = next[q];
        if (j0 + hpar < r)
            load_state(next, Sg + (int64_t)hpar * dk * dv, dk, dv, w, 0, j + hpar < r && !pad && !fresh && has_col);
        float beta = 0.0f, decay = 0.0f, v = 0.0f;
        if (head) {
            const float a_exp = expf(act_load(a_log[h])), dtb = act_load(dt_bias[h]);
            beta = 1.0f / (1.0f + expf(-act_load(bar[j])));
            decay = expf(-a_exp * softplus_(act_load(bar[r + j]) + dtb));
            v = has_col ? xs[2 * dk + j * dv + col] : 0.0f;
        }
        float *my_part = part + (hs * GDN_RULE_PARTS) * dvp + col;
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
        my_part[w * dvp] = u;
        __syncthreads();
        u = 0.0f;
        for (int i = 0; i < GDN_RULE_PARTS; i++) u += my_part[i * dvp];
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
        __syncthreads(); /* every thread has read part */
        my_part[w * dvp] = o;
        __syncthreads();
        if (w == 0 && head && has_col) {
            o = 0.0f;
            for (int i = 0; i < GDN_RULE_PARTS; i++) o += my_part[i * dvp];
            core[hs * dvp + col] = pad ? 0.0f : act_rounded<A>(o); /* the rule writes 0 for a padding row */
        }
        if (run) {
#pragma unroll
            for (int q = 0; q < DEC_ROWS; q++) {
                const int i = w + GDN_RULE_PARTS * q;
                if (i < dk) Sg[i * dv] = S[q];
            }
        }
        __syncthreads();

        /* the gated RMSNorm of head h's row: its first warp */
        if (head && tid % per_head < 32) {
            const float *x = core + hs * dvp;
            const A *z = grp + 2 * dk + r * dv + j * dv;
            A *y = out + (t * g.nv + h) * dv;
            float ss = 0.0f;
            if (norm_x4) { /* dv = 128: lane's 4 adjacent columns, summed as gdn_norm_gate_bf16x4_kernel sums them */
                const float x0 = x[4 * lane], x1 = x[4 * lane + 1], x2 = x[4 * lane + 2], x3 = x[4 * lane + 3];
                ss = x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3;
            } else {
                for (int e = lane; e < dv; e += 32) ss += x[e] * x[e];
            }
            for (int o2 = 16; o2 > 0; o2 >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o2);
            const float inv = 1.0f / sqrtf(norm_x4 ? ss / 128.0f + eps : ss / (float)dv + eps);
            if (norm_x4) {
                for (int e = 4 * lane; e < 4 * lane + 4; e++)
                    act_store(y + e, act_load(norm_w[e]) * (x[e] * inv) * silu_(act_load(z[e])));
            } else {
                for (int e = lane; e < dv; e += 32)
                    act_store(y + e, act_load(norm_w[e]) * (x[e] * inv) * silu_(act_load(z[e])));
            }
        }
        __syncthreads(); /* part and core are rewritten by the next heads */
    }
}

extern "C" bool fm_cuda_gdn_decode_fused(bool f32, const void *qkvz, const void *ba, const void *conv_w,
                                         int64_t conv_ld, const void *a_log, const void *dt_bias, const void *norm_w,
                                         int64_t T, fm_gdn_shape g, float eps, float *conv_states, float *rec_states,
                                         const int32_t *tok_seq, const int32_t *tok_pos, const void *qkv,
                                         const void *core, void *out, cudaStream_t s) {
    if (g.nk < 1 || g.nv % g.nk != 0 || g.dk < 1 || g.dk > DEC_MAX_DK || g.dv < 1 || g.dv > DEC_MAX_DV ||
        g.kernel < 1 || g.kernel > DEC_MAX_KERNEL || T > 65535)
        return false;
    const int r = g.nv / g.nk, dvp = (g.dv + 31) & ~31, per_head = GDN_RULE_PARTS * dvp;
    const int hpar = r < DEC_MAX_THREADS / per_head ? r : DEC_MAX_THREADS / per_head;
    const size_t smem = dec_smem_bytes(g, dvp, hpar);
    if (smem > DEC_SMEM_MAX) return false;
    if (T <= 0) return true;
    /* the chain's own choices, from the same predicates (gdn.cu: conv and fm_cuda_gdn_norm_gate), on the buffers the
       chain would have used (qkv: the conv's output, core: the rule's); its conv must be the window kernel, whose
       sums this kernel repeats */
    const size_t as = f32 ? sizeof(float) : sizeof(bf16);
    const bool pairs = g.dk % 2 == 0 && g.dv % 2 == 0 && ((uintptr_t)qkvz | (uintptr_t)qkv) % (2 * as) == 0;
    if (!pairs) return false;
    const bool aligned = ((uintptr_t)core | (uintptr_t)qkvz | (uintptr_t)norm_w | (uintptr_t)out) % 8 == 0;
    const bool norm_x4 = !f32 && g.dv == 128 && g.dk % 4 == 0 && gdn_qkvz_width(g) % 4 == 0 && aligned;
    const dim3 grid((unsigned)g.nk, (unsigned)T);
    const unsigned threads = (unsigned)(hpar * per_head);
    if (f32) {
        const float *z = (const float *)qkvz, *b = (const float *)ba, *cw = (const float *)conv_w;
        const float *al = (const float *)a_log, *dt = (const float *)dt_bias, *nw = (const float *)norm_w;
        if (g.kernel <= 4)
            gdn_decode_kernel<float, 4><<<grid, threads, smem, s>>>(z, b, cw, conv_ld, al, dt, nw, g, eps, conv_states,
                                                                    rec_states, tok_seq, tok_pos, false, (float *)out);
        else
            gdn_decode_kernel<float, 8><<<grid, threads, smem, s>>>(z, b, cw, conv_ld, al, dt, nw, g, eps, conv_states,
                                                                    rec_states, tok_seq, tok_pos, false, (float *)out);
    } else {
        const bf16 *z = (const bf16 *)qkvz, *b = (const bf16 *)ba, *cw = (const bf16 *)conv_w;
        const bf16 *al = (const bf16 *)a_log, *dt = (const bf16 *)dt_bias, *nw = (const bf16 *)norm_w;
        if (g.kernel <= 4)
            gdn_decode_kernel<bf16, 4><<<grid, threads, smem, s>>>(z, b, cw, conv_ld, al, dt, nw, g, eps, conv_states,
                                                                   rec_states, tok_seq, tok_pos, norm_x4, (bf16 *)out);
        else
            gdn_decode_kernel<bf16, 8><<<grid, threads, smem, s>>>(z, b, cw, conv_ld, al, dt, nw, g, eps, conv_states,
                                                                   rec_states, tok_seq, tok_pos, norm_x4, (bf16 *)out);
    }
    FM_LAUNCH_CHECK("gdn_decode_fused");
    return true;
}
