// Experts in host memory on the CUDA backend (backend.h, "Experts in host memory").
//
// Host banks: built on the device as bank_create builds them (one bank at a time: the memory plan's load staging
// covers it), then moved to pinned, mapped host memory in the same layout; only the copy kernel below reads them.
// Only int4-tc banks (the fp8 and fp4 presets' experts) are taken: the grouped W4A8 kernels are the ones that read
// an expert's matrix through a tile's `expert` field, which the dispatch takes from the slot table.
//
// The pool: two banks of S matrices in device memory. The moe op gets two view banks of E matrices over them whose
// slot_of is the current layer's table (expert -> slot, device [E]): the dispatch writes slot_of[e] into each tile
// of expert e (moe_dispatch.cu), so the GEMMs and GEMVs read the slot's bytes. The routed ids reach the moe op as
// they are (expert_cache_create gives no slot-id buffer).
//
// expert_fetch, two launches in stream order, no host synchronisation (a decode step stays one CUDA graph):
//   residency_kernel  one block of 1024 threads runs backend/expert_residency.h's steps on the device table: the
//                     same choices as the reference (same victims, same counters), the copy list (expert, slot),
//                     and the layer's table copied into the view's slot_of;
//   (expert_prefetch: the same two launches, the residency kernel in its prefetch form: expert_residency.h)
//   copy_kernel       a grid-stride copy of the listed experts' four arrays (gate|up codes and scales, down codes
//                     and scales) from mapped host memory into their slots, 16 bytes per load: the host link is
//                     the floor (missed expert bytes / link bandwidth). The grid is fixed; the count is read on
//                     the device.
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/expert_cache.cuh"
extern "C" {
#include "backend/expert_residency.h"
#include "util/status.h"
}

#define RES_THREADS 1024
#define COPY_BLOCKS 528 /* 4 per SM on an H200: enough 16-byte reads in flight to fill the host link */
#define COPY_THREADS 256

// The device table (one allocation of fm_expert_device_table_bytes, expert_residency.h): as fm_residency's arrays, plus
// the copy list and the counters. hdr: [0] tick, [1] fetches, [2] hits, [3] misses, [4] prefetches, [5] their copies.
typedef struct dev_table {
    int32_t *slot_of;               // [L * E]
    uint32_t *uses;                 // [L * E]
    int32_t *owner;                 // [S]
    uint64_t *last_use;             // [S]
    int32_t *copy_e, *copy_s, *map; // [E]
    uint64_t *hdr;                  // [6]
    int32_t *n_copies;              // [1]
} dev_table;

// The four arrays of a slot: gate|up codes and scales, down codes and scales
#define N_ARRAYS 4

struct fm_expert_cache {
    int32_t n_layers, n_experts, n_slots;
    fm_expert_policy policy;
    void *table_mem;
    dev_table t;
    fm_bank *pool_gu, *pool_dn; // the views the moe op gets (n = E, slot_of = t.map); storage in pool[]
    uint8_t *pool[N_ARRAYS];
    size_t matrix_bytes[N_ARRAYS]; // bytes of one matrix of each array
    fm_bank *const *gate_up, *const *down;
};

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Bytes of one matrix of an int4-tc bank: codes [rows_pad / 16][n_groups][1024], scales [n_groups][rows_pad] bf16
static size_t tc_codes_bytes(const fm_bank *b) { return (size_t)(b->rows_pad * b->n_groups * FM_CUDA_GROUP / 2); }
static size_t tc_scales_bytes(const fm_bank *b) { return (size_t)(b->rows_pad * b->n_groups) * 2; }

extern "C" fm_status fm_cuda_bank_create_host(fm_backend *bb, const fm_bank_src *src, fm_wformat fmt, fm_bank **out,
                                              fm_error *err) {
    *out = NULL;
    fm_bank *w = NULL;
    fm_status st = fm_cuda_bank_create(bb, src, fmt, &w, err);
    if (st) return st;
    if (w->fold) { /* the cache's copies and pool banks are int4-tc */
        fm_cuda_bank_free(bb, w);
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: --experts-in host keeps int4-tc experts, not route w4a8.kernel=fold's layout: "
                       "--experts-in device, or another w4a8.kernel",
                       src->label);
    }
    if (w->fmt != FM_W_INT4_G128_TC) {
        const fm_wformat got = w->fmt;
        fm_cuda_bank_free(bb, w);
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: --experts-in host on the cuda backend keeps int4-tc expert banks (the fp8 and fp4 "
                       "presets, from a float or int4 checkpoint); this bank is %s: --experts-in device, or --backend "
                       "cpu",
                       src->label, fm_wformat_name(got));
    }
    const size_t cb = tc_codes_bytes(w) * (size_t)w->n, sb = tc_scales_bytes(w) * (size_t)w->n;
    void *hc = NULL, *hs = NULL;
    if (cudaHostAlloc(&hc, cb, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostAlloc(&hs, sb, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        if (hc) cudaFreeHost(hc);
        fm_cuda_bank_free(bb, w);
        return fm_fail(err, FM_ERR_NOMEM, "%s: out of pinned host memory for %zu bytes of experts", src->label,
                       cb + sb);
    }
    // the copy kernel reads the host pointers themselves: unified addressing maps them to the same device address
    void *dc = NULL, *ds = NULL;
    FM_CUDA_CHECK(cudaHostGetDevicePointer(&dc, hc, 0));
    FM_CUDA_CHECK(cudaHostGetDevicePointer(&ds, hs, 0));
    if (dc != hc || ds != hs) {
        cudaFreeHost(hc), cudaFreeHost(hs);
        fm_cuda_bank_free(bb, w);
        return fm_fail(err, FM_ERR_UNSUPPORTED,
                       "%s: this system maps pinned host memory at other device addresses "
                       "(no unified addressing): --experts-in device",
                       src->label);
    }
    FM_CUDA_CHECK(cudaMemcpy(hc, w->w, cb, cudaMemcpyDeviceToHost));
    FM_CUDA_CHECK(cudaMemcpy(hs, w->scales, sb, cudaMemcpyDeviceToHost));
    FM_CUDA_CHECK(cudaFree(w->w));
    FM_CUDA_CHECK(cudaFree(w->scales));
    w->w = hc, w->scales = (__nv_bfloat16 *)hs, w->host = true;
    *out = w;
    return FM_OK;
}

static bool same_tc_layout(const fm_bank *a, const fm_bank *b) {
    return a->fmt == b->fmt && a->n == b->n && a->rows == b->rows && a->cols == b->cols && a->rows_pad == b->rows_pad &&
           a->n_groups == b->n_groups && a->interleaved == b->interleaved && a->ld == b->ld;
}

static void cache_free(fm_expert_cache *c) {
    if (!c) return;
    for (int i = 0; i < N_ARRAYS; i++)
        if (c->pool[i]) FM_CUDA_CHECK(cudaFree(c->pool[i]));
    if (c->table_mem) FM_CUDA_CHECK(cudaFree(c->table_mem));
    free(c->pool_gu), free(c->pool_dn);
    free(c);
}

// A view bank of E matrices over pool storage (codes, scales) through the slot table
static fm_bank *view_bank(const fm_bank *like, int32_t E, int32_t S, uint8_t *codes, uint8_t *scales,
                          const int32_t *map) {
    fm_bank *v = (fm_bank *)calloc(1, sizeof *v);
    if (!v) return NULL;
    *v = *like;
    v->n = E, v->host = false, v->slot_of = map, v->w = codes, v->scales = (__nv_bfloat16 *)scales;
    v->bytes = (tc_codes_bytes(like) + tc_scales_bytes(like)) * (size_t)S; // the pool's bytes: S slots
    return v;
}

extern "C" fm_status fm_cuda_expert_cache_create(fm_backend *bb, const fm_expert_cache_desc *d, fm_expert_cache **out,
                                                 const fm_bank **pool_gate_up, const fm_bank **pool_down,
                                                 void **slot_ids, fm_error *err) {
    *out = NULL, *slot_ids = NULL;
    int32_t first = -1;
    for (int32_t l = 0; l < d->n_layers; l++) {
        if (!d->gate_up[l] != !d->down[l])
            return fm_fail(err, FM_ERR_USAGE, "expert cache: layer %d has one expert bank of two", l);
        if (!d->gate_up[l]) continue;
        const fm_bank *gu = d->gate_up[l], *dn = d->down[l];
        if (!gu->host || !dn->host || gu->fmt != FM_W_INT4_G128_TC || dn->fmt != FM_W_INT4_G128_TC)
            return fm_fail(err, FM_ERR_USAGE, "expert cache: layer %d's expert banks are not int4-tc host banks", l);
        if (gu->n != d->n_experts)
            return fm_fail(err, FM_ERR_USAGE, "expert cache: layer %d has %d experts, the cache %d", l, gu->n,
                           d->n_experts);
        if (first < 0) first = l;
        if (!same_tc_layout(gu, d->gate_up[first]) || !same_tc_layout(dn, d->down[first]))
            return fm_fail(err, FM_ERR_UNSUPPORTED,
                           "expert cache: layer %d's expert banks differ in shape from layer %d's; one pool of slots "
                           "serves layers of one layout only (--experts-in device runs this model)",
                           l, first);
    }
    if (first < 0) return fm_fail(err, FM_ERR_USAGE, "expert cache: the model has no MoE layer");
    if (d->n_experts > RES_THREADS || d->n_slots < d->n_experts)
        return fm_fail(err, FM_ERR_USAGE, "expert cache: %d experts, %d slots (1..%d experts, slots >= experts)",
                       d->n_experts, d->n_slots, RES_THREADS);
    fm_expert_cache *c = (fm_expert_cache *)calloc(1, sizeof *c);
    if (!c) return fm_fail(err, FM_ERR_NOMEM, "out of host memory for the expert cache");
    c->n_layers = d->n_layers, c->n_experts = d->n_experts, c->n_slots = d->n_slots, c->policy = d->policy;
    c->gate_up = d->gate_up, c->down = d->down;
    const fm_bank *gu = d->gate_up[first], *dn = d->down[first];
    c->matrix_bytes[0] = tc_codes_bytes(gu), c->matrix_bytes[1] = tc_scales_bytes(gu);
    c->matrix_bytes[2] = tc_codes_bytes(dn), c->matrix_bytes[3] = tc_scales_bytes(dn);
    const size_t S = (size_t)d->n_slots, E = (size_t)d->n_experts, keys = (size_t)d->n_layers * E;
    const size_t table = fm_expert_device_table_bytes(d->n_layers, d->n_experts, d->n_slots);
    bool ok = true;
    for (int i = 0; i < N_ARRAYS; i++)
        ok = ok && cudaMalloc((void **)&c->pool[i], c->matrix_bytes[i] * S) == cudaSuccess;
    ok = ok && cudaMalloc(&c->table_mem, table) == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        cache_free(c);
        return fm_fail(err, FM_ERR_NOMEM, "out of GPU memory for the expert cache (%zu slots of %zu bytes)", S,
                       c->matrix_bytes[0] + c->matrix_bytes[1] + c->matrix_bytes[2] + c->matrix_bytes[3]);
    }
    uint8_t *m = (uint8_t *)c->table_mem;
    c->t.slot_of = (int32_t *)m, m += align256(keys * 4);
    c->t.uses = (uint32_t *)m, m += align256(keys * 4);
    c->t.owner = (int32_t *)m, m += align256(S * 4);
    c->t.last_use = (uint64_t *)m, m += align256(S * 8);
    c->t.copy_e = (int32_t *)m, m += align256(E * 4);
    c->t.copy_s = (int32_t *)m, m += align256(E * 4);
    c->t.map = (int32_t *)m, m += align256(E * 4);
    c->t.hdr = (uint64_t *)m, m += align256(6 * 8);
    c->t.n_copies = (int32_t *)m;
    cudaStream_t s = cuda_be(bb)->stream;
    FM_CUDA_CHECK(cudaMemsetAsync(c->table_mem, 0, table, s));
    FM_CUDA_CHECK(cudaMemsetAsync(c->t.slot_of, 0xFF, keys * 4, s)); // -1: not resident
    FM_CUDA_CHECK(cudaMemsetAsync(c->t.owner, 0xFF, S * 4, s));      // -1: empty
    c->pool_gu = view_bank(gu, d->n_experts, d->n_slots, c->pool[0], c->pool[1], c->t.map);
    c->pool_dn = view_bank(dn, d->n_experts, d->n_slots, c->pool[2], c->pool[3], c->t.map);
    if (!c->pool_gu || !c->pool_dn) {
        cache_free(c);
        return fm_fail(err, FM_ERR_NOMEM, "out of host memory for the expert cache");
    }
    *out = c, *pool_gate_up = c->pool_gu, *pool_down = c->pool_dn;
    return FM_OK;
}

// The victim order of expert_residency.h: true when slot a (key ka) goes before slot b
typedef struct victim_key {
    int64_t uses; // LFU: the owner's uses, -1 for an empty slot; LRU: 0 (then last_use alone orders)
    uint64_t last_use;
    int32_t slot; // -1: no candidate
} victim_key;

static __device__ __forceinline__ bool key_before(const victim_key &a, const victim_key &b, bool lfu) {
    if (a.slot < 0) return false;
    if (b.slot < 0) return true;
    if (a.uses != b.uses) return a.uses < b.uses;
    if (a.last_use != b.last_use) return (a.last_use < b.last_use) != lfu; // LFU: among equal counts, the most recent
    return a.slot < b.slot;
}

static __device__ victim_key shfl_key(const victim_key &k, int src_lane_xor) {
    victim_key o;
    o.uses = __shfl_xor_sync(0xffffffffu, k.uses, src_lane_xor);
    o.last_use = __shfl_xor_sync(0xffffffffu, k.last_use, src_lane_xor);
    o.slot = __shfl_xor_sync(0xffffffffu, k.slot, src_lane_xor);
    return o;
}

// One fetch of `layer`: the reference's steps 1-4 (expert_residency.h) on the device table, by one block. prefetch:
// the reference's prefetch instead (no tick, no use, no pin; victims among the slots of other layers; no map). The
// ids: rows of k, the first m of each (P = rows m; a fetch passes k = m = 1).
static __global__ void __launch_bounds__(RES_THREADS)
    residency_kernel(dev_table t, int32_t L, int32_t E, int32_t S, int32_t policy, int32_t layer, const int32_t *ids,
                     int64_t P, int32_t k, int32_t m, bool prefetch) {
    __shared__ int32_t first[RES_THREADS];     // the first index of expert e among ids, INT32_MAX if absent
    __shared__ int32_t missfirst[RES_THREADS]; // first[e] for a missing expert, else INT32_MAX
    __shared__ int32_t miss_e[RES_THREADS];    // the misses in order of first appearance
    __shared__ int32_t n_miss, n_hit;
    __shared__ victim_key warp_best[RES_THREADS / 32];
    const int tid = threadIdx.x;
    const uint64_t tick = t.hdr[0] + (prefetch ? 0 : 1);
    const int32_t key0 = layer * E;
    const bool lfu = policy == FM_EXPERT_LFU;
    if (tid == 0) n_miss = 0, n_hit = 0;
    // 1. the LFU half-life
    if (!prefetch && lfu && tick % FM_EXPERT_LFU_HALF_LIFE == 0)
        for (int64_t i = tid; i < (int64_t)L * E; i += RES_THREADS) t.uses[i] >>= 1;
    for (int e = tid; e < E; e += RES_THREADS) first[e] = INT32_MAX;
    __syncthreads();
    // 2. the distinct experts, in order of first appearance: hits pinned (last_use = tick), misses ranked
    for (int64_t i = tid; i < P; i += RES_THREADS) atomicMin(&first[ids[i / m * k + i % m]], (int32_t)i);
    __syncthreads();
    if (tid < E) {
        missfirst[tid] = INT32_MAX;
        if (first[tid] != INT32_MAX) {
            const int32_t s = t.slot_of[key0 + tid];
            if (!prefetch) {
                t.uses[key0 + tid]++;
                if (s >= 0) t.last_use[s] = tick, atomicAdd(&n_hit, 1);
            }
            if (s < 0) missfirst[tid] = first[tid];
        }
    }
    __syncthreads();
    if (tid < E && missfirst[tid] != INT32_MAX) {
        int32_t rank = 0;
        for (int e = 0; e < E; e++) rank += missfirst[e] < missfirst[tid];
        miss_e[rank] = tid;
        atomicAdd(&n_miss, 1);
    }
    __syncthreads();
    // 3. each miss in order takes the smallest key among the slots not pinned (last_use != tick; a prefetch: among
    // the slots that hold no expert of this layer)
    const int nm = n_miss;
    for (int j = 0; j < nm; j++) {
        victim_key best = {0, 0, -1};
        for (int32_t s = tid; s < S; s += RES_THREADS) {
            const uint64_t lu = t.last_use[s];
            const int32_t o = t.owner[s];
            if (prefetch ? o >= 0 && o / E == layer : lu == tick) continue;
            victim_key k = {0, lu, s};
            if (lfu) k.uses = o < 0 ? -1 : (int64_t)t.uses[o];
            if (key_before(k, best, lfu)) best = k;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const victim_key other = shfl_key(best, o);
            if (key_before(other, best, lfu)) best = other;
        }
        if ((tid & 31) == 0) warp_best[tid >> 5] = best;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < RES_THREADS / 32; w++)
                if (key_before(warp_best[w], best, lfu)) best = warp_best[w];
            const int32_t v = best.slot, e = miss_e[j]; // a victim always exists: S >= E
            const int32_t old = t.owner[v];
            if (old >= 0) t.slot_of[old] = -1;
            t.owner[v] = key0 + e, t.slot_of[key0 + e] = v, t.last_use[v] = tick;
            t.copy_e[j] = e, t.copy_s[j] = v;
        }
        __syncthreads();
    }
    // 4. the layer's table for the moe op's views; the counters
    if (prefetch) {
        if (tid == 0) t.hdr[4] += 1, t.hdr[5] += (uint64_t)nm, *t.n_copies = nm;
        return;
    }
    for (int e = tid; e < E; e += RES_THREADS) t.map[e] = t.slot_of[key0 + e];
    if (tid == 0) {
        t.hdr[0] = tick, t.hdr[1] += 1, t.hdr[2] += (uint64_t)n_hit, t.hdr[3] += (uint64_t)nm;
        *t.n_copies = nm;
    }
}

typedef struct copy_args {
    const uint8_t *src[N_ARRAYS]; // the layer's host arrays (matrix 0)
    uint8_t *dst[N_ARRAYS];       // the pool's arrays (slot 0)
    int64_t units[N_ARRAYS];      // 16-byte units of one matrix of each array
} copy_args;

// The listed experts' arrays, host -> slots: unit u of the n x (sum of units) units of this fetch
static __global__ void __launch_bounds__(COPY_THREADS)
    copy_kernel(copy_args a, const int32_t *n_copies, const int32_t *copy_e, const int32_t *copy_s) {
    const int64_t per = a.units[0] + a.units[1] + a.units[2] + a.units[3];
    const int64_t total = (int64_t)*n_copies * per, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < total; u += stride) {
        const int64_t j = u / per;
        int64_t r = u - j * per;
        int i = 0;
        while (r >= a.units[i]) r -= a.units[i], i++;
        const int64_t e = copy_e[j], s = copy_s[j];
        const uint4 v = *((const uint4 *)(a.src[i]) + e * a.units[i] + r);
        *((uint4 *)(a.dst[i]) + s * a.units[i] + r) = v;
    }
}

static void fetch(fm_backend *bb, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P, int32_t k, int32_t m,
                  bool prefetch) {
    if (layer < 0 || layer >= c->n_layers || !c->gate_up[layer]) {
        fprintf(stderr, "fp8moe: expert_%s: layer %d has no experts in the cache\n", prefetch ? "prefetch" : "fetch",
                layer);
        abort();
    }
    if (P == 0) return;
    cudaStream_t s = cuda_be(bb)->stream;
    residency_kernel<<<1, RES_THREADS, 0, s>>>(c->t, c->n_layers, c->n_experts, c->n_slots, (int32_t)c->policy, layer,
                                               (const int32_t *)ids, P, k, m, prefetch);
    FM_LAUNCH_CHECK("expert_residency");
    copy_args a;
    const fm_bank *gu = c->gate_up[layer], *dn = c->down[layer];
    a.src[0] = (const uint8_t *)gu->w, a.src[1] = (const uint8_t *)gu->scales;
    a.src[2] = (const uint8_t *)dn->w, a.src[3] = (const uint8_t *)dn->scales;
    for (int i = 0; i < N_ARRAYS; i++) a.dst[i] = c->pool[i], a.units[i] = (int64_t)(c->matrix_bytes[i] / 16);
    copy_kernel<<<COPY_BLOCKS, COPY_THREADS, 0, s>>>(a, c->t.n_copies, c->t.copy_e, c->t.copy_s);
    FM_LAUNCH_CHECK("expert_copy");
}

extern "C" void fm_cuda_expert_fetch(fm_backend *bb, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P) {
    fetch(bb, c, layer, ids, P, 1, 1, false);
}

extern "C" void fm_cuda_expert_prefetch(fm_backend *bb, fm_expert_cache *c, int32_t layer, const void *ids,
                                        int64_t rows, int32_t k, int32_t m) {
    if (k < 1 || m < 1 || m > k) {
        fprintf(stderr, "fp8moe: expert_prefetch: the first %d of rows of %d ids\n", m, k);
        abort();
    }
    fetch(bb, c, layer, ids, rows * m, k, m, true);
}

extern "C" void fm_cuda_expert_cache_stats(fm_backend *bb, const fm_expert_cache *c, fm_expert_cache_stats *out) {
    uint64_t h[6] = {0, 0, 0, 0, 0, 0};
    FM_CUDA_CHECK(cudaStreamSynchronize(cuda_be(bb)->stream));
    FM_CUDA_CHECK(cudaMemcpy(h, c->t.hdr, sizeof h, cudaMemcpyDeviceToHost));
    const uint64_t slot = c->matrix_bytes[0] + c->matrix_bytes[1] + c->matrix_bytes[2] + c->matrix_bytes[3];
    *out = (fm_expert_cache_stats){(int64_t)h[1], (int64_t)h[2], (int64_t)h[3], h[3] * slot,
                                   (int64_t)h[4], (int64_t)h[5], h[5] * slot};
}

extern "C" void fm_cuda_expert_cache_free(fm_backend *bb, fm_expert_cache *c) {
    if (c) FM_CUDA_CHECK(cudaStreamSynchronize(cuda_be(bb)->stream));
    cache_free(c);
}

extern "C" fm_status fm_cuda_expert_cache_table(fm_backend *bb, const fm_expert_cache *c, int32_t *slot_of,
                                                int32_t *owner, fm_error *err) {
    if (!c) return fm_fail(err, FM_ERR_USAGE, "no expert cache");
    FM_CUDA_CHECK(cudaStreamSynchronize(cuda_be(bb)->stream));
    FM_CUDA_CHECK(
        cudaMemcpy(slot_of, c->t.slot_of, (size_t)c->n_layers * (size_t)c->n_experts * 4, cudaMemcpyDeviceToHost));
    FM_CUDA_CHECK(cudaMemcpy(owner, c->t.owner, (size_t)c->n_slots * 4, cudaMemcpyDeviceToHost));
    return FM_OK;
}

// The host link as the cache uses it: `bytes` from pinned, mapped host memory into device memory, by the copy
// kernel's loads (mapped_gbps) and by the DMA engines (cudaMemcpyAsync, dma_gbps); the best of 5 runs each.
static __global__ void __launch_bounds__(COPY_THREADS) mapped_copy_kernel(const uint4 *src, uint4 *dst, int64_t units) {
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < units; u += (int64_t)gridDim.x * blockDim.x)
        dst[u] = src[u];
}

extern "C" fm_status fm_cuda_host_link(size_t bytes, double *dma_gbps, double *mapped_gbps, fm_error *err) {
    *dma_gbps = *mapped_gbps = 0;
    bytes = bytes / 16 * 16;
    void *h = NULL, *d = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaMalloc(&d, bytes) != cudaSuccess) {
        cudaGetLastError();
        if (h) cudaFreeHost(h);
        return fm_fail(err, FM_ERR_NOMEM, "host link measurement: %zu bytes of pinned host and GPU memory", bytes);
    }
    memset(h, 1, bytes);
    FM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    FM_CUDA_CHECK(cudaEventCreate(&e0));
    FM_CUDA_CHECK(cudaEventCreate(&e1));
    for (int way = 0; way < 2; way++)
        for (int r = 0; r < 6; r++) { // the first run of each is a warm-up
            FM_CUDA_CHECK(cudaEventRecord(e0, s));
            if (way == 0) FM_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
            else {
                mapped_copy_kernel<<<COPY_BLOCKS, COPY_THREADS, 0, s>>>((const uint4 *)h, (uint4 *)d,
                                                                        (int64_t)(bytes / 16));
                FM_LAUNCH_CHECK("host link copy");
            }
            FM_CUDA_CHECK(cudaEventRecord(e1, s));
            FM_CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            FM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double gbps = (double)bytes / (ms * 1e-3) / 1e9;
            double *best = way == 0 ? dma_gbps : mapped_gbps;
            if (r > 0 && gbps > *best) *best = gbps;
        }
    FM_CUDA_CHECK(cudaEventDestroy(e0));
    FM_CUDA_CHECK(cudaEventDestroy(e1));
    FM_CUDA_CHECK(cudaStreamDestroy(s));
    FM_CUDA_CHECK(cudaFree(d));
    FM_CUDA_CHECK(cudaFreeHost(h));
    return FM_OK;
}
