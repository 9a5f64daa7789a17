/* The NCCL world (src/backend/cuda/comm_nccl.cu, dist/comm.h) on the GPUs of this machine: one rank per GPU (all of
 * them, at most 8), each rank a thread with its own stream and device buffers. Every collective against what it must
 * give, computed on the host: the all-reduce's sums bit for bit as the simulated world's (rank order, fp32, rounded
 * once for bf16) on every rank, the all-gather's and all-to-all's bytes exactly, the bytes each rank sent. With one
 * GPU the world has one rank: the calls, the scratch and the sum kernel run, the exchanges are copies. Needs
 * libnccl.so.2 where the loader finds it (tools/gpu-check.sh points LD_LIBRARY_PATH at PyTorch's). Runs only where a
 * GPU is present. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "gpu_test_util.h"
#include "quant/bf16.h"

#define N_ELEMS 100003 /* odd, several blocks of the sum kernel */
#define GATHER_BYTES 4099
#define A2A_BLOCK 1031
#define MAX_GPUS 8

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
    } while (0)

typedef struct rank_job {
    fm_comm *c;
    int n_ranks, device;
    fm_status st[4];
    fm_error err[4];
    float *red;     /* all_reduce f32 result (host copy) */
    uint16_t *redb; /* all_reduce bf16 result */
    uint8_t *gathered, *a2a;
    uint64_t sent;
} rank_job;

static float value(int rank, int64_t i) { /* values whose sum depends on the order of the additions */
    const float scale[3] = {1e8f, 1.0f, 3e-8f};
    return scale[(rank + i) % 3] * (float)((i * 7919 + rank * 104729) % 1000 - 500) / 500.0f;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    const int r = fm_comm_rank(j->c), n = j->n_ranks;
    if (cudaSetDevice(j->device) != cudaSuccess) return NULL;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return NULL;
    fm_comm_set_stream(j->c, s);
    j->red = malloc(N_ELEMS * sizeof *j->red), j->redb = malloc(N_ELEMS * sizeof *j->redb);
    for (int64_t i = 0; i < N_ELEMS; i++) j->red[i] = value(r, i), j->redb[i] = fm_f32_to_bf16(value(r, i));
    uint8_t *send = malloc(GATHER_BYTES), *blocks = malloc((size_t)n * A2A_BLOCK); /* block d goes to rank d */
    for (int i = 0; i < GATHER_BYTES; i++) send[i] = (uint8_t)(r * 31 + i);
    for (int d = 0; d < n; d++)
        for (int i = 0; i < A2A_BLOCK; i++) blocks[d * A2A_BLOCK + i] = (uint8_t)(r * 17 + d * 5 + i);
    void *d_red, *d_redb, *d_send, *d_gathered, *d_blocks, *d_a2a;
    cudaMalloc(&d_red, N_ELEMS * 4), cudaMalloc(&d_redb, N_ELEMS * 2), cudaMalloc(&d_send, GATHER_BYTES);
    cudaMalloc(&d_gathered, (size_t)n * GATHER_BYTES), cudaMalloc(&d_blocks, (size_t)n * A2A_BLOCK);
    cudaMalloc(&d_a2a, (size_t)n * A2A_BLOCK);
    cudaMemcpy(d_red, j->red, N_ELEMS * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_redb, j->redb, N_ELEMS * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_send, send, GATHER_BYTES, cudaMemcpyHostToDevice);
    cudaMemcpy(d_blocks, blocks, (size_t)n * A2A_BLOCK, cudaMemcpyHostToDevice);
    j->st[0] = fm_comm_all_reduce_sum(j->c, d_red, N_ELEMS, FM_COMM_F32, &j->err[0]);
    j->st[1] = fm_comm_all_reduce_sum(j->c, d_redb, N_ELEMS, FM_COMM_BF16, &j->err[1]);
    j->st[2] = fm_comm_all_gather(j->c, d_send, d_gathered, GATHER_BYTES, &j->err[2]);
    j->st[3] = fm_comm_all_to_all(j->c, d_blocks, d_a2a, A2A_BLOCK, &j->err[3]);
    cudaStreamSynchronize(s);
    j->gathered = calloc((size_t)n, GATHER_BYTES), j->a2a = calloc((size_t)n, A2A_BLOCK);
    cudaMemcpy(j->red, d_red, N_ELEMS * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(j->redb, d_redb, N_ELEMS * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(j->gathered, d_gathered, (size_t)n * GATHER_BYTES, cudaMemcpyDeviceToHost);
    cudaMemcpy(j->a2a, d_a2a, (size_t)n * A2A_BLOCK, cudaMemcpyDeviceToHost);
    j->sent = fm_comm_bytes_sent(j->c);
    cudaFree(d_red), cudaFree(d_redb), cudaFree(d_send), cudaFree(d_gathered), cudaFree(d_blocks), cudaFree(d_a2a);
    cudaStreamDestroy(s);
    free(send), free(blocks);
    return NULL;
}

static void test_collectives(void **state) {
    (void)state;
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n > MAX_GPUS) n = MAX_GPUS;
    int devices[MAX_GPUS];
    for (int d = 0; d < n; d++) devices[d] = d;
    fm_world *w = NULL;
    fm_error err = {{0}};
    if (fm_world_create_nccl(n, devices, &w, &err)) fail_msg("NCCL world of %d GPUs: %s", n, err.msg);
    assert_string_equal(fm_comm_kind(fm_world_comm(w, 0)), "NCCL");
    rank_job jobs[MAX_GPUS];
    pthread_t th[MAX_GPUS];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < n; r++) {
        jobs[r].c = fm_world_comm(w, r), jobs[r].n_ranks = n, jobs[r].device = devices[r];
        assert_int_equal(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < 4; k++)
            if (jobs[r].st[k] != FM_OK) fail_msg("rank %d collective %d: %s", r, k, jobs[r].err[k].msg);
    int64_t checked = 0;
    for (int64_t i = 0; i < N_ELEMS; i++) {
        float want = 0.0f, wantb = 0.0f; /* rank order, fp32: the simulated world's sums */
        for (int r = 0; r < n; r++) want += value(r, i), wantb += fm_bf16_to_f32(fm_f32_to_bf16(value(r, i)));
        for (int r = 0; r < n; r++, checked++) {
            if (memcmp(&jobs[r].red[i], &want, sizeof want))
                fail_msg("all_reduce f32: rank %d element %lld: %.9g, want %.9g", r, (long long)i, jobs[r].red[i],
                         want);
            if (jobs[r].redb[i] != fm_f32_to_bf16(wantb))
                fail_msg("all_reduce bf16: rank %d element %lld: 0x%04x, want 0x%04x", r, (long long)i, jobs[r].redb[i],
                         fm_f32_to_bf16(wantb));
        }
    }
    for (int r = 0; r < n; r++) {
        for (int src = 0; src < n; src++) {
            for (int i = 0; i < GATHER_BYTES; i++)
                assert_int_equal(jobs[r].gathered[src * GATHER_BYTES + i], (uint8_t)(src * 31 + i));
            for (int i = 0; i < A2A_BLOCK; i++) /* what rank src put in its block for rank r */
                assert_int_equal(jobs[r].a2a[src * A2A_BLOCK + i], (uint8_t)(src * 17 + r * 5 + i));
        }
        const uint64_t want_sent = (uint64_t)(n - 1) * (N_ELEMS * 4 + N_ELEMS * 2 + GATHER_BYTES + A2A_BLOCK);
        assert_int_equal(jobs[r].sent, want_sent);
        free(jobs[r].red), free(jobs[r].redb), free(jobs[r].gathered), free(jobs[r].a2a);
    }
    printf("  NCCL %d over %d GPU(s): all_reduce (f32 and bf16, %d elements: %lld values bit for bit as the rank-order "
           "sum), all_gather (%d bytes), all_to_all (%d-byte blocks) as computed on the host\n",
           fm_nccl_version(), n, N_ELEMS, (long long)checked, GATHER_BYTES, A2A_BLOCK);
    fm_world_free(w);
}

int main(int argc, char **argv) {
    gpu_test_args(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_collectives)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
