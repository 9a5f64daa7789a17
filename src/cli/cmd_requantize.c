/* fp8moe requantize: a float checkpoint written as an int4 compressed-tensors pack-quantized checkpoint by our own
 * quantizer (fp8moe.h, fm_requantize). */
#include <string.h>

#include "cli/cli.h"
#include "fp8moe.h"

static const char *HELP =
    "usage: fp8moe requantize --model IN_DIR --out OUT_DIR [--scales g128|p2] [--force] [--shard-size BYTES] "
    "[--quiet]\n"
    "       (also spelled: fp8moe --requantize --model IN_DIR --out OUT_DIR)\n"
    "\n"
    "Reads a float checkpoint (config.json + safetensors with BF16, F16 or F32 weights, one file or sharded) and\n"
    "writes OUT_DIR as an int4 compressed-tensors 'pack-quantized' checkpoint (readable by vLLM too): every linear\n"
    "the int4 preset quantizes (attention q/k/v/o, dense MLP and expert gate/up/down) is quantized exactly as that\n"
    "preset does at load (symmetric, groups of 128 along K, bf16 scales rounded up, codes -7..7) and stored as\n"
    "weight_packed I32 [N, K/8], weight_scale BF16 [N, K/128], weight_shape I64 [2]; embeddings, norms, routers and\n"
    "lm_head are copied as they are (the routers and lm_head named in quantization_config.ignore), and so are the\n"
    "directory's other files (tokenizer, generation config). Loaded by fp8moe with --preset int4 or fp8, the result\n"
    "gives the same logits, bit for bit, as the float checkpoint. One tensor is processed at a time.\n"
    "\n"
    "  --model IN_DIR      the float checkpoint (refused when it is already quantized)\n"
    "  --out OUT_DIR       the int4 checkpoint to write (created; refused when it exists and is not empty)\n"
    "  --scales g128|p2    g128 (default): the int4 preset's quantizer, as above. p2: every row's group scales are\n"
    "                      one bf16 row scale times powers of two (2^0 .. 2^-12), the row scale and each group's\n"
    "                      exponent searched for the least squared error (quant/int4_p2.h): the same file format,\n"
    "                      the scales a W4A8 kernel can fold into its e4m3 operand (docs/int4_p2.md)\n"
    "  --force             write into a non-empty OUT_DIR, replacing its safetensors files, index and config.json\n"
    "  --shard-size BYTES  largest output file before the checkpoint is sharded with an index (default 4Gi;\n"
    "                      suffixes K M G T, Ki Mi Gi Ti)\n"
    "  -q, --quiet         no progress on stderr\n"
    "  -h, --help          this help\n";

enum { OPT_MODEL = 2000, OPT_OUT, OPT_SCALES, OPT_FORCE, OPT_SHARD, OPT_QUIET, OPT_HELP };
static const struct option options[] = {{"model", required_argument, 0, OPT_MODEL},
                                        {"out", required_argument, 0, OPT_OUT},
                                        {"scales", required_argument, 0, OPT_SCALES},
                                        {"force", no_argument, 0, OPT_FORCE},
                                        {"shard-size", required_argument, 0, OPT_SHARD},
                                        {"quiet", no_argument, 0, OPT_QUIET},
                                        {"help", no_argument, 0, OPT_HELP},
                                        {0, 0, 0, 0}};

int cmd_requantize(int argc, char **argv) {
    const char *cmd = "requantize";
    fm_requant_opts o = {.progress = true};
    int64_t shard = 0;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":qh", options, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: o.in_dir = optarg; break;
        case OPT_OUT: o.out_dir = optarg; break;
        case OPT_SCALES:
            if (strcmp(optarg, "g128") && strcmp(optarg, "p2"))
                return cli_usage(cmd, "--scales '%s': expected g128 or p2", optarg);
            o.p2_scales = !strcmp(optarg, "p2");
            break;
        case OPT_FORCE: o.force = true; break;
        case OPT_SHARD:
            if (!cli_parse_bytes(cmd, "--shard-size", optarg, &shard)) return CLI_USAGE;
            o.shard_bytes = (uint64_t)shard;
            break;
        case 'q':
        case OPT_QUIET: o.progress = false; break;
        case 'h':
        case OPT_HELP: fputs(HELP, stdout); return CLI_OK;
        case ':': return cli_usage(cmd, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!o.in_dir || !o.out_dir) return cli_usage(cmd, "--model IN_DIR and --out OUT_DIR are required");
    fm_error err = {{0}};
    fm_requant_stats s;
    const double t0 = cli_now();
    fm_status st = fm_requantize(&o, &s, &err);
    if (st) return cli_fail(cmd, st, &err);
    if (o.progress)
        fprintf(stderr, "requantize: %lld linears as int4, %lld tensors copied, %d file(s), %.1f MiB in %.1f s -> %s\n",
                (long long)s.n_quantized, (long long)s.n_copied, s.n_files, (double)s.bytes / (1 << 20), cli_now() - t0,
                o.out_dir);
    return CLI_OK;
}
