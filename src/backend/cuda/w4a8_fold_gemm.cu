// The grouped W4A8 GEMM of int4-p2 banks with the group scale folded into the e4m3 operand (sm_90a), its per-token
// activation quantizer, and the repack of an int4-tc bank into its code layout. The arithmetic, the code layout and
// the CPU's emulation: backend/w4a8_fold.h. Why: today's kernel (w4a8_gemm_wgmma.cu) is bound by instruction
// issue, ~132 of its 342 instructions per warp and 128-group promoting the accumulator with two scales per element
// (bench/NOTES.md 2026-12-02 "the GEMM's epilogues through shared memory"). With the group scale inside the operand
// and one activation scale per token, the promotion is a FADD every P groups, and the conversion moves to a warpgroup
// of its own (bench/NOTES.md 2026-12-05 twenty-third session has the counts and the predictions).
//
// CTA: 384 threads, one tile of BNT activation rows (64, 32 or 16) x BM = 256 weight rows (the int4-tc kernel's
// tiles and grid: grid.x over 256-row bands of the bank, grid.y over the dispatch's tiles).
//   threads   0..255  two consumer warpgroups; warpgroup c owns weight rows 128c..128c+127 as two m64 blocks (the
//                     int4-tc kernel's row ownership, so its epilogue runs unchanged on their accumulators)
//   threads 256..383  the producer warpgroup: thread pt converts rows pt and pt + 128 of the band
// Shared memory (dynamic, 1024-aligned): a ring of FOLD_STAGES stages, each
//   a[256][128]  e4m3 weights of one 128-group, 128-byte rows in the 128-byte swizzle (the producer's stores)
//   b[BNT][128]  e4m3 activations of the group, same swizzle (the producer's cp.async)
//   xsc[BNT]     PER_GROUP only: the group's activation scales
// and full / empty mbarriers per stage (full: the producer's 128 threads arrive once the stage's conversion is
// stored and its cp.async landed; empty: the 8 consumer warps once their wgmmas that read it completed, or
// with PER_GROUP the 256 consumer threads once they read its scales too), rs[256]
// (each weight row's scale x 2^-6, for the epilogue), the epilogue's reductions. The epilogue's scratch is the b
// stages (free once both warpgroups are past their last group: the epilogue's first barrier).
// Per 128-group, a consumer warpgroup issues 2 blocks x 4 k steps of wgmma.m64nBNTk32 e4m3 with both operands in
// shared memory into its partial; every P groups (FM_FOLD_PROMOTE; 1 for PER_GROUP) it waits and adds the partial
// into the fp32 accumulator (PER_GROUP: a FFMA with the activation scale). Between promotions it waits only for
// the previous group's wgmmas (wait_group 1), to hand that stage back.
// The producer, per group: the codes (8 x 16 bytes a thread) and scales of the group FOLD_AHEAD ahead into
// registers, that group's activations by cp.async, then this group's conversion: per row and group a table of 8 e4m3
// bytes from the scale's exponent (2 IMAD), per 8 codes 7 instructions (w4a8_fold.h), 16-byte stores into the
// swizzled rows. The floor it chases: the tensor cores' time for the FLOPs (Qwen3-30B-A3B experts, T = 2048: 155
// GFLOP, ~80 us at the dense FP8 rate), with the producer's ~320 instructions per warp and group on one warp per
// scheduler beside two consumer warps of ~70 (today's kernel: two warps of 342), bench/NOTES.md 2026-12-05.
#include <cuda_fp8.h>

#include "backend/cuda/w4a8_fold_gemm.h"
#include "backend/cuda/w4a8_gemm_device.cuh"
extern "C" {
#include "backend/w4a8_fold.h"
}

#define FOLD_STAGES 4
#define FOLD_AHEAD 2 /* groups the producer's loads run ahead of its conversion (< FOLD_STAGES) */
static_assert(FOLD_AHEAD == 2 && FOLD_AHEAD < FOLD_STAGES, "the producer rotates three code register sets");
#define FOLD_THREADS 384
#define FOLD_CONSUMERS 256 /* the epilogue's THREADS */
static_assert(FOLD_CONSUMERS == THREADS, "the consumers are the int4-tc kernel's 256 threads (its epilogue)");

template <int BNT> struct fold_layout {
    static constexpr int a_bytes = BM * 128, b_bytes = BNT * 128;
    static constexpr int a_off = 0;                                        /* [STAGES][a_bytes] */
    static constexpr int b_off = a_off + FOLD_STAGES * a_bytes;            /* [STAGES][b_bytes] */
    static constexpr int xsc_off = b_off + FOLD_STAGES * b_bytes;          /* float [STAGES][BNT] */
    static constexpr int rs_off = xsc_off + FOLD_STAGES * BNT * 4;         /* float [BM] */
    static constexpr int red_off = rs_off + BM * 4;                        /* float [8][BNT] */
    static constexpr int red_sum_off = red_off + (THREADS / 32) * BNT * 4; /* float [1][BNT] (unused) */
    static constexpr int bar_off = (red_sum_off + BNT * 4 + 7) / 8 * 8;    /* uint64 full[STAGES], empty[STAGES] */
    static constexpr int bytes = bar_off + 2 * FOLD_STAGES * 8 + 1024;     /* + the alignment of the base */
    static_assert(FOLD_STAGES * b_bytes >= epi_scratch<BNT>::bytes, "epilogue scratch in the activation stages");
};

// ---- mbarriers (sm_90) ------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FOLD_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FOLD_ASM(...) __trap()
#endif
static __device__ __forceinline__ void fold_bar_init(uint32_t bar, unsigned count) {
    FOLD_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void fold_bar_arrive(uint32_t bar) {
    FOLD_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void fold_bar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        FOLD_ASM("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    } while (!done);
}
// generic-proxy stores (st.shared, cp.async) made visible to the async proxy (wgmma's operand reads)
static __device__ __forceinline__ void fold_fence_proxy(void) {
    FOLD_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- wgmma with both operands in shared memory ----------------------------------------------------------------
template <int BNT>
static __device__ __forceinline__ void wgmma_ss(float d[BNT / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BNT == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                     "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
                     : WGMMA_PART_ARGS(d)
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    } else if constexpr (BNT == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                       "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                       "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    } else {
        static_assert(BNT == 16, "wgmma tiles: n64, n32 or n16");
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                       "+f"(d[1][2]), "+f"(d[1][3])
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    }
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}

// ---- the producer's pieces ----------------------------------------------------------------------------------
typedef struct fold_codes {
    uint4 v[2][4]; // rows pt, pt + 128; segments 0..3
    uint32_t s[2]; // their bf16 scale bits
} fold_codes;

// Where a producer thread reads its two rows: each row's group-0 codes and scale, and the strides, in bytes and
// elements, as 32-bit offsets (the launcher checks that an expert's codes fit): one add per load instead of the 64-bit
// products of (group, segment, row) that took ~100 instructions per warp and group.
typedef struct fold_rows {
    const uint8_t *codes;   /* row pt of the band at group 0, segment 0 (row pt + 128: 2048 bytes on) */
    const uint16_t *scales; /* its group-0 scale (row pt + 128: 128 on) */
    uint32_t seg;           /* bytes from one segment to the next: rows_pad x 16 */
    uint32_t grp_scales;    /* elements from one group's scales to the next: rows_pad */
} fold_rows;

// Codes and scales of group grp for this producer thread's two rows (zeros past the bank's padded rows)
static __device__ __forceinline__ void fold_load_codes(const fold_rows &w, int grp, const bool ok[2], fold_codes &c) {
    const uint32_t off = (uint32_t)grp * 4u * w.seg;
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int s = 0; s < 4; s++)
            c.v[h][s] = ok[h] ? __ldg((const uint4 *)(w.codes + off + (uint32_t)s * w.seg + h * 128 * 16))
                              : make_uint4(0u, 0u, 0u, 0u);
        c.s[h] =
            ok[h] ? (uint32_t)__ldg((const unsigned short *)(w.scales + (uint32_t)grp * w.grp_scales + h * 128)) : 0u;
    }
}

// One row's 128 codes of a group into its swizzled e4m3 row (w4a8_fold.h: the table of exponent j, 7 instructions
// per 8 codes)
static __device__ __forceinline__ void fold_convert_row(const uint4 v[4], int32_t j, uint8_t *row, int r) {
    const uint32_t tlo = FM_FOLD_TLO0 + (uint32_t)j * FM_FOLD_TLO_STEP;
    const uint32_t thi = FM_FOLD_THI0 + (uint32_t)j * FM_FOLD_THI_STEP;
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t w[4] = {v[s].x, v[s].y, v[s].z, v[s].w};
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t sel = w[i] & 0x77777777u;
            o[2 * i] = __byte_perm(tlo, thi, sel) | (w[i] & 0x80808080u);
            o[2 * i + 1] = __byte_perm(tlo, thi, sel >> 16) | ((w[i] << 4) & 0x80808080u);
        }
        /* k 32s .. 32s + 31: 16-byte chunks 2s, 2s + 1 of the row, XOR-swizzled by the row within its 8 */
        *(uint4 *)(row + (((2 * s) ^ (r & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)(row + (((2 * s + 1) ^ (r & 7)) << 4)) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

// This producer thread's share of the activation stage of group grp (BNT rows x 128 bytes: BNT / 16 chunks of 16
// bytes a thread; rows past the tile zero-filled) and, PER_GROUP, the rows' scales of the group.
template <int BNT, int AS>
static __device__ __forceinline__ void fold_load_acts(const gemm_params &p, const fm_w4a8_tile &tile, int pt,
                                                      int64_t grp, uint8_t *b, float *xsc) {
    const uint32_t base = smem_u32(b);
#pragma unroll
    for (int i = 0; i < BNT / 16; i++) {
        const int c = pt + i * 128, n = c >> 3, ch = c & 7;
        const bool ok = n < tile.rows;
        cp_async16(base + n * 128 + ((ch ^ (n & 7)) << 4),
                   p.x + (int64_t)(tile.slot0 + (ok ? n : 0)) * p.ldx + grp * 128 + ch * 16, ok ? 16 : 0);
    }
    if (AS == FM_FOLD_PER_GROUP && pt < BNT) {
        const bool ok = pt < tile.rows;
        cp_async4(smem_u32(xsc + pt), p.xs + grp * p.lds + tile.slot0 + (ok ? pt : 0), ok ? 4 : 0);
    }
}

template <int EPILOGUE, int BNT, int AS>
static __global__ __launch_bounds__(FOLD_THREADS, 1) void w4a8_fold_kernel(const gemm_params p) {
    /* compiled for every architecture (its asm traps below sm_90, the wgmmas below sm_90a); launched on sm_90 only */
    typedef fold_layout<BNT> L;
    extern __shared__ uint8_t fold_smem_raw[];
    /* the 1024-byte alignment as an offset from the shared array itself, not through an integer cast: the compiler
       then knows every pointer below is shared memory (STS/LDS; a cast made them generic ST/LD with 64-bit address
       arithmetic, ~50 instructions per producer warp and group) */
    uint8_t *sm = fold_smem_raw + ((1024u - (smem_u32(fold_smem_raw) & 1023u)) & 1023u);
    float *rs = (float *)(sm + L::rs_off);
    const uint32_t full0 = smem_u32(sm + L::bar_off), empty0 = full0 + 8 * FOLD_STAGES;
    constexpr unsigned FOLD_EMPTY_ARRIVALS = AS == FM_FOLD_PER_GROUP ? FOLD_CONSUMERS : FOLD_CONSUMERS / 32;

    /* PDL (pdl.cuh): the tiles, the activations and their scales are the dispatch's (or, for the down GEMM, the gate|up
       GEMM's): nothing is read before the wait, so the launch and the shared-memory setup overlap the kernel before */
    pdl_wait();
    const int64_t tile_idx = blockIdx.y;
    if (p.n_tiles && tile_idx >= *p.n_tiles) return;
    const fm_w4a8_tile tile = tile_of<BNT>(p, tile_idx);
    const int64_t KG = p.n_groups, row0 = (int64_t)blockIdx.x * BM;
    if (threadIdx.x == 0) {
        for (int st = 0; st < FOLD_STAGES; st++) {
            fold_bar_init(full0 + 8 * st, 128);
            fold_bar_init(empty0 + 8 * st, FOLD_EMPTY_ARRIVALS);
        }
        FOLD_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    /* the warpgroup's role, uniform in the compiler's eyes (a branch on threadIdx it takes for divergent, and then
       serialises the wgmmas behind it: ptxas C7518) */
    const int role = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    if (role == FOLD_CONSUMERS / 128) { /* ---- the producer warpgroup ---- */
        const int pt = (int)threadIdx.x - FOLD_CONSUMERS;
        const int G = (int)KG;
        const bool ok[2] = {row0 + pt < p.rows_pad, row0 + pt + 128 < p.rows_pad};
        fold_rows w;
        w.seg = (uint32_t)p.rows_pad * 16u, w.grp_scales = (uint32_t)p.rows_pad;
        w.codes = p.wq + ((int64_t)tile.expert * G * 4 * p.rows_pad + row0 + pt) * 16;
        w.scales = (const uint16_t *)p.ws + (int64_t)tile.expert * G * p.rows_pad + row0 + pt;
        /* the first two groups' codes and activations in flight before the row scales' pass below, which waits on
           its own loads (they used to wait for it: one more memory latency per CTA, before any conversion) */
        fold_codes c0, c1, c2;
        fold_load_codes(w, 0, ok, c0);
        fold_load_acts<BNT, AS>(p, tile, pt, 0, sm + L::b_off, (float *)(sm + L::xsc_off));
        cp_async_commit();
        if (G > 1) {
            fold_load_codes(w, 1, ok, c1);
            fold_load_acts<BNT, AS>(p, tile, pt, 1, sm + L::b_off + L::b_bytes, (float *)(sm + L::xsc_off) + BNT);
        }
        cp_async_commit();
        /* each row's scale: the largest of its group scales (bf16 bits of positive values order as the values) */
        uint32_t er[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t m = 0u;
            if (ok[h])
#pragma unroll 8
                for (int g = 0; g < G; g++)
                    m = max(m,
                            (uint32_t)__ldg((const unsigned short *)(w.scales + (uint32_t)g * w.grp_scales + h * 128)));
            er[h] = (m >> 7) & 0xFFu;
            rs[pt + 128 * h] = __uint_as_float(m << 16) * 0.015625f; /* x 2^-FM_FOLD_J_BIAS: exact */
        }
        /* one group: group grp + FOLD_AHEAD's activations and codes put in flight (into the code registers that held
           grp - 1), this group's conversion, the stage full */
        auto step = [&](int grp, const fold_codes &cur, fold_codes &ahead) {
            const int st = grp % FOLD_STAGES;
            const int nx = grp + FOLD_AHEAD;
            if (nx < G) {
                const int sn = nx % FOLD_STAGES;
                if (nx >= FOLD_STAGES) fold_bar_wait(empty0 + 8 * sn, (uint32_t)((nx / FOLD_STAGES - 1) & 1));
                fold_load_acts<BNT, AS>(p, tile, pt, nx, sm + L::b_off + sn * L::b_bytes,
                                        (float *)(sm + L::xsc_off) + sn * BNT);
                fold_load_codes(w, nx, ok, ahead);
            }
            cp_async_commit();
            uint8_t *a = sm + L::a_off + st * L::a_bytes;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                /* j = k + 6 from the exponent fields (a zero scale's codes are zeros: any table gives 0 for them) */
                const int32_t j = (int32_t)((cur.s[h] >> 7) & 0xFFu) - (int32_t)er[h] + FM_FOLD_J_BIAS;
                const int r = pt + 128 * h;
                fold_convert_row(cur.v[h], j, a + r * 128, r);
            }
            cp_async_wait<FOLD_AHEAD>(); /* this group's activations landed (committed FOLD_AHEAD groups ago) */
            fold_fence_proxy();
            fold_bar_arrive(full0 + 8 * st);
        };
        /* three sets of code registers in turn, two groups in flight while one converts (one group ahead would leave
           the DRAM latency of an expert's first tile, ~1 us, exposed against a group's predicted ~0.35 us); no copies
           between them */
        for (int grp = 0; grp < G; grp += 3) {
            step(grp, c0, c2);
            if (grp + 1 < G) step(grp + 1, c1, c0);
            if (grp + 2 < G) step(grp + 2, c2, c1);
        }
        return;
    }

    /* ---- the consumer warpgroups ---- */
    const int warp = threadIdx.x >> 5, wg = warp >> 2, w4 = warp & 3, lane = threadIdx.x & 31;
    const int64_t blk0 = (row0 + wg * 128) / 16 + w4; /* m64 block mb: 16-row block blk0 + 4 mb */
    const int64_t blk[2] = {blk0, blk0 + 4};
    const bool blk_ok[2] = {blk[0] * 16 < p.rows_pad, blk[1] * 16 < p.rows_pad};
    constexpr int P = AS == FM_FOLD_PER_TOKEN ? FM_FOLD_PROMOTE : 1;
    float acc[2][BNT / 8][4], part[2][BNT / 8][4];
#pragma unroll
    for (int mb = 0; mb < 2; mb++)
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mb][nt][i] = 0.0f, part[mb][nt][i] = 0.0f;
    const uint32_t a0 = smem_u32(sm + L::a_off) + (uint32_t)(wg * 128 * 128), b0 = smem_u32(sm + L::b_off);
    const int t = lane & 3;

    /* one group's wgmmas into the partial (overwriting it when `first`), issued once the stage is full */
    auto issue = [&](int64_t grp, bool first) {
        const int st = (int)(grp % FOLD_STAGES);
        fold_bar_wait(full0 + 8 * st, (uint32_t)((grp / FOLD_STAGES) & 1));
        const uint32_t as = a0 + st * L::a_bytes, bs = b0 + st * L::b_bytes;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
                wgmma_ss<BNT>(part[mb], desc_sw128(as + mb * 64 * 128 + 32 * ks), desc_sw128(bs + 32 * ks),
                              !(first && ks == 0));
        wgmma_commit();
    };
    /* the stage of group grp back to the producer: once per warp after the warp's sync, or, where the consumers read
       the stage with generic loads (PER_GROUP: its activation scales), by every consumer thread, so that each read is
       ordered before the producer's next cp.async into the stage by the thread's own arrive (racecheck reported the
       one-lane release as a race with that cp.async, H100, 2026-12-05, with and without PDL) */
    auto release = [&](int64_t grp) {
        if (AS == FM_FOLD_PER_GROUP) {
            fold_bar_arrive(empty0 + 8 * (int)(grp % FOLD_STAGES));
            return;
        }
        __syncwarp();
        if (lane == 0) fold_bar_arrive(empty0 + 8 * (int)(grp % FOLD_STAGES));
    };
    auto settle = [&]() {
#pragma unroll
        for (int mb = 0; mb < 2; mb++)
#pragma unroll
            for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) fence_f(part[mb][nt][i]);
    };
    /* The waits sit where ptxas can see them on every path to the partial's reads (a wait under a runtime condition
       made it insert its own: C7517). */
    if (AS == FM_FOLD_PER_TOKEN) {
        for (int64_t g0 = 0; g0 < KG; g0 += P) {
            if (g0 + P <= KG) { /* a whole block: between its groups, wait for the group before only */
#pragma unroll
                for (int q = 0; q < P; q++) {
                    issue(g0 + q, q == 0);
                    if (q + 1 < P) wgmma_wait<1>();
                    else wgmma_wait<0>();
                    if (q > 0) release(g0 + q - 1);
                    if (q + 1 == P) release(g0 + q);
                }
            } else { /* the last, shorter block */
                for (int64_t grp = g0; grp < KG; grp++) {
                    issue(grp, grp == g0);
                    wgmma_wait<0>();
                    release(grp);
                }
            }
            settle();
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
#pragma unroll
                for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[mb][nt][i] += part[mb][nt][i];
        }
    } else {
        for (int64_t grp = 0; grp < KG; grp++) { /* acc = fma(part, the column's activation scale, acc) */
            issue(grp, true);
            wgmma_wait<0>();
            settle();
            const float *xsc = (const float *)(sm + L::xsc_off) + (grp % FOLD_STAGES) * BNT;
#pragma unroll
            for (int nt = 0; nt < BNT / 8; nt++) {
                const float2 s = *(const float2 *)(xsc + nt * 8 + 2 * t);
#pragma unroll
                for (int mb = 0; mb < 2; mb++) {
                    acc[mb][nt][0] = fmaf(part[mb][nt][0], s.x, acc[mb][nt][0]);
                    acc[mb][nt][1] = fmaf(part[mb][nt][1], s.y, acc[mb][nt][1]);
                    acc[mb][nt][2] = fmaf(part[mb][nt][2], s.x, acc[mb][nt][2]);
                    acc[mb][nt][3] = fmaf(part[mb][nt][3], s.y, acc[mb][nt][3]);
                }
            }
            release(grp);
        }
    }

    /* the scales: y = acc x (rs 2^-6 x s_token) per token, acc x rs 2^-6 per group (rs written before the producer's
       first arrival, which every consumer waited for) */
    const int g = lane >> 2;
    float sx[BNT / 8][2];
#pragma unroll
    for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int n = nt * 8 + 2 * t + c;
            /* a plain load: the dispatch wrote xs (under PDL, never through the non-coherent path) */
            sx[nt][c] = AS == FM_FOLD_PER_GROUP ? 1.0f : n < tile.rows ? p.xs[tile.slot0 + n] : 0.0f;
        }
#pragma unroll
    for (int mb = 0; mb < 2; mb++) {
        const int lr = wg * 128 + mb * 64 + w4 * 16 + g;
        const float r0 = rs[lr], r1 = rs[lr + 8];
#pragma unroll
        for (int nt = 0; nt < BNT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                if (AS == FM_FOLD_PER_TOKEN) {
                    acc[mb][nt][c] *= r0 * sx[nt][c];
                    acc[mb][nt][2 + c] *= r1 * sx[nt][c];
                } else {
                    acc[mb][nt][c] *= r0;
                    acc[mb][nt][2 + c] *= r1;
                }
            }
    }
    epilogue<EPILOGUE, BNT>(p, tile, acc, blk, blk_ok, (float(*)[BNT])(sm + L::red_off),
                            (float(*)[BNT])(sm + L::red_sum_off), sm + L::b_off);
}

template <int EPILOGUE, int BNT, int AS> static void fold_launch(const gemm_params &p, dim3 grid, cudaStream_t s) {
    constexpr int smem = fold_layout<BNT>::bytes;
    FM_CUDA_CHECK(
        cudaFuncSetAttribute(w4a8_fold_kernel<EPILOGUE, BNT, AS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    pdl_launch(w4a8_fold_kernel<EPILOGUE, BNT, AS>, grid, FOLD_THREADS, smem, s, p.pdl, p);
}

template <int BNT>
static void fold_launch_tile(const fm_fold_gemm_args *a, const gemm_params &p, dim3 grid, cudaStream_t s) {
    const bool tok = a->ascale == FM_FOLD_PER_TOKEN;
    if (a->out == FM_FOLD_OUT_BF16) {
        if (tok) fold_launch<EPI_BF16, BNT, FM_FOLD_PER_TOKEN>(p, grid, s);
        else fold_launch<EPI_BF16, BNT, FM_FOLD_PER_GROUP>(p, grid, s);
    } else {
        if (tok) fold_launch<EPI_SWIGLU, BNT, FM_FOLD_PER_TOKEN>(p, grid, s);
        else fold_launch<EPI_SWIGLU, BNT, FM_FOLD_PER_GROUP>(p, grid, s);
    }
}

extern "C" bool fm_cuda_fold_supported(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return false;
    return major == 9;
}

extern "C" void fm_cuda_w4a8_fold_gemm(const fm_fold_gemm_args *a, void *stream) {
    const char *bad =
        !a->codes || !a->scales                                         ? "bank"
        : a->rows_pad % 32 || a->rows > a->rows_pad || a->n_groups <= 0 ? "bank shape"
        : a->rows_pad * a->n_groups * 64 > (int64_t)UINT32_MAX          ? "bank shape (a matrix's codes past 4 GB)"
        : !a->x || !a->xs || a->ldx < 128 * a->n_groups || a->ldx % 16  ? "activations"
        : (uintptr_t)a->x % 16 || (uintptr_t)a->codes % 16              ? "alignment"
        : a->max_tiles <= 0 || a->max_tiles > 65535                     ? "tiles"
        : (a->tiles == NULL) != (a->n_tiles == NULL)                    ? "tile list"
        : a->out == FM_FOLD_OUT_BF16 && !a->y                           ? "y"
        : a->out == FM_FOLD_OUT_SWIGLU_E4M3 && (!a->interleaved || !a->h || !a->hs) ? "h"
        : !(a->tile_rows == FM_W4A8_BN || a->tile_rows == FM_W4A8_BN_MID || a->tile_rows == FM_W4A8_BN_SMALL)
            ? "tile rows"
        : !fm_cuda_fold_supported() ? "device (sm_90 only)"
                                    : NULL;
    if (bad) {
        fprintf(stderr, "fp8moe: w4a8_fold_gemm: bad arguments: %s\n", bad);
        abort();
    }
    gemm_params p;
    memset(&p, 0, sizeof p);
    p.wq = a->codes, p.ws = (const __nv_bfloat16 *)a->scales;
    p.rows = a->rows, p.rows_pad = a->rows_pad, p.n_groups = a->n_groups, p.interleaved = a->interleaved;
    p.x = a->x, p.ldx = a->ldx, p.xs = a->xs, p.lds = a->lds;
    p.tiles = (const fm_w4a8_tile *)a->tiles, p.n_tiles = a->n_tiles, p.m_dense = a->m_dense;
    p.dense_matrix = a->dense_matrix, p.pdl = a->pdl;
    p.y = (__nv_bfloat16 *)a->y, p.ldy = a->ldy, p.row_map = a->row_map;
    p.h = a->h, p.ldh = a->ldh, p.hs = a->hs, p.ldhs = a->ldhs;
    const dim3 grid((unsigned)fm_ceil_div(a->rows_pad, BM), (unsigned)a->max_tiles);
    cudaStream_t s = (cudaStream_t)stream;
    if (a->tile_rows == FM_W4A8_BN_SMALL) fold_launch_tile<FM_W4A8_BN_SMALL>(a, p, grid, s);
    else if (a->tile_rows == FM_W4A8_BN_MID) fold_launch_tile<FM_W4A8_BN_MID>(a, p, grid, s);
    else fold_launch_tile<FM_W4A8_BN>(a, p, grid, s);
    FM_LAUNCH_CHECK("w4a8 fold GEMM");
}

// ---- per-token e4m3 activations ---------------------------------------------------------------------------------
// One warp per row: the amax over the row, then each element divided by the scale (the CPU's division, so that the
// codes agree bit for bit) and rounded to e4m3; the row's padding to ld8 written as zeros. V: 8 elements a lane at a
// time (16-byte loads, 8-byte stores) where the shapes and pointers allow, else one.
template <int V>
static __global__ void fold_quantize_tokens_kernel(const __nv_bfloat16 *x, int64_t ldx, const int32_t *src_of,
                                                   int32_t src_div, int64_t rows, int64_t K, uint8_t *x8, int64_t ld8,
                                                   float *xs) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int64_t src = src_of ? __ldg(src_of + row) / src_div : row;
    const __nv_bfloat16 *xr = x + src * ldx;
    float m = 0.0f;
    for (int64_t i = (int64_t)lane * V; i < K; i += 32 * V) {
        if constexpr (V == 8) {
            const uint4 v = __ldg((const uint4 *)(xr + i));
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 4; q++) /* fmaxf skips NaN */
                m = fmaxf(m, fmaxf(fabsf(__uint_as_float(w[q] << 16)), fabsf(__uint_as_float(w[q] & 0xFFFF0000u))));
        } else {
            m = fmaxf(m, fabsf(__bfloat162float(xr[i])));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float scale = fmaxf(m / 448.0f, 1e-12f); /* FM_E4M3_MAX, FM_ACT_SCALE_FLOOR */
    uint8_t *out = x8 + row * ld8;
    for (int64_t i = (int64_t)lane * V; i < ld8; i += 32 * V) {
        if constexpr (V == 8) {
            uint32_t c[2] = {0u, 0u};
            if (i < K) {
                const uint4 v = __ldg((const uint4 *)(xr + i));
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const uint32_t lo = __nv_cvt_float_to_fp8(__uint_as_float(w[q] << 16) / scale, __NV_SATFINITE,
                                                              __NV_E4M3),
                                   hi = __nv_cvt_float_to_fp8(__uint_as_float(w[q] & 0xFFFF0000u) / scale,
                                                              __NV_SATFINITE, __NV_E4M3);
                    c[q / 2] |= (lo | hi << 8) << (16 * (q & 1));
                }
            }
            *(uint2 *)(out + i) = make_uint2(c[0], c[1]);
        } else {
            out[i] = i < K ? (uint8_t)__nv_cvt_float_to_fp8(__bfloat162float(xr[i]) / scale, __NV_SATFINITE, __NV_E4M3)
                           : (uint8_t)0;
        }
    }
    if (lane == 0) xs[row] = scale;
}

extern "C" void fm_cuda_fold_quantize_tokens(const void *x, int64_t ldx, const int32_t *src_of, int32_t src_div,
                                             int64_t rows, int64_t K, uint8_t *x8, int64_t ld8, float *xs,
                                             void *stream) {
    if (rows <= 0) return;
    if (K > ld8 || src_div <= 0) {
        fprintf(stderr, "fp8moe: fold_quantize_tokens: bad arguments (K %lld, ld8 %lld)\n", (long long)K,
                (long long)ld8);
        abort();
    }
    const int warps = 8;
    const dim3 grid((unsigned)fm_ceil_div(rows, warps));
    const bool vec = K % 8 == 0 && ldx % 8 == 0 && ld8 % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)x8 % 8 == 0;
    if (vec)
        fold_quantize_tokens_kernel<8><<<grid, 32 * warps, 0, (cudaStream_t)stream>>>(
            (const __nv_bfloat16 *)x, ldx, src_of, src_div, rows, K, x8, ld8, xs);
    else
        fold_quantize_tokens_kernel<1><<<grid, 32 * warps, 0, (cudaStream_t)stream>>>(
            (const __nv_bfloat16 *)x, ldx, src_of, src_div, rows, K, x8, ld8, xs);
    FM_LAUNCH_CHECK("fold per-token quantize");
}

// ---- int4-tc -> fold code layout ----------------------------------------------------------------------------------
// One thread per (matrix, group, segment, row): the 32 codes of the row at k = 32 s .. + 31 read from the int4-tc
// chunk (w4a8_layout.cuh: lane 4 (r % 8) + t, word 2 s' + p holds k = 32 s' + 16 p + 4 t + b; the top code is the
// row r % 8 in bits 0-2 and 7, the bottom one row r % 8 + 8 in bits 4-6 with its sign in bit 3 of the next byte).
static __global__ void repack_tc_to_fold_kernel(const uint8_t *src, int64_t n_units, int64_t rows_pad, int64_t G,
                                                uint8_t *dst) {
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= n_units) return;
    const int64_t r = u % rows_pad, rest = u / rows_pad, s = rest % 4, gm = rest / 4, g = gm % G, m = gm / G;
    const int64_t blk = r / 16;
    const int rr = (int)(r % 16), gg = rr % 8;
    const bool top = rr < 8;
    const uint8_t *chunk = src + ((m * (rows_pad / 16) + blk) * G + g) * FM_TC_CHUNK;
    uint32_t out[4] = {0u, 0u, 0u, 0u};
    for (int kk = 0; kk < 32; kk++) {
        const int k = 32 * (int)s + kk; /* within the group */
        const int sp = k / 32, p = (k / 16) % 2, t = (k / 4) % 4, b = k % 4;
        const int word = 2 * sp + p, h = word / 4, jj = word % 4;
        const uint8_t *wb = chunk + h * 512 + (4 * gg + t) * 16 + jj * 4;
        const uint32_t byte = wb[b];
        const uint32_t mag = top ? byte & 7u : (byte >> 4) & 7u;
        const uint32_t neg = top ? byte >> 7 : (wb[(b + 1) % 4] >> 3) & 1u;
        const int i = kk / 8, c = kk % 8;
        out[i] |= mag << (4 * c);
        out[i] |= neg << (c < 4 ? 8 * c + 7 : 8 * (c - 4) + 3);
    }
    *(uint4 *)(dst + (((m * G + g) * 4 + s) * rows_pad + r) * 16) = make_uint4(out[0], out[1], out[2], out[3]);
}

extern "C" void fm_cuda_repack_tc_to_fold(const uint8_t *src, int32_t n, int64_t rows_pad, int64_t n_groups,
                                          uint8_t *dst, void *stream) {
    const int64_t units = (int64_t)n * n_groups * 4 * rows_pad;
    if (units <= 0) return;
    repack_tc_to_fold_kernel<<<(unsigned)fm_ceil_div(units, 256), 256, 0, (cudaStream_t)stream>>>(src, units, rows_pad,
                                                                                                  n_groups, dst);
    FM_LAUNCH_CHECK("repack int4-tc to fold");
}
