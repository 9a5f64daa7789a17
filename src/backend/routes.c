/* The route table (routes.h): parsing of the overrides, the deciders, the printer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/routes.h"
#include "util/status.h"

#define KEYS                                                                                                           \
    "w4a8.kernel, attention.kernel, w4a8.tile, w4a8.fp4, w4a8.codes, dense.gemv, w8a8.gemv_max_m, moe.gemv, "          \
    "router.fused, pdl, decode.graphs, gdn.tc, gdn.state, rope.store, shared.stream, expert.prefetch"

void fm_routes_default(fm_routes *r, int sm_major) {
    memset(r, 0, sizeof *r);
    r->sm_major = sm_major;
}

static bool parse_switch(const char *v, fm_route_switch *out) {
    if (!strcmp(v, "auto")) *out = FM_ROUTE_AUTO;
    else if (!strcmp(v, "on")) *out = FM_ROUTE_ON;
    else if (!strcmp(v, "off")) *out = FM_ROUTE_OFF;
    else return false;
    return true;
}

/* an integer in [lo, hi], or "auto" (0) */
static bool parse_count(const char *v, long lo, long hi, int32_t *out) {
    if (!strcmp(v, "auto")) return *out = 0, true;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) return false;
    *out = (int32_t)n;
    return true;
}

/* one key=value onto r; the checks against the device come after the whole spec parsed */
static fm_status apply_one(fm_routes *r, const char *key, const char *val, fm_error *err) {
    if (!strcmp(key, "w4a8.kernel")) {
        if (!strcmp(val, "auto")) r->w4a8_kernel = FM_ROUTE_W4A8_AUTO;
        else if (!strcmp(val, "wgmma")) r->w4a8_kernel = FM_ROUTE_W4A8_WGMMA;
        else if (!strcmp(val, "mma")) r->w4a8_kernel = FM_ROUTE_W4A8_MMA;
        else return fm_fail(err, FM_ERR_USAGE, "route w4a8.kernel: '%s' is not a value (auto, wgmma or mma)", val);
    } else if (!strcmp(key, "attention.kernel")) {
        if (!strcmp(val, "auto")) r->attention_kernel = FM_ROUTE_ATTENTION_AUTO;
        else if (!strcmp(val, "wgmma")) r->attention_kernel = FM_ROUTE_ATTENTION_WGMMA;
        else if (!strcmp(val, "mma")) r->attention_kernel = FM_ROUTE_ATTENTION_MMA;
        else return fm_fail(err, FM_ERR_USAGE, "route attention.kernel: '%s' is not a value (auto, wgmma or mma)", val);
    } else if (!strcmp(key, "w4a8.tile")) {
        int32_t t = 0;
        if (!parse_count(val, FM_W4A8_BN_SMALL, FM_W4A8_BN, &t) ||
            (t && t != FM_W4A8_BN_SMALL && t != FM_W4A8_BN_MID && t != FM_W4A8_BN))
            return fm_fail(err, FM_ERR_USAGE, "route w4a8.tile: '%s' is not a value (auto, %d, %d or %d)", val,
                           FM_W4A8_BN_SMALL, FM_W4A8_BN_MID, FM_W4A8_BN);
        r->w4a8_tile = t;
    } else if (!strcmp(key, "w4a8.fp4")) {
        if (!strcmp(val, "auto")) r->w4a8_fp4 = FM_ROUTE_FP4_AUTO;
        else if (!strcmp(val, "producer")) r->w4a8_fp4 = FM_ROUTE_FP4_PRODUCER;
        else if (!strcmp(val, "inline")) r->w4a8_fp4 = FM_ROUTE_FP4_INLINE;
        else return fm_fail(err, FM_ERR_USAGE, "route w4a8.fp4: '%s' is not a value (auto, producer or inline)", val);
    } else if (!strcmp(key, "w4a8.codes")) {
        if (!strcmp(val, "auto")) r->w4a8_codes = FM_ROUTE_CODES_AUTO;
        else if (!strcmp(val, "regs")) r->w4a8_codes = FM_ROUTE_CODES_REGS;
        else if (!strcmp(val, "smem")) r->w4a8_codes = FM_ROUTE_CODES_SMEM;
        else return fm_fail(err, FM_ERR_USAGE, "route w4a8.codes: '%s' is not a value (auto, regs or smem)", val);
    } else if (!strcmp(key, "dense.gemv")) {
        if (!parse_switch(val, &r->dense_gemv))
            return fm_fail(err, FM_ERR_USAGE, "route dense.gemv: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "w8a8.gemv_max_m")) {
        if (!parse_count(val, 1, FM_GEMV_FP8_MAX_M, &r->w8a8_gemv_max_m))
            return fm_fail(err, FM_ERR_USAGE, "route w8a8.gemv_max_m: '%s' is not a value (auto or 1..%d)", val,
                           FM_GEMV_FP8_MAX_M);
    } else if (!strcmp(key, "moe.gemv")) {
        if (!strcmp(val, "off")) r->moe_gemv = -1;
        else if (!parse_count(val, 1, FM_MOE_GEMV_MAX_PAIRS, &r->moe_gemv))
            return fm_fail(err, FM_ERR_USAGE, "route moe.gemv: '%s' is not a value (auto, off or 1..%d)", val,
                           FM_MOE_GEMV_MAX_PAIRS);
    } else if (!strcmp(key, "router.fused")) {
        if (!parse_switch(val, &r->router_fused))
            return fm_fail(err, FM_ERR_USAGE, "route router.fused: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "pdl")) {
        if (!parse_switch(val, &r->pdl))
            return fm_fail(err, FM_ERR_USAGE, "route pdl: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "gdn.tc")) {
        if (!parse_switch(val, &r->gdn_tc))
            return fm_fail(err, FM_ERR_USAGE, "route gdn.tc: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "gdn.state")) {
        int32_t w = 0;
        if (!strcmp(val, "split")) w = FM_GDN_STATE_SPLIT;
        else if (!parse_count(val, 4, 8, &w) || (w != 0 && w != 4 && w != 8))
            return fm_fail(err, FM_ERR_USAGE, "route gdn.state: '%s' is not a value (auto, 4, 8 or split)", val);
        r->gdn_state = w;
    } else if (!strcmp(key, "rope.store")) {
        if (!parse_switch(val, &r->rope_store))
            return fm_fail(err, FM_ERR_USAGE, "route rope.store: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "shared.stream")) {
        if (!parse_switch(val, &r->shared_stream))
            return fm_fail(err, FM_ERR_USAGE, "route shared.stream: '%s' is not a value (auto, on or off)", val);
    } else if (!strcmp(key, "expert.prefetch")) {
        if (!strcmp(val, "off")) r->expert_prefetch = -1;
        else if (!strcmp(val, "on")) r->expert_prefetch = FM_EXPERT_PREFETCH_ALL;
        else if (!parse_count(val, 1, 64, &r->expert_prefetch))
            return fm_fail(err, FM_ERR_USAGE, "route expert.prefetch: '%s' is not a value (auto, on, off or 1..64)",
                           val);
    } else if (!strcmp(key, "decode.graphs")) {
        if (!parse_switch(val, &r->decode_graphs))
            return fm_fail(err, FM_ERR_USAGE, "route decode.graphs: '%s' is not a value (auto, on or off)", val);
    } else {
        return fm_fail(err, FM_ERR_USAGE, "unknown route key '%s' (keys: " KEYS ")", key);
    }
    return FM_OK;
}

fm_status fm_routes_apply(fm_routes *r, const char *spec, fm_error *err) {
    if (!spec || !*spec) return FM_OK;
    fm_routes next = *r;
    char item[128];
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n >= sizeof item)
            return fm_fail(err, FM_ERR_USAGE, "route '%.40s...' is too long (key=value, keys: " KEYS ")", p);
        memcpy(item, p, n);
        item[n] = '\0';
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return fm_fail(err, FM_ERR_USAGE, "route '%s' is not key=value (keys: " KEYS ")", item);
        *eq = '\0';
        fm_status st = apply_one(&next, item, eq + 1, err);
        if (st) return st;
        if (!comma) break;
        p = comma + 1;
    }
    if (next.sm_major && next.sm_major != 9 && next.w4a8_kernel == FM_ROUTE_W4A8_WGMMA)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route w4a8.kernel=wgmma needs an sm_90 GPU (Hopper: the binary carries "
                       "sm_90a code for it); this GPU is sm_%d: use w4a8.kernel=mma or auto",
                       next.sm_major * 10);
    if (next.sm_major && next.sm_major != 9 && next.attention_kernel == FM_ROUTE_ATTENTION_WGMMA)
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "route attention.kernel=wgmma needs an sm_90 GPU (Hopper: the binary carries "
                       "sm_90a code for it); this GPU is sm_%d: use attention.kernel=mma or auto",
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
    return r->w4a8_kernel == FM_ROUTE_W4A8_WGMMA || (r->w4a8_kernel == FM_ROUTE_W4A8_AUTO && r->sm_major == 9);
}

bool fm_routes_attention_wgmma(const fm_routes *r, int32_t hd) {
    if (hd != FM_ATTENTION_WGMMA_HD || r->attention_kernel == FM_ROUTE_ATTENTION_MMA) return false;
    return r->attention_kernel == FM_ROUTE_ATTENTION_WGMMA || r->sm_major == 9;
}

/* PDL: a 15-25 % gain of the decode GEMVs at M <= 8 (bench/NOTES.md "v2 -> v4: what PDL, ordering and L1 did") */
bool fm_routes_decode_graphs(const fm_routes *r) { return r->decode_graphs != FM_ROUTE_OFF; }

bool fm_routes_pdl(const fm_routes *r) {
    return r->pdl == FM_ROUTE_ON || (r->pdl == FM_ROUTE_AUTO && r->sm_major >= 9);
}

/* The W4A8 GEMV beats the grouped kernel 2.7-5.4x at M <= 16 (bench/NOTES.md "bench gemm, final table": 0.492 /
 * 0.579 / 1.007 ms against 2.657 / 2.668 / 2.694 at M = 1 / 8 / 16), so it keeps every M it can take. */
bool fm_routes_gemv(const fm_routes *r) { return r->dense_gemv != FM_ROUTE_OFF; }

int32_t fm_routes_w8a8_gemv_max_m(const fm_routes *r) {
    return r->w8a8_gemv_max_m ? r->w8a8_gemv_max_m : FM_W8A8_GEMV_MAX_M_DEFAULT;
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
       at 32 rows per expert, slower at 128 (bench/NOTES.md, sixteenth session) */
    const bool measured =
        f == FM_W_INT4_G128_TC && expert_bytes <= FM_W4A8_MID_MAX_EXPERT_BYTES && (!fp4_dispatch || P < 64 * E);
    return bn == FM_W4A8_BN_MID && !r->w4a8_tile && !measured ? FM_W4A8_BN : bn;
}

bool fm_routes_moe_gemv(const fm_routes *r, uint64_t P, uint64_t E, uint64_t k) {
    if (r->moe_gemv < 0) return false;
    /* auto: up to 8 pairs, and always one token's k (Qwen3-Next's top-10 decode step: RESULTS 2.12) */
    const uint64_t dflt = k > FM_MOE_GEMV_PAIRS_DEFAULT && k <= FM_MOE_GEMV_MAX_PAIRS ? k : FM_MOE_GEMV_PAIRS_DEFAULT;
    const uint64_t max = r->moe_gemv ? (uint64_t)r->moe_gemv : dflt;
    return P >= 1 && P <= max && fm_routes_w4a8_tile_rows(r, P, E) == FM_W4A8_BN_SMALL;
}

bool fm_routes_router_fused(const fm_routes *r, int64_t T) {
    return r->router_fused == FM_ROUTE_ON ? T >= 1 : r->router_fused == FM_ROUTE_AUTO && T == 1;
}

bool fm_routes_rope_store(const fm_routes *r) { return r->rope_store != FM_ROUTE_OFF; }

bool fm_routes_shared_stream(const fm_routes *r, int64_t T) { return T >= 1 && r->shared_stream != FM_ROUTE_OFF; }

int64_t fm_routes_shared_stream_rows(const fm_routes *r, int64_t T) { return r->shared_stream == FM_ROUTE_OFF ? 0 : T; }

bool fm_routes_expert_prefetch(const fm_routes *r, int64_t T) {
    return r->expert_prefetch >= 1 && T <= FM_EXPERT_PREFETCH_MAX_T;
}

int32_t fm_routes_expert_prefetch_top(const fm_routes *r, int32_t k) {
    return r->expert_prefetch < 1 ? 0 : r->expert_prefetch < k ? r->expert_prefetch : k;
}

int fm_routes_gdn_state(const fm_routes *r) { return r->gdn_state ? r->gdn_state : FM_GDN_STATE_SPLIT; }

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
        const bool gemv =
            fm_routes_gemv(r) && M >= 1 && M <= FM_GEMV_FP8_MAX_M && fm_gemv_fp8_smem(M, k_pad) <= FM_GEMV_FP8_SMEM_MAX;
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

static const char *switch_name(fm_route_switch s) {
    return s == FM_ROUTE_ON ? "on" : s == FM_ROUTE_OFF ? "off" : "auto";
}

void fm_routes_print(const fm_routes *r, FILE *out) {
    char tile[8], maxm[8];
    snprintf(tile, sizeof tile, "%d", r->w4a8_tile);
    snprintf(maxm, sizeof maxm, "%d", r->w8a8_gemv_max_m);
    const char *kernel = r->w4a8_kernel == FM_ROUTE_W4A8_WGMMA ? "wgmma"
                         : r->w4a8_kernel == FM_ROUTE_W4A8_MMA ? "mma"
                                                               : "auto";
    const char *att = r->attention_kernel == FM_ROUTE_ATTENTION_WGMMA ? "wgmma"
                      : r->attention_kernel == FM_ROUTE_ATTENTION_MMA ? "mma"
                                                                      : "auto";
    const char *fp4 = r->w4a8_fp4 == FM_ROUTE_FP4_PRODUCER ? "producer"
                      : r->w4a8_fp4 == FM_ROUTE_FP4_INLINE ? "inline"
                                                           : "auto";
    const char *codes = r->w4a8_codes == FM_ROUTE_CODES_REGS   ? "regs"
                        : r->w4a8_codes == FM_ROUTE_CODES_SMEM ? "smem"
                                                               : "auto";
    char now[9][64], moe[8], warps[8], prefetch[8], prefetch_now[40];
    snprintf(prefetch, sizeof prefetch, "%d", r->expert_prefetch);
    if (r->expert_prefetch <= 0 || r->expert_prefetch == FM_EXPERT_PREFETCH_ALL)
        snprintf(prefetch, sizeof prefetch, "%s",
                 r->expert_prefetch == 0  ? "auto"
                 : r->expert_prefetch < 0 ? "off"
                                          : "on");
    if (r->expert_prefetch < 1) snprintf(prefetch_now, sizeof prefetch_now, "off");
    else if (r->expert_prefetch == FM_EXPERT_PREFETCH_ALL) snprintf(prefetch_now, sizeof prefetch_now, "top-k, T <= 8");
    else snprintf(prefetch_now, sizeof prefetch_now, "top %d, T <= 8", r->expert_prefetch);
    snprintf(warps, sizeof warps, "%d", r->gdn_state);
    if (r->gdn_state == FM_GDN_STATE_SPLIT) snprintf(warps, sizeof warps, "split");
    snprintf(moe, sizeof moe, "%d", r->moe_gemv);
    snprintf(now[0], sizeof now[0], "%s", fm_routes_w4a8_wgmma(r) ? "wgmma" : "mma.sync");
    if (r->w4a8_tile) snprintf(now[1], sizeof now[1], "%d rows", r->w4a8_tile);
    else if (fm_routes_w4a8_wgmma(r)) snprintf(now[1], sizeof now[1], "16 / 32 / 64 rows at P < 32 E / 256 E / above");
    else snprintf(now[1], sizeof now[1], "16 rows while P < 32 E, else 64");
    snprintf(now[2], sizeof now[2], "%s", fm_routes_gemv(r) ? "on" : "off");
    snprintf(now[3], sizeof now[3], "%d", fm_routes_w8a8_gemv_max_m(r));
    if (r->moe_gemv < 0) snprintf(now[4], sizeof now[4], "off");
    else if (r->moe_gemv) snprintf(now[4], sizeof now[4], "P <= %d", r->moe_gemv);
    else snprintf(now[4], sizeof now[4], "P <= max(%d, top-k)", FM_MOE_GEMV_PAIRS_DEFAULT);
    snprintf(now[5], sizeof now[5], "%s",
             fm_routes_attention_wgmma(r, FM_ATTENTION_WGMMA_HD) ? "wgmma for hd 128" : "mma.sync");
    snprintf(now[6], sizeof now[6], "%s",
             fm_routes_w4a8_fp4_producer(r, FM_W4A8_BN) ? "producer warpgroup" : "inline (MMA warps)");
    snprintf(now[8], sizeof now[8], "%s",
             !fm_routes_w4a8_wgmma(r)               ? "registers (mma.sync)"
             : r->w4a8_codes == FM_ROUTE_CODES_SMEM ? "stage ring"
             : r->w4a8_codes == FM_ROUTE_CODES_REGS ? "registers"
                                                    : "ring for 16/32-row tiles or P < 64 E, else registers");
    if (fm_routes_gdn_state(r) == FM_GDN_STATE_SPLIT) snprintf(now[7], sizeof now[7], "states, then outputs");
    else snprintf(now[7], sizeof now[7], "%d warps", fm_routes_gdn_state(r));
    const struct {
        const char *key, *value, *values, *def, *decides, *now;
    } rows[] = {
        {"w4a8.kernel", kernel, "auto|wgmma|mma", "wgmma on sm_90, else mma",
         "the grouped W4A8 GEMM (MoE experts; W4A8 dense projections above the GEMV)", now[0]},
        {"attention.kernel", att, "auto|wgmma|mma", "wgmma on sm_90 (hd 128)",
         "prefill attention: wgmma + TMA (hd 128), else mma.sync flash attention", now[5]},
        {"w4a8.tile", r->w4a8_tile ? tile : "auto", "auto|16|32|64", "16, 32 (wgmma), 64 by P / E",
         "routed rows per tile of the W4A8 MoE GEMM, P pairs over E experts (sizes the workspace)", now[1]},
        {"w4a8.fp4", fp4, "auto|producer|inline", "producer (wgmma)",
         "where the FP4 dispatch's gate|up GEMM expands E2M1 to e4m3: its own warpgroup or the MMA warps", now[6]},
        {"w4a8.codes", codes, "auto|regs|smem", "smem while P < 64 E",
         "how the wgmma W4A8 GEMM's int4 codes reach its warps: registers a group ahead, or the shared-memory ring",
         now[8]},
        {"dense.gemv", switch_name(r->dense_gemv), "auto|on|off", "on",
         "the mma.sync FP8 GEMVs of the dense projections at M <= 16 (W4A8) / w8a8.gemv_max_m (W8A8)", now[2]},
        {"w8a8.gemv_max_m", r->w8a8_gemv_max_m ? maxm : "auto", "auto|1..16", "8",
         "the W8A8 GEMV up to this many rows, cuBLASLt FP8 above", now[3]},
        {"moe.gemv",
         r->moe_gemv < 0 ? "off"
         : r->moe_gemv   ? moe
                         : "auto",
         "auto|off|1..64", "8, or top-k",
         "the experts as grouped W4A8 GEMVs up to this many routed pairs (16-row tiles), the grouped GEMM above",
         now[4]},
        {"router.fused", switch_name(r->router_fused), "auto|on|off", "T = 1",
         "the router GEMV and top-k in one launch (on: T <= 8), else cuBLAS GEMM + route kernel",
         r->router_fused == FM_ROUTE_OFF  ? "off"
         : r->router_fused == FM_ROUTE_ON ? "T <= 8"
                                          : "T = 1"},
        {"pdl", switch_name(r->pdl), "auto|on|off", "on for sm_90+",
         "programmatic dependent launch of the decode kernels (quantizers, GEMVs)", fm_routes_pdl(r) ? "on" : "off"},
        {"decode.graphs", switch_name(r->decode_graphs), "auto|on|off", "on",
         "decode steps captured once per batch bucket as CUDA graphs and replayed",
         fm_routes_decode_graphs(r) ? "on" : "off"},
        {"gdn.tc", switch_name(r->gdn_tc), "auto|on|off", "on",
         "the Gated DeltaNet's chunked prefill on tensor cores (dk = dv = 128, bf16), else token by token",
         r->gdn_tc != FM_ROUTE_OFF ? "dk = dv = 128, bf16" : "off"},
        {"gdn.state", r->gdn_state ? warps : "auto", "auto|4|8|split", "split",
         "the chunked rule's state pass: 4 or 8 warps, or split (states in sequence, outputs in parallel)", now[7]},
        {"rope.store", switch_name(r->rope_store), "auto|on|off", "on",
         "a decode step's k and v stored in the paged cache by the q/k norm + RoPE kernel, else a kv_store launch",
         fm_routes_rope_store(r) ? "on" : "off"},
        {"shared.stream", switch_name(r->shared_stream), "auto|on|off", "on",
         "the shared expert (Qwen3-Next) on a second stream beside the router and the routed experts",
         r->shared_stream == FM_ROUTE_OFF ? "off" : "every pass"},
        {"expert.prefetch", prefetch, "auto|on|off|1..64", "off",
         "experts in host memory: each layer's experts predicted at its start and copied beside its token mixer",
         prefetch_now},
    };
    fprintf(out, "  %-16s %-6s %-17s %-25s %-32s %s\n", "key", "value", "values", "default", "now", "decides");
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        fprintf(out, "  %-16s %-6s %-17s %-25s %-32s %s\n", rows[i].key, rows[i].value, rows[i].values, rows[i].def,
                rows[i].now, rows[i].decides);
}

fm_status fm_routes_check(const char *routes, fm_error *err) {
    fm_routes r;
    fm_routes_default(&r, 0);
    return fm_routes_apply(&r, routes, err);
}
