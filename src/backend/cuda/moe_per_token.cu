// Per-token MoE dispatch (see moe_per_token.cuh): gate|up GEMV for every routed pair p = t * k + j (input row
// t, expert ids[p]), SwiGLU, down GEMV, then each token's k outputs summed in order with their routing weights
// in fp32. The bf16 roundings sit where the CPU reference puts them (src/backend/cpu/cpu_moe.c), so the two
// compute the same function. Launches per layer: 4, whatever T is; no host synchronisation.
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_per_token.cuh"

static __global__ void combine_kernel(const __nv_bfloat16 *y, const __nv_bfloat16 *weights, int64_t T, int32_t k,
                                      int64_t H, __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / H, c = i % H;
        float acc = 0.0f;
        for (int32_t j = 0; j < k; j++) acc += __bfloat162float(weights[t * k + j]) * __bfloat162float(y[(t * k + j) * H + c]);
        out[i] = __float2bfloat16_rn(acc);
    }
}

void fm_cuda_moe_per_token(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x,
                           int64_t T, const int32_t *ids, const __nv_bfloat16 *weights, int32_t k, __nv_bfloat16 *out) {
    const int64_t P = T * k, I = down->cols, H = down->rows;
    if (P == 0) return;
    __nv_bfloat16 *gu = (__nv_bfloat16 *)fm_cuda_workspace(be, (size_t)(P * (2 * I + I + H)) * sizeof(__nv_bfloat16));
    __nv_bfloat16 *h = gu + P * 2 * I, *y = h + P * I;
    fm_cuda_gemv(gate_up, 0, ids, x, k, P, gu, be->stream);
    fm_cuda_swiglu(gu, P, I, h, be->stream);
    fm_cuda_gemv(down, 0, ids, h, 1, P, y, be->stream);
    const int64_t blocks = fm_ceil_div(T * H, 256);
    combine_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, be->stream>>>(y, weights, T, k, H, out);
    FM_LAUNCH_CHECK("moe_combine");
}
