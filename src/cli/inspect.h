/* fp8moe inspect, in parts: its options and the order of its sections (cmd_inspect.c), the checkpoint's description
 * (inspect_model.c), the memory plan (inspect_plan.c) and the kernel route table (inspect_routes.c). */
#ifndef FM_CLI_INSPECT_H
#define FM_CLI_INSPECT_H

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model_src.h"

/* The memory plan's options (--tokens and the options that refine it) */
typedef struct plan_args {
    int64_t tokens, vram_limit;
    const char *backend;
    fm_preset preset;
    int32_t n_layers;
    fm_dense dense;
    int32_t max_seqs; /* --max-seqs: generation's KV cache in the plan */
    int64_t ctx;
    fm_kv_dtype kv_cache; /* --kv-cache */
    char routes[512];     /* --route options, "k=v,k=v" */
    fm_experts_in experts_in;
    int32_t expert_slots;
    fm_dispatch dispatch; /* --dispatch: the experts' dispatch buffer format (sizes the W4A8 MoE scratch) */
    int32_t ep, tp;       /* --ep, --tp: the partition over that many ranks (0: none) */
    fm_lm_head lm_head;   /* --lm-head */
} plan_args;

/* The shapes the route table is shown at: a model's, or Qwen3-30B-A3B's. */
typedef struct route_shapes {
    const char *what;
    int64_t hidden, attn, widest_k; /* hidden size, attention width (heads x head dim), the widest linear input */
    int64_t qkv_n;                  /* fused q|k|v rows */
    int32_t n_experts, top_k;       /* 0 experts: no MoE layer */
} route_shapes;

static inline double inspect_mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* the checkpoint: architecture, shapes, tensors, parameters; a pre-quantized checkpoint's linears by family */
void inspect_print_model(const char *dir, const fm_config *c, const fm_st_set *set, const fm_model_src *src);
void inspect_print_quantization(const fm_config *c, const fm_model_src *src);
/* the memory plan of the options (--tokens): FM_ERR_USAGE and the like for options the plan refuses */
fm_status inspect_print_plan(const fm_config *cfg, const fm_model_src *src, const plan_args *a, fm_error *err);
/* the route table after the overrides, then what it picks at the shapes; the shapes of a model */
fm_status inspect_print_routes(const route_shapes *s, const char *overrides, fm_error *err);
route_shapes inspect_shapes_of(const char *dir, const fm_config *c);

#endif
