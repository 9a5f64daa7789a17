// The fp8 preset's MoE expert FFN on the GPU: device-side dispatch, one grouped W4A8 GEMM for gate|up with the
// SwiGLU and the e4m3 requantization in its epilogue, one grouped W4A8 GEMM for down, and a deterministic
// combine. Six launches (count, plan, place+quantize, two GEMMs, combine) and one or two memsets per layer, no
// host synchronisation.
#ifndef FM_CUDA_MOE_W4A8_CUH
#define FM_CUDA_MOE_W4A8_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/moe_combine_norm.cuh"
#include "backend/cuda/row_tail.cuh"

// Same contract as the backend's moe op (backend.h); gate_up and down are int4-tc banks, gate_up interleaved.
// a_dispatch: e4m3 1x128, or FP4 (MXFP4, NVFP4: int4-tc banks only) for the gate|up input; the down input is e4m3.
// tail: NULL, or the moe_add_rmsnorm op's end (decode.fused): the combine adds into tail->acc and out is its norm (with
// tail->out_q, out's rows also quantized there, fm_qrows).
// router: NULL (ids and weights are given), or the router op before it (route moe.dispatch=fused) whose launch also
// dispatches the rows (fm_cuda_router_dispatch): it writes logits, ids and weights, where
// fm_cuda_moe_w4a8_router_takes says so.
typedef struct fm_moe_router {
    const __nv_bfloat16 *w; // the router's bf16 matrix [E][ld], H columns (x's)
    int64_t ld;
    bool softmax_topk, norm_topk, shared; // as fm_cuda_router_fused takes them
    __nv_bfloat16 *logits;                // [T][E]
    unsigned *counter;                    // the fused router's counter (zero between launches)
} fm_moe_router;
void fm_cuda_moe_w4a8(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x, int64_t T,
                      const int32_t *ids, const __nv_bfloat16 *weights, int32_t k, fm_afmt a_dispatch,
                      const fm_moe_norm_tail *tail, __nv_bfloat16 *out, const fm_moe_router *router);
// Whether the experts' dispatch of T tokens can run in the fused router's launch: the decode GEMVs (moe.gemv) of
// non-fold banks with their own expert ids (no expert cache) on e4m3 1x128 rows. The router's own conditions
// (router.fused, fm_cuda_router_dispatch_takes) are the caller's.
bool fm_cuda_moe_w4a8_router_takes(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, int64_t T, int32_t k,
                                   fm_afmt a_dispatch);
// The router and the experts of one token in one persistent launch (route moe.persistent,
// moe_decode_block.cuh): the router op and then the moe_add_rmsnorm op (tail not NULL), bit for bit those of the
// fused router and the decode GEMVs (a shared expert in the bank too: its pair the last). False, with nothing launched,
// where it does not apply (T != 1, no tail, banks other than int4-tc, an expert cache, rows other than e4m3 1x128,
// experts not on the decode GEMVs (moe.gemv), shapes fm_cuda_moe_decode_block_takes refuses). tail->out_q, out_qs:
// NULL, or out quantized for the next dense linear as well (fm_qrows' codes and scales, one row).
// pre (NULL: none; route moe.block_norm): x made first in the block, tail->acc += pre->y and x = pre->x =
// rmsnorm(acc) * pre->norm, the add_rmsnorm op's bits (false where the rows are not 16-byte aligned).
typedef struct fm_moe_pre {
    const __nv_bfloat16 *y, *norm;
    float eps;
    __nv_bfloat16 *x;
} fm_moe_pre;
bool fm_cuda_moe_w4a8_block(cuda_backend *be, const fm_moe_router *router, const fm_bank *gate_up, const fm_bank *down,
                            const __nv_bfloat16 *x, int64_t T, int32_t k, int32_t *ids, __nv_bfloat16 *weights,
                            fm_afmt a_dispatch, fm_afmt a_down, const fm_moe_norm_tail *tail, __nv_bfloat16 *out,
                            const fm_moe_pre *pre);
// Expert parallelism's moe_blocks op (backend.h) on W4A8 banks: the experts on the rows of the received dispatch
// blocks (backend/ep_blocks.h; e4m3, or MXFP4 / NVFP4 on int4-tc banks; amaxes: NVFP4's, every rank's amax, device
// fp32 [N]), each output row in its place of the return blocks yret.
struct fm_ep_layout;
void fm_cuda_moe_w4a8_blocks(cuda_backend *be, const struct fm_ep_layout *L, const fm_bank *gate_up,
                             const fm_bank *down, const uint8_t *recv, const float *amaxes, __nv_bfloat16 *yret);

// Dense W4A8 projection y[M, N] = x[M, K] W[idx]^T: x quantized to e4m3 1x128, then the same GEMM kernel with
// one matrix. w is an int4-tc bank.
void fm_cuda_linear_w4a8(cuda_backend *be, const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                         __nv_bfloat16 *y);
// The same for matrix 0, then acc [M, N] += y and out = rmsnorm(acc) * norm in the decode GEMV's last CTA
// (row_tail.cuh, as fm_cuda_linear_w8a8_add_rmsnorm; route decode.fused: the fp8 preset's o projection and the next
// add_rmsnorm in one launch). False, with nothing launched, where that does not apply (M above the GEMV's rows, an
// interleaved bank, rows that fm_row_tail_takes refuses): the caller then runs the two ops.
bool fm_cuda_linear_w4a8_add_rmsnorm(cuda_backend *be, const fm_bank *w, const __nv_bfloat16 *x, int64_t M,
                                     __nv_bfloat16 *y, __nv_bfloat16 *acc, const __nv_bfloat16 *norm, float eps,
                                     __nv_bfloat16 *out);
// Whether fm_cuda_linear_w4a8_add_rmsnorm takes these rows (M, y and the tail's buffers on matrix 0 of w); if so, tail
// is the GEMV's tail for them
bool fm_cuda_linear_w4a8_tail(cuda_backend *be, const fm_bank *w, int64_t M, __nv_bfloat16 *y, __nv_bfloat16 *acc,
                              const __nv_bfloat16 *norm, float eps, __nv_bfloat16 *out, fm_row_tail *tail);
// The workspace's e4m3 rows of a dense W4A8 linear's input [M][w->cols], where fm_cuda_linear_w4a8 quantizes x: codes
// x8 [M][pad128 K], scales xs [group][M], group sums xsum for an int4-zp-tc bank (else NULL). A producer of x may write
// them itself (paged attention for o: route dense.quant=producer), then fm_cuda_linear_w4a8_from_rows instead of the
// linear.
void fm_cuda_w4a8_linear_rows(cuda_backend *be, const fm_bank *w, int64_t M, uint8_t **x8, float **xs, float **xsum);
// fm_cuda_linear_w4a8 (tail NULL) or fm_cuda_linear_w4a8_add_rmsnorm (tail: fm_cuda_linear_w4a8_tail's) from x's rows
// already quantized
void fm_cuda_linear_w4a8_from_rows(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *x8, const float *xs,
                                   const float *xsum, int64_t M, __nv_bfloat16 *y, const fm_row_tail *tail);
// Its GEMM on x already quantized (x8 [M][pad128 K], xs [group][M], xsum as xs for int4-zp-tc banks, else NULL):
// the mma.sync GEMV or the grouped kernel, as the backend's route table says (fm_routes_dense_kernel).
void fm_cuda_w4a8_linear_gemm(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *x8, const float *xs,
                              const float *xsum, int64_t M, __nv_bfloat16 *y);

#endif
