// Causal GQA prefill attention on Hopper: wgmma + TMA, FlashAttention-3's recipe (sm_90a; a trap below it, the
// route table sends other GPUs and head dims to the mma.sync kernel, attention.cu). hd 128 only for now.
//
// Grid: x = query head h (nh), y = query tile of BM = 128 rows, heaviest causal tile first (blockIdx.y = 0 is the last
// tile); the q heads of one kv head are neighbours in x, so their K/V tile reads meet in L2 (as attention.cu).
// Block: 384 threads, three warpgroups:
//   warpgroups 0, 1  the consumers; warpgroup w owns query rows m0 + 64 w .. + 63 and all their math (240 registers)
//   warpgroup 2      the producer (its first thread; 24 registers): Q once, then K_n and V_n of every key tile up to
//                    the diagonal into a STAGES-deep ring, by bulk tensor copies (TMA, 128-byte swizzle, zero fill
//                    past T) on mbarriers
// Barriers: q_full; per stage k_full and v_full (the producer's expect_tx arrival + the bytes), k_empty and v_empty
// (one arrival per consumer warpgroup: K_n once S_n is done, V_n once P_n V_n is, so K_{n+STAGES} loads early).
//
// Per key tile n of BN = 128 keys, per consumer warpgroup (registers per thread: S 64 fp32, O 64 fp32, P 32 b32):
//   S = Q K_n^T     8 x wgmma.m64n128k16 bf16, A = Q and B = K_n from shared memory (K-major, desc_sw128)
//   mask            only on the diagonal tile (key > query -> -inf); tiles above it are never loaded
//   softmax         online, fp32, exp2 of log2(e)/sqrt(hd)-prescaled scores, rows reduced over the quad
//   O += P V_n      8 x wgmma.m64n128k16, A = P rounded to bf16 in registers (the m64k16 A fragment has the
//                   accumulator's layout, so S's n8 tiles 2j, 2j+1 are P's k-step j), B = V_n from shared memory
//                   as the transposed (MN-major) operand: V's rows are keys, hd contiguous
// Schedules (SCHED; the lab times each, lab/README.md):
//   ATW_PLAIN       S_n issued and waited for, softmax, P_n V_n issued and waited for
//   ATW_OVERLAP     FA3's intra-warpgroup pipelining: S_{n+1} = Q K_{n+1}^T and O += P_n V_n issued together, the
//                   softmax of S_{n+1} runs while P_n V_n is still on the tensor cores, O rescaled after it completes
//   ATW_PINGPONG    ATW_OVERLAP, and the two warpgroups take turns issuing their GEMMs (two named barriers), so that
//                   one's softmax runs under the other's GEMMs (the engine's)
//
// Shared memory (dynamic, 1024-byte aligned): Q [2 halves][128 rows][128 B], then per stage K and V in the same
// layout: each 64-column half of a tile is one TMA box, rows of 128 bytes, 16-byte chunk c of row r at c ^ (r & 7)
// (the 128-byte swizzle both TMA and wgmma speak). 32 KB + STAGES x 64 KB: 224 KB at 3 stages, one block per SM.
//
// Floor: causal FLOPs 4 hd nh T (T + 1) / 2 over ~790 TFLOP/s (the bf16 wgmma rate measured on the H200).
#include <cuda.h>
#include <math.h>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/tensor_map.cuh"
#include "backend/cuda/wgmma.cuh"

#define ATW_BM 128 // query rows per block: two consumer warpgroups of 64
#define ATW_BN 128 // keys per tile (the diagonal tile is then the last one of every block)
#define ATW_CONSUMERS 2
#define ATW_THREADS ((ATW_CONSUMERS + 1) * 128) // + the producer warpgroup (one thread of it issues the copies)
// Registers per thread after setmaxnreg: the producer warpgroup gives its share to the consumers. An SM's four
// sub-partitions each hold one warp of every warpgroup and 16K registers: 24 + 2 x 240 = 504 of 512 per lane.
#define ATW_PRODUCER_REGS 24
#define ATW_CONSUMER_REGS 240
template <int HD, int STAGES> struct atw_smem {
    static constexpr int q_bytes = ATW_BM * HD * 2, kv_bytes = ATW_BN * HD * 2;
    static constexpr int bytes = q_bytes + STAGES * 2 * kv_bytes + 1024; // + alignment slack
};

// The device pieces exist only where the kernel does (the sm_90a pass; the host pass sees their declarations)
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The 64 accumulator registers of an m64n128 fp32 fragment ([n8 tile][4], the m16n8 D order) as asm operands
#define ATW_D4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define ATW_D64                                                                                                        \
    ATW_D4(0), ATW_D4(1), ATW_D4(2), ATW_D4(3), ATW_D4(4), ATW_D4(5), ATW_D4(6), ATW_D4(7), ATW_D4(8), ATW_D4(9),      \
        ATW_D4(10), ATW_D4(11), ATW_D4(12), ATW_D4(13), ATW_D4(14), ATW_D4(15)
#define ATW_D64_STR                                                                                                    \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (m64n128 fp32) = A B (+ d when accumulate): A [64][16] and B [128][16] bf16 from shared memory, both K-major
static __device__ __forceinline__ void atw_wgmma_ss(float d[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATW_D64_STR ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : ATW_D64
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}

// d (m64n128 fp32) += A B: A [64][16] bf16 in registers (the fragment of mma.sync m16n8k16 per warp), B [16][128]
// from shared memory stored N-major (transposed: imm-trans-b 1)
static __device__ __forceinline__ void atw_wgmma_rs(float d[16][4], const uint32_t a[4], uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATW_D64_STR
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : ATW_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#else
    (void)d, (void)a, (void)desc_b;
    __trap();
#endif
}

// Descriptor of an MN-major (transposed) operand in the 128-byte swizzle: 64 elements of N contiguous in each
// 128-byte row, rows = k; 8-row (k) groups 1024 bytes apart (stride byte offset), the next 64 elements of N at lbo
// bytes (leading byte offset); 1024-byte aligned atoms.
static __device__ __forceinline__ uint64_t atw_desc_mn(uint32_t smem_addr, uint32_t lbo) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// Online softmax of one S tile (a consumer thread's rows g and g + 8 of its warp's 16): m, l updated, s replaced by
// exp2(s sl2 - m sl2), alpha = the factor O must be rescaled by (exactly 1 where the row max did not move).
template <int NT>
static __device__ __forceinline__ void atw_softmax(float s[NT][4], float m[2], float l[2], float alpha[2], float sl2) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float t[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) t[nt] = fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]);
#pragma unroll
        for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int i = 0; i + w < NT; i += 2 * w) t[i] = fmaxf(t[i], t[i + w]);
        float mx = fmaxf(m[hf], t[0]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mb = mx == -INFINITY ? 0.0f : mx * sl2; // a fully masked row stays 0, never NaN
        alpha[hf] = att_exp2(m[hf] * sl2 - mb);
        m[hf] = mx;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][2 * hf] = att_exp2(fmaf(s[nt][2 * hf], sl2, -mb));
            s[nt][2 * hf + 1] = att_exp2(fmaf(s[nt][2 * hf + 1], sl2, -mb));
            t[nt] = s[nt][2 * hf] + s[nt][2 * hf + 1];
        }
#pragma unroll
        for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int i = 0; i + w < NT; i += 2 * w) t[i] += t[i + w];
        l[hf] = l[hf] * alpha[hf] + t[0];
    }
}

// S = Q K^T for one tile, issued and committed (not waited for): q, k the shared addresses of the warpgroup's 64 Q
// rows and of the K tile (HD / 64 halves of 128-byte rows each, ATW_BM resp. ATW_BN rows apart)
template <int HD> static __device__ __forceinline__ void atw_issue_qk(float s[ATW_BN / 8][4], uint32_t q, uint32_t k) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        atw_wgmma_ss(s, desc_sw128(q + (kk >> 2) * ATW_BM * 128 + (kk & 3) * 32),
                     desc_sw128(k + (kk >> 2) * ATW_BN * 128 + (kk & 3) * 32), kk > 0);
    wgmma_commit();
}

// O += P V for one tile, issued and committed: v the shared address of the V tile (keys are rows: 16 keys per k-step
// = 2048 bytes; the second 64 columns of hd ATW_BN rows further)
static __device__ __forceinline__ void atw_issue_pv(float o[16][4], const uint32_t p[ATW_BN / 16][4], uint32_t v) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < ATW_BN / 16; ks++) atw_wgmma_rs(o, p[ks], atw_desc_mn(v + ks * 16 * 128, ATW_BN * 128));
    wgmma_commit();
}

// After a wait: the fragments belong to the program again (fence_f, wgmma.cuh)
static __device__ __forceinline__ void atw_own_s(float s[ATW_BN / 8][4]) {
#pragma unroll
    for (int nt = 0; nt < ATW_BN / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) fence_f(s[nt][i]);
}
static __device__ __forceinline__ void atw_own_op(float o[16][4], uint32_t p[ATW_BN / 16][4]) {
#pragma unroll
    for (int dt = 0; dt < 16; dt++)
#pragma unroll
        for (int i = 0; i < 4; i++) fence_f(o[dt][i]);
#pragma unroll
    for (int ks = 0; ks < ATW_BN / 16; ks++)
#pragma unroll
        for (int i = 0; i < 4; i++) fence_u(p[ks][i]);
}

// Causal mask and online softmax of the tile of keys n0 .. n0 + ATW_BN - 1 for this thread's rows r0, r0 + 8 (lane
// column pair c); only the diagonal tile (a key past the warpgroup's first row wg0) is masked
static __device__ __forceinline__ void atw_mask_softmax(float s[ATW_BN / 8][4], int n0, int wg0, int r0, int c,
                                                        float m[2], float l[2], float alpha[2], float sl2) {
    if (n0 + ATW_BN - 1 > wg0) {
#pragma unroll
        for (int nt = 0; nt < ATW_BN / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (n0 + nt * 8 + 2 * c + (i & 1) > r0 + ((i >> 1) << 3)) s[nt][i] = -INFINITY;
    }
    atw_softmax<ATW_BN / 8>(s, m, l, alpha, sl2);
}

// O *= alpha per row, skipped when no row max of the warp moved
static __device__ __forceinline__ void atw_rescale(float o[16][4], const float alpha[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int dt = 0; dt < 16; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
    }
}

// P = S (the exponentials) rounded to bf16: S's n8 tiles 2 ks, 2 ks + 1 are P's k-step ks
static __device__ __forceinline__ void atw_pack(uint32_t p[ATW_BN / 16][4], const float s[ATW_BN / 8][4]) {
#pragma unroll
    for (int ks = 0; ks < ATW_BN / 16; ks++) {
        p[ks][0] = att_pack_bf16(s[2 * ks][0], s[2 * ks][1]);
        p[ks][1] = att_pack_bf16(s[2 * ks][2], s[2 * ks][3]);
        p[ks][2] = att_pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
        p[ks][3] = att_pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
}

// Named barriers of the ping-pong schedule: warpgroup w waits on barrier 1 + w for its turn on the tensor cores, the
// other warpgroup's 128 threads arrive on it once they have issued theirs
static __device__ __forceinline__ void atw_turn_wait(int wg) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
}
static __device__ __forceinline__ void atw_turn_pass(int wg) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (wg ^ 1)) : "memory");
}

#endif

// SCHED: ATW_PLAIN (each warpgroup waits for S, then for P V), ATW_OVERLAP (S_{n+1} issued with P_n V_n, softmax
// under the latter), ATW_PINGPONG (ATW_OVERLAP, and the two warpgroups take turns issuing their GEMMs, so that
// one's softmax runs under the other's GEMMs)
enum { ATW_PLAIN, ATW_OVERLAP, ATW_PINGPONG };
#define ATW_ENGINE_SCHED ATW_PINGPONG
#define ATW_ENGINE_STAGES 3

template <int HD, int SCHED, int STAGES>
__global__ void __launch_bounds__(ATW_THREADS, 1)
    atw_fwd_kernel(const __grid_constant__ CUtensorMap map, __nv_bfloat16 *__restrict__ out, int T, int nh, int nkv,
                   float sl2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = ATW_BM, BN = ATW_BN;
    constexpr int NT = BN / 8;  // n8 tiles of S
    constexpr int DT = HD / 8;  // n8 tiles of O
    constexpr int PS = BN / 16; // k-steps of O += P V
    constexpr int QB = atw_smem<HD, STAGES>::q_bytes, KVB = atw_smem<HD, STAGES>::kv_bytes;
    static_assert(HD == 128 && BM == 128 && BN == 128, "the m64n128 wgmma wrappers and the ring assume these");
    extern __shared__ uint8_t atw_raw[];
    __shared__ __align__(8) uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
    uint8_t *smem = (uint8_t *)(((uintptr_t)atw_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t sq = smem_u32(smem), skv = sq + QB; // stage s: K at skv + 2 s KVB, V at + KVB

    const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x, m0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const int kvh = h / (nh / nkv);
    const int ntiles = min(T - 1, m0 + BM - 1) / BN + 1;
    if (tid == 0) {
        bulk_barrier_init(&q_full, 1);
        for (int s = 0; s < STAGES; s++) {
            bulk_barrier_init(&k_full[s], 1);
            bulk_barrier_init(&v_full[s], 1);
            bulk_barrier_init(&k_empty[s], ATW_CONSUMERS);
            bulk_barrier_init(&v_empty[s], ATW_CONSUMERS);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    if (wg == ATW_CONSUMERS) { // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ATW_PRODUCER_REGS));
        if (warp == ATW_CONSUMERS * 4 && lane == 0) {
            bulk_barrier_expect(&q_full, QB);
            for (int hf = 0; hf < HD / 64; hf++)
                bulk_tensor_load_2d(smem + hf * BM * 128, &map, h * HD + hf * 64, m0, &q_full);
            for (int n = 0; n < ntiles; n++) {
                const int s = n % STAGES;
                const uint32_t par = (uint32_t)((n / STAGES - 1) & 1);
                uint8_t *k = smem + QB + s * 2 * KVB, *v = k + KVB;
                if (n >= STAGES) bulk_barrier_wait(&k_empty[s], par);
                bulk_barrier_expect(&k_full[s], KVB);
                for (int hf = 0; hf < HD / 64; hf++)
                    bulk_tensor_load_2d(k + hf * BN * 128, &map, (nh + kvh) * HD + hf * 64, n * BN, &k_full[s]);
                if (n >= STAGES) bulk_barrier_wait(&v_empty[s], par);
                bulk_barrier_expect(&v_full[s], KVB);
                for (int hf = 0; hf < HD / 64; hf++)
                    bulk_tensor_load_2d(v + hf * BN * 128, &map, (nh + nkv + kvh) * HD + hf * 64, n * BN, &v_full[s]);
            }
        }
    } else { // the consumers
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ATW_CONSUMER_REGS));
        const int g = lane >> 2, c = lane & 3;
        const int r0 = m0 + wg * 64 + (warp & 3) * 16 + g; // this thread's rows r0 and r0 + 8
        const int wg0 = m0 + wg * 64;                      // the warpgroup's first row
        float o[DT][4], s[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
        uint32_t p[PS][4];
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
        bulk_barrier_wait(&q_full, 0);

        // stage addresses of tile n: K at kv(n), V at kv(n) + KVB; full-barrier parity of tile n
#define ATW_KV(n) (skv + ((n) % STAGES) * 2 * KVB)
#define ATW_PAR(n) ((uint32_t)(((n) / STAGES) & 1))
        const uint32_t sqw = sq + wg * 64 * 128; // the warpgroup's Q rows
        const bool lead = (tid & 127) == 0;      // arrives on the empty barriers for its warpgroup
        // K_n goes back once S_n is done, V_n once P_n V_n is
        if (SCHED == ATW_PLAIN) {
            for (int n = 0; n < ntiles; n++) {
                bulk_barrier_wait(&k_full[n % STAGES], ATW_PAR(n));
                atw_issue_qk<HD>(s, sqw, ATW_KV(n));
                wgmma_wait<0>();
                atw_own_s(s);
                if (lead) bulk_barrier_arrive(&k_empty[n % STAGES]);
                atw_mask_softmax(s, n * BN, wg0, r0, c, m, l, alpha, sl2);
                atw_rescale(o, alpha);
                atw_pack(p, s);
                bulk_barrier_wait(&v_full[n % STAGES], ATW_PAR(n));
                atw_issue_pv(o, p, ATW_KV(n) + KVB);
                wgmma_wait<0>();
                atw_own_op(o, p);
                if (lead) bulk_barrier_arrive(&v_empty[n % STAGES]);
            }
        } else {
            const bool pp = SCHED == ATW_PINGPONG;
            if (pp && wg == 1) atw_turn_pass(wg); // warpgroup 0 goes first
            bulk_barrier_wait(&k_full[0], 0);
            if (pp) atw_turn_wait(wg);
            atw_issue_qk<HD>(s, sqw, ATW_KV(0));
            if (pp) atw_turn_pass(wg);
            wgmma_wait<0>();
            atw_own_s(s);
            if (lead) bulk_barrier_arrive(&k_empty[0]);
            atw_mask_softmax(s, 0, wg0, r0, c, m, l, alpha, sl2);
            atw_pack(p, s);
            for (int n = 1; n < ntiles; n++) {
                bulk_barrier_wait(&k_full[n % STAGES], ATW_PAR(n));
                bulk_barrier_wait(&v_full[(n - 1) % STAGES], ATW_PAR(n - 1));
                if (pp) atw_turn_wait(wg);
                atw_issue_qk<HD>(s, sqw, ATW_KV(n));
                atw_issue_pv(o, p, ATW_KV(n - 1) + KVB);
                if (pp) atw_turn_pass(wg);
                wgmma_wait<1>(); // S_n is done; P_{n-1} V_{n-1} may still run
                atw_own_s(s);
                if (lead) bulk_barrier_arrive(&k_empty[n % STAGES]);
                atw_mask_softmax(s, n * BN, wg0, r0, c, m, l, alpha, sl2);
                wgmma_wait<0>();
                atw_own_op(o, p);
                if (lead) bulk_barrier_arrive(&v_empty[(n - 1) % STAGES]);
                atw_rescale(o, alpha);
                atw_pack(p, s);
            }
            bulk_barrier_wait(&v_full[(ntiles - 1) % STAGES], ATW_PAR(ntiles - 1));
            if (pp) atw_turn_wait(wg);
            atw_issue_pv(o, p, ATW_KV(ntiles - 1) + KVB);
            if (pp && wg == 0) atw_turn_pass(wg); // the last turn: warpgroup 1 has none to pass
            wgmma_wait<0>();
            atw_own_op(o, p);
            if (lead) bulk_barrier_arrive(&v_empty[(ntiles - 1) % STAGES]);
        }
#undef ATW_KV
#undef ATW_PAR

        // epilogue: O / l as bf16 pairs straight from the fragment, rows < T
        const int64_t ldo = (int64_t)nh * HD;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float ls = l[hf];
            ls += __shfl_xor_sync(0xffffffffu, ls, 1);
            ls += __shfl_xor_sync(0xffffffffu, ls, 2);
            const float inv = 1.0f / ls; // l >= 1: the row's max contributes exp2(0)
            const int t = r0 + 8 * hf;
            if (t >= T) continue;
            __nv_bfloat16 *dst = out + (int64_t)t * ldo + (int64_t)h * HD + 2 * c;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(uint32_t *)(dst + dt * 8) = att_pack_bf16(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
        }
    }
#else
    (void)map, (void)out, (void)T, (void)nh, (void)nkv, (void)sl2;
    __trap();
#endif
}

// ---- host ----

static void atw_fail(const char *what, int64_t T, int32_t nh, int32_t nkv, int32_t hd) {
    fprintf(stderr, "fp8moe: fm_cuda_attention_wgmma(T=%lld, nh=%d, nkv=%d, hd=%d): %s\n", (long long)T, nh, nkv, hd,
            what);
    abort();
}

// One launch of a schedule (the lab compares them; the engine runs ATW_ENGINE_SCHED)
template <int HD, int SCHED, int STAGES>
static void atw_launch(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, __nv_bfloat16 *out,
                       cudaStream_t stream) {
    static bool allowed = false;
    if (!allowed) {
        FM_CUDA_CHECK(cudaFuncSetAttribute(atw_fwd_kernel<HD, SCHED, STAGES>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, atw_smem<HD, STAGES>::bytes));
        allowed = true;
    }
    // qkv as a 2-D tensor [T][(nh + 2 nkv) hd] bf16, boxes of 128 rows x 64 columns (128 bytes): one half of a
    // Q, K or V tile; rows past T read as zeros
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)(nh + 2 * nkv) * HD, (cuuint64_t)T};
    const cuuint64_t strides[1] = {(cuuint64_t)(nh + 2 * nkv) * HD * 2};
    const cuuint32_t box[2] = {64, ATW_BM}, elem[2] = {1, 1};
    const CUresult r = fm_tensor_map_encoder("the wgmma attention")(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)qkv, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) atw_fail("cuTensorMapEncodeTiled failed for qkv", T, nh, nkv, HD);
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD)); // log2(e) / sqrt(hd)
    atw_fwd_kernel<HD, SCHED, STAGES>
        <<<dim3((unsigned)nh, (unsigned)fm_ceil_div(T, ATW_BM)), ATW_THREADS, atw_smem<HD, STAGES>::bytes, stream>>>(
            map, out, (int)T, nh, nkv, sl2);
    FM_LAUNCH_CHECK("attention_wgmma");
}

extern "C" bool fm_cuda_attention_wgmma_supported(int32_t hd) { return hd == 128; }

extern "C" void fm_cuda_attention_wgmma(const __nv_bfloat16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                        __nv_bfloat16 *out, cudaStream_t stream) {
    if (!qkv || !out) atw_fail("null pointer", T, nh, nkv, hd);
    if (T < 1 || T > INT32_MAX) atw_fail("T must be in [1, 2^31)", T, nh, nkv, hd);
    if (fm_ceil_div(T, ATW_BM) > 65535) atw_fail("T too large for the grid (query tiles > 65535)", T, nh, nkv, hd);
    if (nh < 1 || nkv < 1 || nh % nkv != 0) atw_fail("need nh >= 1, nkv >= 1 and nh % nkv == 0", T, nh, nkv, hd);
    if (!fm_cuda_attention_wgmma_supported(hd))
        atw_fail("head dim not supported by the wgmma kernel (route attention.kernel=mma)", T, nh, nkv, hd);
    if (((uintptr_t)qkv | (uintptr_t)out) % 16 != 0) atw_fail("qkv and out must be 16-byte aligned", T, nh, nkv, hd);
    static int sm_major = 0;
    if (!sm_major) sm_major = fm_cuda_device_attr(cudaDevAttrComputeCapabilityMajor);
    if (sm_major != 9) atw_fail("needs an sm_90 GPU (route attention.kernel=mma elsewhere)", T, nh, nkv, hd);
    atw_launch<128, ATW_ENGINE_SCHED, ATW_ENGINE_STAGES>(qkv, T, nh, nkv, out, stream);
}
