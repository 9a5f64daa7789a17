/* A group of ranks in one process over a whole model: N ranks, each a model of the same
 * checkpoint holding its share, joined by a simulated world (comm.h); a thread per rank. The shares:
 *   --ep N  expert parallelism: every dense weight and 1/N of the routed experts (fm_ep_expert_range); the MoE
 *           layers exchange their rows (engine/forward.c, dist/ep_moe.h): the logits of one model holding every
 *           expert, bit for bit;
 *   --tp N  tensor parallelism of the attention layers: the rank's query and key-value heads (fm_tp_head_range), o's
 *           columns of them, one all-reduce per layer (dist/tp_attention.h): the logits of one model up to the
 *           order in which o's partial sums add;
 *   both    the same N ranks (one per device), attention split by heads, experts by expert.
 * A forward pass or a generation runs on every rank at once over the same prompts; every rank ends with the same
 * logits (tests/test_rank_group.c). The ranks exchange through a simulated world (dist/comm.h): on the cpu backend
 * in host memory; on the cuda backend staged through each rank's backend, every rank on the one GPU the backend
 * takes (tests/gpu/test_cuda_tp.c, test_cuda_ep.c: a correctness path, not a speed-up), decode steps without graphs.
 * What is left for several GPUs: a device per rank and the NCCL world (backend/cuda/comm_nccl.cu, tested alone). */
#ifndef FM_DIST_RANK_GROUP_H
#define FM_DIST_RANK_GROUP_H

#include "dist/comm.h"
#include "engine/engine.h"

/* Whether a model of configuration c splits over --ep ep and --tp tp ranks (0 or 1: no split): together they must
 * be the same ranks; the experts must split evenly (fm_ep_expert_range), the key-value heads too (fm_tp_head_range).
 * FM_ERR_USAGE naming the numbers. */
fm_status fm_rank_split_check(const fm_config *c, int32_t ep, int32_t tp, fm_error *err);

struct fm_rank_group {
    int n_ranks;
    fm_world *world;
    fm_model *models[FM_COMM_MAX_RANKS];     /* rank r's model */
    fm_context *contexts[FM_COMM_MAX_RANKS]; /* and its context, held by the group (its communicators) */
};

/* fm_rank_group_load (fp8moe.h) sets ep_rank and tp_rank per rank and joins the ranks. */
/* The same over the synthetic model `name` (engine.h: fm_model_load_synthetic), its first n_layers layers (0: all):
 * the same weights on every rank (each keeps its share), as one such model would hold them. */
fm_status fm_rank_group_load_synthetic(const char *name, int32_t n_layers, const fm_options *opt, fm_rank_group **out,
                                       fm_error *err);
/* fm_rank_group_forward and fm_rank_group_generate (fp8moe.h): fm_forward and fm_context_generate on every rank
 * together; in generation every rank runs the same scheduler over the same logits (bit-identical across the ranks:
 * the exchanges give every rank the same bits) and samples the same tokens, so their steps line up. */

/* Runs fn on every rank's job at once, a thread each (jobs: n_ranks items of job_size bytes, rank r's at r x
 * job_size), and returns when all have: what any pass of the group needs, since a rank waits in its exchanges until
 * every other rank reaches them. A thread that cannot start aborts the process (the started ranks would wait for it).
 */
void fm_rank_group_run(const fm_rank_group *g, void *(*fn)(void *), void *jobs, size_t job_size);

/* The routed-expert bytes rank r holds (the dense weights are every rank's, but for --tp's attention heads). */
size_t fm_rank_group_expert_bytes(const fm_rank_group *g, int rank);

#endif
