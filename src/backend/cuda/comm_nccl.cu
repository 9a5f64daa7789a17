// The NCCL world (dist/comm.h): one process, a thread per rank, rank r on one GPU, communicators from
// ncclCommInitAll. NCCL is loaded at run time (dlopen of libnccl.so.2): the build needs no NCCL headers or library,
// and a binary that never makes an NCCL world never looks for it. The few entry points used are declared below with
// nccl.h's types as their ABI has been since NCCL 2.0 (opaque communicator, int-sized result and data-type enums).
//
// Every collective enqueues on the rank's stream (fm_comm_set_stream) after making the rank's GPU current, and
// returns without waiting:
//   all_gather      ncclAllGather of bytes
//   all_to_all      ncclSend / ncclRecv of one block per peer in one group; the rank's own block by a device copy
//   all_reduce_sum  ncclAllGather into the rank's scratch ([N][n]), then sum_ranks_kernel adds the N parts in rank
//                   order in fp32 and rounds once, as the simulated world does: every rank gets the same bits, where
//                   NCCL's own reductions choose their order (by algorithm, protocol and ring position)
// Bytes sent count what leaves the rank: (N - 1) parts of an all-gather, (N - 1) blocks of an all-to-all.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "dist/comm_world.h"
#include "util/status.h"
}

typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t;                                     // ncclSuccess = 0
enum { NCCL_UINT8 = 1, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 }; // ncclDataType_t values (nccl.h)

typedef struct nccl_api {
    void *lib;
    ncclResult_t (*comm_init_all)(ncclComm_t *comms, int ndev, const int *devlist);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    ncclResult_t (*all_gather)(const void *send, void *recv, size_t count, int type, ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*send)(const void *buf, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*recv)(void *buf, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t r);
    ncclResult_t (*get_version)(int *version);
} nccl_api;

static nccl_api api;

static fm_status load_nccl(fm_error *err) {
    if (api.lib) return FM_OK;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return fm_fail(err, FM_ERR_BACKEND,
                       "NCCL: libnccl.so.2 could not be loaded (%s); install NCCL or point LD_LIBRARY_PATH to the "
                       "folder that holds it (with PyTorch installed: the nvidia/nccl/lib folder of its packages)",
                       dlerror());
    nccl_api a;
    memset(&a, 0, sizeof a);
    a.lib = lib;
#define SYM(field, name) *(void **)&a.field = dlsym(lib, name)
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(all_gather, "ncclAllGather");
    SYM(send, "ncclSend");
    SYM(recv, "ncclRecv");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(error_string, "ncclGetErrorString");
    SYM(get_version, "ncclGetVersion");
#undef SYM
    if (!a.comm_init_all || !a.comm_destroy || !a.all_gather || !a.send || !a.recv || !a.group_start || !a.group_end ||
        !a.error_string || !a.get_version) {
        dlclose(lib);
        return fm_fail(err, FM_ERR_BACKEND, "NCCL: libnccl.so.2 lacks an entry point (ncclSend needs NCCL >= 2.7)");
    }
    api = a; // kept loaded for the life of the process
    return FM_OK;
}

static fm_status nccl_check(ncclResult_t r, const char *what, fm_error *err) {
    return r == 0 ? FM_OK : fm_fail(err, FM_ERR_BACKEND, "NCCL %s: %s", what, api.error_string(r));
}

static fm_status cuda_check(cudaError_t e, const char *what, fm_error *err) {
    if (e == cudaSuccess) return FM_OK;
    cudaGetLastError();
    return fm_fail(err, FM_ERR_BACKEND, "NCCL world: %s: %s", what, cudaGetErrorString(e));
}

typedef struct nccl_rank {
    ncclComm_t comm;
    int device;
    void *scratch; // all_reduce_sum's gathered parts
    size_t scratch_bytes;
} nccl_rank;

static nccl_rank *rank_of(const fm_comm *c) { return (nccl_rank *)c->impl; }
static cudaStream_t stream_of(const fm_comm *c) { return (cudaStream_t)c->stream; }

template <typename A> static __global__ void sum_ranks_kernel(const A *parts, int n_ranks, int64_t n, A *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < n_ranks; r++) s += act_load(parts[(int64_t)r * n + i]); // rank order
        act_store(out + i, s);
    }
}

// The scratch grows outside a stream capture only (a captured step must find it reserved: a first eager step does)
static fm_status scratch_for(fm_comm *c, size_t bytes, fm_error *err) {
    nccl_rank *r = rank_of(c);
    if (bytes <= r->scratch_bytes) return FM_OK;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    fm_status st = cuda_check(cudaStreamIsCapturing(stream_of(c), &capturing), "stream query", err);
    if (st) return st;
    if (capturing != cudaStreamCaptureStatusNone)
        return fm_fail(err, FM_ERR_USAGE,
                       "NCCL all_reduce: %zu bytes of scratch asked during a stream capture (%zu held); run the "
                       "step once without capture first",
                       bytes, r->scratch_bytes);
    if (r->scratch) {
        st = cuda_check(cudaStreamSynchronize(stream_of(c)), "synchronize", err);
        if (!st) st = cuda_check(cudaFree(r->scratch), "free", err);
        if (st) return st;
        r->scratch = NULL, r->scratch_bytes = 0;
    }
    st = cuda_check(cudaMalloc(&r->scratch, bytes), "scratch allocation", err);
    if (!st) r->scratch_bytes = bytes;
    return st;
}

static fm_status nccl_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err) {
    if (n < 0 || (n > 0 && !buf)) return fm_fail(err, FM_ERR_USAGE, "all_reduce of %lld elements", (long long)n);
    if (n == 0) return FM_OK;
    nccl_rank *r = rank_of(c);
    const int N = c->w->n;
    const size_t elem = t == FM_COMM_F32 ? 4 : 2;
    fm_status st = cuda_check(cudaSetDevice(r->device), "cudaSetDevice", err);
    if (!st) st = scratch_for(c, (size_t)N * (size_t)n * elem, err);
    if (!st)
        st = nccl_check(api.all_gather(buf, r->scratch, (size_t)n, t == FM_COMM_F32 ? NCCL_FLOAT32 : NCCL_BFLOAT16,
                                       r->comm, stream_of(c)),
                        "all_gather (all_reduce)", err);
    if (st) return st;
    const int threads = 256;
    const unsigned blocks = (unsigned)(fm_ceil_div(n, threads) < 1024 ? fm_ceil_div(n, threads) : 1024);
    if (t == FM_COMM_F32)
        sum_ranks_kernel<float><<<blocks, threads, 0, stream_of(c)>>>((const float *)r->scratch, N, n, (float *)buf);
    else
        sum_ranks_kernel<__nv_bfloat16>
            <<<blocks, threads, 0, stream_of(c)>>>((const __nv_bfloat16 *)r->scratch, N, n, (__nv_bfloat16 *)buf);
    st = cuda_check(cudaGetLastError(), "sum_ranks launch", err);
    if (!st) c->sent += (uint64_t)(N - 1) * (uint64_t)n * elem;
    return st;
}

static fm_status nccl_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err) {
    if (bytes == 0) return FM_OK;
    nccl_rank *r = rank_of(c);
    fm_status st = cuda_check(cudaSetDevice(r->device), "cudaSetDevice", err);
    if (!st) st = nccl_check(api.all_gather(send, recv, bytes, NCCL_UINT8, r->comm, stream_of(c)), "all_gather", err);
    if (!st) c->sent += (uint64_t)(c->w->n - 1) * bytes;
    return st;
}

static fm_status nccl_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err) {
    if (block == 0) return FM_OK;
    nccl_rank *r = rank_of(c);
    const int N = c->w->n, me = c->rank;
    fm_status st = cuda_check(cudaSetDevice(r->device), "cudaSetDevice", err);
    if (st) return st;
    if (N > 1) {
        st = nccl_check(api.group_start(), "group start", err);
        for (int p = 0; !st && p < N; p++) {
            if (p == me) continue;
            st = nccl_check(
                api.send((const char *)send + (size_t)p * block, block, NCCL_UINT8, p, r->comm, stream_of(c)), "send",
                err);
            if (!st)
                st = nccl_check(api.recv((char *)recv + (size_t)p * block, block, NCCL_UINT8, p, r->comm, stream_of(c)),
                                "recv", err);
        }
        const fm_status end = nccl_check(api.group_end(), "group end", err); // always closes the group
        if (!st) st = end;
    }
    if (!st)
        st = cuda_check(cudaMemcpyAsync((char *)recv + (size_t)me * block, (const char *)send + (size_t)me * block,
                                        block, cudaMemcpyDeviceToDevice, stream_of(c)),
                        "own block", err);
    if (!st) c->sent += (uint64_t)(N - 1) * block;
    return st;
}

static void nccl_world_free(fm_world *w) {
    nccl_rank *ranks = (nccl_rank *)w->impl;
    if (!ranks) return;
    for (int i = 0; i < w->n; i++) {
        cudaSetDevice(ranks[i].device);
        if (ranks[i].comm) api.comm_destroy(ranks[i].comm);
        if (ranks[i].scratch) cudaFree(ranks[i].scratch);
    }
    free(ranks);
}

static const fm_comm_vt nccl_vt = {"NCCL", nccl_all_reduce_sum, nccl_all_gather, nccl_all_to_all, nccl_world_free};

extern "C" fm_status fm_world_create_nccl(int n_ranks, const int *devices, fm_world **out, fm_error *err) {
    *out = NULL;
    if (!devices) return fm_fail(err, FM_ERR_USAGE, "NCCL world: no device list");
    fm_status st = load_nccl(err);
    if (st) return st;
    fm_world *w = NULL;
    if ((st = fm_world_alloc(&nccl_vt, n_ranks, &w, err))) return st;
    nccl_rank *ranks = (nccl_rank *)calloc((size_t)n_ranks, sizeof *ranks);
    ncclComm_t comms[FM_COMM_MAX_RANKS];
    if (!ranks) {
        free(w);
        return fm_fail(err, FM_ERR_NOMEM, "NCCL world: out of host memory");
    }
    w->impl = ranks;
    st = nccl_check(api.comm_init_all(comms, n_ranks, devices), "communicators (ncclCommInitAll)", err);
    for (int r = 0; r < n_ranks; r++) {
        ranks[r].device = devices[r], ranks[r].comm = st ? NULL : comms[r];
        w->ranks[r].impl = &ranks[r];
    }
    if (st) {
        fm_world_free(w);
        return st;
    }
    *out = w;
    return FM_OK;
}

extern "C" int fm_nccl_version(void) {
    int v = 0;
    return api.lib && api.get_version(&v) == 0 ? v : 0;
}
