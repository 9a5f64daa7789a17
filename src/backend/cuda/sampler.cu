// Token sampling on the device, one CTA of 1024 threads per row; src/engine/sampler.h defines the arithmetic and
// sampler.c is the reference this kernel reproduces (the same float operations for penalties and temperature, the
// same double-precision masses, the same counter-based uniform), so a seed draws the same ids on both backends.
//
// Passes over the row (vocab V, from L2 after the first): penalties, the constraint's mask (a bit per id, read only
// for a masked row) + temperature into z (stored only for a row that reads it again), with the argmax and the raw
// logits' log-sum-exp (online: each thread's largest logit and its sum of exps, lse_add), in 16-byte loads (1
// pass; a row with a logit bias adds its entries to z and takes the argmax again: one more pass); greedy rows stop
// there. Sampled rows: top-k as a radix select of the k-th largest z (4 passes of 8 bits over
// order-preserving keys), top-p as a radix select on probability mass (4 passes, double sums in 256 shared bins),
// min-p in closed form, the kept total (1 pass), and the draw: each thread owns a contiguous chunk of ids, a block
// scan of the chunk masses finds the chunk holding u x total, and its thread walks it in id order (1 pass). Log-
// probabilities of the raw logits: the top N by N argmax passes over the total order (value descending, id
// ascending), each pass taking the first element after the previous pick. (The greedy row's first pass was 148
// scalar loads and z stores a thread, and the log-sum-exp two more passes in fp64 exps: 132 us for one Qwen3 row on
// an H100; bench/NOTES.md, forty-fourth session.)
// Floor: V x (2 or 4) bytes of logits per row from HBM; the rest is L2 traffic, ~10-14 passes of 4V bytes.
// Programmatic dependent launch (pdl.cuh, `pdl`): the kernel waits for the earlier ones at its top (every input is
// the step's: the logits, the rows' slots, the sampling state and the constraint's masks).
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sampler.cuh"

#define THREADS 1024
#define WARPS (THREADS / 32)

typedef struct best_t {
    float v;
    int32_t i;
} best_t;

// (v desc, i asc): true when a comes first
static __device__ __forceinline__ bool before(best_t a, best_t b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

static __device__ best_t warp_best(best_t x) {
    for (int o = 16; o > 0; o >>= 1) {
        best_t y;
        y.v = __shfl_xor_sync(0xffffffffu, x.v, o), y.i = __shfl_xor_sync(0xffffffffu, x.i, o);
        if (before(y, x)) x = y;
    }
    return x;
}

static __device__ best_t block_best(best_t x, best_t *sh) {
    x = warp_best(x);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        x = warp_best(sh[lane]);
        if (lane == 0) sh[0] = x;
    }
    __syncthreads();
    return sh[0];
}

static __device__ double block_sum(double x, double *sh) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        x = sh[lane];
        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) sh[0] = x;
    }
    __syncthreads();
    return sh[0];
}

// Exclusive prefix sum over the block's threads (thread order).
static __device__ double block_exclusive_scan(double x, double *sh) {
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    double inc = x;
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) sh[w] = inc;
    __syncthreads();
    if (w == 0) {
        double t = sh[lane], ti = t;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += y;
        }
        sh[lane] = ti - t; // the warps before this one
    }
    __syncthreads();
    return sh[w] + inc - x;
}

static __device__ __forceinline__ float load_logit(const void *logits, bool f32, int64_t idx) {
    const float v = f32 ? ((const float *)logits)[idx] : __bfloat162float(((const __nv_bfloat16 *)logits)[idx]);
    return v;
}

// order-preserving map of a float to an unsigned key (larger float, larger key); z is never NaN
static __device__ __forceinline__ uint32_t fkey(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

static __device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct sample_smem {
    best_t best[WARPS];
    double dsum[WARPS];
    uint32_t count[256];
    double mass[256];
    uint32_t prefix, k;
    double above;
    int32_t chosen;
} sample_smem;

// The largest key K (among keys >= floor_key) with count{key >= K} >= k (top-k) or, when by_mass, with
// mass{key >= K} >= target: four 8-bit passes from the top digit.
static __device__ uint32_t radix_select(const float *z, int32_t V, double zmax, uint32_t floor_key, bool by_mass,
                                        uint32_t k, double target, sample_smem *sh) {
    uint32_t prefix = 0, mask = 0;
    double above = 0.0; // mass (or count) of the keys above the prefix fixed so far
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += THREADS) sh->count[d] = 0, sh->mass[d] = 0.0;
        __syncthreads();
        for (int32_t i = threadIdx.x; i < V; i += THREADS) {
            const uint32_t key = fkey(z[i]);
            if (key < floor_key || (key & mask) != prefix) continue;
            const uint32_t d = (key >> shift) & 255u;
            if (by_mass) atomicAdd(&sh->mass[d], exp((double)z[i] - zmax));
            else atomicAdd(&sh->count[d], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const double goal = by_mass ? target : (double)k;
            int pick = -1, lowest = -1;
            double acc = above, acc_lowest = above;
            for (int d = 255; d >= 0; d--) {
                const double here = by_mass ? sh->mass[d] : (double)sh->count[d];
                if (here <= 0.0) continue;
                if (acc + here >= goal) {
                    pick = d;
                    break;
                }
                lowest = d, acc_lowest = acc; // rounding can leave the goal above the whole mass: then the lowest digit
                acc += here;
            }
            if (pick < 0) pick = lowest >= 0 ? lowest : 0, acc = acc_lowest;
            sh->prefix = prefix | ((uint32_t)pick << shift);
            sh->above = acc;
        }
        __syncthreads();
        prefix = sh->prefix, above = sh->above;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// A slice's result when a row is split over CTAs (fm_cuda_sample's workspace): its argmax (v, i) and its log-sum-exp
// share (the largest raw logit m and the sum of exp(l - m))
typedef struct sample_part {
    float v;
    int32_t i;
    float m;
    double s;
} sample_part;

// The first pass's state of a row: its parameters, its penalty state (NULL: none applies), its mask's bits (NULL:
// unmasked), z (NULL: not stored) and whether the raw logits' log-sum-exp is wanted (the row's fm_sample_info)
typedef struct first_pass {
    fm_sampling p;
    const uint8_t *seen;
    const int32_t *counts;
    const uint32_t *mask;
    float *z;
    bool lse;
} first_pass;

// A thread's share of the raw logits' log-sum-exp, online: the largest logit m it has seen and the sum of exp(l - m)
// over its logits. A load's n logits at a time: their largest first (m and the sum rescaled once, by an fp32 exp),
// then their n fp32 exps summed in fp32 and added to the fp64 sum (each term within an ulp; per id, rescaling the
// sum at every new largest logit took a divergent fp64 exp on most iterations). NaN and -inf add nothing; a row
// whose largest logit is not finite takes the two-pass form.
typedef struct lse_acc {
    float m;
    double s;
} lse_acc;
static __device__ __forceinline__ void lse_add(lse_acc *a, const float *l, int n) {
    float cm = -INFINITY;
    for (int j = 0; j < n; j++) cm = fmaxf(cm, l[j]); /* fmaxf drops a NaN */
    if (cm == -INFINITY) return;
    if (cm > a->m) a->s *= (double)expf(a->m - cm), a->m = cm;
    float t = 0.0f;
    for (int j = 0; j < n; j++)
        if (!isnan(l[j])) t += expf(l[j] - a->m);
    a->s += (double)t;
}

// logit l of id i through the first pass: NaN as -inf, the penalties, the mask, into z, and the running argmax
static __device__ __forceinline__ void first_pass_one(const first_pass &fp, float l, int32_t i, best_t *mine) {
    if (isnan(l)) l = -INFINITY;
    if (fp.seen && fp.seen[i])
        l = l > 0.0f ? __fdiv_rn(l, fp.p.repetition_penalty) : __fmul_rn(l, fp.p.repetition_penalty);
    if (fp.counts && fp.counts[i])
        l = __fsub_rn(l, __fadd_rn(fp.p.presence_penalty, __fmul_rn(fp.p.frequency_penalty, (float)fp.counts[i])));
    if (fp.mask && !((fp.mask[i >> 5] >> (i & 31)) & 1u)) l = -INFINITY;
    if (fp.z) fp.z[i] = l;
    const best_t b = {l, i};
    if (before(b, *mine)) *mine = b;
}

static __global__ __launch_bounds__(THREADS) void sample_kernel(const void *logits, bool f32, int32_t V,
                                                                const int32_t *row_slot, const fm_sampling *params,
                                                                uint64_t *steps, int32_t *counts, uint8_t *seen,
                                                                const fm_logit_bias *bias, const uint32_t *mask,
                                                                float *zbuf, int32_t *ids, fm_sample_info *info,
                                                                unsigned *split_count, sample_part *split_part) {
    __shared__ sample_smem sh;
    __shared__ bool last;
    pdl_wait();
    const int32_t S = (int32_t)gridDim.y, slice = (int32_t)blockIdx.y; // the row's slices: this CTA's
    const int64_t row = blockIdx.x;
    const int64_t slot = row_slot ? row_slot[row] : row; // the row's sequence: its parameters, step and state
    const fm_sampling p = params[slot];
    const int64_t base = row * (int64_t)V, sbase = slot * (int64_t)V;
    float *z = zbuf + base;
    const bool rep = seen && p.repetition_penalty != 1.0f;
    const bool pres = counts && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
    const uint32_t *mrow = mask && p.masked ? mask + row * (int64_t)((V + 31) / 32) : NULL;
    const bool biased = bias && p.n_bias > 0;
    // penalties (the reference's float operations, uncontracted), the mask, and the argmax of the result (the bias
    // comes between them in the reference: a biased row adds it below and takes the argmax again); z is written only
    // for a row whose later passes read it (a biased or a sampled row): a greedy row reads its logits once
    const first_pass fp = {p,
                           rep ? seen + sbase : NULL,
                           pres ? counts + sbase : NULL,
                           mrow,
                           biased || p.temperature > 0.0f ? z : NULL,
                           info != NULL};
    best_t mine = {-INFINITY, INT32_MAX};
    lse_acc la = {-INFINITY, 0.0};
    const int32_t W = f32 ? 4 : 8; /* ids a 16-byte load */
    const bool vec = V % W == 0 && ((uintptr_t)logits & 15) == 0;
    /* this CTA's ids [lo, hi): a slice of the row's loads (of its ids without the 16-byte loads) */
    const int32_t units = vec ? V / W : V, lo = (int32_t)((int64_t)units * slice / S) * (vec ? W : 1),
                  hi = (int32_t)((int64_t)units * (slice + 1) / S) * (vec ? W : 1);
    for (int32_t i0 = vec ? lo + threadIdx.x * W : hi; i0 < hi; i0 += THREADS * W) {
        float l[8];
        if (f32) {
            const float4 v = __ldg((const float4 *)((const float *)logits + base + i0));
            l[0] = v.x, l[1] = v.y, l[2] = v.z, l[3] = v.w;
        } else {
            const uint4 v = __ldg((const uint4 *)((const __nv_bfloat16 *)logits + base + i0));
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++)
                l[2 * j] = __uint_as_float(w[j] << 16), l[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
        if (fp.lse) lse_add(&la, l, W);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < W) first_pass_one(fp, l[j], i0 + j, &mine);
    }
    if (!vec)
        for (int32_t i = lo + threadIdx.x; i < hi; i += THREADS) {
            const float l = load_logit(logits, f32, base + i);
            if (fp.lse) lse_add(&la, &l, 1);
            first_pass_one(fp, l, i, &mine);
        }
    // the slice's argmax and log-sum-exp share (M, sum of exp(l - M) in fp64; 0 when M is not finite)
    best_t top = block_best(mine, sh.best);
    float M = fp.lse ? block_best(best_t{la.m, 0}, sh.best).v : 0.0f;
    double msum =
        fp.lse && isfinite(M) ? block_sum(la.s > 0.0 ? la.s * exp((double)la.m - (double)M) : 0.0, sh.dsum) : 0.0;
    if (S > 1) {         // the row's last CTA to finish its slice goes on with the whole row; the others are done
        __threadfence(); /* this thread's z stores, before the count that tells the last CTA they are there */
        __syncthreads();
        if (threadIdx.x == 0) {
            split_part[row * S + slice] = sample_part{top.v, top.i, M, msum};
            __threadfence();
            last = atomicAdd(&split_count[row], 1u) == (unsigned)S - 1u;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        sample_part q = {-INFINITY, INT32_MAX, -INFINITY, 0.0};
        if ((int32_t)threadIdx.x < S) {
            const sample_part *src = split_part + row * S + threadIdx.x;
            q = sample_part{__ldcg(&src->v), __ldcg(&src->i), __ldcg(&src->m), __ldcg(&src->s)};
        }
        top = block_best(best_t{q.v, q.i}, sh.best); /* a total order: the slices' order does not matter */
        if (fp.lse) {
            M = block_best(best_t{q.m, 0}, sh.best).v;
            msum = isfinite(M) ? block_sum(q.s > 0.0 ? q.s * exp((double)q.m - (double)M) : 0.0, sh.dsum) : 0.0;
        }
        if (threadIdx.x == 0) split_count[row] = 0u; /* for the next launch (a graph replays this one) */
    }
    if (biased) { // distinct ids (checked at submission): one thread per entry; a masked id stays -inf
        __syncthreads();
        const fm_logit_bias *lb = bias + slot * FM_MAX_LOGIT_BIAS;
        for (int32_t j = threadIdx.x; j < p.n_bias; j += THREADS) {
            const int32_t id = lb[j].id;
            if (id >= 0 && id < V) z[id] = __fadd_rn(z[id], lb[j].bias);
        }
        __syncthreads();
        mine = best_t{-INFINITY, INT32_MAX};
        for (int32_t i = threadIdx.x; i < V; i += THREADS) {
            const best_t b = {z[i], i};
            if (before(b, mine)) mine = b;
        }
        top = block_best(mine, sh.best);
    }
    int32_t chosen = top.i;
    if (p.temperature > 0.0f && isfinite(top.v)) {
        const double zmax = (double)__fdiv_rn(top.v, p.temperature); // the largest z: its weight is exactly 1
        for (int32_t i = threadIdx.x; i < V; i += THREADS) z[i] = __fdiv_rn(z[i], p.temperature);
        __syncthreads();
        double thr = -INFINITY;
        uint32_t floor_key = 0;
        if (p.top_k > 0 && p.top_k < V) {
            floor_key = radix_select(z, V, zmax, 0, false, (uint32_t)p.top_k, 0.0, &sh);
            thr = (double)key_float(floor_key);
        }
        if (p.top_p < 1.0f) {
            double part = 0.0;
            for (int32_t i = threadIdx.x; i < V; i += THREADS)
                if (fkey(z[i]) >= floor_key) part += exp((double)z[i] - zmax);
            const double total = block_sum(part, sh.dsum);
            const uint32_t kp = radix_select(z, V, zmax, floor_key, true, 0, (double)p.top_p * total, &sh);
            const double tp = (double)key_float(kp);
            if (tp > thr) thr = tp;
        }
        if (p.min_p > 0.0f) {
            const double t = zmax + log((double)p.min_p);
            if (t > thr) thr = t;
        }
        // the draw, in id order: thread t owns ids [t C, (t + 1) C)
        const int32_t C = (V + THREADS - 1) / THREADS, lo = threadIdx.x * C, hi = min(V, lo + C);
        double part = 0.0;
        int32_t last = -1;
        for (int32_t i = lo; i < hi; i++)
            if ((double)z[i] >= thr && z[i] != -INFINITY) part += exp((double)z[i] - zmax), last = i;
        const double total = block_sum(part, sh.dsum);
        const double before_me = block_exclusive_scan(part, sh.dsum);
        const double u = (double)(splitmix64(splitmix64(p.seed) ^ steps[slot]) >> 11) * (1.0 / 9007199254740992.0);
        const double target = u * total;
        const best_t lastb = block_best(best_t{(float)last, last}, sh.best); // the last kept id: the fallback
        if (threadIdx.x == 0) sh.chosen = lastb.i;
        __syncthreads();
        if (part > 0.0 && before_me <= target && target < before_me + part) {
            double cum = before_me;
            for (int32_t i = lo; i < hi; i++) {
                if (!((double)z[i] >= thr) || z[i] == -INFINITY) continue;
                cum += exp((double)z[i] - zmax);
                if (cum > target) {
                    atomicMin(&sh.chosen, i);
                    break;
                }
            }
        }
        __syncthreads();
        chosen = sh.chosen;
    }
    if (info) { // the raw distribution: log-sum-exp, the chosen id's log-probability, the top N
        double lse;
        if (isfinite(M)) { // the threads' (and slices') online shares, rescaled to the row's largest logit
            lse = (double)M + log(msum);
        } else { // a logit at +inf, or none above -inf: the reference's two passes, the same NaN or inf
            best_t rmax = {-INFINITY, INT32_MAX};
            for (int32_t i = threadIdx.x; i < V; i += THREADS) {
                const best_t b = {load_logit(logits, f32, base + i), i};
                if (!isnan(b.v) && before(b, rmax)) rmax = b;
            }
            const double mx = (double)block_best(rmax, sh.best).v;
            double part = 0.0;
            for (int32_t i = threadIdx.x; i < V; i += THREADS) {
                const float l = load_logit(logits, f32, base + i);
                if (!isnan(l)) part += exp((double)l - mx);
            }
            lse = mx + log(block_sum(part, sh.dsum));
        }
        const int32_t n = p.n_logprobs < V ? p.n_logprobs : V;
        best_t prev = {INFINITY, -1};
        int32_t got = 0;
        for (; got < n; got++) {
            best_t b = {-INFINITY, INT32_MAX};
            for (int32_t i = threadIdx.x; i < V; i += THREADS) {
                const best_t c = {load_logit(logits, f32, base + i), i};
                if (!isnan(c.v) && before(prev, c) && before(c, b)) b = c;
            }
            const best_t w = block_best(b, sh.best);
            if (w.i == INT32_MAX) break; // fewer non-NaN ids than asked
            if (threadIdx.x == 0) info[row].top[got].id = w.i, info[row].top[got].logprob = (float)((double)w.v - lse);
            prev = w;
        }
        if (threadIdx.x == 0) {
            info[row].n_top = got;
            info[row].logprob = (float)((double)load_logit(logits, f32, base + chosen) - lse);
        }
    }
    if (threadIdx.x == 0) {
        ids[row] = chosen;
        steps[slot]++;
        if (seen) seen[sbase + chosen] = 1;
        if (counts) counts[sbase + chosen]++;
    }
}

static_assert(sizeof(sample_part) * FM_CUDA_SAMPLE_MAX_SPLITS * FM_CUDA_SAMPLE_SPLIT_ROWS +
                      FM_CUDA_SAMPLE_SPLIT_ROWS * 8 <=
                  FM_CUDA_SAMPLE_WS_BYTES,
              "the split workspace holds every row's counter and slices");
static_assert(FM_CUDA_SAMPLE_MAX_SPLITS <= THREADS, "the last CTA reads one slice a thread");

int32_t fm_cuda_sample_splits(int32_t B, int32_t vocab, bool ws) {
    if (!ws || B > FM_CUDA_SAMPLE_SPLIT_ROWS) return 1;
    int32_t S = FM_CUDA_SAMPLE_SPLIT_CTAS / B, most = vocab / FM_CUDA_SAMPLE_MIN_SLICE;
    if (S > FM_CUDA_SAMPLE_MAX_SPLITS) S = FM_CUDA_SAMPLE_MAX_SPLITS;
    if (S > most) S = most;
    return S > 1 ? S : 1;
}

void fm_cuda_sample(const void *logits, bool f32, int32_t B, int32_t vocab, const int32_t *row_slot,
                    const fm_sampling *params, uint64_t *steps, int32_t *counts, uint8_t *seen,
                    const fm_logit_bias *bias, const uint32_t *mask, float *z, int32_t *ids, fm_sample_info *info,
                    void *split_ws, bool pdl, cudaStream_t s) {
    if (B <= 0) return;
    if ((counts == NULL) != (seen == NULL) || vocab <= 0 || !params || !steps || !z || !ids) {
        fprintf(stderr, "fp8moe: sample: bad arguments (vocab %d, counts %p, seen %p)\n", vocab, (void *)counts,
                (void *)seen);
        abort();
    }
    const int32_t S = fm_cuda_sample_splits(B, vocab, split_ws != NULL);
    unsigned *count = (unsigned *)split_ws;
    sample_part *part = split_ws ? (sample_part *)((char *)split_ws + FM_CUDA_SAMPLE_SPLIT_ROWS * 8) : NULL;
    pdl_launch(sample_kernel, dim3((unsigned)B, (unsigned)S), THREADS, 0, s, pdl, logits, f32, vocab, row_slot, params,
               steps, counts, seen, bias, mask, z, ids, info, count, part);
    FM_LAUNCH_CHECK("sample");
}
