/* The fp8moe command: shared helpers of the subcommands. Exit codes are a contract:
 * 0 success, 1 bad input or data (one line on stderr naming the file, field or tensor), 2 usage error. */
#ifndef FM_CLI_H
#define FM_CLI_H

#include <getopt.h>
#include <stdio.h>

#include "fp8moe.h"

enum { CLI_OK = 0, CLI_BAD_INPUT = 1, CLI_USAGE = 2 };

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_parity(int argc, char **argv);
/* bench: runs the bench program (fp8moe-bench, beside this binary) with the arguments after "bench" */
int cmd_bench(int argc, char **argv);
int cmd_requantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* Prints "fp8moe CMD: error: MSG" and returns the exit code for st. */
int cli_fail(const char *cmd, fm_status st, const fm_error *err);
/* Usage error: prints the message and a hint to --help, returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses an integer option value in [lo, hi]; false (after printing) on a bad value. */
bool cli_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, long *out);

/* Parses a byte count >= 1: plain bytes, or a number (a decimal fraction allowed) with a suffix K, M, G, T
 * (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024): "8Gi", "7.5G", "123456789". False (after printing) on a bad
 * value. */
bool cli_parse_bytes(const char *cmd, const char *opt, const char *text, int64_t *out);
/* --max-step-tokens N|off: N >= 1, or off (-1, fm_options.max_step_tokens) */
bool cli_parse_step_tokens(const char *cmd, const char *text, int64_t *out);
/* --step-budget fixed|latency (fm_options.step_budget) and --max-step-latency-ratio R (R in [1, 1000]) */
bool cli_parse_step_budget(const char *cmd, const char *text, fm_step_budget_mode *out);
bool cli_parse_step_ratio(const char *cmd, const char *text, double *out);
/* --max-prompt-wait-steps N|off: N in [1, FM_PROMPT_WAIT_STEPS_MAX], or off (-1, fm_options.prompt_wait_steps) */
bool cli_parse_prompt_wait(const char *cmd, const char *text, int32_t *out);
/* The step budget the load resolved, on stderr (serve prints it at start; chat and generate with --verbose) */
void cli_print_step_tokens(const char *cmd, const fm_context *ctx);
#define CLI_STEP_TOKENS_HELP                                                                                           \
    "  --max-step-tokens N|off  tokens of one scheduler step: every running sequence's next token and prompt\n"        \
    "                           chunks in one forward pass (default: --max-seqs + 512, at most --prefill-chunk);\n"    \
    "                           off: prompt chunks and decode steps alternate (docs/mixed-steps.md)\n"                 \
    "  --step-budget fixed|latency  a mixed step's prompt share beside the running streams: latency (default)\n"       \
    "                           sizes it from measured step times so a step stays within R x a decode-only\n"          \
    "                           step (64 tokens at least); fixed: every token --max-step-tokens leaves (a\n"           \
    "                           prompt's first token sooner, the streams' gaps less even)\n"                           \
    "  --max-step-latency-ratio R  latency's R, >= 1 (default 1.5)\n"                                                  \
    "  --max-prompt-wait-steps N|off  latency: a step also takes at least the waiting prompts' tokens over the\n"      \
    "                           steps left before the one waiting longest has waited N steps (default 40; off:\n"      \
    "                           the share by time alone)\n"
/* --kv-cache auto|e4m3 (fm_options.kv_cache) */
bool cli_parse_kv_cache(const char *cmd, const char *text, fm_kv_dtype *out);
#define CLI_KV_CACHE_HELP                                                                                              \
    "  --kv-cache auto|e4m3     the KV cache's format: auto (the activations', bf16 on the GPU presets) or e4m3,\n"    \
    "                           FP8 keys and values with a scale per token and head: half the bytes, twice the\n"      \
    "                           tokens in the same memory (docs/kv-cache.md)\n"
/* --state-cache-slots, of the commands with a prefix cache */
#define CLI_STATE_SLOTS_HELP                                                                                           \
    "  --state-cache-slots N    hybrid models (Qwen3-Next): snapshots of the recurrent states kept for the prefix\n"   \
    "                           cache, each one sequence's states (default: 2 x --max-seqs; 0: no prefix cache)\n"

/* Experts in host memory: one line of the expert cache's counters (slots, hit rate, misses, bytes copied); nothing
 * when the model keeps its experts on the device. */
/* The expert cache's counts since a snapshot (NULL: since the load); false when the experts are in backend memory. */
bool cli_expert_stats_since(const fm_context *ctx, const fm_expert_stats *since, fm_expert_stats *out);
void cli_print_expert_stats(const fm_context *ctx, const fm_expert_stats *since);

/* Writes n bytes to path through a temporary file and a rename, so a failed run never leaves a partial file. A path
 * that exists and is not a regular file (a device, a FIFO, a directory) is refused, not replaced. */
fm_status cli_write_file(const char *path, const void *data, size_t n, fm_error *err);

/* Options every model-running command shares: --model --backend --preset --layers --threads --ctx --vram-limit
 * --route --verbose. */
typedef struct cli_model_opts {
    const char *model_dir;
    fm_options opt;
    char routes[512];               /* the --route options joined "k=v,k=v"; opt.routes points here once one is given */
    bool preset_given, dense_given; /* --preset, --dense on the command line (cli_pick_preset) */
} cli_model_opts;

/* ---- defaults from the backend, the checkpoint and the card (cli_defaults.c), printed when chosen ---- */
#define CLI_MEMORY_FRACTION 0.90     /* of the card's free memory the server plans to use (weights, buffers, KV) */
#define CLI_MAX_SEQS_DEFAULT_CAP 256 /* sequences the fitted default stops at */
/* cuda without --preset: fp8, with --dense w8a8 for a float checkpoint; the cpu backend keeps ref */
void cli_pick_preset(const char *cmd, cli_model_opts *mo);
/* the prefill chunk: given (> 0), else FM_DEFAULT_MAX_TOKENS clamped to --ctx or the model's context */
int64_t cli_prefill_chunk(const cli_model_opts *mo, int64_t given);
/* cuda: --max-seqs (unless given) and --ctx (unless given) from the memory plan and the card's free memory */
void cli_fit_to_card(const char *cmd, cli_model_opts *mo, bool max_seqs_given, int64_t chunk);
/* One --route KEY=VALUE: checked (fm_routes_check) and appended to routes (cap bytes, "k=v,k=v"). False after
 * printing a usage message naming the key or value and the valid ones. */
bool cli_route_add(const char *cmd, const char *arg, char *routes, size_t cap);

#define CLI_ROUTE_HELP                                                                                                 \
    "  --route KEY=VALUE  cuda: force a kernel route (repeatable; `fp8moe inspect --routes` prints the table):\n"      \
    "                     w4a8.kernel=auto|wgmma|mma, attention.kernel=auto|wgmma|mma,\n"                              \
    "                     w4a8.tile=auto|16|64, dense.gemv=auto|on|off, w8a8.gemv_max_m=auto|1..16,\n"                 \
    "                     moe.gemv=auto|off|1..64, router.fused=auto|on|off, pdl=auto|on|off,\n"                       \
    "                     decode.graphs=auto|on|off, mixed.graphs=auto|on|off\n"

#define CLI_MODEL_HELP                                                                                                 \
    "  --model DIR        Hugging Face checkpoint directory (config.json + safetensors)\n"                             \
    "  --backend B        cpu (default) or cuda\n"                                                                     \
    "  --preset P         ref (the fp32 oracle), ref32 (fp32 on the GPU too), int4, fp8, fp4; default: ref on\n"       \
    "                     the cpu; generate, chat and serve on cuda: fp8 (+ --dense w8a8 for a float checkpoint)\n"    \
    "  --dense w8a8       dense projections as e4m3 weights (one scale per matrix, set at load) times e4m3\n"          \
    "                     activations (one dynamic scale per input); the preset's otherwise\n"                         \
    "  --lm-head L        the lm_head as float (default: bf16 on cuda, fp32 on the cpu) or dense: quantized at\n"      \
    "                     load to the dense projections' format (int4 W4A8 under fp8, e4m3 under --dense w8a8),\n"     \
    "                     a quarter or half of the largest matrix a decode step reads, for some accuracy\n"            \
    "                     (docs/speed-and-accuracy.md); refused by ref and ref32, whose dense projections are float\n" \
    "  --dispatch F       the experts' dispatch buffer (each token's routed copies): bf16, fp8 (e4m3, a scale\n"       \
    "                     per 128), mxfp4 (E2M1, a power-of-two scale per 32), nvfp4 (E2M1, an e4m3 scale per\n"       \
    "                     16 and one fp32 scale); the preset's otherwise (fp8: fp8, fp4: mxfp4). cpu: all; cuda:\n"    \
    "                     fp8, mxfp4, nvfp4 with the fp8 and fp4 presets (int4-tc experts), else the preset's\n"       \
    "  --int4-scales S    int4 group scales of weights quantized at load: g128 (default: a bf16 scale per 128)\n"      \
    "                     or p2 (each row's scales one bf16 row scale times powers of two, searched: the form a\n"     \
    "                     W4A8 kernel can fold into its e4m3 operand; docs/int4_p2.md). cpu backend, float\n"          \
    "                     checkpoints, presets int4, fp8 and fp4\n"                                                    \
    "  --layers N         run only the first N decoder layers, then the final norm and lm_head\n"                      \
    "  --threads N        CPU threads (default: all)\n"                                                                \
    "  --ctx N            tokens per sequence (default: the model's max_position_embeddings; longer\n"                 \
    "                     prompts are refused unless --ctx allows them)\n"                                             \
    "  --vram-limit BYTES cuda: as if the GPU had this much free memory (8Gi, 7.5G, bytes); the load\n"                \
    "                     fails before allocating if weights + buffers for 2048 tokens do not fit\n"                   \
    "  --experts-in W     where the routed experts live: device (default), host (host memory, with a cache of\n"       \
    "                     expert slots in device memory; cuda: the fp8 and fp4 presets; cpu: every preset),\n"         \
    "                     auto (host only when the model does not fit with every expert on the device)\n"              \
    "  --expert-slots N   experts in host memory: slots of the expert cache (at least the experts of one layer);\n"    \
    "                     default: what --vram-limit leaves after everything else (cpu: every expert)\n"               \
    "  --expert-policy P  which cached expert a miss replaces: lfu (default: least often needed, counts halved\n"      \
    "                     every 256 layer passes) or lru (least recently used)\n" CLI_ROUTE_HELP                       \
    "  -v, --verbose      progress on stderr\n"                                                                        \
    "  -h, --help         this help\n"

void cli_model_opts_init(cli_model_opts *o);

/* A command's own option: returns false after printing a usage message when the value is bad. */
typedef bool (*cli_option_fn)(const char *cmd, int id, const char *arg, void *ctx);

/* Parses argv: the shared model options into mo, the command's own options (`own`, ids >= 2000, ended by a
 * zero entry) through handle(ctx); an own option named like a shared one replaces it. Returns -1 when the command
 * should run, else the exit code to return: 0 after --help (help printed), 2 on a usage error (message printed). */
int cli_parse(const char *cmd, int argc, char **argv, const struct option *own, const char *help, cli_model_opts *mo,
              cli_option_fn handle, void *ctx);

/* Wall-clock seconds (monotonic). */
double cli_now(void);

#endif
