// The Gated DeltaNet's ops on the GPU (see gdn.cuh for the contract, backend.h for each op, cpu_gdn.c for the
// reference).
//
// conv: a tap before the token reads the row it needs when that row belongs to the same run (rows of the same
//   sequence at consecutive positions), else the sequence's conv state (kernels of <= 8 taps: a thread per channel
//   over 32 rows, its window of inputs sliding in registers; longer ones: a thread per channel and token); a second
//   kernel, once every output has read the old state, writes each sequence's last kernel - 1 inputs at its run's last
//   row. Both fully parallel, so that a fresh prompt of T tokens costs one pass over its q|k|v columns.
// the rule, token by token: a block per (32 state columns, value head, run of a sequence): warp w holds state rows
//   w, w + 4, ... of the block's 32 columns in shared memory (dk x 32 fp32); per token the block normalises q and k,
//   then two cross-warp sums (S^T k and S^T q). Any dk <= 256 and dv (the golden checkpoints have dk 8 and 16, dv 10
//   and 12). gdn_chunked runs the same kernel over its one run (from a zero state at position 0, else from the
//   sequence's state: a prompt chunk after others): the chunked form
//   computes the same recurrence in another order, and its speed on tensor cores is lab/gdn.cu's subject.
// norm_gate: one warp per (token, value head); with q8 (route dense.quant=producer) it also quantizes its rows for the
//   out projection (fm_qrows): at dv = 128 each head is one 128-group, quantized by its warp (gdn_quantize_head);
//   other shapes take the quantizer's launch after it.
//
// Programmatic dependent launch (pdl.cuh, `pdl` of the decode ops' launchers): every kernel lets the next one start at
// its top and waits for the earlier ones before its first activation, state or index load and before any early
// return; the conv window kernel loads its taps and the bf16 norm kernel its weights (no kernel writes them) first.
// The chunked op (prompts) launches normally.
#include "backend/cuda/gdn.cuh"
#include "backend/cuda/gdn_device.cuh"
#include "backend/cuda/pdl.cuh"

#define RULE_WARPS GDN_RULE_PARTS
#define RULE_COLS 32
#define GDN_MAX_DK 256
#define GDN_MAX_KERNEL 64

typedef __nv_bfloat16 bf16;

/* column of channel c (q | k | v order) inside a qkvz row (grouped by key head), as cpu_gdn.c; 32-bit: a row's
   width is far below 2^31, and 64-bit divisions per output made the conv kernel issue-bound (0.88 ms at T = 8192,
   Qwen3-Next's 8192 channels) */
static __device__ __forceinline__ int qkvz_column(fm_gdn_shape g, int c) {
    const int r = g.nv / g.nk, W = 2 * g.dk + 2 * r * g.dv, key = g.nk * g.dk;
    if (c < key) return (c / g.dk) * W + c % g.dk;
    if (c < 2 * key) return ((c - key) / g.dk) * W + g.dk + (c - key) % g.dk;
    const int h = (c - 2 * key) / g.dv, e = (c - 2 * key) % g.dv;
    return (h / r) * W + 2 * g.dk + (h % r) * g.dv + e;
}

/* whether row u (a real row) continues row u - 1's run */
static __device__ __forceinline__ bool continues(const int32_t *seq, const int32_t *pos, int64_t u) {
    return u > 0 && seq[u - 1] == seq[u] && pos[u - 1] == pos[u] - 1 && !is_padding(seq, pos, u - 1);
}
/* how many rows before row t (at most limit) are in its run */
static __device__ int run_back(const int32_t *seq, const int32_t *pos, int64_t t, int limit) {
    int r = 0;
    while (r < limit && continues(seq, pos, t - r)) r++;
    return r;
}

/* the input at distance d before row t (d <= kernel - 1) of channel c: a row of the run, the state, or zero before
   position 0; r = run_back(t) */
template <typename A>
static __device__ __forceinline__ float conv_input(const A *qkvz, int64_t Wz, int64_t col, int64_t t, int d, int r,
                                                   int64_t p, const float *hist, int64_t C, int64_t c, int K) {
    if (d <= r) return act_load(qkvz[(t - d) * Wz + col]);
    if (p - d < 0) return 0.0f;
    return hist[(int64_t)(K - 1 - (d - r)) * C + c]; /* the state's inputs: oldest first, the run's first row next */
}

/* grid (channel blocks, token blocks): thread x of block (bx, by) takes channel 256 bx + x at tokens by, by +
   gridDim.y, ... (its column and weights found once) */
template <typename A>
static __global__ void gdn_conv_kernel(const A *qkvz, const A *w, int64_t ld, int64_t T, fm_gdn_shape g,
                                       const float *states, const int32_t *seq, const int32_t *pos, A *out) {
    pdl_wait();
    const int64_t C = gdn_channels(g), Wz = gdn_qkvz_width(g);
    const int K = g.kernel, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t col = qkvz_column(g, c);
    const A *wc = w + c * ld;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        float acc = act_load(wc[K - 1]) * act_load(qkvz[t * Wz + col]);
        if (!states) {
            for (int j = 0; j < K - 1; j++) {
                const int64_t src = t - (K - 1) + j;
                if (src >= 0) acc += act_load(wc[j]) * act_load(qkvz[src * Wz + col]);
            }
        } else {
            const int r = run_back(seq, pos, t, K - 1);
            const float *hist = states + (int64_t)seq[t] * (K - 1) * C;
            for (int j = 0; j < K - 1; j++)
                acc += act_load(wc[j]) * conv_input(qkvz, Wz, col, t, K - 1 - j, r, pos[t], hist, C, c, K);
        }
        act_store(out + t * C + c, silu_(acc));
    }
}

/* The same outputs for kernels of at most KW taps, a thread per two adjacent channels (one 4-byte load and store
   per row for bf16; even dk and dv keep a pair's columns adjacent) over CONV_ROWS = 32 consecutive rows: a window
   of the last KW inputs in registers slides by one row while the run continues (one load per output), and is
   rebuilt as the kernel above builds it at the block's first row and wherever a run starts. Which rows continue
   their run is found once per block (warp 0, one ballot) instead of by every thread (6 index loads a row). The same
   products summed in the same order as the kernel above (the window's unused taps add 0 * 0). With write_state (one
   block row, T <= CONV_ROWS: the launcher sets it for a single-token step) each thread then writes its own channels'
   new conv states, as gdn_conv_state_kernel does: it alone read them, so no other thread can see the old ones
   replaced (one launch less per Gated DeltaNet layer and step). */
#define CONV_ROWS 32 /* the ballot's 32 lanes */
#define CONV_LOADS 8 /* rows whose loads are in flight together; divides CONV_ROWS */
template <typename A, int KW>
static __global__ void gdn_conv_window_kernel(const A *qkvz, const A *w, int64_t ld, int64_t T, fm_gdn_shape g,
                                              float *states, const int32_t *seq, const int32_t *pos, A *out,
                                              bool write_state) {
    __shared__ uint32_t run_mask; /* bit i: row t0 + i continues row t0 + i - 1 inside the block's rows */
    const int64_t C = gdn_channels(g), Wz = gdn_qkvz_width(g);
    const int K = g.kernel, c = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    const bool active = c < C;
    const int64_t col = active ? qkvz_column(g, c) : 0;
    float wr[2][KW], a[2][KW]; /* index KW - 1 - d: the tap at distance d before the row (d = 0: the row itself) */
#pragma unroll
    for (int v = 0; v < 2; v++)
#pragma unroll
        for (int d = 0; d < KW; d++) wr[v][KW - 1 - d] = active && d < K ? act_load(w[(c + v) * ld + K - 1 - d]) : 0.0f;
    pdl_wait(); /* the taps above are weights; the rows, states and indices below earlier kernels' */
    for (int64_t t0 = (int64_t)blockIdx.y * CONV_ROWS; t0 < T; t0 += (int64_t)gridDim.y * CONV_ROWS) {
        const int64_t t1 = t0 + CONV_ROWS < T ? t0 + CONV_ROWS : T;
        if (threadIdx.x < 32) {
            const int64_t t = t0 + threadIdx.x;
            const bool cont = t < t1 && t > t0 && (!states || continues(seq, pos, t));
            const uint32_t m = __ballot_sync(0xffffffffu, cont);
            if (threadIdx.x == 0) run_mask = m;
        }
        __syncthreads();
        const uint32_t mask = run_mask;
        for (int64_t tb = t0; active && tb < t1; tb += CONV_LOADS) {
            float xs[CONV_LOADS][2]; /* the next rows' inputs in flight together */
#pragma unroll
            for (int i = 0; i < CONV_LOADS; i++) {
                if (tb + i < t1) act_load_pair(qkvz + (tb + i) * Wz + col, xs[i]);
                else xs[i][0] = xs[i][1] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < CONV_LOADS; i++) {
                const int64_t t = tb + i;
                if (t >= t1) break;
                if ((mask >> (t - t0)) & 1u) {
#pragma unroll
                    for (int v = 0; v < 2; v++) {
#pragma unroll
                        for (int j = 0; j + 1 < KW; j++) a[v][j] = a[v][j + 1];
                        a[v][KW - 1] = xs[i][v];
                    }
                } else {
                    const int r = states ? run_back(seq, pos, t, K - 1) : 0;
                    const float *hist = states ? states + (int64_t)seq[t] * (K - 1) * C : NULL;
#pragma unroll
                    for (int v = 0; v < 2; v++) {
                        a[v][KW - 1] = xs[i][v];
#pragma unroll
                        for (int d = 1; d < KW; d++)
                            a[v][KW - 1 - d] = d >= K ? 0.0f
                                               : states
                                                   ? conv_input(qkvz, Wz, col + v, t, d, r, pos[t], hist, C, c + v, K)
                                               : t - d >= 0 ? act_load(qkvz[(t - d) * Wz + col + v])
                                                            : 0.0f;
                    }
                }
                float acc[2];
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    acc[v] = wr[v][KW - 1] * a[v][KW - 1];
#pragma unroll
                    for (int j = 0; j + 1 < KW; j++) acc[v] += wr[v][j] * a[v][j];
                }
                act_store_pair(out + t * C + c, silu_(acc[0]), silu_(acc[1]));
            }
        }
        __syncthreads(); /* run_mask is rewritten for the next rows */
    }
    if (write_state && active && states) /* gridDim.y == 1: every row above was this thread's */
        for (int64_t t = 0; t < T; t++) {
            if (is_padding(seq, pos, t) || (t + 1 < T && !is_padding(seq, pos, t + 1) && continues(seq, pos, t + 1)))
                continue;
            const int r = run_back(seq, pos, t, K - 2);
            float *hist = states + (int64_t)seq[t] * (K - 1) * C;
#pragma unroll
            for (int v = 0; v < 2; v++) {
                float next[GDN_MAX_KERNEL];
                for (int j = 0; j < K - 1; j++)
                    next[j] = conv_input(qkvz, Wz, col + v, t, K - 2 - j, r, pos[t], hist, C, c + v, K);
                for (int j = 0; j < K - 1; j++) hist[(int64_t)j * C + c + v] = next[j];
            }
        }
}

/* each sequence's new conv state at the last row of its run: its last kernel - 1 inputs (grid as the conv's) */
template <typename A>
static __global__ void gdn_conv_state_kernel(const A *qkvz, int64_t T, fm_gdn_shape g, float *states,
                                             const int32_t *seq, const int32_t *pos) {
    pdl_wait();
    const int64_t C = gdn_channels(g), Wz = gdn_qkvz_width(g);
    const int K = g.kernel, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t col = qkvz_column(g, c);
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        if (is_padding(seq, pos, t) || (t + 1 < T && !is_padding(seq, pos, t + 1) && continues(seq, pos, t + 1)))
            continue;
        const int r = run_back(seq, pos, t, K - 2);
        float *hist = states + (int64_t)seq[t] * (K - 1) * C;
        float next[GDN_MAX_KERNEL];
        for (int j = 0; j < K - 1; j++) next[j] = conv_input(qkvz, Wz, col, t, K - 2 - j, r, pos[t], hist, C, c, K);
        for (int j = 0; j < K - 1; j++) hist[(int64_t)j * C + c] = next[j];
    }
}

/* The gated delta rule over rows [t0, t1) of one sequence, value head blockIdx.y, state columns 32 blockIdx.x + lane:
   chunked: one run of all T rows (blockIdx.z 0), from states[seq[0]] when given (zero at position 0, or where pos is
   NULL), else from a zero state, the final state back to states[seq[0]] when given;
   else: block z takes the run starting at row z (others return), from the sequence's state (zero at position 0). */
template <typename A>
static __global__ __launch_bounds__(RULE_WARPS * 32) void gdn_rule_kernel(const A *qkv, const A *ba, const A *a_log,
                                                                          const A *dt_bias, int64_t T, fm_gdn_shape g,
                                                                          float *states, const int32_t *seq,
                                                                          const int32_t *pos, bool chunked, A *out) {
    extern __shared__ float sm[];
    __shared__ float part[RULE_WARPS][RULE_COLS];
    __shared__ float red[2][RULE_WARPS];
    pdl_wait();
    const int dk = g.dk, dv = g.dv, r = g.nv / g.nk;
    float *S = sm, *qs = S + dk * RULE_COLS, *ks = qs + dk; /* [dk][32], [dk], [dk] */
    const int h = blockIdx.y, kh = h / r, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * RULE_COLS + lane;
    const bool has_col = col < dv;
    const int64_t C = gdn_channels(g), key = (int64_t)g.nk * dk, ld_out = (int64_t)g.nv * dv;
    const int64_t per = (int64_t)g.nv * dk * dv;
    int64_t t0 = 0, t1 = T;
    float *Sg = NULL;
    bool fresh = true;
    if (chunked) {
        if (blockIdx.z != 0) return;
        if (states) Sg = states + (int64_t)seq[0] * per + (int64_t)h * dk * dv;
        fresh = !states || !pos || pos[0] == 0;
    } else {
        t0 = blockIdx.z;
        if (is_padding(seq, pos, t0)) { /* no state change; a finite output */
            if (w == 0 && has_col) act_store(out + t0 * ld_out + (int64_t)h * dv + col, 0.0f);
            return;
        }
        if (continues(seq, pos, t0)) return; /* inside another block's run */
        t1 = t0 + 1;
        while (t1 < T && !is_padding(seq, pos, t1) && continues(seq, pos, t1)) t1++;
        Sg = states + (int64_t)seq[t0] * per + (int64_t)h * dk * dv;
        fresh = pos[t0] == 0;
    }
    for (int i = w; i < dk; i += RULE_WARPS)
        S[i * RULE_COLS + lane] = !fresh && has_col ? Sg[(int64_t)i * dv + col] : 0.0f;
    const float a_exp = expf(act_load(a_log[h])), dtb = act_load(dt_bias[h]), qscale = 1.0f / sqrtf((float)dk);
    for (int64_t t = t0; t < t1; t++) {
        const A *row = qkv + t * C;
        float sq = 0.0f, sk = 0.0f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            const float q = act_load(row[(int64_t)kh * dk + i]), k = act_load(row[key + (int64_t)kh * dk + i]);
            qs[i] = q, ks[i] = k, sq += q * q, sk += k * k;
        }
        for (int o = 16; o > 0; o >>= 1)
            sq += __shfl_xor_sync(0xffffffffu, sq, o), sk += __shfl_xor_sync(0xffffffffu, sk, o);
        if (lane == 0) red[0][w] = sq, red[1][w] = sk;
        __syncthreads();
        sq = 0.0f, sk = 0.0f;
        for (int i = 0; i < RULE_WARPS; i++) sq += red[0][i], sk += red[1][i];
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        const A *bar = ba + t * 2 * (int64_t)g.nv + (int64_t)kh * 2 * r;
        const float beta = 1.0f / (1.0f + expf(-act_load(bar[h % r])));
        const float decay = expf(-a_exp * softplus_(act_load(bar[r + h % r]) + dtb));
        const float v = has_col ? act_load(row[2 * key + (int64_t)h * dv + col]) : 0.0f;
        float u = 0.0f;
        for (int i = w; i < dk; i += RULE_WARPS) {
            const float s = S[i * RULE_COLS + lane] * decay;
            S[i * RULE_COLS + lane] = s;
            u += s * (ks[i] * ik);
        }
        part[w][lane] = u;
        __syncthreads();
        u = 0.0f;
        for (int i = 0; i < RULE_WARPS; i++) u += part[i][lane];
        u = beta * (v - u);
        float o = 0.0f;
        for (int i = w; i < dk; i += RULE_WARPS) {
            const float s = S[i * RULE_COLS + lane] + (ks[i] * ik) * u;
            S[i * RULE_COLS + lane] = s;
            o += s * (qs[i] * iq * qscale);
        }
        __syncthreads(); /* every warp has read part */
        part[w][lane] = o;
        __syncthreads();
        if (w == 0 && has_col) {
            o = 0.0f;
            for (int i = 0; i < RULE_WARPS; i++) o += part[i][lane];
            act_store(out + t * ld_out + (int64_t)h * dv + col, o);
        }
        __syncthreads(); /* part, qs and ks are rewritten for the next token */
    }
    if (Sg && has_col)
        for (int i = w; i < dk; i += RULE_WARPS) Sg[(int64_t)i * dv + col] = S[i * RULE_COLS + lane];
}

template <typename A>
static __global__ void gdn_norm_gate_kernel(const A *core, const A *qkvz, const A *w, int64_t T, fm_gdn_shape g,
                                            float eps, A *out) {
    pdl_wait();
    const int lane = threadIdx.x & 31, r = g.nv / g.nk;
    const int64_t Wz = gdn_qkvz_width(g), Wg = 2 * (int64_t)g.dk + 2 * (int64_t)r * g.dv;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t wi = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); wi < T * g.nv; wi += warps) {
        const int64_t t = wi / g.nv;
        const int h = (int)(wi % g.nv);
        const A *x = core + wi * g.dv;
        const A *z = qkvz + t * Wz + (h / r) * Wg + 2 * (int64_t)g.dk + (int64_t)r * g.dv + (int64_t)(h % r) * g.dv;
        float ss = 0.0f;
        for (int e = lane; e < g.dv; e += 32) {
            const float v = act_load(x[e]);
            ss += v * v;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss / (float)g.dv + eps);
        for (int e = lane; e < g.dv; e += 32)
            act_store(out + wi * g.dv + e, act_load(w[e]) * (act_load(x[e]) * inv) * silu_(act_load(z[e])));
    }
}

/* The same for bf16 heads of dv = 128, a warp per (token, head): each lane its 4 consecutive columns by one 8-byte
 * load of core, z and w (the general kernel above: 4 two-byte loads a lane, 64-bit divisions per row, ~4.6x its byte
 * floor at T = 8192); grid (head blocks of 8, token rows). The sum of squares in another order: not the same bits. */
static __global__ void gdn_norm_gate_bf16x4_kernel(const bf16 *core, const bf16 *qkvz, const bf16 *w, int64_t T,
                                                   fm_gdn_shape g, float eps, bf16 *out, uint8_t *q8, float *qs) {
    const int lane = threadIdx.x & 31, r = g.nv / g.nk, h = blockIdx.x * 8 + (threadIdx.x >> 5);
    const uint2 wraw = *(const uint2 *)(w + 4 * lane); /* the weights before the wait */
    pdl_wait();
    if (h >= g.nv) return;
    const int64_t Wz = gdn_qkvz_width(g), Wg = 2 * (int64_t)g.dk + 2 * (int64_t)r * g.dv;
    const int64_t zoff = (h / r) * Wg + 2 * (int64_t)g.dk + (int64_t)r * g.dv + (int64_t)(h % r) * g.dv + 4 * lane;
    const float2 w01 = __bfloat1622float2(*(const __nv_bfloat162 *)&wraw.x);
    const float2 w23 = __bfloat1622float2(*(const __nv_bfloat162 *)&wraw.y);
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const int64_t row = (t * g.nv + h) * 128 + 4 * lane;
        const uint2 xr = *(const uint2 *)(core + row), zr = *(const uint2 *)(qkvz + t * Wz + zoff);
        const float2 x01 = __bfloat1622float2(*(const __nv_bfloat162 *)&xr.x);
        const float2 x23 = __bfloat1622float2(*(const __nv_bfloat162 *)&xr.y);
        const float2 z01 = __bfloat1622float2(*(const __nv_bfloat162 *)&zr.x);
        const float2 z23 = __bfloat1622float2(*(const __nv_bfloat162 *)&zr.y);
        float ss = x01.x * x01.x + x01.y * x01.y + x23.x * x23.x + x23.y * x23.y;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss / 128.0f + eps);
        const __nv_bfloat162 o01 =
            __floats2bfloat162_rn(w01.x * (x01.x * inv) * silu_(z01.x), w01.y * (x01.y * inv) * silu_(z01.y));
        const __nv_bfloat162 o23 =
            __floats2bfloat162_rn(w23.x * (x23.x * inv) * silu_(z23.x), w23.y * (x23.y * inv) * silu_(z23.y));
        uint2 o;
        o.x = *(const uint32_t *)&o01, o.y = *(const uint32_t *)&o23;
        *(uint2 *)(out + row) = o;
        if (q8) /* the head is group h of out's row t for the out projection: the quantizer's codes and scale */
            gdn_quantize_head(o01, o23, t, h, T, (int64_t)g.nv * 128, q8, qs);
    }
}

static int grid_for(int64_t n, int per_block) {
    const int64_t blocks = fm_ceil_div(n, per_block);
    return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

static void check_shape(fm_gdn_shape g, const char *op) {
    if (g.dk < 1 || g.dk > GDN_MAX_DK || g.dv < 1 || g.kernel < 1 || g.kernel > GDN_MAX_KERNEL || g.nk < 1 ||
        g.nv % g.nk != 0) {
        fprintf(stderr, "fp8moe: cuda %s: unsupported Gated DeltaNet shape (dk %d, dv %d, conv kernel %d)\n", op, g.dk,
                g.dv, g.kernel);
        abort();
    }
}

template <typename A>
static void conv(const A *qkvz, const A *w, int64_t ld, int64_t T, fm_gdn_shape g, float *states, const int32_t *seq,
                 const int32_t *pos, A *out, bool pdl, cudaStream_t s) {
    const int64_t C = 2 * (int64_t)g.nk * g.dk + (int64_t)g.nv * g.dv;
    const dim3 grid((unsigned)fm_ceil_div(C, 256), (unsigned)(T < 65535 ? T : 65535));
    const int64_t row_blocks = fm_ceil_div(T, CONV_ROWS);
    const dim3 wgrid((unsigned)fm_ceil_div(C, 512), (unsigned)(row_blocks < 65535 ? row_blocks : 65535));
    /* the window kernel's channel pairs: adjacent columns (even dk, dv), 4-byte aligned rows */
    const bool pairs = g.dk % 2 == 0 && g.dv % 2 == 0 && ((uintptr_t)qkvz | (uintptr_t)out) % (2 * sizeof(A)) == 0;
    /* the state in the window kernel for one row only: over several rows (a batch of sequences) its serial loop of
       state loads and stores cost more than the launch it saves (batch 8: +3.7 us a layer, H200) */
    const bool window = pairs && g.kernel <= 8, fused_state = window && states && T == 1;
    if (!window)
        pdl_launch(gdn_conv_kernel<A>, grid, 256, 0, s, pdl, qkvz, w, ld, T, g, (const float *)states, seq, pos, out);
    else if (g.kernel <= 4)
        pdl_launch(gdn_conv_window_kernel<A, 4>, wgrid, 256, 0, s, pdl, qkvz, w, ld, T, g, states, seq, pos, out,
                   fused_state);
    else
        pdl_launch(gdn_conv_window_kernel<A, 8>, wgrid, 256, 0, s, pdl, qkvz, w, ld, T, g, states, seq, pos, out,
                   fused_state);
    FM_LAUNCH_CHECK("gdn_conv");
    if (states && g.kernel > 1 && !fused_state) {
        pdl_launch(gdn_conv_state_kernel<A>, grid, 256, 0, s, pdl, qkvz, T, g, states, seq, pos);
        FM_LAUNCH_CHECK("gdn_conv state");
    }
}

extern "C" void fm_cuda_gdn_conv(bool f32, const void *qkvz, const void *conv_w, int64_t conv_ld, int64_t T,
                                 fm_gdn_shape g, float *states, const int32_t *tok_seq, const int32_t *tok_pos,
                                 void *out, bool pdl, cudaStream_t s) {
    check_shape(g, "gdn_conv");
    if (T <= 0) return;
    if (f32)
        conv((const float *)qkvz, (const float *)conv_w, conv_ld, T, g, states, tok_seq, tok_pos, (float *)out, pdl, s);
    else conv((const bf16 *)qkvz, (const bf16 *)conv_w, conv_ld, T, g, states, tok_seq, tok_pos, (bf16 *)out, pdl, s);
}

static void rule(bool f32, const void *qkv, const void *ba, const void *a_log, const void *dt_bias, int64_t T,
                 fm_gdn_shape g, float *states, const int32_t *seq, const int32_t *pos, bool chunked, void *out,
                 bool pdl, cudaStream_t s) {
    check_shape(g, chunked ? "gdn_chunked" : "gdn_recurrent");
    if (T <= 0) return;
    if (!chunked && T > 65535) {
        fprintf(stderr, "fp8moe: cuda gdn_recurrent: a step of %lld tokens (at most 65535)\n", (long long)T);
        abort();
    }
    const dim3 grid((unsigned)fm_ceil_div(g.dv, RULE_COLS), (unsigned)g.nv, chunked ? 1u : (unsigned)T);
    const size_t smem = (size_t)(g.dk * RULE_COLS + 2 * g.dk) * sizeof(float);
    if (f32)
        pdl_launch(gdn_rule_kernel<float>, grid, RULE_WARPS * 32, smem, s, pdl, (const float *)qkv, (const float *)ba,
                   (const float *)a_log, (const float *)dt_bias, T, g, states, seq, pos, chunked, (float *)out);
    else
        pdl_launch(gdn_rule_kernel<bf16>, grid, RULE_WARPS * 32, smem, s, pdl, (const bf16 *)qkv, (const bf16 *)ba,
                   (const bf16 *)a_log, (const bf16 *)dt_bias, T, g, states, seq, pos, chunked, (bf16 *)out);
    FM_LAUNCH_CHECK(chunked ? "gdn_chunked" : "gdn_recurrent");
}

extern "C" void fm_cuda_gdn_chunked(bool f32, const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                    int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                    const int32_t *tok_pos, void *out, cudaStream_t s) {
    rule(f32, qkv, ba, a_log, dt_bias, T, g, states, tok_seq, tok_pos, true, out, false, s);
}

extern "C" void fm_cuda_gdn_recurrent(bool f32, const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                      int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                      const int32_t *tok_pos, void *out, bool pdl, cudaStream_t s) {
    rule(f32, qkv, ba, a_log, dt_bias, T, g, states, tok_seq, tok_pos, false, out, pdl, s);
}

extern "C" void fm_cuda_gdn_norm_gate(bool f32, const void *core, const void *qkvz, const void *w, int64_t T,
                                      fm_gdn_shape g, float eps, void *out, uint8_t *q8, float *qs, bool pdl,
                                      cudaStream_t s) {
    check_shape(g, "gdn_norm_gate");
    if (T <= 0) return;
    const int64_t Wz = gdn_qkvz_width(g);
    const bool aligned = ((uintptr_t)core | (uintptr_t)qkvz | (uintptr_t)w | (uintptr_t)out) % 8 == 0;
    if (!f32 && g.dv == 128 && g.dk % 4 == 0 && Wz % 4 == 0 && aligned) {
        const dim3 grid((unsigned)fm_ceil_div(g.nv, 8), (unsigned)(T < 65535 ? T : 65535));
        pdl_launch(gdn_norm_gate_bf16x4_kernel, grid, 256, 0, s, pdl, (const bf16 *)core, (const bf16 *)qkvz,
                   (const bf16 *)w, T, g, eps, (bf16 *)out, q8, qs);
        FM_LAUNCH_CHECK("gdn_norm_gate");
        return;
    }
    const int grid = grid_for(T * g.nv, 8);
    if (f32)
        pdl_launch(gdn_norm_gate_kernel<float>, grid, 256, 0, s, pdl, (const float *)core, (const float *)qkvz,
                   (const float *)w, T, g, eps, (float *)out);
    else
        pdl_launch(gdn_norm_gate_kernel<bf16>, grid, 256, 0, s, pdl, (const bf16 *)core, (const bf16 *)qkvz,
                   (const bf16 *)w, T, g, eps, (bf16 *)out);
    FM_LAUNCH_CHECK("gdn_norm_gate");
    if (q8 && !f32) fm_cuda_quantize_e4m3_rows((const bf16 *)out, T, (int64_t)g.nv * g.dv, q8, qs, NULL, T, pdl, s);
}
