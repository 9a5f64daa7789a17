// lab: the gated delta rule of Qwen3-Next's linear-attention layers (Gated DeltaNet), its two GPU forms, against a
// float64 reference of the recurrence (llm.c dev/cuda style). Not in the engine yet: the kernels move to
// src/backend/cuda once the op exists on the CPU backend.
//
//   make -C lab gdn && ./build/lab/gdn     validate every shape (both forms), then time Qwen3-Next's shape
//   ./build/lab/gdn --small                the small shapes only, no timing (for compute-sanitizer)
//
// The op, per v-head h (H of them; k-head h / (H / Hk) gives its q and k), token t, dk = dv = 128:
//   q, k l2-normalised (x / sqrt(sum x^2 + 1e-6)), q also times 1 / sqrt(dk);
//   S <- exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t
// with the state S [dk][dv] fp32 carried between calls (zero or a given initial state). g (a log decay, <= 0) and
// beta in (0, 1) come precomputed (in the model: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)).
//
// Two forms (same results up to fp32 rounding):
//   recurrent  one token after another (decode: T = 1). Grid (dv / 32, H), 128 threads: warp w holds rows
//              32w..32w+31 of 32 state columns (one per lane) in registers; per token two cross-warp sums
//              (S^T k and S^T q) through shared memory.
//   chunked    chunks of C = 64 tokens (transformers' torch_chunk_gated_delta_rule, FLA's chunk form):
//              prep     l2-normalise q and k (one warp per vector)
//              intra    per (chunk, head), independent: the decays' cumulative sums, A = -(beta k k^T) * decay
//                       (strictly lower), T = (I - A)^-1 by forward substitution, W = T (beta exp(gcum) k),
//                       U = T (beta v), the causal q k^T * decay block, q exp(gcum) and k exp(glast - gcum)
//              state    per head and 32 state columns, sequential over chunks: v' = U - W S,
//                       o = q exp(gcum) S + (q k^T * decay) v', S <- exp(glast) S + (k exp(glast - gcum))^T v'
//              FLOPs per (chunk, head): intra ~4 x 64 x 64 x 128 x 2, state ~3 x 64 x 128 x 128 x 2; fp32 CUDA cores
//              (no tensor cores yet).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

#define DK 128
#define DV 128
#define CH 64 /* chunk */
#define THRESHOLD 1e-4

// ---------------------------------------------------------------------------------------------------------
// prep: one warp per 128-vector of q or k

static __global__ void l2norm_kernel(const float *x, int64_t n_vec, float scale, float *y) {
    const int64_t v = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (v >= n_vec) return;
    const float4 a = ((const float4 *)(x + v * DK))[lane];
    float ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss + 1e-6f) * scale;
    ((float4 *)(y + v * DK))[lane] = make_float4(a.x * r, a.y * r, a.z * r, a.w * r);
}

// ---------------------------------------------------------------------------------------------------------
// recurrent form: qn, kn [T][Hk][DK] normalised, v [T][H][DV], g, beta [T][H], state [H][DK][DV] in and out,
// o [T][H][DV]

static __global__ void __launch_bounds__(128)
    recurrent_kernel(const float *qn, const float *kn, const float *v, const float *g, const float *beta, int64_t T,
                     int H, int Hk, float *state, float *o) {
    __shared__ float kq[2][DK];
    __shared__ float part[4][32];
    const int h = blockIdx.y, kh = h / (H / Hk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * 32 + lane;
    float *S = state + (int64_t)h * DK * DV;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = S[(int64_t)(32 * w + i) * DV + col];
    for (int64_t t = 0; t < T; t++) {
        kq[0][threadIdx.x] = kn[(t * Hk + kh) * DK + threadIdx.x];
        kq[1][threadIdx.x] = qn[(t * Hk + kh) * DK + threadIdx.x];
        const float eg = expf(g[t * H + h]), b = beta[t * H + h];
        __syncthreads();
        float kv = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) kv = fmaf(s[i], kq[0][32 * w + i], kv);
        part[w][lane] = kv;
        __syncthreads();
        kv = eg * (part[0][lane] + part[1][lane] + part[2][lane] + part[3][lane]);
        const float delta = b * (v[(t * H + h) * DV + col] - kv);
        float oq = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            s[i] = fmaf(kq[0][32 * w + i], delta, eg * s[i]);
            oq = fmaf(s[i], kq[1][32 * w + i], oq);
        }
        __syncthreads(); /* every warp has read part (kv) */
        part[w][lane] = oq;
        __syncthreads();
        if (w == 0) o[(t * H + h) * DV + col] = part[0][lane] + part[1][lane] + part[2][lane] + part[3][lane];
        __syncthreads(); /* part and kq are rewritten next token */
    }
#pragma unroll
    for (int i = 0; i < 32; i++) S[(int64_t)(32 * w + i) * DV + col] = s[i];
}

// ---------------------------------------------------------------------------------------------------------
// chunked form, intra-chunk part: one block of 256 threads per (chunk, head). Outputs per (chunk, head) into
// scratch: W, U, Qg = q exp(gcum), Kg = k exp(glast - gcum) [CH][128] each, Aqk [CH][CH] (causal q.k * decay),
// and exp(glast).

typedef struct chunk_scratch {
    float *W, *U, *Qg, *Kg, *Aqk, *eglast;
} chunk_scratch;

static __device__ __forceinline__ int64_t chunk_index(int64_t c, int h, int H) { return c * H + h; }

#define KS (DK + 1) /* row stride of k and q in shared memory: the q.k and k.k dots read columns conflict-free */
#define INTRA_SMEM ((2 * CH * KS + CH * DV + 2 * CH * CH + 4 * CH) * 4)

static __global__ void __launch_bounds__(256)
    intra_kernel(const float *qn, const float *kn, const float *v, const float *g, const float *beta, int64_t T, int H,
                 int Hk, chunk_scratch out) {
    extern __shared__ float sm[];
    float *Ks = sm, *Qs = Ks + CH * KS, *Vs = Qs + CH * KS; /* [CH][KS], [CH][KS], [CH][DV] */
    float *A = Vs + CH * DV, *Aq = A + CH * CH;             /* [CH][CH] */
    float *gc = Aq + CH * CH, *bs = gc + CH, *tmp = bs + CH, *ebg = tmp + CH;
    const int64_t c = blockIdx.x;
    const int h = blockIdx.y, kh = h / (H / Hk), tid = threadIdx.x;
    const int64_t t0 = c * CH;
    for (int i = tid; i < CH * DK; i += 256) { /* zeros past T */
        const int r = i / DK, d = i % DK;
        const int64_t t = t0 + r;
        Ks[r * KS + d] = t < T ? kn[(t * Hk + kh) * DK + d] : 0.0f;
        Qs[r * KS + d] = t < T ? qn[(t * Hk + kh) * DK + d] : 0.0f;
        Vs[i] = t < T ? v[(t * H + h) * DV + d] : 0.0f;
    }
    if (tid < CH) {
        const int64_t t = t0 + tid;
        gc[tid] = t < T ? g[t * H + h] : 0.0f;
        bs[tid] = t < T ? beta[t * H + h] : 0.0f;
    }
    __syncthreads();
    if (tid < 32) { /* inclusive cumulative sum of the 64 decays, one warp, two per lane */
        float a = gc[2 * tid], b = a + gc[2 * tid + 1];
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, b, o);
            if (tid >= o) a += n, b += n;
        }
        gc[2 * tid] = a, gc[2 * tid + 1] = b;
    }
    __syncthreads();
    // A = -(beta_r k_r.k_c) exp(gc_r - gc_c) for c < r; Aq = (q_r.k_c) exp(gc_r - gc_c) for c <= r
    for (int i = tid; i < CH * CH; i += 256) {
        const int r = i / CH, cc = i % CH;
        float kk = 0.0f, qk = 0.0f;
        if (cc <= r)
            for (int d = 0; d < DK; d++) {
                const float kd = Ks[cc * KS + d];
                kk = fmaf(Ks[r * KS + d], kd, kk);
                qk = fmaf(Qs[r * KS + d], kd, qk);
            }
        const float dec = cc <= r ? expf(gc[r] - gc[cc]) : 0.0f;
        A[i] = cc < r ? -bs[r] * kk * dec : 0.0f;
        Aq[i] = qk * dec;
    }
    __syncthreads();
    // forward substitution, as the reference loop: row i <- row i + sum_m row_i[m] A[m][:] over the rows m < i already
    // done; then T = A + I
    for (int i = 1; i < CH; i++) {
        if (tid < i) tmp[tid] = A[i * CH + tid];
        __syncthreads();
        if (tid < i) {
            float acc = tmp[tid];
            for (int m = tid + 1; m < i; m++) acc = fmaf(tmp[m], A[m * CH + tid], acc);
            A[i * CH + tid] = acc;
        }
        __syncthreads();
    }
    if (tid < CH) A[tid * CH + tid] = 1.0f, ebg[tid] = bs[tid] * expf(gc[tid]);
    __syncthreads();
    // W = T (beta exp(gc) k), U = T (beta v); Qg = q exp(gc), Kg = k exp(glast - gc)
    const int64_t ci = chunk_index(c, h, H);
    float *W = out.W + ci * CH * DK, *U = out.U + ci * CH * DV, *Qg = out.Qg + ci * CH * DK,
          *Kg = out.Kg + ci * CH * DK;
    const float glast = gc[CH - 1];
    for (int i = tid; i < CH * DK; i += 256) {
        const int r = i / DK, d = i % DK;
        float wa = 0.0f, ua = 0.0f;
        for (int m = 0; m <= r; m++) {
            const float tm = A[r * CH + m];
            wa = fmaf(tm * ebg[m], Ks[m * KS + d], wa);
            ua = fmaf(tm * bs[m], Vs[m * DV + d], ua);
        }
        W[i] = wa, U[i] = ua;
        Qg[i] = Qs[r * KS + d] * expf(gc[r]);
        Kg[i] = Ks[r * KS + d] * expf(glast - gc[r]);
    }
    for (int i = tid; i < CH * CH; i += 256) out.Aqk[ci * CH * CH + i] = Aq[i];
    if (tid == 0) out.eglast[ci] = expf(glast);
}

// chunked form, state part: grid (DV / 32, H), 128 threads (warp w: state rows 32w..32w+31, lane: one of the
// block's 32 columns), sequential over the chunks.
#define STATE_SMEM ((3 * CH * DK + CH * CH + 4 * CH * 32 + CH * 32) * 4)

static __global__ void __launch_bounds__(128) state_kernel(chunk_scratch in, int64_t T, int H, float *state, float *o) {
    extern __shared__ float sm[];
    float *Ws = sm, *Qs = Ws + CH * DK, *Ks = Qs + CH * DK, *Aq = Ks + CH * DK; /* [CH][128] x 3, [CH][CH] */
    float *part = Aq + CH * CH, *vn = part + 4 * CH * 32;                       /* [4][CH][32], [CH][32] */
    const int h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31, col = blockIdx.x * 32 + lane;
    float *S = state + (int64_t)h * DK * DV;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = S[(int64_t)(32 * w + i) * DV + col];
    const int64_t n_chunks = (T + CH - 1) / CH;
    for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t ci = chunk_index(c, h, H);
        for (int i = threadIdx.x; i < CH * DK / 4; i += 128) {
            ((float4 *)Ws)[i] = ((const float4 *)(in.W + ci * CH * DK))[i];
            ((float4 *)Qs)[i] = ((const float4 *)(in.Qg + ci * CH * DK))[i];
            ((float4 *)Ks)[i] = ((const float4 *)(in.Kg + ci * CH * DK))[i];
        }
        for (int i = threadIdx.x; i < CH * CH / 4; i += 128)
            ((float4 *)Aq)[i] = ((const float4 *)(in.Aqk + ci * CH * CH))[i];
        __syncthreads();
        // v' = U - W S: this warp's rows of the sum, then each warp finishes 16 rows
        for (int r = 0; r < CH; r++) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++) p = fmaf(Ws[r * DK + 32 * w + i], s[i], p);
            part[(w * CH + r) * 32 + lane] = p;
        }
        __syncthreads();
        for (int r = 16 * w; r < 16 * w + 16; r++)
            vn[r * 32 + lane] =
                in.U[(ci * CH + r) * DV + col] - (part[(0 * CH + r) * 32 + lane] + part[(1 * CH + r) * 32 + lane] +
                                                  part[(2 * CH + r) * 32 + lane] + part[(3 * CH + r) * 32 + lane]);
        __syncthreads();
        // o = Qg S + Aqk v'
        for (int r = 0; r < CH; r++) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++) p = fmaf(Qs[r * DK + 32 * w + i], s[i], p);
            part[(w * CH + r) * 32 + lane] = p;
        }
        __syncthreads();
        for (int r = 16 * w; r < 16 * w + 16; r++) {
            const int64_t t = c * CH + r;
            float acc = part[(0 * CH + r) * 32 + lane] + part[(1 * CH + r) * 32 + lane] +
                        part[(2 * CH + r) * 32 + lane] + part[(3 * CH + r) * 32 + lane];
            for (int m = 0; m <= r; m++) acc = fmaf(Aq[r * CH + m], vn[m * 32 + lane], acc);
            if (t < T) o[(t * H + h) * DV + col] = acc;
        }
        // S <- exp(glast) S + Kg^T v'
        const float eg = in.eglast[ci];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] *= eg;
        for (int r = 0; r < CH; r++) {
            const float x = vn[r * 32 + lane];
#pragma unroll
            for (int i = 0; i < 32; i++) s[i] = fmaf(Ks[r * DK + 32 * w + i], x, s[i]);
        }
        __syncthreads(); /* the next chunk overwrites shared memory */
    }
#pragma unroll
    for (int i = 0; i < 32; i++) S[(int64_t)(32 * w + i) * DV + col] = s[i];
}

// ---------------------------------------------------------------------------------------------------------
// host side

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
static float rndu(uint64_t i) { return (float)(mix(i) >> 40) * (1.0f / 16777216.0f); }
static float rndn(uint64_t i) {
    const float u = rndu(2 * i) + 1e-7f, v = rndu(2 * i + 1);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

typedef struct problem {
    int64_t T;
    int H, Hk;
    float *q, *k, *v, *g, *beta, *s0; /* host inputs; s0 [H][DK][DV] */
    float *d_q, *d_k, *d_qn, *d_kn, *d_v, *d_g, *d_beta, *d_state, *d_o;
    chunk_scratch cs;
} problem;

// inputs as a trained layer gives them: q, k ~ N(0, 1) (normalised in the op), v ~ N(0, 1), g = -exp(A_log)
// softplus(a + dt_bias) with A_log ~ U(0, 2.8) (A in 1..16), a ~ N(0, 1), dt_bias ~ U(-4, 0), beta = sigmoid(N(0, 1))
static void problem_init(problem *p, int64_t T, int H, int Hk, bool initial_state, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->T = T, p->H = H, p->Hk = Hk;
    const int64_t nq = T * Hk * DK, nv = T * H * DV, ns = (int64_t)H * DK * DV;
    p->q = (float *)malloc((size_t)nq * 4), p->k = (float *)malloc((size_t)nq * 4);
    p->v = (float *)malloc((size_t)nv * 4), p->g = (float *)malloc((size_t)(T * H) * 4);
    p->beta = (float *)malloc((size_t)(T * H) * 4), p->s0 = (float *)calloc((size_t)ns, 4);
#pragma omp parallel for
    for (int64_t i = 0; i < nq; i++)
        p->q[i] = rndn(seed * 7919 + 4 * (uint64_t)i), p->k[i] = rndn(seed * 7919 + 4 * (uint64_t)i + 1);
#pragma omp parallel for
    for (int64_t i = 0; i < nv; i++) p->v[i] = rndn(seed * 104729 + 3 * (uint64_t)i + 2);
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float A_log = 2.8f * rndu(seed * 31 + (uint64_t)h), dt_bias = -4.0f * rndu(seed * 37 + (uint64_t)h);
            const float a = rndn(seed * 41 + (uint64_t)(t * H + h)) + dt_bias;
            const float sp = a > 20.0f ? a : log1pf(expf(a));
            p->g[t * H + h] = -expf(A_log) * sp;
            p->beta[t * H + h] = 1.0f / (1.0f + expf(-rndn(seed * 43 + (uint64_t)(t * H + h))));
        }
    if (initial_state)
        for (int64_t i = 0; i < ns; i++) p->s0[i] = 0.1f * rndn(seed * 47 + (uint64_t)i);
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_q, (size_t)nq * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_k, (size_t)nq * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_qn, (size_t)nq * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_kn, (size_t)nq * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_v, (size_t)nv * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_g, (size_t)(T * H) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_beta, (size_t)(T * H) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_state, (size_t)ns * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->d_o, (size_t)nv * 4));
    FM_CUDA_CHECK(cudaMemcpy(p->d_q, p->q, (size_t)nq * 4, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->d_k, p->k, (size_t)nq * 4, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->d_v, p->v, (size_t)nv * 4, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->d_g, p->g, (size_t)(T * H) * 4, cudaMemcpyHostToDevice));
    FM_CUDA_CHECK(cudaMemcpy(p->d_beta, p->beta, (size_t)(T * H) * 4, cudaMemcpyHostToDevice));
    const int64_t nc = (T + CH - 1) / CH * H;
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.W, (size_t)(nc * CH * DK) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.U, (size_t)(nc * CH * DV) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.Qg, (size_t)(nc * CH * DK) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.Kg, (size_t)(nc * CH * DK) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.Aqk, (size_t)(nc * CH * CH) * 4));
    FM_CUDA_CHECK(cudaMalloc((void **)&p->cs.eglast, (size_t)nc * 4));
}

static void problem_free(problem *p) {
    free(p->q), free(p->k), free(p->v), free(p->g), free(p->beta), free(p->s0);
    cudaFree(p->d_q), cudaFree(p->d_k), cudaFree(p->d_qn), cudaFree(p->d_kn), cudaFree(p->d_v), cudaFree(p->d_g);
    cudaFree(p->d_beta), cudaFree(p->d_state), cudaFree(p->d_o);
    cudaFree(p->cs.W), cudaFree(p->cs.U), cudaFree(p->cs.Qg), cudaFree(p->cs.Kg), cudaFree(p->cs.Aqk);
    cudaFree(p->cs.eglast);
}

static void run_prep(const problem *p, cudaStream_t s) {
    const int64_t n = p->T * p->Hk;
    const unsigned blocks = (unsigned)fm_ceil_div(n, 8);
    l2norm_kernel<<<blocks, 256, 0, s>>>(p->d_q, n, 1.0f / sqrtf((float)DK), p->d_qn);
    l2norm_kernel<<<blocks, 256, 0, s>>>(p->d_k, n, 1.0f, p->d_kn);
    FM_LAUNCH_CHECK("gdn l2norm");
}

static void run_recurrent(const problem *p, cudaStream_t s) {
    run_prep(p, s);
    recurrent_kernel<<<dim3(DV / 32, p->H), 128, 0, s>>>(p->d_qn, p->d_kn, p->d_v, p->d_g, p->d_beta, p->T, p->H, p->Hk,
                                                         p->d_state, p->d_o);
    FM_LAUNCH_CHECK("gdn recurrent");
}

static void run_intra(const problem *p, cudaStream_t s) {
    const int64_t n_chunks = (p->T + CH - 1) / CH;
    intra_kernel<<<dim3((unsigned)n_chunks, p->H), 256, INTRA_SMEM, s>>>(p->d_qn, p->d_kn, p->d_v, p->d_g, p->d_beta,
                                                                         p->T, p->H, p->Hk, p->cs);
    FM_LAUNCH_CHECK("gdn intra");
}

static void run_state(const problem *p, cudaStream_t s) {
    state_kernel<<<dim3(DV / 32, p->H), 128, STATE_SMEM, s>>>(p->cs, p->T, p->H, p->d_state, p->d_o);
    FM_LAUNCH_CHECK("gdn state");
}

static void run_chunked(const problem *p, cudaStream_t s) {
    run_prep(p, s);
    run_intra(p, s);
    run_state(p, s);
}

// what time_median launches: a whole form, or one kernel of the chunked form (its inputs left by a whole run)
typedef enum { PART_RECURRENT, PART_CHUNKED, PART_PREP, PART_INTRA, PART_STATE } part;
static const char *part_name[] = {"recurrent", "chunked", "  l2norm", "  intra", "  state"};

static void run_part(const problem *p, part w, cudaStream_t s) {
    if (w == PART_RECURRENT) run_recurrent(p, s);
    else if (w == PART_CHUNKED) run_chunked(p, s);
    else if (w == PART_PREP) run_prep(p, s);
    else if (w == PART_INTRA) run_intra(p, s);
    else run_state(p, s);
}

// the recurrence in float64 on the host: o [T][H][DV], state [H][DK][DV] (from s0)
static void reference(const problem *p, double *o, double *st) {
#pragma omp parallel for
    for (int h = 0; h < p->H; h++) {
        const int kh = h / (p->H / p->Hk);
        double *S = st + (int64_t)h * DK * DV;
        for (int64_t i = 0; i < DK * DV; i++) S[i] = p->s0[(int64_t)h * DK * DV + i];
        double q[DK], k[DK], kv[DV];
        for (int64_t t = 0; t < p->T; t++) {
            double qq = 0, kk = 0;
            for (int d = 0; d < DK; d++) {
                q[d] = p->q[(t * p->Hk + kh) * DK + d], k[d] = p->k[(t * p->Hk + kh) * DK + d];
                qq += q[d] * q[d], kk += k[d] * k[d];
            }
            const double rq = 1.0 / sqrt(qq + 1e-6) / sqrt((double)DK), rk = 1.0 / sqrt(kk + 1e-6);
            for (int d = 0; d < DK; d++) q[d] *= rq, k[d] *= rk;
            const double eg = exp((double)p->g[t * p->H + h]), b = p->beta[t * p->H + h];
            for (int64_t i = 0; i < DK * DV; i++) S[i] *= eg;
            for (int j = 0; j < DV; j++) kv[j] = 0;
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) kv[j] += S[i * DV + j] * k[i];
            for (int j = 0; j < DV; j++) kv[j] = b * (p->v[(t * p->H + h) * DV + j] - kv[j]); /* delta */
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) S[i * DV + j] += k[i] * kv[j];
            for (int j = 0; j < DV; j++) {
                double acc = 0;
                for (int i = 0; i < DK; i++) acc += S[i * DV + j] * q[i];
                o[(t * p->H + h) * DV + j] = acc;
            }
        }
    }
}

static double rel_err(const float *got, const double *ref, int64_t n, bool *finite) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) *finite = false;
        num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// runs one form from s0 with y poisoned (NaN); returns the relative errors of o and of the final state, or -1
static void check(const problem *p, bool chunked, const double *o_ref, const double *s_ref, cudaStream_t s, double *e_o,
                  double *e_s) {
    const int64_t no = p->T * p->H * DV, ns = (int64_t)p->H * DK * DV;
    FM_CUDA_CHECK(cudaMemcpyAsync(p->d_state, p->s0, (size_t)ns * 4, cudaMemcpyHostToDevice, s));
    FM_CUDA_CHECK(cudaMemsetAsync(p->d_o, 0xFF, (size_t)no * 4, s));
    if (chunked) run_chunked(p, s);
    else run_recurrent(p, s);
    float *o = (float *)malloc((size_t)no * 4), *st = (float *)malloc((size_t)ns * 4);
    FM_CUDA_CHECK(cudaMemcpyAsync(o, p->d_o, (size_t)no * 4, cudaMemcpyDeviceToHost, s));
    FM_CUDA_CHECK(cudaMemcpyAsync(st, p->d_state, (size_t)ns * 4, cudaMemcpyDeviceToHost, s));
    FM_CUDA_CHECK(cudaStreamSynchronize(s));
    bool finite = true;
    *e_o = rel_err(o, o_ref, no, &finite);
    *e_s = rel_err(st, s_ref, ns, &finite);
    if (!finite) *e_o = *e_s = -1.0;
    free(o), free(st);
}

static float time_median(const problem *p, part w, cudaStream_t s, int samples) {
    for (int i = 0; i < 2; i++) run_part(p, w, s);
    cudaEvent_t a, b;
    FM_CUDA_CHECK(cudaEventCreate(&a));
    FM_CUDA_CHECK(cudaEventCreate(&b));
    float *ms = (float *)malloc((size_t)samples * 4);
    for (int i = 0; i < samples; i++) {
        FM_CUDA_CHECK(cudaEventRecord(a, s));
        run_part(p, w, s);
        FM_CUDA_CHECK(cudaEventRecord(b, s));
        FM_CUDA_CHECK(cudaEventSynchronize(b));
        FM_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    for (int i = 1; i < samples; i++)
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    const float med = ms[samples / 2];
    free(ms);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return med;
}

int main(int argc, char **argv) {
    const bool small = argc > 1 && !strcmp(argv[1], "--small");
    if (argc > 2 || (argc == 2 && !small)) {
        fprintf(stderr, "usage: %s [--small]\n", argv[0]);
        return 2;
    }
    cudaDeviceProp prop;
    FM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    FM_CUDA_CHECK(cudaFuncSetAttribute(intra_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, INTRA_SMEM));
    FM_CUDA_CHECK(cudaFuncSetAttribute(state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, STATE_SMEM));
    cudaStream_t s;
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // T around the chunk edges, GQA ratios 1 and 2, with and without an initial state
    static const struct {
        int64_t T;
        int H, Hk;
        bool s0;
    } shapes[] = {{1, 2, 1, false},  {1, 4, 2, true},   {63, 2, 2, false},  {64, 4, 2, true},
                  {65, 4, 2, false}, {130, 2, 1, true}, {1000, 4, 2, true}, {300, 32, 16, false}};
    const int n_shapes = small ? 4 : (int)(sizeof shapes / sizeof *shapes);
    int checks = 0, failed = 0;
    double worst = 0;
    printf("\nvalidation against the float64 recurrence (threshold %.0e on o and on the final state):\n", THRESHOLD);
    for (int i = 0; i < n_shapes; i++) {
        problem p;
        problem_init(&p, shapes[i].T, shapes[i].H, shapes[i].Hk, shapes[i].s0, (uint64_t)i + 1);
        double *o_ref = (double *)malloc((size_t)(p.T * p.H * DV) * 8);
        double *s_ref = (double *)malloc((size_t)p.H * DK * DV * 8);
        reference(&p, o_ref, s_ref);
        for (int form = 0; form < 2; form++) {
            double eo, es;
            check(&p, form == 1, o_ref, s_ref, s, &eo, &es);
            const bool ok = eo >= 0 && eo <= THRESHOLD && es <= THRESHOLD;
            printf("  T %5lld H %2d Hk %2d %-13s %-9s o err %.3e  state err %.3e  %s\n", (long long)p.T, p.H, p.Hk,
                   shapes[i].s0 ? "initial state" : "zero state", form ? "chunked" : "recurrent", eo, es,
                   ok ? "ok" : "FAILED");
            checks++, failed += !ok;
            worst = fmax(worst, fmax(eo, es));
        }
        free(o_ref), free(s_ref);
        problem_free(&p);
    }
    printf("%d checks, %d failed; worst relative error %.3e\n", checks, failed, worst);
    if (failed || small) return failed ? 1 : 0;

    // timing: Qwen3-Next-80B-A3B's linear attention (32 v-heads, 16 k-heads, dk = dv = 128), one layer, one
    // sequence; FLOPs counted as the chunked form does them
    printf("\ntiming (CUDA events, median of 10; state reset not included; the chunked form's three kernels apart):\n");
    printf("  %-7s %-10s %9s %9s\n", "T", "form", "ms", "TFLOP/s");
    static const int64_t Ts[] = {1, 2048, 8192};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        problem p;
        problem_init(&p, Ts[i], 32, 16, false, 99);
        FM_CUDA_CHECK(cudaMemset(p.d_state, 0, (size_t)p.H * DK * DV * 4));
        const double chunks = (double)((p.T + CH - 1) / CH) * p.H;
        const double fl = chunks * (4.0 * CH * CH * DK * 2 + 3.0 * CH * DK * DV * 2);
        for (int w = PART_RECURRENT; w <= PART_STATE; w++) {
            if (w == PART_RECURRENT && p.T > 2048)
                continue; /* the recurrent form at T = 8192: minutes of nothing new */
            const float ms = time_median(&p, (part)w, s, 10);
            printf("  %-7lld %-10s %9.4f", (long long)p.T, part_name[w], ms);
            if (w <= PART_CHUNKED) printf(" %9.2f", fl / (ms * 1e-3) / 1e12);
            printf("\n");
        }
        problem_free(&p);
    }
    return 0;
}
