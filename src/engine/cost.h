/* Bytes and FLOPs of a prefill per stage: the floors benchmarks report beside their times. */
#ifndef FM_ENGINE_COST_H
#define FM_ENGINE_COST_H

#include "engine/engine.h"

typedef struct fm_cost {
    double bytes[FM_STAGE_COUNT]; /* fewest bytes through device memory: weights once, activations in and out */
    double flops[FM_STAGE_COUNT];
    double total_bytes, total_flops;
    /* expert weight bytes a per-token dispatch actually reads (each routed pair reads its expert again),
       for comparison with the ideal in bytes[FM_STAGE_EXPERTS] (summed over layers, an expectation) */
    double expert_weight_reads_per_token_design;
} fm_cost;

void fm_prefill_cost(const fm_config *c, const fm_plan *p, int32_t n_layers, int64_t T, bool last_only, fm_cost *out);

#endif
