// W8A8 dense projections (see linear_w8a8.cuh). Memory-bound kernels around one cuBLASLt FP8 GEMM:
//   load:  amax of the fp32 matrix (grid-stride, warp max, atomicMax on the bits), then the cast to e4m3 rows
//          padded to 16 bytes (cuBLASLt FP8 wants 16-byte aligned rows) and the scale into its 16-byte slot
//   call:  the same for the input x [M, K] bf16: fused in one 1024-thread block when M K is small (decode), else
//          an amax grid and a cast grid; the scale never leaves the device
// Workspace layout (fm_w8a8_linear_ws_bytes): the scale slot, the amax word and a count of NaN/Inf inputs (256
// bytes), then xq [M][Kp]. NaN and Inf are not spread silently: amax skips NaN (whose code is NaN) while an Inf
// makes every other code zero; in debug mode (FP8MOE_SYNC=1) each call reads the count back and says so.
#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/linear_w8a8.cuh"
#include "backend/cuda/pdl.cuh"

typedef __nv_bfloat16 bf16;

#define AMAX_BLOCKS 1024 /* grid of the amax reductions: one atomic per block (e4m3_tensor.cuh) */

static unsigned grid_for(int64_t n, int64_t cap) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < cap ? (b > 0 ? b : 1) : cap);
}

static __global__ void matrix_amax_kernel(const float *w, int64_t n, unsigned *amax) {
    float a = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(w[i]));
    e4m3t_block_amax_commit(a, amax);
}

static __global__ void matrix_cast_kernel(const float *w, int64_t rows, int64_t cols, uint8_t *q, int64_t ldq,
                                          const unsigned *amax, float *scale_slot) {
    const float s = e4m3t_scale_of(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_slot[0] = s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * ldq;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / ldq, c = i % ldq;
        q[i] = c < cols ? e4m3t_encode(w[r * cols + c] / s) : 0;
    }
}

void fm_cuda_w8a8_quantize_matrix(const float *w, int64_t rows, int64_t cols, uint8_t *q, int64_t ldq,
                                  float *scale_slot, unsigned *amax_tmp, cudaStream_t s) {
    FM_CUDA_CHECK(cudaMemsetAsync(amax_tmp, 0, sizeof(unsigned), s));
    matrix_amax_kernel<<<grid_for(rows * cols, AMAX_BLOCKS), 256, 0, s>>>(w, rows * cols, amax_tmp);
    FM_LAUNCH_CHECK("w8a8_matrix_amax");
    matrix_cast_kernel<<<grid_for(rows * ldq, 65536), 256, 0, s>>>(w, rows, cols, q, ldq, amax_tmp, scale_slot);
    FM_LAUNCH_CHECK("w8a8_matrix_cast");
}

// a warp's count of non-finite inputs into *bad (one atomic per warp that saw any; the rare path)
static __device__ __forceinline__ void count_bad(unsigned n, unsigned *bad) {
    for (int o = 16; o; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if ((threadIdx.x & 31) == 0 && n) atomicAdd(bad, n);
}

// 8 consecutive elements of row r from column c0 (zeros past K), packed as they are (bf16): one 16-byte load
// where the row allows
static __device__ __forceinline__ uint4 load8(const bf16 *x, int64_t r, int64_t c0, int64_t K) {
    const bf16 *p = x + r * K + c0;
    if (c0 + 8 <= K && ((uintptr_t)p & 15) == 0) return *(const uint4 *)p;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (c0 + j < K) w[j / 2] |= (uint32_t)__bfloat16_as_ushort(p[j]) << (16 * (j % 2));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// element j (0..7, a constant after unrolling) of 8 packed bf16, as a float (a bf16 is the top half of one)
static __device__ __forceinline__ float elem8(const uint4 v, int j) {
    const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return __uint_as_float(j % 2 ? w & 0xFFFF0000u : w << 16);
}

// x [M, K] bf16 -> xq [M][Kp] e4m3 with the scale s (columns past K zero): 16 output bytes per step, from two
// 16-byte loads where the row allows
static __device__ __forceinline__ void cast_rows(const bf16 *x, int64_t M, int64_t K, int64_t Kp, float s, uint8_t *xq,
                                                 int64_t first, int64_t step) {
    const int64_t chunks = Kp / 16;
    for (int64_t i = first; i < M * chunks; i += step) {
        const int64_t r = i / chunks, c0 = (i % chunks) * 16;
        const uint4 lo = load8(x, r, c0, K), hi = load8(x, r, c0 + 8, K);
        uint32_t v[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 16; j++)
            v[j / 4] |= (uint32_t)e4m3t_encode(elem8(j < 8 ? lo : hi, j % 8) / s) << (8 * (j % 4));
        *(uint4 *)(xq + r * Kp + c0) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

// decode sizes (M Kp <= fm_routes_w8a8_fused_elems): one launch of B = ceil(M Kp / FUSED_BLOCK_ELEMS) blocks
// (FUSED_PIECES pieces of 8 bf16 per thread, all loaded in one round and kept in registers). Each block reduces its
// amax; with B > 1 the blocks meet at grid_barrier_amax, then each casts its own pieces. Launched with PDL: the GEMM
// after it starts meanwhile. (It was one 1024-thread block: at M = 8-16 that one SM's casts took ~7-10 us per call,
// bench gemm's w8a8 op row; bench/NOTES.md.)
#define FUSED_THREADS 256
#define FUSED_PIECES 4
#define FUSED_BLOCK_ELEMS (FUSED_THREADS * FUSED_PIECES * 8)

// The amax of all B blocks, for thread 0 of each: a sense-reversing grid barrier on the caller's zeroed words
// sync[0] arrivals, sync[1] generation, sync[2 + generation % 2] the amax bits of this generation. The last block to
// arrive clears the count and the next generation's amax, then advances the generation, which releases the others.
// It cannot starve: every block lets the next kernel launch (pdl_wait) before the barrier, and the next kernel
// launches only once all B blocks have, so no later kernel's CTA can take an SM before all B blocks are resident.
static __device__ float grid_barrier_amax(float a, unsigned *sync) {
    volatile unsigned *vs = sync;
    const unsigned gen = vs[1];
    atomicMax(&sync[2 + (gen & 1u)], __float_as_uint(a));
    __threadfence();
    if (atomicAdd(&sync[0], 1u) == gridDim.x - 1) {
        sync[0] = 0u, sync[2 + ((gen + 1u) & 1u)] = 0u;
        __threadfence();
        atomicAdd(&sync[1], 1u);
    } else {
        while (vs[1] == gen) __nanosleep(20);
    }
    __threadfence();
    return __uint_as_float(vs[2 + (gen & 1u)]);
}

static __global__ __launch_bounds__(FUSED_THREADS) void act_fused_kernel(const bf16 *x, int64_t M, int64_t K,
                                                                         int64_t Kp, uint8_t *xq, float *scale_slot,
                                                                         unsigned *bad, unsigned *sync) {
    __shared__ float red[FUSED_THREADS / 32];
    pdl_wait();
    const int64_t per_row = Kp / 8, n = M * per_row, first = (int64_t)blockIdx.x * FUSED_THREADS * FUSED_PIECES;
    uint4 v[FUSED_PIECES];
    float a = 0.0f;
    unsigned n_bad = 0;
#pragma unroll
    for (int i = 0; i < FUSED_PIECES; i++) {
        const int64_t p = first + threadIdx.x + (int64_t)i * FUSED_THREADS;
        v[i] = p < n ? load8(x, p / per_row, (p % per_row) * 8, K) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < FUSED_PIECES; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(elem8(v[i], j))), n_bad += !isfinite(elem8(v[i], j));
    count_bad(n_bad, bad);
    a = e4m3t_warp_max(a);
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = a;
    __syncthreads();
    a = e4m3t_warp_max(lane < FUSED_THREADS / 32 ? red[lane] : 0.0f); /* every warp, the block's amax */
    if (gridDim.x > 1) {
        __syncthreads(); /* red is reused for the grid's amax */
        if (threadIdx.x == 0) red[0] = grid_barrier_amax(a, sync);
        __syncthreads();
        a = red[0];
    }
    const float s = e4m3t_scale_of(__float_as_uint(a));
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_slot[0] = s;
#pragma unroll
    for (int i = 0; i < FUSED_PIECES; i++) {
        const int64_t p = first + threadIdx.x + (int64_t)i * FUSED_THREADS;
        if (p >= n) break;
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) w[j / 4] |= (uint32_t)e4m3t_encode(elem8(v[i], j) / s) << (8 * (j % 4));
        *(uint2 *)(xq + (p / per_row) * Kp + (p % per_row) * 8) = make_uint2(w[0], w[1]);
    }
}

// amax of n elements: 16-byte loads where x is aligned (the tail, or all of an unaligned x, element by element)
static __global__ void act_amax_kernel(const bf16 *x, int64_t n, unsigned *amax, unsigned *bad) {
    pdl_wait(); /* x is the previous kernel's output */
    float a = 0.0f;
    unsigned n_bad = 0;
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    const int64_t n8 = ((uintptr_t)x & 15) == 0 ? n / 8 : 0;
    for (int64_t p = first; p < n8; p += step) {
        const uint4 v = *(const uint4 *)(x + 8 * p);
#pragma unroll
        for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(elem8(v, j))), n_bad += !isfinite(elem8(v, j));
    }
    for (int64_t i = 8 * n8 + first; i < n; i += step) {
        const float v = __bfloat162float(x[i]);
        a = fmaxf(a, fabsf(v)), n_bad += !isfinite(v);
    }
    count_bad(n_bad, bad);
    e4m3t_block_amax_commit(a, amax);
}

static __global__ void act_cast_kernel(const bf16 *x, int64_t M, int64_t K, int64_t Kp, const unsigned *amax,
                                       uint8_t *xq, float *scale_slot) {
    pdl_wait(); /* the amax kernel's */
    const float s = e4m3t_scale_of(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_slot[0] = s;
    cast_rows(x, M, K, Kp, s, xq, blockIdx.x * (int64_t)blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x);
}

// a plain 16-byte slot for the scale, then the amax word and the NaN/Inf count (fm_w8a8_linear_ws_bytes)
void fm_cuda_w8a8_quantize_act(const bf16 *x, int64_t M, int64_t K, int64_t Kp, uint8_t *xq, float *scale_slot,
                               unsigned *amax_and_bad, unsigned *grid_sync, bool count_bad_inputs, bool pdl,
                               int64_t fused_elems, cudaStream_t s) {
    unsigned *amax = amax_and_bad, *bad = amax_and_bad + 1;
    /* at most FM_W8A8_FUSED_ELEMS_MAX: 64 blocks, resident together on any GPU the backend takes */
    if (M * Kp <= fused_elems && M * Kp <= FM_W8A8_FUSED_ELEMS_MAX) {
        if (count_bad_inputs) FM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, s));
        const unsigned blocks = (unsigned)fm_ceil_div(M * Kp, FUSED_BLOCK_ELEMS);
        void *args[] = {(void *)&x,  (void *)&M,          (void *)&K,   (void *)&Kp,
                        (void *)&xq, (void *)&scale_slot, (void *)&bad, (void *)&grid_sync};
        fm_cuda_launch_pdl((const void *)act_fused_kernel, dim3(blocks), dim3(FUSED_THREADS), 0, s, args, pdl);
        FM_LAUNCH_CHECK("w8a8_act_fused");
    } else {
        FM_CUDA_CHECK(cudaMemsetAsync(amax, 0, 2 * sizeof *amax, s)); /* amax and the NaN/Inf count */
        /* after the memset (a full dependency) the amax kernel overlaps only its launch; the cast overlaps the amax */
        pdl_launch(act_amax_kernel, grid_for(M * K, AMAX_BLOCKS), 256, 0, s, pdl, x, M * K, amax, bad);
        FM_LAUNCH_CHECK("w8a8_act_amax");
        pdl_launch(act_cast_kernel, grid_for(M * Kp / 16, 65536), 256, 0, s, pdl, x, M, K, Kp, (const unsigned *)amax,
                   xq, scale_slot);
        FM_LAUNCH_CHECK("w8a8_act_cast");
    }
}

// Above the GEMV's rows cuBLASLt FP8 runs: a TMA + wgmma GEMM of our own reached 0.77-0.83x of it at M = 2048 on
// the H200 and far less at M <= 128 (bench/NOTES.md 2026-11-30, "A W8A8 prefill GEMM of our own"); it lives in
// lab/gemm_w8a8.cu.
void fm_cuda_w8a8_gemm(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *xq, const float *x_scale,
                       int64_t M, bf16 *y) {
    fm_error err = {{0}};
    const uint8_t *A = (const uint8_t *)w->w + (int64_t)idx * w->rows * w->ld;
    const float *a_scale = w->tscale + (int64_t)idx * FM_LT_SCALE_SLOT;
    if (fm_routes_dense_kernel(&be->routes, w->fmt, M, w->cols) == FM_DK_W8A8_GEMV) {
        fm_cuda_w8a8_gemv(A, w->rows, w->ld, a_scale, xq, M, x_scale, y, fm_routes_pdl(&be->routes), be->stream);
    } else if (M > INT32_MAX || fm_lt_gemm_run(be->lt, w->lt_gemm, A, a_scale, xq, x_scale, (int)M, y, be->stream,
                                               "dense W8A8 projection", &err)) {
        fprintf(stderr, "fp8moe: %s\n", M > INT32_MAX ? "W8A8 linear: too many rows" : err.msg);
        abort(); /* a shape the bank accepted at load; a failure here is a bug, as a device fault is */
    }
}

// tail: NULL, or the add + RMSNorm the decode GEMV's last CTA runs (fm_cuda_linear_w8a8_add_rmsnorm checked it)
static void linear_w8a8(cuda_backend *be, const fm_bank *w, int32_t idx, const bf16 *x, int64_t M, bf16 *y,
                        const fm_row_tail *tail) {
    if (M == 0) return;
    const int64_t K = w->cols, Kp = w->ld;
    char *ws = (char *)fm_cuda_workspace(be, fm_w8a8_linear_ws_bytes(M, K));
    float *xs = (float *)ws;
    unsigned *amax = (unsigned *)(ws + 16), *bad = amax + 1;
    uint8_t *xq = (uint8_t *)(ws + 256);
    const bool debug = fm_cuda_debug_mode();
    fm_cuda_w8a8_quantize_act(x, M, K, Kp, xq, xs, amax, be->lt->grid_sync, debug, fm_routes_pdl(&be->routes),
                              fm_routes_w8a8_fused_elems(&be->routes), be->stream);
    if (tail)
        fm_cuda_w8a8_gemv_add_rmsnorm((const uint8_t *)w->w + (int64_t)idx * w->rows * w->ld, w->rows, w->ld,
                                      w->tscale + (int64_t)idx * FM_LT_SCALE_SLOT, xq, M, xs, y, tail,
                                      fm_routes_pdl(&be->routes), be->stream);
    else fm_cuda_w8a8_gemm(be, w, idx, xq, xs, M, y);
    if (debug) {
        unsigned n_bad = 0;
        FM_CUDA_CHECK(cudaMemcpyAsync(&n_bad, bad, sizeof n_bad, cudaMemcpyDeviceToHost, be->stream));
        FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
        if (n_bad)
            fprintf(stderr,
                    "fp8moe: W8A8 linear [%lld x %lld] -> %lld: %u of the %lld inputs are NaN or Inf; the e4m3 "
                    "input (and so the output) is meaningless\n",
                    (long long)M, (long long)K, (long long)w->rows, n_bad, (long long)(M * K));
    }
}

void fm_cuda_linear_w8a8(cuda_backend *be, const fm_bank *w, int32_t idx, const bf16 *x, int64_t M, bf16 *y) {
    linear_w8a8(be, w, idx, x, M, y, NULL);
}

bool fm_cuda_linear_w8a8_add_rmsnorm(cuda_backend *be, const fm_bank *w, const bf16 *x, int64_t M, bf16 *y, bf16 *acc,
                                     const bf16 *norm, float eps, bf16 *out) {
    if (M < 1 || !be->tail_counter || fm_routes_dense_kernel(&be->routes, w->fmt, M, w->cols) != FM_DK_W8A8_GEMV ||
        !fm_row_tail_takes(w->rows, y, acc, norm, out))
        return false;
    const fm_row_tail tail = {be->tail_counter, acc, norm, eps, out};
    linear_w8a8(be, w, 0, x, M, y, &tail);
    return true;
}
