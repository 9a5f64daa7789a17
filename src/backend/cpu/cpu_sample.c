/* The sample op on the CPU: the reference sampler (src/engine/sampler.c) row by row, on the backend's fp32 logits
 * (rounded to bf16 already where the plan emulates the GPU, so both backends sample the same values). */
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "engine/sampler.h"

void cpu_sample(fm_backend *be, const void *logits, int32_t B, int32_t vocab, const void *row_slot, const void *params,
                void *steps, void *counts, void *seen, const void *bias, const void *mask, void *z, void *ids,
                void *info) {
    (void)be;
    const int32_t *slot_of = row_slot;
    const fm_sampling *p = params;
    uint64_t *step = steps;
    int32_t *cnt = counts;
    uint8_t *sn = seen;
    int32_t *out = ids;
    fm_sample_info *inf = info;
    const fm_logit_bias *bs = bias;
    const uint32_t *mk = mask;
    const int32_t words = (vocab + 31) / 32;
    /* the reference keeps its own 2 x vocab floats (z is the device kernel's scratch) */
    float *scratch = malloc(2 * (size_t)vocab * sizeof *scratch);
    if (!scratch) abort(); /* a few hundred KiB; the op has no error path (backend.h) */
    (void)z;
    for (int32_t r = 0; r < B; r++) {
        const int64_t s = slot_of ? slot_of[r] : r;
        out[r] = fm_sample_row((const float *)logits + (size_t)r * vocab, vocab, &p[s], cnt ? cnt + s * vocab : NULL,
                               sn ? sn + s * vocab : NULL, bs ? bs + s * FM_MAX_LOGIT_BIAS : NULL,
                               mk ? mk + (size_t)r * words : NULL, step[s], scratch, inf ? &inf[r] : NULL);
        step[s]++;
        if (cnt) fm_sample_state_add(vocab, out[r], true, cnt + s * vocab, sn + s * vocab);
    }
    free(scratch);
}
