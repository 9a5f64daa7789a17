// The MoE block's end in one kernel (moe_combine_norm.cuh). Decode floor: a token reads its k routed rows and its
// residual row and writes the residual and the normed row, (k + 3) H bf16 = 45 KB at Qwen3-30B-A3B's k = 8, H = 2048:
// ~10 ns at 4.25 TB/s, so the kernel is all launch, wait and ramp; what it saves is the second of the two launches
// (~2-4 us under a graph, bench/NOTES.md 2026-12-05) and one write + read of the combined row.
//
// Layout: one block of NORM_THREADS per token; thread t owns the 8-element chunks t, t + NORM_THREADS of the row
// (norm_row.cuh), combines them from the k routed rows with the products and order of moe_combine_bf16x8_kernel,
// rounds to bf16 as that kernel stores, then adds, rounds, sums squares and normalises exactly as add_rmsnorm_kernel:
// the result is the two kernels' bit for bit.
//
// QOUT (route dense.quant=producer): the normed row's 128-groups are then quantized with the quantizer's arithmetic on
// the bf16 values just stored (from the registers that hold them, moe_combine_row.cuh) into the next q|k|v
// projection's rows: the codes and scales fm_cuda_quantize_e4m3_rows would write, without its launch.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_combine_norm.cuh"
#include "backend/cuda/moe_combine_row.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"

typedef __nv_bfloat16 bf16;

template <bool QOUT>
static __global__ __launch_bounds__(NORM_THREADS) void moe_combine_add_rmsnorm_kernel(
    const bf16 *__restrict__ y, const int32_t *__restrict__ slot_of, const bf16 *__restrict__ w, int32_t k, int64_t H,
    bf16 *__restrict__ acc, const bf16 *__restrict__ norm, float eps, bf16 *__restrict__ out, uint8_t *out_q,
    float *out_qs) {
    float wv[NORM_CHUNKS][8];
    combine_row_norm_weights(norm, H, wv); /* no earlier kernel's output: loaded while the down projection finishes */
    pdl_wait();
    const int64_t t = blockIdx.x;
    combine_add_rmsnorm_row(y, slot_of, w, k, H, t, acc, eps, wv, out, QOUT ? out_q : NULL, out_qs, gridDim.x);
}

extern "C" void fm_cuda_moe_combine_add_rmsnorm(const bf16 *y, const int32_t *slot_of, const bf16 *w, int64_t T,
                                                int32_t k, int64_t H, bf16 *scratch, bf16 *acc, const bf16 *norm,
                                                float eps, bf16 *out, uint8_t *out_q, float *out_qs, bool pdl,
                                                cudaStream_t s) {
    if (T <= 0) return;
    const bool one_kernel = T <= INT32_MAX && fm_combine_row_takes(H, y, acc, norm, out);
    if (!one_kernel) { /* the two kernels it fuses, in their order, and the quantizer */
        fm_cuda_moe_combine(y, slot_of, w, T, k, H, scratch, pdl, s);
        fm_cuda_add_rmsnorm(acc, scratch, norm, T, H, eps, out, pdl, s);
        if (out_q) fm_cuda_quantize_e4m3_rows(out, T, H, out_q, out_qs, NULL, T, pdl, s);
        return;
    }
    void *args[] = {(void *)&y,    (void *)&slot_of, (void *)&w,   (void *)&k,     (void *)&H,     (void *)&acc,
                    (void *)&norm, (void *)&eps,     (void *)&out, (void *)&out_q, (void *)&out_qs};
    const void *kernel = out_q ? (const void *)moe_combine_add_rmsnorm_kernel<true>
                               : (const void *)moe_combine_add_rmsnorm_kernel<false>;
    fm_cuda_launch_pdl(kernel, dim3((unsigned)T), dim3(NORM_THREADS), 0, s, args, pdl);
    FM_LAUNCH_CHECK("moe_combine_add_rmsnorm");
}
