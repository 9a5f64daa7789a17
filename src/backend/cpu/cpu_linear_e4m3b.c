/* y = x W^T for e4m3-block banks (block-FP8 checkpoints under the fp8 plans), the CPU reference the GPU kernels
 * are tested against. Numerics contract, per output (m, n), over activation groups g of 128 along K in order (the
 * last one partial when K is not a multiple of 128, as if K were zero-padded):
 *   partial   = sum_{k in group g} xq[m, k] * w8[n, k]          fp32, in k order, w8 the checkpoint's e4m3 decoded
 *   acc      += partial * (a[m, g] * sinv[n / bn, g])            one fp32 product of the two scales first
 * with xq, a the e4m3 1x128 activation and its scale (cpu_quantize_row; a = 1 for activations as stored) and sinv
 * the checkpoint's weight_scale_inv of the (bn x 128) block holding row n, column group g (stored per row). */
#include "backend/cpu/cpu_internal.h"
#include "quant/e4m3.h"

void cpu_e4m3b_rows(const fm_bank *w, int32_t idx, const cpu_qrow *x, int64_t n0, int64_t n1, float *y) {
    float lut[256]; /* e4m3 -> fp32 is exact: decode each code once per call */
    for (int c = 0; c < 256; c++) lut[c] = fm_e4m3_to_f32((uint8_t)c);
    const int64_t K = w->cols, ng = w->n_groups, A = FM_CPU_GROUP;
    for (int64_t n = n0; n < n1; n++) {
        const int64_t r = (int64_t)idx * w->rows + n;
        const uint8_t *cr = w->codes + r * K;
        const float *sr = w->scales + r * ng;
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; g++) {
            const int64_t k0 = g * A, k1 = k0 + A < K ? k0 + A : K;
            float partial = 0.0f;
            for (int64_t k = k0; k < k1; k++) partial += x->val[k] * lut[cr[k]];
            acc += partial * ((x->scale ? x->scale[g] : 1.0f) * sr[g]);
        }
        y[n - n0] = acc;
    }
}
