/* Defaults that depend on the backend, the checkpoint and the card, chosen after the options are parsed and printed
 * at start, so that a user who gives no option gets the fast path on the GPU and a model that starts:
 *   - cuda: --preset fp8 (int4 weights computed as e4m3, grouped experts), and --dense w8a8 for a float checkpoint
 *     (its dense projections quantized per tensor); a pre-quantized checkpoint keeps its own weights on fp8's path.
 *     The cpu backend keeps ref, the oracle.
 *   - the prefill chunk clamps to the context (a model whose max_position_embeddings is 1024 starts as it is);
 *   - cuda, serve: --max-seqs and --ctx from the memory plan and the card's free memory (CLI_MEMORY_FRACTION of it,
 *     as vLLM's gpu_memory_utilization): the model's whole context per sequence, as many sequences as fit. */
#include <stdio.h>

#include "cli/cli.h"
#include "fp8moe.h"

static bool on_cuda(const cli_model_opts *mo) { return fm_backend_on_device(mo->opt.backend); }

void cli_pick_preset(const char *cmd, cli_model_opts *mo) {
    if (!on_cuda(mo) || mo->preset_given) return;
    fm_checkpoint_info ck;
    fm_error err;
    const bool prequant = mo->model_dir && !fm_checkpoint_probe(mo->model_dir, &ck, &err) && ck.prequantized;
    mo->opt.preset = FM_PRESET_FP8;
    if (!mo->dense_given && !prequant) mo->opt.dense = FM_DENSE_W8A8;
    fprintf(stderr, "fp8moe %s: cuda: --preset fp8%s (%s; --preset ref for the bf16 reference)\n", cmd,
            mo->opt.dense == FM_DENSE_W8A8 ? " --dense w8a8" : "",
            prequant ? "the checkpoint's own quantized weights on the fast path" : "the fast path");
}

int64_t cli_prefill_chunk(const cli_model_opts *mo, int64_t given) {
    if (given > 0) return given;
    int64_t ctx = mo->opt.ctx;
    fm_checkpoint_info ck;
    fm_error err;
    if (ctx <= 0 && mo->model_dir && !fm_checkpoint_probe(mo->model_dir, &ck, &err)) ctx = ck.max_position_embeddings;
    return ctx > 0 && ctx < FM_DEFAULT_MAX_TOKENS ? ctx : FM_DEFAULT_MAX_TOKENS;
}

void cli_fit_to_card(const char *cmd, cli_model_opts *mo, bool max_seqs_given, int64_t chunk) {
    if (!on_cuda(mo) || !mo->model_dir) return;
    const bool ctx_given = mo->opt.ctx > 0;
    if (max_seqs_given && ctx_given) return;
    fm_error err;
    fm_checkpoint_info ck;
    size_t free_bytes = 0;
    if (fm_checkpoint_probe(mo->model_dir, &ck, &err) ||
        fm_backend_free_memory(mo->opt.backend, &free_bytes, NULL, &err)) {
        fprintf(stderr, "fp8moe %s: cannot size --max-seqs and --ctx from the card (%s): the defaults stay\n", cmd,
                err.msg);
        return;
    }
    if (mo->opt.vram_limit > 0 && (size_t)mo->opt.vram_limit < free_bytes) free_bytes = (size_t)mo->opt.vram_limit;
    int32_t seqs = max_seqs_given ? mo->opt.max_seqs : 0;
    int64_t ctx = mo->opt.ctx;
    const size_t budget = (size_t)(CLI_MEMORY_FRACTION * (double)free_bytes);
    if (fm_memory_fit_generation(mo->model_dir, &mo->opt, chunk, budget, CLI_MAX_SEQS_DEFAULT_CAP, &seqs, &ctx, &err)) {
        fprintf(stderr, "fp8moe %s: cannot size --max-seqs and --ctx from the card (%s): the defaults stay\n", cmd,
                err.msg);
        return;
    }
    mo->opt.max_seqs = seqs, mo->opt.ctx = ctx;
    char b[32];
    fprintf(stderr, "fp8moe %s: cuda: --max-seqs %d --ctx %lld (fit to %.0f%% of the card's %s free)\n", cmd, seqs,
            (long long)ctx, 100 * CLI_MEMORY_FRACTION, fm_mem_format(free_bytes, b, sizeof b));
}
