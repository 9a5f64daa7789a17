/* Collectives between the ranks of one process: the interface the multi-GPU engine is written against.
 *
 * One process drives every GPU of the host, one host thread per rank, each rank with its own backend (its GPU, its
 * stream, its weights' shard). Why not one process per GPU: the server, the scheduler and the tokenizer stay single,
 * no launcher or MPI is needed, and NCCL supports it (one communicator per GPU from ncclCommInitAll).
 *
 * Implementations:
 *   simulated (comm_sim.c)  the ranks exchange through host memory, with a barrier between the phases; for the CPU
 *                           backend, whose buffers are host memory: the partitioning, the dispatch and the combine are
 *                           tested on any machine against the single-rank result
 *   NCCL (backend/cuda/comm_nccl.cu)  the same calls on GPU buffers, enqueued on each rank's stream
 *                           (fm_comm_set_stream) and returning at once, stream-ordered like the backend's ops; NCCL
 *                           is loaded when a world is made (dlopen of libnccl.so.2), so nothing else needs it
 *
 * Every collective is called by all ranks of the world, each from its own thread, with the same sizes (the simulated
 * world checks: a mismatch fails on every rank with FM_ERR_USAGE; NCCL cannot, and a mismatch hangs or fails in
 * NCCL). Buffers are the calling rank's backend memory. */
#ifndef FM_DIST_COMM_H
#define FM_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"

typedef struct fm_world fm_world; /* every rank of the process */
typedef struct fm_backend fm_backend;
typedef struct fm_comm fm_comm; /* one rank's end */

typedef enum fm_comm_dtype {
    FM_COMM_F32,
    FM_COMM_BF16,
} fm_comm_dtype;

/* A simulated world of n_ranks ranks (1..FM_COMM_MAX_RANKS). */
#define FM_COMM_MAX_RANKS FM_MAX_RANKS
fm_status fm_world_create_sim(int n_ranks, fm_world **out, fm_error *err);
void fm_world_free(fm_world *w);
/* A world of n_ranks NCCL ranks, rank r on GPU devices[r] (one process, a thread per rank: ncclCommInitAll).
 * FM_ERR_BACKEND when the build has no CUDA or libnccl.so.2 cannot be loaded (the message says how to point to it:
 * LD_LIBRARY_PATH), or NCCL fails to make the communicators. */
fm_status fm_world_create_nccl(int n_ranks, const int *devices, fm_world **out, fm_error *err);
/* The loaded NCCL's version (NCCL_VERSION_CODE, e.g. 22703 for 2.27.3); 0 before a world was made or without CUDA. */
int fm_nccl_version(void);
fm_comm *fm_world_comm(fm_world *w, int rank);
/* The implementation's name: "simulated" or "NCCL". */
const char *fm_comm_kind(const fm_comm *c);
/* The stream rank c's collectives are enqueued on (NCCL: the rank's backend's cudaStream_t;
 * the simulated world runs them on the calling thread and ignores it). */
void fm_comm_set_stream(fm_comm *c, void *stream);
/* A rank of a simulated world whose buffers are its backend's memory (any backend): each collective copies them to
 * host memory with the backend's raw copies (the download waits for the rank's device work), exchanges there and
 * copies the results back (stream-ordered), the same bits as NCCL's form. What runs ranks of the cuda backend
 * without NCCL (several ranks on one GPU: the tests); not for a captured step (it synchronises). No effect on an
 * NCCL world's rank. */
void fm_comm_sim_stage_through(fm_comm *c, fm_backend *be);

int fm_comm_rank(const fm_comm *c);
int fm_comm_size(const fm_comm *c);

/* buf[n] <- the sum over ranks of every rank's buf[n]. The ranks' values are added in rank order 0, 1, ..., N-1 in fp32
 * and rounded once (bf16), so every rank gets the same bits and the result does not depend on timing (NCCL: an
 * all-gather into the communicator's scratch, then a kernel summing in rank order; NCCL's own reductions sum in an
 * order of its choosing). */
fm_status fm_comm_all_reduce_sum(fm_comm *c, void *buf, int64_t n, fm_comm_dtype t, fm_error *err);

/* recv[r * bytes, (r + 1) * bytes) <- rank r's send[0, bytes), for every rank r (recv holds N blocks). */
fm_status fm_comm_all_gather(fm_comm *c, const void *send, void *recv, size_t bytes, fm_error *err);

/* recv[r * block, (r + 1) * block) <- rank r's send[me * block, (me + 1) * block): each rank sends one fixed-size
 * block to every rank (itself included). Fixed sizes are what keeps a step graph-safe: the sizes never have to reach
 * the host; a block carries its own count of rows. */
fm_status fm_comm_all_to_all(fm_comm *c, const void *send, void *recv, size_t block, fm_error *err);

/* Bytes this rank has sent to other ranks so far (what a link carries: blocks to itself do not count). */
uint64_t fm_comm_bytes_sent(const fm_comm *c);

#endif
