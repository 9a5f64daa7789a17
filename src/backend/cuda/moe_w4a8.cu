// W4A8 expert FFN and dense projections (moe_w4a8.cuh). Scratch comes from the backend's one workspace, laid
// out by src/backend/w4a8_workspace.h (which the memory plan reads too).
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/moe_combine_norm.cuh"
#include "backend/cuda/moe_decode_block.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_w4a8.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/cuda/w4a8_fold_gemv.h"
#include "backend/cuda/w4a8_fold_ws.h"
#include "backend/cuda/w4a8_gemm.cuh"
#include "backend/ep_blocks.h"
#include "backend/w4a8_workspace.h"

// The gate|up GEMM (SwiGLU epilogue: e4m3 h) and the down GEMM (bf16 y, rows of the pairs) over a dispatch's tiles.
static void grouped_gemms(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const fm_dispatch_bufs *bp,
                          int64_t P, int64_t E, uint32_t bn, uint8_t *h, float *hs, float *hsum, __nv_bfloat16 *y) {
    const fm_routes *r = &be->routes;
    const fm_dispatch_bufs b = *bp;
    const int64_t H = down->rows, I = down->cols;
    const fm_w4a8_dispatch fmt = (fm_w4a8_dispatch)b.fmt;
    fm_w4a8_args a;
    memset(&a, 0, sizeof a);
    a.w = gate_up, a.wgmma = fm_routes_w4a8_wgmma(r), a.x = b.x8, a.xs = b.xs, a.xsum = b.xsum, a.lds = P;
    a.codes_staged = fm_routes_w4a8_codes_staged(r, (uint64_t)P, (uint64_t)E), a.pdl = fm_routes_pdl(r);
    a.early_codes = fm_routes_w4a8_early_codes(r); /* the down GEMM's (its tiles the dispatch's: tiles_early) */
    a.tiles = b.tiles, a.n_tiles = b.n_tiles, a.max_tiles = (int64_t)fm_w4a8_max_tiles((uint64_t)P, (uint64_t)E, bn);
    a.tile_rows = (int32_t)bn; /* as the dispatch planned them */
    a.dispatch = fmt, a.xts = b.amax ? (const float *)b.amax + 1 : NULL,
    a.fp4_producer = fm_routes_w4a8_fp4_producer(r, bn);
    a.epilogue = FM_W4A8_OUT_SWIGLU_E4M3, a.h = h, a.ldh = (int64_t)fm_w4a8_pad128((uint64_t)I), a.hs = hs, a.ldhs = P;
    a.hsum = hsum, a.token_scales = b.token_groups; /* route moe.act_scale=token: one scale per token */
    fm_cuda_w4a8_gemm(&a, be->stream);

    a.w = down, a.x = h, a.xs = hs, a.xsum = hsum, a.lds = P, a.dispatch = FM_W4A8_DISPATCH_E4M3, a.xts = NULL;
    a.epilogue = FM_W4A8_OUT_BF16, a.y = y, a.ldy = H, a.row_map = b.pair_of_slot, a.h = NULL, a.hs = NULL,
    a.hsum = NULL, a.token_scales = false;
    a.tiles_early = true; /* the dispatch wrote them two launches back */
    fm_cuda_w4a8_gemm(&a, be->stream);
}

// The same two GEMMs on fold banks (route w4a8.kernel=fold, w4a8_fold_gemm.cu): the gate|up GEMM with one activation
// scale per token (xs_token [P], the slots' rows of x quantized per token) or, where only the dispatch's e4m3 rows
// exist (expert parallelism's received blocks: xs_token NULL), per (token, 128-group); the down GEMM per (slot, 128
// channels), the scales of h the SwiGLU epilogue writes.
static void fold_gemms(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const fm_dispatch_bufs *b,
                       int64_t P, int64_t E, uint32_t bn, const float *xs_token, uint8_t *h, float *hs,
                       __nv_bfloat16 *y) {
    const int64_t H = down->rows, I = down->cols;
    fm_fold_gemm_args a;
    memset(&a, 0, sizeof a);
    a.codes = (const uint8_t *)gate_up->w, a.scales = (const uint16_t *)gate_up->scales, a.rows = gate_up->rows;
    a.rows_pad = gate_up->rows_pad, a.n_groups = gate_up->n_groups, a.interleaved = gate_up->interleaved;
    a.x = b->x8, a.ldx = gate_up->ld, a.ascale = xs_token ? FM_FOLD_PER_TOKEN : FM_FOLD_PER_GROUP;
    a.xs = xs_token ? xs_token : b->xs, a.lds = P;
    a.tiles = (const fm_fold_tile *)b->tiles, a.n_tiles = b->n_tiles;
    a.max_tiles = (int64_t)fm_w4a8_max_tiles((uint64_t)P, (uint64_t)E, bn), a.tile_rows = (int32_t)bn;
    a.out = FM_FOLD_OUT_SWIGLU_E4M3, a.h = h, a.ldh = (int64_t)fm_w4a8_pad128((uint64_t)I), a.hs = hs, a.ldhs = P;
    a.pdl = fm_routes_pdl(&be->routes);
    fm_cuda_w4a8_fold_gemm(&a, be->stream);

    a.codes = (const uint8_t *)down->w, a.scales = (const uint16_t *)down->scales, a.rows = down->rows;
    a.rows_pad = down->rows_pad, a.n_groups = down->n_groups, a.interleaved = down->interleaved;
    a.x = h, a.ldx = down->ld, a.ascale = FM_FOLD_PER_GROUP, a.xs = hs, a.lds = P;
    a.out = FM_FOLD_OUT_BF16, a.y = y, a.ldy = H, a.row_map = b->pair_of_slot, a.h = NULL, a.hs = NULL;
    fm_cuda_w4a8_fold_gemm(&a, be->stream);
}

// Route w4a8.fold_ws (fm_routes_fold_ws): the fold banks' GEMMs at prefill sizes on the warp-specialised kernel
// (w4a8_fold_ws.cu), on the dispatch's tiles of FM_FOLD_WS_TILE_ROWS rows
static bool fold_ws_takes(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, int64_t P, int64_t E,
                          int32_t k) {
    return gate_up->fold && down->fold && gate_up->fold_j && down->fold_j &&
           fm_routes_fold_ws(&be->routes, (uint64_t)P, (uint64_t)E, (uint64_t)k);
}

// ... its two GEMMs: gate|up with one activation scale per token, the SwiGLU into bf16 h16 [P][I]; h quantized per
// token (e4m3 [P][pad128(I)], hs [P]); down per token into y through the row map
static void fold_ws_gemms(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const fm_dispatch_bufs *b,
                          int64_t P, int64_t E, __nv_bfloat16 *h16, uint8_t *h, float *hs, __nv_bfloat16 *y) {
    const int64_t H = down->rows, I = down->cols;
    fm_fold_ws_args a;
    memset(&a, 0, sizeof a);
    a.codes = (const uint8_t *)gate_up->w, a.fold_j = gate_up->fold_j, a.fold_rs = gate_up->fold_rs;
    a.rows = gate_up->rows, a.rows_pad = gate_up->rows_pad, a.n_groups = gate_up->n_groups;
    a.x = b->x8, a.ldx = gate_up->ld, a.slots = P, a.xs = b->xs;
    a.tiles = (const fm_fold_tile *)b->tiles, a.n_tiles = b->n_tiles;
    a.max_tiles = (int64_t)fm_w4a8_max_tiles((uint64_t)P, (uint64_t)E, FM_FOLD_WS_TILE_ROWS);
    a.out = FM_FOLD_WS_OUT_SWIGLU, a.y = h16, a.ldy = I;
    fm_cuda_w4a8_fold_ws_gemm(&a, be->stream);
    fm_cuda_fold_quantize_tokens(h16, I, NULL, 1, P, I, h, down->ld, hs, be->stream);
    a.codes = (const uint8_t *)down->w, a.fold_j = down->fold_j, a.fold_rs = down->fold_rs;
    a.rows = down->rows, a.rows_pad = down->rows_pad, a.n_groups = down->n_groups;
    a.x = h, a.ldx = down->ld, a.xs = hs;
    a.out = FM_FOLD_WS_OUT_BF16, a.y = y, a.ldy = H, a.row_map = b->pair_of_slot;
    fm_cuda_w4a8_fold_ws_gemm(&a, be->stream);
}

// The decode form of fold_gemms (moe.gemv's pairs): the gate|up GEMV on the per-token rows with the SwiGLU into bf16
// h16, h quantized per (slot, 128 channels) as the GEMM's epilogue quantizes it, the down GEMV per group.
static void fold_gemvs(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const fm_dispatch_bufs *b,
                       int64_t P, int64_t max_tiles, int64_t max_rows, __nv_bfloat16 *h16, uint8_t *h, float *hs,
                       __nv_bfloat16 *y) {
    const int64_t H = down->rows, I = down->cols;
    const bool pdl = fm_routes_pdl(&be->routes);
    fm_fold_gemv_args a;
    memset(&a, 0, sizeof a);
    a.codes = (const uint8_t *)gate_up->w, a.scales = (const uint16_t *)gate_up->scales, a.rows = gate_up->rows;
    a.rows_pad = gate_up->rows_pad, a.n_groups = gate_up->n_groups;
    a.x = b->x8, a.ldx = gate_up->ld, a.ascale = FM_FOLD_PER_TOKEN, a.xs = b->xs, a.lds = P;
    a.tiles = (const fm_fold_tile *)b->tiles, a.n_tiles = b->n_tiles, a.max_tiles = max_tiles, a.max_rows = max_rows;
    a.swiglu = true, a.y = h16, a.ldy = I, a.pdl = pdl;
    fm_cuda_w4a8_fold_gemv(&a, be->stream);
    fm_cuda_quantize_e4m3_rows(h16, P, I, h, hs, NULL, P, pdl, be->stream);
    a.codes = (const uint8_t *)down->w, a.scales = (const uint16_t *)down->scales, a.rows = down->rows;
    a.rows_pad = down->rows_pad, a.n_groups = down->n_groups;
    a.x = h, a.ldx = down->ld, a.ascale = FM_FOLD_PER_GROUP, a.xs = hs, a.lds = P;
    a.swiglu = false, a.y = y, a.ldy = H, a.row_map = b->pair_of_slot;
    fm_cuda_w4a8_fold_gemv(&a, be->stream);
}

// The routed rows y [T k][H] weighted into out, or with a tail (decode.fused) into the residual acc and out its norm
static void combine(cuda_backend *be, const __nv_bfloat16 *y, const __nv_bfloat16 *weights, int64_t T, int32_t k,
                    int64_t H, const fm_moe_norm_tail *tail, __nv_bfloat16 *out) {
    if (tail)
        fm_cuda_moe_combine_add_rmsnorm(y, NULL, weights, T, k, H, tail->scratch, tail->acc, tail->norm, tail->eps, out,
                                        tail->out_q, tail->out_qs, fm_routes_pdl(&be->routes), be->stream);
    else fm_cuda_moe_combine(y, NULL, weights, T, k, H, out, fm_routes_pdl(&be->routes), be->stream);
}

bool fm_cuda_moe_w4a8_router_takes(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, int64_t T, int32_t k,
                                   fm_afmt a_dispatch) {
    const int64_t P = T * k;
    return P >= 1 && fm_cuda_w4a8_takes(gate_up->fmt) && fm_cuda_w4a8_takes(down->fmt) && !gate_up->fold &&
           !down->fold && !gate_up->slot_of && fm_w4a8_dispatch_of(a_dispatch) == FM_W4A8_DISPATCH_E4M3 &&
           fm_routes_moe_gemv(&be->routes, (uint64_t)P, (uint64_t)gate_up->n, (uint64_t)k);
}

bool fm_cuda_moe_w4a8_block(cuda_backend *be, const fm_moe_router *router, const fm_bank *gate_up, const fm_bank *down,
                            const __nv_bfloat16 *x, int64_t T, int32_t k, int32_t *ids, __nv_bfloat16 *weights,
                            fm_afmt a_dispatch, fm_afmt a_down, const fm_moe_norm_tail *tail, __nv_bfloat16 *out,
                            const fm_moe_pre *pre) {
    const int64_t E = gate_up->n, H = down->rows, I = down->cols, P = T * k;
    /* the block's pre step reads and writes whole rows 16 bytes at a time (the add_rmsnorm kernel's fast form) */
    const bool aligned =
        !pre ||
        ((((uintptr_t)pre->y | (uintptr_t)pre->norm | (uintptr_t)pre->x | (uintptr_t)(tail ? tail->acc : NULL)) & 15) ==
         0);
    if (!aligned) return false;
    if (!be->block_barrier || !tail || !tail->norm || gate_up->fmt != FM_W_INT4_G128_TC ||
        down->fmt != FM_W_INT4_G128_TC || !gate_up->interleaved || gate_up->fold || down->fold || gate_up->slot_of ||
        down->slot_of || a_dispatch != FM_A_E4M3_G128 || a_down != FM_A_E4M3_G128 || gate_up->rows != 2 * I ||
        gate_up->cols != H || down->n != E ||
        !fm_cuda_moe_decode_block_takes(T, (int32_t)E, k, router->shared, H, I, router->ld))
        return false;
    const fm_routes *r = &be->routes;
    /* the chain it equals is the decode GEMVs' (moe.gemv): where the experts take the grouped GEMM, so does this op */
    if (!fm_routes_moe_gemv(r, (uint64_t)P, (uint64_t)E, (uint64_t)k)) return false;
    /* the decode GEMVs' tile plan for these pairs, for their K slices (the same chains) and the workspace */
    const uint32_t bn = fm_routes_w4a8_moe_tile_rows(r, (uint64_t)P, (uint64_t)E, gate_up->fmt, false,
                                                     (uint64_t)gate_up->rows * (uint64_t)gate_up->cols / 2);
    const fm_w4a8_moe_ws L = fm_w4a8_moe_layout((uint64_t)T, (uint64_t)k, (uint64_t)E, (uint64_t)H, (uint64_t)I, bn,
                                                FM_W4A8_DISPATCH_E4M3, false);
    uint8_t *ws = (uint8_t *)fm_cuda_workspace(be, L.total);
    const int64_t max_tiles = (int64_t)fm_w4a8_max_tiles((uint64_t)P, (uint64_t)E, bn);
    const int32_t gg = fm_routes_gemv_groups(r);
    fm_moe_block_args a;
    memset(&a, 0, sizeof a);
    a.router_w = router->w, a.router_ld = router->ld, a.E = (int32_t)E, a.k = k;
    a.softmax_topk = router->softmax_topk, a.norm_topk = router->norm_topk, a.shared = router->shared;
    a.gu_codes = (const uint8_t *)gate_up->w, a.down_codes = (const uint8_t *)down->w;
    a.gu_scales = gate_up->scales, a.down_scales = down->scales;
    a.gu_rows_pad = gate_up->rows_pad, a.down_rows_pad = down->rows_pad;
    a.gu_groups = gate_up->n_groups, a.down_groups = down->n_groups;
    a.gu_slices = fm_cuda_w4a8_moe_gemv_slices(gate_up, max_tiles, gg);
    a.down_slices = fm_cuda_w4a8_moe_gemv_slices(down, max_tiles, gg);
    a.x = x, a.H = H, a.I = I, a.logits = router->logits, a.ids = ids, a.weights = weights;
    a.acc = tail->acc, a.norm = tail->norm, a.eps = tail->eps, a.out = out, a.out_q = tail->out_q,
    a.out_qs = tail->out_qs;
    a.h16 = (__nv_bfloat16 *)(ws + L.h16), a.y = (__nv_bfloat16 *)(ws + L.y), a.barrier = be->block_barrier;
    if (fm_routes_moe_block_barrier_count(r)) a.counts = be->block_counts, a.count_grids = be->block_count_grids;
    if (pre) a.pre_y = pre->y, a.pre_norm = pre->norm, a.pre_eps = pre->eps, a.pre_x = pre->x;
    if (!fm_combine_row_takes(H, a.y, a.acc, a.norm, a.out)) return false;
    fm_cuda_moe_decode_block(&a, fm_routes_pdl(r), be->stream);
    return true;
}

void fm_cuda_moe_w4a8(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const __nv_bfloat16 *x, int64_t T,
                      const int32_t *ids, const __nv_bfloat16 *weights, int32_t k, fm_afmt a_dispatch,
                      const fm_moe_norm_tail *tail, __nv_bfloat16 *out, const fm_moe_router *router) {
    const int64_t P = T * k, E = gate_up->n, H = down->rows, I = down->cols;
    if (router && !fm_cuda_moe_w4a8_router_takes(be, gate_up, down, T, k, a_dispatch)) {
        fprintf(stderr,
                "fp8moe: moe_w4a8: the router's dispatch of %lld tokens, top-%d, %s rows (the decode GEMVs' "
                "e4m3 rows only)\n",
                (long long)T, k, fm_afmt_name(a_dispatch));
        abort(); /* cu_router_moe asks fm_cuda_moe_w4a8_router_takes first */
    }
    if (P == 0) return;
    const fm_w4a8_dispatch fmt = fm_w4a8_dispatch_of(a_dispatch);
    if (fmt != FM_W4A8_DISPATCH_E4M3 && (gate_up->fmt != FM_W_INT4_G128_TC || down->fmt != FM_W_INT4_G128_TC)) {
        fprintf(stderr,
                "fp8moe: moe_w4a8: --dispatch %s needs int4-tc expert banks (ours, from a float checkpoint); this "
                "model's are %s and %s: use --dispatch fp8\n",
                fm_afmt_name(a_dispatch), fm_wformat_name(gate_up->fmt), fm_wformat_name(down->fmt));
        abort(); /* the backend refuses such banks at load (cuda_bank.cu) */
    }
    if (!fm_cuda_w4a8_takes(gate_up->fmt) || !fm_cuda_w4a8_takes(down->fmt) || !gate_up->interleaved ||
        gate_up->rows != 2 * I || gate_up->cols != H || down->n != E || down->slot_of != gate_up->slot_of) {
        fprintf(stderr,
                "fp8moe: moe_w4a8: banks do not match (gate_up [%d][%lld, %lld] %s, down [%d][%lld, %lld] %s)\n",
                gate_up->n, (long long)gate_up->rows, (long long)gate_up->cols, fm_wformat_name(gate_up->fmt), down->n,
                (long long)down->rows, (long long)down->cols, fm_wformat_name(down->fmt));
        abort();
    }
    const fm_routes *r = &be->routes;
    /* the fold route's warp-specialised GEMMs dispatch in tiles of their own height and keep h in bf16 */
    const bool ws_gemms = fold_ws_takes(be, gate_up, down, P, E, k);
    const uint32_t bn =
        ws_gemms ? FM_FOLD_WS_TILE_ROWS
                 : fm_routes_w4a8_moe_tile_rows(r, (uint64_t)P, (uint64_t)E, gate_up->fmt, fmt != FM_W4A8_DISPATCH_E4M3,
                                                (uint64_t)gate_up->rows * (uint64_t)gate_up->cols / 2);
    const fm_w4a8_moe_ws L =
        fm_w4a8_moe_layout((uint64_t)T, (uint64_t)k, (uint64_t)E, (uint64_t)H, (uint64_t)I, bn, fmt, ws_gemms);
    uint8_t *ws = (uint8_t *)fm_cuda_workspace(be, L.total);
    fm_dispatch_bufs b;
    b.cursor = (int32_t *)(ws + L.cursor); /* L.counts: unused since the plan kernel counts in shared memory */
    b.seg_start = (int32_t *)(ws + L.seg_start), b.n_tiles = (int32_t *)(ws + L.n_tiles);
    b.tiles = (fm_w4a8_tile *)(ws + L.tiles), b.pair_of_slot = (int32_t *)(ws + L.pair_of_slot);
    b.slot_of_pair = (int32_t *)(ws + L.slot_of_pair);
    b.fmt = fmt, b.x8 = ws + L.x, b.xs = (float *)(ws + L.xs);
    b.matrix_of = gate_up->slot_of; /* an expert cache's pool: the slot of each expert (expert_cache.cu) */
    b.amax = (uint32_t *)(ws + L.ts), b.xg = ws + L.xg, b.xgs = (float *)(ws + L.xgs);
    /* route moe.act_scale=token (the grouped GEMM's steps only): one scale per token, written as each group's */
    b.token_groups =
        !gate_up->fold && fm_routes_moe_token_scales(r, (uint64_t)P, (uint64_t)E, (uint64_t)k, gate_up->fmt, down->fmt,
                                                     fmt == FM_W4A8_DISPATCH_E4M3);
    /* the fold GEMM's and GEMV's gate|up input (xs [P]), or the token route's: one scale per token */
    b.per_token = gate_up->fold || b.token_groups;
    const bool fp4 = fmt != FM_W4A8_DISPATCH_E4M3;
    b.xsum = gate_up->fmt == FM_W_INT4_ZP_TC ? (float *)(ws + L.xsum) : NULL;
    uint8_t *h = ws + L.h;
    /* the last 128-group of h has columns no CTA writes: they must read as zero (the grouped dispatch zeroes them) */
    b.h = I % 128 ? h : NULL, b.h_cols = I;
    float *hs = (float *)(ws + L.hs);
    float *hsum = down->fmt == FM_W_INT4_ZP_TC ? (float *)(ws + L.hsum) : NULL;
    __nv_bfloat16 *y = (__nv_bfloat16 *)(ws + L.y);

    if (gate_up->fold != down->fold || (gate_up->fold && fp4)) {
        fprintf(stderr, "fp8moe: moe_w4a8: fold banks (gate_up %d, down %d) need each other and e4m3 rows\n",
                (int)gate_up->fold, (int)down->fold);
        abort(); /* cuda_bank_fold.cu lays out every expert bank of a load alike and refuses an FP4 dispatch */
    }
    if (fm_routes_moe_gemv(r, (uint64_t)P, (uint64_t)E, (uint64_t)k)) {
        /* decode: the dispatch in one block, then each tile's expert streams through a GEMV; h in bf16, quantized as
           the grouped GEMM's epilogue quantizes it (per slot and 128 channels; the quantizer writes whole groups), by
           a launch of its own or (moe.down_quant=fused) by the down GEMV as it stages its rows. Every bank kind and
           dispatch format takes either: h is e4m3 1x128 whatever x was, with group sums for int4-zp-tc banks. */
        const bool pdl = fm_routes_pdl(r);
        const int32_t gg = fm_routes_gemv_groups(r);
        if (router) /* the router's last CTA routes, then dispatches (route moe.dispatch=fused) */
            fm_cuda_router_dispatch(router->w, router->ld, (int32_t)E, H, x, T, k, router->softmax_topk,
                                    router->norm_topk, router->shared, router->logits, (int32_t *)ids,
                                    (__nv_bfloat16 *)weights, router->counter, (int32_t)bn, &b, pdl, be->stream);
        else fm_cuda_moe_dispatch_small(x, T, H, ids, k, (int32_t)E, (int32_t)bn, &b, pdl, be->stream);
        const int64_t max_tiles = (int64_t)fm_w4a8_max_tiles((uint64_t)P, (uint64_t)E, bn);
        /* an expert gets at most one row per token (a token's top-k experts are distinct): T rows per tile at most */
        const int64_t max_rows = T < (int64_t)bn ? T : (int64_t)bn;
        __nv_bfloat16 *h16 = (__nv_bfloat16 *)(ws + L.h16);
        if (gate_up->fold) { /* fold banks: their own GEMVs, on the dispatch's per-token rows */
            fold_gemvs(be, gate_up, down, &b, P, max_tiles, max_rows, h16, h, hs, y);
            combine(be, y, weights, T, k, H, tail, out);
            return;
        }
        /* an FP4 dispatch: the GEMV reads the e4m3 expansion the dispatch wrote beside the codes (xg, xgs) */
        fm_cuda_w4a8_moe_gemv(gate_up, b.tiles, b.n_tiles, max_tiles, max_rows, fp4 ? b.xg : b.x8, fp4 ? b.xgs : b.xs,
                              b.xsum, P, true, NULL, h16, I, NULL, gg, pdl, be->stream);
        /* moe.combine=fused: the fused tail (moe_add_rmsnorm) in the down GEMV's last CTA of each token, on the
           counters after the dense GEMV's (cuda_internal.cuh) */
        const bool in_gemv = tail && fm_routes_moe_combine_fused(r) && be->tail_counter && T <= FM_MOE_GEMV_MAX_PAIRS &&
                             fm_combine_row_takes(H, y, tail->acc, tail->norm, out);
        fm_moe_gemv_tail tt = {be->tail_counter + 1, weights, k, NULL, NULL, 0.0f, out};
        if (in_gemv) tt.acc = tail->acc, tt.norm = tail->norm, tt.eps = tail->eps;
        if (fm_routes_moe_down_quant_fused(r)) {
            fm_cuda_w4a8_moe_gemv_bf16(down, b.tiles, b.n_tiles, max_tiles, max_rows, h16, b.pair_of_slot, y, H,
                                       in_gemv ? &tt : NULL, gg, pdl, be->stream);
        } else {
            fm_cuda_quantize_e4m3_rows(h16, P, I, h, hs, hsum, P, pdl, be->stream);
            fm_cuda_w4a8_moe_gemv(down, b.tiles, b.n_tiles, max_tiles, max_rows, h, hs, hsum, P, false, b.pair_of_slot,
                                  y, H, in_gemv ? &tt : NULL, gg, pdl, be->stream);
        }
        if (!in_gemv) combine(be, y, weights, T, k, H, tail, out);
        else if (tail->out_q) /* the GEMV's tail writes bf16 rows only */
            fm_cuda_quantize_e4m3_rows(out, T, H, tail->out_q, tail->out_qs, NULL, T, pdl, be->stream);
        return;
    }
    /* no memset before it (a graph node would break the PDL chain): the dispatch needs nothing zeroed */
    fm_cuda_moe_dispatch(x, T, H, ids, k, (int32_t)E, (int32_t)bn, &b, fm_routes_moe_plan_slots(r), fm_routes_pdl(r),
                         be->stream); /* fold: per-token */
    if (ws_gemms) {
        fold_ws_gemms(be, gate_up, down, &b, P, E, (__nv_bfloat16 *)(ws + L.h16), h, hs, y);
    } else if (gate_up->fold) {
        fold_gemms(be, gate_up, down, &b, P, E, bn, b.xs, h, hs, y);
    } else {
        grouped_gemms(be, gate_up, down, &b, P, E, bn, h, hs, hsum, y);
    }
    combine(be, y, weights, T, k, H, tail, out);
}

// Expert parallelism: this rank's experts on its received blocks (backend/ep_blocks.h) in the dispatch format (e4m3,
// or FP4 on int4-tc banks, as fm_cuda_moe_w4a8 takes them; amaxes: NVFP4's, every rank's amax); y rows land in the
// return blocks' places (pair q = s cap + i is row q of yret).
void fm_cuda_moe_w4a8_blocks(cuda_backend *be, const fm_ep_layout *Lb, const fm_bank *gate_up, const fm_bank *down,
                             const uint8_t *recv, const float *amaxes, __nv_bfloat16 *yret) {
    const int64_t P = (int64_t)Lb->n_ranks * Lb->cap, E = gate_up->n, H = down->rows, I = down->cols;
    const fm_w4a8_dispatch fmt = fm_w4a8_dispatch_of(Lb->fmt);
    const bool fp4 = fmt != FM_W4A8_DISPATCH_E4M3;
    const bool rows_ok =
        Lb->fmt == FM_A_E4M3_G128 || (fp4 && gate_up->fmt == FM_W_INT4_G128_TC && down->fmt == FM_W_INT4_G128_TC);
    if (!fm_cuda_w4a8_takes(gate_up->fmt) || !fm_cuda_w4a8_takes(down->fmt) || !gate_up->interleaved ||
        gate_up->rows != 2 * I || gate_up->cols != H || down->n != E || !rows_ok || Lb->H != H) {
        fprintf(stderr,
                "fp8moe: moe_blocks: banks %s / %s and %s rows do not match (the W4A8 experts: e4m3 rows, or FP4 rows "
                "on int4-tc banks)\n",
                fm_wformat_name(gate_up->fmt), fm_wformat_name(down->fmt), fm_afmt_name(Lb->fmt));
        abort();
    }
    const uint32_t bn = fm_routes_w4a8_moe_tile_rows(&be->routes, (uint64_t)P, (uint64_t)E, gate_up->fmt, fp4,
                                                     (uint64_t)gate_up->rows * (uint64_t)gate_up->cols / 2);
    const fm_w4a8_moe_ws L = fm_w4a8_moe_layout((uint64_t)P, 1, (uint64_t)E, (uint64_t)H, (uint64_t)I, bn, fmt, false);
    uint8_t *ws = (uint8_t *)fm_cuda_workspace(be, L.total + fm_w4a8_align((uint64_t)P * 4));
    fm_dispatch_bufs b;
    memset(&b, 0, sizeof b);
    b.cursor = (int32_t *)(ws + L.cursor);
    b.seg_start = (int32_t *)(ws + L.seg_start), b.n_tiles = (int32_t *)(ws + L.n_tiles);
    b.tiles = (fm_w4a8_tile *)(ws + L.tiles), b.pair_of_slot = (int32_t *)(ws + L.pair_of_slot);
    b.slot_of_pair = (int32_t *)(ws + L.slot_of_pair);
    b.fmt = fmt, b.x8 = ws + L.x, b.xs = (float *)(ws + L.xs), b.matrix_of = gate_up->slot_of;
    b.amax = fmt == FM_W4A8_DISPATCH_NV ? (uint32_t *)(ws + L.ts) : NULL; /* [1]: the tensor scale the GEMM reads */
    b.xsum = gate_up->fmt == FM_W_INT4_ZP_TC ? (float *)(ws + L.xsum) : NULL;
    uint8_t *h = ws + L.h;
    b.h = I % 128 ? h : NULL, b.h_cols = I; /* the pad of each slot's row of h zeroed by the plan (as above) */
    float *hs = (float *)(ws + L.hs);
    float *hsum = down->fmt == FM_W_INT4_ZP_TC ? (float *)(ws + L.hsum) : NULL;
    int32_t *ids = (int32_t *)(ws + L.total); /* each place's local expert, -1 where empty */
    fm_cuda_ep_receive(recv, Lb, (int32_t)E, (int32_t)bn, amaxes, ids, &b, be->stream);
    if (gate_up->fold) fold_gemms(be, gate_up, down, &b, P, E, bn, NULL, h, hs, yret); /* e4m3 1x128 rows only */
    else grouped_gemms(be, gate_up, down, &b, P, E, bn, h, hs, hsum, yret);
}

extern "C" bool fm_cuda_moe_dispatch_read(fm_backend *bb, int64_t T, int32_t k, int32_t E, int64_t H, int64_t I,
                                          uint8_t *codes, uint8_t *scales, float *tensor_scale) {
    if (!fm_cuda_backend_stream(bb)) return false;
    cuda_backend *be = cuda_be(bb);
    const fm_w4a8_dispatch fmt = fm_w4a8_dispatch_of(bb->plan.a_dispatch);
    /* e4m3 rows are read only in the fold banks' per-token form */
    const bool tok = fmt == FM_W4A8_DISPATCH_E4M3 && fm_routes_w4a8_fold(&be->routes);
    if ((fmt == FM_W4A8_DISPATCH_E4M3 && !tok) || !be->work) return false;
    const int64_t P = T * k, Hp = (int64_t)fm_w4a8_pad128((uint64_t)H), G = tok ? 1 : Hp / 128;
    const int64_t sb = fmt == FM_W4A8_DISPATCH_NV ? 8 : 4; /* scale bytes per group (per token: one fp32) */
    const int64_t cb = tok ? Hp : Hp / 2;                  /* code bytes per row */
    /* an FP4 dispatch runs on int4-tc banks only, as fold banks are: the tile rows fm_cuda_moe_w4a8 took */
    /* the tiles fm_cuda_moe_w4a8 took (fold banks: the warp-specialised GEMMs' where the route takes them) */
    const bool ws_gemms = tok && fm_routes_fold_ws(&be->routes, (uint64_t)P, (uint64_t)E, (uint64_t)k);
    const uint32_t bn = ws_gemms ? FM_FOLD_WS_TILE_ROWS
                                 : fm_routes_w4a8_moe_tile_rows(&be->routes, (uint64_t)P, (uint64_t)E,
                                                                FM_W_INT4_G128_TC, !tok, (uint64_t)(2 * I * H / 2));
    const fm_w4a8_moe_ws L =
        fm_w4a8_moe_layout((uint64_t)T, (uint64_t)k, (uint64_t)E, (uint64_t)H, (uint64_t)I, bn, fmt, ws_gemms);
    const uint8_t *ws = (const uint8_t *)be->work;
    int32_t *slot = (int32_t *)malloc((size_t)P * 4);
    uint8_t *c = (uint8_t *)malloc((size_t)(P * cb)), *s = (uint8_t *)malloc((size_t)(G * P * sb));
    uint32_t ts[2] = {0, 0x3F800000u};
    FM_CUDA_CHECK(cudaStreamSynchronize(be->stream));
    FM_CUDA_CHECK(cudaMemcpy(slot, ws + L.slot_of_pair, (size_t)P * 4, cudaMemcpyDeviceToHost));
    FM_CUDA_CHECK(cudaMemcpy(c, ws + L.x, (size_t)(P * cb), cudaMemcpyDeviceToHost));
    FM_CUDA_CHECK(cudaMemcpy(s, ws + L.xs, (size_t)(G * P * sb), cudaMemcpyDeviceToHost));
    if (fmt == FM_W4A8_DISPATCH_NV) FM_CUDA_CHECK(cudaMemcpy(ts, ws + L.ts, 8, cudaMemcpyDeviceToHost));
    for (int64_t p = 0; p < P; p++) {
        memcpy(codes + p * cb, c + (int64_t)slot[p] * cb, (size_t)cb);
        for (int64_t g = 0; g < G; g++) memcpy(scales + (p * G + g) * sb, s + (g * P + slot[p]) * sb, (size_t)sb);
    }
    memcpy(tensor_scale, &ts[1], 4);
    free(slot), free(c), free(s);
    return true;
}

void fm_cuda_w4a8_linear_gemm(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *x8, const float *xs,
                              const float *xsum, int64_t M, __nv_bfloat16 *y) {
    /* a dense MLP's gate|up bank is interleaved for the SwiGLU epilogue: only the GEMM's epilogue writes its rows back
       in order, so it takes that bank at every M (the GEMV reads plain row tiles) */
    if (!w->interleaved && fm_routes_dense_kernel(&be->routes, w->fmt, M, w->cols) == FM_DK_W4A8_GEMV) {
        fm_cuda_w4a8_gemv(w, idx, x8, xs, xsum, M, M, y, fm_routes_gemv_groups(&be->routes), fm_routes_pdl(&be->routes),
                          be->stream);
        return;
    }
    fm_w4a8_args a;
    memset(&a, 0, sizeof a);
    a.w = w, a.wgmma = fm_routes_w4a8_wgmma(&be->routes), a.x = x8, a.xs = xs, a.xsum = xsum, a.lds = M;
    a.codes_staged = fm_routes_w4a8_codes_staged(&be->routes, (uint64_t)M, 1), a.pdl = fm_routes_pdl(&be->routes);
    a.early_codes = fm_routes_w4a8_early_codes(&be->routes); /* dense tiling: every tile known before the wait */
    a.m_dense = M, a.dense_matrix = idx, a.max_tiles = fm_ceil_div(M, FM_W4A8_BN);
    a.epilogue = FM_W4A8_OUT_BF16, a.y = y, a.ldy = w->rows;
    /* route w4a8.splits: K over a cluster of CTAs a tile (the wgmma kernel's; the mma.sync kernel runs all of K) */
    if (a.wgmma && !w->interleaved)
        a.splits = fm_routes_w4a8_splits(&be->routes, w->n_groups, fm_ceil_div(w->rows_pad, 256) * a.max_tiles,
                                         fm_cuda_device_attr(cudaDevAttrMultiProcessorCount));
    fm_cuda_w4a8_gemm(&a, be->stream);
}

// The workspace's e4m3 rows of a dense W4A8 linear's input [M][w->cols] (fm_w4a8_linear_ws_bytes): codes x8
// [M][pad128 K], scales xs [group][M], and for an int4-zp-tc bank the group sums xsum after them (else NULL)
void fm_cuda_w4a8_linear_rows(cuda_backend *be, const fm_bank *w, int64_t M, uint8_t **x8, float **xs, float **xsum) {
    const int64_t K = w->cols, Kp = (int64_t)fm_w4a8_pad128((uint64_t)K);
    uint8_t *ws = (uint8_t *)fm_cuda_workspace(be, fm_w4a8_linear_ws_bytes((uint64_t)M, (uint64_t)K));
    *x8 = ws;
    *xs = (float *)(ws + fm_w4a8_align((uint64_t)(M * Kp)));
    *xsum = w->fmt == FM_W_INT4_ZP_TC ? *xs + fm_w4a8_align((uint64_t)(Kp / 128 * M * 4)) / 4 : NULL;
}

void fm_cuda_linear_w4a8_from_rows(cuda_backend *be, const fm_bank *w, int32_t idx, const uint8_t *x8, const float *xs,
                                   const float *xsum, int64_t M, __nv_bfloat16 *y, const fm_row_tail *tail) {
    if (tail)
        fm_cuda_w4a8_gemv_add_rmsnorm(w, idx, x8, xs, xsum, M, M, y, tail, fm_routes_gemv_groups(&be->routes),
                                      fm_routes_pdl(&be->routes), be->stream);
    else fm_cuda_w4a8_linear_gemm(be, w, idx, x8, xs, xsum, M, y);
}

// tail: NULL, or the add + RMSNorm the decode GEMV's last CTA runs (fm_cuda_linear_w4a8_tail checked it)
static void linear_w4a8(cuda_backend *be, const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                        __nv_bfloat16 *y, const fm_row_tail *tail) {
    if (M == 0) return;
    const bool pdl = fm_routes_pdl(&be->routes);
    /* route dense.quant=fused: the GEMV quantizes x itself where it takes these rows (the branch of
       fm_cuda_w4a8_linear_gemm below, and every caller that passes a tail) */
    if (fm_routes_dense_quant_fused(&be->routes) && !w->interleaved &&
        fm_routes_dense_kernel(&be->routes, w->fmt, M, w->cols) == FM_DK_W4A8_GEMV) {
        fm_cuda_w4a8_gemv_bf16(w, idx, x, M, y, tail, fm_routes_gemv_groups(&be->routes), pdl, be->stream);
        return;
    }
    uint8_t *x8;
    float *xs, *xsum;
    fm_cuda_w4a8_linear_rows(be, w, M, &x8, &xs, &xsum);
    fm_cuda_quantize_e4m3_rows(x, M, w->cols, x8, xs, xsum, M, pdl, be->stream);
    fm_cuda_linear_w4a8_from_rows(be, w, idx, x8, xs, xsum, M, y, tail);
}

void fm_cuda_linear_w4a8(cuda_backend *be, const fm_bank *w, int32_t idx, const __nv_bfloat16 *x, int64_t M,
                         __nv_bfloat16 *y) {
    linear_w4a8(be, w, idx, x, M, y, NULL);
}

bool fm_cuda_linear_w4a8_tail(cuda_backend *be, const fm_bank *w, int64_t M, __nv_bfloat16 *y, __nv_bfloat16 *acc,
                              const __nv_bfloat16 *norm, float eps, __nv_bfloat16 *out, fm_row_tail *tail) {
    /* the GEMV's rows only, where fm_cuda_w4a8_linear_gemm would take the GEMV (an interleaved bank never does) */
    if (M < 1 || M > FM_GEMV_FP8_MAX_M || !be->tail_counter || w->interleaved || /* one chunk: the tail's counter */
        fm_routes_dense_kernel(&be->routes, w->fmt, M, w->cols) != FM_DK_W4A8_GEMV ||
        !fm_row_tail_takes(w->rows, y, acc, norm, out))
        return false;
    *tail = (fm_row_tail){be->tail_counter, acc, norm, eps, out};
    return true;
}

bool fm_cuda_linear_w4a8_add_rmsnorm(cuda_backend *be, const fm_bank *w, const __nv_bfloat16 *x, int64_t M,
                                     __nv_bfloat16 *y, __nv_bfloat16 *acc, const __nv_bfloat16 *norm, float eps,
                                     __nv_bfloat16 *out) {
    fm_row_tail tail;
    if (!fm_cuda_linear_w4a8_tail(be, w, M, y, acc, norm, eps, out, &tail)) return false;
    linear_w4a8(be, w, 0, x, M, y, &tail);
    return true;
}
