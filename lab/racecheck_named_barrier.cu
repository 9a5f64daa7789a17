// Does compute-sanitizer's racecheck follow __syncthreads after a named barrier that only some warps use? The
// persistent attention block (src/backend/cuda/attn_decode_block.cu) runs the split kernel's CTA in warps 0-3 with
// `bar.sync 1, 128` while warps 4-7 wait at barrier 0, and racecheck then reports hazards between accesses that
// __syncthreads separates. This kernel has the same shape and no race: warps 0-3 use shared memory behind the named
// barrier, then every thread writes and reads another region with __syncthreads between. Build and run (from the
// repository root): make -C lab racecheck_named_barrier, then
//   compute-sanitizer --tool racecheck build/lab/racecheck_named_barrier [named|plain]
// "plain" runs the same kernel with the first phase under __syncthreads by all warps (the control).
#include <cstdio>
#include <cstring>

template <bool NAMED> __global__ void kernel(float *out) {
    __shared__ float a[256], b[256], c[256];
    const int t = threadIdx.x;
    if (NAMED) {
        if (t < 128) { /* phase 1: warps 0-3 only, their own barrier */
            a[t] = (float)t;
            asm volatile("bar.sync 1, 128;" ::: "memory");
            c[t] = a[127 - t];
            asm volatile("bar.sync 1, 128;" ::: "memory");
        }
        __syncthreads();
    } else {
        a[t] = (float)t;
        __syncthreads();
        c[t] = a[255 - t];
        __syncthreads();
    }
    /* phase 2: every thread, barrier 0 between the write and the reads */
    b[t] = c[t & 127] * 2.0f; /* phase 1's results */
    a[t] = 1.0f;              /* over phase 1's reads of a */
    __syncthreads();
    out[blockIdx.x * 256 + t] = b[255 - t];
    __syncthreads();
    b[t] = 0.0f; /* after every read above */
}

int main(int argc, char **argv) {
    const bool named = argc < 2 || strcmp(argv[1], "plain") != 0;
    float *out;
    cudaMalloc(&out, 4 * 256 * sizeof(float));
    if (named) kernel<true><<<4, 256>>>(out);
    else kernel<false><<<4, 256>>>(out);
    const cudaError_t e = cudaDeviceSynchronize();
    printf("%s: %s\n", named ? "named barrier" : "plain", cudaGetErrorString(e));
    cudaFree(out);
    return e != cudaSuccess;
}
