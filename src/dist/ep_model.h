/* Expert parallelism over a whole model, host form (the cpu backend): N ranks in one process, each a model of the
 * same checkpoint that holds every dense weight and its share of the routed experts (fm_ep_expert_range), joined by
 * a simulated world (comm.h). A forward pass runs on every rank at once, one thread each, over the same prompt; the
 * MoE layers exchange their rows (engine/forward.c, dist/ep_moe.h), so every rank ends with the logits one model
 * holding every expert computes, bit for bit (tests/test_ep_model.c). The GPU form is the same plan over NCCL, one
 * GPU per rank. */
#ifndef FM_DIST_EP_MODEL_H
#define FM_DIST_EP_MODEL_H

#include "dist/comm.h"
#include "engine/engine.h"

typedef struct fm_ep_group {
    int n_ranks;
    fm_world *world;
    fm_model *models[FM_COMM_MAX_RANKS]; /* rank r's model */
} fm_ep_group;

/* Loads dir once per rank with opt (opt->ep_ranks and ep_rank are set per rank here: n_ranks >= 2), and joins the
 * ranks. Errors name the rank when one rank's load fails. */
fm_status fm_ep_group_load(const char *dir, const fm_options *opt, int n_ranks, fm_ep_group **out, fm_error *err);
void fm_ep_group_free(fm_ep_group *g);

/* fm_forward on every rank together (the prompt on every rank); logits as fm_forward's, from rank 0 (every rank holds
 * the same). */
fm_status fm_ep_group_forward(fm_ep_group *g, const int32_t *ids, int64_t T, bool last_only, float *logits,
                              fm_error *err);

/* The routed-expert bytes rank r holds (the dense weights are every rank's). */
size_t fm_ep_group_expert_bytes(const fm_ep_group *g, int rank);

#endif
