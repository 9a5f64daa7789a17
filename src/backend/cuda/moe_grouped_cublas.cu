// Grouped MoE through cuBLAS (see moe_grouped_cublas.cuh), with no host synchronisation (graph-safe):
//
//   1. count the routed pairs per expert (atomics); one block turns the counts into segment starts, each expert's
//      segment padded to whole tiles of tile_rows rows (moe_grouped_workspace.h, from P and E alone), and writes the
//      pointer arrays of both GEMMs: tile j computes rows [j * tile_rows, (j + 1) * tile_rows) with its expert's
//      matrix; the tiles past the used ones take expert 0 and their own padding rows (computed, never read)
//   2. scatter: each pair p = t*k + j takes a slot in its expert's segment (order inside a segment does not
//      matter: every row is computed independently, and the combine reads rows by pair), gather x rows
//   3. gate|up, SwiGLU, down: two batched GEMMs of max_tiles equal shapes, cuBLAS bf16 -> fp32 -> bf16
//   4. combine: out[t] = sum_j w[t, j] * y[slot(t, j)] in j order, fp32, one bf16 rounding
// The bf16 roundings match the per-token path and the CPU reference, so the three compute the same function.
// fp32 banks (the ref32 oracle) take the same route with fp32 activations and SGEMMs (no rounding at all).
// The cost of equal shapes: at most E padded tiles per GEMM (tile rows follow the average rows per expert).
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_dispatch.cuh"
#include "backend/cuda/moe_grouped_cublas.cuh"
#include "backend/ep_blocks.h"
#include "backend/moe_grouped_workspace.h"

typedef __nv_bfloat16 bf16;

// (an id of -1: an empty place of expert parallelism's received blocks, skipped here and by the scatter)
static __global__ void count_kernel(const int32_t *ids, int64_t P, int32_t *counts) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
        if (ids[p] >= 0) atomicAdd(&counts[ids[p]], 1);
}

// The pointers of one batched GEMM y = x W^T per tile: A the expert's matrix, B the tile's input rows, C its output
typedef struct gemm_ptrs {
    const void **a, **b;
    void **c;
    const char *w; // bank values
    size_t w_mat;  // bytes per matrix
    const char *x;
    size_t x_row; // bytes per input row
    char *y;
    size_t y_row;
} gemm_ptrs;

// One block: segment row starts from the counts (thread 0, E is small), then the tiles' pointers of both GEMMs
static __global__ void plan_kernel(const int32_t *counts, int32_t E, int64_t tile_rows, int64_t max_tiles,
                                   int32_t *seg_row, int32_t *fill, gemm_ptrs g1, gemm_ptrs g2) {
    extern __shared__ int32_t tile_start[]; // [E + 1]
    if (threadIdx.x == 0) {
        int32_t t = 0;
        for (int32_t e = 0; e < E; e++) {
            tile_start[e] = t;
            seg_row[e] = (int32_t)(t * tile_rows);
            t += (int32_t)((counts[e] + tile_rows - 1) / tile_rows);
        }
        tile_start[E] = t;
    }
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < max_tiles; j += blockDim.x) {
        int32_t e = 0;           // a tile past the used ones: expert 0 on its own padding rows
        if (j < tile_start[E]) { // the last expert whose first tile is at or before j
            int32_t lo = 0, hi = E - 1;
            while (lo < hi) {
                const int32_t mid = (lo + hi + 1) / 2;
                if (tile_start[mid] <= j) lo = mid;
                else hi = mid - 1;
            }
            e = lo;
        }
        const int64_t row = j * tile_rows;
        g1.a[j] = g1.w + (size_t)e * g1.w_mat, g1.b[j] = g1.x + (size_t)row * g1.x_row,
        g1.c[j] = g1.y + (size_t)row * g1.y_row;
        g2.a[j] = g2.w + (size_t)e * g2.w_mat, g2.b[j] = g2.x + (size_t)row * g2.x_row,
        g2.c[j] = g2.y + (size_t)row * g2.y_row;
    }
}

// slot_of[p] = seg_row[e] + (arrival order within e); -1 for an empty place (id -1)
static __global__ void scatter_kernel(const int32_t *ids, int64_t P, const int32_t *seg_row, int32_t *fill,
                                      int32_t *slot_of) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = ids[p];
        slot_of[p] = e >= 0 ? seg_row[e] + atomicAdd(&fill[e], 1) : -1;
    }
}

template <typename A>
static __global__ void gather_kernel(const A *x, int64_t P, int32_t k, int64_t H, const int32_t *slot_of, A *xs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i / H, c = i % H;
        xs[(int64_t)slot_of[p] * H + c] = x[(p / k) * H + c];
    }
}

static unsigned blocks_for(int64_t n) {
    const int64_t b = fm_ceil_div(n, 256);
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

static gemm_ptrs ptrs_for(const fm_bank *w, void **arrays, int64_t max_tiles, const char *x, char *y) {
    const size_t esz = bank_elem_size(w);
    gemm_ptrs g;
    g.a = (const void **)arrays, g.b = (const void **)(arrays + max_tiles), g.c = arrays + 2 * max_tiles;
    g.w = (const char *)w->w, g.w_mat = (size_t)(w->rows * w->ld) * esz;
    g.x = x, g.x_row = (size_t)w->cols * esz;
    g.y = y, g.y_row = (size_t)w->rows * esz;
    return g;
}

// y [tile] = x [tile] W_e^T for every tile, one batched call of equal shapes
static void batched_gemm(cuda_backend *be, const fm_bank *w, const gemm_ptrs *g, int64_t tile_rows, int64_t max_tiles) {
    const cudaDataType dtype = w->fmt == FM_W_F32 ? CUDA_R_32F : CUDA_R_16BF;
    const float alpha = 1.0f, beta = 0.0f;
    FM_CUBLAS_CHECK(cublasGemmBatchedEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)tile_rows,
                                        (int)w->cols, &alpha, (const void *const *)g->a, dtype, (int)w->ld,
                                        (const void *const *)g->b, dtype, (int)w->cols, &beta, (void *const *)g->c,
                                        dtype, (int)w->rows, (int)max_tiles, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The workspace of one grouped MoE over P routed pairs (moe_grouped_workspace.h), extra bytes after it
typedef struct grouped_run {
    fm_grouped_ws L;
    char *ws, *xs, *gu, *h, *y;
    int32_t *counts, *fill, *seg_row, *slot_of;
    gemm_ptrs g1, g2;
    int64_t tile_rows, max_tiles;
} grouped_run;

static grouped_run grouped_setup(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, int64_t P,
                                 uint64_t extra) {
    grouped_run r;
    r.L = fm_grouped_layout((uint64_t)P, (uint64_t)gate_up->n, (uint64_t)down->rows, (uint64_t)down->cols,
                            bank_elem_size(gate_up));
    char *ws = r.ws = (char *)fm_cuda_workspace(be, r.L.total + extra);
    r.counts = (int32_t *)(ws + r.L.counts), r.fill = (int32_t *)(ws + r.L.fill);
    r.seg_row = (int32_t *)(ws + r.L.seg_row), r.slot_of = (int32_t *)(ws + r.L.slot_of);
    r.xs = ws + r.L.xs, r.gu = ws + r.L.gu, r.h = ws + r.L.h, r.y = ws + r.L.y;
    r.tile_rows = (int64_t)r.L.tile_rows, r.max_tiles = (int64_t)r.L.max_tiles;
    void **arrays = (void **)(ws + r.L.ptrs);
    r.g1 = ptrs_for(gate_up, arrays, r.max_tiles, r.xs, r.gu);
    r.g2 = ptrs_for(down, arrays + 3 * r.max_tiles, r.max_tiles, r.h, r.y);
    return r;
}

// Steps 1-2 without the gather: each pair's slot in its expert's tiles (ids of -1 skipped), the GEMMs' pointers
static void grouped_plan(cuda_backend *be, const grouped_run *r, const int32_t *ids, int64_t P, int32_t E) {
    FM_CUDA_CHECK(cudaMemsetAsync(r->counts, 0, (size_t)E * sizeof(int32_t), be->stream));
    count_kernel<<<blocks_for(P), 256, 0, be->stream>>>(ids, P, r->counts);
    FM_LAUNCH_CHECK("moe_count");
    plan_kernel<<<1, 256, (size_t)(E + 1) * sizeof(int32_t), be->stream>>>(r->counts, E, r->tile_rows, r->max_tiles,
                                                                           r->seg_row, r->fill, r->g1, r->g2);
    FM_LAUNCH_CHECK("moe_plan");
    scatter_kernel<<<blocks_for(P), 256, 0, be->stream>>>(ids, P, r->seg_row, r->fill, r->slot_of);
    FM_LAUNCH_CHECK("moe_scatter");
}

// Step 3: gate|up, SwiGLU, down over every tile
static void grouped_ffn(cuda_backend *be, const grouped_run *r, const fm_bank *gate_up, const fm_bank *down) {
    const int64_t I = down->cols;
    batched_gemm(be, gate_up, &r->g1, r->tile_rows, r->max_tiles);
    /* over every row, padding too: rows are independent, and a tile's padding rows are never read */
    const int64_t R = (int64_t)r->L.rows;
    if (gate_up->fmt == FM_W_F32)
        fm_cuda_swiglu_f32((const float *)r->gu, R, I, (float *)r->h, fm_routes_pdl(&be->routes), be->stream);
    else fm_cuda_swiglu((const bf16 *)r->gu, R, I, (bf16 *)r->h, fm_routes_pdl(&be->routes), be->stream);
    batched_gemm(be, down, &r->g2, r->tile_rows, r->max_tiles);
}

void fm_cuda_moe_grouped_cublas(cuda_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                                const int32_t *ids, const void *weights, int32_t k, void *out) {
    const int64_t P = T * k, H = down->rows;
    if (P == 0) return;
    const bool f32 = gate_up->fmt == FM_W_F32;
    const grouped_run r = grouped_setup(be, gate_up, down, P, 0);
    grouped_plan(be, &r, ids, P, gate_up->n);
    if (f32)
        gather_kernel<<<blocks_for(P * H), 256, 0, be->stream>>>((const float *)x, P, k, H, r.slot_of, (float *)r.xs);
    else gather_kernel<<<blocks_for(P * H), 256, 0, be->stream>>>((const bf16 *)x, P, k, H, r.slot_of, (bf16 *)r.xs);
    FM_LAUNCH_CHECK("moe_gather");
    grouped_ffn(be, &r, gate_up, down);
    if (f32)
        fm_cuda_moe_combine_f32((const float *)r.y, r.slot_of, (const float *)weights, T, k, H, (float *)out,
                                fm_routes_pdl(&be->routes), be->stream);
    else
        fm_cuda_moe_combine((const bf16 *)r.y, r.slot_of, (const bf16 *)weights, T, k, H, (bf16 *)out,
                            fm_routes_pdl(&be->routes), be->stream);
}

// Expert parallelism: the received blocks' native rows (row q of block q / cap) into their slots, and each computed
// row back to its place q of the return blocks (rows of H activations, as one array of N x cap rows)
template <typename A>
static __global__ void gather_blocks_kernel(const uint8_t *recv, int64_t NQ, int64_t H, int64_t cap, int64_t dblock,
                                            int64_t rows_at, int64_t row_d, const int32_t *slot_of, A *xs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < NQ * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = i / H, c = i % H;
        const int32_t s = slot_of[q];
        if (s >= 0) xs[(int64_t)s * H + c] = ((const A *)(recv + (q / cap) * dblock + rows_at + (q % cap) * row_d))[c];
    }
}

template <typename A>
static __global__ void put_rows_kernel(const A *y, const int32_t *slot_of, int64_t NQ, int64_t H, A *yret) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < NQ * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t s = slot_of[i / H];
        if (s >= 0) yret[i] = y[(int64_t)s * H + i % H];
    }
}

void fm_cuda_moe_grouped_cublas_blocks(cuda_backend *be, const fm_ep_layout *Lb, const fm_bank *gate_up,
                                       const fm_bank *down, const uint8_t *recv, void *yret) {
    const int64_t P = (int64_t)Lb->n_ranks * Lb->cap, H = down->rows;
    const bool f32 = gate_up->fmt == FM_W_F32;
    if (Lb->fmt != FM_A_NATIVE || Lb->act_bf16 == f32 || Lb->H != H || gate_up->cols != H) {
        fprintf(stderr, "fp8moe: moe_blocks: %s rows (%s activations) on %s banks\n", fm_afmt_name(Lb->fmt),
                Lb->act_bf16 ? "bf16" : "fp32", fm_wformat_name(gate_up->fmt));
        abort();
    }
    if (P == 0) return;
    const grouped_run r = grouped_setup(be, gate_up, down, P, fm_grouped_align((uint64_t)P * 4));
    int32_t *ids = (int32_t *)(r.ws + r.L.total); /* each place's local expert, -1 where empty */
    const int64_t db = (int64_t)Lb->dblock, at = (int64_t)Lb->rows_at, rd = (int64_t)Lb->row_d;
    fm_cuda_ep_flatten(recv, Lb, ids, be->stream);
    grouped_plan(be, &r, ids, P, gate_up->n);
    if (f32)
        gather_blocks_kernel<float>
            <<<blocks_for(P * H), 256, 0, be->stream>>>(recv, P, H, Lb->cap, db, at, rd, r.slot_of, (float *)r.xs);
    else
        gather_blocks_kernel<bf16>
            <<<blocks_for(P * H), 256, 0, be->stream>>>(recv, P, H, Lb->cap, db, at, rd, r.slot_of, (bf16 *)r.xs);
    FM_LAUNCH_CHECK("moe_blocks_gather");
    grouped_ffn(be, &r, gate_up, down);
    if (f32)
        put_rows_kernel<float>
            <<<blocks_for(P * H), 256, 0, be->stream>>>((const float *)r.y, r.slot_of, P, H, (float *)yret);
    else
        put_rows_kernel<bf16>
            <<<blocks_for(P * H), 256, 0, be->stream>>>((const bf16 *)r.y, r.slot_of, P, H, (bf16 *)yret);
    FM_LAUNCH_CHECK("moe_blocks_put_rows");
}
