/* The route table (routes.h) in one place: every key, the values it takes, its default and what it decides. The
 * parser (fm_routes_apply), the printer (fm_routes_print, `fp8moe inspect --routes`), the reference page
 * (fm_routes_print_markdown: docs/routes.md, `inspect --routes --markdown`, checked equal by tests/test_routes.c) and
 * the error messages all read route_keys[] below; the deciders after it resolve `auto`. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/routes.h"
#include "util/status.h"

/* A named value and the code the field holds for it (`auto` is always 0). */
typedef struct route_word {
    const char *name;
    int32_t code;
} route_word;

typedef struct route_key {
    const char *key;
    size_t field;        /* offsetof(fm_routes, ...): an int32_t */
    const char *values;  /* what it accepts, in the order shown: '|'-separated words, integers, or ranges "a..b" */
    route_word words[3]; /* the codes of the words in `values` other than auto */
    const char *def;     /* the default rule, in a few words (the printer) */
    const char *decides; /* what it decides, in one line (the printer) */
    const char *doc;     /* what it decides, in full (docs/routes.md) */
    void (*now)(const fm_routes *r, char *buf, size_t cap); /* what it resolves to on r's GPU */
} route_key;

#define SWITCH_WORDS                                                                                                   \
    {                                                                                                                  \
        {"on", FM_ROUTE_ON}, { "off", FM_ROUTE_OFF }                                                                   \
    }
#define FIELD(f) offsetof(fm_routes, f)

static const char *on_off(bool b) { return b ? "on" : "off"; }

static void now_w4a8_kernel(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s",
             fm_routes_w4a8_fold(r)    ? "fold (experts), wgmma"
             : fm_routes_w4a8_wgmma(r) ? "wgmma"
                                       : "mma.sync");
}
static void now_attention_kernel(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_attention_wgmma(r, FM_ATTENTION_WGMMA_HD) ? "wgmma for hd 128" : "mma.sync");
}
static void now_w4a8_tile(const fm_routes *r, char *b, size_t n) {
    if (r->w4a8_tile) snprintf(b, n, "%d rows", r->w4a8_tile);
    else if (fm_routes_w4a8_wgmma(r)) snprintf(b, n, "16 / 32 / 64 rows at P < 32 E / 256 E / above");
    else snprintf(b, n, "16 rows while P < 32 E, else 64");
}
static void now_w4a8_fp4(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_w4a8_fp4_producer(r, FM_W4A8_BN) ? "producer warpgroup" : "inline (MMA warps)");
}
static void now_w4a8_codes(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s",
             !fm_routes_w4a8_wgmma(r)               ? "registers (mma.sync)"
             : r->w4a8_codes == FM_ROUTE_CODES_SMEM ? "stage ring"
             : r->w4a8_codes == FM_ROUTE_CODES_REGS ? "registers"
                                                    : "ring for 16/32-row tiles or P < 64 E, else registers");
}
static void now_fold_ws(const fm_routes *r, char *b, size_t n) {
    if (!fm_routes_w4a8_fold(r)) snprintf(b, n, "off (w4a8.kernel is not fold)");
    else if (r->fold_ws == FM_ROUTE_AUTO) snprintf(b, n, "from %d rows an expert", FM_FOLD_WS_MIN_ROWS_PER_EXPERT);
    else snprintf(b, n, "%s", on_off(r->fold_ws == FM_ROUTE_ON));
}
static void now_dense_gemv(const fm_routes *r, char *b, size_t n) { snprintf(b, n, "%s", on_off(fm_routes_gemv(r))); }
static void now_w8a8_gemv_max_m(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%d", fm_routes_w8a8_gemv_max_m(r));
}
static void now_w4a8_gemv_max_m(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%d", fm_routes_w4a8_gemv_max_m(r));
}
static void now_w4a8_splits(const fm_routes *r, char *b, size_t n) {
    if (r->w4a8_splits == FM_ROUTE_W4A8_SPLITS_FILL) snprintf(b, n, "fill (8, 4 or 2 while the CTAs fit the SMs)");
    else snprintf(b, n, "%d", fm_routes_w4a8_splits(r, 1 << 30, 1, 1));
}
static void now_w8a8_quant(const fm_routes *r, char *b, size_t n) {
    const int64_t e = fm_routes_w8a8_fused_elems(r);
    if (e) snprintf(b, n, "fused up to %lld elements", (long long)e);
    else snprintf(b, n, "kernel");
}
static void now_moe_gemv(const fm_routes *r, char *b, size_t n) {
    if (r->moe_gemv < 0) snprintf(b, n, "off");
    else if (r->moe_gemv) snprintf(b, n, "P <= %d", r->moe_gemv);
    else snprintf(b, n, "P <= max(%d, top-k)", FM_MOE_GEMV_PAIRS_DEFAULT);
}
static void now_moe_down_quant(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_down_quant_fused(r) ? "fused" : "kernel");
}
static void now_moe_combine(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_combine_fused(r) ? "fused" : "kernel");
}
static void now_dense_quant(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s",
             fm_routes_dense_quant_fused(r)      ? "fused"
             : fm_routes_dense_quant_producer(r) ? "producer"
                                                 : "kernel");
}
static void now_gemv_groups(const fm_routes *r, char *b, size_t n) {
    if (fm_routes_gemv_groups(r)) snprintf(b, n, "%d groups a warp", fm_routes_gemv_groups(r));
    else snprintf(b, n, "most slices in one wave");
}
static void now_paged_swap(const fm_routes *r, char *b, size_t n) {
    const int32_t t = fm_routes_paged_swap(r);
    if (t) snprintf(b, n, "%d tile%s a warp an iteration", t, t > 1 ? "s" : "");
    else snprintf(b, n, "off");
}
static void now_paged_splits(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_paged_splits_waves(r) ? "waves" : "fill");
}
static void now_moe_dispatch(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_dispatch_fused(r) ? "fused" : "kernel");
}
static void now_router_fused(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", r->router_fused == FM_ROUTE_OFF ? "off" : r->router_fused == FM_ROUTE_ON ? "T <= 8" : "T = 1");
}
static void now_moe_act_scale(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", r->moe_act_scale == FM_ROUTE_ACT_SCALE_TOKEN ? "token (int4 experts, grouped GEMM)" : "group");
}
static void now_router_cluster(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_router_cluster(r) ? "E <= 128" : "off");
}
static void now_paged_early_kv(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_paged_early_kv(r)));
}
static void now_moe_block_norm(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_block_norm(r) ? "in the block" : "add_rmsnorm before it");
}
static void now_gdn_decode_fused(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_fused_gdn(r) ? "one kernel" : "conv, rule, gated norm");
}
static void now_gdn_decode_ba(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_gdn_decode_ba(r) ? "in gdn_decode_fused" : "a linear launch");
}
static void now_gdn_early_state(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_gdn_early_state(r)));
}
static void now_moe_block_barrier(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_block_barrier_count(r) ? "count" : "generation");
}
static void now_moe_plan_slots(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_moe_plan_slots(r)));
}
static void now_w4a8_early_codes(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_w4a8_early_codes(r)));
}
static void now_moe_persistent(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_persistent(r) ? "T = 1" : "off");
}
static void now_attn_persistent(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_attn_persistent(r) ? "T = 1" : "off");
}
static void now_pdl(const fm_routes *r, char *b, size_t n) { snprintf(b, n, "%s", on_off(fm_routes_pdl(r))); }
static void now_decode_graphs(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_decode_graphs(r)));
}
static void now_mixed_graphs(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_mixed_graphs(r) ? "attention models, one rank" : "off");
}
static void now_gdn_tc(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", r->gdn_tc != FM_ROUTE_OFF ? "dk = dv = 128, bf16" : "off");
}
static void now_paged_tiled(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_attention_paged_tiled(r)));
}
static void now_paged_combine(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_paged_combine_fused(r) ? "fused" : "kernel");
}
static void now_rope_store(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", on_off(fm_routes_rope_store(r)));
}
static void now_shared_stream(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", r->shared_stream == FM_ROUTE_OFF ? "off" : "every pass");
}
static void now_moe_shared(const fm_routes *r, char *b, size_t n) {
    snprintf(b, n, "%s", fm_routes_moe_shared_routed(r) ? "routed where the shapes agree" : "separate");
}
static void now_decode_fused(const fm_routes *r, char *b, size_t n) {
    if (r->decode_fused == FM_ROUTE_AUTO) snprintf(b, n, "the MoE tail at T <= 64, the o projection off");
    else snprintf(b, n, "%s", on_off(r->decode_fused == FM_ROUTE_ON));
}
static void now_expert_prefetch(const fm_routes *r, char *b, size_t n) {
    if (r->expert_prefetch < 1) snprintf(b, n, "off");
    else if (r->expert_prefetch == FM_EXPERT_PREFETCH_ALL) snprintf(b, n, "top-k, T <= 8");
    else snprintf(b, n, "top %d, T <= 8", r->expert_prefetch);
}

/* The measurements behind each default are cited beside its decider below and in routes.h. */
static const route_key route_keys[] = {
    {"w4a8.kernel",
     FIELD(w4a8_kernel),
     "auto|wgmma|mma|fold",
     {{"wgmma", FM_ROUTE_W4A8_WGMMA}, {"mma", FM_ROUTE_W4A8_MMA}, {"fold", FM_ROUTE_W4A8_FOLD}},
     "wgmma on sm_90, else mma",
     "the grouped W4A8 GEMM (MoE experts; W4A8 dense projections above the GEMV)",
     "the grouped W4A8 GEMM (the `fp8` preset's experts, and its dense projections above the GEMV's rows): wgmma "
     "m64n64k32 on sm_90, mma.sync m16n8k32 on sm_89. `mma` forces the Ada kernel on a Hopper GPU. `fold` (sm_90, "
     "experts of int4-p2 checkpoints only, docs/int4_p2.md; a load of other int4 scales is refused): the experts' "
     "codes load in the fold layout and run the fold GEMM, the group scale inside the e4m3 operand and one activation "
     "scale per token into the gate|up GEMM (the cpu backend takes the same route to emulate it); the dense "
     "projections stay on wgmma",
     now_w4a8_kernel},
    {"attention.kernel",
     FIELD(attention_kernel),
     "auto|wgmma|mma",
     {{"wgmma", FM_ROUTE_ATTENTION_WGMMA}, {"mma", FM_ROUTE_ATTENTION_MMA}},
     "wgmma on sm_90 (hd 128)",
     "prefill attention: wgmma + TMA (hd 128), else mma.sync flash attention",
     "prefill attention in bf16: the wgmma + TMA kernel (FlashAttention-3's recipe) on sm_90 for head dim 128, the "
     "mma.sync flash-attention kernel elsewhere and for every other head dim. `mma` forces the Ada kernel on a Hopper "
     "GPU",
     now_attention_kernel},
    {"w4a8.tile",
     FIELD(w4a8_tile),
     "auto|16|32|64",
     {{NULL, 0}},
     "16, 32 (wgmma), 64 by P / E",
     "routed rows per tile of the W4A8 MoE GEMM, P pairs over E experts (sizes the workspace)",
     "routed rows per tile of the grouped expert GEMM (the memory plan sizes its workspace by it): 16 while the "
     "experts average fewer than 32 rows (decode, short prompts); on sm_90 32 (two CTAs per SM) while they average "
     "fewer than 256, 64 above (64 from 32 rows for a pre-quantized checkpoint's banks and for experts larger than "
     "16 MB, as Mixtral's, and from 64 rows with an FP4 dispatch, unless forced); on sm_89 64 from 32 rows",
     now_w4a8_tile},
    {"w4a8.fp4",
     FIELD(w4a8_fp4),
     "auto|producer|inline",
     {{"producer", FM_ROUTE_FP4_PRODUCER}, {"inline", FM_ROUTE_FP4_INLINE}},
     "producer (wgmma)",
     "where the FP4 dispatch's gate|up GEMM expands E2M1 to e4m3: its own warpgroup or the MMA warps",
     "where the wgmma gate|up GEMM of an FP4 dispatch (`--dispatch mxfp4|nvfp4`) expands E2M1 to e4m3: a producer "
     "warpgroup of its own, a stage ahead of the MMA warpgroups, or the MMA warps themselves between the stage's "
     "barrier and the MMAs; the mma.sync kernel always expands inline",
     now_w4a8_fp4},
    {"w4a8.codes",
     FIELD(w4a8_codes),
     "auto|regs|smem",
     {{"regs", FM_ROUTE_CODES_REGS}, {"smem", FM_ROUTE_CODES_SMEM}},
     "smem while P < 64 E",
     "how the wgmma W4A8 GEMM's int4 codes reach its warps: registers a group ahead, or the shared-memory ring",
     "how the wgmma GEMM's int4 weights reach its warps: into registers one 128-group ahead, or through the "
     "shared-memory ring with the activations, three groups ahead; `auto` takes the ring for 16- and 32-row tiles and "
     "while the experts average fewer than 64 rows (each tile then streams its own expert's weights), registers "
     "otherwise",
     now_w4a8_codes},
    {"dense.gemv", FIELD(dense_gemv), "auto|on|off", SWITCH_WORDS, "on",
     "the mma.sync FP8 GEMVs of the dense projections at M <= w4a8.gemv_max_m (W4A8) / w8a8.gemv_max_m (W8A8)",
     "our FP8 decode GEMVs for the dense projections at small M (up to `w4a8.gemv_max_m` rows for W4A8, "
     "`w8a8.gemv_max_m` for W8A8); `off` sends every M to the GEMM",
     now_dense_gemv},
    {"w8a8.gemv_max_m",
     FIELD(w8a8_gemv_max_m),
     "auto|1..16",
     {{NULL, 0}},
     "8",
     "the W8A8 GEMV up to this many rows, cuBLASLt FP8 above",
     "the largest M the W8A8 GEMV takes (`auto`: 8); above it, cuBLASLt FP8",
     now_w8a8_gemv_max_m},
    {"moe.gemv",
     FIELD(moe_gemv),
     "auto|off|1..64",
     {{"off", -1}},
     "8, or top-k",
     "the experts as grouped W4A8 GEMVs up to this many routed pairs (16-row tiles), the grouped GEMM above",
     "the experts of a step with at most this many routed pairs (tokens x top-k) as grouped W4A8 GEMVs (16-row "
     "tiles), above it the grouped GEMM; `auto` is 8 (a one-token decode step of Qwen3-MoE), or one token's top-k "
     "when it is larger (Qwen3-Next's 10)",
     now_moe_gemv},
    {"router.fused", FIELD(router_fused), "auto|on|off", SWITCH_WORDS, "T = 1",
     "the router GEMV and top-k in one launch (on: T <= 8), else cuBLAS GEMM + route kernel",
     "the router's matrix-vector product and top-k in one kernel: `auto` for one token, `on` up to 8 tokens, `off` a "
     "cuBLAS GEMM then the routing kernel",
     now_router_fused},
    {"router.cluster", FIELD(router_cluster), "auto|on|off", SWITCH_WORDS, "off",
     "the fused router as one thread-block cluster (E <= 128, sm_90)",
     "the fused router (`router.fused`) over at most 128 experts as one thread-block cluster of up to 8 CTAs: each "
     "warp's logits go into the first CTA's shared memory (distributed shared memory) and one cluster barrier hands "
     "them over, where the default kernel's CTAs fence their logits, count themselves on an atomic counter and the "
     "last one reads every logit back through L2. The same logits, experts and weights bit for bit. `auto` is `off`: "
     "on an H100 both kernels take 11-12.5 us a layer under ncu and fp8 decode at B = 1 is level (docs/RESULTS.md "
     "2.19: the routing's own chain, not the hand-over, is the cost); `on` needs sm_90; `moe.dispatch=fused` keeps "
     "the default kernel",
     now_router_cluster},
    {"moe.persistent", FIELD(moe_persistent), "auto|on|off", SWITCH_WORDS, "sm_90+",
     "a decode step's MoE block for one token as one persistent launch (router, experts, combine, norm)",
     "at B = 1 the MoE block runs as six launches (the fused router, the small dispatch, the gate|up GEMV, the "
     "quantizer of h, the down GEMV, the combine + residual add + RMSNorm), each paying a launch, a ramp and a drain "
     "for kilobytes to a few megabytes of work; `on` runs them as one grid of resident CTAs whose phases meet at "
     "grid barriers, with the same arithmetic in the same order (the same logits, experts, weights and outputs bit "
     "for bit). For a bf16 router (with Qwen3-Next's shared expert, where `moe.shared=routed` puts it in the bank, "
     "as the last pair), int4 experts of ours in device memory with the e4m3 dispatch, the fused MoE tail "
     "(`decode.fused`), hidden and intermediate sizes up to 4096; elsewhere the launches "
     "run. `auto` is `on` from sm_90 (an H100: 678 -> 443 kernels a step and fp8 decode at B = 1 -6 to -7 %, "
     "docs/RESULTS.md 2.22), `off` below (not measured there); the grid must be resident at once, so a GPU shared "
     "with other processes' kernels (MPS) should run `off`; the cpu backend has one reference (the router, then the "
     "experts)",
     now_moe_persistent},
    {"attn.persistent", FIELD(attn_persistent), "auto|on|off", SWITCH_WORDS, "off",
     "a decode step's attention block for one token as one persistent launch (QKV, RoPE, attention, o, norm)",
     "at B = 1 the attention block runs as eight launches (the quantizer, the QKV GEMV, q/k norm + RoPE + the cache "
     "store, paged attention's split and combine kernels, the quantizer, the o GEMV, the residual add + RMSNorm); "
     "`on` runs them as one grid of resident CTAs whose phases meet at grid barriers, with the same arithmetic in the "
     "same order (the same cache rows and outputs bit for bit as the chain with the split attention kernel, "
     "`paged.swap=off`; the swapped kernel may differ in the last bits). For int4 projections of ours on the decode "
     "GEMVs, "
     "head dim 128, a bf16 KV cache, no output gate (Qwen3-Next) and no tensor parallelism; elsewhere the launches "
     "run. `auto` is `off`: on an H100 `on` made fp8 decode at B = 1 16 % slower (docs/RESULTS.md 2.23: the phases "
     "and five barriers take ~35 us a layer against the chain's ~33, and the MoE block after it loses its early start "
     "under PDL); the grid must be resident at once, so a GPU shared with other processes' kernels (MPS) should run "
     "`off`; the cpu backend runs the ops",
     now_attn_persistent},
    {"moe.act_scale",
     FIELD(moe_act_scale),
     "auto|group|token",
     {{"group", FM_ROUTE_ACT_SCALE_GROUP}, {"token", FM_ROUTE_ACT_SCALE_TOKEN}},
     "group",
     "the grouped GEMM's gate|up input: one e4m3 scale per 128-group (group) or per token (token)",
     "how the experts' gate|up input is quantized to e4m3 on the grouped GEMM (steps above `moe.gemv`'s pairs): "
     "`group`, one scale per (token, 128-group), the accumulator promoted with the weight scale times the "
     "activation scale after every group; `token`, one scale per token, the promotion with the weight scale only "
     "(one FFMA an element where it took two) and the token's scale applied once before the SwiGLU. For int4 "
     "expert banks of ours with the e4m3 dispatch (other banks and the decode GEMVs keep `group`); the cpu backend "
     "quantizes the same rows the same way. Both W4A8 kernels (wgmma, mma.sync) take it; `auto` is `group` until "
     "measured (bench/NOTES.md, thirtieth session)",
     now_moe_act_scale},
    {"pdl", FIELD(pdl), "auto|on|off", SWITCH_WORDS, "on for sm_90+",
     "programmatic dependent launch of every kernel of a decode step (cuBLAS / cuBLASLt ones excepted)",
     "programmatic dependent launch of every kernel of a decode step (cuBLAS / cuBLASLt ones excepted: bench/NOTES.md "
     "lists them), on by default from sm_90; `on` needs sm_90",
     now_pdl},
    {"decode.graphs", FIELD(decode_graphs), "auto|on|off", SWITCH_WORDS, "on",
     "decode steps captured once per batch bucket as CUDA graphs and replayed",
     "each decode step captured once per batch bucket (1, 2, 4, ... 128 sequences) as a CUDA graph and replayed; "
     "`off` launches every kernel of every step",
     now_decode_graphs},
    {"mixed.graphs", FIELD(mixed_graphs), "auto|on|off", SWITCH_WORDS, "on",
     "mixed steps' passes captured once per row bucket as CUDA graphs and replayed",
     "the pass of a step over the paged cache that holds prompt chunks (a mixed step beside running streams, "
     "engine/step_graphs.c) padded to its row bucket with copies of its first row (multiples of 16 rows to 128, of 32 "
     "to 256, of 64 to 1024, "
     "of 128 to 4096), captured once per bucket as a CUDA graph and replayed; the final norm, the lm_head of the "
     "sampled rows and the sampler run outside it. Models whose layers are all attention layers (not Qwen3-Next's "
     "Gated DeltaNet, whose prompt chunks are found on the host), one rank, experts on the device; `auto` = `on` "
     "where the backend has graphs; `on` pads the rows on any backend (the cpu's tests: the padding changes no "
     "bit); `off` launches every kernel of such a step; `decode.graphs=off` turns it off too",
     now_mixed_graphs},
    {"gdn.tc", FIELD(gdn_tc), "auto|on|off", SWITCH_WORDS, "on",
     "the Gated DeltaNet's chunked prefill on tensor cores (dk = dv = 128, bf16), else token by token",
     "a prompt's Gated DeltaNet (Qwen3-Next) in the chunked form on tensor cores where it takes the shape (heads of "
     "128, bf16 activations); `off` runs the delta rule token by token",
     now_gdn_tc},
    {"rope.store", FIELD(rope_store), "auto|on|off", SWITCH_WORDS, "on",
     "a decode step's k and v stored in the paged cache by the q/k norm + RoPE kernel, else a kv_store launch",
     "a decode step's keys and values written to the KV cache by the q/k norm + RoPE kernel itself (`auto` = `on`); "
     "`off` stores them with a launch of their own",
     now_rope_store},
    {"shared.stream", FIELD(shared_stream), "auto|on|off", SWITCH_WORDS, "on",
     "the shared expert (Qwen3-Next) on a second stream beside the router and the routed experts",
     "Qwen3-Next's shared expert on a second CUDA stream beside the router and the routed experts (`auto` = `on`); "
     "`off` runs it after them on the one stream",
     now_shared_stream},
    {"expert.prefetch",
     FIELD(expert_prefetch),
     "auto|on|off|1..64",
     {{"on", FM_EXPERT_PREFETCH_ALL}, {"off", -1}},
     "off",
     "experts in host memory: each layer's experts predicted at its start and copied beside its token mixer",
     "with experts in host memory: each MoE layer's experts predicted at the layer's start (its router applied to "
     "the residual stream before attention) and copied on the second stream while attention runs, in steps of up to "
     "8 tokens: `on` each token's whole top-k prediction, `N` its top N (fewer wasted copies); `auto` is `off` (on "
     "synthetic weights the whole top-k copied more than it saved)",
     now_expert_prefetch},
    {"decode.fused", FIELD(decode_fused), "auto|on|off", SWITCH_WORDS, "the MoE tail at T <= 64",
     "the residual add + RMSNorm in the MoE combine's kernel and in the o projection's GEMV (W8A8, W4A8); a decode "
     "step's "
     "Gated DeltaNet in one kernel",
     "the fused ops of a forward pass: the MoE block's weighted combine of the routed experts' rows, the residual add "
     "and the next block's RMSNorm in one kernel (`moe_add_rmsnorm`), and the o projection's decode GEMV (W8A8, or the "
     "`fp8` preset's W4A8) adding and normalising its rows in its last CTA (`linear_add_rmsnorm`): a launch fewer per "
     "layer each; in a decode "
     "step, "
     "a Gated DeltaNet layer's conv update, delta rule and gated RMSNorm in one kernel (`gdn_decode_fused`, "
     "Qwen3-Next: "
     "2 launches fewer per layer at one sequence, 3 at more); `auto` fuses the MoE tail in passes of at most 64 rows "
     "(H200: fp8 decode +0.3 to +3.8 %) and leaves the o projection apart (with it fp8 + w8a8 lost 3.3 % at B = 8); "
     "the Gated DeltaNet's kernel is `gdn.decode_fused`'s to choose (its first form, a block per key head, lost 2-3 % "
     "on the H200; the second, on the rule kernel's grid of a block per 32 state columns, won on an H100 and is its "
     "default from sm_90); on the cpu backend the fused ops are their "
     "references, the same "
     "numbers",
     now_decode_fused},
    {"paged.tiled", FIELD(paged_tiled), "auto|on|off", SWITCH_WORDS, "on for sm_90+",
     "the rows of prompt chunks in paged attention on the tiled kernel (K and V read once per 64 query rows)",
     "paged attention (a mixed step, a prompt chunk after cached blocks, chunked prefill) gives every row whose "
     "neighbour in the step is of the same sequence, i.e. a prompt chunk's rows, to a kernel whose CTA takes 64 query "
     "rows (several tokens x one kv head's query heads) and reads each K and V tile once for all of them; the decode "
     "rows keep the kernel split along the context, in the same call. `auto` is `on` from sm_90 (H100, two device "
     "sessions: a 512-token chunk after 3,584 cached tokens 52.0 -> 25.3 ms for Qwen3-30B-A3B, 39.8 -> 32.1 ms for "
     "Qwen3-Next), `off` below (not measured on Ada); `on` takes it for every step that holds a prompt chunk (two "
     "neighbouring rows of one sequence at consecutive "
     "positions; decode steps and their graphs are unchanged); bf16 head dims that are multiples of 16 only (fp32 "
     "and the others keep the plain kernel); on the cpu backend both are its one reference",
     now_paged_tiled},
    {"moe.shared",
     FIELD(moe_shared),
     "auto|routed|separate",
     {{"routed", FM_ROUTE_SHARED_ROUTED}, {"separate", FM_ROUTE_SHARED_SEPARATE}},
     "routed from sm_90",
     "the shared expert (Qwen3-Next) as one more expert in the routed experts' launches, or its own",
     "Qwen3-Next's shared expert as one more expert of each MoE layer's bank (index E, routed to by every token with "
     "the weight sigmoid(shared_expert_gate x): the gate's row appended to the router's, top-k + 1 pairs), so the "
     "routed experts' launches (router, grouped GEMV or GEMM, combine) compute it: per layer the shared expert's "
     "gate|up, SwiGLU, down and gate launches go. Only where its width equals the experts' and the plan quantizes "
     "the dense projections as the experts (not `--dense w8a8`, not an FP4 dispatch), from float weights, on one rank "
     "(elsewhere it stays separate even when `routed` is asked for: `--verbose` says which form each load takes and "
     "why). At one token the persistent MoE block (`moe.persistent`) then takes the whole layer's MoE, the shared "
     "expert included, in one launch. `auto` is `routed` from sm_90 (an H200: Qwen3-Next fp8 decode at B = 1 -9.3 %, "
     "1,073 -> 491 kernels a step, B = 64 level; docs/RESULTS.md 2.42), `separate` below and on the cpu backend "
     "(its reference form; sm_89 not measured)",
     now_moe_shared},
    {"paged.combine",
     FIELD(paged_combine),
     "auto|kernel|fused",
     {{"kernel", FM_ROUTE_COMBINE_KERNEL}, {"fused", FM_ROUTE_COMBINE_FUSED}},
     "kernel",
     "paged attention's splits merged by a second kernel, or by the split kernel's last CTA",
     "paged attention (decode) splits each token's context across CTAs and merges their partial results: `kernel` "
     "launches a second kernel for the merge, `fused` lets the last CTA of each (token, kv head, group of query "
     "heads) to finish merge them, counted on a device counter in the op's scratch: one launch fewer per attention "
     "layer of a step whose attention splits (decode steps below 512 rows), the same bits (the same arithmetic in the "
     "same order). `auto` is `kernel` until `fused` is measured on a GPU; bf16 head dims that are multiples of 16 "
     "(the split kernel's); the cpu backend has one reference",
     now_paged_combine},
    {"moe.down_quant",
     FIELD(moe_down_quant),
     "auto|kernel|fused",
     {{"kernel", FM_ROUTE_DOWN_QUANT_KERNEL}, {"fused", FM_ROUTE_DOWN_QUANT_FUSED}},
     "kernel",
     "the grouped GEMVs' h quantized for the down GEMV by a launch of its own, or by the down GEMV's CTAs",
     "the experts on the grouped W4A8 GEMVs (`moe.gemv`): the gate|up GEMV writes h (SwiGLU, bf16), which the down "
     "GEMV reads as e4m3 in 128-column groups; `kernel` quantizes it with a launch of its own, `fused` lets each CTA "
     "of the down GEMV quantize its tile's rows into shared memory as it stages them (the same codes, scales and "
     "group sums): one launch fewer per MoE layer, the same bits. `auto` is `kernel`: on an H200 `fused` (with "
     "`dense.quant=fused`) cost fp8 decode another +2.5 % a step at B = 1 (docs/RESULTS.md 2.18); the grouped GEMMs "
     "quantize h in their epilogue either way; the cpu backend has one reference",
     now_moe_down_quant},
    {"moe.combine",
     FIELD(moe_combine),
     "auto|kernel|fused",
     {{"kernel", FM_ROUTE_COMBINE_KERNEL}, {"fused", FM_ROUTE_COMBINE_FUSED}},
     "kernel",
     "the grouped GEMVs' MoE tail (combine + add + RMSNorm) by a kernel after the down GEMV, or by its last CTAs",
     "the experts on the grouped W4A8 GEMVs (`moe.gemv`) ending in the fused MoE tail (`decode.fused`: the weighted "
     "combine of the routed rows, the residual add and the next RMSNorm): `kernel` runs that tail as a kernel after "
     "the down GEMV, `fused` lets the down GEMV's last CTA of each token (counted on a device counter per token) "
     "run it: one launch fewer per MoE layer, the same bits. `auto` is `kernel` until `fused` is measured on a GPU; "
     "rows of a multiple of 8 up to 4096 (else the kernel); the grouped GEMMs and the unfused moe keep the kernel; "
     "the cpu backend has one reference",
     now_moe_combine},
    {"moe.dispatch",
     FIELD(moe_dispatch),
     "auto|kernel|fused",
     {{"kernel", FM_ROUTE_COMBINE_KERNEL}, {"fused", FM_ROUTE_COMBINE_FUSED}},
     "kernel",
     "the decode dispatch of the routed rows by a launch of its own, or by the fused router's last CTA",
     "the experts on the grouped W4A8 GEMVs (`moe.gemv`) after the fused router (`router.fused`): `kernel` launches "
     "the small dispatch (each expert's rows counted, the tile plan, each pair's slot, the rows of x quantized to "
     "e4m3) "
     "after the router, `fused` lets the router's last CTA, the one that routes every token, run it too: one launch "
     "fewer per MoE layer, the same bits. `auto` is `kernel` until `fused` is measured on a GPU; e4m3 1x128 rows "
     "only (the FP4 and the fold banks' per-token dispatch keep the kernel), no expert parallelism, no experts in "
     "host memory; the cpu backend has one reference (the router, then the experts)",
     now_moe_dispatch},
    {"paged.splits",
     FIELD(paged_splits),
     "auto|fill|waves",
     {{"fill", FM_ROUTE_SPLITS_FILL}, {"waves", FM_ROUTE_SPLITS_WAVES}},
     "waves",
     "paged attention's context splits: enough for 2 CTAs per multiprocessor, or enough to fill the last wave",
     "paged attention (decode) splits each token's context across CTAs: `fill` takes enough splits for 2 CTAs per "
     "multiprocessor, `waves` the fewest whose CTAs fill at least 90 % of the waves of resident CTAs they need (the "
     "split kernel's occupancy times the multiprocessors; Qwen3-30B-A3B at 64 rows on an H200: 3 splits, 768 CTAs in "
     "two waves of 396, where `fill` takes 2, 512 CTAs whose second wave is 29 % full). The same math, the partial "
     "sums split elsewhere (fp32; the bf16 outputs may differ in the last bit). `auto` is `waves` (H100, decode at "
     "context 2048: -3.2 % a step at 64 sequences, level at 1 and 8; docs/RESULTS.md 2.16); the cpu backend has one "
     "reference",
     now_paged_splits},
    {"paged.swap",
     FIELD(paged_swap),
     "auto|on|off|x2",
     {{"on", FM_ROUTE_ON}, {"off", FM_ROUTE_OFF}, {"x2", FM_ROUTE_SWAP_X2}},
     "on for sm_90+",
     "decode attention with the keys as the mma's M and the query heads as its N (kv heads of <= 8 query heads)",
     "paged attention's split kernel puts a kv head's query heads in the 16 rows of each tensor-core product: with 8 "
     "of them (Qwen3-30B-A3B, Qwen3-Next) half of every product is zero rows. `on` runs the decode rows on a kernel "
     "that swaps the operands (S^T = K Q^T, O^T += V^T P^T: keys and head dims as M, the query heads as N): half the "
     "products, half the accumulator registers, and with an e4m3 cache the keys' codes go from shared memory to the "
     "product's registers with no conversion tile. The same scratch, splits rule, combine and merge; the numbers "
     "differ from the split kernel's by the order of fp32 sums only. Head dims 64, 128 and 256 with at most 8 query "
     "heads a kv head (elsewhere the split kernel runs). `x2`: each warp takes two 16-key tiles an iteration (four "
     "chains of products, one softmax round per 32 keys, four stages a warp, 2 CTAs an SM), for the e4m3 cache to "
     "head dim 128 (the other forms take one). `auto` is `on` from sm_90 (an H100, fp8 decode at context 2048 "
     "against the split kernel, both loading their first tiles early: bf16 cache B = 1 -2.1 to -3.1 %, B = 8 -2.1 "
     "to -2.7 %, B = 64 -1.4 %; e4m3 cache B = 8 level, B = 64 -4.0 %; docs/RESULTS.md 2.40), `off` below (not "
     "measured there); the cpu backend has one reference",
     now_paged_swap},
    {"dense.quant",
     FIELD(dense_quant),
     "auto|kernel|fused|producer",
     {{"kernel", FM_ROUTE_DOWN_QUANT_KERNEL},
      {"fused", FM_ROUTE_DOWN_QUANT_FUSED},
      {"producer", FM_ROUTE_QUANT_PRODUCER}},
     "producer",
     "the dense W4A8 projections' bf16 input quantized by a launch of its own, by the decode GEMV's CTAs, or by the "
     "kernel that writes it",
     "the `fp8` preset's dense projections (int4 weights, W4A8) read their input as e4m3 in 128-column groups with one "
     "scale a group. `kernel` quantizes the bf16 input rows with a launch of its own before the projection; `fused` "
     "lets each CTA of the decode GEMV (up to 16 rows, `dense.gemv`) quantize the rows itself as it stages them (every "
     "CTA repeats that work, 4-8 KB a row from L2): one launch fewer per projection; `producer` lets the kernel that "
     "writes the input quantize it as it writes it: the o projection's, by the kernel that merges paged attention's "
     "splits (a head of 128 is one group; where the attention does not split, heads are not 128 wide or a step holds "
     "prompt chunks, the launch runs as before), and the next layer's q|k|v projection's (a Gated DeltaNet layer's "
     "qkvz), by the persistent MoE block's tail at one token (`moe.persistent`; elsewhere a quantizer launch after the "
     "MoE block): two launches fewer per layer of a one-token decode step, one at other sizes; a Gated DeltaNet's out "
     "projection's, by the gated norm's kernel (each value head of 128 one group; other widths take the quantizer's "
     "launch after it). "
     "Each gives the same codes and scales, the same bits. `auto` is `producer`: on an H100 it took fp8 decode -2.3 "
     "% a step at B = 1, -0.9 % at B = 8 and -0.4 % at B = 64 against `kernel` (docs/RESULTS.md 2.37), where `fused` "
     "had cost +4.7 % at B = 1 and +33 % at B = 8 on an H200 (2.18: the staging is repeated by every CTA after its "
     "wait). `--dense w8a8` keeps its quantizers; the cpu backend has one reference (`producer`: the chain of ops)",
     now_dense_quant},
    {"gemv.groups",
     FIELD(gemv_groups),
     "auto|1|2|4|8",
     {{NULL, 0}},
     "most K slices in one wave",
     "128-column K groups a warp of the W4A8 decode GEMVs takes (splits a row block's K among a CTA's warps)",
     "how the W4A8 decode GEMVs (the fp8 preset's dense projections and the experts' grouped GEMVs) share a 16-row "
     "block's K among the 8 warps of its CTA. A value: each warp takes about that many 128-column groups. `auto`: "
     "the most warps a row block (up to 8, at least one group each) whose grid still fits one wave of two CTAs an SM. "
     "At B = 1 these GEMVs are bound by each warp's chain of dependent instructions at ~2 warps a scheduler, not by "
     "HBM: more warps a row block shorten the chain until a second wave repeats it (on an H100 under ncu, Qwen3-"
     "30B-A3B's expert gate|up GEMV 13.6 us at 4 groups a warp and 432 CTAs, 11.5 us at 8 and 216; docs/RESULTS.md "
     "2.19). The W8A8 GEMV keeps its own split",
     now_gemv_groups},
    {"w4a8.fold_ws", FIELD(fold_ws), "auto|on|off", SWITCH_WORDS, "from 16 rows an expert",
     "under w4a8.kernel=fold: the warp-specialised prefill GEMMs (256-row tiles, h per token)",
     "under `w4a8.kernel=fold`, the experts' GEMMs above the decode GEMVs' pairs: the warp-specialised kernel "
     "(converter warpgroups feeding ss-wgmma, tiles of 256 routed rows x 128 weight rows, all of K in one "
     "accumulation; h in bf16, then e4m3 with one scale per token into the down GEMM) or the fold GEMM (64-row tiles, "
     "promotion every 4 groups, h per 128 channels). `auto` takes the warp-specialised kernel from 16 rows an "
     "expert on average (P >= 16 E), where it overtakes the fold GEMM on an H200 (docs/RESULTS.md 2.32: Qwen3-30B-A3B "
     "between T = 128 and 256); the cpu backend quantizes h the same way at the same shapes",
     now_fold_ws},
    {"w4a8.gemv_max_m",
     FIELD(w4a8_gemv_max_m),
     "auto|1..64",
     {{NULL, 0}},
     "16 under the split GEMM, else 64",
     "the dense W4A8 GEMV up to this many rows (16-row chunks as grid rows past 16), the W4A8 GEMM above",
     "the largest M the dense W4A8 GEMV takes (`auto`: 16 where the split GEMM of `w4a8.splits` takes the rows "
     "above, on the wgmma kernel; 64 elsewhere); past 16 rows it runs one chunk of 16 rows a grid row of "
     "the same launch, every chunk's CTAs streaming the same weights (from DRAM once, then from L2). Above it the "
     "grouped W4A8 GEMM, whose 256-row x 64-row tiles give a decode batch's projections one CTA a 256 weight rows "
     "(Qwen3-30B-A3B's o projection: 8 CTAs at M = 64). Measured on an H100 (docs/RESULTS.md 2.34, fp8 preset, the "
     "decode step under its graph): B = 32 -6.6 %, B = 64 -2.0 % against 16 (the o projection gains, q|k|v at 64 "
     "rows loses a little); the split GEMM beats the chunks (RESULTS 2.35: B = 64 -3.7 %, B = 32 -0.8 %)",
     now_w4a8_gemv_max_m},
    {"w8a8.quant",
     FIELD(w8a8_quant),
     "auto|kernel|fused",
     {{"kernel", FM_ROUTE_COMBINE_KERNEL}, {"fused", FM_ROUTE_COMBINE_FUSED}},
     "fused up to 65536 elements",
     "the W8A8 projections' activation quantizer: one launch (blocks meeting at a grid barrier) or a memset, an amax "
     "and a cast launch",
     "the W8A8 dense projections quantize their bf16 input per tensor on the device: `fused` is one launch whose "
     "blocks (8192 elements each) meet at a grid barrier, up to 524,288 elements of x (its rows padded to 16 bytes: "
     "Qwen3-30B-A3B's q|k|v and o projections up to 128 rows); `kernel` is a memset of the amax word (a graph node "
     "that ends the chain of programmatic dependent launches), an amax grid and a cast grid; `auto` takes the fused "
     "launch up to 65,536 elements (8 blocks), the rest on the three",
     now_w8a8_quant},
    {"w4a8.splits",
     FIELD(w4a8_splits),
     "auto|fill|1|2|4|8",
     {{"fill", FM_ROUTE_W4A8_SPLITS_FILL}},
     "fill",
     "K splits of the dense W4A8 GEMM above the GEMV's rows, over a thread-block cluster (wgmma kernel)",
     "the dense W4A8 GEMM (the fp8 preset's projections above `w4a8.gemv_max_m` rows; 256-row x 64-row tiles, one "
     "CTA a tile) with its K split over the CTAs of a thread-block cluster: each takes a range of the 128-groups, and "
     "the partial sums meet in distributed shared memory, each CTA summing a share of the tile over the cluster in "
     "rank "
     "order (the same bits at every run) and storing it. A value: that many splits (at most the K groups); `fill`: the "
     "largest of 8, 4, 2 whose CTAs fit the SMs with two groups a split at least (Qwen3-30B-A3B at M = 64: q|k|v 4, o "
     "8). `auto` is `fill`: on an H100 the fp8 decode step with the split GEMM from 17 rows against the GEMV chunks "
     "(docs/RESULTS.md 2.35) B = 64 -3.7 %, B = 32 -0.8 %; q|k|v 1.22 -> 0.89 ms and o 0.96 -> 0.74 ms a step at B = "
     "64. The wgmma kernel only (sm_90): the mma.sync kernel runs all of K",
     now_w4a8_splits},
    {"w4a8.early_codes", FIELD(w4a8_early_codes), "auto|on|off", SWITCH_WORDS, "on",
     "the W4A8 GEMM's first weight codes issued before its PDL wait where its tile is known",
     "the wgmma W4A8 GEMM under PDL (`pdl`) waits for the kernel before it at its top, because its tiles and "
     "activations are earlier kernels' outputs. Where a CTA's tile is known before that (dense tiling, whose tile is "
     "its index: the fp8 preset's projections above `w4a8.gemv_max_m` rows; the experts' grouped down GEMM, whose "
     "tiles the dispatch wrote two launches before it), `on` lets it issue its first weight codes before the wait "
     "(three 128-groups into the shared-memory ring, or the first group into registers), so that they load while the "
     "kernel before it finishes: the down GEMM's CTAs take the SMs the gate|up GEMM's last wave leaves idle. The same "
     "bits either way. `auto` is `on`: on an H100 fp8 decode B = 8 -1.8 %, B = 64 -1.2 %, one MoE layer's experts at "
     "8 tokens 0.072 -> 0.068 ms (docs/RESULTS.md 2.39)",
     now_w4a8_early_codes},
    {"paged.early_kv", FIELD(paged_early_kv), "auto|on|off", SWITCH_WORDS, "on",
     "paged attention's decode kernels loading their first tiles of past keys before their PDL wait",
     "paged attention's decode kernels (the split kernel and `paged.swap`'s) under PDL (`pdl`) wait at their top for "
     "the kernel before them, "
     "which stores the step's own key and value. The keys before a row's position were stored by earlier steps, and "
     "its slots come from the block table, sequences and positions the host staged before the step: `on` lets each "
     "CTA of a row that is its sequence's only row of the step issue the loads of its first tiles of those keys "
     "(each warp's first stages, where every key of a tile is before the position) before the wait, so that "
     "they load while the kernel before it finishes. The same bits either way. `auto` is `on`: on an H100 fp8 "
     "decode B = 1 -1.3 %, B = 8 -1.0 %, B = 64 -0.9 % (docs/RESULTS.md 2.39)",
     now_paged_early_kv},
    {"moe.plan_slots", FIELD(moe_plan_slots), "auto|on|off", SWITCH_WORDS, "on",
     "the grouped experts' dispatch: the plan kernel's block gives every routed row its slot too",
     "the experts on the grouped GEMMs (steps above `moe.gemv`'s pairs) are fed by a dispatch of three launches: the "
     "plan (one block: each expert's rows counted, its segment and tiles), the slots (one thread a routed row: its "
     "place in its expert's segment) and the gather (the rows of x quantized into their slots). `on` lets the plan's "
     "block assign the slots as well, from the ids it has just counted, up to 4096 routed rows (above, the slot kernel "
     "runs): one launch fewer per MoE layer. A row's place inside its expert's segment follows the atomics either way "
     "and no result depends on it. `auto` is `on`: on an H100 one MoE layer's experts at 8-64 tokens 0.001-0.002 ms "
     "less (`bench moe`), fp8 decode B = 8 -1.1 % and B = 64 -0.1 %, at the runs' spread (docs/RESULTS.md 2.41); the "
     "cpu backend has one reference",
     now_moe_plan_slots},
    {"moe.block_barrier",
     FIELD(moe_block_barrier),
     "auto|generation|count",
     {{"generation", FM_ROUTE_BARRIER_GENERATION}, {"count", FM_ROUTE_BARRIER_COUNT}},
     "count",
     "the persistent MoE block's grid barrier: a generation word, or a monotonic count per grid size",
     "the persistent MoE block (`moe.persistent`) meets at three grid barriers a layer. `generation`: each CTA adds "
     "one to a count; the last to arrive, once its add has returned, clears the count and advances a generation word "
     "the others poll. `count`: a 64-bit count that only grows, one word per grid size; the CTA whose add completes "
     "a whole grid goes on at once, the others poll until the count reaches that multiple, so they leave an L2 round "
     "trip earlier. The same results either way. `auto` is `count`: on an H200 fp8 decode at B = 1 -2.2 % (three "
     "rounds in ABBA order; B = 8 and 64 do not run the block), docs/RESULTS.md 2.42",
     now_moe_block_barrier},
    {"moe.block_norm", FIELD(moe_block_norm), "auto|on|off", SWITCH_WORDS, "off",
     "the residual add and RMSNorm before a one-token MoE block inside the persistent block",
     "at B = 1 the attention's output reaches the persistent MoE block (`moe.persistent`) through an add_rmsnorm "
     "launch (the residual add and the post-attention norm). `on`: every CTA of the block adds and normalises the row "
     "itself from the residual and the attention's output (the add_rmsnorm kernel's arithmetic, the same bits), CTA "
     "0 writing the normed row and, once every CTA has read the residual, its sum: one launch and one dependent "
     "round trip fewer a layer. Where the block does not run, add_rmsnorm runs before the MoE as before. `auto` is "
     "`off`: on an H100 it cost fp8 decode B = 1 +3.9 % (Qwen3-30B-A3B) and +2.8 % (Qwen3-Next), the add and the norm "
     "in every CTA before the router lengthening the block's first phase more than the launch it saves "
     "(docs/RESULTS.md 2.43); the cpu backend has one reference (add_rmsnorm, then the MoE)",
     now_moe_block_norm},
    {"gdn.decode_fused", FIELD(gdn_decode_fused), "auto|on|off", SWITCH_WORDS, "on from sm_90",
     "a decode step's Gated DeltaNet conv, delta rule and gated norm in one kernel, apart from decode.fused",
     "a Gated DeltaNet layer (Qwen3-Next) of a decode step runs its conv update, its recurrent delta rule and its "
     "gated RMSNorm as three kernels (four above one sequence). `on` runs them as one (`gdn_decode_fused`: a block "
     "per 32 state columns of a value head, each repeating its key head's conv, the key head's last block writing the "
     "q and k conv states and normalising its value heads' rows; the chain's bits), whatever `decode.fused` says of "
     "the other fused ops; `off` keeps the chain. `auto` is `on` from sm_90 unless `decode.fused=off` (on an H100 "
     "Qwen3-Next fp8 decode B = 1 -1.2 %, B = 64 -1.5 %, two rounds in ABBA order: docs/RESULTS.md 2.43), elsewhere "
     "`decode.fused`'s value; the cpu backend has one reference",
     now_gdn_decode_fused},
    {"gdn.decode_ba", FIELD(gdn_decode_ba), "auto|on|off", SWITCH_WORDS, "off",
     "a decode step's Gated DeltaNet in_proj_ba projection inside the fused GDN kernel",
     "a Gated DeltaNet layer's two small projections of the normed rows, in_proj_qkvz and in_proj_ba (two rows a value "
     "head, bf16), run as two launches: the qkvz GEMV, then a cuBLAS GEMM for ba, which takes no part in PDL. `on` "
     "drops the second: the fused decode kernel (`gdn.decode_fused`) computes its value head's b and a rows itself "
     "before its PDL wait (the weights, and the normed row, written two launches back, through L2), in a fixed order "
     "that the op test repeats on the host, rounded as the linear's output is. Where the fused kernel does not run "
     "(`gdn.decode_fused=off`, prompt steps) or the hidden size is not a multiple of 8, the linear runs as before. "
     "`auto` is `off` until measured on the GPU; the cpu backend has one reference (the "
     "linear, then the op)",
     now_gdn_decode_ba},
    {"gdn.early_state", FIELD(gdn_early_state), "auto|on|off", SWITCH_WORDS, "off",
     "the fused GDN decode kernel's recurrent state loads before its PDL wait",
     "the fused Gated DeltaNet decode kernel (`gdn.decode_fused`) reads its 32 state columns of a value head (64 KB a "
     "head and sequence at Qwen3-Next) after its PDL wait, while its conv runs. A decode step's state was written by "
     "this layer's kernel in an earlier step, many launches back, so `on` issues those loads (through L2) before the "
     "wait, beside the qkvz projection's end. The same bits either way. `auto` is `off` until measured on the GPU",
     now_gdn_early_state},
};
#define N_KEYS (sizeof route_keys / sizeof *route_keys)

static int32_t *field_of(fm_routes *r, const route_key *k) { return (int32_t *)((char *)r + k->field); }
static int32_t field_value(const fm_routes *r, const route_key *k) {
    return *(const int32_t *)((const char *)r + k->field);
}

/* The next '|'-separated item of a values string into tok (cap bytes); the rest, or NULL after the last. */
static const char *next_item(const char *s, char *tok, size_t cap) {
    const char *bar = strchr(s, '|');
    const size_t n = bar ? (size_t)(bar - s) : strlen(s);
    snprintf(tok, cap, "%.*s", (int)n, s);
    return bar ? bar + 1 : NULL;
}

/* A whole decimal integer (strtol's syntax). */
static bool parse_int(const char *v, long *out) {
    char *end = NULL;
    errno = 0;
    *out = strtol(v, &end, 10);
    return !errno && end != v && !*end;
}

static bool word_code(const route_key *k, const char *word, int32_t *code) {
    if (!strcmp(word, "auto")) return *code = 0, true;
    for (size_t i = 0; i < sizeof k->words / sizeof *k->words && k->words[i].name; i++)
        if (!strcmp(k->words[i].name, word)) return *code = k->words[i].code, true;
    return false;
}

/* val as one of k's values: a word, one of its integers, or an integer in one of its ranges. */
static bool parse_value(const route_key *k, const char *val, int32_t *code) {
    long n = 0;
    const bool is_int = parse_int(val, &n);
    char tok[32];
    for (const char *s = k->values; s;) {
        s = next_item(s, tok, sizeof tok);
        const char *dots = strstr(tok, "..");
        long lo = 0, hi = 0;
        if (dots) {
            lo = atol(tok), hi = atol(dots + 2);
            if (is_int && n >= lo && n <= hi) return *code = (int32_t)n, true;
        } else if (parse_int(tok, &lo)) {
            if (is_int && n == lo) return *code = (int32_t)n, true;
        } else if (!strcmp(tok, val)) {
            return word_code(k, tok, code);
        }
    }
    return false;
}

/* The value a field holds, as the user writes it: its word, else the integer. */
static void value_name(const route_key *k, int32_t code, char *buf, size_t cap) {
    if (code == 0) {
        snprintf(buf, cap, "auto");
        return;
    }
    for (size_t i = 0; i < sizeof k->words / sizeof *k->words && k->words[i].name; i++)
        if (k->words[i].code == code) {
            snprintf(buf, cap, "%s", k->words[i].name);
            return;
        }
    snprintf(buf, cap, "%d", code);
}

/* k's values joined for a sentence ("auto, wgmma or mma") or for markdown ("`auto`, `wgmma`, `mma`"). */
static void values_text(const route_key *k, bool markdown, char *buf, size_t cap) {
    char tok[32];
    size_t used = 0;
    buf[0] = '\0';
    for (const char *s = k->values; s && used < cap;) {
        const bool first = s == k->values;
        s = next_item(s, tok, sizeof tok);
        const char *sep = first ? "" : markdown || s ? ", " : " or ";
        used += (size_t)snprintf(buf + used, cap - used, markdown ? "%s`%s`" : "%s%s", sep, tok);
    }
}

/* "key, key, ..." for the errors */
static void keys_text(char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_KEYS && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", route_keys[i].key);
}

void fm_routes_default(fm_routes *r, int sm_major) {
    memset(r, 0, sizeof *r);
    r->sm_major = sm_major;
}

/* one key=value onto r; the checks against the device come after the whole spec parsed */
static fm_status apply_one(fm_routes *r, const char *key, const char *val, fm_error *err) {
    char text[512];
    for (size_t i = 0; i < N_KEYS; i++) {
        const route_key *k = &route_keys[i];
        if (strcmp(k->key, key)) continue;
        int32_t code = 0;
        if (!parse_value(k, val, &code)) {
            values_text(k, false, text, sizeof text);
            return fm_fail(err, FM_ERR_USAGE, "route %s: '%s' is not a value (%s)", key, val, text);
        }
        *field_of(r, k) = code;
        return FM_OK;
    }
    keys_text(text, sizeof text);
    return fm_fail(err, FM_ERR_USAGE, "unknown route key '%s' (keys: %s)", key, text);
}

fm_status fm_routes_apply(fm_routes *r, const char *spec, fm_error *err) {
    if (!spec || !*spec) return FM_OK;
    fm_routes next = *r;
    char item[128], keys[512];
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n >= sizeof item) {
            keys_text(keys, sizeof keys);
            return fm_fail(err, FM_ERR_USAGE, "route '%.40s...' is too long (key=value, keys: %s)", p, keys);
        }
        memcpy(item, p, n);
        item[n] = '\0';
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1]) {
            keys_text(keys, sizeof keys);
            return fm_fail(err, FM_ERR_USAGE, "route '%s' is not key=value (keys: %s)", item, keys);
        }
        *eq = '\0';
        fm_status st = apply_one(&next, item, eq + 1, err);
        if (st) return st;
        if (!comma) break;
        p = comma + 1;
    }
    if (next.sm_major && next.sm_major != 9 &&
        (next.w4a8_kernel == FM_ROUTE_W4A8_WGMMA || next.w4a8_kernel == FM_ROUTE_W4A8_FOLD))
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route w4a8.kernel=%s needs an sm_90 GPU (Hopper: the binary carries "
                       "sm_90a code for it); this GPU is sm_%d: use w4a8.kernel=mma or auto",
                       next.w4a8_kernel == FM_ROUTE_W4A8_FOLD ? "fold" : "wgmma", next.sm_major * 10);
    if (next.sm_major && next.sm_major != 9 && next.attention_kernel == FM_ROUTE_ATTENTION_WGMMA)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route attention.kernel=wgmma needs an sm_90 GPU (Hopper: the binary carries "
                       "sm_90a code for it); this GPU is sm_%d: use attention.kernel=mma or auto",
                       next.sm_major * 10);
    if (next.sm_major && next.sm_major < 9 && next.router_cluster == FM_ROUTE_ON)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route router.cluster=on needs a GPU of compute capability 9 or more (thread-block clusters); "
                       "this GPU is sm_%d: use router.cluster=off or auto",
                       next.sm_major * 10);
    if (next.sm_major && next.sm_major < 9 && next.pdl == FM_ROUTE_ON)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route pdl=on needs a GPU of compute capability 9 or more (programmatic "
                       "dependent launch); this GPU is sm_%d: use pdl=off or auto",
                       next.sm_major * 10);
    *r = next;
    return FM_OK;
}

bool fm_routes_w4a8_wgmma(const fm_routes *r) {
    return r->w4a8_kernel == FM_ROUTE_W4A8_WGMMA || r->w4a8_kernel == FM_ROUTE_W4A8_FOLD ||
           (r->w4a8_kernel == FM_ROUTE_W4A8_AUTO && r->sm_major == 9);
}

bool fm_routes_w4a8_fold(const fm_routes *r) { return r->w4a8_kernel == FM_ROUTE_W4A8_FOLD; }

bool fm_routes_fold_ws(const fm_routes *r, uint64_t P, uint64_t E, uint64_t k) {
    if (!fm_routes_w4a8_fold(r) || r->fold_ws == FM_ROUTE_OFF || P < 1 || fm_routes_moe_gemv(r, P, E, k)) return false;
    return r->fold_ws == FM_ROUTE_ON || P >= FM_FOLD_WS_MIN_ROWS_PER_EXPERT * E;
}

bool fm_routes_attention_wgmma(const fm_routes *r, int32_t hd) {
    if (hd != FM_ATTENTION_WGMMA_HD || r->attention_kernel == FM_ROUTE_ATTENTION_MMA) return false;
    return r->attention_kernel == FM_ROUTE_ATTENTION_WGMMA || r->sm_major == 9;
}

bool fm_routes_decode_graphs(const fm_routes *r) { return r->decode_graphs != FM_ROUTE_OFF; }
bool fm_routes_mixed_graphs(const fm_routes *r) {
    return r->mixed_graphs != FM_ROUTE_OFF && r->decode_graphs != FM_ROUTE_OFF;
}
bool fm_routes_mixed_pad_always(const fm_routes *r) { return r->mixed_graphs == FM_ROUTE_ON; }

/* PDL: a 15-25 % gain of the decode GEMVs at M <= 8 (bench/NOTES.md "v2 -> v4: what PDL, ordering and L1 did") */
bool fm_routes_pdl(const fm_routes *r) {
    return r->pdl == FM_ROUTE_ON || (r->pdl == FM_ROUTE_AUTO && r->sm_major >= 9);
}

/* The W4A8 GEMV beats the grouped kernel 2.7-5.4x at M <= 16 (bench/NOTES.md "bench gemm, final table": 0.492 /
 * 0.579 / 1.007 ms against 2.657 / 2.668 / 2.694 at M = 1 / 8 / 16), so it keeps every M it can take. */
bool fm_routes_gemv(const fm_routes *r) { return r->dense_gemv != FM_ROUTE_OFF; }

int32_t fm_routes_w8a8_gemv_max_m(const fm_routes *r) {
    return r->w8a8_gemv_max_m ? r->w8a8_gemv_max_m : FM_W8A8_GEMV_MAX_M_DEFAULT;
}

int64_t fm_routes_w8a8_fused_elems(const fm_routes *r) {
    return r->w8a8_quant == FM_ROUTE_COMBINE_KERNEL  ? 0
           : r->w8a8_quant == FM_ROUTE_COMBINE_FUSED ? FM_W8A8_FUSED_ELEMS_MAX
                                                     : FM_W8A8_FUSED_ELEMS_DEFAULT;
}

/* fill: measured on an H100 (docs/RESULTS.md 2.35, fp8 preset with w4a8.gemv_max_m=16, against the GEMV chunks):
   B = 64 -3.7 %, B = 32 -0.8 % a decode step */
#define W4A8_SPLITS_BY_DEFAULT FM_ROUTE_W4A8_SPLITS_FILL
int32_t fm_routes_w4a8_splits(const fm_routes *r, int64_t n_groups, int64_t ctas, int32_t sms) {
    int32_t s = r->w4a8_splits ? r->w4a8_splits : W4A8_SPLITS_BY_DEFAULT;
    if (s == FM_ROUTE_W4A8_SPLITS_FILL) {
        s = 8;
        while (s > 1 && (ctas * s > sms || 2 * s > n_groups)) s /= 2;
    }
    return s > n_groups ? (int32_t)(n_groups > 0 ? n_groups : 1) : s;
}

/* auto: the GEMV's 16 rows where the split GEMM takes the rows above (the wgmma kernel with splits), its chunks to 64
   rows elsewhere (the unsplit GEMM loses to them: docs/RESULTS.md 2.34 and 2.35) */
int32_t fm_routes_w4a8_gemv_max_m(const fm_routes *r) {
    if (r->w4a8_gemv_max_m) return r->w4a8_gemv_max_m;
    const int32_t splits = r->w4a8_splits ? r->w4a8_splits : W4A8_SPLITS_BY_DEFAULT;
    return fm_routes_w4a8_wgmma(r) && splits != 1 ? FM_GEMV_FP8_MAX_M : FM_W4A8_GEMV_DENSE_MAX_M;
}

uint32_t fm_routes_w4a8_tile_rows(const fm_routes *r, uint64_t P, uint64_t E) {
    if (r->w4a8_tile) return (uint32_t)r->w4a8_tile;
    if (P < 32 * E) return FM_W4A8_BN_SMALL;
    /* 32-row tiles measured on the wgmma kernel only */
    return fm_routes_w4a8_wgmma(r) && P < 256 * E ? FM_W4A8_BN_MID : FM_W4A8_BN;
}

uint32_t fm_routes_w4a8_moe_tile_rows(const fm_routes *r, uint64_t P, uint64_t E, fm_wformat f, bool fp4_dispatch,
                                      uint64_t expert_bytes) {
    const uint32_t bn = fm_routes_w4a8_tile_rows(r, P, E);
    /* an FP4 dispatch expands inline on 32-row tiles (the producer kernel has none): faster than 64 with the producer
       at 32 rows per expert, slower at 128 (bench/NOTES.md 2026-12-02, "the two warpgroups apart") */
    /* the fold kernel converts the CTA's 256 weight rows per group whatever its tile's activation rows, so 32-row
       tiles would double its producer's work per FLOP (and it runs one CTA per SM either way): 64 (not measured) */
    const bool measured = f == FM_W_INT4_G128_TC && expert_bytes <= FM_W4A8_MID_MAX_EXPERT_BYTES &&
                          (!fp4_dispatch || P < 64 * E) && !fm_routes_w4a8_fold(r);
    return bn == FM_W4A8_BN_MID && !r->w4a8_tile && !measured ? FM_W4A8_BN : bn;
}

bool fm_routes_moe_gemv(const fm_routes *r, uint64_t P, uint64_t E, uint64_t k) {
    if (r->moe_gemv < 0) return false;
    /* auto: up to 8 pairs, and always one token's k (Qwen3-Next's top-10 decode step: RESULTS 2.12) */
    const uint64_t dflt = k > FM_MOE_GEMV_PAIRS_DEFAULT && k <= FM_MOE_GEMV_MAX_PAIRS ? k : FM_MOE_GEMV_PAIRS_DEFAULT;
    const uint64_t max = r->moe_gemv ? (uint64_t)r->moe_gemv : dflt;
    return P >= 1 && P <= max && fm_routes_w4a8_tile_rows(r, P, E) == FM_W4A8_BN_SMALL;
}

/* auto: group until measured (bench/NOTES.md, thirtieth session) */
bool fm_routes_moe_token_scales(const fm_routes *r, uint64_t P, uint64_t E, uint64_t k, fm_wformat gate_up,
                                fm_wformat down, bool e4m3_dispatch) {
    return r->moe_act_scale == FM_ROUTE_ACT_SCALE_TOKEN && e4m3_dispatch && fm_wformat_is_int4(gate_up) &&
           !fm_wformat_is_int4zp(down) && !fm_routes_w4a8_fold(r) && !fm_routes_moe_gemv(r, P, E, k);
}

bool fm_routes_router_fused(const fm_routes *r, int64_t T) {
    return r->router_fused == FM_ROUTE_ON ? T >= 1 : r->router_fused == FM_ROUTE_AUTO && T == 1;
}
/* auto: off, level with the default kernel on an H100 (bench/NOTES.md, twenty-ninth session) */
#define ROUTER_CLUSTER_BY_DEFAULT false
bool fm_routes_router_cluster(const fm_routes *r) {
    return r->router_cluster == FM_ROUTE_ON ||
           (r->router_cluster == FM_ROUTE_AUTO && ROUTER_CLUSTER_BY_DEFAULT && r->sm_major >= 9);
}

/* auto: on from sm_90, where it was measured (an H100: fp8 B = 1 -6 to -7 % a step, docs/RESULTS.md 2.22) */
bool fm_routes_moe_persistent(const fm_routes *r) {
    return r->moe_persistent == FM_ROUTE_ON || (r->moe_persistent == FM_ROUTE_AUTO && r->sm_major >= 9);
}

/* auto: off until measured on a GPU */
bool fm_routes_moe_block_norm(const fm_routes *r) { return r->moe_block_norm == FM_ROUTE_ON; }

bool fm_routes_attn_persistent(const fm_routes *r) { return r->attn_persistent == FM_ROUTE_ON; }

/* auto: the counting barrier (an H200: fp8 B = 1 -2.2 %, docs/RESULTS.md 2.42) */
bool fm_routes_moe_block_barrier_count(const fm_routes *r) {
    return r->moe_block_barrier != FM_ROUTE_BARRIER_GENERATION; /* auto: count */
}

/* auto: on (an H100: bench moe T = 8..64 -0.001 to -0.002 ms, decode B = 8 -1.1 %, docs/RESULTS.md 2.41) */
#define MOE_PLAN_SLOTS_BY_DEFAULT true
bool fm_routes_moe_plan_slots(const fm_routes *r) {
    return r->moe_plan_slots == FM_ROUTE_ON || (r->moe_plan_slots == FM_ROUTE_AUTO && MOE_PLAN_SLOTS_BY_DEFAULT);
}

/* auto: on (an H100: fp8 decode B = 1 -1.3 %, B = 8 -1.0 %, B = 64 -0.9 %, docs/RESULTS.md 2.39); PDL's alone */
#define PAGED_EARLY_KV_BY_DEFAULT true
bool fm_routes_paged_early_kv(const fm_routes *r) {
    return r->paged_early_kv == FM_ROUTE_ON || (r->paged_early_kv == FM_ROUTE_AUTO && PAGED_EARLY_KV_BY_DEFAULT);
}
/* auto: on (an H100: fp8 decode B = 8 -1.8 %, B = 64 -1.2 %, docs/RESULTS.md 2.39); the wgmma kernel's alone */
#define W4A8_EARLY_CODES_BY_DEFAULT true
bool fm_routes_w4a8_early_codes(const fm_routes *r) {
    return r->w4a8_early_codes == FM_ROUTE_ON || (r->w4a8_early_codes == FM_ROUTE_AUTO && W4A8_EARLY_CODES_BY_DEFAULT);
}

/* auto: off until measured on a GPU (built in the forty-first session, bench/NOTES.md) */
#define PAGED_SWAP_BY_DEFAULT_FROM_SM 9
int32_t fm_routes_paged_swap(const fm_routes *r) {
    if (r->paged_swap == FM_ROUTE_AUTO) return r->sm_major >= PAGED_SWAP_BY_DEFAULT_FROM_SM ? 1 : 0;
    return r->paged_swap == FM_ROUTE_SWAP_X2 ? 2 : r->paged_swap == FM_ROUTE_ON ? 1 : 0;
}

bool fm_routes_rope_store(const fm_routes *r) { return r->rope_store != FM_ROUTE_OFF; }
bool fm_routes_attention_paged_tiled(const fm_routes *r) {
    return r->paged_tiled == FM_ROUTE_ON || (r->paged_tiled == FM_ROUTE_AUTO && r->sm_major >= 9);
}
/* auto: the two-kernel form until the fused one is measured on a GPU (compiled only; bench/NOTES.md 2026-12-05) */
#define PAGED_COMBINE_FUSED_BY_DEFAULT false
bool fm_routes_paged_combine_fused(const fm_routes *r) {
    return r->paged_combine == FM_ROUTE_COMBINE_FUSED ||
           (r->paged_combine == FM_ROUTE_COMBINE_AUTO && PAGED_COMBINE_FUSED_BY_DEFAULT);
}
/* auto: the waves rule. H100, bench decode --context 2048, two rounds against the fill rule in the same run: fp8 B = 64
 * 15.349 / 15.404 -> 14.887 / 14.888 ms, fp8 + w8a8 14.549 / 14.546 -> 14.070 / 14.051; B = 1 the same splits, B = 8
 * within 0.6 % (docs/RESULTS.md 2.16, bench/NOTES.md 2026-12-05 twenty-sixth session) */
#define PAGED_SPLITS_WAVES_BY_DEFAULT true
bool fm_routes_paged_splits_waves(const fm_routes *r) {
    return r->paged_splits == FM_ROUTE_SPLITS_WAVES ||
           (r->paged_splits == FM_ROUTE_SPLITS_AUTO && PAGED_SPLITS_WAVES_BY_DEFAULT);
}
/* auto: the quantizer launch until the fused form is measured on a GPU (compiled only; bench/NOTES.md 2026-12-05) */
#define DOWN_QUANT_FUSED_BY_DEFAULT false
bool fm_routes_moe_down_quant_fused(const fm_routes *r) {
    return r->moe_down_quant == FM_ROUTE_DOWN_QUANT_FUSED ||
           (r->moe_down_quant == FM_ROUTE_DOWN_QUANT_AUTO && DOWN_QUANT_FUSED_BY_DEFAULT);
}
/* auto: the quantizer launch until the fused form is measured on a GPU (compiled only; bench/NOTES.md 2026-12-05,
   twenty-seventh session) */
#define DENSE_QUANT_FUSED_BY_DEFAULT false
bool fm_routes_dense_quant_fused(const fm_routes *r) {
    return r->dense_quant == FM_ROUTE_DOWN_QUANT_FUSED ||
           (r->dense_quant == FM_ROUTE_DOWN_QUANT_AUTO && DENSE_QUANT_FUSED_BY_DEFAULT);
}
/* auto: producer (H100, docs/RESULTS.md 2.37: fp8 decode B = 1 -2.3 %, B = 8 -0.9 %, B = 64 -0.4 % a step, the same
   tokens) */
bool fm_routes_dense_quant_producer(const fm_routes *r) {
    return r->dense_quant == FM_ROUTE_QUANT_PRODUCER || r->dense_quant == FM_ROUTE_DOWN_QUANT_AUTO;
}
int32_t fm_routes_gemv_groups(const fm_routes *r) { return r->gemv_groups > 0 ? r->gemv_groups : 0; }
#define MOE_COMBINE_FUSED_BY_DEFAULT false  /* likewise */
#define MOE_DISPATCH_FUSED_BY_DEFAULT false /* likewise */
bool fm_routes_moe_dispatch_fused(const fm_routes *r) {
    return r->moe_dispatch == FM_ROUTE_COMBINE_FUSED ||
           (r->moe_dispatch == FM_ROUTE_COMBINE_AUTO && MOE_DISPATCH_FUSED_BY_DEFAULT);
}

bool fm_routes_moe_combine_fused(const fm_routes *r) {
    return r->moe_combine == FM_ROUTE_COMBINE_FUSED ||
           (r->moe_combine == FM_ROUTE_COMBINE_AUTO && MOE_COMBINE_FUSED_BY_DEFAULT);
}
bool fm_routes_fused_moe_tail(const fm_routes *r, int64_t T) {
    return r->decode_fused == FM_ROUTE_ON || (r->decode_fused == FM_ROUTE_AUTO && T <= 64);
}
bool fm_routes_fused_o_proj(const fm_routes *r) { return r->decode_fused == FM_ROUTE_ON; }

/* auto: on from sm_90 unless decode.fused is off (an H100: Qwen3-Next fp8 B = 1 -1.2 %, B = 64 -1.5 %, docs/RESULTS.md
   2.43); elsewhere decode.fused's value */
bool fm_routes_fused_gdn(const fm_routes *r) {
    if (r->gdn_decode_fused != FM_ROUTE_AUTO) return r->gdn_decode_fused == FM_ROUTE_ON;
    return r->decode_fused == FM_ROUTE_ON || (r->decode_fused == FM_ROUTE_AUTO && r->sm_major >= 9);
}

/* auto: off, both, until a GPU run measures them (bench/NOTES.md, fifty-first session) */
#define GDN_DECODE_BA_BY_DEFAULT false
bool fm_routes_gdn_decode_ba(const fm_routes *r) {
    return r->gdn_decode_ba == FM_ROUTE_ON || (r->gdn_decode_ba == FM_ROUTE_AUTO && GDN_DECODE_BA_BY_DEFAULT);
}
#define GDN_EARLY_STATE_BY_DEFAULT false
bool fm_routes_gdn_early_state(const fm_routes *r) {
    return r->gdn_early_state == FM_ROUTE_ON || (r->gdn_early_state == FM_ROUTE_AUTO && GDN_EARLY_STATE_BY_DEFAULT);
}

/* auto: routed from sm_90, where it was measured with the persistent MoE block taking it (an H200: Qwen3-Next fp8
   B = 1 -9.3 %, B = 64 level, docs/RESULTS.md 2.42); separate elsewhere (the cpu backend's reference form) */
bool fm_routes_moe_shared_routed(const fm_routes *r) {
    return r->moe_shared == FM_ROUTE_SHARED_ROUTED || (r->moe_shared == FM_ROUTE_SHARED_AUTO && r->sm_major >= 9);
}

bool fm_routes_shared_stream(const fm_routes *r, int64_t T) { return T >= 1 && r->shared_stream != FM_ROUTE_OFF; }

int64_t fm_routes_shared_stream_rows(const fm_routes *r, int64_t T) { return r->shared_stream == FM_ROUTE_OFF ? 0 : T; }

bool fm_routes_expert_prefetch(const fm_routes *r, int64_t T) {
    return r->expert_prefetch >= 1 && T <= FM_EXPERT_PREFETCH_MAX_T;
}

int32_t fm_routes_expert_prefetch_top(const fm_routes *r, int32_t k) {
    return r->expert_prefetch < 1 ? 0 : r->expert_prefetch < k ? r->expert_prefetch : k;
}

bool fm_routes_gdn_tc(const fm_routes *r, int32_t dk, int32_t dv, bool act_bf16) {
    return r->gdn_tc != FM_ROUTE_OFF && fm_gdn_tc_takes(dk, dv, act_bf16);
}

fm_dense_kernel fm_routes_dense_kernel(const fm_routes *r, fm_wformat f, int64_t M, int64_t K) {
    switch (f) {
    case FM_W_INT4_G128:
    case FM_W_INT4_ZP: return FM_DK_W4A16_GEMV;
    case FM_W_INT4_G128_TC:
    case FM_W_INT4_ZP_TC:
    case FM_W_E4M3_B128: {
        const int64_t k_pad = (K + 127) / 128 * 128;
        const bool gemv = fm_routes_gemv(r) && M >= 1 && M <= fm_routes_w4a8_gemv_max_m(r) &&
                          fm_gemv_fp8_smem(M, k_pad) <= FM_GEMV_FP8_SMEM_MAX;
        return gemv ? FM_DK_W4A8_GEMV : FM_DK_W4A8_GEMM;
    }
    case FM_W_E4M3_PT:
        return fm_routes_gemv(r) && M >= 1 && M <= fm_routes_w8a8_gemv_max_m(r) ? FM_DK_W8A8_GEMV : FM_DK_W8A8_CUBLASLT;
    case FM_W_F32:
    case FM_W_BF16: break;
    }
    return FM_DK_CUBLAS;
}

bool fm_routes_w4a8_fp4_producer(const fm_routes *r, uint32_t tile_rows) {
    (void)tile_rows;
    return fm_routes_w4a8_wgmma(r) && r->w4a8_fp4 != FM_ROUTE_FP4_INLINE;
}

bool fm_routes_w4a8_codes_staged(const fm_routes *r, uint64_t P, uint64_t E) {
    if (!fm_routes_w4a8_wgmma(r) || r->w4a8_codes == FM_ROUTE_CODES_REGS) return false;
    /* auto: the expert GEMMs while the experts average under one 64-row tile each (E > 1, P < 64 E) */
    return r->w4a8_codes == FM_ROUTE_CODES_SMEM || (E > 1 && P < 64 * E);
}

const char *fm_routes_w4a8_kernel_name(const fm_routes *r) {
    if (fm_routes_w4a8_fold(r)) return "wgmma m64n64k32 e4m3 (sm_90a), experts on the fold GEMM (int4-p2)";
    return fm_routes_w4a8_wgmma(r) ? "wgmma m64n64k32 e4m3 (sm_90a)" : "mma.sync m16n8k32 e4m3 (sm_89+)";
}

const char *fm_dense_kernel_name(const fm_routes *r, fm_dense_kernel k) {
    switch (k) {
    case FM_DK_CUBLAS: return "cuBLAS GEMM";
    case FM_DK_W4A16_GEMV: return "int4 GEMV (W4A16, row by row)";
    case FM_DK_W4A8_GEMV:
        return fm_routes_pdl(r) ? "W4A8 GEMV mma.sync m16n8k32 e4m3 + PDL" : "W4A8 GEMV mma.sync m16n8k32 e4m3";
    case FM_DK_W4A8_GEMM:
        return fm_routes_w4a8_wgmma(r) ? "W4A8 GEMM wgmma m64n64k32 e4m3" : "W4A8 GEMM mma.sync m16n8k32 e4m3";
    case FM_DK_W8A8_GEMV:
        return fm_routes_pdl(r) ? "W8A8 GEMV mma.sync m16n8k32 e4m3 + PDL" : "W8A8 GEMV mma.sync m16n8k32 e4m3";
    case FM_DK_W8A8_CUBLASLT: return "cuBLASLt FP8";
    }
    return "?";
}

void fm_routes_print(const fm_routes *r, FILE *out) {
    fprintf(out, "  %-16s %-6s %-17s %-25s %-32s %s\n", "key", "value", "values", "default", "now", "decides");
    for (size_t i = 0; i < N_KEYS; i++) {
        const route_key *k = &route_keys[i];
        char value[16], now[64];
        value_name(k, field_value(r, k), value, sizeof value);
        k->now(r, now, sizeof now);
        fprintf(out, "  %-16s %-6s %-17s %-25s %-32s %s\n", k->key, value, k->values, k->def, now, k->decides);
    }
}

void fm_routes_print_markdown(FILE *out) {
    fputs("# Kernel routes\n"
          "\n"
          "<!-- Generated by `fp8moe inspect --routes --markdown` from the table in src/backend/routes.c; "
          "tests/test_routes.c checks that this file equals it. Edit the table, then regenerate. -->\n"
          "\n"
          "Which kernel computes an op at a given shape is decided in one place: a route table, filled when the cuda "
          "backend is created from the GPU and the model's shapes. A route chooses a kernel, never what is "
          "computed.\n"
          "\n"
          "- `fp8moe inspect --routes` prints the table (each key, its value, default and what it resolves to), "
          "then the kernel each dense weight format gets at M = 1, 8, 16, 128 and 2048 rows, and the MoE tile rows "
          "at several prompt lengths. Without a GPU it shows what an sm_90 GPU would get.\n"
          "- `--route KEY=VALUE` overrides one key; it is repeatable and accepted by every command that loads a "
          "model or benchmarks. In the C API the same overrides go in `fm_options.routes = \"key=value,key=value\"`, "
          "and `fm_routes_check(spec, &err)` validates such a string without a GPU.\n"
          "- No environment variable changes a route. The value `auto` means the default rule. A forced kernel the "
          "GPU cannot run (`wgmma` off sm_90, `pdl=on` below sm_90) is refused when the backend is created.\n"
          "\n"
          "| key | values | what it chooses |\n"
          "|---|---|---|\n",
          out);
    for (size_t i = 0; i < N_KEYS; i++) {
        char values[128];
        values_text(&route_keys[i], true, values, sizeof values);
        fprintf(out, "| `%s` | %s | ", route_keys[i].key, values);
        for (const char *c = route_keys[i].doc; *c; c++) {
            if (*c == '|') fputc('\\', out); /* a bare '|' would end the cell */
            fputc(*c, out);
        }
        fputs(" |\n", out);
    }
    fputs("\n"
          "```sh\n"
          "./build/fp8moe inspect --model models/tiny-code-moe --routes   # without a GPU: what sm_90 would get\n"
          "./build/fp8moe inspect --routes --route w4a8.tile=64           # Qwen3-30B-A3B-like shapes, one route "
          "forced\n"
          "./build/fp8moe bench moe --shape qwen3 --tokens 16 --route w4a8.tile=64                                 "
          "# GPU: A/B a tile size\n"
          "./build/fp8moe parity --model models/tiny-code-moe --backend cuda --presets fp8 --route w4a8.kernel=mma "
          "# GPU\n"
          "```\n"
          "\n"
          "The bench commands' `--routes LIST` is another thing: the yardstick routes a benchmark compares (see "
          "[cli.md](cli.md#bench)).\n",
          out);
}

fm_status fm_routes_check(const char *routes, fm_error *err) {
    fm_routes r;
    fm_routes_default(&r, 0);
    return fm_routes_apply(&r, routes, err);
}
