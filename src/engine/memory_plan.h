/* The memory plan: from the configuration and the precision plan alone, before anything is allocated, the bytes a
 * model takes on a backend, by category:
 *   weights      every bank the load creates, by family, in the backend's exact layout (fm_bank_bytes_for)
 *   activations  every buffer the forward pass allocates for `tokens` tokens (forward.c, alloc_buffers)
 *   workspace    scratch of the forward pass's ops (cuda: the ops' one scratch buffer, reserved at load for
 *                `tokens` tokens, and the workspaces of cuBLAS and cuBLASLt; cpu: the linear op's
 *                activation-quantization scratch)
 * and the transient load staging (cuda: one 64 MiB buffer per bank upload, freed before the bank returns).
 *
 * The formulas here mirror the allocating code; when one changes, the other must (tests/test_memory_plan.c checks
 * the CPU backend's bytes after a load, tests/gpu/test_cuda_memory.c the CUDA backend's and the device's). */
#ifndef FM_ENGINE_MEMORY_PLAN_H
#define FM_ENGINE_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/routes.h"
#include "model/arch.h"

typedef enum fm_mem_family {
    FM_MEM_EMBED,     /* embed_tokens */
    FM_MEM_LM_HEAD,   /* lm_head: 0 when tied to the embedding */
    FM_MEM_NORMS,     /* input/post-attention RMSNorms, q/k norms, the final norm */
    FM_MEM_ATTN,      /* fused qkv and o projections */
    FM_MEM_ROUTER,    /* MoE router (gate) */
    FM_MEM_EXPERTS,   /* expert gate_up and down banks */
    FM_MEM_DENSE_MLP, /* gate_up and down of dense SwiGLU layers */
    FM_MEM_FAMILY_COUNT
} fm_mem_family;

const char *fm_mem_family_name(fm_mem_family f);

#define FM_MEM_MAX_BUFFERS 16

typedef struct fm_mem_item {
    const char *what;
    size_t bytes;
} fm_mem_item;

/* The forward pass's activation buffers for `tokens` tokens with act-byte activations, in allocation order: names and
 * bytes into out[FM_FORWARD_N_BUFFERS]. The single list: forward.c allocates exactly these (its fw_buffers, member
 * for member) and the memory plan counts them. *overflow is set when a size does not fit (the bytes are then
 * SIZE_MAX). Returns FM_FORWARD_N_BUFFERS. */
#define FM_FORWARD_N_BUFFERS 16
int32_t fm_forward_buffer_list(const fm_config *c, size_t act, int64_t tokens, fm_mem_item *out, bool *overflow);

typedef struct fm_memory_plan {
    const char *backend; /* "cpu" or "cuda" */
    int32_t n_layers;    /* decoder layers loaded */
    int64_t tokens;      /* activations and workspace are for this many tokens */

    size_t weights[FM_MEM_FAMILY_COUNT];
    fm_wformat formats[FM_MEM_FAMILY_COUNT]; /* the bank format each family takes (a pre-quantized checkpoint's
                                                int4-zp, int4-zp-tc, e4m3-block in place of the plan's); FM_W_F32
                                                for a family with no bank */
    size_t weight_total;
    int32_t n_banks;         /* banks the load creates */
    int32_t n_weight_allocs; /* backend allocations those banks make (an int4 bank on cuda: values + scales) */

    fm_mem_item buffers[FM_MEM_MAX_BUFFERS]; /* the forward pass's activation buffers, in allocation order */
    int32_t n_buffers;
    size_t activations; /* sum of buffers[] */

    size_t ws_moe;        /* cuda: the ops' scratch buffer (the moe op's, or the quantized linears' when larger), what
                             the load reserves (backend ops->reserve) and no forward pass grows */
    bool expert_prefetch; /* the routes prefetch experts (expert.prefetch): with experts in host memory, the side
                             stream the prefetch runs on is planned (fm_memory_plan_place_experts) */
    size_t ws_side;   /* cuda: the side stream's scratch (a shared expert beside the routed ones: route shared.stream),
                         the quantized linears' inputs of its rows; 0: no side stream */
    size_t ws_libs;   /* cuda: cuBLAS's workspace (32 MiB, given at the reservation) and cuBLASLt's (32 MiB, W8A8);
                         with a side stream, its cuBLAS handle's (32 MiB) */
    size_t ws_linear; /* cpu: one linear op's quantized input rows, tokens * (K + ceil(K/128)) fp32, largest K */
    size_t ws_tables; /* cuda, w4a8.kernel=fold: the expert banks' exponents and row scales (cuda_bank_fold.cu) */
    size_t workspace; /* ws_moe + ws_side + ws_libs + ws_linear + ws_tables: all alive during a forward pass */

    int32_t kv_seqs; /* generation (fm_memory_plan_add_generation): sequences, and tokens per sequence */
    int64_t kv_ctx;
    size_t kv_cache; /* the paged KV cache: 2 x layers x ceil(ctx / 16) x 16 x seqs x a token's row (kv heads x
                        head_dim x act, or an e4m3 cache's codes and scales: backend.h fm_kv_row_bytes) */
    size_t kv_state; /* decode index buffers, paged-attention scratch, the sampler's per-sequence state; hybrid
                        models' state snapshots of the prefix cache (fm_memory_plan_add_state_cache) */

    size_t load_staging; /* transient while loading (weights not all resident yet, no activations) */

    /* experts (fm_memory_plan_place_experts): where they live, and with experts in host memory the expert cache */
    fm_experts_in experts_in; /* FM_EXPERTS_DEVICE (every expert bank in weights[FM_MEM_EXPERTS]) or
                                 FM_EXPERTS_HOST (weights[FM_MEM_EXPERTS] = 0, the banks in host_experts) */
    int32_t n_moe_layers;     /* MoE layers among those loaded */
    int32_t n_experts;        /* E per MoE layer */
    size_t expert_slot_bytes; /* one expert's gate_up + down matrices in the backend layout (a slot's bytes) */
    size_t host_experts;      /* host: every expert bank, in host memory (cuda: pinned) */
    int32_t expert_slots;     /* host: S, the slots of the expert cache (>= n_experts) */
    size_t expert_pool;       /* host: S x expert_slot_bytes + the cache's own memory (cpu: the slot ids, tokens x
                                 top-k int32; cuda: the device table) + the expert prefetch's buffers */

    /* one rank of a group (fm_memory_plan_rank): the group, and the expert-parallel exchange buffers */
    int32_t ep_ranks, tp_ranks, rank; /* 1, 1, 0: one model */
    size_t ep_exchange;               /* both all-to-alls' blocks, the ids and scales beside them, the layer output's
                                         share of this rank and every rank's gathered (dist/ep_moe.h, forward.c) */

    size_t total; /* weight_total + activations + workspace + kv_cache + kv_state + expert_pool + ep_exchange: resident
                     while running */
    size_t peak;  /* weight_total + max(activations + workspace, load_staging): what must fit */
} fm_memory_plan;

/* The expert prefetch's buffers (engine/expert_offload.c, one allocation by any backend with expert_prefetch): for
 * R = min(tokens, FM_EXPERT_PREFETCH_MAX_T) rows, the normed residual [R, H], the router logits [R, E], ids and
 * weights [R, k], 4 bytes an element (fp32 on the cpu; bf16 activations take half), each part 256-byte aligned. */
typedef struct fm_expert_prefetch_layout {
    size_t h, logits, ids, w, total;
} fm_expert_prefetch_layout;
void fm_expert_prefetch_layout_of(const fm_config *cfg, int64_t tokens, fm_expert_prefetch_layout *out);
/* The side stream's scratch when nothing but the expert prefetch runs there (its router and the prefetch need none:
 * the minimum the cuda backend takes, the W8A8 quantizer's scale slot) */
#define FM_SIDE_WS_MIN 256

/* Bytes one bank of n matrices [rows, cols] in format fmt occupies on the named backend: its kind's bank_bytes
 * (backend/backend_kind.h, which restates the backend's layouts). 0 for an unknown backend or a format the backend
 * does not store, SIZE_MAX on overflow. */
size_t fm_bank_bytes_for(const char *backend, fm_wformat fmt, int32_t n, int64_t rows, int64_t cols);
/* The same for int4-zp (a pre-quantized int4 checkpoint kept as it is), which depends on its group, its order and,
 * on cuda, on the plan: fp8_plan (e4m3 1x128 activations) or not (the int4 preset). */
size_t fm_bank_bytes_int4zp(const char *backend, bool fp8_plan, int32_t n, int64_t rows, int64_t cols, int64_t group,
                            bool act_order);

/* Activation bytes per element of a plan on a backend (the backends' act_size): 4 on cpu, 2 (bf16) on cuda,
 * 4 on cuda for the fp32 plan (ref32). */
size_t fm_act_size_for(const char *backend, const fm_plan *plan);

/* Computes the plan of the first n_layers decoder layers (0 = all) of a model with configuration cfg, stored as
 * `plan` says, on `backend` ("cpu" or "cuda"), with activations and workspace for `tokens` tokens (>= 1).
 * cfg->tie_word_embeddings decides whether lm_head is a bank of its own: a caller that bound a checkpoint where
 * the two differ (tied in config.json but an lm_head.weight present) passes a copy with the flag as bound.
 * Fails with FM_ERR_USAGE (bad arguments), FM_ERR_UNSUPPORTED (a format the backend does not store) or
 * FM_ERR_FORMAT (sizes that overflow). Allocates nothing. */
fm_status fm_memory_plan_compute(const fm_config *cfg, const fm_plan *plan, const char *backend, int32_t n_layers,
                                 int64_t tokens, fm_memory_plan *out, fm_error *err);
/* The same with the cuda backend's route table (src/backend/routes.h; NULL: the defaults): the route w4a8.tile
 * decides the W4A8 MoE tile rows, which size the tile list in its workspace. */
fm_status fm_memory_plan_compute_routes(const fm_config *cfg, const fm_plan *plan, const char *backend,
                                        const fm_routes *routes, int32_t n_layers, int64_t tokens, fm_memory_plan *out,
                                        fm_error *err);

/* Adds generation's memory to a computed plan: the KV cache and decode state for max_seqs sequences of ctx tokens
 * (src/engine/kv_state.c sizes them; steps of up to p->tokens rows), and updates total and peak. */
fm_status fm_memory_plan_add_generation(fm_memory_plan *p, const fm_config *cfg, const fm_plan *plan, int32_t max_seqs,
                                        int64_t ctx, fm_error *err);

/* Adds the prefix cache's state snapshots of a hybrid model (engine/state_cache.h fm_state_cache_bytes) to the
 * generation state of a plan, after fm_memory_plan_add_generation; updates total and peak. */
void fm_memory_plan_add_state_cache(fm_memory_plan *p, size_t bytes);

/* Places the experts of a computed plan (after fm_memory_plan_add_generation, if any: the cache comes after
 * everything else). `available`: the backend bytes the plan may take, 0 = no limit (the cpu backend).
 *   FM_EXPERTS_DEVICE  nothing changes
 *   FM_EXPERTS_AUTO    device when available is 0 or the plan fits in it, else as host
 *   FM_EXPERTS_HOST    the expert banks move to host_experts; the expert cache gets `slots` slots, or, when slots
 *                      is 0, what `available` leaves after the rest (every expert when no limit), at most every
 *                      expert; expert_pool is added to total and peak.
 * Refuses (FM_ERR_NOMEM, with the numbers: slots, bytes per slot, what the limit leaves) a cache of fewer than
 * n_experts slots: a prefill of one layer may route to every expert, and the pool must hold them all at once.
 * `source` says where `available` comes from ("--vram-limit"). FM_ERR_USAGE for slots < 0 or a model without MoE
 * layers in host mode. The caller still checks the result against `available` (fm_memory_plan_check). */
fm_status fm_memory_plan_place_experts(fm_memory_plan *p, const fm_config *cfg, fm_experts_in where, int32_t slots,
                                       size_t available, const char *source, fm_error *err);

/* Bytes of one bank of a description's family (wf) under `plan` on `backend`, in the format the load picks from what
 * the configuration says of the checkpoint (engine/weight_format.h); its refusal otherwise. */
fm_status fm_memory_bank_bytes(const fm_config *cfg, const fm_plan *plan, const char *backend, fm_wfamily wf, int32_t n,
                               int64_t rows, int64_t cols, const char *what, size_t *out, fm_error *err);

/* The one rank memory (--ep N, --tp N): turns p, one model's plan (fm_memory_plan_compute_routes, then
 * fm_memory_plan_add_generation if any), into rank `rank`'s of a group of ep x tp (1: no split; with both, one group:
 * ep == tp): its routed experts only (fm_ep_expert_range), its heads' rows of the q|k|v banks and columns of the o
 * banks (fm_tp_head_range; Gated DeltaNet layers stay whole), the exchange buffers of expert parallelism for
 * p->tokens tokens (ep_exchange) and the expert ops' scratch for the blocks a rank receives (the backend kind's
 * ep_workspace, in ws_moe when larger); every other weight, the activations, the KV cache (every rank keeps every
 * key-value head today) and the decode state are every rank's. total and peak follow. The load checks a rank's peak
 * with it before allocating, the forward pass reserves its ws_moe, and `inspect --ep/--tp` prints it. FM_ERR_USAGE
 * for a split the model does not allow (fm_rank_split_check) or a rank out of range; experts in host memory are not
 * split (the load refuses --ep with them). */
fm_status fm_memory_plan_rank(fm_memory_plan *p, const fm_config *cfg, const fm_plan *plan, int32_t ep, int32_t tp,
                              int32_t rank, fm_error *err);

/* FM_OK when p->peak fits in `available` bytes; otherwise FM_ERR_NOMEM with a message such as
 * "model needs 61.1 GiB on cuda (weights 56.9, activations 0.7, workspace 1.3 for 2048 tokens) but 8.0 GiB is
 * available (--vram-limit)". `source` says where `available` comes from. */
fm_status fm_memory_plan_check(const fm_memory_plan *p, size_t available, const char *source, fm_error *err);

#endif
