// Expert parallelism's dispatch on the device (backend/ep_blocks.h, moe_dispatch.cuh): the sending rank's blocks, the
// receiving rank's tile plan and rows (the group quantizers and the tile plan are the routing dispatch's:
// moe_dispatch_device.cuh).
#include <cuda_fp8.h>

#include "backend/cuda/e4m3_tensor.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/ep_blocks.h"
#include "backend/w4a8_workspace.h"

// One block of 1024 threads over the P routed copies in chunks of 1024, in (token, j) order: each copy's index in its
// destination's block (the copies of a warp to one rank ranked by __match_any_sync, the warps' counts scanned per
// rank), its local expert id into that block, ret_row[p]; the blocks' row counts into their headers last.
static __global__ void __launch_bounds__(1024)
    ep_positions_kernel(const int32_t *ids, int64_t P, int32_t el, int32_t N, int64_t cap, uint8_t *send,
                        int64_t dblock, int64_t ids_at, int32_t *ret_row) {
    __shared__ int32_t wcount[32][FM_EP_MAX_RANKS];
    __shared__ int32_t base[FM_EP_MAX_RANKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < FM_EP_MAX_RANKS) base[threadIdx.x] = 0;
    for (int64_t c0 = 0; c0 < P; c0 += 1024) {
        for (int i = threadIdx.x; i < 32 * FM_EP_MAX_RANKS; i += 1024) (&wcount[0][0])[i] = 0;
        __syncthreads();
        const int64_t p = c0 + threadIdx.x;
        const int32_t e = p < P ? ids[p] : -1, d = e >= 0 ? e / el : -1;
        const unsigned same = __match_any_sync(0xffffffffu, d);
        const int rank = __popc(same & ((1u << lane) - 1u));
        if (d >= 0 && rank == 0) wcount[warp][d] = __popc(same);
        __syncthreads();
        if ((int)threadIdx.x < N) {
            int32_t acc = base[threadIdx.x];
            for (int w = 0; w < 32; w++) {
                const int32_t n = wcount[w][threadIdx.x];
                wcount[w][threadIdx.x] = acc;
                acc += n;
            }
            base[threadIdx.x] = acc;
        }
        __syncthreads();
        if (d >= 0) {
            const int32_t pos = wcount[warp][d] + rank;
            ((int32_t *)(send + d * dblock + ids_at))[pos] = e - d * el;
            ret_row[p] = (int32_t)(d * cap + pos);
        }
        __syncthreads();
    }
    if ((int)threadIdx.x < N) {
        int32_t *h = (int32_t *)(send + threadIdx.x * dblock);
        h[0] = base[threadIdx.x], h[1] = 0, h[2] = 0, h[3] = 0;
    }
}

// One warp per (routed copy p, 128-group g): the token's group quantized as the moe's dispatch quantizes it, into
// the copy's row (backend/dispatch_row.h). e4m3: the group's H codes, then its fp32 scale. FP4 (FMT; NVFP4's
// tensor scale, of the ranks' amaxes): its E2M1 pairs, then its block scales (4 UE8M0 or 8 e4m3 bytes) among the row's
// ceil(H / 32 or 16).
// H % 4 == 0 (the launcher checks): whole lanes. FP4 rows are byte-aligned only (their length may be odd): bytes.
template <int FMT>
static __global__ void ep_rows_kernel(const __nv_bfloat16 *x, int64_t H, int32_t k, int64_t P, const int32_t *ret_row,
                                      int64_t cap, uint8_t *send, int64_t dblock, int64_t rows_at, int64_t row_d,
                                      const float *amaxes, int32_t n_ranks) {
    constexpr int BLOCKS = FMT == FM_W4A8_DISPATCH_NV ? 8 : 4; /* FP4 block scales per 128-group */
    const float ts = FMT == FM_W4A8_DISPATCH_NV ? ep_tensor_scale(amaxes, n_ranks) : 1.0f;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < P * G; task += warps) {
        const int64_t p = task / G, g = task % G, c = g * 128 + lane * 4;
        const int32_t rr = ret_row[p];
        uint8_t *row = send + (rr / cap) * dblock + rows_at + (rr % cap) * row_d;
        float v[4];
        load_group(x + (p / k) * H, H, g, v);
        if (FMT == FM_W4A8_DISPATCH_E4M3) {
            float scale, sum;
            const uint32_t word = quantize_group<false>(v, H, g, &scale, &sum);
            if (c < H) *(uint32_t *)(row + c) = word;
            if (lane == 0) *(float *)(row + H + 4 * g) = scale;
        } else {
            uint32_t sc[2], byte;
            const uint32_t codes = quantize_group_fp4<FMT>(v, ts, sc, &byte);
            const int64_t nb = (H + 1) / 2, blocks = (H + 128 / BLOCKS - 1) / (128 / BLOCKS);
            if (c < H) {
                row[c / 2] = (uint8_t)codes;
                row[c / 2 + 1] = (uint8_t)(codes >> 8);
            }
            if (lane < BLOCKS && g * BLOCKS + lane < blocks)
                row[nb + g * BLOCKS + lane] = (uint8_t)(sc[lane / 4] >> (8 * (lane % 4)));
        }
    }
}

// The native format (FM_A_NATIVE: the activations as they are, bf16 or fp32): each copy's row is its token's row.
template <typename A>
static __global__ void ep_native_rows_kernel(const A *x, int64_t H, int32_t k, int64_t P, const int32_t *ret_row,
                                             int64_t cap, uint8_t *send, int64_t dblock, int64_t rows_at,
                                             int64_t row_d) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * H; i += stride) {
        const int64_t p = i / H, c = i % H;
        const int32_t rr = ret_row[p];
        ((A *)(send + (rr / cap) * dblock + rows_at + (rr % cap) * row_d))[c] = x[(p / k) * H + c];
    }
}

static unsigned elem_blocks(int64_t n) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

void fm_cuda_ep_dispatch(const void *x, int64_t T, const int32_t *ids, const fm_ep_layout *L, const float *amaxes,
                         uint8_t *send, int32_t *ret_row, cudaStream_t s) {
    const bool native = L->fmt == FM_A_NATIVE;
    const bool fmt_ok = native || L->fmt == FM_A_E4M3_G128 || L->fmt == FM_A_MXFP4 || L->fmt == FM_A_NVFP4;
    if (!fmt_ok || (!native && L->H % 4) || L->n_ranks > FM_EP_MAX_RANKS) {
        fprintf(stderr,
                "fp8moe: ep_dispatch: %s rows of %lld over %d ranks (the native, e4m3, MXFP4 and NVFP4 dispatch; "
                "H %% 4 == 0 for the quantized ones)\n",
                fm_afmt_name(L->fmt), (long long)L->H, L->n_ranks);
        abort();
    }
    const int64_t P = T * L->k;
    ep_positions_kernel<<<1, 1024, 0, s>>>(ids, P, L->n_experts / L->n_ranks, L->n_ranks, L->cap, send,
                                           (int64_t)L->dblock, (int64_t)L->ids_at, ret_row);
    FM_LAUNCH_CHECK("ep_positions");
    if (P == 0) return;
    if (native) {
        const int64_t db = (int64_t)L->dblock, at = (int64_t)L->rows_at, rd = (int64_t)L->row_d;
        if (L->act_bf16)
            ep_native_rows_kernel<__nv_bfloat16><<<elem_blocks(P * L->H), 256, 0, s>>>(
                (const __nv_bfloat16 *)x, L->H, L->k, P, ret_row, L->cap, send, db, at, rd);
        else
            ep_native_rows_kernel<float><<<elem_blocks(P * L->H), 256, 0, s>>>((const float *)x, L->H, L->k, P, ret_row,
                                                                               L->cap, send, db, at, rd);
        FM_LAUNCH_CHECK("ep_native_rows");
        return;
    }
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    const unsigned grid = warp_blocks(P * fm_ceil_div(L->H, 128));
    const int64_t dblock = (int64_t)L->dblock, rows_at = (int64_t)L->rows_at, row_d = (int64_t)L->row_d;
    switch (fm_w4a8_dispatch_of(L->fmt)) {
    case FM_W4A8_DISPATCH_E4M3:
        ep_rows_kernel<FM_W4A8_DISPATCH_E4M3>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    case FM_W4A8_DISPATCH_MX:
        ep_rows_kernel<FM_W4A8_DISPATCH_MX>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    case FM_W4A8_DISPATCH_NV:
        ep_rows_kernel<FM_W4A8_DISPATCH_NV>
            <<<grid, 256, 0, s>>>(xb, L->H, L->k, P, ret_row, L->cap, send, dblock, rows_at, row_d, amaxes, L->n_ranks);
        break;
    }
    FM_LAUNCH_CHECK("ep_rows");
}

// The receiving rank: place q = s cap + i of the N x cap the blocks hold gets block s's local id of row i, or -1
// past its count (the tile plan skips those).
static __global__ void ep_flatten_kernel(const uint8_t *recv, int64_t NQ, int64_t cap, int64_t dblock, int64_t ids_at,
                                         int32_t *ids) {
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < NQ; q += (int64_t)gridDim.x * blockDim.x) {
        const uint8_t *b = recv + (q / cap) * dblock;
        const int64_t i = q % cap;
        ids[q] = i < *(const int32_t *)b ? ((const int32_t *)(b + ids_at))[i] : -1;
    }
}

// One warp per (place q, 128-group g) of a received row: its codes and scale where the moe's dispatch would have
// quantized them (x8 row slot, zeros past H; xs[g][slot]), with SUMS the group's sum as quantize_group makes it.
template <bool SUMS>
static __global__ void ep_gather_kernel(const uint8_t *recv, int64_t NQ, int64_t H, int64_t cap, int64_t dblock,
                                        int64_t rows_at, int64_t row_d, const int32_t *slot_of_pair, uint8_t *x8,
                                        float *xs, float *xsum) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128, Hp = G * 128;
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < NQ * G; task += warps) {
        const int64_t q = task / G, g = task % G, c = g * 128 + lane * 4;
        const int32_t slot = slot_of_pair[q];
        if (slot < 0) continue; /* warp-uniform: one place per warp */
        const uint8_t *row = recv + (q / cap) * dblock + rows_at + (q % cap) * row_d;
        const uint32_t word = c < H ? *(const uint32_t *)(row + c) : 0u;
        const float scale = *(const float *)(row + H + 4 * g);
        *(uint32_t *)(x8 + slot * Hp + c) = word;
        float sum = 0.0f;
        if (SUMS) {
            for (int i = 0; i < 4; i++) sum += e4m3_decode((word >> (8 * i)) & 0xFFu);
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        }
        if (lane == 0) {
            xs[g * NQ + slot] = scale;
            if (SUMS) xsum[g * NQ + slot] = sum * scale;
        }
    }
}

// An FP4 dispatch's ep_gather_kernel: place q's E2M1 pairs of group g into x8 (the slot's pad128(H) / 2 bytes), its
// block scales as the group's word(s) of xs (fm_dispatch_bufs); NVFP4: the tensor scale (of the ranks' amaxes) where
// the GEMM reads it.
template <int FMT>
static __global__ void ep_gather_fp4_kernel(const uint8_t *recv, int64_t NQ, int64_t H, int64_t cap, int64_t dblock,
                                            int64_t rows_at, int64_t row_d, const int32_t *slot_of_pair, uint8_t *x8,
                                            uint32_t *xs, const float *amaxes, int32_t n_ranks, uint32_t *amax) {
    constexpr int BLOCKS = FMT == FM_W4A8_DISPATCH_NV ? 8 : 4;
    if (FMT == FM_W4A8_DISPATCH_NV && blockIdx.x == 0 && threadIdx.x == 0)
        ((float *)amax)[1] = ep_tensor_scale(amaxes, n_ranks);
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), G = (H + 127) / 128, Hp = G * 128;
    const int64_t nb = (H + 1) / 2, blocks = (H + 128 / BLOCKS - 1) / (128 / BLOCKS);
    for (int64_t task = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); task < NQ * G; task += warps) {
        const int64_t q = task / G, g = task % G, c2 = g * 64 + lane * 2;
        const int32_t slot = slot_of_pair[q];
        if (slot < 0) continue; /* warp-uniform: one place per warp */
        const uint8_t *row = recv + (q / cap) * dblock + rows_at + (q % cap) * row_d;
        const uint32_t codes = c2 < nb ? (uint32_t)row[c2] | (uint32_t)row[c2 + 1] << 8 : 0u;
        *(uint16_t *)(x8 + slot * (Hp / 2) + c2) = (uint16_t)codes;
        const uint32_t byte = lane < BLOCKS && g * BLOCKS + lane < blocks ? row[nb + g * BLOCKS + lane] : 0u;
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < BLOCKS; j++) w[j / 4] |= __shfl_sync(0xffffffffu, byte, j) << (8 * (j % 4));
        if (lane == 0) {
            if (FMT == FM_W4A8_DISPATCH_MX) xs[g * NQ + slot] = w[0];
            else ((uint2 *)xs)[g * NQ + slot] = make_uint2(w[0], w[1]);
        }
    }
}

void fm_cuda_ep_flatten(const uint8_t *recv, const fm_ep_layout *L, int32_t *ids, cudaStream_t s) {
    const int64_t NQ = (int64_t)L->n_ranks * L->cap, blocks = fm_ceil_div(NQ, 256);
    const unsigned grid = (unsigned)(blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024);
    ep_flatten_kernel<<<grid, 256, 0, s>>>(recv, NQ, L->cap, (int64_t)L->dblock, (int64_t)L->ids_at, ids);
    FM_LAUNCH_CHECK("ep_flatten");
}

void fm_cuda_ep_receive(const uint8_t *recv, const fm_ep_layout *L, int32_t E, int32_t tile_rows, const float *amaxes,
                        int32_t *ids, const fm_dispatch_bufs *b, cudaStream_t s) {
    if (E < 1 || E > MAX_EXPERTS || b->fmt != (int32_t)fm_w4a8_dispatch_of(L->fmt) ||
        (L->fmt != FM_A_E4M3_G128 && L->fmt != FM_A_MXFP4 && L->fmt != FM_A_NVFP4)) {
        fprintf(stderr, "fp8moe: ep_receive: %d experts (1..%d), %s rows (the e4m3, MXFP4 and NVFP4 dispatch)\n", E,
                MAX_EXPERTS, fm_afmt_name(L->fmt));
        abort();
    }
    const int64_t NQ = (int64_t)L->n_ranks * L->cap;
    fm_cuda_ep_flatten(recv, L, ids, s);
    fm_cuda_moe_plan(ids, NQ, E, tile_rows, b, false, false, s); /* plain, as the blocks' kernels around it */
    const unsigned qblocks = warp_blocks(NQ * fm_ceil_div(L->H, 128));
    const int64_t dblock = (int64_t)L->dblock, rows_at = (int64_t)L->rows_at, row_d = (int64_t)L->row_d;
    if (b->fmt == FM_W4A8_DISPATCH_MX)
        ep_gather_fp4_kernel<FM_W4A8_DISPATCH_MX>
            <<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair, b->x8,
                                     (uint32_t *)b->xs, amaxes, L->n_ranks, b->amax);
    else if (b->fmt == FM_W4A8_DISPATCH_NV)
        ep_gather_fp4_kernel<FM_W4A8_DISPATCH_NV>
            <<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair, b->x8,
                                     (uint32_t *)b->xs, amaxes, L->n_ranks, b->amax);
    else if (b->xsum)
        ep_gather_kernel<true><<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair,
                                                       b->x8, b->xs, b->xsum);
    else
        ep_gather_kernel<false><<<qblocks, 256, 0, s>>>(recv, NQ, L->H, L->cap, dblock, rows_at, row_d, b->slot_of_pair,
                                                        b->x8, b->xs, NULL);
    FM_LAUNCH_CHECK("ep_gather");
}
