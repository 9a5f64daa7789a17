// CUDA backend: the state and weight-bank layout shared by its .cu files.
//
// Activations are bf16 in device memory (fp32 under the ref32 oracle's plan). Weight banks hold n matrices
// [rows, cols] with padded rows so that every row starts 16-byte aligned (16-byte loads in the GEMV kernels, any
// leading dimension for cuBLAS):
//   bf16:  w is [n][rows][ld] bf16, ld = cols rounded up to 8, padding zero
//   f32:   w is [n][rows][ld] fp32, ld = cols rounded up to 4, padding zero (the ref32 oracle)
//   int4:  w is [n][rows][ld] bytes, ld = cols rounded up to 32 elements / 2, two codes per byte (element
//          2i in the low nibble, two's complement), padding zero; scales [n][rows][n_groups] bf16, one per
//          128 elements along the row (the last group may be partial)
//   e4m3-tensor (W8A8): w is [n][rows][ld] e4m3, ld = cols rounded up to 16, padding zero; tscale [n][4] fp32,
//          the matrix's scale in the first float of its 16-byte slot; lt_gemm its cuBLASLt shape (rows x ld)
//   int4-tc: the tensor-core layout of w4a8_layout.cuh: w is [n][rows_pad / 16][n_groups][1024] bytes, scales
//          [n][n_groups][rows_pad] bf16; ld = n_groups * 128 (the padded K)
//   pre-quantized checkpoints (cuda_bank_prequant.cu):
//   int4-zp: the checkpoint's codes as the row layout of int4 but unsigned; zeros [n][rows][n_groups] bytes and
//          fscales [n][rows][n_groups] fp32 per group of `group` along K; perm [n][cols] int32 or NULL (act-order)
//   int4-zp-tc: w4a8_layout.cuh's tiles of unsigned nibbles (row r low, r + 8 high); fscales (scale x 512) and
//          zscales (zero x scale) [n][n_groups][rows_pad] fp32 per 128-group
//   e4m3-block: w4a8_layout.cuh's tiles holding e4m3 bytes (2048 per 16 rows x 128); fscales [n][n_groups][rows_pad]
//          fp32, the checkpoint's block scale of each row
#ifndef FM_CUDA_INTERNAL_CUH
#define FM_CUDA_INTERNAL_CUH

#include <cublas_v2.h>

extern "C" {
#include "backend/backend.h"
#include "backend/routes.h"
}
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_decode_block.cuh"

#define FM_CUDA_GROUP 128

#define FM_CUBLAS_CHECK(call)                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "fp8moe: cuBLAS error at %s:%d: %s: %d\n", __FILE__, __LINE__, #call, (int)s_);            \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

struct fm_bank {
    fm_wformat fmt;
    int32_t n;
    int64_t rows, cols;
    int64_t ld;       // row stride: elements (bf16, f32) or bytes (int4)
    int64_t n_groups; // int4 only
    int64_t rows_pad; // int4-tc: rows rounded up to 32
    bool interleaved; // int4-tc: a gate|up bank interleaved by 8 rows (w4a8_layout.cuh)
    bool fold;        // int4-tc: codes in the fold layout (backend/w4a8_fold.h), route w4a8.kernel=fold: moe only
    int8_t *fold_j;   // fold: the operand's exponent per (matrix, group, row) [n][G][rows_pad] (w4a8_fold_ws.cu)
    float *fold_rs;   // fold: the row scale x 2^-6 per (matrix, row) [n][rows_pad]
    void *w;
    __nv_bfloat16 *scales;      // int4 only
    float *tscale;              // e4m3-tensor only
    int32_t group;              // int4-zp: K-group size of zeros and fscales
    uint8_t *zeros;             // int4-zp
    float *fscales;             // pre-quantized formats (above)
    float *zscales;             // int4-zp-tc
    int32_t *perm;              // int4-zp, or NULL
    struct fm_lt_gemm *lt_gemm; // e4m3-tensor only
    size_t bytes;
    bool host;              // bank_create_host: w and scales in pinned, mapped host memory (expert_cache.cu)
    const int32_t *slot_of; // an expert cache's pool view: expert e is matrix slot_of[e] (device [n]), else NULL
};

typedef struct cuda_backend {
    fm_backend base;
    fm_backend_ops ops; // the backend's op table (cuda_backend.cu), act_size set for this plan
    bool f32;           // fp32 activations (the ref32 oracle's plan); bf16 otherwise
    cudaStream_t stream;
    cublasHandle_t cublas;
    int device;
    cudaDeviceProp prop;
    fm_routes routes;       // which kernel runs each op at each shape: filled once at creation (routes.h)
    char device_label[320]; // the GPU's name, and the FP8 kernels the routes pick for the plan
    void *work;             // scratch of the ops that need it (moe, quantized linears), see fm_cuda_workspace
    size_t work_bytes;
    bool work_fixed;          // reserved at load for the memory plan's shapes: never grows afterwards
    void *cublas_ws;          // cuBLAS's workspace, given to it at the reservation (none allocated during a pass)
    cudaEvent_t *marks;       // FM_MARK_SLOTS events, created on the first mark
    struct fm_lt *lt;         // cuBLASLt (W8A8 dense projections), created with the first e4m3-tensor bank
    unsigned *router_counter; // the fused router's CTA counter (router.cuh), zero between launches
    void *sample_ws;          // the sampler's split workspace (sampler.cuh: counters, zero between launches; slices)
    unsigned *tail_counter;   // the decode GEMV's CTA counter for its add + RMSNorm tail (row_tail.cuh), likewise;
                              // after it FM_MOE_GEMV_MAX_PAIRS per token counters of the down GEMV's (moe.combine)
    unsigned *block_barrier;  // the persistent decode MoE block's grid barrier (moe_decode_block.cuh), likewise
    unsigned long long *block_counts;               // its counting barrier's words (moe.block_barrier=count), likewise
    int32_t block_count_grids[FM_MOE_BLOCK_COUNTS]; // the grid size each of them serves (0: free)
    unsigned *gdn_arrivals; // the fused GDN decode kernel's per (row, key head) counters (gdn_decode.cu), likewise
    /* the side stream (ops side_begin / side_end / side_join), made at the reservation when asked for: between
       side_begin and side_end the fields above (stream, cublas, work, work_bytes) hold the side_* ones below, swapped,
       so every op issues there unchanged. Not swapped, so never used by both chains at once: the fused router's
       counter (router_counter), the GEMV tail's (tail_counter), the fused GDN op's (gdn_arrivals) and the W8A8
       quantizer's grid barrier (lt->grid_sync); the forward pass puts no router or W8A8 linear on the main chain while
       the side chain runs one */
    cudaStream_t side_stream;
    cublasHandle_t side_cublas;
    void *side_work;
    size_t side_work_bytes;
    void *side_cublas_ws;
    cudaEvent_t side_fork, side_done; // recorded on the main stream at side_begin, on the side stream at side_end
    bool in_side;
    // the load's two pinned staging buffers for native int4 banks (cuda_bank_native_int4.cu): one is filled on every
    // host core while the other's copy runs; load_copied[b] marks the end of buffer b's last copy
    void *load_stage[2];
    size_t load_stage_bytes;
    cudaEvent_t load_copied[2];
} cuda_backend;

static inline cuda_backend *cuda_be(fm_backend *be) { return (cuda_backend *)be; }

// The ops' scratch: at least `bytes`, contents not kept between ops. Once the load has reserved it for the memory
// plan (ops->reserve), it never grows: asking for more is a bug of the plan (cuda_kind.c, cuda_workspace) and stops
// with both sizes. A backend used without a reservation (op tests, kernel benchmarks) grows it on demand, outside any
// stream capture.
void *fm_cuda_workspace(cuda_backend *be, size_t bytes);
// Bytes of the workspace cuBLAS gets from the reservation (NVIDIA's recommendation for Hopper: 32 MiB).
#define FM_CUDA_CUBLAS_WS ((size_t)32 << 20)
// The side stream's cuBLAS workspace: the main handle's size, because cuBLAS picks its algorithm (and so the
// summation order) by the workspace it may use: with 4 MiB, ref32's prefill GEMMs on the side stream came out other
// bits than on the main stream (bench/NOTES.md 2026-12-02, "a side stream in the decode step")
#define FM_CUDA_SIDE_CUBLAS_WS FM_CUDA_CUBLAS_WS
// The fused GDN decode kernel's counters, one per (row, key head): 256 KiB, decode steps of up to 4,096 rows at
// Qwen3-Next's 16 key heads; a larger step runs the chain (fm_cuda_gdn_decode_fused returns false).
#define FM_CUDA_GDN_ARRIVALS ((int64_t)1 << 16)

extern "C" {
// FM_OK when the binary has kernels for GPU `device`; else FM_ERR_UNSUPPORTED naming the GPU and the archs it was
// built for (device_info.cu).
fm_status fm_cuda_device_has_kernels(int device, fm_error *err);
fm_status fm_cuda_bank_create(fm_backend *bb, const fm_bank_src *src, fm_wformat fmt, fm_bank **out, fm_error *err);
void fm_cuda_bank_free(fm_backend *be, fm_bank *w);
size_t fm_cuda_bank_bytes(const fm_bank *w);
}
// Route w4a8.kernel=fold, an expert bank (src->experts): its int4-tc codes into the fold layout when every row's
// scales have the int4-p2 form, else the load refused naming the bank (cuda_bank_fold.cu); nothing otherwise.
fm_status fm_cuda_bank_fold(cuda_backend *be, const fm_bank_src *src, fm_bank *w, fm_error *err);

static inline const __nv_bfloat16 *bank_bf16(const fm_bank *w, int32_t idx) {
    return (const __nv_bfloat16 *)w->w + (int64_t)idx * w->rows * w->ld;
}
static inline const float *bank_f32(const fm_bank *w, int32_t idx) {
    return (const float *)w->w + (int64_t)idx * w->rows * w->ld;
}
// element size of a bf16 or f32 bank, and its matrix idx
static inline size_t bank_elem_size(const fm_bank *w) { return w->fmt == FM_W_F32 ? 4 : 2; }
static inline const void *bank_matrix(const fm_bank *w, int32_t idx) {
    return (const char *)w->w + (size_t)idx * (size_t)(w->rows * w->ld) * bank_elem_size(w);
}

#endif
