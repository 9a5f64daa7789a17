/* The int4-zp bank on the host: a pre-quantized checkpoint's int4 linears (GPTQ, AWQ, compressed-tensors) decoded
 * from their packed tensors into one layout, from the codes (never through float weights):
 *   codes [n][rows][ceil(K/2)]  unsigned nibbles, bank position 2i in the low nibble
 *   zeros [n][rows][n_groups]   0..16,  scales [n][rows][n_groups] fp32 (the stored fp16/bf16 values, exact)
 *   perm  [n][K] or NULL        act-order: bank position j holds input channel perm[j] (NULL: the identity)
 * w[n, j] = (code - zero) * scale with group j / group. The CPU backend keeps these arrays as its bank; the CUDA
 * backend uploads them (row layout) or reorders them for its tensor cores, then frees them. */
#ifndef FM_BACKEND_INT4ZP_HOST_H
#define FM_BACKEND_INT4ZP_HOST_H

#include "backend/backend.h"

typedef struct fm_int4zp_host {
    int32_t n;
    int64_t rows, cols;
    int32_t group;    /* K-group size (divides cols) */
    int64_t n_groups; /* cols / group */
    uint8_t *codes, *zeros;
    float *scales;
    int32_t *perm;
} fm_int4zp_host;

/* Builds the arrays from a bank source whose every part is a pre-quantized int4 view; errors name src->label.
 * keep_identity_orders (int4-zp): sources with a g_idx get an order even where it is the identity (what the memory
 * plan counts); otherwise (int4-zp-tc, which takes no order) perm stays NULL unless some order is not the identity. */
fm_status fm_int4zp_host_build(const fm_bank_src *src, bool keep_identity_orders, fm_int4zp_host *out, fm_error *err);
void fm_int4zp_host_free(fm_int4zp_host *h);

#endif
