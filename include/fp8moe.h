/* fp8moe: public C API.
 *
 * An opaque model handle holds a checkpoint's configuration and its weights on one backend, quantized
 * according to a precision plan (a preset). Every call that can fail returns an fm_status and fills a
 * caller-provided fm_error with one line naming the file, tensor or field at fault.
 */
#ifndef FP8MOE_H
#define FP8MOE_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP8MOE_VERSION "0.1.0"

typedef enum fm_status {
    FM_OK = 0,
    FM_ERR_USAGE,       /* a caller passed arguments that make no sense (maps to exit code 2) */
    FM_ERR_IO,          /* a file could not be opened, mapped or written */
    FM_ERR_FORMAT,      /* a file is malformed: header, offsets, JSON, shapes, ids */
    FM_ERR_UNSUPPORTED, /* well-formed, but something fp8moe does not implement (model type, dtype, option) */
    FM_ERR_NOMEM,       /* an allocation failed */
    FM_ERR_BACKEND,     /* the backend is unavailable (no GPU, not built) or failed */
} fm_status;

/* One line of explanation; filled by every failing call. */
typedef struct fm_error {
    char msg[768];
} fm_error;

const char *fm_status_name(fm_status st);

/* Named precision plans (DESIGN.md "Precision plan"). */
typedef enum fm_preset {
    FM_PRESET_REF = 0, /* fp32 weights and activations: the oracle */
    FM_PRESET_INT4,    /* int4 sym g128 (bf16 scales) linear weights, bf16 activations (w4a16) */
    FM_PRESET_FP8,     /* the same int4 weights as e4m3, activations e4m3 in 1x128 groups (w4a8) */
    FM_PRESET_FP4,     /* as fp8, expert dispatch activations in MXFP4 */
    FM_PRESET_REF32,   /* fp32 weights and activations on every backend: on the cpu the same as ref, on the GPU
                          the oracle for models too large for the cpu (ref there is the bf16 reference) */
    FM_PRESET_COUNT
} fm_preset;

const char *fm_preset_name(fm_preset p);
/* Returns false when name is not a preset. */
bool fm_preset_parse(const char *name, fm_preset *out);

/* --dense: what the dense projections (q/k/v/o, dense MLPs) use, beside the preset's choice. */
typedef enum fm_dense {
    FM_DENSE_PRESET = 0, /* as the preset says */
    FM_DENSE_W8A8,       /* weights e4m3 with one fp32 scale per matrix (from the checkpoint's bf16, at load),
                            activations e4m3 with one dynamic per-tensor scale (the second seed's path) */
} fm_dense;

const char *fm_dense_name(fm_dense d);
bool fm_dense_parse(const char *name, fm_dense *out);

/* --lm-head: how the lm_head (the vocabulary projection, the largest single matrix a decode step reads) is stored. */
typedef enum fm_lm_head {
    FM_LM_HEAD_FLOAT = 0, /* as the embeddings and norms: bf16 on the GPU, fp32 on the CPU (the reference's) */
    FM_LM_HEAD_DENSE,     /* as the dense projections: quantized at load from the checkpoint's float lm_head to the
                             plan's dense format (int4-tc with e4m3 activations under fp8, e4m3 per tensor under
                             --dense w8a8, int4 under int4), a quarter or half of its bytes; refused where the dense
                             projections are float themselves (ref, ref32) */
} fm_lm_head;

const char *fm_lm_head_name(fm_lm_head h);
bool fm_lm_head_parse(const char *name, fm_lm_head *out);

/* --int4-scales: how weights quantized to int4 at load get their group scales (docs/int4_p2.md). */
typedef enum fm_int4_scales {
    FM_INT4_SCALES_G128 = 0, /* one bf16 scale per (row, 128-group), amax / 7 rounded up (the presets' quantizer) */
    FM_INT4_SCALES_P2,       /* int4-p2: each row's scales one bf16 row scale times 2^k, k in -12..0, searched
                                (quant/int4_p2.h); the same banks and kernels read them. The cpu backend only: the
                                cuda backend quantizes on the device with the first (a checkpoint written by
                                `requantize --scales p2` carries int4-p2 scales to it) */
} fm_int4_scales;

const char *fm_int4_scales_name(fm_int4_scales s);
bool fm_int4_scales_parse(const char *name, fm_int4_scales *out);

/* --dispatch: the format of the expert dispatch buffer (the top-k routed copies of each token that the gate|up GEMM
 * reads), beside the preset's choice (fp8: e4m3 1x128; fp4: MXFP4). */
typedef enum fm_dispatch {
    FM_DISPATCH_PRESET = 0, /* as the preset says */
    FM_DISPATCH_BF16,       /* the activations as they are */
    FM_DISPATCH_FP8,        /* e4m3 with one fp32 scale per 128 elements */
    FM_DISPATCH_MXFP4,      /* E2M1, one UE8M0 scale per 32 elements */
    FM_DISPATCH_NVFP4,      /* E2M1, one e4m3 scale per 16 elements and one fp32 scale per buffer */
} fm_dispatch;

const char *fm_dispatch_name(fm_dispatch d);
bool fm_dispatch_parse(const char *name, fm_dispatch *out);

/* --experts-in: where the routed experts' weights live. */
typedef enum fm_experts_in {
    FM_EXPERTS_DEVICE = 0, /* every expert bank in backend memory (the default) */
    FM_EXPERTS_HOST,       /* every expert bank in host memory in its backend layout; a pool of expert slots in
                              backend memory caches the experts a layer needs (fm_options.expert_slots) */
    FM_EXPERTS_AUTO,       /* host only when the memory plan does not fit with every expert in backend memory */
} fm_experts_in;

const char *fm_experts_in_name(fm_experts_in w);
bool fm_experts_in_parse(const char *name, fm_experts_in *out);

/* --expert-policy: which cached expert a miss evicts (experts in host memory). */
typedef enum fm_expert_policy {
    FM_EXPERT_LRU = 0, /* the least recently used slot */
    FM_EXPERT_LFU,     /* the slot whose expert was needed least often (a count per expert, halved every
                          FM_EXPERT_LFU_HALF_LIFE fetches so that it follows a changing routing); among equal
                          counts the most recently used goes (a cyclic pass keeps S - E slots) */
} fm_expert_policy;

#define FM_EXPERT_LFU_HALF_LIFE 256

const char *fm_expert_policy_name(fm_expert_policy p);
bool fm_expert_policy_parse(const char *name, fm_expert_policy *out);

/* The paged KV cache's element format (fm_options.kv_cache, --kv-cache) */
typedef enum fm_kv_dtype {
    FM_KV_ACT = 0, /* `auto`: the activation dtype (bf16 on the GPU presets) */
    FM_KV_E4M3,    /* `e4m3`: FP8 codes with one power-of-two scale per (token, kv head), half the bytes of bf16
                      (docs/kv-cache.md); needs bf16 activations */
} fm_kv_dtype;

const char *fm_kv_dtype_name(fm_kv_dtype d);
bool fm_kv_dtype_parse(const char *name, fm_kv_dtype *out);

/* How a mixed step's prefill share is sized (fm_options.step_budget) */
typedef enum fm_step_budget_mode {
    FM_STEP_BUDGET_AUTO = 0, /* LATENCY (FIXED for a rank of an --ep/--tp group) */
    FM_STEP_BUDGET_FIXED,    /* every token of max_step_tokens the decode rows leave */
    FM_STEP_BUDGET_LATENCY,  /* by measured step times (src/engine/step_budget.h) */
} fm_step_budget_mode;

typedef struct fm_options {
    const char *backend; /* "cpu" (default) or "cuda" */
    fm_preset preset;
    fm_dense dense;             /* --dense: FM_DENSE_PRESET (0) unless asked */
    fm_lm_head lm_head;         /* --lm-head: FM_LM_HEAD_FLOAT (0) unless asked */
    fm_dispatch dispatch;       /* --dispatch: FM_DISPATCH_PRESET (0) unless asked (the cpu backend: every format;
                                   cuda: the preset's, for now) */
    fm_int4_scales int4_scales; /* --int4-scales: FM_INT4_SCALES_G128 (0) unless asked; refused by presets without
                                   int4 weights, by the cuda backend and by pre-quantized checkpoints */
    int32_t n_layers;           /* run only the first n decoder layers; 0 = all */
    int32_t n_threads;          /* CPU threads; 0 = OpenMP's default */
    bool verbose;               /* progress on stderr while loading */
    const char *plan_backend;   /* take the preset's plan as it is on this backend (NULL: `backend`); with backend
                                   "cpu" and plan_backend "cuda" the CPU emulates the GPU's formats exactly */
    int64_t vram_limit;         /* cuda: behave as if the GPU had this many bytes free (the smaller of this and the
                                   real free memory counts); 0 = the GPU's free memory. Before any weight is
                                   allocated, the load checks that the memory plan (weights + activations +
                                   workspace of max_tokens tokens) fits, else fails with FM_ERR_NOMEM. */
    int64_t max_tokens;         /* prompt length the cuda memory check plans for; 0 = FM_DEFAULT_MAX_TOKENS (2048) */
    const char *routes;         /* cuda: kernel route overrides, "key=value[,key=value...]" (NULL: the defaults for the
                                   GPU). The keys and their values: docs/routes.md, or `fp8moe inspect --routes`
                                   (fm_routes_check validates). They choose kernels, never what is computed. */
    int64_t ctx;                /* tokens per sequence; 0 = the model's max_position_embeddings (no limit when the
                                   config has none); a larger value is allowed only when set explicitly. A longer
                                   prompt (fm_context_logits, a perplexity window, max_tokens) is refused. */
    int32_t max_seqs;           /* generation: sequences decoded together at most; 0 = no KV cache (prompt logits and
                                   perplexity only). The load then also allocates the paged KV cache for max_seqs
                                   sequences of ctx tokens and the sampler's state, counted by the memory check. */
    fm_experts_in experts_in;   /* --experts-in: FM_EXPERTS_DEVICE (0) unless asked. cpu: host runs the CPU emulation
                                   of the expert cache (auto = device there); cuda: refused for now (auto: device when
                                   the plan fits, else a refusal naming --experts-in) */
    int32_t expert_slots;       /* experts in host memory: slots of the expert cache; 0 = from the memory plan (cpu:
                                   every expert; cuda: what --vram-limit or the free memory leaves). At least
                                   n_experts (one layer's experts: a prefill can route to all of them) */
    fm_expert_policy expert_policy; /* --expert-policy: FM_EXPERT_LFU (fm_options_init) unless asked */
    const char *synthetic_routing;  /* synthetic models (benchmarks): "uniform" (NULL) or "zipf:S", how often each
                                       expert is routed to (--synthetic-routing; src/engine/synthetic.c) */
    int32_t ep_ranks, ep_rank;      /* expert parallelism (--ep): the model holds the routed experts of rank ep_rank
                                       of ep_ranks (0 or 1: every expert); a rank's forward pass needs the others
                                       (src/dist/rank_group.h loads and runs the group) */
    int32_t tp_ranks, tp_rank;      /* tensor parallelism of attention (--tp): the model holds the attention heads
                                       of rank tp_rank of tp_ranks (0 or 1: every head); the same group */
    bool prefix_cache;              /* generation: automatic prefix caching (fm_options_init: on; --no-prefix-cache):
                                       full KV blocks stay cached after their sequence ends, and a prompt that begins
                                       with cached tokens maps them instead of computing them again. Hybrid models
                                       (Qwen3-Next) also keep snapshots of their recurrent states, state_cache_slots
                                       (docs/prefix-caching.md) */
    int32_t state_cache_slots;      /* hybrid models with the prefix cache on (--state-cache-slots): snapshots of
                                       the Gated DeltaNet layers' states at a few block boundaries, each the size of
                                       one sequence's states; -1 (fm_options_init): 2 x max_seqs; 0: the prefix
                                       cache is off for such a model. Given (>= 0) to a model without those layers,
                                       or with the prefix cache off: a line on stderr says it has no effect */
    int64_t max_step_tokens;        /* generation (--max-step-tokens): tokens of one scheduler step, every running
                                       sequence's next token and prefill chunks together in one forward pass
                                       (docs/mixed-steps.md). 0: max_seqs + 512, at most max_tokens; -1 (`off`): no
                                       mixed steps, a prefill chunk and a decode step of the batch alternate. At
                                       most max_tokens (the step's activations are planned for it). */

    fm_step_budget_mode step_budget; /* generation (--step-budget): a mixed step's prefill share beside decode rows
                                        (docs/mixed-steps.md). FIXED: every token max_step_tokens leaves; LATENCY:
                                        the share whose measured cost keeps the step within step_latency_ratio x a
                                        decode-only step (64 tokens at least, max_step_tokens at most) and large
                                        enough for the waiting prompts (prompt_wait_steps); AUTO (0): LATENCY, and
                                        FIXED for a rank of an --ep/--tp group (LATENCY is refused there). Refused
                                        with mixed steps off */
    double step_latency_ratio;       /* --max-step-latency-ratio: LATENCY's bound, >= 1; 0: 1.5. Refused with FIXED */
    int32_t prompt_wait_steps;       /* --max-prompt-wait-steps: LATENCY's prompt wait W: a mixed step's share at
                                        least the waiting prompts' tokens over the steps left before the one waiting
                                        longest has waited W steps; 0: 40; -1: off (the share by time alone). As
                                        the ratio: N refused with FIXED and on the ranks of a group (off is
                                        accepted everywhere). A request queued for a slot is not counted */
    fm_kv_dtype kv_cache;            /* generation (--kv-cache): the KV cache's format, FM_KV_ACT (0) unless asked;
                                        e4m3 is refused without a cache (max_seqs 0), with fp32 activations (ref32)
                                        and on cuda for head dims that are not a multiple of 16 */
} fm_options;

#define FM_DEFAULT_MAX_TOKENS 2048
#define FM_PROMPT_WAIT_STEPS_MAX 1000000 /* fm_options.prompt_wait_steps at most */

void fm_options_init(fm_options *opt);

/* Backends by name (fm_options.backend): the library's own spelling of `name` ("cpu", "cuda": a static string), or
 * NULL when there is no such backend. */
const char *fm_backend_lookup(const char *name);
/* True for a backend whose weights and caches live in a device's memory (cuda). */
bool fm_backend_on_device(const char *name);
/* The device memory free (and in all: total may be NULL) for such a backend; FM_ERR_USAGE for one without a device,
 * FM_ERR_BACKEND when there is no device here. */
fm_status fm_backend_free_memory(const char *name, size_t *free_bytes, size_t *total, fm_error *err);

/* ---- before a load: what a checkpoint is, and the memory a load of it takes ---- */

/* A checkpoint's description from its config.json alone (no weight is read). */
typedef struct fm_checkpoint_info {
    char model_type[32];
    int32_t n_layers, n_moe_layers;
    int32_t n_experts, n_experts_per_tok; /* 0 experts: a dense model */
    int32_t hidden_size, vocab_size;
    int64_t max_position_embeddings; /* 0: the config gives none */
    bool prequantized;               /* the weights are already quantized (GPTQ, AWQ, compressed-tensors, block-FP8) */
    char quantization[128];          /* one line describing that format; "" for a float checkpoint */
} fm_checkpoint_info;

fm_status fm_checkpoint_probe(const char *dir, fm_checkpoint_info *out, fm_error *err);
/* The same for a synthetic model (fm_model_load_synthetic's names), before anything is generated. */
fm_status fm_synthetic_probe(const char *name, fm_checkpoint_info *out, fm_error *err);

/* The memory a load of a checkpoint with `opt` takes on opt->backend, planned from config.json and the options before
 * anything is allocated, as the load plans it (the preset, --dense, --dispatch, --layers, max_tokens, max_seqs and
 * ctx, the routes; --ep / --tp: rank ep_rank's or tp_rank's share), in bytes. */
typedef struct fm_memory_estimate {
    size_t weights, activations, workspace; /* the banks; the forward pass's buffers; the ops' and libraries' scratch */
    size_t kv_cache, kv_state;              /* generation (max_seqs > 0): the paged KV cache; the decode state */
    size_t exchange;                        /* a rank of --ep: its exchange buffers */
    size_t load_staging;                    /* transient while loading */
    size_t total;                           /* resident while running */
    size_t peak;                            /* what must fit */
} fm_memory_estimate;

fm_status fm_memory_estimate_compute(const char *dir, const fm_options *opt, fm_memory_estimate *out, fm_error *err);

/* Generation's fit on a device budget of `budget` bytes (a share of fm_backend_free_memory): *max_seqs when <= 0 (as
 * many sequences as fit, 1 to cap) and *ctx when <= 0 (the model's context, shortened to a multiple of 16 when
 * *max_seqs sequences of it do not fit), beside the model planned for prefill chunks of `chunk` tokens. FM_ERR_NOMEM
 * when the model alone, or 16 tokens a sequence, do not fit. */
fm_status fm_memory_fit_generation(const char *dir, const fm_options *opt, int64_t chunk, size_t budget, int32_t cap,
                                   int32_t *max_seqs, int64_t *ctx, fm_error *err);

/* Bytes as "61.1 GiB", "35.2 MiB", "512 bytes" into buf; returns buf. */
const char *fm_mem_format(size_t bytes, char *buf, size_t cap);

/* Checks a route override string (fm_options.routes) without a GPU: FM_ERR_USAGE naming the bad key or value and
 * listing the valid ones. Whether the GPU can run a forced kernel is checked when the backend is created. */
fm_status fm_routes_check(const char *routes, fm_error *err);

/* The model: a checkpoint's configuration and weights on one backend, immutable after the load. */
typedef struct fm_model fm_model;
/* A context: what running the model mutates (the forward buffers, the KV cache and its pool, the sampler's state and
 * masks, captured CUDA graphs, the expert cache of --experts-in host, a rank's state of --ep/--tp). Every call that
 * runs the model takes one. */
typedef struct fm_context fm_context;

/* Loads the checkpoint in dir (config.json + model.safetensors or a sharded index), validates it and
 * quantizes it for opt->preset on opt->backend. On failure *out is NULL and nothing stays allocated. The memory plan
 * counts the context's memory too (opt->max_tokens, ctx, max_seqs, experts_in) and the load reserves it, so that
 * nothing fails for memory after the check that promised it fits. */
fm_status fm_model_load(const char *dir, const fm_options *opt, fm_model **out, fm_error *err);
/* Frees the model and its context's memory; free the context first. */
void fm_model_free(fm_model *m);

int32_t fm_model_vocab_size(const fm_model *m);
/* The model's end-of-sequence ids (config.json, generation_config.json): their count, *ids pointing at them. */
int32_t fm_model_eos_ids(const fm_model *m, const int32_t **ids);

/* A model with synthetic weights at the shapes of a known checkpoint ("qwen3-30b-a3b", "mixtral-8x7b"; the list:
 * fm_synthetic_names), built through the same load path as a real one (weights generated where the backend runs,
 * then converted to the plan's formats); n_layers 0 = all. For benchmarks and the tests of a full-size load. */
fm_status fm_model_load_synthetic(const char *name, int32_t n_layers, const fm_options *opt, fm_model **out,
                                  fm_error *err);
/* Names accepted by fm_model_load_synthetic, comma-separated, for messages. */
const char *fm_synthetic_names(void);

/* What a context asks for; a zero field takes what the model was loaded for (fm_options' field of the same name).
 * More than the load planned is refused, naming the option to load with. */
typedef struct fm_context_params {
    int32_t max_seqs;   /* sequences decoded together; at most the load's max_seqs */
    int64_t ctx;        /* tokens per sequence; at most the load's ctx */
    int64_t max_tokens; /* tokens of one forward pass (a prompt, a prefill chunk); at most the load's */
} fm_context_params;

/* Creates the model's context over the memory its load reserved (params NULL: all of it). One context per model at
 * a time: a second create before fm_context_free is refused (FM_ERR_USAGE). */
fm_status fm_context_create(fm_model *m, const fm_context_params *params, fm_context **out, fm_error *err);
/* Gives the context back (its open sequences end; the memory stays the model's until fm_model_free). NULL: nothing.
 * A scheduler over it must be freed first. */
void fm_context_free(fm_context *c);

const fm_model *fm_context_model(const fm_context *c);
int32_t fm_context_max_seqs(const fm_context *c);     /* 0: no KV cache (logits and perplexity only) */
fm_kv_dtype fm_context_kv_cache(const fm_context *c); /* the KV cache's format (FM_KV_ACT without a cache) */
int64_t fm_context_ctx(const fm_context *c);          /* tokens per sequence; 0: no limit */
int64_t fm_context_max_tokens(const fm_context *c);   /* tokens of one forward pass */
bool fm_context_prefix_cache(const fm_context *c);    /* automatic prefix caching is on */
/* The step token budget of mixed steps (fm_options.max_step_tokens as the load resolved it, at most max_tokens): 0
 * when mixed steps are off or there is no KV cache. */
int64_t fm_context_max_step_tokens(const fm_context *c);
/* How the load resolved fm_options.step_budget: FIXED or LATENCY (FIXED when mixed steps are off), and LATENCY's
 * ratio into *ratio (may be NULL). */
fm_step_budget_mode fm_context_step_budget(const fm_context *c, double *ratio);
/* LATENCY's prompt wait W in steps as the load resolved it (fm_options.prompt_wait_steps); 0 when off or FIXED. */
int32_t fm_context_prompt_wait_steps(const fm_context *c);
/* The KV cache's blocks: held by a sequence (cached blocks no sequence holds count as free), and in the pool; 0 and 0
 * without a KV cache. */
void fm_context_kv_blocks(const fm_context *c, int32_t *used, int32_t *total);

/* Warm-up before serving: a prefill chunk or two and two decode steps of every batch bucket, on throwaway sequences
 * that leave nothing a request can see (src/engine/warmup.c), so that the first request does not pay the first
 * launches and the decode graphs' captures. chunk: the server's prefill chunk (cut to the context). Needs a context
 * with max_seqs > 0. */
typedef struct fm_warmup_report {
    int64_t prefill_tokens; /* tokens of the prefill chunks run */
    int32_t buckets;        /* decode buckets run (and captured on cuda) */
    double seconds;
} fm_warmup_report;
fm_status fm_context_warmup(fm_context *c, int64_t chunk, fm_warmup_report *out, fm_error *err);

/* Prefill of ids[0..n_tokens) at positions 0..n_tokens-1; logits is [n_tokens, vocab] row-major fp32. */
fm_status fm_context_logits(fm_context *c, const int32_t *ids, int64_t n_tokens, float *logits, fm_error *err);

/* Perplexity protocol (models/README.md): `windows` consecutive windows of `window` tokens from ids, each an
 * independent sequence at positions 0..window-1; the loss is the mean next-token cross-entropy over
 * positions 1..window-1 of every window; *ppl = exp(mean loss). progress (may be NULL) is called after each
 * window with the perplexity so far. */
typedef void (*fm_progress_fn)(void *user, int64_t done, int64_t total, double value);
fm_status fm_context_perplexity(fm_context *c, const int32_t *ids, int64_t n_ids, int32_t window, int64_t windows,
                                fm_progress_fn progress, void *user, double *ppl, double *mean_loss, fm_error *err);
/* The same with each window run through the KV cache (a model loaded with max_seqs >= 1 and ctx >= window): its
 * first `chunk` tokens as a prefill, then chunks of `chunk` over the cached prefix (1: decode steps), so every later
 * position reads keys and values as the cache stores them (--kv-cache e4m3: its codes' values). chunk 0: as
 * fm_context_perplexity. */
fm_status fm_context_perplexity_cached(fm_context *c, const int32_t *ids, int64_t n_ids, int32_t window,
                                       int64_t windows, int32_t chunk, fm_progress_fn progress, void *user, double *ppl,
                                       double *mean_loss, fm_error *err);

/* The expert cache's counters since load (experts in host memory). An expert read is one (layer, expert) that a
 * layer's routed tokens need in one forward pass: a hit when its slot already held it, a miss (one copy from host
 * memory) otherwise. */
typedef struct fm_expert_stats {
    int32_t slots;   /* S */
    int32_t experts; /* routed experts of all layers: n_moe_layers x n_experts */
    int64_t fetches; /* layer passes through the cache */
    int64_t hits, misses;
    uint64_t bytes_copied;               /* host -> backend bytes of the misses */
    size_t slot_bytes;                   /* one expert's gate_up + down in the backend layout */
    int64_t prefetches, prefetch_copies; /* layer passes prefetched ahead (route expert.prefetch), experts copied */
    uint64_t bytes_prefetched;           /* host -> backend bytes of those copies */
} fm_expert_stats;

/* false (stats zeroed) when the model keeps its experts in backend memory. */
bool fm_context_expert_stats(const fm_context *c, fm_expert_stats *out);

/* ---- generation ---- */

#define FM_MAX_LOGPROBS 20 /* the OpenAI API's bound on top_logprobs */

typedef struct fm_token_logprob {
    int32_t id;
    float logprob;
} fm_token_logprob;

/* What sampling one token returns beside the id. */
typedef struct fm_sample_info {
    float logprob;                         /* of the chosen id under the raw distribution */
    int32_t n_top;                         /* the top log-probabilities asked for (or vocab when smaller) */
    fm_token_logprob top[FM_MAX_LOGPROBS]; /* the most likely ids of the raw distribution, descending */
} fm_sample_info;

/* Values at the edges of fp32 that a front end hands the sampler:
 *   - temperature: the sampler divides the logits by T; below FM_GREEDY_TEMPERATURE_BELOW a logit of 1e8 would
 *     overflow fp32 (and a denormal T turns every logit into inf), while the distribution is already a point mass
 *     on the argmax at far larger T: such a T is greedy (0).
 *   - top_p: a positive p that rounds to 0 in fp32 (1e-50) keeps only the most likely id, as the smallest positive
 *     float does; it must not become 0, which the sampler refuses. */
#define FM_GREEDY_TEMPERATURE_BELOW 1e-30
static inline float fm_sampler_temperature(double t) { return t < FM_GREEDY_TEMPERATURE_BELOW ? 0.0f : (float)t; }
static inline float fm_sampler_top_p(double p) { return p > 0.0 && (float)p < FLT_MIN ? FLT_MIN : (float)p; }

/* A per-request token constraint (structured outputs, src/text/token_matcher.h makes one from a grammar): before
 * each token of the request the engine asks mask for the ids allowed next, and reports the id it sampled to accept.
 * Sampling then sees only allowed ids (the others' logits -inf); log-probabilities stay the model's own. */
typedef struct fm_token_constraint {
    void *user;
    /* Fills words[(vocab + 31) / 32] (every word): bit i set when id i may come next. At least one bit. The masks of
     * the requests of one decode step are filled in parallel (OpenMP threads): mask must not touch state shared
     * with another request's constraint. */
    void (*mask)(void *user, uint32_t *words, int32_t vocab);
    /* The sampled id; false (an id the constraint refuses) ends the request with an error. */
    bool (*accept)(void *user, int32_t id);
} fm_token_constraint;

/* OpenAI's logit_bias: bias (in [-100, 100]) added to id's logit before sampling (after the penalties, before the
 * temperature and filters): -100 bans the id in practice, +100 forces it. */
typedef struct fm_logit_bias {
    int32_t id;
    float bias;
} fm_logit_bias;
#define FM_MAX_LOGIT_BIAS 1024 /* entries per request */

/* How one sequence samples (src/engine/sampler.h has the exact definitions). fm_gen_params_init: greedy. */
typedef struct fm_gen_params {
    float temperature;        /* 0: greedy */
    int32_t top_k;            /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;
    int64_t max_tokens;      /* new tokens at most (>= 1) */
    const int32_t *stop_ids; /* extra end ids beside the model's eos ids (may be NULL) */
    int32_t n_stop_ids;
    const int32_t *const *stop_seqs; /* stop sequences of ids (stop_seq_lens[i] ids each), excluded from the output */
    const int32_t *stop_seq_lens;
    int32_t n_stop_seqs;
    bool ignore_eos;                       /* run to max_tokens even past an eos id (benchmarks) */
    const fm_token_constraint *constraint; /* NULL: none; it must outlive the request */
    const fm_logit_bias *logit_bias;       /* n_logit_bias entries, distinct ids (copied at submission) */
    int32_t n_logit_bias;
} fm_gen_params;

void fm_gen_params_init(fm_gen_params *p);

typedef enum fm_finish { FM_FINISH_LENGTH = 0, FM_FINISH_EOS, FM_FINISH_STOP } fm_finish;

/* One generated sequence. */
typedef struct fm_gen_output {
    int32_t *ids;    /* the new ids (the prompt excluded; an eos or stop id excluded), malloc'd; free with free() */
    float *logprobs; /* log-probability of each new id under the model's distribution */
    int64_t n;
    fm_finish finish;
} fm_gen_output;

/* Timing of a generate call. */
typedef struct fm_gen_stats {
    double prefill_s;       /* wall time of the prefill steps (a mixed step's time is shared by its prompt and */
    double decode_s;        /* decode tokens in proportion to their numbers) and of the decode steps */
    double ttft_s;          /* from the call to the first sampled token of the first sequence */
    int64_t prefill_tokens; /* prompt tokens run */
    int64_t decode_tokens;  /* tokens sampled by decode steps */
    int64_t decode_steps;
} fm_gen_stats;

/* Called after each sampled token of sequence i (may be NULL). */
typedef void (*fm_token_fn)(void *user, int32_t i, int32_t id);

/* Generates for n prompts (decoded together, max_seqs at a time; the rest wait for a free slot), each with its
 * own parameters. The context must have max_seqs > 0. prefill_chunk: prompt tokens per prefill step (0: the
 * context's max_tokens). out[i] receives sequence i. */
fm_status fm_context_generate(fm_context *c, const int32_t *const *prompts, const int64_t *n_prompt,
                              const fm_gen_params *params, int32_t n, int64_t prefill_chunk, fm_token_fn on_token,
                              void *user, fm_gen_output *out, fm_gen_stats *stats, fm_error *err);

/* ---- requantize: a float checkpoint written as an int4 checkpoint by our own quantizer (the format and how:
 * src/engine/requantize.h) ---- */

#define FM_REQUANT_SHARD_BYTES (4ull << 30) /* default size of one output file */

typedef struct fm_requant_opts {
    const char *in_dir, *out_dir;
    bool force;           /* write into a non-empty out_dir, replacing its checkpoint files */
    uint64_t shard_bytes; /* 0: FM_REQUANT_SHARD_BYTES; one file when everything fits */
    bool progress;        /* layer i/L and bytes written on stderr */
    bool p2_scales;       /* int4-p2 (quant/int4_p2.h): each row's group scales one bf16 row scale times powers of two,
                             searched (the same file format: the scales are bf16 values); else int4-g128's quantizer */
} fm_requant_opts;

typedef struct fm_requant_stats {
    int64_t n_quantized; /* linears written as int4 */
    int64_t n_copied;    /* tensors copied as they are */
    int32_t n_files;     /* safetensors files written */
    uint64_t bytes;      /* safetensors bytes written */
} fm_requant_stats;

/* FM_ERR_USAGE: out_dir exists and is not empty (without force), or is in_dir; FM_ERR_UNSUPPORTED: the input is
 * already quantized; other statuses as loading the input gives them. */
fm_status fm_requantize(const fm_requant_opts *opts, fm_requant_stats *stats, fm_error *err);

/* ---- a group of ranks in one process (--ep, --tp) ---- */

/* N ranks over one checkpoint, each a model holding its share (expert parallelism: 1/N of the routed experts;
 * tensor parallelism of attention: its heads), with its context, joined by a world of collectives; every pass runs on
 * every rank at once (src/dist/rank_group.h says how). */
typedef struct fm_rank_group fm_rank_group;
#define FM_MAX_RANKS 64 /* ranks of a group at most */

/* Loads dir once per rank with opt, whose ep_ranks and tp_ranks (either > 1; equal when both are) size the group.
 * Errors name the rank when a later rank's load fails. */
fm_status fm_rank_group_load(const char *dir, const fm_options *opt, fm_rank_group **out, fm_error *err);
void fm_rank_group_free(fm_rank_group *g);
/* Rank r's model (every rank has the configuration and vocabulary of the checkpoint). */
const fm_model *fm_rank_group_model(const fm_rank_group *g, int32_t rank);
/* Rank r's context, which the group holds (its queries: fm_context_max_seqs, ...). */
const fm_context *fm_rank_group_context(const fm_rank_group *g, int32_t rank);

/* The forward pass over ids (positions 0..T-1) on every rank together; logits [T, vocab] (or the last row only when
 * last_only) from rank 0 (every rank holds the same). */
fm_status fm_rank_group_forward(fm_rank_group *g, const int32_t *ids, int64_t T, bool last_only, float *logits,
                                fm_error *err);
/* fm_context_generate on every rank together (load the group with max_seqs > 0): every rank samples the same
 * tokens; on_token and out are rank 0's. */
fm_status fm_rank_group_generate(fm_rank_group *g, const int32_t *const *prompts, const int64_t *n_prompt,
                                 const fm_gen_params *params, int32_t n, int64_t prefill_chunk, fm_token_fn on_token,
                                 void *user, fm_gen_output *out, fm_gen_stats *stats, fm_error *err);

#ifdef __cplusplus
}
#endif
#endif
