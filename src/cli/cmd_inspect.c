/* fp8moe inspect: what a checkpoint is, without loading its weights (inspect_model.c); with --tokens, the memory plan
 * of a backend and preset and whether it fits (inspect_plan.c); with --routes, the kernel route table and the kernels
 * it picks at the model's shapes (inspect_routes.c). This file parses the options and runs the sections in order. */
#include <string.h>

#include "backend/backend_kind.h"
#include "backend/routes.h"
#include "cli/cli.h"
#include "cli/inspect.h"
#include "dist/comm.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe inspect --model DIR [--tensors] [--tokens T [--backend B] [--preset P] [--dense w8a8] [--lm-head "
    "L]\n"
    "                      [--layers N] [--max-seqs B [--ctx N]] [--vram-limit BYTES]\n"
    "                      [--experts-in W [--expert-slots N]] [--ep N] [--tp N]]\n"
    "                      [--routes] [--route KEY=VALUE]...\n"
    "       fp8moe inspect --routes [--route KEY=VALUE]...\n"
    "       fp8moe inspect --routes --markdown\n"
    "\n"
    "  --model DIR        Hugging Face checkpoint directory\n"
    "  --tensors          also list every tensor with its dtype and shape\n"
    "  --tokens T         also print the memory plan for a prompt of T tokens: weights by family, activation\n"
    "                     buffers, workspace, total, computed before anything is allocated\n"
    "  --backend B        the plan's backend: cpu (default) or cuda\n"
    "  --preset P         the plan's preset: ref (default), ref32, int4, fp8, fp4\n"
    "  --dense w8a8       the plan with e4m3 per-tensor dense projections (W8A8)\n"
    "  --lm-head L        the plan with the lm_head as float (default) or dense (the dense projections' format)\n"
    "  --dispatch D       the plan with the experts' dispatch buffer in D: bf16, fp8, mxfp4, nvfp4 (as run, generate)\n"
    "  --layers N         plan only the first N decoder layers\n"
    "  --max-seqs B       the plan for generation too: the paged KV cache of B sequences and the decode state\n"
    "  --ctx N            tokens per sequence of that KV cache (default: max_position_embeddings)\n"
    "  --kv-cache F       that KV cache's format: auto or e4m3 (docs/kv-cache.md)\n"
    "  --vram-limit BYTES cuda: say whether the plan fits in this much memory (8Gi, 7.5G, bytes) instead of\n"
    "                     the GPU's free memory\n"
    "  --experts-in W     the plan with the routed experts on the device (default), in host memory (host: an\n"
    "                     expert cache of slots on the device, sized by --expert-slots or what --vram-limit or\n"
    "                     the free memory leaves), or auto (host only when the plan does not fit otherwise)\n"
    "  --expert-slots N   experts in host memory: the slots of the expert cache\n"
    "  --ep N             the plan per rank of expert parallelism over N ranks: each rank's experts and bytes\n"
    "  --tp N             the same for tensor parallelism of attention (each rank's heads); with --ep, one group\n"
    "  --routes           print the cuda backend's kernel route table: each key, its value, default and what it\n"
    "                     decides, then the kernel of each dense weight format at M = 1, 8, 16, 128, 2048 rows and\n"
    "                     the W4A8 MoE tile rows at several prompt lengths, for the model's shapes (without\n"
    "                     --model: a Qwen3-30B-A3B-like shape), as on this machine's GPU (on sm_90 when there is\n"
    "                     none; it says which)\n"
    "  --markdown         with --routes alone: the keys' reference page instead (docs/routes.md is its output)\n"
    "  --route KEY=VALUE  an override (repeatable), as the model-running commands take it: the table and the memory\n"
    "                     plan (w4a8.tile sizes the MoE workspace) follow it. The keys and their values: --routes,\n"
    "                     or docs/routes.md\n"
    "  -h, --help         this help\n";

/* what the command line asks for */
typedef struct inspect_args {
    const char *dir, *plan_only; /* --model; the first option that only the memory plan takes */
    bool list, routes, markdown; /* --tensors, --routes, --markdown */
    plan_args pa;                /* the memory plan's options */
} inspect_args;

/* The options: the command's exit code when it ends here (help, a usage error), else -1 with *a filled. */
static int parse_args(int argc, char **argv, inspect_args *a) {
    const char *cmd = "inspect";
    *a = (inspect_args){NULL,
                        NULL,
                        false,
                        false,
                        false,
                        {0, 0, "cpu", FM_PRESET_REF, 0, FM_DENSE_PRESET, 0, 0, FM_KV_ACT, "", FM_EXPERTS_DEVICE, 0,
                         FM_DISPATCH_PRESET, 0, 0, FM_LM_HEAD_FLOAT}};
    enum {
        OPT_MODEL_I = 2000,
        OPT_TENSORS,
        OPT_TOKENS,
        OPT_BACKEND_I,
        OPT_PRESET_I,
        OPT_LAYERS_I,
        OPT_VRAM_I,
        OPT_DENSE_I,
        OPT_ROUTES_I,
        OPT_MARKDOWN_I,
        OPT_ROUTE_I,
        OPT_MAX_SEQS_I,
        OPT_CTX_I,
        OPT_KV_CACHE_I,
        OPT_EXPERTS_IN_I,
        OPT_EXPERT_SLOTS_I,
        OPT_DISPATCH_I,
        OPT_EP_I,
        OPT_TP_I,
        OPT_LM_HEAD_I
    };
    static const struct option longopts[] = {{"model", required_argument, 0, OPT_MODEL_I},
                                             {"tensors", no_argument, 0, OPT_TENSORS},
                                             {"tokens", required_argument, 0, OPT_TOKENS},
                                             {"backend", required_argument, 0, OPT_BACKEND_I},
                                             {"preset", required_argument, 0, OPT_PRESET_I},
                                             {"layers", required_argument, 0, OPT_LAYERS_I},
                                             {"vram-limit", required_argument, 0, OPT_VRAM_I},
                                             {"dense", required_argument, 0, OPT_DENSE_I},
                                             {"routes", no_argument, 0, OPT_ROUTES_I},
                                             {"markdown", no_argument, 0, OPT_MARKDOWN_I},
                                             {"route", required_argument, 0, OPT_ROUTE_I},
                                             {"max-seqs", required_argument, 0, OPT_MAX_SEQS_I},
                                             {"ctx", required_argument, 0, OPT_CTX_I},
                                             {"kv-cache", required_argument, 0, OPT_KV_CACHE_I},
                                             {"experts-in", required_argument, 0, OPT_EXPERTS_IN_I},
                                             {"expert-slots", required_argument, 0, OPT_EXPERT_SLOTS_I},
                                             {"dispatch", required_argument, 0, OPT_DISPATCH_I},
                                             {"ep", required_argument, 0, OPT_EP_I},
                                             {"tp", required_argument, 0, OPT_TP_I},
                                             {"lm-head", required_argument, 0, OPT_LM_HEAD_I},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    long v = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == OPT_MODEL_I) {
            if (!*optarg) return cli_usage(cmd, "--model needs a checkpoint directory, got ''");
            a->dir = optarg;
        } else if (c == OPT_TENSORS) a->list = true;
        else if (c == OPT_TOKENS) {
            if (!cli_parse_int(cmd, "--tokens", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            a->pa.tokens = v;
        } else if (c == OPT_BACKEND_I) {
            if (!fm_backend_kind_find(optarg)) return cli_usage(cmd, "--backend must be cpu or cuda, got '%s'", optarg);
            a->pa.backend = optarg, a->plan_only = "--backend";
        } else if (c == OPT_PRESET_I) {
            if (!fm_preset_parse(optarg, &a->pa.preset))
                return cli_usage(cmd, "--preset must be one of ref, ref32, int4, fp8, fp4, got '%s'", optarg);
            a->plan_only = "--preset";
        } else if (c == OPT_DENSE_I) {
            if (!fm_dense_parse(optarg, &a->pa.dense))
                return cli_usage(cmd, "--dense must be w8a8 or preset, got '%s'", optarg);
            a->plan_only = "--dense";
        } else if (c == OPT_LM_HEAD_I) {
            if (!fm_lm_head_parse(optarg, &a->pa.lm_head))
                return cli_usage(cmd, "--lm-head must be float or dense, got '%s'", optarg);
            a->plan_only = "--lm-head";
        } else if (c == OPT_DISPATCH_I) {
            if (!fm_dispatch_parse(optarg, &a->pa.dispatch))
                return cli_usage(cmd, "--dispatch must be one of bf16, fp8, mxfp4, nvfp4, preset, got '%s'", optarg);
            a->plan_only = "--dispatch";
        } else if (c == OPT_LAYERS_I) {
            if (!cli_parse_int(cmd, "--layers", optarg, 1, 100000, &v)) return CLI_USAGE;
            a->pa.n_layers = (int32_t)v, a->plan_only = "--layers";
        } else if (c == OPT_VRAM_I) {
            if (!cli_parse_bytes(cmd, "--vram-limit", optarg, &a->pa.vram_limit)) return CLI_USAGE;
            a->plan_only = "--vram-limit";
        } else if (c == OPT_KV_CACHE_I) {
            if (!cli_parse_kv_cache(cmd, optarg, &a->pa.kv_cache)) return CLI_USAGE;
            a->plan_only = "--kv-cache";
        } else if (c == OPT_MAX_SEQS_I) {
            if (!cli_parse_int(cmd, "--max-seqs", optarg, 1, 4096, &v)) return CLI_USAGE;
            a->pa.max_seqs = (int32_t)v, a->plan_only = "--max-seqs";
        } else if (c == OPT_CTX_I) {
            if (!cli_parse_int(cmd, "--ctx", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            a->pa.ctx = v, a->plan_only = "--ctx";
        } else if (c == OPT_EXPERTS_IN_I) {
            if (!fm_experts_in_parse(optarg, &a->pa.experts_in))
                return cli_usage(cmd, "--experts-in must be host, device or auto, got '%s'", optarg);
            a->plan_only = "--experts-in";
        } else if (c == OPT_EXPERT_SLOTS_I) {
            if (!cli_parse_int(cmd, "--expert-slots", optarg, 1, 1L << 30, &v)) return CLI_USAGE;
            a->pa.expert_slots = (int32_t)v, a->plan_only = "--expert-slots";
        } else if (c == OPT_EP_I) {
            if (!cli_parse_int(cmd, "--ep", optarg, 1, FM_COMM_MAX_RANKS, &v)) return CLI_USAGE;
            a->pa.ep = (int32_t)v, a->plan_only = "--ep";
        } else if (c == OPT_TP_I) {
            if (!cli_parse_int(cmd, "--tp", optarg, 1, FM_COMM_MAX_RANKS, &v)) return CLI_USAGE;
            a->pa.tp = (int32_t)v, a->plan_only = "--tp";
        } else if (c == OPT_ROUTES_I) {
            a->routes = true;
        } else if (c == OPT_MARKDOWN_I) {
            a->markdown = true;
        } else if (c == OPT_ROUTE_I) {
            if (!cli_route_add(cmd, optarg, a->pa.routes, sizeof a->pa.routes)) return CLI_USAGE;
        } else if (c == 'h') return fputs(HELP, stdout), CLI_OK;
        else return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (a->plan_only && !a->pa.tokens)
        return cli_usage(cmd, "%s describes the memory plan, which needs --tokens T", a->plan_only);
    if (a->markdown && (!a->routes || a->dir || a->pa.routes[0] || a->pa.tokens || a->list))
        return cli_usage(cmd, "--markdown prints the route keys' reference page: --routes --markdown alone");
    return -1;
}

/* The sections the options ask for, in order */
static int run(const inspect_args *a) {
    const char *cmd = "inspect";
    if (a->markdown) return fm_routes_print_markdown(stdout), CLI_OK;
    fm_error err = {{0}};
    if (!a->dir && a->routes) { /* the table alone, at Qwen3-30B-A3B's shapes */
        const route_shapes qwen3 = {"Qwen3-30B-A3B-like, no --model", 2048, 4096, 4096, 5120, 128, 8};
        const fm_status st = inspect_print_routes(&qwen3, a->pa.routes, &err);
        return st ? cli_fail(cmd, st, &err) : CLI_OK;
    }
    if (!a->dir) return cli_usage(cmd, "--model is required (or --routes alone for the route table)");
    if (a->pa.routes[0] && !a->routes && !a->pa.tokens)
        return cli_usage(cmd, "--route changes the route table (--routes) or the memory plan (--tokens T)");
    fm_config cfg;
    fm_st_set set = {0};
    fm_model_src src = {0};
    fm_status st = fm_config_load(a->dir, &cfg, &err);
    if (!st) st = fm_st_open_dir(a->dir, &set, &err);
    if (!st) st = fm_model_src_bind(&cfg, &set, &src, &err);
    if (!st) {
        inspect_print_model(a->dir, &cfg, &set, &src);
        if (cfg.quant.method != FM_QUANT_NONE) inspect_print_quantization(&cfg, &src);
        if (a->list)
            for (int64_t i = 0; i < set.n_tensors; i++) {
                const fm_st_tensor *t = set.by_name[i];
                printf("  %-64s %-8s [", t->name, fm_dtype_name(t->dtype));
                for (int d = 0; d < t->n_dims; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
                printf("]\n");
            }
        if (a->pa.tokens) st = inspect_print_plan(&cfg, &src, &a->pa, &err);
        if (!st && a->routes) {
            const route_shapes s = inspect_shapes_of(a->dir, &cfg);
            st = inspect_print_routes(&s, a->pa.routes, &err);
        }
    }
    fm_model_src_free(&src);
    fm_st_close(&set);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}

int cmd_inspect(int argc, char **argv) {
    inspect_args a;
    const int code = parse_args(argc, argv, &a);
    return code >= 0 ? code : run(&a);
}
