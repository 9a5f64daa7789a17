/* What the fold route's GPU tests share (test_cuda_fold.c: the GEMM, the quantizer, the moe op; test_cuda_fold_gemv.c:
 * the decode GEMV and the per-token dispatch): int4-p2 banks on the host and in the fold layout on the device, routed
 * tiles, the emulation of the kernels' arithmetic (backend/w4a8_fold.h) with the accumulator model's bound, expert
 * sources in our checkpoint format. Include after cmocka.h (FOLD_CK fails through it). */
#ifndef FM_FOLD_TEST_UTIL_H
#define FM_FOLD_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/w4a8_fold_gemm.h"

#define FOLD_CK(call)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

/* xorshift, reseeded per case */
void fold_seed(uint64_t s);
double fold_urand(void);
float fold_gauss(void);

void *fold_dev_copy(const void *h, size_t bytes);

/* Whether the device runs the fold kernels (sm_90); prints that the test is skipped otherwise */
bool fold_have_sm90(void);

/* n int4-p2 matrices [rows][K] on the host (q, scales) and in the fold layout on the device (packed with
 * fm_w4a8_fold_pack, gate|up rows interleaved by 8 when interleaved) */
typedef struct p2_bank {
    int32_t n;
    int64_t rows, K, G, rows_pad;
    bool interleaved;
    int8_t *q;     /* [n][rows][K] */
    float *scales; /* [n][rows][G] */
    uint8_t *d_codes;
    uint16_t *d_scales;
} p2_bank;

/* gaussian rows with log-normal (row, group) scales, quantized by the CPU's int4-p2 quantizer */
p2_bank fold_make_bank(int32_t n, int64_t rows, int64_t K, bool interleaved);
/* codes and scales drawn directly in the int4-p2 form (codes -7..7 around 0, a bf16 row scale, each group 2^k
 * below it, k in [-12, 0]): real widths without the quantizer's ~30 passes a row */
p2_bank fold_make_bank_random(int32_t n, int64_t rows, int64_t K, bool interleaved);
void fold_free_bank(p2_bank *b);

/* P routed rows over E experts, unevenly: the expert of each slot (sorted) and tiles of at most bn rows */
typedef struct routed {
    int64_t P;
    int32_t *expert_of; /* [P], non-decreasing */
    fm_fold_tile *tiles;
    int32_t n_tiles;
} routed;
routed fold_route_rows(int64_t P, int32_t E, int32_t bn);
void fold_free_routed(routed *r);

/* The emulation of one routed GEMM (fm_w4a8_fold_ref per slot): y_ref [P][rows], and per element the bound of the
 * accumulator model (the sum of |products| x the output's scale, over all of K). xs: per token [P], per group
 * [G][lds]. */
void fold_emulate(const p2_bank *b, const routed *rt, const uint8_t *x8, int64_t ldx, const float *xs, int64_t lds,
                  bool per_group, float *y_ref, float *mag);
/* ... promoting every `promote` groups (<= 0: all of K in one block, the warp-specialised kernel's) */
void fold_emulate_promote(const p2_bank *b, const routed *rt, const uint8_t *x8, int64_t ldx, const float *xs,
                          int64_t lds, bool per_group, int32_t promote, float *y_ref, float *mag);
/* Fails unless every |y - ref| is within one bf16 ulp of ref plus 2^-11 of its magnitude (the FP8 accumulator's
 * truncation, ~2^-13 of a block's magnitude per block); prints the worst ratio to that bound. */
void fold_check_close(const float *y, const float *ref, const float *mag, int64_t n, const char *what);
/* ... with acc_rel of the magnitude for the accumulator (all of K in one block: ~2^-13 per k32 step) */
void fold_check_close_acc(const float *y, const float *ref, const float *mag, int64_t n, double acc_rel,
                          const char *what);

/* The fold MoE emulated (per-token x, gate|up, SwiGLU, h per 128 channels, down per group, combine): out [T][H] */
void fold_emulate_moe(const p2_bank *gu, const p2_bank *dn, const float *x, int64_t T, const int32_t *ids,
                      const float *w, int32_t k, float *out);
/* ... or (ws) as the warp-specialised GEMMs compute it (route w4a8.fold_ws): both GEMMs over all of K in one block,
 * h in bf16 then e4m3 with one scale per token into the down GEMM */
void fold_emulate_moe_form(const p2_bank *gu, const p2_bank *dn, const float *x, int64_t T, const int32_t *ids,
                           const float *w, int32_t k, bool ws, float *out);

/* The banks' matrices as expert sources in our checkpoint format with int4-p2 scales (compressed-tensors
 * pack-quantized, symmetric, bf16 scales: what `requantize --scales p2` writes), bound as a checkpoint's tensors
 * are, and the moe op's two banks made from them on a backend. gu: [E][2I][H] gate rows then up rows, not
 * interleaved (the backend interleaves its own); dn: [E][H][I]. */
typedef struct fold_experts fold_experts;
fold_experts *fold_experts_make(const p2_bank *gu, const p2_bank *dn);
void fold_experts_banks(fm_backend *be, const fold_experts *s, fm_bank **gate_up, fm_bank **down);
void fold_experts_free(fold_experts *s);

#endif
