// Shared by the CUDA backend's .cu files: error checks that name the call and the kernel, and activation helpers.
//
// Every CUDA runtime call goes through FM_CUDA_CHECK (a failure stops with file:line and the failing call: a
// device fault is a broken invariant, not a recoverable condition). Every launch is followed by
// FM_LAUNCH_CHECK("kernel name"): it checks the launch, and in debug mode (environment FP8MOE_SYNC=1) it also
// synchronises, so an asynchronous fault is reported at the kernel that caused it, not at a later call.
#ifndef FM_CUDA_COMMON_CUH
#define FM_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FM_CUDA_CHECK(call)                                                                                            \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "fp8moe: CUDA error at %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                        \
                    cudaGetErrorString(e_));                                                                           \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

// Debug mode (environment FP8MOE_SYNC=1): every launch is waited for, and ops that can check their inputs do
// (the W8A8 activation quantizer reports NaN/Inf inputs).
bool fm_cuda_debug_mode(void);

// An attribute of the current device (compute capability, SM count, ...); stops the program if CUDA cannot say
int fm_cuda_device_attr(cudaDeviceAttr attr);
// Checks the last launch; with FP8MOE_SYNC=1 also waits for it and names it on failure.
void fm_cuda_launch_check(const char *kernel, const char *file, int line);
#define FM_LAUNCH_CHECK(kernel) fm_cuda_launch_check((kernel), __FILE__, __LINE__)

static inline int64_t fm_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Activation element access for kernels written once for both activation types (template <typename A>):
// bf16 (the compute presets, one rounding per store) and fp32 (the ref32 oracle, cuda_backend.cu).
static __device__ __forceinline__ float act_load(float x) { return x; }
static __device__ __forceinline__ float act_load(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ void act_store(float *p, float v) { *p = v; }
static __device__ __forceinline__ void act_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
// Two adjacent elements (p[0], p[1]): one 4-byte access for bf16 (p 4-byte aligned), two for fp32
static __device__ __forceinline__ void act_load_pair(const __nv_bfloat16 *p, float *x) {
    const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)p);
    x[0] = f.x, x[1] = f.y;
}
static __device__ __forceinline__ void act_load_pair(const float *p, float *x) { x[0] = p[0], x[1] = p[1]; }
static __device__ __forceinline__ void act_store_pair(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
static __device__ __forceinline__ void act_store_pair(float *p, float a, float b) { p[0] = a, p[1] = b; }

#endif
