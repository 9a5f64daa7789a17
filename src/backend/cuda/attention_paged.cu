// Attention over the paged KV cache (see attention_paged.cuh): flash-decoding on tensor cores for bf16, a plain
// kernel for the fp32 oracle.
//
// bf16, split kernel. Grid: x = token t, y = (kv head, group of up to 16 of its query heads), z = split s of the
// token's context (backend/attention_paged.h: the number of splits S comes from the shapes; the slice of split s
// is [s * chunk, (s + 1) * chunk) with chunk from the token's length, read from device memory, so a captured graph
// replays with any lengths; splits past the end exit at once). Block: 4 warps. The CTA's query heads are the M rows
// of one m16n8k16 tile (GQA: the K and V rows of the kv head are read once for the group; rows past the group are
// zero and never stored). Warp w takes the 16-key tiles w, w + 4, w + 8, ... of the slice, each tile gathered row by
// row through the block table (16-byte cp.async of K and V rows, zero-filled past the slice), and keeps its own
// online softmax: S = Q K^T (ldmatrix K, mma), keys past the slice -> -inf, fp32 max and sum (exp2 of log2e-scaled
// scores), P rounded to bf16 as the A operand, O += P V (ldmatrix.trans V, mma). The 4 warps then merge through
// shared memory; with S = 1 the CTA writes out (O / l, bf16), else the split's partial (O unnormalised, max in
// log2 units, sum; fp32) goes to scratch and the splits are merged: by the combine kernel (grid (token, query head))
// under route paged.combine=kernel, or (fused) by the last of the (token, group)'s split CTAs to finish: each CTA
// fences its partial and counts itself on the group's counter (atomicInc, which wraps the counter back to zero at the
// last, so a replayed graph finds it zero); the last fences again and merges the group's splits from L2
// (apg_fused_combine: the combine kernel's arithmetic in its order, the same bits). One launch fewer per call.
//
// e4m3 cache (FM_KV_E4M3, template E4M3; kv_store.cuh's rows: a slot's codes, then its fp32 scales): the same kernel
// with the stages holding the raw rows, each tile's codes (16-byte cp.async chunks) and its 16 keys' scales (4-byte
// cp.async, zero-filled past the slice like the codes). The products run on f16 operands: every e4m3 code is an f16
// (one cvt a pair), and the CTA's Q tile is converted to f16 once (times 2^-qe, qe = 0 unless a |q| reaches 2^16).
// Before S = Q K^T the warp converts the stage's K codes into one f16 tile of the bf16 form's layout; S's column j is
// then multiplied by key j's scale (times 2^qe). Before O += P V it converts the V codes into the same tile, and P's
// column j is multiplied by value j's scale over vmax, the largest value scale of the warp's tiles so far, before P is
// rounded to f16; o holds O / vmax (a larger vmax rescales it with the softmax's alpha) and is multiplied back before
// the merge. Every scale is a power of two, so each of these products is exact: the numbers are the bf16 form's on a
// bf16 cache of the dequantized values, but for P's rounding (f16's 11 bits against bf16's 8) and queries below f16's
// normal range. The conversion is one cvt per two codes (the scale multiply and the bf16 repack of a conversion to
// values would be three more instructions a value). The raw stage is free once V is converted: its refill is issued
// before the P V product rather than after it.
//
// Shared memory (dynamic), bf16 tiles in the layout of attention_mma.cuh (swizzled or padded rows):
//   Q [16][HD]                         loaded once by the CTA; read by every warp (held in registers for HD <= 128)
//   warp w, bf16: ST stages of K [16][HD] and V [16][HD]  written and read by warp w only (cp.async ring, __syncwarp)
//   warp w, e4m3: an f16 tile [16][HD], then ST stages of K and V raw tiles (codes [16][HD] bytes, 16 fp32 scales)
// ST = 2 for HD <= 128, 1 above: bf16 68 KB at HD 128, 72 KB at HD 256; e4m3 53 KB and 72.5 KB: under the 99 KB of
// sm_89 at every HD. After the loop the warps' regions hold their O [4][16][HD] fp32 and the Q region their max and
// sum [2][4][16] for the merge.
//
// Scratch (S > 1): the counters [fm_attention_paged_counter_bytes(nh) / 4] uint32 (index t * nkv * groups + y; zero
// between calls), then part_o [T][nh][S][HD] fp32, part_m [T][nh][S] and part_l [T][nh][S] fp32.
//
// Floor: the K and V bytes of every token's context, sum_t (tok_pos[t] + 1) * 2 * nkv * hd * 2 bytes, at the
// H200's 4.25 TB/s (Qwen3-30B-A3B, 4 kv heads x 128: 4 MiB per token and layer at context 2048, ~1 us); e4m3: half
// of them, sum_t (tok_pos[t] + 1) * 2 * nkv * (hd + 4) bytes (2.06 MiB there; a slot's scales share one 32-byte
// sector), plus the conversion, half an instruction a value. Measured (RESULTS 2.21, H100, B = 64): the bf16 form at
// ~2.6 TB/s (77 % of DRAM's peak), the e4m3 one at ~1.6, bound by its warps' dependent chain over a tile at 3 warps
// a scheduler, not by its bytes; the
// scratch round trip (S (hd + 2) floats per query head, written and read once, L2-resident) and the query are small
// beside it for S <= 64. Tokens of one sequence in one call (a prefill chunk) each read the prefix: L2 serves the
// repeats (route paged.tiled gives such runs of rows to attention_paged_tiled.cu, launched with skip_runs here).
//
// fp32 (ref32): grid (token, query head), 4 warps; warp w takes keys w, w + 4, ... with an online softmax in fp32
// (lanes split the head dimension, a shuffle reduction per score), then the warps merge through shared memory.
// Written to be obviously right, not fast.
//
// Programmatic dependent launch (pdl.cuh, `pdl`): each kernel waits for the earlier ones near its top, before any
// early return, and lets the next one start after that wait. Before it a kernel reads only what the host staged for
// the step (sequences, positions, block tables: the combine's lengths, the split kernels' slices and, with
// paged.early_kv, their first tiles of keys earlier steps stored); the query and the key the RoPE kernel has just
// appended are earlier kernels' outputs, read after it. There are no weights.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "backend/attention_paged.h"
#include "backend/cuda/attention_e4m3.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/moe_dispatch_device.cuh"
#include "backend/cuda/pdl.cuh"

#include "backend/cuda/attention_paged_split.cuh"
#include "backend/cuda/attention_paged_swap.cuh"

template <int HD, bool E4M3> __global__ void __launch_bounds__(APG_THREADS) apg_split_kernel(apg_args a) {
    extern __shared__ __align__(128) unsigned char apg_smem[];
    __shared__ unsigned qmax, arrived;
    if (!a.early) pdl_wait(); /* else apg_split_cta waits, after the loads of keys earlier steps stored */
    apg_split_cta<HD, E4M3, 128, 0>(a, apg_smem, gridDim.x, blockIdx.x, gridDim.y, blockIdx.y, blockIdx.z, &qmax,
                                    &arrived);
}

// Merges the splits of one (token, query head): thread d < hd owns out[t, h, d]. QUANT (route dense.quant=producer, hd
// a multiple of 128, no skipped rows): then warp w < hd / 128 quantizes the head's w-th 128-column group of the row it
// has just written, as fm_cuda_quantize_e4m3_rows would (the same function on the same bf16 values: the same codes
// and scale), into the o projection's input rows x8 [T][nh hd] and scales xs[group][T]: that launch saved.
template <bool QUANT>
static __global__ void apg_combine_kernel(const float *part, const int32_t *tok_seq, const int32_t *tok_pos, int nh,
                                          int hd, int splits, int skip_runs, bf16 *out, uint8_t *x8, float *xs) {
    __shared__ float sm[FM_ATT_PAGED_MAX_SPLITS], sl[FM_ATT_PAGED_MAX_SPLITS];
    const int64_t t = blockIdx.x;
    /* the sequences and positions are the host's (staged before the step: pdl.cuh), read before the wait */
    const bool skip = skip_runs && apg_in_run(tok_seq, gridDim.x, t);
    const int len = tok_pos[t] + 1;
    pdl_wait();
    if (skip) return;                                                                   /* the whole CTA */
    apg_combine_head(part, len, nh, hd, splits, gridDim.x, t, blockIdx.y, out, sm, sl); /* ends in a barrier */
    if (QUANT && (int)(threadIdx.x >> 5) < hd / 128) {
        const int64_t K = (int64_t)nh * hd, grp = (int64_t)blockIdx.y * (hd / 128) + (threadIdx.x >> 5);
        quantize_group_warp<false>(out + t * K, K, grp, x8 + t * K, xs, NULL, gridDim.x, t);
    }
}

static void apg_fail(const char *what, int64_t T, int32_t nh, int32_t nkv, int32_t hd) {
    fprintf(stderr, "fp8moe: attention_paged(T=%lld, nh=%d, nkv=%d, hd=%d): %s\n", (long long)T, nh, nkv, hd, what);
    abort();
}

// the checks both activation types share
static void apg_check(const void *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const void *k_cache,
                      const void *v_cache, const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                      int32_t max_blocks, int32_t block_tokens, int64_t max_len, const void *out) {
    if (!qkv || !k_cache || !v_cache || !tok_seq || !tok_pos || !tables || !out)
        apg_fail("null pointer", T, nh, nkv, hd);
    if (T < 0 || T > INT32_MAX) apg_fail("T must be in [0, 2^31)", T, nh, nkv, hd);
    if (nh < 1 || nkv < 1 || nh % nkv != 0 || nh > 65535)
        apg_fail("need nh in [1, 65535], nkv >= 1 and nh % nkv == 0", T, nh, nkv, hd);
    if (max_blocks < 1 || block_tokens < 1 || max_len < 1 || max_len > INT32_MAX)
        apg_fail("need max_blocks >= 1, block_tokens >= 1 and max_len in [1, 2^31)", T, nh, nkv, hd);
}

// CTAs of the split kernel one multiprocessor holds at once (its shared memory bounds it: 3 at HD 128 on sm_90)
template <int HD, bool E4M3> static int apg_ctas_per_sm() {
    typedef apg_shape<HD, E4M3> SH;
    if (SH::SMEM > 48 * 1024)
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(apg_split_kernel<HD, E4M3>, cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
    int n = 0;
    FM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, apg_split_kernel<HD, E4M3>, APG_THREADS, SH::SMEM));
    return n > 0 ? n : 1;
}

template <bool E4M3> static int apg_ctas_per_sm_query(int hd) {
    switch (hd) {
    case 16: return apg_ctas_per_sm<16, E4M3>();
    case 32: return apg_ctas_per_sm<32, E4M3>();
    case 48: return apg_ctas_per_sm<48, E4M3>();
    case 64: return apg_ctas_per_sm<64, E4M3>();
    case 80: return apg_ctas_per_sm<80, E4M3>();
    case 96: return apg_ctas_per_sm<96, E4M3>();
    case 112: return apg_ctas_per_sm<112, E4M3>();
    case 128: return apg_ctas_per_sm<128, E4M3>();
    case 144: return apg_ctas_per_sm<144, E4M3>();
    case 160: return apg_ctas_per_sm<160, E4M3>();
    case 176: return apg_ctas_per_sm<176, E4M3>();
    case 192: return apg_ctas_per_sm<192, E4M3>();
    case 208: return apg_ctas_per_sm<208, E4M3>();
    case 224: return apg_ctas_per_sm<224, E4M3>();
    case 240: return apg_ctas_per_sm<240, E4M3>();
    case 256: return apg_ctas_per_sm<256, E4M3>();
    }
    return 1;
}

// the same, asked of the runtime once per head dim and form: the launcher runs for every attention layer of an eager
// step, and the answer depends on the kernel and the GPU only. (Ranks on GPUs of different kinds in one process would
// share the first one's count: a split count is correct at any value up to the scratch's bound, only its speed
// changes.) The e4m3 form's own count: its smaller stages may fit more CTAs, and paged.splits=waves fills its waves.
static int apg_ctas_per_sm(int hd, bool e4m3) {
    static int known[2][256 / 16 + 1];
    int n = __atomic_load_n(&known[e4m3][hd / 16], __ATOMIC_RELAXED);
    if (n == 0) {
        n = e4m3 ? apg_ctas_per_sm_query<true>(hd) : apg_ctas_per_sm_query<false>(hd);
        __atomic_store_n(&known[e4m3][hd / 16], n, __ATOMIC_RELAXED);
    }
    return n;
}

template <int HD, bool E4M3>
static void apg_launch(const apg_args &a, int64_t T, int kv_ctas_y, bool pdl, cudaStream_t s) {
    typedef apg_shape<HD, E4M3> SH;
    if (SH::SMEM > 48 * 1024)
        FM_CUDA_CHECK(
            cudaFuncSetAttribute(apg_split_kernel<HD, E4M3>, cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
    pdl_launch(apg_split_kernel<HD, E4M3>, dim3((unsigned)T, (unsigned)kv_ctas_y, (unsigned)a.splits), APG_THREADS,
               SH::SMEM, s, pdl, a);
    FM_LAUNCH_CHECK(E4M3 ? "attention_paged_e4m3" : "attention_paged");
}

template <bool E4M3> static void apg_launch_hd(const apg_args &a, int hd, int64_t T, int y, bool pdl, cudaStream_t s) {
    switch (hd) {
    case 16: apg_launch<16, E4M3>(a, T, y, pdl, s); break;
    case 32: apg_launch<32, E4M3>(a, T, y, pdl, s); break;
    case 48: apg_launch<48, E4M3>(a, T, y, pdl, s); break;
    case 64: apg_launch<64, E4M3>(a, T, y, pdl, s); break;
    case 80: apg_launch<80, E4M3>(a, T, y, pdl, s); break;
    case 96: apg_launch<96, E4M3>(a, T, y, pdl, s); break;
    case 112: apg_launch<112, E4M3>(a, T, y, pdl, s); break;
    case 128: apg_launch<128, E4M3>(a, T, y, pdl, s); break;
    case 144: apg_launch<144, E4M3>(a, T, y, pdl, s); break;
    case 160: apg_launch<160, E4M3>(a, T, y, pdl, s); break;
    case 176: apg_launch<176, E4M3>(a, T, y, pdl, s); break;
    case 192: apg_launch<192, E4M3>(a, T, y, pdl, s); break;
    case 208: apg_launch<208, E4M3>(a, T, y, pdl, s); break;
    case 224: apg_launch<224, E4M3>(a, T, y, pdl, s); break;
    case 240: apg_launch<240, E4M3>(a, T, y, pdl, s); break;
    case 256: apg_launch<256, E4M3>(a, T, y, pdl, s); break;
    }
}

extern "C" int32_t fm_cuda_attention_paged_split_count(int64_t T, int32_t nh, int32_t nkv, int32_t hd, fm_kv_dtype kv,
                                                       int64_t max_len, bool split_waves) {
    const int64_t kv_ctas = T * nkv * fm_ceil_div(nh / nkv, 16);
    const int sms = fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
    return split_waves ? fm_attention_paged_splits_waves(T, kv_ctas, max_len,
                                                         (int64_t)sms * apg_ctas_per_sm(hd, kv == FM_KV_E4M3))
                       : fm_attention_paged_splits(T, kv_ctas, max_len, sms);
}

// the split kernel (and the combine kernel) over a cache of either form: fm_cuda_attention_paged, _quant (x8, xs:
// the rows quantized for o as well) and _rows
static void apg_run(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const void *k_cache,
                    const void *v_cache, fm_kv_dtype kv, const int32_t *tok_seq, const int32_t *tok_pos,
                    const int32_t *tables, int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                    bf16 *out, bool skip_runs, bool fused_combine, bool split_waves, int32_t swap, bool early_kv,
                    bool pdl, uint8_t *x8, float *xs, cudaStream_t s) {
    apg_check(qkv, T, nh, nkv, hd, k_cache, v_cache, tok_seq, tok_pos, tables, max_blocks, block_tokens, max_len, out);
    if (kv != FM_KV_ACT && kv != FM_KV_E4M3) apg_fail("unknown KV cache dtype", T, nh, nkv, hd);
    if (T == 0) return;
    if (hd < 16 || hd > 256 || hd % 16 != 0) apg_fail("hd must be a multiple of 16 in [16, 256]", T, nh, nkv, hd);
    if (((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) % 16 != 0)
        apg_fail("qkv, k_cache and v_cache must be 16-byte aligned", T, nh, nkv, hd);
    const int qgroups = (int)fm_ceil_div(nh / nkv, 16);
    if ((int64_t)nkv * qgroups > 65535) apg_fail("too many kv heads for the grid", T, nh, nkv, hd);
    const bool e4m3 = kv == FM_KV_E4M3;
    apg_args a;
    a.qkv = qkv, a.k_cache = k_cache, a.v_cache = v_cache;
    a.tok_seq = tok_seq, a.tok_pos = tok_pos, a.tables = tables;
    a.part = NULL, a.counters = NULL, a.out = out;
    a.nh = nh, a.nkv = nkv, a.qgroups = qgroups, a.max_blocks = max_blocks, a.block_tokens = block_tokens;
    a.bt_shift = apg_bt_shift(block_tokens);
    if (!fm_cuda_attention_paged_swap_applies(nh, nkv, hd)) swap = 0;
    if (swap) { // its own resident CTAs for the waves rule
        const int64_t kv_ctas = T * nkv;
        const int sms = fm_cuda_device_attr(cudaDevAttrMultiProcessorCount);
        a.splits = split_waves ? fm_attention_paged_splits_waves(
                                     T, kv_ctas, max_len,
                                     (int64_t)sms * fm_cuda_attention_paged_swap_ctas_per_sm(hd, e4m3, swap))
                               : fm_attention_paged_splits(T, kv_ctas, max_len, sms);
    } else {
        a.splits = fm_cuda_attention_paged_split_count(T, nh, nkv, hd, kv, max_len, split_waves);
    }
    a.skip_runs = skip_runs;
    a.early = early_kv && pdl; /* route paged.early_kv, under PDL (the split and the swapped kernels) */
    a.sl2 = (float)(1.4426950408889634 / sqrt((double)hd));
    a.row_b = e4m3 ? fm_kv_e4m3_row_bytes(nkv, hd) : (int64_t)nkv * hd;
    if (a.splits > 1 && (!scratch || (uintptr_t)scratch % 16 != 0))
        apg_fail("the split needs 16-byte aligned scratch of fm_attention_paged_scratch_bytes()", T, nh, nkv, hd);
    const int y = nkv * qgroups;
    if (a.splits > 1) {
        const size_t cb = fm_attention_paged_counter_bytes(nh);
        if ((size_t)T * (size_t)y * sizeof(unsigned) > cb)
            apg_fail("more counters than the scratch holds", T, nh, nkv, hd);
        a.part = (float *)((char *)scratch + cb);
        if (fused_combine) a.counters = (unsigned *)scratch;
    }
    if (swap) fm_cuda_attention_paged_swap_launch(&a, hd, T, e4m3, swap, pdl, s);
    else if (e4m3) apg_launch_hd<true>(a, hd, T, y, pdl, s);
    else apg_launch_hd<false>(a, hd, T, y, pdl, s);
    /* x8: the rows quantized for o by the combine kernel where it runs over every row, else by a launch after it */
    const bool quant_in_combine = x8 && a.splits > 1 && !fused_combine && !skip_runs && hd % 128 == 0;
    if (a.splits > 1 && !fused_combine) {
        const dim3 grid((unsigned)T, (unsigned)nh), threads((unsigned)fm_ceil_div(hd, 32) * 32);
        if (quant_in_combine)
            pdl_launch(apg_combine_kernel<true>, grid, threads, 0, s, pdl, a.part, tok_seq, tok_pos, nh, hd, a.splits,
                       a.skip_runs, out, x8, xs);
        else
            pdl_launch(apg_combine_kernel<false>, grid, threads, 0, s, pdl, a.part, tok_seq, tok_pos, nh, hd, a.splits,
                       a.skip_runs, out, (uint8_t *)NULL, (float *)NULL);
        FM_LAUNCH_CHECK(quant_in_combine ? "attention_paged_combine + quantize_e4m3_rows" : "attention_paged_combine");
    }
    if (x8 && !quant_in_combine) fm_cuda_quantize_e4m3_rows(out, T, (int64_t)nh * hd, x8, xs, NULL, T, pdl, s);
}

extern "C" void fm_cuda_attention_paged_rows(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                             const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                             const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                             int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                             bf16 *out, bool skip_runs, bool fused_combine, bool split_waves,
                                             int32_t swap, bool early_kv, bool pdl, cudaStream_t s) {
    apg_run(qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks, block_tokens, max_len,
            scratch, out, skip_runs, fused_combine, split_waves, swap, early_kv, pdl, NULL, NULL, s);
}

extern "C" void fm_cuda_attention_paged_quant(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                              const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                              const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                              int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                              bf16 *out, uint8_t *x8, float *xs, bool fused_combine, bool split_waves,
                                              int32_t swap, bool early_kv, bool pdl, cudaStream_t s) {
    apg_run(qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks, block_tokens, max_len,
            scratch, out, false, fused_combine, split_waves, swap, early_kv, pdl, x8, xs, s);
}

extern "C" void fm_cuda_attention_paged(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                        const void *k_cache, const void *v_cache, fm_kv_dtype kv,
                                        const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *tables,
                                        int32_t max_blocks, int32_t block_tokens, int64_t max_len, void *scratch,
                                        bf16 *out, bool fused_combine, bool split_waves, int32_t swap, bool early_kv,
                                        bool pdl, cudaStream_t s) {
    apg_run(qkv, T, nh, nkv, hd, k_cache, v_cache, kv, tok_seq, tok_pos, tables, max_blocks, block_tokens, max_len,
            scratch, out, false, fused_combine, split_waves, swap, early_kv, pdl, NULL, NULL, s);
}

// ---------------------------------------------------------------- fp32 (ref32)

#define APGF_MAXD 8 // head dims per lane: hd <= 256

template <typename A>
static __global__ void apg_f32_kernel(const A *qkv, const A *k_cache, const A *v_cache, const int32_t *tok_seq,
                                      const int32_t *tok_pos, const int32_t *tables, int nh, int nkv, int hd,
                                      int max_blocks, int block_tokens, A *out) {
    extern __shared__ float apgf_smem[]; // per warp: max, sum, acc[hd]
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, kvh = h / (nh / nkv), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, kv_ld = (int64_t)nkv * hd;
    const int len = tok_pos[t] + 1;
    const int32_t *table = tables + (int64_t)tok_seq[t] * max_blocks;
    const float scale = 1.0f / sqrtf((float)hd);
    float q[APGF_MAXD], acc[APGF_MAXD];
#pragma unroll
    for (int i = 0; i < APGF_MAXD; i++) {
        const int d = lane + 32 * i;
        q[i] = d < hd ? act_load(qkv[t * ld + (int64_t)h * hd + d]) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < len; j += APG_WARPS) {
        const int64_t row =
            ((int64_t)table[j / block_tokens] * block_tokens + j % block_tokens) * kv_ld + (int64_t)kvh * hd;
        const A *k = k_cache + row, *v = v_cache + row;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < APGF_MAXD; i++)
            if (lane + 32 * i < hd) dot += q[i] * act_load(k[lane + 32 * i]);
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float sc = dot * scale, mn = fmaxf(m, sc);
        const float corr = expf(m - mn), p = expf(sc - mn); // corr = 0 on the first key (m = -inf)
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < APGF_MAXD; i++)
            if (lane + 32 * i < hd) acc[i] = acc[i] * corr + p * act_load(v[lane + 32 * i]);
        m = mn;
    }
    float *mine = apgf_smem + warp * (hd + 2);
    if (lane == 0) mine[0] = m, mine[1] = l;
#pragma unroll
    for (int i = 0; i < APGF_MAXD; i++)
        if (lane + 32 * i < hd) mine[2 + lane + 32 * i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += APG_THREADS) {
        float M = -INFINITY;
        for (int w = 0; w < APG_WARPS; w++) M = fmaxf(M, apgf_smem[w * (hd + 2)]);
        float a = 0.0f, L = 0.0f;
        for (int w = 0; w < APG_WARPS; w++) {
            const float *ws = apgf_smem + w * (hd + 2);
            const float e = expf(ws[0] - M); // 0 for a warp without keys
            a += ws[2 + d] * e;
            L += ws[1] * e;
        }
        act_store(out + t * (int64_t)nh * hd + (int64_t)h * hd + d, a / L);
    }
}

template <typename A>
static void attention_paged_plain(const A *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd, const A *k_cache,
                                  const A *v_cache, const int32_t *tok_seq, const int32_t *tok_pos,
                                  const int32_t *tables, int32_t max_blocks, int32_t block_tokens, int64_t max_len,
                                  A *out, bool pdl, cudaStream_t s) {
    apg_check(qkv, T, nh, nkv, hd, k_cache, v_cache, tok_seq, tok_pos, tables, max_blocks, block_tokens, max_len, out);
    if (T == 0) return;
    if (hd < 1 || hd > 32 * APGF_MAXD) apg_fail("hd must be in [1, 256] (plain kernel)", T, nh, nkv, hd);
    const size_t smem = (size_t)APG_WARPS * (hd + 2) * sizeof(float);
    pdl_launch(apg_f32_kernel<A>, dim3((unsigned)T, (unsigned)nh), APG_THREADS, smem, s, pdl, qkv, k_cache, v_cache,
               tok_seq, tok_pos, tables, nh, nkv, hd, max_blocks, block_tokens, out);
    FM_LAUNCH_CHECK("attention_paged_f32");
}

extern "C" void fm_cuda_attention_paged_f32(const float *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                            const float *k_cache, const float *v_cache, const int32_t *tok_seq,
                                            const int32_t *tok_pos, const int32_t *tables, int32_t max_blocks,
                                            int32_t block_tokens, int64_t max_len, float *out, bool pdl,
                                            cudaStream_t s) {
    attention_paged_plain(qkv, T, nh, nkv, hd, k_cache, v_cache, tok_seq, tok_pos, tables, max_blocks, block_tokens,
                          max_len, out, pdl, s);
}

extern "C" void fm_cuda_attention_paged_plain_bf16(const bf16 *qkv, int64_t T, int32_t nh, int32_t nkv, int32_t hd,
                                                   const bf16 *k_cache, const bf16 *v_cache, const int32_t *tok_seq,
                                                   const int32_t *tok_pos, const int32_t *tables, int32_t max_blocks,
                                                   int32_t block_tokens, int64_t max_len, bf16 *out, bool pdl,
                                                   cudaStream_t s) {
    attention_paged_plain(qkv, T, nh, nkv, hd, k_cache, v_cache, tok_seq, tok_pos, tables, max_blocks, block_tokens,
                          max_len, out, pdl, s);
}
