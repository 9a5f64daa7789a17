// Per-token MoE dispatch (see moe_per_token.cuh): gate|up GEMV for every routed pair p = t * k + j (input row
// t, expert ids[p]), SwiGLU, down GEMV, then each token's k outputs summed in order with their routing weights
// in fp32. The bf16 roundings sit where the CPU reference puts them (src/backend/cpu/cpu_moe.c), so the two
// compute the same function. Launches per layer: 4, whatever T is; no host synchronisation.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_per_token.cuh"

void fm_cuda_moe_per_token(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x,
                           int64_t T, const int32_t *ids, const __nv_bfloat16 *weights, int32_t k, __nv_bfloat16 *out) {
    const int64_t P = T * k, I = down->cols, H = down->rows;
    if (P == 0) return;
    __nv_bfloat16 *gu = (__nv_bfloat16 *)fm_cuda_workspace(be, (size_t)(P * (2 * I + I + H)) * sizeof(__nv_bfloat16));
    __nv_bfloat16 *h = gu + P * 2 * I, *y = h + P * I;
    fm_cuda_gemv(gate_up, 0, ids, x, k, P, gu, be->stream);
    fm_cuda_swiglu(gu, P, I, h, fm_routes_pdl(&be->routes), be->stream);
    fm_cuda_gemv(down, 0, ids, h, 1, P, y, be->stream);
    fm_cuda_moe_combine(y, NULL, weights, T, k, H, out, fm_routes_pdl(&be->routes), be->stream);
}
