/* What a kind of backend is, known before one exists: where its memory lives, the bytes of its weight banks, of its
 * ops' scratch and of its expert cache, how much device memory is free, and how to create one. The memory plan, the
 * load's checks, `inspect` and the rank groups ask these instead of comparing backend names; the formulas restate the
 * backends' allocations (cpu/cpu_kind.c, cuda/cuda_kind.c name the code they mirror), and the memory-plan tests check
 * them against real loads. */
#ifndef FM_BACKEND_KIND_H
#define FM_BACKEND_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/routes.h"

/* The ops' scratch of a forward pass of `tokens` tokens, by use (engine/memory_plan.h names them ws_*). */
typedef struct fm_backend_ws {
    size_t moe;    /* the ops' one scratch buffer (the moe op's, the quantized linears' when larger) */
    size_t side;   /* the side stream's scratch (a shared expert beside the routed ones); 0: no side stream */
    size_t libs;   /* the libraries' workspaces (cuBLAS, cuBLASLt) */
    size_t linear; /* one linear op's quantized input rows (cpu) */
    size_t tables; /* tables a route keeps beside the banks (cuda, w4a8.kernel=fold: the experts' exponents and row
                      scales, cuda_bank_fold.cu) */
    bool overflow; /* a size did not fit in 64 bits */
} fm_backend_ws;

typedef struct fm_backend_kind {
    const char *name;
    /* weights and caches live in a device's memory, which the load checks against the memory plan before it
       allocates anything (and --vram-limit bounds) */
    bool on_device;
    /* ops run in issue order on the host: ranks of a group exchange through each other's memory directly; others
       stage their exchanges through host memory with copies that synchronise (no graphs then) */
    bool host_ordered;
    /* the expert cache builds a host bank on the device first, then moves it (one layer's banks at a time beside the
       load staging) */
    bool host_experts_built_on_device;
    /* experts in host memory: the one weight format the expert cache keeps (FM_W_F32: any) */
    fm_wformat host_expert_format;
    /* expert parallelism: the presets whose expert ops exchange rows (ep_plan_ok: NULL, every plan) */
    bool (*ep_plan_ok)(const fm_plan *plan);

    /* bytes per activation element under a plan (the backend's ops->act_size) */
    size_t (*act_size)(const fm_plan *plan);
    /* an e4m3 KV cache's rows hold codes and scales (fm_kv_e4m3_row_bytes; the backend's ops->kv_e4m3_codes) */
    bool kv_e4m3_codes;
    /* one bank of n matrices [rows, cols] in format fmt (int4-zp formats: bank_bytes_int4zp): 0 for a format the
       backend does not store, SIZE_MAX on overflow */
    size_t (*bank_bytes)(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols);
    /* a pre-quantized int4 bank kept in the checkpoint's numbers: its group along K, act order, and whether the plan
       quantizes activations to e4m3 1x128 (fp8_plan) */
    size_t (*bank_bytes_int4zp)(bool fp8_plan, int32_t n, int64_t rows, int64_t cols, int64_t group, bool act_order);
    /* transient bytes while one such bank is built (staging buffers, a layout before its repack) */
    size_t (*bank_staging)(fm_wformat fmt, int32_t n, int64_t rows, int64_t cols);
    /* the ops' scratch for a pass of `tokens` tokens over the first n_layers layers (routes: the route table the
       backend will run with; it sizes some scratch) */
    void (*workspace)(const fm_config *c, const fm_plan *plan, const fm_routes *routes, int32_t n_layers,
                      int64_t tokens, fm_backend_ws *out);
    /* expert parallelism over N ranks: the scratch the expert ops of one rank need for T tokens beside workspace's
       (received blocks); 0 where the ops use the exchange buffers only. UINT64_MAX on overflow */
    uint64_t (*ep_workspace)(const fm_config *c, const fm_plan *plan, int64_t T, int32_t N);
    /* experts in host memory: the cache's own bytes beside its slots (its table or its slot ids), for n_layers layers
       of E experts, S slots and passes of `tokens` tokens routed to top_k experts */
    size_t (*expert_cache_bytes)(int32_t n_layers, int32_t E, int32_t S, int64_t tokens, int32_t top_k);
    /* a side stream's own library workspace, when one is made (0: ops run in order, no side stream) */
    size_t side_stream_libs;

    /* the device: free and total bytes (total may be NULL), and its compute capability major and name (name may be
       NULL); NULL where the backend has no device (cpu). Fail with FM_ERR_BACKEND when there is none here. */
    fm_status (*free_memory)(size_t *free_bytes, size_t *total, fm_error *err);
    fm_status (*device_query)(int *sm_major, char *name, size_t cap, fm_error *err);

    fm_status (*create)(const fm_plan *plan, int32_t n_threads, const char *routes, fm_backend **out, fm_error *err);
} fm_backend_kind;

extern const fm_backend_kind fm_backend_kind_cpu, fm_backend_kind_cuda;

/* The kind named `name` ("cpu", "cuda"), or NULL. */
const fm_backend_kind *fm_backend_kind_find(const char *name);
/* The same, or FM_ERR_USAGE naming the kinds there are; `what` begins the message ("memory plan", "--backend"). */
fm_status fm_backend_kind_get(const char *name, const char *what, const fm_backend_kind **out, fm_error *err);
/* the kind of a backend that exists */
const fm_backend_kind *fm_backend_kind_of(const fm_backend *be);

#endif
