/* fp8moe: the command line. Subcommands: logits, generate, chat, perplexity, inspect, parity, bench, requantize,
 * tokenize, detokenize. */
#include <errno.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "fp8moe %s: MoE inference with int4/fp8/fp4 paths, checked against an fp32 oracle\n"
            "\n"
            "usage: fp8moe <command> [options]     (fp8moe <command> --help for its options)\n"
            "\n"
            "commands:\n"
            "  parity      logits of every preset against the fp32 oracle: cosine, argmax, max error, time\n"
            "  logits      write float32 logits [T, vocab] for a file of int32 token ids\n"
            "  generate    new tokens after a prompt: text (--prompt, --chat through the chat template) streamed,\n"
            "              or int32 ids (or a batch of prompts); greedy or sampled; tokens/s, time to first token\n"
            "  chat        an interactive chat in the terminal: the answer streamed, the conversation and its KV\n"
            "              cache kept between turns (only the new text is prefilled); tokens/s per turn\n"
            "  perplexity  perplexity over windows of a token-id file\n"
            "  serve       an OpenAI-compatible HTTP server (chat and completions, streamed) with continuous batching\n"
            "  inspect     architecture, shapes, dtypes, parameter and byte counts of a checkpoint\n"
            "  bench       prefill latency of a synthetic model at real shapes, per stage against the floors;\n"
            "              bench moe: one MoE layer's experts at real shapes, every route side by side\n"
            "              bench gemm: every layer's attention projections, every route side by side\n"
            "              bench tokenize: encode MB/s of a tokenizer.json on a text file, one thread\n"
            "  tokenize    token ids of a text with the model's tokenizer.json (detokenize: ids back to text)\n"
            "  requantize  write a float checkpoint as int4 compressed-tensors pack-quantized with our int4\n"
            "              quantizer; it loads bit-identically under --preset int4 and fp8 (also: --requantize)\n"
            "\n"
            "presets: ref (fp32 oracle), int4 (w4a16), fp8 (int4 weights as e4m3, e4m3 1x128 activations),\n"
            "         fp4 (fp8 with MXFP4 expert dispatch)\n"
            "exit codes: 0 ok, 1 bad input or data, 2 usage error\n",
            FP8MOE_VERSION);
}

static int run_command(const char *cmd, int argc, char **argv) {
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "parity")) return cmd_parity(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "requantize") || !strcmp(cmd, "--requantize")) return cmd_requantize(argc - 1, argv + 1);
    fprintf(stderr, "fp8moe: unknown command '%s' (see 'fp8moe --help')\n", cmd);
    return CLI_USAGE;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("fp8moe %s\n", FP8MOE_VERSION);
        return CLI_OK;
    }
    errno = 0;
    const int rc = run_command(cmd, argc, argv);
    /* output that never reached its file (a full disk, a closed pipe, >/dev/full) is a failure, not a success */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "fp8moe %s: error: cannot write the output to stdout: %s\n", cmd,
                strerror(errno ? errno : EIO));
        return rc ? rc : CLI_BAD_INPUT;
    }
    return rc;
}
