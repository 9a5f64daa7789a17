// FP8 expert FFN through cuBLASLt, one matmul per expert (see moe_cublaslt_fp8.cuh).
//
// Setup, once: every expert matrix of the bf16 banks -> e4m3 [E][N, K] (row-major, ld K) with one fp32 scale per
// matrix, s = max(amax / 448, 1e-12), code = e4m3_rn_satfinite(w / s), computed on the device.
//
// Per call (P = T k routed pairs):
//   1. count the pairs per expert, copy the E counts to the host: the one host synchronisation per call (the
//      per-expert GEMM shapes are host arguments of cublasLtMatmul, as in moe_grouped_cublas.cu); prefix sums
//      there, each expert's segment starting at a multiple of 16 rows (256-byte aligned operands, see below),
//      offsets uploaded
//   2. slots: pair p = t k + j takes a row of its expert's segment (arrival order; every row is independent)
//   3. amax of x [T, H] (the dispatched rows are copies of x rows: same amax), then gather + quantize into
//      xq [rows, H] e4m3 with one dynamic per-tensor scale s_x, computed and kept on the device
//   4. for each expert with rows: gu_e [n_e, 2I] = s_w s_x xq_e W_e^T, bf16 out, fp32 accumulation
//   5. h = bf16(silu(g) u) (the CPU reference's rounding point) and its amax; hq = e4m3(h / s_h), one scale
//   6. for each expert with rows: y_e [n_e, H] = s_d s_h hq_e D_e^T, bf16
//   7. combine: out[t] = sum_j w[t, j] y[slot(t, j)] in j order, fp32, one bf16 rounding
//
// The GEMMs: cublaslt_fp8.cuh (the TN layout mapping, scale-pointer alignment, algorithm choice and caching).
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <string.h>

#include "backend/cuda/cublaslt_fp8.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/e4m3_tensor.cuh"
#include "moe_cublaslt_fp8.cuh"

extern "C" {
#include "util/status.h"
}

typedef __nv_bfloat16 bf16;

#define LT_ROW_ALIGN 16 // expert segments start at multiples of 16 rows (see 1. above)
#define LT_SCALE_SLOT FM_LT_SCALE_SLOT

// one projection (gate|up or down) of every expert, and the cuBLASLt objects that compute it
typedef struct lt_proj {
    uint8_t *w;   // e4m3 [E][N][K]
    float *scale; // [E][LT_SCALE_SLOT] device, the scale in the slot's first float
    int64_t N, K;
    fm_lt_gemm gemm;
} lt_proj;

struct fm_lt_moe {
    cuda_backend *be;
    fm_lt lt;
    int32_t E;
    int64_t H, I;
    lt_proj gu, dn;
    char *buf; // per-call buffers (grow-only), see ensure_buffers
    size_t buf_bytes;
    int *cnt, *off; // host [E]
};

static unsigned grid_for(int64_t n, int64_t cap) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < cap ? (b > 0 ? b : 1) : cap);
}

// 8 bf16 (16 bytes, aligned) -> fp32
static __device__ void load8(const bf16 *p, float *v) {
    const uint4 raw = *(const uint4 *)p;
    const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&raw;
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h2[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}

// e4m3(v[i] / s) for 8 values -> 8 bytes (aligned)
static __device__ void store8_e4m3(uint8_t *p, const float *v, float s) {
    uint32_t lo = 0, hi = 0;
    for (int i = 0; i < 4; i++)
        lo |= (uint32_t)e4m3t_encode(v[i] / s) << (8 * i), hi |= (uint32_t)e4m3t_encode(v[4 + i] / s) << (8 * i);
    *(uint2 *)p = make_uint2(lo, hi);
}

// ---- setup: per-matrix quantization of a bf16 bank; grid (x, matrices) ----

static __global__ void bank_amax_kernel(const bf16 *w, int64_t rows, int64_t cols, int64_t ld, unsigned *amax) {
    const bf16 *m = w + (int64_t)blockIdx.y * rows * ld;
    float a = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (int64_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(__bfloat162float(m[(i / cols) * ld + i % cols])));
    e4m3t_block_amax_commit(a, &amax[blockIdx.y]);
}

static __global__ void bank_quant_kernel(const bf16 *w, int64_t rows, int64_t cols, int64_t ld, const unsigned *amax,
                                         uint8_t *q, float *scale) {
    const bf16 *m = w + (int64_t)blockIdx.y * rows * ld;
    const float s = e4m3t_scale_of(amax[blockIdx.y]);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale[blockIdx.y * LT_SCALE_SLOT] = s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (int64_t)gridDim.x * blockDim.x)
        q[(int64_t)blockIdx.y * rows * cols + i] = e4m3t_encode(__bfloat162float(m[(i / cols) * ld + i % cols]) / s);
}

// ---- per call ----

static __global__ void count_kernel(const int32_t *ids, int64_t P, int32_t *counts) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(&counts[ids[p]], 1);
}

static __global__ void scatter_kernel(const int32_t *ids, int64_t P, const int32_t *offsets, int32_t *fill,
                                      int32_t *slot_of) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[p];
        slot_of[p] = offsets[e] + atomicAdd(&fill[e], 1);
    }
}

// amax over n bf16 (n a multiple of 8, x 16-byte aligned)
static __global__ void amax_kernel(const bf16 *x, int64_t n, unsigned *amax) {
    float a = 0.0f, v[8];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / 8; i += (int64_t)gridDim.x * blockDim.x) {
        load8(x + 8 * i, v);
        for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(v[j]));
    }
    e4m3t_block_amax_commit(a, amax);
}

// xq[slot_of[p], :] = e4m3(x[p / k, :] / s_x); 8 elements per thread (H a multiple of 16)
static __global__ void gather_quant_kernel(const bf16 *x, int64_t P, int32_t k, int64_t H, const int32_t *slot_of,
                                           const unsigned *amax, uint8_t *xq, float *scale) {
    const float s = e4m3t_scale_of(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
    float v[8];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * (H / 8);
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i / (H / 8), c = 8 * (i % (H / 8));
        load8(x + (p / k) * H + c, v);
        store8_e4m3(xq + (int64_t)slot_of[p] * H + c, v, s);
    }
}

// h[row, :] = bf16(silu(g) u) for the rows that hold a pair (segment padding is never read), and amax(h)
static __global__ void swiglu_amax_kernel(const bf16 *gu, int64_t P, int64_t I, const int32_t *slot_of, bf16 *h,
                                          unsigned *amax) {
    float a = 0.0f, g[8], u[8];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * (I / 8);
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = slot_of[i / (I / 8)], c = 8 * (i % (I / 8));
        load8(gu + row * 2 * I + c, g);
        load8(gu + row * 2 * I + I + c, u);
        uint4 raw;
        __nv_bfloat162 *o = (__nv_bfloat162 *)&raw;
        for (int j = 0; j < 4; j++) {
            o[j] = __floats2bfloat162_rn(g[2 * j] / (1.0f + expf(-g[2 * j])) * u[2 * j],
                                         g[2 * j + 1] / (1.0f + expf(-g[2 * j + 1])) * u[2 * j + 1]);
            const float2 f = __bfloat1622float2(o[j]);
            a = fmaxf(a, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
        *(uint4 *)(h + row * I + c) = raw;
    }
    e4m3t_block_amax_commit(a, amax);
}

// hq[row, :] = e4m3(h[row, :] / s_h) for the rows that hold a pair
static __global__ void quant_rows_kernel(const bf16 *h, int64_t P, int64_t I, const int32_t *slot_of,
                                         const unsigned *amax, uint8_t *hq, float *scale) {
    const float s = e4m3t_scale_of(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
    float v[8];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * (I / 8);
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = slot_of[i / (I / 8)], c = 8 * (i % (I / 8));
        load8(h + row * I + c, v);
        store8_e4m3(hq + row * I + c, v, s);
    }
}

static __global__ void combine_kernel(const bf16 *y, const int32_t *slot_of, const bf16 *w, int64_t T, int32_t k,
                                      int64_t H, bf16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        float acc = 0.0f;
        for (int32_t j = 0; j < k; j++)
            acc += __bfloat162float(w[t * k + j]) * __bfloat162float(y[(int64_t)slot_of[t * k + j] * H + c]);
        out[i] = __float2bfloat16_rn(acc);
    }
}

// ---- host side ----

static fm_status proj_init(fm_lt_moe *m, lt_proj *pr, const fm_bank *bank, unsigned *amax_d, fm_error *err) {
    pr->N = bank->rows, pr->K = bank->cols;
    const size_t wbytes = (size_t)(m->E * pr->N * pr->K);
    if (cudaMalloc((void **)&pr->w, wbytes) != cudaSuccess ||
        cudaMalloc((void **)&pr->scale, (size_t)m->E * LT_SCALE_SLOT * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return fm_fail(err, FM_ERR_NOMEM, "cublaslt moe: out of GPU memory for %zu bytes of e4m3 weights", wbytes);
    }
    cudaStream_t s = m->be->stream;
    FM_CUDA_CHECK(cudaMemsetAsync(amax_d, 0, m->E * sizeof(unsigned), s));
    const dim3 grid(grid_for(pr->N * pr->K, 1024), (unsigned)m->E);
    bank_amax_kernel<<<grid, 256, 0, s>>>((const bf16 *)bank->w, pr->N, pr->K, bank->ld, amax_d);
    FM_LAUNCH_CHECK("lt_bank_amax");
    bank_quant_kernel<<<grid, 256, 0, s>>>((const bf16 *)bank->w, pr->N, pr->K, bank->ld, amax_d, pr->w, pr->scale);
    FM_LAUNCH_CHECK("lt_bank_quant");
    FM_CUDA_CHECK(cudaStreamSynchronize(s)); // amax_d is reused by the next projection

    return fm_lt_gemm_init(&pr->gemm, pr->N, pr->K, err);
}

extern "C" fm_status fm_lt_moe_create(fm_backend *bb, const fm_bank *gate_up, const fm_bank *down, fm_lt_moe **out,
                                      fm_error *err) {
    *out = NULL;
    if (strcmp(bb->ops->name, "cuda") != 0)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "the cuBLASLt FP8 route needs the cuda backend, not %s", bb->ops->name);
    if (gate_up->fmt != FM_W_BF16 || down->fmt != FM_W_BF16)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "the cuBLASLt FP8 route quantizes bf16 banks, got %s and %s",
                       fm_wformat_name(gate_up->fmt), fm_wformat_name(down->fmt));
    const int64_t H = down->rows, I = down->cols;
    if (gate_up->n != down->n || gate_up->rows != 2 * I || gate_up->cols != H)
        return fm_fail(err, FM_ERR_USAGE,
                       "cublaslt moe: banks [%d][%lld, %lld] and [%d][%lld, %lld] are not gate_up [E][2I, H] "
                       "and down [E][H, I]",
                       gate_up->n, (long long)gate_up->rows, (long long)gate_up->cols, down->n, (long long)H,
                       (long long)I);
    if (H % 16 || I % 16)
        return fm_fail(err, FM_ERR_UNSUPPORTED, "the cuBLASLt FP8 route needs H and I multiples of 16 (H %lld, I %lld)",
                       (long long)H, (long long)I);
    fm_lt_moe *m = (fm_lt_moe *)calloc(1, sizeof *m);
    if (!m) return fm_fail(err, FM_ERR_NOMEM, "cublaslt moe: out of host memory");
    m->be = cuda_be(bb), m->E = gate_up->n, m->H = H, m->I = I;
    m->cnt = (int *)calloc((size_t)(2 * m->E), sizeof(int));
    m->off = m->cnt + m->E;
    unsigned *amax_d = NULL;
    fm_status st = FM_OK;
    if (!m->cnt) st = fm_fail(err, FM_ERR_NOMEM, "cublaslt moe: out of host memory");
    if (!st && cudaMalloc((void **)&amax_d, m->E * sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        st = fm_fail(err, FM_ERR_NOMEM, "cublaslt moe: out of GPU memory for the amax counters");
    }
    if (!st) st = fm_lt_init(&m->lt, err);
    if (!st) st = proj_init(m, &m->gu, gate_up, amax_d, err);
    if (!st) st = proj_init(m, &m->dn, down, amax_d, err);
    if (amax_d) FM_CUDA_CHECK(cudaFree(amax_d));
    if (st) {
        fm_lt_moe_free(m);
        return st;
    }
    *out = m;
    return FM_OK;
}

extern "C" size_t fm_lt_moe_weight_bytes(const fm_lt_moe *m) {
    return (size_t)(m->E * (m->gu.N * m->gu.K + m->dn.N * m->dn.K)) + 2 * (size_t)m->E * sizeof(float);
}

static void proj_free(lt_proj *pr) {
    fm_lt_gemm_destroy(&pr->gemm);
    cudaFree(pr->w), cudaFree(pr->scale);
}

extern "C" void fm_lt_moe_free(fm_lt_moe *m) {
    if (!m) return;
    cudaStreamSynchronize(m->be->stream); // nothing in flight still uses the buffers
    proj_free(&m->gu), proj_free(&m->dn);
    fm_lt_destroy(&m->lt);
    cudaFree(m->buf);
    free(m->cnt);
    free(m);
}

// D [n, N] (row-major bf16) = s_w[e] s_b B [n, K] W_e^T, on the backend's stream
static fm_status expert_matmul(fm_lt_moe *m, lt_proj *pr, int32_t e, int n, const uint8_t *B, const float *b_scale,
                               bf16 *D, fm_error *err) {
    char what[64];
    snprintf(what, sizeof what, "expert %d %s", e, pr == &m->gu ? "gate_up" : "down");
    return fm_lt_gemm_run(&m->lt, &pr->gemm, pr->w + (int64_t)e * pr->N * pr->K, pr->scale + (int64_t)e * LT_SCALE_SLOT,
                          B, b_scale, n, D, m->be->stream, what, err);
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// per-call device buffers: scales [2][LT_SCALE_SLOT] f32 (s_x, s_h, each in its own 16-byte slot) | amax [2] u32 |
// counts | fill | offsets [3E] int32, slot_of [P], xq [R, H] e4m3, gu [R, 2I] bf16, h [R, I] bf16, hq [R, I] e4m3,
// y [R, H] bf16 (R = rows with segment padding); every array starts at a multiple of 256 bytes
typedef struct lt_bufs {
    int32_t *counts, *fill, *offsets, *slot_of;
    unsigned *amax;
    float *scale_x, *scale_h;
    uint8_t *xq, *hq;
    bf16 *gu, *h, *y;
} lt_bufs;

static fm_status ensure_buffers(fm_lt_moe *m, int64_t P, int64_t R, lt_bufs *b, fm_error *err) {
    const int64_t E = m->E, H = m->H, I = m->I;
    size_t o[8], at = 0;
    o[0] = at, at += align256(2 * LT_SCALE_SLOT * sizeof(float) + (size_t)(2 + 3 * E) * 4);
    o[1] = at, at += align256((size_t)P * 4);
    o[2] = at, at += align256((size_t)(R * H));
    o[3] = at, at += align256((size_t)(R * 2 * I) * 2);
    o[4] = at, at += align256((size_t)(R * I) * 2);
    o[5] = at, at += align256((size_t)(R * I));
    o[6] = at, at += align256((size_t)(R * H) * 2);
    if (at > m->buf_bytes) {
        if (m->buf) FM_CUDA_CHECK(cudaFree(m->buf)); // waits for the work still using it
        m->buf = NULL, m->buf_bytes = 0;
        if (cudaMalloc((void **)&m->buf, at) != cudaSuccess) {
            cudaGetLastError();
            return fm_fail(err, FM_ERR_NOMEM, "cublaslt moe: out of GPU memory for %zu bytes of activations", at);
        }
        m->buf_bytes = at;
    }
    b->scale_x = (float *)(m->buf + o[0]), b->scale_h = b->scale_x + LT_SCALE_SLOT;
    b->amax = (unsigned *)(b->scale_h + LT_SCALE_SLOT);
    b->counts = (int32_t *)(b->amax + 2), b->fill = b->counts + E, b->offsets = b->fill + E;
    b->slot_of = (int32_t *)(m->buf + o[1]);
    b->xq = (uint8_t *)(m->buf + o[2]), b->gu = (bf16 *)(m->buf + o[3]), b->h = (bf16 *)(m->buf + o[4]);
    b->hq = (uint8_t *)(m->buf + o[5]), b->y = (bf16 *)(m->buf + o[6]);
    return FM_OK;
}

extern "C" fm_status fm_lt_moe_run(fm_lt_moe *m, const void *xv, int64_t T, const void *idsv, const void *weightsv,
                                   int32_t k, void *outv, fm_error *err) {
    const int64_t P = T * k, E = m->E, H = m->H, I = m->I;
    if (P == 0) return FM_OK;
    const bf16 *x = (const bf16 *)xv, *weights = (const bf16 *)weightsv;
    const int32_t *ids = (const int32_t *)idsv;
    if ((uintptr_t)x % 16)
        return fm_fail(err, FM_ERR_USAGE, "cublaslt moe: x must be 16-byte aligned (8-element loads)");
    const int64_t R = fm_ceil_div(P, LT_ROW_ALIGN) * LT_ROW_ALIGN + E * LT_ROW_ALIGN; // rows with segment padding
    lt_bufs b = {};
    fm_status st = ensure_buffers(m, P, R, &b, err);
    if (st) return st;
    cudaStream_t s = m->be->stream;

    FM_CUDA_CHECK(cudaMemsetAsync(b.amax, 0, (size_t)(2 + 3 * E) * 4, s)); // amax, counts, fill, offsets
    count_kernel<<<grid_for(P, 4096), 256, 0, s>>>(ids, P, b.counts);
    FM_LAUNCH_CHECK("lt_moe_count");
    FM_CUDA_CHECK(cudaMemcpyAsync(m->cnt, b.counts, (size_t)E * 4, cudaMemcpyDeviceToHost, s));
    FM_CUDA_CHECK(cudaStreamSynchronize(s)); // the one host synchronisation: GEMM shapes are host arguments
    for (int64_t e = 0, acc = 0; e < E; e++)
        m->off[e] = (int)acc, acc += fm_ceil_div(m->cnt[e], LT_ROW_ALIGN) * LT_ROW_ALIGN;
    FM_CUDA_CHECK(cudaMemcpyAsync(b.offsets, m->off, (size_t)E * 4, cudaMemcpyHostToDevice, s));
    scatter_kernel<<<grid_for(P, 4096), 256, 0, s>>>(ids, P, b.offsets, b.fill, b.slot_of);
    FM_LAUNCH_CHECK("lt_moe_scatter");
    amax_kernel<<<grid_for(T * H / 8, 1024), 256, 0, s>>>(x, T * H, &b.amax[0]);
    FM_LAUNCH_CHECK("lt_moe_amax_x");
    gather_quant_kernel<<<grid_for(P * H / 8, 65536), 256, 0, s>>>(x, P, k, H, b.slot_of, &b.amax[0], b.xq, b.scale_x);
    FM_LAUNCH_CHECK("lt_moe_gather_quant");
    for (int32_t e = 0; !st && e < E; e++)
        if (m->cnt[e])
            st = expert_matmul(m, &m->gu, e, m->cnt[e], b.xq + (int64_t)m->off[e] * H, b.scale_x,
                               b.gu + (int64_t)m->off[e] * 2 * I, err);
    if (st) return st;
    swiglu_amax_kernel<<<grid_for(P * I / 8, 1024), 256, 0, s>>>(b.gu, P, I, b.slot_of, b.h, &b.amax[1]);
    FM_LAUNCH_CHECK("lt_moe_swiglu_amax");
    quant_rows_kernel<<<grid_for(P * I / 8, 65536), 256, 0, s>>>(b.h, P, I, b.slot_of, &b.amax[1], b.hq, b.scale_h);
    FM_LAUNCH_CHECK("lt_moe_quant_h");
    for (int32_t e = 0; !st && e < E; e++)
        if (m->cnt[e])
            st = expert_matmul(m, &m->dn, e, m->cnt[e], b.hq + (int64_t)m->off[e] * I, b.scale_h,
                               b.y + (int64_t)m->off[e] * H, err);
    if (st) return st;
    combine_kernel<<<grid_for(T * H, 65536), 256, 0, s>>>(b.y, b.slot_of, weights, T, k, H, (bf16 *)outv);
    FM_LAUNCH_CHECK("lt_moe_combine");
    return FM_OK;
}
